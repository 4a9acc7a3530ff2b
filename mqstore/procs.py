"""Process states read from /proc (Linux): what a process is doing, without signalling it."""

from __future__ import annotations

import os


def proc_stat(pid: int, tid: int | None = None) -> list[str]:
    """The fields of /proc/<pid>[/task/<tid>]/stat after the command name: [0] is the state,
    [11] / [12] user / system CPU in clock ticks, [16] the nice value (proc(5) numbers less 3).
    FileNotFoundError once the process (or thread) is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path, encoding="ascii") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def stopped(pid: int) -> bool:
    """True when every thread of pid is stopped (state T or t in /proc)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for tid in tasks:
        try:
            state = proc_stat(pid, int(tid))[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
        if state not in ("T", "t"):
            return False
    return True



def alive(pid: int) -> bool:
    """True while pid is a running process (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        return proc_stat(pid)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def dead_allocation(name: str) -> bool:
    """True for ``<name>.alloc<pid>`` (MappedFile.create's temporary name) whose pid is no
    longer running: the leftover of an allocation that died half way. A live pid's file is
    an allocation under way in another process of the node, which renames it when done."""
    head, sep, pid = name.rpartition(".alloc")
    return bool(sep) and head.isdigit() and pid.isdigit() and not alive(int(pid))
