"""The send side of the compiled client kernel (mqstore.client._client) against its twins: message ids
(mqstore.client._twin.UniqIdGenerator) id for id from the same fixed bytes, counter and clock
readings, across month bounds and clock steps; properties strings (mqstore.log._codec's
properties_to_string) and batch bodies (mqstore.log._codec's encode_batch_body) byte for byte."""

from __future__ import annotations

import os
import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.client._client import UniqIdGenerator, batch_entries, encode_batch, encode_properties
from mqstore.log._codec import decode_batch_body, encode_batch_body, properties_to_string
from mqstore.client import _twin
from mqstore.client._sending import batch_body
from mqstore.client._sending import batch_entries as checked_batch_entries
from mqstore.client.message import MAX_MESSAGE_SIZE, Message, SendResult, SendStatus, new_send_result

FIX = bytes([10, 1, 2, 3, 0x12, 0x34, 0xDE, 0xAD, 0xBE, 0xEF])


def _month_start(year: int, month: int) -> int:
    return int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1)) * 1000)


def test_the_kernel_and_the_twin_give_the_same_ids_for_the_same_clock():
    now = time.time_ns() // 1_000_000
    t = time.localtime(now / 1000)
    next_month = _month_start(t.tm_year + (t.tm_mon == 12), t.tm_mon % 12 + 1)
    readings = [now, now, now + 1, now + 5, now - 3, now - 999_999, now - 1_000_000, now - 5_000_000, now + 86_400_000,
                next_month - 1, next_month, next_month + 1, next_month - 10, next_month - 2_000_000,
                next_month + 40 * 86_400_000, now]
    kernel = UniqIdGenerator(fix=FIX, counter=65530, now_ms=now)
    twin = _twin.UniqIdGenerator(fix=FIX, counter=65530, now_ms=now)
    assert kernel.fix == twin.fix == FIX
    ids = [kernel.next_at(ms) for ms in readings]
    assert ids == [twin.next_at(ms) for ms in readings]
    assert all(re.fullmatch(r"0A010203" "1234" "DEADBEEF" r"[0-9A-F]{12}", i) for i in ids)
    counters = [int(i[-4:], 16) for i in ids]
    assert counters[:8] == [65530, 65531, 65532, 65533, 65534, 65535, 0, 1], "the counter wraps at 16 bits"
    diffs = [int.from_bytes(bytes.fromhex(i[20:28]), "big") for i in ids]
    start = _month_start(t.tm_year, t.tm_mon)
    assert diffs[0] == (now - start) % 2**32, "ms since the month's start, as Java's int (wraps after 24.8 days)"
    assert diffs[4] == (now - 3 - start) % 2**32
    assert diffs[10] == 0 and diffs[11] == 1, "a new month starts counting from 0"
    assert diffs[12] == 0, "a clock stepped back by less than 1000 s reads as the month's start"
    assert diffs[13] == (next_month - 2_000_000 - next_month) % 2**32, "further back: as it is"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-3 * 86_400_000, max_value=70 * 86_400_000), min_size=1, max_size=40),
       st.integers(min_value=0, max_value=0xFFFF), st.binary(min_size=10, max_size=10))
def test_id_parity_on_any_clock_walk(steps, counter, fix):
    base = 1_700_000_000_000
    kernel = UniqIdGenerator(fix=fix, counter=counter, now_ms=base)
    twin = _twin.UniqIdGenerator(fix=fix, counter=counter, now_ms=base)
    for step in steps:
        assert kernel.next_at(base + step) == twin.next_at(base + step)


def test_ids_from_the_clock_next_and_next_many():
    gen = UniqIdGenerator("10.1.2.3")
    twin = _twin.UniqIdGenerator(fix=gen.fix)
    a, b = gen.next(), twin.next()
    assert a[:20] == b[:20] == gen.fix.hex().upper()
    assert abs(int(a[20:28], 16) - int(b[20:28], 16)) < 5_000, "ms since the month's start, the same clock"
    ids = gen.next_many(70_000)
    assert len(ids) == 70_000 and len(set(ids)) == len(ids), "the counter wraps but the clock moves on"
    assert int(ids[0][-4:], 16) == 1 and gen.next_many(0) == []
    assert len(twin.next_many(3)) == 3
    raw = bytes.fromhex(ids[0])
    assert raw[:4] == bytes([10, 1, 2, 3]) and int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF
    assert UniqIdGenerator("::1").fix[4:6] == (os.getpid() & 0xFFFF).to_bytes(2, "big")
    assert UniqIdGenerator(None).fix != UniqIdGenerator(None).fix, "a random salt each"
    with pytest.raises(ValueError, match="fix must be 10 bytes"):
        UniqIdGenerator(fix=b"short")
    with pytest.raises(ValueError, match="n must be >= 0"):
        gen.next_many(-1)


# -- properties and batch bodies --------------------------------------------------------------------
NAMES = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "a", "b", "user", "x" * 20, "ü", "K1", "K2"])
VALUES = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(NAMES, st.one_of(st.none(), VALUES), max_size=8))
def test_properties_strings_match_the_codec(props):
    assert encode_properties(props) == properties_to_string(props)
    assert encode_properties(props) == properties_to_string(props), "again, from the order cache"


def test_properties_of_many_name_sets_and_none():
    assert encode_properties(None) == "" == properties_to_string(None)
    rnd = random.Random(7)
    for _ in range(3000):  # more sets of names than the cache keeps: it starts over
        props = {f"n{rnd.randrange(10_000)}": "v" for _ in range(rnd.randrange(1, 6))}
        assert encode_properties(props) == properties_to_string(props)


ITEMS = st.lists(st.one_of(
    st.binary(min_size=1, max_size=40),
    st.tuples(st.binary(min_size=1, max_size=40), st.dictionaries(st.sampled_from(["a", "b", "user"]),
                                                                  VALUES.filter(bool), max_size=3)),
    st.builds(lambda body, tags, keys, flag: Message(body, tags=tags, keys=keys, flag=flag),
              st.binary(min_size=1, max_size=40), st.one_of(st.none(), st.sampled_from(["TagA", "t"])),
              st.one_of(st.none(), st.just("k1"), st.just(["k1", "k2"])),
              st.integers(min_value=-2**31, max_value=2**31 - 1))), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(ITEMS)
def test_batch_bodies_match_the_codec(items):
    entries = checked_batch_entries(items)
    ids = UniqIdGenerator(fix=FIX).next_many(len(entries))
    expected = []
    for item, uniq in zip(items, ids):
        if isinstance(item, bytes):
            expected.append((item, {"UNIQ_KEY": uniq}, 0))
        elif isinstance(item, tuple):
            expected.append((item[0], {**item[1], "UNIQ_KEY": uniq}, 0))
        else:
            expected.append((item.body, item.property_map(uniq), item.flag))
    body = batch_body(entries, ids)
    assert body == encode_batch_body(expected)
    assert [b for _, b, _ in decode_batch_body(body)] == [e[0] for e in expected]


def test_batch_entries_keep_plain_bodies_and_ask_for_the_rest():
    asked = []

    def prepare(item, i):
        asked.append(i)
        return (b"prepared", {"a": "b"}, 5)

    big = b"x" * 11
    entries = batch_entries([b"one", bytearray(b"two"), b"", big], prepare, 10)
    assert entries[0] == b"one" and asked == [1, 2, 3], "bytearray, an empty body, an oversized one: prepare's"
    assert entries[1:] == [(b"prepared", {"a": "b"}, 5)] * 3
    with pytest.raises(ValueError, match="2 entries but 1 ids"):
        encode_batch([b"a", b"b"], ["X"])
    with pytest.raises(TypeError, match="batch entry 0"):
        encode_batch([("a",)], ["X"])
    with pytest.raises(ValueError, match="properties are 40000 bytes, more than 32767"):
        encode_batch([(b"a", {"p": "v" * 39_987}, 0)], ["X"])
    with pytest.raises(ValueError, match="the batch body size over max value"):
        batch_body([b"x" * (MAX_MESSAGE_SIZE // 2)] * 3, ["A", "B", "C"])


def test_a_send_result_made_without_init_is_the_same_object():
    args = (SendStatus.SEND_OK, "ID", 1, 2, "broker-a", "OFF", "T")
    fast, slow = new_send_result(*args), SendResult(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.message_queue == slow.message_queue
    with pytest.raises(AttributeError):
        fast.msg_id = "other"  # type: ignore[misc]
