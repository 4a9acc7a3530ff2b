"""Read-path benchmarks (issue 3): dispatch, getMessage, lookups, time search; lmdb's
sequential read of the same bodies as the baseline.

One store of READ_MSGS messages of 100 B in one queue is written once per module (untimed)
and dispatched; each benchmark then reads it. ``get_message/batch32`` consumes the whole queue
with getMessage batches of 32 and takes each message's record buffer (a zero-copy
memoryview); ``get_message/batch32-results`` only asks for the batches (what a broker
forwarding record slices does). lmdb reads the same bodies with a cursor (``iternext``,
values as bytes, and with ``buffers=True`` as zero-copy views).
"""

from __future__ import annotations

import random
import struct

import pytest

from bench._common import record_rate
from mqstore import Message, MessageStore

READ_MSGS = 200_000
GROUP_READ = "reads, 200k x 100 B in one queue"
GROUP_DISPATCH = "dispatch, 200k x 100 B"
GROUP_LOOKUP = "lookups"
TOPIC = "ReadTopic"


@pytest.fixture(scope="module")
def read_store(bench_root, bodies):
    import tempfile

    path = tempfile.mkdtemp(prefix="read-store-", dir=bench_root)
    store = MessageStore(path, message_index_enable=False, mapped_file_size_commit_log=64 << 20)
    body = bodies["100B"]
    msgs = [Message(TOPIC, body) for _ in range(READ_MSGS)]
    for m in msgs:
        store.put_message(m).check()
    assert store.wait_dispatched(timeout_ms=60_000)
    yield store
    store.shutdown()


@pytest.mark.benchmark(group=GROUP_READ)
def test_get_message_batch32(benchmark, read_store):
    get = read_store.get_message

    def consume():
        offset, n = 0, 0
        while True:
            res = get("bench", TOPIC, 0, offset, 32)
            if not len(res):
                return n
            for buf in res.buffers():
                n += 1
            offset = res.next_begin_offset

    assert benchmark.pedantic(consume, rounds=10, warmup_rounds=1) == READ_MSGS
    record_rate(benchmark, "get_message/batch32", READ_MSGS)


@pytest.mark.benchmark(group=GROUP_READ)
def test_get_message_batch32_results(benchmark, read_store):
    get = read_store.get_message

    def consume():
        offset, n = 0, 0
        while True:
            res = get("bench", TOPIC, 0, offset, 32)
            k = len(res)
            if not k:
                return n
            n += k
            offset = res.next_begin_offset

    assert benchmark.pedantic(consume, rounds=10, warmup_rounds=1) == READ_MSGS
    record_rate(benchmark, "get_message/batch32-results", READ_MSGS)


@pytest.mark.benchmark(group=GROUP_READ)
@pytest.mark.parametrize("buffers", [False, True], ids=["bytes", "buffers"])
def test_lmdb_sequential_read(benchmark, work_dir, bodies, buffers):
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(work_dir / "lmdb"), map_size=4 << 30, sync=False)
    pack = struct.Struct(">Q").pack
    body = bodies["100B"]
    for start in range(0, READ_MSGS, 1000):
        with env.begin(write=True) as txn:
            for i in range(start, start + 1000):
                txn.put(pack(i), body, append=True)

    def consume():
        n = 0
        with env.begin(buffers=buffers) as txn:
            for _key, _value in txn.cursor().iternext():
                n += 1
        return n

    assert benchmark.pedantic(consume, rounds=10, warmup_rounds=1) == READ_MSGS
    record_rate(benchmark, f"lmdb/cursor-{'buffers' if buffers else 'bytes'}", READ_MSGS)
    env.close()


@pytest.mark.benchmark(group=GROUP_DISPATCH)
def test_dispatch_rate(benchmark, read_store):
    store = read_store
    store.reput.shutdown()  # the benchmark drives dispatch itself

    def setup():
        store.consume_queues.destroy_all()
        store.dispatcher.reset(0)

    def run():
        return store.dispatcher.dispatch_available()

    assert benchmark.pedantic(run, setup=setup, rounds=8, warmup_rounds=1) == READ_MSGS
    record_rate(benchmark, "dispatch/serial", READ_MSGS)
    assert store.get_max_offset_in_queue(TOPIC, 0) == READ_MSGS


@pytest.mark.benchmark(group=GROUP_LOOKUP)
def test_look_message_by_queue_offset(benchmark, read_store):
    rng = random.Random(7)
    offsets = [rng.randrange(READ_MSGS) for _ in range(10_000)]
    look = read_store.reader.look_message_by_queue_offset

    def run():
        for q in offsets:
            look(TOPIC, 0, q)

    benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    record_rate(benchmark, "look_message_by_queue_offset", len(offsets))
    benchmark.extra_info["us_per_lookup_median"] = round(benchmark.stats.stats.median / len(offsets) * 1e6, 3)


@pytest.mark.benchmark(group=GROUP_LOOKUP)
@pytest.mark.parametrize("where", ["tail", "cold"])
@pytest.mark.parametrize("warm", [8192, 0], ids=["hotcold", "plain"])
def test_time_lookup(benchmark, read_store, where, warm):
    store = read_store
    q = READ_MSGS - 5 if where == "tail" else 1000
    ts = store.get_message_store_timestamp(TOPIC, 0, q)
    lookup = store.offset_in_queue_by_time

    def run():
        for _ in range(1000):
            lookup(TOPIC, 0, ts, warm)

    benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    found = lookup(TOPIC, 0, ts, warm)
    record_rate(benchmark, f"time-lookup/{where}/{'hotcold' if warm else 'plain'}", 1000)
    benchmark.extra_info.update(cq_pages=found.cq_pages, commitlog_pages=found.commitlog_pages, probes=found.probes,
                                us_per_lookup_median=round(benchmark.stats.stats.median / 1000 * 1e6, 3))
