"""Bulk jobs on Spark (issue 5), as functions and as a command:

    python -m mqstore.spark.jobs export STORE OUT [--topics T,..] [--mode overwrite]
    python -m mqstore.spark.jobs stats STORE [--topics T,..] [--json]
    python -m mqstore.spark.jobs rebuild STORE [--out DIR]

(``mqstore-spark`` is the same command.) Each runs in a local Spark session
(``mqstore.spark.session``; ``--master`` to change it) and works on any store directory in
RocketMQ's layout: it needs ``commitlog/`` (and ``consumequeue/`` for export and stats), not
mqstore's own files; without ``mqstore.config.json`` the file sizes and index geometry are
RocketMQ's defaults (``StoreConfig()``).

``export_parquet``   the messages of the chosen topics into Parquet, partitioned by topic
``queue_stats``      per queue: messages, bytes (stored record sizes), body bytes, first/last
                     queue offset and store time, messages per tag and untagged ones
``rebuild_queues``   every ConsumeQueue and the IndexFile(s) rebuilt from the CommitLog: one
                     Spark task per CommitLog file parses it with the dispatcher's parser
                     (``mqstore._reput.BatchParser``, the concurrent dispatch's parse step);
                     the driver applies the parsed files in log order with the dispatcher's
                     ConsumeQueue and IndexFile writers, so the files are byte for byte what
                     dispatching the log builds (IndexFile *names* are creation times, as in
                     RocketMQ, so only their contents compare). In place (the default) it
                     takes the store's lock, builds next to the old files and swaps them in;
                     ``out=DIR`` leaves the store alone and writes ``DIR/consumequeue`` and
                     ``DIR/index``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from mqstore._reput import BatchParser
from mqstore.checkpoint import StoreCheckpoint
from mqstore.config import StoreConfig
from mqstore.consume_queue import ConsumeQueueTable
from mqstore.errors import MQStoreError, StoreLockedError
from mqstore.index import IndexService
from mqstore.inspection import open_commitlog
from mqstore.node import CONFIG_NAME, read_config
from mqstore.snapshot import StoreNotReadableError, StoreSnapshot
from mqstore.spark.source import LogSlice
from mqstore.store import lock_state, release_store_lock, require_store, take_store_lock

log = logging.getLogger("mqstore.spark")

#: what a rebuild task gives per CommitLog file: its ConsumeQueue units in record order, then
#: one row with its index keys ((phy, store_timestamp, key_hash) native int64 triples)
DISPATCH_SCHEMA = StructType([
    StructField("file_from", LongType()),
    StructField("topic", StringType()),
    StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()),
    StructField("phy", LongType()),
    StructField("size", IntegerType()),
    StructField("tags_code", LongType()),
    StructField("index_keys", BinaryType()),
])


def store_config(root: str) -> StoreConfig:
    """The store's configuration (mqstore.config.json), or RocketMQ's defaults without one."""
    return read_config(root) if os.path.exists(os.path.join(root, CONFIG_NAME)) else StoreConfig()


# -- export and statistics ------------------------------------------------------------------
def _reader(spark: SparkSession, store: str, topics: Sequence[str] | None, schema: str | None = None) -> DataFrame:
    r = spark.read.format("mqstore")
    if schema:
        r = r.schema(schema)
    if topics:
        r = r.option("topics", ",".join(topics))
    return r.load(store)


def export_parquet(spark: SparkSession, store: str, out: str, *, topics: Sequence[str] | None = None,
                   mode: str = "errorifexists") -> int:
    """Write the messages of topics (default: all) to Parquet under out, partitioned by topic
    (every column of mqstore.spark.SCHEMA). Returns the number of messages written."""
    _reader(spark, store, topics).write.mode(mode).partitionBy("topic").parquet(out)
    return int(spark.read.parquet(out).count())  # from the Parquet footers


def queue_stats(spark: SparkSession, store: str, *, topics: Sequence[str] | None = None) -> DataFrame:
    """One row per queue: topic, queue_id, messages, bytes, body_bytes, first_offset,
    last_offset, first_store_time, last_store_time, tag_counts (map tag -> messages) and
    untagged (messages without TAGS)."""
    df = _reader(spark, store, topics, "topic string, queue_id int, queue_offset long, store_size int, "
                                       "store_timestamp timestamp, tags string, body binary")
    per_tag = (df.where(F.col("tags").isNotNull()).groupBy("topic", "queue_id", "tags").count()
               .groupBy("topic", "queue_id")
               .agg(F.map_from_entries(F.collect_list(F.struct("tags", "count"))).alias("tag_counts")))
    totals = df.groupBy("topic", "queue_id").agg(
        F.count(F.lit(1)).alias("messages"), F.sum("store_size").alias("bytes"),
        F.sum(F.length("body")).alias("body_bytes"), F.min("queue_offset").alias("first_offset"),
        F.max("queue_offset").alias("last_offset"), F.min("store_timestamp").alias("first_store_time"),
        F.max("store_timestamp").alias("last_store_time"),
        F.sum(F.when(F.col("tags").isNull(), 1).otherwise(0)).alias("untagged"))
    return (totals.join(per_tag, ["topic", "queue_id"], "left")
            .select("topic", "queue_id", "messages", "bytes", "body_bytes", "first_offset", "last_offset",
                    "first_store_time", "last_store_time",
                    F.coalesce("tag_counts", F.create_map().cast("map<string,bigint>")).alias("tag_counts"),
                    "untagged")
            .orderBy("topic", "queue_id"))


# -- rebuilding ConsumeQueues and the IndexFile ------------------------------------------------
class DispatchDataSource(DataSource):
    """``format("mqstore_dispatch")``: the parse step of dispatch, a partition per CommitLog file
    (the rebuild's input; see DISPATCH_SCHEMA)."""

    @classmethod
    def name(cls) -> str:
        return "mqstore_dispatch"

    def schema(self) -> StructType:
        return DISPATCH_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return DispatchReader(dict(self.options))


class DispatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.root = require_store(options["path"])
        cfg = store_config(self.root)
        self.delay_levels_ms = tuple(cfg.delay_levels_ms)
        self.index_enable = cfg.message_index_enable

    def partitions(self) -> list[InputPartition]:
        with StoreSnapshot(self.root) as snap:
            return [LogSlice(start, end) for start, end in snap.log_spans()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogSlice)
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(DISPATCH_SCHEMA, timezone="UTC")
        parser = BatchParser(self.delay_levels_ms, index_enable=self.index_enable)
        queue = open_commitlog(self.root)
        try:
            mf = next(f for f in queue.files if f.file_from <= partition.start < f.file_from + queue.file_size)
            batch = parser.parse(mf, mf.file_from, partition.start - mf.file_from, partition.end - mf.file_from)
            if batch.reason == "invalid":
                raise StoreNotReadableError(f"CommitLog record at {mf.file_from + batch.stop} does not parse "
                                            f"(file {mf.file_from:020d})")
            units = batch.unit_list()
            n = len(units)
            cols = list(zip(*units)) if units else [()] * 6
            yield pa.RecordBatch.from_arrays([
                pa.array([mf.file_from] * (n + 1), pa.int64()),
                pa.array([t.decode() for t in cols[0]] + [None], pa.string()),
                pa.array(list(cols[1]) + [None], pa.int32()),
                pa.array(list(cols[2]) + [None], pa.int64()),
                pa.array(list(cols[3]) + [None], pa.int64()),
                pa.array(list(cols[4]) + [None], pa.int32()),
                pa.array(list(cols[5]) + [None], pa.int64()),
                pa.array([None] * n + [batch.index_keys], pa.binary()),
            ], schema=schema)
        finally:
            queue.close()


@dataclass
class RebuildReport:
    queues: int
    units: int
    index_keys: int
    commitlog_files: int
    out: str


def rebuild_queues(spark: SparkSession, store: str, *, out: str | None = None) -> RebuildReport:
    """Rebuild every ConsumeQueue and the IndexFile(s) of store from its CommitLog (see the
    module docstring). The store must not be running, nor crashed (open it once to recover)."""
    root = require_store(store)
    status = lock_state(root)["status"]
    if status == "running":
        raise StoreLockedError(f"{root} is owned by a running store; stop it before rebuilding its queues")
    if status == "crashed":
        raise StoreNotReadableError(f"{root} was not shut down cleanly; open it once so it recovers, then rebuild")
    lock = take_store_lock(root) if out is None else -1  # no store may open it while files are swapped
    try:
        cfg = store_config(root)
        spark.dataSource.register(DispatchDataSource)
        table = spark.read.format("mqstore_dispatch").load(root).toArrow()
        target = os.path.abspath(out) if out is not None else os.path.join(root, ".rebuild")
        if out is None:
            shutil.rmtree(target, ignore_errors=True)
        for sub in ("consumequeue", "index"):
            if os.path.exists(os.path.join(target, sub)):
                raise MQStoreError(f"{os.path.join(target, sub)} exists; a rebuild writes into a fresh directory")
        os.makedirs(target, exist_ok=True)
        report = _write_queues(table, target, cfg)
        if out is None:
            _swap_in(root, target)
            report.out = root
        return report
    finally:
        if lock >= 0:
            release_store_lock(lock)


def _write_queues(table: pa.Table, target: str, cfg: StoreConfig) -> RebuildReport:
    """Apply the parsed files in log order with the dispatcher's writers."""
    queues = ConsumeQueueTable(os.path.join(target, "consumequeue"), cfg.mapped_file_size_consume_queue)
    queues.load()
    checkpoint = StoreCheckpoint(os.path.join(target, "checkpoint"))
    index = IndexService(target, cfg, checkpoint) if cfg.message_index_enable else None
    if index is not None:
        index.load(True)
    units = keys = 0
    try:
        cols = {name: table.column(name).to_pylist() for name in table.column_names}
        current: dict[tuple[str, int], Any] = {}
        for i in range(table.num_rows):
            blob = cols["index_keys"][i]
            if blob is not None:
                if index is not None and blob:
                    if not index.put_key_hashes(blob):
                        raise MQStoreError(f"no index file could be created under {target}")
                    keys += len(blob) // 24
                continue
            key = (cols["topic"][i], cols["queue_id"][i])
            cq = current.get(key)
            if cq is None:
                cq = current[key] = queues.find_or_create(*key)
            cq.put_message_position_info(cols["phy"][i], cols["size"][i], cols["tags_code"][i], cols["queue_offset"][i])
            units += 1
        queues.flush()
        files = len(set(cols["file_from"]))
        return RebuildReport(len(current), units, keys, files, target)
    finally:
        queues.close()
        if index is not None:
            index.close()
        checkpoint.close()
        os.unlink(os.path.join(target, "checkpoint"))


def _swap_in(root: str, staging: str) -> None:
    """Replace root's consumequeue/ and index/ with the rebuilt ones (under the store lock)."""
    for sub in ("consumequeue", "index"):
        new, old = os.path.join(staging, sub), os.path.join(root, sub)
        retired = os.path.join(staging, f"{sub}.old")
        if os.path.exists(old):
            os.rename(old, retired)
        if os.path.exists(new):
            os.rename(new, old)
    shutil.rmtree(staging)


# -- the command ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mqstore-spark", description="Bulk jobs on a store directory, on Spark.")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    sub = p.add_subparsers(dest="job", required=True)
    e = sub.add_parser("export", help="messages to Parquet, partitioned by topic")
    e.add_argument("store")
    e.add_argument("out")
    e.add_argument("--topics", help="comma-separated topics (default: all)")
    e.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite", "append", "ignore"])
    s = sub.add_parser("stats", help="per-queue statistics")
    s.add_argument("store")
    s.add_argument("--topics")
    s.add_argument("--json", action="store_true")
    r = sub.add_parser("rebuild", help="ConsumeQueues and IndexFile(s) from the CommitLog")
    r.add_argument("store")
    r.add_argument("--out", help="write DIR/consumequeue and DIR/index instead of replacing the store's")
    args = p.parse_args(argv)
    from mqstore.spark import session

    topics = args.topics.split(",") if getattr(args, "topics", None) else None
    spark = session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.job == "export":
            n = export_parquet(spark, args.store, args.out, topics=topics, mode=args.mode)
            print(f"exported {n:,} message(s) from {args.store} to {args.out}")
        elif args.job == "stats":
            rows = [r.asDict() for r in queue_stats(spark, args.store, topics=topics).collect()]
            if args.json:
                print(json.dumps(rows, default=str, indent=2))
            else:
                for row in rows:
                    tags = ", ".join(f"{k}={v}" for k, v in sorted(row["tag_counts"].items()))
                    print(f"{row['topic']}/{row['queue_id']}: {row['messages']:,} messages, {row['bytes']:,} bytes, "
                          f"offsets {row['first_offset']}..{row['last_offset']}, "
                          f"{row['first_store_time']} .. {row['last_store_time']}, "
                          f"tags: {tags or '-'}, untagged {row['untagged']}")
        else:
            report = rebuild_queues(spark, args.store, out=args.out)
            print(json.dumps(asdict(report)))
    except MQStoreError as exc:
        print(f"mqstore-spark: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
