"""Twin of mqstore.ha._ha: RocketMQ's replication wire format (docs/rocketmq-remoting-spec.md §4.3),
with struct, plainly: 8-byte big-endian reports from the slave, 12-byte headers (int64 offset,
int32 size) and the CommitLog bytes from the master."""

from __future__ import annotations

import struct

HEADER_SIZE = 12
REPORT_SIZE = 8
READ_BUFFER_SIZE = 4 * 1024 * 1024


def header(phy_offset: int, size: int) -> bytes:
    return struct.pack(">qi", phy_offset, size)


def report(offset: int) -> bytes:
    return struct.pack(">q", offset)


def last_report(buf: bytes | bytearray | memoryview, start: int, end: int) -> tuple[int, int]:
    if start < 0 or end > len(buf) or start > end:
        raise ValueError(f"[{start}, {end}) is not inside the {len(buf)}-byte buffer")
    whole = (end - start) // 8 * 8
    if whole == 0:
        return -1, start
    return struct.unpack_from(">q", buf, start + whole - 8)[0], start + whole


class SlaveReader:
    def __init__(self, capacity: int = READ_BUFFER_SIZE) -> None:
        if capacity < 64:
            raise ValueError(f"a read buffer of {capacity} bytes is too small")
        self.capacity = capacity
        self.data = b""

    @property
    def buffered(self) -> int:
        return len(self.data)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if len(self.data) + len(data) > self.capacity:
            raise ValueError("the read buffer is full of one unfinished frame")
        self.data += bytes(data)

    def next(self) -> tuple[int, bytes] | None:
        if len(self.data) < 12:
            return None
        phy, size = struct.unpack_from(">qi", self.data)
        if size < 0 or size > self.capacity - 12:
            raise ValueError(f"a frame of {size} bytes at CommitLog offset {phy}: it cannot fit the "
                             f"{self.capacity}-byte read buffer")
        if len(self.data) < 12 + size:
            return None
        body, self.data = self.data[12:12 + size], self.data[12 + size:]
        return phy, body
