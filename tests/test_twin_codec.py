"""Tests of the pure-Python record codec twin (mqstore.twin.codec) against spec §1, §5.3, App. B.

Java-derived vectors marked "(Java 17)" were produced by running the equivalent Java
(String.hashCode, java.util.HashMap iteration, Integer.parseInt) on OpenJDK 17.
"""

from __future__ import annotations

import array
import ipaddress
import mmap
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.errors import CorruptRecordError
from mqstore.twin import codec as c

# --------------------------------------------------------------------------------------------
# Golden vectors (spec §1.9, §1.10)
# --------------------------------------------------------------------------------------------

GOLDEN_HEX = """
0000008a daa320a7 69c865ed 00000003 00000007 000000000000002a 0000000000001000 00000000
0000018bcfe56800 7f000001 000004d2 0000018bcfe5687b 0a000002 00002a9f 00000001 0000000000000000
0000000e 48656c6c6f20526f636b65744d51 09 546f70696354657374
0018 4b455953 01 6b657931206b657932 02 54414753 01 54616741
"""
GOLDEN = bytes.fromhex("".join(GOLDEN_HEX.split()))

GOLDEN_FIELDS = dict(
    topic="TopicTest", body=b"Hello RocketMQ", properties={"KEYS": "key1 key2", "TAGS": "TagA"},
    queue_id=3, flag=7, queue_offset=42, physical_offset=4096, sys_flag=0,
    born_timestamp=1700000000000, store_timestamp=1700000000123,
    born_host=("127.0.0.1", 1234), store_host=("10.0.0.2", 10911),
    reconsume_times=1, prepared_transaction_offset=0,
)
GOLDEN_V6_FIELDS = dict(GOLDEN_FIELDS, born_host=("::1", 1234), store_host=("fe80::2", 10911))


def test_golden_vector_bytes():
    assert len(GOLDEN) == 138
    assert c.encode_record(**GOLDEN_FIELDS) == GOLDEN
    # Insertion order of the dict does not matter: Java HashMap order puts KEYS first.
    fields = dict(GOLDEN_FIELDS, properties={"TAGS": "TagA", "KEYS": "key1 key2"})
    assert c.encode_record(**fields) == GOLDEN


def test_golden_vector_decode():
    rec = c.decode_record(GOLDEN)
    assert rec.total_size == 138
    assert rec.magic == c.MESSAGE_MAGIC_CODE
    assert rec.body_crc == c.crc32(b"Hello RocketMQ") == 0x69C865ED
    assert (rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset) == (3, 7, 42, 4096)
    assert rec.sys_flag == 0
    assert rec.born_timestamp == 1700000000000 and rec.store_timestamp == 1700000000123
    assert rec.born_host == ("127.0.0.1", 1234) and rec.store_host == ("10.0.0.2", 10911)
    assert rec.reconsume_times == 1 and rec.prepared_transaction_offset == 0
    assert rec.body == b"Hello RocketMQ" and rec.topic == "TopicTest"
    assert rec.properties == {"KEYS": "key1 key2", "TAGS": "TagA"}
    assert rec.properties_string == "KEYS\x01key1 key2\x02TAGS\x01TagA"
    assert rec.tags == "TagA" and rec.tags_code == 2598919
    assert rec.keys == ["key1", "key2"] and rec.uniq_key is None
    assert rec.msg_id == "0A00000200002A9F0000000000001000"
    assert not rec.is_v2 and rec.transaction_type == c.TRANSACTION_NOT_TYPE
    assert c.check_record(GOLDEN) == (138, True)
    assert c.msg_id(("10.0.0.2", 10911), 4096) == "0A00000200002A9F0000000000001000"


def test_golden_vector_ipv6():
    data = c.encode_record(**GOLDEN_V6_FIELDS)
    assert len(data) == 162 == 138 + 24
    # sysFlag 0x30 at offset 36, born host ::1 at 48, store host after the store timestamp
    assert struct.unpack_from(">i", data, 36)[0] == 0x30
    assert data[48:68] == bytes(15) + b"\x01" + struct.pack(">i", 1234)
    assert data[76:96] == ipaddress.IPv6Address("fe80::2").packed + struct.pack(">i", 10911)
    # everything from RECONSUMETIMES on is the same as the IPv4 record
    assert data[96:] == GOLDEN[72:]
    rec = c.decode_record(data)
    assert rec.sys_flag == c.BORNHOST_V6_FLAG | c.STOREHOSTADDRESS_V6_FLAG == 0x30
    assert rec.born_host == ("::1", 1234) and rec.store_host == ("fe80::2", 10911)
    expected_id = "FE80000000000000000000000000000200002A9F0000000000001000"
    assert rec.msg_id == expected_id
    assert c.msg_id(("fe80::2", 10911), 4096) == expected_id
    assert c.check_record(data) == (162, True)
    # explicitly passing sysFlag 0x30 gives the same bytes
    assert c.encode_record(**dict(GOLDEN_V6_FIELDS, sys_flag=0x30)) == data


def test_v6_flags_follow_hosts():
    # V6 bits given for IPv4 hosts are cleared; other bits are kept
    data = c.encode_record(**dict(GOLDEN_FIELDS, sys_flag=0x30 | 0x2))
    assert c.decode_record(data).sys_flag == 0x2
    only_born = c.encode_record(**dict(GOLDEN_FIELDS, born_host=("::1", 1)))
    assert len(only_born) == 150
    assert c.decode_record(only_born).sys_flag == c.BORNHOST_V6_FLAG
    only_store = c.encode_record(**dict(GOLDEN_FIELDS, store_host=("::1", 1)))
    assert c.decode_record(only_store).sys_flag == c.STOREHOSTADDRESS_V6_FLAG


def test_ipv4_mapped_host_is_ipv4_like_java():
    # Java's InetAddress.getByName("::ffff:1.2.3.4") is an Inet4Address (Java 17)
    data = c.encode_record(**dict(GOLDEN_FIELDS, store_host=("::ffff:10.0.0.2", 10911)))
    assert data == GOLDEN
    assert c.msg_id(("::ffff:10.0.0.2", 10911), 4096) == "0A00000200002A9F0000000000001000"
    # "::1.2.3.4" (IPv4-compatible) stays IPv6 in Java
    rec = c.decode_record(c.encode_record(**dict(GOLDEN_FIELDS, store_host=("::10.0.0.2", 1))))
    assert rec.sys_flag == c.STOREHOSTADDRESS_V6_FLAG
    # brackets and scope ids are accepted; the scope is not stored
    assert c.msg_id(("[fe80::2]", 10911), 4096) == c.msg_id(("fe80::2%eth0", 10911), 4096)
    assert c.msg_id((ipaddress.ip_address("10.0.0.2"), 10911), 4096) == "0A00000200002A9F0000000000001000"


def test_batch_body_example():
    expected = bytes.fromhex("00000022 00000000 00000000 00000005 00000004 626f6479 0008 5441475301616263".replace(" ", ""))
    assert c.encode_batch_body([(b"body", {"TAGS": "abc"}, 5)]) == expected
    assert c.encode_batch_body([(b"body", "TAGS\x01abc", 5)]) == expected
    # totalSize = 22 + bodyLen + propsLen (4+4+4+4+4+2 header bytes)
    assert struct.unpack_from(">i", expected)[0] == 22 + 4 + 8 == len(expected)
    assert c.decode_batch_body(expected) == [(5, b"body", "TAGS\x01abc")]
    assert c.encode_batch_body([]) == b"" and c.decode_batch_body(b"") == []
    two = c.encode_batch_body([(b"", None, 0), (b"x", {"KEYS": "a", "TAGS": "b"}, -1)])
    assert c.decode_batch_body(two) == [(0, b"", ""), (-1, b"x", "KEYS\x01a\x02TAGS\x01b")]


# --------------------------------------------------------------------------------------------
# CRC, hashes, tagsCode (spec §1.5, §1.6, Appendix B)
# --------------------------------------------------------------------------------------------


def test_crc32_examples():
    assert c.crc32(b"") == 0
    assert c.crc32(b"Hello RocketMQ") == 1774740973
    assert c.crc32(b"Once, there was a chance for me!") == 151131488
    assert c.crc32(bytearray(b"Hello RocketMQ")) == c.crc32(memoryview(b"Hello RocketMQ")) == 1774740973
    # masked to 31 bits: zlib's CRC of b"a" has the top bit set
    assert c.crc32(b"a") == 0xE8B7BE43 & 0x7FFFFFFF


@pytest.mark.parametrize(("text", "expected"), [
    ("TagA", 2598919), ("TAG1", 2567159), ("abc", 96354), ("", 0),
    ("polygenelubricants", -2147483648),
    ("TopicTest#key1", -1655984460),
    ("KEYS", 2303476), ("TAGS", 2567193),
    ("\U0001F600", 1772899),  # (Java 17) one non-BMP char = 2 UTF-16 units 0xD83D 0xDE00
    ("Aa", 2112), ("BB", 2112),
])
def test_java_string_hash(text, expected):
    assert c.java_string_hash(text) == expected


def test_java_string_hash_non_bmp_counts_two_units():
    assert c.java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00
    assert c.java_string_hash("\U0001F600") == c.java_string_hash("\ud83d\ude00")  # surrogates given explicitly


@given(st.text())
def test_java_string_hash_matches_definition(text):
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) % (1 << 32)
    expected = h - (1 << 32) if h >= 1 << 31 else h
    assert c.java_string_hash(text) == expected
    assert -(1 << 31) <= expected < (1 << 31)


def test_tags_code():
    assert c.tags_code(None) == 0 and c.tags_code("") == 0
    assert c.tags_code("TagA") == 2598919
    assert c.tags_code("polygenelubricants") == -2147483648


# --------------------------------------------------------------------------------------------
# HashMap order and properties (spec §1.4)
# --------------------------------------------------------------------------------------------


def test_hashmap_order_keys_before_tags():
    # Hand computation (capacity 16, bucket = (h ^ (h >>> 16)) & 15):
    #   "KEYS".hashCode() = 2303476 = 0x002325F4; 0x002325F4 ^ 0x23 = 0x002325D7; & 15 = 7
    #   "TAGS".hashCode() = 2567193 = 0x00272C19; 0x00272C19 ^ 0x27 = 0x00272C3E; & 15 = 14
    # bucket 7 is iterated before bucket 14, so KEYS comes first whatever the put order.
    assert c.java_hashmap_order(["TAGS", "KEYS"]) == ["KEYS", "TAGS"]
    assert c.java_hashmap_order(["KEYS", "TAGS"]) == ["KEYS", "TAGS"]
    # UNIQ_KEY -> bucket 12, WAIT -> bucket 13 (same computation); checked against Java 17
    assert c.java_hashmap_order(["KEYS", "TAGS", "UNIQ_KEY", "WAIT"]) == ["KEYS", "UNIQ_KEY", "WAIT", "TAGS"]
    assert c.java_hashmap_order([]) == []


def test_hashmap_order_same_bucket_keeps_insertion_order_and_duplicates():
    # "Aa" and "BB" have the same hashCode (2112), hence the same bucket at any capacity
    assert c.java_hashmap_order(["BB", "Aa"]) == ["BB", "Aa"]
    assert c.java_hashmap_order(["Aa", "BB"]) == ["Aa", "BB"]
    # a repeated put keeps the first position
    assert c.java_hashmap_order(["TAGS", "KEYS", "TAGS"]) == ["KEYS", "TAGS"]


def test_hashmap_order_grows_to_32():
    keys12 = [f"key{i}" for i in range(12)]
    keys13 = [f"key{i}" for i in range(13)]
    # 12 keys fit 16 buckets (threshold 12); (Java 17)
    assert c.java_hashmap_order(keys12) == [
        "key1", "key2", "key0", "key5", "key6", "key3", "key4", "key9", "key7", "key8", "key11", "key10"]
    # the 13th key resizes to 32: key12 is in bucket 19 (it would be bucket 3, right after key0, with 16)
    assert c.java_hashmap_order(keys13) == [
        "key1", "key2", "key0", "key5", "key6", "key3", "key4", "key9", "key7", "key8", "key11", "key10", "key12"]
    spread = c._hashmap_spread("key12")
    assert spread & 31 == 19 and spread & 15 == 3


def test_hashmap_order_treeify_bin_resize():
    # 9 keys with one hashCode land in one bucket; Java's treeifyBin() doubles a table smaller than
    # 64 instead of building a tree, so 12 keys end up in 32 buckets, not 16 (Java 17 vector).
    colliding = ["AaAaAaAa", "AaAaAaBB", "AaAaBBAa", "AaAaBBBB", "AaBBAaAa", "AaBBAaBB", "AaBBBBAa",
                 "AaBBBBBB", "BBAaAaAa"]
    assert len({c.java_string_hash(k) for k in colliding}) == 1
    assert c.java_hashmap_order(["TAGS", "KEYS", "UNIQ_KEY", *colliding]) == [*colliding, "KEYS", "UNIQ_KEY", "TAGS"]


@given(st.lists(st.text(max_size=6), max_size=60))
def test_hashmap_order_is_a_permutation_of_distinct_keys(keys):
    order = c.java_hashmap_order(keys)
    assert sorted(order) == sorted(set(keys))
    assert order == c.java_hashmap_order(list(dict.fromkeys(keys)))


def test_string_to_properties_spec_examples():
    assert c.string_to_properties("k\x01v\x02") == {"k": "v"}
    assert c.string_to_properties("k\x01\x02kk\x01v") == {"kk": "v"}
    assert c.string_to_properties("a\x011\x02\x02x\x01\x02ab\x01") == {"a": "1"}


@pytest.mark.parametrize(("text", "expected"), [
    ("", {}),
    ("\x02\x02", {}),
    ("kv", {}),  # no separator
    ("\x01v", {}),  # empty name
    ("k\x01", {}),  # empty value
    ("k\x01v\x01w", {"k": "v\x01w"}),  # value is everything after the first \x01
    ("k\x011\x02k\x012", {"k": "2"}),  # later duplicate wins
    ("a\x01b\x02c\x01d", {"a": "b", "c": "d"}),
    ("\U0001F600\x01\U0001F600", {"\U0001F600": "\U0001F600"}),
])
def test_string_to_properties_edge_cases(text, expected):
    assert c.string_to_properties(text) == expected


def test_properties_to_string():
    assert c.properties_to_string(None) == ""
    assert c.properties_to_string({}) == ""
    assert c.properties_to_string({"TAGS": "TagA", "KEYS": "k"}) == "KEYS\x01k\x02TAGS\x01TagA"
    assert c.properties_to_string({"TAGS": "TagA", "KEYS": "k"}, java_order=False) == "TAGS\x01TagA\x02KEYS\x01k"
    assert c.properties_to_string({"TAGS": None, "KEYS": "k"}) == "KEYS\x01k"
    assert c.properties_to_string({"TAGS": None}) == ""
    assert c.properties_to_string({"k": ""}) == "k\x01"  # empty values are written (and dropped on parse)
    with pytest.raises(TypeError):
        c.properties_to_string({"k": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        c.properties_to_string({1: "v"})  # type: ignore[dict-item]


PROP_NAME = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x01\x02"), min_size=1, max_size=8)
PROP_VALUE = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x02"), min_size=1, max_size=12)
PROPS = st.dictionaries(PROP_NAME, PROP_VALUE, max_size=20)


@given(PROPS, st.booleans())
def test_properties_round_trip(props, java_order):
    text = c.properties_to_string(props, java_order=java_order)
    assert c.string_to_properties(text) == props
    if not java_order:
        assert list(c.string_to_properties(text)) == list(props)
    else:
        assert list(c.string_to_properties(text)) == c.java_hashmap_order(list(props))


def test_batch_inner_properties():
    assert c.batch_inner_properties("", "") == ""
    assert c.batch_inner_properties("a\x01b", "") == "a\x01b"
    assert c.batch_inner_properties("", "c\x01d") == "c\x01d"
    assert c.batch_inner_properties("a\x01b", "c\x01d") == "a\x01b\x02c\x01d"
    assert c.batch_inner_properties("a\x01b\x02", "c\x01d") == "a\x01b\x02c\x01d"


# --------------------------------------------------------------------------------------------
# Lengths and msgId
# --------------------------------------------------------------------------------------------


def test_record_length():
    assert c.record_length(0, 0, 0) == 91
    assert c.record_length(14, 9, 24) == 138
    assert c.record_length(14, 9, 24, sys_flag=0x30) == 162
    assert c.record_length(14, 9, 24, sys_flag=c.BORNHOST_V6_FLAG) == 150
    assert c.record_length(14, 9, 24, v2=True) == 139
    assert c.record_length(-5, 9, -1) == c.record_length(0, 9, 0)  # negative lengths count as 0
    assert c.record_length(2**31 - 1, 0, 0) < 0  # Java int wrap-around, as calMsgLength


def test_msg_id():
    assert c.msg_id(("10.0.0.2", 10911), 4096) == "0A00000200002A9F0000000000001000"
    assert len(c.msg_id(("::1", 0), 0)) == 56
    assert c.msg_id(("255.255.255.255", 65535), -1) == "FFFFFFFF0000FFFF" + "F" * 16
    with pytest.raises(ValueError):
        c.msg_id(("10.0.0.2", 10911), 2**63)
    with pytest.raises(ValueError):
        c.msg_id(("localhost", 1), 0)


# --------------------------------------------------------------------------------------------
# Round trips (hypothesis)
# --------------------------------------------------------------------------------------------

INT = st.integers(-(2**31), 2**31 - 1)
LONG = st.integers(-(2**63), 2**63 - 1)
IPV4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
IPV6 = st.one_of(
    st.integers(0, 2**128 - 1),
    st.integers(0, 2**32 - 1).map(lambda n: (0xFFFF << 32) | n),  # IPv4-mapped
    st.integers(0, 2**16),
).map(lambda n: str(ipaddress.IPv6Address(n)))
HOST = st.tuples(st.one_of(IPV4, IPV6), st.integers(0, 65535))
TOPIC_CHARS = st.characters(exclude_categories=("Cs",))


def _normalized(host):
    addr = ipaddress.ip_address(host[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr), host[1], isinstance(addr, ipaddress.IPv6Address)


@st.composite
def records(draw):
    v2 = draw(st.booleans())
    limit = 300 if v2 else 127
    topic = draw(st.text(TOPIC_CHARS, max_size=limit).filter(lambda t: len(t.encode()) <= limit))
    props = draw(st.one_of(st.none(), PROPS, PROPS.map(lambda p: c.properties_to_string(p, java_order=False))))
    return dict(
        topic=topic, body=draw(st.binary(max_size=300)), queue_id=draw(INT), flag=draw(INT),
        queue_offset=draw(LONG), physical_offset=draw(LONG), sys_flag=draw(INT),
        born_timestamp=draw(LONG), born_host=draw(HOST), store_timestamp=draw(LONG),
        store_host=draw(HOST), reconsume_times=draw(INT), prepared_transaction_offset=draw(LONG),
        properties=props, body_crc=draw(st.one_of(st.none(), INT)), v2=v2,
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.binary(max_size=20), st.binary(max_size=20))
def test_encode_decode_round_trip(fields, prefix, suffix):
    data = c.encode_record(**fields)
    born, store = _normalized(fields["born_host"]), _normalized(fields["store_host"])
    props = fields["properties"]
    props_string = (c.properties_to_string(props) if isinstance(props, dict) else props or "")
    expected_flag = fields["sys_flag"] & ~0x30 | (0x10 if born[2] else 0) | (0x20 if store[2] else 0)
    assert len(data) == c.record_length(len(fields["body"]), len(fields["topic"].encode()),
                                        len(props_string.encode()), expected_flag, fields["v2"])

    buf = prefix + data + suffix
    crc_ok = fields["body_crc"] is None or fields["body_crc"] == c.crc32(fields["body"]) or not fields["body"]
    if not crc_ok:
        with pytest.raises(CorruptRecordError, match="CRC"):
            c.decode_record(buf, len(prefix))
    rec = c.decode_record(buf, len(prefix), check_crc=crc_ok)
    assert rec.total_size == len(data)
    assert rec.magic == (c.MESSAGE_MAGIC_CODE_V2 if fields["v2"] else c.MESSAGE_MAGIC_CODE)
    assert rec.is_v2 == fields["v2"]
    for name in ("queue_id", "flag", "queue_offset", "physical_offset", "born_timestamp", "store_timestamp",
                 "reconsume_times", "prepared_transaction_offset", "topic", "body"):
        assert getattr(rec, name) == fields[name], name
    assert rec.sys_flag == expected_flag
    assert rec.born_host == born[:2] and rec.store_host == store[:2]
    assert rec.properties_string == props_string
    assert rec.properties == c.string_to_properties(props_string)
    assert rec.transaction_type == expected_flag & 0xC
    assert rec.msg_id == c.msg_id(fields["store_host"], fields["physical_offset"])
    assert rec.tags_code == c.tags_code(rec.properties.get("TAGS"))

    assert rec.body_crc == (c.crc32(fields["body"]) if fields["body_crc"] is None else fields["body_crc"])
    assert c.check_record(buf, len(prefix), check_crc=False) == (len(data), True)
    assert c.check_record(buf, len(prefix), read_body=False) == (len(data), True)
    assert c.check_record(bytearray(buf), len(prefix)) == ((len(data), True) if crc_ok else (-1, False))
    assert c.decode_record(memoryview(buf), len(prefix), read_body=False).body is None


@given(records())
def test_decode_from_exact_buffer_types(fields):
    fields["body_crc"] = None
    data = c.encode_record(**fields)
    for buf in (data, bytearray(data), memoryview(data)):
        assert c.decode_record(buf) == c.decode_record(data)
        assert c.check_record(buf) == (len(data), True)


def test_decode_from_non_byte_buffers():
    words = array.array("H")
    words.frombytes(GOLDEN)  # 138 bytes = 69 unsigned shorts, read as raw bytes
    assert c.decode_record(words) == c.decode_record(GOLDEN)
    assert c.check_record(memoryview(GOLDEN).cast("H")) == (138, True)


def test_decode_from_mmap_releases_the_buffer():
    blank = struct.pack(">ii", 100, c.BLANK_MAGIC_CODE)
    with tempfile.TemporaryFile() as f:
        f.write(GOLDEN + blank + bytes(92))
        f.flush()
        m = mmap.mmap(f.fileno(), 0)
        assert c.decode_record(m).body == b"Hello RocketMQ"
        assert c.check_record(m) == (138, True)
        assert c.check_record(m, 138) == (0, True)
        with pytest.raises(CorruptRecordError):
            c.decode_record(m, 138)
        m.close()  # would raise BufferError if a memoryview were still exported


def test_empty_body_topic_and_properties():
    data = c.encode_record(topic="", body=b"")
    assert len(data) == 91
    rec = c.decode_record(data)
    assert (rec.body, rec.topic, rec.properties, rec.properties_string) == (b"", "", {}, "")
    assert rec.body_crc == 0 and rec.keys == [] and rec.tags is None and rec.tags_code == 0


def test_keys_and_uniq_key_properties():
    data = c.encode_record(topic="t", body=b"x", properties={"KEYS": " a  b ", "UNIQ_KEY": "U1", "TAGS": ""})
    rec = c.decode_record(data)
    assert rec.keys == ["a", "b"] and rec.uniq_key == "U1"
    assert rec.tags is None and rec.tags_code == 0  # "TAGS\x01" has an empty value: dropped on parse


def test_v2_long_topic():
    topic = "t" * 200
    data = c.encode_record(topic=topic, body=b"b", v2=True)
    assert struct.unpack_from(">i", data, 4)[0] == c.MESSAGE_MAGIC_CODE_V2
    assert len(data) == 92 + 1 + 200
    rec = c.decode_record(data)
    assert rec.topic == topic and rec.is_v2
    assert c.check_record(data) == (len(data), True)
    assert len(c.encode_record(topic="t", body=b"", v2=True)) == 93


def test_transaction_type():
    for t in (c.TRANSACTION_NOT_TYPE, c.TRANSACTION_PREPARED_TYPE, c.TRANSACTION_COMMIT_TYPE,
              c.TRANSACTION_ROLLBACK_TYPE):
        rec = c.decode_record(c.encode_record(topic="t", body=b"", sys_flag=t | c.MULTI_TAGS_FLAG))
        assert rec.transaction_type == t


# --------------------------------------------------------------------------------------------
# check_record (§5.3) failure kinds
# --------------------------------------------------------------------------------------------


def _with_int(data: bytes, at: int, value: int, fmt: str = ">i") -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def test_check_blank():
    blank = struct.pack(">ii", 4096, c.BLANK_MAGIC_CODE)
    assert c.check_record(blank) == (0, True)
    assert c.check_record(blank + bytes(4088)) == (0, True)
    assert c.check_record(GOLDEN + blank, 138) == (0, True)
    assert c.check_record(struct.pack(">ii", -7, c.BLANK_MAGIC_CODE)) == (0, True)
    assert c.check_record(blank[:7]) == (-1, False)
    with pytest.raises(CorruptRecordError, match="blank.*check_record"):
        c.decode_record(blank)


def test_check_unknown_magic():
    for magic in (0, c.MESSAGE_MAGIC_CODE + 1, 0x12345678):
        data = _with_int(GOLDEN, 4, magic)
        assert c.check_record(data) == (-1, False)
        with pytest.raises(CorruptRecordError, match="magic"):
            c.decode_record(data)


def test_check_truncated_every_prefix():
    v6 = c.encode_record(**GOLDEN_V6_FIELDS)
    for data in (GOLDEN, v6, c.encode_record(topic="", body=b"")):
        for n in range(len(data)):
            assert c.check_record(data[:n]) == (-1, False), n
            assert c.check_record(data[:n], read_body=False) == (-1, False), n
            with pytest.raises(CorruptRecordError, match="truncated"):
                c.decode_record(data[:n])
    assert c.check_record(GOLDEN, 139) == (-1, False)
    with pytest.raises(CorruptRecordError):
        c.decode_record(GOLDEN, 1000)


def test_check_crc_mismatch():
    body_at = 88  # BODY starts at 84 + 4 with both hosts IPv4
    for at in (8, 9, 10, 11, body_at, body_at + 13):  # flip a BODYCRC byte or a body byte
        data = bytearray(GOLDEN)
        data[at] ^= 0x01
        assert c.check_record(data) == (-1, False), at
        assert c.check_record(data, check_crc=False) == (138, True)
        assert c.check_record(data, read_body=False) == (138, True)
        with pytest.raises(CorruptRecordError, match="CRC"):
            c.decode_record(data)
        assert c.decode_record(data, check_crc=False).total_size == 138
        assert c.decode_record(data, read_body=False).body is None


def test_crc_not_checked_for_empty_body():
    # QUIRK (Java): the CRC is only compared when BODYLENGTH > 0
    data = c.encode_record(topic="t", body=b"", body_crc=12345)
    assert c.check_record(data) == (len(data), True)
    assert c.decode_record(data).body_crc == 12345


def test_check_wrong_length():
    for wrong in (137, 139, 200, 100, 28):
        data = _with_int(GOLDEN, 0, wrong)
        assert c.check_record(data + bytes(100)) == (wrong, False), wrong
        with pytest.raises(CorruptRecordError, match="TOTALSIZE"):
            c.decode_record(data + bytes(100))
    # QUIRK: Java copies fields into `new byte[totalSize]`; a field longer than TOTALSIZE or a
    # negative TOTALSIZE throws before the length comparison -> (-1, False)
    for wrong in (13, 7, 0, -1, -138):  # body is 14 bytes; IPv4 host is 8
        data = _with_int(GOLDEN, 0, wrong)
        assert c.check_record(data) == (-1, False), wrong
        with pytest.raises(CorruptRecordError):
            c.decode_record(data)
    # with read_body=False the body is skipped, not copied into the scratch array
    big_body = c.encode_record(topic="t", body=b"x" * 50)
    assert c.check_record(_with_int(big_body, 0, 20)) == (-1, False)
    assert c.check_record(_with_int(big_body, 0, 20), read_body=False) == (20, False)
    # the V6 host (20 bytes) does not fit in a 19-byte scratch array
    v6 = c.encode_record(topic="t", body=b"", born_host=("::1", 1))
    assert c.check_record(_with_int(v6, 0, 19)) == (-1, False)
    assert c.check_record(_with_int(v6, 0, 20)) == (20, False)
    # the properties (24 bytes in GOLDEN) are copied too
    assert c.check_record(_with_int(GOLDEN, 0, 23)) == (-1, False)
    assert c.check_record(_with_int(GOLDEN, 0, 24)) == (24, False)
    # a V6 flag on an IPv4 record shifts every field: some length no longer matches or runs out
    flagged = _with_int(GOLDEN, 36, 0x10)
    assert c.check_record(flagged)[1] is False


def test_negative_body_and_properties_lengths_follow_java():
    # BODYLENGTH <= 0 is "no body" and PROPERTIESLENGTH <= 0 is "no properties" (QUIRK, Java)
    base = c.encode_record(topic="t", body=b"")
    neg_body = _with_int(base, 84, -5)
    assert c.check_record(neg_body) == (len(base), True)
    assert c.decode_record(neg_body).body == b""
    neg_props = _with_int(base, len(base) - 2, -1, ">h")
    assert c.check_record(neg_props) == (len(base), True)
    assert c.decode_record(neg_props).properties_string == ""


def test_negative_topic_length():
    data = c.encode_record(topic="t", body=b"")
    bad = bytearray(data)
    bad[88] = 0x80  # V1 topic length byte is signed: -128
    assert c.check_record(bad) == (-1, False)
    with pytest.raises(CorruptRecordError, match="topic length"):
        c.decode_record(bad)
    v2 = c.encode_record(topic="t", body=b"", v2=True)
    assert c.check_record(_with_int(v2, 88, -1, ">h")) == (-1, False)


def test_bad_utf8_fails_decode_but_not_check():
    data = bytearray(c.encode_record(topic="ab", body=b""))
    data[89] = 0xFF  # first topic byte
    assert c.check_record(data) == (len(data), True)  # Java decodes with U+FFFD
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        c.decode_record(data)
    props = bytearray(c.encode_record(topic="t", body=b"", properties="k\x01v"))
    props[-1] = 0xC3  # truncated 2-byte sequence
    assert c.check_record(props) == (len(props), True)
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        c.decode_record(props)


@pytest.mark.parametrize(("delay", "ok"), [
    ("3", True), ("0", True), ("-1", True), ("99", True), ("+3", True), ("\u0661\u0662", True),
    ("abc", False), (" 3", False), ("3 ", False), ("1_0", False), ("2147483648", False), ("+", False),
])
def test_schedule_topic_delay_parse_quirk(delay, ok):
    # QUIRK: for SCHEDULE_TOPIC_XXXX Java runs Integer.parseInt(DELAY); a NumberFormatException
    # makes checkMessageAndReturnSize return (-1, false). (Accepted/refused strings: Java 17.)
    data = c.encode_record(topic="SCHEDULE_TOPIC_XXXX", body=b"x", properties={"DELAY": delay})
    assert c.check_record(data) == ((len(data), True) if ok else (-1, False))
    assert c.decode_record(data).properties["DELAY"] == delay  # decode_record does not care
    other = c.encode_record(topic="TopicTest", body=b"x", properties={"DELAY": delay})
    assert c.check_record(other) == (len(other), True)


HEADER_GARBAGE = st.builds(
    lambda total, magic, rest: struct.pack(">ii", total, magic) + rest,
    st.one_of(st.integers(-5, 300), INT),
    st.sampled_from([c.MESSAGE_MAGIC_CODE, c.MESSAGE_MAGIC_CODE_V2, c.BLANK_MAGIC_CODE, 0]),
    st.binary(max_size=250),
)


@settings(max_examples=500)
@given(st.one_of(st.binary(max_size=200), HEADER_GARBAGE), st.integers(0, 8))
def test_check_and_decode_agree_on_garbage(data, offset):
    size, ok = c.check_record(data, offset)
    try:
        rec = c.decode_record(data, offset)
    except CorruptRecordError as exc:
        assert str(exc)
        assert not ok or size == 0 or "UTF-8" in str(exc)
    else:
        assert (size, ok) == (rec.total_size, True)


@settings(max_examples=200)
@given(records(), st.data())
def test_single_byte_corruption_never_crashes(fields, data):
    fields["body_crc"] = None
    record = bytearray(c.encode_record(**fields))
    at = data.draw(st.integers(0, len(record) - 1))
    record[at] ^= data.draw(st.integers(1, 255))
    size, ok = c.check_record(record)
    assert isinstance(size, int) and isinstance(ok, bool)
    try:
        rec = c.decode_record(record)
    except CorruptRecordError:
        pass
    else:
        assert (size, ok) == (rec.total_size, True)


def test_bad_offset():
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError):
            c.check_record(GOLDEN, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            c.decode_record(GOLDEN, bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# encode_record errors
# --------------------------------------------------------------------------------------------


def test_topic_limits():
    assert len(c.encode_record(topic="t" * 127, body=b"")) == 91 + 127
    with pytest.raises(ValueError, match="127"):
        c.encode_record(topic="t" * 128, body=b"")
    with pytest.raises(ValueError, match="127"):
        c.encode_record(topic="é" * 64, body=b"")  # 64 chars but 128 UTF-8 bytes
    assert len(c.encode_record(topic="t" * 32767, body=b"", v2=True)) == 92 + 32767
    with pytest.raises(ValueError, match="32767"):
        c.encode_record(topic="t" * 32768, body=b"", v2=True)
    with pytest.raises(ValueError, match="UTF-8"):
        c.encode_record(topic="\ud800", body=b"")
    with pytest.raises(TypeError):
        c.encode_record(topic=b"t", body=b"")  # type: ignore[arg-type]


def test_properties_limits():
    ok = "k\x01" + "v" * 32765
    assert len(c.encode_record(topic="t", body=b"", properties=ok)) == 91 + 1 + 32767
    with pytest.raises(ValueError, match="32767"):
        c.encode_record(topic="t", body=b"", properties=ok + "v")
    with pytest.raises(ValueError, match="32767"):
        c.encode_record(topic="t", body=b"", properties={"k": "é" * 16383})  # 2 + 32766 = 32768 bytes
    with pytest.raises(ValueError, match="UTF-8"):
        c.encode_record(topic="t", body=b"", properties={"k": "\udc00"})
    with pytest.raises(TypeError):
        c.encode_record(topic="t", body=b"", properties=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="32767"):
        c.encode_batch_body([(b"", ok + "v", 0)])


INT_FIELDS = ("queue_id", "flag", "sys_flag", "reconsume_times", "body_crc")
LONG_FIELDS = ("queue_offset", "physical_offset", "born_timestamp", "store_timestamp",
               "prepared_transaction_offset")


@pytest.mark.parametrize("name", INT_FIELDS + LONG_FIELDS)
def test_integer_ranges(name):
    bits = 32 if name in INT_FIELDS else 64
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    for good in (lo, hi):
        c.encode_record(topic="t", body=b"", **{name: good})
    for bad in (lo - 1, hi + 1, "1", 1.0, True):
        with pytest.raises(ValueError, match=name):
            c.encode_record(topic="t", body=b"", **{name: bad})


@pytest.mark.parametrize("host", [
    ("localhost", 1), ("1.2.3", 1), ("1.2.3.4", -1), ("1.2.3.4", 65536), ("1.2.3.4", "80"),
    ("1.2.3.4",), ["1.2.3.4", 1], "1.2.3.4:1", (1234, 1), ("", 1), ("::1::2", 1),
])
def test_bad_hosts(host):
    with pytest.raises(ValueError):
        c.encode_record(topic="t", body=b"", born_host=host)
    with pytest.raises(ValueError):
        c.encode_record(topic="t", body=b"", store_host=host)
    with pytest.raises(ValueError):
        c.msg_id(host, 0)


def test_body_types():
    assert c.encode_record(topic="t", body=bytearray(b"ab")) == c.encode_record(topic="t", body=memoryview(b"ab"))
    with pytest.raises(TypeError):
        c.encode_record(topic="t", body="ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c.encode_record(topic="t", body=None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Batch body (§1.10)
# --------------------------------------------------------------------------------------------

BATCH_ITEM = st.tuples(st.binary(max_size=50), st.one_of(st.none(), PROPS), INT)


@given(st.lists(BATCH_ITEM, max_size=8))
def test_batch_round_trip(items):
    data = c.encode_batch_body(items)
    decoded = c.decode_batch_body(data)
    assert [(flag, body, c.string_to_properties(props)) for flag, body, props in decoded] == \
           [(flag, body, props or {}) for body, props, flag in items]
    assert [p for _, _, p in decoded] == [c.properties_to_string(p) for _, p, _ in items]
    assert c.decode_batch_body(bytearray(data)) == decoded


def test_batch_decode_ignores_total_magic_and_crc_like_the_broker():
    data = bytearray(c.encode_batch_body([(b"body", {"TAGS": "abc"}, 5)]))
    struct.pack_into(">iii", data, 0, 999, c.MESSAGE_MAGIC_CODE, 42)
    assert c.decode_batch_body(data) == [(5, b"body", "TAGS\x01abc")]


def test_batch_decode_errors():
    good = c.encode_batch_body([(b"body", {"TAGS": "abc"}, 5)])
    for n in range(1, len(good)):
        with pytest.raises(CorruptRecordError, match="truncated"):
            c.decode_batch_body(good[:n])
    with pytest.raises(CorruptRecordError, match="truncated"):
        c.decode_batch_body(good + good[:5])
    with pytest.raises(CorruptRecordError, match="negative body length"):
        c.decode_batch_body(_with_int(good, 16, -1))
    with pytest.raises(CorruptRecordError, match="negative properties length"):
        c.decode_batch_body(_with_int(good, 24, -2, ">h"))
    bad_utf8 = bytearray(good)
    bad_utf8[-1] = 0xFF
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        c.decode_batch_body(bad_utf8)
    with pytest.raises(ValueError):
        c.encode_batch_body([(b"", None, 2**31)])
    with pytest.raises(TypeError):
        c.encode_batch_body([(b"", None)])  # type: ignore[list-item]


@given(st.binary(max_size=80))
def test_batch_decode_garbage_only_raises_corrupt(data):
    try:
        c.decode_batch_body(data)
    except CorruptRecordError:
        pass
