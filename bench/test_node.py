"""Benchmarks of the multi-process node (issue 4): a node (``mqstore node``: owner, allocator,
flusher, dispatcher and cleaner processes) on a fresh store on disk, and writer processes
attached with ``MessageStore.open``. The benchmark process only hands out rounds and waits
(see bench/_node.py); a round's time is the time all writers need for their shares.

- writer processes: 1, 2 and 4 writers x spin / mutex put lock, 200k x 100 B per round
  in all (each writer its own queue), ASYNC_FLUSH; CPU use of every process per round;
- the transient store pool on / off, one writer;
- sync group commit: SYNC_FLUSH with 1-16 producer processes putting one message (or a batch
  of 100) at a time and waiting for its flush (messages per fsync), against lmdb committing
  (fsync) every 100 puts (test_baselines.py, same group);
- dispatch lag (store-time and bytes behind, sampled every ms from the control block) while
  1 or 2 writers put flat out, serial and concurrent dispatch;
- put latency of the puts next to a CommitLog roll (16 MiB files) against the others;
- CPU use of an idle node.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bench._common import (
    GROUP_NODE_IDLE,
    GROUP_NODE_LAG,
    GROUP_NODE_ROLL,
    GROUP_NODE_SYNC,
    GROUP_NODE_WRITERS,
    NODE_MSGS,
    NODE_SYNC_BATCH_MSGS,
    NODE_SYNC_MSGS,
    WARMUP_ROUNDS,
    record_rate,
)
from bench._node import CpuMeter, Node, Writers, percentile

MiB = 1 << 20
ROUNDS_NODE = 15
ROUNDS_NODE_SYNC = 10
#: messages the writers put untimed before the rounds (the async flusher's first msync and a
#: few new files happen before the measurement, as in test_put.py's pre-write)
PREWRITE_ROUNDS = 8
FAILURES = ("flush_timeouts", "create_mapped_file_failed", "message_illegal", "service_not_available",
            "page_cache_busy", "pool_exhausted", "flush_errors", "alloc_errors")


@contextmanager
def node_and_writers(root: str, k: int, per_writer: int, **settings: Any) -> Iterator[tuple[Node, Writers, Any]]:
    from mqstore.log._shm import ControlBlock

    node = Node(root, **settings)
    writers = None
    ctl = None
    try:
        writers = Writers(root, k, per_writer)
        ctl = ControlBlock.attach(os.path.join(root, "mqstore.shm"), readonly=True)
        yield node, writers, ctl
    finally:
        if ctl is not None:
            ctl.close()
        if writers is not None:
            writers.close()
        node.stop()


def _rounds(benchmark: Any, writers: Writers, ctl: Any, command: str, n_msgs: int, rounds: int,
            during: CpuMeter | LagSampler | None = None, prewrite: int = PREWRITE_ROUNDS) -> dict[str, int]:
    """Prewrite, then run `command` on every writer per round (``during`` measuring each
    round: start() before, stop() after); check from the control block's counters that
    every put of every round (warm-up and pre-write included) stored its message and no
    failure counter moved. Returns the counter deltas of all rounds."""
    if not benchmark.disabled:
        for _ in range(prewrite):
            writers.run(command)
    before = ctl.stats()
    benchmark.pedantic(writers.run, args=(command,), setup=during.start if during else None,
                       teardown=(lambda *_: during.stop()) if during else None,
                       rounds=rounds, warmup_rounds=WARMUP_ROUNDS, iterations=1)
    after = ctl.stats()
    done = 1 if benchmark.disabled else rounds + WARMUP_ROUNDS
    delta = {k: after[k] - before[k] for k in after}
    assert delta["put_messages"] == done * n_msgs, f"{delta['put_messages']} of {done * n_msgs} messages stored"
    for bad in FAILURES:
        assert delta[bad] == 0, f"{bad}={delta[bad]}"
    return delta


def _lock_figures(delta: dict[str, int]) -> dict[str, float]:
    acquires = max(1, delta["lock_acquires"])
    return {"lock_hold_ns_mean": round(delta["lock_hold_ns_total"] / acquires, 1),
            "spin_yields_per_put": round(delta["spin_yields"] / acquires, 4)}


# -- 1. writer processes x lock kind ------------------------------------------------------------
@pytest.mark.benchmark(group=GROUP_NODE_WRITERS)
@pytest.mark.parametrize("lock", ["spin", "mutex"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_writer_processes(benchmark, work_dir, lock, k):
    """K attached writer processes put 200k x 100 B per round in all, ASYNC_FLUSH, 64 MiB
    files; use_reentrant_lock_when_put_message False (spin) / True (mutex)."""
    per = NODE_MSGS // k
    with node_and_writers(str(work_dir / "store"), k, per, use_reentrant_lock_when_put_message=(lock == "mutex"),
                          mapped_file_size_commit_log=64 * MiB) as (node, writers, ctl):
        meter = CpuMeter({**node.pids, **writers.pids})
        delta = _rounds(benchmark, writers, ctl, f"put {per}", per * k, ROUNDS_NODE, meter)
    record_rate(benchmark, f"node/writers-{k}/{lock}", per * k, cpu_percent=meter.percent(),
                machine_idle_percent=meter.machine_idle_percent(), roll_wait_ms_total=delta["roll_wait_ns_total"] / 1e6,
                **_lock_figures(delta))


@pytest.mark.benchmark(group=GROUP_NODE_WRITERS)
@pytest.mark.parametrize("pool", [False, True], ids=["pool-off", "pool-on"])
def test_writer_process_transient_pool(benchmark, work_dir, pool):
    """One writer process, transient_store_pool_enable off / on (5 shared buffers on
    /dev/shm, the flusher process commits them into the files), spin lock."""
    with node_and_writers(str(work_dir / "store"), 1, NODE_MSGS, use_reentrant_lock_when_put_message=False,
                          mapped_file_size_commit_log=64 * MiB, transient_store_pool_enable=pool) as (node, writers, ctl):
        meter = CpuMeter({**node.pids, **writers.pids})
        delta = _rounds(benchmark, writers, ctl, f"put {NODE_MSGS}", NODE_MSGS, ROUNDS_NODE, meter)
    record_rate(benchmark, f"node/writers-1/spin/{'pool' if pool else 'no-pool'}", NODE_MSGS,
                cpu_percent=meter.percent(), machine_idle_percent=meter.machine_idle_percent(),
                commits=delta["commit_count"], **_lock_figures(delta))


# -- 2. sync group commit -----------------------------------------------------------------------
@pytest.mark.benchmark(group=GROUP_NODE_SYNC)
@pytest.mark.parametrize("batch", [1, 100])
@pytest.mark.parametrize("producers", [1, 2, 4, 8, 16])
def test_sync_group_commit(benchmark, work_dir, producers, batch):
    """SYNC_FLUSH: P producer processes, each putting its share of the round and waiting for
    the flush of each put before the next (the flusher process's group commit: one msync
    covers every put that arrived while the previous one ran). batch 1: put_message, 1,600
    messages per round in all; batch 100: put_messages of 100 (one record each, one queue
    offset range), 16,000 per round in all, as the lmdb baseline commits them."""
    total = NODE_SYNC_MSGS if batch == 1 else NODE_SYNC_BATCH_MSGS
    per = total // producers
    command = f"put {per}" if batch == 1 else f"batch {per} {batch}"
    with node_and_writers(str(work_dir / "store"), producers, per, flush_disk_type="SYNC_FLUSH",
                          mapped_file_size_commit_log=64 * MiB) as (node, writers, ctl):
        delta = _rounds(benchmark, writers, ctl, command, per * producers, ROUNDS_NODE_SYNC, prewrite=2)
    flushes = max(1, delta["flush_count"])
    record_rate(benchmark, f"node/sync/batch{batch}/{producers}-producers", per * producers,
                msgs_per_flush=round(delta["put_messages"] / flushes, 2),
                flush_us_mean=round(delta["flush_ns_total"] / flushes / 1000, 1))


# -- 3. dispatch lag --------------------------------------------------------------------------
class LagSampler:
    """Samples the dispatch lag every `every_s` from the control block: store time of the
    newest written record minus that of the newest dispatched one (0 when nothing is
    behind), and the bytes behind (committed - dispatched)."""

    def __init__(self, ctl: Any, every_s: float = 0.001) -> None:
        self.ctl = ctl
        self.every_s = every_s
        self.lag_ms: list[int] = []
        self.behind: list[int] = []
        self._on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ctl = self.ctl
        logs = range(ctl.log_count)  # a store with several CommitLogs: the worst log's lag, all logs' bytes
        while not self._stop.is_set():
            if self._on.wait(0.05):
                lag = behind_all = 0
                for k in logs:
                    behind = ctl.get("committed", log=k) - ctl.get("dispatched", log=k)
                    if behind > 0:
                        done = ctl.get("dispatched_store_timestamp", log=k)
                        lag = max(lag, ctl.get("last_store_timestamp", log=k) - done if done > 0 else 0)
                        behind_all += behind
                self.lag_ms.append(lag)
                self.behind.append(behind_all)
                time.sleep(self.every_s)

    def start(self) -> None:
        self._on.set()

    def stop(self) -> None:
        self._on.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, Any]:
        lag, behind = sorted(self.lag_ms), sorted(self.behind)
        return {"lag_samples": len(lag), "lag_ms_p50": percentile(lag, 0.5), "lag_ms_p99": percentile(lag, 0.99),
                "lag_ms_max": lag[-1] if lag else 0, "behind_bytes_p50": percentile(behind, 0.5),
                "behind_bytes_p99": percentile(behind, 0.99), "behind_bytes_max": behind[-1] if behind else 0}


@pytest.mark.benchmark(group=GROUP_NODE_LAG)
@pytest.mark.parametrize("concurrent", [False, True], ids=["serial", "concurrent"])
@pytest.mark.parametrize("k", [1, 2])
def test_dispatch_lag_while_writers_run(benchmark, work_dir, concurrent, k):
    """K writer processes put flat out (200k x 100 B per round in all, spin lock); the
    dispatcher process builds the ConsumeQueues (serial, or the concurrent mode with its
    default 16 pool threads); the lag is sampled every ms during the rounds."""
    per = NODE_MSGS // k
    with node_and_writers(str(work_dir / "store"), k, per, use_reentrant_lock_when_put_message=False,
                          mapped_file_size_commit_log=64 * MiB,
                          enable_build_consume_queue_concurrently=concurrent) as (node, writers, ctl):
        sampler = LagSampler(ctl)
        try:
            _rounds(benchmark, writers, ctl, f"put {per}", per * k, ROUNDS_NODE, sampler)
        finally:
            sampler.close()
    record_rate(benchmark, f"node/lag/{'concurrent' if concurrent else 'serial'}/writers-{k}", per * k,
                **sampler.figures())


# -- 4. put latency across a roll ---------------------------------------------------------------
@pytest.mark.benchmark(group=GROUP_NODE_ROLL)
@pytest.mark.parametrize("lock", ["spin", "mutex"])
def test_put_latency_across_roll(benchmark, work_dir, lock):
    """One writer process times each of 200k put_message calls per round (100 B, 16 MiB
    files: ~2 rolls per round; the allocator process has the next file ready). Latencies of
    the 2,000 puts around each roll (1,000 before, 1,000 after) against all the others."""
    n = 200_000
    roll_lat: list[int] = []
    steady_lat: list[int] = []
    rolls = 0

    def keep(answers: list[dict[str, Any]]) -> None:
        nonlocal rolls
        for a in answers:
            roll_lat.extend(a["roll"])
            steady_lat.extend(a["steady"])
            rolls += a["rolls"]

    with node_and_writers(str(work_dir / "store"), 1, n, use_reentrant_lock_when_put_message=(lock == "mutex"),
                          mapped_file_size_commit_log=16 * MiB) as (node, writers, ctl):
        if not benchmark.disabled:
            writers.run(f"put {n}")
        benchmark.pedantic(lambda: keep(writers.run(f"lat {n}")), rounds=5, warmup_rounds=0, iterations=1)
    roll_lat.sort()
    steady_lat.sort()
    figures: dict[str, Any] = {"rolls": rolls}
    for name, lat in (("roll", roll_lat), ("steady", steady_lat)):
        for q, label in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
            figures[f"{name}_{label}_us"] = round(percentile(lat, q) / 1000, 2)
        figures[f"{name}_max_us"] = round(lat[-1] / 1000, 1) if lat else 0
    steady = figures["steady_p999_us"] or 1
    figures["p999_roll_over_steady"] = round(figures["roll_p999_us"] / steady, 2)
    record_rate(benchmark, f"node/latency/{lock}", n, **figures)


# -- 5. an idle node ----------------------------------------------------------------------------
@pytest.mark.benchmark(group=GROUP_NODE_IDLE)
def test_idle_node_cpu(benchmark, work_dir):
    """A node on an empty store, nobody attached: CPU of the owner and its four service
    processes over 10 s, after 2 s to settle (the dispatcher sleeps until a put once idle for 1 s)."""
    node = Node(str(work_dir / "store"))
    try:
        time.sleep(2.0)
        meter = CpuMeter(node.pids)
        seconds = 0.5 if benchmark.disabled else 10.0
        benchmark.pedantic(time.sleep, args=(seconds,), setup=meter.start, teardown=lambda *_: meter.stop(),
                           rounds=1, iterations=1)
    finally:
        node.stop()
    pct = meter.percent()
    benchmark.extra_info.update({"case": "node/idle", "cpu_percent": pct,
                                 "cpu_percent_all": round(sum(pct.values()), 2)})
