"""Crash tests of a store with several CommitLogs (issue 27, docs/parallel-commitlogs.md):
SIGKILLs of a node's writers, service processes and the node itself at random moments with
the checker after every kill (mqstore.tools.soak), and a slave ahead of a new master on one
log that cuts that log alone back to the master's end.

The seed of the random kills is printed (``-s`` shows it); ``MQSTORE_SEED=<seed>`` replays it
(the victims and the pauses before each kill; what the processes were doing at that moment
is up to the machine).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil

import pytest

from mqstore.tools.checker import check_store

from helpers_proc import wait_until
from test_multilog import _queue_log, _same_logs, _several

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

#: every kind of process a kill can take: the writers (one watched for holding a log's put lock
#: and killed there when the watch catches it inside: the lock is held for microseconds),
#: each service process (every one serves every log), the node alone (its service processes
#: exit when they see it gone) and the node with its service processes at once
VICTIMS = ("writer", "writer-in-lock", "allocator", "flusher", "dispatcher", "cleaner", "node", "node-and-services")


def _seed(what: str) -> str:
    seed = os.environ.get("MQSTORE_SEED") or f"{what}-{random.randrange(1 << 32)}"
    print(f"{what}: seed {seed} (MQSTORE_SEED={seed} replays it)")
    return seed


def _soak_over_logs(root: str, logs: int, flush: str, seed: str, random_kills: int) -> dict[str, object]:
    """A node with ``logs`` CommitLogs and two attached writer processes: one SIGKILL of every
    kind in VICTIMS, in a random order, then ``random_kills`` of kinds picked at random, each
    after a random pause; after each the node's restart (of the service killed, or of the whole
    node) and the checker; then finish(): the node stopped cleanly and every acknowledged put
    read back (mqstore.tools.soak.Soak.finish)."""
    from mqstore.tools import soak

    s = soak.Soak(root, random.Random(seed), writers=2, env=ENV, logs=logs, flush=flush, wait_restarts=True)
    order = list(VICTIMS)
    s.rng.shuffle(order)
    s.start_node()
    try:
        for victim in order:
            s.step(victim)
        for _ in range(random_kills):
            s.step()
        counts = s.finish()
    except BaseException:
        s.abort()
        raise
    return {"kills": dict(s.kills), **counts}


@pytest.mark.multiprocess
@pytest.mark.parametrize("logs, flush", [(2, "SYNC_FLUSH"), (3, "ASYNC_FLUSH")])
def test_sigkills_of_writers_services_and_the_node_over_several_logs(tmp_path, logs, flush):
    """SIGKILL at random moments, over a node whose store has two (SYNC_FLUSH) or three
    (ASYNC_FLUSH: a put is acknowledged once in the mapped file, which a SIGKILL leaves in
    the page cache, so nothing acknowledged may be lost either) CommitLogs: a writer, a writer
    watched for holding a log's put lock, each service process, the node, the node with its service
    processes; the checker after every kill (on the live store, or on the files the dead node
    left); at the end every acknowledged put is at its queue offset and physical offset with
    its body, each queue's offsets run from 0 without a gap, each writer's puts in each queue
    in its order, every record in its queue's log, and every log got puts."""
    from mqstore import MessageStore

    root = str(tmp_path / "store")
    result = _soak_over_logs(root, logs, flush, _seed(f"n{logs}-{flush}"), random_kills=2)
    print(result)
    kills = result["kills"]
    assert isinstance(kills, dict) and sum(kills.values()) == len(VICTIMS) + 2, kills
    assert {"writer", "node", "node-and-services", "allocator", "flusher", "dispatcher", "cleaner"} <= set(kills)
    assert result["acks"] and result["messages"] >= result["acks"]  # type: ignore[operator]
    with MessageStore(root) as store:
        assert store.last_exit_ok and store.config.commit_log_count == logs
        assert all(hi > lo for _, lo, hi in store.logs()), f"a log got no puts: {store.logs()}"
        assert {_queue_log("T", q, logs) for q in range(4)} == set(range(logs))
    check_store(root).raise_if_failed()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_many_sigkills_of_a_node_over_three_logs(tmp_path):
    """A longer run of the test above: three CommitLogs, SYNC_FLUSH, one kill of every kind and
    12 at random (the soak is the script: python -m mqstore.tools.soak DIR --logs 3 --kills 1000;
    the suite keeps this one short, as CI runs it on 2 cores)."""
    result = _soak_over_logs(str(tmp_path / "store"), 3, "SYNC_FLUSH", _seed("n3-long"), random_kills=12)
    assert result["acks"] and result["messages"] >= result["acks"]  # type: ignore[operator]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigkills_of_a_master_and_slave_of_two_logs_leave_each_log_byte_for_byte(tmp_path):
    """The replication soak over two CommitLogs (python -m mqstore.tools.ha_soak DIR --logs 2):
    a SYNC_MASTER node and a SLAVE node, writers on the master; the slave node killed (and
    started again) and its HA process killed (and restarted by it), the master node killed, then
    16 SIGKILLs at random among the writers, every service process of both nodes (their HA
    processes more often) and the two nodes themselves, the checker on both stores after every
    kill; at the end every acknowledged put is on the slave at its queue and physical offset,
    and each log of the slave is the master's byte for byte."""
    from mqstore.tools import ha_soak

    s = ha_soak.HASoak(str(tmp_path / "pair"), random.Random(_seed("ha-n2")), env=ENV, logs=2)
    first = ["slave-node", "slave-ha", "master-node", "slave-node"]
    s.start()
    try:
        for victim in first:
            s.step(victim)
        for _ in range(16):
            s.step()
        result = s.finish()
    except BaseException:
        s.abort()
        raise
    print(s.kills, result)
    assert sum(s.kills.values()) == 20 and s.kills["slave-node"] >= 2
    assert result["acks"] and result["messages"] >= result["acks"]


# -- a slave ahead of a new master on one log ---------------------------------------------------
def _digest(paths: list[str]) -> dict[str, str]:
    out = {}
    for path in paths:
        with open(path, "rb") as fh:
            out[os.path.basename(path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.mark.parametrize("mode", ["threads", pytest.param("processes", marks=pytest.mark.multiprocess)])
def test_a_slave_ahead_of_its_new_master_on_one_log_cuts_that_log_alone(tmp_path, mode):
    """A slave of two CommitLogs follows a master; the master's disk is copied (what the new
    master will hold), and the master takes more puts into queues of log 1 only, which the
    slave gets. The copy then becomes the master (a failover to a node that never had them):
    the slave's log 1 is ahead of it, its log 0 is not. The slave cuts log 1 back to the new
    master's end (its queues and index with it) and leaves log 0 alone, byte for byte; then it
    follows the new master in both logs, each log byte for byte the master's, and the checker
    passes on both."""
    from mqstore import Message, MessageStore, PutMessageStatus
    from mqstore.ha import read_truncation, write_ha_master

    q0 = [q for q in range(8) if _queue_log("T", q, 2) == 0][:2]
    q1 = [q for q in range(8) if _queue_log("T", q, 2) == 1][:2]
    sent: dict[int, list[bytes]] = {q: [] for q in q0 + q1}

    def put(store: MessageStore, queues: list[int], n: int) -> None:
        for i in range(n):
            q = queues[i % len(queues)]
            body = b"q%d-%05d-" % (q, len(sent[q])) + b"z" * (i % 700)
            r = store.put_message(Message("T", body, queue_id=q, keys=f"k{q}-{len(sent[q])}"))
            assert r.status is PutMessageStatus.PUT_OK, (r.status, r.detail)
            sent[q].append(body)

    def master(name: str) -> MessageStore:
        return _several(tmp_path / name, 2, ha_listen_port=0, **small_index)

    def follow(m: MessageStore) -> None:
        write_ha_master(slave.root, f"127.0.0.1:{m.ctl.get('ha_port')}")

    def caught_up(m: MessageStore) -> bool:
        return all(slave.ctl.get("wrote", log=k) == m.ctl.get("wrote", log=k)
                   and slave.ctl.get("dispatched", log=k) == slave.ctl.get("wrote", log=k)
                   and m.ctl.get("dispatched", log=k) == m.ctl.get("wrote", log=k) for k in (0, 1))

    small_index = {"max_hash_slot_num": 64, "max_index_num": 1000}  # (a copy of the store copies its index files)
    slave = _several(tmp_path / "slave", 2, broker_role="SLAVE", service_mode=mode,  # follows what ha_master says
                     **small_index)
    first = second = None
    try:
        first = master("first")
        follow(first)
        put(first, q0 + q1, 800)  # both logs roll (64 KiB files)
        wait_until(lambda: caught_up(first), timeout_s=60, what="the slave to catch up")
        first.shutdown()
        shutil.copytree(first.root, tmp_path / "second")  # what the new master's disk will hold
        kept = {q: len(v) for q, v in sent.items()}
        first = master("first")
        follow(first)
        put(first, q1, 300)  # log 1 only: the slave gets these, the new master never will
        wait_until(lambda: caught_up(first), timeout_s=60, what="the slave to catch up again")
        held = [slave.ctl.get("wrote", log=k) for k in (0, 1)]
        log0 = [mf.path for mf in slave.commitlogs[0].queue.files]
        before = _digest(log0)
        first.shutdown()
        first = None
        second = master("second")
        ends = [second.ctl.get("wrote", log=k) for k in (0, 1)]
        assert ends[0] == held[0] and (1 << 56) < ends[1] < held[1]
        follow(second)
        wait_until(lambda: read_truncation(slave.root) is not None, timeout_s=60, what="the slave to truncate")
        done = read_truncation(slave.root)
        assert (done["offset"], done["end"], done["dropped_bytes"]) == (ends[1], held[1], held[1] - ends[1])
        assert sum(done["queue_units_dropped"].values()) == 300 and done["index_entries_dropped"] >= 300
        assert {key.split("/")[1] for key in done["queue_units_dropped"]} <= {str(q) for q in q1}
        assert not os.path.exists(os.path.join(slave.root, "ha_truncate"))  # the request was carried out
        assert [slave.ctl.get("wrote", log=k) for k in (0, 1)] == ends
        assert _digest(log0) == before, "log 0 changed"  # untouched, byte for byte
        for q, n in kept.items():
            assert slave.get_max_offset_in_queue("T", q) == n, f"queue {q}"
            del sent[q][n:]
        put(second, q0 + q1, 400)  # the slave follows the new master in both logs
        wait_until(lambda: caught_up(second), timeout_s=60, what="the slave to follow the new master")
        _same_logs(second, slave)
        for q, bodies in sent.items():
            for store in (second, slave):
                got = store.read_messages("T", q, 0, 10_000)
                assert [bytes(b) for b in got.bodies()] == bodies, f"queue {q} on {store.root}"
                assert {p >> 56 for p in got.physical_offsets} == {_queue_log("T", q, 2)}
        q = q1[0]  # the keys the dropped messages had are found once, at the new master's messages
        for key in (f"k{q}-{kept[q]}", f"k{q}-{kept[q] + 1}"):
            theirs = [m.physical_offset for m in second.query_message("T", key, max_num=8).messages]
            assert [m.physical_offset for m in slave.query_message("T", key, max_num=8).messages] == theirs
            assert len(theirs) == 1, key
    finally:
        slave.shutdown()
        for m in (first, second):
            if m is not None:
                m.shutdown()
    for name in ("slave", "second", "first"):
        check_store(str(tmp_path / name)).raise_if_failed()
