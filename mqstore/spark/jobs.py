"""Bulk jobs on Spark, as functions and as a command:

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
                     (``mqstore.queue._reput.BatchParser``, the concurrent dispatch's parse step);
                     the driver applies the parsed files in log order with the dispatcher's
                     ConsumeQueue and IndexFile writers, so the files are byte for byte what
                     dispatching the log builds (IndexFile *names* are creation times, as in
                     RocketMQ, so only their contents compare). A store with several
                     CommitLogs: a task per file of every log, each log's keys into its own
                     index (``index-k``), as each log's dispatcher puts them. In place (the
                     default) it takes the store's lock, builds next to the old files and swaps
                     them in;
                     ``out=DIR`` leaves the store alone and writes ``DIR/consumequeue`` and
                     ``DIR/index`` (and ``DIR/index-k``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from mqstore.queue._reput import BatchParser
from mqstore.config import StoreConfig
from mqstore.errors import MQStoreError, StoreLockedError
from mqstore.queue.files import open_commitlog
from mqstore.node import read_config
from mqstore.layout import CONFIG_NAME, CONSUMEQUEUE_DIR, checkpoint_path, fence_log_count, index_dir, log_of
from mqstore.parts import open_parts
from mqstore.queue.snapshot import StoreNotReadableError, StoreSnapshot
from mqstore.spark.source import LogSlice
from mqstore.spark.worker import settle_worker
from mqstore.log.directory import lock_state, release_store_lock, require_store, take_store_lock

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
    """The store's configuration (mqstore.config.json), or RocketMQ's defaults without one
    (with the CommitLog count the fence names, for a store with several whose file is gone)."""
    if os.path.exists(os.path.join(root, CONFIG_NAME)):
        return read_config(root)
    cfg = StoreConfig()
    count = fence_log_count(cfg.commit_log_dir(root))
    return cfg.replace(commit_log_count=count) if count else cfg


def rebuilt_dirs(cfg: StoreConfig) -> list[str]:
    """The directories a rebuild writes, under its target: consumequeue and each log's index
    (``index``, ``index-1``, ...)."""
    return [CONSUMEQUEUE_DIR] + [os.path.basename(index_dir("", k)) for k in range(cfg.commit_log_count)]


# -- export and statistics ------------------------------------------------------------------
def _reader(spark: SparkSession, store: str, topics: Sequence[str] | None, schema: str | None = None,
            options: dict[str, Any] | None = None) -> DataFrame:
    r = spark.read.format("mqstore")
    if schema:
        r = r.schema(schema)
    if topics:
        r = r.option("topics", ",".join(topics))
    for key, value in (options or {}).items():
        r = r.option(key, str(value))
    return r.load(store)


def export_parquet(spark: SparkSession, store: str, out: str, *, topics: Sequence[str] | None = None,
                   mode: str = "errorifexists", options: dict[str, Any] | None = None) -> int:
    """Write the messages of topics (default: all) to Parquet under out, partitioned by topic
    (every column of mqstore.spark.SCHEMA). options: more read options of the data source
    (``batchRows``, ``maxBatchBytes``, ...). Returns the number of messages written."""
    _reader(spark, store, topics, options=options).write.mode(mode).partitionBy("topic").parquet(out)
    return int(spark.read.parquet(out).count())  # from the Parquet footers


def queue_stats(spark: SparkSession, store: str, *, topics: Sequence[str] | None = None,
                options: dict[str, Any] | None = None) -> DataFrame:
    """One row per queue: topic, queue_id, messages, bytes, body_bytes, first_offset,
    last_offset, first_store_time, last_store_time, tag_counts (map tag -> messages) and
    untagged (messages without TAGS). options: more read options of the data source."""
    df = _reader(spark, store, topics, "topic string, queue_id int, queue_offset long, store_size int, "
                                       "store_timestamp timestamp, tags string, body binary", options)
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
    of every log (the rebuild's input; see DISPATCH_SCHEMA)."""

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
        """A partition per CommitLog file of every log (log after log: a span never crosses
        logs), as mode=commitlog reads them."""
        with StoreSnapshot(self.root) as snap:
            return [LogSlice(start, end) for start, end in snap.log_spans()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogSlice)
        from pyspark.sql.pandas.types import to_arrow_schema

        settle_worker()

        schema = to_arrow_schema(DISPATCH_SCHEMA, timezone="UTC")
        parser = BatchParser(self.delay_levels_ms, index_enable=self.index_enable)
        # the partition's CommitLog (log 0 of a store with one is the store's only one)
        queue = open_commitlog(self.root, log=log_of(partition.start))
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
    #: the store's CommitLogs (each log's files parsed, its index-k rebuilt)
    logs: int = 1


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
        for sub in rebuilt_dirs(cfg):
            if os.path.exists(os.path.join(target, sub)):
                raise MQStoreError(f"{os.path.join(target, sub)} exists; a rebuild writes into a fresh directory")
        os.makedirs(target, exist_ok=True)
        report = _write_queues(table, target, cfg)
        if out is None:
            _swap_in(root, target, rebuilt_dirs(cfg))
            report.out = root
        return report
    finally:
        if lock >= 0:
            release_store_lock(lock)


def _write_queues(table: pa.Table, target: str, cfg: StoreConfig) -> RebuildReport:
    """Apply the parsed files in log order with the dispatcher's writers: each log's index
    keys into that log's index (``index-k``), as its own dispatcher puts them; a queue's
    units all come from the log it is bound to, so the logs' order between them does not
    matter."""
    parts = open_parts(target, cfg, None, "rebuild")
    queues, indexes = parts.consume_queues, parts.indexes
    assert queues is not None
    units = keys = skipped = 0
    try:
        cols = {name: table.column(name).to_pylist() for name in table.column_names}
        current: dict[tuple[str, int], Any] = {}
        for i in range(table.num_rows):
            blob = cols["index_keys"][i]
            if blob is not None:
                index = indexes[log_of(cols["file_from"][i])]
                if index is not None and blob:
                    if not index.put_key_hashes(blob):
                        raise MQStoreError(f"no index file could be created under {target}")
                    keys += len(blob) // 24
                continue
            key = (cols["topic"][i], cols["queue_id"][i])
            cq = current.get(key)
            if cq is None:
                cq = current[key] = queues.dispatch_target(*key)
            if cq is None:  # a damaged record no queue can take: dispatch skips it too
                skipped += 1
                continue
            cq.put_message_position_info(cols["phy"][i], cols["size"][i], cols["tags_code"][i], cols["queue_offset"][i])
            units += 1
        queues.flush()
        files = len(set(cols["file_from"]))
        if skipped:
            log.error("rebuild: %d record(s) name a queue that cannot exist (a damaged topic); left out", skipped)
        return RebuildReport(sum(1 for cq in current.values() if cq is not None), units, keys, files, target,
                             cfg.commit_log_count)
    finally:
        parts.close()
        for k in range(cfg.commit_log_count):
            os.unlink(checkpoint_path(target, k))


def _swap_in(root: str, staging: str, subs: list[str]) -> None:
    """Replace root's consumequeue/ and index/ (and each log's index-k/) with the rebuilt ones
    (under the store lock)."""
    for sub in subs:
        new, old = os.path.join(staging, sub), os.path.join(root, sub)
        retired = os.path.join(staging, f"{sub}.old")
        if os.path.exists(old):
            os.rename(old, retired)
        if os.path.exists(new):
            os.rename(new, old)
    shutil.rmtree(staging)


# -- the command ----------------------------------------------------------------------------------
class JobProgress:
    """A driver thread that prints the running job's partitions (Spark tasks) done, a
    percentage and the elapsed time to stderr about every interval_s seconds, from Spark's
    status tracker (no Spark console progress bar: the session turns it off)."""

    def __init__(self, spark: SparkSession, job: str, interval_s: float = 1.0, stream: Any = None) -> None:
        import threading

        self.tracker = spark.sparkContext.statusTracker()
        self.job = job
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqstore-spark-progress", daemon=True)
        self.lines = 0

    def __enter__(self) -> JobProgress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = ""
        while not self._stop.wait(self.interval_s):
            try:
                stages = [self.tracker.getStageInfo(i) for i in self.tracker.getActiveStageIds()]
            except Exception:  # noqa: BLE001 - the JVM is stopping; progress is best effort
                return
            parts = [f"stage {st.stageId}: {st.numCompletedTasks} of {st.numTasks} partition(s) "
                     f"({100 * st.numCompletedTasks // max(1, st.numTasks)} %)" for st in stages if st is not None]
            if parts:
                line = f"mqstore-spark {self.job}: " + "; ".join(parts)
                if line != last:
                    print(f"{line}, {time.monotonic() - self._started:.0f} s", file=self.stream, flush=True)
                    self.lines += 1
                    last = line


def failure_line(exc: BaseException, log_text: str = "") -> str:
    """One line naming the cause of a failed Spark job, instead of its stack traces: running out
    of memory (named in the error or in Spark's log: the JVM may exit before the error reaches
    Python), else the first line of the innermost Python or JVM error that says something."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a Py4J error asks the JVM for its text, and the JVM may be gone
        text = f"{type(exc).__name__} (the JVM is gone)"
    for marker in ("OutOfDirectMemoryError", "OutOfMemoryError", "Java heap space"):
        if marker in text or marker in log_text:
            return (f"Spark ran out of memory ({marker}) reading the store; lower --max-batch-bytes "
                    "(rows' bytes per Arrow batch) or give the driver more memory (spark.driver.memory)")
    for line in text.splitlines():
        line = line.strip()
        for prefix in ("mqstore.", "pyspark.errors.", "org.apache.spark.", "java."):
            if line.startswith(prefix) and ": " in line:
                return line.split(": ", 1)[1][:500]
    if "SparkContext was shut down" in text:
        return "Spark's JVM stopped while the job ran (its log says why)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:500]


def run_command(main: Callable[[], object], prog: str) -> int:
    """Run a script's main() (the Spark examples) with its failure as one line on stderr (exit
    status 1) instead of Py4J's stack traces; MQSTORE_DEBUG=1 in the environment shows them."""
    try:
        main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, the cause named
        if os.environ.get("MQSTORE_DEBUG"):
            raise
        print(f"{prog}: {failure_line(exc)} (MQSTORE_DEBUG=1 shows the whole error)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """The mqstore-spark command; returns its exit status (0 done, 1 the job failed, 2 usage
    or not a store)."""
    p = argparse.ArgumentParser(prog="mqstore-spark", description="Bulk jobs on a store directory, on Spark.")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--batch-rows", type=int, help="rows per Arrow batch (the batchRows read option)")
    p.add_argument("--max-batch-bytes", type=int,
                   help="record bytes per Arrow batch (the maxBatchBytes read option, default 16 MiB)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--progress-every", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between progress lines (default 1)")
    p.add_argument("--debug", action="store_true", help="on failure, print the whole error, not one line")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting, as spark-submit's --conf (repeatable)")
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
    options = {k: v for k, v in (("batchRows", args.batch_rows), ("maxBatchBytes", args.max_batch_bytes))
               if v is not None}
    from mqstore.spark import session

    topics = args.topics.split(",") if getattr(args, "topics", None) else None
    try:
        require_store(args.store)
    except MQStoreError as exc:
        print(f"mqstore-spark: {exc}", file=sys.stderr)
        return 2
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"mqstore-spark: --conf {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        conf[key.strip()] = value.strip()
    err = sys.stderr  # progress and the one-line outcome; Spark's own output goes to the log
    log_path = os.path.join(tempfile.gettempdir(), f"mqstore-spark-{os.getpid()}.log")
    with contextlib.nullcontext() if args.debug else _output_to(log_path):
        try:
            spark = session(args.master, **conf)
        except Exception as exc:  # noqa: BLE001 - the JVM did not start
            print(f"mqstore-spark: Spark did not start: {failure_line(exc)} (log: {log_path})", file=err)
            return 1
    spark.sparkContext.setLogLevel("ERROR")  # into the log (stderr with --debug)
    progress = JobProgress(spark, args.job, args.progress_every, stream=err)
    if not args.debug:
        sys.stderr = open(log_path, "a", encoding="utf-8")  # tracebacks of PySpark's threads, if the JVM dies
    failed = True
    try:
        with contextlib.nullcontext() if args.quiet else progress:
            if args.job == "export":
                n = export_parquet(spark, args.store, args.out, topics=topics, mode=args.mode, options=options)
                print(f"exported {n:,} message(s) from {args.store} to {args.out}")
            elif args.job == "stats":
                rows = [r.asDict() for r in queue_stats(spark, args.store, topics=topics, options=options).collect()]
                if args.json:
                    print(json.dumps(rows, default=str, indent=2))
                else:
                    for row in rows:
                        tags = ", ".join(f"{k}={v}" for k, v in sorted(row["tag_counts"].items()))
                        print(f"{row['topic']}/{row['queue_id']}: {row['messages']:,} messages, "
                              f"{row['bytes']:,} bytes, offsets {row['first_offset']}..{row['last_offset']}, "
                              f"{row['first_store_time']} .. {row['last_store_time']}, "
                              f"tags: {tags or '-'}, untagged {row['untagged']}")
            else:
                report = rebuild_queues(spark, args.store, out=args.out)
                print(json.dumps(asdict(report)))
        failed = False
    except MQStoreError as exc:
        print(f"mqstore-spark: {exc}", file=err)
        return 2
    except Exception as exc:  # noqa: BLE001 - Py4J / Spark errors: one line unless --debug
        if args.debug:
            raise
        traceback.print_exc(file=sys.stderr)  # into the log, with the JVM's own output
        sys.stderr.flush()
        time.sleep(0.5)  # a dying JVM may still be writing why
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            log_text = fh.read()
        print(f"mqstore-spark {args.job}: {failure_line(exc, log_text)} (the whole error: --debug; Spark's log: "
              f"{log_path})", file=err)
        return 1
    finally:
        try:
            spark.stop()
        except Exception:  # noqa: BLE001 - the JVM is gone already (it died of the failure)
            pass
        if sys.stderr is not err and not failed:
            sys.stderr.close()
            sys.stderr = err
        # after a failure sys.stderr stays on the log until the command exits: PySpark's threads
        # (its accumulator server's handler, when the JVM died under it) print their tracebacks
        # after spark.stop() has given up on them
        if not failed and os.path.exists(log_path):
            os.unlink(log_path)
    return 0


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """The JVM that starts meanwhile (and the Python workers it forks) write their stderr to
    path: Spark's start-up banner and warnings, and the stack traces of a failing job, stay
    out of the command's output (the command names the log when something failed)."""
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        sys.stderr.flush()
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
