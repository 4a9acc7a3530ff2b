"""Pure-Python twin (test oracle) of the getMessage path of ``mqstore.queue._reads.ReadKernel``.

Follows spec §11 (``DefaultMessageStore.getMessage``) of ``docs/rocketmq-store-spec.md``:
the status table on the queue's min/max offsets, the slice of units from the requested offset
to the end of its ConsumeQueue file (never crossing a file), and the scan with the tag filter,
the in-memory / on-disk transfer caps and the skip of a removed CommitLog file. The kernel
reads the same units from the mapped files; this twin takes them as a list.

It is also the twin of the body CRC check on read (``check_crc_on_read``): ``record_status``
and ``first_corrupt`` of ``mqstore.queue._search`` (the structure checks of ``parse_record_head``,
spec §5.3, then BODYCRC against ``zlib.crc32(body) & 0x7FFFFFFF``, spec §1.5), and
``get_message_checked``, what ``MessageStore.get_message`` returns with the check on: the
messages before the first damaged one, or MESSAGE_CORRUPTED at it when it comes first.

``body_as_sent`` is the twin of the bodies the kernels hand out (``MessageView.body_bytes``,
``GetMessageResult.bodies``, the Arrow body column): inflated per sysFlag by
``mqstore.compression`` (Python's zlib where the kernels call C zlib).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mqstore.compression import inflate_body
from mqstore.status import GetMessageStatus as S
from mqstore.twin.codec import DecodedRecord

__all__ = ["CQ_STORE_UNIT_SIZE", "FILLER_SIZE", "Limits", "Unit", "TwinResult", "get_message",
           "RECORD_OK", "RECORD_CRC_MISMATCH", "RECORD_MALFORMED", "record_status", "first_corrupt",
           "get_message_checked", "body_as_sent"]

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
    queue_offsets: list[int] = field(default_factory=list)  # of the messages collected
    sizes: list[int] = field(default_factory=list)
    corrupt_physical_offset: int = -1  # MESSAGE_CORRUPTED: where the damaged record starts


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
        result.queue_offsets.append(q)
        result.sizes.append(size)
        result.buffer_total_size += size
        result.status = S.FOUND
        q += 1
    result.next_begin_offset = q
    if last_phy >= 0:
        result.suggest_pulling_from_slave = limits.max_phy - last_phy > limits.in_memory
    return result


# -- body CRC on read ----------------------------------------------------------------------------

RECORD_OK, RECORD_CRC_MISMATCH, RECORD_MALFORMED = 0, 1, 2
_MAGIC_V1, _MAGIC_V2, _MIN_RECORD = -626843481, -626843477, 91
_BORNHOST_V6, _STOREHOST_V6 = 0x10, 0x20


def _i32(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">i", b, at)[0])


def _i16(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">h", b, at)[0])


def record_status(data: bytes | bytearray | memoryview) -> int:
    """The status of the record at the start of data (which may extend past it): RECORD_MALFORMED
    unless it parses as a message (parse_record_head: magic, TOTALSIZE within data, the
    lengths add up to TOTALSIZE), else RECORD_CRC_MISMATCH unless BODYCRC is
    crc32(body) & 0x7FFFFFFF."""
    b = bytes(data)
    avail = len(b)
    if avail < 8:
        return RECORD_MALFORMED
    size, magic = _i32(b, 0), _i32(b, 4)
    if magic not in (_MAGIC_V1, _MAGIC_V2) or size < _MIN_RECORD or size > avail:
        return RECORD_MALFORMED  # a BLANK record is no message either
    v2 = magic == _MAGIC_V2
    sys_flag = _i32(b, 36)
    born = 20 if sys_flag & _BORNHOST_V6 else 8
    store = 20 if sys_flag & _STOREHOST_V6 else 8
    hdr = 48 + born + 8 + store + 12
    if hdr + 4 + 3 > size:
        return RECORD_MALFORMED
    body_len = _i32(b, hdr)
    if body_len < 0 or hdr + 4 + body_len + 3 > size:
        return RECORD_MALFORMED
    at = hdr + 4 + body_len
    topic_len = _i16(b, at) if v2 else struct.unpack_from(">b", b, at)[0]
    topic_pos = at + (2 if v2 else 1)
    if topic_len < 0 or topic_pos + topic_len + 2 > size:
        return RECORD_MALFORMED
    props_len = _i16(b, topic_pos + topic_len)
    if props_len < 0 or topic_pos + topic_len + 2 + props_len != size:
        return RECORD_MALFORMED
    crc = zlib.crc32(b[hdr + 4:hdr + 4 + body_len]) & 0x7FFFFFFF
    return RECORD_OK if crc == _i32(b, 8) else RECORD_CRC_MISMATCH


def first_corrupt(records: Sequence[bytes | None]) -> tuple[int, int]:
    """(index, status) of the first record that is not RECORD_OK, (-1, RECORD_OK) if none;
    records[i] holds the bytes from the record to the end of its file, None when its file is
    not mapped (skipped: nothing to check)."""
    for i, data in enumerate(records):
        if data is None:
            continue
        status = record_status(data)
        if status != RECORD_OK:
            return i, status
    return -1, RECORD_OK


def get_message_checked(units: Sequence[Unit | None], min_offset: int, max_offset: int, units_per_file: int,
                        offset: int, max_msg_nums: int, codes: frozenset[int] | None, limits: Limits,
                        readable: Callable[[int, int], bool], damaged: Callable[[int], bool]) -> TwinResult:
    """get_message with the body CRC check on; damaged(phy): the record at phy fails it.

    No collected message damaged: get_message's result. The first damaged one at index i > 0:
    the first i messages, next_begin_offset right after the i-th one's unit (where a batch
    full at i messages stops), suggest_pulling_from_slave from the i-th one. At index 0:
    MESSAGE_CORRUPTED, no messages, next_begin_offset = its queue offset."""
    result = get_message(units, min_offset, max_offset, units_per_file, offset, max_msg_nums, codes, limits,
                         readable)
    bad = next((i for i, phy in enumerate(result.physical_offsets) if damaged(phy)), -1)
    if bad < 0:
        return result
    if bad == 0:
        return TwinResult(S.MESSAGE_CORRUPTED, result.queue_offsets[0],
                          corrupt_physical_offset=result.physical_offsets[0])
    last = result.physical_offsets[bad - 1]
    return TwinResult(S.FOUND, result.queue_offsets[bad - 1] + 1, result.physical_offsets[:bad],
                      sum(result.sizes[:bad]), limits.max_phy - last > limits.in_memory,
                      result.queue_offsets[:bad], result.sizes[:bad])


def body_as_sent(rec: DecodedRecord, physical_offset: int, decompress: bool = True) -> bytes:
    """The body of a record (decoded with its body) as a reader hands it out: inflated per its
    sysFlag, its errors naming topic, queue, queue offset and physical_offset; as stored with
    decompress=False."""
    body = rec.body or b""
    if not decompress:
        return body
    return inflate_body(body, rec.sys_flag, (rec.topic, rec.queue_id, rec.queue_offset, physical_offset))
