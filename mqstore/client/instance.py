"""What a producer or a consumer shares with RocketMQ's MQClientInstance
(docs/rocketmq-remoting-spec.md §2.3, §2.4.4, §2.4.5, §2.5): one connection per address, topic
routes from the NameServers (cached, refreshed, looked up once however many callers wait), the
broker address table, the heartbeat to every known broker, the requests brokers send, and
UNREGISTER_CLIENT at close; with credentials, every request signed (mqstore.acl.signature); with
tls, the connections to brokers over TLS, and those to NameServers with namesrv_tls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from mqstore.remoting._remoting import RemotingCommand
from mqstore.acl.signature import SessionCredentials
from mqstore.client.errors import (ClientError, ClientStateError, ConnectFailedError, MQClientError, ProtocolError,
                                   RemotingConnectionError, RemotingTimeoutError)
from mqstore.client.message import UniqIdGenerator
from mqstore.client.protocol import (DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS, VERSION, RequestCode, ResponseCode,
                                     request_name)
from mqstore.client.remoting import RemotingConnection, TlsOption, parse_address, serialize_type, tls_context
from mqstore.client.route import TopicRoute, parse_route_data

__all__ = ["ClientInstance", "check_group", "check_positive", "client_tls", "derived_route", "new_instance_name",
           "no_namesrv_answered", "parse_namesrv", "publish_route", "response_int", "route_of", "wants_default_route"]

log = logging.getLogger("mqstore.client")

#: a route derived from TBW102's (the topic does not exist yet) is asked for again after this long
DERIVED_ROUTE_TTL_S = 1.0
_GROUP_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")
#: Validators.CHARACTER_MAX_LENGTH
GROUP_MAX_LENGTH = 255


def check_group(group: object, reserved: str) -> str:
    """A producer or consumer group name as RocketMQ's Validators.checkGroup accepts it (and not
    the client's reserved default group); ValueError naming the problem."""
    if not isinstance(group, str):
        raise ValueError(f"group must be a str, not {type(group).__name__}")
    if not group or group.isspace():
        raise ValueError("the specified group is blank")
    if not _GROUP_CHARS.fullmatch(group):
        raise ValueError(f"the specified group {group!r} contains illegal characters, allowing only "
                         "^[%|a-zA-Z0-9_-]+$")
    if len(group) > GROUP_MAX_LENGTH:
        raise ValueError(f"the specified group is longer than {GROUP_MAX_LENGTH} characters")
    if group == reserved:
        raise ValueError(f"the group can not be {reserved}, the client's default group; name your own")
    return group


def response_int(response: RemotingCommand, name: str, address: str, request: int) -> int:
    """An integer extFields value of a response; ProtocolError naming the field when it is
    missing or not a number."""
    value = response.ext_fields.get(name)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ProtocolError(f"the response from {address} to {request_name(request)} has "
                            f"{'no ' + name if value is None else f'{name}={value!r}, not a number'}") from None


def parse_namesrv(namesrv: str) -> list[str]:
    """'host:port;host:port' -> the addresses; ValueError naming a bad one or an empty list."""
    if not isinstance(namesrv, str):
        raise ValueError(f"namesrv must be a 'host:port;host:port' string, not {namesrv!r}")
    addrs = [a.strip() for a in namesrv.split(";") if a.strip()]
    if not addrs:
        raise ValueError("namesrv is empty: give the NameServer addresses as 'host:port;host:port'")
    for a in addrs:
        parse_address(a)
    return addrs


@dataclass
class _CachedRoute:
    route: TopicRoute
    fetched: float  # monotonic
    derived: bool  # from TBW102's route


def client_tls(tls: TlsOption, namesrv_tls: TlsOption) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """A client's tls and namesrv_tls arguments -> the contexts of its connections to brokers and
    to NameServers (None: plain TCP). namesrv_tls None means as tls; False, plain TCP to the
    NameServers (a plain NameServer with brokers that serve TLS)."""
    ctx = tls_context(tls, "tls")
    return ctx, ctx if namesrv_tls is None else tls_context(namesrv_tls, "namesrv_tls")


def check_positive(name: str, value: float) -> float:
    """A positive number of seconds; ValueError naming name otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def new_instance_name() -> str:
    """The instance name of a client id (clientIP@instanceName): pid and a clock reading."""
    return f"{os.getpid()}#{time.monotonic_ns()}"


# -- routes: what the asyncio ClientInstance and the SyncProducer decide alike --------------------
def route_of(response: RemotingCommand, addr: str) -> TopicRoute:
    """The route a GET_ROUTEINFO_BY_TOPIC response from the NameServer at addr carries;
    MQClientError for an answer that is not SUCCESS (TOPIC_NOT_EXIST for an unknown topic)."""
    if response.code != ResponseCode.SUCCESS:
        raise MQClientError(response.code, response.remark, address=addr, request=RequestCode.GET_ROUTEINFO_BY_TOPIC)
    return parse_route_data(response.body)


def no_namesrv_answered(topic: str, errors: list[str], namesrv: list[str]) -> ConnectFailedError:
    return ConnectFailedError(f"no NameServer answered the route of {topic}: " + "; ".join(errors), ";".join(namesrv))


def publish_route(route: TopicRoute, topic: str) -> TopicRoute:
    """route, when a producer can send to topic with it; MQClientError TOPIC_NOT_EXIST when it
    has no writable queue with a master (then the producer falls back to TBW102's route)."""
    if not route.publish_queues(topic):
        raise MQClientError(ResponseCode.TOPIC_NOT_EXIST, f"the route of {topic} has no writable queue with a master",
                            request=RequestCode.GET_ROUTEINFO_BY_TOPIC)
    return route


def wants_default_route(exc: MQClientError, topic: str, publish: bool) -> bool:
    """Whether a producer that got exc looking up topic's route asks for TBW102's instead."""
    return publish and exc.code == ResponseCode.TOPIC_NOT_EXIST and topic != DEFAULT_TOPIC


def derived_route(default: TopicRoute, topic: str, exc: MQClientError) -> TopicRoute:
    """The route a producer uses for a topic the NameServers do not know: TBW102's, at most 4
    queues per broker (the broker creates the topic on the first send, §3.2); exc (the lookup's
    error) when even that has no queue to send to."""
    route = default.with_queue_nums(DEFAULT_TOPIC_QUEUE_NUMS)
    if not route.publish_queues(topic):
        raise exc from None
    return route


K = TypeVar("K")
T = TypeVar("T")


async def _single_flight(tasks: dict[K, asyncio.Task[T]], key: K, start: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """The result of the task in flight for key, started by ``start()`` when none is: however many
    callers ask at the same time, the work is done once (a caller cancelled does not cancel it)."""
    task = tasks.get(key)
    if task is None:
        task = asyncio.get_running_loop().create_task(start())
        tasks[key] = task

        def done(t: asyncio.Task[T]) -> None:
            tasks.pop(key, None)
            if not t.cancelled():
                t.exception()  # retrieved here: a failure is raised to every waiter anyway
        task.add_done_callback(done)
    return await asyncio.shield(task)


class ClientInstance:
    """Connections, routes and heartbeats of one producer or consumer.

    ``heartbeat_body(client_id)`` gives the HEART_BEAT body; ``unregister_fields`` the
    UNREGISTER_CLIENT fields besides clientID; ``on_notify(group)`` is called for each
    NOTIFY_CONSUMER_IDS_CHANGED a broker sends; ``credentials`` sign every request on every
    connection (brokers and NameServers); ``tls`` and ``namesrv_tls`` as client_tls takes them."""

    def __init__(self, namesrv: str, *, serialize: str | int = "JSON", timeout: float = 3.0,
                 heartbeat_interval: float = 30.0, route_ttl: float = 30.0, version: int = VERSION,
                 heartbeat_body: Callable[[str], bytes], unregister_fields: dict[str, str],
                 on_notify: Callable[[str], None] | None = None,
                 credentials: SessionCredentials | None = None, tls: TlsOption = None,
                 namesrv_tls: TlsOption = None) -> None:
        self.namesrv = parse_namesrv(namesrv)
        self.credentials = credentials
        self.tls, self.namesrv_tls = client_tls(tls, namesrv_tls)
        self.serialize_type = serialize_type(serialize)
        self.timeout = check_positive("timeout", timeout)
        self.heartbeat_interval = check_positive("heartbeat_interval", heartbeat_interval)
        self.route_ttl = check_positive("route_ttl", route_ttl)
        self.version = int(version)
        self.heartbeat_body = heartbeat_body
        self.unregister_fields = dict(unregister_fields)
        self.on_notify = on_notify
        self.instance_name = new_instance_name()
        self.connections: dict[str, RemotingConnection] = {}
        self.brokers: dict[str, dict[int, str]] = {}  # broker name -> id -> address
        self.heartbeats = 0  # HEART_BEAT requests answered SUCCESS
        self._connecting: dict[str, asyncio.Task[RemotingConnection]] = {}
        self._routes: dict[str, _CachedRoute] = {}
        self._route_tasks: dict[tuple[str, bool], asyncio.Task[TopicRoute]] = {}
        self._heartbeated: set[str] = set()
        self._ns_index = 0
        self._local_ip: str | None = None
        self._client_id: str | None = None
        self._uniq: UniqIdGenerator | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self.started = False
        self.closed = False

    # -- identity ------------------------------------------------------------------------------
    @property
    def client_id(self) -> str:
        """clientIP@instanceName (ClientConfig.buildMQClientId), the IP being the local address of
        this client's first connection; fixed once read."""
        if self._client_id is None:
            self._client_id = f"{self._local_ip or '127.0.0.1'}@{self.instance_name}"
        return self._client_id

    def new_msg_id(self) -> str:
        uniq = self._uniq
        if uniq is None:
            uniq = self._uniq = UniqIdGenerator(self._local_ip)
        return uniq.next()

    def new_msg_ids(self, n: int) -> list[str]:
        uniq = self._uniq
        if uniq is None:
            uniq = self._uniq = UniqIdGenerator(self._local_ip)
        return uniq.next_many(n)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.closed:
            raise ClientStateError("this client is closed; make a new one")
        if not self.started:
            self.started = True
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def check_open(self, what: str) -> None:
        if self.closed:
            raise ClientStateError(f"{what} is closed")
        if not self.started:
            raise ClientStateError(f"{what} is not started: await start() first")

    async def close(self) -> None:
        """UNREGISTER_CLIENT to every broker heartbeated, then every connection closed."""
        if self.closed:
            return
        self.closed = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            try:
                await self._heartbeat_task
            except (asyncio.CancelledError, Exception):
                pass
        if self.started:
            fields = {"clientID": self.client_id, **self.unregister_fields}
            await asyncio.gather(*(self._unregister(addr, fields) for addr in sorted(self._heartbeated)))
        await asyncio.gather(*self._connecting.values(), return_exceptions=True)  # they see closed and close
        conns = list(self.connections.values())
        for conn in conns:
            conn.close("was closed by the client")
        for conn in conns:
            await conn.wait_closed()
        self.connections.clear()

    async def _unregister(self, addr: str, fields: dict[str, str]) -> None:
        conn = self.connections.get(addr)
        if conn is None or conn.closed:
            return
        try:
            await self.call(addr, RequestCode.UNREGISTER_CLIENT, fields)
        except ClientError as exc:
            log.warning("UNREGISTER_CLIENT to %s failed: %s", addr, exc)

    # -- connections ---------------------------------------------------------------------------
    async def connection(self, addr: str) -> RemotingConnection:
        """The open connection to addr, made once however many callers ask at the same time."""
        conn = self.connections.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self.closed:
            raise ClientStateError(f"this client is closed; no new connection to {addr}")
        return await _single_flight(self._connecting, addr, lambda: self._connect(addr))

    async def _connect(self, addr: str) -> RemotingConnection:
        tls = self.namesrv_tls if addr in self.namesrv else self.tls
        conn = await RemotingConnection.open(addr, connect_timeout=self.timeout, serialize=self.serialize_type,
                                             version=self.version, on_request=self._on_request,
                                             on_close=self._on_close, credentials=self.credentials, tls=tls)
        if self.closed:
            conn.close("was closed by the client")
            raise ClientStateError(f"this client was closed while it connected to {addr}")
        if self._local_ip is None and conn.local_address is not None:
            self._local_ip = conn.local_address[0]
        self.connections[addr] = conn
        return conn

    def _on_close(self, conn: RemotingConnection) -> None:
        if self.connections.get(conn.address) is conn:
            del self.connections[conn.address]
        self._heartbeated.discard(conn.address)  # a new connection is a new channel: heartbeat it again

    def _on_request(self, conn: RemotingConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        """Requests brokers send (§1.6, §2.4.11): NOTIFY_CONSUMER_IDS_CHANGED goes to on_notify;
        a request this client has no processor for gets REQUEST_CODE_NOT_SUPPORTED, unless oneway."""
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = cmd.ext_fields.get("consumerGroup", "")
            log.info("%s: consumer ids of group %s changed", conn.address, group)
            if self.on_notify is not None:
                self.on_notify(group)
            return None
        if cmd.is_oneway:
            return None
        return RemotingCommand(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                               remark=f" request type {cmd.code} not supported")

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float | None = None) -> RemotingCommand:
        conn = self.connections.get(addr)
        if conn is None or conn.closed:  # (the open connection is used without awaiting connection())
            conn = await self.connection(addr)
        return await conn.request(cmd, self.timeout if timeout is None else timeout)

    async def call(self, addr: str, code: int, fields: dict[str, str] | None = None, body: bytes = b"", *,
                   timeout: float | None = None, ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """A request whose response code must be one of ``ok``; MQClientError naming the code,
        the remark, the address and the request otherwise."""
        response = await self.invoke(addr, RemotingCommand(code, ext_fields=fields or {}, body=body), timeout)
        if response.code not in ok:
            raise MQClientError(response.code, response.remark, address=addr, request=code)
        return response

    # -- routes --------------------------------------------------------------------------------
    async def query_route(self, topic: str) -> TopicRoute:
        """GET_ROUTEINFO_BY_TOPIC from a NameServer (the next one when one cannot be reached);
        MQClientError for an answer that is not SUCCESS (TOPIC_NOT_EXIST for an unknown topic)."""
        errors: list[str] = []
        n = len(self.namesrv)
        for i in range(n):
            addr = self.namesrv[(self._ns_index + i) % n]
            try:
                response = await self.invoke(addr, RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                   ext_fields={"topic": topic}))
            except (RemotingConnectionError, RemotingTimeoutError) as exc:
                errors.append(str(exc))
                continue
            self._ns_index = (self._ns_index + i) % n
            return route_of(response, addr)
        raise no_namesrv_answered(topic, errors, self.namesrv)

    def cached_route(self, topic: str) -> TopicRoute | None:
        entry = self._routes.get(topic)
        return entry.route if entry is not None else None

    def forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    async def route(self, topic: str, *, publish: bool = False) -> TopicRoute:
        """The topic's route, from the cache while younger than route_ttl (a route derived from
        TBW102's, for a topic that does not exist yet, for 1 s). With ``publish``, a topic the
        NameServers do not know (or whose route has no writable queue) gets TBW102's route with
        at most 4 queues per broker (the broker creates the topic on the first send, §3.2)."""
        entry = self._routes.get(topic)
        now = time.monotonic()
        if entry is not None and now - entry.fetched < (DERIVED_ROUTE_TTL_S if entry.derived else self.route_ttl):
            return entry.route
        return await _single_flight(self._route_tasks, (topic, publish),
                                    lambda: self._update_route(topic, publish, entry))

    async def _update_route(self, topic: str, publish: bool, old: _CachedRoute | None) -> TopicRoute:
        derived = False
        try:
            try:
                route = await self.query_route(topic)
                if publish:
                    publish_route(route, topic)
            except MQClientError as exc:
                if not wants_default_route(exc, topic, publish):
                    raise
                try:
                    default = await self.query_route(DEFAULT_TOPIC)
                except MQClientError:
                    raise exc from None
                route = derived_route(default, topic, exc)
                derived = True
        except (RemotingConnectionError, RemotingTimeoutError) as exc:
            if old is None:
                raise
            log.warning("route of %s not refreshed, the cached one is kept: %s", topic, exc)
            old.fetched = time.monotonic() - self.route_ttl + DERIVED_ROUTE_TTL_S  # try again soon
            return old.route
        self._routes[topic] = _CachedRoute(route, time.monotonic(), derived)
        fresh = []
        for b in route.broker_datas:
            self.brokers[b.broker_name] = dict(b.addrs)  # the latest route's addresses of that broker
            fresh += [a for a in b.addrs.values() if a not in self._heartbeated]
        if fresh and self.started and not self.closed:
            await asyncio.gather(*(self._heartbeat_one(a) for a in sorted(set(fresh))))
        return route

    def broker_address(self, broker_name: str, broker_id: int | None = 0) -> str | None:
        """The address of broker_name's broker_id (None: its lowest id present)."""
        table = self.brokers.get(broker_name) or {}
        if broker_id is None:
            return table[min(table)] if table else None
        return table.get(broker_id)

    # -- heartbeat -----------------------------------------------------------------------------
    async def heartbeat(self) -> None:
        """HEART_BEAT to every known broker now; the first failure is raised after all were tried."""
        addrs = sorted({a for table in self.brokers.values() for a in table.values()})
        results = await asyncio.gather(*(self._heartbeat_one(a, raise_errors=True) for a in addrs),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _heartbeat_one(self, addr: str, *, raise_errors: bool = False) -> None:
        try:
            await self.call(addr, RequestCode.HEART_BEAT, {}, self.heartbeat_body(self.client_id))
        except ClientError as exc:
            log.warning("HEART_BEAT to %s failed: %s", addr, exc)
            if raise_errors:
                raise
            return
        self.heartbeats += 1
        self._heartbeated.add(addr)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.heartbeat()
            except ClientError:
                pass  # logged per broker; the next round tries again
