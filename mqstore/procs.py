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

