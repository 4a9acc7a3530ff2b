"""Create (or reopen) a store, put a stream of messages through it, print what was stored.

    python examples/produce_demo.py --store /tmp/mqstore-demo --messages 200000
"""

from __future__ import annotations

import argparse
import time

from mqstore import Message, MessageStore
from mqstore.checker import check_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="/tmp/mqstore-demo", help="store directory (created if missing)")
    ap.add_argument("--messages", type=int, default=200_000, help="messages to put one by one")
    ap.add_argument("--batch", type=int, default=100, help="batch size for the batch phase")
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--file-size", type=int, default=64 << 20, help="CommitLog file size in bytes")
    ap.add_argument("--sync", action="store_true", help="SYNC_FLUSH (group commit) instead of ASYNC_FLUSH")
    args = ap.parse_args()

    body = b"m" * args.body_size
    with MessageStore(args.store, mapped_file_size_commit_log=args.file_size,
                      flush_disk_type="SYNC_FLUSH" if args.sync else "ASYNC_FLUSH") as store:
        print(f"opened {store.root}: {store.recovery.summary()}")
        start_offset = store.max_phy_offset

        t0 = time.perf_counter()
        for i in range(args.messages):
            store.put_message(Message("DemoTopic", body, queue_id=i % args.queues, tags="TagA")).check()
        single_s = time.perf_counter() - t0

        batches = args.messages // args.batch
        t0 = time.perf_counter()
        for i in range(batches):
            store.put_messages([Message("DemoBatch", body, queue_id=i % args.queues)] * args.batch).check()
        batch_s = time.perf_counter() - t0

        stats = store.stats()
        stored = store.max_phy_offset - start_offset
        print(f"put_message : {args.messages:>9,} messages of {args.body_size} B in {single_s:6.2f} s "
              f"= {args.messages / single_s:>12,.0f} msg/s")
        print(f"put_messages: {batches * args.batch:>9,} messages in batches of {args.batch} in {batch_s:6.2f} s "
              f"= {batches * args.batch / batch_s:>12,.0f} msg/s")
        print(f"stored {stored:,} bytes; CommitLog now ends at {store.max_phy_offset:,} in "
              f"{len(store.commitlog.queue)} file(s); {stats['rolls']} rolls, max roll wait "
              f"{stats['roll_wait_ns_max'] / 1e6:.2f} ms; mean lock hold "
              f"{stats['lock_hold_ns_total'] / max(stats['lock_acquires'], 1):.0f} ns")
        for topic in ("DemoTopic", "DemoBatch"):
            offsets = ", ".join(f"q{q}={store.next_queue_offset(topic, q)}" for q in range(args.queues))
            print(f"  {topic}: next queue offsets {offsets}")
    report = check_store(args.store).raise_if_failed()
    print(f"verified: {report.records:,} records in {report.files} file(s), every CRC and queue offset in order")


if __name__ == "__main__":
    main()
