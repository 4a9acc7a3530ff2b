"""A stop request that a Python signal handler may raise.

``threading.Event.set()`` in a signal handler can hang the process for good: Python runs the
handler on the main thread between two bytecodes, and if that thread is inside the same
Event's ``wait()`` (which holds the Event's non-reentrant lock for a few bytecodes after each
timeout) the handler blocks on a lock its own thread holds. A service process polling
``stop.wait(0.2)`` hit it about once in a few thousand SIGTERMs and was killed after 30 s,
leaving ``abort`` behind.

``StopRequest.set()`` takes no lock: it sets a flag and writes one byte to a pipe (a
non-blocking ``os.write``), and ``wait()`` sleeps in ``select`` on that pipe, so a signal ends
the wait at once.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Callable, Iterable
from types import FrameType


class StopRequest:
    """Set by signal handlers (or any thread), waited for by the main loop."""

    def __init__(self) -> None:
        self._requested = False
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        self._requested = True
        try:
            os.write(self._write_fd, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending already) or closed

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout_s: float) -> bool:
        """Wait until set or timeout_s passes; True once set."""
        if not self._requested:
            try:
                select.select([self._read_fd], [], [], timeout_s)
            except (OSError, ValueError):
                pass  # closed: report what is known
        return self._requested

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._read_fd = self._write_fd = -1

    def on_signals(self, signals: Iterable[signal.Signals],
                   then: Callable[[signal.Signals], None] | None = None) -> None:
        """Install a handler for each signal that sets this request (after calling then(signal),
        e.g. to log; then must not wait for a lock the main thread may hold)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            if then is not None:
                then(signal.Signals(signum))
            self.set()

        for sig in signals:
            signal.signal(sig, handler)
