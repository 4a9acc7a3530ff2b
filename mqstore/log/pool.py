"""The transient store pool of a store (spec §7): where it lives, how the owner
creates it, how other processes attach to it, and what a new owner does with the pool of an
owner that died.

With ``transient_store_pool_enable`` writers append into write buffers in shared memory
(``mqstore.log._shm.TransientStorePool``: one file on ``/dev/shm`` per store, buffer i holds
every CommitLog file whose index is i modulo the pool size), and the commit service
(``mqstore.services.flush.CommitRealTimeService``: a thread of the owner, or of the flusher
process in a node) copies the bytes between the committed and the wrote positions into the
mapped CommitLog files. Readers (dispatch, gets, followers) only see committed bytes.

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

from mqstore.layout import file_start_of
from mqstore.log import _shm
from mqstore.errors import ConfigError

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.log.mapped_file_queue import MappedFileQueue

log = logging.getLogger("mqstore.pool")

#: where pools live: a memory file system, so buffers never go to the disk
POOL_DIR = "/dev/shm"


def pool_path(root: str) -> str:
    """The pool file of the store at root: named after the store directory's device and inode,
    so every process that opens the directory finds the same one."""
    st = os.stat(root)
    return os.path.join(POOL_DIR, f"mqstore-pool-{st.st_dev:x}-{st.st_ino:x}")


def create_pool(root: str, ctl: _shm.ControlBlock, config: StoreConfig) -> _shm.TransientStorePool:
    """The owner's new pool, tied to its control block. ConfigError names what is missing when
    the memory file system cannot hold it."""
    buffers, file_size = config.transient_store_pool_size, config.mapped_file_size_commit_log
    if not os.path.isdir(POOL_DIR):
        raise ConfigError(f"transient_store_pool_enable=true needs {POOL_DIR} (a tmpfs) for the shared write "
                          "buffers, and this machine has none", hint="set transient_store_pool_enable=false")
    need = buffers * file_size
    st = os.statvfs(POOL_DIR)
    if st.f_bavail * st.f_frsize < need:
        raise ConfigError(f"the transient store pool needs {need} bytes on {POOL_DIR} (transient_store_pool_size="
                          f"{buffers} x mapped_file_size_commit_log={file_size}), and it has "
                          f"{st.f_bavail * st.f_frsize} free",
                          hint="lower transient_store_pool_size or mapped_file_size_commit_log")
    path = pool_path(root)
    try:
        pool = _shm.TransientStorePool.create(path, buffers, file_size, ctl.created_ms, ctl.owner_pid)
    except OSError as exc:
        raise ConfigError(f"cannot create the transient store pool {path}: {exc.strerror or exc}",
                          hint="set transient_store_pool_enable=false") from exc
    if not pool.locked:
        # RocketMQ mlocks each buffer and only logs a failure; so do we
        log.warning("transient store pool %s: mlock of %d bytes failed (%s); buffers may be swapped out",
                    path, need, os.strerror(pool.lock_errno))
    return pool


def attach_pool(root: str, ctl: _shm.ControlBlock) -> _shm.TransientStorePool | None:
    """The owner's pool, for a process that attaches to the store (None: the store has none)."""
    if ctl.pool_buffers == 0:
        return None
    pool = _shm.TransientStorePool.attach(pool_path(root), ctl.created_ms, ctl.owner_pid)
    if pool.buffers != ctl.pool_buffers or pool.file_size != ctl.file_size:
        pool.close()
        raise ValueError(f"{pool_path(root)} holds {pool.buffers} x {pool.file_size} bytes; the control block says "
                         f"{ctl.pool_buffers} x {ctl.file_size}")
    return pool


def remove_pool(root: str) -> None:
    try:
        os.unlink(pool_path(root))
    except FileNotFoundError:
        pass


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


def replay(root: str, ctl_path: str, commit_log_dir: str) -> int:
    """Before a new owner recovers: copy what a dead owner's writers appended to the pool but
    its commit service had not committed into the CommitLog files. Returns the bytes copied.

    Runs after the old control block was fenced (no process writes into the pool any more).
    Only a pool that belongs to the old block (same creation time and owner pid) is used;
    the old pool file is removed afterwards. Recovery then checks what was copied like any
    other bytes of the log (records parse, CRCs)."""
    path = pool_path(root)
    if not os.path.exists(path) or not os.path.exists(ctl_path):
        return 0
    copied = 0
    try:
        old = _shm.ControlBlock.attach(ctl_path)
    except (OSError, ValueError):
        old = None
    if old is not None:
        try:
            pos = old.positions()
            committed, wrote = pos["committed"], pos["wrote"]
            if old.pool_buffers > 0 and wrote > committed:
                from mqstore.log.mapped_file_queue import MappedFileQueue

                queue = MappedFileQueue(commit_log_dir, old.file_size)
                try:
                    copied = _replay_from(path, old, queue, committed, wrote)
                finally:
                    queue.close()
        finally:
            old.close()
    remove_pool(root)
    return copied


def _replay_from(path: str, old: _shm.ControlBlock, queue: MappedFileQueue, committed: int, wrote: int) -> int:
    try:
        pool = _shm.TransientStorePool.attach(path, old.created_ms, old.owner_pid)
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
