"""Fault injection on a running node: SIGKILL a random process at a random moment, again and
again, and check the store after every kill (design.md "What every part must do
under stress").

The node runs as ``mqstore node`` in its own process; writers are separate processes that
attach with ``MessageStore.open`` and put with SYNC_FLUSH, appending every acknowledged put
to an ack file. Each step sleeps a random time, then kills one victim picked at random: a
writer, a writer caught inside the put lock (watched through the control block, frozen while
it holds the lock, killed there), a service process (allocator, flusher, dispatcher, cleaner)
or the node itself (alone, its service processes exiting when they see it gone, or together
with them); each node start picks the lock kind (spin or mutex) at random. A
killed writer is replaced; a killed service process is restarted by the node; a killed node
is started again (its service processes die with it), which recovers the store. After every
kill the invariant checker runs (on the live store, or on the stopped one after a node kill).
At the end the node is stopped cleanly, and every acknowledged message must be at its queue
offset and physical offset with its body, with no queue offset repeated or skipped, each
writer's messages in each queue in the order it put them, every record in its queue's
CommitLog.

A store with several CommitLogs (``--logs N``, docs/parallel-commitlogs.md) is soaked the same
way: the writers' queues are bound to every log, a writer is caught inside the put lock of
whichever log it holds, and every service process serves every log. ``--flush ASYNC_FLUSH``
acknowledges a put once it is in the mapped file: a SIGKILL keeps the page cache, so nothing
acknowledged may be lost either. ``--wait-restarts`` waits for the node to restart a killed
service process before the checker runs.

    python -m mqstore.tools.soak STORE_DIR --kills 1000 [--logs 2] [--flush ASYNC_FLUSH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mqstore.layout import CONTROL_BLOCK_NAME, NODE_INFO_NAME, log_of
from mqstore.tools.checker import check_store
from mqstore.procs import alive, stopped

QUEUES = 4
NODE_SETTINGS: dict[str, Any] = {"flush_disk_type": "SYNC_FLUSH", "mapped_file_size_commit_log": 256 * 1024,
                 "mapped_file_size_consume_queue": 20 * 500, "flush_interval_consume_queue": 100}
#: a writer process: root, name, ack file, rate, and what a put that is stored but not acknowledged
#: does ("raise": SYNC_FLUSH, where every put must be PUT_OK; "skip": SYNC_MASTER, where
#: FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE are stored and not acknowledged, and go unlogged)
WRITER = """
import json, sys, time
from mqstore import Message, MessageStore
root, name, acks, rate, not_ok = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
store = MessageStore.attach(root)  # never the owner, even while the node is being restarted
out = open(acks, "a", buffering=1)
i = 0
t0 = time.monotonic()
while True:
    if rate > 0 and i % 16 == 0:  # paced: the store (and the checker's scan after each kill) grows slower
        ahead = t0 + i / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    body = f"{name}|{i}|".encode() + b"x" * (i % 300)
    r = store.put_message(Message("T", body, queue_id=i % QUEUES, keys=[f"{name}-{i}"]))
    if r.status.name == "SERVICE_NOT_AVAILABLE":
        sys.exit(3)  # the node stopped (or a new one fenced this block): reattach
    if r.status.name == "PUT_OK":
        out.write(json.dumps([name, i, i % QUEUES, r.queue_offset, r.wrote_offset]) + "\\n")
    elif not_ok == "raise":
        r.check()
    i += 1
""".replace("QUEUES", str(QUEUES))


def launch_node(root: str, settings: dict[str, Any], env: dict[str, str], log_path: str | None = None
                ) -> tuple[subprocess.Popen[str], dict[str, int]]:
    """Start ``mqstore node root`` with ``settings`` (its log appended to log_path, when given);
    returns the process once it has opened the store (its first lines read) and the pids of its
    service processes by kind."""
    args = [sys.executable, "-m", "mqstore.tools.cli", "node", root] + [f"--set={k}={v}" for k, v in settings.items()]
    with open(log_path or os.devnull, "ab") as log_file:
        node = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env)
    assert node.stdout is not None
    line = node.stdout.readline()
    if "owner pid" not in line:
        node.wait(30)
        raise RuntimeError(f"the node on {root} did not start (exit {node.returncode}): {line!r}")
    services = {part.split()[0]: int(part.split()[-1]) for part in line.strip().split(": ", 1)[1].split(", ")
                if " pid " in part and not part.startswith("owner")}
    node.stdout.readline()  # the recovery summary
    return node, services


def node_services(root: str) -> dict[str, int]:
    """The service pids a running node wrote (a restarted service has a new pid; -1 while it is
    being restarted), or {} when there is no node info to read."""
    try:
        with open(os.path.join(root, NODE_INFO_NAME), encoding="utf-8") as fh:
            return dict(json.load(fh)["services"])
    except (FileNotFoundError, ValueError, KeyError):
        return {}


def wait_gone(pids: list[int], timeout_s: float = 15.0) -> None:
    """Wait until every pid is gone (the service processes of a killed node follow it)."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"service process {pid} outlived its node")


def read_acks(ack_dir: str) -> list[Any]:
    """Every whole line the writers' ack files hold (a writer killed mid-line left a partial one)."""
    acked = []
    for name in sorted(os.listdir(ack_dir)):
        with open(os.path.join(ack_dir, name), encoding="utf-8") as fh:
            acked += [json.loads(line) for line in fh if line.endswith("\n")]
    return acked


def wait_for_new_ack(soak: Any, where: str, timeout_s: float = 180.0) -> None:
    """Keep a soak's writers running (the ones its last kill took replaced) until a put made
    after that kill is acknowledged: the store takes puts again after all the kills. The kills
    come every few tenths of a second, so on a loaded machine the writers may have had none
    acknowledged before (starting one alone can take seconds); the bound is generous for that."""
    os.makedirs(soak.ack_dir, exist_ok=True)
    before = len(read_acks(soak.ack_dir))
    deadline = time.monotonic() + timeout_s
    while len(read_acks(soak.ack_dir)) <= before:
        if time.monotonic() > deadline:
            raise AssertionError(f"no put was acknowledged within {timeout_s} s of the last kill "
                                 f"({before} were before it); {where}")
        for name, p in list(soak.procs.items()):
            if p.poll() is not None:  # killed by the last step, or gave up on a put while a service restarted
                del soak.procs[name]
        while len(soak.procs) < soak.writers:
            soak.start_writer()
        time.sleep(0.1)


def check_queue_order(store: Any, topic: str, qid: int) -> int:
    """Read a queue of the soak's writers whole (from offset 0: the soak's stores are not
    cleaned) and check it: every queue offset up to its max once, each record in the queue's
    own CommitLog, each writer's messages in the order it put them (a writer puts its numbers
    in order and never twice). Returns how many it holds."""
    from mqstore.log._shm import log_of_queue

    log_id = log_of_queue(topic, qid, store.config.commit_log_count)
    high = store.get_max_offset_in_queue(topic, qid)
    last: dict[bytes, int] = {}
    offset = 0
    while offset < high:
        got = store.read_messages(topic, qid, offset, 4096)
        assert got.status.name == "FOUND" and len(got), f"{topic}/{qid} @ {offset} of {high}: {got.status.name}"
        for body, phy in zip(got.bodies(), got.physical_offsets):
            name, i, _ = bytes(body).split(b"|", 2)
            assert int(i) > last.get(name, -1), f"{topic}/{qid} @ {offset}: {name!r}-{int(i)} after {last[name]}"
            assert log_of(phy) == log_id, f"{topic}/{qid} @ {offset} is in CommitLog {log_of(phy)}, not {log_id}"
            last[name] = int(i)
            offset += 1
        assert got.next_begin_offset == offset, f"{topic}/{qid}: a gap after {offset}"
    return high


def freeze(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP pid and wait until all its threads are stopped. kill() only queues the signal:
    a thread of the process can go on running (e.g. a commit thread woken by a futex) until
    the thread picked to take the signal is scheduled, which on a busy machine takes
    milliseconds. Raises TimeoutError if the process does not stop, ProcessLookupError if it
    is gone."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not stop within {timeout_s} s of SIGSTOP")
        os.kill(pid, 0)
        time.sleep(0.0001)


def thaw(pid: int) -> None:
    """SIGCONT a process freeze() stopped (nothing if it is gone)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@dataclass
class Soak:
    root: str
    rng: random.Random
    writers: int = 2
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    rate: float = 100.0  # messages/s per writer; 0 = flat out
    node: subprocess.Popen[str] | None = None
    services: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)
    serial: int = 0
    lock: str = "mutex"
    logs: int = 1  # commit_log_count of the store
    flush: str = "SYNC_FLUSH"
    #: after killing a service process, wait for the node to run a new one before the checker
    wait_restarts: bool = False

    @property
    def ack_dir(self) -> str:
        return os.path.join(os.path.dirname(self.root), os.path.basename(self.root) + ".acks")

    @property
    def settings(self) -> dict[str, Any]:
        """The node's settings (NODE_SETTINGS with this soak's flush and CommitLog count)."""
        several = {"commit_log_count": self.logs} if self.logs > 1 else {}
        return {**NODE_SETTINGS, "flush_disk_type": self.flush, **several}

    def start_node(self) -> None:
        """Start (or restart) the node; each start picks the put lock kind at random, so both
        kinds are killed into (the owner's choice is what attached writers use)."""
        self.lock = self.rng.choice(["spin", "mutex"])
        self.node, self.services = launch_node(
            self.root, {"use_reentrant_lock_when_put_message": self.lock == "mutex", **self.settings}, self.env)

    def start_writer(self) -> None:
        os.makedirs(self.ack_dir, exist_ok=True)
        self.serial += 1
        name = f"w{self.serial}"
        self.procs[name] = subprocess.Popen([sys.executable, "-c", WRITER, self.root, name,
                                             os.path.join(self.ack_dir, name), str(self.rate), "raise"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)

    def refresh_services(self) -> None:
        """The service pids the node wrote (a restarted service has a new pid)."""
        self.services = node_services(self.root) or self.services

    def step(self, victim: str | None = None) -> str:
        """Sleep a random time, then SIGKILL ``victim`` (a kind of process: "writer",
        "writer-in-lock", a service kind, "node", or "node-and-services": the node and every
        service process of it at once), or one picked at random; then check the store. Returns
        what was killed."""
        time.sleep(self.rng.uniform(0.0, 0.25))
        for name, p in list(self.procs.items()):
            if p.poll() is not None:  # exited (e.g. 3: fenced by a restarted node): replace it
                del self.procs[name]
        while len(self.procs) < self.writers:
            self.start_writer()
        self.refresh_services()
        running = sorted(kind for kind, pid in self.services.items() if pid > 0)  # -1: being restarted
        victims = ["writer"] * 3 + ["writer-in-lock"] * 2 + running + ["node", "node-and-services"]
        if victim is None:
            victim = self.rng.choice(victims)
        if victim == "writer-in-lock":
            victim = self.kill_writer_in_lock()
        elif victim == "writer":
            name = self.rng.choice(sorted(self.procs))
            self.procs.pop(name).kill()
        self.kills[victim] = self.kills.get(victim, 0) + 1
        if victim in ("node", "node-and-services"):
            assert self.node is not None
            self.node.kill()
            if victim == "node-and-services":  # not left to notice their parent is gone
                for pid in self.services.values():
                    if pid > 0:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            self.node.wait()
            wait_gone([pid for pid in self.services.values() if pid > 0])
            # writers may still be appending to the dead node's block until the next node
            # fences it: under SYNC_FLUSH none of that is acknowledged (nobody flushes it);
            # under ASYNC_FLUSH what is acknowledged is in the files (SIGKILL leaves the page
            # cache), and the next node fences the block before it recovers
            check_store(self.root, allow_torn_tail=True, quiescent=False).raise_if_failed()
            self.start_node()
            return victim
        elif victim in self.services:
            pid = self.services[victim]
            if pid <= 0:  # being restarted (never kill(-1, ...)): wait for the new one
                self.wait_restarted(victim, pid)
                pid = self.services[victim]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.wait_restarts:
                self.wait_restarted(victim, pid)
        check_store(self.root, quiescent=False).raise_if_failed()
        return victim

    def wait_restarted(self, kind: str, old: int, timeout_s: float = 60.0) -> None:
        """Wait until the node runs a new process of ``kind`` (the node info names a pid other
        than ``old``, and it is alive)."""
        deadline = time.monotonic() + timeout_s
        while True:
            pid = node_services(self.root).get(kind, -1)
            if pid > 0 and pid != old and alive(pid):
                self.services[kind] = pid
                return
            if self.node is not None and self.node.poll() is not None:
                raise AssertionError(f"the node exited ({self.node.returncode}) while {kind} was restarted")
            if time.monotonic() > deadline:
                raise AssertionError(f"the node did not restart its {kind} process (pid {old}) within {timeout_s} s")
            time.sleep(0.05)

    def kill_writer_in_lock(self, within_s: float = 1.0) -> str:
        """SIGKILL a writer while it holds the put lock: watch the control block until the
        writer records itself as the holder (lock_owner_pid its pid, lock_begin_time_ms set),
        freeze it, and kill it if it is still inside (it usually is not: the lock is held for
        microseconds), else let it go on and watch again. Returns "writer-in-lock/<lock kind>",
        or "writer" when within_s passed without catching it inside (a writer that is not
        putting, e.g. starting up or waiting for a restarted flusher): killed where it stands."""
        from mqstore.log._shm import ControlBlock

        name = self.rng.choice(sorted(self.procs))
        p = self.procs.pop(name)
        ctl = ControlBlock.attach(os.path.join(self.root, CONTROL_BLOCK_NAME), readonly=True)

        def holds_lock() -> bool:  # the put lock of any of its CommitLogs
            return any(ctl.get("lock_owner_pid", log=k) == p.pid and ctl.get("lock_begin_time_ms", log=k) != 0
                       for k in range(ctl.log_count))

        give_up = time.monotonic() + within_s
        try:
            while time.monotonic() < give_up:
                watch_until = time.monotonic() + 0.005
                while not holds_lock() and time.monotonic() < watch_until:
                    pass
                try:
                    freeze(p.pid)
                except (ProcessLookupError, TimeoutError):
                    break  # it exited (fenced by a new node): reaped below
                if holds_lock():
                    p.kill()
                    p.wait()
                    return f"writer-in-lock/{self.lock}"
                thaw(p.pid)
        finally:
            ctl.close()
        p.kill()
        p.wait()
        return "writer"

    def finish(self) -> dict[str, int]:
        """Stop writers and the node cleanly; verify every acknowledged message. Returns the
        counts (acks, messages read)."""
        wait_for_new_ack(self, f"see {self.root}")
        for p in self.procs.values():
            p.kill()
            p.wait()
        self.procs.clear()
        assert self.node is not None
        self.node.send_signal(signal.SIGTERM)
        code = self.node.wait(120)
        # every service process ran again after the last kill: the node stops cleanly (without
        # waiting, the last kill may have just taken one, and the node rightly says so)
        assert code == 0 or not self.wait_restarts, f"the node did not stop cleanly (exit {code})"
        check_store(self.root).raise_if_failed()
        from mqstore import MessageStore

        acked = read_acks(self.ack_dir)
        read = 0
        with MessageStore(self.root, **self.settings) as store:
            for name, i, q, qoff, phy in acked:
                m = store.look_message_by_queue_offset("T", q, qoff)
                assert m is not None, f"acknowledged {name}-{i} (queue {q} offset {qoff}) is missing"
                assert bytes(m.body) == f"{name}|{i}|".encode() + b"x" * (i % 300), f"{name}-{i} has another body"
                assert m.physical_offset == phy, f"{name}-{i} is at {m.physical_offset}, acknowledged at {phy}"
            for q in range(QUEUES):
                read += check_queue_order(store, "T", q)
        return {"acks": len(acked), "messages": read}


    def abort(self) -> None:
        """Kill what the soak started (after a failure)."""
        for p in self.procs.values():
            p.kill()
        if self.node is not None and self.node.poll() is None:
            self.node.kill()


def drive(soak: Any, kills: int, progress: bool, every: int = 50) -> dict[str, object]:
    """Run ``kills`` steps of a started soak (``step()``, then ``finish()``; ``abort()`` on any
    failure), printing the kills so far every ``every`` steps when asked."""
    try:
        for n in range(kills):
            soak.step()
            if progress and (n + 1) % every == 0:
                print(f"{n + 1} kills: {soak.kills}", flush=True)
        counts = soak.finish()
    except BaseException:
        soak.abort()
        raise
    return {"kills": dict(soak.kills), **counts}


def run(root: str, kills: int, seed: int | str, writers: int = 2, env: dict[str, str] | None = None,
        progress: bool = False, rate: float = 100.0, logs: int = 1, flush: str = "SYNC_FLUSH",
        wait_restarts: bool = False) -> dict[str, object]:
    soak = Soak(os.path.abspath(root), random.Random(seed), writers, env or dict(os.environ), rate=rate, logs=logs,
                flush=flush, wait_restarts=wait_restarts)
    soak.start_node()
    return drive(soak, kills, progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqstore.tools.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a new store directory")
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100.0,
                        help="messages/s each writer puts at most (0: flat out); the checker scans the whole store "
                             "after every kill, so a faster store makes every step slower")
    parser.add_argument("--seed", default="soak")
    parser.add_argument("--logs", type=int, default=1, help="commit_log_count of the store (CommitLogs in parallel)")
    parser.add_argument("--flush", choices=("SYNC_FLUSH", "ASYNC_FLUSH"), default="SYNC_FLUSH")
    parser.add_argument("--wait-restarts", action="store_true",
                        help="after killing a service process, wait for the node to restart it before the checker")
    args = parser.parse_args(argv)
    result = run(args.root, args.kills, args.seed, args.writers, progress=True, rate=args.rate, logs=args.logs,
                 flush=args.flush, wait_restarts=args.wait_restarts)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
