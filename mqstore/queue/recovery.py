"""Store recovery at start-up (spec §5.2–§5.5), its own module as Kafka's LogLoader.

1. Every ConsumeQueue recovers its last three files (spec §3): units are kept while
   ``phyOffset >= 0 and size > 0`` and while their records follow each other in the log;
   a short file is cut at its last whole unit (ConsumeQueue.load). What a queue drops
   while data follows is *damage*, reported per queue.
2. The CommitLog is scanned record by record (CRC checked when check_crc_on_recover):
   after a clean shutdown from the third-last file (recoverNormally), after a crash from the
   newest file whose first record is older than the checkpoint (recoverAbnormally). The
   valid end is where the scan stops; what follows is truncated (later files deleted, the
   torn tail zeroed). The scan also notes each queue's next offset as the log has it.
   Beyond RocketMQ, the scan cross-checks the header fields no CRC covers (``scan_file``):
   a record whose PHYSICALOFFSET is not where it sits, or whose QUEUEID is negative, is
   treated like a record with a bad CRC: the log ends before it and ``stop_detail`` says
   why. (The bound on QUEUEID is the put path's: it accepts every queue id >= 0, so any
   non-negative int32 is one a writer could have written, and RocketMQ bounds it no lower:
   queue ids are ints, topic configs may hold any number of queues.) QUEUEOFFSET is *not*
   a reason to cut: a record whose queue
   offset is not the next one of its queue has a valid CRC and sits where it should, and
   cutting there would drop every later record of every queue. The start-up dispatch
   handles it as RocketMQ's ConsumeQueue does (an offset already built is a duplicate and
   gets no unit; a skipped offset gets filler units, logged and counted in
   ``ConsumeQueue.gaps``), and ``mqstore verify`` reports both as problems ("duplicate
   offset" / "gap before offset").
3. ConsumeQueue units pointing at or past the valid end are dropped (truncateDirtyLogicFiles),
   and so is a queue's last unit that does not match its record (size, topic, queue, offset).
   Index entries past the valid end are dropped too (when the store passes its index).
4. The control block is rebuilt: positions at the valid end, the topic-queue table from the
   queues' max offsets and, where the log is ahead of a queue, from the log (so a queue
   offset is never handed out twice). The caller then dispatches from ``dispatch_from``
   until nothing is behind, which re-builds what the queues and the index lack (both ignore
   duplicates).

Beyond RocketMQ, ``dispatch_from`` is lowered for queues that lack units the log has (a
damaged or deleted queue, spotted against the scanned files) and for a damaged index, to
the start of the CommitLog file holding the queue's last kept unit (the log's first file
when the queue kept none), so the start-up dispatch rebuilds them.

The report says what was kept and what was dropped: CommitLog bytes and files and why the
scan stopped, units per queue, damaged queues and index files, and how many records the
start-up dispatch replayed.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqstore.layout import FILLER_SIZE, file_start_of, log_of
from mqstore.log._codec import check_record, decode_record
from mqstore.log._scan import scan_records
from mqstore.log._shm import log_of_queue
from mqstore.errors import CorruptRecordError
from mqstore.log.mapped_file_queue import MappedFileQueue
from mqstore.log.clean_close import mismatch as clean_close_mismatch
from mqstore.progress import LogProgress
from mqstore.log.scan import is_zero, why_invalid

if TYPE_CHECKING:
    from mqstore.log._shm import CellName
    from mqstore.log.clean_close import CleanClose
    from mqstore.log._shm import ControlBlock
    from mqstore.log.checkpoint import StoreCheckpoint
    from mqstore.queue.consume_queue import ConsumeQueue, ConsumeQueueTable

log = logging.getLogger("mqstore.recovery")

NORMAL_RECOVERY_FILES = 3  # spec §5.4: recoverNormally starts at the third-last file
LAST_UNIT_CHECKS = 8  # a queue's last units checked against their records, at most
_UNIT = struct.Struct(">qiq")  # ConsumeQueue unit: commitLogOffset, size, tagsCode


@dataclass
class RecoveryReport:
    """What recovery kept and what it dropped."""

    clean_shutdown: bool
    mode: str = "normal"
    files_scanned: int = 0
    first_file_scanned: str = ""
    records: int = 0
    bytes_scanned: int = 0
    valid_end: int = 0
    stop_reason: str = "empty"
    #: why the record at valid_end did not parse ("" when the log simply ended there)
    stop_detail: str = ""
    #: CommitLog files found shorter than the file size (cut), extended with zeros at load
    short_files: list[str] = field(default_factory=list)
    #: short files after them holding only zeros (allocated ahead, never written), extended
    #: at load and then deleted with the other files past the valid end (not damage)
    short_empty_files: list[str] = field(default_factory=list)
    dropped_bytes: int = 0
    deleted_files: list[str] = field(default_factory=list)
    #: the deleted files that held data (the others were pre-allocated, still empty)
    deleted_data_files: list[str] = field(default_factory=list)
    queues: int = 0
    queue_units_dropped: dict[str, int] = field(default_factory=dict)
    queue_files_deleted: int = 0
    #: queues whose files were damaged ("topic/queueId" -> what was wrong)
    damaged_queues: dict[str, str] = field(default_factory=dict)
    #: queues that lacked units for records of the scanned log ("topic/queueId" -> how many);
    #: the start-up dispatch rebuilds them
    queue_units_missing: dict[str, int] = field(default_factory=dict)
    #: where dispatch was lowered to rebuild damaged queues or index files (-1: not lowered)
    rebuild_from: int = -1
    index_entries_dropped: int = 0
    index_files_deleted: list[str] = field(default_factory=list)
    #: what was wrong with the index files / the checkpoint ("" / empty: nothing)
    index_damage: list[str] = field(default_factory=list)
    checkpoint_damage: str = ""
    dispatch_from: int = 0
    redispatched_records: int = 0
    last_store_timestamp: int = -1
    #: why a clean-close record was there but not used ("" when it was used or absent)
    clean_close_problem: str = ""
    elapsed_ms: float = 0.0

    @property
    def dropped_units(self) -> int:
        return sum(self.queue_units_dropped.values())

    @property
    def damaged(self) -> bool:
        """True when anything was found damaged or dropped (queues lacking units are damage
        only after a clean shutdown: after a crash dispatch was simply behind)."""
        return bool(self.short_files or self.dropped_bytes or self.deleted_data_files or self.queue_units_dropped
                    or self.damaged_queues or (self.clean_shutdown and self.queue_units_missing)
                    or self.index_entries_dropped or self.index_files_deleted or self.index_damage
                    or self.checkpoint_damage or self.stop_detail)

    def summary(self) -> str:
        how = "clean" if self.clean_shutdown else "abnormal (abort file present)"
        if self.stop_reason == "clean-close record":
            checked = "valid end from the clean-close record (no scan)"
        else:
            checked = f"{self.records} records in {self.files_scanned} files checked from {self.first_file_scanned or '-'}"
        text = (f"recovery after {how} shutdown: {checked}, valid end {self.valid_end}, {self.queues} queues, "
                f"{self.redispatched_records} records dispatched from {self.dispatch_from}")
        if self.clean_close_problem:
            text += f"; the clean-close record was not used: {self.clean_close_problem}"
        if self.short_files:
            text += f"; CommitLog files cut short: {', '.join(self.short_files)}"
        if self.short_empty_files:
            text += f"; empty CommitLog files cut short: {', '.join(self.short_empty_files)}"
        if self.stop_detail:
            text += f"; the CommitLog ends at {self.valid_end}: {self.stop_detail}"
        if self.dropped_bytes:
            text += f"; dropped {self.dropped_bytes} bytes after the valid end"
        if self.deleted_data_files:
            text += f"; deleted files holding data after the valid end: {', '.join(self.deleted_data_files)}"
        empty = [name for name in self.deleted_files if name not in self.deleted_data_files]
        if empty:
            text += f"; deleted empty pre-allocated files {', '.join(empty)}"
        if self.queue_units_dropped:
            shown = ", ".join(f"{k}: {v}" for k, v in sorted(self.queue_units_dropped.items())[:10])
            text += f"; dropped {self.dropped_units} queue units ({shown})"
        if self.damaged_queues:
            shown = "; ".join(f"{k}: {v}" for k, v in sorted(self.damaged_queues.items())[:10])
            text += f"; damaged queues ({shown})"
        if self.queue_units_missing:
            shown = ", ".join(f"{k}: {v}" for k, v in sorted(self.queue_units_missing.items())[:10])
            text += f"; queues lacking units of the log ({shown})"
        if self.rebuild_from >= 0:
            text += f"; rebuilding from {self.rebuild_from}"
        if self.index_entries_dropped or self.index_files_deleted or self.index_damage:
            text += (f"; index: dropped {self.index_entries_dropped} entries"
                     + (f", deleted {', '.join(self.index_files_deleted)}" if self.index_files_deleted else "")
                     + (f" ({'; '.join(self.index_damage)})" if self.index_damage else ""))
        if self.checkpoint_damage:
            text += f"; checkpoint: {self.checkpoint_damage}"
        return text

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


_HEAD_FIELDS_AT = 12  # QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET (spec §1.1)
_HEAD_FIELDS = struct.Struct(">iiqq")


def header_problem(file_from: int, pos: int, queue_id: int, physical_offset: int) -> str:
    """Why a record that parses (and whose CRC matches) still cannot be trusted, "" if it can:
    header fields no CRC covers that contradict where it is. PHYSICALOFFSET must be the
    record's own offset (file_from + pos); QUEUEID must be >= 0 (what the put path accepts:
    every non-negative int32)."""
    if physical_offset != file_from + pos:
        return f"its PHYSICALOFFSET field says {physical_offset}, but the record is at {file_from + pos}"
    if queue_id < 0:
        return f"its QUEUEID is {queue_id}, but queue ids are >= 0"
    return ""


def scan_file(mf: Any, start: int, end: int, check_crc: bool, ctl: ControlBlock | None = None
              ) -> tuple[int, str, int, int, str]:
    """scan_records over [start, end) of one CommitLog file with the header cross-check
    (header_problem, done by the kernel: check_header): a record failing it ends the scan
    there as a bad CRC does. Returns (stop, reason, count, last_store_timestamp, detail);
    reason is scan_records' ("invalid" for a failed cross-check); detail names the header
    field that stopped the scan ("" otherwise, also when the record simply did not parse:
    mqstore.log.scan.why_invalid says why then). With ctl, each queue's next offset in the
    topic-queue table is raised past every record kept (never for the record refused)."""
    base = mf.file_from
    stop, reason, count, last_ts = scan_records(mf, base, start, end, check_crc, ctl, None, True)
    detail = ""
    if reason == "header":
        qid, _, _, phy = _HEAD_FIELDS.unpack_from(mf.read(stop + _HEAD_FIELDS_AT, _HEAD_FIELDS.size))
        reason, detail = "invalid", header_problem(base, stop, qid, phy)
    return stop, reason, count, last_ts, detail


def choose_abnormal_start(queue: MappedFileQueue, min_timestamp: int) -> int:
    """spec §5.5: index of the newest file whose first record is valid (its header fields
    too: header_problem), has a store timestamp and is not newer than the checkpoint's min
    timestamp; 0 if none."""
    files = queue.files
    for i in range(len(files) - 1, -1, -1):
        mf = files[i]
        size, ok = check_record(mf, 0, check_crc=False, read_body=False)
        if not ok or size <= 0:
            continue
        _, _, count, ts, _ = scan_file(mf, 0, size, False)
        if count == 1 and ts != 0 and ts <= min_timestamp:
            return i
    return 0


def scan_commitlog(queue: MappedFileQueue, start_index: int, *, check_crc: bool, report: RecoveryReport,
                   progress: Callable[[int, int], None] | None = None, ctl: ControlBlock | None = None) -> int:
    """Scan from file start_index until a record fails (scan_file: parse, CRC, header fields)
    or the log ends; returns the valid end. With ctl, each queue's next offset in its
    topic-queue table is raised past every record kept."""
    files = queue.files
    if not files:
        return 0
    valid_end = files[start_index].file_from
    report.first_file_scanned = files[start_index].file_name
    todo = files[start_index:]
    logged = LogProgress(log, "recovery")
    for i, mf in enumerate(todo):
        stop, reason, count, last_ts, detail = scan_file(mf, 0, queue.file_size, check_crc, ctl)
        report.files_scanned += 1
        report.records += count
        report.bytes_scanned += stop
        if last_ts >= 0:
            report.last_store_timestamp = last_ts
        valid_end = mf.file_from + stop
        report.stop_reason = reason
        if detail:
            report.stop_detail = f"corrupt record in {mf.file_name} at {stop}: {detail}"
        elif reason == "invalid" and not is_zero(mf, stop, stop + 8):
            report.stop_detail = (f"corrupt record in {mf.file_name} at {stop}: "
                                  + why_invalid(mf, stop, check_crc, "its start"))
        if progress is not None:
            progress(i + 1, len(todo))
        logged("CommitLog", (i + 1) * queue.file_size, len(todo) * queue.file_size)
        if reason == "blank" and i + 1 < len(todo):
            continue
        break
    logged.finish(f"{report.files_scanned} CommitLog file(s), {report.records:,} records")
    return valid_end


def commitlog_file_was_cut(path: str) -> bool:
    """Whether a CommitLog file shorter than the configured size was cut (its data runs to its
    very end: the last record is cut off, or the cut fell on a record boundary, or inside the
    END_OF_FILE blank, whose TOTALSIZE then reaches past the cut) rather than written with
    another file size (its records end with an END_OF_FILE blank that ends with the file, or
    zeros follow them). For MappedFileQueue.load (and plan_load, which the recovery dry run
    uses): a cut last file is extended, recovery keeps what precedes the cut; a file of another
    size is refused."""
    with open(path, "rb") as fh:
        data = fh.read()
    stop, reason, _, _ = scan_records(data, 0, 0, len(data), False)
    if reason == "blank":
        blank_total = int.from_bytes(data[stop:stop + 4], "big", signed=True)
        return stop + blank_total > len(data)
    rest = data[stop:]
    if not rest:
        return True
    if is_zero(rest):
        return False
    return len(rest) < 4 or int.from_bytes(rest[:4], "big", signed=True) > len(rest)


def _record_at(queue: MappedFileQueue, phy: int) -> Any:
    """The decoded record starting at phy (no CRC check, no body), or None."""
    mf = queue.find_mapped_file_by_offset(phy)
    if mf is None:
        return None
    pos = phy - mf.file_from
    view = mf.view(pos, mf.file_size - pos)
    try:
        return decode_record(view, 0, check_crc=False, read_body=False)
    except (CorruptRecordError, ValueError, IndexError):
        return None
    finally:
        view.release()


def _check_last_units(cq: ConsumeQueue, queue: MappedFileQueue, min_phy: int) -> str:
    """Drop the queue's last units while they do not match the record they point at (a
    damaged unit would make the queue's max_physic_offset, where dispatch resumes, land
    inside a record). Returns what was wrong, "" if nothing."""
    problem = ""
    for _ in range(LAST_UNIT_CHECKS):
        last = cq.last_unit()
        if last is None:
            break
        q, phy, size, _tags = last
        if phy < min_phy:
            break  # removed by retention: nothing to check it against
        rec = _record_at(queue, phy)
        if rec is not None and rec.total_size == size and rec.topic == cq.topic and rec.queue_id == cq.queue_id \
                and rec.queue_offset == q:
            break
        what = "no record starts there" if rec is None else (
            f"the record there is {rec.topic}/{rec.queue_id} offset {rec.queue_offset}, {rec.total_size} bytes")
        problem = problem or f"unit {q} (phyOffset {phy}, size {size}) does not match its record: {what}"
        cq.truncate_dirty_logic_files(phy)
        if cq.max_offset_in_queue > q:  # truncation did not remove it (it is before a filler run)
            break
    return problem


def _check_first_file(cq: ConsumeQueue, min_phy: int, base: int = 0) -> str:
    """A queue whose first file starts above queue offset 0 with a real unit (not the pre-fill
    of a queue that started above 0) while the CommitLog still starts at its first offset
    (base: 0, or log_base(k) for CommitLog k): its first files were lost (retention deletes a
    queue's files only after the log's). Its files are deleted, to be rebuilt from the log's
    start. Returns what was wrong, "" if nothing."""
    first = cq.files.first()
    if min_phy != base or first is None or first.file_from == 0:
        return ""
    phy, size, _ = _UNIT.unpack(first.read(0, _UNIT.size))
    if phy == 0 and size == FILLER_SIZE:
        return ""
    problem = (f"its first file is {first.file_name} (queue offset {first.file_from // _UNIT.size}) but the "
               f"CommitLog still starts at 0: the files before it are missing; rebuilding the queue")
    cq.drop_all_files()
    return problem


def recover_store(queue: MappedFileQueue, ctl: ControlBlock, queues: ConsumeQueueTable | None,
                  checkpoint: StoreCheckpoint | None, *, check_crc: bool, clean_shutdown: bool,
                  index_safe: bool = False, progress: Callable[[int, int], None] | None = None,
                  index: Any = None, clean_close: CleanClose | None = None, log_id: int = 0) -> RecoveryReport:
    """Recover the CommitLog and the ConsumeQueues (and the index files, when given); rebuild
    the (fresh) control block. Sets report.dispatch_from: where the start-up dispatch must begin.

    ``log_id``: with several CommitLogs (docs/parallel-commitlogs.md), ``queue`` is CommitLog
    ``log_id``'s files, and only the ConsumeQueues of that log's queues, its cells of the control
    block and its table entries are recovered here (offsets are that log's encoded offsets);
    each log is recovered by its own call.

    After a clean shutdown, a clean-close record (mqstore.log.clean_close) that agrees with the
    files stands for the scan of the last files: its write position is the valid end and its
    queue offsets fill the topic-queue table."""
    t0 = time.monotonic()
    report = RecoveryReport(clean_shutdown=clean_shutdown, mode="normal" if clean_shutdown else "abnormal")
    if checkpoint is not None:
        report.checkpoint_damage = getattr(checkpoint, "damage", "")
        if not report.checkpoint_damage and getattr(checkpoint, "created", False) and len(queue):
            report.checkpoint_damage = "the checkpoint file was missing"
    report.short_files = [f"{name} ({size} of {queue.file_size} bytes)"
                          for name, size in getattr(queue, "extended", [])]
    report.short_empty_files = [f"{name} ({size} of {queue.file_size} bytes)"
                                for name, size in getattr(queue, "extended_empty", [])]
    damaged: dict[tuple[str, int], str] = {}
    files = queue.files
    base = queue.base
    if queues is not None:
        for r in queues.recover(log_id):
            report.queue_files_deleted += r.deleted_files
            if r.damaged:
                damaged[(r.topic, r.queue_id)] = "; ".join(r.damage)
            if r.dropped_units:
                report.queue_units_dropped[f"{r.topic}/{r.queue_id}"] = r.dropped_units
        if files:
            # before the CommitLog's truncation can delete the files that show the loss (a
            # queue whose remaining files all point past a shortened log would otherwise keep
            # its raised min offset and never get its lost first units back)
            for cq in queues.of_log(log_id):
                problem = _check_first_file(cq, files[0].file_from, base)
                if problem:
                    key = (cq.topic, cq.queue_id)
                    damaged[key] = f"{damaged[key]}; {problem}" if key in damaged else problem
                    log.error("ConsumeQueue %s/%d: %s; dropped", cq.topic, cq.queue_id, problem)
    scan_start = 0
    if not files:
        if queues is not None and queues.of_log(log_id):
            log.warning("CommitLog %d is empty: destroying its %d ConsumeQueues", log_id, len(queues.of_log(log_id)))
            queues.destroy_all(log_id)
        report.valid_end = base
    else:
        trusted = None
        if clean_shutdown and clean_close is not None:
            report.clean_close_problem = clean_close_mismatch(queue, clean_close)
            if report.clean_close_problem:
                log.warning("recovery: the clean-close record is not used (%s); scanning the last files",
                            report.clean_close_problem)
            else:
                trusted = clean_close
        if clean_shutdown:
            start = max(0, len(files) - NORMAL_RECOVERY_FILES)
        else:
            min_ts = 0
            if checkpoint is not None:
                min_ts = checkpoint.min_timestamp_index if index_safe else checkpoint.min_timestamp
            start = choose_abnormal_start(queue, min_ts)
        scan_start = files[start].file_from
        if trusted is not None:
            report.mode = "normal, from the clean-close record"
            report.stop_reason = "clean-close record"
            valid_end = trusted.wrote
            report.last_store_timestamp = trusted.last_store_timestamp
            for topic, qid, n in trusted.table:
                ctl.table_set(topic, qid, n)
        else:
            valid_end = scan_commitlog(queue, start, check_crc=check_crc, report=report, progress=progress, ctl=ctl)
        report.deleted_data_files = [mf.file_name for mf in files if mf.file_from > valid_end
                                     and not is_zero(mf, 0, 8)]
        report.deleted_files, report.dropped_bytes = queue.truncate_dirty_files(valid_end)
        report.valid_end = valid_end
        if report.stop_detail:
            log.error("recovery: %s; the CommitLog is truncated there (%d bytes dropped%s)", report.stop_detail,
                      report.dropped_bytes,
                      f", files {', '.join(report.deleted_files)} deleted" if report.deleted_files else "")
        if queues is not None:
            for (topic, qid), n in queues.truncate_dirty(valid_end, log_id).items():
                name = f"{topic}/{qid}"
                report.queue_units_dropped[name] = report.queue_units_dropped.get(name, 0) + n
    files = queue.files
    min_phy = files[0].file_from if files else base
    count = queues.log_count if queues is not None else 1
    log_next = {(topic, qid): n for topic, qid, n in ctl.table_items()
                if n > 0 and log_of_queue(topic, qid, count) == log_id}
    ends: tuple[CellName, ...] = ("wrote", "committed", "flushed", "confirmed")
    for name in ends:
        ctl.set(name, report.valid_end, log=log_id)
    ctl.set("min_phy", min_phy, log=log_id)
    if report.last_store_timestamp > 0:
        ctl.set("last_store_timestamp", report.last_store_timestamp, log=log_id)
        ctl.set("flushed_store_timestamp", report.last_store_timestamp, log=log_id)
    max_phy_cq = -1
    rebuild: list[tuple[int, str]] = []  # (offset to dispatch from, why)
    if queues is not None:
        if files:
            for cq in queues.of_log(log_id):
                problem = _check_last_units(cq, queue, min_phy)
                if problem:
                    key = (cq.topic, cq.queue_id)
                    damaged[key] = f"{damaged[key]}; {problem}" if key in damaged else problem
                    log.error("ConsumeQueue %s/%d: %s; dropped", cq.topic, cq.queue_id, problem)
        queues.correct_min_offsets(min_phy, log_id)
        for cq in queues.of_log(log_id):
            key = (cq.topic, cq.queue_id)
            have = cq.max_offset_in_queue
            in_log = log_next.get(key, 0)
            ctl.table_set(cq.topic, cq.queue_id, max(have, in_log))
            if in_log > have:
                report.queue_units_missing[f"{cq.topic}/{cq.queue_id}"] = in_log - have
            if in_log > have or key in damaged:
                rebuild.append(_rebuild_point(cq, queue.file_size, min_phy, clean_shutdown, scan_start, key in damaged))
        for key, in_log in log_next.items():
            if queues.get(*key) is None:
                # the log has records of a queue that has no ConsumeQueue at all
                report.queue_units_missing[f"{key[0]}/{key[1]}"] = in_log
                if clean_shutdown:
                    rebuild.append((min_phy, f"{key[0]}/{key[1]} has no ConsumeQueue"))
        max_phy_cq = queues.max_physic_offset_of(log_id)
        report.queues = len(queues.of_log(log_id))
        report.damaged_queues = {f"{t}/{q}": why for (t, q), why in damaged.items()}
    if index is not None:
        _recover_index(index, queue, report, rebuild, min_phy)
    if clean_shutdown or not files:
        report.dispatch_from = max(max_phy_cq, min_phy)
    else:
        report.dispatch_from = max(min(max_phy_cq, scan_start), min_phy)
    if rebuild and files:
        point, why = min(rebuild)
        point = max(point, min_phy)
        if point < report.dispatch_from:
            report.rebuild_from = point
            report.dispatch_from = point
            log.warning("recovery: dispatching from %d to rebuild what is missing (%s)", point, why)
    report.dispatch_from = min(report.dispatch_from, report.valid_end)
    report.elapsed_ms = (time.monotonic() - t0) * 1000
    return report


def _rebuild_point(cq: ConsumeQueue, file_size: int, min_phy: int, clean_shutdown: bool, scan_start: int,
                   damaged: bool) -> tuple[int, str]:
    """Where dispatch must start to rebuild what cq lacks: the start of the CommitLog file
    holding the end of its last kept unit (file starts are record boundaries; the dispatch
    skips what the queue has), or the log's first file when it kept none (after a crash
    the checkpoint vouches for what precedes the scanned files, unless the queue is damaged)."""
    name = f"{cq.topic}/{cq.queue_id}"
    end = cq.max_physic_offset
    if end >= 0:
        return max(min_phy, file_start_of(end, file_size)), f"{name} lacks units after {end}"
    if not clean_shutdown and not damaged:
        return scan_start, f"{name} lacks units"
    return min_phy, f"{name} kept no units"


def _recover_index(index: Any, queue: MappedFileQueue, report: RecoveryReport, rebuild: list[tuple[int, str]],
                   min_phy: int) -> None:
    """Drop index entries past the valid end; rebuild damaged index files from the log."""

    def timestamp_of(phy: int) -> int:
        rec = _record_at(queue, phy)
        return -1 if rec is None else rec.store_timestamp

    dropped, deleted = index.truncate_dirty(report.valid_end, timestamp_of)
    report.index_entries_dropped = dropped
    report.index_files_deleted = list(getattr(index, "damaged_files", [])) + deleted
    report.index_damage = list(getattr(index, "damage", []))
    need = getattr(index, "rebuild_from", -1)
    if need >= 0:
        file_size = queue.file_size
        point = max(min_phy, file_start_of(need, file_size))
        rebuild.append((point, "damaged index files"))


def log_report(report: RecoveryReport) -> None:
    log.log(logging.WARNING if report.damaged else logging.INFO, "%s", report.summary())


@dataclass
class Truncation:
    """What ``truncate_store`` dropped."""

    offset: int  # where the log ends now
    end: int  # where it ended before
    deleted_files: list[str] = field(default_factory=list)
    queue_units_dropped: dict[str, int] = field(default_factory=dict)
    index_entries_dropped: int = 0

    @property
    def dropped_bytes(self) -> int:
        return self.end - self.offset

    def summary(self) -> str:
        parts = [f"the CommitLog was cut from {self.end} to {self.offset}: {self.dropped_bytes} bytes dropped"]
        if self.deleted_files:
            parts.append(f"files {', '.join(self.deleted_files)} deleted")
        if self.queue_units_dropped:
            parts.append(f"{sum(self.queue_units_dropped.values())} ConsumeQueue units dropped "
                         f"({', '.join(f'{k}: {v}' for k, v in sorted(self.queue_units_dropped.items()))})")
        if self.index_entries_dropped:
            parts.append(f"{self.index_entries_dropped} index entries dropped")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "end": self.end, "dropped_bytes": self.dropped_bytes,
                "deleted_files": self.deleted_files, "queue_units_dropped": self.queue_units_dropped,
                "index_entries_dropped": self.index_entries_dropped}


def truncate_store(offset: int, queue: MappedFileQueue, ctl: ControlBlock, queues: ConsumeQueueTable,
                   index: Any = None) -> Truncation:
    """Cut an open store's log back to ``offset``, a record boundary (a slave whose log holds
    bytes its master lost: RocketMQ 5's DefaultMessageStore.truncateFiles), while nothing
    appends to it and nothing dispatches it (the caller stopped both): the CommitLog's tail
    from offset is zeroed and later files deleted, every ConsumeQueue unit and index entry of
    a record at or after offset dropped, and the control block's positions, topic-queue table
    and published queue counts set to what is left. ``queues`` must hold every queue of the
    store, built up to what the dispatcher published."""
    k = log_of(offset)  # with several CommitLogs the offset names its log: only that log is cut
    of_log = k if queues.log_count > 1 else None
    end = ctl.get("wrote", log=k)
    report = Truncation(offset=offset, end=end)
    if offset >= end:
        report.offset = end
        return report
    min_phy = ctl.get("min_phy", log=k)
    if offset < min_phy:
        raise ValueError(f"cannot truncate the CommitLog to {offset}: it starts at {min_phy}")
    report.deleted_files, _ = queue.truncate_dirty_files(offset)
    for name in ("wrote", "committed", "flushed", "confirmed", "dispatched"):
        if ctl.get(name, log=k) > offset:  # type: ignore[arg-type]
            ctl.set(name, offset, log=k)  # type: ignore[arg-type]
    for (topic, qid), n in queues.truncate_dirty(offset, of_log).items():
        report.queue_units_dropped[f"{topic}/{qid}"] = n
    for cq in queues.of_log(of_log):
        ctl.table_set(cq.topic, cq.queue_id, cq.max_offset_in_queue)
        ctl.table_set_dispatched(cq.topic, cq.queue_id, cq.max_offset_in_queue)
    if index is not None:
        report.index_entries_dropped, _ = index.truncate_dirty(
            offset, lambda phy: -1 if (rec := _record_at(queue, phy)) is None else rec.store_timestamp)
    return report
