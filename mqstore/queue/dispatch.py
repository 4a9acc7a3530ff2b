"""Dispatch (reput, spec §10): CommitLog records → ConsumeQueue units and index entries.

``Dispatcher`` follows the CommitLog from the control block's ``dispatched`` position to the
readable end, in one of two modes:

* serial (spec §10.1, RocketMQ 4.9.7's ReputMessageService): the compiled kernel parses each
  record without its body and appends the queue units; records with KEYS / UNIQ_KEY then go
  to the index;
* concurrent (spec §10.2, 5.x's ConcurrentReputMessageService, ``concurrent=True``): the log
  is cut into batches of whole records (``batch_bytes``, 4 MiB), a thread pool parses them
  at the same time without the GIL (``mqstore.queue._reput``), and the results are applied strictly
  in batch order, so every queue's units and the index come out as the serial mode writes
  them. A pass that finds one batch or less to do parses it on the calling thread.

After each applied batch the position, the store timestamp of the newest dispatched record
and the counters are published in the control block. The arrival notification (a broadcast
on the "dispatched" channel, which readers in any process wait on) follows every applied
batch when ``notify_arrival`` (long_polling_enable) is on; when it is off, the dispatcher
broadcasts only once it has caught up with the readable end, so that ``wait_dispatched``
still returns promptly, and a dispatcher that is behind spends nothing on waking readers.

Both halves are idempotent: a unit whose record ends at or before the queue's
max_physic_offset is skipped, and so is an index entry below the index file's end offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mqstore.layout import file_start_of
from mqstore.log._shm import log_of_queue
from mqstore.queue._dispatch import DispatchKernel
from mqstore.queue._reput import BatchParser, ParsedBatch
from mqstore.queue.index import index_key_triples

if TYPE_CHECKING:
    from mqstore.log._mapped import MappedFile
    from mqstore.log._shm import ControlBlock
    from mqstore.log.commitlog import CommitLog
    from mqstore.config import StoreConfig
    from mqstore.queue.consume_queue import ConsumeQueueTable

log = logging.getLogger("mqstore.dispatch")

CHUNK_BYTES = 16 << 20  # most bytes one serial kernel call dispatches (bounds the time it holds the GIL)
DISPATCH_BATCH_BYTES = 4 << 20  # spec §10.2 BATCH_SIZE
POOL_THREADS = 16  # spec §10.2 batchDispatchRequestThreadPoolNums


class Dispatcher:
    def __init__(self, commitlog: CommitLog, queues: ConsumeQueueTable, index: Any | None, ctl: ControlBlock,
                 *, delay_levels_ms: tuple[int, ...] = (), concurrent: bool = False,
                 pool_threads: int = POOL_THREADS, batch_bytes: int = DISPATCH_BATCH_BYTES,
                 notify_arrival: bool = True) -> None:
        if pool_threads < 1 or batch_bytes < 1:
            raise ValueError(f"pool_threads ({pool_threads}) and batch_bytes ({batch_bytes}) must be >= 1")
        self.commitlog = commitlog
        #: the CommitLog this dispatcher follows (its own dispatched cursor); the ConsumeQueues
        #: it writes are those of that log's queues (docs/parallel-commitlogs.md)
        self.log_id = commitlog.log_id
        self.queues = queues
        self.index = index
        self.ctl = ctl
        #: WRITE_INDEX_FILE_ERROR set for this log and not cleared yet (by this dispatcher, or by
        #: the process of this log's dispatcher that was killed before it could clear it)
        self.index_error = ctl.log_running_flag("WRITE_INDEX_FILE_ERROR", self.log_id)
        self.kernel = DispatchKernel(queues.dispatch_target, index_enable=index is not None,
                                     delay_levels_ms=delay_levels_ms, control_block=ctl,
                                     on_skipped=self._skipped)
        self.concurrent = concurrent
        self.parser = BatchParser(delay_levels_ms=delay_levels_ms, index_enable=index is not None)
        self.pool_threads = pool_threads
        self.batch_bytes = batch_bytes
        self.notify_arrival = notify_arrival
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.logics_store_timestamp = 0
        #: the last dispatch_available() pass ended at the readable end (not at max_bytes)
        self.caught_up = True

    def _skipped(self, phy_offset: int, topic: bytes, queue_id: int) -> None:
        """A record whose queue cannot exist (its topic cannot name a directory, or is not
        UTF-8; a negative queue id): RocketMQ's broker never writes one, so it is damaged or
        foreign. It gets no ConsumeQueue unit (it stays in the CommitLog, readable by its
        offset) and dispatch goes on: one bad record must not stop every queue."""
        self.ctl.add_stat("dispatch_skipped_records")
        bound = self._bound_elsewhere(topic, queue_id)
        if bound is not None:
            log.error("dispatch: the record at offset %d of CommitLog %d names topic %r, queue %d, which is bound to "
                      "CommitLog %d; it is left out of the queues", phy_offset, self.log_id, topic, queue_id, bound)
            return
        log.error("dispatch: the record at offset %d names topic %r, queue %d, which cannot be a ConsumeQueue; "
                  "it is left out of the queues", phy_offset, topic, queue_id)

    def _bound_elsewhere(self, topic: bytes, queue_id: int) -> int | None:
        """The log a valid queue is bound to when it is not the log of this dispatcher's table
        of one log's queues (dispatch_logs_in_parallel: that log's dispatcher writes it)."""
        from mqstore.queue.consume_queue import queue_problem

        only = self.queues.only_log
        if only is None:
            return None
        try:
            name = topic.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if queue_problem(name, queue_id) is not None:
            return None
        bound = log_of_queue(name, queue_id, self.queues.log_count)
        return bound if bound != only else None

    @classmethod
    def from_config(cls, commitlog: CommitLog, queues: ConsumeQueueTable, index: Any | None, ctl: ControlBlock,
                    config: StoreConfig) -> Dispatcher:
        """A dispatcher set up by the store's config: delay levels, enable_build_consume_queue_
        concurrently, batch_dispatch_request_thread_pool_nums, dispatch_batch_bytes and
        long_polling_enable (the arrival notification)."""
        return cls(commitlog, queues, index, ctl, delay_levels_ms=config.delay_levels_ms,
                   concurrent=config.enable_build_consume_queue_concurrently,
                   pool_threads=config.batch_dispatch_request_thread_pool_nums,
                   batch_bytes=config.dispatch_batch_bytes, notify_arrival=config.long_polling_enable)

    @property
    def dispatched(self) -> int:
        return self.ctl.get("dispatched", log=self.log_id)

    def behind(self) -> int:
        """dispatch_behind_bytes: readable end minus the dispatched position (spec §10.1)."""
        return max(0, self.ctl.get("committed", log=self.log_id) - self.ctl.get("dispatched", log=self.log_id))

    def lag_ms(self) -> int:
        """Store time of the newest written record minus that of the newest dispatched one."""
        if self.behind() == 0:
            return 0
        written = self.ctl.get("last_store_timestamp", log=self.log_id)
        done = self.ctl.get("dispatched_store_timestamp", log=self.log_id)
        return max(0, written - done) if done > 0 else 0

    def reset(self, start: int) -> None:
        """Start dispatching at start (start-up: after recovery)."""
        self.ctl.set("dispatched", start, log=self.log_id)
        self.kernel.forget()

    def close(self) -> None:
        """Stop the parser threads of the concurrent mode (started again when needed)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def dispatch_available(self, *, raise_table: bool = False, max_bytes: int = 0,
                           progress: Callable[[str, int, int], None] | None = None) -> int:
        """Dispatch everything readable now (or about max_bytes of it); returns the records
        dispatched. With raise_table the topic-queue table follows the queue offsets seen
        (start-up). progress("dispatch", bytes done, bytes to do) is called after each chunk
        (the start-up dispatch of a store that lost its queues or index can be long).
        Thread-safe: one caller dispatches at a time."""
        with self._lock:
            return self._dispatch(raise_table, max_bytes, progress)

    def _dispatch(self, raise_table: bool, max_bytes: int,
                  progress: Callable[[str, int, int], None] | None = None) -> int:
        ctl = self.ctl
        fs = self.commitlog.file_size
        queue = self.commitlog.queue
        total = 0
        done_bytes = 0
        first = ctl.get("dispatched", log=self.log_id)
        # one pass goes up to the readable end seen when it starts: with writers appending
        # continuously, re-reading it per step would chase them in steps of a few records
        end = ctl.get("committed", log=self.log_id)
        while True:
            start = ctl.get("dispatched", log=self.log_id)
            min_offset = self.commitlog.min_offset
            if start < min_offset:
                log.warning("dispatch position %d is below the CommitLog's first file; jumping to %d", start,
                            min_offset)
                start = min_offset
                ctl.set("dispatched", start, log=self.log_id)
            if start >= end:
                if start != first and not self.notify_arrival:
                    ctl.broadcast("dispatched")  # caught up: wake wait_dispatched() callers once
                self.caught_up = True
                return total
            if max_bytes and done_bytes >= max_bytes:
                self.caught_up = False
                return total
            file_start = file_start_of(start, fs)
            mf = queue.get(file_start) or queue.map_existing(file_start)
            if mf is None:
                log.error("dispatch: no CommitLog file holds offset %d (readable end %d)", start, end)
                return total
            hi = min(end, file_start + fs)
            if self.concurrent:
                stop, reason, records = self._dispatch_batches(
                    mf, file_start, start - file_start, hi - file_start, raise_table,
                    max_bytes - done_bytes if max_bytes else 0)
            else:
                stop, reason, records = self._dispatch_serially(
                    mf, file_start, start - file_start, hi - file_start, raise_table)
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
            if new > file_start + stop:
                ctl.advance("dispatched", new, log=self.log_id)
                if self.notify_arrival:
                    ctl.broadcast("dispatched")
            total += records
            done_bytes += new - start
            if progress is not None:
                progress("dispatch", ctl.get("dispatched", log=self.log_id) - first, end - first)

    def _publish(self, new: int, records: int, units: int, last_ts: int, t0: int) -> None:
        """Make one applied batch visible: timestamps, position, counters, arrival notification.
        dispatch_ns_total counts the in-order step: a serial kernel call, or the apply of a
        batch (its parse ran in the pool)."""
        ctl = self.ctl
        if last_ts > 0:
            ctl.set("dispatched_store_timestamp", last_ts, log=self.log_id)
            self.logics_store_timestamp = last_ts
        ctl.advance("dispatched", new, log=self.log_id)
        ctl.add_stat("dispatch_records", records)
        ctl.add_stat("dispatch_units", units)
        ctl.add_stat("dispatch_batches")
        ctl.add_stat("dispatch_ns_total", time.monotonic_ns() - t0)
        if self.notify_arrival:
            ctl.broadcast("dispatched")

    # -- serial (spec §10.1) -------------------------------------------------------------------
    def _dispatch_serially(self, mf: MappedFile, file_start: int, start: int, end: int,
                           raise_table: bool) -> tuple[int, str, int]:
        t0 = time.monotonic_ns()
        stop, reason, records, units, last_ts = self.kernel.dispatch(
            mf, file_start, start, end, raise_table, start + CHUNK_BYTES)
        if self.index is not None and self.kernel.index_requests:
            self._build_index()
        self._publish(file_start + stop, records, units, last_ts, t0)
        return stop, reason, records

    def _build_index(self) -> None:
        """The kernel's index requests (topic, keys, uniq_key, phy_offset, store_timestamp,
        sys_flag) hashed into one put_key_hashes call, the path a parsed batch's keys take."""
        requests = self.kernel.index_requests
        self.kernel.index_requests = []
        assert self.index is not None
        keys = b"".join(index_key_triples(*request) for request in requests)
        if keys:
            self._index_done(len(keys) // 24, self.index.put_key_hashes(keys))

    def _index_done(self, keys: int, ok: bool) -> None:
        self.ctl.add_stat("index_keys", keys)
        if not ok:
            self.ctl.add_stat("index_errors")
            if not self.index_error:
                self.index_error = True
                self.ctl.set_log_running_flag("WRITE_INDEX_FILE_ERROR", self.log_id)

    def heal_index(self) -> bool:
        """After an index error (no index file could be created or grown: a full disk), clear
        WRITE_INDEX_FILE_ERROR once the index can take keys again (tried at most once every
        index.CREATE_RETRY_INTERVAL_S). RocketMQ keeps the flag until the broker restarts,
        refusing every put meanwhile; here puts resume when space returns. True if healed."""
        if not self.index_error or self.index is None or not self.index.writable():
            return False
        self.index_error = False
        self.ctl.set_log_running_flag("WRITE_INDEX_FILE_ERROR", self.log_id, False)
        log.warning("index files%s can be written again: WRITE_INDEX_FILE_ERROR cleared%s",
                    f" of CommitLog {self.log_id}" if self.log_id else "",
                    ", puts are accepted" if "WRITE_INDEX_FILE_ERROR" not in self.ctl.running_flags()
                    else " for this log (another log's index still fails)")
        return True

    # -- concurrent (spec §10.2) ---------------------------------------------------------------
    def _dispatch_batches(self, mf: MappedFile, file_start: int, start: int, end: int, raise_table: bool,
                          max_bytes: int) -> tuple[int, str, int]:
        """Cut [start, end) of one file into batches, parse them in the pool (at most
        pool_threads + 1 ahead of the one being applied) and apply them in order. Returns
        (stop, reason, records) like the serial kernel. While the oldest batch is still being
        parsed, this thread parses the newest one no pool thread has started."""
        parser = self.parser
        pending: deque[_Pending] = deque()  # in batch id order: oldest first
        pos, cut_reason, records = start, "batch", 0
        window = self.pool_threads + 1
        try:
            while True:
                while (cut_reason == "batch" and pos < end and len(pending) < window
                       and not (max_bytes and pos - start >= max_bytes)):
                    cut, cut_reason, n = parser.cut(mf, pos, end, self.batch_bytes)
                    if cut > pos:
                        args = (mf, file_start, pos, cut, n)
                        only = not pending and cut_reason != "batch"  # no hand-off for a single batch
                        pending.append(_Pending(args, None if only else self._executor().submit(parser.parse, *args)))
                    pos = cut
                if not pending:
                    # everything cut is applied: stopped at the end, a blank or a bad pre-check
                    return pos, cut_reason if cut_reason in ("blank", "invalid") else "end", records
                while not pending[0].done() and any(p.steal(parser) for p in reversed(pending)):
                    pass
                batch = pending.popleft().result(parser)
                self._apply(batch, raise_table)
                records += batch.count
                if batch.reason != "end":  # a record the pre-check let through does not parse
                    return batch.stop, batch.reason, records
        finally:
            for item in pending:
                item.cancel()

    def _apply(self, batch: ParsedBatch, raise_table: bool) -> None:
        t0 = time.monotonic_ns()
        units = self.kernel.apply(batch, raise_table)
        if self.index is not None and batch.index_key_count:
            self._index_done(batch.index_key_count, self.index.put_key_hashes(batch.index_keys))
        self._publish(batch.file_from + batch.stop, batch.count, units, batch.last_store_timestamp, t0)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.pool_threads, thread_name_prefix="mqstore-dispatch-batch")
        return self._pool


class _Pending:
    """A cut batch on its way to being applied: parsed by a pool thread (future), or by the
    reput thread if it gets to it before any pool thread does (no future, or a cancelled one)."""

    __slots__ = ("args", "batch", "future")

    def __init__(self, args: tuple[MappedFile, int, int, int, int], future: Future[ParsedBatch] | None) -> None:
        self.args = args
        self.future = future
        self.batch: ParsedBatch | None = None

    def done(self) -> bool:
        return self.batch is not None or (self.future is not None and self.future.done())

    def steal(self, parser: BatchParser) -> bool:
        """Parse here if no pool thread has started it; True if this parsed it."""
        if self.batch is not None or (self.future is not None and not self.future.cancel()):
            return False
        self.batch = parser.parse(*self.args)
        return True

    def result(self, parser: BatchParser) -> ParsedBatch:
        if self.batch is None and not self.steal(parser):
            assert self.future is not None
            self.batch = self.future.result()
        assert self.batch is not None
        return self.batch

    def cancel(self) -> None:
        if self.future is not None:
            self.future.cancel()
