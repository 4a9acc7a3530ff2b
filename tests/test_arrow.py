"""The Arrow column kernel (ext/mqstore/queue/_arrow.pyx) against its pure-Python twin (mqstore.twin.arrow):
records encoded by the codec into CommitLog-shaped files, read back by span (the whole-log
scan) and by ConsumeQueue units, every column compared value by value. Bodies are stored as
RocketMQ's producers store them (zlib, LZ4, ZSTD per sysFlag; tests/helpers_bodies.py): the body
column holds them as sent, or as stored with decompress=False."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers_bodies import FLAGS, broken_bodies, compress, good_bodies, with_stored_body
from test_twin_codec import records

from mqstore.queue import _arrow
from mqstore import compression
from mqstore.log._codec import encode_record
from mqstore.errors import BodyDecompressError
from mqstore.twin import arrow as twin
from mqstore.twin import codec as c

FILE_SIZE = 1 << 16
UNIT = struct.Struct(">qiq")


def _log(fields_list: list[dict], file_size: int = FILE_SIZE) -> tuple[list[bytearray], list[int]]:
    """CommitLog files holding the records (PHYSICALOFFSET set to where each lands), an
    END_OF_FILE blank where the next does not fit; returns the files and the offsets."""
    files = [bytearray(file_size)]
    phys = []
    pos = 0
    for fields in fields_list:
        data = bytearray(encode_record(**{**fields, "body_crc": None}))
        if pos % file_size + len(data) + 8 > file_size:
            left = file_size - pos % file_size
            struct.pack_into(">ii", files[-1], pos % file_size, left, c.BLANK_MAGIC_CODE)
            files.append(bytearray(file_size))
            pos += left
        struct.pack_into(">q", data, 28, pos)
        files[-1][pos % file_size:pos % file_size + len(data)] = data
        phys.append(pos)
        pos += len(data)
    return files, phys


def _end(files: list[bytearray], phys: list[int]) -> int:
    """The end of the last record."""
    return phys[-1] + struct.unpack_from(">i", files[-1], phys[-1] % FILE_SIZE)[0]


def _expected(files: list[bytearray], phys: list[int], columns=twin.COLUMNS) -> list[dict]:
    recs = [c.decode_record(files[p // FILE_SIZE], p % FILE_SIZE) for p in phys]
    return twin.rows(recs, columns)


MAX_MS = (2**63 - 1) // 1000  # timestamps beyond are refused (test_timestamps_microseconds_cannot_hold)
SMALL = records().filter(lambda f: len(f["topic"].encode()) + len(f["body"]) < 2000
                         and abs(f["born_timestamp"]) <= MAX_MS and abs(f["store_timestamp"]) <= MAX_MS
                         ).flatmap(with_stored_body)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SMALL, min_size=1, max_size=12))
def test_span_scan_matches_the_twin(fields_list):
    files, phys = _log(fields_list)
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    cols = _arrow.BatchColumns()
    assert cols.add_span(source, 0, _end(files, phys)) == (len(phys), _end(files, phys))
    assert cols.rows == len(phys)
    assert twin.buffers_to_rows(cols.buffers(), cols.rows) == _expected(files, phys)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SMALL, min_size=1, max_size=8), st.data())
def test_units_with_fillers_and_a_min_offset_match_the_twin(fields_list, data):
    files, phys = _log(fields_list)
    min_phy = data.draw(st.sampled_from([0] + phys))
    picked = data.draw(st.lists(st.sampled_from(phys), max_size=10))
    units = b"".join(UNIT.pack(0, 0x7FFFFFFF, 0) if data.draw(st.booleans()) and i % 3 == 0 else b""
                     for i in range(len(picked)))
    sizes = {p: struct.unpack_from(">i", files[p // FILE_SIZE], p % FILE_SIZE)[0] for p in phys}
    units += b"".join(UNIT.pack(p, sizes[p], 7) for p in picked)
    columns = data.draw(st.lists(st.sampled_from(twin.COLUMNS), min_size=1, unique=True))
    cols = _arrow.BatchColumns(columns)
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    kept = [p for p in picked if p >= min_phy]
    assert cols.add_units(source, units, min_phy) == len(kept)
    assert cols.below_min == len(picked) - len(kept)
    assert twin.buffers_to_rows(cols.buffers(), cols.rows) == _expected(files, kept, columns)


def test_properties_follow_rocketmq_parsing_rules():
    """Duplicates keep the first position and the last value; a segment without a name, a
    value or a \\x01 is skipped; a value may hold \\x01; TAGS and KEYS come out of the map."""
    props = "TAGS\x01a\x02\x01x\x02KEYS\x01k1 k2\x02noval\x01\x02junk\x02TAGS\x01b\x02v\x01x\x01y"
    files, phys = _log([dict(topic="T", body=b"b", properties=props)])
    cols = _arrow.BatchColumns(["tags", "keys", "properties"])
    cols.add_span(_arrow.RecordSource(0, FILE_SIZE, files), 0, _end(files, phys))
    (got,) = twin.buffers_to_rows(cols.buffers(), 1)
    assert got == {"tags": "b", "keys": "k1 k2", "properties": [("TAGS", "b"), ("KEYS", "k1 k2"), ("v", "x\x01y")]}


def test_hosts_and_msg_id_for_ipv4_and_ipv6():
    files, phys = _log([dict(topic="T", body=b"", born_host=("10.1.2.3", 10911), store_host=("::1", 7)),
                        dict(topic="T", body=b"", born_host=("::ffff:0:1", 1), store_host=("192.168.0.1", 65535))])
    cols = _arrow.BatchColumns(["born_host", "store_host", "msg_id", "tags", "keys"])
    cols.add_span(_arrow.RecordSource(0, FILE_SIZE, files), 0, _end(files, phys))
    got = twin.buffers_to_rows(cols.buffers(), 2)
    assert got[0]["born_host"] == "10.1.2.3:10911" and got[0]["store_host"] == "[::1]:7"
    assert got[1]["store_host"] == "192.168.0.1:65535"
    assert got[0]["msg_id"] == c.msg_id(("::1", 7), phys[0]) and len(got[0]["msg_id"]) == 56
    assert got[1]["msg_id"] == c.msg_id(("192.168.0.1", 65535), phys[1])
    assert got[0]["tags"] is None and got[1]["keys"] is None


def test_bad_input_names_the_cause():
    files, phys = _log([dict(topic="T", body=b"x")])
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    with pytest.raises(ValueError, match="unknown column"):
        _arrow.BatchColumns(["topic", "colour"])
    with pytest.raises(ValueError, match="no record at physical offset 3"):
        _arrow.BatchColumns().add_units(source, UNIT.pack(3, 100, 0), 0)
    with pytest.raises(ValueError, match="not in the mapped CommitLog files"):
        _arrow.BatchColumns().add_units(source, UNIT.pack(FILE_SIZE * 5, 100, 0), 0)
    with pytest.raises(ValueError, match="less than file_size"):
        _arrow.RecordSource(0, FILE_SIZE, [bytearray(10)])


def test_timestamps_microseconds_cannot_hold_are_refused():
    files, phys = _log([dict(topic="T", body=b"", store_timestamp=MAX_MS + 1)])
    with pytest.raises(OverflowError, match="physical offset 0 has STORETIMESTAMP"):
        _arrow.BatchColumns(["store_timestamp"]).add_span(_arrow.RecordSource(0, FILE_SIZE, files), 0,
                                                          _end(files, phys))
    assert _arrow.BatchColumns(["body"]).add_span(_arrow.RecordSource(0, FILE_SIZE, files), 0,
                                                  _end(files, phys))[0] == 1


def test_a_span_read_in_slices_of_rows_gives_the_same_rows():
    files, phys = _log([dict(topic="T", body=bytes([i]) * (i * 300)) for i in range(40)])
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    end = _end(files, phys)
    got, at = [], 0
    while at < end:
        cols = _arrow.BatchColumns(["commitlog_offset", "body"])
        added, at = cols.add_span(source, at, end, max_rows=7)
        assert 0 < added <= 7
        got += twin.buffers_to_rows(cols.buffers(), cols.rows)
    assert got == _expected(files, phys, ["commitlog_offset", "body"]) and len(files) > 1


def test_buffers_are_views_and_seal_the_batch():
    """buffers() hands out views of the batch's memory (no copy): adding afterwards would move
    it under them, so it is refused."""
    files, phys = _log([dict(topic="T", body=b"abc")])
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    cols = _arrow.BatchColumns(["body"])
    cols.add_span(source, 0, _end(files, phys))
    offsets, data = cols.buffers()["body"]
    assert bytes(memoryview(data)) == b"abc" and memoryview(data).readonly and len(offsets) == 8
    with pytest.raises(ValueError, match="buffers were handed out"):
        cols.add_span(source, 0, _end(files, phys))
    del cols  # the views keep the memory alive
    assert bytes(data) == b"abc"


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SMALL, min_size=1, max_size=12), st.integers(0, 5), st.integers(0, 3000))
def test_a_span_batch_is_bounded_by_rows_and_bytes_like_the_twin(fields_list, max_rows, max_bytes):
    """Issue 14: batches of 65,536 rows of 4 KiB bodies (271 MB) ran Spark out of direct memory."""
    files, phys = _log(fields_list)
    end = _end(files, phys)
    sizes = [struct.unpack_from(">i", files[p // FILE_SIZE], p % FILE_SIZE)[0] for p in phys]
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    at, batches = 0, []
    while at < end:
        cols = _arrow.BatchColumns()
        added, at = cols.add_span(source, at, end, max_rows, max_bytes)
        assert added >= 1
        batches.append(added)
        if len(batches) > len(phys):
            break
    expected, i = [], 0
    while i < len(sizes):
        n = twin.take_within(sizes[i:], max_rows, max_bytes)
        expected.append(n)
        i += n
    assert batches == expected
    if max_bytes:  # every batch of more than one record stays within the bytes
        starts = [sum(batches[:k]) for k in range(len(batches))]
        assert all(n == 1 or sum(sizes[s:s + n]) <= max_bytes for s, n in zip(starts, batches))


@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.sampled_from([0, 91, 500, 4096, 70000, 0x7FFFFFFF])),
                max_size=40), st.data())
def test_cut_units_matches_the_twin(units, data):
    buf = b"".join(UNIT.pack(phy, size, 0) for phy, size in units)
    start = data.draw(st.integers(0, len(units)))
    max_rows = data.draw(st.integers(0, 10))
    max_bytes = data.draw(st.integers(0, 100_000))
    assert _arrow.cut_units(buf, start, max_rows, max_bytes) == twin.cut_units(buf, start, max_rows, max_bytes)


# -- bodies as the producer sent them ---------------------------------------------------------
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SMALL, min_size=1, max_size=8))
def test_decompress_false_gives_the_stored_bodies_and_the_same_other_columns(fields_list):
    files, phys = _log(fields_list)
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    raw = _arrow.BatchColumns(decompress=False)
    raw.add_span(source, 0, _end(files, phys))
    assert not raw.decompress and _arrow.BatchColumns().decompress
    recs = [c.decode_record(files[p // FILE_SIZE], p % FILE_SIZE) for p in phys]
    got = twin.buffers_to_rows(raw.buffers(), raw.rows)
    assert got == twin.rows(recs, decompress=False)
    assert [r["body"] for r in got] == [f["body"] for f in fields_list]
    assert [r["sys_flag"] for r in got] == [rec.sys_flag for rec in recs]  # the stored sysFlag


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(good_bodies(), min_size=0, max_size=3), broken_bodies(), st.sampled_from(["span", "units"]))
def test_a_body_that_does_not_inflate_is_named_as_the_twin_names_it(before, broken, how):
    """The batch stops at the record, with the twin's BodyDecompressError naming its topic,
    queue, queue offset and physical offset; with decompress=False it reads as stored."""
    fields = [dict(topic="Tb", body=stored, sys_flag=FLAGS[kind], queue_id=3, queue_offset=i)
              for i, (kind, _, stored) in enumerate(before)]
    fields.append(dict(topic="Tb", body=broken[1], sys_flag=broken[0], queue_id=3, queue_offset=len(before)))
    files, phys = _log(fields)
    source = _arrow.RecordSource(0, FILE_SIZE, files)
    with pytest.raises(BodyDecompressError) as want:
        _expected(files, phys)
    cols = _arrow.BatchColumns()
    with pytest.raises(BodyDecompressError) as got:
        if how == "span":
            cols.add_span(source, 0, _end(files, phys))
        else:
            cols.add_units(source, b"".join(UNIT.pack(p, len(encode_record(**{**f, "body_crc": None})), 0)
                                            for p, f in zip(phys, fields)))
    assert str(got.value) == str(want.value)
    assert f"queue offset {len(before)} of Tb/3 (physical offset {phys[-1]})" in str(got.value)
    assert "does not inflate" in str(got.value) and "decompress=False" in str(got.value)
    raw = _arrow.BatchColumns(["body", "sys_flag"], decompress=False)
    raw.add_span(source, 0, _end(files, phys))
    rows = twin.buffers_to_rows(raw.buffers(), raw.rows)
    assert [r["body"] for r in rows] == [f["body"] for f in fields]
    assert rows[-1]["sys_flag"] == broken[0]
    no_body = _arrow.BatchColumns(["topic", "queue_offset"])  # nothing to inflate
    assert no_body.add_span(source, 0, _end(files, phys))[0] == len(fields)


def test_a_body_past_the_inflated_size_bound_is_refused(monkeypatch):
    payload = b"0123456789" * 300
    for kind in ("zlib", "lz4", "zstd"):
        files, phys = _log([dict(topic="T", body=compress(payload, kind), sys_flag=FLAGS[kind])])
        source = _arrow.RecordSource(0, FILE_SIZE, files)
        monkeypatch.setattr(compression, "MAX_INFLATED_BYTES", len(payload))
        cols = _arrow.BatchColumns(["body"])
        cols.add_span(source, 0, _end(files, phys))
        assert twin.buffers_to_rows(cols.buffers(), 1) == [{"body": payload}]
        monkeypatch.setattr(compression, "MAX_INFLATED_BYTES", len(payload) - 1)
        with pytest.raises(BodyDecompressError, match=f"inflate \\({kind}\\): it inflates past {len(payload) - 1} "):
            _arrow.BatchColumns(["body"]).add_span(source, 0, _end(files, phys))


def test_keep_freed_memory_is_taken_by_glibc():
    """The reader processes' malloc setting (no fresh-page faults per batch) is accepted here."""
    from mqstore.queue._arrow import keep_freed_memory

    assert keep_freed_memory() is True


_QUEUE_UNITS = st.lists(st.one_of(st.just((0, 0x7FFFFFFF)), st.tuples(st.integers(0, 1 << 40), st.integers(1, 1 << 20))),
                        max_size=40)


@given(_QUEUE_UNITS, st.lists(st.sampled_from(twin.QUEUE_COLUMNS), min_size=1, unique=True),
       st.text(min_size=1, max_size=20), st.integers(0, 1023), st.integers(0, 1 << 40), st.integers(0, 1 << 40))
def test_queue_units_alone_match_the_twin(units, columns, topic, queue_id, first, min_phy):
    raw = b"".join(UNIT.pack(p, s, 0) for p, s in units)
    cols = _arrow.BatchColumns(columns)
    assert cols.queue_only
    rows, below = twin.queue_rows(raw, topic, queue_id, first, min_phy, columns)
    assert cols.add_queue_units(raw, topic, queue_id, first, min_phy) == len(rows) == cols.rows
    assert cols.below_min == below
    assert twin.buffers_to_rows(cols.buffers(), cols.rows) == rows


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SMALL, min_size=1, max_size=8), st.data())
def test_queue_units_alone_give_what_the_records_say(fields_list, data):
    """What add_queue_units takes from the units is what add_units reads in the records their
    units point at, when the units are the queue's (its topic and id, at its offsets)."""
    fields_list = [dict(f, topic="QueueOnly", queue_id=3, queue_offset=100 + i) for i, f in enumerate(fields_list)]
    files, phys = _log(fields_list)
    sizes = [struct.unpack_from(">i", files[p // FILE_SIZE], p % FILE_SIZE)[0] for p in phys]
    raw = b"".join(UNIT.pack(p, s, 0) for p, s in zip(phys, sizes))
    columns = data.draw(st.lists(st.sampled_from(twin.QUEUE_COLUMNS), min_size=1, unique=True))
    min_phy = data.draw(st.sampled_from([0] + phys))
    by_records, alone = _arrow.BatchColumns(columns), _arrow.BatchColumns(columns)
    by_records.add_units(_arrow.RecordSource(0, FILE_SIZE, files), raw, min_phy)
    alone.add_queue_units(raw, "QueueOnly", 3, 100, min_phy)
    assert alone.below_min == by_records.below_min
    assert (twin.buffers_to_rows(alone.buffers(), alone.rows)
            == twin.buffers_to_rows(by_records.buffers(), by_records.rows))


def test_queue_units_alone_refuse_columns_that_need_the_records():
    cols = _arrow.BatchColumns(["queue_id", "body"])
    assert not cols.queue_only
    with pytest.raises(ValueError, match="need the records"):
        cols.add_queue_units(UNIT.pack(0, 10, 0), "T", 0, 0)
    with pytest.raises(ValueError, match="first_offset"):
        _arrow.BatchColumns(["queue_id"]).add_queue_units(UNIT.pack(0, 10, 0), "T", 0, -1)
    with pytest.raises(ValueError, match="need the records"):
        twin.queue_rows(UNIT.pack(0, 10, 0), "T", 0, 0, columns=["tags"])
