"""The segment object format (tiered-storage spec §5.2): mqstore.tier._segment against its twin
mqstore.twin.segment (hypothesis parity), the spec's T1 checks read with struct only, the
lookups against a brute-force scan, damaged objects, and segments of a real store's files
against its ConsumeQueues."""

from __future__ import annotations

import os
import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageStore
from mqstore.errors import CorruptRecordError, CorruptSegmentError
from mqstore.log._codec import encode_record
from mqstore.log._mapped import MappedFile
from mqstore.tier import _segment as kernel
from mqstore.twin import segment as twin

FILE_START = 3 << 20
TOPICS = ["TopicA", "TopicB", "%RETRY%g1", "Z"]
NOT, PREPARED, COMMIT, ROLLBACK = 0x0, 0x4, 0x8, 0xC
BLANK_MAGIC = 0xCBD43194


# -- files of records made with the store's own encoder -----------------------------------------

def make_file(seed: int, n: int, max_body: int = 3000, gaps: bool = True) -> tuple[bytes, int, set[int]]:
    """(file bytes with an END_OF_FILE blank, valid length, file positions of the records that
    dispatch gives no unit): several topics and queues, PREPARED/ROLLBACK records, store
    timestamps rising, and (gaps) a record past MAX_GAP_UNITS and a repeated queue offset."""
    rnd = random.Random(seed)
    next_q: dict[tuple[str, int], int] = {}
    out = bytearray()
    unit_less: set[int] = set()
    ts = 1_700_000_000_000 + rnd.randrange(1000)
    for _ in range(n):
        topic = rnd.choice(TOPICS)
        qid = rnd.randrange(3)
        tx = rnd.choice([NOT] * 6 + [PREPARED, COMMIT, ROLLBACK])
        key = (topic, qid)
        q = next_q.get(key, rnd.randrange(5))
        pos = len(out)
        kind = rnd.randrange(40) if gaps else 0
        if tx in (PREPARED, ROLLBACK):
            qo = 0
            unit_less.add(pos)
        elif kind == 1 and key in next_q:            # a flipped high bit: more than MAX_GAP_UNITS past the end
            qo = q + 1_000_001
            unit_less.add(pos)
        elif kind == 2 and key in next_q and q > 0:  # a queue offset below the queue's end
            qo = q - 1
            unit_less.add(pos)
        else:
            qo = q + (rnd.randrange(1, 4) if kind == 3 else 0)  # a small gap: fillers, the record keeps its unit
            next_q[key] = qo + 1
        ts += rnd.randrange(3)
        body = rnd.randbytes(rnd.randrange(max_body + 1))
        out += encode_record(topic=topic, body=body, queue_id=qid, queue_offset=qo,
                             physical_offset=FILE_START + pos, sys_flag=tx, store_timestamp=ts,
                             born_timestamp=ts - 5, properties={"TAGS": "t", "KEYS": f"k{pos}"})
    valid = len(out)
    out += struct.pack(">iI", 64, BLANK_MAGIC) + bytes(56)
    return bytes(out), valid, unit_less


def records_of(file: bytes, valid: int) -> list[tuple[int, int, bytes, int, int, int]]:
    """(file position, size, topic, queue id, queue offset, store timestamp) of every record, by struct."""
    out = []
    pos = 0
    while pos < valid:
        size, _magic, _crc, qid, _flag, qo, _phy, sys_flag = struct.unpack_from(">iIiiiqqi", file, pos)
        (ts,) = struct.unpack_from(">q", file, pos + 56)
        (body_len,) = struct.unpack_from(">i", file, pos + 84)
        tlen = file[pos + 88 + body_len]
        topic = file[pos + 89 + body_len:pos + 89 + body_len + tlen]
        out.append((pos, size, topic, qid, qo, ts))
        pos += size
    return out


# -- T1: the object read with struct only ---------------------------------------------------------

def check_t1(obj: bytes, file: bytes, valid: int, unit_less: set[int], log_id: int = 0,
             file_start: int = FILE_START) -> None:
    """Spec §11 T1 (format.md's "Check it yourself"): trailer and footer CRCs, directory sorted,
    every record byte-identical to the local one, the no-queue group holds exactly the unit-less
    records, the phy index sorted and complete, samples every 64th record."""
    recs = records_of(file, valid)
    t = obj[-64:]
    assert t[:8] == b"MQSEG001"
    version, k, start, vlen, d, f, n, dcrc, fcrc, tcrc, reserved = struct.unpack(">iiqqqIIIIII", t[8:])
    assert (version, k, start, vlen, d, n, reserved) == (1, log_id, file_start, valid, valid, len(recs), 0)
    assert tcrc == zlib.crc32(t[:56])
    assert len(obj) == d + f + 64
    data, footer = obj[:d], obj[d:d + f]
    assert zlib.crc32(data) == dcrc and zlib.crc32(footer) == fcrc
    by_pos = {r[0]: r for r in recs}
    c, total, entries = 0, 0, []
    while total < n:
        tl = footer[c]
        topic = footer[c + 1:c + 1 + tl]
        e = (topic,) + struct.unpack_from(">iqIqqqqII", footer, c + 1 + tl)
        entries.append(e)
        total += e[3]
        c += 1 + tl + 56
    queue_entries = [e for e in entries if e[0]]
    assert [(e[0], e[1]) for e in queue_entries] == sorted((e[0], e[1]) for e in queue_entries)
    assert len(set((e[0], e[1]) for e in queue_entries)) == len(queue_entries)
    assert all(e[0] for e in entries[:-1]), "only the last entry may be the no-queue group"
    n_samples = sum(e[9] for e in entries)
    samples = [struct.unpack_from(">qqII", footer, c + 24 * i) for i in range(n_samples)]
    c += 24 * n_samples
    n_fences = (n + 4095) // 4096
    fences = struct.unpack_from(f">{n_fences}I", footer, c)
    c += 4 * n_fences
    phy = [struct.unpack_from(">II", footer, c + 8 * i) for i in range(n)]
    assert c + 8 * n == f
    # the phy index: sorted, one entry per record, each pointing at a byte-identical copy
    assert [p[0] for p in phy] == [r[0] for r in recs]
    for file_pos, data_pos in phy:
        size = by_pos[file_pos][1]
        assert data[data_pos:data_pos + size] == file[file_pos:file_pos + size]
    assert list(fences) == [phy[i][0] for i in range(0, n, 4096)]
    # groups tile the data section; each group's records are its queue's, in queue-offset order
    at = 0
    seen: set[int] = set()
    pos_of_data = {data_pos: file_pos for file_pos, data_pos in phy}
    for e in entries:
        topic, qid, first_qo, count, start_b, length, lo_ts, hi_ts, first_s, n_s = e
        assert start_b == at
        members, p = [], start_b
        while p < start_b + length:
            r = by_pos[pos_of_data[p]]
            members.append(r)
            p += r[1]
        assert p == start_b + length and len(members) == count
        seen.update(r[0] for r in members)
        assert (lo_ts, hi_ts) == (min(r[5] for r in members), max(r[5] for r in members))
        if topic:
            assert all((r[2], r[3]) == (topic, qid) for r in members)
            qos = [r[4] for r in members]
            assert qos == sorted(qos) and len(set(qos)) == len(qos) and first_qo == qos[0]
            picks = list(range(0, count, 64)) + ([count - 1] if (count - 1) % 64 else [])
            got = samples[first_s:first_s + n_s]
            want, q = [], start_b
            positions = []
            for r in members:
                positions.append(q)
                q += r[1]
            want = [(members[i][4], members[i][5], positions[i], members[i][1]) for i in picks]
            assert got == want
        else:
            assert {r[0] for r in members} == unit_less
            assert [r[0] for r in members] == sorted(r[0] for r in members)
            assert n_s == 0
        at += length
    assert at == d and len(seen) == n
    if not unit_less:
        assert all(e[0] for e in entries)


def whole(builder, part_size: int) -> bytes:
    return b"".join(builder.parts(part_size))


# -- parity ----------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 300), part=st.integers(1, 70000),
       max_body=st.sampled_from([0, 64, 4096]))
def test_builder_parity_and_t1(seed, n, part, max_body):
    file, valid, unit_less = make_file(seed, n, max_body)
    k = kernel.SegmentBuilder(file, FILE_START, 2, valid)
    w = twin.SegmentBuilder(file, FILE_START, 2, valid)
    obj = whole(k, part)
    assert obj == w.object_bytes()
    assert (k.size, k.footer_len, k.footer, k.footer_crc, k.data_crc, k.trailer, k.record_count) == \
           (w.size, w.footer_len, w.footer, w.footer_crc, w.data_crc, w.trailer, w.record_count)
    assert k.directory == w.directory
    assert set(k.unit_less()) == unit_less and k.unit_less() == w.unit_less()
    assert (k.first_store_timestamp, k.last_store_timestamp) == (w.first_store_timestamp, w.last_store_timestamp)
    check_t1(obj, file, valid, unit_less, log_id=2)
    assert kernel.parse_segment(obj) == twin.parse_segment(obj)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), cuts=st.lists(st.integers(0, 1 << 20), max_size=8))
def test_read_into_any_order(seed, cuts):
    """Reads in any order give the same bytes; the CRC is finished from the file when the
    reads were not in order."""
    file, valid, _ = make_file(seed, 150, 1000)
    k = kernel.SegmentBuilder(memoryview(file), FILE_START, 0, valid)
    ref = twin.SegmentBuilder(file, FILE_START, 0, valid).object_bytes()
    for c in cuts:
        at = c % (k.size + 1)
        out = bytearray(min(5000, k.size - at) + 7)
        got = k.read_into(at, out)
        assert got == min(len(out), k.size - at)
        assert bytes(out[:got]) == ref[at:at + got]
    assert k.data_crc == zlib.crc32(ref[:k.data_len])
    with pytest.raises(ValueError):
        k.read_into(k.size + 1, bytearray(1))


def test_many_records_fences_and_queue_ends():
    """More than 4096 records (three phy fences); with queue_ends saying the queue already
    holds a file's first record's offset, that record gets no unit, as dispatch left it."""
    file, valid, unit_less = make_file(7, 9000, 40, gaps=False)
    k = kernel.SegmentBuilder(file, FILE_START, 0, valid)
    check_t1(whole(k, 1 << 20), file, valid, unit_less)
    t, f = kernel.parse_segment(whole(k, 1 << 20))
    assert len(f.fences) == 3
    first = records_of(file, valid)[0]
    name = first[2].decode()
    ends = {(name, first[3]): first[4] + 1}
    k2 = kernel.SegmentBuilder(file, FILE_START, 0, valid, queue_ends=ends)
    w2 = twin.SegmentBuilder(file, FILE_START, 0, valid, queue_ends=ends)
    assert whole(k2, 1 << 16) == w2.object_bytes()
    if first[0] not in unit_less:
        assert first[0] in k2.unit_less() and first[0] not in k.unit_less()


def test_empty_file_and_bad_arguments():
    k = kernel.SegmentBuilder(b"\0" * 100, FILE_START, 0, 0)
    obj = whole(k, 7)
    assert obj == twin.SegmentBuilder(b"\0" * 100, FILE_START, 0, 0).object_bytes()
    t, f = kernel.parse_segment(obj)
    assert (t.record_count, t.data_len, f.groups, f.phy_index) == (0, 0, [], b"")
    for builder in (kernel.SegmentBuilder, twin.SegmentBuilder):
        with pytest.raises(ValueError):
            builder(b"\0" * 10, FILE_START, 0, 11)
        with pytest.raises(ValueError):
            builder(b"", -1, 0, 0)


def test_damaged_file_is_refused():
    """A record that does not parse, a wrong PHYSICALOFFSET or a blank inside the valid length:
    CorruptRecordError naming the position, from the kernel and the twin."""
    file, valid, _ = make_file(3, 20, 100)
    recs = records_of(file, valid)
    bad_magic = bytearray(file)
    bad_magic[recs[5][0] + 4] ^= 0x55
    bad_phy = bytearray(file)
    bad_phy[recs[3][0] + 35] ^= 1
    for buf, length in ((bad_magic, valid), (bad_phy, valid), (file, valid + 8), (file, valid - 1)):
        for builder in (kernel.SegmentBuilder, twin.SegmentBuilder):
            with pytest.raises(CorruptRecordError):
                builder(bytes(buf), FILE_START, 0, length)
    flipped_body = bytearray(file)
    flipped_body[recs[2][0] + recs[2][1] - 20] ^= 1   # inside the properties: TOTALSIZE still fits
    body_at = recs[4][0] + 88                          # first body byte of record 4
    flipped_body[body_at] ^= 1
    kernel.SegmentBuilder(bytes(flipped_body), FILE_START, 0, valid)  # no CRC check by default
    with pytest.raises(CorruptRecordError, match="CRC"):
        kernel.SegmentBuilder(bytes(flipped_body), FILE_START, 0, valid, check_crc=True)


# -- lookups against a brute-force scan ------------------------------------------------------------

def brute_groups(k) -> dict[tuple[bytes, int], list[tuple[int, int, int, int]]]:
    """(queue offset, store timestamp, data position, size) of each queue group's records, from
    the object by struct."""
    obj = whole(k, 1 << 20)
    out = {}
    for e in k.directory:
        if e.no_queue:
            continue
        rows, p = [], e.data_start
        while p < e.data_start + e.data_length:
            size, = struct.unpack_from(">i", obj, p)
            qo, = struct.unpack_from(">q", obj, p + 20)
            ts, = struct.unpack_from(">q", obj, p + 56)
            rows.append((qo, ts, p, size))
            p += size
        out[(e.topic, e.queue_id)] = rows
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 400))
def test_lookups_against_brute_force(seed, n):
    file, valid, _ = make_file(seed, n, 200)
    k = kernel.SegmentBuilder(file, FILE_START, 0, valid)
    obj = whole(k, 1 << 20)
    rnd = random.Random(seed)
    for mod in (kernel, twin):
        trailer, footer = mod.parse_segment(obj)
        for (topic, qid), rows in brute_groups(k).items():
            g = footer.group(topic, qid)
            assert g >= 0 and footer.groups[g].topic == topic
            lo, hi = rows[0][0], rows[-1][0]
            for q in list(range(max(0, lo - 2), hi + 3)) + [rnd.randrange(hi + 1)]:
                got = mod.queue_offset_range(footer, g, q)
                want = next((r for r in rows if r[0] >= q), None)
                if q < lo or q > hi:
                    assert got is None
                    continue
                assert got is not None and got[1] - got[0] <= sum(sorted(r[3] for r in rows)[-65:])
                found = mod.find_queue_offset(obj[got[0]:got[1]], q)
                assert found is not None and want is not None
                assert (got[0] + found[0], found[1], found[2]) == (want[2], want[3], want[0])
            for ts in sorted({r[1] for r in rows} | {rows[0][1] - 1, rows[-1][1] + 1, rows[len(rows) // 2][1] + 1}):
                start, stop, after = mod.time_range(footer, g, ts)
                want_q = next((r[0] for r in rows if r[1] >= ts), hi + 1)
                assert mod.find_time(obj[start:stop], ts, after) == want_q
        assert footer.group(b"NoSuchTopic", 0) == -1
        for file_pos, size, *_ in records_of(file, valid):
            rng = mod.phy_entries_range(trailer, footer.fences, file_pos)
            assert rng is not None and rng[1] - rng[0] <= 4096 * 8
            data_pos = mod.phy_lookup(obj[rng[0]:rng[1]], file_pos)
            assert obj[data_pos:data_pos + size] == file[file_pos:file_pos + size]
            assert mod.phy_lookup(obj[rng[0]:rng[1]], file_pos + 1) == -1


# -- damaged objects: the named error, never wrong data ---------------------------------------------

@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), where=st.integers(0, 1 << 30), bit=st.integers(0, 7),
       cut=st.integers(1, 1 << 30))
def test_damaged_objects_raise(seed, where, bit, cut):
    file, valid, _ = make_file(seed, 60, 300)
    obj = whole(kernel.SegmentBuilder(file, FILE_START, 0, valid), 4096)
    t = kernel.parse_trailer(obj[-64:])
    tail = obj[t.data_len:]        # footer + trailer: any flipped bit there is caught
    at = t.data_len + where % len(tail)
    flipped = bytearray(obj)
    flipped[at] ^= 1 << bit
    truncated = obj[:len(obj) - 1 - cut % (len(obj) - 1)]
    for mod in (kernel, twin):
        for bad in (bytes(flipped), truncated, obj + b"\0"):
            with pytest.raises(CorruptSegmentError) as info:
                mod.parse_segment(bad)
            assert "segment" in str(info.value)
    # a flipped data byte is caught by the data CRC
    data_flip = bytearray(obj)
    data_flip[where % t.data_len] ^= 1 << bit
    assert zlib.crc32(bytes(data_flip[:t.data_len])) != t.data_crc


def test_error_names_the_field():
    file, valid, _ = make_file(1, 30, 50)
    obj = bytearray(whole(kernel.SegmentBuilder(file, FILE_START, 0, valid), 1 << 20))
    for mod in (kernel, twin):
        bad = bytearray(obj)
        bad[-64] ^= 1
        with pytest.raises(CorruptSegmentError, match="magic"):
            mod.parse_segment(bytes(bad))
        bad = bytearray(obj)
        bad[-30] ^= 1
        with pytest.raises(CorruptSegmentError, match="trailer CRC"):
            mod.parse_segment(bytes(bad))
        t = mod.parse_trailer(bytes(obj[-64:]))
        bad = bytearray(obj)
        bad[t.data_len + 3] ^= 1
        with pytest.raises(CorruptSegmentError, match="footer CRC"):
            mod.parse_segment(bytes(bad))
        with pytest.raises(CorruptSegmentError, match="64"):
            mod.parse_trailer(bytes(obj[-63:]))
        with pytest.raises(CorruptSegmentError, match="footer is"):
            mod.parse_footer(bytes(obj[t.data_len:t.data_len + t.footer_len - 1]), t)


# -- a real store's files against its ConsumeQueues -------------------------------------------------

def test_real_store_files_match_consume_queues(tmp_path):
    """A MessageStore writes small files (topics, queues, batches, PREPARED/ROLLBACK records);
    every closed file's segment passes T1 and its queue groups are exactly the units its
    ConsumeQueues hold for that file."""
    root = str(tmp_path / "store")
    fs = 256 * 1024
    store = MessageStore(root, mapped_file_size_commit_log=fs, max_message_size=16 * 1024)
    rnd = random.Random(28)
    try:
        for i in range(1500):
            topic = rnd.choice(["TopicA", "TopicB", "TopicC"])
            qid = rnd.randrange(4)
            body = rnd.randbytes(rnd.randrange(4096))
            if i % 50 == 7:
                store.put_messages([Message(topic, body[:100] + bytes([j]), queue_id=qid) for j in range(5)]).check()
            else:
                tx = rnd.choice([0] * 8 + [PREPARED, COMMIT, ROLLBACK])
                store.put_message(Message(topic, body, queue_id=qid, tags="t", sys_flag=tx)).check()
        store.flush()
        store.wait_dispatched()
    finally:
        store.shutdown()
    cl = os.path.join(root, "commitlog")
    names = sorted(os.listdir(cl))
    assert len(names) >= 3
    units: dict[tuple[bytes, int], list[tuple[int, int, int]]] = {}  # (qo, phy, size)
    cq_root = os.path.join(root, "consumequeue")
    for topic in os.listdir(cq_root):
        for qid in os.listdir(os.path.join(cq_root, topic)):
            rows = []
            for name in sorted(os.listdir(os.path.join(cq_root, topic, qid))):
                with open(os.path.join(cq_root, topic, qid, name), "rb") as fh:
                    b = fh.read()
                for j in range(0, len(b) - 19, 20):
                    phy, size, _tags = struct.unpack_from(">qiq", b, j)
                    if size > 0 and phy >= 0 and size != 0x7FFFFFFF:
                        rows.append((int(name) // 20 + j // 20, phy, size))
            units[(topic.encode(), int(qid))] = rows
    unit_less_seen = 0
    for name in names[:-1]:           # the closed files
        with open(os.path.join(cl, name), "rb") as fh:
            file = fh.read()
        start = int(name)
        recs = records_of_until_blank(file)
        valid = recs[-1][0] + recs[-1][1] if recs else 0
        mapped = MappedFile.open(os.path.join(cl, name), fs, readonly=True)
        try:
            k = kernel.SegmentBuilder(mapped, start, 0, valid)   # straight from the mapping
            obj = whole(k, 64 * 1024)
            del k
        finally:
            mapped.close()
        k = kernel.SegmentBuilder(file, start, 0, valid)
        assert whole(k, 100_000) == obj == twin.SegmentBuilder(file, start, 0, valid).object_bytes()
        in_file = {key: [u for u in rows if start <= u[1] < start + fs] for key, rows in units.items()}
        unit_phys = {u[1] - start for rows in in_file.values() for u in rows}
        check_t1(obj, file, valid, {r[0] for r in recs} - unit_phys, file_start=start)
        unit_less_seen += len(k.unit_less())
        groups = brute_groups(k)
        assert set(groups) == {key for key, rows in in_file.items() if rows}
        for key, rows in groups.items():
            want = in_file[key]
            assert [r[0] for r in rows] == [u[0] for u in want]
            for r, u in zip(rows, want):
                assert obj[r[2]:r[2] + r[3]] == file[u[1] - start:u[1] - start + u[2]]
    assert unit_less_seen > 0, "the closed files hold PREPARED/ROLLBACK records"


def records_of_until_blank(file: bytes) -> list[tuple[int, int, bytes, int, int, int]]:
    pos = 0
    while pos + 8 <= len(file):
        size, magic = struct.unpack_from(">iI", file, pos)
        if magic == BLANK_MAGIC or size <= 0:
            break
        pos += size
    return records_of(file, pos)


# -- the compacted index object (.mqidx, spec §5.3) -------------------------------------------------

def local_index(seed: int, slots: int, entries: int, n_keys: int, puts: int):
    """A local IndexFile (the twin's, byte for byte the kernel's layout) with puts of n_keys keys."""
    from mqstore.twin.index import IndexFile

    rnd = random.Random(seed)
    f = IndexFile(slots, entries)
    keys = [f"T#k{rnd.randrange(1 << 30)}" for _ in range(n_keys)]
    ts = 1_700_000_000_000
    for i in range(puts):
        ts += rnd.randrange(2500)
        if not f.put_key(rnd.choice(keys), FILE_START + 100 * i, ts):
            break
    return f, keys


def query_compacted(mod, obj: bytes, key: str, max_num: int, begin: int, end: int) -> list[int]:
    from mqstore.twin.index import index_key_hash

    h = mod.parse_index_header(obj[:48])
    kh = index_key_hash(key)
    a, b = mod.index_slot_range(h, kh)
    run = mod.index_entries_range(h, obj[a:b])
    return [] if run is None else mod.index_query(obj[run[0]:run[1]], h, kh, max_num, begin, end)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), slots=st.integers(1, 64), entries=st.integers(2, 400),
       n_keys=st.integers(1, 80), puts=st.integers(0, 500))
def test_compacted_index_parity_and_queries(seed, slots, entries, n_keys, puts):
    """compact_index equals its twin; every key query on the object (one slot read, one run
    read) returns what IndexFile.selectPhyOffset returns on the local file."""
    f, keys = local_index(seed, slots, entries, n_keys, puts)
    obj = kernel.compact_index(bytes(f.data), slots, entries, 1)
    assert obj == twin.compact_index(bytes(f.data), slots, entries, 1)
    h = kernel.verify_index(obj)
    assert h == twin.verify_index(obj)
    assert (h.log_id, h.slot_count, h.entry_count) == (1, slots, max(0, f.index_count - 1))
    assert (h.begin_timestamp, h.end_timestamp) == (f.begin_timestamp, f.end_timestamp)
    rnd = random.Random(seed)
    for key in keys + ["T#absent"]:
        windows = [(0, 1 << 62), (f.begin_timestamp + rnd.randrange(1 << 20), f.end_timestamp)]
        for begin, end in windows:
            for max_num in (1, 3, 64):
                want = f.select_phy_offset(key, max_num, begin, end)
                assert query_compacted(kernel, obj, key, max_num, begin, end) == want
                assert query_compacted(twin, obj, key, max_num, begin, end) == want


def test_compacted_index_damage_and_arguments():
    f, keys = local_index(5, 16, 300, 40, 299)
    obj = kernel.compact_index(bytes(f.data), 16, 300, 0)
    for mod in (kernel, twin):
        for at, match in ((0, "magic"), (9, "version"), (60, "CRC"), (len(obj) - 3, "CRC")):
            bad = bytearray(obj)
            bad[at] ^= 0x10
            with pytest.raises(CorruptSegmentError, match=match):
                mod.verify_index(bytes(bad))
        with pytest.raises(CorruptSegmentError, match="header says"):
            mod.verify_index(obj[:-1])
        with pytest.raises(CorruptSegmentError, match="8"):
            mod.index_entries_range(mod.parse_index_header(obj[:48]), obj[48:55])
        with pytest.raises(ValueError):
            mod.compact_index(bytes(f.data), 16, 301, 0)
    h = kernel.parse_index_header(obj[:48])
    with pytest.raises(CorruptSegmentError, match="outside|holds"):
        kernel.index_entries_range(h, struct.pack(">II", h.entry_count, 1))


def test_real_store_index_files_compact(tmp_path):
    """A store's own IndexFiles (small geometry, several files): every key found through the
    compacted object is what the local file answers."""
    from mqstore.twin.index import IndexFile

    root = str(tmp_path / "store")
    slots, entries = 32, 150
    store = MessageStore(root, mapped_file_size_commit_log=256 * 1024, max_message_size=16 * 1024,
                         max_hash_slot_num=slots, max_index_num=entries)
    try:
        for i in range(400):
            store.put_message(Message("TopicI", b"b%d" % i, keys=[f"k{i % 37}", f"u{i}"])).check()
        store.flush()
        store.wait_dispatched()
    finally:
        store.shutdown()
    names = sorted(os.listdir(os.path.join(root, "index")))
    assert len(names) >= 3
    found = 0
    for name in names:
        with open(os.path.join(root, "index", name), "rb") as fh:
            data = bytearray(fh.read())
        local = IndexFile(slots, entries, data=data)
        obj = kernel.compact_index(bytes(data), slots, entries, 0)
        assert kernel.verify_index(obj).entry_count == local.index_count - 1
        for key in [f"TopicI#k{j}" for j in range(37)] + [f"TopicI#u{j}" for j in range(0, 400, 7)]:
            want = local.select_phy_offset(key, 64, 0, 1 << 62)
            assert query_compacted(kernel, obj, key, 64, 0, 1 << 62) == want
            found += len(want)
    assert found > 400
