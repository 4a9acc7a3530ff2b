"""IndexService (spec §4.4): find messages by key in ``ROOT/index/<yyyyMMddHHmmssSSS>`` files.

Every dispatched message with a UNIQ_KEY or KEYS gets one entry per key (``topic#key``) in the
newest index file; the files themselves are the compiled kernel ``mqstore.queue._index.IndexFile``
(spec §4.1-§4.3). When the newest file is full a new one is started, and the full one is
flushed in the background, after which its end timestamp is stored as
checkpoint.indexMsgTimestamp (spec §5.1). A query walks the files newest to oldest.

Decisions beyond RocketMQ 4.9.7:

* File names strictly increase. A new file is named after the local time of its creation
  (``yyyyMMddHHmmssSSS``); if that name is not greater than the newest file's (two files in
  the same millisecond, or a clock that went back), it takes the millisecond after the newest
  file's name instead. RocketMQ would reuse the name (and map the old file again) or sort the
  new file before older ones at the next start.
* Full files are flushed one after the other (each background flush waits for the previous
  one), so checkpoint.indexMsgTimestamp never covers a file whose flush has not finished.
* A full disk: an index file (420 MB by default) is allocated in bounded steps, not at once:
  the header and hash slots (20 MB by default) plus ALLOCATE_STEP bytes of entries when it is
  created, then ALLOCATE_STEP more each time the entries reach the end of what is allocated
  (the rest of the file is sparse, and nothing is written past what posix_fallocate gave, so
  a full disk is an error here, never a SIGBUS). RocketMQ creates the whole file and retries
  three times one second apart inside the dispatcher for every keyed message; here a failed
  creation or step is retried at most once every CREATE_RETRY_INTERVAL_S and never sleeps:
  until it succeeds ``build_index``/``put_key_hashes`` return False at once (the keys of
  messages dispatched meanwhile are not indexed, as in RocketMQ, and counted as index_errors),
  the dispatcher sets WRITE_INDEX_FILE_ERROR (puts are refused, so few messages are affected),
  and ``writable`` (asked by the dispatcher while the flag is set) clears it once a file can
  take keys again.
* Loading refuses (NotAStoreError) a file of the wrong size instead of mapping it anyway.
* MappedFile accepts only 20-digit names (start offsets), so an index file is created and
  opened through a transient 20-digit hard link, see ``_IndexMapping``.

Keys are written one way: ``put_key_hashes`` with (phy_offset, store_timestamp, key_hash)
triples, a parsed batch's keys (the concurrent dispatch) or ``index_key_triples`` of each
message (the serial dispatch, ``build_index``), so both dispatch modes build the same files.

Threads: one writer (the dispatcher) puts keys; queries, cleaning and flushes come from other
threads. Changes to the file list happen under a lock and readers work on a snapshot of the
list; a file being deleted under a query is protected by its mapped file's reference count
(the kernel holds it while reading).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mqstore.queue._index import IndexFile, index_key_hash
from mqstore.log._mapped import MappedFile
from mqstore.log.checkpoint import StoreCheckpoint
from mqstore.layout import index_dir
from mqstore.config import StoreConfig
from mqstore.errors import NotAStoreError, StoreClosedError
from mqstore.log.scan import is_zero
from mqstore.procs import dead_allocation

__all__ = ["IndexService", "QueryOffsetResult", "index_file_name", "index_key_triples"]

log = logging.getLogger("mqstore.index")

CREATE_RETRY_INTERVAL_S = 1.0     # a failed creation or allocation step is retried after this (RocketMQ: 3 tries 1 s apart)
ALLOCATE_STEP = 4 << 20           # entries of an index file are allocated this many bytes at a time
DESTROY_INTERVAL_MS = 3000        # a file still held by a reader is deleted forcibly after this
TRANSACTION_TYPE_MASK = 0xC       # spec §1.3 sys flag bits 2-3
TRANSACTION_ROLLBACK_TYPE = 0xC

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
_HEADER = struct.Struct(">qqqqii")   # begin ts, end ts, begin phy, end phy, hashSlotCount, indexCount
_ENTRY = struct.Struct(">iqii")      # keyHash, commitLogOffset, timeDiff (s), previous entry
_I32 = struct.Struct(">i")
_KEY_TRIPLE = struct.Struct("=qqq")  # put_key_hashes' input: phy_offset, store_timestamp, key_hash

_INDEX_NAME = re.compile(r"\d{17}")
_STAGING_NAME = re.compile(r"000\d{17}(\.alloc\d+)?")   # links an earlier _IndexMapping left


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def index_file_name(ms: int) -> str:
    """yyyyMMddHHmmssSSS of ms since the epoch in local time (RocketMQ timeMillisToHumanString)."""
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms // 1000)) + f"{ms % 1000:03d}"


def _name_after(name: str) -> str:
    """The index file name one millisecond after ``name`` (name + 1 if it is not a valid time)."""
    try:
        t = datetime.strptime(name, "%Y%m%d%H%M%S%f") + timedelta(milliseconds=1)
    except ValueError:
        return f"{int(name) + 1:017d}"
    return f"{t:%Y%m%d%H%M%S}{t.microsecond // 1000:03d}"


def index_key_triples(topic: str, keys: str | None, uniq_key: str | None, phy_offset: int, store_timestamp: int,
                      sys_flag: int) -> bytes:
    """The keys spec §4.4 buildIndex indexes for one message, as ``IndexService.put_key_hashes``
    takes them: ``topic#uniq_key``, then ``topic#k`` for each non-empty k of keys split on " ",
    each as a (phy_offset, store_timestamp, index_key_hash) triple of native int64s, the
    layout and the hash of ``mqstore.queue._reput.ParsedBatch.index_keys``. Empty for a ROLLBACK
    message and for one without a non-empty key."""
    if sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return b""
    words = [uniq_key] if uniq_key else []
    if keys:
        words += [k for k in keys.split(" ") if k]
    return b"".join(_KEY_TRIPLE.pack(phy_offset, store_timestamp, index_key_hash(f"{topic}#{w}")) for w in words)


@dataclass
class QueryOffsetResult:
    """spec §4.4 queryOffset: the matching commit log offsets (newest first, hash matches only)
    and the end of the newest index file (how far the index has got)."""

    phy_offsets: list[int] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phy_offset: int = 0


class _IndexMapping:
    """A MappedFile under an index file's own name (what IndexFile needs of a mapped file).

    Index files are named ``yyyyMMddHHmmssSSS`` (spec §2), not by a start offset: they are
    created and opened with ``file_from=0``. Each process maps them under their own name (an
    earlier version went through a shared hard link ``000<name>``, which two processes opening
    one file at once collided on; ``load`` removes such links). This wrapper keeps the real
    path: ``file_name`` is the index name and ``destroy`` deletes the real file.
    """

    __slots__ = ("mapped", "path")

    def __init__(self, mapped: MappedFile, path: str) -> None:
        self.mapped = mapped
        self.path = path

    @classmethod
    def create(cls, path: str, file_size: int, allocate: int = -1) -> _IndexMapping:
        """Create and map a new index file, allocating its first ``allocate`` bytes (-1: all);
        FileExistsError if path exists, OSError (ENOSPC) if the disk has no room for them."""
        return cls(MappedFile.create(path, file_size, allocate, file_from=0), path)

    @classmethod
    def open(cls, path: str, file_size: int) -> _IndexMapping:
        """Map an existing index file of exactly file_size bytes."""
        return cls(MappedFile.open(path, file_size, keep_fd=True, file_from=0), path)  # allocate_to needs it

    @property
    def file_size(self) -> int:
        return self.mapped.file_size

    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    def hold(self) -> bool:
        return self.mapped.hold()

    def release(self) -> None:
        self.mapped.release()

    def flush_range(self, start: int, end: int) -> None:
        self.mapped.flush_range(start, end)

    def destroy(self, interval_forcibly_ms: int = 0) -> bool:
        if not self.mapped.destroy(interval_forcibly_ms):
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        return True

    def close(self) -> None:
        self.mapped.close()


def _mapping(f: IndexFile) -> _IndexMapping:
    """The wrapper every IndexFile of the service is built on (to close it)."""
    mapping = f.mapped_file
    assert isinstance(mapping, _IndexMapping)
    return mapping


@dataclass
class IndexLoadPlan:
    """What IndexService.load does to the index directory (plan_index_load)."""

    #: leftovers of an interrupted creation (a dead pid's ``.alloc``) or older links, removed
    staging: list[str] = field(default_factory=list)
    #: the files mapped, oldest first
    keep: list[str] = field(default_factory=list)
    #: (name, end timestamp) of the files destroyed after an abnormal exit (spec §4.4)
    destroy: list[tuple[str, int]] = field(default_factory=list)
    #: the damaged file and every newer one, deleted
    damaged: list[str] = field(default_factory=list)
    #: what was wrong ("<file>: <why>"), also a newest file without entries
    damage: list[str] = field(default_factory=list)
    #: CommitLog offset recovery re-dispatches from to rebuild the index (-1: none)
    rebuild_from: int = -1


def plan_index_load(store_path: str, file_size: int, hash_slot_num: int, index_num: int, *, last_exit_ok: bool,
                    index_msg_timestamp: int, geometry_vouched: bool) -> IndexLoadPlan:
    """What IndexService.load does, decided from the file sizes and headers without changing
    anything (the recovery dry run, mqstore.tools.inspection, reports the same).

    A file is damaged (it and every newer file are deleted, the index is rebuilt from the end
    of the last file kept) when:

    * its header cannot be right (indexCount outside [1, max_index_num] in a file that is not
      the newest, counts or offsets out of range, a zeroed header over used hash slots);
    * its size is not the configured one while another file has that size, or while the
      store's own mqstore.config.json names this max_hash_slot_num / max_index_num
      (``geometry_vouched``: the index was written with this geometry, so a file of another
      size was cut or grown, e.g. a truncated file);
    * after an abnormal exit, for a file that is kept: its hash slot table does not fit its
      header (a slot pointing outside the file's entries, or fewer or more slots in use than
      hashSlotCount says). Zeroed or flipped slots make keys unfindable; the check reads the
      slot table (4 * max_hash_slot_num bytes, 20 MB at the default geometry) of every file
      kept, only after a crash. ``mqstore verify --deep`` checks every slot's chain.

    Refused (NotAStoreError) as a geometry change: every file of one other size, unless
    geometry_vouched and there is only one file (several files cut to one size alike are
    rather another max_hash_slot_num / max_index_num, even if a config file says otherwise)."""
    plan = IndexLoadPlan()
    names = sorted(os.listdir(store_path))
    plan.staging = [n for n in names if _STAGING_NAME.fullmatch(n) or (_INDEX_NAME.fullmatch(n.split(".alloc")[0])
                                                                         and dead_allocation(n))]
    candidates = [n for n in names if _INDEX_NAME.fullmatch(n) and os.path.isfile(os.path.join(store_path, n))]
    sizes = {n: os.path.getsize(os.path.join(store_path, n)) for n in candidates}
    wrong = {size for size in sizes.values() if size != file_size}
    if candidates and len(wrong) == 1 and all(size != file_size for size in sizes.values()) and (
            len(candidates) > 1 or not geometry_vouched):
        name = candidates[0]
        path = os.path.join(store_path, name)
        raise NotAStoreError(
            f"index file {path} is {sizes[name]} bytes, but max_hash_slot_num={hash_slot_num} and "
            f"max_index_num={index_num} make index files of {file_size} bytes",
            hint="open the store with the max_hash_slot_num and max_index_num it was written "
                 "with, or move the index/ directory away (it is then rebuilt from the CommitLog "
                 "only for messages dispatched again)")
    kept: list[tuple[int, int]] = []  # (indexCount, endPhyOffset) of the files kept
    for i, name in enumerate(candidates):
        path = os.path.join(store_path, name)
        problem, header = _index_header_problem(path, sizes[name], file_size, hash_slot_num, index_num,
                                                newest=i == len(candidates) - 1)
        if not problem and not last_exit_ok and header[1] > index_msg_timestamp:
            plan.destroy.append((name, header[1]))
            continue
        if not problem and not last_exit_ok:
            problem = _slot_table_problem(path, hash_slot_num, header[5], header[4])
        if problem:
            plan.rebuild_from = kept[-1][1] if kept else 0
            plan.damage.append(f"{name}: {problem}")
            plan.damaged = candidates[i:]
            return plan
        plan.keep.append(name)
        kept.append((header[5], header[3]))
    if kept and kept[-1][0] <= 1:
        plan.rebuild_from = kept[-2][1] if len(kept) > 1 else 0
        plan.damage.append(f"{plan.keep[-1]} holds no entries: rebuilding from {plan.rebuild_from}")
    return plan


def _geometry_vouched(root: str, hash_slot_num: int, index_num: int) -> bool:
    """Whether root's mqstore.config.json (what its last owner ran with) names this index
    geometry: then its index files were written with it."""
    from mqstore.geometry import saved_sizes

    saved = saved_sizes(root)
    return saved is not None and (saved["max_hash_slot_num"], saved["max_index_num"]) == (hash_slot_num, index_num)


def _index_header_problem(path: str, size: int, file_size: int, hash_slot_num: int, index_num: int, *,
                          newest: bool) -> tuple[str, tuple[int, int, int, int, int, int]]:
    """(why the index file at path cannot be loaded as it is or "", its header fields)."""
    if size != file_size:
        return f"it is {size} bytes, not {file_size}", (0, 0, 0, 0, 0, 0)
    with open(path, "rb") as fh:
        header = _HEADER.unpack(fh.read(HEADER_SIZE))
    begin_ts, end_ts, begin_phy, end_phy, slot_count, count = header
    if count == 0 and newest:
        # created and never written (a RocketMQ file gets its header at its first key),
        # unless the header alone was zeroed: then its slots still point at entries
        if not is_zero(path, HEADER_SIZE, HEADER_SIZE + SLOT_SIZE * hash_slot_num):
            return "its header is zeroed but its hash slots point at entries", header
        return "", header
    if not 1 <= count <= index_num:
        return f"its indexCount is {count}", header
    if not 0 <= slot_count <= min(hash_slot_num, count - 1):
        return f"its hashSlotCount is {slot_count} with indexCount {count}", header
    if count > 1 and (begin_phy < 0 or end_phy < begin_phy or end_ts < begin_ts):
        return f"its header says phy [{begin_phy}, {end_phy}], timestamps [{begin_ts}, {end_ts}]", header
    return "", header


SLOT_CHECK_CHUNK = 1 << 20  # hash slots read at a time by _slot_table_problem


def _slot_table_problem(path: str, hash_slot_num: int, count: int, slot_count: int) -> str:
    """Why the hash slot table of the index file at path does not fit its header ("" if it
    does): every slot must be 0 or an entry number below indexCount, and as many slots as
    hashSlotCount says must be in use. Reads the table in chunks with C-speed array scans."""
    entries = max(count, 1)  # entries #1 .. #entries-1 exist
    in_use = 0
    with open(path, "rb") as fh:
        fd = fh.fileno()
        for first in range(0, hash_slot_num, SLOT_CHECK_CHUNK):
            n = min(SLOT_CHECK_CHUNK, hash_slot_num - first)
            table = array("i")
            table.frombytes(os.pread(fd, SLOT_SIZE * n, HEADER_SIZE + SLOT_SIZE * first))
            if len(table) < n:
                return "its hash slot table is cut short"
            if sys.byteorder == "little":
                table.byteswap()
            lo, hi = min(table), max(table)
            if lo < 0 or hi >= entries:
                bad = lo if lo < 0 else hi
                return (f"hash slot {first + table.index(bad)} holds entry {bad}, but the file has entries "
                        f"1..{entries - 1}")
            in_use += n - table.count(0)
    if in_use != slot_count:
        return f"{in_use} hash slots are in use, but its header counts {slot_count}"
    return ""


class IndexService:
    """The index files of one store (spec §4.4), or of one of its CommitLogs (``log``: the
    IndexFiles of log k >= 1 are in ROOT/index-k, their offsets that log's; each log's
    dispatcher writes its own, docs/parallel-commitlogs.md); see the module docstring."""

    def __init__(self, root: str, config: StoreConfig, checkpoint: StoreCheckpoint, log: int = 0) -> None:
        self.store_path = index_dir(root, log)
        self.log_id = log
        self.config = config
        self.checkpoint = checkpoint
        self.hash_slot_num = int(config.max_hash_slot_num)
        self.index_num = int(config.max_index_num)
        self.file_size = config.index_file_size
        self._files: list[IndexFile] = []
        self._lock = threading.Lock()
        self._flushers: list[threading.Thread] = []
        self._closed = False
        #: what load() found damaged, the files it deleted for it, and the CommitLog offset
        #: from which the index lacks entries (-1: none); recovery re-dispatches from there
        self.damage: list[str] = []
        self.damaged_files: list[str] = []
        self.rebuild_from = -1
        self._failed_at: float | None = None  # monotonic time of the last failed creation or allocation

    @property
    def files(self) -> list[IndexFile]:
        """The index files, oldest first (a snapshot)."""
        with self._lock:
            return list(self._files)

    # -- start-up -----------------------------------------------------------------------------
    def load(self, last_exit_ok: bool) -> None:
        """spec §4.4 load(lastExitOK): map every ``index/<17 digits>`` file in name order (other
        names are ignored, ``<name>.alloc<pid>`` left by a dead process's interrupted
        creation and the ``000<name>`` links of an earlier version are removed). After an
        abnormal exit, files whose end timestamp is past checkpoint.indexMsgTimestamp (not known
        to be flushed) are destroyed; recovery re-dispatches what they held when
        message_index_safe is set.

        Damage (beyond RocketMQ, decided by ``plan_index_load``, which the recovery dry run
        runs too): a damaged file is deleted with every newer file (entries are only ever
        added to the newest file), and ``rebuild_from`` tells recovery where to re-dispatch
        from to rebuild them: the end of the last file kept. So does a newest file without
        entries (a file is created for a key and gets it at once: an empty one was zeroed, or
        the creation was interrupted). Files that all have one wrong size are refused
        (NotAStoreError) as a geometry change, see plan_index_load."""
        if not os.path.isdir(self.store_path):
            return
        plan = plan_index_load(self.store_path, self.file_size, self.hash_slot_num, self.index_num,
                               last_exit_ok=last_exit_ok, index_msg_timestamp=self.checkpoint.index_msg_timestamp,
                               geometry_vouched=_geometry_vouched(os.path.dirname(self.store_path), self.hash_slot_num,
                                                                  self.index_num))
        for name in plan.staging:
            log.warning("index: removing %s, left by an interrupted index file creation", name)
            try:
                os.unlink(os.path.join(self.store_path, name))
            except FileNotFoundError:
                pass  # another process's load removed it first
        for name, end_ts in plan.destroy:
            log.warning("index: destroying %s after an abnormal exit: it ends at %d, after the last "
                        "flushed index file (checkpoint.indexMsgTimestamp %d)", name, end_ts,
                        self.checkpoint.index_msg_timestamp)
            os.unlink(os.path.join(self.store_path, name))
        if plan.damaged:
            log.error("index: %s is damaged (%s): deleting it%s; recovery rebuilds the index from CommitLog "
                      "offset %d", plan.damaged[0], plan.damage[0].split(": ", 1)[1],
                      f" and the {len(plan.damaged) - 1} newer file(s)" if len(plan.damaged) > 1 else "",
                      plan.rebuild_from)
            for name in plan.damaged:
                os.unlink(os.path.join(self.store_path, name))
        elif plan.damage:
            log.warning("index: %s; recovery rebuilds it from CommitLog offset %d", plan.damage[0],
                        plan.rebuild_from)
        self.damage.extend(plan.damage)
        self.damaged_files.extend(plan.damaged)
        if plan.rebuild_from >= 0:
            self.rebuild_from = plan.rebuild_from
        loaded: list[IndexFile] = []
        try:
            for name in plan.keep:
                path = os.path.join(self.store_path, name)
                f = IndexFile.load(_IndexMapping.open(path, self.file_size), self.hash_slot_num, self.index_num)
                # a file an earlier run created may be sparse past its last entry: what is
                # allocated is taken to end there, so the next entries go through _allocate
                _mapping(f).mapped.allocated = self._entries_end(f, 0)
                loaded.append(f)
        except BaseException:
            for f in loaded:
                _mapping(f).close()
            raise
        log.info("index: loaded %d file(s) from %s", len(loaded), self.store_path)
        with self._lock:
            self._files = loaded

    def follow(self) -> None:
        """A follower (a process reading a store whose dispatcher is another process): map
        the index files created since, forget the ones deleted, re-read every header. Never
        writes. Queries then see the entries the dispatcher has published; every hit is
        still checked against its record by the caller."""
        try:
            names = sorted(n for n in os.listdir(self.store_path) if _INDEX_NAME.fullmatch(n))
        except FileNotFoundError:
            names = []
        with self._lock:
            by_name = {f.file_name: f for f in self._files}
            files: list[IndexFile] = []
            for name in names:
                f = by_name.pop(name, None)
                if f is None:
                    path = os.path.join(self.store_path, name)
                    try:
                        if os.path.getsize(path) != self.file_size:
                            continue
                        f = IndexFile.load(_IndexMapping.open(path, self.file_size), self.hash_slot_num,
                                           self.index_num)
                    except (FileNotFoundError, OSError, ValueError):
                        continue
                else:
                    f.refresh_header()
                files.append(f)
            self._files = files
        for gone in by_name.values():
            _mapping(gone).close()

    # -- recovery -----------------------------------------------------------------------------
    def truncate_dirty(self, phy_offset: int, timestamp_of: Callable[[int], int]) -> tuple[int, list[str]]:
        """Drop every entry of a record at or after phy_offset (the CommitLog was truncated
        there): newer files entirely past it are deleted, the file holding the cut loses its
        last entries (hash slots go back to the previous entry of their chain, the header's
        counts and end fields follow; the end timestamp is the store time of the last kept
        record, from timestamp_of(phy)). Without this, entries would point at records that are
        gone or replaced, and new records below the old end offset would not be indexed.
        Returns (entries dropped, files deleted)."""
        dropped = 0
        deleted: list[str] = []
        while True:
            with self._lock:
                f = self._files[-1] if self._files else None
            if f is None or f.end_phy_offset < phy_offset:
                break
            count = f.index_count
            if count <= 1 or f.begin_phy_offset >= phy_offset:
                if not f.destroy(DESTROY_INTERVAL_MS):
                    log.error("index: %s is in use and cannot be deleted", f.file_name)
                    break
                with self._lock:
                    self._files.remove(f)
                dropped += max(0, count - 1)
                deleted.append(f.file_name)
                continue
            n, g = self._truncate_entries(f, phy_offset, timestamp_of)
            dropped += n
            with self._lock:
                self._files[-1] = g
            break
        if dropped or deleted:
            log.warning("index: dropped %d entries%s past the CommitLog's end %d", dropped,
                        f" and files {', '.join(deleted)}" if deleted else "", phy_offset)
            with self._lock:
                last = self._files[-1] if self._files else None
            if last is not None:
                last.flush()
            limit = last.end_timestamp if last is not None else 0
            if self.checkpoint.index_msg_timestamp > limit:
                self.checkpoint.index_msg_timestamp = limit
                self.checkpoint.flush()
        return dropped, deleted

    def _truncate_entries(self, f: IndexFile, phy_offset: int,
                          timestamp_of: Callable[[int], int]) -> tuple[int, IndexFile]:
        mapped = _mapping(f).mapped
        slots = self.hash_slot_num
        entries_at = HEADER_SIZE + SLOT_SIZE * slots
        begin_ts, _end_ts, begin_phy, _end_phy, slot_count, count = _HEADER.unpack(mapped.read(0, HEADER_SIZE))
        count = max(1, count)
        keep = count
        while keep > 2:
            _, phy, _, _ = _ENTRY.unpack(mapped.read(entries_at + ENTRY_SIZE * (keep - 1), ENTRY_SIZE))
            if phy < phy_offset:
                break
            keep -= 1
        # undo the puts newest first: each slot goes back to the entry before in its chain
        for m in range(count - 1, keep - 1, -1):
            at = entries_at + ENTRY_SIZE * m
            key_hash, _, _, prev = _ENTRY.unpack(mapped.read(at, ENTRY_SIZE))
            slot_at = HEADER_SIZE + SLOT_SIZE * (key_hash % slots if key_hash >= 0 else 0)
            if _I32.unpack(mapped.read(slot_at, SLOT_SIZE))[0] == m:
                mapped.write_at(slot_at, _I32.pack(prev if 0 < prev < m else 0))
                if not 0 < prev < m:
                    slot_count -= 1
            mapped.write_at(at, bytes(ENTRY_SIZE))
        _, last_phy, last_diff, _ = _ENTRY.unpack(mapped.read(entries_at + ENTRY_SIZE * (keep - 1), ENTRY_SIZE))
        end_ts = timestamp_of(last_phy)
        if end_ts < 0:
            end_ts = begin_ts + last_diff * 1000
        mapped.write_at(0, _HEADER.pack(begin_ts, end_ts, begin_phy, last_phy, max(0, slot_count), keep))
        return count - keep, IndexFile.load(_mapping(f), slots, self.index_num)

    # -- writing (dispatcher thread) ----------------------------------------------------------
    def build_index(self, topic: str, keys: str | None, uniq_key: str | None, phy_offset: int,
                    store_timestamp: int, sys_flag: int) -> bool:
        """spec §4.4 buildIndex: index ``topic#uniq_key`` and ``topic#k`` for each non-empty k
        of keys split on " ". Skipped (True): ROLLBACK messages, and messages below the newest
        file's end_phy_offset (already indexed, so re-dispatch is idempotent). False when no
        index file could be created (logged): the caller sets WRITE_INDEX_FILE_ERROR.
        ``put_key_hashes(index_key_triples(...))``: the keys are hashed here and written like a
        parsed batch's; a message without keys touches no file."""
        return self.put_key_hashes(index_key_triples(topic, keys, uniq_key, phy_offset, store_timestamp, sys_flag))

    def put_key_hashes(self, keys: bytes) -> bool:
        """Index keys already hashed, in dispatch order: (phy_offset, store_timestamp,
        key_hash) triples of native int64s (``mqstore.queue._reput.ParsedBatch.index_keys``, or
        ``index_key_triples`` of one message; ROLLBACK messages are not in them). A key below
        the newest file's end_phy_offset is skipped (build_index's skip: the keys of one
        message share its offset, so they are all skipped or all put); a full file is followed
        by a new one. False when no index file could be created (logged; the keys not yet
        indexed are dropped)."""
        if self._closed:
            raise StoreClosedError("the index service is closed")
        n = len(keys) // 24
        done = 0
        while done < n:
            f = self._writable_file(n - done)
            if f is None:
                return False
            done = f.put_key_hashes(keys, done)  # a writable file takes at least one
            if done < n:
                log.info("index: %s is full, starting the next file", f.file_name)
        return True

    def _writable_file(self, keys: int = 1) -> IndexFile | None:
        """RocketMQ retryGetAndCreateIndexFile: the newest file, or a new one if it is full,
        with room allocated for ``keys`` more entries (at most what the file holds). None
        after a failure (logged once), and at once until CREATE_RETRY_INTERVAL_S has passed."""
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < CREATE_RETRY_INTERVAL_S:
            return None
        try:
            f = self._last_or_new_file()
            self._allocate(f, keys)
        except OSError as e:
            if self._failed_at is None:
                log.error("index: no index file can take keys in %s: %s; keys are not indexed until it can "
                          "(WRITE_INDEX_FILE_ERROR), retried every %.0f s", self.store_path, e,
                          CREATE_RETRY_INTERVAL_S)
            self._failed_at = now
            return None
        if self._failed_at is not None:
            log.warning("index: %s takes keys again", f.file_name)
            self._failed_at = None
        return f

    def writable(self) -> bool:
        """True if the index can take keys now (tried at most once every
        CREATE_RETRY_INTERVAL_S after a failure): the dispatcher clears WRITE_INDEX_FILE_ERROR."""
        if self._closed:
            return False
        return self._writable_file() is not None

    def _entries_end(self, f: IndexFile, keys: int) -> int:
        """Where f's entries end once ``keys`` more are written (index_count starts at 1)."""
        return HEADER_SIZE + self.hash_slot_num * SLOT_SIZE + (f.index_count + keys) * ENTRY_SIZE

    def _allocate(self, f: IndexFile, keys: int) -> None:
        """Allocate f's entries for ``keys`` more keys, ALLOCATE_STEP bytes at a time (OSError
        when the disk is full)."""
        mapped = _mapping(f).mapped
        need = self._entries_end(f, keys)
        if need > mapped.allocated:
            mapped.allocate_to(max(need, mapped.allocated + ALLOCATE_STEP))

    def _last_or_new_file(self) -> IndexFile:
        with self._lock:
            last = self._files[-1] if self._files else None
        if last is not None and not last.is_write_full:
            return last
        # only the dispatcher adds files, so the list cannot grow between the two locks
        os.makedirs(self.store_path, exist_ok=True)
        name = index_file_name(_now_ms())
        if last is not None and name <= last.file_name:
            name = _name_after(last.file_name)    # same millisecond, or the clock went back
        while os.path.lexists(os.path.join(self.store_path, name)):
            name = _name_after(name)
        first = HEADER_SIZE + self.hash_slot_num * SLOT_SIZE + ALLOCATE_STEP
        mapping = _IndexMapping.create(os.path.join(self.store_path, name), self.file_size, first)
        end_phy, end_ts = (last.end_phy_offset, last.end_timestamp) if last is not None else (0, 0)
        try:
            f = IndexFile(mapping, self.hash_slot_num, self.index_num, end_phy, end_ts)
        except BaseException:
            mapping.destroy(0)
            raise
        with self._lock:
            self._files.append(f)
        log.info("index: created %s (begin phy %d, ts %d)", name, end_phy, end_ts)
        if last is not None:
            self._flush_in_background(last)
        return f

    def _flush_in_background(self, full: IndexFile) -> None:
        """spec §4.4: flush a full file off the dispatcher thread, then store its end timestamp
        as checkpoint.indexMsgTimestamp. Flushes run in order (each waits for the one before)."""
        previous = self._flushers[-1] if self._flushers else None

        def run() -> None:
            if previous is not None:
                previous.join()
            try:
                ts = full.end_timestamp if full.is_write_full else 0
                if full.flush() and ts > 0:
                    self.checkpoint.index_msg_timestamp = ts
                    self.checkpoint.flush()
            except Exception:
                log.exception("index: flushing full index file %s failed; checkpoint.indexMsgTimestamp "
                              "stays at %d", full.file_name, self.checkpoint.index_msg_timestamp)

        thread = threading.Thread(target=run, name=f"FlushIndexFile-{full.file_name}", daemon=True)
        self._flushers = [t for t in self._flushers if t.is_alive()] + [thread]
        thread.start()

    # -- reading ------------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int) -> QueryOffsetResult:
        """spec §4.4 queryOffset: commit log offsets of ``topic#key`` entries stored in
        [begin, end] (ms), newest file first, at most min(max_num, max_msgs_num_batch). Hash
        matches only: the caller checks each record's real keys."""
        max_num = min(max_num, int(self.config.max_msgs_num_batch))
        files = self.files
        result = QueryOffsetResult()
        if not files:
            return result
        result.index_last_update_timestamp = files[-1].end_timestamp
        result.index_last_update_phy_offset = files[-1].end_phy_offset
        full_key = f"{topic}#{key}"
        found = result.phy_offsets
        for f in reversed(files):
            if f.is_time_matched(begin, end):
                found.extend(f.select_phy_offset(full_key, max_num - len(found), begin, end))
            if f.begin_timestamp < begin or len(found) >= max_num:
                break
        return result

    # -- cleaning -----------------------------------------------------------------------------
    def delete_expired_file(self, min_phy: int) -> int:
        """spec §4.4 deleteExpiredFile: delete files in order while their end_phy_offset is below
        min_phy (the commit log's min offset), never the newest file. Waits for background
        flushes first; a file a query still holds stops the run (it is deleted forcibly on a
        later run). Returns how many files were deleted."""
        files = self.files
        if not files or files[0].end_phy_offset >= min_phy:
            return 0
        self._wait_for_flushes()
        expired = []
        for f in files[:-1]:
            if f.end_phy_offset >= min_phy:
                break
            expired.append(f)
        deleted = 0
        with self._lock:
            for f in expired:
                if not f.destroy(DESTROY_INTERVAL_MS):
                    log.error("index: %s is still in use and was not deleted; retried at the next clean",
                              f.file_name)
                    break
                self._files.remove(f)
                deleted += 1
        if deleted:
            log.info("index: deleted %d expired file(s) below phy offset %d", deleted, min_phy)
        return deleted

    # -- durability and lifetime --------------------------------------------------------------
    def flush(self) -> None:
        """Flush every index file (the checkpoint is not touched)."""
        for f in self.files:
            f.flush()

    def _wait_for_flushes(self) -> None:
        for thread in list(self._flushers):
            thread.join()

    def close(self) -> None:
        """Wait for background flushes, flush every file and unmap it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wait_for_flushes()
        with self._lock:
            files, self._files = self._files, []
        try:
            for f in files:
                f.flush()
        finally:
            for f in files:
                _mapping(f).close()

    shutdown = close

    def destroy(self) -> None:
        """Delete every index file (waits for background flushes first)."""
        self._wait_for_flushes()
        with self._lock:
            files, self._files = self._files, []
        for f in files:
            if not f.destroy(DESTROY_INTERVAL_MS):
                log.error("index: %s is still in use and was not deleted", f.file_name)
