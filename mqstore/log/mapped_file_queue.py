"""MappedFileQueue (spec §6.2): the ordered list of fixed-size files of one log or queue."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from mqstore.layout import FENCE_NAME, file_start_of, log_of
from mqstore.log._mapped import MappedFile, file_name
from mqstore.errors import NotAStoreError
from mqstore.procs import dead_allocation
from mqstore.log.scan import is_zero

DELETE_FILES_BATCH_MAX = 10


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000)


def _mtime_ms(mf: MappedFile) -> int:
    """The file's mtime in ms (RocketMQ getLastModifiedTimestamp); 0 when the file is gone
    (another process deleted it: as expired as a file can be)."""
    try:
        return int(mf.last_modified_ms)
    except FileNotFoundError:
        return 0


@dataclass
class LoadPlan:
    """What MappedFileQueue.load does to a directory (MappedFileQueue.plan_load)."""

    #: the 20-digit files it maps, in order
    names: list[str]
    #: ``<offset>.alloc<pid>`` leftovers of a dead allocation it removes (a live pid's file is
    #: an allocation under way in another process of the node: left alone)
    leftovers: list[str]
    #: (name, size) of the cut last file with data it extends to the file size
    extend: list[tuple[str, int]] = field(default_factory=list)
    #: (name, size) of the short all-zero files after it that it extends
    extend_empty: list[tuple[str, int]] = field(default_factory=list)


MAX_FILE_START = 2**63 - 1  # a start offset is a Java long


def mapped_file_names(directory: str, *, fenced: bool = False) -> list[str]:
    """The 20-digit file names (start offsets) of a CommitLog or ConsumeQueue directory, in
    order. NotAStoreError for one that is not a regular file (a directory, a socket) or whose
    start offset does not fit a Java long: nothing the store wrote looks like that, and
    neither can be mapped or deleted safely. fenced: the directory is log 0's of a store with
    several CommitLogs, whose fence (layout.FENCE_NAME) is skipped rather than refused."""
    names = []
    for name in sorted(os.listdir(directory)):
        if len(name) != 20 or not name.isdigit():
            continue
        path = os.path.join(directory, name)
        if name == FENCE_NAME:
            if fenced:
                continue
            raise NotAStoreError(f"{path}: the store has several CommitLogs (commit_log_count > 1), and this "
                                 "reader reads stores with one", hint="open it with an mqstore that reads "
                                 "several CommitLogs (docs/parallel-commitlogs.md)")
        if int(name) > MAX_FILE_START:
            raise NotAStoreError(f"{path}: a file name is its start offset, and {name} is past 2^63 - 1",
                                 hint="move the file out of the store")
        if not os.path.isfile(path) or os.path.islink(path):
            raise NotAStoreError(f"{path} is not a regular file (where the store keeps a mapped file)",
                                 hint="move it out of the store")
        names.append(name)
    return names


#: a CommitLog file's first disk reservation; each later one doubles, up to
#: commit_log_allocate_step_bytes, so a small store takes little disk and a busy one large steps
ALLOCATE_STEP_MIN = 1 << 20


def reservation_step(pos: int, max_step: int) -> int:
    """The disk reservation step of a CommitLog file written up to byte pos: the power of two
    at or above pos, at least ALLOCATE_STEP_MIN (or max_step if smaller), at most max_step."""
    step = 1 << max(0, (pos - 1).bit_length())
    return max(min(max_step, ALLOCATE_STEP_MIN), min(max_step, step))


class MappedFileQueue:
    """Files of one directory keyed by start offset, each exactly ``file_size`` bytes.

    ``base``: the offset of the directory's first possible byte. 0 for a ConsumeQueue and for
    CommitLog 0; ``layout.log_base(k)`` for CommitLog k of a store with several
    (docs/parallel-commitlogs.md): its files are named base + j * file_size, and an empty
    queue's ends are base."""

    def __init__(self, store_path: str, file_size: int, base: int = 0, *, fenced: bool = False) -> None:
        self.store_path = store_path
        self.file_size = file_size
        self.base = base
        #: log 0's directory of a store with several CommitLogs: its fence file is not a file of the log
        self.fenced = fenced
        self._files: SortedDict = SortedDict()
        self._lock = threading.RLock()
        # bumped whenever a file is added, removed or shut down for deletion (readers cache file maps)
        self.version = 0
        self.extended: list[tuple[str, int]] = []  # cut last files extended by load: (name, size before)
        #: short all-zero files after them (allocated ahead, never written) extended by load
        self.extended_empty: list[tuple[str, int]] = []
        self._removal_listeners: list[weakref.WeakMethod[Callable[[], None]]] = []
        #: bytes of a new file's disk space allocated when it is created (0: all of it); the
        #: CommitLog allocates the rest ahead of its write position (commit_log_allocate_step_bytes),
        #: a ConsumeQueue ahead of its units (a page first)
        self.allocate_step = 0
        #: whether a file created in part keeps its descriptor for allocate_to (None: it does;
        #: False: the ConsumeQueues, thousands of small files, open it again for each step)
        self.keep_fd: bool | None = None

    def initial_allocation(self) -> int:
        """What MappedFile.create allocates of a new file: -1 (all) or the first step."""
        first = reservation_step(0, self.allocate_step) if self.allocate_step else self.file_size
        return -1 if first >= self.file_size else first

    # -- loading -----------------------------------------------------------------------
    def load(self, last_file_was_cut: Callable[[str], bool] | None = None) -> None:
        """Map every file of the directory (spec §2: all must be exactly file_size bytes).

        Leftovers of an allocation that died half way (``*.alloc<pid>`` of a pid no longer
        running) are removed: they were never renamed into place, so nothing was ever written
        to them. A running pid's file is another process's allocation under way.

        ``last_file_was_cut(path)`` (the CommitLog passes recovery.commitlog_file_was_cut)
        allows two kinds of short files at the end of the log (see ``plan_load``), which are
        extended with zeros to file_size: the last file written to, when it was cut (listed in
        ``extended`` as (name, size before); recovery then ends the log at the cut), and files
        after it that hold nothing but zeros (listed in ``extended_empty``: allocated ahead and
        never written, cut by a crash before the file system kept their size; recovery deletes
        them with the other files past the end of the log). Any other size mismatch is
        refused (NotAStoreError) before a file is changed."""
        os.makedirs(self.store_path, exist_ok=True)
        with self._lock:
            plan = self.plan_load(self.store_path, self.file_size, last_file_was_cut, fenced=self.fenced)
            for name in plan.leftovers:
                try:
                    os.unlink(os.path.join(self.store_path, name))
                except FileNotFoundError:
                    pass  # another process's load removed it first
            for name, _ in plan.extend + plan.extend_empty:
                path = os.path.join(self.store_path, name)
                with open(path, "r+b") as fh:
                    fh.truncate(self.file_size)
                    fh.flush()
                    os.fsync(fh.fileno())
            self.extended.extend(plan.extend)
            self.extended_empty.extend(plan.extend_empty)
            for name in plan.names:
                mf = MappedFile.open(os.path.join(self.store_path, name), self.file_size)
                mf.wrote_position = mf.committed_position = mf.flushed_position = self.file_size
                self._files[mf.file_from] = mf
            self.version += 1
            self._check_contiguous()

    @staticmethod
    def plan_load(directory: str, file_size: int, last_file_was_cut: Callable[[str], bool] | None = None, *,
                  fenced: bool = False) -> LoadPlan:
        """What ``load`` does to directory, decided without changing anything (the recovery dry
        run, mqstore.tools.inspection, maps the files the same way): the 20-digit files in order, the
        allocation leftovers it removes, and the short files it extends.

        Every file must be file_size bytes, except, when last_file_was_cut is given (the
        CommitLog), at the end of the log:

        * files that hold nothing but zeros, of any size up to file_size, followed only by such
          files: allocated ahead and never written (a crash can leave a renamed file shorter
          than what posix_fallocate gave it, down to 0 bytes) -> ``extend_empty``;
        * the last file holding data, if ``last_file_was_cut(path)`` says it was cut (its data
          runs to its very end) rather than written with another file size, followed only by
          all-zero files -> ``extend``.

        Anything else (a short file with data before other data, a longer file, a short file
        that ends like a whole file of another size) raises NotAStoreError."""
        names = mapped_file_names(directory, fenced=fenced)
        leftovers = [n for n in sorted(os.listdir(directory)) if dead_allocation(n)]
        plan = LoadPlan(names, leftovers)
        sizes = [os.path.getsize(os.path.join(directory, n)) for n in names]
        zeros: dict[int, bool] = {}

        def all_zeros(i: int) -> bool:
            if i not in zeros:
                zeros[i] = is_zero(os.path.join(directory, names[i]))
            return zeros[i]

        for i, (name, size) in enumerate(zip(names, sizes)):
            if size == file_size:
                continue
            path = os.path.join(directory, name)
            at_end = size < file_size and last_file_was_cut is not None and all(
                all_zeros(j) and sizes[j] <= file_size for j in range(i + 1, len(names)))
            if at_end and all_zeros(i):
                plan.extend_empty.append((name, size))
                continue
            if at_end and not plan.extend and last_file_was_cut is not None and last_file_was_cut(path):
                plan.extend.append((name, size))
                continue
            raise NotAStoreError(
                f"{path} is {size} bytes but the configured file size is {file_size}",
                hint="open the store with the file size it was created with "
                "(mapped_file_size_commit_log / mapped_file_size_consume_queue)"
                + ("; only the last file written to may be cut short" if size < file_size else ""),
            )
        return plan

    def map_new_files(self) -> int:
        """Map the files another process created since load (readers and service processes
        following a store that someone else writes). Files are created whole and renamed
        into place, so every 20-digit file found is complete. Returns the number mapped."""
        try:
            names = os.listdir(self.store_path)
        except FileNotFoundError:
            return 0
        added = 0
        with self._lock:
            for name in sorted(names):
                if len(name) != 20 or not name.isdigit() or name == FENCE_NAME or int(name) in self._files:
                    continue
                if self._files and int(name) < self._files.peekitem(0)[0]:
                    continue  # below the first file: a file being deleted, or never ours to read
                try:
                    mf = MappedFile.open(os.path.join(self.store_path, name), self.file_size)
                except (FileNotFoundError, ValueError, OSError):
                    continue  # deleted meanwhile, or not (yet) of the file size
                mf.wrote_position = mf.committed_position = mf.flushed_position = self.file_size
                self._files[mf.file_from] = mf
                added += 1
            if added:
                self.version += 1
        return added

    def _check_contiguous(self) -> None:
        starts = list(self._files)
        for a, b in zip(starts, starts[1:]):
            if b - a != self.file_size:
                raise NotAStoreError(
                    f"{self.store_path}: files {file_name(a)} and {file_name(b)} are not contiguous",
                    hint="a file is missing from the middle of the log; restore it from a backup",
                )
        if starts and file_start_of(starts[0], self.file_size) != starts[0]:
            raise NotAStoreError(f"{self.store_path}: first file {file_name(starts[0])} is not aligned to "
                                 f"the file size {self.file_size}")
        if starts and (starts[0] < self.base or log_of(starts[-1]) != log_of(self.base)):
            raise NotAStoreError(f"{self.store_path}: files {file_name(starts[0])} .. {file_name(starts[-1])} are not "
                                 f"all of CommitLog {log_of(self.base)} (offsets {self.base} and on)",
                                 hint="a file was moved here from another CommitLog's directory")

    # -- lookup --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._files)

    def __iter__(self) -> Iterator[MappedFile]:
        with self._lock:
            return iter(list(self._files.values()))

    @property
    def files(self) -> list[MappedFile]:
        with self._lock:
            return list(self._files.values())

    @property
    def mapped_end(self) -> int:
        """End offset of the last mapped file (the base when none)."""
        with self._lock:
            return self._files.peekitem(-1)[0] + self.file_size if self._files else self.base

    def first(self) -> MappedFile | None:
        with self._lock:
            return self._files.peekitem(0)[1] if self._files else None

    def last(self) -> MappedFile | None:
        with self._lock:
            return self._files.peekitem(-1)[1] if self._files else None

    def get(self, start: int) -> MappedFile | None:
        with self._lock:
            return self._files.get(start)

    @property
    def min_offset(self) -> int:
        """Start of the first file, -1 when empty."""
        first = self.first()
        return -1 if first is None else first.file_from

    def min_available_offset(self) -> int:
        """spec §6.2 CommitLog minOffset: the first file's start if it is available, else the
        start of the file after it (its deletion has begun); the base when empty."""
        first = self.first()
        if first is None:
            return self.base
        return first.file_from if first.is_available else first.file_from + self.file_size

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        """The file holding offset (spec §2 offset→file), or None / the first file."""
        with self._lock:
            if not self._files:
                return None
            first_from = self._files.peekitem(0)[0]
            last_from = self._files.peekitem(-1)[0]
            if first_from <= offset < last_from + self.file_size:
                mf = self._files.get(file_start_of(offset, self.file_size))
                if mf is not None:
                    return mf
            return self._files.peekitem(0)[1] if return_first_on_not_found else None

    def files_between(self, start: int, end: int) -> list[MappedFile]:
        """Files overlapping [start, end)."""
        with self._lock:
            lo = file_start_of(start, self.file_size)
            return [mf for off, mf in self._files.items() if lo <= off < end]

    def flush_between(self, start: int, end: int) -> None:
        """msync [start, end) across the files it spans (a flush may cover the tail of one
        file and the head of the next); raises OSError from the first file that fails."""
        for mf in self.files_between(start, end):
            lo = max(start, mf.file_from) - mf.file_from
            hi = min(end, mf.file_from + self.file_size) - mf.file_from
            if hi > lo:
                mf.flush_range(lo, hi)
                mf.flushed_position = hi

    # -- creation ------------------------------------------------------------------------
    def path_of(self, start: int) -> str:
        return os.path.join(self.store_path, file_name(start))

    def map_existing(self, start: int) -> MappedFile | None:
        """The file at start, mapping it if another thread or process created it."""
        with self._lock:
            mf = self._files.get(start)
            if mf is not None:
                return mf
            path = self.path_of(start)
            if not os.path.exists(path):
                return None
            mf = MappedFile.open(path, self.file_size)
            self._files[start] = mf
            self.version += 1
            return mf

    def add(self, mf: MappedFile) -> MappedFile:
        """Register a file created elsewhere (allocate service); keeps an existing mapping."""
        with self._lock:
            self.version += 1
            return self._files.setdefault(mf.file_from, mf)

    def create(self, start: int) -> MappedFile:
        """Create the file at start synchronously (no allocate service)."""
        if file_start_of(start, self.file_size) != start:
            raise ValueError(f"file start {start} is not a multiple of the file size {self.file_size}")
        with self._lock:
            existing = self.map_existing(start)
            if existing is not None:
                return existing
            os.makedirs(self.store_path, exist_ok=True)
            mf = MappedFile.create(self.path_of(start), self.file_size, self.initial_allocation(), keep_fd=self.keep_fd)
            self._files[start] = mf
            self.version += 1
            return mf

    def get_last_mapped_file(self, start_offset: int | None = None, create: bool = True) -> MappedFile | None:
        """spec §6.2 getLastMappedFile: the last file, or a new one if none / the last is full
        (the first at the file holding start_offset, the base when not given)."""
        if start_offset is None:
            start_offset = self.base
        with self._lock:
            last = self.last()
            if last is not None and not last.is_full:
                return last
            if not create:
                return last
            start = file_start_of(start_offset, self.file_size) if last is None else last.file_from + self.file_size
            return self.create(start)

    # -- truncation and deletion ---------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> tuple[list[str], int]:
        """Keep data before offset (spec §6.2): later files are destroyed, the file holding
        offset gets its positions set to it and its dirty tail zeroed. Returns the removed
        file names and the number of non-zero tail bytes dropped from the kept file."""
        removed = []
        dropped = 0
        with self._lock:
            for start, mf in list(self._files.items()):
                if start + self.file_size <= offset:
                    continue
                if start <= offset:
                    pos = offset - start
                    mf.wrote_position = mf.committed_position = mf.flushed_position = pos
                    dropped = mf.zero_dirty_tail(pos) - pos
                else:
                    removed.append(mf.file_name)
                    mf.destroy(1000)
                    del self._files[start]
        if removed:
            self._files_removed()
        return removed, dropped

    def delete_last_file(self) -> str | None:
        """Destroy the last file (ConsumeQueue truncation); returns its name."""
        with self._lock:
            if not self._files:
                return None
            start, mf = self._files.popitem(-1)
        self._files_removed()
        mf.destroy(1000)
        return mf.file_name

    def on_files_removed(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after files were removed or shut down for deletion, from the
        thread that removed them. callback must be a bound method: it is held weakly, so a
        reader can still be collected. Readers drop their cached maps of the old file list
        here: a deleted file's disk space is only freed when its last mapping goes."""
        self._removal_listeners.append(weakref.WeakMethod(callback))

    def _files_removed(self) -> None:
        with self._lock:
            self.version += 1
            self._removal_listeners = [ref for ref in self._removal_listeners if ref() is not None]
            listeners = list(self._removal_listeners)
        for ref in listeners:
            callback = ref()
            if callback is not None:
                callback()

    def drop_below(self, offset: int) -> int:
        """A follower (a process that does not clean): unmap and forget the files that end at
        or below offset, which another process (the cleaner) deleted. The files themselves are
        not touched. Returns the number dropped."""
        with self._lock:
            gone = [mf for start, mf in self._files.items() if start + self.file_size <= offset]
            for mf in gone:
                del self._files[mf.file_from]
        for mf in gone:
            mf.close()
        if gone:
            self._files_removed()
        return len(gone)

    def drop_above(self, offset: int) -> int:
        """A follower: unmap and forget the files that start after offset, which the process
        that truncated the log (a slave cut back to its master's end) deleted; a file created
        again under the same name later is mapped afresh. Returns the number dropped."""
        with self._lock:
            gone = [mf for start, mf in self._files.items() if start > offset]
            for mf in gone:
                del self._files[mf.file_from]
            if gone:
                self.version += 1
        for mf in gone:
            mf.close()
        if gone:
            self._files_removed()
        return len(gone)

    def _destroy_listed(self, mf: MappedFile, interval_forcibly_ms: int) -> bool:
        """Destroy mf and drop it from the list (spec §6.1 destroy). A file still held by a
        reader is only shut down (unavailable, readers stop mapping it) and stays listed until
        a later call succeeds. Listeners are told either way."""
        was_available = mf.is_available
        destroyed = mf.destroy(interval_forcibly_ms)
        if destroyed:
            with self._lock:
                if self._files.get(mf.file_from) is mf:
                    del self._files[mf.file_from]
        if destroyed or was_available:
            self._files_removed()
        return destroyed

    def delete_expired_file_by_time(self, expired_ms: int, delete_interval_ms: int, interval_forcibly_ms: int,
                                    clean_immediately: bool, *, now_ms: Callable[[], int] | None = None,
                                    sleep_ms: Callable[[float], None] | None = None,
                                    max_files: int = DELETE_FILES_BATCH_MAX, keep_from: int | None = None) -> int:
        """spec §6.2 deleteExpiredFileByTime: oldest first, never the last file, stop at the
        first unexpired file (file mtime + expired_ms > now) unless clean_immediately, at most
        max_files per call, delete_interval_ms between two deletions. Returns the number deleted.

        now_ms / sleep_ms replace the wall clock and time.sleep (the cleaning service passes its
        own, so tests can move time and shutdown interrupts the pause). Beyond RocketMQ:
        keep_from stops the run at the first file that ends after it (the cleaning service
        passes the lowest of the flushed and dispatched positions, so a file is never deleted
        under the flush or before its messages have ConsumeQueue units)."""
        clock = now_ms if now_ms is not None else _wall_ms
        pause = sleep_ms if sleep_ms is not None else _sleep_ms
        deleted = 0
        files = self.files[:-1]
        for i, mf in enumerate(files):
            if keep_from is not None and mf.file_from + self.file_size > keep_from:
                break
            if not (clean_immediately or clock() >= _mtime_ms(mf) + expired_ms):
                break
            if not self._destroy_listed(mf, interval_forcibly_ms):
                break
            deleted += 1
            if deleted >= max_files:
                break
            if delete_interval_ms > 0 and i < len(files) - 1:
                pause(delete_interval_ms)
        return deleted

    def delete_expired_file_by_offset(self, min_phy: int, unit_size: int, interval_forcibly_ms: int = 60_000) -> int:
        """spec §6.2 deleteExpiredFileByOffset (ConsumeQueue files): oldest first, never the last
        file, delete while the file's last unit (at file_size - unit_size) points below min_phy;
        a file already shut down ("hanged") is deleted too. Stops at the first file kept or
        whose destroy fails. Returns the number deleted."""
        deleted = 0
        for mf in self.files[:-1]:
            if mf.is_available:
                try:
                    last_phy = int.from_bytes(mf.read(self.file_size - unit_size, 8), "big", signed=True)
                except ValueError:  # unmapped meanwhile: its deletion is under way
                    last_phy = -1
                if last_phy >= min_phy:
                    break
            if not self._destroy_listed(mf, interval_forcibly_ms):
                break
            deleted += 1
        return deleted

    def retry_delete_first_file(self, interval_forcibly_ms: int) -> bool:
        """spec §14 redeleteHangedFile (CommitLog.retryDeleteFirstFile): destroy the first file
        again if an earlier deletion left it shut down but still held. True if it went."""
        first = self.first()
        if first is None or first.is_available:
            return False
        return self._destroy_listed(first, interval_forcibly_ms)

    def close(self) -> None:
        with self._lock:
            for mf in self._files.values():
                mf.close()
            self._files.clear()
            self.version += 1
