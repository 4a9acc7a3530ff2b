"""Baselines measured in the same process and run as the mqstore benchmarks, writing the
same bodies, the same number of messages per round, with the same round structure.

lmdb (py-lmdb): keys are big-endian 8-byte counters, ``txn.put(key, body, append=True)``,
one write transaction per 1,000 puts. ``lmdb/append`` opens the environment with
``sync=False`` (commits do not fsync; the OS writes the pages back later: the durability of
mqstore's ASYNC_FLUSH, whose flusher msyncs every 500 ms) and every other option at its
default (metasync=True, which only matters with sync=True; writemap=False; map_async=False;
map_size 4 GiB, sparse). ``lmdb/append-sync`` is the same with lmdb's default sync=True
(fsync per commit), as a reference. ``lmdb/sync-batch100`` (group of the node's SYNC_FLUSH
benchmarks): sync=True and a commit every 100 puts, 16,000 per round.

SQLite (stdlib sqlite3): table ``msg(id INTEGER PRIMARY KEY, body BLOB NOT NULL)``,
journal_mode=WAL, autocommit connection. ``sqlite/wal-full-1``: synchronous=FULL, one
INSERT per transaction (the WAL is fsynced at every commit), to compare with mqstore's
SYNC_FLUSH one message per flush. ``sqlite/wal-normal-1000``: synchronous=NORMAL (fsync only
at checkpoints, default wal_autocheckpoint=1000 pages), executemany of 1,000 rows per
BEGIN/COMMIT, as an extra reference for the async numbers.

Keys / row tuples are built in the untimed setup of each round, like the Message objects
of the mqstore benchmarks; the throughput baselines also get the same untimed pre-write
phase (bench._common.PREWRITE_S) before their rounds.
"""

from __future__ import annotations

import sqlite3
import struct

import pytest

from bench._common import (
    GROUP_100B,
    GROUP_DURABLE,
    GROUP_NODE_SYNC,
    MSGS,
    NODE_SYNC_BATCH_MSGS,
    ROUNDS_FAST,
    ROUNDS_SYNC,
    SYNC_MSGS,
    WARMUP_ROUNDS,
    prewrite,
    record_rate,
)

LMDB_TXN = 1000
SQLITE_BATCH = 1000


# -- lmdb -------------------------------------------------------------------------------------
def _lmdb_rounds(benchmark, lmdb, path: str, body: bytes, *, sync: bool, n_msgs: int, per_txn: int, rounds: int,
                 prewrite_first: bool) -> None:
    """Rounds of n_msgs appends (txn.put(append=True)) committed every per_txn puts."""
    env = lmdb.open(path, map_size=4 << 30, sync=sync)
    pack = struct.Struct(">Q").pack
    state = {"next": 0}

    def setup():
        start = state["next"]
        state["next"] += n_msgs
        keys = [pack(i) for i in range(start, start + n_msgs)]
        return (keys,), {}

    def append_all(keys):
        begin = env.begin
        for c in range(0, n_msgs, per_txn):
            txn = begin(write=True)
            put = txn.put
            for k in keys[c:c + per_txn]:
                put(k, body, append=True)
            txn.commit()

    try:
        if prewrite_first and not benchmark.disabled:
            prewrite(append_all, setup=setup)
        benchmark.pedantic(append_all, setup=setup, rounds=rounds, warmup_rounds=WARMUP_ROUNDS, iterations=1)
        assert env.stat()["entries"] == state["next"]
        with env.begin() as txn:
            assert txn.get(pack(state["next"] - 1)) == body
    finally:
        env.close()


@pytest.mark.benchmark(group=GROUP_100B)
@pytest.mark.parametrize("sync", [False, True], ids=["nosync", "sync"])
def test_lmdb_append(benchmark, work_dir, bodies, sync):
    lmdb = pytest.importorskip("lmdb")
    _lmdb_rounds(benchmark, lmdb, str(work_dir / "lmdb"), bodies["100B"], sync=sync, n_msgs=MSGS, per_txn=LMDB_TXN,
                 rounds=ROUNDS_FAST, prewrite_first=True)
    record_rate(benchmark, "lmdb/append" if not sync else "lmdb/append-sync", MSGS,
                lmdb_sync=sync, commit_every=LMDB_TXN, lmdb_version=".".join(map(str, lmdb.version())))


@pytest.mark.benchmark(group=GROUP_NODE_SYNC)
def test_lmdb_sync_batches_of_100(benchmark, work_dir, bodies):
    """lmdb with sync=True (fsync at every commit), one write transaction per 100 puts:
    the durable batch a single lmdb writer would use, against SYNC_FLUSH group commit."""
    lmdb = pytest.importorskip("lmdb")
    _lmdb_rounds(benchmark, lmdb, str(work_dir / "lmdb"), bodies["100B"], sync=True, n_msgs=NODE_SYNC_BATCH_MSGS,
                 per_txn=100, rounds=ROUNDS_SYNC, prewrite_first=False)
    record_rate(benchmark, "lmdb/sync-batch100", NODE_SYNC_BATCH_MSGS, lmdb_sync=True, commit_every=100)


# -- SQLite -----------------------------------------------------------------------------------
def _sqlite(path: str, synchronous: str) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)  # autocommit: every statement commits
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    con.execute(f"PRAGMA synchronous={synchronous}")
    con.execute("CREATE TABLE msg (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    return con


@pytest.mark.benchmark(group=GROUP_DURABLE)
def test_sqlite_wal_full_one_per_commit(benchmark, work_dir, bodies):
    con = _sqlite(str(work_dir / "full.sqlite"), "FULL")
    row = (bodies["100B"],)
    calls = [0]

    def insert_all():
        ex = con.execute
        for _ in range(SYNC_MSGS):
            ex("INSERT INTO msg(body) VALUES (?)", row)
        calls[0] += 1

    try:
        benchmark.pedantic(insert_all, rounds=ROUNDS_SYNC, warmup_rounds=WARMUP_ROUNDS, iterations=1)
        assert con.execute("SELECT count(*) FROM msg").fetchone()[0] == SYNC_MSGS * calls[0]
    finally:
        con.close()
    record_rate(benchmark, "sqlite/wal-full-1", SYNC_MSGS, synchronous="FULL", rows_per_commit=1,
                sqlite_version=sqlite3.sqlite_version)


@pytest.mark.benchmark(group=GROUP_100B)
def test_sqlite_wal_normal_batched(benchmark, work_dir, bodies):
    con = _sqlite(str(work_dir / "normal.sqlite"), "NORMAL")
    rows = [(bodies["100B"],)] * SQLITE_BATCH
    calls = [0]

    def insert_all():
        ex, exm = con.execute, con.executemany
        for _ in range(0, MSGS, SQLITE_BATCH):
            ex("BEGIN")
            exm("INSERT INTO msg(body) VALUES (?)", rows)
            ex("COMMIT")
        calls[0] += 1

    try:
        if not benchmark.disabled:
            prewrite(insert_all)
        benchmark.pedantic(insert_all, rounds=ROUNDS_FAST, warmup_rounds=WARMUP_ROUNDS, iterations=1)
        assert con.execute("SELECT count(*) FROM msg").fetchone()[0] == MSGS * calls[0]
    finally:
        con.close()
    record_rate(benchmark, "sqlite/wal-normal-1000", MSGS, synchronous="NORMAL", rows_per_commit=SQLITE_BATCH,
                sqlite_version=sqlite3.sqlite_version)

