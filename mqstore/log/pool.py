"""The transient store pool of a store (spec §7): where it lives, how the owner
creates it, how other processes attach to it, and what a new owner does with the pool of an
owner that died.

With ``transient_store_pool_enable`` writers append into write buffers in shared memory
(``mqstore.log._shm.TransientStorePool``: one file on ``/dev/shm`` per CommitLog, buffer i
holds every file of that log whose index is i modulo the pool size), and the commit service
(``mqstore.services.flush.CommitRealTimeService``: a thread of the owner, or of the flusher
process in a node, one per log) copies the bytes between the log's committed and wrote
positions into its mapped CommitLog files. Readers (dispatch, gets, followers) only see
committed bytes.

A store with several CommitLogs (``commit_log_count``) has a pool per log, each of
``transient_store_pool_size`` buffers: log 0's file is named as a store with one log names its
pool, log k's has ``-<k>`` after it (``pool_path``). Everything else (committed position,
commit service, replay) is per log as well.

Decision on a RocketMQ behaviour (documented in docs/node.md): RocketMQ's buffers are
process memory, so a broker that dies loses what was appended but not committed. Here the
pool outlives the processes that write into it, so the next owner copies the uncommitted
bytes of a dead owner's pool into the files before recovering them (``replay``); only a
machine crash (or a reboot, which empties ``/dev/shm``) loses them, as with any
asynchronous flush.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from mqstore.layout import file_start_of, log_base
from mqstore.log import _shm
from mqstore.errors import ConfigError

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.log.mapped_file_queue import MappedFileQueue

log = logging.getLogger("mqstore.pool")

#: where pools live: a memory file system, so buffers never go to the disk
POOL_DIR = "/dev/shm"


def pool_path(root: str, log: int = 0) -> str:
    """The pool file of CommitLog log of the store at root: named after the store directory's
    device and inode, so every process that opens the directory finds the same one (log 0's
    is the name a store with one CommitLog has always used)."""
    st = os.stat(root)
    name = f"mqstore-pool-{st.st_dev:x}-{st.st_ino:x}"
    return os.path.join(POOL_DIR, name if log == 0 else f"{name}-{log}")


def create_pools(root: str, ctl: _shm.ControlBlock, config: StoreConfig) -> list[_shm.TransientStorePool]:
    """The owner's new pools, one per CommitLog (log 0's first), tied to its control block.
    ConfigError names what is missing when the memory file system cannot hold them all (the
    pools made before a failure are closed and removed)."""
    buffers, file_size = config.transient_store_pool_size, config.mapped_file_size_commit_log
    count = config.commit_log_count
    if not os.path.isdir(POOL_DIR):
        raise ConfigError(f"transient_store_pool_enable=true needs {POOL_DIR} (a tmpfs) for the shared write "
                          "buffers, and this machine has none", hint="set transient_store_pool_enable=false")
    need = buffers * file_size
    st = os.statvfs(POOL_DIR)
    if st.f_bavail * st.f_frsize < need * count:
        logs = f" x commit_log_count={count} (a pool per CommitLog)" if count > 1 else ""
        raise ConfigError(f"the transient store pool needs {need * count} bytes on {POOL_DIR} (transient_store_pool_size="
                          f"{buffers} x mapped_file_size_commit_log={file_size}{logs}), and it has "
                          f"{st.f_bavail * st.f_frsize} free",
                          hint="lower transient_store_pool_size or mapped_file_size_commit_log")
    pools: list[_shm.TransientStorePool] = []
    try:
        for k in range(count):
            path = pool_path(root, k)
            try:
                pool = _shm.TransientStorePool.create(path, buffers, file_size, ctl.created_ms, ctl.owner_pid, log=k)
            except OSError as exc:
                raise ConfigError(f"cannot create the transient store pool {path}: {exc.strerror or exc}",
                                  hint="set transient_store_pool_enable=false") from exc
            pools.append(pool)
            if not pool.locked:
                # RocketMQ mlocks each buffer and only logs a failure; so do we
                log.warning("transient store pool %s: mlock of %d bytes failed (%s); buffers may be swapped out",
                            path, need, os.strerror(pool.lock_errno))
    except BaseException:
        for pool in pools:
            pool.close()
        remove_pools(root, count)
        raise
    return pools


def attach_pool(root: str, ctl: _shm.ControlBlock, log: int = 0) -> _shm.TransientStorePool | None:
    """The owner's pool of CommitLog log, for a process that attaches to the store (None: the
    store has none)."""
    if ctl.pool_buffers == 0:
        return None
    path = pool_path(root, log)
    pool = _shm.TransientStorePool.attach(path, ctl.created_ms, ctl.owner_pid, log=log)
    if pool.buffers != ctl.pool_buffers or pool.file_size != ctl.file_size:
        pool.close()
        raise ValueError(f"{path} holds {pool.buffers} x {pool.file_size} bytes; the control block says "
                         f"{ctl.pool_buffers} x {ctl.file_size}")
    return pool


def attach_pools(root: str, ctl: _shm.ControlBlock) -> list[_shm.TransientStorePool]:
    """Every CommitLog's pool of the owner, by log id (empty: the store has none)."""
    pools: list[_shm.TransientStorePool] = []
    try:
        for k in range(ctl.log_count):
            pool = attach_pool(root, ctl, k)
            if pool is None:
                return []
            pools.append(pool)
    except BaseException:
        for pool in pools:
            pool.close()
        raise
    return pools


def remove_pool(root: str, log: int = 0) -> None:
    try:
        os.unlink(pool_path(root, log))
    except FileNotFoundError:
        pass


def remove_pools(root: str, count: int) -> None:
    """Remove the pool files of CommitLogs 0 .. count - 1."""
    for k in range(count):
        remove_pool(root, k)


def commit_range(pool: _shm.TransientStorePool, queue: MappedFileQueue, start: int, end: int) -> None:
    """Copy [start, end) of the log from the pool's buffers into the mapped CommitLog files
    (several files when the range crosses a boundary). A file that is not there raises
    OSError: bytes that were written must have a file to go to."""
    file_size = pool.file_size
    if queue.mapped_end < end:
        queue.map_new_files()
    pos = start
    while pos < end:
        file_from = file_start_of(pos, file_size)
        stop = min(end, file_from + file_size)
        mf = queue.get(file_from)
        if mf is None:
            raise FileNotFoundError(f"CommitLog file {file_from:020d} is missing: cannot commit [{pos}, {stop}) "
                                    "from the transient store pool")
        pool.commit_into(mf, pos - file_from, stop - file_from)
        pos = stop


def replay(root: str, ctl_path: str, config: StoreConfig) -> int:
    """Before a new owner recovers: copy what a dead owner's writers appended to the pools but
    its commit services had not committed into the CommitLog files, each log's pool into its
    own files. Returns the bytes copied (over every log).

    Runs after the old control block was fenced (no process writes into the pools any more).
    Only a pool that belongs to the old block (same creation time and owner pid) and to its
    log is used; the old pool files are removed afterwards. Recovery then checks what was
    copied like any other bytes of the log (records parse, CRCs)."""
    count = config.commit_log_count
    paths = [pool_path(root, k) for k in range(count)]
    if not any(os.path.exists(path) for path in paths) or not os.path.exists(ctl_path):
        remove_pools(root, count)
        return 0
    copied = 0
    try:
        old = _shm.ControlBlock.attach(ctl_path)
    except (OSError, ValueError):
        old = None
    if old is not None:
        try:
            if old.pool_buffers > 0 and old.file_size == config.mapped_file_size_commit_log:
                for k in range(min(count, old.log_count)):
                    copied += _replay_log(root, old, config, k, paths[k])
        finally:
            old.close()
    remove_pools(root, count)
    return copied


def _replay_log(root: str, old: _shm.ControlBlock, config: StoreConfig, k: int, path: str) -> int:
    """replay for CommitLog k, whose pool file is path."""
    pos = old.positions(k)
    committed, wrote = pos["committed"], pos["wrote"]
    if wrote <= committed or not os.path.exists(path):
        return 0
    from mqstore.log.mapped_file_queue import MappedFileQueue

    # (as mqstore.log.commitlog.commit_log_files, which imports this module)
    queue = MappedFileQueue(config.commit_log_dirs(root)[k], old.file_size, base=log_base(k),
                            fenced=config.commit_log_count > 1 and k == 0)
    try:
        return _replay_from(path, old, queue, committed, wrote, k)
    finally:
        queue.close()


def _replay_from(path: str, old: _shm.ControlBlock, queue: MappedFileQueue, committed: int, wrote: int,
                 k: int = 0) -> int:
    try:
        pool = _shm.TransientStorePool.attach(path, old.created_ms, old.owner_pid, log=k)
    except (OSError, ValueError) as exc:
        log.warning("transient store pool %s not replayed: %s", path, exc)
        return 0
    try:
        if wrote - committed > pool.buffers * pool.file_size:
            log.warning("transient store pool %s not replayed: %d uncommitted bytes are more than the pool holds",
                        path, wrote - committed)
            return 0
        try:
            queue.map_new_files()
        except (OSError, ValueError) as exc:
            log.warning("transient store pool %s not replayed: the CommitLog files do not map (%s)", path, exc)
            return 0
        # bytes go only into files that exist, from the committed position on, in order
        end = committed
        while end < wrote and queue.get(file_start_of(end, pool.file_size)) is not None:
            end = min(wrote, file_start_of(end, pool.file_size) + pool.file_size)
        commit_range(pool, queue, committed, end)
        for mf in queue.files_between(committed, end):
            mf.flush_range(0, mf.file_size)
        log.warning("copied %d bytes [%d, %d) that the previous owner appended but had not committed from the "
                    "transient store pool %s into the CommitLog", end - committed, committed, end, path)
        return end - committed
    finally:
        pool.close()
