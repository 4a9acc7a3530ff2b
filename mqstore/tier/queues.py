"""The tier queue index (tiered-storage spec §6.2): per queue, which segment holds which queue
offsets, so a tier read needs no per-message local state.

``ROOT/tier/queues/<topic>/<queueId>`` is an array of 32-byte big-endian entries, one per
(queue, segment), in queue-offset order:

    first queue offset (8) · record count (4) · log id (4) · file start (8) · min store timestamp (8)

The tierer appends a segment's entries (one ``write`` each) and syncs them *before* the
segment's COPY_FINISHED record, so no COPY_FINISHED segment lacks its entries; entries of a copy
that never finished are dropped by recovery (:func:`drop_segment_entries`) or replaced when the
file is copied again. Readers binary-search with ``pread`` and see appends by re-reading the
size (and see a rewrite by the inode changing); a torn last entry (a size that is not a multiple
of 32) is ignored by readers and cut by the writer.

Tier retention cuts from the front: the leading entries of deleted segments are marked dead in
place (record count set to 0, one aligned 4-byte write: a live entry always counts at least one
record), and once more than half the entries are dead the file is rewritten without them
(``.tmp``, fsync, rename, directory fsync).

Topic directory names are the ConsumeQueue's (``consumequeue/<topic>/<queueId>``): the topic
as it is, refused by the same rule (``mqstore.queue.consume_queue.queue_problem``) when it could
not name a ConsumeQueue directory ('..', '/', NUL, too long, not TopicValidator's characters).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mqstore.errors import TierError
from mqstore.layout import MAX_LOGS
from mqstore.queue.consume_queue import MAX_QUEUE_ID, queue_problem
from mqstore.tier.manifest import TIER_DIR, fsync_dir

__all__ = ["ENTRY", "ENTRY_SIZE", "QUEUES_DIR", "QueueEntry", "TierQueueIndex", "drop_segment_entries",
           "iter_queue_indexes", "queue_index_path"]

QUEUES_DIR = "queues"
ENTRY = struct.Struct(">qIIqq")
ENTRY_SIZE = ENTRY.size  # 32
_COUNT_AT = 8  # the record count's position inside an entry
_ZERO_COUNT = b"\0\0\0\0"


@dataclass(frozen=True)
class QueueEntry:
    """One (queue, segment) row: the segment of log ``log`` whose file starts at ``file_start``
    holds the queue's records [first_queue_offset, first_queue_offset + record_count)."""

    first_queue_offset: int
    record_count: int
    log: int
    file_start: int
    min_store_ts: int

    @property
    def end_queue_offset(self) -> int:
        return self.first_queue_offset + self.record_count

    def pack(self) -> bytes:
        return ENTRY.pack(self.first_queue_offset, self.record_count, self.log, self.file_start, self.min_store_ts)

    @classmethod
    def unpack(cls, data: bytes | memoryview, at: int = 0) -> QueueEntry:
        return cls(*ENTRY.unpack_from(data, at))


def _tier(root_or_tier_dir: str) -> str:
    norm = os.path.normpath(root_or_tier_dir)
    return norm if os.path.basename(norm) == TIER_DIR else os.path.join(norm, TIER_DIR)


def queue_index_path(root_or_tier_dir: str, topic: str, queue_id: int) -> str:
    """ROOT/tier/queues/<topic>/<queueId>; TierError for a (topic, queue id) no ConsumeQueue
    directory could have."""
    if type(queue_id) is not int or queue_id > MAX_QUEUE_ID:
        raise TierError(f"tier queue index of {topic!r}: queue id {queue_id!r} is not an int 0 .. {MAX_QUEUE_ID}")
    why = queue_problem(topic, queue_id) if isinstance(topic, str) else f"topic {topic!r} is not a str"
    if why is not None:
        raise TierError(f"no tier queue index for topic {topic!r} queue {queue_id}: {why}")
    return os.path.join(_tier(root_or_tier_dir), QUEUES_DIR, topic, str(queue_id))


def iter_queue_indexes(root_or_tier_dir: str) -> Iterator[tuple[str, int, str]]:
    """(topic, queue id, path) of every tier queue index; names no queue could have are skipped."""
    base = os.path.join(_tier(root_or_tier_dir), QUEUES_DIR)
    try:
        topics = sorted(os.listdir(base))
    except FileNotFoundError:
        return
    for topic in topics:
        topic_dir = os.path.join(base, topic)
        if not os.path.isdir(topic_dir):
            continue
        for name in sorted(os.listdir(topic_dir)):
            if not name.isdigit() or name.endswith(".tmp") or int(name) > MAX_QUEUE_ID:
                continue
            if queue_problem(topic, int(name)) is None and os.path.isfile(os.path.join(topic_dir, name)):
                yield topic, int(name), os.path.join(topic_dir, name)


class TierQueueIndex:
    """One queue's tier queue index. Every process may read; the tierer opens it ``writable``
    (one writer: the tierer is alone under the store's lock)."""

    def __init__(self, root_or_tier_dir: str, topic: str, queue_id: int, *, writable: bool = False) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.path = queue_index_path(root_or_tier_dir, topic, queue_id)
        self.writable = writable
        self._fd = -1
        self._ino = -1
        self._size = 0  # the writer's own end (whole entries)
        if writable:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._open_writer()

    def __repr__(self) -> str:
        return f"TierQueueIndex({self.topic!r}, {self.queue_id}, {self.path!r})"

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._ino = -1

    def __enter__(self) -> TierQueueIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------

    def _open_writer(self) -> None:
        self.close()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        st = os.fstat(self._fd)
        self._ino = st.st_ino
        self._size = st.st_size - st.st_size % ENTRY_SIZE
        if self._size != st.st_size:
            os.ftruncate(self._fd, self._size)  # a torn last entry
            os.fsync(self._fd)

    def _count(self) -> int:
        """Whole entries now; a reader reopens when the file was rewritten (a new inode)."""
        if self.writable:
            return self._size // ENTRY_SIZE
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.close()
            return 0
        if st.st_ino != self._ino:
            self.close()
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return 0
            fst = os.fstat(self._fd)
            self._ino = fst.st_ino
            return fst.st_size // ENTRY_SIZE
        return os.fstat(self._fd).st_size // ENTRY_SIZE

    def _get(self, i: int) -> QueueEntry:
        data = os.pread(self._fd, ENTRY_SIZE, i * ENTRY_SIZE)
        if len(data) != ENTRY_SIZE:
            raise TierError(f"{self.path}: entry {i} is short ({len(data)} bytes): the file shrank while read")
        return QueueEntry.unpack(data)

    def _first_live(self, n: int) -> int:
        """The index of the first live entry (dead ones, count 0, are a prefix)."""
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._get(mid).record_count == 0:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def __len__(self) -> int:
        """Live entries."""
        n = self._count()
        return n - self._first_live(n)

    def entries(self) -> list[QueueEntry]:
        """Every live entry, in queue-offset order."""
        n = self._count()
        if n == 0:
            return []
        data = os.pread(self._fd, n * ENTRY_SIZE, 0)
        out = [QueueEntry.unpack(data, i * ENTRY_SIZE) for i in range(len(data) // ENTRY_SIZE)]
        return [e for e in out if e.record_count]

    def min_offset(self) -> int | None:
        """The first queue offset the tier holds for the queue (None: nothing)."""
        n = self._count()
        first = self._first_live(n)
        return self._get(first).first_queue_offset if first < n else None

    def max_offset(self) -> int | None:
        """One past the last queue offset the tier holds (None: nothing)."""
        n = self._count()
        if n == 0 or self._first_live(n) == n:
            return None
        return self._get(n - 1).end_queue_offset

    def find(self, queue_offset: int) -> QueueEntry | None:
        """The live entry whose segment holds queue_offset, or None (before the first, past the
        last, or in a hole: offsets no segment holds)."""
        n = self._count()
        lo, hi = 0, n  # the first entry whose first offset is past queue_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self._get(mid).first_queue_offset <= queue_offset:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        entry = self._get(lo - 1)
        if entry.record_count == 0 or queue_offset >= entry.end_queue_offset:
            return None
        return entry

    def find_after(self, queue_offset: int) -> QueueEntry | None:
        """The first live entry holding queue_offset or later offsets (a reader in a hole moves on
        to it), or None."""
        n = self._count()
        lo, hi = self._first_live(n), n  # the first entry that ends past queue_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self._get(mid).end_queue_offset <= queue_offset:
                lo = mid + 1
            else:
                hi = mid
        return self._get(lo) if lo < n else None

    def find_by_time(self, store_ts: int) -> QueueEntry | None:
        """spec §6.4 get_offset_in_queue_by_time: the live entry to search for the first record
        stored at or after store_ts: the last whose min store timestamp is below store_ts (that
        segment may still hold it), else the first live entry; None when there is none. If the
        segment holds no record that late, the answer is the next entry's first offset."""
        n = self._count()
        first = self._first_live(n)
        lo, hi = first, n  # the first entry whose min store timestamp is >= store_ts
        while lo < hi:
            mid = (lo + hi) // 2
            if self._get(mid).min_store_ts < store_ts:
                lo = mid + 1
            else:
                hi = mid
        if first == n:
            return None
        return self._get(max(first, lo - 1))

    # -- writing (the tierer) ----------------------------------------------------------------

    def _need_writer(self) -> None:
        if not self.writable or self._fd < 0:
            raise TierError(f"{self.path}: the tier queue index is not open for writing")

    def append(self, entry: QueueEntry) -> None:
        """Append entry with one write (not synced: sync() before the segment's COPY_FINISHED).
        Trailing entries of the same segment (a copy that crashed before its COPY_FINISHED) are
        replaced. TierError for an entry that is not after the last one."""
        self._need_writer()
        if entry.record_count < 1 or entry.first_queue_offset < 0 or entry.file_start < 0 or entry.min_store_ts < 0:
            raise TierError(f"{self.path}: entry {entry} needs a record count >= 1 and offsets and timestamp >= 0")
        if entry.log >= MAX_LOGS:
            raise TierError(f"{self.path}: entry {entry} names log {entry.log}, past the last ({MAX_LOGS - 1})")
        self.drop_segment(entry.log, entry.file_start, sync=False)
        n = self._size // ENTRY_SIZE
        if n:
            last = self._get(n - 1)
            if entry.first_queue_offset < last.end_queue_offset or (
                    entry.log == last.log and entry.file_start <= last.file_start):
                raise TierError(f"{self.path}: entry {entry} does not follow the last one {last} (queue offsets "
                                "and, within a log, file starts must increase)")
        data = entry.pack()
        if os.pwrite(self._fd, data, self._size) != ENTRY_SIZE:
            os.ftruncate(self._fd, self._size)
            raise TierError(f"{self.path}: a short write appending {entry}")
        self._size += ENTRY_SIZE

    def sync(self) -> None:
        self._need_writer()
        os.fsync(self._fd)

    def drop_segment(self, log: int, file_start: int, *, sync: bool = True) -> int:
        """Cut the trailing entries of segment (log, file_start) (a copy that never reached
        COPY_FINISHED, spec §4.3); how many were cut."""
        self._need_writer()
        n = keep = self._size // ENTRY_SIZE
        while keep:
            e = self._get(keep - 1)
            if e.log != log or e.file_start != file_start:
                break
            keep -= 1
        if keep < n:
            self._size = keep * ENTRY_SIZE
            os.ftruncate(self._fd, self._size)
            if sync:
                os.fsync(self._fd)
        return n - keep

    def cut_front(self, is_dead: Callable[[QueueEntry], bool]) -> int:
        """Tier retention (spec §8): mark the leading entries is_dead says are gone (their
        segments deleted from the tier) dead, synced; rewrite the file without its dead entries
        once they are more than half. How many entries were newly marked."""
        self._need_writer()
        n = self._size // ENTRY_SIZE
        i = self._first_live(n)
        marked = 0
        while i < n and is_dead(self._get(i)):
            os.pwrite(self._fd, _ZERO_COUNT, i * ENTRY_SIZE + _COUNT_AT)
            i += 1
            marked += 1
        if marked:
            os.fsync(self._fd)
        if i * 2 > n:
            self._rewrite(i, n)
        return marked

    def _rewrite(self, first_live: int, n: int) -> None:
        data = os.pread(self._fd, (n - first_live) * ENTRY_SIZE, first_live * ENTRY_SIZE)
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        self._open_writer()


def drop_segment_entries(root_or_tier_dir: str, log: int, file_start: int) -> int:
    """Recovery (manifest Step.DROP_QUEUE_ENTRIES): cut segment (log, file_start)'s trailing
    entries from every tier queue index; how many were cut."""
    cut = 0
    for topic, queue_id, _path in iter_queue_indexes(root_or_tier_dir):
        with TierQueueIndex(root_or_tier_dir, topic, queue_id, writable=True) as index:
            cut += index.drop_segment(log, file_start)
    return cut
