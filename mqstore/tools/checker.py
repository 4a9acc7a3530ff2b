"""The store-wide invariant checker (style.md: sortedcontainers' ``_check()`` after every step).

``check_store(root)`` verifies a store directory.

CommitLog: every record parses and its CRC matches, every record's PHYSICALOFFSET is where it
sits and its QUEUEID is not negative (recovery ends the log at a record failing either, see
mqstore.queue.recovery.header_problem), store timestamps never go back, every file but the last ends with a well-formed
END_OF_FILE blank, nothing but zeros follows the end of the log (files after it may exist,
pre-allocated and empty), queue offsets of each queue are consecutive, and, when a control
block is present, its positions are ordered (flushed <= committed <= wrote) and agree with the
files, as does its topic-queue table.

ConsumeQueues (``consumequeue/<topic>/<int queueId>/``, spec §3): all files have one size (the
configured one when a config is given), are contiguous and named by logical byte offset;
units are read up to the first invalid one (phyOffset < 0 or size <= 0). Filler units
(0, 0x7FFFFFFF, 0) are counted: before the first real unit they are the pre-fill of a queue
that starts above 0, later they stand for skipped offsets (``gaps``). Every real unit points at
a record of the valid log (or below its first file: removed by retention) whose TOTALSIZE,
topic, queue id and QUEUEOFFSET match the unit, of transaction type NOT or COMMIT, whose tags
code matches (a delivery time >= the store timestamp for a delayed SCHEDULE_TOPIC_XXXX
record); phyOffsets strictly increase along a queue. When the store is quiescent and was
closed cleanly (no ``abort`` file), every NOT/COMMIT record of the log must have its unit.

Index files (``index/``, spec §4.1): the header is sane, every entry chains only to older
entries of its own hash slot, the hash slots point at the newest entry of their chain, and
every entry's keyHash is the hash of one of the keys (topic#UNIQ_KEY, topic#k for each KEYS
word) of the record it points at. Entries are checked when the file size matches the
configured (or default) max_hash_slot_num / max_index_num; otherwise the file is noted and
only its header checked.

Stress and crash tests call it after every step; ``mqstore verify`` runs it.
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import tempfile
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqstore.layout import (BLANK_MAGIC_CODE, CONTROL_BLOCK_NAME, CQ_STORE_UNIT_SIZE, FILLER_SIZE, MESSAGE_MAGIC_CODE,
                            MESSAGE_MAGIC_CODE_V2)
from mqstore._codec import java_string_hash, string_to_properties
from mqstore._index import index_key_hash
from mqstore._commitlog import scan_records
from mqstore._consumequeue import scan_units
from mqstore._mapped import MappedFile
from mqstore.queue.consume_queue import queue_problem
from mqstore.log.scan import CLEAN_PAGES, is_zero, nonzero_extent, why_invalid

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.log.record import DecodedRecord

TX_MASK = 0xC
TX_PREPARED = 0x4
TX_ROLLBACK = 0xC

BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
MIN_RECORD_SIZE = 91

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
CQ_TAIL_CHECK_BYTES = 16 * 4096  # zeros checked after a queue's end (what truncation zeroes)
MISSING_RUNS_SHOWN = 10  # completeness problems reported per queue

INDEX_HEADER_SIZE = 40
INDEX_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20
INDEX_SLOT_TABLE_READ_MAX = 16 << 20  # read the whole slot table when it is at most this big

RECORD_CACHE_MAX = 1 << 20  # records parsed for unit / entry checks kept for reuse

_HEAD = struct.Struct(">iiiiiqqi")  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode
_INDEX_HEADER = struct.Struct(">qqqqii")
_INDEX_ENTRY = struct.Struct(">iqii")  # keyHash, commitLogOffset, timeDiff, prevIndex


@dataclass
class Problem:
    where: str
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.where} @ {self.offset}: {self.message}"


@dataclass
class QueueSummary:
    first_offset: int
    last_offset: int
    count: int


@dataclass
class ConsumeQueueSummary:
    """What one ConsumeQueue holds (queue offsets; max_offset is the next one to be written)."""

    #: offset of the first real unit whose record is still in the log (max_offset if none)
    min_offset: int
    max_offset: int
    #: real units (not fillers), including those pointing below the log (``removed``)
    units: int = 0
    #: pre-fill units before the first real unit (a queue that starts above offset 0)
    fillers: int = 0
    #: filler units after the first real unit: skipped queue offsets
    gaps: int = 0
    #: real units whose record is below the CommitLog's first file (removed by retention)
    removed: int = 0
    files: int = 0


@dataclass
class IndexFileSummary:
    """An index file's header (spec §4.1), as the checker and ``mqstore inspect`` read it."""

    name: str
    size: int
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 0
    #: False when the file's size does not match the slot / entry counts in use (header only)
    entries_checked: bool = False
    #: why the header could not be read ("" when it was)
    error: str = ""


@dataclass
class CheckReport:
    root: str
    files: int = 0
    records: int = 0
    valid_end: int = 0
    torn_tail_bytes: int = 0
    #: with quiescent=False: bytes past the wrote position read before the scan that did not
    #: parse yet (records being written while the checker ran)
    in_flight_bytes: int = 0
    queues: dict[tuple[str, int], QueueSummary] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    control_block: dict[str, int] | None = None
    #: every ConsumeQueue directory found, by (topic, queue id)
    consume_queues: dict[tuple[str, int], ConsumeQueueSummary] = field(default_factory=dict)
    #: whether every record of the log was required to have its unit (check_queues_complete)
    queues_complete_checked: bool = False
    #: ConsumeQueue units and index entries skipped because they point past the end of the
    #: log of a store being written (quiescent=False)
    in_flight_units: int = 0
    index_files: list[IndexFileSummary] = field(default_factory=list)
    #: index entries checked against their records
    index_entries: int = 0
    #: what was not checked, and why (not problems)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> CheckReport:
        if self.problems:
            shown = "\n  ".join(str(p) for p in self.problems[:20])
            raise AssertionError(f"store {self.root} violates {len(self.problems)} invariant(s):\n  {shown}")
        return self


ProblemSink = Callable[[str, int, str], None]
#: progress(what, done, total) of a long check (mqstore.progress)
Progress = Callable[[str, int, int], None]
PROGRESS_EVERY_RECORDS = 4096


def _commitlog_dir(root: str) -> str:
    return os.path.join(root, "commitlog")


def check_store(root: str, *, check_crc: bool = True, allow_torn_tail: bool = False,
                quiescent: bool = True, max_problems: int = 200, config: StoreConfig | None = None,
                check_queues_complete: bool | None = None, progress: Progress | None = None,
                deep: bool = False) -> CheckReport:
    """Check every invariant of the store at root; see the module docstring.

    Every file is opened read-only (MappedFile.open(readonly=True), the control block
    attached read-only), so the check works on a read-only mount.

    allow_torn_tail: a store that crashed and was not reopened may hold a partly written
    record after its valid end; count it in ``torn_tail_bytes`` instead of failing.
    quiescent: no writer is active, so the control block's wrote position must equal the end
    found in the files. With quiescent=False (writers may be running) the positions are read
    before the scan: the log must reach at least that wrote position, and bytes after it that
    do not parse yet are a record being written, not a problem; so are ConsumeQueue units and
    index entries pointing past the end of the log found by the scan.

    A partly written record is a torn tail (allow_torn_tail) in the last file that holds data;
    files after it that the allocate service created ahead are empty.

    config: the store's configuration: the ConsumeQueue file size and the index geometry
    (max_hash_slot_num, max_index_num). Without it the ConsumeQueue file size is inferred from
    the files and the index geometry is StoreConfig()'s default; an index file of another
    size then gets its header checked only (see ``notes``).
    check_queues_complete: require every NOT/COMMIT record of the log to have its
    ConsumeQueue unit. None (default) = only when quiescent and no ``abort`` file exists (a
    crashed store rebuilds missing units at its next open; a running one dispatches behind
    the writer). Existing units are checked either way.
    progress(what, done, total): called as the work goes ("CommitLog" in bytes, then
    "ConsumeQueues" and "index files" by count), at most every few thousand records.
    deep (``mqstore verify --deep``): read every byte that the default check samples. Files
    past the end of the log must be all zeros (not only their first bytes), so must the rest
    of the file where the log ends and of the file where each ConsumeQueue ends (not only the
    next 16 pages / 64 KiB); and every hash slot of every index file is read, whatever the
    size of the slot table, and its chain walked: each slot must hold its newest entry, every
    entry on a chain must hash to that slot, and every entry must be on a chain (an entry no
    chain reaches is never found by a query). After a crash the slots are checked in the index
    files the next open keeps (those ending by checkpoint.indexMsgTimestamp), not in the
    newest ones that it destroys.
    """
    report = CheckReport(root=root)
    problems = report.problems

    def problem(where: str, offset: int, message: str) -> None:
        if len(problems) < max_problems:
            problems.append(Problem(where, offset, message))

    live_positions = None if quiescent else _read_positions(root)
    cdir = _commitlog_dir(root)
    names = sorted(n for n in os.listdir(cdir) if len(n) == 20 and n.isdigit()) if os.path.isdir(cdir) else []
    if not names:
        _check_control_block(root, report, problem, quiescent, live_positions)
        log = _Log(0)
        try:
            _check_queues_and_index(root, report, problem, log, {}, set(), quiescent=quiescent, config=config,
                                    check_queues_complete=check_queues_complete, progress=progress, deep=deep)
        finally:
            log.close()
        return report
    sizes = {os.path.getsize(os.path.join(cdir, n)) for n in names}
    short: dict[str, int] = {}  # short files the next open extends (a cut last file, empty ones after it)
    if len(sizes) != 1:
        short = _short_files_the_open_extends(cdir, config.mapped_file_size_commit_log if config else max(sizes))
        if not short:
            problem("commitlog", 0, f"files have different sizes {sorted(sizes)}")
            report.notes.append("ConsumeQueues and index files not checked: the CommitLog files differ in size")
            return report
        sizes = {config.mapped_file_size_commit_log if config else max(sizes)}
        for name, size in short.items():
            what = (f"file {name} is cut short ({size} of {max(sizes)} bytes); the next open extends it with "
                    f"zeros and ends the log at the cut")
            if allow_torn_tail:
                report.notes.append(what)
            else:
                problem(name, int(name) + size, what)
    file_size = sizes.pop()
    scratch = tempfile.TemporaryDirectory(prefix="mqstore-check-") if short else None
    starts = [int(n) for n in names]
    for a, b in zip(starts, starts[1:]):
        if b - a != file_size:
            problem("commitlog", b, f"file {b:020d} does not follow {a:020d} (file size {file_size})")
    if starts[0] % file_size:
        problem("commitlog", starts[0], "first file is not aligned to the file size")

    last_with_data = max((i for i, n in enumerate(names) if not is_zero(os.path.join(cdir, n), 0, 8)), default=0)
    scan_total = (last_with_data + 1) * file_size  # the bytes the scan walks (files past the end are only peeked)
    seen = [0]
    # live: the end of what the files may hold when the scan began; past it bytes may be
    # arriving (the committed position: with a transient store pool the bytes between it and
    # the wrote position are still in the write buffers, without one the two move together)
    live_wrote = live_positions["committed"] if live_positions else None
    last_ts = [-1]
    next_q: dict[tuple[bytes, int], int] = {}
    first_q: dict[tuple[bytes, int], int] = {}
    counts: dict[tuple[bytes, int], int] = {}
    # physical offsets of each queue's records in queue offset order (ConsumeQueue checks)
    phys: dict[tuple[bytes, int], array] = {}
    broken: set[tuple[bytes, int]] = set()  # queues whose offsets are not consecutive in the log
    ended = False
    blank_end: int | None = None
    log = _Log(file_size)
    log.min_offset = starts[0]
    try:
        for index, name in enumerate(names):
            path = os.path.join(cdir, name)
            if scratch is not None and name in short:  # checked as the open extends it, in a copy
                path = _extended_copy(path, scratch.name, file_size)
            mf = MappedFile.open(path, file_size, readonly=True)
            report.files += 1
            base = mf.file_from
            if ended:
                if not is_zero(mf, 0, None if deep else 8):
                    if live_wrote is not None and base >= live_wrote:  # written since the scan began
                        report.in_flight_bytes += nonzero_extent(mf, 0, clean_pages=CLEAN_PAGES)
                    else:
                        problem(name, base, "file follows the end of the log but holds data")
                mf.close()
                continue
            log.add(mf)

            def on_record(pos, size, topic, qid, qoff, phy, sys_flag, ts, _base=base, _name=name):
                seen[0] += 1
                if progress is not None and seen[0] % PROGRESS_EVERY_RECORDS == 0:
                    progress("CommitLog", min(_base - starts[0] + pos, scan_total), scan_total)
                if phy != _base + pos:
                    problem(_name, _base + pos, f"PHYSICALOFFSET field says {phy} (the next open ends the log here)")
                if qid < 0:
                    problem(_name, _base + pos, f"QUEUEID {qid} is negative (the next open ends the log here)")
                if ts < last_ts[0]:
                    problem(_name, _base + pos, f"store timestamp {ts} is older than the previous record's {last_ts[0]}")
                last_ts[0] = ts
                tx = sys_flag & TX_MASK
                if tx in (TX_PREPARED, TX_ROLLBACK):
                    if qoff != 0:
                        problem(_name, _base + pos, f"prepared/rollback record carries queue offset {qoff}, not 0")
                    return
                key = (topic, qid)
                expected = next_q.get(key)
                if expected is None:
                    phys[key] = array("q", (_base + pos,))
                else:
                    if qoff != expected:
                        kind = "duplicate" if qoff < expected else "gap before"
                        problem(_name, _base + pos, f"queue {topic.decode(errors='replace')}-{qid}: {kind} offset "
                                                     f"{qoff}, expected {expected}")
                        broken.add(key)
                    phys[key].append(_base + pos)
                first_q.setdefault(key, qoff)
                next_q[key] = qoff + 1
                counts[key] = counts.get(key, 0) + 1

            stop, reason, count, _ = scan_records(mf, base, 0, file_size, check_crc, None, on_record)
            report.records += count
            if progress is not None:
                progress("CommitLog", min(base - starts[0] + file_size, scan_total), scan_total)
            is_last = index == len(names) - 1
            last_data_file = index >= last_with_data
            if reason == "blank":
                blank_total = int.from_bytes(mf.read(stop, 4), "big", signed=True)
                if blank_total != file_size - stop:
                    problem(name, base + stop, f"blank record says {blank_total} bytes, {file_size - stop} remain")
                report.valid_end = base + stop if is_last else base + file_size
                if is_last:
                    ended = True
                    blank_end = base + file_size
                continue
            # the log ends in this file
            report.valid_end = base + stop
            ended = True
            dirty = not is_zero(mf, stop, stop + 8)
            if reason == "invalid" and (dirty or (deep and not is_zero(mf, stop))):
                if live_wrote is not None and base + stop >= live_wrote:
                    report.in_flight_bytes = nonzero_extent(mf, stop, clean_pages=CLEAN_PAGES)  # being written now
                    continue
                why = why_invalid(mf, stop, check_crc) if dirty else "zeros, then non-zero bytes further on"
                tail = nonzero_extent(mf, stop, clean_pages=None if deep else CLEAN_PAGES)
                if not last_data_file:
                    problem(name, base + stop, f"corrupt record in a file that is not the last: {why}")
                elif allow_torn_tail:
                    report.torn_tail_bytes = tail
                else:
                    problem(name, base + stop, f"{tail} bytes after the end of the log are not zero: {why}")

        queue_phys: dict[tuple[str, int], array] = {}
        broken_names: set[tuple[str, int]] = set()
        for (topic, qid), nxt in next_q.items():
            key = (topic.decode("utf-8", errors="replace"), qid)
            report.queues[key] = QueueSummary(first_q[(topic, qid)], nxt - 1, counts[(topic, qid)])
            queue_phys[key] = phys[(topic, qid)]
            if (topic, qid) in broken:
                broken_names.add(key)
        _check_control_block(root, report, problem, quiescent, live_positions, blank_end)
        log.end = report.valid_end
        _check_queues_and_index(root, report, problem, log, queue_phys, broken_names, quiescent=quiescent,
                                config=config, check_queues_complete=check_queues_complete, progress=progress,
                                deep=deep)
    finally:
        log.close()
        if scratch is not None:
            scratch.cleanup()
    return report


def _short_files_the_open_extends(cdir: str, file_size: int) -> dict[str, int]:
    """{name: size} of the short CommitLog files MappedFileQueue.load would extend (a cut last
    file and all-zero files after it, see MappedFileQueue.plan_load); {} if it would refuse
    the directory or extend nothing."""
    from mqstore.log.mapped_file_queue import MappedFileQueue
    from mqstore.errors import NotAStoreError
    from mqstore.queue.recovery import commitlog_file_was_cut

    try:
        plan = MappedFileQueue.plan_load(cdir, file_size, commitlog_file_was_cut)
    except (NotAStoreError, OSError):
        return {}
    return dict(plan.extend + plan.extend_empty)


def _extended_copy(path: str, directory: str, file_size: int) -> str:
    """A copy of the short file at path in directory, extended (sparse) to file_size."""
    copy = os.path.join(directory, os.path.basename(path))
    shutil.copyfile(path, copy)
    os.truncate(copy, file_size)
    return copy


def _read_positions(root: str) -> dict[str, int] | None:
    from mqstore import _shm

    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return None
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
    except (OSError, ValueError):
        return None  # reported by _check_control_block
    try:
        return None if ctl.state == _shm.STATE_BUILDING else ctl.positions()
    finally:
        ctl.close()


def _check_control_block(root: str, report: CheckReport, problem, quiescent: bool,
                         live_positions: dict[str, int] | None = None, blank_end: int | None = None) -> None:
    """blank_end: the end of the last file when it ends with its END_OF_FILE blank. The put
    path that wrote the blank moved the wrote position there, to the start of a next file
    that a kill may have kept from being created; recovery ends the log at the blank."""
    from mqstore import _shm

    path = os.path.join(root, CONTROL_BLOCK_NAME)
    if not os.path.exists(path):
        return
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
    except (OSError, ValueError) as exc:
        problem("control block", 0, f"cannot attach: {exc}")
        return
    try:
        if ctl.state == _shm.STATE_BUILDING:
            return  # being rebuilt by an owner; nothing to compare yet
        # live: the positions read before the scan (the log had reached them then)
        pos = live_positions if live_positions is not None else ctl.positions()
        report.control_block = pos
        if not pos["flushed"] <= pos["committed"] <= pos["wrote"]:
            problem("control block", pos["wrote"], f"positions out of order: {pos}")
        ends = (report.valid_end, blank_end)
        # what the files hold: up to the committed position with a transient store pool (the
        # rest is in its buffers), else up to the wrote position
        name = "committed" if ctl.pool_buffers else "wrote"
        end = pos[name]
        if quiescent and end not in ends:
            problem("control block", end, f"{name} position {end} but the log ends at {report.valid_end}")
        if end > report.valid_end and end != blank_end:
            problem("control block", end, f"{name} position is past the end of the log {report.valid_end}")
        if quiescent:
            table = {(t, q): n for t, q, n in ctl.table_items()}
            # records still in the pool's buffers (wrote past committed) have their offsets
            in_pool = ctl.pool_buffers > 0 and pos["wrote"] > pos["committed"]
            for key, summary in report.queues.items():
                got = table.get(key)
                if got != summary.last_offset + 1 and not (in_pool and got is not None and got > summary.last_offset):
                    problem("control block", 0, f"queue {key[0]}-{key[1]}: table says next offset {table.get(key)}, "
                                                f"the log's last is {summary.last_offset}")
    finally:
        ctl.close()


# -- records by physical offset (ConsumeQueue units and index entries point at them) ----------
class _Record:
    """The fields of one CommitLog record that units and index entries are checked against."""

    __slots__ = ("total_size", "topic", "queue_id", "queue_offset", "sys_flag", "store_timestamp", "properties",
                 "_key_hashes")

    def __init__(self, total_size: int, topic: str, queue_id: int, queue_offset: int, sys_flag: int,
                 store_timestamp: int, properties: dict[str, str]) -> None:
        self.total_size = total_size
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.sys_flag = sys_flag
        self.store_timestamp = store_timestamp
        self.properties = properties
        self._key_hashes: dict[int, str] | None = None

    @property
    def tags_code(self) -> int:
        tags = self.properties.get("TAGS")
        return java_string_hash(tags) if tags else 0

    def index_keys(self) -> list[str]:
        """The index keys of spec §4.4: topic#UNIQ_KEY, then topic#k for each KEYS word."""
        keys = []
        uniq = self.properties.get("UNIQ_KEY")
        if uniq:
            keys.append(f"{self.topic}#{uniq}")
        keys.extend(f"{self.topic}#{k}" for k in self.properties.get("KEYS", "").split(" ") if k)
        return keys

    def key_hashes(self) -> dict[int, str]:
        if self._key_hashes is None:
            self._key_hashes = {index_key_hash(k): k for k in self.index_keys()}
        return self._key_hashes


class _Log:
    """The CommitLog files of a check, mapped; parses the record at a physical offset."""

    def __init__(self, file_size: int) -> None:
        self.file_size = file_size
        self.min_offset = 0  # start of the first file: records below were removed by retention
        self.end = 0  # the valid end found by the scan
        self._files: dict[int, MappedFile] = {}
        self._views: dict[int, memoryview] = {}
        self._cache: dict[int, _Record | str] = {}

    def add(self, mf: MappedFile) -> None:
        self._files[mf.file_from] = mf

    def close(self) -> None:
        for view in self._views.values():
            view.release()
        self._views.clear()
        for mf in self._files.values():
            mf.close()
        self._files.clear()
        self._cache.clear()

    def record(self, phy: int) -> _Record | str:
        """The record starting at phy (inside [min_offset, end)), or why there is none."""
        got = self._cache.get(phy)
        if got is None:
            got = self._parse(phy)
            if len(self._cache) < RECORD_CACHE_MAX:
                self._cache[phy] = got
        return got

    def _parse(self, phy: int) -> _Record | str:
        fs = self.file_size
        if fs <= 0:
            return "no CommitLog file holds it"
        base = phy - (phy - self.min_offset) % fs
        view = self._views.get(base)
        if view is None:
            mf = self._files.get(base)
            if mf is None:
                return "no CommitLog file holds it"
            view = self._views[base] = memoryview(mf)
        pos = phy - base
        if pos + 40 > fs:
            return "no record starts there (too close to the end of its file)"
        total, magic, _crc, qid, _flag, qoff, phy_field, sf = _HEAD.unpack_from(view, pos)
        if magic == BLANK_MAGIC_CODE:
            return "an END_OF_FILE blank is there, not a record"
        if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
            return f"no record starts there (magic 0x{magic & 0xFFFFFFFF:08X})"
        if phy_field != phy:
            return f"no record starts there (the bytes there say PHYSICALOFFSET {phy_field})"
        end = pos + total
        if total < MIN_RECORD_SIZE or end > fs:
            return f"the record there has an impossible TOTALSIZE {total}"
        born = 20 if sf & BORNHOST_V6_FLAG else 8
        at = pos + 48 + born  # STORETIMESTAMP
        ts = _I64.unpack_from(view, at)[0]
        at += 8 + (20 if sf & STOREHOST_V6_FLAG else 8) + 12  # store host, RECONSUMETIMES, PREPARED_TX_OFFSET
        body_len = _I32.unpack_from(view, at)[0]
        at += 4 + body_len
        if body_len < 0 or at + 3 > end:
            return f"the record there is malformed (BODYLENGTH {body_len})"
        if magic == MESSAGE_MAGIC_CODE_V2:
            topic_len = _I16.unpack_from(view, at)[0]
            at += 2
        else:
            topic_len = view[at]
            at += 1
        if topic_len <= 0 or at + topic_len + 2 > end:
            return f"the record there is malformed (TOPICLENGTH {topic_len})"
        topic = bytes(view[at:at + topic_len]).decode("utf-8", "replace")
        at += topic_len
        props_len = _I16.unpack_from(view, at)[0]
        at += 2
        if props_len < 0 or at + props_len != end:
            return f"the record there is malformed (PROPERTIESLENGTH {props_len})"
        props = string_to_properties(bytes(view[at:end]).decode("utf-8", "replace")) if props_len else {}
        return _Record(total, topic, qid, qoff, sf, ts, props)


def _check_queues_and_index(root: str, report: CheckReport, problem: ProblemSink, log: _Log,
                            queue_phys: dict[tuple[str, int], array], broken: set[tuple[str, int]], *,
                            quiescent: bool, config: StoreConfig | None,
                            check_queues_complete: bool | None, progress: Progress | None = None,
                            deep: bool = False) -> None:
    crashed = os.path.exists(os.path.join(root, "abort"))
    complete = (quiescent and not crashed) if check_queues_complete is None else check_queues_complete
    # stable: nothing writes the store now and it was shut down cleanly, so the last units and
    # index entries are whole and the index header agrees with its slots
    stable = quiescent and not crashed
    cq_size = config.mapped_file_size_consume_queue if config is not None else None
    _check_consume_queues(root, report, problem, log, queue_phys, broken, file_size=cq_size, live=not quiescent,
                          stable=stable, complete=complete, progress=progress, deep=deep)
    if progress is not None:
        progress("ConsumeQueues", len(report.consume_queues), len(report.consume_queues))
    _check_index_files(root, report, problem, log, config, live=not quiescent, stable=stable, progress=progress,
                       deep=deep)
    if progress is not None:
        progress("index files", len(report.index_files), len(report.index_files))


# -- ConsumeQueues (spec §3) -----------------------------------------------------------------
def _check_consume_queues(root: str, report: CheckReport, problem: ProblemSink, log: _Log,
                          queue_phys: dict[tuple[str, int], array], broken: set[tuple[str, int]], *,
                          file_size: int | None, live: bool, stable: bool, complete: bool,
                          progress: Progress | None = None, deep: bool = False) -> None:
    cq_root = os.path.join(root, "consumequeue")
    if not os.path.isdir(cq_root):
        if complete and report.queues:
            report.notes.append("no consumequeue directory: the next open rebuilds every ConsumeQueue")
        return
    queues: list[tuple[str, int, str, list[tuple[int, str, int]]]] = []
    for topic in sorted(os.listdir(cq_root)):
        topic_dir = os.path.join(cq_root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for qname in sorted(os.listdir(topic_dir)):
            qdir = os.path.join(topic_dir, qname)
            if not qname.isdigit() or not os.path.isdir(qdir):
                continue  # like the loader: only <topic>/<int queueId> directories are queues
            files = []
            for name in os.listdir(qdir):
                if len(name) == 20 and name.isdigit():
                    try:
                        files.append((int(name), name, os.path.getsize(os.path.join(qdir, name))))
                    except FileNotFoundError:
                        continue  # deleted by retention while we looked
            files.sort()
            queues.append((topic, int(qname), qdir, files))

    sizes = Counter(size for *_, files in queues for _, _, size in files)
    if file_size is not None:
        expected, source = file_size, "the configured size"
    elif sizes:
        expected = max(sizes, key=lambda s: (sizes[s], s))
        source = "the size of the other ConsumeQueue files"
    else:
        expected, source = CQ_STORE_UNIT_SIZE, ""
    if expected <= 0 or expected % CQ_STORE_UNIT_SIZE:
        problem("consumequeue", 0, f"ConsumeQueue files are {expected} bytes, not a multiple of the {CQ_STORE_UNIT_SIZE}-byte unit")
        return
    report.queues_complete_checked = complete

    for done, (topic, qid, qdir, files) in enumerate(queues):
        if progress is not None:
            progress("ConsumeQueues", done, len(queues))
        where = f"consumequeue/{topic}/{qid}"
        key = (topic, qid)
        wrong = [(start, name, size) for start, name, size in files if size != expected]
        for start, name, size in wrong:
            problem(where, start // CQ_STORE_UNIT_SIZE, f"file {name} is {size} bytes; {source} is {expected}")
        if wrong:
            q0 = files[0][0] // CQ_STORE_UNIT_SIZE
            report.consume_queues[key] = ConsumeQueueSummary(q0, q0, files=len(files))
            continue  # units not read (and no completeness verdict): the file size is reported
        for (a, an, _), (b, bn, _) in zip(files, files[1:]):
            if b - a != expected:
                problem(where, b // CQ_STORE_UNIT_SIZE, f"file {bn} does not follow {an} (file size {expected})")
        if files and files[0][0] % expected:
            problem(where, files[0][0] // CQ_STORE_UNIT_SIZE, f"first file {files[0][1]} is not at a multiple of the file "
                                                    f"size {expected}")
        summary = _check_queue(report, problem, log, where, topic, qid, qdir, files, expected,
                               report.queues.get(key), None if key in broken else queue_phys.get(key),
                               live=live, stable=stable, complete=complete, deep=deep)
        report.consume_queues[key] = summary

    if complete:
        for (topic, qid), s in sorted(report.queues.items()):
            if (topic, qid) not in report.consume_queues and queue_problem(topic, qid) is not None:
                # puts refuse such a record; dispatch skips it (dispatch_skipped_records)
                report.notes.append(f"the log holds {s.count} record(s) of topic {topic!r}, queue {qid}, offsets "
                                    f"{s.first_offset}..{s.last_offset}, which cannot have a ConsumeQueue "
                                    f"({queue_problem(topic, qid)}): left out of the queues")
            elif (topic, qid) not in report.consume_queues:
                problem(f"consumequeue/{topic}/{qid}", s.first_offset,
                        f"no ConsumeQueue for the log's {s.count} record(s) of offsets {s.first_offset}.."
                        f"{s.last_offset}")


def _check_queue(report: CheckReport, problem: ProblemSink, log: _Log, where: str, topic: str, qid: int,
                 qdir: str, files: list[tuple[int, str, int]], file_size: int, in_log: QueueSummary | None,
                 phys: array | None, *, live: bool, stable: bool, complete: bool,
                 deep: bool = False) -> ConsumeQueueSummary:
    """Check the units of one queue; returns its summary. Reports missing units when complete."""
    first = in_log.first_offset if in_log is not None else 0
    last = in_log.last_offset if in_log is not None else -1
    units = fillers = gaps = removed = nfiles = 0
    first_in_log = -1
    last_phy = -1
    max_offset = files[0][0] // CQ_STORE_UNIT_SIZE if files else 0
    ended_at = -1  # queue offset where the queue ended (a file that is not full), -1: not yet
    covered: list[tuple[int, int]] = []  # [from, to) queue offset ranges of units read
    filler_offsets: list[int] = []  # fillers standing where the log has a record
    # a problem found on the unit read last, reported when another unit follows it or, at the
    # end of the queue of a store that may be writing, if the unit still reads the same:
    # (queue offset, message, position, file path, the 20 bytes read)
    pending: tuple[int, str, int, str, bytes] | None = None
    log_min, log_end = log.min_offset, log.end
    for start, name, _ in files:
        q0 = start // CQ_STORE_UNIT_SIZE
        path = os.path.join(qdir, name)
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        with fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if ended_at >= 0:
                phy, size, _ = _UNIT.unpack_from(mm, 0)
                if phy >= 0 and size > 0 and not live:
                    problem(where, q0, f"file {name} holds units after the end of the queue at offset {ended_at}")
                elif deep and stable and not is_zero(mm):
                    problem(where, q0, f"file {name} follows the end of the queue at offset {ended_at} but is not "
                                       f"all zeros")
                continue
            nfiles += 1
            end = scan_units(mm, 0, file_size)[0]
            with memoryview(mm) as whole, whole[:end] as view:
                for i, (phy, size, tags) in enumerate(_UNIT.iter_unpack(view)):
                    q = q0 + i
                    if pending is not None:
                        problem(where, pending[0], pending[1])
                        pending = None
                    if size == FILLER_SIZE and phy == 0:
                        if units:
                            gaps += 1
                        else:
                            fillers += 1
                        if first <= q <= last:
                            filler_offsets.append(q)
                        continue
                    units += 1
                    msgs = []
                    if phy <= last_phy:
                        msgs.append(f"phyOffset {phy} is not above the previous unit's {last_phy}")
                    last_phy = phy
                    if phy < log_min:
                        removed += 1  # below the log's first file: removed by retention
                        if first <= q <= last:
                            at = f" (at {phys[q - first]})" if phys is not None else ""
                            msgs.append(f"points at {phy}, below the CommitLog's first file {log_min}, but the log "
                                        f"still holds the record of queue offset {q}{at}")
                    elif phy >= log_end:
                        if live:
                            report.in_flight_units += 1  # its record was written after the scan
                            continue
                        msgs.append(f"points at {phy}, past the end of the log at {log_end}")
                    else:
                        if first_in_log < 0:
                            first_in_log = q
                        rec = log.record(phy)
                        if isinstance(rec, str):
                            msgs.append(f"points at {phy}: {rec}")
                        else:
                            why = unit_mismatch(rec, size, tags, topic, qid, q)
                            if phys is not None and first <= q <= last and phys[q - first] != phy:
                                why.append(f"the log's record of queue offset {q} is at {phys[q - first]}")
                            if why:
                                msgs.append(f"unit (phy {phy}, size {size}, tags {tags}) does not match the record "
                                            f"there: " + "; ".join(why))
                    if msgs:
                        pos = i * CQ_STORE_UNIT_SIZE
                        pending = (q, "; ".join(msgs), pos, path, bytes(view[pos:pos + CQ_STORE_UNIT_SIZE]))
            covered.append((q0, q0 + end // CQ_STORE_UNIT_SIZE))
            max_offset = q0 + end // CQ_STORE_UNIT_SIZE
            if end < file_size:
                ended_at = max_offset
                if stable:
                    if not is_zero(mm, end, None if deep else end + CQ_TAIL_CHECK_BYTES):
                        phy, size, tags = _UNIT.unpack_from(mm, end) if end + CQ_STORE_UNIT_SIZE <= file_size else (0, 0, 0)
                        problem(where, max_offset, f"non-zero bytes follow the end of the queue (the unit there "
                                                   f"reads phy {phy}, size {size}, tags {tags})")
        finally:
            mm.close()
    if pending is not None:
        q, msg, pos, path, seen = pending
        if stable or _read_unit(path, pos) == seen:
            problem(where, q, msg)
    summary = ConsumeQueueSummary(first_in_log if first_in_log >= 0 else max_offset, max_offset, units, fillers,
                                  gaps, removed, nfiles)
    if complete and in_log is not None:
        _report_missing_units(problem, where, summary, first, last, phys, covered, filler_offsets)
    return summary


def unit_mismatch(rec: _Record | DecodedRecord, size: int, tags: int, topic: str, qid: int, q: int) -> list[str]:
    """How the ConsumeQueue unit (size, tags) at queue offset q of topic-qid disagrees with the
    record it points at (none: []): TOTALSIZE, topic and queue id, QUEUEOFFSET, a transaction
    type that gets no unit (PREPARED, ROLLBACK), the tags code (a delivery time not before the
    store timestamp for a delayed SCHEDULE_TOPIC_XXXX record). ``verify`` reports these as
    problems, ``dump`` shows them in the unit's note."""
    why = []
    if rec.total_size != size:
        why.append(f"its TOTALSIZE is {rec.total_size}")
    if rec.topic != topic or rec.queue_id != qid:
        why.append(f"it belongs to queue {rec.topic}-{rec.queue_id}")
    if rec.queue_offset != q:
        why.append(f"its QUEUEOFFSET is {rec.queue_offset}")
    tx = rec.sys_flag & TX_MASK
    if tx == TX_PREPARED or tx == TX_ROLLBACK:
        why.append(f"it is a {'PREPARED' if tx == TX_PREPARED else 'ROLLBACK'} transaction record (only NOT and "
                   f"COMMIT records get units)")
    if tags != rec.tags_code:
        delayed = rec.topic == SCHEDULE_TOPIC and "DELAY" in rec.properties
        if not (delayed and tags >= rec.store_timestamp):
            if delayed:
                why.append(f"tags code {tags} is not a delivery time (the record was stored at "
                           f"{rec.store_timestamp})")
            else:
                why.append(f"its tags code is {rec.tags_code} (TAGS {rec.properties.get('TAGS')!r})")
    return why


def _read_unit(path: str, pos: int) -> bytes | None:
    """The unit at pos of path read again (a running store may have been writing it when the
    check read it: a torn unit), None if the file is gone."""
    try:
        with open(path, "rb") as fh:
            return os.pread(fh.fileno(), CQ_STORE_UNIT_SIZE, pos)
    except OSError:
        return None


def _report_missing_units(problem: ProblemSink, where: str, summary: ConsumeQueueSummary, first: int, last: int,
                          phys: array | None, covered: list[tuple[int, int]], filler_offsets: list[int]) -> None:
    """Every record of the log in queue offsets [first, last] needs a unit. Offsets whose unit
    points at another record were reported with that unit; here: offsets no unit covers and
    offsets where a filler stands."""
    runs: list[tuple[int, int, str | None]] = []  # [lo, hi] inclusive, why (None: not covered)
    at = first
    for lo, hi in covered:
        if lo > at and at <= last:
            runs.append((at, min(lo, last + 1) - 1, None))
        at = max(at, hi)
    if at <= last:
        runs.append((at, last, None))
    run_start = prev = -2
    for q in filler_offsets + [-2]:
        if q != prev + 1:
            if run_start >= 0:
                runs.append((run_start, prev, "filler units stand there"))
            run_start = q
        prev = q
    runs.sort(key=lambda run: run[0])
    start = covered[0][0] if covered else summary.max_offset
    for lo, hi, why in runs[:MISSING_RUNS_SHOWN]:
        if why is None:
            why = (f"the queue ends at offset {summary.max_offset}" if lo >= summary.max_offset else
                   f"the queue starts at offset {start}" if hi < start else "no ConsumeQueue file holds them")
        n = hi - lo + 1
        span = f"offset {lo}" if n == 1 else f"offsets {lo}..{hi}"
        at_phy = "" if phys is None else f" ({'at' if n == 1 else 'the first at'} {phys[lo - first]})"
        problem(where, lo, f"no unit for the log's record{'s' if n > 1 else ''} of queue {span}{at_phy}: {why}")
    if len(runs) > MISSING_RUNS_SHOWN:
        problem(where, runs[MISSING_RUNS_SHOWN][0], f"... and {len(runs) - MISSING_RUNS_SHOWN} more runs of records "
                                                    f"without units")


# -- index files (spec §4) -------------------------------------------------------------------
def _check_index_files(root: str, report: CheckReport, problem: ProblemSink, log: _Log,
                       config: StoreConfig | None, *, live: bool, stable: bool,
                       progress: Progress | None = None, deep: bool = False) -> None:
    index_dir = os.path.join(root, "index")
    if not os.path.isdir(index_dir):
        return
    # deep, after a crash: the files the next open keeps (spec §4.4: it destroys those ending
    # after checkpoint.indexMsgTimestamp) must have sound slots; -1: none is checked
    kept_until = -1
    if deep and not live and not stable:
        from mqstore.log.checkpoint import read_checkpoint_file

        try:
            kept_until = read_checkpoint_file(os.path.join(root, "checkpoint"))["index_msg_timestamp"]
        except (OSError, ValueError):
            kept_until = 0
    if config is None:
        from mqstore.config import StoreConfig

        config, given = StoreConfig(), False
    else:
        given = True
    slots, num = config.max_hash_slot_num, config.max_index_num
    expected = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slots + INDEX_ENTRY_SIZE * num
    names = sorted(os.listdir(index_dir))
    for i, name in enumerate(names):
        if progress is not None:
            progress("index files", i, len(names))
        path = os.path.join(index_dir, name)
        if len(name) != 17 or not name.isdigit() or not os.path.isfile(path):
            continue  # index files are named yyyyMMddHHmmssSSS; others are not the index's
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        with fh:
            _check_index_file(report, problem, log, fh.fileno(), name, slots, num, expected, given,
                              live=live, stable=stable, deep=deep, kept_until=kept_until)


def _check_index_file(report: CheckReport, problem: ProblemSink, log: _Log, fd: int, name: str, slots: int,
                      num: int, expected_size: int, geometry_given: bool, *, live: bool, stable: bool,
                      deep: bool = False, kept_until: int = -1) -> None:
    where = f"index/{name}"
    size = os.fstat(fd).st_size
    if size < INDEX_HEADER_SIZE:
        problem(where, 0, f"file is {size} bytes, shorter than the {INDEX_HEADER_SIZE}-byte header")
        return
    begin_ts, end_ts, begin_phy, end_phy, slot_count, count = _INDEX_HEADER.unpack(
        os.pread(fd, INDEX_HEADER_SIZE, 0))
    summary = IndexFileSummary(name, size, begin_ts, end_ts, begin_phy, end_phy, slot_count, count)
    report.index_files.append(summary)
    # header (spec §4.1). indexCount starts at 1 (entry #0 is never used); a file whose header
    # was never written reads 0, which RocketMQ's load() also takes as 1.
    if count < 0 or (count == 0 and slot_count != 0):
        problem(where, 0, f"header: index_count {count} (at least 1; 0 only in a file never written to)")
        return
    used = max(count, 1)  # entries #0 .. #used-1 are written (#0 never)
    if slot_count < 0 or (stable and slot_count > used - 1):
        problem(where, 0, f"header: hash_slot_count {slot_count} with {used - 1} entries")
    if stable and count > 1 and begin_ts > end_ts:
        problem(where, 0, f"header: begin timestamp {begin_ts} is after the end timestamp {end_ts}")
    if size != expected_size:
        if geometry_given:
            problem(where, 0, f"file is {size} bytes; max_hash_slot_num={slots} and max_index_num={num} make "
                              f"{expected_size}")
        else:
            report.notes.append(f"{where}: {size} bytes is not the size of an index file with the default "
                                f"max_hash_slot_num={slots} and max_index_num={num}; only its header was checked "
                                f"(pass the store's config to check its entries)")
        return
    if slot_count > slots:
        problem(where, 0, f"header: hash_slot_count {slot_count} is more than the {slots} hash slots")
    if count > num:
        problem(where, 0, f"header: index_count {count} is more than max_index_num {num}")
        used = num
    summary.entries_checked = True
    area = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slots
    entries = list(_INDEX_ENTRY.iter_unpack(os.pread(fd, INDEX_ENTRY_SIZE * used, area)))
    newest: dict[int, int] = {}  # hash slot -> its newest entry
    last_phy = -1
    log_min, log_end = log.min_offset, log.end
    for n in range(1, used):
        key_hash, phy, time_diff, prev = entries[n]
        msgs = []
        slot = key_hash % slots
        older = newest.get(slot, 0)
        if prev < 0 or prev >= n:
            msgs.append(f"previous entry {prev} is not an older entry")
        elif prev != older:
            msgs.append(f"previous entry {prev}, but the newest older entry of its hash slot {slot} is {older}")
        newest[slot] = n
        if key_hash < 0:
            msgs.append(f"keyHash {key_hash} is negative")
        if time_diff < 0:
            msgs.append(f"timeDiff {time_diff} is negative")
        if phy < last_phy:
            msgs.append(f"commitLogOffset {phy} is below the previous entry's {last_phy}")
        last_phy = max(last_phy, phy)
        if phy < 0:
            msgs.append(f"commitLogOffset {phy} is negative")
        elif phy < log_min:
            pass  # the record was removed by retention
        elif phy >= log_end:
            if live:
                report.in_flight_units += 1  # its record was written after the scan
            else:
                msgs.append(f"points at {phy}, past the end of the log at {log_end}")
        else:
            rec = log.record(phy)
            if isinstance(rec, str):
                msgs.append(f"points at {phy}: {rec}")
            else:
                if rec.sys_flag & TX_MASK == TX_ROLLBACK:
                    msgs.append(f"points at {phy}, a ROLLBACK record (those are not indexed)")
                hashes = rec.key_hashes()
                if key_hash not in hashes:
                    keys = ", ".join(f"{k!r} ({h})" for h, k in hashes.items()) or "none"
                    msgs.append(f"keyHash {key_hash} is the hash of none of the keys of the record at {phy} "
                                f"(keys: {keys})")
        if msgs:
            problem(where, n, f"entry {n}: " + "; ".join(msgs))
    report.index_entries += used - 1
    if deep and not stable and not live and 0 <= end_ts <= kept_until and used > 1:
        stable = True  # a file the next open keeps after this crash: it was flushed whole
    if not stable or used <= 1:
        return  # a writer may be between the entry, its slot and the header
    if begin_phy != entries[1][1] or end_phy != entries[used - 1][1]:
        problem(where, 0, f"header: phy offsets {begin_phy}..{end_phy}, but the entries span "
                          f"{entries[1][1]}..{entries[used - 1][1]}")
    if slot_count != len(newest):
        problem(where, 0, f"header: hash_slot_count {slot_count}, but the entries use {len(newest)} hash slots")
    if deep:
        _check_slot_chains(problem, where, fd, slots, used, entries, newest)
        return
    if INDEX_SLOT_SIZE * slots <= INDEX_SLOT_TABLE_READ_MAX:
        table = array("i")
        table.frombytes(os.pread(fd, INDEX_SLOT_SIZE * slots, INDEX_HEADER_SIZE))
        if table.itemsize != 4:
            return
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            table.byteswap()
        in_use = slots - table.count(0)
        if in_use != len(newest):
            problem(where, 0, f"{in_use} hash slots are in use, but the entries use {len(newest)}")
        slot_value: Callable[[int], int] = table.__getitem__
    else:
        def slot_value(slot: int) -> int:
            return int(_I32.unpack(os.pread(fd, INDEX_SLOT_SIZE, INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * slot))[0])
    for slot, n in sorted(newest.items()):
        value = slot_value(slot)
        if value != n:
            problem(where, n, f"hash slot {slot} holds entry {value}, but its newest entry is {n}")


INDEX_SLOT_CHUNK = 1 << 20  # hash slots read at a time by the deep check


def _check_slot_chains(problem: ProblemSink, where: str, fd: int, slots: int, used: int,
                       entries: list[tuple[int, int, int, int]], newest: dict[int, int]) -> None:
    """check_store(deep=True): read every hash slot (in chunks) and walk its chain. A slot must
    hold the newest entry of its hash (0 when none); every entry a chain reaches must exist
    and hash to that slot, and be reached once; every entry must be reached (queries walk the
    chains only: an entry no chain reaches is never found)."""
    reached = bytearray(used)
    for first in range(0, slots, INDEX_SLOT_CHUNK):
        n = min(INDEX_SLOT_CHUNK, slots - first)
        table = array("i")
        table.frombytes(os.pread(fd, INDEX_SLOT_SIZE * n, INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * first))
        if len(table) < n:
            problem(where, 0, f"the hash slot table is cut short at slot {first + len(table)}")
            return
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            table.byteswap()
        wanted = [(slot - first, entry) for slot, entry in newest.items() if first <= slot < first + n]
        if table.count(0) == n and not wanted:
            continue
        for i, value in enumerate(table):
            slot = first + i
            want = newest.get(slot, 0)
            if value != want:
                problem(where, value if 0 < value < used else 0,
                        f"hash slot {slot} holds entry {value}, but its newest entry is {want}"
                        + (" (the slot is zeroed: its entries cannot be found)" if value == 0 else ""))
            at = value
            while 0 < at < used and not reached[at]:
                key_hash = entries[at][0]
                if key_hash % slots != slot:
                    problem(where, at, f"hash slot {slot}: its chain reaches entry {at}, whose keyHash {key_hash} "
                                       f"belongs to hash slot {key_hash % slots}")
                    break
                reached[at] = 1
                prev = entries[at][3]
                at = prev if 0 < prev < at else 0
    lost = reached.count(0, 1)
    if lost:
        first_lost = reached.find(0, 1)
        problem(where, first_lost, f"{lost} entr{'y is' if lost == 1 else 'ies are'} on no hash slot's chain "
                                   f"(queries cannot find them), the first entry {first_lost}")
