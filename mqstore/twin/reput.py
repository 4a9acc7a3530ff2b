"""Pure-Python twin (test oracle) of ``mqstore.queue._reput``: the batches of the concurrent dispatch.

``cut`` cuts a CommitLog file's bytes into batches of whole records with the 5.x pre-check
(TOTALSIZE and MAGIC only); ``parse`` parses one batch as the dispatch kernels of
``ext/mq_dispatch.pxd`` do (the structure checks of ``parse_record_head``, which are the
compiled dispatch's, not all of Java's checkMessageAndReturnSize), and returns each record's
ConsumeQueue unit (spec §3, §10.1: transaction types NOT and COMMIT only; tags code from TAGS,
or the delivery time of a SCHEDULE_TOPIC_XXXX record) and the index keys that
``IndexService.build_index`` would put (spec §4.4), with their hashes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mqstore.twin.codec import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    java_string_hash,
    record_length,
)
from mqstore.twin.index import index_key_hash

__all__ = ["MIN_RECORD_SIZE", "ParsedBatch", "cut", "parse"]

MIN_RECORD_SIZE = 91  # a record with no body, topic or properties
_SCHEDULE_TOPIC = b"SCHEDULE_TOPIC_XXXX"


@dataclass
class ParsedBatch:
    """What ``mqstore.queue._reput.ParsedBatch`` holds, as plain values."""

    stop: int
    reason: str = "end"
    count: int = 0
    last_store_timestamp: int = -1
    # (topic, queue_id, queue_offset, phy_offset, size, tags_code), in record order
    units: list[tuple[bytes, int, int, int, int, int]] = field(default_factory=list)
    # (phy_offset, store_timestamp, key_hash), in the order build_index puts them
    index_keys: list[tuple[int, int, int]] = field(default_factory=list)


def _i16(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">h", b, at)[0])


def _i32(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">i", b, at)[0])


def _i64(b: bytes, at: int) -> int:
    return int(struct.unpack_from(">q", b, at)[0])


def cut(data: bytes, start: int, end: int, batch_bytes: int) -> tuple[int, str, int]:
    """(stop, reason, records): the shortest run of whole records from start at least
    batch_bytes long ("batch"), else up to end ("end"), an END_OF_FILE record ("blank") or a
    record whose TOTALSIZE or MAGIC is wrong ("invalid")."""
    end = min(end, len(data))
    pos, records = start, 0
    while pos < end:
        if pos - start >= batch_bytes:
            return pos, "batch", records
        if end - pos < 8:
            return pos, "invalid", records
        size, magic = _i32(data, pos), _i32(data, pos + 4)
        if magic == BLANK_MAGIC_CODE:
            return pos, "blank", records
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or size < MIN_RECORD_SIZE or size > end - pos:
            return pos, "invalid", records
        pos += size
        records += 1
    return pos, "end", records


def _properties(raw: bytes) -> dict[bytes, bytes]:
    """string2messageProperties on the raw bytes (spec §1.4): segments split on 0x02, the name
    before the first 0x01, name and value both non-empty; a later duplicate wins."""
    out: dict[bytes, bytes] = {}
    for segment in raw.split(b"\x02"):
        name, sep, value = segment.partition(b"\x01")
        if sep and name and value:
            out[name] = value
    return out


def _delay_level(raw: bytes) -> int:
    """Integer.parseInt of a delay level as the kernel takes it: plain decimal, 1-9 digits, else -1."""
    if not 1 <= len(raw) <= 9 or not all(0x30 <= c <= 0x39 for c in raw):
        return -1
    return int(raw)


@dataclass
class _Record:
    size: int
    sys_flag: int
    queue_id: int
    queue_offset: int
    phy_offset: int
    store_timestamp: int
    topic: bytes
    properties: dict[bytes, bytes]


def _record(data: bytes, pos: int, avail: int) -> _Record | str:
    """The record at pos, or "blank" / "invalid" (parse_record_head's checks)."""
    if avail < 8:
        return "invalid"
    size, magic = _i32(data, pos), _i32(data, pos + 4)
    if magic == BLANK_MAGIC_CODE:
        return "blank"
    if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2) or size < MIN_RECORD_SIZE or size > avail:
        return "invalid"
    v2 = magic == MESSAGE_MAGIC_CODE_V2
    sys_flag = _i32(data, pos + 36)
    body_len_at = 48 + (20 if sys_flag & 0x10 else 8) + 8 + (20 if sys_flag & 0x20 else 8) + 12
    body_len = _i32(data, pos + body_len_at)
    if body_len < 0 or body_len_at + 4 + body_len + 3 > size:
        return "invalid"
    topic_len_at = body_len_at + 4 + body_len
    topic_len = _i16(data, pos + topic_len_at) if v2 else int(struct.unpack_from(">b", data, pos + topic_len_at)[0])
    topic_at = topic_len_at + (2 if v2 else 1)
    if topic_len < 0 or topic_at + topic_len + 2 > size:
        return "invalid"
    props_len = _i16(data, pos + topic_at + topic_len)
    if props_len < 0 or record_length(body_len, topic_len, props_len, sys_flag, v2) != size:
        return "invalid"
    if topic_len == 0:
        return "invalid"  # a queue needs a topic
    props_at = pos + topic_at + topic_len + 2
    return _Record(size=size, sys_flag=sys_flag, queue_id=_i32(data, pos + 12), queue_offset=_i64(data, pos + 20),
                   phy_offset=_i64(data, pos + 28),
                   store_timestamp=_i64(data, pos + (68 if sys_flag & 0x10 else 56)),
                   topic=bytes(data[pos + topic_at:pos + topic_at + topic_len]),
                   properties=_properties(bytes(data[props_at:props_at + props_len])))


def parse(data: bytes, start: int, end: int, delay_levels_ms: tuple[int, ...] = (),
          index_enable: bool = True) -> ParsedBatch:
    """Parse the records of data[start:end] (one batch) like ``BatchParser.parse``."""
    end = min(end, len(data))
    delays = tuple(delay_levels_ms)[:18]
    batch = ParsedBatch(stop=start)
    pos = start
    while pos < end:
        rec = _record(data, pos, end - pos)
        if isinstance(rec, str):
            batch.reason = rec
            break
        props, ts, phy = rec.properties, rec.store_timestamp, rec.phy_offset
        tx = rec.sys_flag & 0xC
        tags = java_string_hash(props[b"TAGS"].decode("utf-8", "replace")) if b"TAGS" in props else 0
        if b"DELAY" in props and rec.topic == _SCHEDULE_TOPIC:
            level = min(_delay_level(props[b"DELAY"]), len(delays))
            tags = ts + (delays[level - 1] if level > 0 else 1000)
        if tx not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
            batch.units.append((rec.topic, rec.queue_id, rec.queue_offset, phy, rec.size, tags))
        if index_enable and tx != TRANSACTION_ROLLBACK_TYPE and (b"KEYS" in props or b"UNIQ_KEY" in props):
            keys = [props[b"UNIQ_KEY"].decode("utf-8", "replace")] if b"UNIQ_KEY" in props else []
            if b"KEYS" in props:
                keys += [k for k in props[b"KEYS"].decode("utf-8", "replace").split(" ") if k]
            if keys:
                prefix = rec.topic.decode("utf-8", "replace") + "#"  # as Java decodes: U+FFFD for bad bytes
                batch.index_keys += [(phy, ts, index_key_hash(prefix + k)) for k in keys]
        batch.count += 1
        batch.last_store_timestamp = ts
        pos += rec.size
    batch.stop = pos
    return batch
