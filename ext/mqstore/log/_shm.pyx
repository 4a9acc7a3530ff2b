# cython: language_level=3
"""The shared-memory control block: positions, put lock, wake-ups, topic-queue table, stats.

Mapped by every process that uses a store (design.md "Processes and shared memory"). The
layout is in ``include/mq_ctl.h``; this module creates, attaches, reads and updates it.
"""

import os
import sys

from libc.errno cimport errno, EBUSY
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memset, memcpy
from posix.fcntl cimport open as c_open, O_RDONLY, O_RDWR, O_CREAT, O_EXCL
from posix.unistd cimport close as c_close, ftruncate, getpid

from mq_bytes cimport *
from mq_ctl cimport *
from mqstore.log._mapped cimport MappedFile

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int msync(void *addr, size_t length, int flags)
    int PROT_READ, PROT_WRITE, MAP_SHARED, MS_SYNC
    void *MAP_FAILED

cdef extern from "<errno.h>":
    int EOWNERDEAD, ENOSPC, EDQUOT

cdef extern from "<fcntl.h>" nogil:
    int posix_fallocate(int fd, long offset, long len)
    struct flock:
        short l_type
        short l_whence
        long l_start
        long l_len
        int l_pid
    int fcntl(int fd, int cmd, ...)
    int F_OFD_SETLK, F_OFD_GETLK, F_WRLCK, F_UNLCK, SEEK_SET

STATE_BUILDING = MQ_STATE_BUILDING
STATE_READY = MQ_STATE_READY
STATE_CLOSED = MQ_STATE_CLOSED
LOCK_SPIN = MQ_LOCK_SPIN
LOCK_MUTEX = MQ_LOCK_MUTEX
HEADER_SIZE = MQ_CTL_HEADER_SIZE
SLOT_SIZE = MQ_TQ_SLOT_SIZE

LOG_SHIFT = MQ_LOG_SHIFT
LOG_MAX = MQ_LOG_MAX
LOG_STATES = {MQ_LOG_UNUSED: "unused", MQ_LOG_ONLINE: "online", MQ_LOG_OFFLINE: "offline", MQ_LOG_FULL: "full"}

CHANNELS = {"flush": MQ_CH_FLUSH, "flushed": MQ_CH_FLUSHED, "alloc": MQ_CH_ALLOC, "alloc_done": MQ_CH_ALLOC_DONE,
            "commit": MQ_CH_COMMIT, "dispatch": MQ_CH_DISPATCH, "dispatched": MQ_CH_DISPATCHED,
            "clean": MQ_CH_CLEAN}

RUNNING_FLAGS = {"NOT_READABLE": MQ_NOT_READABLE, "NOT_WRITEABLE": MQ_NOT_WRITEABLE,
                 "WRITE_LOGICS_QUEUE_ERROR": MQ_WRITE_LOGICS_QUEUE_ERROR,
                 "WRITE_INDEX_FILE_ERROR": MQ_WRITE_INDEX_FILE_ERROR, "DISK_FULL": MQ_DISK_FULL}

# Names of the statistics counters, in MQ_STAT_* order.
STAT_NAMES = (
    "put_requests", "put_messages", "put_bytes", "lock_acquires",
    "lock_hold_ns_total", "lock_hold_ns_max", "rolls", "lock_hold_warns",
    "page_cache_busy", "flush_timeouts", "create_mapped_file_failed", "message_illegal",
    "lock_takeovers", "roll_wait_ns_total", "roll_wait_ns_max", "service_not_available",
    "flush_count", "flush_ns_total", "flush_ns_max", "flush_ns_last",
    "flush_bytes", "flush_errors", "group_commit_waits", "flush_wait_ns_total",
    "alloc_count", "alloc_ns_total", "alloc_ns_max", "warm_ns_total",
    "alloc_errors", "properties_size_exceeded", "spin_yields", "roll_waits",
    "dispatch_records", "dispatch_units", "dispatch_batches", "dispatch_ns_total",
    "dispatch_skipped_bytes", "dispatch_errors", "index_keys", "index_errors",
    "commit_count", "commit_bytes", "commit_ns_total", "commit_ns_max",
    "pool_exhausted", "dispatch_skipped_records",
)
assert len(STAT_NAMES) == MQ_STAT_COUNT
#: the statistics of a log's header line (puts into that log), in their cell order
LOG_STAT_NAMES = ("puts", "bytes", "lock_hold_ns_total", "lock_hold_ns_max", "lock_waits")
#: channels whose futex words every log has its own of; the others are the store's ("dispatch":
#: log k's own dispatcher waits on log k's, the one dispatcher of every log on the store's, which
#: is log 0's)
_LOG_CHANNELS = frozenset({"flush", "flushed", "alloc", "alloc_done", "commit", "dispatch"})
#: named cells that are the store's, not a log's
_STORE_CELLS = frozenset({"running_flags", "manual_delete_request", "dispatch_idle", "ha_port", "flag_logs"})
#: the running flags that stand for logs (set_log_running_flag): their bits' shift in "flag_logs"
_LOG_FLAG_SHIFT = {"WRITE_LOGICS_QUEUE_ERROR": 0, "WRITE_INDEX_FILE_ERROR": 32}

_POSITIONS = {"wrote": MQ_CTL_WROTE, "committed": MQ_CTL_COMMITTED, "flushed": MQ_CTL_FLUSHED,
              "dispatched": MQ_CTL_DISPATCHED, "confirmed": MQ_CTL_CONFIRMED, "min_phy": MQ_CTL_MIN_PHY,
              "last_store_timestamp": MQ_CTL_LAST_STORE_TS, "committed_store_timestamp": MQ_CTL_COMMITTED_STORE_TS,
              "dispatched_store_timestamp": MQ_CTL_DISPATCHED_STORE_TS, "flushed_store_timestamp": MQ_CTL_FLUSHED_STORE_TS,
              "flush_request_upto": MQ_CTL_FLUSH_REQUEST_UPTO, "flush_error_count": MQ_CTL_FLUSH_ERROR_COUNT,
              "flush_last_errno": MQ_CTL_FLUSH_LAST_ERRNO, "flush_error_offset": MQ_CTL_FLUSH_ERROR_OFFSET,
              "alloc_request_upto": MQ_CTL_ALLOC_REQUEST_UPTO, "alloc_ready_upto": MQ_CTL_ALLOC_READY_UPTO,
              "alloc_error_errno": MQ_CTL_ALLOC_ERROR_ERRNO, "alloc_error_offset": MQ_CTL_ALLOC_ERROR_OFFSET,
              "alloc_error_count": MQ_CTL_ALLOC_ERROR_COUNT, "running_flags": MQ_CTL_RUNNING_FLAGS,
              "lock_begin_time_ms": MQ_CTL_LOCK_BEGIN_MS, "lock_takeovers": MQ_CTL_LOCK_TAKEOVERS,
              "lock_entry_wrote": MQ_CTL_LOCK_ENTRY_WROTE, "lock_owner_pid": MQ_CTL_LOCK_OWNER_PID,
              "manual_delete_request": MQ_CTL_MANUAL_DELETE, "dispatch_idle": MQ_CTL_DISPATCH_IDLE,
              "reserved": MQ_CTL_RESERVED, "ha_slaves": MQ_CTL_HA_SLAVES, "ha_report_ms": MQ_CTL_HA_REPORT_MS,
              "ha_port": MQ_CTL_HA_PORT, "flag_logs": MQ_CTL_FLAG_LOGS}


cdef tuple _reusable_block(str path, int64_t size, object why):
    """(fd, created_ms) of the old block at path if it can be laid out again in place (same
    size, a control block); else re-raise why, the error of creating a new one."""
    cdef bytes path_b = os.fsencode(path)
    cdef int fd = c_open(path_b, O_RDWR, 0)
    if fd < 0:
        raise why
    cdef int64_t old_created = 0
    try:
        if os.fstat(fd).st_size != size:
            raise why
        head = os.pread(fd, MQ_CTL_CREATED_MS + 8, 0)
        if len(head) < MQ_CTL_CREATED_MS + 8 or int.from_bytes(head[:8], sys.byteorder) != MQ_CTL_MAGIC:
            raise why
        old_created = int.from_bytes(head[MQ_CTL_CREATED_MS:MQ_CTL_CREATED_MS + 8], sys.byteorder, signed=True)
    except BaseException:
        c_close(fd)
        raise
    return fd, old_created


def control_block_size(int64_t table_slots) -> int:
    return MQ_CTL_HEADER_SIZE + table_slots * MQ_TQ_SLOT_SIZE


cdef class ControlBlock:
    """One store's shared-memory control block, mapped from a file (``<store>/mqstore.shm``)."""

    # attributes: _shm.pxd

    def __cinit__(self):
        self.base = NULL
        self.fd = -1

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.size)
        if self.fd >= 0:
            c_close(self.fd)

    @staticmethod
    def create(str path, *, int64_t table_slots, int64_t file_size, str lock_kind, bint sync_flush,
               int64_t pool_buffers=0, int log_count=1):
        """Lay out a fresh block in a new file (atomically renamed over any old one).

        pool_buffers: buffers of the transient store pool (0: no pool; then the put path
        moves the committed position with the wrote position).

        log_count: the store's CommitLogs (commit_log_count). Every log's position cells start
        at its first encoded offset (log k: k << LOG_SHIFT), its state online.

        The whole file is allocated up front so a full disk fails here, not as SIGBUS later.
        On a full disk (ENOSPC, EDQUOT) an old block of the same size at path is laid out
        again in place instead, so a store can start (and its cleaner free space) on a full
        disk. The caller must have fenced the old block first (its writers stopped, its put
        lock free); the new layout gets a later ``created_ms``, which processes still
        attached to the old one compare under the put lock, so they can never write again.
        The block starts in state BUILDING; the owner rebuilds it from the files and then
        calls ``mark_ready``.
        """
        if table_slots < 64 or table_slots & (table_slots - 1):
            raise ValueError(f"table_slots={table_slots} must be a power of two >= 64")
        if lock_kind not in ("spin", "mutex"):
            raise ValueError(f"lock_kind={lock_kind!r} must be 'spin' or 'mutex'")
        if not 1 <= log_count <= MQ_LOG_MAX:
            raise ValueError(f"log_count={log_count} must be 1 .. {MQ_LOG_MAX}")
        cdef int64_t size = control_block_size(table_slots)
        tmp = f"{path}.tmp{os.getpid()}"
        cdef bytes tmp_b = os.fsencode(tmp)
        cdef int fd = c_open(tmp_b, O_RDWR | O_CREAT, 0o644)
        cdef int r
        cdef int64_t after_ms = 0
        cdef bint in_place = False
        try:
            if fd < 0:
                raise OSError(errno, f"cannot create control block {tmp}: {os.strerror(errno)}")
            try:
                if ftruncate(fd, 0) != 0:
                    raise OSError(errno, f"cannot truncate {tmp}: {os.strerror(errno)}")
                r = posix_fallocate(fd, 0, size)
                if r != 0:
                    raise OSError(r, f"cannot allocate {size} bytes for control block {tmp}: {os.strerror(r)}")
            except BaseException:
                c_close(fd)
                fd = -1
                os.unlink(tmp)
                raise
        except OSError as e:
            if e.errno not in (ENOSPC, EDQUOT):
                raise
            fd, after_ms = _reusable_block(path, size, e)
            in_place = True
        cdef ControlBlock cb = ControlBlock.__new__(ControlBlock)
        cb.path = path
        cb.fd = fd
        cb._map(size)
        if in_place:
            memset(cb.base, 0, size)  # a fresh file is all zeros: the table and stats too
        else:
            memset(cb.base, 0, MQ_CTL_HEADER_SIZE)
        (<uint64_t *>cb.base)[0] = MQ_CTL_MAGIC
        mq_cell(cb.base, MQ_CTL_VERSION_OFF)[0] = MQ_CTL_VERSION
        mq_cell(cb.base, MQ_CTL_TOTAL_SIZE)[0] = size
        mq_cell(cb.base, MQ_CTL_TABLE_SLOTS)[0] = table_slots
        mq_cell(cb.base, MQ_CTL_FILE_SIZE)[0] = file_size
        mq_cell(cb.base, MQ_CTL_OWNER_PID)[0] = getpid()
        mq_cell(cb.base, MQ_CTL_LOCK_KIND)[0] = MQ_LOCK_MUTEX if lock_kind == "mutex" else MQ_LOCK_SPIN
        mq_cell(cb.base, MQ_CTL_FLUSH_DISK_TYPE)[0] = 1 if sync_flush else 0
        mq_cell(cb.base, MQ_CTL_POOL_BUFFERS)[0] = pool_buffers
        mq_cell(cb.base, MQ_CTL_CREATED_MS)[0] = max(mq_now_ms(), after_ms + 1)
        mq_cell(cb.base, MQ_CTL_LOG_COUNT)[0] = log_count
        mq_cell(cb.base, MQ_CTL_LOG_SHIFT_OFF)[0] = MQ_LOG_SHIFT
        cdef int k, c
        cdef char *lg
        for k in range(log_count):
            lg = mq_log(cb.base, k)
            mq_cell(mq_log_head(cb.base, k), MQ_LOG_ID)[0] = k
            mq_cell(mq_log_head(cb.base, k), MQ_LOG_STATE)[0] = MQ_LOG_ONLINE
            for c in (MQ_CTL_WROTE, MQ_CTL_RESERVED, MQ_CTL_COMMITTED, MQ_CTL_FLUSHED, MQ_CTL_DISPATCHED,
                      MQ_CTL_CONFIRMED, MQ_CTL_MIN_PHY, MQ_CTL_FLUSH_REQUEST_UPTO):
                mq_cell(lg, c)[0] = mq_log_start(k)
            mq_cell(lg, MQ_CTL_ALLOC_READY_UPTO)[0] = -1
            mq_cell(lg, MQ_CTL_ALLOC_REQUEST_UPTO)[0] = -1
            r = mq_mutex_init(lg)
            if r != 0:
                raise OSError(r, f"cannot initialise the process-shared put mutex of log {k}: {os.strerror(r)}")
        mq_store(mq_cell(cb.base, MQ_CTL_STATE), MQ_STATE_BUILDING)
        if not in_place:
            os.rename(tmp, path)
        cb.reused = in_place
        return cb

    @staticmethod
    def attach(str path, *, bint readonly=False):
        """Map an existing block (any process). Raises ValueError if it is not one.

        readonly=True opens the file read-only and maps it PROT_READ (monitoring tools: works
        without write permission, and cannot change the block); every method that writes
        then raises ValueError."""
        cdef bytes path_b = os.fsencode(path)
        cdef int fd = c_open(path_b, O_RDONLY if readonly else O_RDWR, 0)
        if fd < 0:
            raise OSError(errno, f"cannot open control block {path}: {os.strerror(errno)}")
        cdef ControlBlock cb = ControlBlock.__new__(ControlBlock)
        cb.path = path
        cb.fd = fd
        cb.readonly = readonly
        size = os.fstat(fd).st_size
        if size < MQ_CTL_HEADER_SIZE:
            raise ValueError(f"{path} is {size} bytes, too small for a control block")
        cb._map(size)
        if (<uint64_t *>cb.base)[0] != MQ_CTL_MAGIC or mq_cell(cb.base, MQ_CTL_VERSION_OFF)[0] != MQ_CTL_VERSION:
            raise ValueError(f"{path} is not an mqstore control block of layout version {MQ_CTL_VERSION}")
        if not 1 <= mq_cell(cb.base, MQ_CTL_LOG_COUNT)[0] <= MQ_LOG_MAX:
            raise ValueError(f"{path}: header says {mq_cell(cb.base, MQ_CTL_LOG_COUNT)[0]} CommitLogs")
        if mq_cell(cb.base, MQ_CTL_TOTAL_SIZE)[0] != size:
            raise ValueError(f"{path}: header says {mq_cell(cb.base, MQ_CTL_TOTAL_SIZE)[0]} bytes, file has {size}")
        return cb

    cdef _map(self, Py_ssize_t size):
        cdef void *p = mmap(NULL, size, PROT_READ if self.readonly else PROT_READ | PROT_WRITE, MAP_SHARED,
                            self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"cannot map control block {self.path}: {os.strerror(errno)}")
        self.base = <char *>p
        self.size = size

    cdef char *_b(self) except NULL:
        if self.base == NULL:
            raise ValueError("control block is closed")
        return self.base

    cdef char *_w(self) except NULL:
        """The base for a method that writes: refused on a read-only attach (it would fault)."""
        if self.readonly:
            raise ValueError(f"control block {self.path} is attached read-only")
        return self._b()

    cdef char *_lg(self, int log, bint write) except NULL:
        """The base of log ``log``'s cells (the block's for log 0); ValueError for a log the
        store does not have."""
        cdef char *b = self._w() if write else self._b()
        if not 0 <= log < mq_cell(b, MQ_CTL_LOG_COUNT)[0]:
            raise ValueError(f"log {log} does not exist: the store has {mq_cell(b, MQ_CTL_LOG_COUNT)[0]} "
                             "CommitLog(s) (commit_log_count)")
        return mq_log(b, log)

    cdef int64_t *_named(self, str name, int log, bint write) except NULL:
        if log and name in _STORE_CELLS:
            raise ValueError(f"{name} is the store's cell, not a log's (log={log})")
        return mq_cell(self._lg(log, write), _POSITIONS[name])

    cdef char *_channel_base(self, str channel, int log, bint write) except NULL:
        if log and channel not in _LOG_CHANNELS:
            raise ValueError(f"the {channel!r} channel is the store's, not a log's (log={log})")
        return self._lg(log, write)

    def close(self):
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL
        if self.fd >= 0:
            c_close(self.fd)
            self.fd = -1

    # -- logs -----------------------------------------------------------------------------
    @property
    def log_count(self) -> int:
        """The store's CommitLogs (commit_log_count)."""
        return mq_cell(self._b(), MQ_CTL_LOG_COUNT)[0]

    def log_state(self, int log) -> str:
        """'online', 'offline' (an I/O error took it offline) or 'full' (its disk is)."""
        self._lg(log, False)
        return LOG_STATES.get(mq_load(mq_cell(mq_log_head(self._b(), log), MQ_LOG_STATE)), "unknown")

    def set_log_state(self, int log, str state):
        cdef dict codes = {v: k for k, v in LOG_STATES.items()}
        if state not in codes or state == "unused":
            raise ValueError(f"state {state!r} is not one of online, offline, full")
        self._lg(log, True)
        mq_store(mq_cell(mq_log_head(self._b(), log), MQ_LOG_STATE), codes[state])

    def log_stats(self, int log) -> dict:
        """The statistics of the puts into one log (its header line)."""
        self._lg(log, False)
        cdef char *h = mq_log_head(self._b(), log)
        return {n: mq_load_relaxed(mq_cell(h, MQ_LOG_PUTS + 8 * i)) for i, n in enumerate(LOG_STAT_NAMES)}

    # -- header ---------------------------------------------------------------------------
    @property
    def table_slots(self) -> int:
        return mq_cell(self._b(), MQ_CTL_TABLE_SLOTS)[0]

    @property
    def table_count(self) -> int:
        return mq_load(mq_cell(self._b(), MQ_CTL_TABLE_COUNT))

    @property
    def file_size(self) -> int:
        return mq_cell(self._b(), MQ_CTL_FILE_SIZE)[0]

    @property
    def lock_kind(self) -> str:
        return "mutex" if mq_cell(self._b(), MQ_CTL_LOCK_KIND)[0] == MQ_LOCK_MUTEX else "spin"

    @property
    def sync_flush(self) -> bool:
        return mq_cell(self._b(), MQ_CTL_FLUSH_DISK_TYPE)[0] == 1

    @property
    def pool_buffers(self) -> int:
        """Buffers of the transient store pool (0: the store has none)."""
        return mq_cell(self._b(), MQ_CTL_POOL_BUFFERS)[0]

    @property
    def owner_pid(self) -> int:
        return mq_load(mq_cell(self._b(), MQ_CTL_OWNER_PID))

    @property
    def created_ms(self) -> int:
        """Wall-clock ms when this block was laid out: every open of a store creates a new one."""
        return mq_cell(self._b(), MQ_CTL_CREATED_MS)[0]

    @property
    def generation(self) -> int:
        return mq_load(mq_cell(self._b(), MQ_CTL_GENERATION))

    @property
    def state(self) -> int:
        return mq_load(mq_cell(self._b(), MQ_CTL_STATE))

    def mark_ready(self):
        mq_fetch_add(mq_cell(self._w(), MQ_CTL_GENERATION), 1)
        mq_store(mq_cell(self.base, MQ_CTL_STATE), MQ_STATE_READY)

    def mark_closed(self):
        mq_store(mq_cell(self._w(), MQ_CTL_STATE), MQ_STATE_CLOSED)

    # -- cells ----------------------------------------------------------------------------
    def get(self, str name, int log=0) -> int:
        """Atomic read of a named cell (positions, flush/alloc cells, running flags); a
        position of log ``log`` (an encoded offset)."""
        return mq_load(self._named(name, log, False))

    def set(self, str name, int64_t value, int log=0):
        """Atomic store. Only the owner rebuilding the block, or tests, move positions back."""
        mq_store(self._named(name, log, True), value)

    def advance(self, str name, int64_t value, int log=0) -> int:
        """Raise a position to at least value (positions only move forward); returns the new value."""
        return mq_max(self._named(name, log, True), value)

    def ha_data_seq(self, int log=0) -> int:
        """The sequence puts bump while slaves are connected (new data for the HA writers)."""
        return mq_load32(<uint32_t *>(self._lg(log, False) + MQ_CTL_HA_DATA_SEQ))

    def wait_ha_data(self, uint32_t seen, double timeout_ms, int log=0) -> bool:
        """Block until a put bumps the HA data sequence past seen, or timeout; True if it did."""
        cdef uint32_t *seq = <uint32_t *>(self._lg(log, False) + MQ_CTL_HA_DATA_SEQ)
        cdef int64_t ns = <int64_t>(timeout_ms * 1e6)
        with nogil:
            if mq_load32(seq) == seen:
                mq_futex_wait(seq, seen, ns)
        return mq_load32(seq) != seen

    def ha_broadcast(self, int log=0):
        """The confirmed position (what a slave holds) or the slave count changed: wake every
        SYNC_MASTER put waiting for its slave."""
        mq_ha_broadcast(self._lg(log, True))

    def positions(self, int log=0) -> dict:
        """The store's positions. Read trailing position first (confirmed, dispatched, flushed,
        committed, then wrote): each only grows and each trails the next, so the values read
        while writers run are still ordered (flushed <= committed <= wrote). Log ``log``'s."""
        cdef char *b = self._lg(log, False)
        got = {n: mq_load(mq_cell(b, _POSITIONS[n])) for n in ("min_phy", "confirmed", "dispatched", "flushed",
                                                               "committed", "wrote")}
        return {n: got[n] for n in ("wrote", "committed", "flushed", "dispatched", "confirmed", "min_phy")}

    def set_running_flag(self, str flag, bint on=True):
        cdef int64_t bit = RUNNING_FLAGS[flag]
        cdef int64_t *cell = mq_cell(self._w(), MQ_CTL_RUNNING_FLAGS)
        cdef int64_t cur
        while True:
            cur = mq_load(cell)
            if mq_cas(cell, cur, (cur | bit) if on else (cur & ~bit)):
                return

    def running_flags(self) -> list:
        cdef int64_t v = mq_load(mq_cell(self._b(), MQ_CTL_RUNNING_FLAGS))
        return [name for name, bit in RUNNING_FLAGS.items() if v & bit]

    # -- statistics -----------------------------------------------------------------------
    def stats(self) -> dict:
        """Every counter, summed over the shared cells and the writers' slots.

        Read last to first: a put bumps put_requests before put_messages before put_bytes,
        so reading them in the other order never shows more messages than requests (or
        more bytes than messages) even while puts go on."""
        cdef char *b = self._b()
        cdef int i
        values = [0] * MQ_STAT_COUNT
        for i in range(MQ_STAT_COUNT - 1, -1, -1):
            values[i] = mq_stat_total(b, i)
        return dict(zip(STAT_NAMES, values))

    def writer_slots(self) -> dict:
        """Per-writer statistics: {pid: {name: value}} for each writer process that has a slot
        (the statistics every put updates; stats() sums them with the shared cells)."""
        cdef char *b = self._b()
        cdef int k, i
        cdef int64_t pid
        cdef int64_t *w
        out = {}
        for k in range(MQ_WRITER_SLOTS):
            pid = mq_load(mq_wslot_pid(b, k))
            if pid:
                w = mq_wslot_stats(b, k)
                out[pid] = {STAT_NAMES[i]: mq_load_relaxed(&w[i]) for i in range(MQ_WSTAT_COUNT)}
        return out

    def add_stat(self, str name, int64_t value=1):
        mq_add_relaxed(mq_stat(self._w(), STAT_NAMES.index(name)), value)

    def max_stat(self, str name, int64_t value):
        mq_stat_max(self._w(), STAT_NAMES.index(name), value)

    def set_stat(self, str name, int64_t value):
        mq_store_relaxed(mq_stat(self._w(), STAT_NAMES.index(name)), value)

    # -- wake-ups -------------------------------------------------------------------------
    def arm_dispatch_idle(self, int log=-1) -> bool:
        """The dispatcher is going to sleep long: from now on the put path (and the commit of
        the transient store pool) wakes it on the "dispatch" channel. After this returns,
        a put that the dispatcher's next look at the positions misses sees the flag (see
        mq_dispatch_idle_arm). False where the kernel has no membarrier: keep polling.
        log: -1 for the one dispatcher of every log (woken on the store's channel by a put into
        any log), k for log k's own dispatcher (dispatch_logs_in_parallel: woken on log k's
        channel by a put into log k). The "dispatch_idle" cell holds a bit per sleeper."""
        cdef char *b = self._w()
        cdef int r
        if not -1 <= log < mq_cell(b, MQ_CTL_LOG_COUNT)[0]:
            raise ValueError(f"log={log}: the store has {mq_cell(b, MQ_CTL_LOG_COUNT)[0]} CommitLogs")
        with nogil:
            r = mq_dispatch_idle_arm(b, log)
        return r == 0

    def disarm_dispatch_idle(self, int log=-1):
        """Clear the bit arm_dispatch_idle(log) set (the other sleepers' stay)."""
        cdef char *b = self._w()
        if not -1 <= log < mq_cell(b, MQ_CTL_LOG_COUNT)[0]:
            raise ValueError(f"log={log}: the store has {mq_cell(b, MQ_CTL_LOG_COUNT)[0]} CommitLogs")
        mq_dispatch_idle_disarm(b, log)

    def wake_idle_dispatcher(self, int log=0):
        """Wake the dispatcher if it sleeps idle (after moving log ``log``'s committed position)."""
        mq_wake_idle_dispatcher(self._w(), self._lg(log, True), log)

    def set_log_running_flag(self, str flag, int log, bint on=True):
        """A running flag that stands for logs (WRITE_LOGICS_QUEUE_ERROR: a log's dispatch
        failed; WRITE_INDEX_FILE_ERROR: a log's index cannot be written): mark log ``log`` as
        having it (the flag is set) or not any more (the flag is cleared once no log has it).
        Several dispatchers (one per log) each mark their own log, so one that gets through
        never clears the flag another log's failure set."""
        cdef int shift = _LOG_FLAG_SHIFT.get(flag, -1)
        if shift < 0:
            raise ValueError(f"{flag!r} is not a running flag that stands for logs; one of "
                             f"{', '.join(_LOG_FLAG_SHIFT)}")
        cdef char *b = self._w()
        if not 0 <= log < mq_cell(b, MQ_CTL_LOG_COUNT)[0]:
            raise ValueError(f"log={log}: the store has {mq_cell(b, MQ_CTL_LOG_COUNT)[0]} CommitLogs")
        cdef int64_t *cell = mq_cell(b, MQ_CTL_FLAG_LOGS)
        cdef int64_t bit = <int64_t>(<uint64_t>1 << (shift + log))
        cdef int64_t group = <int64_t>(<uint64_t>0xFFFFFFFF << shift)
        cdef int64_t cur
        while True:
            cur = mq_load(cell)
            if mq_cas(cell, cur, (cur | bit) if on else (cur & ~bit)):
                break
        if on:
            self.set_running_flag(flag)
        elif not mq_load(cell) & group:
            self.set_running_flag(flag, False)
            if mq_load(cell) & group:  # another log failed meanwhile: its flag stays
                self.set_running_flag(flag)

    def log_running_flag(self, str flag, int log) -> bool:
        """Whether log ``log`` is marked as having flag (set_log_running_flag)."""
        cdef int shift = _LOG_FLAG_SHIFT.get(flag, -1)
        if shift < 0:
            raise ValueError(f"{flag!r} is not a running flag that stands for logs; one of "
                             f"{', '.join(_LOG_FLAG_SHIFT)}")
        if not 0 <= log < MQ_LOG_MAX:
            raise ValueError(f"log={log} must be 0 .. {MQ_LOG_MAX - 1}")
        return bool(mq_load(mq_cell(self._b(), MQ_CTL_FLAG_LOGS)) & (<int64_t>(<uint64_t>1 << (shift + log))))

    def notify(self, str channel, int log=0):
        """Wake the service waiting on channel (RocketMQ ServiceThread.wakeup)."""
        cdef char *b = self._channel_base(channel, log, True)
        cdef int ch = CHANNELS[channel]
        with nogil:
            mq_notify(b, ch)

    def broadcast(self, str channel, int log=0):
        """Wake every waiter of channel (e.g. sync writers waiting for 'flushed')."""
        cdef char *b = self._channel_base(channel, log, True)
        cdef int ch = CHANNELS[channel]
        with nogil:
            mq_broadcast(b, ch)

    def wait_notified(self, str channel, double timeout_ms, int log=0) -> bool:
        """Wait for a notify on channel or the timeout (RocketMQ waitForRunning); True if notified."""
        cdef char *b = self._channel_base(channel, log, True)
        cdef int ch = CHANNELS[channel]
        cdef int64_t ns = <int64_t>(timeout_ms * 1e6)
        cdef int r
        with nogil:
            r = mq_wait_notified(b, ch, ns)
        return r == 1

    def channel_seq(self, str channel, int log=0) -> int:
        return mq_load32(mq_ch_seq(self._channel_base(channel, log, False), CHANNELS[channel]))

    def wait_seq_change(self, str channel, uint32_t seen, double timeout_ms, int log=0) -> bool:
        """Block until the channel's sequence differs from seen, or timeout; True if it changed."""
        cdef char *b = self._channel_base(channel, log, False)
        cdef uint32_t *seq = mq_ch_seq(b, CHANNELS[channel])
        cdef int64_t ns = <int64_t>(timeout_ms * 1e6)
        with nogil:
            if mq_load32(seq) == seen:
                mq_futex_wait(seq, seen, ns)
        return mq_load32(seq) != seen

    def wait_position(self, str name, int64_t target, str channel, double timeout_ms, int log=0) -> bool:
        """Wait until position name (of log ``log``) reaches target, woken by broadcasts on channel
        (the log's own channel for flush, flushed, alloc, alloc_done and commit; the store's one for the
        others, which every log's service broadcasts on: dispatched)."""
        cdef int64_t *cell = self._named(name, log, False)
        cdef char *chb = self._lg(log, False) if channel in _LOG_CHANNELS else self._b()
        cdef uint32_t *seq = mq_ch_seq(chb, CHANNELS[channel])
        cdef int64_t deadline = mq_mono_ns() + <int64_t>(timeout_ms * 1e6)
        cdef int64_t left
        cdef uint32_t s
        with nogil:
            while True:
                s = mq_load32(seq)
                if mq_load(cell) >= target:
                    break
                left = deadline - mq_mono_ns()
                if left <= 0:
                    break
                mq_futex_wait(seq, s, left)
        return mq_load(cell) >= target

    # -- put lock (tools and tests; the put path uses the same C functions) ---------------
    def acquire_put_lock(self, int log=0) -> bool:
        """Take log ``log``'s put lock as a put would (sets begin_time_in_lock); True if it was
        taken over from a dead holder."""
        cdef int kind = <int>mq_cell(self._w(), MQ_CTL_LOCK_KIND)[0]
        cdef char *b = self._lg(log, True)
        cdef int64_t token = mq_lock_token()
        cdef int r = mq_put_trylock(b, kind, token)
        if r == EBUSY:
            with nogil:
                r = mq_put_lock(b, kind, token)
        if r != 0 and r != EOWNERDEAD:
            raise OSError(r, f"cannot take the put lock: {os.strerror(r)}")
        mq_store(mq_cell(b, MQ_CTL_LOCK_OWNER_PID), getpid())
        mq_store(mq_cell(b, MQ_CTL_LOCK_BEGIN_MS), mq_now_ms())
        mq_store(mq_cell(b, MQ_CTL_LOCK_BEGIN_NS), mq_mono_ns())
        return r == EOWNERDEAD

    def try_acquire_put_lock(self, int log=0) -> bool:
        """Take log ``log``'s put lock if it is free (or its holder died: taken over); False
        when a live holder has it. Sets begin_time_in_lock like acquire_put_lock."""
        cdef int kind = <int>mq_cell(self._w(), MQ_CTL_LOCK_KIND)[0]
        cdef char *b = self._lg(log, True)
        cdef int64_t token = mq_lock_token()
        cdef int64_t cur
        cdef int r = mq_put_trylock(b, kind, token)
        if r == EBUSY and kind == MQ_LOCK_SPIN:
            cur = mq_load(mq_cell(b, MQ_CTL_LOCK_WORD))
            if cur != 0 and not mq_pid_alive(cur >> 32) and mq_cas(mq_cell(b, MQ_CTL_LOCK_WORD), cur, token):
                r = EOWNERDEAD
        if r == EBUSY:
            return False
        if r != 0 and r != EOWNERDEAD:
            raise OSError(r, f"cannot take the put lock: {os.strerror(r)}")
        mq_store(mq_cell(b, MQ_CTL_LOCK_OWNER_PID), getpid())
        mq_store(mq_cell(b, MQ_CTL_LOCK_BEGIN_MS), mq_now_ms())
        return True

    def release_put_lock(self, int log=0):
        cdef int kind = <int>mq_cell(self._w(), MQ_CTL_LOCK_KIND)[0]
        cdef char *b = self._lg(log, True)
        mq_store(mq_cell(b, MQ_CTL_LOCK_BEGIN_MS), 0)
        mq_put_unlock(b, kind)

    def page_cache_busy(self, int64_t timeout_ms, int log=0) -> bool:
        return mq_page_cache_busy(self._lg(log, False), mq_now_ms(), timeout_ms)

    @property
    def lock_holder(self):
        """(pid, tid) of log 0's spin-lock holder, or None (the mutex kind does not record one)."""
        return self.log_lock_holder(0)

    def log_lock_holder(self, int log):
        """(pid, tid) of log ``log``'s spin-lock holder, or None."""
        cdef int64_t w = mq_load(mq_cell(self._lg(log, False), MQ_CTL_LOCK_WORD))
        return None if w == 0 else (w >> 32, w & 0xFFFFFFFF)

    # -- topic-queue table ----------------------------------------------------------------
    def table_get(self, str topic, int32_t queue_id):
        """Next queue offset of topic-queueId, or None if the queue was never written."""
        cdef bytes t = topic.encode("utf-8")
        cdef mq_tq_slot *s = mq_tq_find(self._b(), t, len(t), queue_id, mq_tq_hash(t, len(t), queue_id))
        return None if s == NULL else mq_load(&s.next_offset)

    def table_set(self, str topic, int32_t queue_id, int64_t next_offset):
        """Set (insert) the next offset of a queue. Owner only: used when rebuilding."""
        cdef bytes t = topic.encode("utf-8")
        cdef char *b = self._w()
        if len(t) > MQ_TQ_TOPIC_MAX:
            raise ValueError(f"topic {topic!r} is longer than {MQ_TQ_TOPIC_MAX} UTF-8 bytes")
        cdef mq_tq_slot *s = mq_tq_get_or_insert(b, t, len(t), queue_id)
        if s == NULL:
            raise OverflowError(f"topic-queue table is full ({self.table_slots} slots, 7/8 usable); "
                                "raise topic_queue_table_slots")
        mq_store(&s.next_offset, next_offset)

    def table_get_dispatched(self, str topic, int32_t queue_id):
        """Queue offsets the dispatcher has built ConsumeQueue units for (the queue's max offset
        as readers in any process may use it), or None if the queue is not in the table."""
        cdef bytes t = topic.encode("utf-8")
        cdef mq_tq_slot *s = mq_tq_find(self._b(), t, len(t), queue_id, mq_tq_hash(t, len(t), queue_id))
        return None if s == NULL else mq_load(&s.dispatched_next)

    def table_set_dispatched(self, str topic, int32_t queue_id, int64_t units):
        """Publish a queue's dispatched unit count (the dispatcher, or the owner after recovery);
        False if the queue is not in the table."""
        cdef bytes t = topic.encode("utf-8")
        cdef mq_tq_slot *s = mq_tq_find(self._b(), t, len(t), queue_id, mq_tq_hash(t, len(t), queue_id))
        if s == NULL:
            return False
        mq_tq_publish_units(&s.dispatched_next, units)
        return True

    def wait_queue_units(self, str topic, int32_t queue_id, int64_t above, double timeout_ms):
        """Long polling (spec §12): wait until the dispatcher has published more than ``above``
        units of the queue, or timeout_ms; returns the unit count seen last, or None when the
        queue is not in the table (nothing was ever put to it). A futex wait on the queue's
        slot: the dispatcher wakes it after publishing a unit, and only queues somebody waits
        for cost it a wake-up."""
        cdef bytes t = topic.encode("utf-8")
        cdef mq_tq_slot *s = mq_tq_find(self._w(), t, len(t), queue_id, mq_tq_hash(t, len(t), queue_id))
        if s == NULL:
            return None
        cdef int64_t ns = <int64_t>(timeout_ms * 1e6)
        cdef int64_t units
        with nogil:
            units = mq_tq_wait_units(s, above, ns)
        return units

    def table_items(self) -> list:
        """[(topic, queue_id, next_offset)] of every queue in the table (a topic that is not UTF-8,
        from a damaged record, with U+FFFD for its bad bytes)."""
        cdef char *b = self._b()
        cdef int64_t i, n = mq_cell(b, MQ_CTL_TABLE_SLOTS)[0]
        cdef mq_tq_slot *slots = mq_tq_slots(b)
        out = []
        for i in range(n):
            if slots[i].state & 1:  # published (a claimed slot is even)
                out.append((slots[i].topic[:slots[i].topic_len].decode("utf-8", "replace"), slots[i].queue_id,
                            mq_load(&slots[i].next_offset)))
        return out


def ofd_lock(int fd, bint exclusive=True) -> bool:
    """Try an open-file-description lock on byte 0 of fd (what RocketMQ's FileChannel.tryLock
    takes, but owned by the open file, so a second open in the same process conflicts too).
    Returns False when another holder has it. The kernel drops it when the holder dies."""
    cdef flock fl
    memset(&fl, 0, sizeof(fl))
    fl.l_type = F_WRLCK
    fl.l_whence = SEEK_SET
    fl.l_start = 0
    fl.l_len = 1
    if fcntl(fd, F_OFD_SETLK, &fl) == 0:
        return True
    if errno in (11, 13):  # EAGAIN, EACCES
        return False
    raise OSError(errno, f"cannot lock: {os.strerror(errno)}")


def ofd_unlock(int fd):
    cdef flock fl
    memset(&fl, 0, sizeof(fl))
    fl.l_type = F_UNLCK
    fl.l_whence = SEEK_SET
    fl.l_len = 1
    fcntl(fd, F_OFD_SETLK, &fl)


def ofd_is_locked(int fd) -> bool:
    """True if some open file description holds a conflicting lock on byte 0."""
    cdef flock fl
    memset(&fl, 0, sizeof(fl))
    fl.l_type = F_WRLCK
    fl.l_whence = SEEK_SET
    fl.l_len = 1
    if fcntl(fd, F_OFD_GETLK, &fl) != 0:
        raise OSError(errno, os.strerror(errno))
    return fl.l_type != F_UNLCK


# -- the transient store pool (spec §7) ----------------------------------------------------------

cdef extern from "<sys/mman.h>" nogil:
    int mlock(const void *addr, size_t len)

cdef uint64_t POOL_MAGIC = 0x4C4F4F5054534D51ULL  # "MQSTPOOL"
cdef int64_t POOL_VERSION = 1
cdef int64_t POOL_HEADER = 4096
POOL_HEADER_SIZE = POOL_HEADER


cdef class TransientStorePool:
    """RocketMQ's TransientStorePool, shared by every process of a store: ``buffers`` write
    buffers of one CommitLog file each, in one file on a memory file system (``/dev/shm``).

    Writers append into the buffer of the file they write (buffer ``(local / file_size)
    % buffers``, local the file's offset in its CommitLog: a ring, so no process has to borrow
    or return a buffer); the commit service
    copies the bytes between the committed and the wrote positions into the CommitLog file.
    A buffer is free again once the committed position has passed the end of the file that
    used it, which is when RocketMQ returns a buffer to its pool.

    Each CommitLog of a store has its own pool (docs/parallel-commitlogs.md): the header
    names the log (``log``), and a pool serves only the files of its log.

    A 4 KiB header names the control block the pool belongs to (its created_ms and owner
    pid), so a pool left by an owner that died is recognised by the next owner, which copies
    what was written but not committed into the files before recovering (see
    mqstore.log.pool.replay_transient_pool), and a stale pool is never attached to another block.
    """

    # attributes: _shm.pxd

    def __cinit__(self):
        self.base = NULL
        self.fd = -1

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.size)
        if self.fd >= 0:
            c_close(self.fd)

    @staticmethod
    def create(str path, int64_t buffers, int64_t file_size, int64_t ctl_created_ms, int64_t ctl_owner_pid,
               bint lock_memory=True, int log=0):
        """A new pool file (any old one at path is replaced), fully allocated, its buffers
        mlocked when lock_memory (a failed mlock is reported by ``locked``/``lock_errno``),
        for the files of CommitLog log."""
        if buffers < 1:
            raise ValueError(f"buffers={buffers} must be >= 1")
        if not 0 <= log < MQ_LOG_MAX:
            raise ValueError(f"log={log} must be 0 .. {MQ_LOG_MAX - 1}")
        cdef int64_t total = POOL_HEADER + buffers * file_size
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        cdef bytes path_b = os.fsencode(path)
        cdef int fd = c_open(path_b, O_RDWR | O_CREAT | O_EXCL, 0o600)
        if fd < 0:
            raise OSError(errno, f"cannot create the transient store pool {path}: {os.strerror(errno)}")
        cdef int r = posix_fallocate(fd, 0, total)
        if r != 0:
            c_close(fd)
            os.unlink(path)
            raise OSError(r, f"cannot allocate {total} bytes for the transient store pool {path} "
                             f"({buffers} x {file_size} bytes): {os.strerror(r)}")
        cdef TransientStorePool pool = TransientStorePool.__new__(TransientStorePool)
        pool.path = path
        pool.fd = fd
        pool._map(total)
        memset(pool.base, 0, POOL_HEADER)
        (<uint64_t *>pool.base)[0] = POOL_MAGIC
        (<int64_t *>pool.base)[1] = POOL_VERSION
        (<int64_t *>pool.base)[2] = buffers
        (<int64_t *>pool.base)[3] = file_size
        (<int64_t *>pool.base)[4] = ctl_created_ms
        (<int64_t *>pool.base)[5] = ctl_owner_pid
        (<int64_t *>pool.base)[6] = log  # 0 in a pool written before pools were per log
        pool.buffers = buffers
        pool.file_size = file_size
        if lock_memory:
            with nogil:
                r = mlock(pool.base + POOL_HEADER, buffers * file_size)
            pool.locked = r == 0
            pool.lock_errno = 0 if r == 0 else errno
        return pool

    @staticmethod
    def attach(str path, int64_t ctl_created_ms=-1, int64_t ctl_owner_pid=-1, int log=-1):
        """Map an existing pool. With the control block's identity given, a pool that belongs to
        another block raises ValueError (as does a file that is not a pool); with log given, so
        does a pool of another CommitLog."""
        cdef bytes path_b = os.fsencode(path)
        cdef int fd = c_open(path_b, O_RDWR, 0)
        if fd < 0:
            raise OSError(errno, f"cannot open the transient store pool {path}: {os.strerror(errno)}")
        cdef TransientStorePool pool = TransientStorePool.__new__(TransientStorePool)
        pool.path = path
        pool.fd = fd
        size = os.fstat(fd).st_size
        if size < POOL_HEADER:
            raise ValueError(f"{path} is {size} bytes, too small for a transient store pool")
        pool._map(size)
        cdef int64_t *h = <int64_t *>pool.base
        if (<uint64_t *>pool.base)[0] != POOL_MAGIC or h[1] != POOL_VERSION:
            raise ValueError(f"{path} is not an mqstore transient store pool of version {POOL_VERSION}")
        pool.buffers = h[2]
        pool.file_size = h[3]
        if pool.buffers < 1 or POOL_HEADER + pool.buffers * pool.file_size != size:
            raise ValueError(f"{path}: header says {pool.buffers} x {pool.file_size} bytes, the file has {size}")
        if ctl_created_ms >= 0 and (h[4] != ctl_created_ms or h[5] != ctl_owner_pid):
            raise ValueError(f"{path} belongs to another control block (created {h[4]} by pid {h[5]}, "
                             f"not {ctl_created_ms} by pid {ctl_owner_pid})")
        if log >= 0 and h[6] != log:
            raise ValueError(f"{path} is the pool of CommitLog {h[6]}, not of CommitLog {log}")
        return pool

    cdef _map(self, int64_t size):
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"cannot map the transient store pool {self.path}: {os.strerror(errno)}")
        self.base = <char *>p
        self.size = size

    cdef char *_buffer(self, int64_t file_from) except NULL:
        if self.base == NULL:
            raise ValueError("the transient store pool is closed")
        # a file's offset in its own log: log k's files start at k << 56, which need not be a
        # multiple of the file size
        cdef int64_t local = file_from - mq_log_start(<int>(<int64_t *>self.base)[6])
        if file_from < 0 or mq_log_of(file_from) != (<int64_t *>self.base)[6] or local % self.file_size:
            raise ValueError(f"{file_from} is not the start of a file of {self.file_size} bytes of CommitLog "
                             f"{(<int64_t *>self.base)[6]}, whose transient store pool this is")
        return self.base + POOL_HEADER + ((local // self.file_size) % self.buffers) * self.file_size

    def buffer_index(self, int64_t file_from) -> int:
        """The buffer the CommitLog file starting at file_from writes into."""
        cdef char *p = self._buffer(file_from)
        return (p - self.base - POOL_HEADER) // self.file_size

    def buffer_view(self, int64_t file_from) -> memoryview:
        """The buffer of a file as a writable memoryview (valid while the pool is open)."""
        cdef unsigned char *p = <unsigned char *>self._buffer(file_from)
        return memoryview(<unsigned char[:self.file_size]> p)

    @property
    def ctl_created_ms(self) -> int:
        return (<int64_t *>self.base)[4] if self.base != NULL else -1

    @property
    def ctl_owner_pid(self) -> int:
        return (<int64_t *>self.base)[5] if self.base != NULL else -1

    @property
    def log(self) -> int:
        """The CommitLog whose files this pool buffers (-1 once closed)."""
        return (<int64_t *>self.base)[6] if self.base != NULL else -1

    def commit_into(self, MappedFile mapped_file not None, int64_t start, int64_t end):
        """Copy bytes [start, end) of mapped_file's buffer into mapped_file (the commit of
        RocketMQ's CommitRealTimeService), without the GIL."""
        cdef char *src = self._buffer(mapped_file.file_from)
        if not 0 <= start <= end <= self.file_size or mapped_file.file_size != self.file_size:
            raise ValueError(f"commit range [{start}, {end}) is not inside a file of {self.file_size} bytes "
                             f"(the mapped file has {mapped_file.file_size})")
        cdef char *dst = mapped_file._w()
        with nogil:
            memcpy(dst + start, src + start, end - start)

    def close(self):
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL
        if self.fd >= 0:
            c_close(self.fd)
            self.fd = -1


def log_of_queue(str topic, int32_t queue_id, int log_count) -> int:
    """The CommitLog (0 .. log_count - 1) the queue topic/queue_id is written to: FNV-1a 64 of
    the topic's UTF-8 bytes plus the queue id (as an unsigned 32-bit number), modulo
    log_count (docs/parallel-commitlogs.md "Queue to log binding"; twin:
    mqstore.twin.logs.log_of_queue)."""
    if not 1 <= log_count <= MQ_LOG_MAX:
        raise ValueError(f"log_count={log_count} must be 1 .. {MQ_LOG_MAX}")
    cdef bytes t = topic.encode("utf-8")
    return mq_log_of_queue(t, len(t), queue_id, log_count)
