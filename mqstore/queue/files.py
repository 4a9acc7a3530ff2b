"""Read-only access to a store's files without opening the store: its CommitLog and
ConsumeQueue files mapped read-only (``MappedFile.open(readonly=True)``), where their records
and units end, the queues on disk. The layer under the tools (mqstore.tools.inspection, the checker's
commands) and the readers that follow a store without owning it (mqstore.queue.snapshot, the Spark
jobs): nothing here takes the store's lock or opens a file for writing, so it works on a store
another process has open and on a read-only mount. What loading would repair first (a cut last
CommitLog file, a short ConsumeQueue file) is mapped from a repaired copy in a temporary
directory (``ReadOnlyFileQueue``).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mqstore.log._shm import log_of_queue
from mqstore.layout import CONFIG_NAME, FENCE_NAME, FILLER_SIZE, consumequeue_dir, file_start_of, log_base
from mqstore.log._scan import scan_records
from mqstore.queue._consumequeue import CQ_STORE_UNIT_SIZE, scan_units
from mqstore.log._mapped import MappedFile
from mqstore.config import StoreConfig
from mqstore.queue.consume_queue import RepairPlan
from mqstore.errors import MQStoreError, NotAStoreError
from mqstore.log.mapped_file_queue import MAX_FILE_START, MappedFileQueue
from mqstore.geometry import adopt_store_sizes
from mqstore.queue.recovery import commitlog_file_was_cut
from mqstore.log.scan import CLEAN_PAGES, nonzero_extent

UNIT = CQ_STORE_UNIT_SIZE
_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode

Progress = Callable[[str, int, int], None]  # (what, done, total)
Buffer = mmap.mmap | memoryview | bytes


# -- bytes ---------------------------------------------------------------------------------
def _map_read(path: str) -> Buffer:
    """path mapped read-only (b"" for an empty file, which cannot be mapped). A 20-digit file
    goes through MappedFile.open(readonly=True), which holds no descriptor once mapped (Python's
    mmap keeps a dup of one per file, and a reader of a queue with tens of thousands of small
    files ran out); the memoryview keeps the mapping alive until it is released."""
    size = os.path.getsize(path)
    if size == 0:
        return b""
    name = os.path.basename(path)
    if len(name) == 20 and name.isdigit() and int(name) <= MAX_FILE_START:
        return memoryview(MappedFile.open(path, size, readonly=True))
    with open(path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def _offset_names(directory: str, *, fenced: bool = False) -> list[str]:
    """The 20-digit file names (start offsets, spec §2) of directory, sorted (fenced: log 0's
    directory of a store with several CommitLogs, whose fence is not a file of the log)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if len(n) == 20 and n.isdigit() and not (fenced and n == FENCE_NAME))


def alloc_leftovers(directory: str) -> list[str]:
    """``<offset>.alloc<pid>`` files that MappedFileQueue.load removes (an allocation that died)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if ".alloc" in n and n.split(".alloc")[0].isdigit())


# -- files mapped like the store maps them, read-only ---------------------------------------------
def _copy_extended(src: str, dst: str, keep: int, file_size: int) -> None:
    """dst = the first keep bytes of src, extended with zeros (sparse) to file_size: what
    MappedFileQueue.load / ConsumeQueue.load make of a short file, made in a scratch
    directory so that the dry run maps it at the file size without changing src."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        left = keep
        while left > 0:
            block = fin.read(min(left, 1 << 20))
            if not block:
                break
            fout.write(block)
            left -= len(block)
        fout.truncate(file_size)


class ReadOnlyFileQueue(MappedFileQueue):
    """A MappedFileQueue over a store's real files that never changes them. The files are
    opened and mapped read-only (``MappedFile.open(readonly=True)``: O_RDONLY, PROT_READ, so
    this works on a read-only mount and a stray write faults instead of changing the store);
    truncation and deletion (what recovery does to them) only change this object's list and
    positions and record what the real ones would zero and delete, so the real recovery can
    run over them as a dry run. (Recovery reads files only up to their positions, so it sees
    the same data as after a real truncation.)

    What loading repairs before recovery (a cut last CommitLog file or short empty files after
    it extended, MappedFileQueue.plan_load; a short ConsumeQueue file cut at its last whole
    unit and the files after it or after a gap deleted, consume_queue.plan_repair) is done to
    copies in a scratch directory removed at close(): the repaired files are mapped from
    there, the deleted ones are listed in ``deleted`` from the start."""

    def __init__(self, store_path: str, file_size: int, base: int = 0, *, fenced: bool = False) -> None:
        super().__init__(store_path, file_size, base, fenced=fenced)
        #: file name -> non-zero bytes that truncation would zero in it
        self.zeroed: dict[str, int] = {}
        #: names of the files that would be deleted, and the non-zero bytes they hold
        self.deleted: list[str] = []
        self.deleted_data = 0
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def _scratch_path(self, name: str) -> str:
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="mqstore-readonly-")
        return os.path.join(self._scratch.name, name)

    def close(self) -> None:
        super().close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    @classmethod
    def of_directory(cls, directory: str, file_size: int, what: str, *, contiguous: bool = True,
                     last_file_was_cut: Callable[[str], bool] | None = None,
                     repair: RepairPlan | None = None, base: int = 0, fenced: bool = False) -> ReadOnlyFileQueue:
        """The 20-digit files of directory as loading maps them (positions at the file size,
        nothing in directory removed, created or changed); NotAStoreError where the open would
        not map them: a file of another size, and (contiguous) a gap or a misaligned first file.

        last_file_was_cut (the CommitLog's MappedFileQueue.load predicate): the short files
        plan_load accepts are mapped as load extends them, and listed in ``extended`` and
        ``extended_empty`` as load lists them. repair (a ConsumeQueue's plan_repair): its
        short file is mapped as cut and extended, its deleted files are left out."""
        deleted: list[str] = []
        copies: dict[str, int] = {}  # name -> bytes of the real file kept in its scratch copy
        extended: list[tuple[str, int]] = []
        extended_empty: list[tuple[str, int]] = []
        if last_file_was_cut is not None and os.path.isdir(directory):
            plan = MappedFileQueue.plan_load(directory, file_size, last_file_was_cut, fenced=fenced)
            names = plan.names
            extended, extended_empty = plan.extend, plan.extend_empty
            copies = {name: size for name, size in plan.extend + plan.extend_empty}
        else:
            names = _offset_names(directory, fenced=fenced)
            if repair is not None:
                deleted = list(repair.delete)
                names = [n for n in names if n not in deleted]
                if repair.cut is not None:
                    copies[repair.cut[0]] = repair.cut[2]
            for name in names:
                size = os.path.getsize(os.path.join(directory, name))
                if size != file_size and name not in copies:
                    raise NotAStoreError(f"{os.path.join(directory, name)} is {size:,} bytes, not {file_size:,} like "
                                         f"the other {what} files (opening the store refuses such a file, or cuts "
                                         f"the queue there)")
        if contiguous:
            cls._check_contiguous_names(directory, names, file_size)
        queue = cls(directory, file_size, base, fenced=fenced)
        queue.extended, queue.extended_empty = list(extended), list(extended_empty)
        try:
            for name in deleted:
                queue.deleted.append(name)
                queue.deleted_data += nonzero_extent(os.path.join(directory, name))
            for name in names:
                path = os.path.join(directory, name)
                if name in copies:
                    keep = copies[name]
                    dropped = nonzero_extent(path, keep)
                    if dropped:
                        queue.zeroed[name] = dropped
                    path = queue._scratch_path(name)
                    _copy_extended(os.path.join(directory, name), path, keep, file_size)
                mf = MappedFile.open(path, file_size, readonly=True)
                queue.add(mf)
                mf.wrote_position = mf.committed_position = mf.flushed_position = file_size
        except BaseException:
            queue.close()
            raise
        return queue

    @staticmethod
    def _check_contiguous_names(directory: str, names: list[str], file_size: int) -> None:
        starts = [int(n) for n in names]
        for a, b in zip(starts, starts[1:]):
            if b - a != file_size:
                raise NotAStoreError(f"{directory}: files {a:020d} and {b:020d} are not contiguous: opening the store "
                                     f"would fail", hint="a file is missing from the middle; restore it from a backup")
        if starts and file_start_of(starts[0], file_size) != starts[0]:
            raise NotAStoreError(f"{directory}: first file {names[0]} is not aligned to the file size {file_size}: "
                                 f"opening the store would fail")

    def truncate_dirty_files(self, offset: int) -> tuple[list[str], int]:
        """MappedFileQueue.truncate_dirty_files without writing: (names it would delete,
        bytes it would zero in the file holding offset)."""
        removed, dropped = [], 0
        for mf in self.files:
            if mf.file_from + self.file_size <= offset:
                continue
            if mf.file_from <= offset:
                pos = offset - mf.file_from
                mf.wrote_position = mf.committed_position = mf.flushed_position = pos
                dropped = nonzero_extent(mf, pos, self.file_size, CLEAN_PAGES)
                if dropped:
                    self.zeroed[mf.file_name] = dropped
            else:
                removed.append(mf.file_name)
                self._forget(mf)
        return removed, dropped

    def delete_last_file(self) -> str | None:
        last = self.last()
        if last is None:
            return None
        self._forget(last)
        return last.file_name

    def _forget(self, mf: MappedFile) -> None:
        self.deleted.append(mf.file_name)
        self.deleted_data += nonzero_extent(mf, 0, self.file_size, CLEAN_PAGES)
        with self._lock:
            del self._files[mf.file_from]
            self.version += 1
        mf.close()


def store_config(root: str) -> StoreConfig:
    """The configuration an open of root most likely runs with: what its last owner wrote to
    mqstore.config.json (as mqstore.node.read_config reads it), else the defaults, with the file sizes the store
    was created with (geometry.adopt_store_sizes, as MessageStore adopts them)."""
    try:
        with open(os.path.join(root, CONFIG_NAME), encoding="utf-8") as fh:
            cfg = StoreConfig.from_dict(json.load(fh)).validate()
    except (OSError, ValueError, TypeError, AttributeError, MQStoreError):
        cfg = StoreConfig()
    try:
        return adopt_store_sizes(root, cfg)
    except MQStoreError:
        return cfg


def open_commitlog(root: str, *, contiguous: bool = True, file_size: int | None = None,
                   log: int | None = None) -> ReadOnlyFileQueue:
    """The CommitLog files of root, read-only, as MappedFileQueue.load maps them (a cut last
    file and short empty files after it extended, in scratch copies; it would also create the
    directory and remove leftovers); contiguous=False also maps a log with a missing file (to
    look at, not to recover). file_size: the CommitLog file size (default: the store's own,
    store_config). log: CommitLog ``log`` of a store with several (docs/parallel-commitlogs.md);
    None for a reader of one CommitLog, which refuses such a store by its fence. Close it with
    ``.close()``."""
    cfg = store_config(root)
    several = log is not None and cfg.commit_log_count > 1
    # store_path_commit_log (store_path_commit_logs) as the store's owner had it
    cdir = cfg.commit_log_dirs(root)[log] if several and log is not None else cfg.commit_log_dir(root)
    base = log_base(log) if several and log is not None else 0
    fenced = several and log == 0
    names = _offset_names(cdir, fenced=fenced)
    if not names:
        return ReadOnlyFileQueue(cdir, 0, base, fenced=fenced)
    if file_size is None:
        file_size = cfg.mapped_file_size_commit_log
    return ReadOnlyFileQueue.of_directory(cdir, file_size, "CommitLog", contiguous=contiguous,
                                          last_file_was_cut=commitlog_file_was_cut, base=base, fenced=fenced)


def queue_log(topic: str, queue_id: int, log_count: int) -> int:
    """The CommitLog topic/queue_id is bound to (0 with one CommitLog). A name no queue can have
    (a queue id past int32, a topic that is not UTF-8: a damaged or foreign directory a reader
    met) is taken as log 0's, where a read finds nothing of it, instead of failing the reader."""
    if log_count <= 1:
        return 0
    try:
        return log_of_queue(topic, queue_id, log_count)
    except (OverflowError, UnicodeEncodeError, TypeError):
        return 0


def commit_log_count(root: str) -> int:
    """How many CommitLogs the store at root has (store_config: its saved count, or its fence)."""
    return store_config(root).commit_log_count


# -- CommitLog -----------------------------------------------------------------------------
@contextmanager
def commitlog(root: str, log: int | None = None) -> Iterator[ReadOnlyFileQueue]:
    """The CommitLog files to look at (a missing file in the middle is no obstacle); log: see
    open_commitlog."""
    queue = open_commitlog(root, contiguous=False, log=log)
    try:
        yield queue
    finally:
        queue.close()


@dataclass
class LogFile:
    """One CommitLog file: where its records end (records parsed, CRCs not checked)."""

    name: str
    file_from: int
    size: int
    #: where its valid records end; the file size when it ends with the END_OF_FILE blank
    wrote: int
    records: int
    #: scan_records' stop reason: "blank" (END_OF_FILE: full), "end", "invalid" (zeros or a bad record)
    stop_reason: str
    #: non-zero bytes after ``wrote`` that do not parse as a record (a torn or corrupt tail)
    dirty_bytes: int
    #: the control block's flushed position inside this file; None without a control block
    flushed: int | None


def log_files(queue: MappedFileQueue, flushed: int | None, progress: Progress | None = None) -> list[LogFile]:
    out = []
    files = queue.files
    for i, mf in enumerate(files):
        stop, reason, count, _ = scan_records(mf, mf.file_from, 0, queue.file_size, False)
        dirty = nonzero_extent(mf, stop, queue.file_size, CLEAN_PAGES) if reason == "invalid" else 0
        in_file = None if flushed is None else min(max(flushed - mf.file_from, 0), queue.file_size)
        out.append(LogFile(mf.file_name, mf.file_from, queue.file_size,
                           queue.file_size if reason == "blank" else stop, count, reason, dirty, in_file))
        if progress is not None:
            progress("commitlog", i + 1, len(files))
    return out


def log_end(files: list[LogFile]) -> int:
    """Where the log ends: in the first file that does not end with the END_OF_FILE blank."""
    for f in files:
        if f.stop_reason == "invalid":
            return f.file_from + f.wrote
    return files[-1].file_from + files[-1].size if files else 0


# -- ConsumeQueues (spec §3) -----------------------------------------------------------------
def queue_dirs(root: str) -> list[tuple[str, int, str]]:
    """(topic, queue id, directory) of every ``consumequeue/<topic>/<int queueId>`` directory,
    the ones ConsumeQueueTable.load maps (spec §5.2: other names are ignored)."""
    cq_root = consumequeue_dir(root)
    if not os.path.isdir(cq_root):
        return []
    out = []
    for topic in sorted(os.listdir(cq_root)):
        topic_dir = os.path.join(cq_root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for qid in sorted(os.listdir(topic_dir), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)):
            if qid.isdigit() and os.path.isdir(os.path.join(topic_dir, qid)):
                out.append((topic, int(qid), os.path.join(topic_dir, qid)))
    return out


class QueueFiles:
    """The files of one ConsumeQueue mapped read-only: [(file_from, name, buffer)] by start."""

    def __init__(self, topic: str, queue_id: int, directory: str) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.files: list[tuple[int, str, Buffer]] = []
        try:
            for name in _offset_names(directory):
                self.files.append((int(name), name, _map_read(os.path.join(directory, name))))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for _, _, buf in self.files:
            if isinstance(buf, memoryview):
                buf.release()
            elif isinstance(buf, mmap.mmap):
                buf.close()
        self.files = []

    def __enter__(self) -> QueueFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def unit(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(phyOffset, size, tagsCode) of the unit at queue_offset, None if no file holds it."""
        at = queue_offset * UNIT
        for start, _, buf in self.files:
            if start <= at and at + UNIT <= start + len(buf):
                phy, size, tags = _UNIT.unpack_from(buf, at - start)
                return phy, size, tags
        return None


def is_filler(phy: int, size: int) -> bool:
    return phy == 0 and size == FILLER_SIZE


@dataclass
class QueueFile:
    name: str
    #: logical byte offset of its first unit (its name); queue offset = file_from // 20
    file_from: int
    size: int
    #: where its valid units end (the first with phyOffset < 0 or size <= 0)
    wrote: int
    #: non-zero bytes after that (torn units; the next open zeroes them)
    dirty_bytes: int


@dataclass
class QueueInfo:
    """One ConsumeQueue as its files hold it now (queue offsets; max_offset is the next one)."""

    topic: str
    queue_id: int
    files: list[QueueFile]
    #: the first unit whose record is still in the log (below: removed by retention, or pre-fill)
    min_offset: int
    max_offset: int
    #: physical offsets of the records of the units at min_offset and max_offset - 1 (-1: none)
    min_phy_offset: int
    max_phy_offset: int

    @property
    def messages(self) -> int:
        """RocketMQ's messageTotal: max - min (skipped offsets, rare, count too)."""
        return self.max_offset - self.min_offset


def queue_info(queue: QueueFiles, log_min: int) -> QueueInfo:
    """Offsets of one queue: its units are read up to the first invalid one (spec §3 recovery)."""
    files = []
    max_offset = queue.files[0][0] // UNIT if queue.files else 0
    ended = False
    expect = queue.files[0][0] if queue.files else 0
    for start, name, buf in queue.files:
        size = len(buf)
        wrote = scan_units(buf, 0, size)[0] if size else 0
        files.append(QueueFile(name, start, size, wrote, nonzero_extent(buf, wrote, size, CLEAN_PAGES)))
        ended = ended or start != expect  # a missing file ends the queue too
        if not ended:
            max_offset = (start + wrote) // UNIT
            ended = wrote < size or size == 0  # an empty (truncated) file holds no unit
        expect = start + size
    min_offset, min_phy = _first_unit_in_log(queue, files, log_min, max_offset)
    return QueueInfo(queue.topic, queue.queue_id, files, min_offset, max_offset, min_phy,
                     _last_unit_phy(queue, min_offset, max_offset))


def _first_unit_in_log(queue: QueueFiles, files: list[QueueFile], log_min: int, max_offset: int) -> tuple[int, int]:
    """(queue offset, phy) of the first real unit whose record is at or above log_min."""
    for (start, _, buf), info in zip(queue.files, files):
        with memoryview(buf) as view:
            for i, (phy, size, _) in enumerate(_UNIT.iter_unpack(view[:info.wrote])):
                q = start // UNIT + i
                if q >= max_offset:
                    return max_offset, -1
                if not is_filler(phy, size) and phy >= log_min:
                    return q, phy
    return max_offset, -1


def _last_unit_phy(queue: QueueFiles, min_offset: int, max_offset: int) -> int:
    for q in range(max_offset - 1, min_offset - 1, -1):
        unit = queue.unit(q)
        if unit is not None and not is_filler(unit[0], unit[1]):
            return unit[0]
    return -1


def queue_file_size(dirs: list[tuple[str, int, str]]) -> int:
    """The ConsumeQueue file size in use: the most common one (a store has one configured)."""
    sizes = Counter(os.path.getsize(os.path.join(d, n)) for _, _, d in dirs for n in _offset_names(d))
    return max(sizes, key=lambda s: (sizes[s], s)) if sizes else 0


# -- index files (spec §4.1) -------------------------------------------------------------------
