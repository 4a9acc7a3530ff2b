"""Type stubs for the compiled ``mqstore.log._mapped`` (ext/mqstore/log/_mapped.pyx).

MappedFile (spec §6.1): one fixed-size file, allocated with posix_fallocate, mapped shared.
"""

from typing import Final

from _typeshed import ReadableBuffer
from typing_extensions import disjoint_base

OS_PAGE_SIZE: Final = 4096

def inject_flush_failure(err: int, count: int = 1, where: str | None = None) -> None:
    """Make the next `count` MappedFile flushes in this process fail with errno `err`; with
    `where`, only flushes of files whose path contains that string."""

def file_name(offset: int) -> str:
    """20-digit zero-padded decimal start offset (spec §2)."""

@disjoint_base
class MappedFile:
    """A fixed-size file mapped MAP_SHARED, with RocketMQ's positions and reference count.

    wrote/committed/flushed positions here are this object's own (ConsumeQueue, index, tests);
    the CommitLog keeps its store-wide positions in the control block.

    Supports the buffer protocol (read only): ``memoryview(mapped_file)`` is zero-copy.
    """

    wrote_position: int
    committed_position: int
    flushed_position: int
    store_timestamp: int
    allocated: int
    @property
    def readonly(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def file_from(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    @property
    def locked_in_memory(self) -> bool: ...
    @staticmethod
    def create(path: str, file_size: int, allocate: int = -1, file_from: int = -1,
               keep_fd: bool | None = None) -> MappedFile:
        """Create, allocate and map a new file at path (its name is its start offset, unless
        file_from >= 0 gives it: the index files, named by time).

        allocate: bytes allocated up front (-1: all of them). A file allocated in part (the
        index, the CommitLog's, the ConsumeQueue's) is sparse after that and its writer calls
        ``allocate_to`` before writing past ``allocated``, so a full disk is an OSError there,
        never a SIGBUS.
        keep_fd: keep the descriptor while mapped (None: when the file is allocated in part,
        for ``allocate_to``). False for the many small files of the ConsumeQueues, whose
        ``allocate_to`` opens the file again for each of its few steps.
        Raises FileExistsError if path exists, OSError(ENOSPC/EFBIG/...) when the space
        cannot be allocated; nothing is left behind in that case.
        """

    @staticmethod
    def open(path: str, file_size: int, readonly: bool = False, keep_fd: bool = False,
             file_from: int = -1) -> MappedFile:
        """Map an existing file; its size must be exactly file_size (spec §2). Its name is its
        20-digit start offset, unless file_from >= 0 gives that (the index files).

        readonly: open and map it for reading only (the read-only tools, which must work on a
        read-only mount); every write method then raises PermissionError.
        keep_fd: keep the file descriptor open while mapped (a file that ``allocate_to``
        grows later: the index files, whose path may be deleted meanwhile). Otherwise it is closed
        once the file is mapped (the mapping does not need it), so a store of many small
        files never runs out of descriptors."""

    def reserve(self, start: int, end: int) -> None:
        """Allocate the file's blocks in [start, end) (clamped to the file) whatever this object
        believes is allocated (another process may have created the file sparse). OSError
        (ENOSPC...) when the disk has no room; nothing is written."""
    def allocate_to(self, end: int) -> int:
        """Allocate the file's blocks up to end (at most its size) if not done yet; returns
        ``allocated``. OSError (ENOSPC...) when the disk has no room: nothing was written."""

    @property
    def file_name(self) -> str: ...
    @property
    def is_full(self) -> bool: ...
    @property
    def read_position(self) -> int: ...
    @property
    def last_modified_ms(self) -> int: ...

    # -- zero-copy access (buffer protocol, read only). Python 3.11 exposes Cython's
    # __getbuffer__/__releasebuffer__ only as C slots; these are their PEP 688 spelling,
    # so that type checkers treat a MappedFile as a buffer (see tests/stubtest_allowlist.txt).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    def view(self, pos: int, size: int) -> memoryview: ...
    def read(self, pos: int, size: int) -> bytes: ...
    def write_at(self, pos: int, data: ReadableBuffer) -> None:
        """Copy data at pos (positions untouched)."""

    def append(self, data: ReadableBuffer) -> bool:
        """Raw append at wrote_position (ConsumeQueue, HA slave): False if it does not fit."""

    def zero_range(self, start: int, end: int) -> None: ...
    def zero_dirty_tail(self, start: int, clean_pages: int = 16) -> int:
        """Zero bytes from start until `clean_pages` consecutive all-zero pages are seen.

        Used when recovery truncates a torn tail, so stale bytes of an unfinished record can
        never be parsed as a record later. Returns the end of the last page that held a
        non-zero byte (start if there was none): the extent of what was dropped."""

    # -- durability
    def flush_range(self, start: int, end: int) -> None:
        """msync(MS_SYNC) the pages covering [start, end). Raises OSError on failure: a failed
        flush must never be reported as success (spec §8)."""

    def is_able_to_flush(self, least_pages: int) -> bool:
        """spec §6.1 isAbleToFlush on this file's own positions."""

    def flush(self, least_pages: int = 0) -> int:
        """Flush this file's own dirty range if able (spec §6.1); returns flushed_position."""

    # -- warm-up (spec §6.3 warmMappedFile)
    def warm(self, sync_flush: bool, flush_least_pages: int, lock_memory: bool = True) -> dict[str, int]:
        """Touch one byte per 4 KiB page; under sync flush force every flush_least_pages pages;
        then mlock + madvise(WILLNEED). Returns timings and whether mlock succeeded:
        {"pages", "forces", "warm_ns", "mlock_ok" (a bool), "mlock_errno"}."""

    def populate(self, end: int = -1, start: int = 0) -> dict[str, int]:
        """Read every page of the file (of bytes [start, end) when end >= 0) into the page cache
        and map it read-only
        (madvise MADV_POPULATE_READ, Linux 5.14+): the pages of a new, fallocated file are
        zero-filled here instead of on the writer's first touch. Nothing is dirtied or
        locked; unlike warm() this writes nothing to disk. Returns timings and the errno if
        the kernel refused (then the writer simply takes the first-touch faults):
        {"populate_ns", "ok" (a bool), "errno"}."""

    def munlock(self) -> None: ...

    # -- lifetime (spec §6.1 reference counting)
    def hold(self) -> bool: ...
    def release(self) -> None: ...
    @property
    def ref_count_value(self) -> int: ...
    @property
    def is_available(self) -> bool: ...
    @property
    def is_cleanup_over(self) -> bool: ...
    def shutdown(self, interval_forcibly_ms: int) -> None:
        """Mark unavailable and drop the initial reference; on a later call past the interval,
        force the count down even if readers still hold it."""

    def close(self) -> None:
        """Unmap now (if no buffer is exported) and close the descriptor."""

    def destroy(self, interval_forcibly_ms: int = 0) -> bool:
        """shutdown + delete the file once no one holds it (spec §6.1)."""
