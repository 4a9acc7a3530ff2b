"""A broker front process: RocketMQ clients' connections on the broker's port
(docs/rocketmq-remoting-spec.md §1, §2.4, §3).

Several front processes accept on one port (the broker's listening socket, inherited: whichever
is free takes the next connection, and no other process can bind the port), each attached to the store through its control block, so sends from many connections go
through the store's shared put lock in parallel processes and no one interpreter caps the
broker. A front serves sends (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE), pulls (with
long polling: a pull that finds nothing is held until the dispatcher publishes a message of its
queue, or its suspend time passes) and the store's reads (offsets by queue and time, a message by
id, messages by key) itself; the rest of a client's requests (heartbeats, offsets, the consumer
list, send-back, locks, admin) go to the broker's controller over the link (``link``), which
holds that state once for every front.

Run by the broker's supervisor as::

    python -c "...mqstore.broker.front.main..." STORE_DIR INDEX PORT LINK_ADDRESS LISTEN_FD CONNECTIONS_FD

It prints ``READY`` once it listens, and exits when its parent dies or the link closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from mqstore.log._codec import string_to_properties
from mqstore.log._message import Message, MessageBatch
from mqstore.broker._front import parse_send, send_ok_response
from mqstore.remoting._remoting import ROCKETMQ, FrameError, FrameReader, RemotingCommand
from mqstore.acl.holder import AclHolder
from mqstore.acl.validator import SendVerdicts
from mqstore.broker import link
from mqstore.broker.limits import BrokerConnectionCounter, LogLimiter, housekeeping, next_frame_started
from mqstore.broker.codes import RequestCode, ResponseCode, put_response, send_fields, topic_not_exist
from mqstore.broker.requests import (BadBody, BadField, Guard, Handler, check_header, field, handlers_for, int_field,
                                     not_supported, response, route)
from mqstore.broker.table import Access, RequestSpec, Server
from mqstore.broker.topics import NOT_ALLOWED_SEND, PERM_READ, PERM_WRITE, topic_problem
from mqstore.protocol import VERSION
from mqstore.status import GetMessageStatus, PutMessageStatus
from mqstore.store import MessageStore, StoreBase
from mqstore.tls import ENFORCING, accept_loop, config_server_context

__all__ = ["Front", "main"]

log = logging.getLogger("mqstore.broker")

#: PullSysFlag bits (§2.4.2)
FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x1, 0x2, 0x4
_TRUE = frozenset({"true", "1"})
#: how many topic names a front remembers as checked (a send's name is checked once, not per send)
SENDABLE_CACHE = 100_000
#: MessageSysFlag.COMPRESSED_FLAG: the body is zlib-compressed
SYSFLAG_COMPRESSED = 0x1
#: PULL answer code by GetMessageStatus (§2.4.2): FOUND is SUCCESS, the three "moved" ones
#: PULL_OFFSET_MOVED unless the request offset is 0 on an empty queue
_PULL_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.NO_MESSAGE_IN_QUEUE: ResponseCode.PULL_OFFSET_MOVED,
}


def _not_a_namesrv(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    return not_supported(cmd, ": this is a broker, not a NameServer")


class Connection(asyncio.Protocol):
    """One client connection: frames in, responses out, in the request's serialization.

    Limits (docs/security.md): reading stops while the answers the client has not taken pass
    ``write_buffer_high_water_mark`` (until they fall under the low mark) or while
    ``max_requests_in_flight_per_connection`` of its requests wait for the controller, a held pull
    or a put; its requests then wait in the socket, and the front's memory does not grow. A
    connection silent for ``server_channel_max_idle_time_seconds``, or whose frame does not
    arrive whole within FRAME_TIMEOUT_S (or the idle time when shorter), is closed by the front's
    housekeeping (``mqstore.broker.limits``). A request followed by a half-close (SHUT_WR) is
    answered before the connection closes.
    """

    def __init__(self, front: Front) -> None:
        self.front = front
        self.frames = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.id = ""
        self.peer: tuple[str, int] = ("0.0.0.0", 0)
        self.peer_addr = "0.0.0.0:0"  # ip:port, as the link carries it
        self.closed = False
        self.counted = False  # admitted by the broker's connection counter
        self.in_flight = 0
        self._paused: set[str] = set()  # why reading stopped: "write", "in_flight"
        self._eof = False
        self.last_active = time.monotonic()
        self.frame_started = 0.0  # when the bytes of a frame not yet whole began (0: none)
        self.refused = 0  # requests the ACL refused (logged once, counted at the close)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (asyncio's own, or uvloop's, which does not subclass asyncio.Transport)
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername") or ("0.0.0.0", 0)
        self.peer = (str(peer[0]), int(peer[1]))
        self.peer_addr = f"{self.peer[0]}:{self.peer[1]}"
        refused = self.front.admit(self)
        if refused is not None:
            self.closed = True
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cfg = self.front.cfg
        transport.set_write_buffer_limits(high=cfg.write_buffer_high_water_mark,
                                          low=min(cfg.write_buffer_low_water_mark, cfg.write_buffer_high_water_mark))
        self.id = self.front.register(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_active = time.monotonic()
        self.frames.feed(data)
        self._serve_frames()

    def _serve_frames(self) -> None:
        took = False
        try:
            while not self._paused and not self.closed and (cmd := self.frames.next()) is not None:
                took = True
                self.front.dispatch(self, cmd)
        except FrameError as exc:
            self.front.log_refusal("closing the connection from %s:%d: %s", *self.peer, exc)
            self.close()
            return
        self.frame_started = next_frame_started(self.frame_started, self.frames.buffered, took, time.monotonic())
        if self._eof and not self.in_flight and not self._paused:
            self.close()  # half-closed and every request answered: close() sends what is buffered first

    def eof_received(self) -> bool:
        """The client shut its side (SHUT_WR): answer what it sent, then close (TLS has no
        half-close: its transport closes whatever this returns, so it is not asked to stay)."""
        self._eof = True
        if not self.in_flight and not self._paused:
            self._serve_frames()
            self.close()
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.refused > 1:
            self.front.log_refusal("ACL: the connection from %s:%d closed after %d refused requests", *self.peer,
                                   self.refused)
        self.front.unregister(self)

    # -- flow control ----------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """Reading stopped (the client does not take its answers, or too many requests wait)."""
        return bool(self._paused)

    @property
    def busy(self) -> bool:
        """Requests of it wait for the controller, a held pull or a put: not idle."""
        return self.in_flight > 0

    @property
    def buffered(self) -> int:
        """Bytes of its frame not yet whole."""
        return self.frames.buffered

    def _pause(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            try:
                self.transport.pause_reading()
            except RuntimeError:  # already closing
                pass
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if self._paused or self.closed or self.transport is None:
            return
        try:
            self.transport.resume_reading()
        except RuntimeError:
            return
        self._serve_frames()  # frames that arrived before the pause

    def pause_writing(self) -> None:
        self._pause("write")

    def resume_writing(self) -> None:
        self._resume("write")

    def begin(self) -> None:
        """A request of this connection goes on after dispatch (the controller, a held pull, a put)."""
        self.in_flight += 1
        if self.in_flight >= self.front.cfg.max_requests_in_flight_per_connection:
            self._pause("in_flight")

    def end(self) -> None:
        """A request counted by begin() is answered (or dropped)."""
        if self.in_flight > 0:
            self.in_flight -= 1
        if self.in_flight < self.front.cfg.max_requests_in_flight_per_connection:
            self._resume("in_flight")
        if self._eof and not self.in_flight and not self._paused:
            self.close()

    # -- answers ---------------------------------------------------------------------------------
    def write(self, cmd: RemotingCommand) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(cmd.encode())
            self.last_active = time.monotonic()

    def write_bytes(self, frame: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(frame)

    def answer(self, request: RemotingCommand, code: int, remark: str | None = None, *,
               ext_fields: dict[str, str] | None = None, body: bytes = b"") -> None:
        """Write the response to `request`, unless it is oneway: RocketMQ never answers those, not
        even a refusal (NettyRemotingAbstract.processRequestCommand)."""
        if not request.is_oneway:
            self.write(response(request, code, remark, ext_fields=ext_fields, body=body))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping answers not yet sent (the housekeeping's close)."""
        if self.transport is not None:
            self.transport.abort()


@dataclass
class Held:
    """A pull held for long polling (PullRequestHoldService's PullRequest)."""

    conn: Connection
    cmd: RemotingCommand
    offset: int
    deadline: float  # monotonic


class Front:
    """One front process's server: its store attachment, connections, held pulls and the link."""

    def __init__(self, store: StoreBase, port: int, link_address: str, listen_fd: int,
                 counter: BrokerConnectionCounter) -> None:
        self.store = store
        self.listen_fd = listen_fd
        self.cfg = store.config
        self.port = port
        self.host_ip = self.cfg.broker_ip1
        self.store_host = (self.host_ip, port)
        self.link = link.LinkClient(link_address, self._pushed, self._link_lost)
        self.topics: dict[str, dict[str, Any]] = {}
        self._sendable: set[str] = set()  # topic names that passed topic_problem
        #: topic -> the sends that came while its creation was asked of the controller (they go after it)
        self._creating: dict[str, list[tuple[Connection, RemotingCommand]]] = {}
        #: topic -> (its config, its queue count) for the send fast path, while that config is current
        self._writable: dict[str, tuple[dict[str, Any], int]] = {}
        self.cluster = self.cfg.broker_cluster_name
        self.groups: dict[str, dict[str, Any]] = {}
        self.conns: dict[str, Connection] = {}
        self._ids = 0
        self.counter = counter  # max_connections and max_connections_per_ip, over every front of the broker
        self.refusals = LogLimiter(log)
        self.handlers = self._handlers()
        #: the ACL (acl_enable): the plain_acl.yml in force, reloaded when it changes
        self.acl = AclHolder(self.cfg.acl_path(store.root)) if self.cfg.acl_enable else None
        self.guard: Guard | None = self._acl_guard if self.acl is not None else None
        self._verdicts = SendVerdicts()  # the sends' permission verdicts, kept per ACL version
        self.held: dict[tuple[str, int], list[Held]] = defaultdict(list)
        self._held_event = threading.Event()
        self._stop = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.Server | None = None
        self._accepting: asyncio.Task[None] | None = None  # permissive TLS: the accept loop
        self.stopped: asyncio.Event | None = None
        self.sync_flush = self.cfg.is_sync_flush
        self.executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="mqstore-put") if self.sync_flush else None
        self.serialize_type = ROCKETMQ if self.cfg.serialize_type == "ROCKETMQ" else 0
        self.pid = os.getpid()

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        await self.link.connect()
        hello = await self.link.request(RemotingCommand(link.HELLO, ext_fields={"pid": str(self.pid)}))
        table = json.loads(hello.body).get("topicConfigTable", {})
        self.topics = {str(k): v for k, v in table.items()}
        sock = socket.socket(fileno=self.listen_fd)  # the broker's listening socket, inherited
        sock.setblocking(False)
        # TLS (tls_server_mode): none, every connection (enforcing), or each by its first byte
        ctx = config_server_context(self.cfg)
        mode = self.cfg.tls_server_mode
        if ctx is None or mode == ENFORCING:
            self.server = await self.loop.create_server(lambda: Connection(self), sock=sock, ssl=ctx)
        else:
            self._accepting = self.loop.create_task(accept_loop(
                sock, lambda: Connection(self), mode, ctx, max_pending=self.cfg.max_connections,
                on_refused=lambda why: self.log_refusal("refusing a connection from %s", why)))
        threading.Thread(target=self._watch_dispatch, name="mqstore-hold", daemon=True).start()
        self.loop.create_task(self._expire_held())
        self.loop.create_task(housekeeping(self.conns.values, self.cfg.server_channel_max_idle_time_seconds,
                                           self.refusals, self._stop.is_set))

    def stop(self) -> None:
        self._stop.set()
        self._held_event.set()
        if self.server is not None:
            self.server.close()
        if self._accepting is not None:
            self._accepting.cancel()
        for conn in list(self.conns.values()):
            conn.close()
        self.link.close()
        if self.stopped is not None:
            self.stopped.set()

    def _link_lost(self) -> None:
        if not self._stop.is_set():
            log.error("front %d: the controller's link closed; stopping", self.pid)
            self.stop()

    # -- connections ---------------------------------------------------------------------------
    def admit(self, conn: Connection) -> str | None:
        """Count a new connection against max_connections and max_connections_per_ip; why not."""
        refused = self.counter.admit(conn.peer[0])
        if refused is None:
            conn.counted = True
        else:
            self.log_refusal("refusing a connection from %s:%d: %s", *conn.peer, refused)
        return refused

    def log_refusal(self, msg: str, *args: object) -> None:
        """A refused connection or frame, logged within the front's log budget (LogLimiter)."""
        self.refusals.warning(msg, *args)

    def register(self, conn: Connection) -> str:
        self._ids += 1
        cid = f"{self.pid}:{self._ids}"
        self.conns[cid] = conn
        return cid

    def unregister(self, conn: Connection) -> None:
        if conn.counted:
            conn.counted = False
            self.counter.release(conn.peer[0])
        if self.conns.pop(conn.id, None) is not None and not self._stop.is_set():
            try:
                self.link.send(RemotingCommand(link.CLOSED, ext_fields={"conn": conn.id}), oneway=True)
            except ConnectionError:
                pass

    def _pushed(self, cmd: RemotingCommand) -> None:
        """What the controller tells this front: a topic changed, consumers to notify."""
        if cmd.code == link.TOPIC_CHANGED:
            topic = cmd.ext_fields.get("topic", "")
            if cmd.body:
                self.topics[topic] = json.loads(cmd.body)
            else:
                self.topics.pop(topic, None)
        elif cmd.code == link.NOTIFY:
            group = cmd.ext_fields.get("group", "")
            # oneway, as Broker2Client.notifyConsumerIdsChanged sends it (invokeOneway): no client answers it
            notice = RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, language="JAVA", version=VERSION,
                                     flag=2, ext_fields={"consumerGroup": group}, serialize_type=self.serialize_type)
            for cid in cmd.body.decode().split(","):
                conn = self.conns.get(cid)
                if conn is not None:
                    notice.opaque = random.getrandbits(31)
                    conn.write(notice)

    # -- requests ------------------------------------------------------------------------------
    def _handlers(self) -> dict[int, Handler]:
        """The front's column of the request table: what it serves (each code by the method its
        row names), what it forwards to the controller, what it refuses (a NameServer's
        requests); the link's own codes are not here, so a client's is refused."""
        return handlers_for(self, Server.FRONT, passed={Server.CONTROLLER: self._forward,
                                                        Server.NAMESRV: _not_a_namesrv})

    def _acl_guard(self, spec: RequestSpec, cmd: RemotingCommand, conn: Connection) -> str | None:
        """The request table's ACL column (docs/security.md): a client's request is checked by its
        AccessKey's signature and the permissions its code needs (mqstore.acl.validator.check);
        why it is refused, or None."""
        assert self.acl is not None
        refused = self._verdicts.check(self.acl.current(), cmd.code, cmd.ext_fields, cmd.body, conn.peer[0],
                                       admin=spec.access is not Access.CLIENT)
        if refused is not None:
            conn.refused += 1
            if conn.refused == 1:  # once per connection, with the count when it closes
                self.log_refusal("ACL: refusing request %d from %s:%d: %s", cmd.code, *conn.peer, refused)
        return refused

    def dispatch(self, conn: Connection, cmd: RemotingCommand) -> None:
        """Serve one frame of a client connection through the request table (a response frame
        is dropped: clients answer only GET_CONSUMER_RUNNING_INFO, which the broker does not ask)."""
        answer = route(cmd, self.handlers, conn, guard=self.guard, errors=self.refusals)
        if answer is not None and not cmd.is_oneway:
            conn.write(answer)

    def _pull(self, conn: Connection, cmd: RemotingCommand) -> None:
        self.pull(conn, cmd, allow_suspend=True)

    def _read(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return self.read(cmd)

    def _forward(self, conn: Connection, cmd: RemotingCommand) -> None:
        """A request the controller serves: sent over the link with the connection's id; its
        response goes back with the client's opaque."""
        fields = dict(cmd.ext_fields)
        fields[link.CONN] = conn.id
        fields[link.PEER] = conn.peer_addr
        fwd = RemotingCommand(cmd.code, language=cmd.language, version=cmd.version, flag=cmd.flag & ~2,
                              remark=cmd.remark, ext_fields=fields, body=cmd.body)
        try:
            fut = self.link.send(fwd)
        except ConnectionError as exc:
            conn.answer(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
            return
        assert fut is not None
        conn.begin()

        def done(f: asyncio.Future[RemotingCommand]) -> None:
            try:
                answer(f)
            finally:  # after the answer: a half-closed connection closes once its last one is written
                conn.end()

        def answer(f: asyncio.Future[RemotingCommand]) -> None:
            if cmd.is_oneway:  # (a Java client's oneway UPDATE_CONSUMER_OFFSET, ...): no answer
                return
            if f.cancelled() or f.exception() is not None:
                conn.answer(cmd, ResponseCode.SYSTEM_ERROR, f"the broker's controller did not answer: "
                                                            f"{f.exception() if not f.cancelled() else 'cancelled'}")
                return
            got = f.result()
            conn.write(RemotingCommand(got.code, language="JAVA", version=VERSION, opaque=cmd.opaque, flag=1,
                                       remark=got.remark, ext_fields=got.ext_fields, body=got.body,
                                       serialize_type=cmd.serialize_type))
        fut.add_done_callback(done)

    # -- send (SendMessageProcessor) -------------------------------------------------------------
    def send(self, conn: Connection, cmd: RemotingCommand) -> None:
        if self.executor is None and self._send_fast(conn, cmd):
            return
        f = send_fields(cmd.code, cmd.ext_fields)
        check_header(RequestCode.SEND_MESSAGE, f)
        topic = field(f, "topic")
        field(f, "producerGroup")
        if topic not in self._sendable:
            problem = topic_problem(topic)
            if problem is not None:
                code = ResponseCode.NO_PERMISSION if topic in NOT_ALLOWED_SEND else ResponseCode.SYSTEM_ERROR
                conn.answer(cmd, code, problem)
                return
            if len(self._sendable) < SENDABLE_CACHE:
                self._sendable.add(topic)
        tc = self.topics.get(topic)
        if tc is None or topic in self._creating:
            self._create_then_send(conn, cmd, f, topic)
            return
        self._send_to(conn, cmd, f, topic, tc)

    def _send_fast(self, conn: Connection, cmd: RemotingCommand) -> bool:
        """The common send, served without the general path's checks: a single message whose
        header ``parse_send`` takes, to a known writable topic already checked, a queue it has
        (an ASYNC_FLUSH put, answered at once). False when it is not one: the general path then
        serves or refuses it, naming why."""
        parsed = parse_send(cmd.code, cmd.ext_fields)
        if parsed is None:
            return False
        topic, queue_id, sys_flag, born, flag, reconsume, properties = parsed
        if self._creating and topic in self._creating:
            return False  # after the send whose creation is on its way (the general path queues it)
        tc = self.topics.get(topic)
        writable = self._writable.get(topic)
        if writable is None or writable[0] is not tc:
            if tc is None or topic not in self._sendable or not tc.get("perm", 0) & PERM_WRITE:
                return False
            writable = self._writable[topic] = (tc, max(tc.get("writeQueueNums", 0), tc.get("readQueueNums", 0)))
        if queue_id >= writable[1]:
            return False
        props, wait = self._properties(properties)
        result = self.store.put_message(Message(topic, cmd.body, queue_id=queue_id, flag=flag, properties=props,
                                                sys_flag=sys_flag, born_timestamp=born, born_host=conn.peer,
                                                reconsume_times=reconsume, wait_store_msg_ok=None if wait else False))
        if result.status is PutMessageStatus.PUT_OK:
            if not cmd.is_oneway:
                conn.write_bytes(send_ok_response(cmd, ResponseCode.SUCCESS, result.msg_id or "", queue_id,
                                                  result.queue_offset))
        else:
            self._answer_put(conn, cmd, result, queue_id)
        return True

    def _properties(self, text: str | None) -> tuple[dict[str, str], bool]:
        """A send's properties as stored (its WAIT taken out, the broker's CLUSTER put in), and
        whether it waits for the flush (WAIT absent or anything but "false")."""
        props = string_to_properties(text) if text else {}
        wait = props.pop("WAIT", "true").lower() != "false"
        props["CLUSTER"] = self.cluster
        return props, wait

    def _create_then_send(self, conn: Connection, cmd: RemotingCommand, f: dict[str, str], topic: str) -> None:
        ask = RemotingCommand(link.TOPIC_FOR_SEND, ext_fields={
            "topic": topic, "defaultTopic": f.get("defaultTopic", "TBW102"),
            "defaultTopicQueueNums": str(int_field(f, "defaultTopicQueueNums", 4)),
            "sysFlag": str(int_field(f, "sysFlag", 0)), link.PEER: conn.peer_addr, link.CONN: conn.id})

        if topic in self._creating:  # its creation is on its way: this send goes after the one that asked
            self._creating[topic].append((conn, cmd))
            conn.begin()  # in flight: a client pipelining sends to a new topic stops being read
            return
        self._creating[topic] = []

        def then(got: RemotingCommand) -> None:
            tc = json.loads(got.body)
            self.topics[topic] = tc
            self._send_to(conn, cmd, f, topic, tc)

        def after() -> None:  # the sends that came meanwhile, in their order
            for waiting_conn, waiting_cmd in self._creating.pop(topic, []):
                try:
                    if not waiting_conn.closed:
                        self.dispatch(waiting_conn, waiting_cmd)
                finally:  # after: a half-closed connection would close before its send was served
                    waiting_conn.end()
        self._ask(conn, cmd, ask, then, after=after)

    def _ask(self, conn: Connection, cmd: RemotingCommand, ask: RemotingCommand,
             then: Callable[[RemotingCommand], None], *, after: Callable[[], None] | None = None) -> None:
        """Ask the controller, then go on serving `cmd` with its answer (`then`); a refusal is
        the client's answer, as is a controller that does not answer or a bad field met after."""
        try:
            fut = self.link.send(ask)
        except ConnectionError as exc:
            conn.answer(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
            if after is not None:
                after()
            return
        assert fut is not None
        conn.begin()

        def done(fu: asyncio.Future[RemotingCommand]) -> None:
            try:
                answer(fu)
            finally:  # after `then`: a pull it holds again is counted before reading resumes
                conn.end()
                if after is not None:
                    after()

        def answer(fu: asyncio.Future[RemotingCommand]) -> None:
            if fu.cancelled() or fu.exception() is not None:
                conn.answer(cmd, ResponseCode.SYSTEM_ERROR, "the broker's controller did not answer")
                return
            got = fu.result()
            if got.code != ResponseCode.SUCCESS:
                conn.answer(cmd, got.code, got.remark)
                return
            try:
                then(got)
            except BadField as exc:
                conn.answer(cmd, exc.code, str(exc))
            except Exception as exc:  # as dispatch does: the request is answered, the connection kept
                self.refusals.exception("request %d from %s:%d failed", cmd.code, *conn.peer)
                conn.answer(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        fut.add_done_callback(done)

    def _send_to(self, conn: Connection, cmd: RemotingCommand, f: dict[str, str], topic: str,
                 tc: dict[str, Any]) -> None:
        if not tc.get("perm", 0) & PERM_WRITE:
            conn.answer(cmd, ResponseCode.NO_PERMISSION,
                                f"the topic[{topic}] sending message is forbidden")
            return
        queue_id = int_field(f, "queueId")
        queues = max(tc.get("writeQueueNums", 0), tc.get("readQueueNums", 0))
        if queue_id >= queues:
            conn.answer(cmd, ResponseCode.SYSTEM_ERROR,
                                f"request queueId[{queue_id}] is illegal, {topic} Producer: {conn.peer[0]}")
            return
        if queue_id < 0:
            queue_id = random.randrange(max(1, tc.get("writeQueueNums", 1)))
        props, wait = self._properties(f.get("properties"))
        sys_flag = int_field(f, "sysFlag", 0)
        born = int_field(f, "bornTimestamp", 0)
        reconsume = int_field(f, "reconsumeTimes", 0)
        # batch: Java parses the flag with Boolean.parseBoolean, so the C++ client's "1" would be a
        # single message holding the encoded batch; here "1" is a batch too (the client meant one)
        is_batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE or f.get("batch", "false").lower() in _TRUE
        item: Message | MessageBatch
        if is_batch:
            body = cmd.body
            if sys_flag & SYSFLAG_COMPRESSED:
                # the C++ client zlib-compresses any body of 4 KiB or more, a batch's too: the
                # messages are in the inflated body (each stored uncompressed)
                body = self._inflate(body)
                sys_flag &= ~SYSFLAG_COMPRESSED
            item = MessageBatch(topic, body, queue_id=queue_id, properties=props, sys_flag=sys_flag,
                                born_timestamp=born, born_host=conn.peer, reconsume_times=reconsume)
        else:
            item = Message(topic, cmd.body, queue_id=queue_id, flag=int_field(f, "flag", 0), properties=props,
                           sys_flag=sys_flag, born_timestamp=born, born_host=conn.peer, reconsume_times=reconsume,
                           wait_store_msg_ok=None if wait else False)
        put: Callable[[Any], Any] = self.store.put_messages if is_batch else self.store.put_message
        if self.executor is None or not wait:
            self._answer_put(conn, cmd, put(item), queue_id)
            return
        assert self.loop is not None
        fut = self.loop.run_in_executor(self.executor, put, item)
        conn.begin()

        def done(fu: asyncio.Future[Any]) -> None:
            try:
                if fu.exception() is None:
                    self._answer_put(conn, cmd, fu.result(), queue_id)
                else:
                    conn.answer(cmd, ResponseCode.SYSTEM_ERROR, str(fu.exception()))
            finally:  # after the answer (see the forwarded requests' done)
                conn.end()
        fut.add_done_callback(done)

    def _inflate(self, body: bytes) -> bytes:
        """A compressed batch body, inflated; at most max_message_size x 32 bytes (a batch of
        big messages), BadBody past that or when it is not zlib data."""
        limit = self.cfg.max_message_size * 32
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(body, limit)
        except zlib.error as exc:
            raise BadBody(f"the batch body is flagged compressed (sysFlag bit 0) but does not inflate: {exc}") from None
        if inflater.unconsumed_tail or not inflater.eof:
            raise BadBody(f"the compressed batch body inflates past {limit} bytes or is cut short")
        return out

    def _answer_put(self, conn: Connection, cmd: RemotingCommand, result: Any, queue_id: int) -> None:
        status = result.status
        code, remark = put_response(status, result.detail, max_message_size=self.cfg.max_message_size)
        if status in (PutMessageStatus.PUT_OK, PutMessageStatus.FLUSH_DISK_TIMEOUT,
                      PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE):
            fields = {"msgId": result.msg_id or "", "queueId": str(queue_id),
                      "queueOffset": str(result.queue_offset), "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        else:
            fields = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        conn.answer(cmd, code, remark, ext_fields=fields)

    # -- pull (PullMessageProcessor) -------------------------------------------------------------
    def pull(self, conn: Connection, cmd: RemotingCommand, *, allow_suspend: bool) -> None:
        f = cmd.ext_fields
        group = field(f, "consumerGroup")
        topic = field(f, "topic")
        queue_id = int_field(f, "queueId")
        offset = int_field(f, "queueOffset")
        max_nums = int_field(f, "maxMsgNums")
        sys_flag = int_field(f, "sysFlag")
        suspend_ms = int_field(f, "suspendTimeoutMillis", 0)
        gc = self.groups.get(group)
        if gc is None:
            self._ask_group_then(conn, cmd, group, allow_suspend)
            return
        if not gc.get("consumeEnable", True):
            conn.answer(cmd, ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
            return
        tc = self.topics.get(topic)
        if tc is None:
            conn.answer(cmd, ResponseCode.TOPIC_NOT_EXIST,
                                topic_not_exist(topic))
            return
        if not tc.get("perm", 0) & PERM_READ:
            conn.answer(cmd, ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
            return
        if not 0 <= queue_id < tc.get("readQueueNums", 0):
            conn.answer(cmd, ResponseCode.SYSTEM_ERROR,
                                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                f"[{tc.get('readQueueNums', 0)}] consumer:[{conn.peer[0]}]")
            return
        if max_nums <= 0:
            raise BadField(f"the custom field <maxMsgNums> must be positive: {max_nums}")
        if sys_flag & FLAG_SUBSCRIPTION:
            expression_type = f.get("expressionType")
            if expression_type not in (None, "", "TAG"):  # SQL92 and the rest: enablePropertyFilter is off
                conn.answer(cmd, ResponseCode.SYSTEM_ERROR,
                            f"The broker does not support consumer to filter message by {expression_type}")
                return
            expression = f.get("subscription") or "*"
            self._pull_with(conn, cmd, group, gc, topic, queue_id, offset, max_nums, sys_flag, suspend_ms,
                            expression, allow_suspend)
            return
        # no SUBSCRIPTION flag: the group's registered subscription (from its heartbeats)
        self._ask(conn, cmd, RemotingCommand(link.SUBSCRIPTION, ext_fields={"group": group, "topic": topic}),
                  lambda got: self._pull_with(conn, cmd, group, gc, topic, queue_id, offset, max_nums, sys_flag,
                                              suspend_ms, got.ext_fields.get("subString") or "*", allow_suspend))

    def _ask_group_then(self, conn: Connection, cmd: RemotingCommand, group: str, allow_suspend: bool) -> None:
        def then(got: RemotingCommand) -> None:
            self.groups[group] = json.loads(got.body)
            self.pull(conn, cmd, allow_suspend=allow_suspend)
        self._ask(conn, cmd, RemotingCommand(link.GROUP, ext_fields={"group": group}), then)

    def _pull_with(self, conn: Connection, cmd: RemotingCommand, group: str, gc: dict[str, Any], topic: str,
                   queue_id: int, offset: int, max_nums: int, sys_flag: int, suspend_ms: int, expression: str,
                   allow_suspend: bool) -> None:
        result = self.store.get_message(group, topic, queue_id, offset, max_nums, expression)
        status = result.status
        code = _PULL_CODES.get(status, ResponseCode.SYSTEM_ERROR)
        next_offset = result.next_begin_offset
        if status in (GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE) and offset == 0:
            code = ResponseCode.PULL_NOT_FOUND
        suggest = 0
        if self.cfg.slave_read_enable and result.suggest_pulling_from_slave:
            suggest = int(gc.get("whichBrokerWhenConsumeSlowly", 1))
        elif self.cfg.slave_read_enable:
            suggest = int(gc.get("brokerId", 0))
        if allow_suspend and sys_flag & FLAG_COMMIT_OFFSET and self.cfg.broker_id == 0:
            commit = int_field(cmd.ext_fields, "commitOffset", -1)
            if commit >= 0:
                try:
                    self.link.send(RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields={
                        "consumerGroup": group, "topic": topic, "queueId": str(queue_id),
                        "commitOffset": str(commit), link.CONN: conn.id}), oneway=True)
                except ConnectionError:
                    pass
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & FLAG_SUSPEND:
            hold_ms = suspend_ms if self.cfg.long_polling_enable else self.cfg.short_polling_time_mills
            hold_ms = min(max(hold_ms, 0), self.cfg.broker_suspend_max_time_millis)
            if hold_ms > 0:
                self.held[(topic, queue_id)].append(Held(conn, cmd, offset, time.monotonic() + hold_ms / 1000))
                conn.begin()
                self._held_event.set()
                return
        fields = {"suggestWhichBrokerId": str(suggest), "nextBeginOffset": str(next_offset),
                  "minOffset": str(result.min_offset), "maxOffset": str(result.max_offset)}
        remark = status.name
        body = result.records() if code == ResponseCode.SUCCESS else b""
        if code == ResponseCode.SYSTEM_ERROR:
            remark = f"{status.name}: {getattr(result, 'detail', '')}"
        conn.answer(cmd, code, remark, ext_fields=fields, body=body)

    # -- long polling (PullRequestHoldService) ----------------------------------------------------
    def _watch_dispatch(self) -> None:
        """Wake held pulls when the dispatcher publishes (it wakes the 'dispatched' channel after
        each applied batch with long polling on, or once caught up with it off)."""
        ctl = self.store.ctl
        while not self._stop.is_set():
            if not self.held:
                self._held_event.wait(1.0)
                self._held_event.clear()
                continue
            # check once after reading the sequence: a message dispatched between a pull's empty
            # get and this read changed nothing the wait below would see
            seen = ctl.channel_seq("dispatched")
            if not self._wake_held():
                return
            ctl.wait_seq_change("dispatched", seen, 200)
            if not self._wake_held():
                return

    def _wake_held(self) -> bool:
        """Have the event loop re-check the held pulls; False once the loop is gone."""
        if self.loop is None or self._stop.is_set():
            return not self._stop.is_set()
        try:
            self.loop.call_soon_threadsafe(self._check_held, False)
        except RuntimeError:
            return False
        return True

    async def _expire_held(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(0.1)
            self._check_held(True)

    def _check_held(self, expiry_only: bool) -> None:
        now = time.monotonic()
        for key in list(self.held):
            waiting = self.held.get(key)
            if not waiting:
                self.held.pop(key, None)
                continue
            max_offset = -1 if expiry_only else self.store.get_max_offset_in_queue(*key)
            keep = []
            for h in waiting:
                if h.conn.closed:
                    continue
                if max_offset > h.offset or now >= h.deadline:
                    try:
                        self.pull(h.conn, h.cmd, allow_suspend=False)
                    except Exception as exc:  # answer the held request, keep the others
                        h.conn.answer(h.cmd, ResponseCode.SYSTEM_ERROR, str(exc))
                    finally:
                        h.conn.end()
                else:
                    keep.append(h)
            if keep:
                self.held[key] = keep
            else:
                self.held.pop(key, None)

    # -- reads (AdminBrokerProcessor, QueryMessageProcessor) --------------------------------------
    def read(self, cmd: RemotingCommand) -> RemotingCommand:
        f = cmd.ext_fields
        code, store = cmd.code, self.store
        if code == RequestCode.GET_MAX_OFFSET:
            value = store.get_max_offset_in_queue(field(f, "topic"), int_field(f, "queueId"))
            return response(cmd, ResponseCode.SUCCESS, ext_fields={"offset": str(value)})
        if code == RequestCode.GET_MIN_OFFSET:
            value = store.get_min_offset_in_queue(field(f, "topic"), int_field(f, "queueId"))
            return response(cmd, ResponseCode.SUCCESS, ext_fields={"offset": str(value)})
        if code == RequestCode.SEARCH_OFFSET_BY_TIMESTAMP:
            value = store.get_offset_in_queue_by_time(field(f, "topic"), int_field(f, "queueId"),
                                                      int_field(f, "timestamp"))
            return response(cmd, ResponseCode.SUCCESS, ext_fields={"offset": str(value)})
        if code == RequestCode.GET_EARLIEST_MSG_STORETIME:
            value = store.get_earliest_message_time(field(f, "topic"), int_field(f, "queueId"))
            return response(cmd, ResponseCode.SUCCESS, ext_fields={"timestamp": str(value)})
        if code == RequestCode.VIEW_MESSAGE_BY_ID:
            phy = int_field(f, "offset")
            view = store.look_message_by_offset(phy) if phy >= 0 else None
            if view is None:
                return response(cmd, ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {phy}")
            return response(cmd, ResponseCode.SUCCESS, body=bytes(view.buffer))
        # QUERY_MESSAGE
        topic, key = field(f, "topic"), field(f, "key")
        max_num = int_field(f, "maxNum")
        if max_num <= 0:
            raise BadField(f"the custom field <maxNum> must be positive: {max_num}")
        found = store.query_message(topic, key, max_num, int_field(f, "beginTimestamp", 0),
                                    int_field(f, "endTimestamp", 2**63 - 1))
        fields = {"indexLastUpdateTimestamp": str(found.index_last_update_timestamp),
                  "indexLastUpdatePhyoffset": str(found.index_last_update_phy_offset)}
        if not found.messages:
            return response(cmd, ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct",
                            ext_fields=fields)
        return response(cmd, ResponseCode.SUCCESS, ext_fields=fields,
                        body=b"".join(bytes(m.buffer) for m in found.messages))


# -- the process ---------------------------------------------------------------------------------

def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency on Linux): its transports and
    callbacks are C, which takes ~10 us of the front's CPU off every request on this kind of
    machine; asyncio's own loop otherwise, or when MQSTORE_FRONT_LOOP=asyncio asks for it."""
    if os.environ.get("MQSTORE_FRONT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return cast(Callable[[], asyncio.AbstractEventLoop], uvloop.new_event_loop)


def main(argv: list[str]) -> int:
    """python -c "...front.main..." STORE_DIR INDEX PORT LINK_ADDRESS LISTEN_FD CONNECTIONS_FD (the
    broker's supervisor runs it, LISTEN_FD and the connection table's CONNECTIONS_FD inherited)."""
    root, index, port, address, listen_fd = argv[0], int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    connections_fd = int(argv[5])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s front{index}[%(process)d] %(levelname)s %(message)s")
    parent = os.getppid()
    store = MessageStore.attach(root)
    counter = BrokerConnectionCounter(connections_fd, index, store.config.max_connections,
                                      store.config.max_connections_per_ip)  # this front's counts zeroed
    front = Front(store, port, address.replace("\\0", "\0"), listen_fd, counter)

    async def run() -> None:
        await front.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, front.stop)
        print("READY", flush=True)
        assert front.stopped is not None
        while not front.stopped.is_set():
            if os.getppid() != parent:
                log.error("front %d: the broker (pid %d) is gone; stopping", os.getpid(), parent)
                front.stop()
                break
            try:
                await asyncio.wait_for(front.stopped.wait(), 0.2)
            except asyncio.TimeoutError:
                pass

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(run())
    finally:
        if front.executor is not None:
            front.executor.shutdown(wait=True)
        store.shutdown()
    return 0
