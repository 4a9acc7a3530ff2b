# cython: language_level=3
"""MappedFile (spec §6.1): one fixed-size file, allocated with posix_fallocate, mapped shared.

Files are created under a temporary name, allocated (whole, or a first part that their writer
extends with ``allocate_to`` before writing past it), then renamed into place, so every process
that sees a file name can map it, and a full disk surfaces as an OSError (ENOSPC) at creation
or allocation instead of SIGBUS on a later write into a hole.
"""

import os

from cpython.buffer cimport PyBUF_WRITABLE
from libc.errno cimport ENXIO, errno
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset
from posix.fcntl cimport open as c_open, O_RDWR, O_CREAT, O_EXCL, O_RDONLY
from posix.unistd cimport close as c_close, ftruncate

from mq_bytes cimport mq_now_ms, mq_mono_ns

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int msync(void *addr, size_t length, int flags)
    int madvise(void *addr, size_t length, int advice)
    int mlock(const void *addr, size_t len)
    int munlock(const void *addr, size_t len)
    int PROT_READ, PROT_WRITE, MAP_SHARED, MS_SYNC, MADV_WILLNEED, MADV_DONTNEED
    void *MAP_FAILED

cdef extern from "<fcntl.h>" nogil:
    int posix_fallocate(int fd, long offset, long len)

cdef extern from "<unistd.h>" nogil:
    long lseek(int fd, long offset, int whence)
    int SEEK_DATA, SEEK_HOLE

cdef extern from *:
    """
    #ifndef MADV_POPULATE_READ
    #define MADV_POPULATE_READ 22
    #endif
    """
    int MADV_POPULATE_READ

cdef extern from "<sched.h>" nogil:
    int sched_yield()

OS_PAGE_SIZE = 4096
cdef int64_t PAGE = 4096
#: bytes per msync call of flush_range (the kernel yields its CPU between calls)
cdef int64_t FLUSH_SLICE = 4 << 20

# Fault injection (inject_flush_failure, for tests): the next N flushes fail with this errno instead
# of calling msync, so tests can prove a failed flush is never reported as success.
# `where`, when set, limits the failures to files whose path contains it (the ConsumeQueue flush
# thread must not take a failure meant for the CommitLog).
cdef int _fail_flush_errno = 0
cdef int _fail_flush_count = 0
cdef object _fail_flush_where = None


def inject_flush_failure(int err, int count=1, where=None):
    """Make the next `count` MappedFile flushes in this process fail with errno `err`; with
    `where`, only flushes of files whose path contains that string."""
    global _fail_flush_errno, _fail_flush_count, _fail_flush_where
    if where is not None and not isinstance(where, str):
        raise TypeError(f"where must be a str or None, not {type(where).__name__}")
    _fail_flush_errno = err
    _fail_flush_count = count
    _fail_flush_where = where


def file_name(int64_t offset) -> str:
    """20-digit zero-padded decimal start offset (spec §2)."""
    return f"{offset:020d}"


cdef inline int64_t zero_dirty_page(char *base, int64_t pos, int64_t file_size, int64_t *run,
                                    int64_t *dirty_end) noexcept nogil:
    """One page of MappedFile.zero_dirty_tail from pos: zeroed when it holds a non-zero byte
    (the run of zero pages starts again), else counted in the run. Returns where the next one starts."""
    cdef int64_t page_end = min((pos // PAGE + 1) * PAGE, file_size), i
    cdef bint zero = True
    for i in range(pos, page_end):
        if base[i] != 0:
            zero = False
            break
    if zero:
        run[0] += 1
    else:
        run[0] = 0
        for i in range(page_end - 1, pos - 1, -1):
            if base[i] != 0:
                dirty_end[0] = i + 1
                break
        memset(base + pos, 0, page_end - pos)
    return page_end


cdef class MappedFile:
    """A fixed-size file mapped MAP_SHARED, with RocketMQ's positions and reference count.

    wrote/committed/flushed positions here are this object's own (ConsumeQueue, index, tests);
    the CommitLog keeps its store-wide positions in the control block.
    """

    # attributes: _mapped.pxd

    def __cinit__(self):
        self.base = NULL
        self.fd = -1
        self.ref_count = 1
        self.available = True

    def __dealloc__(self):
        if self.base != NULL and self.exports == 0:
            munmap(self.base, self.file_size)
        if self.fd >= 0:
            c_close(self.fd)

    @staticmethod
    def create(str path, int64_t file_size, int64_t allocate=-1, int64_t file_from=-1, keep_fd=None):
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
        if allocate < 0 or allocate > file_size:
            allocate = file_size
        name = os.path.basename(path)
        if file_from < 0 and (len(name) != 20 or not name.isdigit()):
            raise ValueError(f"{path}: a mapped file name is its 20-digit start offset")
        if os.path.exists(path):
            raise FileExistsError(f"mapped file {path} already exists")
        tmp = f"{path}.alloc{os.getpid()}"
        cdef bytes tmp_b = os.fsencode(tmp)
        cdef int fd = c_open(tmp_b, O_RDWR | O_CREAT | O_EXCL, 0o644)
        if fd < 0:
            raise OSError(errno, f"cannot create {tmp}: {os.strerror(errno)}")
        cdef int r
        with nogil:
            r = posix_fallocate(fd, 0, allocate)
            if r == 0 and allocate < file_size:
                r = ftruncate(fd, file_size)
                if r != 0:
                    r = errno
        if r != 0:
            c_close(fd)
            os.unlink(tmp)
            raise OSError(r, f"cannot allocate {allocate} bytes for {os.path.basename(path)}: {os.strerror(r)}", path)
        c_close(fd)
        os.rename(tmp, path)
        cdef MappedFile mf = MappedFile.open(path, file_size, keep_fd=allocate < file_size if keep_fd is None
                                             else bool(keep_fd), file_from=file_from)
        mf.allocated = allocate
        return mf

    def allocate_to(self, int64_t end) -> int:
        """Allocate the file's blocks up to end (at most its size) if not done yet; returns
        ``allocated``. OSError (ENOSPC...) when the disk has no room: nothing was written."""
        cdef int r
        cdef int fd = self.fd
        end = min(end, self.file_size)
        if end <= self.allocated:
            return self.allocated
        self._w()
        if fd < 0:  # the descriptor was closed after mapping: open the file again for this
            fd = c_open(os.fsencode(self.path), O_RDWR, 0)
            if fd < 0:
                raise OSError(errno, f"cannot open {self.path}: {os.strerror(errno)}", self.path)
        with nogil:
            r = posix_fallocate(fd, self.allocated, end - self.allocated)
        if fd != self.fd:
            c_close(fd)
        if r != 0:
            raise OSError(r, f"cannot allocate {self.file_name} up to byte {end}: {os.strerror(r)}", self.path)
        self.allocated = end
        return end

    def reserve(self, int64_t start, int64_t end):
        """Allocate the file's blocks in [start, end) (clamped to the file) whatever this object
        believes is allocated: another process may have created the file sparse (the CommitLog's
        reservation ahead of the write position, commit_log_allocate_step). OSError (ENOSPC...)
        when the disk has no room; nothing is written."""
        cdef int r
        cdef int fd = self.fd
        start = max(0, start)
        end = min(end, self.file_size)
        if end <= start:
            return
        self._w()
        if fd < 0:
            fd = c_open(os.fsencode(self.path), O_RDWR, 0)
            if fd < 0:
                raise OSError(errno, f"cannot open {self.path}: {os.strerror(errno)}", self.path)
        with nogil:
            r = posix_fallocate(fd, start, end - start)
        if fd != self.fd:
            c_close(fd)
        if r != 0:
            raise OSError(r, f"cannot allocate {self.file_name} bytes [{start}, {end}): {os.strerror(r)}", self.path)
        if start <= self.allocated < end:
            self.allocated = end

    @staticmethod
    def open(str path, int64_t file_size, bint readonly=False, bint keep_fd=False, int64_t file_from=-1):
        """Map an existing file; its size must be exactly file_size (spec §2). Its name is its
        20-digit start offset, unless file_from >= 0 gives that (the index files).

        readonly: open and map it for reading only (the read-only tools, which must work on a
        read-only mount); every write method then raises PermissionError.
        keep_fd: keep the file descriptor open while mapped (a file that ``allocate_to``
        grows later: the index files, whose path may be deleted meanwhile). Otherwise it is closed
        once the file is mapped (the mapping does not need it), so a store of many small
        files never runs out of descriptors."""
        name = os.path.basename(path)
        if file_from < 0 and (len(name) != 20 or not name.isdigit()):
            raise ValueError(f"{path}: a mapped file name is its 20-digit start offset")
        cdef bytes path_b = os.fsencode(path)
        cdef int fd = c_open(path_b, O_RDONLY if readonly else O_RDWR, 0)
        if fd < 0:
            raise OSError(errno, f"cannot open {path}: {os.strerror(errno)}", path)
        actual = os.fstat(fd).st_size
        if actual != file_size:
            c_close(fd)
            raise ValueError(f"{path} is {actual} bytes but the configured size is {file_size}")
        cdef MappedFile mf = MappedFile.__new__(MappedFile)
        mf.fd = fd
        mf.path = path
        mf.file_size = file_size
        mf.file_from = int(name) if file_from < 0 else file_from
        mf.readonly = readonly
        mf.allocated = file_size  # what was there is taken as allocated (MappedFile.create sets less)
        cdef void *p = mmap(NULL, file_size, PROT_READ if readonly else PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"cannot map {path}: {os.strerror(errno)}", path)
        mf.base = <char *>p
        if not keep_fd:
            c_close(fd)
            mf.fd = -1
        return mf

    cdef char *_b(self) except NULL:
        if self.base == NULL:
            raise ValueError(f"{self.path} is unmapped")
        return self.base

    cdef char *_w(self) except NULL:
        if self.readonly:
            raise PermissionError(f"{self.path} is mapped read-only")
        return self._b()

    def __repr__(self):
        return (f"MappedFile({os.path.basename(self.path) if self.path else None}, wrote={self.wrote_position}, "
                f"committed={self.committed_position}, flushed={self.flushed_position})")

    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    @property
    def is_full(self) -> bool:
        return self.wrote_position == self.file_size

    @property
    def read_position(self) -> int:
        return self.wrote_position

    @property
    def last_modified_ms(self) -> int:
        return int(os.stat(self.path).st_mtime * 1000)

    # -- zero-copy access (buffer protocol, read only) ------------------------------------
    def __getbuffer__(self, Py_buffer *buffer, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("mapped files are exported read-only; write through append/write_at")
        buffer.buf = self._b()
        buffer.obj = self
        buffer.len = self.file_size
        buffer.readonly = 1
        buffer.itemsize = 1
        buffer.format = NULL
        buffer.ndim = 1
        buffer.shape = NULL
        buffer.strides = NULL
        buffer.suboffsets = NULL
        buffer.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self.exports -= 1

    def view(self, int64_t pos, int64_t size) -> memoryview:
        self._check_range(pos, size)
        return memoryview(self)[pos:pos + size]

    def read(self, int64_t pos, int64_t size) -> bytes:
        self._check_range(pos, size)
        return self.base[pos:pos + size]

    cdef _check_range(self, int64_t pos, int64_t size):
        self._b()
        if pos < 0 or size < 0 or pos + size > self.file_size:
            raise IndexError(f"range [{pos}, {pos + size}) is outside {self.file_name} of {self.file_size} bytes")

    def write_at(self, int64_t pos, data):
        """Copy data at pos (positions untouched)."""
        cdef const unsigned char[::1] v = memoryview(data).cast("B")
        self._check_range(pos, v.shape[0])
        self._w()
        if v.shape[0]:
            memcpy(self.base + pos, &v[0], v.shape[0])

    def append(self, data) -> bool:
        """Raw append at wrote_position (ConsumeQueue, HA slave): False if it does not fit."""
        cdef const unsigned char[::1] v = memoryview(data).cast("B")
        cdef int64_t n = v.shape[0]
        self._w()
        if self.wrote_position + n > self.file_size:
            return False
        if n:
            memcpy(self.base + self.wrote_position, &v[0], n)
        self.wrote_position += n
        return True

    def zero_range(self, int64_t start, int64_t end):
        self._check_range(start, end - start)
        self._w()
        memset(self.base + start, 0, end - start)

    def zero_dirty_tail(self, int64_t start, int64_t clean_pages=16) -> int:
        """Zero bytes from start until `clean_pages` consecutive all-zero pages are seen.

        Used when recovery truncates a torn tail, so stale bytes of an unfinished record can
        never be parsed as a record later. Returns the end of the last page that held a
        non-zero byte (start if there was none): the extent of what was dropped.

        Holes of a sparse file (lseek SEEK_DATA) count as zero pages without being read: a
        file allocated in part (the ConsumeQueues') is not given pages for them (tmpfs does
        give a page to a hole read through a shared mapping, and a SIGBUS when it is full)."""
        self._check_range(start, 0)
        self._w()
        cdef int64_t pos = start, page_end, run = 0, dirty_end = start
        cdef int64_t data_end = start  # bytes before it are known to be data (not a hole)
        cdef long found
        cdef int fd = self.fd
        if fd < 0:
            fd = c_open(os.fsencode(self.path), O_RDONLY, 0)  # -1: every page is read
        try:
            while pos < self.file_size and run < clean_pages:
                if fd >= 0 and pos >= data_end:
                    found = lseek(fd, pos, SEEK_DATA)
                    if found < 0 and errno == ENXIO:
                        break  # no data from pos to the end of the file
                    if found < 0:  # no hole information here: every page is read
                        data_end = self.file_size
                        continue
                    if found > pos:  # a hole up to found: whole zero pages, not touched
                        page_end = found // PAGE * PAGE
                        if page_end > pos:
                            run += (page_end - pos + PAGE - 1) // PAGE
                            pos = page_end
                            continue
                    found = lseek(fd, pos, SEEK_HOLE)
                    data_end = found if found > pos else self.file_size
                pos = zero_dirty_page(self.base, pos, self.file_size, &run, &dirty_end)
        finally:
            if fd >= 0 and fd != self.fd:
                c_close(fd)
        return dirty_end

    # -- durability -----------------------------------------------------------------------
    def flush_range(self, int64_t start, int64_t end):
        """msync(MS_SYNC) the pages covering [start, end). Raises OSError on failure: a failed
        flush must never be reported as success (spec §8)."""
        global _fail_flush_count
        if end <= start:
            return
        self._check_range(start, end - start)
        cdef int64_t a = (start // PAGE) * PAGE
        cdef int r
        cdef int err = 0
        if _fail_flush_count > 0 and (_fail_flush_where is None or _fail_flush_where in self.path):
            _fail_flush_count -= 1
            raise OSError(_fail_flush_errno, f"msync of {self.file_name} [{start}, {end}) failed: "
                          f"{os.strerror(_fail_flush_errno)} (injected)")
        cdef int64_t z = (end // PAGE) * PAGE
        cdef int64_t at = a, upto
        r = 0
        with nogil:
            # in slices: the kernel runs the writeback of one msync call without giving up its
            # CPU, which on a 2-core machine keeps the dispatcher and writers off a core for
            # milliseconds when an async flush covers hundreds of MB; between calls it can switch
            while at < end and r == 0:
                upto = min(end, at + FLUSH_SLICE)
                if not self.locked_in_memory and min(upto, z) > at:
                    madvise(self.base + at, min(upto, z) - at, MADV_DONTNEED)
                r = msync(self.base + at, upto - at, MS_SYNC)
                if r != 0:
                    err = errno
                at = upto
        if r != 0:
            raise OSError(err, f"msync of {self.file_name} [{start}, {end}) failed: {os.strerror(err)}")

    def is_able_to_flush(self, int least_pages) -> bool:
        """spec §6.1 isAbleToFlush on this file's own positions."""
        if self.is_full:
            return True
        if least_pages > 0:
            return self.wrote_position // PAGE - self.flushed_position // PAGE >= least_pages
        return self.wrote_position > self.flushed_position

    def flush(self, int least_pages=0) -> int:
        """Flush this file's own dirty range if able (spec §6.1); returns flushed_position."""
        cdef int64_t target = self.wrote_position
        if self.is_able_to_flush(least_pages) and self.hold():
            try:
                self.flush_range(self.flushed_position, target)
                self.flushed_position = target
            finally:
                self.release()
        return self.flushed_position

    # -- warm-up (spec §6.3 warmMappedFile) --------------------------------------
    def warm(self, bint sync_flush, int64_t flush_least_pages, bint lock_memory=True) -> dict:
        """Touch one byte per 4 KiB page; under sync flush force every flush_least_pages pages;
        then mlock + madvise(WILLNEED). Returns timings and whether mlock succeeded."""
        cdef char *b = self._b()
        cdef int64_t i, last_forced = 0, pages = 0, t0 = mq_mono_ns(), forces = 0
        cdef int mr = 0, merr = 0
        with nogil:
            i = 0
            while i < self.file_size:
                b[i] = 0
                pages += 1
                if sync_flush and flush_least_pages > 0 and (i // PAGE - last_forced // PAGE) >= flush_least_pages:
                    msync(b + (last_forced // PAGE) * PAGE, i - (last_forced // PAGE) * PAGE, MS_SYNC)
                    last_forced = i
                    forces += 1
                if pages % 1000 == 0:
                    sched_yield()
                i += PAGE
            if sync_flush:
                msync(b, self.file_size, MS_SYNC)
                forces += 1
        cdef int64_t warm_ns = mq_mono_ns() - t0
        if lock_memory:
            mr = mlock(b, self.file_size)
            if mr != 0:
                merr = errno
            madvise(b, self.file_size, MADV_WILLNEED)
            self.locked_in_memory = mr == 0
        return {"pages": pages, "forces": forces, "warm_ns": warm_ns, "mlock_ok": lock_memory and mr == 0,
                "mlock_errno": merr}

    def populate(self, int64_t end=-1, int64_t start=0) -> dict:
        """Read every page of the file (of bytes [start, end) when end >= 0) into the page cache
        and map it read-only (madvise MADV_POPULATE_READ, Linux 5.14+): the pages of a new, fallocated file are
        zero-filled here instead of on the writer's first touch. Nothing is dirtied or
        locked; unlike warm() this writes nothing to disk. Returns timings and the errno if
        the kernel refused (then the writer simply takes the first-touch faults)."""
        cdef char *b = self._b()
        cdef int64_t t0 = mq_mono_ns()
        cdef int r, err = 0
        cdef int64_t n = self.file_size if end < 0 or end > self.file_size else (end + PAGE - 1) // PAGE * PAGE
        if n > self.file_size:
            n = self.file_size
        start = max(0, start) // PAGE * PAGE
        if start >= n:
            return {"populate_ns": 0, "ok": True, "errno": 0}
        with nogil:
            r = madvise(b + start, n - start, MADV_POPULATE_READ)
            if r != 0:
                err = errno
        return {"populate_ns": mq_mono_ns() - t0, "ok": r == 0, "errno": err}

    def munlock(self):
        if self.base != NULL and self.locked_in_memory:
            munlock(self.base, self.file_size)
            self.locked_in_memory = False

    # -- lifetime (spec §6.1 reference counting) --------------------------------------------
    def hold(self) -> bool:
        if self.available and self.ref_count > 0:
            self.ref_count += 1
            return True
        return False

    def release(self):
        self.ref_count -= 1
        if self.ref_count <= 0:
            self._cleanup()

    @property
    def ref_count_value(self) -> int:
        return self.ref_count

    @property
    def is_available(self) -> bool:
        return self.available

    @property
    def is_cleanup_over(self) -> bool:
        return self.ref_count <= 0 and self.cleanup_over

    def shutdown(self, int64_t interval_forcibly_ms):
        """Mark unavailable and drop the initial reference; on a later call past the interval,
        force the count down even if readers still hold it."""
        if self.available:
            self.available = False
            self.first_shutdown_ms = mq_now_ms()
            self.release()
        elif self.ref_count > 0 and mq_now_ms() - self.first_shutdown_ms >= interval_forcibly_ms:
            self.ref_count = -1000 - self.ref_count
            self.release()

    cdef _cleanup(self):
        if self.cleanup_over:
            return
        if self.exports > 0:
            return  # a memoryview still points into the mapping; unmapped at dealloc
        if self.locked_in_memory:
            self.munlock()
        if self.base != NULL:
            munmap(self.base, self.file_size)
            self.base = NULL
        self.cleanup_over = True

    def close(self):
        """Unmap now (if no buffer is exported) and close the descriptor."""
        self.available = False
        self.ref_count = 0
        self._cleanup()
        if self.fd >= 0:
            c_close(self.fd)
            self.fd = -1

    def destroy(self, int64_t interval_forcibly_ms=0) -> bool:
        """shutdown + delete the file once no one holds it (spec §6.1)."""
        self.shutdown(interval_forcibly_ms)
        if self.ref_count <= 0:
            self._cleanup()
            if self.fd >= 0:
                c_close(self.fd)
                self.fd = -1
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            return True
        return False
