"""A blocking producer (RocketMQ's DefaultMQProducer.send, the C++ client's send_sync) for programs
without asyncio: ``SyncProducer`` sends what ``Producer`` sends (docs/rocketmq-remoting-spec.md
§2.4.1) over plain blocking sockets, and may be shared by any number of threads.

    with SyncProducer("PG", namesrv="127.0.0.1:9876") as producer:
        result = producer.send("TopicTest", b"hello", tags="TagA", keys="k1")

Everything around the request (argument checks, properties, header, batch body, queue picking,
the SendResult) is the asyncio producer's own code (mqstore.client._sending); the routes are
looked up and decided as ClientInstance does (mqstore.client.instance's functions). What is
different is the connection: one blocking TCP socket per address (TCP_NODELAY), and one lock per
connection held for a whole request/response exchange: the frame is sent, then frames are read
(mqstore.remoting._remoting.FrameReader) until the response with the request's opaque arrives. A request
the server sends meanwhile is answered REQUEST_CODE_NOT_SUPPORTED (unless oneway, like
NOTIFY_CONSUMER_IDS_CHANGED, which is skipped), as RemotingConnection does without a handler.
A timeout (the socket's: SO_RCVTIMEO / SO_SNDTIMEO on Linux, so that a request costs one send and
one recv system call) or a frame that cannot be decoded closes the connection; the next request
opens a new one. With credentials every request is signed as the asyncio clients sign theirs.

With tls the socket is wrapped in the context's TLS (the handshake within the timeout, the server's
certificate checked against the host of the address) and keeps Python's socket timeout: an SSL
socket under SO_RCVTIMEO would fail a read with an SSL error rather than time out. A handshake
that fails is a ConnectFailedError naming the address and the TLS reason.

Heartbeats need no thread: a broker gets HEART_BEAT before the first send on a connection and
again, before a send, once heartbeat_interval has passed. close() sends UNREGISTER_CLIENT to
every broker heartbeated.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from types import TracebackType

from mqstore.client._client import UniqIdGenerator
from mqstore.remoting._remoting import FrameError, FrameReader, RemotingCommand
from mqstore.acl.signature import SessionCredentials, as_credentials
from mqstore.client._sending import (BATCH_PROPERTIES, BatchItem, QueuePicker, batch_body, batch_entries, check_topic,
                                     heartbeat_body, prepare_message, producer_options, send_header, send_properties,
                                     send_result)
from mqstore.client.errors import (ClientError, ClientStateError, ConnectFailedError, ConnectionClosedError,
                                   MQClientError, RemotingConnectionError, RemotingTimeoutError)
from mqstore.client.instance import (DERIVED_ROUTE_TTL_S, check_positive, client_tls, derived_route,
                                     new_instance_name, no_namesrv_answered, parse_namesrv, publish_route, route_of,
                                     wants_default_route)
from mqstore.client.message import Message, SendResult
from mqstore.client.protocol import DEFAULT_TOPIC, VERSION, RequestCode, ResponseCode, request_name
from mqstore.client.remoting import (LANGUAGE, RPC_ONEWAY, RPC_RESPONSE, TlsOption, _next_opaque, parse_address,
                                     serialize_type, tls_failure, unanswered_hint)
from mqstore.client.route import MessageQueue, TopicRoute

__all__ = ["SyncProducer"]

log = logging.getLogger("mqstore.client")

#: bytes asked of the socket per recv
RECV_SIZE = 65536
#: on Linux a request's timeout is the kernel's (SO_SNDTIMEO / SO_RCVTIMEO on a blocking socket:
#: a send and a recv are one system call each); elsewhere Python's socket timeout (a poll before each)
KERNEL_TIMEOUTS = sys.platform.startswith("linux")


def _set_timeout(sock: socket.socket, seconds: float) -> None:
    """Make a send or a recv on sock fail after seconds: socket.timeout, or (kernel timeouts)
    BlockingIOError."""
    if not KERNEL_TIMEOUTS:
        sock.settimeout(seconds)
        return
    sec = int(seconds)
    usec = int((seconds - sec) * 1_000_000)
    if sec == 0 and usec == 0:
        usec = 1  # 0 would mean no timeout at all
    tv = struct.pack("@ll", sec, usec)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _set_tls_timeout(sock: socket.socket, seconds: float) -> None:
    """_set_timeout for a TLS socket: Python's timeout (socket.timeout), whatever the platform."""
    sock.settimeout(seconds)


class _Connection:
    """A blocking connection to one address. Whoever holds ``lock`` owns the socket and the
    frame reader for a whole exchange; ``sock`` is None until connected and after a close. With
    ``tls`` (a client's context) the socket is TLS and ``set_timeout`` sets Python's timeout."""

    __slots__ = ("address", "host", "port", "lock", "sock", "frames", "sock_timeout", "local_ip", "closed_reason",
                 "heartbeat_due", "heartbeated", "requests", "unmatched", "credentials", "tls", "set_timeout",
                 "requests_at_connect")

    def __init__(self, address: str, credentials: SessionCredentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.address = address
        self.credentials = credentials
        self.tls = tls
        self.set_timeout = _set_timeout if tls is None else _set_tls_timeout
        self.host, self.port = parse_address(address)
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.frames = FrameReader()
        self.sock_timeout = 0.0
        self.local_ip: str | None = None
        self.closed_reason = ""  # set by SyncProducer.close: no reconnecting
        self.heartbeat_due = 0.0  # monotonic: a send after this heartbeats first
        self.heartbeated = False  # HEART_BEAT answered SUCCESS on the current socket
        self.requests = 0
        self.requests_at_connect = 0  # requests sent before the current socket
        self.unmatched = 0

    def connect(self, timeout: float) -> socket.socket:
        """The connected socket (made now if there is none); ConnectFailedError naming the address."""
        sock = self.sock
        if sock is not None:
            return sock
        deadline = time.monotonic() + timeout
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except TimeoutError:
            raise ConnectFailedError(f"cannot connect to {self.address}: no answer in {timeout:g} s",
                                     self.address) from None
        except OSError as exc:
            raise ConnectFailedError(f"cannot connect to {self.address}: {exc.strerror or exc}", self.address) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self._handshake(sock, self.tls, deadline, timeout)
        elif KERNEL_TIMEOUTS:
            sock.settimeout(None)  # blocking; the kernel times the sends and recvs out
            _set_timeout(sock, timeout)
        self.local_ip = str(sock.getsockname()[0])
        self.sock = sock
        self.sock_timeout = timeout
        self.requests_at_connect = self.requests
        self.frames = FrameReader()
        self.heartbeat_due = 0.0
        self.heartbeated = False
        return sock

    def _handshake(self, sock: socket.socket, ctx: ssl.SSLContext, deadline: float, timeout: float) -> ssl.SSLSocket:
        """sock wrapped in ctx's TLS, the handshake done in what is left of the connect timeout;
        ConnectFailedError naming the address and the TLS reason (sock closed) when it fails."""
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            tls_sock = ctx.wrap_socket(sock, server_hostname=self.host)
            tls_sock.settimeout(timeout)
            return tls_sock
        except TimeoutError:
            sock.close()
            raise ConnectFailedError(f"cannot connect to {self.address}: no answer in {timeout:g} s (TCP and the "
                                     "TLS handshake)", self.address) from None
        except (OSError, ValueError) as exc:
            sock.close()
            message = tls_failure(self.address, exc) or f"cannot connect to {self.address}: the TLS handshake " \
                                                        f"failed: {exc}"
            raise ConnectFailedError(message, self.address) from exc

    def _peer_closed(self, detail: str = "") -> str:
        """Why the peer closed the connection, with a hint when it answered nothing on it."""
        reason = f"closed by the peer{detail}"
        if self.requests == self.requests_at_connect + 1:
            reason += unanswered_hint(self.tls is not None)
        return reason

    def drop(self) -> None:
        """Close the socket (a new request connects again, unless closed_reason is set)."""
        sock, self.sock = self.sock, None
        self.heartbeated = False
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def exchange(self, cmd: RemotingCommand, timeout: float, serialize: int, oneway: bool = False) -> RemotingCommand:
        """Send cmd and read frames until its response (the lock held by the caller); with oneway,
        return cmd once it is sent. cmd's opaque, flag, language, version and serialization are
        set here, and its AccessKey and Signature with credentials. RemotingTimeoutError,
        ConnectionClosedError, ConnectFailedError."""
        if self.closed_reason:
            raise ConnectionClosedError(f"cannot send {request_name(cmd.code)} to {self.address}: the connection "
                                        f"{self.closed_reason}", self.address)
        sock = self.sock if self.sock is not None else self.connect(timeout)
        opaque = cmd.opaque = _next_opaque()
        cmd.flag = RPC_ONEWAY if oneway else 0
        cmd.language = LANGUAGE
        cmd.version = VERSION
        cmd.serialize_type = serialize
        if self.credentials is not None:
            self.credentials.sign(cmd.ext_fields, cmd.body)
        self.requests += 1
        if self.sock_timeout != timeout:
            self.set_timeout(sock, timeout)
            self.sock_timeout = timeout
        frame = cmd.encode()
        frames = self.frames
        deadline = 0.0
        try:
            sock.sendall(frame)
            if oneway:
                return cmd
            while True:
                response = frames.next()
                if response is None:
                    if deadline:  # a second read for this request: only what is left of the timeout
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise TimeoutError
                        self.set_timeout(sock, left)
                        self.sock_timeout = left
                    else:
                        deadline = time.monotonic() + timeout
                    data = sock.recv(RECV_SIZE)
                    if not data:
                        raise self._closed(cmd, opaque, self.closed_reason or self._peer_closed())
                    frames.feed(data)
                elif response.opaque == opaque and response.is_response:
                    return response
                elif response.is_response:
                    self.unmatched += 1  # a late response, to a request that timed out
                elif not response.is_oneway:
                    self._refuse(sock, response)
        except (TimeoutError, BlockingIOError):  # Python's socket timeout, or the kernel's (EAGAIN)
            self.drop()
            if self.closed_reason:
                raise self._closed(cmd, opaque, self.closed_reason) from None
            raise RemotingTimeoutError(f"no response from {self.address} to {request_name(cmd.code)} (opaque "
                                       f"{opaque}) in {timeout:g} s", self.address, timeout) from None
        except FrameError as exc:
            log.warning("closing the connection to %s: a frame that cannot be decoded: %s", self.address, exc)
            raise self._closed(cmd, opaque, f"was closed by the client: {self.address} sent a frame that cannot be "
                                            f"decoded ({exc})") from None
        except ConnectionClosedError:
            raise
        except OSError as exc:  # (an SSL error too: a TLS alert, a record that does not decrypt)
            raise self._closed(cmd, opaque, self.closed_reason or self._peer_closed(f": {exc}")) from None
        except BaseException:  # e.g. KeyboardInterrupt: a frame half sent or a response unread
            self.drop()
            raise

    def _closed(self, cmd: RemotingCommand, opaque: int, reason: str) -> ConnectionClosedError:
        self.drop()
        return ConnectionClosedError(f"the connection to {self.address} {reason} while {request_name(cmd.code)} "
                                     f"(opaque {opaque}) waited for its response", self.address)

    def _refuse(self, sock: socket.socket, request: RemotingCommand) -> None:
        """A request from the server: this client has no processor for any."""
        answer = RemotingCommand(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, opaque=request.opaque, flag=RPC_RESPONSE,
                                 language=LANGUAGE, version=VERSION, serialize_type=request.serialize_type,
                                 remark=f" request type {request.code} not supported")
        sock.sendall(answer.encode())


class SyncProducer:
    """A blocking producer of group ``group`` over the NameServers ``namesrv``
    ("host:port;host:port"), with Producer's arguments (serialize, send_code, timeout,
    compress_over, heartbeat_interval, route_ttl, credentials, tls, namesrv_tls) and its sends as
    plain methods.
    Any number of threads may share one: each connection carries one request at a time."""

    def __init__(self, group: str, namesrv: str, *, serialize: str = "JSON", send_code: str = "SEND_MESSAGE_V2",
                 timeout: float = 3.0, compress_over: int | None = None, heartbeat_interval: float = 30.0,
                 route_ttl: float = 30.0,
                 credentials: SessionCredentials | tuple[str, str] | None = None, tls: TlsOption = None,
                 namesrv_tls: TlsOption = None) -> None:
        self.group, self.send_code, self.compress_over = producer_options(group, send_code, compress_over)
        self.credentials = as_credentials(credentials)
        self.tls, self.namesrv_tls = client_tls(tls, namesrv_tls)
        self.namesrv = parse_namesrv(namesrv)
        self.serialize_type = serialize_type(serialize)
        self.timeout = check_positive("timeout", timeout)
        self.heartbeat_interval = check_positive("heartbeat_interval", heartbeat_interval)
        self.route_ttl = check_positive("route_ttl", route_ttl)
        self.instance_name = new_instance_name()
        self.heartbeats = 0  # HEART_BEAT requests answered SUCCESS
        self.started = False
        self.closed = False
        self._v2 = self.send_code == RequestCode.SEND_MESSAGE_V2
        self._picker = QueuePicker()
        self._routes: dict[str, tuple[TopicRoute, float]] = {}  # topic -> (route, monotonic expiry)
        self._connections: dict[str, _Connection] = {}
        self._brokers: set[str] = set()  # addresses sent to
        self._lock = threading.Lock()  # the connection table and the id generator
        self._uniq: UniqIdGenerator | None = None
        self._local_ip: str | None = None
        self._client_id: str | None = None
        self._ns_index = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> SyncProducer:
        """Nothing is sent until a topic is used (its route names the brokers)."""
        if self.closed:
            raise ClientStateError("this client is closed; make a new one")
        self.started = True
        return self

    def close(self) -> None:
        """UNREGISTER_CLIENT to every broker this producer heartbeated, then the connections close.
        A request another thread has in flight on a connection gets up to timeout seconds to end
        first; one still waiting after that fails with ConnectionClosedError."""
        if self.closed:
            return
        self.closed = True
        conns = list(self._connections.values())
        fields = {"clientID": self.client_id, "producerGroup": self.group}
        for conn in conns:
            if conn.address not in self._brokers or not conn.lock.acquire(timeout=self.timeout):
                continue
            try:
                if conn.heartbeated and conn.sock is not None:
                    response = conn.exchange(RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields=dict(fields)),
                                             self.timeout, self.serialize_type)
                    if response.code != ResponseCode.SUCCESS:
                        raise MQClientError(response.code, response.remark, address=conn.address,
                                            request=RequestCode.UNREGISTER_CLIENT)
            except ClientError as exc:
                log.warning("UNREGISTER_CLIENT to %s failed: %s", conn.address, exc)
            finally:
                conn.lock.release()
        for conn in conns:
            conn.closed_reason = "was closed by the client"
            sock = conn.sock
            if sock is not None:
                try:
                    # wakes a thread blocked in recv on it (socket's own: an SSLSocket's would also
                    # drop its TLS state under that thread)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass
            if conn.lock.acquire(timeout=self.timeout):
                try:
                    conn.drop()
                finally:
                    conn.lock.release()

    def __enter__(self) -> SyncProducer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ClientStateError("the producer is closed")
        if not self.started:
            raise ClientStateError("the producer is not started: call start() first")

    @property
    def client_id(self) -> str:
        """clientIP@instanceName, the IP being the local address of this producer's first
        connection; fixed once read."""
        if self._client_id is None:
            self._client_id = f"{self._local_ip or '127.0.0.1'}@{self.instance_name}"
        return self._client_id

    def _ids(self) -> UniqIdGenerator:
        uniq = self._uniq
        if uniq is None:
            with self._lock:
                uniq = self._uniq
                if uniq is None:
                    uniq = self._uniq = UniqIdGenerator(self._local_ip)
        return uniq

    # -- connections ---------------------------------------------------------------------------
    def _connection(self, addr: str) -> _Connection:
        conn = self._connections.get(addr)
        if conn is None:
            with self._lock:
                conn = self._connections.get(addr)
                if conn is None:
                    tls = self.namesrv_tls if addr in self.namesrv else self.tls
                    conn = self._connections[addr] = _Connection(addr, self.credentials, tls)
        return conn

    def _request(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """One exchange with addr (a NameServer, or a broker without the heartbeat check)."""
        conn = self._connection(addr)
        with conn.lock:
            response = conn.exchange(cmd, timeout, self.serialize_type)
            if self._local_ip is None:
                self._local_ip = conn.local_ip
            return response

    def _send(self, addr: str, cmd: RemotingCommand, timeout: float | None, oneway: bool = False) -> RemotingCommand:
        """One exchange with the broker at addr, heartbeating it first when that is due."""
        if timeout is None:
            timeout = self.timeout
        elif not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        conn = self._connections.get(addr)
        if conn is None:
            conn = self._connection(addr)
            self._brokers.add(addr)
        with conn.lock:
            if conn.sock is None or time.monotonic() >= conn.heartbeat_due:
                self._heartbeat(conn)
            return conn.exchange(cmd, timeout, self.serialize_type, oneway)

    def _heartbeat(self, conn: _Connection) -> None:
        """HEART_BEAT over conn (its lock held). An error answer is logged (the next one is due
        after heartbeat_interval); a connection that fails fails the send that asked, except a
        connection found closed by the broker (RocketMQ's close connections idle for 120 s):
        the heartbeat is sent once more on a new one."""
        fresh = conn.sock is None
        if fresh and not conn.closed_reason:
            conn.connect(self.timeout)
            if self._local_ip is None:
                self._local_ip = conn.local_ip
        body = heartbeat_body(self.group, self.client_id)
        try:
            response = conn.exchange(RemotingCommand(RequestCode.HEART_BEAT, body=body), self.timeout,
                                     self.serialize_type)
        except ConnectionClosedError as exc:
            if fresh or conn.closed_reason:
                raise
            log.info("the connection to %s was closed (%s); connecting again", conn.address, exc)
            response = conn.exchange(RemotingCommand(RequestCode.HEART_BEAT, body=body), self.timeout,
                                     self.serialize_type)
        conn.heartbeat_due = time.monotonic() + self.heartbeat_interval
        if response.code != ResponseCode.SUCCESS:
            log.warning("HEART_BEAT to %s failed: %s", conn.address,
                        MQClientError(response.code, response.remark, address=conn.address,
                                      request=RequestCode.HEART_BEAT))
            return
        conn.heartbeated = True
        self.heartbeats += 1

    def heartbeat(self) -> None:
        """HEART_BEAT now to every broker this producer sent to (a send heartbeats its broker
        anyway when heartbeat_interval has passed); the first failure is raised after all were tried."""
        self._check_open()
        first: ClientError | None = None
        for addr in sorted(self._brokers):
            conn = self._connection(addr)
            with conn.lock:
                try:
                    self._heartbeat(conn)
                except ClientError as exc:
                    log.warning("HEART_BEAT to %s failed: %s", addr, exc)
                    first = first or exc
        if first is not None:
            raise first

    # -- routes --------------------------------------------------------------------------------
    def _query_route(self, topic: str) -> TopicRoute:
        """GET_ROUTEINFO_BY_TOPIC from a NameServer (the next one when one cannot be reached)."""
        errors: list[str] = []
        n = len(self.namesrv)
        for i in range(n):
            addr = self.namesrv[(self._ns_index + i) % n]
            try:
                response = self._request(addr, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                               ext_fields={"topic": topic}), self.timeout)
            except (RemotingConnectionError, RemotingTimeoutError) as exc:
                errors.append(str(exc))
                continue
            self._ns_index = (self._ns_index + i) % n
            return route_of(response, addr)
        raise no_namesrv_answered(topic, errors, self.namesrv)

    def _route(self, topic: str) -> TopicRoute:
        """The route a send to topic uses: cached for route_ttl (1 s for one derived from TBW102's,
        for a topic the NameServers do not know yet), as ClientInstance.route(publish=True)."""
        entry = self._routes.get(topic)
        if entry is not None and time.monotonic() < entry[1]:
            return entry[0]
        derived = False
        try:
            try:
                route = publish_route(self._query_route(topic), topic)
            except MQClientError as exc:
                if not wants_default_route(exc, topic, True):
                    raise
                try:
                    default = self._query_route(DEFAULT_TOPIC)
                except MQClientError:
                    raise exc from None
                route = derived_route(default, topic, exc)
                derived = True
        except (RemotingConnectionError, RemotingTimeoutError) as exc:
            if entry is None:
                raise
            log.warning("route of %s not refreshed, the cached one is kept: %s", topic, exc)
            self._routes[topic] = (entry[0], time.monotonic() + DERIVED_ROUTE_TTL_S)  # try again soon
            return entry[0]
        self._routes[topic] = (route, time.monotonic() + (DERIVED_ROUTE_TTL_S if derived else self.route_ttl))
        return route

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to topic may go to (every broker's write queues)."""
        self._check_open()
        check_topic(topic)
        return list(self._picker.queues(topic, self._route(topic)))

    # -- sends ---------------------------------------------------------------------------------
    def _prepare(self, topic: str, msg: Message, queue_id: int | None,
                 broker_name: str | None) -> tuple[RemotingCommand, MessageQueue, str, str]:
        if self.closed or not self.started:
            self._check_open()
        check_topic(topic)
        body, props, sys_flag = prepare_message(msg, self.compress_over)  # refused before anything is sent
        mq, addr = self._picker.pick(topic, self._route(topic), queue_id, broker_name)
        uniq = self._ids().next()
        fields = send_header(self.group, topic, mq.queue_id, send_properties(props, uniq), sys_flag=sys_flag,
                             flag=msg.flag, v2=self._v2)
        return RemotingCommand(self.send_code, ext_fields=fields, body=body), mq, addr, uniq

    def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | list[str] | None = None,
             properties: Mapping[str, str] | None = None, queue_id: int | None = None, broker_name: str | None = None,
             flag: int = 0, delay_level: int = 0, timeout: float | None = None) -> SendResult:
        """Send one message and wait for the broker's answer (Producer.send, blocking). The queue is
        picked round robin over every broker's write queues unless queue_id (and broker_name) name
        one. MQClientError for an error response (its code and remark), RemotingTimeoutError,
        ConnectFailedError, ConnectionClosedError."""
        return self.send_message(topic, Message(body, tags, keys, properties, flag, delay_level), queue_id=queue_id,
                                 broker_name=broker_name, timeout=timeout)

    def send_message(self, topic: str, message: Message, *, queue_id: int | None = None,
                     broker_name: str | None = None, timeout: float | None = None) -> SendResult:
        """send() for a Message."""
        cmd, mq, addr, uniq = self._prepare(topic, message, queue_id, broker_name)
        return send_result(self._send(addr, cmd, timeout), topic, mq, uniq, addr, self.send_code)

    def send_oneway(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | list[str] | None = None,
                    properties: Mapping[str, str] | None = None, queue_id: int | None = None,
                    broker_name: str | None = None, flag: int = 0, delay_level: int = 0) -> str:
        """Send one message with the oneway flag: returns once it is written to the socket (the
        broker sends no answer, so nothing says whether it was stored). The message's id (UNIQ_KEY)."""
        cmd, _mq, addr, uniq = self._prepare(topic, Message(body, tags, keys, properties, flag, delay_level),
                                             queue_id, broker_name)
        self._send(addr, cmd, None, oneway=True)
        return uniq

    def send_batch(self, topic: str, messages: Iterable[BatchItem], *, queue_id: int | None = None,
                   broker_name: str | None = None, timeout: float | None = None) -> SendResult:
        """Send messages as one batch (SEND_BATCH_MESSAGE), all to one queue with consecutive queue
        offsets: Producer.send_batch, blocking. Items are bodies, (body, user properties) pairs or
        Messages; SendResult.msg_id is the messages' ids comma-joined."""
        self._check_open()
        check_topic(topic)
        entries = batch_entries(messages)
        mq, addr = self._picker.pick(topic, self._route(topic), queue_id, broker_name)
        ids = self._ids().next_many(len(entries))
        cmd = RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, body=batch_body(entries, ids),
                              ext_fields=send_header(self.group, topic, mq.queue_id, BATCH_PROPERTIES, batch=True))
        return send_result(self._send(addr, cmd, timeout), topic, mq, ",".join(ids), addr, cmd.code)

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("started" if self.started else "new")
        return f"<SyncProducer {self.group} {state}, {len(self._connections)} connections>"
