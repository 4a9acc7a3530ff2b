"""RocketMQ's replication wire format (docs/rocketmq-remoting-spec.md §4.3): 8-byte big-endian
reports from the slave; 12-byte headers (int64 phyOffset, int32 bodySize) and CommitLog bytes
from the master. Twin: mqstore/twin/ha.py."""

import socket

from typing_extensions import disjoint_base

HEADER_SIZE: int
REPORT_SIZE: int
READ_BUFFER_SIZE: int

def header(phy_offset: int, size: int) -> bytes:
    """The master's 12-byte frame header: the chunk's CommitLog offset and its size."""

def report(offset: int) -> bytes:
    """The slave's 8-byte report: its CommitLog end."""

def last_report(buf: bytes | bytearray | memoryview, start: int, end: int) -> tuple[int, int]:
    """(value, consumed) of the reports in buf[start:end]: the last whole 8-byte value counted
    from start (ReadSocketService reads only that one) and where the whole values end; (-1,
    start) when fewer than 8 bytes are there."""

@disjoint_base
class SlaveReader:
    """The slave's receive buffer (HAClient's byteBufferRead): ``recv_into(sock)`` reads into
    it, ``next()`` hands out the next whole frame as (phy_offset, body view), None when the
    rest has not arrived. A body view is valid until the next ``recv_into``."""

    def __init__(self, capacity: int = ...) -> None: ...
    @property
    def buffered(self) -> int:
        """Bytes received and not handed out yet."""
    def recv_into(self, sock: socket.socket) -> int:
        """One recv into the free part of the buffer; its byte count (0: the peer closed)."""
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes as if received (tests, and the twin parity)."""
    def next(self) -> tuple[int, memoryview] | None:
        """(phy_offset, body) of the next whole frame, body a memoryview into the buffer; None
        when its bytes have not all arrived."""
