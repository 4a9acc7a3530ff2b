"""Read-only inspection of a store directory: what ``mqstore inspect``, ``dump`` and ``recover`` show.

Nothing here takes the store's lock or creates, extends, truncates or deletes a file, or opens
one for writing, so it may look at a store that another process has open, or one on a
read-only mount. CommitLog files (and, for the recovery dry run, ConsumeQueue files) are
mapped with ``MappedFile.open(readonly=True)`` (O_RDONLY, PROT_READ: a stray write faults
instead of changing the store), so that the store's own scanners, decoders and recovery read
them in place; otherwise ConsumeQueue files are mapped read-only, and index headers are read
with pread. What loading would repair first (a cut last CommitLog file, a short ConsumeQueue
file) is mapped from a repaired copy in a temporary directory.

It builds on mqstore.queue.files (the read-only mappings and scans of the files, which the readers
that follow a store use too) and adds what the commands show:

- ``inventory(root)``: the CommitLog files and where their records end, every ConsumeQueue
  (offsets, physical offsets, files) and the index file headers.
- ``records_at`` / ``queue_records``: records by physical offset or by queue offset, every
  field decoded, for ``dump``; a bad offset raises ``OffsetError`` naming why.
- ``plan_recovery(root)``: what opening the store would do (spec §3 recovery and
  truncateDirtyLogicFiles, §5.2-§5.5): ``mqstore.queue.recovery.recover_store`` itself runs over
  ``ReadOnlyFileQueue``s, which mirror what loading repairs (MappedFileQueue.plan_load,
  consume_queue.plan_repair) and record what recovery would zero and delete instead of
  doing it, and over ``DryRunIndex``, which does the same for the index files
  (index.plan_index_load, IndexService.truncate_dirty), so the plan cannot drift from the
  real recovery. Its ``report`` is the RecoveryReport the open will produce (up to
  ``elapsed_ms``); the plan adds the details per queue and file.

A store that is being written may change while it is read: the results are then a snapshot
of a moving target, never a reason to touch a file.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from mqstore.layout import (CONTROL_BLOCK_NAME, INDEX_DIR, abort_path, checkpoint_path, consumequeue_dir, file_start_of,
                            index_dir, log_base, log_of, queue_dir)
from mqstore.log import _shm
from mqstore.log._codec import check_record, crc32, decode_record
from mqstore.log._scan import scan_records
from mqstore.log._mapped import MappedFile
from mqstore.tools.checker import IndexFileSummary, unit_mismatch
from mqstore.log.checkpoint import StoreCheckpoint
from mqstore.config import StoreConfig
from mqstore.queue.consume_queue import ConsumeQueueTable, plan_repair
from mqstore.errors import CorruptRecordError, MQStoreError
from mqstore.log.mapped_file_queue import MappedFileQueue
from mqstore.queue.files import (LogFile, QueueFiles, QueueInfo, ReadOnlyFileQueue, alloc_leftovers, commit_log_count,
                                 commitlog, is_filler, log_end, log_files, open_commitlog, queue_dirs, queue_info,
                                 queue_log, store_config)
from mqstore.queue.index import IndexLoadPlan, _geometry_vouched, plan_index_load
from mqstore.log.record import DecodedRecord
from mqstore.log import clean_close as clean_close_record
from mqstore.queue.recovery import RecoveryReport, recover_store

INDEX_HEADER = struct.Struct(">qqqqii")  # spec §4.1
_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode
_INDEX_NAME = re.compile(r"\d{17}")
_INDEX_STAGING = re.compile(r"000\d{17}(\.alloc\d+)?")  # links an interrupted index creation leaves

Progress = Callable[[str, int, int], None]  # (what, done, total)
Buffer = mmap.mmap | bytes


class OffsetError(MQStoreError, ValueError):
    """A physical or queue offset that holds no record: not on a record boundary, past the end
    of the log, below its first file, or a queue that does not exist."""

    hint = "mqstore inspect STORE_DIR lists the files, queues and their offsets"


def index_files(root: str, log: int = 0) -> list[IndexFileSummary]:
    """The header of every ``index/<yyyyMMddHHmmssSSS>`` file (``index-k/`` for CommitLog k of
    a store with several)."""
    idir = index_dir(root, log)
    if not os.path.isdir(idir):
        return []
    out = []
    for name in sorted(os.listdir(idir)):
        path = os.path.join(idir, name)
        if not _INDEX_NAME.fullmatch(name) or not os.path.isfile(path):
            continue
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = os.pread(fh.fileno(), INDEX_HEADER.size, 0)
        if len(head) < INDEX_HEADER.size:
            out.append(IndexFileSummary(name, size, error=f"{size} bytes, shorter than the {INDEX_HEADER.size}-byte "
                                                       f"header"))
        else:
            out.append(IndexFileSummary(name, size, *INDEX_HEADER.unpack(head)))
    return out


# -- the whole store -----------------------------------------------------------------------
@dataclass
class LogInventory:
    """One CommitLog of a store with several: its files, min offset and end."""

    log: int
    files: list[LogFile]
    min_offset: int
    end: int
    index_files: list[IndexFileSummary]


@dataclass
class Inventory:
    root: str
    log_files: list[LogFile]
    #: start of the first CommitLog file (records below were removed by retention)
    log_min: int
    log_end: int
    queues: list[QueueInfo]
    index_files: list[IndexFileSummary]
    #: a store with several CommitLogs: each log (the fields above are log 0's); empty otherwise
    logs: list[LogInventory] = field(default_factory=list)


def inventory(root: str, *, flushed: int | None = None, progress: Progress | None = None) -> Inventory:
    """What the store holds; flushed: the control block's flushed position, if known (of log
    0; a store with several CommitLogs reads each log's own from the block)."""
    count = commit_log_count(root)
    logs = []
    for k in range(count):
        in_log = flushed if k == 0 else _flushed_of(root, k)
        with commitlog(root, log=k if count > 1 else None) as queue:
            files = log_files(queue, in_log, progress)
        log_min = files[0].file_from if files else log_base(k)
        logs.append(LogInventory(k, files, log_min, log_end(files) if files else log_base(k), index_files(root, k)))
    dirs = queue_dirs(root)
    queues = []
    for i, (topic, qid, qdir) in enumerate(dirs):
        with QueueFiles(topic, qid, qdir) as qf:
            queues.append(queue_info(qf, logs[queue_log(topic, qid, count)].min_offset))
        if progress is not None:
            progress("consumequeues", i + 1, len(dirs))
    first = logs[0]
    return Inventory(root, first.files, first.min_offset, first.end, queues, first.index_files,
                     logs if count > 1 else [])


def _flushed_of(root: str, log: int) -> int | None:
    """CommitLog log's flushed position in root's control block (None without one)."""
    path = os.path.join(root, CONTROL_BLOCK_NAME)
    try:
        ctl = _shm.ControlBlock.attach(path, readonly=True)
    except (OSError, ValueError):
        return None
    try:
        return ctl.get("flushed", log=log) if log < ctl.log_count else None
    finally:
        ctl.close()


# -- records (dump) ------------------------------------------------------------------------
@dataclass
class DumpEntry:
    """One record (or, reading a queue, one unit without a record: ``record`` None, ``note`` why)."""

    phy: int
    record: DecodedRecord | None = None
    #: the body's CRC computed now (RocketMQ crc32 & 0x7FFFFFFF); compare record.body_crc
    computed_crc: int = 0
    file_name: str = ""
    #: reading a queue: the unit's queue offset and (phyOffset, size, tagsCode)
    queue_offset: int | None = None
    unit: tuple[int, int, int] | None = None
    note: str = ""

    @property
    def crc_ok(self) -> bool:
        return self.record is not None and self.computed_crc == self.record.body_crc


class LogReader:
    """The CommitLog files of a store mapped for reading, with record lookups by offset (every
    log's of a store with several: an offset is looked up in the log it names)."""

    def __init__(self, root: str) -> None:
        count = commit_log_count(root)
        self.queues: list[ReadOnlyFileQueue] = []
        try:
            for k in range(count):
                self.queues.append(open_commitlog(root, contiguous=False, log=k if count > 1 else None))
        except BaseException:
            self.close()
            raise
        self.queue = self.queues[0]
        self.file_size = max(q.file_size for q in self.queues)
        self._scans: dict[int, tuple[int, str]] = {}

    def close(self) -> None:
        for queue in self.queues:
            queue.close()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def min_offset(self) -> int:
        return self.min_offset_of(0)

    def min_offset_of(self, log: int) -> int:
        """The first offset CommitLog log still holds (its base when it has no file)."""
        queue = self.queues[log]
        return queue.min_offset if len(queue) else log_base(log)

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        """The min offset of the log topic/queue_id is written to."""
        return self.min_offset_of(queue_log(topic, queue_id, len(self.queues)))

    def _queue_of(self, phy: int) -> ReadOnlyFileQueue:
        k = log_of(phy) if phy >= 0 else 0
        if k >= len(self.queues):
            raise OffsetError(f"offset {phy} names CommitLog {k}, and the store has {len(self.queues)}")
        return self.queues[k]

    def stop(self, mf: MappedFile) -> tuple[int, str]:
        """(position where the file's records end, scan_records' reason), CRCs not checked."""
        got = self._scans.get(mf.file_from)
        if got is None:
            stop, reason, _, _ = scan_records(mf, mf.file_from, 0, self.file_size, False)
            got = self._scans[mf.file_from] = (stop, reason)
        return got

    def end(self, log: int = 0) -> int:
        """Where the log ends (the first file not ended by the END_OF_FILE blank)."""
        files = self.queues[log].files
        for mf in files:
            stop, reason = self.stop(mf)
            if reason == "invalid":
                return mf.file_from + stop
        return files[-1].file_from + self.file_size if files else log_base(log)

    def locate(self, phy: int) -> MappedFile:
        """The file holding the record at phy; OffsetError naming why phy holds none."""
        queue = self._queue_of(phy)
        k = log_of(phy) if phy >= 0 else 0
        files = queue.files
        if not files:
            raise OffsetError(f"offset {phy} is past the end of the log: the CommitLog has no files")
        if phy < 0:
            raise OffsetError(f"offset {phy} is negative")
        if phy < files[0].file_from:
            raise OffsetError(f"offset {phy} is below the CommitLog's first file {files[0].file_name} (starts at "
                              f"{files[0].file_from}): removed by retention")
        mf = queue.find_mapped_file_by_offset(phy)
        if mf is None and phy < files[-1].file_from + self.file_size:
            raise OffsetError(f"offset {phy} is in CommitLog file {file_start_of(phy, self.file_size):020d}, which is missing")
        if mf is None:
            raise OffsetError(f"offset {phy} is past the end of the log at {self.end(k)}")
        pos = phy - mf.file_from
        stop, reason = self.stop(mf)
        if pos >= stop:
            if reason == "blank":
                raise OffsetError(f"offset {phy} is in the END_OF_FILE blank of file {mf.file_name} (from "
                                  f"{mf.file_from + stop}); the next record is at {mf.file_from + self.file_size}")
            raise OffsetError(f"offset {phy} is past the end of the log at {self.end(k)}")
        start, _, _, _ = scan_records(mf, mf.file_from, 0, pos, False)
        if start != pos:
            size = int.from_bytes(mf.read(start, 4), "big", signed=True)
            raise OffsetError(f"offset {phy} is not on a record boundary: it falls inside the record at "
                              f"{mf.file_from + start} (TOTALSIZE {size}); the next record is at "
                              f"{mf.file_from + start + size}")
        return mf

    @staticmethod
    def decode(mf: MappedFile, pos: int) -> tuple[DecodedRecord, DumpEntry]:
        """The record at pos of mf with its body, and its entry (the CRC computed, not enforced)."""
        rec = decode_record(mf, pos, check_crc=False, read_body=True)
        return rec, DumpEntry(mf.file_from + pos, rec, crc32(rec.body or b""), mf.file_name)

    def records_at(self, phy: int, count: int) -> list[DumpEntry]:
        """count records from phy on (fewer at the end of the log), across files."""
        first = self.locate(phy)
        mf: MappedFile | None = first
        pos = phy - first.file_from
        out: list[DumpEntry] = []
        while mf is not None and len(out) < count:
            stop, reason = self.stop(mf)
            if pos >= stop:
                mf = None if reason == "invalid" else self._queue_of(phy).get(mf.file_from + self.file_size)
                pos = 0
                continue
            rec, entry = self.decode(mf, pos)
            out.append(entry)
            pos += rec.total_size
        return out

    def unit_entry(self, queue_offset: int, unit: tuple[int, int, int], topic: str, queue_id: int) -> DumpEntry:
        """The record a ConsumeQueue unit points at, with a note when there is none or it disagrees."""
        phy, size, tags = unit
        base = DumpEntry(phy, queue_offset=queue_offset, unit=unit)
        if is_filler(phy, size):
            base.note = "filler unit: no message has this queue offset (pre-fill or skipped offset)"
            return base
        low = self.min_offset_of(log_of(phy)) if 0 <= log_of(phy) < len(self.queues) else 0
        if phy < low:
            base.note = f"the record at {phy} was removed by retention (the CommitLog starts at {low})"
            return base
        try:
            mf = self.locate(phy)
            rec, got = self.decode(mf, phy - mf.file_from)
        except (OffsetError, CorruptRecordError) as exc:
            base.note = f"the unit points at no record: {exc.args[0]}"
            return base
        got.queue_offset, got.unit = queue_offset, unit
        why = unit_mismatch(rec, size, tags, topic, queue_id, queue_offset)
        got.note = ("the unit does not match the record: " + "; ".join(why)) if why else ""
        return got


def queue_records(root: str, log: LogReader, topic: str, queue_id: int, start: int | None,
                  count: int) -> tuple[QueueInfo, list[DumpEntry]]:
    """count units of topic/queue_id from queue offset start (default: the queue's min offset)
    with their records; OffsetError for an unknown queue or an offset outside the queue."""
    qdir = queue_dir(root, topic, queue_id)
    if not os.path.isdir(qdir):
        known = [f"{t}/{q}" for t, q, _ in queue_dirs(root)]
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        raise OffsetError(f"unknown queue {topic}/{queue_id}: no consumequeue/{topic}/{queue_id} directory "
                          f"(queues: {shown or 'none'})")
    with QueueFiles(topic, queue_id, qdir) as qf:
        info = queue_info(qf, log.queue_min_offset(topic, queue_id))
        first = info.min_offset if start is None else start
        if not info.min_offset <= first < info.max_offset:
            held = (f"holds offsets {info.min_offset}..{info.max_offset - 1}" if info.messages > 0 else
                    f"is empty (next offset {info.max_offset})")
            raise OffsetError(f"queue offset {first} is out of range: {topic}/{queue_id} {held}")
        out = []
        for q in range(first, min(first + count, info.max_offset)):
            unit = qf.unit(q)
            assert unit is not None  # below max_offset every offset has a unit
            out.append(log.unit_entry(q, unit, topic, queue_id))
    return info, out


# -- recovery dry run (spec §3, §5.2-§5.5) -----------------------------------------------------
@dataclass
class QueuePlan:
    """What opening the store does to one ConsumeQueue (queue offsets: the next one)."""

    topic: str
    queue_id: int
    #: where the queue's valid units end now, and where they end after recovery
    max_offset: int
    kept_offset: int
    #: units the open reports as dropped (RecoveryReport.queue_units_dropped)
    units_dropped: int = 0
    #: non-zero bytes zeroed after the kept end (torn units, units past the log's end)
    bytes_zeroed: int = 0
    files_deleted: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.kept_offset != self.max_offset or self.units_dropped or self.bytes_zeroed
                    or self.files_deleted)


@dataclass
class RecoveryPlan:
    """What ``MessageStore(root)`` would do on opening, found without changing a file."""

    #: the RecoveryReport the open produces (elapsed_ms aside)
    report: RecoveryReport
    #: whether the scan checks body CRCs (check_crc_on_recover)
    check_crc: bool
    #: the checkpoint as the open reads it, and the min timestamp the abnormal start is
    #: chosen by (spec §5.5; 0 after a clean shutdown)
    checkpoint: dict[str, int]
    min_timestamp: int
    commitlog_files: list[str]
    #: physical offset where the CommitLog scan starts, and its first record's store time
    scan_start: int
    scan_start_timestamp: int
    #: non-zero bytes in the CommitLog files deleted after the valid end
    deleted_files_data_bytes: int
    queues: list[QueuePlan]
    #: the CommitLog has no file: every ConsumeQueue is destroyed
    queues_destroyed: int
    #: index files ending after checkpoint.indexMsgTimestamp, destroyed after an abnormal exit
    index_files_destroyed: list[str]
    #: allocation leftovers removed when the files are loaded (paths relative to the root)
    leftovers: list[str]
    #: bytes of the log dispatched again (queues and index rebuilt from dispatch_from)
    redispatch_bytes: int
    #: a store with several CommitLogs: each log's plan (this one is log 0's); empty otherwise
    logs: list[RecoveryPlan] = field(default_factory=list)
    #: the CommitLog this plan is of
    log: int = 0

    @property
    def drops_data(self) -> bool:
        """Whether the open cuts anything written: CommitLog bytes or ConsumeQueue units
        (empty pre-allocated files and re-dispatch do not count); of any log."""
        if self.logs:
            return any(plan._drops_data() for plan in self.logs)
        return self._drops_data()

    def _drops_data(self) -> bool:
        r = self.report
        return bool(r.dropped_bytes or self.deleted_files_data_bytes or r.queue_units_dropped
                    or any(q.bytes_zeroed or q.kept_offset < q.max_offset for q in self.queues))


def plan_recovery(root: str, *, check_crc: bool | None = None, progress: Progress | None = None) -> RecoveryPlan:
    """What opening root would do (check_crc None: as check_crc_on_recover says), found by
    running mqstore.queue.recovery.recover_store itself over read-only files (ReadOnlyFileQueue,
    which also mirrors what loading repairs first), a model of the index (DryRunIndex: what
    IndexService.load and truncate_dirty would do), a copy of the checkpoint and a scratch
    control block in a temporary directory, which is removed again. Nothing in root is
    written. The configuration is the store's own as far as it is known (store_config: its
    mqstore.config.json, else the defaults, with its file sizes)."""
    cfg = store_config(root)
    count = cfg.commit_log_count
    check = cfg.check_crc_on_recover if check_crc is None else check_crc
    clean = not os.path.exists(abort_path(root))
    index_safe = cfg.message_index_enable and cfg.message_index_safe
    dirs = queue_dirs(root)
    if count > 1:
        records = clean_close_record.read_logs(root, count)[0] if clean else {}
    else:
        record = clean_close_record.read(root)[0] if clean else None
        records = {0: record} if record is not None else {}
    with tempfile.TemporaryDirectory(prefix="mqstore-recover-") as sandbox, ExitStack() as stack:
        table, files, before = _dry_run_queues(sandbox, dirs, progress, cfg.mapped_file_size_consume_queue, count)
        stack.callback(table.close)
        ctl = _shm.ControlBlock.create(os.path.join(sandbox, CONTROL_BLOCK_NAME), table_slots=cfg.topic_queue_table_slots,
                                       file_size=cfg.mapped_file_size_commit_log, lock_kind=cfg.put_lock_kind,
                                       sync_flush=cfg.is_sync_flush, log_count=count)
        stack.callback(ctl.close)
        plans = []
        for k in range(count):  # each log as the open recovers it (docs/parallel-commitlogs.md)
            log = open_commitlog(root, file_size=cfg.mapped_file_size_commit_log, log=k if count > 1 else None)
            stack.callback(log.close)
            names = [mf.file_name for mf in log.files]
            checkpoint = _checkpoint_copy(root, sandbox, k)
            stack.callback(checkpoint.close)
            index = (DryRunIndex(root, cfg, checkpoint.index_msg_timestamp, clean, log=k)
                     if cfg.message_index_enable else None)
            scan_progress = None if progress is None else functools.partial(progress, "commitlog")
            with _silenced("mqstore"):
                report = recover_store(log, ctl, table, checkpoint, check_crc=check, clean_shutdown=clean,
                                       index_safe=index_safe, progress=scan_progress, index=index,
                                       clean_close=records.get(k), log_id=k)
            scan_mf = log.get(int(report.first_file_scanned)) if report.first_file_scanned else None
            report.redispatched_records = _count_records(log, report.dispatch_from, report.valid_end)
            min_ts = 0 if clean else checkpoint.min_timestamp_index if index_safe else checkpoint.min_timestamp
            queues = []
            for cq in table.of_log(k if count > 1 else None):  # empty when recovery destroyed them
                key = (cq.topic, cq.queue_id)
                queues.append(QueuePlan(cq.topic, cq.queue_id, before[key], cq.max_offset_in_queue,
                                        report.queue_units_dropped.get(f"{cq.topic}/{cq.queue_id}", 0),
                                        sum(files[key].zeroed.values()), list(files[key].deleted)))
            of_log = [d for d in dirs if queue_log(d[0], d[1], count) == k]
            plans.append(RecoveryPlan(
                report, check, checkpoint.to_dict(), min_ts, names,
                scan_mf.file_from if scan_mf is not None else log_base(k),
                _first_store_timestamp(scan_mf) if scan_mf is not None else -1,
                log.deleted_data, queues, len(of_log) if not names else 0,
                [name for name, _ in index.plan.destroy] if index is not None else [],
                _all_leftovers(root, dirs) if k == 0 else [], report.valid_end - report.dispatch_from, log=k))
        if count > 1:
            plans[0].logs = plans
        return plans[0]


def _dry_run_queues(sandbox: str, dirs: list[tuple[str, int, str]], progress: Progress | None, size: int,
                    log_count: int = 1,
                    ) -> tuple[ConsumeQueueTable, dict[tuple[str, int], ReadOnlyFileQueue], dict[tuple[str, int], int]]:
    """Every ConsumeQueue of the store over ReadOnlyFileQueues (of file size ``size``, what the
    open uses), in a table rooted in the sandbox (so a queue destroyed by recovery is removed
    there, not in the store), each as ConsumeQueue.load leaves it (plan_repair: what it cut and
    deleted, and the damage and dropped units it reports to recovery); the file queues by
    (topic, queue id), which record what recovery did to them; and each queue's next offset as
    its files hold it now (queue_info)."""
    table = ConsumeQueueTable(consumequeue_dir(sandbox), size, log_count)
    files = {}
    before = {}
    try:
        for i, (topic, qid, qdir) in enumerate(dirs):
            with QueueFiles(topic, qid, qdir) as qf:
                before[(topic, qid)] = queue_info(qf, 0).max_offset
            repair = plan_repair(qdir, size)
            queue = ReadOnlyFileQueue.of_directory(qdir, size, "ConsumeQueue", repair=repair)
            cq = table.find_or_create(topic, qid)
            cq.files = queue
            if repair.what:
                cq.load_damage = [repair.what]
                cq.load_dropped_units = repair.dropped_units
            files[(topic, qid)] = queue
            if progress is not None:
                progress("consumequeues", i + 1, len(dirs))
    except BaseException:
        table.close()
        raise
    return table, files, before


class DryRunIndex:
    """What IndexService does to the index files during an open, without doing it: load
    (plan_index_load: the files destroyed after a crash, the damaged ones deleted, where the
    index is rebuilt from) and recovery's truncate_dirty (the entries and files past the valid
    end), read from the headers and entries with pread. recover_store takes it for the
    IndexService, so the plan's report has the open's index fields."""

    def __init__(self, root: str, cfg: StoreConfig, index_msg_timestamp: int, last_exit_ok: bool,
                 log: int = 0) -> None:
        self.store_path = index_dir(root, log)
        self.hash_slot_num = int(cfg.max_hash_slot_num)
        self.index_num = int(cfg.max_index_num)
        self.file_size = cfg.index_file_size
        self.plan = IndexLoadPlan()
        if os.path.isdir(self.store_path):
            self.plan = plan_index_load(self.store_path, self.file_size, self.hash_slot_num, self.index_num,
                                        last_exit_ok=last_exit_ok, index_msg_timestamp=index_msg_timestamp,
                                        geometry_vouched=_geometry_vouched(root, self.hash_slot_num, self.index_num))
        self.damage = list(self.plan.damage)
        self.damaged_files = list(self.plan.damaged)
        self.rebuild_from = self.plan.rebuild_from
        #: (name, begin phy, end phy, indexCount) of the files the open keeps, oldest first
        self.files: list[tuple[str, int, int, int]] = []
        for name in self.plan.keep:
            with open(os.path.join(self.store_path, name), "rb") as fh:
                head = os.pread(fh.fileno(), INDEX_HEADER.size, 0)
            _, _, begin_phy, end_phy, _, count = INDEX_HEADER.unpack(head)
            self.files.append((name, begin_phy, end_phy, max(1, count)))

    def truncate_dirty(self, phy_offset: int, timestamp_of: Callable[[int], int]) -> tuple[int, list[str]]:
        """IndexService.truncate_dirty's (entries dropped, files deleted), nothing written."""
        dropped, deleted = 0, []
        entries_at = INDEX_HEADER.size + 4 * self.hash_slot_num
        while self.files:
            name, begin_phy, end_phy, count = self.files[-1]
            if end_phy < phy_offset:
                break
            if count <= 1 or begin_phy >= phy_offset:
                self.files.pop()
                dropped += max(0, count - 1)
                deleted.append(name)
                continue
            keep = count
            with open(os.path.join(self.store_path, name), "rb") as fh:
                while keep > 2:
                    raw = os.pread(fh.fileno(), 8, entries_at + 20 * (keep - 1) + 4)
                    if int.from_bytes(raw, "big", signed=True) < phy_offset:
                        break
                    keep -= 1
            dropped += count - keep
            break
        return dropped, deleted


@contextmanager
def _silenced(name: str) -> Iterator[None]:
    """Mute a logger tree: recovery logs what it did ("truncated", "dropped"), which a dry run
    did not do; the plan says it instead."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _checkpoint_copy(root: str, sandbox: str, log: int = 0) -> StoreCheckpoint:
    """The store's checkpoint (CommitLog log's) opened from a copy (StoreCheckpoint creates,
    extends or resets its file); absent stays absent."""
    copy = checkpoint_path(sandbox, log)
    source = checkpoint_path(root, log)
    if os.path.isfile(source):
        shutil.copyfile(source, copy)
    return StoreCheckpoint(copy)


def _first_store_timestamp(mf: MappedFile) -> int:
    """STORETIMESTAMP of the file's first record (what choose_abnormal_start compares), -1 if
    it does not start with one."""
    size, ok = check_record(mf, 0, check_crc=False, read_body=False)
    if not ok or size <= 0:
        return -1
    return int(scan_records(mf, mf.file_from, 0, size, False)[3])


def _count_records(queue: MappedFileQueue, start: int, end: int) -> int:
    """Records the start-up dispatch goes through from start to end (Dispatcher._dispatch's walk)."""
    fs, count, pos = queue.file_size, 0, start
    while pos < end:
        base = file_start_of(pos, fs)
        mf = queue.get(base)
        if mf is None:
            break
        stop, reason, n, _ = scan_records(mf, base, pos - base, min(end, base + fs) - base, False)
        count += n
        pos = base + stop if reason == "end" else base + fs
    return count


def _all_leftovers(root: str, dirs: list[tuple[str, int, str]]) -> list[str]:
    cdir = store_config(root).commit_log_dir(root)
    out = [os.path.relpath(os.path.join(cdir, n), root) for n in alloc_leftovers(cdir)]
    for _, _, qdir in dirs:
        out += [os.path.relpath(os.path.join(qdir, n), root) for n in alloc_leftovers(qdir)]
    idir = index_dir(root)
    if os.path.isdir(idir):
        out += [os.path.join(INDEX_DIR, n) for n in sorted(os.listdir(idir)) if _INDEX_STAGING.fullmatch(n)]
    return out
