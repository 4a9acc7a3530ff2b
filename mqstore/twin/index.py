"""Pure-Python twin (test oracle) of the IndexFile kernel ``mqstore.queue._index``.

Follows spec §4.1-§4.3 of ``docs/rocketmq-store-spec.md``, i.e. Apache RocketMQ 4.9.7
``IndexFile`` / ``IndexHeader``, line by line, over a ``bytearray`` with the same layout:
a 40-byte header (beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount,
indexCount), ``hash_slot_num`` 4-byte slots, ``index_num`` 20-byte entries (keyHash,
commitLogOffset, timeDiff seconds, previous entry). Big-endian; Java long arithmetic wraps
and integer division truncates toward zero (Appendix B).

Written for clarity, not speed. The kernel's documented deviations are reproduced: a chain
walk stops after indexCount steps; an entry number (a slot's value, a previous-entry number)
is valid only in [1, indexCount) (RocketMQ also follows indexCount itself, past the end of a
full file); and an indexCount read from a header is clamped to [1, index_num].
"""

from __future__ import annotations

import struct

from mqstore.twin.codec import java_string_hash

__all__ = ["INDEX_HEADER_SIZE", "HASH_SLOT_SIZE", "INDEX_SIZE", "index_key_hash", "index_file_size", "IndexFile"]

INDEX_HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_SIZE = 20
INVALID_INDEX = 0

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1

# header field offsets (spec §4.1)
_BEGIN_TS, _END_TS, _BEGIN_PHY, _END_PHY, _SLOT_COUNT, _INDEX_COUNT = 0, 8, 16, 24, 32, 36


def _to_long(value: int) -> int:
    """Wrap an arbitrary Python int to a Java long (two's complement, 64 bits)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def _java_div(a: int, b: int) -> int:
    """Java integer division: truncates toward zero (Python's // floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def index_key_hash(key: str) -> int:
    """IndexFile.indexKeyHashMethod: Math.abs(key.hashCode()), and 0 if that is still negative
    (abs(Integer.MIN_VALUE) == Integer.MIN_VALUE)."""
    h = java_string_hash(key)
    positive = abs(h)
    return 0 if positive > _INT_MAX else positive


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + HASH_SLOT_SIZE * hash_slot_num + INDEX_SIZE * index_num


class IndexFile:
    """One index file over ``data`` (a new zero-filled bytearray unless given).

    Like the kernel's constructor: a header with indexCount 0 is initialised with
    begin = end = (end_phy_offset, end_timestamp) and indexCount 1; otherwise it is read."""

    def __init__(self, hash_slot_num: int, index_num: int, end_phy_offset: int = 0, end_timestamp: int = 0,
                 data: bytearray | None = None) -> None:
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        size = index_file_size(hash_slot_num, index_num)
        self.data = bytearray(size) if data is None else data
        if len(self.data) != size:
            raise ValueError(f"index data is {len(self.data)} bytes, expected {size}")
        if self._i32(_INDEX_COUNT) >= 1:
            self._read_header()
            return
        self.begin_timestamp = self.end_timestamp = end_timestamp
        self.begin_phy_offset = self.end_phy_offset = end_phy_offset
        self.hash_slot_count = 0
        self.index_count = 1
        self._write_header()

    @classmethod
    def load(cls, hash_slot_num: int, index_num: int, data: bytearray) -> IndexFile:
        """An existing file: the header is read as it is (indexCount clamped to [1, index_num])."""
        f = cls.__new__(cls)
        f.hash_slot_num, f.index_num, f.data = hash_slot_num, index_num, data
        f._read_header()
        return f

    # -- bytes --------------------------------------------------------------------------------
    def _i32(self, pos: int) -> int:
        value: int = struct.unpack_from(">i", self.data, pos)[0]
        return value

    def _read_header(self) -> None:
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, count) = struct.unpack_from(">qqqqii", self.data, 0)
        self.index_count = min(max(1, count), self.index_num)

    def _write_header(self) -> None:
        struct.pack_into(">qqqqii", self.data, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                         self.end_phy_offset, self.hash_slot_count, self.index_count)

    def _slot_pos(self, key_hash: int) -> int:
        return INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE

    def _entry_pos(self, n: int) -> int:
        return INDEX_HEADER_SIZE + self.hash_slot_num * HASH_SLOT_SIZE + n * INDEX_SIZE

    # -- spec §4.2 ----------------------------------------------------------------------------
    @property
    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        return self.put_key_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_key_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        if self.index_count >= self.index_num:
            return False
        abs_slot_pos = self._slot_pos(key_hash)
        slot_value = self._i32(abs_slot_pos)
        if slot_value <= INVALID_INDEX or slot_value >= self.index_count:
            slot_value = INVALID_INDEX
        time_diff = _java_div(_to_long(store_timestamp - self.begin_timestamp), 1000)
        if self.begin_timestamp <= 0:
            time_diff = 0
        elif time_diff > _INT_MAX:
            time_diff = _INT_MAX
        elif time_diff < 0:
            time_diff = 0
        struct.pack_into(">iqii", self.data, self._entry_pos(self.index_count), key_hash, phy_offset, time_diff,
                         slot_value)
        struct.pack_into(">i", self.data, abs_slot_pos, self.index_count)
        if self.index_count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        if slot_value == INVALID_INDEX:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        self._write_header()
        return True

    # -- spec §4.3 ----------------------------------------------------------------------------
    def select_phy_offset(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        out: list[int] = []
        key_hash = index_key_hash(key)
        slot_value = self._i32(self._slot_pos(key_hash))
        if slot_value <= INVALID_INDEX or slot_value >= self.index_count or self.index_count <= 1:
            return out
        next_index = slot_value
        steps = 0
        while len(out) < max_num and steps < self.index_count:
            steps += 1
            key_hash_read, phy_read, time_diff, prev_index = struct.unpack_from(">iqii", self.data,
                                                                               self._entry_pos(next_index))
            if time_diff < 0:
                break
            time_read = _to_long(self.begin_timestamp + time_diff * 1000)
            if key_hash == key_hash_read and begin <= time_read <= end:
                out.append(phy_read)
            if (prev_index <= INVALID_INDEX or prev_index >= self.index_count or prev_index == next_index
                    or time_read < begin):
                break
            next_index = prev_index
        return out

    def is_time_matched(self, begin: int, end: int) -> bool:
        return ((begin < self.begin_timestamp and end > self.end_timestamp)
                or self.begin_timestamp <= begin <= self.end_timestamp
                or self.begin_timestamp <= end <= self.end_timestamp)
