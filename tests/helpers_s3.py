"""A real S3 API for the tier tests (tiered-storage spec §11): moto's S3 server in a child process
on 127.0.0.1, a fresh bucket per test, and a fault-injecting TCP proxy in front of it.

- ``s3_server`` (session): ``ThreadedMotoServer(ip_address='127.0.0.1', port=0)`` started by a
  child interpreter (so the server does not share the tests' GIL) with
  ``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE=268435456`` (objects kept in memory); its port read from the
  child's stdout; stopped by its pid at the end of the session.
- ``bucket`` (function): a new bucket made with boto3 (test-only: obstore has no bucket API),
  dummy AWS credentials in the environment, and ``bucket.config(**keys)``: a StoreConfig that
  points the tier at it.
- ``FaultProxy``: a loopback TCP proxy (asyncio in a thread) with switches: refuse connections
  (the listener is closed: ECONNREFUSED), hang (accept and read requests, never answer), add
  latency, cut the next responses after N bytes, answer 503 to the next K requests. It parses
  request heads (Content-Length bodies) so a 503 replaces exactly one request.

Register with ``from tests.helpers_s3 import s3_server, bucket, s3_proxy  # noqa: F401`` in a
test file (or conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import pytest

_MOTO_CHILD = ("from moto.server import ThreadedMotoServer; "
               "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False); s.start(); "
               "print(s.get_host_and_port()[1], flush=True); import time; time.sleep(1e9)")
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1"}
_START_TIMEOUT_S = 60.0


@dataclass
class MotoServer:
    """The moto child process: its pid and the loopback endpoint it serves S3 on."""

    proc: subprocess.Popen[bytes]
    port: int
    log: IO[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after 10 s."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


def start_moto() -> MotoServer:
    """Start moto's S3 server as a child process; its port is the first line it prints."""
    env = {**os.environ, "MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(256 * 1024 * 1024), **DUMMY_CREDENTIALS}
    log = tempfile.TemporaryFile()  # werkzeug's request log: shown only when the server fails to start
    proc = subprocess.Popen([sys.executable, "-c", _MOTO_CHILD], stdout=subprocess.PIPE, stderr=log, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, min(left, 1.0)))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 64)
            if not chunk:
                break
            line += chunk
        if proc.poll() is not None or left <= 0:
            break
    if not line.strip().isdigit():
        MotoServer(proc, 0, log).stop()
        log.seek(0)
        raise RuntimeError(f"moto's S3 server did not start within {_START_TIMEOUT_S} s "
                           f"(exit code {proc.returncode}, printed {line!r}, stderr {log.read()[-2000:]!r})")
    return MotoServer(proc, int(line), log)


def boto3_client(endpoint: str) -> Any:
    """A boto3 S3 client for endpoint (dummy credentials, path-style, no retries)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))


@dataclass
class S3Bucket:
    """One test's bucket on the moto server."""

    name: str
    endpoint: str
    s3: Any  # boto3 client, test-only

    def config(self, endpoint: str | None = None, **keys: Any) -> Any:
        """A StoreConfig whose tier points at this bucket (through ``endpoint`` when given: the
        proxy's), at the NOT_IN_DISK level, with short timeouts."""
        from mqstore.config import StoreConfig

        settings = {"tiered_storage_level": "NOT_IN_DISK", "object_store_bucket": self.name,
                    "object_store_endpoint": endpoint or self.endpoint, "object_store_allow_http": True,
                    "object_store_request_timeout_ms": 10_000, "object_store_connect_timeout_ms": 2_000,
                    **keys}
        return StoreConfig(**settings)

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under prefix (boto3's listing)."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", ())]

    def multipart_uploads(self) -> list[dict[str, Any]]:
        """Multipart uploads started and neither completed nor aborted."""
        return list(self.s3.list_multipart_uploads(Bucket=self.name).get("Uploads", ()))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    # moto is in the test extra: without it the tier tests fail here (never skip), naming the fix
    try:
        import moto  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"the tier tests need moto[s3] ({exc}): pip install -e '.[test]'") from exc
    server = start_moto()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    client = boto3_client(s3_server.endpoint)
    name = f"t-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    yield S3Bucket(name, s3_server.endpoint, client)


# ------------------------------------------------------------------------------------------------
# the fault-injecting proxy


_MAX_HEAD = 64 * 1024
_503_BODY = b'<?xml version="1.0"?><Error><Code>SlowDown</Code><Message>injected by the test proxy</Message></Error>'
_503 = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(_503_BODY), _503_BODY))


@dataclass
class _Switches:
    refuse: bool = False
    hang: bool = False
    latency_s: float = 0.0
    fail_503: int = 0  # next K requests answered 503
    fail_match: bytes = b""  # ... of those whose request line contains this
    cut_after: int | None = None  # next `cut_count` responses cut after this many bytes
    cut_count: int = 0
    # counters (read by tests)
    requests: int = 0  # requests that reached the proxy (whatever happened to them)
    answered_503: int = 0
    cut: int = 0
    hung: int = 0
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class FaultProxy:
    """A loopback TCP proxy to ``upstream_port`` on a free port, run by an asyncio loop in a
    daemon thread. Switches are plain methods, safe to call from the test's thread."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.s = _Switches()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port: int = sock.getsockname()[1]
        self._call(self._listen(sock))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- switches -------------------------------------------------------------------------------

    def refuse(self, on: bool = True) -> None:
        """Close the listener (and every open connection): connections are refused until off."""
        with self.s.lock:
            self.s.refuse = on
        self._call(self._set_listening(not on))

    def hang(self, on: bool = True) -> None:
        """Requests are read and never answered (their connections stay open) until off."""
        with self.s.lock:
            self.s.hang = on

    def latency(self, seconds: float) -> None:
        """Delay every request by this much before it is forwarded (0 = none)."""
        with self.s.lock:
            self.s.latency_s = seconds

    def fail_next(self, k: int, match: bytes = b"") -> None:
        """Answer the next k requests 503 SlowDown (with Connection: close); with ``match``, only
        requests whose request line contains it (b"partNumber=2": one part of a multipart upload)."""
        with self.s.lock:
            self.s.fail_503, self.s.fail_match = k, match

    def cut_next(self, after_bytes: int, count: int = 1) -> None:
        """Cut the next `count` responses after `after_bytes` bytes (head included): the
        connection is closed mid-response."""
        with self.s.lock:
            self.s.cut_after, self.s.cut_count = after_bytes, count

    def heal(self) -> None:
        """Every switch off."""
        with self.s.lock:
            self.s.hang, self.s.latency_s, self.s.fail_503, self.s.fail_match = False, 0.0, 0, b""
            self.s.cut_after, self.s.cut_count = None, 0
        if self.s.refuse:
            self.refuse(False)

    def close(self) -> None:
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # --- the loop's side ------------------------------------------------------------------------

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self, sock: socket.socket | None = None) -> None:
        if sock is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True,
                                                      limit=_MAX_HEAD)
        else:
            self._server = await asyncio.start_server(self._serve, sock=sock, limit=_MAX_HEAD)

    async def _set_listening(self, on: bool) -> None:
        if on and self._server is None:
            await self._listen()
        elif not on and self._server is not None:
            self._server.close()
            self._server = None
            for writer in list(self._conns):
                writer.transport.abort()

    async def _shutdown(self) -> None:
        await self._set_listening(False)
        tasks = asyncio.all_tasks(self._loop) - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        with self.s.lock:
            self.s.connections += 1
        self._conns.add(client_w)
        upstream_w: asyncio.StreamWriter | None = None
        pump: asyncio.Task[None] | None = None
        conn = {"sent": 0, "cut_at": None}
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            pump = asyncio.ensure_future(self._responses(upstream_r, client_w, conn))
            while True:
                try:
                    head = await client_r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length, chunked = _body_framing(head)
                with self.s.lock:
                    self.s.requests += 1
                    answer_503 = self.s.fail_503 > 0 and self.s.fail_match in head.split(b"\r\n", 1)[0]
                    if answer_503:
                        self.s.fail_503 -= 1
                        self.s.answered_503 += 1
                    hang, latency = self.s.hang, self.s.latency_s
                    if hang:
                        self.s.hung += 1
                    cut_at = None
                    if self.s.cut_count > 0 and not answer_503 and not hang:
                        cut_at, self.s.cut_count = self.s.cut_after, self.s.cut_count - 1
                if chunked:  # no framing to follow: pass the rest of the connection through
                    upstream_w.write(head)
                    while data := await client_r.read(65536):
                        upstream_w.write(data)
                        await upstream_w.drain()
                    return
                body = await client_r.readexactly(length) if length else b""
                if answer_503:
                    client_w.write(_503)
                    await client_w.drain()
                    return
                if hang:
                    await client_r.read()  # until the client gives up and closes
                    return
                if latency:
                    await asyncio.sleep(latency)
                conn["sent"], conn["cut_at"] = 0, cut_at
                upstream_w.write(head + body)
                await upstream_w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            self._conns.discard(client_w)
            if pump is not None:
                pump.cancel()
            for w in (client_w, upstream_w):
                if w is not None:
                    w.transport.abort()

    async def _responses(self, upstream_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                         conn: dict[str, Any]) -> None:
        try:
            while data := await upstream_r.read(65536):
                cut_at = conn["cut_at"]
                if cut_at is not None and conn["sent"] + len(data) > cut_at:
                    client_w.write(data[:max(0, cut_at - conn["sent"])])
                    await client_w.drain()
                    with self.s.lock:
                        self.s.cut += 1
                    client_w.transport.abort()
                    return
                conn["sent"] += len(data)
                client_w.write(data)
                await client_w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            client_w.transport.abort()


def _body_framing(head: bytes) -> tuple[int, bool]:
    """(Content-Length, chunked) of a request head."""
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return length, chunked


@pytest.fixture
def s3_proxy(s3_server: MotoServer) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the session's moto server (all switches off), closed after."""
    proxy = FaultProxy(s3_server.port)
    try:
        yield proxy
    finally:
        proxy.close()
