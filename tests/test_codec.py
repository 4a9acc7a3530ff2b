"""The Cython codec against RocketMQ's bytes (spec §1) and against the pure-Python twin."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.log import _codec
from mqstore.errors import CorruptRecordError
from mqstore.twin import codec as twin

GOLDEN = bytes.fromhex(
    "0000008a daa320a7 69c865ed 00000003 00000007 000000000000002a 0000000000001000 00000000"
    "0000018bcfe56800 7f000001 000004d2 0000018bcfe5687b 0a000002 00002a9f 00000001 0000000000000000"
    "0000000e 48656c6c6f20526f636b65744d51 09 546f70696354657374"
    "0018 4b455953 01 6b657931206b657932 02 54414753 01 54616741".replace(" ", ""))

GOLDEN_FIELDS = dict(topic="TopicTest", body=b"Hello RocketMQ", properties={"KEYS": "key1 key2", "TAGS": "TagA"},
                     queue_id=3, flag=7, queue_offset=42, physical_offset=4096, born_timestamp=1700000000000,
                     store_timestamp=1700000000123, born_host=("127.0.0.1", 1234), store_host=("10.0.0.2", 10911),
                     reconsume_times=1)


def test_golden_vector_is_byte_identical():
    assert _codec.encode_record(**GOLDEN_FIELDS) == GOLDEN


def test_golden_vector_decodes_field_by_field():
    rec = _codec.decode_record(GOLDEN)
    assert rec.total_size == 138 and rec.magic == _codec.MESSAGE_MAGIC_CODE
    assert (rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset) == (3, 7, 42, 4096)
    assert rec.born_host == ("127.0.0.1", 1234) and rec.store_host == ("10.0.0.2", 10911)
    assert rec.store_timestamp == 1700000000123 and rec.reconsume_times == 1
    assert rec.body == b"Hello RocketMQ" and rec.topic == "TopicTest"
    assert rec.properties == {"KEYS": "key1 key2", "TAGS": "TagA"}
    assert rec.msg_id == "0A00000200002A9F0000000000001000"
    assert rec.tags_code == 2598919 and rec.keys == ["key1", "key2"]


def test_ipv6_golden_variant():
    fields = {**GOLDEN_FIELDS, "born_host": ("::1", 1234), "store_host": ("fe80::2", 10911)}
    raw = _codec.encode_record(**fields)
    assert len(raw) == 162
    rec = _codec.decode_record(raw)
    assert rec.sys_flag == 0x30
    assert rec.msg_id == "FE80000000000000000000000000000200002A9F0000000000001000"
    assert raw == twin.encode_record(**fields)


def test_batch_body_example():
    raw = _codec.encode_batch_body([(b"body", {"TAGS": "abc"}, 5)])
    assert raw.hex() == "00000022" "00000000" "00000000" "00000005" "00000004" "626f6479" "0008" "5441475301616263"
    assert _codec.decode_batch_body(raw) == [(5, b"body", "TAGS\x01abc")]


@pytest.mark.parametrize("text,expected", [
    ("Hello RocketMQ", 1774740973), ("Once, there was a chance for me!", 151131488), ("", 0)])
def test_crc_examples(text, expected):
    assert _codec.crc32(text.encode()) == expected


@pytest.mark.parametrize("text,expected", [
    ("TagA", 2598919), ("TAG1", 2567159), ("abc", 96354), ("", 0), ("polygenelubricants", -2147483648),
    ("TopicTest#key1", -1655984460)])
def test_java_hash_examples(text, expected):
    assert _codec.java_string_hash(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("k\x01v\x02", {"k": "v"}), ("k\x01\x02kk\x01v", {"kk": "v"}), ("a\x011\x02\x02x\x01\x02ab\x01", {"a": "1"})])
def test_property_parsing_examples(text, expected):
    assert _codec.string_to_properties(text) == expected


def test_check_record_statuses():
    assert _codec.check_record(GOLDEN) == (138, True)
    assert _codec.check_record(b"\x00\x00\x00\x10\xcb\xd4\x31\x94" + b"\x00" * 8) == (0, True)
    assert _codec.check_record(GOLDEN[:-1]) == (-1, False)
    flipped = bytearray(GOLDEN)
    flipped[100] ^= 1  # a body byte: CRC mismatch
    assert _codec.check_record(bytes(flipped)) == (-1, False)
    assert _codec.check_record(bytes(flipped), check_crc=False) == (138, True)
    wrong_len = bytearray(GOLDEN) + b"\x00"
    wrong_len[3] = 139
    assert _codec.check_record(bytes(wrong_len)) == (139, False)


@pytest.mark.parametrize("mutate,needle", [
    (lambda b: b[:50], "truncated"), (lambda b: b"\x00" * 8 + b[8:], "magic"),
    (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "CRC")])
def test_decode_errors_name_the_cause(mutate, needle):
    with pytest.raises(CorruptRecordError, match=needle):
        _codec.decode_record(mutate(GOLDEN))


def test_encode_refuses_what_rocketmq_cannot_store():
    with pytest.raises(ValueError, match="127"):
        _codec.encode_record(topic="t" * 128, body=b"")
    with pytest.raises(ValueError, match="32767"):
        _codec.encode_record(topic="t", body=b"", properties={"k": "v" * 40000})
    with pytest.raises(ValueError):
        _codec.encode_record(topic="t", body=b"", born_host=("not-an-ip", 1))


# -- parity with the pure-Python twin (the oracle) --------------------------------------------

ipv4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)).map(
    lambda t: ".".join(map(str, t)))
ipv6 = st.sampled_from(["::1", "fe80::2", "2001:db8::8a2e:370:7334", "::"])
hosts = st.tuples(st.one_of(ipv4, ipv6), st.integers(0, 65535))
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)
prop_maps = st.dictionaries(text.filter(bool), text.filter(bool), max_size=14)
java_int = st.integers(-(2**31), 2**31 - 1)
java_long = st.integers(-(2**63), 2**63 - 1)
topics = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda t: len(t.encode()) <= 127)


@st.composite
def record_fields(draw):
    return dict(topic=draw(topics), body=draw(st.binary(max_size=300)), queue_id=draw(java_int), flag=draw(java_int),
                queue_offset=draw(java_long), physical_offset=draw(java_long),
                sys_flag=draw(st.integers(0, 0x7FF).map(lambda v: v & ~0x30)), born_timestamp=draw(java_long),
                born_host=draw(hosts), store_timestamp=draw(java_long), store_host=draw(hosts),
                reconsume_times=draw(java_int), prepared_transaction_offset=draw(java_long),
                properties=draw(prop_maps), v2=draw(st.booleans()))


@given(record_fields())
def test_encode_matches_twin(fields):
    assert _codec.encode_record(**fields) == twin.encode_record(**fields)


@given(record_fields())
def test_round_trip_and_decode_parity(fields):
    raw = _codec.encode_record(**fields)
    mine, theirs = _codec.decode_record(raw), twin.decode_record(raw)
    for name in ("total_size", "magic", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
                 "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
                 "prepared_transaction_offset", "body", "topic", "properties", "properties_string"):
        assert getattr(mine, name) == getattr(theirs, name), name
    assert mine.body == fields["body"] and mine.topic == fields["topic"]
    assert mine.properties == {k: v for k, v in fields["properties"].items()}
    assert mine.msg_id == theirs.msg_id


@given(st.binary(max_size=400), st.integers(0, 64))
def test_check_record_parity_on_arbitrary_bytes(data, offset):
    assert _codec.check_record(data, offset) == twin.check_record(data, offset)


@given(st.lists(text, max_size=40, unique=True))
def test_hashmap_order_parity(keys):
    assert _codec.java_hashmap_order(keys) == twin.java_hashmap_order(keys)


@given(st.text(max_size=50))
def test_java_hash_and_property_parsing_parity(s):
    assert _codec.java_string_hash(s) == twin.java_string_hash(s)
    assert _codec.string_to_properties(s) == twin.string_to_properties(s)


@given(st.binary(max_size=2000))
def test_crc_matches_zlib(data):
    assert _codec.crc32(data) == zlib.crc32(data) & 0x7FFFFFFF == twin.crc32(data)


@given(st.lists(st.tuples(st.binary(max_size=64), prop_maps, java_int), max_size=8))
def test_batch_body_parity(messages):
    raw = _codec.encode_batch_body(messages)
    assert raw == twin.encode_batch_body(messages)
    assert _codec.decode_batch_body(raw) == twin.decode_batch_body(raw)


@given(record_fields(), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1, max_size=4),
       st.booleans())
def test_check_record_parity_on_mutated_records(fields, edits, check_crc):
    raw = bytearray(_codec.encode_record(**fields))
    for pos, value in edits:
        raw[pos % len(raw)] = value
    data = bytes(raw)
    assert _codec.check_record(data, check_crc=check_crc) == twin.check_record(data, check_crc=check_crc)
