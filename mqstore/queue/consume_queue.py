"""ConsumeQueue (spec §3): the per-queue index of 20-byte units into the CommitLog.

``ConsumeQueue`` adds files, recovery, truncation, min-offset correction and flush to the
compiled append kernel; ``ConsumeQueueTable`` holds every queue of a store
(``consumequeue/<topic>/<queueId>/``), loads and recovers them, and flushes them.

Disk: a queue file has its full size from the start (RocketMQ's layout), but only its first
page is allocated when it is created; the kernel allocates further pages, doubling, ahead of
the units (``allocate_for_units``), so a topic that got one message costs a page per queue
written, and a full disk is an OSError of the dispatch, never a SIGBUS. The rest of the file is
a hole, which reads as zeros: what recovery takes as the end of a queue either way.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mqstore.layout import FILLER_SIZE, OS_PAGE_SIZE
from mqstore.queue._consumequeue import (
    CQ_STORE_UNIT_SIZE,
    ConsumeQueueKernel,
    filler_units,
    order_break,
    scan_units,
    truncate_point,
)
from mqstore.log._message import topic_problem_of
from mqstore.log._mapped import MappedFile
from mqstore.log._shm import log_of_queue
from mqstore.errors import NotAStoreError
from mqstore.log.mapped_file_queue import MappedFileQueue, mapped_file_names
from mqstore.log.scan import nonzero_extent

log = logging.getLogger("mqstore.consumequeue")

UNIT = CQ_STORE_UNIT_SIZE
RECOVER_LAST_FILES = 3
CQ_DESTROY_INTERVAL_FORCIBLY_MS = 60_000  # RocketMQ deleteExpiredFileByOffset: destroy(1000 * 60)
#: the longest topic a ConsumeQueue directory is made for (a file name holds at most 255 bytes;
#: topics are ASCII by TopicValidator's rule)
MAX_TOPIC_DIR_CHARS = 255
MAX_QUEUE_ID = 2**31 - 1  # a Java int
_UNIT_STRUCT = struct.Struct(">qiq")


@dataclass
class QueueRecovery:
    """What recovery of one queue found: the kept end and what was dropped past it.

    ``damage`` names what was wrong with the queue's files (a short file, units that are
    invalid or out of order while data follows them); empty when the queue simply ended.
    A damaged queue lacks units the CommitLog still has: recovery re-dispatches them."""

    topic: str
    queue_id: int
    max_offset: int = 0
    dropped_units: int = 0
    deleted_files: int = 0
    damage: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        return bool(self.damage)


class ConsumeQueue(ConsumeQueueKernel):
    """One queue's files and state. Appends go through the compiled kernel (put_unit)."""

    def __init__(self, root: str, topic: str, queue_id: int, file_size: int, log_id: int = 0) -> None:
        super().__init__(topic, queue_id, file_size, log_id)
        self.store_path = os.path.join(root, topic, str(queue_id))
        self.files = MappedFileQueue(self.store_path, file_size)
        # a new file gets one page of disk and grows with its units (the kernel allocates ahead
        # of them), so a topic with one message costs a page per queue written, not a whole file
        self.files.allocate_step = OS_PAGE_SIZE
        self.files.keep_fd = False
        self.flushed_where = 0
        self._flush_lock = threading.Lock()
        self.load_damage: list[str] = []  # what load() repaired (short files), for recover()
        self.load_dropped_units = 0
        self._followed_min_phy = 0  # follow_cleaning: the last min_phy acted on
        self.files.on_files_removed(self._forget_queue_map)

    def _forget_queue_map(self) -> None:
        """Files were removed: drop the read kernel's map of them, so their mappings (and disk
        space) go once no result taken from it is left."""
        self.queue_map = None

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self.topic!r}, {self.queue_id}, min={self.min_offset_in_queue}, "
                f"max={self.max_offset_in_queue})")

    # -- files -----------------------------------------------------------------------------
    def load(self) -> None:
        self._repair_files()
        self.files.load()

    def _repair_files(self) -> None:
        """Carry out ``plan_repair`` (see there) on the queue's directory; what it repaired is
        kept for recover() to report."""
        plan = plan_repair(self.store_path, self.file_size)
        if not plan.what:
            return
        if plan.cut is not None:
            name, _, keep = plan.cut
            with open(os.path.join(self.store_path, name), "r+b") as fh:
                fh.truncate(keep)
                fh.truncate(self.file_size)
                fh.flush()
                os.fsync(fh.fileno())
        for name in plan.delete:
            os.unlink(os.path.join(self.store_path, name))
        log.error("ConsumeQueue %s/%d: %s; the missing units are rebuilt from the CommitLog", self.topic,
                  self.queue_id, plan.what)
        self.load_damage.append(plan.what)
        self.load_dropped_units += plan.dropped_units

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
                mf.allocate_to(within)
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

    def follow(self, units: int) -> None:
        """A reader in another process than the dispatcher: the queue is built up to ``units``
        (its published count, ControlBlock.table_get_dispatched). Map the files the dispatcher
        created since and make reads end there. Never writes."""
        end = units * UNIT
        cur = self.current_file
        if cur is None or not cur.file_from < end <= cur.file_from + self.file_size:
            self.files.map_new_files()
            cur = self.files.find_mapped_file_by_offset(end - 1) if end > 0 else None
            if cur is None:
                return
        if end != self.max_logic_offset or cur is not self.current_file:
            previous = self.current_file
            if previous is not None and previous is not cur and previous.file_from < cur.file_from:
                previous.wrote_position = self.file_size  # the files before the holder are full
            cur.wrote_position = end - cur.file_from
            self.set_current_file(cur)

    def follow_cleaning(self, min_phy: int) -> None:
        """A follower: the cleaner (another process) deleted this queue's files whose units all
        point below min_phy. Forget the leading files that are gone from the disk and raise
        the min offset as the cleaner did (start of the first remaining file, then
        correct_min_offset). Runs only when min_phy rose. Never writes."""
        if min_phy <= self._followed_min_phy:
            return
        self._followed_min_phy = min_phy
        gone_end = -1
        for mf in self.files.files[:-1]:  # never the last
            if os.path.exists(mf.path):
                break
            gone_end = mf.file_from + self.file_size
        if gone_end > 0:
            self.files.drop_below(gone_end)
        first = self.files.first()
        if first is not None and first.file_from > self.min_logic_offset:
            self.min_logic_offset = first.file_from
        self.correct_min_offset(min_phy)

    def resume_at(self, units: int) -> int:
        """The dispatcher taking the queue over (a dispatcher process started or restarted):
        keep the first ``units`` units (the published count: every unit below it was written
        whole before it was published) and drop what a killed predecessor wrote after them,
        which the dispatch that follows rebuilds. Returns the units dropped."""
        end = units * UNIT
        files = self.files.files
        if files and end < files[0].file_from:
            end = files[0].file_from
        dropped = 0
        for mf in files:
            if mf.file_from + self.file_size > end:
                dropped += _nonzero_units(mf, max(0, end - mf.file_from), None)
        self.files.truncate_dirty_files(end)
        self._after_truncate(end)
        self.follow(units)
        self.max_physic_offset = self._recompute_max_phy()
        return dropped

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
        try:
            raw = mf.read(pos, UNIT)
        except ValueError:  # unmapped: retention deleted the file since the lookup (spec §14)
            return None
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

    # -- retention (spec §14) ----------------------------------------------------------------
    def delete_expired_file(self, min_phy: int, interval_forcibly_ms: int = CQ_DESTROY_INTERVAL_FORCIBLY_MS) -> int:
        """RocketMQ ConsumeQueue.deleteExpiredFile: delete the files (never the last) whose last
        unit points below min_phy, the CommitLog's new min offset, then correct_min_offset.
        Runs under the flush lock, so a flush never meets a file being deleted. Beyond
        RocketMQ, the min offset is first raised to the start of the first remaining file:
        units below it no longer exist even when that file holds no unit at or after min_phy.
        Returns the number of files deleted."""
        with self._flush_lock:
            deleted = self.files.delete_expired_file_by_offset(min_phy, UNIT, interval_forcibly_ms)
            first = self.files.first()
            if first is not None and first.file_from > self.min_logic_offset:
                self.min_logic_offset = first.file_from
        self.correct_min_offset(min_phy)
        return deleted

    # -- recovery (spec §3 "Recovery", truncateDirtyLogicFiles) ------------------------------
    def recover(self) -> QueueRecovery:
        """spec §3 Recovery: keep the units of the last three files while ``phyOffset >= 0 and
        size > 0``, and (beyond RocketMQ) while the real units' records follow each other in
        the CommitLog (phyOffset >= previous phyOffset + size). A unit breaking that order
        is dropped with the unit before it (one of the two is wrong) and everything after.
        Non-zero bytes past the kept end are damage (dropped units are counted), zeros are
        the unwritten rest of the file."""
        report = QueueRecovery(self.topic, self.queue_id, dropped_units=self.load_dropped_units,
                               damage=list(self.load_damage))
        self.load_damage = []
        self.load_dropped_units = 0
        files = self.files.files
        if not files:
            self.set_current_file(None)
            return report
        index = max(0, len(files) - RECOVER_LAST_FILES)
        valid_end = files[index].file_from
        prev_end, prev_pos = -1, -1
        if index > 0:
            prev_end, prev_pos = _last_real_unit(files[index - 1], self.file_size)
        for mf in files[index:]:
            end, _ = scan_units(mf, 0, self.file_size)
            brk, prev_end, prev_pos = order_break(mf, end, mf.file_from, prev_end, prev_pos)
            if brk >= 0:
                report.damage.append(f"unit {brk // UNIT} is out of CommitLog order with the unit before it")
                valid_end = brk
                break
            valid_end = mf.file_from + end
            if end < self.file_size:
                break
        if files[0].file_from > self.min_logic_offset:
            self.min_logic_offset = files[0].file_from
        dropped = 0
        for mf in files:
            if mf.file_from > valid_end:
                dropped += _nonzero_units(mf, 0, None)
        removed, dirty = self.files.truncate_dirty_files(valid_end)
        dropped += -(-dirty // UNIT)
        report.deleted_files = len(removed)
        self._after_truncate(valid_end)
        self.max_physic_offset = self._recompute_max_phy()
        if dropped:
            report.dropped_units += dropped
            if not report.damage:
                report.damage.append(f"{dropped} unit(s) after an invalid unit at queue offset {valid_end // UNIT}")
        if report.damage:
            log.error("ConsumeQueue %s/%d: %s; %d unit(s) dropped, kept up to queue offset %d", self.topic,
                      self.queue_id, "; ".join(report.damage), report.dropped_units, valid_end // UNIT)
        report.max_offset = self.max_offset_in_queue
        return report

    def last_unit(self) -> tuple[int, int, int, int] | None:
        """(queue_offset, phyOffset, size, tagsCode) of the last real (non-filler) unit, or None."""
        for mf in reversed(self.files.files):
            end = self.max_logic_offset - mf.file_from if mf is self.current_file else mf.wrote_position
            end = min(end, self.file_size)
            pos = end - end % UNIT - UNIT
            while pos >= 0:
                phy, size, tags = _UNIT_STRUCT.unpack(mf.read(pos, UNIT))
                if not (phy == 0 and size == FILLER_SIZE):
                    return (mf.file_from + pos) // UNIT, phy, size, tags
                pos -= UNIT
        return None

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

    def drop_all_files(self) -> None:
        """Delete every file (newest first, through the file queue) and start the queue
        afresh at offset 0: recovery rebuilds a queue whose first files are missing."""
        while self.files.delete_last_file() is not None:
            pass
        self.set_current_file(None)
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self.flushed_where = 0

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


@dataclass
class RepairPlan:
    """What ConsumeQueue.load repairs in a queue's directory before mapping it (plan_repair)."""

    #: (name, size, whole-unit bytes kept) of the short file cut at its last whole unit and
    #: extended with zeros, None if no file is short
    cut: tuple[str, int, int] | None = None
    #: files deleted (after a gap, or after the short file)
    delete: list[str] = field(default_factory=list)
    #: non-zero units dropped (the unit the cut went through, the deleted files' units)
    dropped_units: int = 0
    #: what was wrong, as the log and the recovery report say it ("" when nothing)
    what: str = ""


def plan_repair(store_path: str, file_size: int) -> RepairPlan:
    """What ConsumeQueue.load repairs in store_path, decided without changing anything (the
    recovery dry run, mqstore.tools.inspection, maps the files the same way).

    Beyond RocketMQ (which refuses to start): a queue's files are derived from the CommitLog,
    so a damaged file is cut rather than refused, and the start-up dispatch rebuilds what was
    cut (recover() reports it).

    * A file shorter than the configured size (a crash while the file system extended it, a
      copy that stopped, a damaged disk) keeps its whole units and is extended with zeros; the
      files after it are deleted, so the queue ends at the cut.
    * A file missing in the middle: the files after the gap are deleted.

    A file is taken as cut when it ends inside a unit, or when another file of the queue has
    the configured size. Left to MappedFileQueue.load to refuse (NotAStoreError): a file
    longer than the configured size, short files of whole units with no file of the
    configured size beside them (the store was written with another
    mapped_file_size_consume_queue), misaligned names."""
    plan = RepairPlan()
    if not os.path.isdir(store_path):
        return plan
    names = mapped_file_names(store_path)
    if not names:
        return plan
    fs = file_size
    sizes = [os.path.getsize(os.path.join(store_path, n)) for n in names]
    starts = [int(n) for n in names]
    if any(size > fs for size in sizes) or any(start % fs for start in starts):
        return plan
    if not any(size == fs or size % UNIT for size in sizes):
        return plan  # files of whole units, none of the configured size: another configured size
    cut = len(names)  # files from here on are deleted
    what = ""
    for i in range(1, len(names)):
        if starts[i] - starts[i - 1] != fs:
            cut = i
            what = f"files between {names[i - 1]} and {names[i]} are missing"
            break
    dropped = 0
    short = next((i for i in range(cut) if sizes[i] < fs), None)
    if short is not None:
        size = sizes[short]
        keep = size - size % UNIT
        dropped += _nonzero_units(os.path.join(store_path, names[short]), keep, None)  # the unit the cut went through
        plan.cut = (names[short], size, keep)
        cut = short + 1
        what = f"file {names[short]} was {size} bytes, not {fs}: kept its first {keep // UNIT} units"
    if not what:
        return plan
    plan.delete = names[cut:]
    for name in plan.delete:
        dropped += _nonzero_units(os.path.join(store_path, name), 0, None)
    if plan.delete:
        what += f"; deleted the {len(plan.delete)} file(s) after it"
    plan.what = what
    plan.dropped_units = dropped
    return plan


def queue_problem(topic: str, queue_id: int) -> str | None:
    """Why (topic, queue_id) cannot have a ConsumeQueue, or None: a topic outside RocketMQ's
    rule (it names the queue's directory, so '..', '/' or NUL must never reach the file
    system), longer than a file name, or a negative queue id."""
    if queue_id < 0:
        return f"queue id {queue_id} is negative"
    return topic_problem_of(topic, MAX_TOPIC_DIR_CHARS)


class ConsumeQueueTable:
    """Every ConsumeQueue of a store, by (topic, queue_id). With several CommitLogs
    (``log_count``), each queue knows the log its units point into (the binding of
    docs/parallel-commitlogs.md)."""

    def __init__(self, root: str, file_size: int, log_count: int = 1, only_log: int | None = None) -> None:
        self.root = root
        self.file_size = file_size
        self.log_count = log_count
        #: a table of one log's queues (the dispatcher process of that log, with
        #: dispatch_logs_in_parallel): load() maps no other log's queue, and dispatch gets no
        #: queue of another log (the other log's dispatcher writes those)
        self.only_log = only_log
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.RLock()
        self._publish_ctl: Any = None

    def load(self) -> None:
        """Map every ``<topic>/<int queueId>`` directory (others are ignored, spec §5.2)."""
        if not os.path.isdir(self.root):
            return
        for topic in sorted(os.listdir(self.root)):
            topic_dir = os.path.join(self.root, topic)
            if not os.path.isdir(topic_dir):
                continue
            for qid in sorted(os.listdir(topic_dir)):
                if not qid.isdigit():
                    continue
                try:
                    why = queue_problem(topic, int(qid)) if int(qid) <= MAX_QUEUE_ID else f"queue id {qid} is not an int"
                except UnicodeEncodeError:
                    why = "the topic directory's name is not UTF-8"
                if why is None and qid != str(int(qid)):
                    why = f"{qid} is not how a queue id is written (another name of queue {int(qid)})"
                path = os.path.join(topic_dir, qid)
                if why is not None:
                    # RocketMQ skips what does not parse as a queue id; no queue can be here
                    log.warning("ConsumeQueue: ignoring %s: %s", path, why)
                    continue
                if self.only_log is not None and log_of_queue(topic, int(qid), self.log_count) != self.only_log:
                    continue  # another log's queue: its own dispatcher loads it
                if not os.path.isdir(path):
                    raise NotAStoreError(f"{path} is not a directory (where queue {qid} of {topic} keeps its files)",
                                         hint="move it out of the store")
                cq = self._new(topic, int(qid))
                cq.load()
                self._queues[(topic, int(qid))] = cq

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(self.root, topic, queue_id, self.file_size, log_of_queue(topic, queue_id, self.log_count))

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

    def dispatch_target(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """find_or_create for the dispatcher: None instead of ValueError for a queue that
        cannot exist (the record is skipped and reported, dispatch goes on)."""
        cq = self._queues.get((topic, queue_id))
        if cq is not None:
            return cq
        if queue_problem(topic, queue_id) is not None:
            return None
        if self.only_log is not None and log_of_queue(topic, queue_id, self.log_count) != self.only_log:
            return None  # a record in the wrong log (damaged or foreign): the queue is another's to write
        return self.find_or_create(topic, queue_id)

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue of (topic, queue_id), created on first use. ValueError for one that
        cannot exist (queue_problem): puts refuse such records, so only a damaged or foreign
        CommitLog holds them."""
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            problem = queue_problem(topic, queue_id)
            if problem is not None:
                raise ValueError(problem)
            with self._lock:
                cq = self._queues.get((topic, queue_id))
                if cq is None:
                    cq = self._new(topic, queue_id)
                    if self._publish_ctl is not None:
                        cq.publish_to(self._publish_ctl)
                    self._queues[(topic, queue_id)] = cq
        return cq

    def publish_to(self, ctl: Any) -> None:
        """Every queue (now and later created) publishes its unit count in ctl after each
        append (the dispatcher's side of ConsumeQueue.follow)."""
        with self._lock:
            self._publish_ctl = ctl
            for cq in self._queues.values():
                cq.publish_to(ctl)

    def open_existing(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """A follower (a reader in another process than the dispatcher): map a queue the
        dispatcher created after this table was loaded, without repairing anything."""
        path = os.path.join(self.root, topic, str(queue_id))
        if not os.path.isdir(path):
            return None
        with self._lock:
            cq = self._queues.get((topic, queue_id))
            if cq is None:
                cq = self._new(topic, queue_id)
                cq.files.map_new_files()
                self._queues[(topic, queue_id)] = cq
        return cq

    def of_log(self, log: int | None) -> list[ConsumeQueue]:
        """The queues whose units point into CommitLog ``log`` (every queue for None)."""
        return list(self) if log is None else [cq for cq in self if cq.log_id == log]

    def recover(self, log: int | None = None) -> list[QueueRecovery]:
        return [cq.recover() for cq in self.of_log(log)]

    @property
    def max_physic_offset(self) -> int:
        return self.max_physic_offset_of(None)

    def max_physic_offset_of(self, log: int | None) -> int:
        return max((cq.max_physic_offset for cq in self.of_log(log)), default=-1)

    def truncate_dirty(self, phy_offset: int, log: int | None = None) -> dict[tuple[str, int], int]:
        """truncateDirtyLogicFiles on every queue (of CommitLog ``log``: phy_offset is that
        log's end); returns units dropped per queue."""
        dropped = {}
        for cq in self.of_log(log):
            if cq.max_physic_offset > phy_offset or cq.max_physic_offset < 0:
                n = cq.truncate_dirty_logic_files(phy_offset)
                if n:
                    dropped[(cq.topic, cq.queue_id)] = n
        return dropped

    def correct_min_offsets(self, min_phy: int, log: int | None = None) -> None:
        for cq in self.of_log(log):
            cq.correct_min_offset(min_phy)

    def flush(self, least_pages: int = 0, log: int | None = None) -> int:
        """Flush every queue (of CommitLog ``log``); the number that wrote something."""
        return sum(1 for cq in self.of_log(log) if cq.flush(least_pages))

    def destroy_all(self, log: int | None = None) -> None:
        """Destroy every queue (of CommitLog ``log``)."""
        with self._lock:
            for key, cq in list(self._queues.items()):
                if log is None or cq.log_id == log:
                    cq.destroy()
                    del self._queues[key]

    def close(self) -> None:
        with self._lock:
            for cq in self._queues.values():
                cq.close()
            self._queues.clear()


def _nonzero_units(f: MappedFile | str, start: int, end: int | None) -> int:
    """Units from start up to the last non-zero byte before end (None: the file's end)."""
    return -(-nonzero_extent(f, start, end) // UNIT)


def _last_real_unit(mf: MappedFile, file_size: int) -> tuple[int, int]:
    """(phyOffset + size, logical position) of the last real unit of a full earlier file."""
    end, _ = scan_units(mf, 0, file_size)
    pos = end - UNIT
    while pos >= 0:
        phy, size, _ = _UNIT_STRUCT.unpack(mf.read(pos, UNIT))
        if not (phy == 0 and size == FILLER_SIZE):
            return phy + size, mf.file_from + pos
        pos -= UNIT
    return -1, -1


