"""The transient store pool of a store with several CommitLogs (docs/parallel-commitlogs.md,
issue 27 item 3): a pool per log (its own buffers on /dev/shm, its own committed position in
the log's section of the control block, its own commit service), in threads mode and in a node,
and what a SIGKILL leaves (each log's pool replayed into its own files; without the pool files
each log loses only what it had not committed).

Real parts only: pools are files on /dev/shm mapped by every process, the node's flusher process
runs the commit services, writers are other OS processes, stalls are SIGSTOP, deaths SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from typing import Any

import pytest

from mqstore import Message, MessageStore
from mqstore.config import StoreConfig
from mqstore.layout import file_start_of, log_base
from mqstore.log._shm import TransientStorePool
from mqstore.log.pool import pool_path
from mqstore.services.flush import CommitRealTimeService
from mqstore.tools import stats
from mqstore.tools.checker import check_store

from helpers_store import REPO
from test_multilog import _queue_log, run_killed_writer

ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
FS = 64 * 1024
POOL = {"commit_log_count": 2, "transient_store_pool_enable": True, "transient_store_pool_size": 3,
        "mapped_file_size_commit_log": FS, "mapped_file_size_consume_queue": 20 * 500}
#: a commit service that only commits when asked or when a file is full
NO_COMMIT = {"commit_commit_log_least_pages": 100_000, "commit_commit_log_thorough_interval": 3_600_000}
NODE = {"service_mode": "processes", "flush_interval_commit_log": 50, "flush_interval_consume_queue": 100}
QUEUES = 8  # of topic "T": four bound to each of two logs (docs/parallel-commitlogs.md, the binding)


def body(i: int, name: str = "m") -> bytes:
    return f"{name}|{i}|".encode() + b"b" * (i % 150)


def put(store: Any, msg: Message, deadline_s: float = 60) -> Any:
    """Put, retrying while the log's pool is exhausted (OS_PAGECACHE_BUSY, as a RocketMQ client
    retries a busy broker); the result of the put that got through."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = store.put_message(msg)
        if r.status.name != "OS_PAGECACHE_BUSY":
            return r
        assert time.monotonic() < deadline, f"the pool never had room: {r.detail}"
        time.sleep(0.001)


def files_hold(root: str, acked: Iterable[tuple[int, bytes]], file_size: int = FS) -> None:
    """Each acknowledged record is in its log's CommitLog file, read from the disk (not through
    the store): at its physical offset a record whose PHYSICALOFFSET field is that offset and
    that holds the body."""
    dirs = StoreConfig(commit_log_count=2).commit_log_dirs(root)
    for phy, data in acked:
        start = file_start_of(phy, file_size)
        with open(os.path.join(dirs[phy >> 56], f"{start:020d}"), "rb") as fh:
            fh.seek(phy - start)
            head = fh.read(4)
            size = struct.unpack(">i", head)[0]
            record = head + fh.read(size - 4)
        assert struct.unpack(">q", record[28:36])[0] == phy, f"no record at {phy} in log {phy >> 56}'s files"
        assert data in record, f"the record at {phy} does not hold its body"


def check_queues(store: Any, sent: dict[int, list[bytes]]) -> None:
    """Every queue reads back exactly what was put into it, in order, every unit in its log."""
    assert store.wait_dispatched(timeout_ms=30_000)
    for q in range(QUEUES):
        bodies, offsets = read_queue(store, q)
        assert bodies == sent.get(q, []), f"queue {q}"
        assert {p >> 56 for p in offsets} <= {_queue_log("T", q, 2)}
        assert store.get_max_offset_in_queue("T", q) == len(sent.get(q, []))


def read_queue(store: Any, q: int, topic: str = "T") -> tuple[list[bytes], list[int]]:
    """A queue's bodies and physical offsets from queue offset 0 to its end (a read stops at
    the end of a ConsumeQueue file: read on from where it stopped)."""
    bodies: list[bytes] = []
    offsets: list[int] = []
    while True:
        got = store.read_messages(topic, q, len(bodies), 100_000)
        if not got.bodies():
            return bodies, offsets
        bodies += [bytes(b) for b in got.bodies()]
        offsets += list(got.physical_offsets)


def test_a_pool_buffers_the_files_of_its_own_log_only(tmp_path):
    """Log 1's files start at 2^56, not a multiple of a 12 KiB file: its pool counts them from
    the log's first offset (file j of the log in buffer j mod size), refuses a file of another
    log, and an attach names the log it expects."""
    size = 12 * 1024
    path = str(tmp_path / "pool-1")
    pool = TransientStorePool.create(path, 3, size, 123, 456, lock_memory=False, log=1)
    try:
        assert pool.log == 1
        assert [pool.buffer_index(log_base(1) + j * size) for j in range(7)] == [0, 1, 2, 0, 1, 2, 0]
        with pytest.raises(ValueError, match="of CommitLog 1"):
            pool.buffer_index(0)  # log 0's first file
        with pytest.raises(ValueError, match="not the start of a file"):
            pool.buffer_index(log_base(1) + 4096)
        with pytest.raises(ValueError, match="the pool of CommitLog 1, not of CommitLog 0"):
            TransientStorePool.attach(path, 123, 456, log=0)
        again = TransientStorePool.attach(path, 123, 456, log=1)
        assert again.log == 1 and again.buffers == 3
        again.close()
    finally:
        pool.close()


def test_config_accepts_several_logs_with_the_pool():
    """commit_log_count > 1 with transient_store_pool_enable is valid (it was refused before
    each log had its own pool); the pool's own refusals stay."""
    from mqstore.errors import ConfigError

    cfg = StoreConfig(commit_log_count=3, transient_store_pool_enable=True).validate()
    assert cfg.commit_log_count == 3 and cfg.transient_store_pool_enable
    with pytest.raises(ConfigError, match="SYNC_FLUSH"):
        StoreConfig(commit_log_count=2, transient_store_pool_enable=True, flush_disk_type="SYNC_FLUSH").validate()


def test_two_logs_each_with_its_own_pool_commit_apart_and_read_back_exactly(tmp_path):
    """Threads mode, N = 2: a pool file per log on /dev/shm; puts over eight queues (four per
    log) stay in the pools until a commit (each log's committed position is its own); after
    commit and flush both logs' files hold their records; every queue reads back exactly, in
    order, in its log; a clean stop removes both pools and a reopen reads the same."""
    root = str(tmp_path / "s")
    sent: dict[int, list[bytes]] = {}
    acked: dict[int, tuple[int, bytes]] = {}
    with MessageStore(root, **POOL, **NO_COMMIT) as store:
        paths = [pool_path(root, k) for k in (0, 1)]
        assert paths[0] != paths[1] and all(os.path.getsize(p) == 4096 + 3 * FS for p in paths)
        assert [pool.log for pool in store.pools] == [0, 1]
        committers = [s for s in store._services if isinstance(s, CommitRealTimeService)]
        assert sorted(s.channel_log for s in committers) == [0, 1]
        # no thorough commit is due during the test: each service's first (thorough) round is
        # done, or (a machine up for less than the interval) the first is not due for a minute
        deadline = time.monotonic() + 30
        while not all(s._last_commit_ms > 0 or time.monotonic() * 1000 + 60_000 < s.thorough_ms for s in committers):
            assert time.monotonic() < deadline, "a commit service never ran"
            time.sleep(0.01)
        for i in range(60):  # less than a file per log: nothing is due before a commit
            q = i % QUEUES
            r = put(store, Message("T", body(i), queue_id=q))
            r.check()
            assert r.wrote_offset >> 56 == _queue_log("T", q, 2)
            sent.setdefault(q, []).append(body(i))
            acked[i] = (r.wrote_offset, body(i))
        for k in (0, 1):
            pos = store.ctl.positions(k)
            assert pos["wrote"] > log_base(k) and pos["committed"] == log_base(k), (k, pos)
            assert store.look_message_by_offset(next(p for p, _ in acked.values() if p >> 56 == k)) is None
        assert store.commit() and store.flush()
        for k in (0, 1):
            pos = store.ctl.positions(k)
            assert pos["wrote"] == pos["committed"] == pos["flushed"] > log_base(k), (k, pos)
        files_hold(root, acked.values())
        check_queues(store, sent)
        for i in range(60, 3000):  # rolls through each log's three buffers several times
            q = i % QUEUES
            r = put(store, Message("T", body(i), queue_id=q))
            r.check()
            sent[q].append(body(i))
            acked[i] = (r.wrote_offset, body(i))
        assert store.commit() and store.flush()
        files_hold(root, acked.values())
        check_queues(store, sent)
        assert all(hi - lo > 3 * FS for _, lo, hi in store.logs()), f"a log did not reuse a buffer: {store.logs()}"
        assert store.stats()["commit_count"] >= 2
    assert not any(os.path.exists(pool_path(root, k)) for k in (0, 1)), "a clean stop removes every pool"
    check_store(root).raise_if_failed()
    with MessageStore(root, **POOL) as store:
        assert store.last_exit_ok
        check_queues(store, sent)
        for k in (0, 1):
            pos = store.ctl.positions(k)
            assert pos["wrote"] == pos["committed"] == pos["flushed"]


@pytest.mark.parametrize("full, file_size", [(0, FS), (1, 12 * 1024)])
def test_an_exhausted_pool_refuses_only_its_own_logs_puts(tmp_path, full, file_size):
    """With the commit services stopped, the puts of a queue of one log fill that log's pool (3
    buffers: refused when the 4th file needs the 1st file's buffer, counted from the log's first
    offset, which for log 1 is not a multiple of a 12 KiB file) and are refused naming the
    pool; a queue of the other log still takes puts (its pool has room); a commit frees the
    buffers and nothing acknowledged is lost."""
    root = str(tmp_path / "s")
    qfull = next(q for q in range(QUEUES) if _queue_log("T", q, 2) == full)
    qother = next(q for q in range(QUEUES) if _queue_log("T", q, 2) == 1 - full)
    sent: dict[int, list[bytes]] = {}
    with MessageStore(root, **{**POOL, "mapped_file_size_commit_log": file_size}) as store:
        for service in store._services:
            if isinstance(service, CommitRealTimeService):
                service.shutdown()
        i = 0
        while True:
            r = store.put_message(Message("T", body(i), queue_id=qfull))
            if not r.ok:
                break
            sent.setdefault(qfull, []).append(body(i))
            i += 1
            assert i < 10_000
        assert r.status.name == "OS_PAGECACHE_BUSY" and "transient store pool is exhausted" in r.detail, r
        local = store.ctl.get("wrote", log=full) - log_base(full)
        assert 3 * file_size - 512 < local <= 3 * file_size, f"refused at {local}, not at the 4th file"
        for j in range(10):  # the other log's pool is its own (these fit its first buffer)
            store.put_message(Message("T", body(j, "other"), queue_id=qother)).check()
            sent.setdefault(qother, []).append(body(j, "other"))
        assert store.ctl.get("committed", log=1 - full) == log_base(1 - full)
        # mqstore stats counts both pools: the full one's 3 buffers and the other's first
        fig = stats.figures(None, stats.snapshot_of(store.ctl, root=root, status="running"))
        assert fig["pool_buffers"] == 3 and fig["pool_buffers_in_use"] == 4, fig
        assert fig["uncommitted_bytes"] == sum(store.ctl.get("wrote", log=k) - log_base(k) for k in (0, 1))
        text = "\n".join(stats.format_lines(fig))
        assert "transient store pool: 4 of 6 buffers in use (2 pools of 3)" in text, text
        assert store.commit()
        for j in range(200):
            store.put_message(Message("T", body(i + j), queue_id=qfull)).check()
            sent[qfull].append(body(i + j))
        assert store.commit()
        check_queues(store, sent)
    check_store(root).raise_if_failed()


PRODUCER = textwrap.dedent("""
    import json, sys, time
    from mqstore import Message, MessageStore
    root, w, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = MessageStore.open(root)
    assert store.attached
    acks = []
    for i in range(n):
        q = w * 4 + i % 4
        body = b"w%d|%d|" % (w, i) + b"p" * (i % 900)
        while True:  # a RocketMQ client retries a busy broker (the pools are 3 small files each)
            r = store.put_message(Message("T", body, queue_id=q))
            if r.status.name != "OS_PAGECACHE_BUSY":
                break
            time.sleep(0.001)
        r.check()
        acks.append([i, q, r.queue_offset, r.wrote_offset])
    store.close()
    print(json.dumps(acks))
""")


@pytest.mark.multiprocess
def test_a_node_of_two_logs_with_a_pool_each(tmp_path):
    """A node (service processes) with N = 2 and the pool: two producer processes attached,
    each putting into four queues of its own (both logs get puts); the flusher process commits
    each log from its own pool; every queue reads back exactly, in order, in its own log, at the
    offsets the producers were told; the files hold every record; the checker passes while the
    node runs and after; a clean stop removes both pools."""
    root = str(tmp_path / "s")
    n = 1500
    with MessageStore(root, **POOL, **NODE) as node:
        procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, root, str(w), str(n)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=ENV) for w in range(2)]
        acks = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-3000:]
            acks.append(json.loads(out))
        assert node.commit(timeout_ms=30_000)
        assert node.wait_dispatched(timeout_ms=30_000)
        for w in range(2):
            for j in range(4):
                q = w * 4 + j
                bodies, offsets = read_queue(node, q)
                want = [b"w%d|%d|" % (w, i) + b"p" * (i % 900) for i in range(j, n, 4)]
                assert bodies == want, f"queue {q}"
                assert {p >> 56 for p in offsets} == {_queue_log("T", q, 2)}
                mine = sorted((qoff, phy) for _, qq, qoff, phy in acks[w] if qq == q)
                assert mine == list(enumerate(offsets))
        assert {_queue_log("T", q, 2) for q in range(QUEUES)} == {0, 1}
        assert all(hi - lo > 3 * FS for _, lo, hi in node.logs()), f"a log did not roll its pool: {node.logs()}"
        for k in (0, 1):
            pos = node.ctl.positions(k)
            assert pos["committed"] == pos["wrote"], (k, pos)
        assert node.stats()["commit_count"] > 0
        check_store(root, quiescent=False).raise_if_failed()  # while the node runs
    assert not any(os.path.exists(pool_path(root, k)) for k in (0, 1))
    files_hold(root, [(phy, b"w%d|%d|" % (w, i)) for w in range(2) for i, _, _, phy in acks[w]])
    check_store(root).raise_if_failed()


_KILLED_WRITER = """
import sys, time
from mqstore import MessageStore, Message
root, i = sys.argv[1], int(sys.argv[2])
store = MessageStore(root, commit_log_count=2, transient_store_pool_enable=True, transient_store_pool_size=3,
                     mapped_file_size_commit_log=65536, commit_commit_log_least_pages=8)
out = sys.stdout
out.write("READY\\n"); out.flush()
while True:
    q = i % 6
    r = store.put_message(Message("K", b"%d-" % i + b"p" * (i % 500), queue_id=q))
    if r.ok:
        out.write(f"{i} {q} {r.queue_offset} {r.wrote_offset}\\n"); out.flush()
    elif r.status.name == "OS_PAGECACHE_BUSY":
        time.sleep(0.001)
    i += 1
"""


@pytest.mark.multiprocess
def test_an_owner_of_two_logs_with_pools_killed_at_random_moments_loses_no_acknowledged_message(tmp_path):
    """T4 with the pool (ASYNC_FLUSH, as the pool requires): a threads-mode owner of two logs
    writing through both pools is SIGKILLed at random moments, three times. The checker passes
    on the store as the kill left it and after each reopen; the pools outlive the process, so
    each reopen copies each log's uncommitted bytes from its own pool into its own files (as
    with one log), and every acknowledged message reads back at its queue and physical offset,
    in its queue's log; each queue's offsets run from 0 without a gap or repeat."""
    root = str(tmp_path / "s")
    rng = random.Random(os.getpid())
    acked: dict[int, tuple[int, int, int]] = {}
    start = 0
    for _ in range(3):
        run_killed_writer(_KILLED_WRITER, root, start, rng, acked, env=ENV)
        check_store(root, allow_torn_tail=True).raise_if_failed()  # as the kill left it
        with MessageStore(root, transient_store_pool_enable=True, transient_store_pool_size=3) as store:
            assert not store.last_exit_ok and store.config.commit_log_count == 2
            assert [pool.log for pool in store.pools] == [0, 1]
            assert store.wait_dispatched(timeout_ms=30_000)
            for q in range(6):
                got = store.read_messages("K", q, 0, 100_000)
                ids = [int(bytes(b).split(b"-")[0]) for b in got.bodies()]
                assert ids == sorted(set(ids)), f"queue {q}: a message repeats or is out of order"
                assert {p >> 56 for p in got.physical_offsets} <= {_queue_log("K", q, 2)}
                assert store.get_max_offset_in_queue("K", q) == len(ids)
                for i, (qq, qoff, phy) in acked.items():
                    if qq == q:
                        assert qoff < len(ids) and ids[qoff] == i, f"acknowledged message {i} is not at {q}/{qoff}"
                        assert got.physical_offsets[qoff] == phy
            start = max(acked) + 1_000_000  # ids the next writer uses cannot be confused with these
        check_store(root).raise_if_failed()
    assert {phy >> 56 for _, _, phy in acked.values()} == {0, 1}


def _kill_node_with_uncommitted_bytes(root: str) -> dict[str, Any]:
    """A node of two logs (in a child process) whose flusher process (both commit services) is
    stopped, then killed with every process of it: each log's pool holds acknowledged bytes its
    files do not."""
    code = textwrap.dedent("""
        import json, sys, time
        from mqstore import Message, MessageStore
        from mqstore.tools.soak import freeze
        node = MessageStore(sys.argv[1], **json.loads(sys.argv[2]))
        pids = node.supervisor.pids()
        acks = []
        def put(k):
            r = node.put_message(Message("T", f"m|{k}|".encode() + b"b" * (k % 150), queue_id=k % 8))
            r.check()
            acks.append([k, k % 8, r.queue_offset, r.wrote_offset])
        for k in range(160):  # committed
            put(k)
        assert node.commit()
        freeze(pids["flusher"])
        for k in range(160, 560):  # less than two files per log: the pools hold it
            put(k)
        print(json.dumps({"pids": pids, "acks": acks,
                          "positions": [node.ctl.positions(k) for k in (0, 1)]}), flush=True)
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
    for k, pos in enumerate(state["positions"]):
        assert pos["committed"] < pos["wrote"], (k, pos)
    return state


@pytest.mark.multiprocess
def test_each_logs_uncommitted_bytes_of_a_killed_node_are_replayed_from_its_own_pool(tmp_path):
    """Both logs hold uncommitted bytes in their pools when the node dies: the next owner copies
    each log's from its own pool into its own files (the bytes copied are the two logs'
    uncommitted bytes), every acknowledged message reads back, the checker passes."""
    root = str(tmp_path / "s")
    state = _kill_node_with_uncommitted_bytes(root)
    assert all(os.path.exists(pool_path(root, k)) for k in (0, 1))
    check_store(root, allow_torn_tail=True).raise_if_failed()
    with MessageStore(root, **POOL) as store:
        assert not store.last_exit_ok
        assert store.pool_replayed_bytes == sum(p["wrote"] - p["committed"] for p in state["positions"])
        for k, pos in enumerate(state["positions"]):
            assert store.ctl.get("wrote", log=k) == pos["wrote"]
        sent: dict[int, list[bytes]] = {}
        for k, q, qoff, phy in state["acks"]:
            assert qoff == len(sent.setdefault(q, []))
            sent[q].append(f"m|{k}|".encode() + b"b" * (k % 150))
        check_queues(store, sent)
    check_store(root).raise_if_failed()


@pytest.mark.multiprocess
def test_without_the_pool_files_each_log_of_a_killed_node_loses_only_what_it_had_not_committed(tmp_path):
    """As after a reboot (/dev/shm emptied): each log keeps what it had committed and loses the
    rest, as a store with one log does (RocketMQ's behaviour for a broker crash); each queue is a
    prefix of what was acknowledged to it, and the store is consistent and takes puts."""
    root = str(tmp_path / "s")
    state = _kill_node_with_uncommitted_bytes(root)
    for k in (0, 1):
        os.unlink(pool_path(root, k))
    with MessageStore(root, **POOL) as store:
        assert store.pool_replayed_bytes == 0
        for k, pos in enumerate(state["positions"]):
            assert pos["committed"] <= store.ctl.get("wrote", log=k) < pos["wrote"], k
        assert store.wait_dispatched(timeout_ms=30_000)
        total = 0
        for q in range(QUEUES):
            want = [f"m|{k}|".encode() + b"b" * (k % 150) for k, qq, _, _ in state["acks"] if qq == q]
            got, _ = read_queue(store, q)
            assert got == want[:len(got)], f"queue {q} is not a prefix of what was acknowledged to it"
            total += len(got)
        assert 160 <= total < 560
        store.put_message(Message("T", b"after", queue_id=0)).check()
    check_store(root).raise_if_failed()
