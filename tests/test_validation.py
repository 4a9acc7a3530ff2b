"""Bad names and properties at every entry (issue 14): a topic is checked with RocketMQ's
TopicValidator rule and max_topic_length, a property that would not read back as it was put
(a separator inside a name or value, an empty name or value) is refused with MESSAGE_ILLEGAL
naming it; the kernels against their pure-Python twins, and a fuzz test driving random
topics, properties, tags and keys through put_message, put_messages (lists and client batch
bodies) and an attached process's puts, after which the store's file tree is still its own
layout and the checker finds nothing."""

from __future__ import annotations

import os
import random
import re

import pytest
from helpers_proc import run_in_child
from hypothesis import given
from hypothesis import strategies as st

from mqstore import Message, MessageBatch, MessageStore, PutMessageStatus
from mqstore.log._codec import encode_batch_body
from mqstore.log._message import properties_problem_of, topic_problem_of
from mqstore.tools.checker import check_store
from mqstore.twin.codec import properties_problem, string_to_properties, topic_problem

TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")  # RocketMQ 4.9.7 TopicValidator.VALID_PATTERN_STR

# characters that matter: path parts, separators, NUL, non-ASCII, and the allowed ones
NASTY = "./\\\x00\x01\x02 \t\n:*?é漢😀%|_-aZ09"
names = st.text(alphabet=st.sampled_from(NASTY), max_size=12) | st.text(max_size=12)
values = st.one_of(st.none(), names, st.integers(-5, 5))


@given(topic=names, max_length=st.integers(1, 127))
def test_topic_check_matches_the_twin_and_rocketmq_rule(topic, max_length):
    got = topic_problem_of(topic, max_length)
    assert got == topic_problem(topic, max_length)
    # fullmatch, as Java's Pattern.matches: Python's $ also matches before a trailing newline
    assert (got is None) == (bool(TOPIC_RE.fullmatch(topic)) and len(topic) <= max_length)


@given(props=st.dictionaries(names | st.integers(0, 3), values, max_size=5))
def test_properties_check_matches_the_twin(props):
    got = properties_problem_of(props)
    assert got == properties_problem(props)
    if got is None:
        from mqstore.log._codec import properties_to_string
        expected = {k: str(v) for k, v in props.items() if v is not None}
        assert string_to_properties(properties_to_string(expected)) == expected


@pytest.mark.parametrize("props, needle", [
    ({"a\x01": "b\x02c"}, "name 'a\\x01'"),            # read back as {"a": "\x01b"} before
    ({"a": "b\x02c\x01d"}, "property 'a' has a value"),  # read back as two properties
    ({"": "x"}, "name is empty"),
    ({"a": ""}, "property 'a' has an empty value"),
    ({"ok": "1", 7: "x"}, "property name 7 is a int"),
])
def test_a_property_that_would_not_read_back_is_refused_naming_it(open_store, props, needle):
    store = open_store()
    good = store.put_message(Message("T", b"before", properties={"k": "v"})).check()
    for put in (lambda: store.put_message(Message("T", b"x", properties=props)),
                lambda: store.put_messages([Message("T", b"y"), Message("T", b"x", properties=props)]),
                lambda: store.put_messages(MessageBatch("T", encode_batch_body([(b"x", None, 0)]),
                                                        properties=props))):
        r = put()
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL, r
        assert needle in r.detail
    after = store.put_message(Message("T", b"after")).check()
    assert after.queue_offset == good.queue_offset + 1
    store.wait_dispatched()
    got = store.get_message("g", "T", 0, 0, 8)
    assert [bytes(m.body) for m in got] == [b"before", b"after"]
    assert got[0].properties["k"] == "v"


def test_max_topic_length_is_honoured(open_store):
    store = open_store(max_topic_length=8)
    assert store.put_message(Message("T" * 8, b"x")).ok
    r = store.put_message(Message("T" * 9, b"x"))
    assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "more than 8 (max_topic_length)" in r.detail


def test_a_refused_topic_is_refused_again_after_a_valid_one_is_cached(open_store):
    store = open_store()
    for _ in range(3):
        assert store.put_message(Message("Good", b"x")).ok
        assert store.put_message(Message("..", b"x")).status is PutMessageStatus.MESSAGE_ILLEGAL


def test_statuses_print_their_names():
    assert str(PutMessageStatus.PUT_OK) == "PUT_OK" and f"{PutMessageStatus.MESSAGE_ILLEGAL}" == "MESSAGE_ILLEGAL"
    assert f"{PutMessageStatus.MESSAGE_ILLEGAL:d}" == "6" and PutMessageStatus.MESSAGE_ILLEGAL == 6


# -- the fuzz test ------------------------------------------------------------------------------
LAYOUT = [re.compile(p) for p in (
    r"commitlog(/\d{20})?",
    r"consumequeue(/[%|a-zA-Z0-9_-]{1,127}(/\d+(/\d{20})?)?)?",
    r"index(/\d{17})?",
    r"config(/.*)?",
    r"(checkpoint|abort|lock|mqstore\.shm|mqstore\.config\.json|mqstore\.node\.json|mqstore\.clean\.json|mqstore\.pool(/.*)?)",
)]


def assert_layout(root: str) -> None:
    """Every path under root is one of a store's own."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            assert any(p.fullmatch(rel) for p in LAYOUT), f"{rel} is not part of a store's layout"


def random_name(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return rng.choice(["..", ".", "../escape", "a/b", "/abs", "a\x00b", "", "é", "a b", "%RETRY%g",
                           "x" * 128, "x" * 127, "rmq_sys_X", "T|1"])
    return "".join(rng.choice(NASTY) for _ in range(rng.randint(0, 10)))


def random_message(rng: random.Random, topic: str) -> Message:
    props = {random_name(rng): rng.choice([random_name(rng), None, "v"]) for _ in range(rng.randint(0, 3))}
    tags = rng.choice([None, random_name(rng), "TagA"])
    keys = rng.choice([None, [random_name(rng)], ["k1", random_name(rng)]])
    return Message(topic, b"body", queue_id=rng.randint(0, 2), tags=tags, keys=keys, properties=props or None)


def put_randomly(store, rng: random.Random, n: int) -> tuple[int, int]:
    """n random puts of each kind; (stored, refused). A refused put is MESSAGE_ILLEGAL."""
    stored = refused = 0
    for _ in range(n):
        topic = rng.choice([random_name(rng), "Good", "Good-2"])
        kind = rng.randrange(3)
        if kind == 0:
            r = store.put_message(random_message(rng, topic))
        elif kind == 1:
            first = random_message(rng, topic)
            r = store.put_messages([first] + [random_message(rng, topic) for _ in range(rng.randint(0, 3))])
        else:
            msgs = [random_message(rng, topic) for _ in range(rng.randint(1, 3))]
            body = encode_batch_body([(m.body, None, 0) for m in msgs])
            props = {random_name(rng): random_name(rng)} if rng.random() < 0.5 else None
            r = store.put_messages(MessageBatch(topic, body, queue_id=msgs[0].queue_id, properties=props))
        if r.ok:
            stored += 1
            assert topic_problem(topic) is None
        else:
            assert r.status is PutMessageStatus.MESSAGE_ILLEGAL, r
            assert r.detail
            refused += 1
    return stored, refused


def test_fuzzed_names_and_properties_keep_the_store_inside_its_layout(tmp_path, open_store):
    root = str(tmp_path / "store")
    store = open_store(root)
    rng = random.Random(14)
    stored, refused = put_randomly(store, rng, 600)
    assert stored > 50 and refused > 50
    store.wait_dispatched()
    store.shutdown()
    assert sorted(os.listdir(tmp_path)) == ["store"]
    assert_layout(root)
    check_store(root, config=store.config).raise_if_failed()


def test_fuzzed_puts_from_an_attached_process_keep_the_store_inside_its_layout(tmp_path):
    root = str(tmp_path / "store")
    with MessageStore(root, service_mode="processes", mapped_file_size_commit_log=1 << 20) as owner:
        assert run_in_child(_attached_fuzz, root, 41) == 0
        assert owner.wait_dispatched()
    assert sorted(os.listdir(tmp_path)) == ["store"]
    assert_layout(root)
    check_store(root).raise_if_failed()


def _attached_fuzz(root: str, seed: int) -> None:
    store = MessageStore.open(root)
    try:
        assert type(store).__name__ == "AttachedStore"
        stored, refused = put_randomly(store, random.Random(seed), 300)
        assert stored > 20 and refused > 20
    finally:
        store.shutdown()


def test_fuzzed_rows_written_through_spark_keep_the_store_inside_its_layout(spark, tmp_path):
    """The Spark batch writer is an entry point too: rows with random topics, tags, keys and
    properties either all land, or the write fails naming the bad row's cause; either way the
    store stays inside its layout and verifies clean."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    root = str(tmp_path / "store")
    rng = random.Random(5)
    failed = 0
    with MessageStore(root, mapped_file_size_commit_log=1 << 20) as store:
        for _ in range(4):
            rows = []
            for i in range(12):
                m = random_message(rng, rng.choice(["Good", "Good-2", random_name(rng)]))
                props = {k: v for k, v in m.properties.items() if k not in ("TAGS", "KEYS") and v is not None}
                rows.append((m.topic, b"b%d" % i, m.tags, " ".join(m.keys) or None,
                             {k: str(v) for k, v in props.items()} or None))
            bad = [r for r in rows if topic_problem(r[0]) or properties_problem({"TAGS": r[2], "KEYS": r[3], **(r[4] or {})})]
            df = spark.createDataFrame(rows, "topic string, body binary, tags string, keys string, "
                                             "properties map<string,string>").coalesce(1)
            try:
                df.write.format("mqstore").mode("append").save(root)
                assert not bad, f"rows {bad} were written"
            except (Py4JJavaError, PySparkException) as exc:
                assert bad, f"a write of valid rows failed: {exc}"
                assert "MESSAGE_ILLEGAL" in str(exc)
                failed += 1
        assert failed >= 1
        assert store.wait_dispatched()
    assert sorted(os.listdir(tmp_path)) == ["store"]
    assert_layout(root)
    check_store(root).raise_if_failed()
