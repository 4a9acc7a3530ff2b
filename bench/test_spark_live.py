"""A streaming query over a live store (issue 26): a writer puts LIVE_RATE messages/s (default
20,000, 100 B bodies, 4 queues) through the public API into a store this process serves,
while ``spark.readStream.format("mqstore")`` runs on local[2] with a 500 ms processing-time
trigger into a foreachBatch sink. For every row: store time -> the end of the micro-batch that
carried it (the batch's commit), as p50 / p99; and whether the query kept up (rows read per
second of the measured window vs the rate put).

Target (issue 26): keep up with 20k msg/s produced, p99 <= 2 s.

Run: ``LIVE_RATE=20000 python -m pytest bench/test_spark_live.py -q -s``; extra_info has
latency_ms_p50 / p99, the rates and the micro-batch count. On the 2 shared cores, whatever
else runs shifts these a lot: say what ran beside it.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench._common import record_rate

pytest.importorskip("pyspark")

RATE = int(os.environ.get("LIVE_RATE", "20000"))
SECONDS = float(os.environ.get("LIVE_SECONDS", "30"))
WARMUP_S = float(os.environ.get("LIVE_WARMUP_SECONDS", "15"))


def test_live_stream_latency(benchmark, spark, tmp_path):
    from mqstore import Message, MessageStore

    root = str(tmp_path / "live")
    body = os.urandom(100)
    store = MessageStore(root)
    stop = threading.Event()
    put = [0]

    def writer() -> None:
        step = max(4, RATE // 100)  # a batch per queue every 10 ms
        started = time.monotonic()
        while not stop.is_set():
            for q in range(4):
                store.put_messages([Message("Live", body, queue_id=q) for _ in range(step // 4)]).check()
            put[0] += step // 4 * 4
            ahead = started + put[0] / RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    latencies: list[float] = []
    counts: list[tuple[float, int]] = []
    lock = threading.Lock()

    def sink(df, batch_id):  # runs in the driver: the batch's rows are computed here (an Arrow collect)
        stamps = df.selectExpr("unix_millis(store_timestamp) as t").toArrow().column("t").to_pylist()
        done = time.time() * 1000
        with lock:
            counts.append((time.monotonic(), len(stamps)))
            latencies.extend(done - s for s in stamps)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    query = (spark.readStream.format("mqstore").option("startingOffsets", "latest").load(root)
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="500 milliseconds").start())
    try:
        time.sleep(WARMUP_S)
        with lock:
            latencies.clear()
            counts.clear()
        put_before, t0 = put[0], time.monotonic()
        time.sleep(SECONDS)
        with lock:
            window = list(latencies)
            rows = sum(n for _, n in counts)
            batches = len(counts)
        put_rate = (put[0] - put_before) / (time.monotonic() - t0)
        phases = [p["durationMs"] for p in query.recentProgress[-5:]]
    finally:
        stop.set()
        thread.join(30)
        query.stop()
        store.shutdown()
    window.sort()
    assert window, "the query read nothing"
    p50, p99 = window[len(window) // 2], window[int(len(window) * 0.99)]
    benchmark.extra_info.update(latency_ms_p50=round(p50), latency_ms_p99=round(p99), put_rate=round(put_rate),
                                read_rate=round(rows / SECONDS), micro_batches=batches)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    record_rate(benchmark, "spark/live-stream", rows)
    print(f"\nput {put_rate:,.0f}/s, read {rows / SECONDS:,.0f}/s in {batches} micro-batches; "
          f"store time -> batch commit p50 {p50:,.0f} ms, p99 {p99:,.0f} ms")
    for phase in phases:
        print("  micro-batch ms:", phase)
