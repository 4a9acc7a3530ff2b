"""CommitLog: the files, the put path kernel, the commit and the flush of one store (spec §6-§9).

The store-wide positions (wrote / committed / flushed) live in the control block; this class
maps files for the put path (outside the put lock), commits the transient store pool's
buffers into the files (spec §7, when the store has a pool), flushes ranges that may span two
files, and owns the allocate service hand-off.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import TYPE_CHECKING

from mqstore.layout import OS_PAGE_SIZE, commit_log_k_dir, file_start_of, log_base
from mqstore.log._commitlog import CommitLogAppender
from mqstore.log.mapped_file_queue import MappedFileQueue, reservation_step
from mqstore.log.pool import commit_range
from mqstore.roles import BrokerRole

if TYPE_CHECKING:
    from mqstore.log._shm import ControlBlock, TransientStorePool
    from mqstore.config import StoreConfig
    from mqstore.log._mapped import MappedFile
    from mqstore.services.allocate import AllocateClient, AllocateMappedFileService

log = logging.getLogger("mqstore.commitlog")

#: errors that take a log of a store with several offline (the disk under it failed or went
#: read-only); a full disk is not one of them (the cleaner frees space)
OFFLINE_ERRNOS = frozenset({errno.EIO, errno.EROFS})

MUNLOCK_DELAY_S = 6.0  # spec §6.3: a warmed file is munlock'ed 6 s after the put path leaves it


def _populate(mf: MappedFile, start: int, end: int) -> None:
    """Zero-fill the pages of [start, end) of a held file in the page cache, then release it."""
    try:
        mf.populate(end, start)
    finally:
        mf.release()


def allocate_step_of(config: StoreConfig) -> int:
    """The step the CommitLog's files are allocated in: 0 (whole files) when warm-up writes
    every page anyway (warm_maped_file_enable), else commit_log_allocate_step_bytes."""
    return 0 if config.warm_maped_file_enable else config.commit_log_allocate_step_bytes


def commit_log_files(root: str, config: StoreConfig, log: int = 0) -> MappedFileQueue:
    """The (unloaded) MappedFileQueue of CommitLog ``log``'s directory: its files named from
    ``log_base(log)``; log 0's of a store with several skips the fence."""
    several = config.commit_log_count > 1
    if several:
        directory = config.commit_log_dirs(root)[log]
    else:  # (log k >= 1 of one CommitLog's configuration: the pieces' tests build logs by hand)
        directory = commit_log_k_dir(config.root_dir(root), log) if log else config.commit_log_dir(root)
    return MappedFileQueue(directory, config.mapped_file_size_commit_log, base=log_base(log),
                           fenced=several and log == 0)


class CommitLog:
    """One CommitLog: log 0 (every store has it, at ``store_path_commit_log``), or log ``log``
    of a store with several (docs/parallel-commitlogs.md), at ROOT/commitlog-<log>, whose
    offsets start at ``layout.log_base(log)`` and whose cells are its section of the control
    block."""

    def __init__(self, root: str, config: StoreConfig, ctl: ControlBlock,
                 pool: TransientStorePool | None = None, log: int = 0) -> None:
        self.config = config
        self.ctl = ctl
        self.pool = pool
        self.log_id = log
        self.file_size = config.mapped_file_size_commit_log
        self.queue = commit_log_files(root, config, log)
        #: new files get this much of their disk space at creation, the rest as puts reach it
        self.allocate_step = allocate_step_of(config)
        self.queue.allocate_step = self.allocate_step
        self.allocator: AllocateMappedFileService | AllocateClient | None = None
        self._flush_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self.appender = CommitLogAppender(
            ctl,
            self._provide_file,
            file_size=self.file_size,
            max_message_size=config.max_message_size,
            max_topic_length=config.max_topic_length,
            os_page_cache_busy_time_out_mills=config.os_page_cache_busy_time_out_mills,
            sync_flush_timeout=config.sync_flush_timeout,
            sync_flush=config.is_sync_flush,
            flush_commit_log_timed=config.flush_commit_log_timed,
            store_host=config.store_host_address,
            lock_hold_warn_ms=config.lock_hold_warn_ms,
            slave=config.is_slave,
            pool=pool,
            space_provider=self._reserve_space if self.allocate_step else None,
            flush_provider=self.flush_here if config.is_sync_flush and pool is None else None,
            sync_master=config.broker_role is BrokerRole.SYNC_MASTER,
            slave_timeout_ms=config.slave_timeout,
            slave_fallbehind_max=config.ha_slave_fallbehind_max,
            log=log,
        )

    # -- files for the put path (called by the kernel outside the put lock) ---------------
    def _provide_file(self, offset: int) -> str | None:
        """Map the file holding offset and make it the append target; request the file after
        it in advance. Returns None, or a detail string for CREATE_MAPEDFILE_FAILED."""
        start = file_start_of(offset, self.file_size)
        previous = self.appender.current_file
        mf = self.queue.get(start)
        if mf is None:
            if self.allocator is not None:
                got = self.allocator.put_request_and_return_mapped_file(start, start + self.file_size)
                if isinstance(got, str):
                    return got
                mf = got
            else:
                try:
                    mf = self.queue.create(start)
                except OSError as exc:
                    return f"cannot create CommitLog file {start:020d}: {exc.strerror or exc}"
        elif self.allocator is not None:
            self.allocator.prefetch(start + self.file_size)
        self.appender.set_current_file(mf)
        if previous is not None and previous is not mf and previous.locked_in_memory:
            timer = threading.Timer(MUNLOCK_DELAY_S, previous.munlock)
            timer.daemon = True
            timer.start()
        return None

    def _reserve_space(self, end: int) -> str | None:
        """Allocate the current file's blocks up to log offset end (rounded up to a whole step)
        and publish it in the control block's ``reserved``; called by the put path outside the
        lock. Returns None, or a detail string for CREATE_MAPEDFILE_FAILED (a full disk)."""
        file_from = file_start_of(end - 1, self.file_size)
        mf = self.appender.current_file
        if mf is None or mf.file_from != file_from:
            mf = self.queue.get(file_from)
            if mf is None:
                return f"CommitLog file {file_from:020d} is not mapped: cannot allocate up to {end}"
        start = max(self.ctl.get("reserved", log=self.log_id), file_from) - file_from
        step = reservation_step(end - file_from, self.allocate_step)
        need = min(self.file_size, (end - file_from + step - 1) // step * step)
        try:
            mf.reserve(start, need)
        except OSError as exc:
            self.ctl.add_stat("alloc_errors")
            return f"cannot allocate disk space for CommitLog file {mf.file_name} up to byte {need}: " \
                   f"{exc.strerror or exc}"
        target = need
        ahead = min(self.file_size, need + step)
        if ahead > need:
            # one step ahead, so the writer finds the next step allocated and its pages in the page
            # cache (zero-filled by a background thread, not by the writer's first touch); a full
            # disk here costs nothing: the next reservation tries again and reports it
            try:
                mf.reserve(need, ahead)
                target = ahead
            except OSError:
                pass
        self.ctl.advance("reserved", file_from + target, log=self.log_id)
        if target > start and mf.hold():
            threading.Thread(target=_populate, args=(mf, start, target), name="mqstore-populate", daemon=True).start()
        return None

    def prepare_for_writes(self) -> None:
        """Point the put path at the file holding the write position, if it exists."""
        wrote = self.ctl.get("wrote", log=self.log_id)
        mf = self.queue.find_mapped_file_by_offset(wrote)
        if mf is not None and wrote < mf.file_from + self.file_size:
            self.appender.set_current_file(mf)

    # -- positions -------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        """End of readable data (spec §6.2 getMaxOffset): the committed position (with the
        transient store pool the bytes past it are still in the write buffers)."""
        return self.ctl.get("committed", log=self.log_id)

    # -- commit (spec §7) -------------------------------------------------------------------
    def commit(self, least_pages: int) -> bool:
        """Copy [committed, wrote) from the transient store pool into the files when at least
        least_pages pages are pending (0 = any byte; a range reaching the end of a file always
        goes), then move the committed position. Returns True if it moved. One committer at a
        time: the commit service of the owner or of the flusher process, or the owner at
        shutdown after writers were stopped."""
        pool = self.pool
        if pool is None:
            return False
        with self._commit_lock:
            ts = self.ctl.get("last_store_timestamp", log=self.log_id)  # read before wrote: covered by [0, wrote)
            wrote = self.ctl.get("wrote", log=self.log_id)
            committed = self.ctl.get("committed", log=self.log_id)
            if self._not_due(committed, wrote, least_pages):
                return False
            t0 = time.monotonic_ns()
            commit_range(pool, self.queue, committed, wrote)
            elapsed = time.monotonic_ns() - t0
            self.ctl.advance("committed", wrote, log=self.log_id)
            self.ctl.wake_idle_dispatcher(self.log_id)
            if ts > 0:
                self.ctl.advance("committed_store_timestamp", ts, log=self.log_id)
            self.ctl.add_stat("commit_count")
            self.ctl.add_stat("commit_bytes", wrote - committed)
            self.ctl.add_stat("commit_ns_total", elapsed)
            self.ctl.max_stat("commit_ns_max", elapsed)
            return True

    def _not_due(self, start: int, end: int, least_pages: int) -> bool:
        """A commit or flush of [start, end) waits: the range is empty, or it lies in one file and
        spans fewer than least_pages pages (0 = any byte is enough; a range that reaches into the
        next file always goes)."""
        if end <= start:
            return True
        same_file = file_start_of(start, self.file_size) == file_start_of(end, self.file_size)
        return least_pages > 0 and same_file and end // OS_PAGE_SIZE - start // OS_PAGE_SIZE < least_pages

    @property
    def min_offset(self) -> int:
        """Start of the first available file (spec §6.2); the log's first offset when empty."""
        return self.queue.min_available_offset()

    # -- flush (spec §8) --------------------------------------------------------------------
    def flush(self, least_pages: int) -> bool:
        """Flush [flushed, committed) if at least least_pages pages are dirty (0 = anything), across
        file boundaries. Returns True if the flushed position moved. A failed msync is recorded
        in the control block (waiters return FLUSH_DISK_TIMEOUT) and re-raised, never hidden."""
        with self._flush_lock:
            return self._flush_locked(least_pages)

    def flush_here(self) -> bool:
        """The caller-side flush of a SYNC_FLUSH put: flush everything written, in the putting
        thread, unless another thread of this process is flushing (then False: the caller waits
        for that flush, and the group commit service flushes what it did not cover). A failed
        msync is recorded in the control block as by flush(); the waiter reports it."""
        if not self._flush_lock.acquire(blocking=False):
            return False
        try:
            self._flush_locked(0)
        except OSError:
            pass  # recorded in the control block: the waiter answers FLUSH_DISK_TIMEOUT naming it
        finally:
            self._flush_lock.release()
        return True

    def _flush_locked(self, least_pages: int) -> bool:
        """flush() with its lock held."""
        # the store timestamp read first is covered by the position read after it
        ts = self.ctl.get("committed_store_timestamp" if self.pool is not None else "last_store_timestamp",
                          log=self.log_id)
        target = self.ctl.get("committed", log=self.log_id)
        flushed = self.ctl.get("flushed", log=self.log_id)
        if self._not_due(flushed, target, least_pages):
            return False
        t0 = time.monotonic_ns()
        if self.queue.mapped_end < target:
            self.queue.map_new_files()  # files another process (the allocator) created
        try:
            self.queue.flush_between(flushed, target)
        except OSError as exc:
            self.ctl.set("flush_last_errno", exc.errno or 5, log=self.log_id)
            self.ctl.set("flush_error_offset", flushed, log=self.log_id)
            self.ctl.advance("flush_error_count", self.ctl.get("flush_error_count", log=self.log_id) + 1,
                             log=self.log_id)
            self.ctl.add_stat("flush_errors")
            self._maybe_offline(exc, flushed)
            self.ctl.broadcast("flushed", log=self.log_id)
            raise
        elapsed = time.monotonic_ns() - t0
        self.ctl.advance("flushed", target, log=self.log_id)
        if ts > 0:
            self.ctl.advance("flushed_store_timestamp", ts, log=self.log_id)
        self.ctl.add_stat("flush_count")
        self.ctl.add_stat("flush_ns_total", elapsed)
        self.ctl.max_stat("flush_ns_max", elapsed)
        self.ctl.set_stat("flush_ns_last", elapsed)
        self.ctl.add_stat("flush_bytes", target - flushed)
        self.ctl.broadcast("flushed", log=self.log_id)
        return True

    def _maybe_offline(self, exc: OSError, at: int) -> None:
        """A store with several CommitLogs takes a log whose flush met an I/O error offline, alone
        (docs/parallel-commitlogs.md): puts to its queues answer SERVICE_NOT_AVAILABLE naming it
        until the store is opened again, the other logs go on. A store with one CommitLog keeps
        RocketMQ's way: the failed flush is retried, the puts it covered answer
        FLUSH_DISK_TIMEOUT."""
        ctl, k = self.ctl, self.log_id
        if exc.errno not in OFFLINE_ERRNOS or ctl.log_count <= 1 or ctl.log_state(k) != "online":
            return
        ctl.set_log_state(k, "offline")
        log.error("CommitLog %d is offline: flushing at offset %d failed: %s; the queues bound to it take no puts "
                  "until the store is opened again", k, at, exc.strerror or exc)
        if all(ctl.log_state(j) == "offline" for j in range(ctl.log_count)):
            log.critical("every CommitLog of the store is offline: it takes no puts")

    def close(self) -> None:
        self.appender.closed = True
        self.appender.forget_current_file()
        self.queue.close()

