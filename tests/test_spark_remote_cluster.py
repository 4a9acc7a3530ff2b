"""The network source and sink on a cluster, not one process (issue 26): Spark's
``local-cluster[2,1,1024]`` master (two executor JVMs with their own Python workers, the
driver a third process) streams a topic of two ``mqstore broker`` processes (two stores; broker-b
registered with broker-a's NameServer) into another topic of the same brokers, through the
exactly-once network sink, while a producer keeps sending. The driver
(examples/spark_remote_stream.py) is SIGKILLed while a micro-batch runs (once in the suite: each
cluster start costs ~1 minute of the 2 CI cores; the script below kills it 10 times), and started
again from its checkpoint; once the producer is done a last run drains the topic. Every message
sent comes out once, identified by the broker, queue and offset it was stored at (a third run,
from the checkpoint, writes the rest and is stopped once everything is out).

Run as a script for a longer soak: ``python tests/test_spark_remote_cluster.py --kills 10
--messages 30000`` (prints what it did; exit status 1 on a lost or repeated message). Each run
of the driver gets messages/(kills + 1) new messages, which must be more than a micro-batch
(400) for a kill to find the next micro-batch planned."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers_broker import ROOT, BrokerProcess, _children, _wait_gone  # noqa: E402
from helpers_proc import wait_until  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.multiprocess]

DRIVER = Path(ROOT) / "examples" / "spark_remote_stream.py"
MASTER = "local-cluster[2,1,1024]"
IN, OUT, SINK = "ClusterIn", "ClusterOut", "clustercopy"
MESSAGES = 1500
BROKERS = ("broker-a", "broker-b")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the driver, then whatever of its process tree (JVMs, executors, Python workers)
    outlives it, each by its pid."""
    tree = _descendants(proc.pid)
    if proc.poll() is None:
        proc.kill()
    proc.wait(60)
    _wait_gone(tree, 30)


class Producer(threading.Thread):
    """Sends n messages to IN in `stages` equal parts, each once release() is called (so every
    run of the driver reads while messages come): batches of 10 every 20 ms, to both brokers in
    turn; keeps each (broker, queue, offset) the broker stored one at."""

    def __init__(self, namesrv: str, n: int, stages: int) -> None:
        super().__init__(daemon=True)
        self.namesrv, self.n, self.stages = namesrv, n, stages
        self.released = threading.Semaphore(0)
        self.stored: list[str] = []
        self.error: BaseException | None = None

    def release(self) -> None:
        self.released.release()

    def run(self) -> None:
        from mqstore.client import SyncProducer

        try:
            with SyncProducer("PG_cluster", self.namesrv) as producer:
                for stage in range(self.stages):
                    if not self.released.acquire(timeout=900):
                        raise TimeoutError(f"stage {stage} was never released")
                    end = (stage + 1) * self.n // self.stages
                    for i in range(stage * self.n // self.stages, end, 10):
                        broker = BROKERS[(i // 10) % 2]
                        bodies = [b"m%d" % j for j in range(i, min(i + 10, end))]
                        result = producer.send_batch(IN, bodies, queue_id=(i // 20) % 4, broker_name=broker)
                        self.stored += [f"{broker}/{result.queue_id}/{result.queue_offset + k}"
                                        for k in range(len(bodies))]
                        time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            self.error = exc


def _driver(namesrv: str, checkpoint: str, log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, str(DRIVER), "--master", MASTER, "--namesrv", namesrv, "--topics", IN,
            "--checkpoint", checkpoint, "--to-topic", OUT, "--sink-id", SINK, "--max-per-trigger", "400",
            "--trigger-ms", "200"]
    with open(log, "a") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, text=True, env=env, start_new_session=True)


def _count(directory: str) -> int:
    try:
        return len([n for n in os.listdir(directory) if n.isdigit()])
    except FileNotFoundError:
        return 0


def _wait_mid_batch(proc: subprocess.Popen[str], checkpoint: str, timeout_s: float) -> None:
    """Until the driver has committed a micro-batch since it started and planned the next one
    (offsets/N written, commits/N not yet): a kill then lands inside a micro-batch."""
    commits, offsets = os.path.join(checkpoint, "commits"), os.path.join(checkpoint, "offsets")
    base = _count(commits)
    deadline = time.monotonic() + timeout_s
    while not (_count(commits) > base and _count(offsets) > _count(commits)):
        assert proc.poll() is None, f"the driver exited ({proc.returncode})"
        assert time.monotonic() < deadline, "the driver committed no micro-batch in time"
        time.sleep(0.02)


def _create(namesrv: str, brokers: list[BrokerProcess], *topics: str) -> None:
    from test_spark_remote import create_topic

    for topic in topics:
        create_topic(namesrv, topic, *brokers)


def _out_keys(namesrv: str) -> Counter[str]:
    from mqstore.spark.remote.reader import NetworkBatchReader
    from mqstore.spark.source import SCHEMA

    reader = NetworkBatchReader({"namesrv": namesrv, "topics": OUT}, SCHEMA)
    return Counter(row["keys"] for part in reader.partitions() for batch in reader.read(part)
                   for row in batch.select(["keys"]).to_pylist())


@contextlib.contextmanager
def two_brokers(base: Path) -> Iterator[tuple[str, list[BrokerProcess]]]:
    """broker-a (its NameServer the cluster's) and broker-b as ``mqstore broker`` processes,
    with the topics IN and OUT on both."""
    a = BrokerProcess(str(base / "a"), broker_name="broker-a", front_processes=1)
    try:
        b = BrokerProcess(str(base / "b"), broker_name="broker-b", front_processes=1, namesrv_addr=a.namesrv_address)
        try:
            _create(a.namesrv_address, [a, b], IN, OUT)
            yield a.namesrv_address, [a, b]
        finally:
            b.stop()
    finally:
        a.stop()


@dataclass
class Outcome:
    stored: list[str]  # (broker/queue/offset of each message the producer sent)
    out: Counter[str]  # the keys of OUT, with their counts
    cut_batches: int  # kills that left a micro-batch planned and not committed (replayed after)
    log: str  # the drivers' output


def run(base: Path, messages: int, kills: int, seed: int = 0) -> Outcome:
    """The scenario of the module docstring."""
    rng = random.Random(seed)
    log = base / "drivers.log"
    checkpoint = str(base / "checkpoint")
    cut = 0
    with two_brokers(base) as (namesrv, _):
        producer = Producer(namesrv, messages, kills + 1)
        producer.start()
        for kill in range(kills):
            proc = _driver(namesrv, checkpoint, log)
            producer.release()
            began = time.monotonic()
            try:
                _wait_mid_batch(proc, checkpoint, 300)
                print(f"driver {kill + 1}: a micro-batch committed and the next one planned after "
                      f"{time.monotonic() - began:.0f} s; SIGKILLed", flush=True)
                time.sleep(rng.uniform(0, 0.3))  # somewhere in the micro-batch
            finally:
                _kill_tree(proc)
            cut += _count(os.path.join(checkpoint, "offsets")) > _count(os.path.join(checkpoint, "commits"))
        # the last run goes on from the checkpoint until every message is out, then is stopped
        last = _driver(namesrv, checkpoint, log)
        producer.release()
        began = time.monotonic()
        try:
            producer.join(300)
            assert not producer.is_alive() and producer.error is None, producer.error
            wait_until(lambda: sum(_out_keys(namesrv).values()) >= messages or last.poll() is not None, 600,
                       "every message written on", every_s=1.0)
            assert last.poll() is None, f"the last run exited ({last.returncode}); see {log}"
            time.sleep(1.0)  # (a repeat written after the last message would show)
        finally:
            _kill_tree(last)
        print(f"the last run wrote the rest in {time.monotonic() - began:.0f} s", flush=True)
        return Outcome(producer.stored, _out_keys(namesrv), cut, log.read_text())


def test_a_stream_over_two_broker_processes_on_a_local_cluster_survives_a_driver_kill(tmp_path):
    got = run(tmp_path, MESSAGES, kills=1)
    stored, out = got.stored, got.out
    assert len(stored) == len(set(stored)) == MESSAGES
    assert got.cut_batches >= 1, "no kill landed inside a micro-batch"
    missing = set(stored) - set(out)
    repeated = {k: n for k, n in out.items() if n > 1}
    assert not missing and not repeated and set(out) == set(stored), (
        f"{len(missing)} missing (e.g. {sorted(missing)[:5]}), {len(repeated)} repeated (e.g. "
        f"{sorted(repeated.items())[:5]}); drivers' log tail:\n{got.log[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mqstore-soak-") as base:
        got = run(Path(base), args.messages, args.kills, args.seed)
    missing = set(got.stored) - set(got.out)
    repeated = sum(n - 1 for n in got.out.values() if n > 1)
    print(f"{len(got.stored):,} messages sent, {sum(got.out.values()):,} written on, {len(missing)} missing, "
          f"{repeated} repeated; driver SIGKILLed {args.kills} times, {got.cut_batches} of them inside a "
          f"micro-batch; {time.monotonic() - started:.0f} s")
    return 1 if missing or repeated else 0


if __name__ == "__main__":
    sys.exit(main())
