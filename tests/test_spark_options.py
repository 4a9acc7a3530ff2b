"""format("mqstore")'s options (issue 26): Kafka's names as aliases that do what Kafka's do,
every unknown or misspelled option refused with the closest known name, offsets JSON in both
shapes with -2/-1, the exact time lookup; and filters pushed down to the store's indexes,
whose answers must equal Spark's own (a query with pushFilters=false over the same store)."""

from __future__ import annotations

import time

import pytest

from mqstore import Message, MessageStore
from mqstore.queue.snapshot import QueueRange, StoreSnapshot
from mqstore.spark.options import OptionError, check_options, duration_ms_option, offsets_option
from mqstore.spark.pushdown import offset_of_msg_id
from mqstore.spark.session import cores_of
from mqstore.spark.source import QueueSlice, plan_queue_slices, units_with_tags

QUEUES = [QueueRange("A", 0, 5, 100), QueueRange("A", 1, 0, 0), QueueRange("B", 0, 0, 30),
          QueueRange("Orders", 0, 0, 10), QueueRange("Orders", 1, 0, 10)]


# -- the names ----------------------------------------------------------------------------------
@pytest.mark.parametrize("given, message", [
    ({"startingOffset": "latest"}, "unknown option 'startingOffset'.*did you mean 'startingOffsets'"),
    ({"subscribePatern": "A.*"}, "did you mean 'subscribePattern'"),
    ({"maxOffsetPerTrigger": "5"}, "did you mean 'maxOffsetsPerTrigger'"),
    ({"kafka.bootstrap.servers": "x"}, "unknown option 'kafka.bootstrap.servers'"),
    ({"subscribe": "A", "topics": "B"}, "'subscribe' and 'topics' mean the same"),
    ({"maxRecordsPerTrigger": "5"}, "does not apply to batch reads"),
])
def test_an_unknown_or_misplaced_option_is_refused_naming_the_closest_name(given, message):
    with pytest.raises(OptionError, match=message):
        check_options(given, "read")


def test_kafkas_aliases_read_as_the_names_they_stand_for():
    got = check_options({"subscribe": "A,B", "maxOffsetsPerTrigger": "10", "path": "/x"}, "stream")
    assert got == {"topics": "A,B", "maxrecordspertrigger": "10", "path": "/x"}
    assert [s.topic for s in plan_queue_slices(QUEUES, check_options({"subscribe": "B"}, "read"))] == ["B"]


def test_subscribe_pattern_assign_and_unknown_topics():
    keys = lambda opts: sorted({f"{s.topic}/{s.queue_id}" for s in plan_queue_slices(QUEUES, opts)})  # noqa: E731
    assert keys({"subscribepattern": "Ord.*"}) == ["Orders/0", "Orders/1"]
    assert keys({"subscribepattern": "A|B"}) == ["A/0", "B/0"]  # a full match, as Kafka's
    assert keys({"subscribepattern": "Ord"}) == []
    assert keys({"assign": '{"Orders": [1], "A": [0]}'}) == ["A/0", "Orders/1"]
    with pytest.raises(OptionError, match="topics names topic.s. the store does not have: Nope"):
        plan_queue_slices(QUEUES, {"topics": "A,Nope"})
    with pytest.raises(OptionError, match="assign names queue.s. the store does not have: A/7"):
        plan_queue_slices(QUEUES, {"assign": '{"A": [7]}'})
    with pytest.raises(OptionError, match="each pick the topics"):
        plan_queue_slices(QUEUES, {"topics": "A", "subscribepattern": "B"})
    with pytest.raises(OptionError, match="not a regular expression"):
        plan_queue_slices(QUEUES, {"subscribepattern": "("})


def test_offsets_json_in_both_shapes_with_kafkas_sentinels():
    assert offsets_option({"startingoffsets": '{"A": {"0": 7}, "B/0": -2}'}, "startingOffsets", "earliest") == {
        "A/0": 7, "B/0": -2}
    got = plan_queue_slices(QUEUES, {"startingoffsets": '{"A": {"0": 7}, "B": {"0": -1}}', "topics": "A,B"})
    assert got == [QueueSlice("A", 0, 7, 100)]  # B/0 starts at latest: nothing
    got = plan_queue_slices(QUEUES, {"endingoffsets": '{"A": {"0": -1}, "B/0": 4}', "topics": "A,B"})
    assert got == [QueueSlice("A", 0, 5, 100), QueueSlice("B", 0, 0, 4)]
    with pytest.raises(OptionError, match="-2 .earliest. is not valid for A/0"):
        plan_queue_slices(QUEUES, {"endingoffsets": '{"A/0": -2}'})
    with pytest.raises(OptionError, match="endingOffsets=earliest is not valid"):
        plan_queue_slices(QUEUES, {"endingoffsets": "earliest"})
    with pytest.raises(OptionError, match="offset -3 for A/0 is negative"):
        plan_queue_slices(QUEUES, {"startingoffsets": '{"A/0": -3}'})


def test_min_partitions_splits_the_offset_ranges():
    got = plan_queue_slices(QUEUES, {"topics": "B", "minpartitions": "4"})
    assert [(s.start, s.end) for s in got] == [(0, 8), (8, 16), (16, 24), (24, 30)]
    assert len(plan_queue_slices(QUEUES, {"minpartitions": "1"})) == 4


def test_durations_and_master_strings():
    assert duration_ms_option({"maxtriggerdelay": "30s"}, "maxTriggerDelay", 0) == 30_000
    assert duration_ms_option({"maxtriggerdelay": "500ms"}, "maxTriggerDelay", 0) == 500
    assert duration_ms_option({"maxtriggerdelay": "2m"}, "maxTriggerDelay", 0) == 120_000
    with pytest.raises(OptionError, match="expected a duration"):
        duration_ms_option({"maxtriggerdelay": "soon"}, "maxTriggerDelay", 0)
    assert cores_of("local[2,4]") == 2 and cores_of("local[3]") == 3 and cores_of("local") == 1
    assert cores_of("local-cluster[2,1,1024]") == 2 and cores_of("spark://h:7077") >= 1


def test_streams_refuse_ending_options_and_min_offsets_waits_until_the_delay(tmp_path):
    from mqstore.spark.source import SCHEMA
    from mqstore.spark.stream import MQStoreStreamReader

    root = str(tmp_path / "s")
    with MessageStore(root) as s:
        for i in range(10):
            s.put_message(Message("T", b"m%d" % i, queue_id=0)).check()
    with pytest.raises(OptionError, match="endingOffsets does not apply to streaming reads"):
        MQStoreStreamReader({"path": root, "endingOffsets": "latest"}, SCHEMA)
    with pytest.raises(OptionError, match="give that too"):
        MQStoreStreamReader({"path": root, "maxTriggerDelay": "1s"}, SCHEMA)
    reader = MQStoreStreamReader({"path": root, "minOffsetsPerTrigger": "50", "maxTriggerDelay": "1s"}, SCHEMA)
    start = reader.initialOffset()
    limit = reader.getDefaultReadLimit()
    assert reader.latestOffset(start, limit) == start  # 10 < 50: waits
    deadline = time.monotonic() + 30
    while (end := reader.latestOffset(start, limit)) == start:
        assert time.monotonic() < deadline, "maxTriggerDelay never let the micro-batch through"
        time.sleep(0.1)
    assert end == {"T/0": 10}
    assert reader.latestOffset(end, limit) == end  # and the next waits again


# -- the exact time lookup ----------------------------------------------------------------------
def test_first_offset_at_is_the_first_message_stored_at_or_after_the_time(tmp_path):
    root = str(tmp_path / "t")
    with MessageStore(root, mapped_file_size_consume_queue=20 * 50) as s:  # several ConsumeQueue files
        for burst in range(12):
            for i in range(17):
                s.put_message(Message("T", b"%d-%d" % (burst, i), queue_id=0)).check()
            time.sleep(0.003)
    with StoreSnapshot(root) as snap:
        q = snap.queue("T", 0)
        times = [snap.store_time(q, o) for o in range(q.min_offset, q.max_offset)]
        assert times == sorted(times) and None not in times
        for t in sorted(set(times) | {times[0] - 1, times[-1] + 1} | {x + 1 for x in times}):
            expected = next((o for o, ts in enumerate(times) if ts >= t), q.max_offset)
            assert snap.first_offset_at(q, t) == expected, t


# -- pushdown kernels ---------------------------------------------------------------------------
def test_units_with_tags_keeps_the_units_of_those_tag_hashes():
    import struct

    units = b"".join(struct.pack(">qiq", i * 100, 50, i % 4 - 1) for i in range(1000))
    kept = units_with_tags(units, (-1, 2))
    got = [struct.unpack_from(">qiq", kept, at) for at in range(0, len(kept), 20)]
    assert got == [(i * 100, 50, i % 4 - 1) for i in range(1000) if i % 4 in (0, 3)]
    assert units_with_tags(b"", (1,)) == b"" and units_with_tags(units, (99,)) == b""


def test_offset_message_ids_give_their_physical_offset():
    assert offset_of_msg_id("7F00000100002A9F00000000000009F9") == 0x9F9
    assert offset_of_msg_id("0" * 40 + "00000000000000FF") == 0xFF
    assert offset_of_msg_id("AC1E00010000") is None and offset_of_msg_id("Z" * 32) is None


# -- pushdown through Spark ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("push") / "store")
    with MessageStore(root, mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=20 * 300) as s:
        for i in range(3000):
            s.put_message(Message("TopicA" if i % 3 else "TopicB", b"b%d" % i, queue_id=i % 4, tags=f"T{i % 7}",
                                  keys=f"k{i} x{i}")).check()
            if i % 500 == 0:
                time.sleep(0.01)
    return root


FILTERS = [
    "topic = 'TopicA'",
    "topic in ('TopicB', 'Nope') and queue_id in (1, 3)",
    "queue_offset >= 100 and queue_offset < 260",
    "queue_offset = 42 and queue_id = 2",
    "commitlog_offset > 50000 and commitlog_offset <= 120000",
    "tags = 'T3'",
    "tags in ('T1', 'T6') and topic = 'TopicA'",
    "keys = 'k123 x123'",
    "keys in ('k7 x7', 'k2999 x2999', 'nope') ",
    "keys = 'k10'",
    "queue_id = 9",
    "queue_offset > 5 and queue_offset < 3",
]


@pytest.mark.spark
@pytest.mark.parametrize("condition", FILTERS)
def test_pushed_filters_answer_what_spark_answers(spark, tagged, condition):
    pushed = spark.read.format("mqstore").load(tagged).filter(condition)
    plain = spark.read.format("mqstore").option("pushFilters", "false").load(tagged).filter(condition)
    cols = ["topic", "queue_id", "queue_offset", "body"]
    got = sorted(tuple(r) for r in pushed.select(*cols).collect())
    assert got == sorted(tuple(r) for r in plain.select(*cols).collect())


@pytest.mark.spark
def test_pushed_time_and_id_filters_answer_what_spark_answers(spark, tagged):
    every = spark.read.format("mqstore").option("pushFilters", "false").load(tagged)
    rows = every.select("msg_id", "store_timestamp").orderBy("store_timestamp").collect()
    t1, t2 = rows[700].store_timestamp, rows[2100].store_timestamp
    ids = [rows[5].msg_id, rows[2999].msg_id]
    for condition, params in [("store_timestamp >= {t1} and store_timestamp < {t2}", {}),
                              ("store_timestamp > {t1}", {}), ("store_timestamp <= {t1}", {}),
                              ("msg_id in ({ids})", {}), ("msg_id = {id0} and topic = 'TopicB'", {})]:
        text = condition.format(t1=f"timestamp'{t1.isoformat()}'", t2=f"timestamp'{t2.isoformat()}'",
                                ids=", ".join(f"'{i}'" for i in ids), id0=f"'{ids[0]}'")
        got = spark.read.format("mqstore").load(tagged).filter(text).select("msg_id").collect()
        want = every.filter(text).select("msg_id").collect()
        assert sorted(got) == sorted(want) and (want or "topic" in text), text


@pytest.mark.spark
def test_the_plan_keeps_only_what_was_not_pushed(spark, tagged):
    """Filters the store answers exactly leave Spark's Filter node; the rechecked ones stay."""
    plan = spark.read.format("mqstore").load(tagged).filter("topic = 'TopicA' and tags = 'T3'") \
        ._jdf.queryExecution().executedPlan().toString()
    assert "T3" in plan and "TopicA" not in plan
    plain = spark.read.format("mqstore").option("pushFilters", "false").load(tagged) \
        .filter("topic = 'TopicA' and tags = 'T3'")._jdf.queryExecution().executedPlan().toString()
    assert "TopicA" in plain


@pytest.mark.spark
def test_include_headers_gives_kafkas_headers_column(spark, tagged):
    row = spark.read.format("mqstore").option("includeHeaders", "true").load(tagged) \
        .filter("queue_offset = 0 and queue_id = 0").select("topic", "properties", "headers").first()
    assert {h.key: bytes(h.value).decode() for h in row.headers} == row.properties
    with pytest.raises(Exception, match="includeHeaders"):
        spark.read.format("mqstore").schema("topic string, headers array<struct<key:string,value:binary>>") \
            .load(tagged).count()


@pytest.mark.spark
def test_a_bad_option_reaches_the_user_as_one_line(spark, tagged):
    with pytest.raises(Exception) as err:
        spark.read.format("mqstore").option("startingOffset", "latest").load(tagged).count()
    text = str(err.value)
    assert "did you mean 'startingOffsets'" in text and "Traceback" not in text


STATIC_THEN_REGISTER = """
import os, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
found = spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("mqstore")
from mqstore.spark import session
spark = session("local[1]")
print("STATIC", found, "ROWS", spark.read.format("mqstore").load(sys.argv[1]).count(), flush=True)
"""


@pytest.mark.spark
def test_registering_over_the_source_pyspark_found_by_itself_warns_nobody(tagged):
    """With pyspark_mqstore importable by the workers, PySpark registers the source by itself;
    session()'s register() replaces it (for pushdown) without Spark's replacement warning."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-c", STATIC_THEN_REGISTER, tagged], env=env, capture_output=True,
                          text=True, timeout=300)
    assert "STATIC True ROWS 3000" in done.stdout, done.stdout + done.stderr
    assert "replaced a statically registered" not in done.stderr, done.stderr


@pytest.mark.spark
def test_bodies_come_as_sent_and_raw_when_asked(spark, tmp_path):
    """A body stored zlib-compressed (sysFlag bit 0, as RocketMQ's producers store 4 KiB and up)
    reads back as sent; option rawBody gives the stored bytes."""
    import os
    import zlib

    root = str(tmp_path / "z")
    sent = os.urandom(3000) * 3
    with MessageStore(root) as s:
        s.put_message(Message("Z", zlib.compress(sent), queue_id=0, sys_flag=1)).check()
        s.put_message(Message("Z", b"plain", queue_id=0)).check()
    rows = spark.read.format("mqstore").load(root).orderBy("queue_offset").select("body", "sys_flag").collect()
    assert [bytes(r.body) for r in rows] == [sent, b"plain"] and rows[0].sys_flag & 1
    raw = spark.read.format("mqstore").option("rawBody", "true").load(root).orderBy("queue_offset").collect()
    assert bytes(raw[0].body) == zlib.compress(sent) and bytes(raw[1].body) == b"plain"


def test_timestamp_filter_bounds_in_store_milliseconds():
    """A store time of ms milliseconds is Spark's ms * 1000 µs: each comparison with a µs value
    becomes a [low, high) of store ms that holds exactly the rows Spark would keep."""
    from mqstore.spark.pushdown import (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual,
                                        _ms_bounds)

    checks = {GreaterThan: lambda ms, us: ms * 1000 > us, GreaterThanOrEqual: lambda ms, us: ms * 1000 >= us,
              LessThan: lambda ms, us: ms * 1000 < us, LessThanOrEqual: lambda ms, us: ms * 1000 <= us,
              EqualTo: lambda ms, us: ms * 1000 == us}
    for op, keeps in checks.items():
        for us in (5000, 5001, 4999, -1, 0):
            lo, hi = _ms_bounds(op, us)
            assert [ms for ms in range(-3, 12) if lo <= ms < hi] == [ms for ms in range(-3, 12) if keeps(ms, us)]
