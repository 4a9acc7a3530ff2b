"""The NameServer (docs/rocketmq-remoting-spec.md §2.3): brokers register with it, clients ask it for
a topic's route. An asyncio TCP server over the route table of ``mqstore.broker.routes`` and the
frame codec of ``mqstore.remoting._remoting``: REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC;
served through the broker's request table (``mqstore.broker.requests.route``): any other code is
answered REQUEST_CODE_NOT_SUPPORTED, a request missing a field SYSTEM_ERROR naming it, and a frame
that cannot be decoded closes its connection only.

Guarded (docs/security.md), where RocketMQ 4.9.7's takes any registration from anyone:
given broker ``accounts`` (access key -> secret key), it takes only REGISTER_BROKER and
UNREGISTER_BROKER requests signed by one of them (RocketMQ's ACL signature); with or without, a
broker name and id whose registering connection is open cannot be taken from another address, and
an unregistration comes from that connection or is signed. A broker's routes go when its
connection closes (RocketMQ's onChannelDestroy), so a broker keeps one connection per NameServer
(``NameServerLink``). ``NameServerThread`` runs one on an event loop of its own thread: the
NameServer a broker embeds, which the broker's own work must not starve.

TLS as the broker's remoting port has it (``mqstore.tls``, RocketMQ's tls.server.mode): given a
server context, a NameServer serves TLS only (enforcing) or TLS and plain on one port, told apart
by the first byte (permissive); a failed handshake closes its connection and is logged within the
NameServer's log budget. A ``NameServerLink`` given a client context (the broker's ``tls_enable``)
connects with TLS and checks the NameServer's certificate as the context says; a broker's link to
the NameServer it embeds is a socket pair (``NameServerThread.connect_local``), so no TLS setting
can keep the broker from registering with it.

Limits on every connection, as the broker's fronts have them (``mqstore.broker.limits``): one
silent for ``server_channel_max_idle_time_seconds`` or whose frame does not arrive whole within
FRAME_TIMEOUT_S (or the idle time when shorter) is closed, and at most ``max_connections`` are
open, ``max_connections_per_ip`` from one source address (counted by this NameServer alone);
past them a new connection is closed at once. A socket pair from inside the process (``adopt``)
is none of the network's and meets none of them.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias

from mqstore.remoting._remoting import FrameError, FrameReader, RemotingCommand
from mqstore.acl.signature import ACCESS_KEY, signature_matches
from mqstore.broker.codes import FAQ, ResponseCode
from mqstore.broker.limits import ConnectionCounter, LogLimiter, housekeeping, next_frame_started
from mqstore.broker.requests import Handler, handlers_for, int_field, response, route, wall_ms
from mqstore.broker.routes import (BROKER_CHANNEL_EXPIRED_MS, RouteRefused, RouteTable, parse_register_body,
                                   route_json)
from mqstore.broker.table import Access, RequestSpec, Server
from mqstore.errors import PortInUseError
from mqstore.protocol import VERSION  # the MQVersion ordinal a 4.9.7 NameServer sends (V4_9_7)
from mqstore.tls import DISABLED, ENFORCING, PERMISSIVE, accept_loop

__all__ = ["Accounts", "NameServer", "NameServerLink", "NameServerThread", "SCAN_INTERVAL_MS", "VERSION"]

log = logging.getLogger("mqstore.namesrv")

#: how often brokers whose registration expired are dropped (NamesrvController: every 10 s)
SCAN_INTERVAL_MS = 10_000
#: the first client version that gets standard JSON route data (V4_9_4)
STANDARD_JSON_VERSION = 401
#: connections waiting to be accepted (NettyServerConfig serverSocketBacklog: 1024; asyncio's
#: default of 100 makes a burst of clients wait for SYN retransmits, seconds each)
BACKLOG = 1024

#: the brokers' accounts a NameServer trusts (access key -> secret key), or a function returning
#: them (called for each registration and unregistration: an ACL file re-read when it changes)
Accounts: TypeAlias = Mapping[str, str] | Callable[[], Mapping[str, str]]


def _listen(host: str, port: int, setting: str) -> socket.socket:
    """The NameServer's listening socket; PortInUseError naming the port and its setting when taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart over TIME_WAIT, as Netty
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise PortInUseError.of("NameServer", host or "0.0.0.0", port, setting, exc) from None
        raise
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Channel:
    """One connection to the NameServer, the context its requests are served in: registrations
    made on it are tied to it (``RouteTable``'s channel) and go when it closes. What the
    housekeeping reads of it (``mqstore.broker.limits.Watched``) is kept by ``NameServer._serve``."""

    __slots__ = ("ns", "peer", "writer", "frames", "last_active", "frame_started", "paused")

    def __init__(self, ns: NameServer, peer: str, writer: asyncio.StreamWriter) -> None:
        self.ns = ns
        self.peer = peer
        self.writer = writer
        self.frames = FrameReader()
        self.last_active = time.monotonic()
        self.frame_started = 0.0  # when the bytes of a frame not yet whole began (0: none)
        self.paused = False  # its answers wait for it to read them: it is not read meanwhile

    @property
    def peer_addr(self) -> str:
        return self.peer

    @property
    def busy(self) -> bool:
        return False  # a request is answered before the next is read

    @property
    def buffered(self) -> int:
        return self.frames.buffered

    def abort(self) -> None:
        self.writer.transport.abort()


def _guard(spec: RequestSpec, cmd: RemotingCommand, conn: _Channel) -> str | None:
    """The NameServer's column of the request table: a broker's request (Access.BROKER) signed by
    a trusted account when the NameServer has accounts; why not, or None."""
    if spec.access is not Access.BROKER or conn.ns.accounts is None:
        return None
    accounts = conn.ns.trusted()
    access_key = cmd.ext_fields.get(ACCESS_KEY)
    if not access_key:
        why = ("no AccessKey: this NameServer takes registrations signed with a broker account only (set "
               "inner_access_key and inner_secret_key on the broker)")
    elif (secret := accounts.get(access_key)) is None:
        why = f"AccessKey {access_key} is not a broker account of this NameServer"
    elif not signature_matches(cmd.ext_fields, cmd.body, secret):
        why = f"the signature does not match AccessKey {access_key}'s secret key"
    else:
        return None
    conn.ns.log_budget.warning("%s from %s refused: %s", spec.name, conn.peer, why)
    return f"{spec.name} refused: {why}"


def _refused(conn: _Channel, cmd: RemotingCommand, what: str, exc: RouteRefused) -> RemotingCommand:
    conn.ns.log_budget.warning("%s from %s refused: %s", what, conn.peer, exc)
    return response(cmd, ResponseCode.NO_PERMISSION, f"{what} refused: {exc}")


def _route(conn: _Channel, cmd: RemotingCommand) -> RemotingCommand:
    topic = cmd.ext_fields["topic"]
    data = conn.ns.routes.route(topic)
    if data is None:
        return response(cmd, ResponseCode.TOPIC_NOT_EXIST,
                        f"No topic route info in name server for the topic: {topic}{FAQ}")
    standard = cmd.version >= STANDARD_JSON_VERSION or cmd.ext_fields.get("acceptStandardJsonOnly") == "true"
    return response(cmd, ResponseCode.SUCCESS, body=route_json(data, standard=standard))


def _register(conn: _Channel, cmd: RemotingCommand) -> RemotingCommand:
    f = cmd.ext_fields
    body = parse_register_body(cmd.body, compressed=f.get("compressed", "false"), body_crc32=f.get("bodyCrc32", "0"))
    try:
        ha, master = conn.ns.routes.register_broker(f["clusterName"], f["brokerAddr"], f["brokerName"],
                                                    int_field(f, "brokerId"), f.get("haServerAddr", ""), body,
                                                    conn.ns.clock_ms(), channel=conn)
    except RouteRefused as exc:
        return _refused(conn, cmd, "REGISTER_BROKER", exc)
    fields = {k: v for k, v in (("haServerAddr", ha), ("masterAddr", master)) if v is not None}
    return response(cmd, ResponseCode.SUCCESS, ext_fields=fields, body=b'{"table":{}}')


def _unregister(conn: _Channel, cmd: RemotingCommand) -> RemotingCommand:
    f = cmd.ext_fields
    try:  # past the guard, a NameServer with accounts has checked the signature
        conn.ns.routes.unregister_broker(f["clusterName"], f["brokerAddr"], f["brokerName"], int_field(f, "brokerId"),
                                         channel=conn, verified=conn.ns.accounts is not None)
    except RouteRefused as exc:
        return _refused(conn, cmd, "UNREGISTER_BROKER", exc)
    return response(cmd, ResponseCode.SUCCESS)


class NameServer:
    """A NameServer on host:port (port 0: any free one; ``port`` says which after start).

    ``accounts``: the brokers it trusts (access key -> secret key, or a function returning them):
    registrations and unregistrations must be signed by one (none: all are refused); None (a
    developer's loopback default), they need no signature. ``setting`` names the port's setting
    in the error a taken port raises (PortInUseError).

    ``tls``: the server context (``mqstore.tls.server_context``) and ``tls_mode`` how it is used:
    ``enforcing`` (the default with a context: TLS only) or ``permissive`` (TLS and plain on one
    port); without a context the port is plain (``disabled``).

    ``server_channel_max_idle_time_seconds``, ``max_connections``, ``max_connections_per_ip``:
    the limits on its connections, the broker's settings of those names (defaults as theirs)."""

    #: the NameServer's column of the request table (mqstore.broker.table): each code served by the
    #: function of this module its row names
    _handlers: dict[int, Handler] = handlers_for(globals(), Server.NAMESRV)

    def __init__(self, host: str = "0.0.0.0", port: int = 9876, *, accounts: Accounts | None = None,
                 setting: str = "listen_port", clock_ms: Callable[[], int] = wall_ms,
                 scan_interval_ms: int = SCAN_INTERVAL_MS, tls: ssl.SSLContext | None = None,
                 tls_mode: str | None = None, server_channel_max_idle_time_seconds: int = 120,
                 max_connections: int = 10_000, max_connections_per_ip: int = 1000) -> None:
        mode = tls_mode or (ENFORCING if tls is not None else DISABLED)
        if mode not in (DISABLED, PERMISSIVE, ENFORCING) or (tls is None) != (mode == DISABLED):
            raise ValueError(f"tls_mode {mode!r} with {'a' if tls is not None else 'no'} TLS context: "
                             f"{PERMISSIVE} and {ENFORCING} need one, {DISABLED} none")
        self.tls = tls
        self.tls_mode = mode
        self.host = host
        self.port = port
        self.accounts = accounts
        self.setting = setting
        self.routes = RouteTable()
        self.clock_ms = clock_ms
        self.scan_interval_ms = scan_interval_ms
        self.log_budget = LogLimiter(log)  # refusals, bad frames, failed requests, failed handshakes
        self.idle_s = server_channel_max_idle_time_seconds
        self.counter = ConnectionCounter(max_connections, max_connections_per_ip)
        self._server: asyncio.Server | None = None
        self._listener: socket.socket | None = None  # TLS: the socket the accept loop serves
        self._accepting: asyncio.Task[None] | None = None
        self._scan: asyncio.Task[None] | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._conns: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        self._watched: dict[asyncio.StreamWriter, _Channel] = {}  # the network's connections (not adopted)
        self._closing = False

    def trusted(self) -> Mapping[str, str]:
        """The broker accounts trusted now."""
        accounts = self.accounts() if callable(self.accounts) else self.accounts
        return accounts or {}

    async def start(self) -> None:
        sock = _listen(self.host, self.port, self.setting)
        self.port = sock.getsockname()[1]
        if self.tls_mode == DISABLED:
            self._server = await asyncio.start_server(self._serve, sock=sock, backlog=BACKLOG)
        else:  # each connection's handshake (or first byte) awaited apart from the others
            self._listener = sock
            self._accepting = asyncio.create_task(accept_loop(
                sock, self._protocol, self.tls_mode, self.tls, max_pending=BACKLOG, on_refused=self._refused))
        self._scan = asyncio.create_task(self._scan_loop())
        self._housekeeping = asyncio.create_task(housekeeping(self._watched.values, self.idle_s, self.log_budget,
                                                              lambda: self._closing))
        log.info("NameServer listening on %s:%d%s", self.host, self.port,
                 "" if self.tls_mode == DISABLED else f" (TLS {self.tls_mode})")
        if self.accounts is None and not _is_loopback(self.host):
            log.warning("the NameServer on %s:%d has no broker accounts: anyone who reaches it can register a "
                        "broker under a name not yet taken (give it accounts: docs/security.md)",
                        self.host, self.port)

    async def adopt(self, sock: socket.socket) -> None:
        """Serve ``sock``, a connected socket from inside this process (one end of a socket pair),
        as a connection to this NameServer: plain, whatever the port's TLS."""
        sock.setblocking(False)
        await asyncio.get_running_loop().connect_accepted_socket(self._local_protocol, sock)

    def _refused(self, why: str) -> None:
        """A connection closed before it was served (a failed TLS handshake): one line, in the budget."""
        self.log_budget.warning("refusing a connection from %s", why)

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """A connection's protocol, as asyncio.start_server makes it: streams served by _serve."""
        loop = asyncio.get_running_loop()
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), self._serve, loop=loop)

    def _local_protocol(self) -> asyncio.StreamReaderProtocol:
        """An adopted socket pair's protocol: served without the network's limits."""
        loop = asyncio.get_running_loop()
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), self._serve_local, loop=loop)

    async def close(self) -> None:
        self._closing = True
        if self._scan is not None:
            self._scan.cancel()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in list(self._conns):
            writer.close()
        if self._conns:
            await asyncio.wait(list(self._conns.values()), timeout=5)

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_interval_ms / 1000)
            for addr in self.routes.expire(self.clock_ms()):
                log.warning("broker %s dropped: no registration for %d s", addr, BROKER_CHANNEL_EXPIRED_MS // 1000)

    async def _serve_local(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve(reader, writer, local=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, local: bool = False) -> None:
        peer = writer.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) else ""
        conn = _Channel(self, f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer) or "this process",
                        writer)
        if not local:
            refused = self.counter.admit(ip)
            if refused is not None:
                self.log_budget.warning("refusing a connection from %s: %s", conn.peer, refused)
                writer.transport.abort()
                return
            self._watched[writer] = conn
        task = asyncio.current_task()
        assert task is not None
        self._conns[writer] = task
        frames = conn.frames
        try:
            while data := await reader.read(65536):
                conn.last_active = time.monotonic()
                frames.feed(data)
                took = False
                while (cmd := frames.next()) is not None:
                    took = True
                    answer = self.handle(cmd, conn)
                    if answer is not None and not cmd.is_oneway:
                        writer.write(answer.encode())
                conn.frame_started = next_frame_started(conn.frame_started, frames.buffered, took, time.monotonic())
                conn.paused = True
                await writer.drain()
                conn.paused = False
        except (FrameError, ssl.SSLError) as exc:  # a frame, or a TLS record, that does not decode
            self.log_budget.warning("closing the connection from %s: %s", conn.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            del self._conns[writer]
            if self._watched.pop(writer, None) is not None:
                self.counter.release(ip)
            for addr in self.routes.channel_closed(conn):
                log.info("broker %s dropped: the connection it registered on (from %s) closed", addr, conn.peer)

    def handle(self, cmd: RemotingCommand, conn: _Channel) -> RemotingCommand | None:
        """The response to one request that came on ``conn`` (registrations are tied to it); None
        for a response frame, which a NameServer never asked for."""
        return route(cmd, self._handlers, conn, guard=_guard, errors=self.log_budget)


class NameServerThread:
    """A NameServer (``server``) on an event loop of its own, in a thread of its own: the one a
    broker embeds, so neither the broker's controller nor the NameServer can hold up the other
    (they still share the interpreter's lock, which switches every 5 ms). Arguments as
    NameServer's (``tls``, ``tls_mode`` among them); ``start()`` raises what the server's start
    raises (PortInUseError)."""

    def __init__(self, host: str = "0.0.0.0", port: int = 9876, **settings: Any) -> None:
        self.server = NameServer(host, port, **settings)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def start(self, timeout_s: float = 10.0) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="mqstore-namesrv", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout_s)
        except BaseException:
            self.close()
            raise

    async def connect_local(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Streams to this NameServer for another event loop of this process (the broker's link to
        the NameServer it embeds): a socket pair whose other end the NameServer's loop serves, so
        neither the port's TLS (its certificate, client certificates) nor the network is between
        them, and nobody else can be at the other end."""
        loop = self.loop
        if loop is None:
            raise ConnectionError("the NameServer is closed")
        theirs, ours = socket.socketpair()
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.server.adopt(theirs), loop))
        except BaseException:
            theirs.close()
            ours.close()
            raise
        ours.setblocking(False)
        return await asyncio.open_connection(sock=ours)

    def call(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """fn() run on the NameServer's loop (to read its route table from another thread)."""
        assert self.loop is not None

        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        self.loop = self._thread = None
        try:
            if thread.is_alive():
                asyncio.run_coroutine_threadsafe(self.server.close(), loop).result(timeout_s)
        except Exception as exc:  # the thread must still end
            log.error("closing the NameServer failed: %s", exc)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            if not thread.is_alive():
                loop.close()


class NameServerLink:
    """A broker's one connection to a NameServer (RocketMQ's NettyRemotingClient channel): its
    registrations go over it, so the NameServer ties them to it and drops them when it closes.
    Requests may overlap (answers are matched by opaque); a lost connection is opened again by the
    next request, and ``on_lost`` is called when one that answered is lost (its registrations went
    with it: the broker registers again at once; one that never answered held none, and a server
    that closes each new connection must not be called in a loop).
    ``tls``: a client context (``mqstore.tls.config_client_context``: the broker's ``tls_enable``):
    the connection is TLS, the NameServer's certificate checked as the context says (its CAs and
    the address's name, unless tls_test_mode_enable); a handshake that fails is logged, naming why.
    ``opener``: opens the connection instead (``NameServerThread.connect_local``; ``tls`` unused)."""

    def __init__(self, addr: str, *, timeout_s: float = 6.0, on_lost: Callable[[], None] | None = None,
                 tls: ssl.SSLContext | None = None,
                 opener: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] | None = None
                 ) -> None:
        self.addr = addr
        self.tls = tls
        self.opener = opener
        self.timeout_s = timeout_s
        self.on_lost = on_lost
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaque = 0
        self._connecting = asyncio.Lock()
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def call(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """The NameServer's answer to cmd, or None (logged) when there is none."""
        try:
            writer = await self._connect()
        except ssl.SSLCertVerificationError as exc:
            log.warning("NameServer %s: its TLS certificate is not trusted (%s): it must be signed by a CA of "
                        "tls_client_trust_cert_path (the system's CAs when empty) and name the address", self.addr,
                        exc.verify_message)
            return None
        except ssl.SSLError as exc:
            log.warning("NameServer %s: the TLS handshake failed (%s)", self.addr, exc.reason or exc)
            return None
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("NameServer %s: cannot connect (%s)", self.addr, exc)
            return None
        self._opaque = self._opaque % 0x7FFFFFFF + 1
        opaque = cmd.opaque = self._opaque
        answer: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = answer
        try:
            writer.write(cmd.encode())
            await writer.drain()
            return await asyncio.wait_for(answer, self.timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("NameServer %s: request %d failed (%s)", self.addr, cmd.code, exc or type(exc).__name__)
            return None
        finally:
            self._pending.pop(opaque, None)

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._closed:
                raise ConnectionError("the link is closed")
            if self._writer is None or self._writer.is_closing():
                if self.opener is not None:
                    opening = self.opener()
                else:
                    host, _, port = self.addr.rpartition(":")
                    opening = asyncio.open_connection(host, int(port), ssl=self.tls,
                                                      ssl_handshake_timeout=self.timeout_s if self.tls else None)
                reader, writer = await asyncio.wait_for(opening, self.timeout_s)
                self._writer = writer
                self._reading = asyncio.create_task(self._read(reader, writer))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        why = "closed by the NameServer"
        answered = False
        try:
            while data := await reader.read(65536):
                frames.feed(data)
                while (got := frames.next()) is not None:
                    waiting = self._pending.pop(got.opaque, None)
                    if waiting is not None and not waiting.done() and got.is_response:
                        waiting.set_result(got)
                        answered = True
        except (OSError, FrameError) as exc:
            why = str(exc)
        finally:
            if self.tls is not None and not answered:  # TLS 1.3: a refused client certificate shows only now
                why += (" before answering anything over TLS: a NameServer that requires client certificates "
                        "closes the connection when the broker presents none it trusts (tls_client_cert_path)")
            writer.close()
            if self._writer is writer:
                self._writer = None
            for waiting in self._pending.values():  # no await since the loss: all were sent on writer
                if not waiting.done():
                    waiting.set_exception(ConnectionError(why))
            self._pending.clear()
            if not self._closed and answered:  # else the request that waited says it failed
                log.warning("NameServer %s: the connection was lost (%s); registering again", self.addr, why)
                if self.on_lost is not None:
                    self.on_lost()

    async def close(self) -> None:
        self._closed = True
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
