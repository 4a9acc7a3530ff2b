"""The transient store pool (spec §7, issue 4 item 5): write buffers in shared memory, the
commit service, readers seeing committed bytes only, buffers free again once committed, puts
refused while the pool is exhausted, and what happens to uncommitted bytes when processes die.

Real parts only: the pool is a file on /dev/shm mapped by every process, the node's flusher
process runs the commit service, producers are other OS processes, stalls are SIGSTOP and
deaths SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore import Message, MessageStore
from mqstore.log._shm import TransientStorePool
from mqstore.tools.checker import check_store
from mqstore.errors import ConfigError
from mqstore.log.pool import pool_path
from mqstore.services.flush import CommitRealTimeService
from mqstore.tools.soak import freeze, thaw
from helpers_store import read_bodies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
FS = 64 * 1024
POOL = {"transient_store_pool_enable": True, "transient_store_pool_size": 3, "mapped_file_size_commit_log": FS,
        "mapped_file_size_consume_queue": 20 * 500}
#: a commit service that only commits when asked (least pages never reached, thorough never due)
NO_COMMIT = {"commit_commit_log_least_pages": 100_000, "commit_commit_log_thorough_interval": 3_600_000}
NODE = {"service_mode": "processes", "flush_interval_commit_log": 50, "flush_interval_consume_queue": 100}

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="the transient store pool lives on /dev/shm")

PRODUCER = textwrap.dedent("""
    import json, sys, time
    from mqstore import Message, MessageStore
    root, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = MessageStore.open(root)
    acks = []
    for i in range(n):
        while True:  # a RocketMQ client retries a busy broker (the pool is only 3 small files)
            r = store.put_message(Message("T", f"{name}|{i}|".encode() + b"p" * (i % 150), queue_id=i % 2))
            if r.status.name != "OS_PAGECACHE_BUSY":
                break
            time.sleep(0.001)
        r.check()
        acks.append([i, r.queue_offset])
    store.close()
    print(json.dumps(acks))
""")


def body(i: int) -> bytes:
    return f"m|{i}|".encode() + b"b" * (i % 150)


def read_all(store: MessageStore, topic: str = "T", queues: int = 2) -> dict[int, list[bytes]]:
    return read_bodies(store, topic, queues)


def put_n(store: MessageStore, n: int, start: int = 0) -> list[int]:
    """Put n messages (queue i % 2), retrying while the store is busy (the small pools here can
    run out while the commit thread waits for the GIL); returns their wrote offsets."""
    offsets = []
    for i in range(start, start + n):
        while True:
            r = store.put_message(Message("T", body(i), queue_id=i % 2))
            if r.status.name != "OS_PAGECACHE_BUSY":
                break
            time.sleep(0.001)
        r.check()
        offsets.append(r.wrote_offset)
    return offsets


def test_pool_file_is_shared_memory_tied_to_its_control_block(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **POOL) as store:
        path = pool_path(root)
        assert path.startswith("/dev/shm/") and os.path.exists(path)
        assert os.path.getsize(path) == 4096 + 3 * FS
        assert store.ctl.pool_buffers == 3
        with pytest.raises(ValueError, match="another control block"):
            TransientStorePool.attach(path, store.ctl.created_ms + 1, store.ctl.owner_pid)
        pool = TransientStorePool.attach(path, store.ctl.created_ms, store.ctl.owner_pid)
        assert [pool.buffer_index(k * FS) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]
        pool.close()
    assert not os.path.exists(pool_path(root)), "a clean shutdown removes the pool"


def test_readers_see_committed_bytes_only(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, **POOL, **NO_COMMIT) as store:
        time.sleep(0.05)  # the commit service's first (thorough) round found nothing
        offsets = put_n(store, 50)
        pos = store.positions()
        assert pos["wrote"] > 0 and pos["committed"] == 0, pos
        # nothing committed: the file holds no record, dispatch sees nothing, reads find nothing
        with open(os.path.join(root, "commitlog", f"{0:020d}"), "rb") as fh:
            assert fh.read(8) == b"\0" * 8
        assert store.max_phy_offset == 0
        assert store.look_message_by_offset(offsets[0]) is None
        assert store.get_message("g", "T", 0, 0, 32).status.name != "FOUND"
        assert store.commit()
        assert store.positions()["committed"] == pos["wrote"]
        assert store.wait_dispatched(timeout_ms=5000)
        got = read_all(store)
        assert got[0] + got[1] == [body(i) for i in range(0, 50, 2)] + [body(i) for i in range(1, 50, 2)]
        assert bytes(store.look_message_by_offset(offsets[7]).body) == body(7)
        assert store.stats()["commit_count"] >= 1 and store.stats()["commit_bytes"] == pos["wrote"]
    check_store(root).raise_if_failed()


def test_puts_are_refused_while_the_pool_is_exhausted_and_resume_after_a_commit(tmp_path):
    """With 3 buffers and nothing committed, the 4th file needs the 1st file's buffer: the put
    gets OS_PAGECACHE_BUSY naming the pool, and nothing stored before is lost."""
    root = str(tmp_path / "s")
    with MessageStore(root, **POOL) as store:
        # stop the commit service (a full file is committed at its next round whatever the
        # least-pages setting, as RocketMQ's isAbleToCommit); store.commit() still commits
        committer = next(s for s in store._services if isinstance(s, CommitRealTimeService))
        committer.shutdown()
        i = 0
        while True:
            r = store.put_message(Message("T", body(i), queue_id=i % 2))
            if not r.ok:
                break
            i += 1
            assert i < 10_000
        assert r.status.name == "OS_PAGECACHE_BUSY" and "transient store pool is exhausted" in r.detail, r
        assert store.positions()["wrote"] > 2 * FS
        assert store.stats()["pool_exhausted"] >= 1
        again = store.put_message(Message("T", b"z"))
        assert again.status.name == "OS_PAGECACHE_BUSY"  # refused before the lock this time
        assert store.commit()  # the buffers are free again
        put_n(store, 300, start=i)
        assert store.positions()["wrote"] > 3 * FS  # the 4th file wrote into the 1st buffer
        store.commit()
        assert store.wait_dispatched(timeout_ms=5000)
        got = read_all(store)
        assert sorted(got[0] + got[1]) == sorted(body(k) for k in range(i + 300))
    check_store(root).raise_if_failed()


def test_commit_service_runs_on_its_own(tmp_path):
    """Default commit settings: a put wakes the commit service; what was put becomes readable
    without anyone asking, and a clean shutdown leaves everything committed and flushed."""
    root = str(tmp_path / "s")
    with MessageStore(root, **POOL) as store:
        put_n(store, 2000)  # ~300 KiB: rolls through the 3 buffers more than once
        assert store.wait_dispatched(store.positions()["wrote"], timeout_ms=10_000)
        assert sum(len(v) for v in read_all(store).values()) == 2000
    with MessageStore(root, **POOL) as store:
        assert store.last_exit_ok
        pos = store.positions()
        assert pos["wrote"] == pos["committed"] == pos["flushed"] > 4 * FS
    check_store(root).raise_if_failed()


def test_pool_is_refused_where_rocketmq_ignores_it(tmp_path):
    with pytest.raises(ConfigError, match="SYNC_FLUSH"):
        MessageStore(str(tmp_path / "s"), **POOL, flush_disk_type="SYNC_FLUSH")


def test_node_writers_in_processes_through_the_pool(tmp_path):
    """A node with the pool: producer processes append into the shared buffers, the flusher
    process commits, the dispatcher process builds the queues, every message is read back."""
    root = str(tmp_path / "s")
    per = 1500
    with MessageStore(root, **POOL, **NODE) as node:
        procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, root, f"p{k}", str(per)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=ENV) for k in range(2)]
        acks = {}
        for k, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            acks[f"p{k}"] = json.loads(out)
        assert node.commit(timeout_ms=10_000)
        assert node.wait_dispatched(timeout_ms=10_000)
        got = read_all(node)
        for name, pairs in acks.items():
            mine = sorted(int(b.split(b"|")[1]) for q in got.values() for b in q if b.startswith(name.encode() + b"|"))
            assert mine == list(range(per))
        assert node.stats()["commit_count"] > 0
        assert node.positions()["wrote"] > 3 * FS
    check_store(root).raise_if_failed()
    assert not os.path.exists(pool_path(root))


def test_a_stalled_commit_service_exhausts_the_pool_and_a_resumed_one_frees_it(tmp_path):
    """SIGSTOP the node's flusher process (the commit service): puts fill the pool and are then
    refused; SIGCONT: the pool drains and puts go on; nothing acknowledged is lost."""
    root = str(tmp_path / "s")
    with MessageStore(root, **POOL, **NODE) as node:
        flusher = node.supervisor.pids()["flusher"]
        freeze(flusher)
        try:
            acked, i = [], 0
            while True:
                r = node.put_message(Message("T", body(i), queue_id=i % 2))
                if not r.ok:
                    break
                acked.append(i)
                i += 1
            assert r.status.name == "OS_PAGECACHE_BUSY" and "pool is exhausted" in r.detail
            # mqstore stats shows the pool from another process
            out = subprocess.run([sys.executable, "-m", "mqstore.tools.cli", "stats", root, "--json", "--once"],
                                 capture_output=True, text=True, env=ENV, timeout=60)
            fig = json.loads(out.stdout)
            assert fig["pool_buffers"] == 3 and fig["pool_buffers_in_use"] == 3, fig
            assert fig["uncommitted_bytes"] > 2 * FS and fig["counters"]["pool_exhausted"] >= 1
            text = subprocess.run([sys.executable, "-m", "mqstore.tools.cli", "stats", root, "--once"],
                                  capture_output=True, text=True, env=ENV, timeout=60).stdout
            assert "transient store pool: 3 of 3 buffers in use" in text and "transient pool exhausted" in text
        finally:
            thaw(flusher)
        deadline = time.monotonic() + 10
        while not node.put_message(Message("T", body(i), queue_id=i % 2)).ok:
            assert time.monotonic() < deadline, "the pool never drained after SIGCONT"
            time.sleep(0.01)
        acked.append(i)
        assert node.commit(timeout_ms=10_000) and node.wait_dispatched(timeout_ms=10_000)
        got = read_all(node)
        assert sorted(got[0] + got[1]) == sorted(body(k) for k in acked)
    check_store(root).raise_if_failed()


def _kill_node_with_uncommitted_bytes(root: str) -> tuple[list[int], dict[str, int]]:
    """A node (in a child process) whose commit service is stopped, then killed with every
    process of it: the pool holds acknowledged bytes the files do not."""
    code = textwrap.dedent("""
        import json, os, signal, sys, time
        from mqstore import Message, MessageStore
        from mqstore.tools.soak import freeze
        cfg = json.loads(sys.argv[2])
        node = MessageStore(sys.argv[1], **cfg)
        pids = node.supervisor.pids()
        for k in range(120):  # committed: three files' worth would not fit; stays in the first two
            node.put_message(Message("T", f"m|{k}|".encode() + b"b" * (k % 150), queue_id=k % 2)).check()
        assert node.commit()
        freeze(pids["flusher"])
        for k in range(120, 400):
            node.put_message(Message("T", f"m|{k}|".encode() + b"b" * (k % 150), queue_id=k % 2)).check()
        print(json.dumps({"pids": pids, "positions": node.positions()}), flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code, root, json.dumps({**POOL, **NODE})], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    line = p.stdout.readline()
    assert line, p.stderr.read()[-3000:]
    state = json.loads(line)
    p.kill()  # the owner first: its supervisor would restart a killed flusher, which commits
    p.wait(30)
    for pid in state["pids"].values():
        os.kill(pid, signal.SIGKILL)
    for pid in state["pids"].values():
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.02)
    pos = state["positions"]
    assert pos["committed"] < pos["wrote"], pos
    return list(range(400)), pos


def test_uncommitted_bytes_of_a_killed_node_are_replayed_by_the_next_owner(tmp_path):
    """The pool outlives the processes: the next owner copies what was acknowledged but not
    committed into the files before recovering (better than RocketMQ, whose buffers die with
    the broker)."""
    root = str(tmp_path / "s")
    acked, pos = _kill_node_with_uncommitted_bytes(root)
    assert os.path.exists(pool_path(root))
    check_store(root, allow_torn_tail=True).raise_if_failed()
    with MessageStore(root, **POOL) as store:
        assert not store.last_exit_ok
        assert store.pool_replayed_bytes == pos["wrote"] - pos["committed"]
        assert store.positions()["wrote"] == pos["wrote"]
        got = read_all(store)
        assert sorted(got[0] + got[1]) == sorted(body(k) for k in acked)
    check_store(root).raise_if_failed()


def test_without_the_pool_file_a_killed_node_loses_only_uncommitted_bytes(tmp_path):
    """As after a reboot (/dev/shm emptied): what was committed is recovered, the rest is gone
    (RocketMQ's behaviour for a broker crash), and the store is consistent."""
    root = str(tmp_path / "s")
    acked, pos = _kill_node_with_uncommitted_bytes(root)
    os.unlink(pool_path(root))
    with MessageStore(root, **POOL) as store:
        assert store.pool_replayed_bytes == 0
        assert pos["committed"] <= store.positions()["wrote"] < pos["wrote"]
        got = read_all(store)
        bodies = sorted(got[0] + got[1])
        assert 120 <= len(bodies) < 400
        assert set(bodies) <= {body(k) for k in acked}
        store.put_message(Message("T", b"after", queue_id=0)).check()
    check_store(root).raise_if_failed()
