"""Replication between two nodes on this machine (docs/replication.md).

    python -m pytest bench/test_replication.py --benchmark-columns=median,rounds -q

A master node and a slave node (``mqstore node``, each with its own allocator, flusher,
dispatcher, cleaner and HA processes, default settings but 64 MiB CommitLog files), writer
processes attached to the master (bench/_node.py ``Writers``: ``MessageStore.open``, one
``put_message`` per message, 100-byte bodies). Both nodes share the machine's 2 cores with the
writers.

1. Throughput: one writer puts 200k messages flat out per round; the round lasts until the
   slave has them all (its CommitLog end is the master's). The master's put rate is the
   messages over the writer's time, the slave's apply rate the messages over the round.
   Target: the slave applies at >= 80 % of the master's put rate. A sampler reads both control
   blocks every ms: bytes the slave is behind and the store-time lag (the master's newest
   record's store time minus the slave's), p50 / p99.
2. SYNC_MASTER: 16 producer processes each putting its share of 1,600 messages one at a time,
   every put waiting for the slave's report (SYNC_MASTER), against the same with ASYNC_MASTER
   (no wait) and with SYNC_FLUSH (the group commit's msync instead of the slave).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bench._common import WARMUP_ROUNDS, record_rate
from bench._node import Node, Writers, percentile

MiB = 1 << 20
N_THROUGHPUT = 200_000
ROUNDS = 5
N_SYNC = 1_600
ROUNDS_SYNC = 5
GROUP_THROUGHPUT = "replication: the slave's apply rate while one writer puts 200k x 100 B flat out"
GROUP_SYNC = "replication: 16 producer processes, 1,600 x 100 B per round, one put at a time"


def _ctl(root: str) -> Any:
    from mqstore.log._shm import ControlBlock

    return ControlBlock.attach(os.path.join(root, "mqstore.shm"), readonly=True)


def _wait(cond: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout_s:g} s")
        time.sleep(0.05)


@contextmanager
def master_and_slave(work_dir: Any, **master_settings: Any) -> Iterator[tuple[Node, Node, Any, Any]]:
    mroot, sroot = str(work_dir / "master"), str(work_dir / "slave")
    master = Node(mroot, ha_listen_port=0, mapped_file_size_commit_log=64 * MiB, **master_settings)
    slave = None
    mctl = sctl = None
    try:
        mctl = _ctl(mroot)
        _wait(lambda: mctl.get("ha_port") > 0, "the master's HA process did not listen")
        slave = Node(sroot, broker_role="SLAVE", ha_master_address=f"127.0.0.1:{mctl.get('ha_port')}",
                     mapped_file_size_commit_log=64 * MiB)
        sctl = _ctl(sroot)
        _wait(lambda: mctl.get("ha_slaves") > 0, "the slave did not connect")
        yield master, slave, mctl, sctl
    finally:
        for ctl in (mctl, sctl):
            if ctl is not None:
                ctl.close()
        if slave is not None:
            slave.stop()
        master.stop()


class LagSampler:
    """Every ms: the bytes the slave is behind, and the store-time lag (master's newest record's
    store time minus the slave's newest)."""

    def __init__(self, mctl: Any, sctl: Any) -> None:
        self.mctl, self.sctl = mctl, sctl
        self.behind: list[int] = []
        self.lag_ms: list[int] = []
        self._on = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._on.wait(0.05):
                behind = self.mctl.get("wrote") - self.sctl.get("wrote")
                theirs = self.sctl.get("last_store_timestamp")
                lag = self.mctl.get("last_store_timestamp") - theirs if behind > 0 and theirs > 0 else 0
                self.behind.append(max(0, behind))
                self.lag_ms.append(max(0, lag))
                time.sleep(0.001)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, Any]:
        behind, lag = sorted(self.behind), sorted(self.lag_ms)
        return {"samples": len(lag), "lag_ms_p50": percentile(lag, 0.5), "lag_ms_p99": percentile(lag, 0.99),
                "lag_ms_max": lag[-1] if lag else 0, "behind_bytes_p50": percentile(behind, 0.5),
                "behind_bytes_p99": percentile(behind, 0.99)}


@pytest.mark.benchmark(group=GROUP_THROUGHPUT)
def test_replication_throughput(benchmark, work_dir):
    with master_and_slave(work_dir) as (master, slave, mctl, sctl):
        writers = Writers(master.root, 1, N_THROUGHPUT)
        sampler = LagSampler(mctl, sctl)
        put_s: list[float] = []
        try:
            def round_() -> None:
                sampler._on.set()
                (answer,) = writers.run(f"put {N_THROUGHPUT}")
                put_s.append(answer["ns"] / 1e9)
                end = mctl.get("wrote")
                deadline = time.monotonic() + 120
                while sctl.get("wrote") < end:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the slave is at {sctl.get('wrote')} of {end} after 120 s")
                    time.sleep(0.0005)
                sampler._on.clear()

            benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS, iterations=1)
        finally:
            sampler.close()
            writers.close()
        assert sctl.get("wrote") == mctl.get("wrote")
        timed = put_s[WARMUP_ROUNDS:] if not benchmark.disabled else put_s
        put_rate = N_THROUGHPUT / sorted(timed)[len(timed) // 2]
        stats = getattr(benchmark, "stats", None)
        apply_rate = N_THROUGHPUT / stats.stats.median if stats is not None else 0.0
        record_rate(benchmark, "replication/throughput/1-writer", N_THROUGHPUT,
                    master_put_msgs_per_s=round(put_rate), slave_apply_msgs_per_s=round(apply_rate),
                    apply_over_put=round(apply_rate / put_rate, 3), **sampler.figures())


@pytest.mark.benchmark(group=GROUP_SYNC)
@pytest.mark.parametrize("mode", ["SYNC_MASTER", "ASYNC_MASTER", "SYNC_FLUSH"])
def test_sync_master_against_async_and_sync_flush(benchmark, work_dir, mode):
    producers = 16
    per = N_SYNC // producers
    settings = {"broker_role": "SYNC_MASTER"} if mode == "SYNC_MASTER" else (
        {"flush_disk_type": "SYNC_FLUSH"} if mode == "SYNC_FLUSH" else {})
    with master_and_slave(work_dir, **settings) as (master, slave, mctl, sctl):
        writers = Writers(master.root, producers, per)
        try:
            before = mctl.stats()
            benchmark.pedantic(writers.run, args=(f"put {per}",), rounds=ROUNDS_SYNC, warmup_rounds=WARMUP_ROUNDS,
                               iterations=1)
            after = mctl.stats()
        finally:
            writers.close()
        # every put PUT_OK (Writers.run fails on any other status: SLAVE_NOT_AVAILABLE,
        # FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT), every message stored
        done = 1 if benchmark.disabled else ROUNDS_SYNC + WARMUP_ROUNDS
        assert after["put_messages"] - before["put_messages"] == done * per * producers
        record_rate(benchmark, f"replication/{mode}/{producers}-producers", per * producers)
