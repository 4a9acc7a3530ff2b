"""Pure-Python twin of ``mqstore.tier._segment`` (tiered-storage spec §5.2): the segment
object builder, its parsers and its lookups, with struct and zlib, slowly and plainly. The
oracle of tests/test_tier_segment.py; the store never uses it."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mqstore.errors import CorruptRecordError, CorruptSegmentError
from mqstore.segformat import (DIR_FIXED_SIZE, FENCE_EVERY, INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_MAGIC,
                                INDEX_RUN_CAP, INDEX_SLOT_SIZE, INDEX_VERSION, LOCAL_ENTRY_SIZE,
                                LOCAL_INDEX_HEADER_SIZE, LOCAL_SLOT_SIZE, MAGIC, MAX_DATA_BYTES,
                                PHY_ENTRY_SIZE, SAMPLE_EVERY, SAMPLE_SIZE, TRAILER_SIZE, VERSION, Footer,
                                GroupEntry, IndexHeader, TimeSample, Trailer)
from mqstore.twin.codec import (BLANK_MAGIC_CODE, BORNHOST_V6_FLAG, MESSAGE_MAGIC_CODE_V2, STOREHOSTADDRESS_V6_FLAG,
                                check_record, topic_problem)

# The format's constants and parsed parts: mqstore.segformat, shared with the kernel


MAX_GAP_UNITS = 1_000_000    # mqstore.queue._consumequeue: dispatch's bound on a queue offset past the queue's end
INT64_MAX = (1 << 63) - 1
CQ_UNIT = 20
PREPARED, ROLLBACK, TX_MASK = 0x4, 0xC, 0xC


class _Rec:
    __slots__ = ("file_pos", "size", "topic", "queue_id", "queue_offset", "store_ts", "unit", "data_pos")

    def __init__(self, file_pos: int, size: int, topic: bytes, queue_id: int, queue_offset: int, store_ts: int,
                 unit: bool) -> None:
        self.file_pos, self.size, self.topic, self.queue_id = file_pos, size, topic, queue_id
        self.queue_offset, self.store_ts, self.unit, self.data_pos = queue_offset, store_ts, unit, 0


def _fields(b: bytes, pos: int) -> tuple[int, bytes, int, int, int, int]:
    """(size, topic bytes, queue id, queue offset, sys flag, store timestamp) of a checked record."""
    size, magic, _crc, qid, _flag, qo, _phy, sys_flag, _born_ts = struct.unpack_from(">iiiiiqqiq", b, pos)
    c = pos + 48 + (20 if sys_flag & BORNHOST_V6_FLAG else 8)
    (store_ts,) = struct.unpack_from(">q", b, c)
    c += 8 + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8) + 12
    (body_len,) = struct.unpack_from(">i", b, c)
    c += 4 + max(body_len, 0)
    if magic == MESSAGE_MAGIC_CODE_V2:
        (tlen,) = struct.unpack_from(">h", b, c)
        c += 2
    else:
        (tlen,) = struct.unpack_from(">b", b, c)
        c += 1
    return size, bytes(b[c:c + tlen]), qid, qo, sys_flag, store_ts


class SegmentBuilder:
    """See mqstore.tier._segment.SegmentBuilder."""

    def __init__(self, buf: Any, file_start: int, log_id: int, valid_len: int, *,
                 queue_ends: Mapping[tuple[str, int], int] | None = None, check_crc: bool = False) -> None:
        b = bytes(memoryview(buf).cast("B"))
        if file_start < 0 or log_id < 0:
            raise ValueError(f"file_start ({file_start}) and log_id ({log_id}) must be >= 0")
        if not 0 <= valid_len <= len(b) or valid_len > MAX_DATA_BYTES:
            raise ValueError(f"valid_len {valid_len} is outside the file's {len(b)} bytes")
        self.file_start, self.log_id, self.valid_len, self.data_len = file_start, log_id, valid_len, valid_len
        self._file = b
        recs: list[_Rec] = []
        pos = 0
        while pos < valid_len:
            if pos + 8 <= valid_len and struct.unpack_from(">i", b, pos + 4)[0] == BLANK_MAGIC_CODE:
                raise CorruptRecordError(f"CommitLog file {file_start}: END_OF_FILE blank at file position {pos}")
            size, ok = check_record(b[:valid_len], pos, check_crc=check_crc)
            if not ok or size <= 0 or pos + size > valid_len:
                raise CorruptRecordError(f"CommitLog file {file_start}: no valid record at file position {pos}")
            if struct.unpack_from(">q", b, pos + 28)[0] != file_start + pos:
                raise CorruptRecordError(f"CommitLog file {file_start}: PHYSICALOFFSET of the record at {pos}")
            size, topic, qid, qo, sys_flag, ts = _fields(b, pos)
            recs.append(_Rec(pos, size, topic, qid, qo, ts, sys_flag & TX_MASK not in (PREPARED, ROLLBACK)))
            pos += size
        # dispatch's rule (ConsumeQueueKernel.put_unit), in physical order
        ends: dict[tuple[bytes, int], int] = {}
        valid: dict[tuple[bytes, int], bool] = {}
        for r in recs:
            key = (r.topic, r.queue_id)
            if key not in valid:
                try:
                    name = r.topic.decode("utf-8")
                    valid[key] = r.queue_id >= 0 and topic_problem(name, 255) is None  # queue_problem
                except UnicodeDecodeError:
                    valid[key] = False
                if valid[key] and len(r.topic) > 255:
                    raise ValueError(f"topic {r.topic!r} is longer than 255 bytes")
                if valid[key] and queue_ends is not None and (name, r.queue_id) in queue_ends:
                    ends[key] = max(0, queue_ends[(name, r.queue_id)])
            if not (r.unit and valid[key]):
                r.unit = False
                continue
            q, end = r.queue_offset, ends.get(key)
            if q < 0 or q > INT64_MAX // CQ_UNIT or (end is not None and (q < end or q - end > MAX_GAP_UNITS)):
                r.unit = False
            else:
                ends[key] = q + 1
        groups: dict[tuple[bytes, int], list[_Rec]] = {}
        for r in recs:
            if r.unit:
                groups.setdefault((r.topic, r.queue_id), []).append(r)
        ordered = [groups[k] for k in sorted(groups)]
        no_queue = [r for r in recs if not r.unit]
        self._order = [r for g in ordered for r in g] + no_queue
        at = 0
        for r in self._order:
            r.data_pos = at
            at += r.size
        directory: list[GroupEntry] = []
        samples: list[_Rec] = []
        for g, nq in [(g, False) for g in ordered] + ([(no_queue, True)] if no_queue else []):
            picks = [] if nq else g[::SAMPLE_EVERY] + ([g[-1]] if (len(g) - 1) % SAMPLE_EVERY else [])
            directory.append(GroupEntry(b"" if nq else g[0].topic, 0 if nq else g[0].queue_id,
                                        0 if nq else g[0].queue_offset, len(g), g[0].data_pos,
                                        g[-1].data_pos + g[-1].size - g[0].data_pos, min(r.store_ts for r in g),
                                        max(r.store_ts for r in g), len(samples), len(picks)))
            samples.extend(picks)
        footer = bytearray()
        for e in directory:
            footer += bytes([len(e.topic)]) + e.topic + struct.pack(
                ">iqIqqqqII", e.queue_id, e.first_queue_offset, e.record_count, e.data_start, e.data_length,
                e.min_store_timestamp, e.max_store_timestamp, e.first_sample, e.sample_count)
        for r in samples:
            footer += struct.pack(">qqII", r.queue_offset, r.store_ts, r.data_pos, r.size)
        for r in recs[::FENCE_EVERY]:
            footer += struct.pack(">I", r.file_pos)
        for r in sorted(recs, key=lambda r: r.file_pos):
            footer += struct.pack(">II", r.file_pos, r.data_pos)
        self.footer = bytes(footer)
        self.footer_len = len(self.footer)
        self.footer_crc = zlib.crc32(self.footer)
        self.directory = directory
        self.size = self.data_len + self.footer_len + TRAILER_SIZE
        self.record_count = len(recs)
        self.first_store_timestamp = min((r.store_ts for r in recs), default=0)
        self.last_store_timestamp = max((r.store_ts for r in recs), default=0)
        self._unit_less = [r.file_pos for r in recs if not r.unit]

    def _data(self) -> bytes:
        return b"".join(self._file[r.file_pos:r.file_pos + r.size] for r in self._order)

    @property
    def data_crc(self) -> int:
        return zlib.crc32(self._data())

    @property
    def trailer(self) -> bytes:
        head = MAGIC + struct.pack(">iiqqqIIII", VERSION, self.log_id, self.file_start, self.valid_len, self.data_len,
                                   self.footer_len, self.record_count, self.data_crc, self.footer_crc)
        return head + struct.pack(">II", zlib.crc32(head), 0)

    def object_bytes(self) -> bytes:
        return self._data() + self.footer + self.trailer

    def read_into(self, offset: int, out: Any) -> int:
        if not 0 <= offset <= self.size:
            raise ValueError(f"offset {offset} is outside the segment's {self.size} bytes")
        o = memoryview(out).cast("B")
        chunk = self.object_bytes()[offset:offset + len(o)]
        o[:len(chunk)] = chunk
        return len(chunk)

    def parts(self, part_size: int) -> Iterator[bytes]:
        if part_size < 1:
            raise ValueError(f"part_size {part_size} must be >= 1")
        whole = self.object_bytes()
        for at in range(0, len(whole), part_size):
            yield whole[at:at + part_size]

    def unit_less(self) -> list[int]:
        return list(self._unit_less)


def parse_trailer(b: Any) -> Trailer:
    b = bytes(b)
    if len(b) != TRAILER_SIZE:
        raise CorruptSegmentError(f"segment trailer is {len(b)} bytes, expected {TRAILER_SIZE}")
    if b[:8] != MAGIC:
        raise CorruptSegmentError(f"segment trailer: magic {b[:8]!r} is not {MAGIC!r}")
    want, reserved = struct.unpack_from(">II", b, 56)
    if zlib.crc32(b[:56]) != want:
        raise CorruptSegmentError("segment trailer: trailer CRC does not match")
    version, log_id, file_start, valid_len, data_len, f_len, n, dcrc, fcrc = struct.unpack_from(">iiqqqIIII", b, 8)
    if version != VERSION:
        raise CorruptSegmentError(f"segment trailer: format version {version} is not {VERSION}")
    if log_id < 0 or file_start < 0 or data_len != valid_len or not 0 <= data_len <= MAX_DATA_BYTES:
        raise CorruptSegmentError("segment trailer: log id, file start, data length and valid length do not fit")
    if reserved:
        raise CorruptSegmentError("segment trailer: reserved field is not 0")
    return Trailer(version, log_id, file_start, valid_len, data_len, f_len, n, dcrc, fcrc)


def parse_footer(b: Any, trailer: Trailer) -> Footer:
    b = bytes(b)
    if len(b) != trailer.footer_len:
        raise CorruptSegmentError(f"segment footer is {len(b)} bytes, the trailer says {trailer.footer_len}")
    if zlib.crc32(b) != trailer.footer_crc:
        raise CorruptSegmentError("segment footer: footer CRC does not match the trailer's")
    groups: list[GroupEntry] = []
    c = total = n_samples = 0
    while total < trailer.record_count:
        if c + 1 > len(b) or c + b[c] + DIR_FIXED_SIZE > len(b):
            raise CorruptSegmentError(f"segment footer: directory entry {len(groups)} runs past the footer")
        tl = b[c]
        e = GroupEntry(b[c + 1:c + 1 + tl], *struct.unpack_from(">iqIqqqqII", b, c + 1 + tl))
        c += tl + DIR_FIXED_SIZE
        if e.record_count == 0 or e.first_sample != n_samples or e.data_start < 0 or e.data_length < 0 or \
                e.data_start + e.data_length > trailer.data_len or \
                (e.sample_count != 0 if tl == 0 else not 1 <= e.sample_count <= e.record_count):
            raise CorruptSegmentError(f"segment footer: directory entry {len(groups)} does not fit the segment")
        n_samples += e.sample_count
        total += e.record_count
        groups.append(e)
    n = trailer.record_count
    if total != n:
        raise CorruptSegmentError(f"segment footer: the directory counts {total} records, the trailer {n}")
    n_fences = (n + FENCE_EVERY - 1) // FENCE_EVERY
    if len(b) - c != n_samples * SAMPLE_SIZE + n_fences * 4 + n * PHY_ENTRY_SIZE:
        raise CorruptSegmentError("segment footer: the bytes after the directory do not fit its samples")
    samples = [TimeSample(*struct.unpack_from(">qqII", b, c + k * SAMPLE_SIZE)) for k in range(n_samples)]
    c += n_samples * SAMPLE_SIZE
    fences = [struct.unpack_from(">I", b, c + 4 * k)[0] for k in range(n_fences)]
    c += 4 * n_fences
    phy = b[c:]
    for k, fence in enumerate(fences):
        if struct.unpack_from(">I", phy, k * FENCE_EVERY * PHY_ENTRY_SIZE)[0] != fence:
            raise CorruptSegmentError(f"segment footer: phy fence {k} does not match its phy index entry")
    return Footer(groups, samples, fences, phy)


def parse_segment(obj: Any) -> tuple[Trailer, Footer]:
    obj = bytes(obj)
    if len(obj) < TRAILER_SIZE:
        raise CorruptSegmentError(f"segment object is {len(obj)} bytes, shorter than its trailer")
    t = parse_trailer(obj[-TRAILER_SIZE:])
    if t.object_size != len(obj):
        raise CorruptSegmentError(f"segment object is {len(obj)} bytes, its trailer says {t.object_size}")
    return t, parse_footer(obj[t.data_len:t.data_len + t.footer_len], t)


def _group_samples(footer: Footer, group: int) -> list[TimeSample]:
    g = footer.groups[group]
    if g.no_queue:
        raise ValueError("the no-queue group has no queue offsets")
    return footer.samples[g.first_sample:g.first_sample + g.sample_count]


def queue_offset_range(footer: Footer, group: int, queue_offset: int) -> tuple[int, int] | None:
    g = footer.groups[group]
    s = _group_samples(footer, group)
    if queue_offset < g.first_queue_offset or queue_offset > s[-1].queue_offset:
        return None
    j = max(i for i, x in enumerate(s) if x.queue_offset <= queue_offset)
    end = s[j] if j + 1 == len(s) else s[j + 1]
    return s[j].data_pos, end.data_pos + end.size


def time_range(footer: Footer, group: int, timestamp: int) -> tuple[int, int, int]:
    s = _group_samples(footer, group)
    below = [i for i, x in enumerate(s) if x.store_timestamp < timestamp]
    if not below:
        return s[0].data_pos, s[0].data_pos + s[0].size, s[0].queue_offset
    j = below[-1]
    if j + 1 == len(s):
        return s[j].data_pos + s[j].size, s[j].data_pos + s[j].size, s[j].queue_offset + 1
    return s[j].data_pos + s[j].size, s[j + 1].data_pos + s[j + 1].size, s[j + 1].queue_offset


def _records(window: Any) -> Iterator[tuple[int, int, int, int]]:
    w = bytes(window)
    c = 0
    while c < len(w):
        size, ok = check_record(w, c, check_crc=False, read_body=False)
        if not ok or size <= 0 or c + size > len(w):
            raise CorruptSegmentError(f"segment data: no whole record at window position {c}")
        size, _topic, _qid, qo, _sf, ts = _fields(w, c)
        yield c, size, qo, ts
        c += size


def find_queue_offset(window: Any, queue_offset: int) -> tuple[int, int, int] | None:
    for c, size, qo, _ts in _records(window):
        if qo >= queue_offset:
            return c, size, qo
    return None


def find_time(window: Any, timestamp: int, after: int) -> int:
    for _c, _size, qo, ts in _records(window):
        if ts >= timestamp:
            return qo
    return after


def phy_entries_range(trailer: Trailer, fences: Sequence[int], file_pos: int) -> tuple[int, int] | None:
    ks = [k for k, f in enumerate(fences) if f <= file_pos]
    if not ks:
        return None
    k, n = ks[-1], trailer.record_count
    base = trailer.data_len + trailer.footer_len - n * PHY_ENTRY_SIZE
    return base + k * FENCE_EVERY * PHY_ENTRY_SIZE, base + min(n, (k + 1) * FENCE_EVERY) * PHY_ENTRY_SIZE


def phy_lookup(entries: Any, file_pos: int) -> int:
    e = bytes(entries)
    for k in range(len(e) // PHY_ENTRY_SIZE):
        at, data_pos = struct.unpack_from(">II", e, k * PHY_ENTRY_SIZE)
        if at == file_pos:
            return int(data_pos)
    return -1


# -- the compacted index object (.mqidx, spec §5.3) ---------------------------------------------------

def compact_index(buf: Any, hash_slot_num: int, index_num: int, log_id: int) -> bytes:
    b = bytes(memoryview(buf).cast("B"))
    if hash_slot_num < 1 or index_num < 1 or log_id < 0:
        raise ValueError("hash_slot_num and index_num must be >= 1, log_id >= 0")
    entries_at = LOCAL_INDEX_HEADER_SIZE + LOCAL_SLOT_SIZE * hash_slot_num
    if len(b) != entries_at + LOCAL_ENTRY_SIZE * index_num:
        raise ValueError(f"index file is {len(b)} bytes, not {entries_at + LOCAL_ENTRY_SIZE * index_num}")
    begin, end = struct.unpack_from(">qq", b, 0)
    count = min(max(1, struct.unpack_from(">i", b, 36)[0]), index_num)
    slots, entries = bytearray(), bytearray()
    for s in range(hash_slot_num):
        v = struct.unpack_from(">i", b, LOCAL_INDEX_HEADER_SIZE + LOCAL_SLOT_SIZE * s)[0]
        run = []
        steps = 0
        while 0 < v < count and steps < count:   # selectPhyOffset's walk
            steps += 1
            key_hash, phy, time_diff, prev = struct.unpack_from(">iqii", b, entries_at + LOCAL_ENTRY_SIZE * v)
            if time_diff < 0:
                break
            run.append(struct.pack(">iqi", key_hash, phy, time_diff))
            if prev <= 0 or prev >= count or prev == v:
                break
            v = prev
        slots += struct.pack(">II", len(entries) // INDEX_ENTRY_SIZE if run else 0, len(run))
        entries += b"".join(run)
    body = bytes(slots + entries)
    return INDEX_MAGIC + struct.pack(">iiqqiIIi", INDEX_VERSION, log_id, begin, end, hash_slot_num,
                                     len(entries) // INDEX_ENTRY_SIZE, zlib.crc32(body), 0) + body


def parse_index_header(b: Any) -> IndexHeader:
    b = bytes(b)
    if len(b) != INDEX_HEADER_SIZE:
        raise CorruptSegmentError(f"index object header is {len(b)} bytes, expected {INDEX_HEADER_SIZE}")
    if b[:8] != INDEX_MAGIC:
        raise CorruptSegmentError(f"index object header: magic {b[:8]!r} is not {INDEX_MAGIC!r}")
    version, log_id, begin, end, slots, n, crc, reserved = struct.unpack_from(">iiqqiIIi", b, 8)
    if version != INDEX_VERSION:
        raise CorruptSegmentError(f"index object header: format version {version} is not {INDEX_VERSION}")
    if log_id < 0 or slots < 1 or reserved != 0:
        raise CorruptSegmentError("index object header: log id, slot count or reserved field is out of range")
    return IndexHeader(version, log_id, begin, end, slots, n, crc)


def verify_index(obj: Any) -> IndexHeader:
    obj = bytes(obj)
    if len(obj) < INDEX_HEADER_SIZE:
        raise CorruptSegmentError(f"index object is {len(obj)} bytes, shorter than its header")
    h = parse_index_header(obj[:INDEX_HEADER_SIZE])
    if h.object_size != len(obj):
        raise CorruptSegmentError(f"index object is {len(obj)} bytes, its header says {h.object_size}")
    if zlib.crc32(obj[INDEX_HEADER_SIZE:]) != h.crc:
        raise CorruptSegmentError("index object: CRC of slots and entries does not match the header's")
    at = 0
    for s in range(h.slot_count):
        first, k = struct.unpack_from(">II", obj, INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * s)
        if (k == 0 and first != 0) or (k and first != at):
            raise CorruptSegmentError(f"index object: slot {s} does not continue the entries at {at}")
        at += k
    if at != h.entry_count:
        raise CorruptSegmentError(f"index object: slots hold {at} entries, the header {h.entry_count}")
    return h


def index_slot_range(header: IndexHeader, key_hash: int) -> tuple[int, int]:
    s = key_hash % header.slot_count
    return INDEX_HEADER_SIZE + s * INDEX_SLOT_SIZE, INDEX_HEADER_SIZE + (s + 1) * INDEX_SLOT_SIZE


def index_entries_range(header: IndexHeader, slot: Any, max_entries: int = INDEX_RUN_CAP) -> tuple[int, int] | None:
    slot = bytes(slot)
    if len(slot) != INDEX_SLOT_SIZE:
        raise CorruptSegmentError(f"index slot is {len(slot)} bytes, expected {INDEX_SLOT_SIZE}")
    first, k = struct.unpack(">II", slot)
    if k == 0:
        return None
    if first + k > header.entry_count:
        raise CorruptSegmentError("index slot names entries outside the object")
    base = INDEX_HEADER_SIZE + INDEX_SLOT_SIZE * header.slot_count
    return base + first * INDEX_ENTRY_SIZE, base + (first + min(k, max_entries)) * INDEX_ENTRY_SIZE


def index_query(entries: Any, header: IndexHeader, key_hash: int, max_num: int, begin: int, end: int) -> list[int]:
    e = bytes(entries)
    out: list[int] = []
    for i in range(len(e) // INDEX_ENTRY_SIZE):
        if len(out) >= max_num:
            break
        kh, phy, time_diff = struct.unpack_from(">iqi", e, i * INDEX_ENTRY_SIZE)
        t = header.begin_timestamp + time_diff * 1000
        if kh == key_hash and begin <= t <= end:
            out.append(phy)
        if t < begin:
            break
    return out
