"""Type stubs for the compiled ``mqstore.log._shm`` (ext/mqstore/log/_shm.pyx).

The shared-memory control block: positions, put lock, wake-ups, topic-queue table, stats.
"""

from typing import Final, Literal

from typing_extensions import disjoint_base
from mqstore.log._mapped import MappedFile

STATE_BUILDING: Final = 0
STATE_READY: Final = 1
STATE_CLOSED: Final = 2
LOCK_SPIN: Final = 0
LOCK_MUTEX: Final = 1
HEADER_SIZE: Final[int]
SLOT_SIZE: Final[int]
#: a physical offset is log << LOG_SHIFT | local offset (docs/parallel-commitlogs.md)
LOG_SHIFT: Final[int]
#: the most CommitLogs a store has (commit_log_count)
LOG_MAX: Final[int]
#: a log's state code -> name
LOG_STATES: Final[dict[int, str]]
#: the statistics of a log's header line, in their cell order
LOG_STAT_NAMES: Final[tuple[str, ...]]

# channel name -> channel index
CHANNELS: Final[dict[str, int]]
# running-flag name -> bit
RUNNING_FLAGS: Final[dict[str, int]]
# Names of the statistics counters, in MQ_STAT_* order.
STAT_NAMES: Final[tuple[str, ...]]

#: the named cells of ControlBlock.get / set / advance / wait_position (ext/mqstore/log/_shm.pyx _POSITIONS)
CellName = Literal[
    "wrote", "committed", "flushed", "dispatched", "confirmed", "min_phy", "last_store_timestamp",
    "committed_store_timestamp", "dispatched_store_timestamp", "flushed_store_timestamp",
    "flush_request_upto", "flush_error_count", "flush_last_errno", "flush_error_offset",
    "alloc_request_upto", "alloc_ready_upto", "alloc_error_errno", "alloc_error_offset",
    "alloc_error_count", "running_flags", "lock_begin_time_ms", "lock_takeovers",
    "lock_entry_wrote", "lock_owner_pid", "manual_delete_request", "dispatch_idle", "reserved",
    "ha_slaves", "ha_report_ms", "ha_port", "flag_logs",
]
#: the statistics counters of add_stat / max_stat / set_stat (STAT_NAMES)
StatName = Literal[
    "put_requests", "put_messages", "put_bytes", "lock_acquires", "lock_hold_ns_total",
    "lock_hold_ns_max", "rolls", "lock_hold_warns", "page_cache_busy", "flush_timeouts",
    "create_mapped_file_failed", "message_illegal", "lock_takeovers", "roll_wait_ns_total",
    "roll_wait_ns_max", "service_not_available", "flush_count", "flush_ns_total", "flush_ns_max",
    "flush_ns_last", "flush_bytes", "flush_errors", "group_commit_waits", "flush_wait_ns_total",
    "alloc_count", "alloc_ns_total", "alloc_ns_max", "warm_ns_total", "alloc_errors",
    "properties_size_exceeded", "spin_yields", "roll_waits", "dispatch_records", "dispatch_units",
    "dispatch_batches", "dispatch_ns_total", "dispatch_skipped_bytes", "dispatch_errors",
    "index_keys", "index_errors", "commit_count", "commit_bytes", "commit_ns_total",
    "commit_ns_max", "pool_exhausted", "dispatch_skipped_records",
]
#: the running flags of set_running_flag (RUNNING_FLAGS; RocketMQ RunningFlags)
RunningFlag = Literal[
    "NOT_READABLE", "NOT_WRITEABLE", "WRITE_LOGICS_QUEUE_ERROR", "WRITE_INDEX_FILE_ERROR",
    "DISK_FULL",
]
#: the wake-up channels of notify / broadcast / wait_notified (CHANNELS)
Channel = Literal[
    "flush", "flushed", "alloc", "alloc_done", "commit", "dispatch", "dispatched", "clean",
]

def control_block_size(table_slots: int) -> int: ...

@disjoint_base
class ControlBlock:
    """One store's shared-memory control block, mapped from a file (``<store>/mqstore.shm``)."""

    @property
    def size(self) -> int: ...
    @property
    def path(self) -> str: ...
    @staticmethod
    def create(
        path: str,
        *,
        table_slots: int,
        file_size: int,
        lock_kind: Literal["spin", "mutex"],
        sync_flush: bool,
        pool_buffers: int = 0,
        log_count: int = 1,
    ) -> ControlBlock:
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

    @property
    def readonly(self) -> bool: ...
    @property
    def reused(self) -> bool:
        """True if create laid out the old file again in place (the disk was full)."""
    @staticmethod
    def attach(path: str, *, readonly: bool = False) -> ControlBlock:
        """Map an existing block (any process). Raises ValueError if it is not one.

        readonly=True opens the file read-only and maps it PROT_READ (monitoring tools: works
        without write permission, and cannot change the block); every method that writes
        then raises ValueError."""

    def close(self) -> None: ...

    # -- logs
    @property
    def log_count(self) -> int:
        """The store's CommitLogs (commit_log_count)."""
    def log_state(self, log: int) -> Literal["online", "offline", "full", "unused", "unknown"]:
        """'online', 'offline' (an I/O error took it offline) or 'full' (its disk is)."""
    def set_log_state(self, log: int, state: Literal["online", "offline", "full"]) -> None: ...
    def log_stats(self, log: int) -> dict[str, int]:
        """The statistics of the puts into one log (its header line)."""

    # -- header
    @property
    def table_slots(self) -> int: ...
    @property
    def table_count(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    @property
    def lock_kind(self) -> Literal["spin", "mutex"]: ...
    @property
    def sync_flush(self) -> bool: ...
    @property
    def pool_buffers(self) -> int:
        """Buffers of the transient store pool (0: the store has none)."""
    @property
    def owner_pid(self) -> int: ...
    @property
    def created_ms(self) -> int:
        """Wall-clock ms when this block was laid out: every open of a store creates a new one."""

    @property
    def generation(self) -> int: ...
    @property
    def state(self) -> int: ...
    def mark_ready(self) -> None: ...
    def mark_closed(self) -> None: ...

    # -- cells
    def get(self, name: CellName, log: int = 0) -> int:
        """Atomic read of a named cell (positions, flush/alloc cells, running flags)."""

    def set(self, name: CellName, value: int, log: int = 0) -> None:
        """Atomic store. Only the owner rebuilding the block, or tests, move positions back."""

    def advance(self, name: CellName, value: int, log: int = 0) -> int:
        """Raise a position to at least value (positions only move forward); returns the new value."""

    def ha_data_seq(self, log: int = 0) -> int:
        """The sequence puts bump while slaves are connected (new data for the HA writers)."""
    def wait_ha_data(self, seen: int, timeout_ms: float, log: int = 0) -> bool:
        """Block until a put bumps the HA data sequence past seen, or timeout; True if it did."""
    def ha_broadcast(self, log: int = 0) -> None:
        """The confirmed position (what a slave holds) or the slave count changed: wake every
        SYNC_MASTER put waiting for its slave."""
    def positions(self, log: int = 0) -> dict[str, int]: ...
    def set_running_flag(self, flag: RunningFlag, on: bool = True) -> None: ...
    def running_flags(self) -> list[RunningFlag]: ...

    # -- statistics
    def stats(self) -> dict[str, int]: ...
    def writer_slots(self) -> dict[int, dict[str, int]]:
        """Per-writer statistics: {pid: {name: value}} for each writer process that has a slot
        (the statistics every put updates; stats() sums them with the shared cells)."""
    def add_stat(self, name: StatName, value: int = 1) -> None: ...
    def max_stat(self, name: StatName, value: int) -> None: ...
    def set_stat(self, name: StatName, value: int) -> None: ...

    # -- wake-ups
    def arm_dispatch_idle(self, log: int = -1) -> bool: ...
    def disarm_dispatch_idle(self, log: int = -1) -> None: ...
    def wake_idle_dispatcher(self, log: int = 0) -> None: ...
    def set_log_running_flag(self, flag: RunningFlag, log: int, on: bool = True) -> None: ...
    def log_running_flag(self, flag: RunningFlag, log: int) -> bool: ...
    def notify(self, channel: Channel, log: int = 0) -> None:
        """Wake the service waiting on channel (RocketMQ ServiceThread.wakeup)."""

    def broadcast(self, channel: Channel, log: int = 0) -> None:
        """Wake every waiter of channel (e.g. sync writers waiting for 'flushed')."""

    def wait_notified(self, channel: Channel, timeout_ms: float, log: int = 0) -> bool:
        """Wait for a notify on channel or the timeout (RocketMQ waitForRunning); True if notified."""

    def channel_seq(self, channel: Channel, log: int = 0) -> int: ...
    def wait_seq_change(self, channel: Channel, seen: int, timeout_ms: float, log: int = 0) -> bool:
        """Block until the channel's sequence differs from seen, or timeout; True if it changed."""

    def wait_position(self, name: CellName, target: int, channel: Channel, timeout_ms: float, log: int = 0) -> bool:
        """Wait until position name (of log ``log``) reaches target, woken by broadcasts on channel
        (the log's own channel for flush, flushed, alloc_done and commit; the store's one for the
        others, which every log's service broadcasts on: dispatched)."""

    # -- put lock (tools and tests; the put path uses the same C functions)
    def acquire_put_lock(self, log: int = 0) -> bool:
        """Take the put lock as a put would (sets begin_time_in_lock); True if it was taken
        over from a dead holder."""

    def try_acquire_put_lock(self, log: int = 0) -> bool:
        """Take the put lock if it is free (or its holder died: taken over); False when a live
        holder has it. Sets begin_time_in_lock like acquire_put_lock."""
    def release_put_lock(self, log: int = 0) -> None: ...
    def page_cache_busy(self, timeout_ms: int, log: int = 0) -> bool: ...
    @property
    def lock_holder(self) -> tuple[int, int] | None:
        """(pid, tid) of log 0's spin-lock holder, or None (the mutex kind does not record one)."""
    def log_lock_holder(self, log: int) -> tuple[int, int] | None:
        """(pid, tid) of log ``log``'s spin-lock holder, or None."""

    # -- topic-queue table
    def table_get(self, topic: str, queue_id: int) -> int | None:
        """Next queue offset of topic-queueId, or None if the queue was never written."""

    def table_set(self, topic: str, queue_id: int, next_offset: int) -> None:
        """Set (insert) the next offset of a queue. Owner only: used when rebuilding."""

    def table_get_dispatched(self, topic: str, queue_id: int) -> int | None:
        """Queue offsets the dispatcher has built ConsumeQueue units for, or None."""

    def table_set_dispatched(self, topic: str, queue_id: int, units: int) -> bool:
        """Publish a queue's dispatched unit count; False if the queue is not in the table."""

    def wait_queue_units(self, topic: str, queue_id: int, above: int, timeout_ms: float) -> int | None:
        """Long polling (spec §12): wait until the dispatcher has published more than ``above``
        units of the queue, or timeout_ms; returns the unit count seen last, or None when the
        queue is not in the table (nothing was ever put to it)."""
    def table_items(self) -> list[tuple[str, int, int]]:
        """[(topic, queue_id, next_offset)] of every queue in the table."""

def log_of_queue(topic: str, queue_id: int, log_count: int) -> int:
    """The CommitLog (0 .. log_count - 1) the queue topic/queue_id is written to: FNV-1a 64 of
    the topic's UTF-8 bytes plus the queue id (as an unsigned 32-bit number), modulo
    log_count (docs/parallel-commitlogs.md "Queue to log binding"; twin:
    mqstore.twin.logs.log_of_queue)."""

def ofd_lock(fd: int, exclusive: bool = True) -> bool:
    """Try an open-file-description lock on byte 0 of fd (what RocketMQ's FileChannel.tryLock
    takes, but owned by the open file, so a second open in the same process conflicts too).
    Returns False when another holder has it. The kernel drops it when the holder dies."""

def ofd_unlock(fd: int) -> None: ...
def ofd_is_locked(fd: int) -> bool:
    """True if some open file description holds a conflicting lock on byte 0."""

POOL_HEADER_SIZE: Final[int]

@disjoint_base
class TransientStorePool:
    """RocketMQ's TransientStorePool, shared by every process of a store: ``buffers`` write
    buffers of one CommitLog file each, in one file on a memory file system (``/dev/shm``)."""

    @property
    def size(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def buffers(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    @property
    def locked(self) -> bool: ...
    @property
    def lock_errno(self) -> int: ...
    @staticmethod
    def create(
        path: str, buffers: int, file_size: int, ctl_created_ms: int, ctl_owner_pid: int, lock_memory: bool = True,
        log: int = 0,
    ) -> TransientStorePool:
        """A new pool file (any old one at path is replaced), fully allocated, its buffers
        mlocked when lock_memory (a failed mlock is reported by ``locked``/``lock_errno``),
        for the files of CommitLog log."""
    @staticmethod
    def attach(path: str, ctl_created_ms: int = -1, ctl_owner_pid: int = -1, log: int = -1) -> TransientStorePool:
        """Map an existing pool. With the control block's identity given, a pool that belongs to
        another block raises ValueError (as does a file that is not a pool); with log given, so
        does a pool of another CommitLog."""
    def buffer_index(self, file_from: int) -> int:
        """The buffer the CommitLog file starting at file_from writes into."""
    def buffer_view(self, file_from: int) -> memoryview:
        """The buffer of a file as a writable memoryview (valid while the pool is open)."""
    @property
    def ctl_created_ms(self) -> int: ...
    @property
    def ctl_owner_pid(self) -> int: ...
    @property
    def log(self) -> int:
        """The CommitLog whose files this pool buffers (-1 once closed)."""
    def commit_into(self, mapped_file: MappedFile, start: int, end: int) -> None:
        """Copy bytes [start, end) of mapped_file's buffer into mapped_file (the commit of
        RocketMQ's CommitRealTimeService), without the GIL."""
    def close(self) -> None: ...
