"""Spark reading mqstore (issue 5): a store of 1M messages with 100 B bodies (2 topics x 4
queues, a tag and a key each) read by ``spark.read.format("mqstore")`` into ``count()``, into an
aggregate over every body, and into a Parquet write; compared in the same run with Spark
reading the same messages from a Parquet file (written once from the store, untimed).

Run: ``python -m pytest bench/test_spark.py --benchmark-columns=median,rounds -q``
(local[2] session, ~1.5 min). messages/s = 1M / median round time.
"""

from __future__ import annotations

import os
import shutil

import pytest

from bench._common import record_rate

pytest.importorskip("pyspark")

MESSAGES = 1_000_000
ROUNDS = 3
GROUP = "spark: 1M x 100 B messages per round, local[2]"


@pytest.fixture(scope="module")
def data(tmp_path_factory, spark):
    """(store dir, Parquet dir) holding the same 1M messages."""
    from mqstore import Message, MessageStore

    base = tmp_path_factory.mktemp("spark-bench")
    root = str(base / "store")
    body = os.urandom(100)
    with MessageStore(root, mapped_file_size_commit_log=64 << 20) as store:
        for t in range(2):
            for q in range(4):
                batch = [Message(f"Topic{t}", body, queue_id=q, tags=f"Tag{i % 3}", keys=[f"k{t}-{q}-{i}"])
                         for i in range(MESSAGES // 8)]
                for at in range(0, len(batch), 1000):
                    store.put_messages(batch[at:at + 1000]).check()
    parquet = str(base / "parquet")
    spark.read.format("mqstore").load(root).write.parquet(parquet)
    yield root, parquet
    shutil.rmtree(base, ignore_errors=True)


def _run(benchmark, case, fn):
    result = benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    record_rate(benchmark, case, MESSAGES)
    return result


@pytest.mark.benchmark(group=GROUP)
def test_mqstore_count(benchmark, spark, data):
    root, _ = data
    assert _run(benchmark, "spark/mqstore/count", lambda: spark.read.format("mqstore").load(root).count()) == MESSAGES


@pytest.mark.benchmark(group=GROUP)
def test_parquet_count(benchmark, spark, data):
    _, parquet = data
    assert _run(benchmark, "spark/parquet/count", lambda: spark.read.parquet(parquet).count()) == MESSAGES


AGGREGATE = "sum(length(body)) as bytes, count(distinct keys) as keys, max(store_timestamp) as last"


@pytest.mark.benchmark(group=GROUP)
def test_mqstore_aggregate(benchmark, spark, data):
    root, _ = data
    row = _run(benchmark, "spark/mqstore/aggregate",
               lambda: spark.read.format("mqstore").load(root).selectExpr(*AGGREGATE.split(", ")).collect()[0])
    assert row.bytes == 100 * MESSAGES and row.keys == MESSAGES


@pytest.mark.benchmark(group=GROUP)
def test_parquet_aggregate(benchmark, spark, data):
    _, parquet = data
    row = _run(benchmark, "spark/parquet/aggregate",
               lambda: spark.read.parquet(parquet).selectExpr(*AGGREGATE.split(", ")).collect()[0])
    assert row.bytes == 100 * MESSAGES and row.keys == MESSAGES


@pytest.mark.benchmark(group=GROUP)
def test_mqstore_to_parquet(benchmark, spark, data, tmp_path):
    root, _ = data
    out = str(tmp_path / "out")

    def write():
        spark.read.format("mqstore").load(root).write.mode("overwrite").parquet(out)

    _run(benchmark, "spark/mqstore/to-parquet", write)
    assert spark.read.parquet(out).count() == MESSAGES


# -- writes, rebuild, streaming ------------------------------------------------------------
@pytest.mark.benchmark(group="spark: writes and bulk jobs, 1M messages per round")
def test_batch_write(benchmark, spark, data, tmp_path):
    """The 1M messages (topic, queue_id, tags, keys, body) from Parquet, appended by
    df.write.format("mqstore") into a fresh store this process owns (ASYNC_FLUSH)."""
    from mqstore import MessageStore

    _, parquet = data
    df = spark.read.parquet(parquet).select("topic", "queue_id", "tags", "keys", "body")
    stores = []

    def setup():
        root = str(tmp_path / f"w{len(stores)}")
        stores.append(MessageStore(root, mapped_file_size_commit_log=64 << 20))
        return (root,), {}

    def write(root):
        df.write.format("mqstore").mode("append").save(root)

    try:
        benchmark.pedantic(write, setup=setup, rounds=ROUNDS, warmup_rounds=0, iterations=1)
        record_rate(benchmark, "spark/write/mqstore", MESSAGES)
        assert stores[-1].max_phy_offset > MESSAGES * 100
    finally:
        for s in stores:
            s.shutdown()
            shutil.rmtree(s.root, ignore_errors=True)


@pytest.mark.benchmark(group="spark: writes and bulk jobs, 1M messages per round")
def test_rebuild(benchmark, spark, data, tmp_path):
    """rebuild_queues of the 1M-message store (8 queues, an index key each) into a fresh
    directory: a task per CommitLog file parses, the driver writes the queues and the index."""
    from mqstore.spark.jobs import rebuild_queues

    root, _ = data
    outs = []

    def setup():
        outs.append(str(tmp_path / f"r{len(outs)}"))
        return (outs[-1],), {}

    reports = []
    benchmark.pedantic(lambda out: reports.append(rebuild_queues(spark, root, out=out)), setup=setup,
                       rounds=ROUNDS, warmup_rounds=0, iterations=1)
    record_rate(benchmark, "spark/rebuild", MESSAGES, commitlog_files=reports[-1].commitlog_files)
    assert reports[-1].units == MESSAGES


STREAM_BATCHES, STREAM_ROWS = 10, 1000


@pytest.mark.benchmark(group="spark: streaming, 10 micro-batches of 1,000 messages per round")
def test_stream_micro_batch_latency(benchmark, spark, tmp_path):
    """readStream.format("mqstore") with maxRecordsPerTrigger 1,000 into the noop sink over a
    store of 10,000 messages (availableNow: 10 micro-batches a round); extra_info has the median
    and p90 of Spark's triggerExecution per micro-batch (ms), the latency a micro-batch adds."""
    from mqstore import Message, MessageStore

    root = str(tmp_path / "stream")
    with MessageStore(root) as store:
        for q in range(8):
            store.put_messages([Message("S", os.urandom(100), queue_id=q) for _ in range(STREAM_ROWS * STREAM_BATCHES // 8)]).check()
    durations: list[int] = []
    checkpoints = []

    def run():
        checkpoints.append(str(tmp_path / f"cp{len(checkpoints)}"))
        q = (spark.readStream.format("mqstore").option("maxRecordsPerTrigger", STREAM_ROWS).load(root)
             .writeStream.format("noop").option("checkpointLocation", checkpoints[-1])
             .trigger(availableNow=True).start())
        q.awaitTermination()
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        durations.extend(p["durationMs"]["triggerExecution"] for p in progress)
        return len(progress)

    batches = benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    assert batches == STREAM_BATCHES
    ordered = sorted(durations)
    record_rate(benchmark, "spark/stream/micro-batch", STREAM_BATCHES * STREAM_ROWS,
                trigger_ms_median=ordered[len(ordered) // 2], trigger_ms_p90=ordered[int(len(ordered) * 0.9)])
