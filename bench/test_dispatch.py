"""Dispatch benchmarks: serial reput (spec §10.1) against the concurrent one (spec §10.2),
with and without the arrival notification (spec §12), over the same logs.

Each log is written once per module (untimed) across 8 topics x 4 queues, tags on every
message: 200k x 100 B, the same with a UNIQ_KEY per message and the index on (what every
RocketMQ producer sends), and 200k x 1 KiB. A round re-dispatches the whole log into empty
ConsumeQueues. Before each round (untimed) the queues and the index are destroyed and every
queue's first file is created and its first page touched: creating a 6 MB ConsumeQueue file
and the page-cache readahead of its first write fault cost ~1.5 ms each here, which a running
broker pays once per 300k units of a queue, not once per 6k as a from-scratch round would.
The rest (page faults of the units, index file pages) is measured.

"notify" is long_polling_enable: a broadcast on the "dispatched" channel after every applied
batch (serial: every kernel call, at most 16 MiB), or only once caught up. Its cost is a futex
wake; with long-polling readers waiting (``consumers``: threads blocked in wait_seq_change
that read their queue's new messages when woken) it is also the woken readers' share of the
CPU and, in one process, of the GIL.
"""

from __future__ import annotations

import tempfile
import threading

import pytest

from bench._common import record_rate
from mqstore import Message, MessageStore

MSGS = 200_000
TOPICS, QUEUES = 8, 4
GROUP_100B = "dispatch, 200k x 100 B, 8 topics x 4 queues"
GROUP_KEYED = "dispatch, 200k x 100 B with a UNIQ_KEY each, index on"
GROUP_1KIB = "dispatch, 200k x 1 KiB"
GROUP_LAG = "dispatch lag, one thread putting flat out"
ROUNDS = 7
STORE_CFG = {"mapped_file_size_commit_log": 256 << 20, "max_hash_slot_num": 200_000, "max_index_num": 400_000}


def build_log(root: str, body: bytes, keyed: bool) -> MessageStore:
    store = MessageStore(root, message_index_enable=keyed, **STORE_CFG)
    for i in range(MSGS):
        props = {"UNIQ_KEY": f"7F000001{i:024X}"} if keyed else None
        store.put_message(Message(f"DispatchTopic{i % TOPICS}", body, queue_id=(i // TOPICS) % QUEUES,
                                  tags=f"Tag{i % 5}", properties=props)).check()
    assert store.wait_dispatched(timeout_ms=60_000)
    store.reput.shutdown()  # the benchmarks drive dispatch themselves
    return store


@pytest.fixture(scope="module")
def logs(bench_root, bodies):
    made: dict[str, MessageStore] = {}

    def get(name: str) -> MessageStore:
        if name not in made:
            body = bodies["1KiB" if name == "1KiB" else "100B"]
            made[name] = build_log(tempfile.mkdtemp(prefix=f"dispatch-{name}-", dir=bench_root), body,
                                   name == "keyed")
        return made[name]

    yield get
    for store in made.values():
        store.dispatcher.close()
        store.shutdown()


def prepare(store: MessageStore) -> None:
    """Empty queues (their first files created and entered) and index, dispatch from 0."""
    store.consume_queues.destroy_all()
    if store.index is not None:
        store.index.destroy()
    store.dispatcher.reset(0)
    for t in range(TOPICS):
        for q in range(QUEUES):
            cq = store.consume_queues.find_or_create(f"DispatchTopic{t}", q)
            first = cq.next_file(0)
            first.write_at(0, bytes(20))  # the readahead of the first write fault, outside the round
            cq.set_current_file(first)


class Consumers:
    """Long-polling readers: each waits for a broadcast on "dispatched", then reads what its
    queue got since (get_message batches of 32) and waits again. ``paused()`` holds them out
    of the store while a round's setup destroys the queues."""

    def __init__(self, store: MessageStore, n: int) -> None:
        self.store = store
        self.stop = threading.Event()
        self.reading = threading.Lock()
        self.wakeups = 0
        self.offsets = [0] * n
        self.threads = [threading.Thread(target=self.run, args=(k,), daemon=True) for k in range(n)]

    def run(self, k: int) -> None:
        ctl, topic = self.store.ctl, f"DispatchTopic{k % TOPICS}"
        while not self.stop.is_set():
            if not ctl.wait_seq_change("dispatched", ctl.channel_seq("dispatched"), 100):
                continue
            with self.reading:
                self.wakeups += 1
                while True:
                    got = self.store.get_message("bench", topic, 0, self.offsets[k], 32)
                    if got.status.name != "FOUND":
                        break
                    self.offsets[k] = got.next_begin_offset

    def paused(self, action) -> None:
        with self.reading:
            action()
            self.offsets = [0] * len(self.offsets)

    def __enter__(self) -> Consumers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def run_rounds(benchmark, store: MessageStore, case: str, *, concurrent: bool, threads: int, notify: bool,
               consumers: int = 0) -> None:
    d = store.dispatcher
    d.close()
    d.concurrent, d.pool_threads, d.notify_arrival = concurrent, threads, notify
    before: dict[str, int] = {}

    with Consumers(store, consumers) as readers:
        def setup():
            readers.paused(lambda: prepare(store))
            before.update(store.stats(), seq=store.ctl.channel_seq("dispatched"))

        result = benchmark.pedantic(d.dispatch_available, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    assert result == MSGS
    after = store.stats()
    units = after["dispatch_units"] - before["dispatch_units"]
    assert units == MSGS and store.dispatcher.behind() == 0
    record_rate(benchmark, case, MSGS, threads=threads if concurrent else 0, notify=notify, consumers=consumers,
                batches_per_round=after["dispatch_batches"] - before["dispatch_batches"],
                broadcasts_per_round=(store.ctl.channel_seq("dispatched") - before["seq"]) % (1 << 32),
                consumer_wakeups=readers.wakeups)


MODES = [  # (id, concurrent, pool threads)
    ("serial", False, 0),
    ("concurrent-1", True, 1),
    ("concurrent-2", True, 2),
    ("concurrent-16", True, 16),
]


@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("mode,concurrent,threads", MODES, ids=[m[0] for m in MODES])
@pytest.mark.parametrize("notify", [True, False], ids=["notify", "no-notify"])
def test_dispatch_100b(benchmark, logs, mode, concurrent, threads, notify):
    run_rounds(benchmark, logs("100B"), f"dispatch/100B/{mode}/{'notify' if notify else 'no-notify'}",
               concurrent=concurrent, threads=threads, notify=notify)


@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("mode,concurrent,threads", [MODES[0], MODES[2]], ids=["serial", "concurrent-2"])
@pytest.mark.parametrize("notify", [True, False], ids=["notify", "no-notify"])
def test_dispatch_100b_with_waiting_consumers(benchmark, logs, mode, concurrent, threads, notify):
    run_rounds(benchmark, logs("100B"), f"dispatch/100B/{mode}/{'notify' if notify else 'no-notify'}/4-consumers",
               concurrent=concurrent, threads=threads, notify=notify, consumers=4)


@pytest.mark.benchmark(group=GROUP_KEYED)
@pytest.mark.parametrize("mode,concurrent,threads", MODES, ids=[m[0] for m in MODES])
@pytest.mark.parametrize("log", ["keyed", "1KiB"])
def test_dispatch_keyed_and_1kib(benchmark, logs, log, mode, concurrent, threads):
    benchmark.group = GROUP_KEYED if log == "keyed" else GROUP_1KIB
    run_rounds(benchmark, logs(log), f"dispatch/{'100B-keyed' if log == 'keyed' else log}/{mode}",
               concurrent=concurrent, threads=threads, notify=True)


@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("waiters", [0, 4])
def test_arrival_notification_cost(benchmark, logs, waiters):
    """One broadcast on "dispatched" (what an applied batch costs with long_polling_enable), with
    nobody waiting and with threads blocked in wait_seq_change (each re-waits when woken)."""
    ctl = logs("100B").ctl
    stop = threading.Event()

    def wait() -> None:
        while not stop.is_set():
            ctl.wait_seq_change("dispatched", ctl.channel_seq("dispatched"), 100)

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(waiters)]
    for t in threads:
        t.start()
    broadcast = ctl.broadcast

    def run() -> None:
        for _ in range(10_000):
            broadcast("dispatched")

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=1)
    stop.set()
    for t in threads:
        t.join()
    record_rate(benchmark, f"broadcast/dispatched/{waiters}-waiters", 10_000)
    if benchmark.stats is not None:
        benchmark.extra_info["us_per_broadcast_median"] = round(benchmark.stats.stats.median / 10_000 * 1e6, 3)


# -- lag while a writer puts flat out ---------------------------------------------------------------

LAG_BATCHES = 2_000


@pytest.mark.benchmark(group=GROUP_LAG)
@pytest.mark.parametrize("concurrent", [False, True], ids=["serial", "concurrent-2"])
@pytest.mark.parametrize("notify", [True, False], ids=["notify", "no-notify"])
def test_dispatch_lag_while_putting(benchmark, bench_root, bodies, concurrent, notify):
    """put_messages batches of 64 x 100 B (four queues) as fast as one thread can while the
    reput service (a thread of the same process) follows; after every batch the store time
    lag (newest written minus newest dispatched, ms) and the bytes behind are sampled."""
    path = tempfile.mkdtemp(prefix="lag-store-", dir=bench_root)
    store = MessageStore(path, message_index_enable=False, mapped_file_size_commit_log=256 << 20,
                         enable_build_consume_queue_concurrently=concurrent, batch_dispatch_request_thread_pool_nums=2,
                         long_polling_enable=notify)
    batches = [[Message(f"DispatchTopic{q}", bodies["100B"], queue_id=q)] * 64 for q in range(4)]
    lags: list[int] = []
    behind: list[int] = []

    def run():
        put, lag, sample_lag, sample_behind = store.put_messages, store.dispatcher.lag_ms, lags.append, behind.append
        for i in range(LAG_BATCHES):
            put(batches[i % 4]).check()
            sample_lag(lag())
            sample_behind(store.dispatcher.behind())

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    assert store.wait_dispatched(timeout_ms=60_000)
    stats = store.stats()
    store.shutdown()
    lags.sort()
    behind.sort()
    record_rate(benchmark, f"put_messages+dispatch/{'concurrent-2' if concurrent else 'serial'}/"
                           f"{'notify' if notify else 'no-notify'}", LAG_BATCHES * 64)
    benchmark.extra_info.update(
        lag_ms_p50=lags[len(lags) // 2], lag_ms_p99=lags[len(lags) * 99 // 100], lag_ms_max=lags[-1],
        behind_kib_p50=behind[len(behind) // 2] // 1024, behind_kib_p99=behind[len(behind) * 99 // 100] // 1024,
        samples=len(lags), dispatch_batches=stats["dispatch_batches"],
        records_per_batch=round(stats["dispatch_records"] / max(1, stats["dispatch_batches"]), 1),
        mean_dispatch_ms_per_batch=round(stats["dispatch_ns_total"] / max(1, stats["dispatch_batches"]) / 1e6, 3))
