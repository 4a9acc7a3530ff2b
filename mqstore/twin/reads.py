"""Pure-Python twin (test oracle) of the getMessage path of ``mqstore._consumequeue.ReadKernel``.

Follows spec §11 (``DefaultMessageStore.getMessage``) of ``/work/shared/rocketmq-store-spec.md``:
the status table on the queue's min/max offsets, the slice of units from the requested offset
to the end of its ConsumeQueue file (never crossing a file), and the scan with the tag filter,
the in-memory / on-disk transfer caps and the skip of a removed CommitLog file. The kernel
reads the same units from the mapped files; this twin takes them as a list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mqstore.status import GetMessageStatus as S

__all__ = ["CQ_STORE_UNIT_SIZE", "FILLER_SIZE", "Limits", "Unit", "TwinResult", "get_message"]

CQ_STORE_UNIT_SIZE = 20
FILLER_SIZE = 0x7FFFFFFF
Unit = tuple[int, int, int]  # (phyOffset, size, tagsCode)


@dataclass(frozen=True)
class Limits:
    """What getMessage reads by: the CommitLog's readable window, the in-memory share and the
    transfer caps (MessageStoreConfig maxTransfer*)."""

    min_phy: int
    max_phy: int
    log_file_size: int
    in_memory: int
    max_bytes_memory: int
    max_count_memory: int
    max_bytes_disk: int
    max_count_disk: int


@dataclass
class TwinResult:
    status: S
    next_begin_offset: int
    physical_offsets: list[int] = field(default_factory=list)
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False


def get_message(units: Sequence[Unit | None], min_offset: int, max_offset: int, units_per_file: int,
                offset: int, max_msg_nums: int, codes: frozenset[int] | None, limits: Limits,
                readable: Callable[[int, int], bool]) -> TwinResult:
    """getMessage over a queue whose unit of queue offset q is units[q] (None: its file is
    missing). readable(phy, size): the record lies in a mapped CommitLog file."""
    if max_offset == 0:
        return TwinResult(S.NO_MESSAGE_IN_QUEUE, 0)
    if offset < min_offset:
        return TwinResult(S.OFFSET_TOO_SMALL, min_offset)
    if offset == max_offset:
        return TwinResult(S.OFFSET_OVERFLOW_ONE, offset)
    if offset > max_offset:
        return TwinResult(S.OFFSET_OVERFLOW_BADLY, max_offset)
    if units[offset] is None:
        return TwinResult(S.OFFSET_FOUND_NULL, offset + units_per_file - offset % units_per_file)
    file_end = min(max_offset, offset - offset % units_per_file + units_per_file)
    scan_end = min(file_end, offset + max(16000, max_msg_nums * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE)
    result = TwinResult(S.NO_MATCHED_MESSAGE, offset)
    next_file_start = -1
    last_phy = -1
    q = offset
    while q < scan_end:
        unit = units[q]
        assert unit is not None
        phy, size, tags = unit
        if next_file_start >= 0 and phy < next_file_start:
            q += 1
            continue
        count = len(result.physical_offsets)
        total = result.buffer_total_size
        if count:  # isTheBatchFull
            if count >= max_msg_nums:
                break
            if limits.max_phy - phy > limits.in_memory:
                if total + size > limits.max_bytes_disk or count >= limits.max_count_disk:
                    break
            elif total + size > limits.max_bytes_memory or count >= limits.max_count_memory:
                break
        last_phy = phy
        if codes is not None and tags not in codes:
            q += 1
            continue
        if phy < limits.min_phy or size <= 0 or size == FILLER_SIZE or not readable(phy, size):
            if not count:
                result.status = S.MESSAGE_WAS_REMOVING
            if phy >= 0:
                next_file_start = phy - phy % limits.log_file_size + limits.log_file_size
            q += 1
            continue
        result.physical_offsets.append(phy)
        result.buffer_total_size += size
        result.status = S.FOUND
        q += 1
    result.next_begin_offset = q
    if last_phy >= 0:
        result.suggest_pulling_from_slave = limits.max_phy - last_phy > limits.in_memory
    return result
