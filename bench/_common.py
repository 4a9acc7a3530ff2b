"""Shared constants and helpers of the benchmark suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: messages written per measured round by the throughput benchmarks
MSGS = 100_000
#: messages per round of the one-fsync-per-message benchmarks (each costs a disk flush)
SYNC_MSGS = 300
#: messages per round of the node benchmarks (all writer processes together)
NODE_MSGS = 200_000
#: messages per round of the node's SYNC_FLUSH group-commit benchmarks: one message per put,
#: and batches of 100 per put (and the lmdb baseline, which commits every 100)
NODE_SYNC_MSGS = 1_600
NODE_SYNC_BATCH_MSGS = 16_000
#: bodies are random bytes (fixed per session), the same objects for mqstore and the baselines
BODY_SIZES = {"100B": 100, "1KiB": 1024}
TOPIC = "BenchTopic"

# rounds per benchmark (plus warm-up rounds that are run but not recorded)
ROUNDS_FAST = 30       # 100 k small messages per round: ~40-100 ms per round (page faults make it noisy)
ROUNDS_1KIB = 6        # 100 k x 1 KiB = ~110 MB per round
ROUNDS_SYNC = 20       # 300 flushes per round (~50-70 ms)
ROUNDS_ROLL = 10       # 100 k x 100 B = ~1.1 files of 16 MiB per round
WARMUP_ROUNDS = 1
#: before the rounds of a throughput benchmark, write for this long untimed: longer than the
#: async flusher's period (flush_interval_commit_log, 500 ms) so every round runs in the steady
#: state with the flusher msync-ing behind the writer (the first ~0.5 s run faster without it)
PREWRITE_S = 0.8

# benchmark groups: every benchmark of a group writes the same messages per round; the suite
# runs group by group (see conftest.pytest_collection_modifyitems) so that a benchmark and
# its baseline run next to each other, under the same conditions
GROUP_100B = "async append, 100k x 100 B per round"
GROUP_1KIB = "async append, 100k x 1 KiB per round"
GROUP_DURABLE = "durable, one flush/commit per message, 300 per round"
GROUP_ROLL = "roll stall, 16 MiB files, 100k x 100 B per round"
GROUP_NODE_WRITERS = "node: writer processes, 200k x 100 B per round in all"
GROUP_NODE_SYNC = "node: SYNC_FLUSH producer processes vs lmdb fsync per 100 puts"
GROUP_NODE_LAG = "node: dispatch lag while writer processes put flat out"
GROUP_NODE_ROLL = "node: put latency around CommitLog rolls"
GROUP_NODE_IDLE = "node: idle"
GROUP_ORDER = (GROUP_DURABLE, GROUP_100B, GROUP_1KIB, GROUP_ROLL, GROUP_NODE_SYNC, GROUP_NODE_WRITERS,
               GROUP_NODE_LAG, GROUP_NODE_ROLL, GROUP_NODE_IDLE)


def record_rate(benchmark: Any, case: str, n_msgs: int, **extra: Any) -> None:
    """Store messages/s (from the round-time statistics) and extra facts in extra_info."""
    info = benchmark.extra_info
    info["case"] = case
    info["messages_per_round"] = n_msgs
    info.update(extra)
    meta = getattr(benchmark, "stats", None)
    if benchmark.disabled or meta is None:
        return
    st = meta.stats
    info["msgs_per_s_median"] = round(n_msgs / st.median)
    info["msgs_per_s_mean"] = round(n_msgs / st.mean)  # = all messages / all timed seconds (sustained)
    info["msgs_per_s_best"] = round(n_msgs / st.min)
    info["msgs_per_s_worst"] = round(n_msgs / st.max)


class StoreRounds:
    """Per-round deltas of a MessageStore's counters, taken between rounds (never inside the
    timed call). ``reset`` names high-water stats (``*_max``) zeroed before every round so
    each round reports its own maximum. The first ``warmup`` rounds recorded are the
    benchmark's warm-up rounds and are left out of measured()/total()."""

    def __init__(self, store: Any, *, warmup: int = WARMUP_ROUNDS, reset: tuple[str, ...] = ()) -> None:
        self.store = store
        self.warmup = warmup
        self.reset = reset
        self.rounds: list[dict[str, int]] = []
        self._before: dict[str, int] | None = None

    def setup(self) -> None:
        for name in self.reset:
            # ControlBlock.set_stat is the control block's public API; the store has no
            # "reset statistics" call, and a max since open() would include file #0's creation
            self.store.ctl.set_stat(name, 0)
        self._before = self.store.stats()

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        after = self.store.stats()
        assert self._before is not None
        delta = {k: after[k] - self._before.get(k, 0) for k in after}
        for name in self.reset:
            delta[name] = after[name]
        self.rounds.append(delta)
        self._before = None

    def measured(self) -> list[dict[str, int]]:
        return self.rounds[self.warmup:]

    def total(self, key: str) -> int:
        return sum(r[key] for r in self.measured())

    def check_all_put(self, n_msgs: int) -> None:
        """Every round stored exactly n_msgs messages and nothing failed (checked from the
        counters so the timed loop does not pay for checking results)."""
        assert self.measured(), "no measured round"
        for i, r in enumerate(self.rounds):
            assert r["put_messages"] == n_msgs, f"round {i}: {r['put_messages']} of {n_msgs} messages stored"
            for bad in ("flush_timeouts", "create_mapped_file_failed", "message_illegal", "service_not_available",
                        "page_cache_busy", "pool_exhausted", "flush_errors", "alloc_errors"):
                assert r[bad] == 0, f"round {i}: {bad}={r[bad]}"


def prewrite(target: Callable[..., Any], setup: Callable[[], Any] | None = None,
             seconds: float = PREWRITE_S) -> int:
    """Call target (with setup's (args, kwargs), like benchmark.pedantic) until `seconds`
    have passed; untimed, unrecorded. Returns the number of calls."""
    end = time.monotonic() + seconds
    calls = 0
    while time.monotonic() < end:
        got = setup() if setup is not None else None
        args, kwargs = got if got else ((), {})
        target(*args, **kwargs)
        calls += 1
    return calls


def wait_allocator_idle(store: Any, timeout_s: float = 30.0) -> float:
    """Wait until every CommitLog file requested from the allocate service is ready.
    Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        ready, requested = store.ctl.get("alloc_ready_upto"), store.ctl.get("alloc_request_upto")
        if ready >= requested:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"allocate service still busy after {timeout_s} s: ready up to {ready}, "
                               f"requested up to {requested}")
        time.sleep(0.002)


def one_queue_store(root: str, topic: str, body: bytes, n: int) -> Any:
    """A store under root holding n messages of body in queue 0 of topic, all dispatched
    (64 MiB CommitLog files, no index): what the read benchmarks read."""
    from mqstore import Message, MessageStore

    store = MessageStore(root, message_index_enable=False, mapped_file_size_commit_log=64 << 20)
    msgs = [Message(topic, body) for _ in range(n)]
    for m in msgs:
        store.put_message(m).check()
    assert store.wait_dispatched(timeout_ms=60_000)
    return store


def drain_queue(get: Callable[..., Any], topic: str, take: Callable[[Any], int]) -> int:
    """Read queue 0 of topic with getMessage batches of 32 until one comes back empty (never
    because a damaged message stopped it); take(result) -> messages handled."""
    from mqstore.status import GetMessageStatus

    offset, n = 0, 0
    while True:
        res = get("bench", topic, 0, offset, 32)
        if not len(res):
            assert res.status is not GetMessageStatus.MESSAGE_CORRUPTED
            return n
        n += take(res)
        offset = res.next_begin_offset
