"""ConsumeQueue (spec §3): the per-queue index of 20-byte units into the CommitLog.

``ConsumeQueue`` adds files, recovery, truncation, min-offset correction and flush to the
compiled append kernel; ``ConsumeQueueTable`` holds every queue of a store
(``consumequeue/<topic>/<queueId>/``), loads and recovers them, and flushes them.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from mqstore._consumequeue import (
    CQ_STORE_UNIT_SIZE,
    ConsumeQueueKernel,
    filler_units,
    scan_units,
    truncate_point,
)
from mqstore._mapped import MappedFile
from mqstore.mapped_file_queue import MappedFileQueue

log = logging.getLogger("mqstore.consumequeue")

UNIT = CQ_STORE_UNIT_SIZE
RECOVER_LAST_FILES = 3
OS_PAGE_SIZE = 4096


@dataclass
class QueueRecovery:
    """What recovery of one queue found: the kept end and what was dropped past it."""

    topic: str
    queue_id: int
    max_offset: int = 0
    dropped_units: int = 0
    deleted_files: int = 0


class ConsumeQueue(ConsumeQueueKernel):
    """One queue's files and state. Appends go through the compiled kernel (put_unit)."""

    def __init__(self, root: str, topic: str, queue_id: int, file_size: int) -> None:
        super().__init__(topic, queue_id, file_size)
        self.store_path = os.path.join(root, topic, str(queue_id))
        self.files = MappedFileQueue(self.store_path, file_size)
        self.flushed_where = 0
        self._flush_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self.topic!r}, {self.queue_id}, min={self.min_offset_in_queue}, "
                f"max={self.max_offset_in_queue})")

    # -- files -----------------------------------------------------------------------------
    def load(self) -> None:
        self.files.load()

    def next_file(self, expect: int) -> MappedFile:
        """Called by the kernel when the unit at byte offset expect needs a file: the last
        file if it has room, else a new one (spec §3 step 2), with the first-file pre-fill of
        step 3 when the queue starts above offset 0."""
        last = self.files.last()
        if last is not None and last.wrote_position < self.file_size:
            return last
        first_ever = last is None
        start = expect - expect % self.file_size if last is None else last.file_from + self.file_size
        # files stay contiguous: a gap of whole files is filler-filled by the kernel, file by file
        mf = self.files.create(start)
        mf.wrote_position = mf.committed_position = mf.flushed_position = 0
        if first_ever and expect > 0:
            within = expect % self.file_size
            if within:
                mf.write_at(0, filler_units(within // UNIT))
            mf.wrote_position = within
            self.min_logic_offset = expect
            self.flushed_where = expect
        elif first_ever:
            self.flushed_where = start
        return mf

    # -- offsets ---------------------------------------------------------------------------
    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // UNIT

    @property
    def message_total(self) -> int:
        return self.max_offset_in_queue - self.min_offset_in_queue

    def get_index_buffer(self, queue_offset: int) -> tuple[MappedFile, int, int] | None:
        """(file, start, end) of the units from queue_offset to the end of its file's written
        part (spec §3 getIndexBuffer; never crosses a file), or None."""
        offset = queue_offset * UNIT
        if offset < self.min_logic_offset:
            return None
        mf = self.files.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from
        end = self.max_logic_offset - mf.file_from if mf is self.current_file else mf.wrote_position
        if end > self.file_size:
            end = self.file_size
        if pos >= end:
            return None
        return mf, pos, end

    def unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(phyOffset, size, tagsCode) of one unit, or None."""
        got = self.get_index_buffer(queue_offset)
        if got is None:
            return None
        mf, pos, _ = got
        raw = mf.read(pos, UNIT)
        return (int.from_bytes(raw[0:8], "big", signed=True), int.from_bytes(raw[8:12], "big", signed=True),
                int.from_bytes(raw[12:20], "big", signed=True))

    def get_last_offset(self) -> int:
        """phyOffset + size of the last valid unit, -1 if none (spec §3 getLastOffset)."""
        return self.max_physic_offset

    def correct_min_offset(self, min_phy: int) -> None:
        """minLogicOffset = first unit of the first file whose record is at or after min_phy
        (spec §3 correctMinOffset); unchanged when there is none."""
        first = self.files.first()
        if first is None:
            return
        end = first.wrote_position if first is not self.current_file else self.max_logic_offset - first.file_from
        view = memoryview(first)
        for pos in range(0, end, UNIT):
            phy = int.from_bytes(view[pos:pos + 8], "big", signed=True)
            size = int.from_bytes(view[pos + 8:pos + 12], "big", signed=True)
            if size == 0x7FFFFFFF and phy == 0:
                continue
            if phy >= min_phy:
                self.min_logic_offset = max(self.min_logic_offset, first.file_from + pos)
                break
        view.release()

    # -- recovery (spec §3 "Recovery", truncateDirtyLogicFiles) ------------------------------
    def recover(self) -> QueueRecovery:
        report = QueueRecovery(self.topic, self.queue_id)
        files = self.files.files
        if not files:
            self.set_current_file(None)
            return report
        index = max(0, len(files) - RECOVER_LAST_FILES)
        valid_end = files[index].file_from
        max_phy = -1
        for mf in files[index:]:
            end, last = scan_units(mf, 0, self.file_size)
            if last >= 0:
                max_phy = last
            valid_end = mf.file_from + end
            if end < self.file_size:
                break
        if max_phy < 0 and index > 0:
            max_phy = self._last_phy_before(files[index - 1])
        self.max_physic_offset = max_phy
        if files[0].file_from > self.min_logic_offset:
            self.min_logic_offset = files[0].file_from
        removed, _ = self.files.truncate_dirty_files(valid_end)
        report.deleted_files = len(removed)
        self._after_truncate(valid_end)
        report.max_offset = self.max_offset_in_queue
        return report

    def _last_phy_before(self, mf: MappedFile) -> int:
        _, last = scan_units(mf, 0, self.file_size)
        return last

    def _after_truncate(self, valid_end: int) -> None:
        last = self.files.last()
        self.set_current_file(last)
        self.flushed_where = valid_end
        if last is None:
            self.min_logic_offset = max(self.min_logic_offset, valid_end)

    def truncate_dirty_logic_files(self, phy_offset: int) -> int:
        """Drop every unit whose record starts at or after phy_offset (spec §3). Returns the
        number of units dropped."""
        before = self.max_offset_in_queue
        while True:
            last = self.files.last()
            if last is None:
                break
            end = self.max_logic_offset - last.file_from if last is self.current_file else last.wrote_position
            pos, kept_last = truncate_point(last, 0, end, phy_offset)
            if pos == 0:
                # the file's first unit is already past phy_offset (or invalid): it goes whole
                self.files.delete_last_file()
                self.set_current_file(self.files.last())
                continue
            self.files.truncate_dirty_files(last.file_from + pos)
            self.set_current_file(self.files.last())
            break
        self.max_physic_offset = self._recompute_max_phy()
        if self.files.last() is None:
            self.min_logic_offset = min(self.min_logic_offset, before * UNIT)
        return max(0, before - self.max_offset_in_queue)

    def _recompute_max_phy(self) -> int:
        for mf in reversed(self.files.files):
            end = self.max_logic_offset - mf.file_from if mf is self.current_file else mf.wrote_position
            _, last = scan_units(mf, 0, end)
            if last >= 0:
                return last
        return -1

    # -- flush (spec §3 last bullet) ----------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """msync the units written since the last flush if at least least_pages pages are
        dirty (0 = anything). Returns True if something was flushed."""
        with self._flush_lock:
            target = self.max_logic_offset
            start = self.flushed_where
            if target <= start:
                return False
            same_file = start // self.file_size == (target - 1) // self.file_size
            if least_pages > 0 and same_file and target // OS_PAGE_SIZE - start // OS_PAGE_SIZE < least_pages:
                return False
            self.files.flush_between(start, target)
            self.flushed_where = target
            return True

    def destroy(self) -> None:
        self.set_current_file(None)
        self.files.close()
        shutil.rmtree(self.store_path, ignore_errors=True)
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self.flushed_where = 0

    def close(self) -> None:
        self.sync_position()
        self.set_current_file(None)
        self.files.close()


class ConsumeQueueTable:
    """Every ConsumeQueue of a store, by (topic, queue_id)."""

    def __init__(self, root: str, file_size: int) -> None:
        self.root = root
        self.file_size = file_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.RLock()

    def load(self) -> None:
        """Map every ``<topic>/<int queueId>`` directory (others are ignored, spec §5.2)."""
        if not os.path.isdir(self.root):
            return
        for topic in sorted(os.listdir(self.root)):
            topic_dir = os.path.join(self.root, topic)
            if not os.path.isdir(topic_dir):
                continue
            for qid in sorted(os.listdir(topic_dir)):
                if not qid.isdigit() or not os.path.isdir(os.path.join(topic_dir, qid)):
                    continue
                cq = ConsumeQueue(self.root, topic, int(qid), self.file_size)
                cq.load()
                self._queues[(topic, int(qid))] = cq

    def __iter__(self) -> Iterator[ConsumeQueue]:
        with self._lock:
            return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    @property
    def by_key(self) -> dict[tuple[str, int], ConsumeQueue]:
        """The live dict of queues by (topic, queue_id), for the compiled read kernel (which
        looks queues up without a Python call). Read it; change it only through this class."""
        return self._queues

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self._queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(self.root, topic, queue_id, self.file_size)
                    self._queues[(topic, queue_id)] = cq
        return cq

    def recover(self) -> list[QueueRecovery]:
        return [cq.recover() for cq in self]

    @property
    def max_physic_offset(self) -> int:
        return max((cq.max_physic_offset for cq in self), default=-1)

    def truncate_dirty(self, phy_offset: int) -> dict[tuple[str, int], int]:
        """truncateDirtyLogicFiles on every queue; returns units dropped per queue."""
        dropped = {}
        for cq in self:
            if cq.max_physic_offset > phy_offset or cq.max_physic_offset < 0:
                n = cq.truncate_dirty_logic_files(phy_offset)
                if n:
                    dropped[(cq.topic, cq.queue_id)] = n
        return dropped

    def correct_min_offsets(self, min_phy: int) -> None:
        for cq in self:
            cq.correct_min_offset(min_phy)

    def flush(self, least_pages: int = 0) -> int:
        return sum(1 for cq in self if cq.flush(least_pages))

    def destroy_all(self) -> None:
        with self._lock:
            for cq in self._queues.values():
                cq.destroy()
            self._queues.clear()

    def close(self) -> None:
        with self._lock:
            for cq in self._queues.values():
                cq.close()
            self._queues.clear()
