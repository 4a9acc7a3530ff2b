"""mqstore next to its peers, through each one's public API (bench/README.md, "Peers").

    python -m pytest bench/test_peers.py --benchmark-only --benchmark-columns=median,rounds -q

Peers (bench/_peers.py): mqstore (``MessageStore(dir)``, default settings), py-lmdb, SQLite in WAL
mode, Redis Streams (a redis-server started here; the Redis cases skip, saying what is missing,
when none can be had), and a pure-Python mmap append log (the floor). The timed code is what a
user writes: the ``Message`` objects, lmdb keys, SQLite rows and stream ids are built inside the
timed region, and bodies are asked for as bytes (``bytes(m.body)`` for mqstore). 100-byte
bodies unless stated; a fresh store per case, in a directory on disk.

Workloads (each for every peer that can do it), one pytest-benchmark group each:

1. ``append-100B``: 1M x 100 B, 1,000 per call (``put_messages([Message(...) for b in chunk])``,
   lmdb ``putmulti`` in a transaction per 1,000, SQLite ``executemany`` per 1,000 in a
   transaction, a Redis pipeline of 1,000 XADDs, ``MmapLog.append_many``).
2. ``append-1KiB``: the same with 200k x 1 KiB.
3. ``put-each``: one put per message (``put_message(Message(...))``; lmdb ``txn.put`` and SQLite
   ``execute`` inside 1,000-put transactions; one XADD round trip per message for Redis).
4. ``consume``: every message in order, each body as bytes (``get_message`` batches of 32, which
   RocketMQ's transfer caps allow per call; lmdb cursor; SQLite SELECT; XRANGE pages of 1,000;
   the mmap log's offsets). ``consume-bulk``: mqstore's local bulk read, ``read_messages`` of
   1,024 and ``result.bodies()``, against the peers' figures of ``consume``.
5. ``lookup-static`` / ``lookup-live``: 100k random positions, each body as bytes
   (``bytes(look_message_by_queue_offset(topic, 0, i).body)``; lmdb ``txn.get`` with a read
   transaction per 1,000; SQLite SELECT by key; XRANGE id id; ``MmapLog.read``), on the store
   written for 4, and on the same store while a separate writer process appends to it at a
   steady rate (``MQSTORE_PEERS_LIVE_RATE`` messages/s, default 50,000, in batches of 100). For
   mqstore the writer process opens the store with ``MessageStore.open`` and so owns it (its
   services are threads of the writer process); this process opens it with
   ``MessageStore.open`` too and so attaches, and follows the writer's dispatcher.
6. ``durable-1``: one flush per message: mqstore ``flush_disk_type=SYNC_FLUSH`` and
   ``put_message`` each; lmdb ``sync=True`` and a transaction per put; SQLite WAL
   ``synchronous=FULL`` and autocommit INSERTs; Redis ``appendfsync always`` and one XADD per
   round trip; the mmap log ``msync`` after each append.
7. ``durable-100``: one flush per 100 messages: the same stores, ``put_messages`` of 100 under
   SYNC_FLUSH, a transaction / pipeline / msync per 100.
8. ``disk-20k`` / ``disk-1M``: allocated bytes on disk per message (sum of st_blocks x 512 over
   the directory) after a clean close; reported, not timed (the round time is the write or du).
9. ``reopen-100B`` / ``reopen-1KiB``: open after a clean close of the 1M x 100 B and 200k x 1 KiB
   stores, until the next append position is known (mqstore: ``MessageStore(dir)`` and
   ``next_queue_offset``; lmdb: open and the last key; SQLite: connect and ``max(seq)``; Redis: a
   new redis-server loading the AOF, and the last id; the mmap log: map and scan the records).

The non-durable cases run every store in the durability class of mqstore's default
ASYNC_FLUSH (the OS or a background flush writes back): lmdb ``sync=False``, SQLite
``synchronous=NORMAL``, Redis ``appendfsync everysec``, the mmap log without msync.

Redis runs fewer messages per round where it is ~10-100x slower (its rates are per message, so
they compare): appends / 10, one put per message / 50, its data set / 10, lookups / 10.
``MQSTORE_PEERS_SCALE`` (default 1) scales every count, e.g. 0.1 for a quick run.

The append and durable cases first write one round into the fresh store, timed on its own and
kept apart from the median (``extra_info["fresh_store_msgs_per_s"]``), then ROUNDS rounds
appended to the same store; the summary shows medians. ``os.sync()`` runs (untimed) before
every round.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from bench._peers import (
    LiveWriter,
    Peer,
    disk_bytes,
    open_peer,
    redis_unavailable,
    scaled,
    stop_all_spawned,
)

PEER_NAMES = ["mqstore", "lmdb", "sqlite", "redis", "mmap-log"]

N_APPEND_100B = scaled(1_000_000)
N_APPEND_1KIB = scaled(200_000)
N_PUT_EACH = scaled(500_000)
N_DATA_100B = scaled(1_000_000)
N_DATA_1KIB = scaled(200_000)
N_LOOKUPS = scaled(100_000)
N_DURABLE_1 = scaled(2_000)
N_DURABLE_100 = scaled(20_000)
N_DISK_SMALL = 20_000
#: Redis: fewer messages per round where it is slow (rates are per message)
REDIS_DIV = {"append": 10, "put-each": 50, "data": 10, "lookups": 10}
LIVE_RATE = int(os.environ.get("MQSTORE_PEERS_LIVE_RATE", "50000"))
LIVE_BATCH = 100

ROUNDS = 5          # appends, durable appends, reopen (after a first round on the fresh store)
ROUNDS_READ = 5     # consume and lookups (plus one warm-up round)

G_APPEND_100B = "peers 1: append 100 B, 1,000 per call (msg/s)"
G_APPEND_1KIB = "peers 2: append 1 KiB, 1,000 per call (msg/s)"
G_PUT_EACH = "peers 3: one put per message (msg/s)"
G_DURABLE_1 = "peers 6: durable, one flush per message (msg/s)"
G_DURABLE_100 = "peers 7: durable, one flush per 100 messages (msg/s)"
G_DISK_SMALL = "peers 8: disk bytes per message after 20k (not timed)"
G_CONSUME = "peers 4: consume everything as bytes (msg/s)"
G_LOOKUP_STATIC = "peers 5: lookup by position, static store"
G_REOPEN = "peers 9: reopen after a clean close"
G_DISK_LARGE = "peers 8: disk bytes per message after 1M (not timed)"
G_LOOKUP_LIVE = "peers 5: lookup by position, live store (writer process)"


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def stop_started_processes() -> Any:
    """Every redis-server and writer process this module starts is stopped by its pid, also
    when a benchmark fails."""
    yield
    stop_all_spawned()


@pytest.fixture(scope="session")
def peer_bodies() -> dict[int, list[bytes]]:
    """1,000 random bodies per size; every call cycles through them (the same for every peer)."""
    return {size: [os.urandom(size) for _ in range(1000)] for size in (100, 1024)}


def need(name: str) -> None:
    if name == "redis":
        why = redis_unavailable()
        if why:
            pytest.skip(f"Redis cases need a redis-server: {why}")
    elif name == "lmdb":
        pytest.importorskip("lmdb")


def count_for(name: str, n: int, what: str, multiple: int = 100) -> int:
    """n, or Redis's smaller count (whole batches of `multiple`, at least one)."""
    if name != "redis":
        return n
    return max(multiple, n // REDIS_DIV[what] // multiple * multiple)


def record(benchmark: Any, row: str, peer: str, n: int, kind: str, **extra: Any) -> None:
    """Keep the row's figure in extra_info (the summary in bench/conftest.py reads it):
    kind "rate" = n / median round (msg/s), "us" = median / n (us per operation),
    "ms" = median round in ms."""
    info = benchmark.extra_info
    info.update(peers_row=row, peer=peer, per_round=n, **extra)
    stats = getattr(benchmark, "stats", None)
    if benchmark.disabled or stats is None:
        return
    median = stats.stats.median
    if kind == "rate":
        info.update(value=round(n / median), unit="msg/s", mean=round(n / stats.stats.mean))
    elif kind == "us":
        info.update(value=round(median / n * 1e6, 3), unit="us")
    elif kind == "ms":
        info.update(value=round(median * 1e3, 1), unit="ms")


def sync_setup() -> None:
    os.sync()


def rounds_run(benchmark: Any) -> int:
    """Rounds written by rounds_of_appends: the fresh-store round and ROUNDS (one with
    --benchmark-disable)."""
    return 2 if benchmark.disabled else ROUNDS + 1


def rounds_of_appends(benchmark: Any, peer: Peer, target: Any, args: tuple[Any, ...], n: int) -> float:
    """A first round on the fresh store (timed here, reported apart), then ROUNDS rounds."""
    os.sync()
    t0 = time.perf_counter()
    target(*args)
    first = n / (time.perf_counter() - t0)
    benchmark.pedantic(target, args=args, setup=sync_setup, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    return first


class Dataset:
    """A store of n messages of one size, written once (untimed) per module, shared by the
    read cases; open/close on demand (the reopen and live cases need it closed)."""

    def __init__(self, root: Path, name: str, size: int, n: int, bodies: list[bytes]) -> None:
        self.name, self.size, self.n = name, size, n
        self.path = tempfile.mkdtemp(prefix=f"peers-data-{name}-{size}-", dir=root)
        peer = open_peer(name, self.path)
        peer.append_batches(bodies, n, 1000)
        assert peer.count() == n
        if name == "mqstore":
            assert peer.store.wait_dispatched(timeout_ms=120_000)  # type: ignore[attr-defined]
        self.peer: Peer | None = peer

    def open(self) -> Peer:
        if self.peer is None:
            self.peer = open_peer(self.name, self.path)
        return self.peer

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
            self.peer = None


@pytest.fixture(scope="module")
def datasets(bench_root: Path, peer_bodies: dict[int, list[bytes]]) -> Any:
    made: dict[tuple[str, int], Dataset] = {}

    def get(name: str, size: int) -> Dataset:
        if (name, size) not in made:
            n = count_for(name, N_DATA_100B if size == 100 else N_DATA_1KIB, "data", multiple=1000)
            made[(name, size)] = Dataset(bench_root, name, size, n, peer_bodies[size])
        return made[(name, size)]

    yield get
    for ds in made.values():
        try:
            ds.close()
        finally:
            shutil.rmtree(ds.path, ignore_errors=True)


# -- 1, 2: appends of 1,000 per call ------------------------------------------------------------------
def _append(benchmark: Any, work_dir: Path, bodies: list[bytes], name: str, n: int, row: str) -> None:
    need(name)
    n = count_for(name, n, "append", multiple=1000)
    peer = open_peer(name, str(work_dir / name))
    try:
        first = rounds_of_appends(benchmark, peer, peer.append_batches, (bodies, n, 1000), n)
        assert peer.count() == peer.seq == n * rounds_run(benchmark), (peer.count(), peer.seq)
    finally:
        peer.close()
    record(benchmark, row, name, n, "rate", fresh_store_msgs_per_s=round(first))


@pytest.mark.benchmark(group=G_APPEND_100B)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_append_100b(benchmark, work_dir, peer_bodies, name):
    _append(benchmark, work_dir, peer_bodies[100], name, N_APPEND_100B, "append-100B")


@pytest.mark.benchmark(group=G_APPEND_1KIB)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_append_1kib(benchmark, work_dir, peer_bodies, name):
    _append(benchmark, work_dir, peer_bodies[1024], name, N_APPEND_1KIB, "append-1KiB")


# -- 3: one put per message -------------------------------------------------------------------------
@pytest.mark.benchmark(group=G_PUT_EACH)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_put_each(benchmark, work_dir, peer_bodies, name):
    need(name)
    n = count_for(name, N_PUT_EACH, "put-each", multiple=1000)
    peer = open_peer(name, str(work_dir / name))
    try:
        first = rounds_of_appends(benchmark, peer, peer.put_each, (peer_bodies[100], n, 1000), n)
        assert peer.count() == peer.seq == n * rounds_run(benchmark), (peer.count(), peer.seq)
    finally:
        peer.close()
    record(benchmark, "put-each", name, n, "rate", fresh_store_msgs_per_s=round(first),
           per_txn=1000 if name in ("lmdb", "sqlite") else 1)


# -- 6, 7: durable appends ----------------------------------------------------------------------------
def _mq_flushes(peer: Peer) -> int:
    return int(peer.store.stats()["flush_count"]) if peer.name == "mqstore" else 0  # type: ignore[attr-defined]


def _durable(benchmark: Any, work_dir: Path, name: str, n: int, target_name: str, args: tuple[Any, ...],
             row: str) -> None:
    need(name)
    peer = open_peer(name, str(work_dir / name), durable=True)
    try:
        flushes0 = _mq_flushes(peer)
        first = rounds_of_appends(benchmark, peer, getattr(peer, target_name), args, n)
        assert peer.count() == peer.seq == n * rounds_run(benchmark), (peer.count(), peer.seq)
        extra: dict[str, Any] = {"fresh_store_msgs_per_s": round(first)}
        if name == "mqstore":
            st = peer.store.stats()  # type: ignore[attr-defined]
            assert st["flush_timeouts"] == 0 and st["flush_errors"] == 0
            extra["msgs_per_flush"] = round(peer.seq / (st["flush_count"] - flushes0), 2)
    finally:
        peer.close()
    record(benchmark, row, name, n, "rate", **extra)


@pytest.mark.benchmark(group=G_DURABLE_1)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_durable_one_flush_per_message(benchmark, work_dir, peer_bodies, name):
    bodies = peer_bodies[100][:min(1000, N_DURABLE_1)]
    assert N_DURABLE_1 % len(bodies) == 0
    _durable(benchmark, work_dir, name, N_DURABLE_1, "put_each", (bodies, N_DURABLE_1, 1), "durable-1")


@pytest.mark.benchmark(group=G_DURABLE_100)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_durable_one_flush_per_100(benchmark, work_dir, peer_bodies, name):
    _durable(benchmark, work_dir, name, N_DURABLE_100, "append_batches", (peer_bodies[100], N_DURABLE_100, 100),
             "durable-100")


# -- 8: disk bytes per message after 20k ----------------------------------------------------------------
def _disk_extra(path: str, name: str, n: int) -> dict[str, Any]:
    used, apparent = disk_bytes(path)
    extra: dict[str, Any] = {"disk_bytes": used, "apparent_bytes": apparent, "messages": n,
                             "apparent_bytes_per_msg": round(apparent / n, 1)}
    if name == "mqstore":  # where the bytes are
        extra["by_part"] = {part: disk_bytes(os.path.join(path, part))[0]
                            for part in ("commitlog", "consumequeue", "index") if os.path.isdir(os.path.join(path, part))}
    return extra


@pytest.mark.benchmark(group=G_DISK_SMALL)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_disk_bytes_20k(benchmark, work_dir, peer_bodies, name):
    need(name)
    path = str(work_dir / name)
    peer = open_peer(name, path)
    try:
        benchmark.pedantic(peer.append_batches, args=(peer_bodies[100], N_DISK_SMALL, 1000), rounds=1, iterations=1)
        assert peer.count() == N_DISK_SMALL
        if name == "mqstore":
            assert peer.store.wait_dispatched(timeout_ms=60_000)  # type: ignore[attr-defined]
    finally:
        peer.close()
    extra = _disk_extra(path, name, N_DISK_SMALL)
    record(benchmark, "disk-20k", name, N_DISK_SMALL, "none", **extra)
    benchmark.extra_info.update(value=round(extra["disk_bytes"] / N_DISK_SMALL, 1), unit="B/msg")


# -- 4: consume everything as bytes ------------------------------------------------------------------
@pytest.mark.benchmark(group=G_CONSUME)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_consume(benchmark, datasets, name):
    need(name)
    ds = datasets(name, 100)
    peer = ds.open()
    got = benchmark.pedantic(peer.consume, rounds=ROUNDS_READ, warmup_rounds=1, iterations=1)
    assert got == ds.n
    record(benchmark, "consume", name, ds.n, "rate")


@pytest.mark.benchmark(group=G_CONSUME)
def test_consume_bulk(benchmark, datasets):
    """mqstore's local bulk read (read_messages + bodies()), next to the peers' consume above."""
    need("mqstore")
    ds = datasets("mqstore", 100)
    peer = ds.open()
    got = benchmark.pedantic(peer.consume_bulk, rounds=ROUNDS_READ, warmup_rounds=1, iterations=1)
    assert got == ds.n
    record(benchmark, "consume-bulk", "mqstore", ds.n, "rate")


# -- 5: lookups by position ------------------------------------------------------------------------------
def _positions(name: str, n_data: int) -> list[int]:
    rng = random.Random(7)
    return [rng.randrange(n_data) for _ in range(count_for(name, N_LOOKUPS, "lookups"))]


@pytest.mark.benchmark(group=G_LOOKUP_STATIC)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_lookup_static(benchmark, datasets, name):
    need(name)
    ds = datasets(name, 100)
    peer = ds.open()
    positions = _positions(name, ds.n)
    if name == "mqstore":
        view = peer.store.look_message_by_queue_offset("PeersTopic", 0, positions[0])  # type: ignore[attr-defined]
        assert type(view).__name__ == "MessageView" and isinstance(view.body, memoryview)
    assert benchmark.pedantic(peer.lookup, args=(positions,), rounds=ROUNDS_READ, warmup_rounds=1,
                              iterations=1) == len(positions)
    record(benchmark, "lookup-static", name, len(positions), "us", data_messages=ds.n)


# -- 9: reopen after a clean close -------------------------------------------------------------------
@pytest.mark.benchmark(group=G_REOPEN)
@pytest.mark.parametrize("size", [100, 1024], ids=["100B", "1KiB"])
@pytest.mark.parametrize("name", PEER_NAMES)
def test_reopen(benchmark, datasets, name, size):
    need(name)
    ds = datasets(name, size)
    ds.close()
    opened: list[Peer] = []

    def reopen() -> None:
        opened.append(open_peer(name, ds.path))

    def close() -> None:
        opened.pop().close()

    benchmark.pedantic(reopen, setup=sync_setup, teardown=close, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    while opened:  # --benchmark-disable runs the target once without its teardown
        close()
    peer = ds.open()
    assert peer.seq == ds.n, (peer.seq, ds.n)
    extra: dict[str, Any] = {"data_messages": ds.n}
    if name == "mqstore":
        extra["recovery_mode"] = peer.store.recovery.mode  # type: ignore[attr-defined]
    record(benchmark, "reopen-100B" if size == 100 else "reopen-1KiB", name, ds.n, "ms", **extra)


# -- 8: disk bytes per message after 1M (the consume / lookup data set) -------------------------------
@pytest.mark.benchmark(group=G_DISK_LARGE)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_disk_bytes_1m(benchmark, datasets, name):
    need(name)
    ds = datasets(name, 100)
    ds.close()  # measured after a clean close
    benchmark.pedantic(disk_bytes, args=(ds.path,), rounds=1, iterations=1)
    extra = _disk_extra(ds.path, name, ds.n)
    record(benchmark, "disk-1M", name, ds.n, "none", **extra)
    benchmark.extra_info.update(value=round(extra["disk_bytes"] / ds.n, 1), unit="B/msg")


# -- 5: lookups on a live store ------------------------------------------------------------------------
@pytest.mark.benchmark(group=G_LOOKUP_LIVE)
@pytest.mark.parametrize("name", PEER_NAMES)
def test_lookup_live(benchmark, datasets, name):
    need(name)
    ds = datasets(name, 100)
    if name == "redis":
        reader = ds.open()  # the data set's redis-server keeps running; the writer is another client
        port = reader.port  # type: ignore[attr-defined]
    else:
        ds.close()  # the writer process opens it (mqstore: and owns it)
        port = None
    writer = LiveWriter(name, ds.path, 100, LIVE_RATE, LIVE_BATCH, redis_port=port)
    try:
        if name == "mqstore":
            from bench._peers import MqstorePeer

            reader = MqstorePeer(ds.path, open_as="reader")  # MessageStore.open attaches to the writer's store
        elif name != "redis":
            reader = open_peer(name, ds.path)
        positions = _positions(name, ds.n)
        writer.go()
        time.sleep(0.3)  # let the writer reach its pace
        assert benchmark.pedantic(reader.lookup, args=(positions,), rounds=ROUNDS_READ, warmup_rounds=1,
                                  iterations=1) == len(positions)
        wrote = writer.stop_writing()
        if name != "redis":
            reader.close()
    finally:
        writer.quit()
    ds.n = int(wrote["seq"])  # the data set grew
    record(benchmark, "lookup-live", name, len(positions), "us", data_messages_at_start=ds.n - wrote["written"],
           writer_msgs_per_s=round(wrote["written"] / wrote["seconds"]), writer_target_msgs_per_s=LIVE_RATE,
           writer="separate process" + (" (MessageStore.open: owner; this process attached)" if name == "mqstore"
                                        else ""))
