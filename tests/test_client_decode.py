"""The client's decoding of pulled messages: the compiled mqstore.client._client against its pure-Python
twin mqstore.client._twin (hypothesis), on valid records (IPv4 and IPv6 hosts, compressed bodies
of each RocketMQ compression type, properties with and without UNIQ_KEY, empty and quirky
properties strings, V2 records, several records back to back) and on broken ones (each fails
with the twin's MessageDecodeError text);
and MessageExt as a value: equality, repr, hashing, the lazily made fields, setters, pickling."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import struct
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers_bodies import good_bodies, with_flag

from mqstore.client import _client as K
from mqstore.log._codec import encode_record
from mqstore.client import MessageDecodeError, MessageExt, MessageQueue, decode_messages
from mqstore.client import _twin as T
from mqstore.client.protocol import SYSTEM_PROPERTIES

FIELDS = tuple(f.name for f in dataclasses.fields(T.MessageExt))
DERIVED = ("tags", "keys", "uniq_key", "user_properties", "message_queue")
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1, max_size=12)
MAGIC_V1, MAGIC_V2, MAGIC_BLANK = -626843481, -626843477, -875286124


def view(msg) -> tuple:
    """Every field and derived property of a message (kernel or twin), in a fixed order."""
    return tuple(getattr(msg, f) for f in FIELDS + DERIVED)


def outcome(decode, body, **kw):
    try:
        return "ok", [view(m) for m in decode(body, **kw)]
    except MessageDecodeError as exc:
        return "error", str(exc)


def hosts():
    v4 = st.ip_addresses(v=4).map(str)
    v6 = st.ip_addresses(v=6).map(str)
    return st.tuples(st.one_of(v4, v6, st.sampled_from(["127.0.0.1", "::1", "fe80::2", "10.0.0.255"])),
                     st.integers(0, (1 << 31) - 1))


def properties():
    """A map (with or without UNIQ_KEY, TAGS, KEYS), or an exact properties string with RocketMQ's
    parsing quirks (empty names or values, no \\x01, duplicates, several \\x01)."""
    system = st.fixed_dictionaries({}, optional={
        "UNIQ_KEY": st.from_regex(r"[0-9A-F]{32}", fullmatch=True), "TAGS": TEXT,
        "KEYS": st.lists(TEXT.filter(lambda k: " " not in k), max_size=3).map(" ".join).filter(bool),
        "WAIT": st.sampled_from(["true", "false"]), "DELAY": st.sampled_from(["1", "3"])})
    mapped = st.tuples(system, st.dictionaries(TEXT, TEXT, max_size=4)).map(lambda t: {**t[1], **t[0]})
    quirky = st.lists(st.sampled_from(["\x01", "\x02", "UNIQ_KEY", "TAGS", "KEYS", "a", "é", "b c", "€x", "1"]),
                      max_size=14).map("".join)
    return st.one_of(st.none(), st.just({}), mapped, quirky)


@st.composite
def records(draw) -> bytes:
    kind, _, body = draw(good_bodies())  # stored as sent, zlib, LZ4 or ZSTD (RocketMQ 5's type bits)
    sys_flag = with_flag(draw(st.sampled_from([0, 0x2, 0x4, 0x8, 0xC, 0x40])), kind)
    v2 = draw(st.booleans())
    topic = draw(st.one_of(st.sampled_from(["TopicTest", "%RETRY%g", ""]),
                           st.text(st.characters(codec="utf-8"), max_size=20)))
    return encode_record(
        topic=topic, body=body, queue_id=draw(INT32), flag=draw(INT32), queue_offset=draw(INT64),
        physical_offset=draw(INT64), sys_flag=sys_flag,
        born_timestamp=draw(INT64), born_host=draw(hosts()), store_timestamp=draw(INT64), store_host=draw(hosts()),
        reconsume_times=draw(INT32), prepared_transaction_offset=draw(INT64), properties=draw(properties()), v2=v2)


def bodies(max_records: int = 4):
    return st.lists(records(), min_size=1, max_size=max_records).map(b"".join)


# -- parity on valid bodies --------------------------------------------------------------------

@settings(max_examples=300)
@given(body=bodies(), broker_name=st.sampled_from(["", "broker-a"]), order=st.permutations(FIELDS + DERIVED))
def test_valid_bodies_decode_as_the_twin_does(body, broker_name, order):
    got = decode_messages(body, broker_name=broker_name, address="10.0.0.1:10911")
    want = T.decode_messages(body, broker_name=broker_name, address="10.0.0.1:10911")
    assert len(got) == len(want) >= 1
    for g, w in zip(got, want):
        # the lazy fields come out the same whatever is read first
        assert {name: getattr(g, name) for name in order} == {name: getattr(w, name) for name in FIELDS + DERIVED}
        assert repr(g) == repr(w)
        assert type(g) is MessageExt


@settings(max_examples=100)
@given(body=bodies(3))
def test_any_buffer_decodes_as_bytes_do(body):
    want = outcome(T.decode_messages, body)
    assert outcome(decode_messages, bytearray(body)) == want
    assert outcome(decode_messages, memoryview(body)) == want


# -- parity on broken bodies -------------------------------------------------------------------

def _field_positions(record: bytes) -> list[tuple[int, int]]:
    """(position, width) of the fields of a record whose change moves the parse: TOTALSIZE,
    MAGICCODE, BODYCRC, SYSFLAG, BODYLENGTH, TOPICLENGTH, PROPERTIESLENGTH."""
    magic, sys_flag = struct.unpack_from(">i", record, 4)[0], struct.unpack_from(">i", record, 36)[0]
    body_len_at = 48 + (20 if sys_flag & 0x10 else 8) + 8 + (20 if sys_flag & 0x20 else 8) + 12
    topic_len_at = body_len_at + 4 + struct.unpack_from(">i", record, body_len_at)[0]
    topic_width = 2 if magic == MAGIC_V2 else 1
    topic_len = int.from_bytes(record[topic_len_at:topic_len_at + topic_width], "big", signed=True)
    props_len_at = topic_len_at + topic_width + topic_len
    return [(0, 4), (4, 4), (8, 4), (36, 4), (body_len_at, 4), (topic_len_at, topic_width), (props_len_at, 2)]


FIELD_VALUES = st.sampled_from([0, 1, -1, 2, 7, 8, 19, 20, 21, 90, 91, 92, 127, 128, 200, 255, 300, 4096, 32767,
                                -32768, 0x10, 0x20, 0x30, 0x31, 0x11, (1 << 31) - 1, -(1 << 31), MAGIC_V1, MAGIC_V2,
                                MAGIC_BLANK])


@st.composite
def broken_bodies(draw) -> bytes:
    parts = draw(st.lists(records(), min_size=1, max_size=3))
    body = bytearray(b"".join(parts))
    kind = draw(st.sampled_from(["cut", "append", "overwrite", "field", "field"]))
    if kind == "cut":
        del body[draw(st.integers(0, len(body) - 1)):]
    elif kind == "append":
        body += draw(st.binary(min_size=1, max_size=120))
    elif kind == "overwrite":
        at = draw(st.integers(0, len(body) - 1))
        patch = draw(st.binary(min_size=1, max_size=4))
        body[at:at + len(patch)] = patch
    else:
        which = draw(st.integers(0, len(parts) - 1))
        start = sum(len(p) for p in parts[:which])
        at, width = draw(st.sampled_from(_field_positions(parts[which])))
        value = draw(FIELD_VALUES)
        body[start + at:start + at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
    return bytes(body)


@settings(max_examples=600)
@given(body=broken_bodies(), address=st.sampled_from(["", "127.0.0.1:10911"]))
def test_broken_bodies_fail_with_the_twins_words(body, address):
    assert outcome(decode_messages, body, address=address) == outcome(T.decode_messages, body, address=address)


@settings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_fail_with_the_twins_words(data):
    assert outcome(decode_messages, data) == outcome(T.decode_messages, data)


def _record(**kw) -> bytes:
    args = {"topic": "T", "body": b"hello", "properties": {"TAGS": "t", "UNIQ_KEY": "AB" * 16},
            "store_host": ("127.0.0.1", 10911), "physical_offset": 100}
    return encode_record(**{**args, **kw})


def _set(record: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(record)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


GOOD = _record()
BAD_BODIES = {
    "cut record": (GOOD + GOOD[:50], "is truncated: needs 8 bytes at"),
    "cut header": (GOOD[:6], "is truncated: needs 4 bytes at 4, buffer ends at 6"),
    "bad magic": (_set(GOOD, 4, ">i", 0x12345678), "unknown magic code 0x12345678"),
    "blank record": (GOOD + _set(GOOD, 4, ">i", MAGIC_BLANK), "holds a BLANK (end of file) record"),
    "negative total": (_set(GOOD, 0, ">i", -5), "negative TOTALSIZE -5"),
    "total past the fields": (_set(GOOD, 0, ">i", len(GOOD) + 1), "but its fields add up to"),
    "body length past end": (_set(GOOD, 84, ">i", 4000), "BODY of 4000 bytes is longer than TOTALSIZE"),
    "body length past buffer": (_set(_set(GOOD, 0, ">i", 10**6), 84, ">i", 4000), "needs 4000 bytes at 88"),
    "body crc": (_set(GOOD, 8, ">i", 12345), "does not match stored BODYCRC 12345"),
    "v6 born host flag": (_set(GOOD, 36, ">i", 0x10), "has no valid record at byte 0 of"),
    "negative topic length": (_record(body=b"x" * 3)[:91] + b"\xff" + _record(body=b"x" * 3)[92:],
                              "negative topic length -1"),
    "topic not utf-8": (_record(topic="\u00e9").replace("\u00e9".encode(), b"\xc3\x28"), "are not UTF-8"),
    "properties not utf-8": (_record(properties="K\x01\u00e9").replace("\u00e9".encode(), b"\xff\xfe"),
                             "are not UTF-8"),
    "corrupt compressed body": (_record(body=b"not zlib", sys_flag=1), "is flagged compressed but does not inflate"),
    "unknown compression type": (_record(body=zlib.compress(b"x" * 100), sys_flag=0x401), "(type 4)"),
    "cut compressed body": (_record(body=zlib.compress(b"x" * 100)[:-3], sys_flag=1), "does not inflate"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_each_broken_body_is_named_as_the_twin_names_it(name):
    body, words = BAD_BODIES[name]
    for address in ("", "10.1.2.3:10911"):
        with pytest.raises(MessageDecodeError) as got:
            decode_messages(body, address=address)
        with pytest.raises(MessageDecodeError) as want:
            T.decode_messages(body, address=address)
        assert str(got.value) == str(want.value)
        assert words in str(got.value)
        assert (f" from {address}" in str(got.value)) == bool(address)
        assert got.value.__cause__ is None and got.value.__suppress_context__


def test_an_empty_body_flagged_compressed_stays_empty_as_messagedecoder_leaves_it():
    """MessageDecoder.decode inflates only a body of bodyLen > 0."""
    body = _record(body=b"", sys_flag=1)
    assert [m.body for m in decode_messages(body)] == [m.body for m in T.decode_messages(body)] == [b""]


def test_the_kernel_raises_valueerror_and_the_client_makes_it_a_decode_error():
    body = GOOD + b"xyz"
    with pytest.raises(ValueError, match=f"has no valid record at byte {len(GOOD)} of {len(GOOD) + 3}") as raw:
        K.decode_messages(body, address="1.2.3.4:5")
    assert not isinstance(raw.value, MessageDecodeError)
    with pytest.raises(MessageDecodeError) as wrapped:
        decode_messages(body, address="1.2.3.4:5")
    assert str(wrapped.value) == str(raw.value)
    assert K.decode_messages(b"") == decode_messages(b"") == []


# -- what a decoded message holds --------------------------------------------------------------

def test_records_back_to_back_keep_their_own_fields():
    v6 = _record(topic="AB", body=b"one", born_host=("fe80::1", 1), store_host=("2001:db8::7", 10911),
                 properties={"UNIQ_KEY": "U1", "KEYS": "k1 k2", "x": "y"}, queue_offset=1)
    no_uniq = _record(topic="BA", body=b"two", properties={"TAGS": "t2"}, physical_offset=100 + len(v6),
                      queue_offset=2)
    packed = _record(topic="AB", body=zlib.compress(b"three" * 30), sys_flag=1, properties=None, queue_offset=3)
    quirky = _record(topic="\u00e9\u00e9", properties="\x02a\x01\x02\x01b\x02UNIQ_KEY\x01U2\x02UNIQ_KEY\x01U3",
                     born_host=("10.0.0.9", 2), store_host=("10.0.0.9", 2), queue_offset=4, v2=True)
    body = v6 + no_uniq + packed + quirky
    got = decode_messages(body, broker_name="bn")
    assert [view(m) for m in got] == [view(m) for m in T.decode_messages(body, broker_name="bn")]
    a, b, c, d = got
    assert [m.topic for m in got] == ["AB", "BA", "AB", "\u00e9\u00e9"]
    assert (a.body, a.msg_id, a.keys, a.user_properties) == (b"one", "U1", ["k1", "k2"], {"x": "y"})
    assert a.born_host == ("fe80::1", 1) and a.store_host == ("2001:db8::7", 10911)
    assert len(a.offset_msg_id) == 56 and a.offset_msg_id == a.offset_msg_id.upper()
    assert a.offset_msg_id.startswith("20010DB8" + "0" * 23 + "7" + "00002A9F")
    assert b.msg_id == b.offset_msg_id == "7F0000010000" + "2A9F" + (100 + len(v6)).to_bytes(8, "big").hex().upper()
    assert (b.tags, b.uniq_key, b.keys) == ("t2", None, [])
    assert (c.body, c.properties, c.tags, c.sys_flag & 1) == (b"three" * 30, {}, None, 1)
    assert d.properties == {"UNIQ_KEY": "U3"} and d.msg_id == d.uniq_key == "U3", "the last UNIQ_KEY wins"
    assert d.born_host == d.store_host == ("10.0.0.9", 2)
    assert all(m.message_queue == MessageQueue(m.topic, "bn", m.queue_id) for m in got)
    assert set(a.properties) - set(a.user_properties) <= SYSTEM_PROPERTIES


def _twin_pair(**kw):
    """(kernel message, twin message) of one record."""
    record = _record(**kw)
    return decode_messages(record, broker_name="b")[0], T.decode_messages(record, broker_name="b")[0]


def test_equality_repr_and_hashing_are_the_dataclasses():
    k, t = _twin_pair()
    made = MessageExt(*[getattr(t, f) for f in FIELDS])
    by_name = MessageExt(**{f: getattr(t, f) for f in FIELDS})
    assert k == made == by_name and not k != made
    assert repr(k) == repr(made) == repr(t)
    assert k != t and not k == t, "like the dataclass, only its own class compares equal"
    assert k != "x" and k.__eq__("x") is NotImplemented
    other = MessageExt(**{**{f: getattr(t, f) for f in FIELDS}, "queue_offset": t.queue_offset + 1})
    assert k != other and not k == other
    with pytest.raises(TypeError, match="unhashable"):
        hash(k)
    with pytest.raises(TypeError, match="unhashable"):
        hash(t)
    assert MessageExt.__hash__ is None
    short = MessageExt(*[getattr(t, f) for f in FIELDS[:-1]])
    assert short.broker_name == "" and repr(short) == repr(T.MessageExt(*[getattr(t, f) for f in FIELDS[:-1]]))
    with pytest.raises(TypeError):
        MessageExt(topic="T")  # type: ignore[call-arg]
    assert MessageExt.__match_args__ == T.MessageExt.__match_args__ == FIELDS
    match k:
        case MessageExt(topic, body):
            assert (topic, body) == ("T", b"hello")


def test_copies_and_pickles_compare_equal():
    k, _ = _twin_pair(store_host=("::1", 7), properties={"a": "b"})
    for clone in (pickle.loads(pickle.dumps(k)), copy.copy(k), copy.deepcopy(k)):
        assert clone == k and clone is not k and type(clone) is MessageExt


def test_setting_a_field_after_decoding_leaves_the_others_as_decoded():
    k, t = _twin_pair()
    k.commit_log_offset = 5
    assert k.offset_msg_id == t.offset_msg_id and k.commit_log_offset == 5
    k, t = _twin_pair(properties={"TAGS": "t"})
    k.properties = {"UNIQ_KEY": "other"}
    assert k.msg_id == t.msg_id == t.offset_msg_id and k.uniq_key == "other"
    k, t = _twin_pair(properties={"TAGS": "t"})
    k.offset_msg_id = "X"
    assert k.msg_id == t.msg_id
    k, t = _twin_pair()
    k.properties["TAGS"] = "changed"  # the dict is made once and kept: changes to it show
    assert k.properties is k.properties and k.tags == "changed" and k.msg_id == t.msg_id
    k, t = _twin_pair(born_host=("::2", 3))
    k.store_host = ("1.1.1.1", 1)
    k.msg_id = "M"
    assert (k.born_host, k.store_host, k.msg_id, k.offset_msg_id) == (("::2", 3), ("1.1.1.1", 1), "M", t.offset_msg_id)
    k.topic, k.body, k.broker_name, k.queue_id = "U", b"new", "bn", 9
    assert (k.topic, k.body, k.message_queue) == ("U", b"new", MessageQueue("U", "bn", 9))


def test_numbers_are_javas_int_and_long():
    k, _ = _twin_pair(queue_id=-(1 << 31), flag=(1 << 31) - 1, queue_offset=-(1 << 63), physical_offset=(1 << 63) - 1,
                      born_timestamp=-1, store_timestamp=(1 << 63) - 1, reconsume_times=-1)
    assert (k.queue_id, k.flag, k.queue_offset, k.commit_log_offset) == (-(1 << 31), (1 << 31) - 1, -(1 << 63),
                                                                          (1 << 63) - 1)
    with pytest.raises(OverflowError):
        k.queue_id = 1 << 31
    with pytest.raises(OverflowError):
        k.queue_offset = 1 << 63
    with pytest.raises(TypeError):
        k.flag = "1"  # type: ignore[assignment]


def test_a_messages_parts_do_not_pin_the_response_body():
    body = _record(body=b"x" * 1000)
    [m] = decode_messages(body)
    assert m.body == b"x" * 1000 and type(m.body) is bytes
    assert sys.getrefcount(body) == 2, "nothing but this frame refers to the response body"
