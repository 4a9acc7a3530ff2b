"""Read-path benchmarks (issue 3): dispatch, getMessage, lookups, time search; lmdb's
sequential read of the same bodies as the baseline; query by key; recovery speed.

One store of READ_MSGS messages of 100 B in one queue is written once per module (untimed)
and dispatched; each benchmark then reads it. ``get_message/batch32-*`` consumes the whole
queue with getMessage batches of 32 and per message takes: nothing (``results``: what a
broker forwarding record slices does), a MessageView (``views``), the record as a zero-copy
memoryview (``buffers``), or the view's body memoryview (``bodies``). lmdb reads the same
bodies with a cursor (``iternext``, values as bytes, and with ``buffers=True`` as zero-copy
views).
"""

from __future__ import annotations

import os
import random
import statistics
import struct
import tempfile

import pytest

from bench._common import drain_queue, one_queue_store, record_rate
from mqstore import Message, MessageStore

READ_MSGS = 200_000
GROUP_READ = "reads, 200k x 100 B in one queue"
GROUP_DISPATCH = "dispatch, 200k x 100 B"
GROUP_LOOKUP = "lookups"
TOPIC = "ReadTopic"


@pytest.fixture(scope="module")
def read_store(bench_root, bodies):
    store = one_queue_store(tempfile.mkdtemp(prefix="read-store-", dir=bench_root), TOPIC, bodies["100B"], READ_MSGS)
    yield store
    store.shutdown()


def consume_queue(get, take) -> int:
    """Read the whole queue with getMessage batches of 32; take(result) -> messages handled."""
    return drain_queue(get, TOPIC, take)


def take_views(res) -> int:
    n = 0
    for _m in res:  # one MessageView per message (fields decoded on access)
        n += 1
    return n


def take_buffers(res) -> int:
    n = 0
    for _b in res.buffers():  # one zero-copy memoryview of the record per message
        n += 1
    return n


def take_bodies(res) -> int:
    n = 0
    for m in res:
        _body = m.body  # a zero-copy memoryview of the body
        n += 1
    return n


@pytest.mark.benchmark(group=GROUP_READ)
@pytest.mark.parametrize("take", [len, take_views, take_buffers, take_bodies], ids=["results", "views", "buffers", "bodies"])
def test_get_message_batch32(benchmark, read_store, take):
    get = read_store.get_message
    name = {len: "results"}.get(take, take.__name__.removeprefix("take_"))
    assert benchmark.pedantic(consume_queue, args=(get, take), rounds=10, warmup_rounds=1) == READ_MSGS
    record_rate(benchmark, f"get_message/batch32-{name}", READ_MSGS)


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


# -- query by key ------------------------------------------------------------------------------------

KEYED_MSGS = 100_000


@pytest.fixture(scope="module")
def keyed_store(bench_root, bodies):
    """KEYED_MSGS messages of 100 B, each with its own key, indexed (default IndexFile size)."""
    path = tempfile.mkdtemp(prefix="keyed-store-", dir=bench_root)
    store = MessageStore(path, mapped_file_size_commit_log=64 << 20)
    body = bodies["100B"]
    for i in range(KEYED_MSGS):
        store.put_message(Message(TOPIC, body, keys=[f"order-{i}"])).check()
    assert store.wait_dispatched(timeout_ms=60_000)
    yield store
    store.shutdown()


@pytest.mark.benchmark(group=GROUP_LOOKUP)
def test_query_message_by_key(benchmark, keyed_store):
    rng = random.Random(11)
    keys = [f"order-{rng.randrange(KEYED_MSGS)}" for _ in range(2_000)]
    query = keyed_store.query_message

    def run():
        found = 0
        for key in keys:
            found += len(query(TOPIC, key, 32).messages)
        return found

    assert benchmark.pedantic(run, rounds=10, warmup_rounds=1) == len(keys)
    record_rate(benchmark, "query_message/by-key", len(keys))
    benchmark.extra_info["us_per_query_median"] = round(benchmark.stats.stats.median / len(keys) * 1e6, 3)


# -- recovery speed ------------------------------------------------------------------------------------

GROUP_RECOVERY = "recovery"
RECOVERY_LOG_BYTES = {"100B": 64 << 20, "1KiB": 256 << 20}


@pytest.fixture(scope="module", params=["100B", "1KiB"])
def crashed_store(request, bench_root, bodies):
    """A store of RECOVERY_LOG_BYTES[size] of records, shut down; each round recreates the
    state of a crash with no usable checkpoint (abort file present, checkpoint removed), so
    abnormal recovery CRC-checks the whole CommitLog and re-dispatches every record."""
    size = request.param
    path = tempfile.mkdtemp(prefix=f"recovery-{size}-", dir=bench_root)
    cfg = {"mapped_file_size_commit_log": 64 << 20, "message_index_enable": False, "check_crc_on_recover": True}
    store = MessageStore(path, **cfg)
    body = bodies[size]
    while store.get_max_phy_offset() < RECOVERY_LOG_BYTES[size]:
        store.put_messages([Message(TOPIC, body) for _ in range(64)]).check()
    store.shutdown()
    return size, path, cfg


@pytest.mark.benchmark(group=GROUP_RECOVERY)
def test_abnormal_recovery_full_scan(benchmark, crashed_store):
    size, path, cfg = crashed_store
    reports = []

    def crash():
        open(os.path.join(path, "abort"), "wb").close()
        os.unlink(os.path.join(path, "checkpoint"))

    def reopen():
        store = MessageStore(path, **cfg)
        reports.append(store.recovery)
        store.shutdown()

    benchmark.pedantic(reopen, setup=crash, rounds=5, warmup_rounds=1)
    report = reports[-1]
    assert report.mode == "abnormal" and report.first_file_scanned.endswith("0" * 20)
    assert report.redispatched_records == report.records and report.dropped_bytes == 0
    gib = report.bytes_scanned / (1 << 30)
    recover_ms = statistics.median(r.elapsed_ms for r in reports[1:])  # warm-up round left out
    record_rate(benchmark, f"recovery/abnormal-full-{size}", report.records)
    benchmark.extra_info.update(
        bytes_scanned=report.bytes_scanned, records=report.records,
        open_gib_per_s_median=round(gib / benchmark.stats.stats.median, 3),
        recover_ms_median=round(recover_ms, 1), recover_gib_per_s_median=round(gib / (recover_ms / 1000), 3))


# -- dispatch lag under the fastest put rate ------------------------------------------------------------

LAG_BATCHES = 2_000


@pytest.mark.benchmark(group=GROUP_DISPATCH)
def test_dispatch_lag_while_putting(benchmark, bench_root, bodies):
    """put_messages batches of 64 × 100 B (one queue per batch, four queues) as fast as one
    thread can, while the reput service
    (a thread of the same process) follows; after every batch the lag (store time of the newest
    written record minus that of the newest dispatched one, ms) is sampled."""
    path = tempfile.mkdtemp(prefix="lag-store-", dir=bench_root)
    store = MessageStore(path, message_index_enable=False, mapped_file_size_commit_log=256 << 20)
    batches = [[Message(TOPIC, bodies["100B"], queue_id=q)] * 64 for q in range(4)]
    lags: list[int] = []

    def run():
        put, sample = store.put_messages, lags.append
        for i in range(LAG_BATCHES):
            put(batches[i % 4]).check()
            sample(store.dispatch_lag_ms)

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    assert store.wait_dispatched(timeout_ms=60_000)
    store.shutdown()
    lags.sort()
    record_rate(benchmark, "put_messages+dispatch", LAG_BATCHES * 64)
    benchmark.extra_info.update(lag_ms_p50=lags[len(lags) // 2], lag_ms_p99=lags[len(lags) * 99 // 100],
                                lag_ms_max=lags[-1], samples=len(lags))
