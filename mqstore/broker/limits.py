"""Limits on what one client can take from a broker's listeners (docs/security.md): how many
connections in total and from one address (``ConnectionCounter`` in one process,
``BrokerConnectionCounter`` across a broker's front processes), how long a connection may be
idle or take to send a frame (``housekeeping``), and how many log lines a stream of refusals may
write (``LogLimiter``). Shared by the fronts and the NameServer.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from mqstore.broker._conns import ADMITTED, OVER_TOTAL, ConnectionTable, table_size

__all__ = ["BrokerConnectionCounter", "ConnectionCounter", "FRAME_TIMEOUT_S", "IP_SLOTS", "LogLimiter", "Watched",
           "connection_table", "housekeeping", "next_frame_started", "stale"]

#: a frame begun must arrive whole within this long (a client trickling a byte at a time holds no
#: connection for long: RocketMQ's only bound is the 120 s idle close, which such a client resets)
FRAME_TIMEOUT_S = 60.0
#: the per-address counters of each front in a broker's connection table: two addresses whose
#: hash falls in one counter share max_connections_per_ip (refused early, never late)
IP_SLOTS = 1024


class ConnectionCounter:
    """Open connections of one process, in total and by source address, against the two caps
    (the NameServer's)."""

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


def connection_table(fronts: int, ip_slots: int = IP_SLOTS) -> int:
    """A broker's connection table for ``fronts`` front processes (``mqstore.broker._conns``), laid out
    in a memory file the broker's owner makes once: its file descriptor, which every front (and a
    front restarted) inherits as it inherits the listening socket. Nothing is on disk; it goes
    with the last process holding it."""
    fd = os.memfd_create("mqstore-connections")
    try:
        size = table_size(fronts, ip_slots)
        os.ftruncate(fd, size)
        region = mmap.mmap(fd, size)
        ConnectionTable.format(region, fronts, ip_slots)  # (the table made here is gone before the close)
        region.close()
    except BaseException:
        os.close(fd)
        raise
    return fd


class BrokerConnectionCounter:
    """ConnectionCounter's caps over a whole broker: front ``front`` counts its connections in
    its own array of the broker's connection table (``connection_table``'s fd) and admits one
    when every front's sum is under the caps. Starting, it zeroes its array: a killed front's
    connections died with it. Two fronts admitting at once may both take the last place (the
    broker then holds one over per front accepting at that moment), and addresses sharing a
    counter (IP_SLOTS) share max_connections_per_ip."""

    def __init__(self, fd: int, front: int, max_total: int, max_per_ip: int) -> None:
        self.max_total = max_total
        self.max_per_ip = max_per_ip
        self.front = front
        self._region = mmap.mmap(fd, os.fstat(fd).st_size)
        self.table = ConnectionTable(self._region)
        self.table.reset(front)

    @property
    def total(self) -> int:
        """The broker's open connections."""
        return self.table.total()

    def admit(self, ip: str) -> str | None:
        """Count a new connection from ip; or what it would exceed (then it is not counted)."""
        verdict = self.table.admit(self.front, ip, self.max_total, self.max_per_ip)
        if verdict == ADMITTED:
            return None
        if verdict == OVER_TOTAL:
            return f"{self.table.total()} connections open to the broker (max_connections {self.max_total})"
        return (f"{self.table.held(ip)} connections open to the broker from {ip} "
                f"(max_connections_per_ip {self.max_per_ip})")

    def release(self, ip: str) -> None:
        self.table.release(self.front, ip)


class Watched(Protocol):
    """What ``housekeeping`` reads of a connection (the fronts' and the NameServer's)."""

    @property
    def peer_addr(self) -> str: ...
    @property
    def last_active(self) -> float:
        """time.monotonic() of its last bytes in (or answer out)."""
    @property
    def frame_started(self) -> float:
        """When the bytes of a frame not yet whole began (``next_frame_started``; 0: none)."""
    @property
    def busy(self) -> bool:
        """The server owes it an answer (a held pull, a forwarded request): not idle."""
    @property
    def paused(self) -> bool:
        """Not being read (its answers wait for it): its frame cannot arrive."""
    @property
    def buffered(self) -> int:
        """Bytes of the frame not yet whole."""
    def abort(self) -> None: ...


def next_frame_started(started: float, buffered: int, took: bool, now: float) -> float:
    """A connection's ``frame_started`` after its bytes were read into frames: 0 when none are
    left, ``now`` when the bytes left begin a new frame (frames were taken) or none had begun."""
    if not buffered:
        return 0.0
    return now if took or not started else started


def stale(conn: Watched, now: float, idle_s: float) -> str | None:
    """Why the housekeeping closes conn at ``now``: silent for ``idle_s``
    (server_channel_max_idle_time_seconds, NettyServerConfig's IdleStateHandler), or a frame not
    whole after FRAME_TIMEOUT_S (the idle time when shorter); None while it may stay."""
    if conn.busy:
        return None
    if now - conn.last_active >= idle_s:
        return f"idle for {idle_s:g} s (server_channel_max_idle_time_seconds)"
    frame_s = min(FRAME_TIMEOUT_S, idle_s)
    if conn.frame_started and not conn.paused and now - conn.frame_started >= frame_s:
        return f"a frame not whole after {frame_s:g} s ({conn.buffered} bytes)"
    return None


async def housekeeping(conns: Callable[[], Iterable[Watched]], idle_s: float, refusals: LogLimiter,
                       stopped: Callable[[], bool]) -> None:
    """Until ``stopped()``: every second (a quarter of idle_s when shorter), abort the connections
    ``stale`` names, each logged within ``refusals``' budget. Aborted, not closed: a client that
    reads nothing would otherwise keep its connection while its unsent answers wait."""
    while not stopped():
        await asyncio.sleep(min(1.0, idle_s / 4))
        now = time.monotonic()
        for conn in list(conns()):
            why = stale(conn, now, idle_s)
            if why is not None:
                refusals.warning("closing the connection from %s: %s", conn.peer_addr, why)
                conn.abort()


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
