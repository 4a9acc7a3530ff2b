"""Writing DataFrames into a store (issue 5): the batch writer (into a store this process owns,
and into one a node serves while a producer writes), the refusals, queue selection, and the
streaming writer's exactly-once commits (a replayed micro-batch, and an append SIGKILLed half
way). Issue 26: a batch write's rows are checked before anything is put (a bad row fails its
task naming the Spark partition, row, topic and keys, and nothing of that task is stored), and
a task attempt killed while putting is completed, not repeated, by its retry or by the abort
(tests/test_spark_write_retry.py lets Spark itself retry a killed task)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from mqstore import Message, MessageStore
from mqstore.log._codec import decode_batch_body
from mqstore.tools.checker import check_store
from mqstore.spark.options import OptionError
from mqstore.spark.rows import (
    SINK_PROPERTY,
    TASK_PROPERTY,
    QueueChooser,
    RowLimits,
    RowStager,
    WriteError,
    check_rows,
    chunks,
    encode_rows,
    put_staged,
    stage_rows,
    staged_batch,
    write_columns,
)
from mqstore.spark.sink import MQStoreStreamWriter, SinkLog
from mqstore.spark.write import MQStoreBatchWriter, write_dir

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
    return {k: v for k, v in props.items() if k not in ("TAGS", "KEYS", "WAIT", SINK_PROPERTY, TASK_PROPERTY)}


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


MAP = pa.map_(pa.string(), pa.string())
MARK = {TASK_PROPERTY: "0123456789abcdef:3"}


def test_rows_become_batch_items_grouped_by_queue():
    batch = pa.record_batch({"topic": ["A", "A", "B"], "body": [b"1", b"2", b"3"], "queue_id": [3, None, 3],
                             "tags": ["t", None, None], "keys": [None, "hello", None],
                             "properties": pa.array([[("p", "v")], None, []], MAP)})
    groups = encode_rows(batch, QueueChooser(4), check_rows(batch, RowLimits(), MARK, 0))
    assert list(groups) == [("A", 3), ("A", QueueChooser(4).choose("A", "hello")), ("B", 3)]
    assert [decode_batch_body(items[0]) for items, _ in groups.values()] == [
        [(0, b"1", "TAGS\x01t\x02p\x01v")], [(0, b"2", "KEYS\x01hello")], [(0, b"3", "")]]


_BAD = [  # (columns of rows 10 and 11 of Spark partition 3; row 11 is bad), the cause named
    ({"topic": ["A", "Bad topic"], "body": [b"x", b"y"], "keys": ["k1", "k2 k3"]},
     r"\(topic 'Bad topic', keys 'k2 k3'\): topic 'Bad topic' has the character ' ' at index 3.*MESSAGE_ILLEGAL"),
    ({"topic": ["A", None], "body": [b"x", b"y"]}, r"\(no topic, no keys\): topic is null"),
    ({"topic": ["A", "A"], "body": [b"x", None], "keys": [None, "k"]}, r"\(topic 'A', keys 'k'\): body is null"),
    ({"topic": ["A", "A"], "body": [b"x", b"y"], "properties": pa.array([None, [("p", "a\x01b")]], MAP)},
     r"property 'p' has a value containing a separator character .*MESSAGE_ILLEGAL"),
    ({"topic": ["A", "A"], "body": [b"x", b"y"], "properties": pa.array([None, [("p\x02", "v")]], MAP)},
     r"property name 'p\\x02' contains a separator character"),
    ({"topic": ["A", "A"], "body": [b"x", b"y"], "properties": pa.array([None, [("p", None)]], MAP)},
     r"property value of 'p' is null"),
    ({"topic": ["A", "A"], "body": [b"x", b"y"], "tags": [None, ""]}, r"property 'TAGS' has an empty value"),
    ({"topic": ["A", "A"], "body": [b"x", b"y"], "queue_id": [0, -1]}, r"queue_id -1 is negative"),
    ({"topic": ["A", "A"], "body": [b"x", b"y" * 5000]},
     r"body is 5000 bytes: with its properties more than the store's max_message_size=4096 .*MESSAGE_ILLEGAL"),
    ({"topic": ["A", "A"], "body": [b"x", b"y"], "properties": pa.array([None, [("p", "v" * 32_740)]], MAP)},
     r"are 32780 UTF-8 bytes, more than 32767 \(a put would answer PROPERTIES_SIZE_EXCEEDED\)"),
]


@pytest.mark.parametrize("columns, cause", _BAD)
def test_a_bad_row_is_named_by_partition_row_topic_keys_and_cause(columns, cause):
    limits = RowLimits(max_message_size=4096, file_size=1 << 20)
    with pytest.raises(WriteError, match=r"^Spark partition 3, row 11 of the partition .*" + cause):
        check_rows(pa.record_batch(columns), limits, MARK, 3, row_base=10)


def test_the_row_check_accepts_exactly_what_the_put_path_stores_near_its_limits(tmp_path):
    """Bodies around max_message_size and properties around 32767 bytes: check_rows passes a
    row iff its staged put stores it, names the status the put answers otherwise, and gives a
    weight never below the record's bytes (so chunks cut by weight always fit)."""
    limit = 48 << 10
    with MessageStore(str(tmp_path / "s"), max_message_size=limit, mapped_file_size_commit_log=256 << 10) as store:
        limits = RowLimits.of(store.config)
        cases = [(b"b" * n, None) for n in range(limit - 80, limit - 10)]
        cases += [(b"b", {"p": "v" * n}) for n in range(32_700, 32_780, 3)]
        outcomes = set()
        for body, props in cases:
            batch = pa.record_batch({"topic": ["Edge"], "body": [body], "tags": ["TagA"], "keys": ["k1 k2"],
                                     "properties": pa.array([list(props.items()) if props else None], MAP)})
            try:
                weights, said = check_rows(batch, limits, MARK, 0), "PUT_OK"
            except WriteError as exc:
                weights, said = None, str(exc).rsplit("a put would answer ", 1)[1].split(")")[0]
            staged = staged_batch(encode_rows(batch, QueueChooser(4), weights or [0]), limits.chunk_bytes)
            before = store.max_phy_offset
            try:
                put_staged(store, staged, MARK)
                status = "PUT_OK"
            except WriteError as exc:
                status = str(exc).split(": ")[1].split(" ")[0]
            assert status == said, (len(body), props and len(props["p"]))
            if weights is not None:  # the record's bytes (a record that did not fit went to the next file)
                after = store.max_phy_offset
                assert weights[0] >= after - max(before, after - after % limits.file_size)
            outcomes.add((props is None, status))
    assert outcomes == {(True, "PUT_OK"), (True, "MESSAGE_ILLEGAL"), (False, "PUT_OK"),
                        (False, "PROPERTIES_SIZE_EXCEEDED"), (False, "MESSAGE_ILLEGAL")}


def test_staging_that_would_fill_the_disk_fails_the_task_and_leaves_nothing(tmp_path):
    batch = pa.record_batch({"topic": ["T"], "body": [b"x"]})
    path = str(tmp_path / "staged.arrow")
    assert stage_rows([batch], path, RowStager(["topic", "body"], RowLimits(), MARK, 0, 4)) == 1
    os.unlink(path)
    with pytest.raises(WriteError, match="would fill its disk past 0% .disk_space_warning_level_ratio"):
        stage_rows([batch], path, RowStager(["topic", "body"], RowLimits(disk_ratio=0.0), MARK, 0, 4))
    assert os.listdir(tmp_path) == []


def test_chunks_cut_by_count_and_bytes_and_keep_order():
    msgs = [b"x" * 600_000 for _ in range(5)] + [b"y" for _ in range(3000)]
    sizes = [600_100] * 5 + [100] * 3000
    cut = list(chunks(msgs, sizes, 1 << 20))
    assert [m for c in cut for m in c] == msgs
    assert [len(c) for c in cut[:3]] == [1, 1, 1] and all(len(c) <= 1024 for c in cut)
    assert [len(c) for c in chunks(msgs[5:], sizes[5:], 250)] == [2] * 1500


# -- a task attempt killed while putting (no Spark: the task's write() in a process of its own) --
SCHEMA2 = StructType([StructField("topic", StringType()), StructField("body", BinaryType())])

ATTEMPT = """
import os, pickle, signal, sys
import pyarrow as pa
import mqstore.spark.write as w

writer_file, part, attempt, rows, die_after = sys.argv[1], *map(int, sys.argv[2:])
writer = pickle.load(open(writer_file, "rb"))
w._task = lambda: (part, attempt)

def die(partition, attempt, put):
    if put >= die_after:
        os.kill(os.getpid(), signal.SIGKILL)

writer.on_put = die
bodies = [b"p%d-%d" % (part, i) for i in range(rows)]
writer.write(iter(pa.record_batch({"topic": ["K"] * 1000, "body": bodies[at:at + 1000]}) for at in range(0, rows, 1000)))
"""


def _attempt(writer_file: str, part: int, attempt: int, rows: int, die_after: int = 10**9) -> int:
    """Run attempt `attempt` of task `part` (rows bodies p<part>-<i>) in a process of its own,
    SIGKILLed once it has put die_after messages; its exit status."""
    proc = subprocess.run([sys.executable, "-c", ATTEMPT, writer_file, str(part), str(attempt), str(rows),
                           str(die_after)], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, -signal.SIGKILL) or "WriteError" in proc.stderr, proc.stderr
    return proc.returncode


def _pickled_writer(root: str, tmp_path) -> tuple[MQStoreBatchWriter, str]:
    """A batch writer into root as the driver makes it, and the file it is pickled into."""
    writer = MQStoreBatchWriter({"path": root}, SCHEMA2, False)
    path = str(tmp_path / "writer.pickle")
    with open(path, "wb") as f:
        pickle.dump(writer, f)
    return writer, path


def _by_task(got: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in got:
        counts[m["properties"][TASK_PROPERTY]] = counts.get(m["properties"][TASK_PROPERTY], 0) + 1
    return counts


def test_a_retried_task_puts_only_what_its_killed_attempt_did_not_and_the_same_rows(tmp_path, monkeypatch):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        writer, pickled = _pickled_writer(root, tmp_path)
        # attempt 0 of partition 2 is SIGKILLed between two puts, past 2,048 of its 5,000 rows
        assert _attempt(pickled, 2, 0, 5000, 2048) == -signal.SIGKILL
        assert 2048 <= len(_read_all(store)) < 5000
        # attempt 1 recomputes the partition differently (a non-deterministic source): the
        # staged rows of attempt 0 are what is put, the rest of them exactly once (_task is
        # mqstore.spark.rows's; patched where the batch writer looks it up)
        monkeypatch.setattr("mqstore.spark.write._task", lambda: (2, 1))
        other = pa.record_batch({"topic": ["K"] * 10, "body": [b"other-%d" % i for i in range(10)]})
        assert writer.write(iter([other])).messages == 5000
        assert writer.write(iter([other])).messages == 5000  # a third attempt: done already
        writer.commit([None])
        got = _read_all(store)
    assert sorted(m["body"] for m in got) == sorted(b"p2-%d" % i for i in range(5000))
    # round-robin from queue 2 (the partition): each queue in row order
    assert [m["body"] for m in got] == [b"p2-%d" % i for q in range(4) for i in range(5000) if (2 + i) % 4 == q]
    assert _by_task(got) == {f"{writer.write_id}:2": 5000}
    assert not os.path.exists(write_dir(root, writer.write_id))


def test_an_aborted_write_completes_the_task_a_killed_attempt_left_and_then_puts_nothing(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **CFG) as store:
        writer, pickled = _pickled_writer(root, tmp_path)
        assert _attempt(pickled, 0, 0, 3000) == 0  # a whole task
        assert _attempt(pickled, 1, 0, 4000, 1024) == -signal.SIGKILL  # killed half way, never retried
        # the job fails (another task had a bad row): abort completes partition 1 from its staged rows
        writer.abort([None, None, None])
        got = _read_all(store)
        assert _by_task(got) == {f"{writer.write_id}:0": 3000, f"{writer.write_id}:1": 4000}
        # a late attempt of a task of the ended job puts nothing
        assert _attempt(pickled, 2, 0, 500) == 1
        assert len(_read_all(store)) == 7000
    assert sorted(m["body"] for m in got) == sorted([b"p0-%d" % i for i in range(3000)]
                                                    + [b"p1-%d" % i for i in range(4000)])
    assert not os.path.exists(write_dir(root, writer.write_id))


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
    assert os.listdir(os.path.join(root, "config", "spark_writes")) == []  # the job's staging is gone
    assert sorted(_by_task(got).values()) == [1000, 1000, 1000] and len({m.split(":")[0] for m in _by_task(got)}) == 1
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


_BAD_ROWS = {  # row 399 of partition 1, its column values, the cause named
    "invalid topic": ({"topic": "Bad/topic"}, r"topic 'Bad/topic' has the character '/' at index 3"),
    "null body": ({"body": None}, r"body is null"),
    "\\x01 in a property": ({"properties": {"p": "a\x01b"}}, r"property 'p' has a value containing a separator"),
    "too big a body": ({"body": b"b" * 70_000}, r"body is 70000 bytes: with its properties more than the store's "
                                                 r"max_message_size=65536"),
}


@pytest.mark.parametrize("bad", list(_BAD_ROWS))
def test_a_bad_row_fails_its_task_and_nothing_of_that_task_is_stored(spark, tmp_path, bad):
    root = str(tmp_path / "b")
    change, cause = _BAD_ROWS[bad]
    rows = [{"topic": "Rows", "body": b"%d-%d" % (p, i), "keys": f"key-{p}-{i}", "properties": {"n": str(i)}}
            for p in range(2) for i in range(600)]
    rows[600 + 399].update(change)
    df = spark.createDataFrame(spark.sparkContext.parallelize([tuple(r.values()) for r in rows], 2),
                               "topic string, body binary, keys string, properties map<string,string>")
    with MessageStore(root, max_message_size=65536, **CFG) as store:
        with pytest.raises(Exception, match=r"WriteError: Spark partition 1, row 399 of the partition \(topic "
                                            r"'[^']+', keys 'key-1-399'\): " + cause):
            df.write.format("mqstore").mode("append").save(root)
        got = _read_all(store)
    # partition 0 was whole or not begun when the job failed: all its rows or none; none of partition 1
    assert sorted(m["body"] for m in got) in ([], sorted(b"0-%d" % i for i in range(600)))
    assert os.listdir(os.path.join(root, "config", "spark_writes")) == []


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
from mqstore.spark.sink import SinkLog

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
