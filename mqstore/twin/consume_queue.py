"""Pure-Python twin (test oracle) of the ConsumeQueue unit scans of ``mqstore.queue._consumequeue``.

``order_break``: the recovery check (beyond RocketMQ) that a queue's real units follow each other
in the CommitLog (phyOffset >= the previous real unit's phyOffset + size; fillers
(0, Integer.MAX_VALUE, 0) skipped).
"""

from __future__ import annotations

import struct

__all__ = ["FILLER_SIZE", "UNIT", "order_break", "unit_end"]

UNIT = 20
FILLER_SIZE = 0x7FFFFFFF
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def unit_end(phy: int, size: int) -> int:
    """phyOffset + size of a unit, saturated to the int64 range (a damaged unit's phyOffset may
    lie near 2^63; the kernel never lets the sum wrap)."""
    return max(_INT64_MIN, min(_INT64_MAX, phy + size))


def order_break(data: bytes, end: int, file_from: int, prev_end: int, prev_pos: int) -> tuple[int, int, int]:
    """Check that the real units of [0, end) of a ConsumeQueue file's bytes follow each other in
    the CommitLog, after a unit ending at prev_end (-1: none) at logical position prev_pos.
    Returns (logical position to cut at or -1, end of the last real unit, its logical
    position). The cut drops the unit before the first break as well: either may be the
    damaged one."""
    for pos in range(0, min(end, len(data)) - UNIT + 1, UNIT):
        phy, size = struct.unpack_from(">qi", data, pos)
        if phy == 0 and size == FILLER_SIZE:
            continue
        if phy < prev_end:
            return (prev_pos if prev_pos >= 0 else file_from + pos), prev_end, prev_pos
        prev_end, prev_pos = unit_end(phy, size), file_from + pos
    return -1, prev_end, prev_pos
