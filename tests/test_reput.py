"""The batch parser of the concurrent dispatch (mqstore.queue._reput, spec §10.2) against its twin
(mqstore.twin.reput), and its in-order apply against the serial kernel.

Logs are built byte by byte (any topic, properties, transaction type, V2 records, IPv6 hosts,
blanks and damage), so the parse is checked on what the put path would never write, too.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mqstore.queue._dispatch import DispatchKernel
from mqstore.queue._index import index_key_hash
from mqstore.queue._reput import BatchParser
from mqstore.twin import reput as twin
from helpers_mem import mem_queue_class
from mqstore.twin.codec import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, record_length

DELAYS = (1000, 5000, 10000, 30000)
CQ_FILE = 20 * 16  # units per in-memory ConsumeQueue file: rolls are frequent


def raw_record(topic: bytes, props: bytes, *, queue_id: int = 0, queue_offset: int = 0, phy: int = 0,
               sys_flag: int = 0, store_ts: int = 0, body: bytes = b"", v2: bool = False) -> bytes:
    """One CommitLog record (spec §1.2) with exactly these bytes for topic and properties."""
    born, store = (20 if sys_flag & 0x10 else 8), (20 if sys_flag & 0x20 else 8)
    size = record_length(len(body), len(topic), len(props), sys_flag, v2)
    return b"".join([
        struct.pack(">iiiiiqqiq", size, MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE, 0, queue_id, 0,
                    queue_offset, phy, sys_flag, store_ts - 5),
        bytes(born), struct.pack(">q", store_ts), bytes(store), struct.pack(">iqi", 0, 0, len(body)), body,
        struct.pack(">h" if v2 else ">B", len(topic)), topic, struct.pack(">h", len(props)), props,
    ])


def blank(size: int = 64) -> bytes:
    return struct.pack(">ii", size, BLANK_MAGIC_CODE) + bytes(size - 8)


TOPICS = [b"T", b"TopicA", "Töpic".encode(), b"SCHEDULE_TOPIC_XXXX", b"%RETRY%g"]
NAMES = [b"TAGS", b"KEYS", b"UNIQ_KEY", b"DELAY", b"X"]
VALUES = [b"a", b"TagA", b"a\tb  c", b"\t k", "täg".encode(), b"k1 k2", b"  k3  k4 ", b" ", b"\xff\xfe", b"2", b"17", b"99", b"0", b"-1",
          "ключ 😀".encode(), b"\xe2\x82 x"]


@st.composite
def properties(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=24))
    pairs = draw(st.lists(st.tuples(st.sampled_from(NAMES + [b""]), st.sampled_from(VALUES + [b""])), max_size=5))
    return b"\x02".join(n + b"\x01" + v for n, v in pairs)


@st.composite
def logs(draw) -> bytes:
    """A log of records (with their phy fields set to their positions), maybe a blank and damage."""
    out = bytearray()
    next_offset: dict[tuple[bytes, int], int] = {}
    for _ in range(draw(st.integers(0, 40))):
        topic = draw(st.sampled_from(TOPICS))
        queue_id = draw(st.integers(0, 2))
        q = next_offset.get((topic, queue_id), 0) + draw(st.sampled_from([0, 0, 0, 0, -1, 2]))
        next_offset[(topic, queue_id)] = max(q, 0) + 1
        out += raw_record(topic, draw(properties()), queue_id=queue_id, queue_offset=max(q, 0), phy=len(out),
                          sys_flag=draw(st.sampled_from([0, 0, 0x4, 0x8, 0xC, 0x10, 0x20, 0x30, 0x18])),
                          store_ts=1_700_000_000_000 + len(out), body=draw(st.binary(max_size=40)),
                          v2=draw(st.booleans()))
    damage = draw(st.integers(0, 4))
    if damage == 1 and out:
        at = draw(st.integers(0, len(out) - 1))
        out[at] ^= draw(st.integers(1, 255))
    elif damage == 2:
        out += blank()
    elif damage == 3 and out:
        del out[draw(st.integers(0, len(out) - 1)):]
    return bytes(out)


def batches(data: bytes, batch_bytes: int) -> list[tuple[int, int, str, int]]:
    """The compiled cut over the whole of data, checked step by step against the twin."""
    parser = BatchParser(DELAYS)
    out, pos, reason = [], 0, "batch"
    while reason == "batch":
        stop, reason, n = parser.cut(data, pos, len(data), batch_bytes)
        assert (stop, reason, n) == twin.cut(data, pos, len(data), batch_bytes)
        out.append((pos, stop, reason, n))
        pos = stop
    return out


def as_twin(batch) -> twin.ParsedBatch:
    return twin.ParsedBatch(stop=batch.stop, reason=batch.reason, count=batch.count,
                            last_store_timestamp=batch.last_store_timestamp, units=batch.unit_list(),
                            index_keys=list(struct.iter_unpack("=qqq", batch.index_keys)))


def outcome(parse, *args):
    """The parse result as the twin's type, or the type of the exception it raised (a keyed
    record whose topic is not UTF-8 cannot be indexed: both raise UnicodeDecodeError)."""
    try:
        got = parse(*args)
    except UnicodeDecodeError as exc:
        return type(exc)
    return got if isinstance(got, twin.ParsedBatch) else as_twin(got)


@settings(max_examples=100)
@given(data=logs(), batch_bytes=st.integers(1, 3000), index_enable=st.booleans())
def test_cut_and_parse_match_the_twin(data, batch_bytes, index_enable):
    parser = BatchParser(DELAYS, index_enable=index_enable)
    for start, stop, _, n in batches(data, batch_bytes):
        got = outcome(parser.parse, data, 0, start, stop, n)
        assert got == outcome(twin.parse, data, start, stop, DELAYS, index_enable)
    # a batch that runs into a blank or damage reports it, as the serial kernel would
    assert outcome(parser.parse, data, 0, 0, len(data)) == outcome(twin.parse, data, 0, len(data), DELAYS,
                                                                    index_enable)


def test_batch_sizes_and_counts():
    one = raw_record(b"T", b"KEYS\x01a b", phy=0)
    batch = BatchParser().parse(one * 3, 0, 0, 3 * len(one), 3)
    assert (len(batch), batch.count, batch.unit_count, batch.queue_count) == (3, 3, 3, 1)
    assert batch.index_key_count == 6 == len(batch.index_keys) // 24
    assert batch.last_store_timestamp == 0 and batch.file_from == 0 and batch.start == 0


MemQueue = mem_queue_class(CQ_FILE)


def queue_table() -> tuple[dict[tuple[str, int], MemQueue], object]:
    queues: dict[tuple[str, int], MemQueue] = {}

    def lookup(topic: str, queue_id: int) -> MemQueue:
        return queues.setdefault((topic, queue_id), MemQueue(topic, queue_id))

    return queues, lookup


def serial_index_keys(requests) -> list[tuple[int, int, int]]:
    """What IndexService.build_index puts for the kernel's index requests (spec §4.4)."""
    out = []
    for topic, keys, uniq, phy, ts, _ in requests:
        names = ([uniq] if uniq else []) + ([k for k in keys.split(" ") if k] if keys else [])
        out += [(phy, ts, index_key_hash(f"{topic}#{k}")) for k in names]
    return out


@settings(max_examples=100)
@given(data=logs(), batch_bytes=st.integers(1, 3000))
def test_apply_in_batch_order_builds_what_the_serial_kernel_builds(data, batch_bytes):
    serial_queues, lookup = queue_table()
    serial = DispatchKernel(lookup, delay_levels_ms=DELAYS)
    try:
        stop, reason, records, units, last_ts = serial.dispatch(data, 0, 0, len(data))
    except UnicodeDecodeError:
        assume(False)  # a topic that is not UTF-8 stops both modes; the put path never writes one
    batch_queues, lookup = queue_table()
    kernel = DispatchKernel(lookup, delay_levels_ms=DELAYS)
    parser = BatchParser(DELAYS)
    got_records, got_units, keys, end, why = 0, 0, [], 0, "end"
    applied = []
    for start, cut, cut_reason, n in batches(data, batch_bytes):
        applied.append((start, cut, n))
        batch = parser.parse(data, 0, start, cut, n)
        got_units += kernel.apply(batch)
        got_records += batch.count
        keys += list(struct.iter_unpack("=qqq", batch.index_keys))
        end, why = batch.stop, batch.reason if batch.reason != "end" else cut_reason
        if batch.reason != "end":
            break
    assert (end, "end" if why == "batch" else why, got_records, got_units) == (stop, reason, records, units)
    assert keys == serial_index_keys(serial.index_requests)
    assert {k: q.contents() for k, q in batch_queues.items()} == {k: q.contents() for k, q in serial_queues.items()}
    # applying the same batches again appends nothing (idempotent re-dispatch); the batches
    # after one that stopped at a blank or damage were never applied
    for start, cut, n in applied:
        assert kernel.apply(parser.parse(data, 0, start, cut, n)) == 0


def test_non_ascii_tags_and_keys_are_hashed_as_java_does():
    data = raw_record("Töpic".encode(), "TAGS\x01täg\x02KEYS\x01ключ k2\x02UNIQ_KEY\x01u😀".encode(), phy=0)
    batch = BatchParser().parse(data, 0, 0, len(data))
    from mqstore.twin.codec import java_string_hash
    from mqstore.twin.index import index_key_hash as twin_key_hash

    assert batch.unit_list()[0][5] == java_string_hash("täg")
    assert [h for _, _, h in struct.iter_unpack("=qqq", batch.index_keys)] == [
        twin_key_hash(f"Töpic#{k}") for k in ("u😀", "ключ", "k2")]


def test_cut_stops_before_a_blank_and_at_batch_size():
    one = raw_record(b"T", b"", phy=0)
    data = one * 5 + blank() + one
    parser = BatchParser()
    assert parser.cut(data, 0, len(data), 2 * len(one) - 1) == (2 * len(one), "batch", 2)
    assert parser.cut(data, 0, len(data), 1 << 20) == (5 * len(one), "blank", 5)
    assert parser.cut(data, 0, 5 * len(one), 1 << 20) == (5 * len(one), "end", 5)
    bad = bytearray(data)
    bad[len(one) + 4] ^= 1  # the second record's magic
    assert parser.cut(bytes(bad), 0, len(bad), 1 << 20) == (len(one), "invalid", 1)


def test_apply_takes_only_parsed_batches():
    with pytest.raises(TypeError):
        DispatchKernel(lambda t, q: None).apply(object())


@pytest.mark.parametrize("batched", [False, True])
def test_a_damaged_queue_offset_far_past_the_end_is_skipped_not_filled(batched):
    """QUEUEOFFSET is outside the body CRC: a flipped high byte must not make dispatch write
    millions of filler units (the disk). The record is skipped and reported; the queue goes on."""
    log = b""
    for q in (0, (1 << 40) + 1, 1):
        log += raw_record(b"T", b"", queue_offset=q, phy=len(log), store_ts=1_700_000_000_000 + len(log),
                          body=b"q%d" % q)
    queues, lookup = queue_table()
    skipped: list = []
    kernel = DispatchKernel(lookup, delay_levels_ms=DELAYS, on_skipped=lambda *a: skipped.append(a))
    if batched:
        batch = BatchParser(DELAYS).parse(log, 0, 0, len(log), 3)
        assert kernel.apply(batch) == 2 and batch.stop == len(log)
    else:
        stop, reason, records, units, _ = kernel.dispatch(log, 0, 0, len(log))
        assert (stop, records, units) == (len(log), 3, 2)
    second = len(raw_record(b"T", b"", body=b"q0"))
    assert skipped == [(second, b"T", 0)]
    q = queues[("T", 0)]
    assert q.max_offset_in_queue == 2 and q.gaps == 0 and len(q.files) == 1
