"""Run a node on a store directory (created or reopened): this process owns the store and
supervises an allocator, a flusher, a dispatcher and a cleaner process. Put a stream of
messages through it, consume them back (here, and from a second process attached with
MessageStore.open), look some up by key and by time, and print what was done.

    python examples/demo.py --store /tmp/mqstore-demo --messages 200000
    python examples/demo.py --threads ...   # the same with the services as threads
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from mqstore import GetMessageStatus, Message, MessageStore
from mqstore.tools.checker import check_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="/tmp/mqstore-demo", help="store directory (created if missing)")
    ap.add_argument("--messages", type=int, default=200_000, help="messages to put one by one")
    ap.add_argument("--batch", type=int, default=100, help="batch size for the batch phase")
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--file-size", type=int, default=64 << 20, help="CommitLog file size in bytes")
    ap.add_argument("--sync", action="store_true", help="SYNC_FLUSH (group commit) instead of ASYNC_FLUSH")
    ap.add_argument("--threads", action="store_true", help="run the services as threads, not processes")
    args = ap.parse_args()

    body = b"m" * args.body_size
    with MessageStore(args.store, mapped_file_size_commit_log=args.file_size,
                      flush_disk_type="SYNC_FLUSH" if args.sync else "ASYNC_FLUSH",
                      service_mode="threads" if args.threads else "processes") as store:
        print(f"opened {store.root}: {store.recovery.summary()}")
        if store.supervisor is not None:
            print(f"node: owner pid {os.getpid()}, " +
                  ", ".join(f"{kind} pid {pid}" for kind, pid in store.supervisor.pids().items()))
        start_offset = store.max_phy_offset
        first_offsets = [store.next_queue_offset("DemoTopic", q) for q in range(args.queues)]

        t0 = time.perf_counter()
        for i in range(args.messages):
            tags = "TagA" if i % 4 else "TagB"
            keys = [f"order-{i}"] if i % 1000 == 0 else None
            store.put_message(Message("DemoTopic", body, queue_id=i % args.queues, tags=tags, keys=keys)).check()
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
        fs = store.config.mapped_file_size_commit_log
        files = (store.max_phy_offset - 1) // fs - store.min_phy_offset // fs + 1
        print(f"stored {stored:,} bytes; CommitLog now ends at {store.max_phy_offset:,} in "
              f"{files} file(s) of {fs >> 20} MiB; {stats['rolls']} rolls, max roll wait "
              f"{stats['roll_wait_ns_max'] / 1e6:.2f} ms; mean lock hold "
              f"{stats['lock_hold_ns_total'] / max(stats['lock_acquires'], 1):.0f} ns")
        for topic in ("DemoTopic", "DemoBatch"):
            offsets = ", ".join(f"q{q}={store.next_queue_offset(topic, q)}" for q in range(args.queues))
            print(f"  {topic}: next queue offsets {offsets}")
        consume(store, args.queues, first_offsets)
        consume_from_another_process(store, args.queues, first_offsets)
        look_up(store, args.messages)
    report = check_store(args.store).raise_if_failed()
    print(f"verified: {report.records:,} records in {report.files} file(s), every CRC and queue offset in order")


def consume(store: MessageStore, queues: int, first_offsets: list[int]) -> None:
    """Read back what this run put to DemoTopic, every queue with getMessage batches of 32:
    once everything, once only TagB (filtered by tags code in the ConsumeQueue)."""
    store.wait_dispatched()
    for tags in ("*", "TagB"):
        t0 = time.perf_counter()
        count = size = 0
        for q in range(queues):
            offset = first_offsets[q]
            while True:
                got = store.get_message("demo-group", "DemoTopic", q, offset, 32, tags=tags)
                for m in got:  # zero-copy views on the mapped CommitLog
                    count += 1
                    size += len(m.body)
                if got.status is not GetMessageStatus.FOUND and got.next_begin_offset == offset:
                    break  # OFFSET_OVERFLOW_ONE: the queue is read to its end
                offset = got.next_begin_offset
        took = time.perf_counter() - t0
        print(f"get_message : {count:>9,} messages ({size:,} body bytes) with tags {tags!r} in {took:6.2f} s "
              f"= {count / took:>12,.0f} msg/s")


ATTACHED_READER = """
import sys, time
from mqstore import MessageStore
store = MessageStore.open(sys.argv[1])
first = [int(x) for x in sys.argv[2].split(",")]
t0, count = time.perf_counter(), 0
for q, offset in enumerate(first):
    while True:
        got = store.get_message("other-group", "DemoTopic", q, offset, 32)
        count += len(got)
        if got.next_begin_offset == offset:
            break
        offset = got.next_begin_offset
print(type(store).__name__, count, time.perf_counter() - t0)
store.close()
"""


def consume_from_another_process(store: MessageStore, queues: int, first_offsets: list[int]) -> None:
    """A second process attaches to the running store (MessageStore.open) and reads the same
    messages zero-copy from its own mappings."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", ATTACHED_READER, store.root, ",".join(map(str, first_offsets))],
                          capture_output=True, text=True, env=env, check=True)
    kind, count, took = done.stdout.split()
    print(f"another process ({kind}) read {int(count):,} DemoTopic messages in {float(took):6.2f} s")


def look_up(store: MessageStore, produced: int) -> None:
    """A message by key (IndexFile), the queue offset of a point in time, a message by offset."""
    key = f"order-{(produced - 1) // 1000 * 1000}"
    found = store.query_message("DemoTopic", key, 4).messages
    for m in found:
        print(f"query_message({key!r}): queue {m.queue_id} offset {m.queue_offset}, physical offset "
              f"{m.physical_offset}, keys {m.keys}, stored at {m.store_timestamp}")
    last = store.get_max_offset_in_queue("DemoTopic", 0) - 1
    if last >= 0:
        middle = last // 2
        ts = store.get_message_store_timestamp("DemoTopic", 0, middle)
        lookup = store.offset_in_queue_by_time("DemoTopic", 0, ts)
        view = store.look_message_by_queue_offset("DemoTopic", 0, lookup.offset)
        print(f"time lookup : store time {ts} -> DemoTopic/0 offset {lookup.offset} "
              f"({lookup.cq_pages} ConsumeQueue pages, {lookup.probes} probes); the message there has "
              f"tags {view.tags if view else None!r}")


if __name__ == "__main__":
    main()
