"""The "mqstore" PySpark data source against a real local Spark session (issue 5): batch reads
compared with the store's own reads, the options, the whole-log mode, a narrower schema, a
store a node is serving while a producer writes; and the planning rules without Spark."""

from __future__ import annotations

import threading

import pytest

from mqstore import Message, MessageStore
from mqstore.spark.source import SCHEMA, MQStoreBatchReader, OptionError, QueueSlice, plan_queue_slices
from mqstore.queue.snapshot import QueueRange

pytestmark = pytest.mark.spark

CFG = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 200}
# timestamps as epoch milliseconds, so rows compare with the store's values exactly
COLUMNS = [f"unix_millis({c}) as {c}" if c.endswith("_timestamp") else c for c in SCHEMA.fieldNames()]


def _messages(n: int) -> list[Message]:
    out = []
    for i in range(n):
        props = {"source": f"unit-{i % 3}"} if i % 4 == 0 else None
        out.append(Message("Orders" if (i // 3) % 2 else "Pay", bytes([i % 256]) * (i % 50), queue_id=i % 3,
                           tags=None if i % 5 == 0 else f"Tag{i % 2}", keys=[f"k{i}", f"alt{i}"] if i % 2 else None,
                           properties=props))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store shut down cleanly: 2 topics x 3 queues, single puts and a batch."""
    root = str(tmp_path_factory.mktemp("spark") / "store")
    with MessageStore(root, **CFG) as s:
        for m in _messages(2500):
            s.put_message(m).check()
        s.put_messages([Message("Pay", b"batch%d" % i, queue_id=1) for i in range(40)]).check()
    return root


def _store_rows(root: str) -> dict[tuple[str, int, int], dict]:
    """Every message as the store itself reads it (get_message), by (topic, queue, offset)."""
    out = {}
    with MessageStore(root, **CFG) as s:
        for topic in ("Orders", "Pay"):
            for q in range(3):
                offset = 0
                while True:
                    got = s.get_message("g", topic, q, offset, 64)
                    if got.status.name != "FOUND":
                        break
                    for m in got:
                        rec = m.decode()
                        out[(topic, q, m.queue_offset)] = {
                            "topic": rec.topic, "queue_id": rec.queue_id, "queue_offset": rec.queue_offset,
                            "commitlog_offset": rec.physical_offset, "store_size": rec.total_size,
                            "born_timestamp": rec.born_timestamp, "store_timestamp": rec.store_timestamp,
                            "born_host": f"{rec.born_host[0]}:{rec.born_host[1]}",
                            "store_host": f"{rec.store_host[0]}:{rec.store_host[1]}",
                            "tags": rec.properties.get("TAGS"), "keys": rec.properties.get("KEYS"),
                            "msg_id": m.msg_id, "properties": rec.properties, "body": rec.body,
                            "reconsume_times": rec.reconsume_times, "sys_flag": rec.sys_flag}
                    offset = got.next_begin_offset
    return out


def _spark_rows(df) -> dict[tuple[str, int, int], dict]:
    rows = {}
    for r in df.selectExpr(*COLUMNS).collect():
        d = r.asDict()
        d["body"] = bytes(d["body"])
        rows[(d["topic"], d["queue_id"], d["queue_offset"])] = d
    return rows


def test_batch_read_gives_every_message_as_the_store_reads_it(spark, store):
    expected = _store_rows(store)
    df = spark.read.format("mqstore").load(store)
    assert df.schema == SCHEMA
    got = _spark_rows(df)
    assert len(got) == len(expected) == 2540
    assert got == expected
    # small partitions: the same rows, cut into more pieces than there are queues
    small = spark.read.format("mqstore").option("maxRowsPerPartition", 100).option("batchRows", 33).load(store)
    assert small.rdd.getNumPartitions() > 20
    assert _spark_rows(small) == expected


def test_options_pick_topics_queues_and_offset_ranges(spark, store):
    df = (spark.read.format("mqstore").option("topics", "Pay").option("queues", "1, 2")
          .option("startingOffsets", '{"Pay/1": 10}').option("endingOffsets", '{"Pay/1": 15, "Pay/2": 3}')
          .load(store))
    got = sorted((r.topic, r.queue_id, r.queue_offset) for r in df.select("topic", "queue_id", "queue_offset").collect())
    assert got == [("Pay", 1, q) for q in range(10, 15)] + [("Pay", 2, q) for q in range(3)]
    latest = spark.read.format("mqstore").option("startingOffsets", "latest").load(store)
    assert latest.count() == 0


def test_commitlog_mode_reads_every_record_in_log_order(spark, store):
    df = spark.read.format("mqstore").option("mode", "commitlog").load(store)
    offsets = [r.commitlog_offset for r in df.select("commitlog_offset").collect()]
    assert len(offsets) == 2540 and offsets == sorted(offsets)
    assert df.rdd.getNumPartitions() > 1  # a partition per CommitLog file
    assert _spark_rows(df) == _store_rows(store)


def test_a_narrower_schema_reads_only_its_columns_and_a_wrong_one_is_named(spark, store):
    df = spark.read.format("mqstore").schema("body binary, topic string").load(store)
    rows = df.where("topic = 'Pay'").collect()
    assert len(rows) == sum(1 for k in _store_rows(store) if k[0] == "Pay")
    assert rows[0].asDict().keys() == {"body", "topic"}
    with pytest.raises(Exception, match="'colour' is not an mqstore column"):
        spark.read.format("mqstore").schema("colour string").load(store).collect()
    with pytest.raises(Exception, match="'body' is binary, not string"):
        spark.read.format("mqstore").schema("body string").load(store).collect()


def test_a_store_a_node_serves_is_read_consistently_while_a_producer_writes(spark, tmp_path):
    root = str(tmp_path / "live")
    with MessageStore(root, service_mode="processes", **CFG) as node:
        for i in range(3000):
            node.put_message(Message("Live", b"x%d|" % i + b"." * (i % 40), queue_id=i % 2)).check()
        stop = threading.Event()

        def produce():
            i = 3000
            while not stop.is_set():
                node.put_message(Message("Live", b"x%d|" % i + b"." * (i % 40), queue_id=i % 2)).check()
                i += 1

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            rows = spark.read.format("mqstore").load(root).select("queue_id", "queue_offset", "body").collect()
        finally:
            stop.set()
            producer.join()
    assert len(rows) >= 3000
    for q in (0, 1):
        mine = sorted((r.queue_offset, bytes(r.body)) for r in rows if r.queue_id == q)
        assert [o for o, _ in mine] == list(range(len(mine)))  # no gap, no duplicate
        for offset, body in mine:
            i = 2 * offset + q
            assert body == b"x%d|" % i + b"." * (i % 40)


def test_the_auto_registration_module_exports_the_source():
    import pyspark_mqstore
    from mqstore.spark import MQStoreDataSource

    assert pyspark_mqstore.DefaultSource is MQStoreDataSource and MQStoreDataSource.name() == "mqstore"


def test_a_worker_is_settled_once_its_startup_objects_frozen_out_of_the_collector():
    """PySpark's reused worker collects garbage after every task: settle_worker freezes what
    is alive at the first task (the modules), once; what tasks make later is still collected."""
    import subprocess
    import sys

    code = """
import gc, weakref
from mqstore.spark.worker import settle_worker
assert gc.get_freeze_count() == 0
settle_worker()
frozen = gc.get_freeze_count()
assert frozen > 1000, frozen
settle_worker()
assert gc.get_freeze_count() == frozen
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None
print("ok", frozen)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr


def test_the_session_takes_the_driver_jvm_options_from_the_environment(spark):
    import os

    from mqstore.spark.session import DRIVER_JAVA_OPTIONS

    wanted = os.environ["MQSTORE_SPARK_DRIVER_JAVA_OPTIONS"]  # tests/conftest.py: C1 alone
    assert wanted != DRIVER_JAVA_OPTIONS
    got = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")  # Spark appends its own
    assert got.endswith(" " + wanted) or got == wanted, got


# -- planning, without Spark ----------------------------------------------------------------------
QUEUES = [QueueRange("A", 0, 5, 100), QueueRange("A", 1, 0, 0), QueueRange("B", 0, 0, 30)]


def test_plan_cuts_each_queue_into_pieces_of_max_rows():
    got = plan_queue_slices(QUEUES, {"maxrowsperpartition": "40"})
    assert got == [QueueSlice("A", 0, 5, 45), QueueSlice("A", 0, 45, 85), QueueSlice("A", 0, 85, 100),
                   QueueSlice("B", 0, 0, 30)]


def test_small_slices_are_packed_in_order_into_tasks_of_at_most_an_eighth_of_max_rows():
    from mqstore.spark.source import QueueSlices, pack_slices

    pieces = [QueueSlice("A", 0, 0, 3), QueueSlice("A", 1, 10, 14), QueueSlice("A", 2, 0, 80),
              QueueSlice("A", 3, 5, 6), QueueSlice("B", 0, 0, 9), QueueSlice("B", 1, 0, 2)]
    got = pack_slices(pieces, 80)  # small: under 10 rows, packed up to 10
    assert got == [QueueSlices((pieces[0], pieces[1])), pieces[2], QueueSlices((pieces[3], pieces[4])), pieces[5]]
    flat = [p for g in got for p in (g.parts if isinstance(g, QueueSlices) else (g,))]
    assert flat == pieces  # every slice once, in the planned order
    assert pack_slices(pieces, 80, min_partitions=5) == pieces  # packing would go below minPartitions
    assert pack_slices([], 80) == []


def test_a_narrow_time_range_is_one_task_reading_every_queue(tmp_path):
    from mqstore.spark.source import QueueSlices

    with MessageStore(str(tmp_path / "s")) as store:
        for q in range(4):
            store.put_messages([Message("T", b"x", queue_id=q) for _ in range(50)]).check()
    reader = MQStoreBatchReader({"path": str(tmp_path / "s"),
                                 "startingOffsets": '{"T/0": 40, "T/1": 40, "T/2": 40, "T/3": 40}'}, SCHEMA)
    parts = reader.partitions()
    assert len(parts) == 1 and isinstance(parts[0], QueueSlices)
    assert [(p.queue_id, p.start, p.end) for p in parts[0].parts] == [(q, 40, 50) for q in range(4)]


def test_plan_refuses_offsets_no_longer_stored_naming_the_queue_and_the_range():
    with pytest.raises(OptionError, match=r"queue A/0: .* offsets \[2, 5\) are no longer stored"):
        plan_queue_slices(QUEUES, {"startingoffsets": '{"A/0": 2}'})


@pytest.mark.parametrize("options, message", [
    ({"startingoffsets": "newest"}, "expected earliest, latest or JSON"),
    ({"endingoffsets": '{"A/0": "ten"}'}, "option endingOffsets: 'ten' is not an integer"),
    ({"startingoffsets": '{"C/0": 1}'}, "names queue.s. the store does not have: C/0"),
    ({"queues": "one"}, "must list queue ids"),
    ({"maxrowsperpartition": "0"}, "must be >= 1"),
])
def test_plan_names_a_bad_option(options, message):
    with pytest.raises(OptionError, match=message):
        plan_queue_slices(QUEUES, options)


def test_plan_by_timestamps_uses_the_time_lookup_and_refuses_both_kinds():
    looked = []

    def by_time(q, ts):
        looked.append((q.key, ts))
        return {1000: 10, 2000: 20}[ts] if q.topic == "A" else 3

    got = plan_queue_slices(QUEUES, {"startingtimestamp": "1000", "endingtimestamp": "2000", "topics": "A"}, by_time)
    assert got == [QueueSlice("A", 0, 10, 20)] and ("A/0", 1000) in looked
    assert all(key.startswith("A/") for key, _ in looked)  # queues the options leave out are not looked up
    with pytest.raises(OptionError, match="startingOffsets and startingTimestamp each say where to start"):
        plan_queue_slices(QUEUES, {"startingtimestamp": "1", "startingoffsets": "earliest"}, by_time)


def test_read_by_timestamps_gives_exactly_the_messages_stored_in_the_range(spark, tmp_path):
    """startingTimestamp / endingTimestamp and Kafka's per-queue ...ByTimestamp are exact: the
    first offset whose store time is >= t (Kafka's offsetsForTimes), so a read between two times
    gives what Spark's own store_timestamp filter gives."""
    import time

    root = str(tmp_path / "timed")
    with MessageStore(root, **CFG) as s:
        marks = []
        for burst in range(5):
            marks.append(int(time.time() * 1000))
            for i in range(20):
                s.put_message(Message("Timed", b"%d-%d" % (burst, i), queue_id=0)).check()
            time.sleep(0.02)
    df = (spark.read.format("mqstore").option("startingTimestamp", marks[1]).option("endingTimestamp", marks[3])
          .load(root))
    got = sorted(r.queue_offset for r in df.select("queue_offset").collect())
    every = spark.read.format("mqstore").option("pushFilters", "false").load(root)
    expected = sorted(r.queue_offset for r in every.filter(
        f"unix_millis(store_timestamp) >= {marks[1]} and unix_millis(store_timestamp) < {marks[3]}")
        .select("queue_offset").collect())
    assert got == expected and 30 <= len(got) <= 50
    by_queue = (spark.read.format("mqstore").option("startingOffsetsByTimestamp", f'{{"Timed": {{"0": {marks[1]}}}}}')
                .option("endingOffsetsByTimestamp", f'{{"Timed/0": {marks[3]}}}').load(root))
    assert sorted(r.queue_offset for r in by_queue.select("queue_offset").collect()) == expected


# -- streaming ---------------------------------------------------------------------------------
def test_share_rows_gives_each_queue_a_fair_part():
    from mqstore.spark.stream import share_rows

    start = {"A/0": 0, "A/1": 10, "B/0": 5}
    latest = {"A/0": 100, "A/1": 12, "B/0": 105}
    assert share_rows(start, latest, 1000) == latest
    got = share_rows(start, latest, 50)
    assert got["A/1"] == 12 and got["A/0"] + got["B/0"] - 5 == 48 and abs(got["A/0"] - (got["B/0"] - 5)) <= 1
    assert share_rows(start, latest, 0) == start


def _stream(spark, root, checkpoint, out, **options):
    reader = spark.readStream.format("mqstore")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load(root).select("topic", "queue_id", "queue_offset", "body").writeStream.format("parquet")
         .option("checkpointLocation", checkpoint).option("path", out).trigger(availableNow=True).start())
    try:
        q.awaitTermination(240)
    finally:
        q.stop()
    return q


def test_a_stream_reads_every_message_once_in_micro_batches(spark, store, tmp_path):
    q = _stream(spark, store, str(tmp_path / "cp"), str(tmp_path / "out"), maxRecordsPerTrigger=700)
    assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= 4  # 2540 messages, 700 a batch
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    keys = [(r.topic, r.queue_id, r.queue_offset) for r in rows]
    assert len(keys) == len(set(keys)) == 2540


KILLED_QUERY = """
import sys, time
from mqstore.spark import session

spark = session("local[1]")
q = (spark.readStream.format("mqstore").option("maxRecordsPerTrigger", 300).load(sys.argv[1])
     .select("topic", "queue_id", "queue_offset", "body").writeStream.format("parquet")
     .option("checkpointLocation", sys.argv[2]).option("path", sys.argv[3]).trigger(processingTime="100 milliseconds")
     .start())
print("STARTED", flush=True)
q.awaitTermination()
"""


def test_a_killed_query_restarted_from_its_checkpoint_delivers_every_message_exactly_once(spark, store, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    checkpoint, out = str(tmp_path / "cp"), str(tmp_path / "out")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_QUERY, store, checkpoint, out], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "STARTED"
        commits = os.path.join(checkpoint, "commits")
        deadline = time.monotonic() + 180
        while not (os.path.isdir(commits) and len([n for n in os.listdir(commits) if n.isdigit()]) >= 2):
            assert time.monotonic() < deadline and proc.poll() is None, "the query committed no micro-batch"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-stream
        proc.wait(60)
    done_before = len(spark.read.parquet(out).collect())
    assert 0 < done_before < 2540
    _stream(spark, store, checkpoint, out, maxRecordsPerTrigger=300)
    rows = spark.read.parquet(out).collect()
    keys = [(r.topic, r.queue_id, r.queue_offset) for r in rows]
    assert len(keys) == len(set(keys)) == 2540


def test_retention_gaps_fail_the_stream_naming_the_range_unless_skipping_is_asked(tmp_path):
    import os

    from mqstore.spark.source import SCHEMA, DataLossError
    from mqstore.spark.stream import MQStoreStreamReader

    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 200) as s:
        for i in range(2000):
            s.put_message(Message("R", b"r%d" % i, queue_id=0)).check()
    reader = MQStoreStreamReader({"path": root}, SCHEMA)
    start = reader.initialOffset()
    assert start == {"R/0": 0}
    first = sorted(os.listdir(os.path.join(root, "commitlog")))[0]
    os.unlink(os.path.join(root, "commitlog", first))  # as retention does
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"R/0": 2000}
    with pytest.raises(DataLossError, match=r"queue R/0: offsets \[0, \d+\) are no longer stored"):
        reader.partitions(start, end)
    skipping = MQStoreStreamReader({"path": root, "failOnDataLoss": "false"}, SCHEMA)
    parts = skipping.partitions(start, end)
    (key, lost_from, lost_to), = skipping.skipped
    assert key == "R/0" and lost_from == 0 and parts[0].start == lost_to > 0 and parts[-1].end == 2000


def test_messages_deleted_after_planning_fail_the_read_or_are_logged(tmp_path, caplog):
    """Retention between planning and reading: the partition fails naming the queue and the
    range, or (failOnDataLoss=false) its remaining messages are read and the loss logged."""
    import os

    from mqstore.spark.source import SCHEMA, DataLossError, MQStoreBatchReader

    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 200) as s:
        for i in range(2000):
            s.put_message(Message("R", b"r%d" % i, queue_id=0)).check()
    reader = MQStoreBatchReader({"path": root}, SCHEMA)
    (part,) = reader.partitions()
    first = sorted(os.listdir(os.path.join(root, "commitlog")))[0]
    os.unlink(os.path.join(root, "commitlog", first))
    with pytest.raises(DataLossError, match=r"queue R/0: \d+ message\(s\) of offsets \[0, 2000\) were deleted"):
        list(reader.read(part))
    lenient = MQStoreBatchReader({"path": root, "failOnDataLoss": "false"}, SCHEMA)
    rows = sum(b.num_rows for b in lenient.read(part))
    assert 0 < rows < 2000 and "skipped (failOnDataLoss=false)" in caplog.text


def test_queue_columns_alone_are_read_from_the_consume_queue_as_the_records_say(tmp_path):
    """A schema of only the columns ConsumeQueue units say (a count, a groupBy on the queue)
    gives what the full schema's read gives for those columns: on a whole store, and after
    retention deleted the head of the CommitLog and of the queue (the queue offsets still each
    message's). It reads no record: with the CommitLog's bytes zeroed it still reads, where the
    full schema's read finds no record."""
    import os

    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from mqstore.spark.source import SCHEMA, MQStoreBatchReader

    narrow = StructType([StructField("topic", StringType()), StructField("queue_id", IntegerType()),
                         StructField("queue_offset", LongType()), StructField("commitlog_offset", LongType()),
                         StructField("store_size", IntegerType())])
    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 200) as s:
        for i in range(2000):
            s.put_message(Message("Q", b"q%d" % i, queue_id=i % 2)).check()

    def rows(schema: StructType) -> list[tuple]:
        reader = MQStoreBatchReader({"path": root, "failOnDataLoss": "false"}, schema)
        got = []
        for part in reader.partitions():
            for batch in reader.read(part):
                d = batch.to_pydict()
                got += list(zip(*(d[name] for name in narrow.names)))
        return sorted(got)

    whole = rows(narrow)
    assert len(whole) == 2000 and whole == rows(SCHEMA)
    assert {(r[0], r[1]) for r in whole} == {("Q", 0), ("Q", 1)}
    assert sorted(r[2] for r in whole if r[1] == 1) == list(range(1000))
    for sub in ("commitlog", os.path.join("consumequeue", "Q", "0"), os.path.join("consumequeue", "Q", "1")):
        first = sorted(os.listdir(os.path.join(root, sub)))[0]
        os.unlink(os.path.join(root, sub, first))  # as retention deletes, from the head
    after = rows(narrow)
    assert 0 < len(after) < 2000 and after == rows(SCHEMA)
    assert set(after) <= set(whole)  # each message keeps its queue offset
    for name in os.listdir(os.path.join(root, "commitlog")):
        path = os.path.join(root, "commitlog", name)
        with open(path, "r+b") as fh:
            fh.write(bytes(os.path.getsize(path)))
    assert rows(narrow) == after
    with pytest.raises(ValueError, match="no record at physical offset"):
        rows(SCHEMA)


@pytest.fixture(scope="module")
def store_of_two_logs(tmp_path_factory):
    """The same messages in a store with two CommitLogs (docs/parallel-commitlogs.md)."""
    root = str(tmp_path_factory.mktemp("spark2") / "store")
    with MessageStore(root, commit_log_count=2, **CFG) as s:
        for m in _messages(2500):
            s.put_message(m).check()
        s.put_messages([Message("Pay", b"batch%d" % i, queue_id=1) for i in range(40)]).check()
        assert all(hi > lo for _, lo, hi in s.logs())
    return root


def test_a_store_with_two_logs_reads_by_queue_by_log_and_by_key(spark, store_of_two_logs):
    """Every read mode over a store with two CommitLogs gives every message as the store reads
    it: by queue (each queue in its own log), the whole of both logs (mode=commitlog, a
    partition per file of each log, each log's records in order), and a keys / msg_id filter
    pushed down to both logs' indexes."""
    root = store_of_two_logs
    expected = _store_rows(root)
    assert {row["commitlog_offset"] >> 56 for row in expected.values()} == {0, 1}
    assert _spark_rows(spark.read.format("mqstore").load(root)) == expected
    whole = spark.read.format("mqstore").option("mode", "commitlog").load(root)
    assert _spark_rows(whole) == expected
    offsets = [r.commitlog_offset for r in whole.select("commitlog_offset").collect()]
    assert offsets == sorted(offsets) and whole.rdd.getNumPartitions() == 2  # a file in each log
    for value in ("k7 alt7", "k2499 alt2499"):  # pushed down: looked up in both logs' indexes
        want = [k for k, row in expected.items() if row["keys"] == value]
        got = spark.read.format("mqstore").load(root).where(f"keys = '{value}'")
        assert len(want) == 1 and sorted((r.topic, r.queue_id, r.queue_offset) for r in got.collect()) == want
    row = next(v for v in expected.values() if v["commitlog_offset"] >> 56 == 1)
    got = spark.read.format("mqstore").load(root).where(f"msg_id = '{row['msg_id']}'").collect()
    assert [(r.topic, r.queue_id, r.queue_offset) for r in got] == [(row["topic"], row["queue_id"],
                                                                     row["queue_offset"])]


def test_commitlog_id_is_an_optional_column_each_commitlog_partition_one_file_of_one_log(spark, two_logs_small_files):
    """commitlog_id (commitlog_offset's top byte) is a column a schema may name; the default
    schema does not have it. In mode=commitlog each Spark partition reads one file of one log:
    a partition per file of both logs, every row of a partition of one log and one file."""
    from pyspark.sql import functions as F

    from mqstore.queue.files import open_commitlog

    root = two_logs_small_files
    assert "commitlog_id" not in spark.read.format("mqstore").load(root).columns
    files = []
    for k in (0, 1):
        queue = open_commitlog(root, log=k)
        try:
            files += [(k, mf.file_from, queue.file_size) for mf in queue.files]
        finally:
            queue.close()
    assert {k for k, _, _ in files} == {0, 1} and len(files) > 4
    df = (spark.read.format("mqstore").option("mode", "commitlog")
          .schema("commitlog_id int, commitlog_offset bigint, topic string").load(root))
    assert df.rdd.getNumPartitions() == len(files)
    rows = df.select(F.spark_partition_id().alias("p"), "commitlog_id", "commitlog_offset").collect()
    assert len(rows) == 2400 and all(r.commitlog_id == r.commitlog_offset >> 56 for r in rows)
    by_partition: dict[int, set[tuple[int, int]]] = {}
    for r in rows:
        file_from = next(f for k, f, size in files if f <= r.commitlog_offset < f + size)
        by_partition.setdefault(r.p, set()).add((r.commitlog_id, file_from))
    assert all(len(v) == 1 for v in by_partition.values())  # one file of one log each
    assert sorted(v.pop() for v in by_partition.values()) == sorted((k, f) for k, f, _ in files)
    ones = sum(r.commitlog_id == 1 for r in rows)  # a filter on it (pushed down: one log's files / queues)
    assert 0 < ones < len(rows) and df.where("commitlog_id = 1").count() == ones
    by_queue = spark.read.format("mqstore").schema("commitlog_id int, topic string").load(root)
    assert by_queue.where("commitlog_id = 1").count() == ones


def test_commitlog_id_in_queue_mode_a_one_log_store_and_a_write(store, store_of_two_logs):
    """In queue mode (from the ConsumeQueue units alone, or with the records) commitlog_id is
    the log each queue is bound to; a store with one CommitLog gives 0; another type is named;
    a write ignores the column, as it ignores the other read columns."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

    from mqstore.queue.snapshot import StoreSnapshot
    from mqstore.spark import COMMITLOG_ID
    from mqstore.spark.rows import write_columns

    def rows(root: str, schema: StructType, **options: str) -> list[dict]:
        reader = MQStoreBatchReader({"path": root, **options}, schema)
        return [r for part in reader.partitions() for batch in reader.read(part) for r in batch.to_pylist()]

    queue_only = StructType([StructField("topic", StringType()), StructField("queue_id", IntegerType()),
                             COMMITLOG_ID])
    with_records = StructType([COMMITLOG_ID, StructField("topic", StringType()), StructField("queue_id", IntegerType()),
                               StructField("body", BinaryType())])
    with StoreSnapshot(store_of_two_logs) as snap:
        for schema in (queue_only, with_records):
            got = rows(store_of_two_logs, schema)
            assert len(got) == 2540
            assert all(r["commitlog_id"] == snap.log_of(r["topic"], r["queue_id"]) for r in got)
            assert {r["commitlog_id"] for r in got} == {0, 1}
    assert {r["commitlog_id"] for r in rows(store, StructType([COMMITLOG_ID]), mode="commitlog")} == {0}
    assert {r["commitlog_id"] for r in rows(store, queue_only)} == {0}
    with pytest.raises(OptionError, match="'commitlog_id' is int, not bigint"):
        MQStoreBatchReader({"path": store}, StructType([StructField("commitlog_id", LongType())]))
    assert write_columns(StructType([StructField("topic", StringType()), StructField("body", StringType()),
                                     COMMITLOG_ID])) == ["topic", "body"]


def test_a_commitlog_id_filter_plans_only_that_logs_queues_or_files(store_of_two_logs):
    """commitlog_id = / IN pushed down: queue mode plans only the queues bound to those logs,
    mode=commitlog only those logs' files; Spark still checks the rows (the filter is kept)."""
    from pyspark.sql.datasource import EqualTo, In

    from mqstore.layout import log_of
    from mqstore.queue.snapshot import StoreSnapshot
    from mqstore.spark.source import LogSlice, MQStorePushdownReader

    root = store_of_two_logs
    with StoreSnapshot(root) as snap:
        bound = {(q.topic, q.queue_id): snap.log_of(q.topic, q.queue_id) for q in snap.queues()}
    assert set(bound.values()) == {0, 1}

    def planned(filters: list, **options: str) -> list:
        reader = MQStorePushdownReader({"path": root, **options}, SCHEMA)
        assert list(reader.pushFilters(filters)) == filters
        return reader.partitions()

    def queues_of(parts: list) -> set:
        return {(s.topic, s.queue_id) for p in parts for s in getattr(p, "parts", (p,))}

    one = EqualTo(("commitlog_id",), 1)
    assert queues_of(planned([one])) == {key for key, k in bound.items() if k == 1}
    assert queues_of(planned([In(("commitlog_id",), (0, 1))])) == set(bound)
    assert planned([one, EqualTo(("commitlog_id",), 0)]) == []
    files = planned([one], mode="commitlog")
    assert files and all(isinstance(p, LogSlice) and log_of(p.start) == 1 for p in files)
    assert len(planned([], mode="commitlog")) == len(files) + 1  # one file in each log


REBUILD_CFG = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 200,
               "max_hash_slot_num": 128, "max_index_num": 512}


@pytest.fixture(scope="module")
def two_logs_small_files(tmp_path_factory):
    """A store with two CommitLogs of several files each, delay messages (the tags code is the
    delivery time) and keys enough for each log's index to roll over."""
    root = str(tmp_path_factory.mktemp("rebuild2") / "store")
    with MessageStore(root, commit_log_count=2, **REBUILD_CFG) as s:
        for i in range(2400):
            props = {"DELAY": "2"} if i % 97 == 0 else None
            s.put_message(Message(f"T{i % 3}", b"x" * (i % 90), queue_id=i % 4, tags=f"t{i % 5}" if i % 7 else None,
                                  keys=f"k{i} j{i}" if i % 2 else None, properties=props)).check()
        assert all(hi > lo for _, lo, hi in s.logs())
    return root


def _same_files(a: str, b: str, *, by_order: bool = False) -> None:
    """Every file under a and b has the same bytes: by relative name, or (IndexFiles, named by
    their creation times) in name order."""
    import filecmp
    import os

    names_a = sorted(os.path.relpath(os.path.join(d, f), a) for d, _, fs in os.walk(a) for f in fs)
    names_b = sorted(os.path.relpath(os.path.join(d, f), b) for d, _, fs in os.walk(b) for f in fs)
    assert len(names_a) == len(names_b) > 0
    if not by_order:
        assert names_a == names_b
    for x, y in zip(names_a, names_b):
        assert filecmp.cmp(os.path.join(a, x), os.path.join(b, y), shallow=False), (a, x, y)


def test_a_rebuild_of_a_store_with_two_logs_gives_each_logs_queues_and_index_byte_for_byte(
        spark, two_logs_small_files, tmp_path):
    """The Spark rebuild (mqstore.spark.jobs) of a store with two CommitLogs: a task per file of
    each log, every queue's units and each log's index (index/, index-1/) byte for byte what
    the store's own dispatch wrote; in place too, after which the store reads by key in both
    logs without redispatching."""
    import os
    import shutil

    from mqstore.queue.files import open_commitlog
    from mqstore.spark.jobs import rebuild_queues
    from mqstore.tools.checker import check_store

    root = two_logs_small_files
    files = 0
    for k in (0, 1):
        queue = open_commitlog(root, log=k)
        try:
            files += len(queue.files)
        finally:
            queue.close()
    out = str(tmp_path / "out")
    report = rebuild_queues(spark, root, out=out)
    assert (report.units, report.queues, report.logs, report.commitlog_files) == (2400, 12 + 1, 2, files)
    assert report.index_keys == 2 * 1200 and files > 2
    assert sorted(os.listdir(out)) == ["consumequeue", "index", "index-1"]
    _same_files(os.path.join(root, "consumequeue"), os.path.join(out, "consumequeue"))
    for sub in ("index", "index-1"):
        assert len(os.listdir(os.path.join(root, sub))) > 1  # each log's index rolled over
        _same_files(os.path.join(root, sub), os.path.join(out, sub), by_order=True)

    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    for sub in ("consumequeue", "index", "index-1"):
        shutil.rmtree(os.path.join(copy, sub))
    assert rebuild_queues(spark, copy).logs == 2
    assert not os.path.exists(os.path.join(copy, ".rebuild"))
    _same_files(os.path.join(root, "consumequeue"), os.path.join(copy, "consumequeue"))
    for sub in ("index", "index-1"):
        _same_files(os.path.join(root, sub), os.path.join(copy, sub), by_order=True)
    check_store(copy).raise_if_failed()
    with MessageStore(copy) as s:
        assert [r.redispatched_records for r in s.recoveries] == [0, 0]
        logs_found = set()
        for i in (7, 9, 11, 13):  # keys of queues in both logs
            found = s.query_message(f"T{i % 3}", f"k{i}", 10, 0, 2**62).messages
            assert len(found) == 1
            logs_found.add(found[0].physical_offset >> 56)
        assert logs_found == {0, 1}
