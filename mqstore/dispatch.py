"""Dispatch (reput, spec §10.1): CommitLog records → ConsumeQueue units and index entries.

``Dispatcher`` follows the CommitLog from the control block's ``dispatched`` position to the
readable end. The compiled kernel parses each record without its body and appends the
queue units; records with KEYS / UNIQ_KEY then go to the index. The position, the store
timestamp of the newest dispatched record and the counters are published in the control
block, and the "dispatched" channel is broadcast, so readers in any process can wait on it.

Both halves are idempotent: a unit whose record ends at or before the queue's
max_physic_offset is skipped, and so is an index entry below the index file's end offset.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from mqstore._consumequeue import DispatchKernel
from mqstore.services.base import ServiceThread

if TYPE_CHECKING:
    from mqstore._shm import ControlBlock
    from mqstore.commitlog import CommitLog
    from mqstore.consume_queue import ConsumeQueueTable

log = logging.getLogger("mqstore.dispatch")

CHUNK_BYTES = 16 << 20  # most bytes one kernel call dispatches (bounds the time it holds the GIL)
SHUTDOWN_CATCH_UP_MS = 5000
RETRY_AFTER_ERROR_MS = 1000  # spec §10.1: shutdown waits up to 5 s for dispatch to catch up


class Dispatcher:
    def __init__(self, commitlog: CommitLog, queues: ConsumeQueueTable, index: Any | None, ctl: ControlBlock,
                 *, delay_levels_ms: tuple[int, ...] = ()) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.index = index
        self.ctl = ctl
        self.kernel = DispatchKernel(queues.find_or_create, index_enable=index is not None,
                                     delay_levels_ms=delay_levels_ms, control_block=ctl)
        self._lock = threading.Lock()
        self.logics_store_timestamp = 0

    @property
    def dispatched(self) -> int:
        return self.ctl.get("dispatched")

    def behind(self) -> int:
        """dispatch_behind_bytes: readable end minus the dispatched position (spec §10.1)."""
        return max(0, self.ctl.get("committed") - self.ctl.get("dispatched"))

    def lag_ms(self) -> int:
        """Store time of the newest written record minus that of the newest dispatched one."""
        if self.behind() == 0:
            return 0
        written = self.ctl.get("last_store_timestamp")
        done = self.ctl.get("dispatched_store_timestamp")
        return max(0, written - done) if done > 0 else 0

    def reset(self, start: int) -> None:
        """Start dispatching at start (start-up: after recovery)."""
        self.ctl.set("dispatched", start)
        self.kernel.forget()

    def dispatch_available(self, *, raise_table: bool = False, max_bytes: int = 0) -> int:
        """Dispatch everything readable now (or about max_bytes of it); returns the records
        dispatched. With raise_table the topic-queue table follows the queue offsets seen
        (start-up). Thread-safe: one caller dispatches at a time."""
        with self._lock:
            return self._dispatch(raise_table, max_bytes)

    def _dispatch(self, raise_table: bool, max_bytes: int) -> int:
        ctl = self.ctl
        fs = self.commitlog.file_size
        queue = self.commitlog.queue
        total = 0
        done_bytes = 0
        while True:
            start = ctl.get("dispatched")
            end = ctl.get("committed")
            min_offset = self.commitlog.min_offset
            if start < min_offset:
                log.warning("dispatch position %d is below the CommitLog's first file; jumping to %d", start,
                            min_offset)
                start = min_offset
                ctl.set("dispatched", start)
            if start >= end or (max_bytes and done_bytes >= max_bytes):
                return total
            file_start = start - start % fs
            mf = queue.get(file_start) or queue.map_existing(file_start)
            if mf is None:
                log.error("dispatch: no CommitLog file holds offset %d (readable end %d)", start, end)
                return total
            hi = min(end, file_start + fs)
            t0 = time.monotonic_ns()
            stop, reason, records, units, last_ts = self.kernel.dispatch(
                mf, file_start, start - file_start, hi - file_start, raise_table, start + CHUNK_BYTES - file_start)
            new = file_start + stop
            if reason == "blank":
                new = file_start + fs
            elif reason == "invalid":
                # spec §10.1 (master): a record that does not parse is skipped with the rest of
                # the readable part of the file; the readable end is always a record boundary.
                skip_to = min(end, file_start + fs)
                log.error("dispatch: record at offset %d does not parse; skipping %d bytes up to %d", new,
                          skip_to - new, skip_to)
                ctl.add_stat("dispatch_errors")
                ctl.add_stat("dispatch_skipped_bytes", skip_to - new)
                new = skip_to
            if self.index is not None and self.kernel.index_requests:
                self._build_index()
            if last_ts > 0:
                ctl.set("dispatched_store_timestamp", last_ts)
                self.logics_store_timestamp = last_ts
            ctl.advance("dispatched", new)
            ctl.add_stat("dispatch_records", records)
            ctl.add_stat("dispatch_units", units)
            ctl.add_stat("dispatch_batches")
            ctl.add_stat("dispatch_ns_total", time.monotonic_ns() - t0)
            ctl.broadcast("dispatched")
            total += records
            done_bytes += new - start

    def _build_index(self) -> None:
        requests = self.kernel.index_requests
        self.kernel.index_requests = []
        index = self.index
        assert index is not None
        ok = True
        keys = 0
        for topic, msg_keys, uniq, phy, ts, sys_flag in requests:
            if not index.build_index(topic, msg_keys, uniq, phy, ts, sys_flag):
                ok = False
            keys += (1 if uniq else 0) + (len([k for k in msg_keys.split(" ") if k]) if msg_keys else 0)
        self.ctl.add_stat("index_keys", keys)
        if not ok:
            self.ctl.add_stat("index_errors")
            self.ctl.set_running_flag("WRITE_INDEX_FILE_ERROR")


class ReputMessageService(ServiceThread):
    """spec §10.1: dispatch whatever is readable, then wait up to 1 ms (or until woken on
    the "dispatch" channel)."""

    channel = "dispatch"

    def __init__(self, dispatcher: Dispatcher, interval_ms: float = 1.0) -> None:
        super().__init__("reput", dispatcher.ctl)
        self.dispatcher = dispatcher
        self.interval_ms = interval_ms
        self.last_error: BaseException | None = None

    def run_once(self) -> None:
        try:
            done = self.dispatcher.dispatch_available(max_bytes=64 << 20)
        except (OSError, ValueError, OverflowError) as exc:
            # spec §3: a queue that cannot be written is retried (every second here) and the
            # WRITE_LOGICS_QUEUE_ERROR running flag tells operators; dispatch resumes where it
            # stopped, and what was built already is skipped as a duplicate
            log.error("dispatch failed at offset %d: %s; retrying in %d ms", self.dispatcher.dispatched, exc,
                      RETRY_AFTER_ERROR_MS)
            self.ctl.add_stat("dispatch_errors")
            self.ctl.set_running_flag("WRITE_LOGICS_QUEUE_ERROR")
            self.last_error = exc
            self.sleep(RETRY_AFTER_ERROR_MS)
            return
        if done == 0:
            self.wait_for_running(self.interval_ms)

    def on_shutdown(self) -> None:
        # spec §10.1: let dispatch catch up (at most 5 s) so a clean shutdown leaves nothing behind
        deadline = time.monotonic() + SHUTDOWN_CATCH_UP_MS / 1000
        while self.dispatcher.behind() > 0 and time.monotonic() < deadline:
            try:
                if self.dispatcher.dispatch_available() == 0 and self.dispatcher.behind() > 0:
                    time.sleep(0.01)
            except (OSError, ValueError, OverflowError) as exc:
                log.error("dispatch failed while shutting down: %s", exc)
                break
