"""Stream a RocketMQ cluster's topics through Spark, over the network: read them with
``format("mqstore").option("namesrv", ...)`` and write each message on, either into a topic of
the cluster (the exactly-once network sink) or into Parquet files.

    python examples/spark_remote_stream.py --namesrv 127.0.0.1:9876 --topics Orders \\
        --checkpoint /tmp/cp-orders --to-topic OrdersCopy --sink-id orders-copy

Each message written on carries where it came from as its keys, "<broker>/<queueId>/<queueOffset>"
(and in Parquet the columns broker, queue_id, queue_offset, body). Restarted with the same
checkpoint, the query goes on where the last committed micro-batch ended: every message once.
Prints "STARTED" when the query runs; with --available-now it reads what is there and exits.
tests/test_spark_remote_cluster.py runs it on a local-cluster master and SIGKILLs it.
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", required=True, help="NameServer addresses, host:port;host:port")
    ap.add_argument("--topics", required=True, help="comma-separated topics to read")
    ap.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    ap.add_argument("--to-topic", help="write into this topic of the cluster (needs --sink-id)")
    ap.add_argument("--sink-id", help="the network sink's name (its records: topic MQSTORE_SINK_<sink-id>)")
    ap.add_argument("--parquet", help="write Parquet files into this directory instead")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-per-trigger", type=int, default=10_000, help="messages per micro-batch at most")
    ap.add_argument("--trigger-ms", type=int, default=500, help="micro-batch interval")
    ap.add_argument("--available-now", action="store_true", help="read what is there, then stop")
    args = ap.parse_args()
    if (args.to_topic is None) == (args.parquet is None):
        ap.error("give one of --to-topic and --parquet")
    if args.to_topic and not args.sink_id:
        ap.error("--to-topic needs --sink-id")

    from mqstore.spark import session

    conf = {}
    if args.master.startswith("local-cluster"):  # local-cluster[workers,cores,memory]: small executors
        workers, cores, _ = args.master[args.master.find("[") + 1:-1].split(",")
        conf = {"spark.sql.shuffle.partitions": str(int(workers) * int(cores)), "spark.executor.memory": "512m",
                "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    spark = session(args.master, "mqstore-remote-stream", **conf)
    spark.sparkContext.setLogLevel("ERROR")
    rows = (spark.readStream.format("mqstore").option("namesrv", args.namesrv).option("topics", args.topics)
            .option("maxRecordsPerTrigger", args.max_per_trigger)
            .schema("broker string, topic string, queue_id int, queue_offset bigint, body binary").load())
    if args.to_topic:
        out = (rows.selectExpr(f"'{args.to_topic}' as topic", "body",
                               "concat_ws('/', broker, cast(queue_id as string), cast(queue_offset as string)) as keys")
               .writeStream.format("mqstore").option("namesrv", args.namesrv).option("sinkId", args.sink_id))
    else:
        out = rows.writeStream.format("parquet").option("path", args.parquet)
    out = out.option("checkpointLocation", args.checkpoint)
    if args.available_now:
        out = out.trigger(availableNow=True)
    else:
        out = out.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = out.start()
    print("STARTED", flush=True)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
