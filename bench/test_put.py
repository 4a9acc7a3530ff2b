"""mqstore put-path benchmarks. Every round writes a fixed number of messages; the timed call
is the loop of puts only (Message objects and batch lists are built beforehand, results are
checked afterwards from the store's counters, never inside the timed loop).

Each benchmark gets a fresh store on disk. The async ones first write untimed for
PREWRITE_S (longer than the 500 ms flush period), then run their rounds back to back, so
CommitLog rolls, the async flusher and the allocate service work during the measurement as
they would in use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bench._common import (
    GROUP_100B,
    GROUP_1KIB,
    GROUP_DURABLE,
    GROUP_ROLL,
    MSGS,
    ROUNDS_1KIB,
    ROUNDS_FAST,
    ROUNDS_ROLL,
    ROUNDS_SYNC,
    SYNC_MSGS,
    WARMUP_ROUNDS,
    StoreRounds,
    prewrite,
    record_rate,
    wait_allocator_idle,
)

MiB = 1 << 20
LOCK_KINDS = {"mutex": True, "spin": False}  # use_reentrant_lock_when_put_message
ASYNC = {"mapped_file_size_commit_log": 64 * MiB, "flush_disk_type": "ASYNC_FLUSH"}
#: the async flusher never runs within a benchmark (60 s period, and the thorough flush too)
FLUSHER_IDLE = {"flush_interval_commit_log": 60_000, "flush_commit_log_thorough_interval": 60_000}


def _single_puts(store: Any, msgs: list) -> Callable[[], None]:
    def put_all() -> None:
        put = store.put_message
        for m in msgs:
            put(m)
    return put_all


def _measure(benchmark: Any, store: Any, target: Callable[[], None], *, rounds: int, n_msgs: int,
             prewrite_first: bool = True, before_round: Callable[[], None] | None = None,
             reset: tuple[str, ...] = ()) -> StoreRounds:
    counters = StoreRounds(store, warmup=0 if benchmark.disabled else WARMUP_ROUNDS, reset=reset)

    def setup() -> None:
        if before_round is not None:
            before_round()
        counters.setup()

    if prewrite_first and not benchmark.disabled:
        prewrite(target, setup=before_round)
    benchmark.pedantic(target, setup=setup, teardown=counters.teardown,
                       rounds=rounds, warmup_rounds=WARMUP_ROUNDS, iterations=1)
    if benchmark.disabled:  # --benchmark-disable: one plain call, pedantic runs no teardown
        counters.teardown()
    counters.check_all_put(n_msgs)
    return counters


# -- 1. put_message, async flush --------------------------------------------------------------
@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("lock", list(LOCK_KINDS))
def test_put_message_100b(benchmark, open_store, messages, lock):
    """One put_message per message, 100 B bodies, ASYNC_FLUSH with the default timed flusher
    (msync every 500 ms), 64 MiB files, no warm-up."""
    _put_message(benchmark, open_store, messages, lock, "100B", ROUNDS_FAST)


@pytest.mark.benchmark(group=GROUP_1KIB)
@pytest.mark.parametrize("lock", list(LOCK_KINDS))
def test_put_message_1kib(benchmark, open_store, messages, lock):
    """As test_put_message_100b with 1 KiB bodies (~110 MB per round)."""
    _put_message(benchmark, open_store, messages, lock, "1KiB", ROUNDS_1KIB)


def _put_message(benchmark, open_store, messages, lock, size, rounds):
    store = open_store(**ASYNC, use_reentrant_lock_when_put_message=LOCK_KINDS[lock])
    assert store.ctl.lock_kind == lock
    c = _measure(benchmark, store, _single_puts(store, messages(size)), rounds=rounds, n_msgs=MSGS)
    record_rate(benchmark, f"put_message/{size}/{lock}", MSGS, lock_kind=lock,
                rolls=c.total("rolls"), flushes=c.total("flush_count"),
                flushed_MB=round(c.total("flush_bytes") / 1e6, 1))


@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("lock", list(LOCK_KINDS))
def test_put_message_100b_flusher_idle(benchmark, open_store, messages, lock):
    """Reference for the put path alone: as test_put_message_100b, but the async flusher does
    not run during the benchmark, like the lmdb baseline (sync=False leaves all writing back
    to the OS). Shows what the flusher's msync costs the writer on this machine. Not a
    configuration to deploy (a crash would lose up to 60 s)."""
    store = open_store(**ASYNC, **FLUSHER_IDLE, use_reentrant_lock_when_put_message=LOCK_KINDS[lock])
    c = _measure(benchmark, store, _single_puts(store, messages("100B")), rounds=ROUNDS_FAST, n_msgs=MSGS)
    flushes = c.total("flush_count")
    assert flushes == 0, f"the flusher ran {flushes} times"
    record_rate(benchmark, f"put_message/100B/{lock}/flusher-idle", MSGS, lock_kind=lock, flushes=flushes,
                rolls=c.total("rolls"))


@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("lock", list(LOCK_KINDS))
def test_put_message_100b_transient_pool(benchmark, open_store, messages, lock):
    """As test_put_message_100b with the transient store pool on (spec §7): puts append into a
    shared-memory write buffer (5 x 64 MiB on /dev/shm), the commit service (a thread, woken by
    every put, 4 pages least) copies into the mapped file, the flusher msyncs what was
    committed. The pair of this and test_put_message_100b is the pool on/off comparison."""
    store = open_store(**ASYNC, transient_store_pool_enable=True,
                       use_reentrant_lock_when_put_message=LOCK_KINDS[lock])
    c = _measure(benchmark, store, _single_puts(store, messages("100B")), rounds=ROUNDS_FAST, n_msgs=MSGS)
    record_rate(benchmark, f"put_message/100B/{lock}/transient-pool", MSGS, lock_kind=lock,
                rolls=c.total("rolls"), commits=c.total("commit_count"), flushes=c.total("flush_count"),
                committed_MB=round(c.total("commit_bytes") / 1e6, 1))


# -- 2. put_messages batches, async flush -----------------------------------------------------
@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("batch", [100, 1000])
def test_put_messages(benchmark, open_store, messages, batch):
    """put_messages with lists of `batch` Messages of one topic and queue, 100 B bodies,
    ASYNC_FLUSH with the default flusher, 64 MiB files, mutex lock (the default)."""
    store = open_store(**ASYNC)
    msgs = messages("100B")
    batches = [msgs[i:i + batch] for i in range(0, MSGS, batch)]

    def put_all():
        put = store.put_messages
        for b in batches:
            put(b)

    c = _measure(benchmark, store, put_all, rounds=ROUNDS_FAST, n_msgs=MSGS)
    record_rate(benchmark, f"put_messages/batch{batch}", MSGS, batch=batch, rolls=c.total("rolls"),
                flushes=c.total("flush_count"))


@pytest.mark.benchmark(group=GROUP_100B)
def test_put_messages_preencoded_batch(benchmark, open_store, messages):
    """put_messages with MessageBatch objects whose body a client encoded beforehand (the
    RocketMQ batch body, spec §1.10: what SEND_BATCH_MESSAGE carries), 1,000 messages of 100 B
    a batch, ASYNC_FLUSH, 64 MiB files. extra_info holds the memory-copy floor measured in the
    same test: the same batch bodies copied into a preallocated buffer (GB/s), and the put's
    rate in the same unit."""
    import time

    from mqstore import MessageBatch

    store = open_store(**ASYNC)
    msgs = messages("100B")
    batches = [MessageBatch.from_messages(msgs[i:i + 1000]) for i in range(0, MSGS, 1000)]
    body_bytes = sum(len(b.body) for b in batches)

    def put_all():
        put = store.put_messages
        for b in batches:
            put(b)

    c = _measure(benchmark, store, put_all, rounds=ROUNDS_FAST, n_msgs=MSGS)
    buf = bytearray(body_bytes)
    view = memoryview(buf)
    copies = []
    for _ in range(ROUNDS_FAST):
        t0 = time.perf_counter()
        pos = 0
        for b in batches:
            n = len(b.body)
            view[pos:pos + n] = b.body
            pos += n
        copies.append(time.perf_counter() - t0)
    copy_s = sorted(copies)[len(copies) // 2]
    extra: dict[str, Any] = {"batch_body_bytes": body_bytes, "memcpy_gb_per_s": round(body_bytes / copy_s / 1e9, 2)}
    if not benchmark.disabled:
        put_s = benchmark.stats.stats.median
        extra["put_gb_per_s_of_batch_bodies"] = round(body_bytes / put_s / 1e9, 3)
        extra["put_time_over_memcpy"] = round(put_s / copy_s, 1)
    record_rate(benchmark, "put_messages/preencoded-batch1000", MSGS, rolls=c.total("rolls"), **extra)


# -- 3. sync flush, one message per flush -----------------------------------------------------
@pytest.mark.benchmark(group=GROUP_DURABLE)
def test_sync_flush_one_per_flush(benchmark, open_store, messages):
    """SYNC_FLUSH: every put_message waits for its group commit (msync of the range written)
    before the next one is sent, so each message costs one flush. 100 B bodies, 64 MiB
    files, defaults otherwise (group_commit_interval_ms=10, puts wake the service)."""
    store = open_store(mapped_file_size_commit_log=64 * MiB, flush_disk_type="SYNC_FLUSH")
    c = _measure(benchmark, store, _single_puts(store, messages("100B")[:SYNC_MSGS]), rounds=ROUNDS_SYNC,
                 n_msgs=SYNC_MSGS, prewrite_first=False)
    n = SYNC_MSGS * len(c.measured())
    flushes = c.total("flush_count")
    waits = c.total("group_commit_waits")
    assert waits == n, f"{waits} group commit waits for {n} puts"
    record_rate(benchmark, "sync_flush/100B", SYNC_MSGS, flushes=flushes, flushes_per_msg=round(flushes / n, 3),
                msync_us_mean=round(c.total("flush_ns_total") / max(flushes, 1) / 1e3, 1),
                put_wait_us_mean=round(c.total("flush_wait_ns_total") / n / 1e3, 1))
    if not benchmark.disabled:
        benchmark.extra_info["put_us_median"] = round(benchmark.stats.stats.median / SYNC_MSGS * 1e6, 1)


# -- 4. roll stall with and without warm-up ---------------------------------------------------
@pytest.mark.benchmark(group=GROUP_ROLL)
@pytest.mark.parametrize("mode", ["sustained", "allocator-idle"])
@pytest.mark.parametrize("warm", [False, True], ids=["no-warmup", "warmup"])
def test_roll_stall(benchmark, open_store, messages, warm, mode):
    """put_message, 100 B bodies, ASYNC_FLUSH, 16 MiB CommitLog files (~88 k records each),
    so every 100 k-message round rolls at least once; warm_maped_file_enable off / on.

    sustained: rounds back to back; the allocate service has to create (and warm) the next
    file while puts run at full speed. allocator-idle: before each round (untimed) wait
    until the allocate service has finished every file it was asked for, i.e. the put rate
    is one the allocator can keep up with.

    extra_info: roll_wait_ms_max = longest wait of a put for the allocate service to hand
    over the next file (store.stats() roll_wait_ns_max, zeroed before each round so file
    #0's creation is not counted); lock_hold_ms_max = longest put-lock hold (page faults
    on cold pages land here); rolls = files filled during the measured rounds.
    """
    file_size = 16 * MiB
    store = open_store(mapped_file_size_commit_log=file_size, flush_disk_type="ASYNC_FLUSH",
                       warm_maped_file_enable=warm)
    msgs = messages("100B")
    store.put_message(msgs[0]).check()  # file #0 is created (and warmed) before anything is timed
    wait_allocator_idle(store)

    def allocator_idle() -> None:
        wait_allocator_idle(store)

    c = _measure(benchmark, store, _single_puts(store, msgs), rounds=ROUNDS_ROLL, n_msgs=MSGS,
                 before_round=allocator_idle if mode == "allocator-idle" else None, reset=("roll_wait_ns_max", "lock_hold_ns_max"))
    measured = c.measured()
    per_round_max = sorted(r["roll_wait_ns_max"] for r in measured)
    rolls = c.total("rolls")
    roll_waits = c.total("roll_waits")
    alloc = c.total("alloc_count")
    extra: dict[str, Any] = dict(
        warm_maped_file_enable=warm, mode=mode, file_mib=file_size // MiB, rolls=rolls, roll_waits=roll_waits,
        roll_wait_ms_max=round(per_round_max[-1] / 1e6, 3),
        roll_wait_ms_median_round_max=round(per_round_max[len(per_round_max) // 2] / 1e6, 3),
        roll_wait_ms_mean=round(c.total("roll_wait_ns_total") / max(roll_waits, 1) / 1e6, 3),
        lock_hold_ms_max=round(max(r["lock_hold_ns_max"] for r in measured) / 1e6, 3),
        lock_hold_ms_median_round_max=round(sorted(r["lock_hold_ns_max"] for r in measured)[len(measured) // 2] / 1e6,
                                            3),
        alloc_ms_mean=round(c.total("alloc_ns_total") / max(alloc, 1) / 1e6, 1),
        flushes=c.total("flush_count"),
    )
    if warm:
        last_warm = getattr(store.commitlog.allocator, "last_warm", None) or {}
        extra["warm_ms_mean"] = round(c.total("warm_ns_total") / max(alloc, 1) / 1e6, 1)
        extra["mlock_ok"] = last_warm.get("mlock_ok")
    record_rate(benchmark, f"roll/{mode}/{'warmup' if warm else 'no-warmup'}", MSGS, **extra)
    if not benchmark.disabled:
        record_bytes = measured[0]["put_bytes"] / MSGS
        benchmark.extra_info["put_MB_per_s_median"] = round(MSGS * record_bytes / benchmark.stats.stats.median / 1e6, 1)
        if warm and extra["warm_ms_mean"]:
            benchmark.extra_info["warm_MB_per_s"] = round(file_size / 1e6 / (extra["warm_ms_mean"] / 1e3), 1)
