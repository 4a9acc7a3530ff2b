"""The store directory as a thing on disk, before any store opens it: whether a path can be a
store, who owns it (the OFD lock on its ``lock`` file, the ``abort`` file), and taking that lock.
Used by the store itself and by every reader and tool that must not open it (snapshot, stats,
the commands, the Spark jobs)."""

from __future__ import annotations

import os
from typing import Any

from mqstore.log import _shm
from mqstore.errors import NotAStoreError, StoreLockedError
from mqstore.layout import ABORT_NAME, COMMITLOG_DIR, CONTROL_BLOCK_NAME, LOCK_NAME, STORE_ENTRIES

__all__ = ["check_store_dir", "lock_state", "release_store_lock", "replace_file", "require_store", "take_store_lock"]


def replace_file(path: str, text: str, *, fsync: bool = False, mode: int = 0o666) -> None:
    """Write text to path whole and atomically: into ``<path>.tmp<pid>`` beside it (fsync'd when
    asked; created with ``mode``, less the umask: 0o600 keeps a secret to its owner), then renamed
    over it, so a reader sees the old file or the new one, never part of one. On failure the
    temporary file is removed and the error raised."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w", encoding="utf-8") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def check_store_dir(root: str) -> None:
    """Raise NotAStoreError if root exists but cannot be a store: a file, a non-empty
    directory holding none of a store's entries, or a 'commitlog' that is not a directory."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotAStoreError(f"{root} is a file, not a store directory")
    if not os.path.isdir(root):
        return
    entries = set(os.listdir(root))
    if entries and not entries & STORE_ENTRIES:
        shown = ", ".join(sorted(entries)[:5])
        raise NotAStoreError(f"{root} is not empty and holds no store files (found: {shown})")
    commitlog = os.path.join(root, COMMITLOG_DIR)
    if os.path.exists(commitlog) and not os.path.isdir(commitlog):
        raise NotAStoreError(f"{commitlog} is not a directory")


def require_store(root: str) -> str:
    """Absolute path of root if it looks like a store directory; NotAStoreError otherwise."""
    root = os.path.abspath(root)
    if not os.path.exists(root):
        raise NotAStoreError(f"{root} does not exist")
    check_store_dir(root)  # a file, foreign files only, commitlog not a directory
    if not os.listdir(root):
        raise NotAStoreError(f"{root} is an empty directory")
    return root


def lock_state(root: str) -> dict[str, Any]:
    """Who owns root: the lock file, whether a running store holds its OFD lock, the abort file.

    ``status`` is "running" (lock held), "crashed" (abort file left, lock free: the next open
    recovers), "clean" (shut down cleanly) or "new" (no lock file: never opened by a store)."""
    lock_path = os.path.join(root, LOCK_NAME)
    held = False
    if os.path.exists(lock_path):
        fd = os.open(lock_path, os.O_RDONLY)  # F_OFD_GETLK only tests; it takes nothing
        try:
            held = _shm.ofd_is_locked(fd)
        finally:
            os.close(fd)
    abort = os.path.exists(os.path.join(root, ABORT_NAME))
    status = ("running" if held else "crashed" if abort else
              "clean" if os.path.exists(lock_path) else "new")
    return {"status": status, "lock_file": os.path.exists(lock_path), "lock_held": held, "abort_file": abort}


def take_store_lock(root: str) -> int:
    """Take root's ``lock`` file's OFD lock, as RocketMQ's broker locks the store; the fd holds
    it until release_store_lock. StoreLockedError (naming the owner's pid when its control
    block says) if a running store holds it."""
    fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    if not _shm.ofd_lock(fd):
        os.close(fd)
        owner = ""
        try:
            owner = f" (pid {_shm.ControlBlock.attach(os.path.join(root, CONTROL_BLOCK_NAME)).owner_pid})"
        except (OSError, ValueError):
            pass
        raise StoreLockedError(f"{root} is owned by another running store{owner}")
    os.pwrite(fd, b"lock", 0)
    return fd


def release_store_lock(fd: int) -> None:
    _shm.ofd_unlock(fd)
    os.close(fd)
