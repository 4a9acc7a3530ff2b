"""Pure-Python twin (test oracle) of ``mqstore.queue._search``: time -> queue offset over a ConsumeQueue.

Follows spec §3 (``getOffsetInQueueByTime``) and §15 (Kafka's hot/cold "warm section" lookup) of
``docs/rocketmq-store-spec.md``, with the deterministic result rules documented (as a
QUIRK decision) in ``ext/mqstore/queue/_search.pyx``. In short, over the 20-byte units ``low..high`` with
key(u) = -inf for a removed unit, else its store time, and r = the first unit with
key(r) >= ts:

* high < low -> low; key(r) == ts -> r; no r -> high (high + 20 if every unit is removed);
* r == low or the unit before r removed -> r; else the nearer of r - 20 and r, ties left.

``offset_by_time`` probes exactly the units the Cython kernel probes, in the same order, so its
CQ page and probe counts equal the kernel's for a page-aligned mapping; ``offset_by_time_linear``
evaluates every unit and is the oracle for both.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "WARM_BYTES_DEFAULT", "CQ_STORE_UNIT_SIZE", "OS_PAGE_SIZE",
    "offset_by_time", "offset_by_time_linear", "store_time_reader",
]

WARM_BYTES_DEFAULT = 8192
CQ_STORE_UNIT_SIZE = 20
OS_PAGE_SIZE = 4096

_POS_SYSFLAG = 36
_POS_STORETIMESTAMP = 56  # IPv4 born host (spec §1.2)
_POS_STORETIMESTAMP_V6 = 68  # IPv6 born host
_BORNHOST_V6_FLAG = 0x10

StoreTime = Callable[[int], "int | None"]  # phy_offset -> store time, None if gone


def store_time_reader(cl_files: Sequence[Buffer | None], cl_first_from: int, cl_file_size: int) -> StoreTime:
    """A ``store_time(phy_offset)`` reading STORETIMESTAMP from CommitLog files held as buffers.

    ``cl_files[k]`` holds the file starting at ``cl_first_from + k * cl_file_size`` (``None``:
    not mapped). Returns ``None`` where the kernel counts the unit as removed: before
    cl_first_from, past the last file, not mapped, or fields past the file end.
    """
    views = [None if f is None else memoryview(f).cast("B") for f in cl_files]

    def store_time(phy: int) -> int | None:
        if phy < cl_first_from:
            return None
        k, file_pos = divmod(phy - cl_first_from, cl_file_size)
        if k >= len(views) or views[k] is None or file_pos + _POS_SYSFLAG + 4 > cl_file_size:
            return None
        view = views[k]
        assert view is not None
        (sys_flag,) = struct.unpack_from(">i", view, file_pos + _POS_SYSFLAG)
        at = _POS_STORETIMESTAMP_V6 if sys_flag & _BORNHOST_V6_FLAG else _POS_STORETIMESTAMP
        if file_pos + at + 8 > cl_file_size:
            return None
        (stamp,) = struct.unpack_from(">q", view, file_pos + at)
        return int(stamp)

    return store_time


def _check(low: int, high: int, warm_bytes: int) -> None:
    if low < 0 or low % CQ_STORE_UNIT_SIZE or high % CQ_STORE_UNIT_SIZE:
        raise ValueError(f"low ({low}) and high ({high}) must be unit positions (multiples of 20, low >= 0)")
    if warm_bytes < 0:
        raise ValueError(f"warm_bytes must be >= 0, got {warm_bytes}")


def _key_reader(cq: Buffer, min_phy: int, store_time: StoreTime) -> Callable[[int], int | None]:
    """key(pos): the unit's store time, None when removed (below min_phy or store_time None)."""
    view = memoryview(cq).cast("B")

    def key(pos: int) -> int | None:
        (phy,) = struct.unpack_from(">q", view, pos)
        return None if phy < min_phy else store_time(phy)

    return key


def _older(key: int | None, ts: int) -> bool:
    """key < ts, a removed unit (None) being older than any time."""
    return key is None or key < ts


def _choose(low: int, high: int, ts: int, r: int, key_r: int | None, key_left: int | None) -> int:
    """The result rules given the lower bound r (high + 20: none), key(r) and key(r - 20)."""
    unit = CQ_STORE_UNIT_SIZE
    if r > high:
        return high if key_left is not None else high + unit
    if key_r == ts or r == low or key_left is None:
        return r
    assert key_r is not None
    return r - unit if ts - key_left <= key_r - ts else r


def offset_by_time(
    cq: Buffer,
    low: int,
    high: int,
    ts: int,
    min_phy: int,
    store_time: StoreTime,
    warm_bytes: int = WARM_BYTES_DEFAULT,
) -> tuple[int, int, int]:
    """Twin of ``mqstore.queue._search.offset_by_time``: (position, cq_pages, probes).

    cq is the ConsumeQueue file's bytes (positions are relative to its start, which the kernel
    assumes page aligned); store_time(phy) gives a record's store time or None if its file is
    gone. The hot/cold split and binary search probe the same units as the kernel.
    """
    _check(low, high, warm_bytes)
    if high < low:
        return low, 0, 0
    unit, page = CQ_STORE_UNIT_SIZE, OS_PAGE_SIZE
    read_key = _key_reader(cq, min_phy, store_time)
    pages: set[int] = set()
    probes = 0

    def key(pos: int) -> int | None:
        nonlocal probes
        probes += 1
        pages.update((pos // page, (pos + 7) // page))  # the commitLogOffset bytes [pos, pos + 8)
        return read_key(pos)

    # the lower bound r lies in [lo, hi]; key_left = key(lo - 20), key_hi = key(hi) once known
    lo, hi = low, high + unit
    key_left: int | None = None
    key_hi: int | None = None
    if warm_bytes > 0:  # spec §15: search the warm tail alone when the target is newer than it
        warm_pages = max(1, warm_bytes // page)
        boundary = ((high + unit - 1) // page - warm_pages + 1) * page
        if boundary > low:
            first_hot = -(-boundary // unit) * unit
            if first_hot <= high:
                k = key(first_hot)
                if _older(k, ts):
                    lo, key_left = first_hot + unit, k
                else:
                    hi, key_hi = first_hot, k
    while lo < hi:
        mid = lo + (hi - lo) // unit // 2 * unit
        k = key(mid)
        if _older(k, ts):
            lo, key_left = mid + unit, k
        else:
            hi, key_hi = mid, k
    return _choose(low, high, ts, lo, key_hi, key_left), len(pages), probes


def offset_by_time_linear(
    cq: Buffer,
    low: int,
    high: int,
    ts: int,
    min_phy: int,
    store_time: StoreTime,
) -> int:
    """The same result by evaluating every unit of [low, high], written from the definition
    alone (it shares no code with the binary search): the oracle in parity tests."""
    _check(low, high, 0)
    if high < low:
        return low
    unit = CQ_STORE_UNIT_SIZE
    read_key = _key_reader(cq, min_phy, store_time)
    positions = range(low, high + unit, unit)
    keys = [read_key(pos) for pos in positions]
    if all(k is None for k in keys):
        return high + unit
    r = next((i for i, k in enumerate(keys) if k is not None and k >= ts), None)
    if r is None:
        return high
    key_r = keys[r]
    assert key_r is not None
    if key_r == ts or r == 0 or keys[r - 1] is None:
        return positions[r]
    key_l = keys[r - 1]
    assert key_l is not None
    return positions[r - 1] if ts - key_l <= key_r - ts else positions[r]
