"""The bulk jobs on a store directory: per-queue statistics, an export to Parquet and a rebuild
of every ConsumeQueue and IndexFile from the CommitLog (checked byte for byte against the
ones the dispatcher built). Fills the store first if it is empty.

    python examples/spark_jobs.py --store /tmp/mqstore-spark-jobs --messages 100000

The same jobs as a command: python -m mqstore.spark.jobs {export,stats,rebuild} --help
"""

from __future__ import annotations

import argparse
import sys
import filecmp
import os
import shutil
import tempfile
import time

from mqstore import Message, MessageStore
from mqstore.spark import session
from mqstore.spark.jobs import export_parquet, queue_stats, rebuild_queues


def same_files(a: str, b: str) -> bool:
    """The ConsumeQueue trees hold the same files with the same bytes."""
    files = sorted(os.path.relpath(os.path.join(d, f), a) for d, _, fs in os.walk(a) for f in fs)
    other = sorted(os.path.relpath(os.path.join(d, f), b) for d, _, fs in os.walk(b) for f in fs)
    return files == other and filecmp.cmpfiles(a, b, files, shallow=False)[0] == files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="/tmp/mqstore-spark-jobs", help="store directory (filled if new)")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.store, "commitlog")):
        with MessageStore(args.store, mapped_file_size_commit_log=16 << 20) as store:
            for start in range(0, args.messages, 100):
                store.put_messages([Message("Orders", b"order %d" % i, queue_id=(start // 100) % 4,
                                            tags=("created", "paid", "shipped")[i % 3], keys=[f"order-{i}"])
                                    for i in range(start, min(start + 100, args.messages))]).check()
        print(f"filled {args.store} with {args.messages:,} messages")
    spark = session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="mqstore-jobs-")
    try:
        for r in queue_stats(spark, args.store).collect():
            print(f"stats {r.topic}/{r.queue_id}: {r.messages:,} messages, {r.bytes:,} bytes, "
                  f"tags {dict(sorted(r.tag_counts.items()))}, {r.first_store_time} .. {r.last_store_time}")
        t0 = time.time()
        n = export_parquet(spark, args.store, os.path.join(work, "parquet"))
        print(f"export: {n:,} messages to {work}/parquet in {time.time() - t0:.1f} s")
        t0 = time.time()
        report = rebuild_queues(spark, args.store, out=os.path.join(work, "rebuilt"))
        print(f"rebuild: {report.units:,} ConsumeQueue units in {report.queues} queue(s) and {report.index_keys:,} "
              f"index keys from {report.commitlog_files} CommitLog file(s) in {time.time() - t0:.1f} s; "
              f"ConsumeQueues byte-identical to the store's: "
              f"{same_files(os.path.join(args.store, 'consumequeue'), os.path.join(work, 'rebuilt', 'consumequeue'))}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from mqstore.spark.jobs import run_command

    sys.exit(run_command(main, "spark_jobs.py"))
