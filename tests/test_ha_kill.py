"""SYNC_MASTER under SIGKILL (docs/replication.md): a master node and a slave node (``mqstore
node`` processes), writer processes attached to the master putting one message at a time and
logging every PUT_OK; at random moments the master's HA process, then the slave's, then the
whole master node are killed. Afterwards every acknowledged message is in the slave's
CommitLog, byte for byte at the master's offset: a SYNC_MASTER PUT_OK means the slave has it.
And the short version of the replication soak (python -m mqstore.tools.ha_soak DIR --kills 300):
random SIGKILLs of every process of both nodes, both nodes themselves included."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqstore.log._shm import ControlBlock

from helpers_proc import wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

REPO = str(Path(__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
FS = 1 << 20
WRITER = """
import json, sys
from mqstore import Message, MessageStore
store = MessageStore.attach(sys.argv[1])
out = open(sys.argv[2], "a", buffering=1)
i = 0
while True:
    r = store.put_message(Message("T", b"%s-%d-" % (sys.argv[3].encode(), i) + b"x" * (i % 200), queue_id=i % 4))
    if r.status.name == "PUT_OK":
        out.write(json.dumps([r.wrote_offset, r.wrote_bytes]) + "\\n")
    i += 1
"""


def node(root: str, **settings) -> subprocess.Popen:
    argv = [sys.executable, "-m", "mqstore.tools.cli", "node", root]
    argv += [f"--set={k}={v}" for k, v in {"mapped_file_size_commit_log": FS, **settings}.items()]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "owner pid" in line, line
    return proc


def ha_pid(root: str) -> int:
    path = os.path.join(root, "ha.json")
    wait_until(lambda: os.path.exists(path), 30, f"{path}")
    return int(json.load(open(path, encoding="utf-8"))["pid"])


def test_every_sync_master_ack_is_on_the_slave_after_kills(tmp_path):
    rng = random.Random(os.environ.get("MQSTORE_SEED", "19"))
    mroot, sroot = str(tmp_path / "master"), str(tmp_path / "slave")
    master = node(mroot, broker_role="SYNC_MASTER", ha_listen_port=0)
    procs = [master]
    mctl = sctl = None
    try:
        mctl = ControlBlock.attach(os.path.join(mroot, "mqstore.shm"), readonly=True)
        wait_until(lambda: mctl.get("ha_port") > 0, 30, "the master's HA port")
        slave = node(sroot, broker_role="SLAVE", ha_master_address=f"127.0.0.1:{mctl.get('ha_port')}")
        procs.append(slave)
        sctl = ControlBlock.attach(os.path.join(sroot, "mqstore.shm"), readonly=True)
        wait_until(lambda: mctl.get("ha_slaves") > 0, 30, "the slave to connect")
        acks = str(tmp_path / "acks.jsonl")
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, mroot, acks, f"w{k}"], env=ENV) for k in range(3)]
        procs += writers
        time.sleep(rng.uniform(0.5, 1.5))
        killed = ha_pid(mroot)
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: ha_pid(mroot) != killed and mctl.get("ha_slaves") > 0, 30, "the master's HA process back")
        time.sleep(rng.uniform(0.3, 1.0))
        killed = ha_pid(sroot)
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: ha_pid(sroot) != killed and mctl.get("ha_slaves") > 0, 30, "the slave's HA process back")
        time.sleep(rng.uniform(0.5, 1.5))
        os.kill(master.pid, signal.SIGKILL)  # the master is lost; its service processes follow it
        master.wait(10)
        for w in writers:
            w.kill()
            w.wait(10)
        acked = [json.loads(line) for line in open(acks, encoding="utf-8") if line.strip()]
        assert len(acked) > 100, f"only {len(acked)} puts were acknowledged"
        assert sctl.get("wrote") >= max(o + n for o, n in acked)
        missing = []
        for offset, size in acked:
            name = f"{offset - offset % FS:020d}"
            with open(os.path.join(mroot, "commitlog", name), "rb") as a, \
                    open(os.path.join(sroot, "commitlog", name), "rb") as b:
                a.seek(offset % FS)
                b.seek(offset % FS)
                if a.read(size) != b.read(size):
                    missing.append(offset)
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages are not on the slave: {missing[:5]}"
    finally:
        for ctl in (mctl, sctl):
            if ctl is not None:
                ctl.close()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


def test_random_sigkills_of_both_nodes_and_their_processes(tmp_path):
    """25 SIGKILLs picked at random among writers, every service process of the master and of
    the slave (their HA processes more often) and the two nodes themselves, with the checker on
    both stores after every kill; at the end every acknowledged put is on the slave at its queue
    offset, and the two CommitLogs are the same byte for byte."""
    from mqstore.tools import ha_soak

    result = ha_soak.run(str(tmp_path / "pair"), kills=25, seed=os.environ.get("MQSTORE_SEED", "suite"), env=ENV)
    kills = result["kills"]
    assert isinstance(kills, dict) and sum(kills.values()) == 25
    assert {"master-ha", "slave-ha"} <= set(kills), kills
    assert {"master-node", "slave-node"} & set(kills), kills
    assert result["acks"] and result["messages"] >= result["acks"]
