"""Writing DataFrames into a store (issue 5): the batch writer (into a store this process owns,
and into one a node serves while a producer writes), the refusals, queue selection, and the
streaming writer's exactly-once commits (a replayed micro-batch, and an append SIGKILLed half
way)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from mqstore import Message, MessageStore
from mqstore.tools.checker import check_store
from mqstore.spark.source import OptionError
from mqstore.spark.write import (
    SINK_PROPERTY,
    MQStoreStreamWriter,
    QueueChooser,
    SinkLog,
    WriteError,
    batch_messages,
    chunks,
    write_columns,
)

pytestmark = pytest.mark.spark

CFG = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 200}


def _read_all(store: MessageStore) -> list[dict]:
    """Every message of the store, as dicts, through the store's own reads."""
    out = []
    store.wait_dispatched()
    for t, q in sorted((cq.topic, cq.queue_id) for cq in store.consume_queues):
        offset = 0
        while True:
            got = store.get_message("g", t, q, offset, 256)
            if got.status.name != "FOUND":
                break
            for m in got:
                rec = m.decode()
                out.append({"topic": rec.topic, "queue_id": rec.queue_id, "queue_offset": m.queue_offset,
                            "body": rec.body, "properties": rec.properties})
            offset = got.next_begin_offset
    return out


def _user_props(props: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items() if k not in ("TAGS", "KEYS", "WAIT", SINK_PROPERTY)}


# -- without Spark ------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, message", [
    ([("body", BinaryType())], "needs a 'topic' column"),
    ([("topic", StringType())], "needs a 'body' column"),
    ([("topic", StringType()), ("body", IntegerType())], "column 'body' is int"),
    ([("topic", StringType()), ("body", BinaryType()), ("tag", StringType())], "'tag' is not an mqstore column"),
])
def test_write_columns_names_what_is_wrong(fields, message):
    with pytest.raises(OptionError, match=message):
        write_columns(StructType([StructField(n, t) for n, t in fields]))


def test_columns_of_the_read_schema_are_accepted_and_only_the_message_fields_used():
    from mqstore.spark import SCHEMA

    assert write_columns(SCHEMA) == ["topic", "queue_id", "tags", "keys", "properties", "body"]


def test_queue_choice_hashes_keys_as_java_and_goes_round_robin_per_topic_without_them():
    chooser = QueueChooser(4, start=1)
    assert chooser.choose("T", "hello") == 99162322 % 4  # "hello".hashCode() in Java
    # negative hashes: Java's % keeps the sign, then abs (values checked with a JVM)
    assert chooser.choose("T", "order-2xorder-2xorder-2x") == 1  # hashCode() -1810818769
    assert chooser.choose("T", "polygenelubricants") == 0  # hashCode() Integer.MIN_VALUE
    assert [chooser.choose("T", None) for _ in range(5)] == [1, 2, 3, 0, 1]
    assert [chooser.choose("U", "") for _ in range(2)] == [1, 2]


def test_rows_become_messages_grouped_by_queue_and_bad_rows_are_named():
    batch = pa.record_batch({"topic": ["A", "A", "B"], "body": [b"1", b"2", b"3"], "queue_id": [3, None, 3],
                             "tags": ["t", None, None], "keys": [None, "hello", None],
                             "properties": pa.array([[("p", "v")], None, []], pa.map_(pa.string(), pa.string()))})
    groups = batch_messages(batch, QueueChooser(4), {SINK_PROPERTY: "s:1"})
    assert list(groups) == [("A", 3), ("A", 2), ("B", 3)]
    first = groups[("A", 3)][0]
    assert (first.body, first.tags, first.properties["p"], first.properties[SINK_PROPERTY]) == (b"1", "t", "v", "s:1")
    assert groups[("A", 2)][0].keys == ["hello"]
    with pytest.raises(WriteError, match="row 11 .topic A.: body is null"):
        batch_messages(pa.record_batch({"topic": ["A", "A"], "body": [b"x", None]}), QueueChooser(4), row_base=10)
    with pytest.raises(WriteError, match="row 0: topic is null"):
        batch_messages(pa.record_batch({"topic": pa.array([None], pa.string()), "body": [b"x"]}), QueueChooser(4))
    with pytest.raises(WriteError, match="row 0 .topic A.: property value of 'p' is null"):
        batch_messages(pa.record_batch({"topic": ["A"], "body": [b"x"], "properties": pa.array(
            [[("p", None)]], pa.map_(pa.string(), pa.string()))}), QueueChooser(4))
    with pytest.raises(WriteError, match="queue_id -1 is negative"):
        batch_messages(pa.record_batch({"topic": ["A"], "body": [b"x"], "queue_id": [-1]}), QueueChooser(4))


def test_chunks_cut_by_count_and_bytes_and_keep_order():
    msgs = [Message("T", b"x" * 600_000) for _ in range(5)] + [Message("T", b"y") for _ in range(3000)]
    cut = list(chunks(msgs))
    assert [m for c in cut for m in c] == msgs
    assert [len(c) for c in cut[:3]] == [1, 1, 1] and all(len(c) <= 1024 for c in cut)


# -- batch writes through Spark -----------------------------------------------------------------
def test_a_batch_write_puts_every_row_as_a_message(spark, tmp_path):
    root = str(tmp_path / "w")
    rows = [(f"T{i % 2}", f"body-{i}", None if i % 3 else i % 5, f"tag{i % 2}" if i % 4 else None,
             f"key{i}" if i % 2 else None, {"n": str(i)} if i % 5 == 0 else None) for i in range(3000)]
    df = spark.createDataFrame(rows, "topic string, body string, queue_id int, tags string, keys string, "
                                     "properties map<string,string>").repartition(3)
    with MessageStore(root, **CFG) as store:
        df.write.format("mqstore").mode("append").save(root)
        got = _read_all(store)
    assert len(got) == 3000
    by_body = {m["body"]: m for m in got}
    for topic, body, qid, tags, keys, props in rows:
        m = by_body[body.encode()]
        assert m["topic"] == topic
        assert m["properties"].get("TAGS") == tags and m["properties"].get("KEYS") == keys
        assert _user_props(m["properties"]) == (props or {})
        if qid is not None:
            assert m["queue_id"] == qid
        elif keys is not None:
            assert m["queue_id"] == QueueChooser(4).choose(topic, keys)
        else:
            assert 0 <= m["queue_id"] < 4


def test_a_batch_write_into_a_store_a_node_serves_while_a_producer_writes(spark, tmp_path):
    root = str(tmp_path / "node")
    df = spark.range(4000).selectExpr("'Spark' as topic", "cast(id as string) as body", "cast(id % 2 as int) as queue_id")
    with MessageStore(root, service_mode="processes", **CFG) as node:
        stop = threading.Event()
        produced = []

        def produce():
            i = 0
            while not stop.is_set():
                node.put_message(Message("Spark", b"p%d" % i, queue_id=i % 2)).check()
                produced.append(i)
                i += 1

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            df.write.format("mqstore").mode("append").save(root)
        finally:
            stop.set()
            producer.join()
    with MessageStore(root, **CFG) as store:
        got = _read_all(store)
        config = store.config
    check_store(root, config=config).raise_if_failed()
    bodies = sorted(m["body"] for m in got)
    assert bodies == sorted([str(i).encode() for i in range(4000)] + [b"p%d" % i for i in produced])
    for q in (0, 1):
        offsets = [m["queue_offset"] for m in got if m["queue_id"] == q]
        assert offsets == list(range(len(offsets)))


def test_writes_are_refused_with_the_cause_named(spark, tmp_path):
    root = str(tmp_path / "r")
    df = spark.createDataFrame([("T", b"x")], "topic string, body binary")
    with MessageStore(root, **CFG):
        with pytest.raises(Exception, match="append-only"):
            df.write.format("mqstore").mode("overwrite").save(root)
        bad = spark.createDataFrame([("T", None)], "topic string, body binary")
        with pytest.raises(Exception, match="body is null"):
            bad.write.format("mqstore").mode("append").save(root)
    with pytest.raises(Exception, match="no store is running on it"):
        df.write.format("mqstore").mode("append").save(root)
    with MessageStore(root, **CFG) as store:
        assert _read_all(store) == []


# -- streaming writes ---------------------------------------------------------------------------
def _stream_copy(spark, source: str, target: str, checkpoint: str) -> None:
    q = (spark.readStream.format("mqstore").option("maxRecordsPerTrigger", 700).load(source)
         .selectExpr("topic", "concat_ws('/', topic, queue_id, queue_offset) as body")
         .writeStream.format("mqstore").option("sinkId", "copy").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start(target))
    try:
        q.awaitTermination(300)
    finally:
        q.stop()


def test_a_replayed_micro_batch_is_not_written_twice(spark, tmp_path):
    source, target, checkpoint = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "cp")
    with MessageStore(source, **CFG) as s:
        for i in range(2000):
            s.put_message(Message("S", b"%d" % i, queue_id=i % 3)).check()
    with MessageStore(target, **CFG) as store:
        _stream_copy(spark, source, target, checkpoint)
        commits = sorted(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
        assert len(commits) == 3  # 700 + 700 + 600
        # the query "crashed" after appending its last micro-batch, before Spark recorded the commit
        for name in (str(commits[-1]), f".{commits[-1]}.crc"):
            os.unlink(os.path.join(checkpoint, "commits", name))
        _stream_copy(spark, source, target, checkpoint)
        got = _read_all(store)
    bodies = [m["body"] for m in got]
    assert len(bodies) == len(set(bodies)) == 2000
    assert {m["properties"][SINK_PROPERTY] for m in got} == {f"copy:{b}" for b in commits}
    assert SinkLog(target, "copy").state() == {"last_batch": commits[-1], "pending": None}
    assert not os.path.exists(SinkLog(target, "copy").staging)


APPLY_AND_DIE = """
import os, signal, sys
from mqstore.spark.write import SinkLog

root, files, after = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])

def die(put):
    if put >= after:
        os.kill(os.getpid(), signal.SIGKILL)

SinkLog(root, "sink").apply(7, files, on_chunk=die)
"""


def test_an_append_killed_half_way_is_completed_once_when_the_batch_is_replayed(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        writer = MQStoreStreamWriter({"path": root, "sinkId": "sink"},
                                     StructType([StructField("topic", StringType()), StructField("body", BinaryType())]),
                                     False)
        rows = [b"m%d" % i for i in range(5000)]
        batches = [pa.record_batch({"topic": ["K"] * 1000, "body": rows[at:at + 1000]}) for at in range(0, 5000, 1000)]
        staged = [writer.write(iter(batches[:3])).path, writer.write(iter(batches[3:])).path]
        assert all(staged)
        # a driver committing micro-batch 7 is SIGKILLed between two puts, past 2,048 of its 5,000 messages
        proc = subprocess.run([sys.executable, "-c", APPLY_AND_DIE, root, ",".join(staged), "2048"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        done_before = len(_read_all(store))
        assert 2048 <= done_before < 5000
        sink = SinkLog(root, "sink")
        assert sink.state()["pending"]["batch"] == 7
        # Spark replays the batch: its tasks stage the same rows again, the commit completes it
        again = [writer.write(iter(batches[:3])).path, writer.write(iter(batches[3:])).path]
        assert sink.apply(7, again) == 5000 - done_before
        assert sink.apply(7, []) == 0 and sink.apply(6, []) == 0  # applied before: skipped
        got = _read_all(store)
    assert sorted(m["body"] for m in got) == sorted(rows)
    assert sink.state() == {"last_batch": 7, "pending": None}


def test_a_stream_write_needs_a_sink_id(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG):
        schema = StructType([StructField("topic", StringType()), StructField("body", BinaryType())])
        with pytest.raises(OptionError, match="needs option sinkId"):
            MQStoreStreamWriter({"path": root}, schema, False)
        with pytest.raises(OptionError, match="sinkId='a/b'"):
            MQStoreStreamWriter({"path": root, "sinkId": "a/b"}, schema, False)
