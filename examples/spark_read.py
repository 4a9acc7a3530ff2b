"""Read a store with Spark: a node serves a store directory while this script puts messages,
then reads them as a DataFrame (all, by topic and offsets, by time, a whole-log scan) and as a
stream into Parquet, printing what each read gave.

    python examples/spark_read.py --store /tmp/mqstore-spark --messages 100000
"""

from __future__ import annotations

import argparse
import sys
import json
import os
import shutil
import tempfile
import time

from mqstore import Message, MessageStore
from mqstore.spark import session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="/tmp/mqstore-spark", help="store directory (created if missing)")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    if args.messages < 800:
        ap.error("--messages must be at least 800: the example reads offsets 10..15 of queue Orders/1")
    spark = session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    with MessageStore(args.store, service_mode="processes") as node:
        t0 = time.time()
        mid_ms = 0
        for b, start in enumerate(range(0, args.messages, 100)):  # batches of 100, a queue each
            if start >= args.messages // 2 and not mid_ms:
                mid_ms = int(time.time() * 1000)  # for the time lookup below
            for topic in ("Orders", "Payments"):
                node.put_messages([Message(topic, b"%s-%d." % (topic.encode(), i) + b"." * 80, queue_id=b % 4,
                                           tags=f"Tag{i % 3}", keys=[f"{topic}-{i}"])
                                   for i in range(start, min(start + 100, args.messages))]).check()
        node.wait_dispatched()
        print(f"put {2 * args.messages:,} messages into {args.store} in {time.time() - t0:.1f} s "
              f"(node pid {os.getpid()})")

        df = spark.read.format("mqstore").load(args.store)
        print("batch read, per topic:", {r.topic: r["count"] for r in df.groupBy("topic").count().collect()})
        some = (spark.read.format("mqstore").option("topics", "Orders").option("queues", "1")
                .option("startingOffsets", json.dumps({"Orders/1": 10})).option("endingOffsets", json.dumps({"Orders/1": 15}))
                .load(args.store).select("queue_offset", "tags", "keys").collect())
        print("Orders/1 offsets [10, 15):", [(r.queue_offset, r.tags, r.keys) for r in some])
        recent = spark.read.format("mqstore").option("startingTimestamp", str(mid_ms)).load(args.store).count()
        print(f"messages stored at or after {mid_ms} (time lookup): {recent:,}")
        log_scan = spark.read.format("mqstore").option("mode", "commitlog").load(args.store)
        print(f"whole-log scan: {log_scan.count():,} records in {log_scan.rdd.getNumPartitions()} partition(s)")

        out = tempfile.mkdtemp(prefix="mqstore-stream-")
        q = (spark.readStream.format("mqstore").option("maxRecordsPerTrigger", 50_000).load(args.store)
             .select("topic", "queue_id", "queue_offset", "body").writeStream.format("parquet")
             .option("path", os.path.join(out, "data")).option("checkpointLocation", os.path.join(out, "cp"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        streamed = spark.read.parquet(os.path.join(out, "data")).count()
        print(f"stream (availableNow, 50,000 per micro-batch): {streamed:,} rows in "
              f"{len(q.recentProgress)} micro-batch(es), written to Parquet (removed)")
        shutil.rmtree(out, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    from mqstore.spark.jobs import run_command

    sys.exit(run_command(main, "spark_read.py"))
