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
def spark():
    from mqstore.spark import session

    spark = session("local[2]", **{"spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


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
