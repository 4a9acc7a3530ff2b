"""Spark reading a broker over the network (issue 26) against reading its store directory: the
same store of 500k messages with 100 B bodies (2 topics x 4 queues, a tag and a key each),
served by ``mqstore broker`` (a process of its own, 2 fronts; its transfer limits raised to
1,024 messages / 4 MiB a pull), read by ``spark.read.format("mqstore")`` into ``count()`` with
``load(store)`` (the local reader maps the files) and with ``option("namesrv", ...)`` (the
network reader pulls through the broker), pulls of 32 messages (what RocketMQ's default limits
give) and of 1,024. Each round also takes the CPU seconds of the whole process tree (this process, the
JVM, the Python workers, the broker and its fronts and services, from /proc): rows per
CPU-second is what the network costs. Then the latency of a streaming query over the network:
a producer sends 1,000 messages/s, the query (default trigger: a micro-batch as soon as the
last one ended) hands each micro-batch to foreachBatch, which notes, per message, the time from
its store timestamp to the end of the batch's work (the commit follows); p50/p99 per round.

Run: ``python -m pytest bench/test_spark_remote.py --benchmark-columns=median,rounds -q -s``
(local[2] session, ~3 min); the medians are in extra_info and printed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import pytest

from bench._broker import ENV, BrokerProc, children, cpu_s, percentiles, self_cpu_s
from bench._common import record_rate

pytest.importorskip("pyspark")

MESSAGES = 500_000
TOPICS = "Remote0,Remote1"
ROUNDS = 3
GROUP = "spark: 500k x 100 B messages per round, local[2], local vs network reader"
STREAM_RATE, STREAM_S = 1000, 20
#: the broker's transfer limits raised (RocketMQ's defaults: 32 messages / 256 KiB a pull from
#: memory), so a pull of 1,024 messages is answered whole
BULK_LIMITS = {"max_transfer_count_on_message_in_memory": 1024, "max_transfer_bytes_on_message_in_memory": 4 << 20}


def tree_cpu_s() -> float:
    """CPU seconds of this process and every process below it so far."""
    total, todo = self_cpu_s(), [os.getpid()]
    while todo:
        for pid in children(todo.pop()):
            total += cpu_s(pid)
            todo.append(pid)
    return total


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(store dir, NameServer address) of a broker serving the 500k messages."""
    from mqstore import Message, MessageStore
    from mqstore.spark.remote.cluster import Cluster, ClusterConfig

    base = tmp_path_factory.mktemp("spark-remote-bench")
    root = str(base / "store")
    body = os.urandom(100)
    with MessageStore(root, mapped_file_size_commit_log=64 << 20) as store:
        for t in range(2):
            for q in range(4):
                batch = [Message(f"Remote{t}", body, queue_id=q, tags=f"Tag{i % 3}", keys=[f"k{t}-{q}-{i}"])
                         for i in range(MESSAGES // 8)]
                for at in range(0, len(batch), 1000):
                    store.put_messages(batch[at:at + 1000]).check()
    broker = BrokerProc(str(base), front_processes=2, mapped_file_size_commit_log=64 << 20, **BULK_LIMITS)
    try:
        for topic in TOPICS.split(","):  # (the store has its queues; the broker's topic table does not)
            subprocess.run([sys.executable, "-m", "mqstore", "admin", "topic-create", topic, "--queues", "4",
                            "--broker", broker.address], check=True, capture_output=True, timeout=60, env=ENV)
        with Cluster(ClusterConfig(broker.namesrv), route_ttl=0.1) as cluster:
            deadline = time.monotonic() + 60
            while len(cluster.message_queues(TOPICS.split(","), missing_ok=True)) < 8:
                assert time.monotonic() < deadline, "the topics never reached the NameServer"
                time.sleep(0.1)
        yield root, broker.namesrv
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


def _cpu_rounds(benchmark, case: str, fn):
    """benchmark.pedantic of fn, each round's CPU seconds of the process tree in extra_info."""
    cpus: list[float] = []

    def round_():
        before = tree_cpu_s()
        result = fn()
        cpus.append(tree_cpu_s() - before)
        return result

    result = benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    measured = cpus[1:]
    cpu = statistics.median(measured)
    record_rate(benchmark, case, MESSAGES, cpu_s_median=round(cpu, 2), rows_per_cpu_s=round(MESSAGES / cpu))
    print(f"\n{case}: median {benchmark.stats.stats.median:.2f} s, CPU {cpu:.2f} s, "
          f"{MESSAGES / cpu:,.0f} rows per CPU-second")
    return result


@pytest.mark.benchmark(group=GROUP)
def test_local_count(benchmark, spark, served):
    root, _ = served
    df = spark.read.format("mqstore").option("topics", TOPICS).load(root)
    assert _cpu_rounds(benchmark, "spark/local/count", df.count) == MESSAGES


@pytest.mark.benchmark(group=GROUP)
@pytest.mark.parametrize("pull", [32, 1024])
def test_network_count(benchmark, spark, served, pull):
    """pullBatchSize 32 (what a broker with RocketMQ's default limits answers) and 1,024."""
    _, namesrv = served
    df = (spark.read.format("mqstore").option("namesrv", namesrv).option("topics", TOPICS)
          .option("pullBatchSize", pull).load())
    assert _cpu_rounds(benchmark, f"spark/network/count-pull{pull}", df.count) == MESSAGES


@pytest.mark.benchmark(group="spark: a stream over the network, 1,000 messages/s for 20 s per round")
def test_network_stream_latency(benchmark, spark, served, tmp_path):
    from mqstore.client import SyncProducer

    _, namesrv = served
    with SyncProducer("PG_bench_live", namesrv) as producer:
        producer.send("Live", b"first")  # the topic, created before the query asks for its route
    latencies: list[float] = []
    per_round: list[dict[str, float]] = []

    def run() -> int:
        round_lat: list[float] = []
        stop = threading.Event()

        def produce() -> None:
            with SyncProducer("PG_bench_live", namesrv) as p:
                while not stop.is_set():
                    p.send_batch("Live", [os.urandom(100) for _ in range(10)])
                    time.sleep(10 / STREAM_RATE)

        def on_batch(df, batch_id) -> None:
            stamps = [r[0] for r in df.selectExpr("unix_millis(store_timestamp)").collect()]
            now = time.time() * 1000
            round_lat.extend(now - ts for ts in stamps)

        q = (spark.readStream.format("mqstore").option("namesrv", namesrv).option("topics", "Live")
             .option("startingOffsets", "latest").load()
             .writeStream.foreachBatch(on_batch).option("checkpointLocation", str(tmp_path / f"cp{len(per_round)}"))
             .start())
        writer = threading.Thread(target=produce, daemon=True)
        try:
            deadline = time.monotonic() + 120
            while not q.recentProgress and time.monotonic() < deadline:  # the query runs
                time.sleep(0.1)
            writer.start()
            time.sleep(STREAM_S)
        finally:
            stop.set()
            if writer.is_alive():
                writer.join(30)
            q.stop()
        latencies.extend(round_lat)
        per_round.append(percentiles(round_lat, (0.5, 0.99)))
        return len(round_lat)

    got = benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    assert got > STREAM_RATE * STREAM_S // 2
    p50 = statistics.median(r["p50"] for r in per_round)
    p99 = statistics.median(r["p99"] for r in per_round)
    record_rate(benchmark, "spark/network/stream-latency", got, latency_ms_p50=round(p50), latency_ms_p99=round(p99),
                rounds=per_round)
    print(f"\nstream over the network: store time -> end of its micro-batch, median of rounds: p50 {p50:.0f} ms, "
          f"p99 {p99:.0f} ms ({per_round})")
