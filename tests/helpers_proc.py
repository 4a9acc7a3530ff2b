"""Running a test function in a child process (a fresh interpreter, spawned): what a second
process of a user's program does to a store another process owns."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def run_in_child(target: Callable[..., Any], *args: Any, timeout_s: float = 120) -> int:
    """Run target(*args) in a spawned process; its exit code (killed after timeout_s: -9)."""
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
    assert proc.exitcode is not None
    return proc.exitcode
