"""One remoting connection (docs/rocketmq-remoting-spec.md §1): a TCP connection to a broker or a
NameServer carrying any number of requests at once, each matched to its response by ``opaque``
(§1.6), oneway requests, per-request timeouts, and the requests the server sends on its own
(NOTIFY_CONSUMER_IDS_CHANGED) handed to a callback.

A request costs no timer of its own: each one in flight keeps its deadline, and one timer per
connection, armed for the earliest deadline (never more than SCAN_INTERVAL_S ahead), fails the
overdue ones when it fires, as RocketMQ's scanResponseTable does every second.

Frames are encoded and decoded by the compiled ``mqstore.remoting._remoting``; the header serialization
(JSON or ROCKETMQ, §1.2, §1.4) is chosen per connection, and a 4.9.7 server answers in the
request's.

With ``credentials`` (mqstore.acl.SessionCredentials) every request is signed as RocketMQ's
AclClientRPCHook signs it: AccessKey (and SecurityToken) added to its extFields and the
Signature, HMAC-SHA1 over the fields as they go on the wire and the body (docs/client.md).

With ``tls`` (True, or an ssl.SSLContext such as mqstore.tls.client_context builds) the
connection is TLS, the server's certificate checked against the context's CAs and the host of
the address (an IP address against the certificate's IP SANs); a handshake that fails is a
ConnectFailedError naming the address and the TLS reason.

    conn = await RemotingConnection.open("127.0.0.1:9876")
    response = await conn.request(RemotingCommand(105, ext_fields={"topic": "TopicTest"}), timeout=3)
    await conn.close()
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from collections.abc import Callable
from typing import TypeAlias, cast

from mqstore.remoting._remoting import JSON, ROCKETMQ, FrameError, FrameReader, RemotingCommand
from mqstore.acl.signature import SessionCredentials
from mqstore.client.errors import ConnectFailedError, ConnectionClosedError, RemotingTimeoutError
from mqstore.client.protocol import VERSION, ResponseCode, request_name

__all__ = ["RemotingConnection", "RequestHandler", "TlsOption", "parse_address", "serialize_type", "tls_context",
           "tls_failure", "unanswered_hint"]

log = logging.getLogger("mqstore.client")

#: RemotingCommand flag bits (§1.2)
RPC_RESPONSE, RPC_ONEWAY = 0x1, 0x2
#: the longest the timeout scan of a connection with requests in flight sleeps: a request fails
#: at most this long after its deadline, whatever deadlines came after the timer was armed
SCAN_INTERVAL_S = 0.1
LANGUAGE = "PYTHON"

#: what the server's requests are handed to: (connection, request) -> the response to send, or None
RequestHandler = Callable[["RemotingConnection", RemotingCommand], "RemotingCommand | None"]

#: what a client's ``tls`` argument takes: None or False (plain TCP), True (TLS checked against the
#: system's CAs and the server's name) or an ssl.SSLContext the caller built
TlsOption: TypeAlias = bool | ssl.SSLContext | None

# opaques are unique per process (RocketMQ's requestId counter), kept non-negative int32
_opaques = itertools.count(1)


def _next_opaque() -> int:
    return next(_opaques) & 0x7FFFFFFF


def serialize_type(name: str | int) -> int:
    """"JSON" / "ROCKETMQ" (or the numbers 0 / 1) -> the header serialization type."""
    if isinstance(name, int) and not isinstance(name, bool) and name in (JSON, ROCKETMQ):
        return name
    if isinstance(name, str) and name.upper() in ("JSON", "ROCKETMQ"):
        return JSON if name.upper() == "JSON" else ROCKETMQ
    raise ValueError(f"serialize must be 'JSON' or 'ROCKETMQ', not {name!r}")


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ValueError naming the address when it is not one."""
    if not isinstance(address, str):
        raise ValueError(f"an address must be a 'host:port' string, not {address!r}")
    host, sep, port = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not a 'host:port' address")
    return host, int(port)


def tls_context(tls: object, name: str = "tls") -> ssl.SSLContext | None:
    """A client's ``tls`` argument -> the context its connections use (None: plain TCP). True
    makes ssl.create_default_context() (the system's CAs, the server's name checked); a server's
    context, or anything else, is a ValueError naming the argument."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if isinstance(tls, ssl.SSLContext):
        if tls.protocol == ssl.PROTOCOL_TLS_SERVER:
            raise ValueError(f"{name} is a server's context (PROTOCOL_TLS_SERVER): a client needs one made for "
                             "clients, e.g. mqstore.tls.client_context(trust_cert_path=...)")
        return tls
    raise ValueError(f"{name} must be None, True, False or an ssl.SSLContext, not {tls!r}")


def tls_failure(address: str, exc: BaseException) -> str | None:
    """What a connection with TLS that failed with exc says, when exc is the TLS handshake's
    failure (None for a TCP failure: refused, unreachable)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"cannot connect to {address}: the TLS handshake failed: the server's certificate was refused "
                f"({exc.verify_message or exc.reason}); the client's context checks it against its CAs and the name "
                f"{parse_address(address)[0]!r}")
    if isinstance(exc, ssl.SSLError):
        return f"cannot connect to {address}: the TLS handshake failed: {exc.reason or exc}"
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return (f"cannot connect to {address}: the TLS handshake failed: the server closed the connection ({exc}); "
                "does it serve TLS, and does it want a client certificate?")
    return None


def unanswered_hint(tls: bool) -> str:
    """Why a server may close a new connection before answering its first request."""
    if tls:
        return (" before answering anything (a server that requires a client certificate closes a TLS connection "
                "without one: a context with cert_path / key_path)")
    return (" before answering anything (a server that serves TLS only, tls_server_mode=enforcing, closes a plain "
            "connection: tls=True or an ssl.SSLContext)")


class _Protocol(asyncio.Protocol):
    def __init__(self, conn: RemotingConnection) -> None:
        self.conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (asyncio's own, or uvloop's, which does not subclass asyncio.Transport)
        transport = cast(asyncio.Transport, transport)
        self.conn._made(transport)

    def data_received(self, data: bytes) -> None:
        self.conn._received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._lost(exc)

    def pause_writing(self) -> None:
        self.conn._writable.clear()

    def resume_writing(self) -> None:
        self.conn._writable.set()


class RemotingConnection:
    """A connection to ``address`` ("host:port"). Requests are sent with ``serialize`` headers
    ("JSON" or "ROCKETMQ"), language PYTHON and ``version``; ``on_request`` gets every request
    the server sends (its return value, if any, is sent as the response; with no handler a
    non-oneway request is answered REQUEST_CODE_NOT_SUPPORTED, as RocketMQ's remoting does);
    ``on_close`` is called once when the connection ends; with ``credentials`` every request
    sent is signed; with ``tls`` (True or an ssl.SSLContext) the connection is TLS.

    ``max_in_flight`` (the most requests that waited for responses at once), ``requests`` (sent)
    and ``unmatched`` (responses that matched no request in flight: late ones, after a timeout)
    are counted for whoever watches the connection."""

    def __init__(self, address: str, *, serialize: str | int = "JSON", version: int = VERSION,
                 on_request: RequestHandler | None = None,
                 on_close: Callable[[RemotingConnection], None] | None = None,
                 credentials: SessionCredentials | None = None, tls: TlsOption = None) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.tls = tls_context(tls)
        self.serialize_type = serialize_type(serialize)
        self.version = int(version)
        self.on_request = on_request
        self.on_close = on_close
        self.credentials = credentials
        self.local_address: tuple[str, int] | None = None
        self.max_in_flight = 0
        self.requests = 0
        self.unmatched = 0
        self._transport: asyncio.Transport | None = None
        self._frames = FrameReader()
        # opaque -> (future, request code, deadline on the loop's clock, timeout)
        self._pending: dict[int, tuple[asyncio.Future[RemotingCommand], int, float, float]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scan: asyncio.TimerHandle | None = None
        self._scan_at = 0.0
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False
        self._close_reason = ""
        self._lost_event = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------
    @classmethod
    async def open(cls, address: str, *, connect_timeout: float = 3.0, serialize: str | int = "JSON",
                   version: int = VERSION, on_request: RequestHandler | None = None,
                   on_close: Callable[[RemotingConnection], None] | None = None,
                   credentials: SessionCredentials | None = None, tls: TlsOption = None) -> RemotingConnection:
        """A connected RemotingConnection; ConnectFailedError naming the address when it cannot be
        (with tls: the TCP connection and the TLS handshake within connect_timeout)."""
        conn = cls(address, serialize=serialize, version=version, on_request=on_request, on_close=on_close,
                   credentials=credentials, tls=tls)
        await conn.connect(connect_timeout)
        return conn

    async def connect(self, timeout: float = 3.0) -> None:
        if self._transport is not None or self._closed:
            raise ConnectionClosedError(f"the connection to {self.address} was already used; make a new one",
                                        self.address)
        loop = self._loop = asyncio.get_running_loop()
        ctx = self.tls
        try:
            if ctx is None:
                await asyncio.wait_for(loop.create_connection(lambda: _Protocol(self), self.host, self.port), timeout)
            else:
                await asyncio.wait_for(loop.create_connection(lambda: _Protocol(self), self.host, self.port, ssl=ctx,
                                                              server_hostname=self.host,
                                                              ssl_handshake_timeout=timeout), timeout)
        except asyncio.TimeoutError:
            self._closed = True
            what = "" if ctx is None else " (TCP and the TLS handshake)"
            raise ConnectFailedError(f"cannot connect to {self.address}: no answer in {timeout:g} s{what}",
                                     self.address) from None
        except OSError as exc:
            self._closed = True
            message = tls_failure(self.address, exc) if ctx is not None else None
            raise ConnectFailedError(message or f"cannot connect to {self.address}: {exc.strerror or exc}",
                                     self.address) from exc

    def _made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = transport.get_extra_info("sockname")
        if local:
            self.local_address = (str(local[0]), int(local[1]))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests sent and waiting for their responses."""
        return len(self._pending)

    def close(self, reason: str = "closed by the client") -> None:
        """Close the connection; the requests in flight fail with ConnectionClosedError naming reason."""
        if not self._close_reason:
            self._close_reason = reason
        if self._transport is not None:
            self._transport.close()
        else:
            self._lost(None)

    async def wait_closed(self, timeout: float = 5.0) -> None:
        if self._transport is not None and not self._lost_event.is_set():
            try:
                await asyncio.wait_for(self._lost_event.wait(), timeout)
            except asyncio.TimeoutError:
                self._transport.abort()

    def _lost(self, exc: Exception | None) -> None:
        if self._lost_event.is_set():
            return
        self._closed = True
        self._lost_event.set()
        self._writable.set()
        reason = self._close_reason
        if not reason:
            reason = f"closed by the peer: {exc}" if exc else "closed by the peer"
            if len(self._pending) == self.requests and (self.requests or self.tls is not None):
                # nothing answered: a plain client at a TLS-only server, or (TLS 1.3, at once
                # after the handshake) a TLS client without the certificate the server requires
                reason += unanswered_hint(self.tls is not None)
            self._close_reason = reason  # what a request sent after this says too
        if self._scan is not None:
            self._scan.cancel()
            self._scan = None
        pending, self._pending = self._pending, {}
        for opaque, (fut, code, _deadline, _timeout) in pending.items():
            if not fut.done():
                fut.set_exception(ConnectionClosedError(
                    f"the connection to {self.address} {reason} while {request_name(code)} (opaque {opaque}) "
                    "waited for its response", self.address))
        if self.on_close is not None:
            try:
                self.on_close(self)
            except Exception:  # a callback's failure must not hide the close
                log.exception("on_close of the connection to %s failed", self.address)

    # -- requests ------------------------------------------------------------------------------
    def _prepare(self, cmd: RemotingCommand, flag: int) -> None:
        if self._closed or self._transport is None:
            why = self._close_reason or ("closed by the peer" if self._transport is not None else "not connected")
            raise ConnectionClosedError(f"cannot send {request_name(cmd.code)} to {self.address}: the connection is "
                                        f"{why}", self.address)
        cmd.opaque = _next_opaque()
        cmd.flag = flag
        cmd.language = LANGUAGE
        cmd.version = self.version
        cmd.serialize_type = self.serialize_type
        if self.credentials is not None:
            self.credentials.sign(cmd.ext_fields, cmd.body)

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send cmd and wait for its response (whatever its code). RemotingTimeoutError after
        `timeout` seconds, ConnectionClosedError when the connection ends first; both name the
        address and the request. cmd's opaque, flag, language, version and serialization are set
        here, and its AccessKey and Signature with credentials."""
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self._prepare(cmd, 0)
        transport, loop = self._transport, self._loop
        assert transport is not None and loop is not None
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        opaque = cmd.opaque
        pending = self._pending
        deadline = loop.time() + timeout
        pending[opaque] = (fut, cmd.code, deadline, timeout)
        self.requests += 1
        if len(pending) > self.max_in_flight:
            self.max_in_flight = len(pending)
        if self._scan is None or deadline < self._scan_at:
            self._arm(loop, deadline)
        try:
            transport.write(cmd.encode())
            if not self._writable.is_set():
                await self._writable.wait()
            return await fut
        finally:
            pending.pop(opaque, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """(Re-)arm the timeout scan for when (at most SCAN_INTERVAL_S from now)."""
        when = min(when, loop.time() + SCAN_INTERVAL_S)
        if self._scan is not None:
            self._scan.cancel()
        self._scan_at = when
        self._scan = loop.call_at(when, self._scan_timeouts)

    def _scan_timeouts(self) -> None:
        """Fail every request whose deadline passed; re-arm for the earliest one left."""
        self._scan = None
        loop = self._loop
        if loop is None or self._closed:
            return
        now = loop.time()
        earliest = None
        overdue = []
        for opaque, entry in self._pending.items():
            deadline = entry[2]
            if deadline <= now:
                overdue.append(opaque)
            elif earliest is None or deadline < earliest:
                earliest = deadline
        for opaque in overdue:
            self._timed_out(opaque)
        if earliest is not None:
            self._arm(loop, earliest)

    def _timed_out(self, opaque: int) -> None:
        entry = self._pending.pop(opaque, None)
        if entry is not None and not entry[0].done():
            fut, code, _deadline, timeout = entry
            fut.set_exception(RemotingTimeoutError(
                f"no response from {self.address} to {request_name(code)} (opaque {opaque}) in {timeout:g} s",
                self.address, timeout))

    async def oneway(self, cmd: RemotingCommand) -> None:
        """Send cmd with the oneway flag (RPC_ONEWAY): no response is expected. Returns once the
        frame is handed to the transport (after waiting for its buffer to drain, if it is full)."""
        self._prepare(cmd, RPC_ONEWAY)
        assert self._transport is not None
        self.requests += 1
        self._transport.write(cmd.encode())
        if not self._writable.is_set():
            await self._writable.wait()

    # -- frames in -----------------------------------------------------------------------------
    def _received(self, data: bytes) -> None:
        self._frames.feed(data)
        while True:
            try:
                cmd = self._frames.next()
            except FrameError as exc:
                log.warning("closing the connection to %s: a frame that cannot be decoded: %s", self.address, exc)
                self.close(f"was closed by the client: {self.address} sent a frame that cannot be decoded ({exc})")
                return
            if cmd is None:
                return
            if cmd.is_response:
                entry = self._pending.pop(cmd.opaque, None)
                if entry is None or entry[0].done():
                    self.unmatched += 1
                    log.debug("a response from %s (code %d, opaque %d) matches no request in flight", self.address,
                              cmd.code, cmd.opaque)
                else:
                    entry[0].set_result(cmd)
            else:
                self._serve(cmd)

    def _serve(self, cmd: RemotingCommand) -> None:
        """A request from the server: to on_request; its answer (if any) is the response."""
        answer: RemotingCommand | None = None
        try:
            if self.on_request is not None:
                answer = self.on_request(self, cmd)
            elif not cmd.is_oneway:
                answer = RemotingCommand(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                         remark=f" request type {cmd.code} not supported")
        except Exception as exc:
            log.exception("handling request %d from %s failed", cmd.code, self.address)
            answer = RemotingCommand(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
        if answer is None or cmd.is_oneway or self._closed or self._transport is None:
            return
        answer.opaque = cmd.opaque
        answer.flag = RPC_RESPONSE
        answer.language = LANGUAGE
        answer.version = self.version
        answer.serialize_type = cmd.serialize_type
        self._transport.write(answer.encode())

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._transport is not None else "new")
        return f"<RemotingConnection {self.address} {state}, {len(self._pending)} in flight>"
