"""A read-only view of a store directory for bulk readers (the Spark data source, exports):
what has been dispatched, never more, with no lock taken and nothing written.

- A store a node (or any owner) is serving: the queues end at the unit counts its dispatcher
  published in the control block, the CommitLog at the dispatched position, and records
  below the control block's ``min_phy`` (deleted by retention) are skipped.
- A store that was shut down cleanly: the queues end at their last valid unit, the log where
  its records end.
- A store that crashed (``abort`` left, nobody running) is refused: its ConsumeQueues may
  point past the valid end of the log until an open recovers it.

Files are mapped read-only (CommitLog files write-protected, as ``mqstore inspect`` does), so a
view taken while a node writes is a consistent snapshot of what was dispatched when it was
opened. A file that retention deletes later stays readable through the mapping.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqstore.log import _shm
from mqstore.queue._arrow import RecordSource
from mqstore.queue._reads import LogMap
from mqstore.queue._search import WARM_BYTES_DEFAULT
from mqstore.errors import MQStoreError
from mqstore.queue.files import (
    UNIT,
    QueueFiles,
    ReadOnlyFileQueue,
    commit_log_count,
    log_end,
    log_files,
    open_commitlog,
    queue_dirs,
    queue_info,
    queue_log,
)
from mqstore.layout import CONTROL_BLOCK_NAME, log_base, log_of
from mqstore.log import clean_close
from mqstore.queue.reads import offset_by_time_in_files
from mqstore.log.directory import lock_state, require_store


class StoreNotReadableError(MQStoreError):
    """The store cannot be read consistently as it is (it crashed and was not recovered)."""

    hint = "open it once (MessageStore(dir), or `mqstore node dir`) so it recovers, or read it while a node serves it"


def first_where(lo: int, hi: int, passes: Callable[[int], bool]) -> int:
    """The first offset in [lo, hi) for which passes holds (False then True along the range);
    hi when there is none."""
    while lo < hi:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class QueueRange:
    """A ConsumeQueue's readable offsets: [min_offset, max_offset)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int

    @property
    def key(self) -> str:
        """"topic/queueId", the key of offsets in options and checkpoints."""
        return f"{self.topic}/{self.queue_id}"


class StoreSnapshot:
    """See the module docstring. Use as a context manager or call close()."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = require_store(os.fspath(root))
        state = lock_state(self.root)
        self.live = state["status"] == "running"
        if state["status"] == "crashed":
            raise StoreNotReadableError(f"{self.root} was not shut down cleanly (its abort file is there) and no "
                                        "store is running on it: its ConsumeQueues may point past the valid end "
                                        "of the CommitLog")
        self._ctl: Any = None
        self._log: ReadOnlyFileQueue | None = None
        #: every CommitLog's files, by log id (one unless commit_log_count > 1); _log is log 0's
        self._logs: list[ReadOnlyFileQueue] = []
        self._log_maps: dict[int, LogMap] = {}
        self._queues: dict[tuple[str, int], QueueFiles] = {}
        self._dirs = {(t, q): d for t, q, d in queue_dirs(self.root)}
        try:
            if self.live:
                self._ctl = _shm.ControlBlock.attach(os.path.join(self.root, CONTROL_BLOCK_NAME), readonly=True)
            count = commit_log_count(self.root)
            for k in range(count):
                self._logs.append(open_commitlog(self.root, log=k if count > 1 else None))
            self._log = self._logs[0]
            records = self._clean_close_records(count) if not self.live else {}
            #: per log: the first readable offset and the end of what was dispatched
            self.min_phys: list[int] = []
            self.log_ends: list[int] = []
            for k, files_k in enumerate(self._logs):
                files = files_k.files
                first = files[0].file_from if files else log_base(k)
                if self.live:
                    self.min_phys.append(max(first, self._ctl.get("min_phy", log=k)))
                    self.log_ends.append(self._ctl.get("dispatched", log=k))
                else:
                    self.min_phys.append(first)
                    self.log_ends.append(self._closed_log_end(files_k, records.get(k)) if files else log_base(k))
            #: log 0's (the store's, with one CommitLog)
            self.min_phy, self.log_end = self.min_phys[0], self.log_ends[0]
        except BaseException:
            self.close()
            raise

    @property
    def log_count(self) -> int:
        """The store's CommitLogs (commit_log_count)."""
        return len(self._logs)

    def log_of(self, topic: str, queue_id: int) -> int:
        """The CommitLog topic/queue_id is written to (docs/parallel-commitlogs.md)."""
        return queue_log(topic, queue_id, len(self._logs))

    def log_map(self, log: int = 0) -> LogMap:
        """A LogMap over CommitLog log's files (made once per view)."""
        got = self._log_maps.get(log)
        if got is None:
            files = self._logs[log]
            got = self._log_maps[log] = LogMap(files.files, files.file_size)
        return got

    def readable(self, phy: int) -> bool:
        """Whether phy lies in what this view reads of the log it names."""
        k = log_of(phy) if phy >= 0 else -1
        return 0 <= k < len(self._logs) and self.min_phys[k] <= phy < self.log_ends[k]

    def _clean_close_records(self, count: int) -> dict[int, clean_close.CleanClose]:
        if count > 1:
            return clean_close.read_logs(self.root, count)[0]
        record, _ = clean_close.read(self.root)
        return {0: record} if record is not None else {}

    @staticmethod
    def _closed_log_end(files: ReadOnlyFileQueue, record: clean_close.CleanClose | None) -> int:
        """Where a closed store's CommitLog ends: its clean-close record's write position when
        the record agrees with the files (checked in constant time, as an open checks it), else
        a scan of every file. Each Spark task opens a snapshot: a scan here read the whole
        CommitLog once per task (3 GB at 3M x 1 KiB, every page faulted in) before reading
        anything."""
        if record is not None and not clean_close.mismatch(files, record):
            return record.wrote
        return log_end(log_files(files, None))

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        for q in self._queues.values():
            q.close()
        self._queues.clear()
        for files in self._logs:
            files.close()
        self._logs.clear()
        self._log = None
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None

    def __enter__(self) -> StoreSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the CommitLog -----------------------------------------------------------------------
    def record_source(self, log: int = 0) -> RecordSource:
        """CommitLog log's mapped files for the Arrow kernel (valid while this view is open)."""
        queue = self._logs[log]
        files = queue.files
        return RecordSource(files[0].file_from if files else log_base(log), max(1, queue.file_size),
                            [memoryview(mf) for mf in files])

    def log_spans(self) -> list[tuple[int, int]]:
        """[start, end) of the readable records of each CommitLog file, in log order (every
        log's, one log after the other: a span never crosses logs)."""
        out = []
        for k, queue in enumerate(self._logs):
            for mf in queue.files:
                start = max(mf.file_from, self.min_phys[k])
                end = min(mf.file_from + queue.file_size, self.log_ends[k])
                if start < end:
                    out.append((start, end))
        return out

    # -- ConsumeQueues -----------------------------------------------------------------------
    def queues(self) -> list[QueueRange]:
        """Every queue with its readable offsets, by topic and queue id."""
        return [self.queue(topic, queue_id) for topic, queue_id in sorted(self._dirs)]

    def queue(self, topic: str, queue_id: int) -> QueueRange:
        """One queue's readable offsets (KeyError if the store has no such queue)."""
        info = queue_info(self._queue_files(topic, queue_id), self.min_phys[self.log_of(topic, queue_id)])
        max_offset = info.max_offset
        if self.live:
            published = self._ctl.table_get_dispatched(topic, queue_id)
            max_offset = min(max_offset, published if published is not None else 0)
        return QueueRange(topic, queue_id, min(info.min_offset, max_offset), max_offset)

    def offset_by_time(self, q: QueueRange, timestamp: int) -> int:
        """The store's time lookup (spec §3 getOffsetInQueueByTime, MessageStore.
        get_offset_in_queue_by_time) over this view of queue q (from queues() or queue()):
        the queue offset whose store time is nearest timestamp (ms), the earliest of equal
        ones; the max offset when the queue holds nothing readable."""
        queue_files = self._queue_files(q.topic, q.queue_id).files
        if not queue_files or q.max_offset <= q.min_offset:
            return q.max_offset
        assert self._log is not None
        size = len(queue_files[0][2])
        # the search kernel needs addresses: the files again, as write-protected MappedFiles
        files = ReadOnlyFileQueue.of_directory(self._dirs[(q.topic, q.queue_id)], size, "ConsumeQueue",
                                               contiguous=False)

        def unit_range(mf: Any) -> tuple[int, int]:
            lo = max(0, q.min_offset * UNIT - mf.file_from)
            return lo, min(q.max_offset * UNIT - mf.file_from, size) - UNIT

        k = self.log_of(q.topic, q.queue_id)
        try:
            return offset_by_time_in_files(files.files, unit_range, self.log_map(k), self.min_phys[k], timestamp,
                                           WARM_BYTES_DEFAULT, q.max_offset).offset
        finally:
            files.close()

    def store_time(self, q: QueueRange, offset: int) -> int | None:
        """The store time (ms) of queue q's message at offset; None when it is not readable."""
        unit = self.units(q.topic, q.queue_id, offset, offset + 1)
        if len(unit) < UNIT:
            return None
        phy = int.from_bytes(unit[:8], "big", signed=True)
        if not self.readable(phy):
            return None
        ts = self.log_map(log_of(phy)).store_timestamp(phy)
        return ts if ts >= 0 else None

    def first_offset_at(self, q: QueueRange, timestamp: int) -> int:
        """The first offset of queue q whose store time is >= timestamp (ms), exactly (Kafka's
        offsetsForTimes); q.max_offset when there is none. Store times only grow along a queue
        (each is taken under the put lock): the time lookup's nearest message is the hint, and
        a galloping search from it finds the first one at or after timestamp."""
        def at_or_after(offset: int) -> bool:
            ts = self.store_time(q, offset)
            return ts is not None and ts >= timestamp

        hint = self.offset_by_time(q, timestamp)
        if hint >= q.max_offset:
            return q.max_offset
        step = 1
        if at_or_after(hint):  # the answer is hint or before it
            hi = hint
            while True:
                probe = hi - step
                if probe < q.min_offset:
                    lo = q.min_offset
                    break
                if not at_or_after(probe):
                    lo = probe + 1
                    break
                hi, step = probe, step * 2
        else:  # the answer is after hint (max_offset when no message is late enough)
            lo = hint + 1
            probe = hint + step
            while probe < q.max_offset and not at_or_after(probe):
                lo, step = probe + 1, step * 2
                probe = hint + step
            hi = min(probe, q.max_offset)
        return first_where(lo, hi, at_or_after)  # hi is at or after timestamp, or is max_offset

    def units(self, topic: str, queue_id: int, start: int, end: int) -> bytes:
        """The 20-byte units of queue offsets [start, end) (a unit no file holds any more is
        left out)."""
        return self.units_at(topic, queue_id, start, end)[1]

    def units_at(self, topic: str, queue_id: int, start: int, end: int) -> tuple[int, bytes]:
        """(the queue offset of the first unit returned, the 20-byte units of queue offsets
        [start, end) that files still hold). Retention deletes a queue's files from its head, so
        those units are one run; the offset is -1 when they are not (a file missing between two
        others) or there are none."""
        files = self._queue_files(topic, queue_id)
        parts: list[Any] = []
        lo, hi = start * UNIT, end * UNIT
        first, end, one_run = -1, -1, True
        for file_from, _, buf in files.files:
            a, b = max(lo, file_from), min(hi, file_from + len(buf))
            if a < b:
                if not parts:
                    first = a
                elif a != end:
                    one_run = False
                end = b
                parts.append(buf[a - file_from:b - file_from])
        return (first // UNIT if first >= 0 and one_run else -1), b"".join(parts)

    def _queue_files(self, topic: str, queue_id: int) -> QueueFiles:
        got = self._queues.get((topic, queue_id))
        if got is None:
            directory = self._dirs.get((topic, queue_id))
            if directory is None:
                raise KeyError(f"{self.root} has no ConsumeQueue {topic}/{queue_id}")
            got = self._queues[(topic, queue_id)] = QueueFiles(topic, queue_id, directory)
        return got
