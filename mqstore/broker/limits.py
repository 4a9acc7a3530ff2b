"""Limits on what one client can take from a broker's listeners (docs/security.md): how many
connections in total and from one address, and how many log lines a stream of refusals may
write. Shared by the fronts and the NameServer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["ConnectionCounter", "FRAME_TIMEOUT_S", "LogLimiter"]

#: a frame begun must arrive whole within this long (a client trickling a byte at a time holds no
#: connection for long: RocketMQ's only bound is the 120 s idle close, which such a client resets)
FRAME_TIMEOUT_S = 60.0


class ConnectionCounter:
    """Open connections, in total and by source address, against the two caps."""

    def __init__(self, max_total: int, max_per_ip: int) -> None:
        self.max_total = max_total
        self.max_per_ip = max_per_ip
        self.total = 0
        self.by_ip: dict[str, int] = {}

    def admit(self, ip: str) -> str | None:
        """Count a new connection from ip; or what it would exceed (then it is not counted)."""
        if self.total >= self.max_total:
            return f"{self.total} connections open (max_connections {self.max_total})"
        held = self.by_ip.get(ip, 0)
        if held >= self.max_per_ip:
            return f"{held} connections open from {ip} (max_connections_per_ip {self.max_per_ip})"
        self.total += 1
        self.by_ip[ip] = held + 1
        return None

    def release(self, ip: str) -> None:
        held = self.by_ip.get(ip, 0)
        if held <= 0:
            return
        self.total -= 1
        if held == 1:
            del self.by_ip[ip]
        else:
            self.by_ip[ip] = held - 1


class LogLimiter:
    """At most ``burst`` lines per ``window_s`` seconds through ``logger``; the lines held back are
    counted and said in one line when the next window lets a line through, so a flood of bad
    frames or refused connections cannot fill the disk with the log."""

    def __init__(self, logger: logging.Logger, *, burst: int = 20, window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self._window_start = -1e18
        self._lines = 0
        self.suppressed = 0  # held back since the last line that went through
        self.suppressed_total = 0

    def log(self, level: int, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log the line if the window allows it (True), else count it (False)."""
        now = self.clock()
        if now - self._window_start >= self.window_s:
            self._window_start = now
            self._lines = 0
        if self._lines >= self.burst:
            self.suppressed += 1
            self.suppressed_total += 1
            return False
        self._lines += 1
        if self.suppressed:
            self.logger.log(level, "(%d similar lines were not logged in the last %.0f s)", self.suppressed,
                            self.window_s)
            self.suppressed = 0
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, msg, *args)

    def exception(self, msg: str, *args: object) -> bool:
        return self.log(logging.ERROR, msg, *args, exc_info=True)
