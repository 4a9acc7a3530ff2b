"""Fault injection on a replicating pair: a SYNC_MASTER node and a SLAVE node (``mqstore node``
processes), writer processes attached to the master putting one message at a time and logging
every PUT_OK, and at random moments a SIGKILL of one of: a writer, the master's HA process, the
slave's HA process, another service process of either node, the slave node, or the master node
(docs/replication.md). A killed service process is restarted by its node, a killed node is
started again (on the same HA port: the slave follows that address), a killed writer is
replaced. After every kill the invariant checker runs on both stores.

A SYNC_MASTER acknowledges a put only once the slave has reported holding its bytes, so at the
end (the writers stopped, the slave caught up, both nodes stopped cleanly) every acknowledged
message must be on the slave at its queue offset with its body, and the slave's CommitLog must
be the master's byte for byte. With several CommitLogs (``--logs N``) each log of the slave
must be the master's log byte for byte (a connection per log replicates it).

    python -m mqstore.tools.ha_soak DIR --kills 300 [--logs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mqstore.layout import CONTROL_BLOCK_NAME
from mqstore.procs import alive
from mqstore.tools.checker import check_store
from mqstore.tools.soak import QUEUES, WRITER, drive, launch_node, node_services, read_acks, wait_for_new_ack, wait_gone

#: small files, so the kills land on rolls and new files too
FILE_SETTINGS: dict[str, Any] = {"mapped_file_size_commit_log": 256 * 1024,
                                 "mapped_file_size_consume_queue": 20 * 500}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One node of the pair: its directory, settings, process and service pids."""

    root: str
    settings: dict[str, Any]
    proc: subprocess.Popen[str] | None = None
    services: dict[str, int] = field(default_factory=dict)

    def start(self, env: dict[str, str]) -> None:
        self.proc, self.services = launch_node(self.root, self.settings, env, log_path=self.root + ".log")

    def refresh(self) -> None:
        self.services = node_services(self.root) or self.services

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        wait_gone([pid for pid in self.services.values() if pid > 0])

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


@dataclass
class HASoak:
    base: str
    rng: random.Random
    writers: int = 2
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    rate: float = 100.0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kills: dict[str, int] = field(default_factory=dict)
    serial: int = 0
    logs: int = 1  # commit_log_count of both stores

    def __post_init__(self) -> None:
        os.makedirs(self.base, exist_ok=True)
        port = free_port()
        files = {**FILE_SETTINGS, **({"commit_log_count": self.logs} if self.logs > 1 else {})}
        self.master = Node(os.path.join(self.base, "master"),
                           {**files, "broker_role": "SYNC_MASTER", "ha_listen_port": port})
        self.slave = Node(os.path.join(self.base, "slave"),
                          {**files, "broker_role": "SLAVE", "ha_master_address": f"127.0.0.1:{port}"})

    @property
    def ack_dir(self) -> str:
        return os.path.join(self.base, "acks")

    def start(self) -> None:
        self.master.start(self.env)
        self.slave.start(self.env)

    def start_writer(self) -> None:
        os.makedirs(self.ack_dir, exist_ok=True)
        self.serial += 1
        name = f"w{self.serial}"
        self.procs[name] = subprocess.Popen([sys.executable, "-c", WRITER, self.master.root, name,
                                             os.path.join(self.ack_dir, name), str(self.rate), "skip"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)

    def step(self, victim: str | None = None) -> str:
        """Sleep a random time, then SIGKILL ``victim`` ("writer", "master-node", "slave-node" or
        "<side>-<service kind>"), or one picked at random; then check both stores. Returns what
        was killed."""
        time.sleep(self.rng.uniform(0.0, 0.3))
        for name, p in list(self.procs.items()):
            if p.poll() is not None:
                del self.procs[name]
        while len(self.procs) < self.writers:
            self.start_writer()
        victims = ["writer", "master-node", "slave-node"]
        for side, node in (("master", self.master), ("slave", self.slave)):
            node.refresh()
            victims += [f"{side}-{kind}" for kind, pid in node.services.items() if pid > 0]
        victims += ["master-ha", "slave-ha"] * 2  # replication's own processes more often
        if victim is None:
            victim = self.rng.choice(victims)
        self.kills[victim] = self.kills.get(victim, 0) + 1
        if victim == "writer":
            self.procs.pop(self.rng.choice(sorted(self.procs))).kill()
        elif victim.endswith("-node"):
            node = self.master if victim == "master-node" else self.slave
            node.kill()
            check_store(node.root, allow_torn_tail=True, quiescent=False).raise_if_failed()
            node.start(self.env)
        else:
            side, kind = victim.split("-", 1)
            pid = (self.master if side == "master" else self.slave).services.get(kind, -1)
            if pid > 0:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for node in (self.master, self.slave):
            check_store(node.root, quiescent=False).raise_if_failed()
        return victim

    def abort(self) -> None:
        """Kill what the soak started (after a failure)."""
        for p in self.procs.values():
            p.kill()
        for node in (self.slave, self.master):
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()

    def finish(self, catch_up_s: float = 60.0) -> dict[str, int]:
        """Let the pair acknowledge a put after the last kill, stop the writers, let the slave
        catch up, stop both nodes cleanly, and check every acknowledged message on the slave and
        the two logs byte for byte."""
        from mqstore import MessageStore
        from mqstore.log._shm import ControlBlock

        wait_for_new_ack(self, f"see {self.master.root}.log and {self.slave.root}.log")
        for p in self.procs.values():
            p.kill()
            p.wait()
        self.procs.clear()
        ctls = [ControlBlock.attach(os.path.join(n.root, CONTROL_BLOCK_NAME), readonly=True)
                for n in (self.master, self.slave)]
        try:
            deadline = time.monotonic() + catch_up_s
            for k in range(self.logs):  # each CommitLog of the slave up to the master's
                while ctls[1].get("wrote", log=k) != ctls[0].get("wrote", log=k) or \
                        ctls[1].get("dispatched", log=k) != ctls[1].get("wrote", log=k):
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the slave did not catch up within {catch_up_s} s: its log {k} holds "
                                             f"{ctls[1].get('wrote', log=k)} of the master's "
                                             f"{ctls[0].get('wrote', log=k)} bytes")
                    time.sleep(0.05)
            # a service killed by the last step is restarted before the nodes stop (a node that
            # stops with a service process dead of SIGKILL rightly says it did not stop cleanly)
            for node in (self.master, self.slave):
                while not (pids := node_services(node.root)) or not all(pid > 0 and alive(pid) for pid in pids.values()):
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the service processes of {node.root} did not all run again: {pids}")
                    time.sleep(0.05)
        finally:
            for ctl in ctls:
                ctl.close()
        codes = (self.slave.stop(), self.master.stop())
        assert codes == (0, 0), f"the nodes did not stop cleanly (slave, master exit codes: {codes})"
        for node in (self.master, self.slave):
            check_store(node.root).raise_if_failed()
        acked = read_acks(self.ack_dir)
        with MessageStore(self.master.root, **self.master.settings) as master, \
                MessageStore(self.slave.root, broker_role="SLAVE", **FILE_SETTINGS) as slave:
            assert slave.config.commit_log_count == master.config.commit_log_count == self.logs
            for k, (mine, theirs_log) in enumerate(zip(slave.commitlogs, master.commitlogs)):
                assert slave.get_max_phy_offset(k) == master.get_max_phy_offset(k), f"CommitLog {k}"
                for mf in mine.queue.files:
                    theirs = theirs_log.queue.get(mf.file_from)
                    assert theirs is not None and bytes(memoryview(mf)) == bytes(memoryview(theirs)), \
                        f"CommitLog {k}'s file {mf.file_name} differs between the master and the slave"
            for name, i, q, qoff, phy in acked:
                m = slave.look_message_by_queue_offset("T", q, qoff)
                assert m is not None, f"acknowledged {name}-{i} (queue {q} offset {qoff}) is not on the slave"
                assert m.physical_offset == phy and bytes(m.body) == f"{name}|{i}|".encode() + b"x" * (i % 300), \
                    f"{name}-{i} is another message on the slave"
            messages = sum(slave.get_max_offset_in_queue("T", q) for q in range(QUEUES))
        return {"acks": len(acked), "messages": messages}


def run(base: str, kills: int, seed: int | str, writers: int = 2, env: dict[str, str] | None = None,
        progress: bool = False, rate: float = 100.0, logs: int = 1) -> dict[str, object]:
    soak = HASoak(os.path.abspath(base), random.Random(seed), writers, env or dict(os.environ), rate=rate, logs=logs)
    soak.start()
    return drive(soak, kills, progress, every=25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqstore.tools.ha_soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="a new directory (the master's and the slave's stores go inside)")
    parser.add_argument("--kills", type=int, default=300)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100.0, help="messages/s each writer puts at most (0: flat out)")
    parser.add_argument("--seed", default="ha-soak")
    parser.add_argument("--logs", type=int, default=1, help="commit_log_count of both stores (CommitLogs in parallel)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.dir, args.kills, args.seed, args.writers, progress=True, rate=args.rate,
                         logs=args.logs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
