"""Pure-Python twin (test oracle) of ``mqstore.broker._conns``: a broker's connection counts, one slot
array per front process in a shared buffer, admitted against the sums over every front.

Layout (native 64-bit integers): a 64-byte header (magic "MQCONNS1", fronts, ip_slots, stride),
then front k's array at 64 + k * stride: its open connections, then ip_slots counters indexed by
FNV-1a 64 of the source address's UTF-8 text modulo ip_slots; stride is 8 * (1 + ip_slots)
rounded up to 64 bytes.
"""

from __future__ import annotations

__all__ = ["ADMITTED", "HEADER_SIZE", "OVER_PER_IP", "OVER_TOTAL", "ConnectionTable", "address_slot", "table_size"]

HEADER_SIZE = 64
ADMITTED, OVER_TOTAL, OVER_PER_IP = 0, 1, 2
MAGIC = int.from_bytes(b"MQCONNS1", "little")
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def _stride(ip_slots: int) -> int:
    return (8 * (1 + ip_slots) + 63) // 64 * 64


def table_size(fronts: int, ip_slots: int) -> int:
    if fronts < 1 or ip_slots < 1:
        raise ValueError(f"a connection table needs fronts >= 1 and ip_slots >= 1, not {fronts} and {ip_slots}")
    return HEADER_SIZE + fronts * _stride(ip_slots)


def _fnv1a(ip: str) -> int:
    h = _FNV_OFFSET
    for byte in ip.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def address_slot(ip: str, ip_slots: int) -> int:
    if ip_slots < 1:
        raise ValueError(f"ip_slots must be >= 1, not {ip_slots}")
    return _fnv1a(ip) % ip_slots


class ConnectionTable:
    def __init__(self, buffer: bytearray | memoryview) -> None:
        self.cells = memoryview(buffer).cast("B")
        if len(self.cells) < HEADER_SIZE:
            raise ValueError(f"a connection table is at least {HEADER_SIZE} bytes, not {len(self.cells)}")
        self.q = self.cells[:len(self.cells) // 8 * 8].cast("q")
        if self.q[0] & 0xFFFFFFFFFFFFFFFF != MAGIC:
            raise ValueError("not a connection table (no MQCONNS1 magic): lay it out with ConnectionTable.format")
        self.fronts, self.ip_slots, stride = self.q[1], self.q[2], self.q[3]
        if (self.fronts < 1 or self.ip_slots < 1 or stride != _stride(self.ip_slots)
                or len(self.cells) < table_size(self.fronts, self.ip_slots)):
            raise ValueError(f"a damaged connection table header (fronts {self.fronts}, ip_slots {self.ip_slots}, "
                             f"stride {stride}, {len(self.cells)} bytes)")
        self.stride_q = stride // 8

    @staticmethod
    def format(buffer: bytearray | memoryview, fronts: int, ip_slots: int) -> ConnectionTable:
        size = table_size(fronts, ip_slots)
        cells = memoryview(buffer).cast("B")
        if len(cells) < size:
            raise ValueError(f"a connection table of {fronts} fronts and {ip_slots} slots needs {size} bytes, "
                             f"not {len(cells)}")
        cells[:size] = bytes(size)
        q = cells[:size].cast("q")
        q[1], q[2], q[3] = fronts, ip_slots, _stride(ip_slots)
        q[0] = MAGIC
        return ConnectionTable(buffer)

    def _cell(self, front: int, cell: int) -> int:
        if not 0 <= front < self.fronts:
            raise IndexError(f"front {front} of a table of {self.fronts} fronts")
        return HEADER_SIZE // 8 + front * self.stride_q + cell

    def _sum(self, cell: int) -> int:
        return sum(self.q[HEADER_SIZE // 8 + k * self.stride_q + cell] for k in range(self.fronts))

    def reset(self, front: int) -> None:
        first = self._cell(front, 0)
        for i in range(1 + self.ip_slots):
            self.q[first + i] = 0

    def admit(self, front: int, ip: str, max_total: int, max_per_ip: int) -> int:
        total, cell = self._cell(front, 0), 1 + address_slot(ip, self.ip_slots)
        if self._sum(0) >= max_total:
            return OVER_TOTAL
        if self._sum(cell) >= max_per_ip:
            return OVER_PER_IP
        self.q[total] += 1
        self.q[total + cell] += 1
        return ADMITTED

    def release(self, front: int, ip: str) -> bool:
        total, cell = self._cell(front, 0), 1 + address_slot(ip, self.ip_slots)
        if self.q[total + cell] <= 0 or self.q[total] <= 0:
            return False
        self.q[total + cell] -= 1
        self.q[total] -= 1
        return True

    def total(self) -> int:
        return self._sum(0)

    def held(self, ip: str) -> int:
        return self._sum(1 + address_slot(ip, self.ip_slots))

    def front_total(self, front: int) -> int:
        return int(self.q[self._cell(front, 0)])
