"""MappedFileQueue (spec §6.2): the ordered list of fixed-size files of one log or queue."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

from sortedcontainers import SortedDict

from mqstore._mapped import MappedFile, file_name
from mqstore.errors import NotAStoreError

DELETE_FILES_BATCH_MAX = 10


def _all_zeros(path: str, chunk: int = 1 << 20) -> bool:
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            if block.count(0) != len(block):
                return False
    return True


class MappedFileQueue:
    """Files of one directory keyed by start offset, each exactly ``file_size`` bytes."""

    def __init__(self, store_path: str, file_size: int) -> None:
        self.store_path = store_path
        self.file_size = file_size
        self._files: SortedDict = SortedDict()
        self._lock = threading.RLock()
        self.version = 0  # bumped whenever a file is added or removed (readers cache file maps)
        self.extended: list[tuple[str, int]] = []  # cut last files extended by load: (name, size before)

    # -- loading -----------------------------------------------------------------------
    def load(self, last_file_was_cut: Callable[[str], bool] | None = None) -> None:
        """Map every file of the directory (spec §2: all must be exactly file_size bytes).

        Leftovers of an allocation that died half way (``*.alloc<pid>``) are removed: they
        were never renamed into place, so nothing was ever written to them.

        ``last_file_was_cut(path)`` (the CommitLog passes recovery.commitlog_file_was_cut):
        when the last file written to (only never-written, all-zero files, such as the one
        the allocation service made ahead, may follow it) is shorter than file_size and the predicate says it was cut (its
        data runs to its end) rather than written with another file size, it is extended with
        zeros and listed in ``extended`` as (name, size before); recovery then ends the log at
        the cut. Any other size mismatch is refused before a file is changed."""
        os.makedirs(self.store_path, exist_ok=True)
        with self._lock:
            names = []
            for name in sorted(os.listdir(self.store_path)):
                path = os.path.join(self.store_path, name)
                if ".alloc" in name and name.split(".alloc")[0].isdigit():
                    os.unlink(path)
                elif len(name) == 20 and name.isdigit():
                    names.append(name)
            extend = None
            for i, name in enumerate(names):
                path = os.path.join(self.store_path, name)
                size = os.path.getsize(path)
                if size == self.file_size:
                    continue
                if (extend is None and size < self.file_size and last_file_was_cut is not None
                        and all(_all_zeros(os.path.join(self.store_path, n)) for n in names[i + 1:])
                        and last_file_was_cut(path)):
                    extend = (name, size)
                    continue
                raise NotAStoreError(
                    f"{path} is {size} bytes but the configured file size is {self.file_size}",
                    hint="open the store with the file size it was created with "
                    "(mapped_file_size_commit_log / mapped_file_size_consume_queue)"
                    + ("; only the last file written to may be cut short" if size < self.file_size else ""),
                )
            if extend is not None:
                path = os.path.join(self.store_path, extend[0])
                with open(path, "r+b") as fh:
                    fh.truncate(self.file_size)
                    fh.flush()
                    os.fsync(fh.fileno())
                self.extended.append(extend)
            for name in names:
                mf = MappedFile.open(os.path.join(self.store_path, name), self.file_size)
                mf.wrote_position = mf.committed_position = mf.flushed_position = self.file_size
                self._files[mf.file_from] = mf
            self.version += 1
            self._check_contiguous()

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
                if len(name) != 20 or not name.isdigit() or int(name) in self._files:
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
        if starts and starts[0] % self.file_size:
            raise NotAStoreError(f"{self.store_path}: first file {file_name(starts[0])} is not aligned to "
                                 f"the file size {self.file_size}")

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
        """End offset of the last mapped file (0 when none)."""
        with self._lock:
            return self._files.peekitem(-1)[0] + self.file_size if self._files else 0

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

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        """The file holding offset (spec §2 offset→file), or None / the first file."""
        with self._lock:
            if not self._files:
                return None
            first_from = self._files.peekitem(0)[0]
            last_from = self._files.peekitem(-1)[0]
            if first_from <= offset < last_from + self.file_size:
                mf = self._files.get(offset - offset % self.file_size)
                if mf is not None:
                    return mf
            return self._files.peekitem(0)[1] if return_first_on_not_found else None

    def files_between(self, start: int, end: int) -> list[MappedFile]:
        """Files overlapping [start, end)."""
        with self._lock:
            lo = start - start % self.file_size
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
        if start % self.file_size:
            raise ValueError(f"file start {start} is not a multiple of the file size {self.file_size}")
        with self._lock:
            existing = self.map_existing(start)
            if existing is not None:
                return existing
            os.makedirs(self.store_path, exist_ok=True)
            mf = MappedFile.create(self.path_of(start), self.file_size)
            self._files[start] = mf
            self.version += 1
            return mf

    def get_last_mapped_file(self, start_offset: int = 0, create: bool = True) -> MappedFile | None:
        """spec §6.2 getLastMappedFile: the last file, or a new one if none / the last is full."""
        with self._lock:
            last = self.last()
            if last is not None and not last.is_full:
                return last
            if not create:
                return last
            start = start_offset - start_offset % self.file_size if last is None else last.file_from + self.file_size
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
                    self.version += 1
        return removed, dropped

    def delete_last_file(self) -> str | None:
        """Destroy the last file (ConsumeQueue truncation); returns its name."""
        with self._lock:
            if not self._files:
                return None
            start, mf = self._files.popitem(-1)
            self.version += 1
        mf.destroy(1000)
        return mf.file_name

    def delete_expired_file_by_time(self, expired_ms: int, delete_interval_ms: int, interval_forcibly_ms: int,
                                    clean_immediately: bool) -> int:
        """spec §6.2 deleteExpiredFileByTime: oldest first, never the last file, stop at the
        first unexpired file, at most 10 per call. Returns the number deleted."""
        deleted = 0
        files = self.files[:-1]
        now_ms = int(time.time() * 1000)
        for i, mf in enumerate(files):
            if not (now_ms >= mf.last_modified_ms + expired_ms or clean_immediately):
                break
            if not mf.destroy(interval_forcibly_ms):
                break
            with self._lock:
                self._files.pop(mf.file_from, None)
                self.version += 1
            deleted += 1
            if deleted >= DELETE_FILES_BATCH_MAX:
                break
            if delete_interval_ms > 0 and i < len(files) - 1:
                time.sleep(delete_interval_ms / 1000)
        return deleted

    def close(self) -> None:
        with self._lock:
            for mf in self._files.values():
                mf.close()
            self._files.clear()
            self.version += 1
