"""Write into a store with Spark: this script serves a store directory (as a node) and
- appends a DataFrame as messages (queue chosen by the hash of the keys, as RocketMQ's
  SelectMessageQueueByHash does), then
- runs a streaming query that reads those messages, transforms them and writes them to another
  topic of the same store, exactly once per micro-batch; run again on the same checkpoint, it
  has nothing new to write,
and prints what each step wrote.

    python examples/spark_write.py --store /tmp/mqstore-spark-write --rows 100000
"""

from __future__ import annotations

import argparse
import sys
import os

from mqstore import MessageStore
from mqstore.spark import session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="/tmp/mqstore-spark-write", help="store directory (created if missing)")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    spark = session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    checkpoint = os.path.join(args.store, "..", os.path.basename(args.store) + "-checkpoint")
    with MessageStore(args.store, service_mode="processes") as node:
        df = spark.range(args.rows).selectExpr(
            "'Clicks' as topic", "concat('user-', cast(id % 1000 as string)) as keys",
            "cast(id % 3 as string) as tags", "map('seq', cast(id as string)) as properties",
            "cast(concat('click ', cast(id as string)) as binary) as body")
        df.write.format("mqstore").mode("append").save(args.store)
        node.wait_dispatched()
        per_queue = {r.queue_id: r["count"] for r in spark.read.format("mqstore").option("topics", "Clicks")
                     .load(args.store).groupBy("queue_id").count().collect()}
        print(f"batch write: {sum(per_queue.values()):,} Clicks messages, per queue {dict(sorted(per_queue.items()))}")

        for run in (1, 2):
            q = (spark.readStream.format("mqstore").option("topics", "Clicks")
                 .option("maxRecordsPerTrigger", max(1, args.rows // 4)).load(args.store)
                 .selectExpr("'ClicksUpper' as topic", "keys", "upper(cast(body as string)) as body")
                 .writeStream.format("mqstore").option("sinkId", "clicks-upper")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(args.store))
            q.awaitTermination()
            node.wait_dispatched()
            upper = spark.read.format("mqstore").option("topics", "ClicksUpper").load(args.store)
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            print(f"stream run {run}: read {rows:,} new Clicks messages; ClicksUpper now holds "
                  f"{upper.count():,} messages ({upper.select('body').distinct().count():,} distinct bodies)")
    spark.stop()


if __name__ == "__main__":
    from mqstore.spark.jobs import run_command

    sys.exit(run_command(main, "spark_write.py"))
