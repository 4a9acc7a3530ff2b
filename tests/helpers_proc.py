"""Running a test function in a child process (a fresh interpreter, spawned): what a second
process of a user's program does to a store another process owns; and waiting for what other
processes do (``wait_until``)."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "the condition", *,
               every_s: float = 0.02) -> Any:
    """The predicate's first truthy value, polled every every_s; AssertionError naming `what`
    (and the last value) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s (last: {value!r})"
        time.sleep(every_s)


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
