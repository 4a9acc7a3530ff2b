"""The multi-process node: service processes, attached writers and readers in other OS
processes, restarts, and SIGKILLs of every kind of process (issue 4).

Everything here is real: the node's service processes are OS processes, producers and
consumers are separate Python processes attached with MessageStore.open, kills are SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore import MessageStore
from mqstore.log._shm import ControlBlock
from mqstore.tools.checker import check_store
from mqstore.config import StoreConfig
from mqstore.store import AttachedStore
from helpers_store import read_bodies

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
FS = 256 * 1024  # CommitLog file size: every test rolls files, so the allocator process works
NODE_CFG = {"service_mode": "processes", "mapped_file_size_commit_log": FS,
            "mapped_file_size_consume_queue": 20 * 500, "flush_interval_commit_log": 50,
            "flush_interval_consume_queue": 100}
QUEUES = 4

PRODUCER = textwrap.dedent("""
    import json, os, sys
    from mqstore import Message, MessageStore
    root, name, n, sync_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = MessageStore.open(root)
    out = open(sys.argv[5], "a", buffering=1) if len(sys.argv) > 5 else None
    for i in range(n):
        body = f"{name}|{i}|".encode() + b"x" * (i % 200)
        r = store.put_message(Message("T", body, queue_id=i % NQ, keys=[f"{name}-{i}"]))
        r.check()
        if out is not None:
            out.write(json.dumps([name, i, i % NQ, r.queue_offset, r.wrote_offset]) + "\\n")
    store.close()
    print("DONE", n)
""").replace("NQ", str(QUEUES))

CONSUMER = textwrap.dedent("""
    import json, sys, time
    from mqstore import MessageStore
    root, expect = sys.argv[1], int(sys.argv[2])
    store = MessageStore.open(root)
    seen, next_off, deadline = {}, [0] * NQ, time.monotonic() + 120
    while sum(len(v) for v in seen.values()) < expect and time.monotonic() < deadline:
        got = 0
        for q in range(NQ):
            r = store.get_message("g", "T", q, next_off[q], 32)
            for m in r:
                assert m.queue_offset == next_off[q], (q, m.queue_offset, next_off[q])
                name, i, pad = bytes(m.body).split(b"|")
                assert len(pad) == int(i) % 200, "body cut"
                seen.setdefault((q, name.decode()), []).append(int(i))
                next_off[q] += 1
                got += 1
        if not got:
            time.sleep(0.01)
    store.close()
    print(json.dumps({f"{q}/{n}": v for (q, n), v in seen.items()}))
""").replace("NQ", str(QUEUES))


def run_py(code: str, *args: object, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def start_py(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def drain(store: MessageStore, topic: str = "T") -> dict[int, list[bytes]]:
    return read_bodies(store, topic, QUEUES)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- producers and consumers in many processes --------------------------------------------------

@pytest.mark.parametrize("lock", ["spin", "mutex"])
@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_producers_and_consumers_in_many_processes(tmp_path, lock, flush):
    """3 producer and 2 consumer processes on one node: every consumer sees every message once,
    in queue-offset order, each producer's messages in its own order, bodies intact."""
    root = str(tmp_path / "store")
    producers, per = 3, 1500
    with MessageStore(root, use_reentrant_lock_when_put_message=(lock == "mutex"), flush_disk_type=flush,
                      **NODE_CFG) as node:
        assert node.supervisor is not None and all(alive(p) for p in node.supervisor.pids().values())
        consumers = [start_py(CONSUMER, root, producers * per) for _ in range(2)]
        procs = [start_py(PRODUCER, root, f"p{k}", per, 0) for k in range(producers)]
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-3000:]
        for c in consumers:
            out, err = c.communicate(timeout=180)
            assert c.returncode == 0, err[-3000:]
            seen = json.loads(out)
            for k in range(producers):
                mine = [i for q in range(QUEUES) for i in seen.get(f"{q}/p{k}", [])]
                assert sorted(mine) == list(range(per)), f"producer p{k}: {len(mine)} of {per}"
                for q in range(QUEUES):
                    got = seen.get(f"{q}/p{k}", [])
                    assert got == sorted(got), f"p{k} out of order in queue {q}"
        assert node.wait_dispatched(timeout_ms=30_000)
        assert sum(len(v) for v in drain(node).values()) == producers * per  # the owner reads them too
        assert node.stats()["put_messages"] == producers * per
        if flush == "SYNC_FLUSH":
            assert node.positions()["flushed"] == node.positions()["wrote"]
    check_store(root).raise_if_failed()
    assert not os.path.exists(os.path.join(root, "abort"))


def test_attach_uses_the_owner_configuration(tmp_path):
    """An attached store runs with the owner's configuration; asking for another geometry is
    refused naming the key; puts and reads work against a threads-mode owner too."""
    root = str(tmp_path / "store")
    with MessageStore(root, mapped_file_size_commit_log=FS) as owner:
        with pytest.raises(Exception, match="mapped_file_size_commit_log"):
            MessageStore.open(root, mapped_file_size_commit_log=2 * FS)
        with MessageStore.open(root) as attached:
            assert isinstance(attached, AttachedStore)
            assert attached.config.mapped_file_size_commit_log == FS
            for i in range(3000):  # rolls files: the owner's allocate thread serves the request
                attached.put("A", b"a" * 100, queue_id=i % 2).check()
            assert attached.wait_dispatched(timeout_ms=10_000)
            assert attached.get_max_offset_in_queue("A", 0) == 1500
            r = attached.get_message("g", "A", 1, 1490, 32)
            assert r.status.name == "FOUND" and len(r) == 10
        assert owner.get_max_offset_in_queue("A", 1) == 1500
        assert owner.get_max_phy_offset() > 2 * FS
    check_store(root).raise_if_failed()


def test_attached_puts_are_refused_after_the_owner_shuts_down(tmp_path):
    root = str(tmp_path / "store")
    owner = MessageStore(root, **NODE_CFG)
    attached = MessageStore.open(root)
    attached.put("A", b"x").check()
    owner.shutdown()
    r = attached.put("A", b"y")
    assert r.status.name == "SERVICE_NOT_AVAILABLE" and "not writable" in r.detail
    attached.close()
    with MessageStore(root, **{**NODE_CFG, "service_mode": "threads"}) as again:
        assert again.last_exit_ok and again.get_max_offset_in_queue("A", 0) == 1


# -- kills -------------------------------------------------------------------------------------

@pytest.mark.parametrize("victim", ["dispatcher", "flusher", "allocator"])
def test_a_killed_service_process_is_restarted(tmp_path, victim):
    """SIGKILL a service process while a producer writes (SYNC_FLUSH): the supervisor starts a
    new one, the producer's puts all succeed, and every message is read back once."""
    root = str(tmp_path / "store")
    with MessageStore(root, flush_disk_type="SYNC_FLUSH", **NODE_CFG) as node:
        assert node.supervisor is not None
        producer = start_py(PRODUCER, root, "p", 4000, 0)
        time.sleep(0.3)
        old = node.supervisor.pids()[victim]
        os.kill(old, signal.SIGKILL)
        out, err = producer.communicate(timeout=180)
        assert producer.returncode == 0, err[-3000:]
        deadline = time.monotonic() + 30
        while node.supervisor.pids()[victim] in (old, -1) and time.monotonic() < deadline:
            time.sleep(0.05)
        new = node.supervisor.pids()[victim]
        assert new not in (old, -1) and alive(new)
        assert node.wait_dispatched(timeout_ms=30_000)
        bodies = drain(node)
        assert sorted(int(b.split(b"|")[1]) for v in bodies.values() for b in v) == list(range(4000))
        check_store(root, quiescent=False).raise_if_failed()
    check_store(root).raise_if_failed()
    assert not os.path.exists(os.path.join(root, "abort")), "the restarted service did not stop cleanly"


@pytest.mark.parametrize("lock", ["spin", "mutex"])
def test_a_writer_that_dies_holding_the_put_lock_does_not_block_the_others(tmp_path, lock):
    """A process takes the put lock and is SIGKILLed holding it: the next put (another
    process) takes the lock over (spin: the dead owner's pid; mutex: the kernel's robust
    mutex) and the queue offsets stay consecutive."""
    root = str(tmp_path / "store")
    with MessageStore(root, use_reentrant_lock_when_put_message=(lock == "mutex"), **NODE_CFG) as node:
        node.put("T", b"before", queue_id=0).check()
        holder = start_py(textwrap.dedent("""
            import os, signal, sys
            from mqstore.log._shm import ControlBlock
            ctl = ControlBlock.attach(sys.argv[1])
            ctl.acquire_put_lock()
            print("HELD", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """), os.path.join(root, "mqstore.shm"))
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        holder.wait()
        assert holder.returncode == -signal.SIGKILL
        res = run_py(PRODUCER, root, "after", 10, 0)
        assert res.returncode == 0, res.stderr[-3000:]
        assert node.stats()["lock_takeovers"] >= 1
        assert node.wait_dispatched(timeout_ms=10_000)
        assert node.get_max_offset_in_queue("T", 0) == 1 + 3  # "after" puts 0, 4, 8 go to queue 0
    check_store(root).raise_if_failed()


def test_killing_the_node_owner_stops_its_services_and_the_store_recovers(tmp_path):
    """SIGKILL the owner (the supervisor): its service processes notice and exit; the next
    open recovers abnormally and every acknowledged SYNC_FLUSH message is there."""
    root = str(tmp_path / "store")
    acks = str(tmp_path / "acks.jsonl")
    node = subprocess.Popen([sys.executable, "-m", "mqstore.tools.cli", "node", root, "--set", "flush_disk_type=SYNC_FLUSH",
                             *[f"--set={k}={v}" for k, v in NODE_CFG.items() if k != "service_mode"]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert node.stdout is not None
    line = node.stdout.readline()
    assert "owner pid" in line, node.stderr.read() if node.poll() is not None else line  # type: ignore[union-attr]
    services = [int(p.split()[-1]) for p in line.strip().split(", ")[1:]]
    producer = start_py(PRODUCER, root, "p", 100_000, 0, acks)
    time.sleep(1.0)
    status = subprocess.run([sys.executable, "-m", "mqstore.tools.cli", "node", "status", root, "--json"],
                            capture_output=True, text=True, env=ENV, timeout=60)
    assert status.returncode == 0, status.stderr
    live = json.loads(status.stdout)
    assert live["state"] == "READY" and live["owner_pid"] == node.pid and live["owner_alive"]
    assert sorted(s["pid"] for s in live["services"].values()) == sorted(services)
    assert all(s["alive"] for s in live["services"].values()) and live["stats"]["put_messages"] > 0
    node.kill()
    node.wait()
    producer.kill()
    producer.wait()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in services) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in services), "service processes outlived the node"
    after = subprocess.run([sys.executable, "-m", "mqstore.tools.cli", "node", "status", root, "--json"],
                                   capture_output=True, text=True, env=ENV, timeout=60)
    dead = json.loads(after.stdout)
    assert after.returncode == 1 and not dead["owner_alive"]
    assert not any(s["alive"] for s in dead["services"].values())
    acked = [json.loads(x) for x in open(acks)]
    assert acked, "the producer acknowledged nothing before the kill"
    check_store(root, allow_torn_tail=True).raise_if_failed()
    with MessageStore(root, flush_disk_type="SYNC_FLUSH", **{**NODE_CFG, "service_mode": "threads"}) as store:
        assert not store.last_exit_ok
        for name, i, q, qoff, phy in acked:
            m = store.look_message_by_queue_offset("T", q, qoff)
            assert m is not None and bytes(m.body).startswith(f"{name}|{i}|".encode()), (i, q, qoff)
    check_store(root).raise_if_failed()


def test_random_sigkills_of_every_process_kind(tmp_path):
    """The short version of the soak (python -m mqstore.tools.soak DIR --kills 1000): 100 SIGKILLs
    of writers (some caught inside the put lock, with either lock kind), service processes and
    the node at random moments; the checker after every kill; at the end every acknowledged
    SYNC_FLUSH message is at its queue offset."""
    from mqstore.tools import soak

    result = soak.run(str(tmp_path / "store"), kills=100, seed="suite", env=ENV)
    kills = result["kills"]
    assert isinstance(kills, dict) and sum(kills.values()) >= 100
    assert {"writer", "node", "dispatcher", "flusher"} <= set(kills), kills
    assert any(k.startswith("writer-in-lock/") for k in kills), kills  # killed while holding the put lock
    assert result["acks"] and result["messages"] >= result["acks"]


def test_query_by_key_follows_the_dispatcher_process(tmp_path):
    """query_message in the node's owner and in an attached process finds keys the dispatcher
    process indexed after they opened (index files mapped as they appear, headers re-read)."""
    root = str(tmp_path / "store")
    with MessageStore(root, max_hash_slot_num=64, max_index_num=100, **NODE_CFG) as node:
        with MessageStore.open(root) as attached:
            res = run_py(PRODUCER, root, "p", 300, 0)  # 300 keys: several index files of 100 entries
            assert res.returncode == 0, res.stderr[-3000:]
            assert node.wait_dispatched(timeout_ms=10_000)
            for store in (node, attached):
                for i in (0, 150, 299):
                    hits = store.query_message("T", f"p-{i}").messages
                    assert [bytes(m.body).split(b"|")[:2] for m in hits] == [[b"p", str(i).encode()]], (store, i)
            assert len(os.listdir(os.path.join(root, "index"))) >= 3


def test_freeze_returns_once_every_thread_is_stopped(tmp_path):
    """Regression (CI, test_pool): kill(SIGSTOP) returns before the process stops, and a thread
    of it woken meanwhile went on committing. freeze() waits until no thread runs: a counter
    that a busy thread bumps in a shared file stays put afterwards."""
    from mqstore.tools.soak import freeze, stopped, thaw

    path = tmp_path / "counter"
    path.write_bytes(b"\0" * 8)
    p = start_py(textwrap.dedent("""
        import mmap, struct, sys, threading
        f = open(sys.argv[1], "r+b")
        m = mmap.mmap(f.fileno(), 8)
        def spin():
            n = 0
            while True:
                n += 1
                m[:8] = struct.pack("<q", n)
        threading.Thread(target=spin, daemon=True).start()
        print("GO", flush=True)
        threading.Event().wait()
    """), str(path))
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "GO"
        freeze(p.pid)
        assert stopped(p.pid)
        first = path.read_bytes()
        time.sleep(0.2)
        assert path.read_bytes() == first
        thaw(p.pid)
        deadline = time.monotonic() + 10
        while path.read_bytes() == first:
            assert time.monotonic() < deadline, "the process did not run again after thaw()"
            time.sleep(0.01)
    finally:
        p.kill()
        p.wait()


def test_the_dispatcher_process_takes_a_pass_per_millisecond_not_per_few_records(tmp_path):
    """Regression (bench: the dispatcher process burned 60 % of a core behind one writer): a
    dispatch pass goes to the readable end seen when it starts, and the reput service waits
    its 1 ms between passes (RocketMQ's doReput loop), so a writer putting flat out is
    dispatched in passes of many records, not in a pass per handful."""
    from mqstore import Message

    root = str(tmp_path / "store")
    with MessageStore(root, service_mode="processes", mapped_file_size_commit_log=64 << 20) as node:
        msgs = [Message("T", b"x" * 100, queue_id=0) for _ in range(20_000)]
        before = node.stats()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            for m in msgs:
                node.put_message(m)
        elapsed_ms = (time.monotonic() - t0) * 1000
        assert node.wait_dispatched(timeout_ms=10_000)
        after = node.stats()
    records = after["dispatch_records"] - before["dispatch_records"]
    passes = after["dispatch_batches"] - before["dispatch_batches"]
    assert records == after["put_messages"] - before["put_messages"] > 0
    # one kernel call per pass, plus one per CommitLog file a pass crosses; a 1 ms wait between
    assert passes <= elapsed_ms + 100, (passes, records, elapsed_ms)


def test_background_services_run_at_a_lower_priority(tmp_path):
    """The allocator and the cleaner work ahead of need and run niced, so their bursts (a new
    file's pages zero-filled, a deletion run) do not take a core from writers, the flusher
    or the dispatcher."""
    from mqstore.node import BACKGROUND_NICE
    from mqstore.procs import proc_stat

    def nice(pid: int) -> int:
        return int(proc_stat(pid)[16])

    with MessageStore(str(tmp_path / "store"), **NODE_CFG) as node:
        pids = node.supervisor.pids()
        base = nice(os.getpid())
        assert nice(pids["allocator"]) == nice(pids["cleaner"]) == min(19, base + BACKGROUND_NICE)
        assert nice(pids["flusher"]) == nice(pids["dispatcher"]) == base


@pytest.mark.parametrize("pool", [False, True], ids=["plain", "transient-pool"])
def test_an_idle_dispatcher_sleeps_until_a_put_wakes_it(tmp_path, monkeypatch, pool):
    """After a second without work the reput arms the control block's idle flag and sleeps
    (IDLE_SLEEP_MS, made a minute here); the next put (with the transient store pool: the
    commit that makes it readable) wakes it, so the message is dispatched at once and an
    idle node does not poll."""
    from mqstore.services import reput

    monkeypatch.setattr(reput, "IDLE_SLEEP_MS", 60_000.0)
    extra = {"transient_store_pool_enable": True, "transient_store_pool_size": 2} if pool else {}
    with MessageStore(str(tmp_path / "store"), mapped_file_size_commit_log=FS, **extra) as store:
        store.put("T", b"first").check()
        assert store.wait_dispatched(timeout_ms=10_000)
        deadline = time.monotonic() + 10
        while store.ctl.get("dispatch_idle") != 1:
            assert time.monotonic() < deadline, "the dispatcher never went idle"
            time.sleep(0.05)
        store.put("T", b"wakes it").check()
        if pool:
            assert store.commit(timeout_ms=10_000)
        assert store.wait_dispatched(timeout_ms=10_000), "the put did not wake the idle dispatcher"
        assert [bytes(m.body) for m in store.get_message("g", "T", 0, 0, 8)] == [b"first", b"wakes it"]
