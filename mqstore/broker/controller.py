"""The broker's controller (RocketMQ's BrokerController without the network front): the state a
broker keeps once for every front process, run by the broker's owner process in an asyncio loop.

It holds the topics (``topics``), the subscription groups (``groups``), the consumer offsets
(``offsets``), the producer and consumer registry (``clients``), the order locks, delayed
delivery (``schedule``) and send-back (``retry``); it serves the fronts over the link (``link``),
registers the broker with every NameServer every ``register_name_server_period`` (and at once when
a topic is created), runs the embedded NameServer when ``namesrv_addr`` is empty, writes
``config/consumerOffset.json`` every ``flush_consumer_offset_interval`` and drops clients silent for
``channel_expired_timeout``. docs/rocketmq-remoting-spec.md §2.4, §3.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import socket
import struct
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from mqstore.remoting._remoting import FrameError, FrameReader, RemotingCommand
from mqstore.acl.holder import AclHolder, admin_accounts
from mqstore.acl.signature import sign_fields
from mqstore.acl.validator import offset_refusal
from mqstore.broker import link
from mqstore.broker.clients import ConsumerManager, ProducerManager, consumer_list_body, parse_heartbeat
from mqstore.broker.codes import RequestCode, ResponseCode, put_response, topic_not_exist
from mqstore.broker.groups import SubscriptionGroups
from mqstore.broker.namesrv import NameServerLink, NameServerThread
from mqstore.broker.limits import LogLimiter
from mqstore.broker.requests import (BadField, Handler, field, handlers_for, int_field, parse_number, response, route,
                                     wall_ms)
from mqstore.broker.offsets import ConsumerOffsets, decode_offset_table
from mqstore.broker.retry import max_reconsume_times, retry_topic, send_back_message
from mqstore.broker.schedule import ScheduleMessageService, decode_delay_offsets
from mqstore.broker.table import Server
from mqstore.broker.topics import PERM_READ, PERM_WRITE, TopicConfigs, topic_config, topic_problem
from mqstore.ha import read_ha_master, write_ha_master
from mqstore.ha.master import read_ha_status
from mqstore.protocol import VERSION
from mqstore.roles import BrokerRole
from mqstore.store import StoreBase
from mqstore.tls import config_client_context, config_server_context

__all__ = ["BrokerController", "HA_SLAVE_KEYS", "LOCK_EXPIRY_MS", "LOG_KEY_SUFFIX", "log_key", "wall_ms"]

log = logging.getLogger("mqstore.broker")

#: an order lock not renewed for this long is free again (RebalanceLockManager.REBALANCE_LOCK_MAX_LIVE_TIME)
LOCK_EXPIRY_MS = 60_000
#: client housekeeping period (ClientHousekeepingService)
SCAN_INTERVAL_S = 10.0
REGISTER_TIMEOUT_S = 6.0
#: a slave copies its master's topics, offsets and groups this often (SlaveSynchronize: 10 s)
SLAVE_SYNC_PERIOD_S = 10.0

#: GET_BROKER_RUNTIME_INFO on a master, one key per slave and figure: the prefix followed by the
#: slave's address (as RocketMQ suffixes commitLogDiskRatio_ with a path), and the slave's
#: field in the HA service's ha.json
HA_SLAVE_KEYS = {"haSlaveAckOffset_": "ack_offset", "haSlaveLagBytes_": "lag_bytes", "haSlaveLagMs_": "lag_ms",
                 "haSlaveBytesPerSecond_": "rate_bytes_per_s"}
#: a store with several CommitLogs (commit_log_count = N > 1): every log's figures again under
#: the key with this suffix and the log id (``haSlaveAckOffset_ADDR_L1``, ``commitLogMaxOffset_L1``,
#: log 0's too); the keys without it stay log 0's, as RocketMQ's tools read them
LOG_KEY_SUFFIX = "_L"


def log_key(name: str, log: int) -> str:
    """The runtime info key of a figure of CommitLog ``log`` (LOG_KEY_SUFFIX)."""
    return f"{name}{LOG_KEY_SUFFIX}{log}"


def _json_body(cmd: RemotingCommand) -> Any:
    try:
        return json.loads(cmd.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadField(f"the request body is not JSON: {exc}") from None


def _lock_body(cmd: RemotingCommand) -> tuple[str, str, list[tuple[tuple[str, str, int], Any]]]:
    """A LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body (LockBatchRequestBody / UnlockBatchRequestBody):
    (consumerGroup, clientId, [((topic, brokerName, queueId), the MessageQueue as sent)]); BadField
    naming what is not what fastjson would bind (a MessageQueue's missing queueId is 0, its
    missing names null)."""
    body = _json_body(cmd)
    if type(body) is not dict:
        raise BadField("the request body is not a JSON object (LockBatchRequestBody)")

    def text(obj: dict[str, Any], key: str, where: str) -> str:
        value = obj.get(key)
        if value is None:
            return ""
        if type(value) is not str:
            raise BadField(f"the request body's {where}{key} is not a string: {value!r:.64}")
        return value

    group, client = text(body, "consumerGroup", ""), text(body, "clientId", "")
    queues = body.get("mqSet")
    if queues is None:
        queues = []
    if type(queues) is not list:
        raise BadField(f"the request body's mqSet is not an array: {queues!r:.64}")
    out = []
    for i, mq in enumerate(queues):
        where = f"mqSet[{i}]."
        if type(mq) is not dict:
            raise BadField(f"the request body's mqSet[{i}] is not a MessageQueue object: {mq!r:.64}")
        qid = mq.get("queueId", 0)
        if type(qid) is str:
            try:
                qid = parse_number("queueId", qid, 32)
            except BadField:
                raise BadField(f"the request body's {where}queueId is not an integer: {qid!r:.64}") from None
        if type(qid) is not int or not -(1 << 31) <= qid < 1 << 31:
            raise BadField(f"the request body's {where}queueId is not a 32-bit integer: {qid!r:.64}")
        out.append(((text(mq, "topic", where), text(mq, "brokerName", where), qid), mq))
    return group, client, out


class BrokerController:
    """The broker-wide state and its services; ``serve()`` runs in the owner's asyncio loop."""

    def __init__(self, store: StoreBase, port: int, link_address: str) -> None:
        cfg = store.config
        self.store = store
        self.cfg = cfg
        self.root = store.root
        self.port = port
        self.addr = f"{cfg.broker_ip1}:{port}"
        self.link_address = link_address
        self.topics = TopicConfigs(self.root, cluster=cfg.broker_cluster_name, broker_name=cfg.broker_name,
                                   auto_create_topic_enable=cfg.auto_create_topic_enable,
                                   default_topic_queue_nums=cfg.default_topic_queue_nums,
                                   cluster_topic_enable=cfg.cluster_topic_enable,
                                   broker_topic_enable=cfg.broker_topic_enable)
        self.groups = SubscriptionGroups(self.root, auto_create_subscription_group=cfg.auto_create_subscription_group)
        self.offsets = ConsumerOffsets(self.root)
        self.consumers = ConsumerManager()
        self.producers = ProducerManager()
        self.schedule = ScheduleMessageService(store, self.root)
        # order locks: group -> (topic, brokerName, queueId) -> (clientId, last renewal ms)
        self.locks: dict[str, dict[tuple[str, str, int], tuple[str, int]]] = defaultdict(dict)
        self.fronts: dict[str, asyncio.StreamWriter] = {}  # front pid -> its link
        self.namesrv: NameServerThread | None = None
        self._namesrv_links: dict[str, NameServerLink] = {}  # one connection per NameServer
        self.namesrv_addrs: list[str] = [a.strip() for a in cfg.namesrv_addr.split(";") if a.strip()]
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._register_now = asyncio.Event()
        self.registrations = 0  # successful REGISTER_BROKER calls (status, tests)
        self.errors = LogLimiter(log)  # requests that failed inside a handler
        #: the ACL (acl_enable), for its one step that needs the consumer groups' members
        #: (_offset_membership_refusal); the fronts check everything else
        self.acl = AclHolder(cfg.acl_path(self.root)) if cfg.acl_enable else None
        self.refusals = LogLimiter(log)  # requests refused here (a oneway one is answered to nobody)
        #: creations waiting for the next registration to reach the NameServers (_next_registration)
        self._awaiting_registration: list[asyncio.Future[None]] = []
        self._registering: dict[str, asyncio.Future[None]] = {}  # topic -> its creation's registration
        #: what the broker signs its registrations with: (inner_access_key, inner_secret_key)
        self.inner_account: tuple[str, str] | None = (
            (cfg.inner_access_key, cfg.inner_secret_key) if cfg.inner_access_key and cfg.inner_secret_key else None)
        #: a slave broker: its master's remoting address (from the NameServer's answer to its
        #: registration) and how many metadata syncs from it went through (SlaveSynchronize)
        self.is_slave = cfg.broker_role is BrokerRole.SLAVE
        self.master_addr: str | None = None
        self.slave_syncs = 0

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.namesrv_addrs:
            # on a loop of its own thread: the controller's work cannot starve it; it trusts the
            # broker's own account (docs/security.md); a taken port is PortInUseError
            # with the ACL on, its accounts with admin: true too (re-read when the file changes)
            self.namesrv = NameServerThread(
                self.cfg.effective_bind_address, self.cfg.namesrv_listen_port, tls=config_server_context(self.cfg),
                tls_mode=self.cfg.tls_server_mode, accounts=self._trusted_brokers(), setting="namesrv_listen_port",
                server_channel_max_idle_time_seconds=self.cfg.server_channel_max_idle_time_seconds,
                max_connections=self.cfg.max_connections, max_connections_per_ip=self.cfg.max_connections_per_ip)
            self.namesrv.start()
            bind = self.cfg.effective_bind_address
            host = "127.0.0.1" if bind == "0.0.0.0" else bind
            self.namesrv_addrs = [f"{host}:{self.namesrv.port}"]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.link_address)
        self._server = await asyncio.start_unix_server(self._serve_front, sock=sock)
        if not self.is_slave:  # a slave delivers no delayed messages: its master does (handleScheduleMessageService)
            self.schedule.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._register_loop()), loop.create_task(self._flush_loop()),
                       loop.create_task(self._scan_loop())]
        if self.is_slave:
            self._tasks.append(loop.create_task(self._slave_sync_loop()))

    def _trusted_brokers(self) -> Callable[[], Mapping[str, str]] | None:
        """The accounts the embedded NameServer accepts registrations from: the broker's own pair
        (inner_access_key / inner_secret_key) and, with the ACL on, the ACL's admin accounts;
        None (registrations unsigned) when there are neither."""
        if self.inner_account is None and self.cfg.acl_enable:
            # no account of its own: it signs with one made for this run, which only its own
            # NameServer knows, so that the ACL's accounts are not the only way in
            self.inner_account = (f"mqstore-broker-{os.getpid()}", secrets.token_urlsafe(32))
        own = dict([self.inner_account]) if self.inner_account is not None else {}
        if not self.cfg.acl_enable:
            return (lambda: own) if own else None
        holder = AclHolder(self.cfg.acl_path(self.root))

        def accounts() -> Mapping[str, str]:
            return {**admin_accounts(holder.current()), **own}
        return accounts

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
        for writer in self.fronts.values():
            writer.close()
        self.schedule.stop()
        self.offsets.persist()
        await self._unregister_all()
        for ns_link in self._namesrv_links.values():
            await ns_link.close()
        if self.namesrv is not None:
            self.namesrv.close()

    # -- the link ------------------------------------------------------------------------------
    async def _serve_front(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the link's socket is in the abstract namespace, which has no file permissions: only
        # processes of the broker's own user may speak for a front (SO_PEERCRED)
        sock = writer.get_extra_info("socket")
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")) if sock else b""
        if len(creds) != struct.calcsize("3i") or struct.unpack("3i", creds)[1] != os.getuid():
            log.warning("the link refused a connection from another user (pid, uid, gid: %s)",
                        struct.unpack("3i", creds) if creds else "unknown")
            writer.close()
            return
        frames = FrameReader()
        pid = ""
        try:
            while data := await reader.read(262144):
                frames.feed(data)
                while (cmd := frames.next()) is not None:
                    if cmd.code == link.HELLO and not pid:  # a link's name is its first HELLO's
                        pid = cmd.ext_fields.get("pid", "")
                        if pid:
                            self.fronts[pid] = writer
                    answer = self.handle(cmd)
                    if asyncio.iscoroutine(answer):  # answered later (a creation waits for its registration)
                        self._answer_later(writer, cmd, answer)
                    elif answer is not None and not cmd.is_oneway:
                        writer.write(answer.encode())
                await writer.drain()
        except (FrameError, ConnectionError) as exc:
            log.error("the link of front %s broke: %s", pid or "?", exc)
        finally:
            writer.close()
            if pid and self.fronts.get(pid) is writer:
                del self.fronts[pid]
                self._front_gone(pid)

    def _answer_later(self, writer: asyncio.StreamWriter, cmd: RemotingCommand, answer: Any) -> None:
        def done(task: asyncio.Task[RemotingCommand]) -> None:
            if task.cancelled() or cmd.is_oneway or writer.is_closing():
                return
            exc = task.exception()
            got = task.result() if exc is None else response(cmd, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
            writer.write(got.encode())
        asyncio.get_running_loop().create_task(answer).add_done_callback(done)

    def _front_gone(self, pid: str) -> None:
        """A front process ended: every client connection it held is closed."""
        prefix = f"{pid}:"
        held = {str(c) for manager in (self.consumers, self.producers) for g in manager.groups()
                for c in manager.channels(g) if str(c).startswith(prefix)}
        for conn in held:
            self._closed(conn)  # leaves both registries

    def _push(self, pid: str, cmd: RemotingCommand) -> None:
        writer = self.fronts.get(pid)
        if writer is not None and not writer.is_closing():
            cmd.flag |= 2
            writer.write(cmd.encode())

    def _notify(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED to every consumer of group (through the fronts holding them)."""
        gc = self.groups.table.get(group)
        if not self.cfg.notify_consumer_ids_changed_enable or (gc is not None and not gc.notify_consumer_ids_changed_enable):
            return
        by_front: dict[str, list[str]] = defaultdict(list)
        for conn in self.consumers.channels(group):
            by_front[str(conn).partition(":")[0]].append(str(conn))
        for pid, conns in by_front.items():
            self._push(pid, RemotingCommand(link.NOTIFY, ext_fields={"group": group}, body=",".join(conns).encode()))

    def _topic_changed(self, topic: str) -> None:
        cfg = self.topics.get(topic)
        body = json.dumps(cfg).encode() if cfg is not None else b""
        for pid in list(self.fronts):
            self._push(pid, RemotingCommand(link.TOPIC_CHANGED, ext_fields={"topic": topic}, body=body))
        self._register_now.set()

    def _closed(self, conn: str) -> None:
        for group in self.consumers.channel_closed(conn):
            self._notify(group)
        self.producers.channel_closed(conn)
        self.topics.auto_creations.forget(conn)

    # -- requests ------------------------------------------------------------------------------
    def handle(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """The answer to one request from a front (forwarded client requests, checked by the
        front's ACL, and the link's own), through the request table."""
        return route(cmd, self._handlers, self, errors=self.errors)

    def _hello(self, cmd: RemotingCommand) -> RemotingCommand:
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps(self.topics.wrapper()).encode())

    def _topic_for_send(self, cmd: RemotingCommand) -> RemotingCommand | Coroutine[Any, Any, RemotingCommand]:
        topic = field(cmd.ext_fields, "topic")
        queue_nums, sys_flag = int_field(cmd.ext_fields, "defaultTopicQueueNums", 4), int_field(cmd.ext_fields, "sysFlag", 0)
        cfg = self.topics.get(topic)
        if cfg is not None:
            answer = response(cmd, ResponseCode.SUCCESS, body=json.dumps(cfg).encode())
            pending = self._registering.get(topic)
            # sends that asked while the topic's creation waits for its registration go after it, in order
            return answer if pending is None else self._after(pending, answer)
        cfg = self.topics.config_in_send(topic, cmd.ext_fields.get("defaultTopic", "TBW102"), queue_nums, sys_flag)
        if cfg is None and topic.startswith("%RETRY%"):
            cfg = topic_config(topic, 1, PERM_READ | PERM_WRITE)  # as _create_system_topic makes it
        if cfg is None:
            return response(cmd, ResponseCode.TOPIC_NOT_EXIST,
                             topic_not_exist(topic)
                             + ("" if self.cfg.auto_create_topic_enable else
                                " (auto_create_topic_enable is false: create the topic first, e.g. "
                                "mqstore admin topic create)"))
        conn = cmd.ext_fields.get(link.CONN, "")
        refused = self._auto_creation_refusal(topic, conn)
        if refused is not None:
            return response(cmd, *refused)
        self.topics.add(cfg)
        if conn:
            self.topics.auto_creations.created(conn, lambda: set(self.fronts))
        log.info("topic %s created on its first send from %s: %s", topic, cmd.ext_fields.get(link.PEER), cfg)
        registered = self._next_registration()
        self._registering[topic] = registered
        registered.add_done_callback(lambda _: self._registering.pop(topic, None))
        self._topic_created(topic)
        return self._after(registered, response(cmd, ResponseCode.SUCCESS, body=json.dumps(cfg).encode()))

    def _next_registration(self) -> asyncio.Future[None]:
        """Done when a registration that starts after now has reached the NameServers (or failed)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._awaiting_registration.append(fut)
        return fut

    async def _after(self, registered: asyncio.Future[None], answer: RemotingCommand) -> RemotingCommand:
        """answer once the new topic is registered, as 4.9.7's createTopicInSendMessageMethod
        registers before the send goes on: a client that looks the route up after its first send
        finds it. Bounded by REGISTER_TIMEOUT_S (the registration goes on regardless)."""
        try:
            await asyncio.wait_for(asyncio.shield(registered), REGISTER_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass
        return answer

    def _create_system_topic(self, topic: str, queues: int, perm: int) -> dict[str, Any] | None:
        """createTopicInSendMessageBackMethod: a retry or DLQ topic of an explicit size; None
        (logged) when it does not exist and the broker holds max_topic_count topics."""
        cfg = self.topics.get(topic)
        if cfg is None:
            why = self.topics.room_refusal(topic, self.cfg.max_topic_count)
            if why is not None:
                self._creation_refused(topic, why)
                return None
            cfg = topic_config(topic, queues, perm)
            self.topics.add(cfg)
            self._topic_created(topic)
        return cfg

    # creation bounded (docs/broker.md "Topic limits"): the caps, and O(1) work per creation
    #: the NameServers hear of new topics at most this often (the first after a quiet while at once):
    #: a new topic is routable within about this long, and a flood costs 10 registrations a second
    REGISTER_COALESCE_S = 0.1
    #: a refused creation is logged at most this often (with the count refused since)
    REFUSAL_LOG_INTERVAL_S = 10.0
    _register_later: asyncio.TimerHandle | None = None
    _register_asked_at = float("-inf")
    _refusal_logged_at = float("-inf")
    _refusals_unlogged = 0

    def _auto_creation_refusal(self, topic: str, conn: str) -> tuple[int, str] | None:
        """(code, remark) refusing the creation of `topic` on a first send from connection `conn`
        ("" when the front did not say), or None when it may go ahead (a token of the rate is
        then taken). TOPIC_NOT_EXIST past the connection's or the broker's cap; SYSTEM_BUSY past
        the rate, which clients back off on and retry."""
        made = self.topics.auto_creations
        why = made.connection_refusal(conn, self.cfg.auto_create_topic_max_per_connection) if conn else None
        if why is None:
            why = self.topics.room_refusal(topic, self.cfg.max_topic_count)
        if why is not None:
            self._creation_refused(topic, why)
            return ResponseCode.TOPIC_NOT_EXIST, f"{topic_not_exist(topic)} ({why})"
        why = made.rate_refusal(self.cfg.auto_create_topic_max_per_second)
        if why is not None:
            self._creation_refused(topic, why)
            return ResponseCode.SYSTEM_BUSY, f"topic[{topic}] not created: {why}"
        return None

    def _creation_refused(self, topic: str, why: str) -> None:
        """Log a refused creation: the first, then one line every REFUSAL_LOG_INTERVAL_S at most."""
        self._refusals_unlogged += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= self.REFUSAL_LOG_INTERVAL_S:
            log.warning("topic %s not created (%d creation(s) refused since the last such line): %s", topic,
                        self._refusals_unlogged, why)
            self._refusal_logged_at, self._refusals_unlogged = now, 0

    def _topic_created(self, topic: str) -> None:
        """A request created or changed `topic`: the fronts are told at once (as _topic_changed
        tells them), topics.json is written soon (TopicConfigs.persist_soon) and the NameServers
        hear of it through _register_soon, so a flood of creations costs O(1) each here, not a
        write and a registration of the whole topic table each."""
        cfg = self.topics.get(topic)
        body = json.dumps(cfg).encode() if cfg is not None else b""
        for pid in list(self.fronts):
            self._push(pid, RemotingCommand(link.TOPIC_CHANGED, ext_fields={"topic": topic}, body=body))
        self.topics.persist_soon()
        self._register_soon()

    def _register_soon(self) -> None:
        """Register with the NameServers at once when the last registration a topic change asked
        for is REGISTER_COALESCE_S old, else once when it is (the changes of that second go
        together: each registration carries the whole topic table)."""
        if self._register_later is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._register_asked_at + self.REGISTER_COALESCE_S - loop.time()
        if wait > 0:
            self._register_later = loop.call_later(wait, self._register_due)
        else:
            self._register_due()

    def _register_due(self) -> None:
        self._register_later = None
        self._register_asked_at = asyncio.get_running_loop().time()
        self._register_now.set()

    def _group(self, cmd: RemotingCommand) -> RemotingCommand:
        group = field(cmd.ext_fields, "group")
        gc = self.groups.find(group)
        if gc is None:
            return response(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                             f"subscription group [{group}] does not exist, "
                             "(auto_create_subscription_group is false)")
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps(gc.to_json()).encode())

    def _subscription(self, cmd: RemotingCommand) -> RemotingCommand:
        group, topic = field(cmd.ext_fields, "group"), field(cmd.ext_fields, "topic")
        if self.consumers.group_info(group) is None:
            return response(cmd, ResponseCode.SUBSCRIPTION_NOT_EXIST,
                             f"the consumer's group info not exist, {group}")
        sub = self.consumers.subscription(group, topic)
        if sub is None:
            return response(cmd, ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist")
        return response(cmd, ResponseCode.SUCCESS, ext_fields={"subString": sub.sub_string})

    def _link_closed(self, cmd: RemotingCommand) -> None:
        self._closed(field(cmd.ext_fields, "conn"))
        return None

    def _heartbeat(self, cmd: RemotingCommand) -> RemotingCommand:
        data = parse_heartbeat(cmd.body)
        conn = field(cmd.ext_fields, link.CONN)
        now = wall_ms()
        for consumer in data.consumers:
            gc = self.groups.find(consumer.group)
            if gc is not None:
                # the group's retry topic, so its pulls of %RETRY%<group> find a topic (§2.4.4)
                self._create_system_topic(retry_topic(consumer.group), gc.retry_queue_nums, PERM_READ | PERM_WRITE)
            if self.consumers.register(conn, data.client_id, cmd.language, cmd.version, consumer, now):
                log.info("consumer group %s changed: %s joined or resubscribed", consumer.group, data.client_id)
                self._notify(consumer.group)
        for group in data.producers:
            self.producers.register(conn, data.client_id, group, now, language=cmd.language, version=cmd.version)
        return response(cmd, ResponseCode.SUCCESS)

    def _unregister_client(self, cmd: RemotingCommand) -> RemotingCommand:
        conn = field(cmd.ext_fields, link.CONN)
        producer = cmd.ext_fields.get("producerGroup", "")
        consumer = cmd.ext_fields.get("consumerGroup", "")
        if producer:
            self.producers.unregister(conn, producer)
        if consumer and self.consumers.unregister(conn, consumer):
            self._notify(consumer)
        return response(cmd, ResponseCode.SUCCESS)

    def _consumer_list(self, cmd: RemotingCommand) -> RemotingCommand:
        group = field(cmd.ext_fields, "consumerGroup")
        ids = self.consumers.consumer_ids(group)
        if not ids:
            return response(cmd, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return response(cmd, ResponseCode.SUCCESS, body=consumer_list_body(ids))

    def _query_offset(self, cmd: RemotingCommand) -> RemotingCommand:
        group, topic, queue_id = field(cmd.ext_fields, "consumerGroup"), field(cmd.ext_fields, "topic"), int_field(cmd.ext_fields, "queueId")
        offset = self.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return response(cmd, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
        # a new group on a queue that still starts at 0 and whose first message is in memory: 0
        if self.store.get_min_offset_in_queue(topic, queue_id) <= 0 and not self._in_disk(topic, queue_id):
            return response(cmd, ResponseCode.SUCCESS, ext_fields={"offset": "0"})
        return response(cmd, ResponseCode.QUERY_NOT_FOUND,
                         "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")

    def _in_disk(self, topic: str, queue_id: int) -> bool:
        """checkInDiskByConsumeOffset of the queue's first message: farther behind the log's end
        than access_message_in_memory_max_ratio of memory."""
        result = self.store.get_message("", topic, queue_id, 0, 1)
        return bool(result.message_count and result.suggest_pulling_from_slave)

    def _update_offset(self, cmd: RemotingCommand) -> RemotingCommand:
        refused = self._offset_membership_refusal(cmd.code, cmd.ext_fields)
        if refused is not None:
            return response(cmd, ResponseCode.NO_PERMISSION, refused)
        self.offsets.commit(field(cmd.ext_fields, "consumerGroup"), field(cmd.ext_fields, "topic"), int_field(cmd.ext_fields, "queueId"),
                            int_field(cmd.ext_fields, "commitOffset"))
        return response(cmd, ResponseCode.SUCCESS)

    def _offset_membership_refusal(self, code: int, fields: Mapping[str, str]) -> str | None:
        """The ACL's check that a client may set a consumer group's offsets (mqstore's rule,
        docs/security.md "Offsets are the group's"), after the front's check of the request
        table's ACL column: with acl_enable, a client's UPDATE_CONSUMER_OFFSET needs an admin
        account, the group listed in its account's groupPerms with SUB, or the client to be a live
        consumer of the group: its connection (``_conn``) a channel of the group here, registered
        by a heartbeat and not since unregistered, closed or expired
        (mqstore.acl.validator.offset_refusal). Why it is refused (NO_PERMISSION), or None.
        A client's request comes forwarded with ``_peer`` (link.py); what the broker's own
        processes send without it is not a client's: a front's commit of a pull's commitOffset,
        which keeps 4.9.7's rule and was checked with the pull, and an embedded consumer's commit.
        With the ACL off nothing is checked (RocketMQ 4.9.7 without ACL)."""
        peer = fields.get(link.PEER)
        if self.acl is None or peer is None:
            return None
        conn = fields.get(link.CONN, "")
        refused = offset_refusal(self.acl.current(), code, fields, peer.rpartition(":")[0],
                                 lambda group: self.consumers.has_channel(group, conn))
        if refused is not None:
            self.refusals.warning("ACL: refusing request %d from %s: %s", code, peer, refused)
        return refused

    def _send_back(self, cmd: RemotingCommand) -> RemotingCommand:
        group = field(cmd.ext_fields, "group")
        phy = int_field(cmd.ext_fields, "offset")
        gc = self.groups.find(group)
        if gc is None:
            return response(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                             f"subscription group not exist, {group}")
        view = self.store.look_message_by_offset(phy) if phy >= 0 else None
        if view is None:
            return response(cmd, ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {phy}")
        header_max = int_field(cmd.ext_fields, "maxReconsumeTimes") if "maxReconsumeTimes" in cmd.ext_fields else None
        max_times = max_reconsume_times(gc.retry_max_times, header_max, cmd.version)
        back = send_back_message(view, group=group, delay_level=int_field(cmd.ext_fields, "delayLevel", 0),
                                 max_reconsume_times=max_times, retry_queue_nums=gc.retry_queue_nums)
        if back is None:  # retryQueueNums <= 0: RocketMQ answers SUCCESS and puts nothing
            return response(cmd, ResponseCode.SUCCESS)
        # 4.9.7 creates both read-write (older brokers made the DLQ write-only): a DLQ can be consumed
        if self._create_system_topic(back.topic, back.queue_nums, PERM_READ | PERM_WRITE) is None:
            return response(cmd, ResponseCode.SYSTEM_ERROR,
                            f"topic[{back.topic}] cannot be created: the broker holds max_topic_count "
                            f"({self.cfg.max_topic_count}) topics")
        result = self.store.put_message(back.message)
        code, remark = put_response(result.status, result.detail)
        if code in (ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE):
            code, remark = ResponseCode.SUCCESS, None
        return response(cmd, code, remark)

    def _lock(self, cmd: RemotingCommand) -> RemotingCommand:
        group, client, queues = _lock_body(cmd)
        now = wall_ms()
        table = self.locks[group]
        ok = []
        for key, mq in queues:
            holder = table.get(key)
            if holder is None or holder[0] == client or now - holder[1] > LOCK_EXPIRY_MS:
                table[key] = (client, now)
                ok.append(mq)
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps({"lockOKMQSet": ok}).encode())

    def _unlock(self, cmd: RemotingCommand) -> RemotingCommand:
        group, client, queues = _lock_body(cmd)
        table = self.locks[group]
        for key, _mq in queues:
            if table.get(key, ("",))[0] == client:
                del table[key]
        return response(cmd, ResponseCode.SUCCESS)

    def _update_topic(self, cmd: RemotingCommand) -> RemotingCommand:
        """UPDATE_AND_CREATE_TOPIC (an admin's topic create or update)."""
        topic = field(cmd.ext_fields, "topic")
        problem = topic_problem(topic)
        if problem is not None and "forbidden" not in problem:
            return response(cmd, ResponseCode.SYSTEM_ERROR, problem)
        cfg = topic_config(topic, int_field(cmd.ext_fields, "writeQueueNums", 16), int_field(cmd.ext_fields, "perm", PERM_READ | PERM_WRITE),
                           int_field(cmd.ext_fields, "topicSysFlag", 0), cmd.ext_fields.get("topicFilterType", "SINGLE_TAG"),
                           cmd.ext_fields.get("order", "false") == "true")
        cfg["readQueueNums"] = int_field(cmd.ext_fields, "readQueueNums", cfg["writeQueueNums"])
        if cfg["readQueueNums"] <= 0 or cfg["writeQueueNums"] <= 0:
            return response(cmd, ResponseCode.SYSTEM_ERROR, "readQueueNums and writeQueueNums must be positive")
        why = self.topics.room_refusal(topic, self.cfg.max_topic_count)
        if why is not None:
            self._creation_refused(topic, why)
            return response(cmd, ResponseCode.SYSTEM_ERROR, why)
        self.topics.add(cfg)
        self._topic_created(topic)
        return response(cmd, ResponseCode.SUCCESS)

    def _all_topics(self, cmd: RemotingCommand) -> RemotingCommand:
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps(self.topics.wrapper()).encode())

    def _all_offsets(self, cmd: RemotingCommand) -> RemotingCommand:
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps({"offsetTable": self.offsets.table()}).encode())

    def _all_delay_offsets(self, cmd: RemotingCommand) -> RemotingCommand:
        return response(cmd, ResponseCode.SUCCESS, body=self.schedule.offsets_json().encode())

    def _all_groups(self, cmd: RemotingCommand) -> RemotingCommand:
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps(self.groups.wrapper()).encode())

    def _runtime_info(self, cmd: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO: the broker's KVTable (a subset of RocketMQ's keys, plus mqstore's)."""
        st = self.store
        table = {"brokerVersion": str(VERSION), "brokerVersionDesc": "V4_9_7 (mqstore)",
                 "commitLogMaxOffset": str(st.get_max_phy_offset()), "commitLogMinOffset": str(st.get_min_phy_offset()),
                 "dispatchBehindBytes": str(st.dispatch_behind_bytes), "brokerName": self.cfg.broker_name,
                 "brokerAddr": self.addr, "clusterName": self.cfg.broker_cluster_name,
                 # a front's link is named by its pid, an embedded consumer's by pid-id
                 "frontProcesses": str(sum(1 for name in self.fronts if name.isdigit())),
                 "embeddedConsumers": str(sum(1 for name in self.fronts if not name.isdigit())), "topics": str(len(self.topics.table)),
                 "consumerGroups": str(len(self.consumers.groups())), "registrations": str(self.registrations),
                 "namesrvAddr": ";".join(self.namesrv_addrs)}
        table.update({k: str(v) for k, v in st.stats().items()})
        logs = st.logs() if st.ctl.log_count > 1 else []
        if logs:  # every log's offsets; the keys above are log 0's (docs/parallel-commitlogs.md)
            table["commitLogCount"] = str(len(logs))
            for k, low, high in logs:
                table[log_key("commitLogMaxOffset", k)] = str(high)
                table[log_key("commitLogMinOffset", k)] = str(low)
        table.update(self._ha_runtime_info(int(table["commitLogMaxOffset"]), [high for _, _, high in logs]))
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps({"table": table}).encode())

    def _ha_runtime_info(self, max_offset: int, log_ends: list[int] | None = None) -> dict[str, str]:
        """The runtime info's replication keys. RocketMQ 4.9.7's prepareRuntimeInfo has none;
        its names are kept where 4.9.7 has one for the figure elsewhere: ``slaveFallBehindMuch``
        (MessageStore.slaveFallBehindMuch: the CommitLog's max offset minus the highest offset a
        slave reported, ``confirmed``), ``haServerAddr`` and ``masterAddr`` (the registration's
        fields), ``haMasterAddress`` (the store setting). The others are mqstore's, from the
        control block and the HA service's ha.json (mqstore.ha.master.read_ha_status).

        ``log_ends``: each CommitLog's max offset of a store with several (else empty). The
        keys above stay log 0's; every log's figures (log 0's too) come again under the key
        with ``_L<k>`` (log_key): on a master the fall-behind, slave count, last report,
        ``confirmed`` and each of its slaves' keys (``haSlaveAckOffset_ADDR_L<k>``; a slave
        broker holds one connection per log, so each log's slave has its own ADDR); on a
        slave each log's connection, reported offset, last error and divergence."""
        ha = read_ha_status(self.root) or {}
        ctl = self.store.ctl
        several = log_ends or []
        if self.is_slave:
            out = {"masterAddr": self.master_addr or "",
                   "haMasterAddress": str(ha.get("master") or self.cfg.ha_master_address or read_ha_master(self.root)),
                   "haConnected": "true" if ha.get("connected") else "false",
                   "haReportedOffset": str(ha.get("offset", ctl.get("wrote"))),
                   "haLastError": str(ha.get("last_error") or ""), "haDiverged": str(ha.get("diverged") or "")}
            listed = ha.get("logs")
            peers: list[Any] = listed if isinstance(listed, list) else []
            for k in range(len(several)):  # the slave's HA process has a client per log, in log order
                peer = peers[k] if k < len(peers) and isinstance(peers[k], dict) else {}
                out.update({log_key("haConnected", k): "true" if peer.get("connected") else "false",
                            log_key("haReportedOffset", k): str(peer.get("offset", ctl.get("wrote", log=k))),
                            log_key("haLastError", k): str(peer.get("last_error") or ""),
                            log_key("haDiverged", k): str(peer.get("diverged") or "")})
            return out
        out = {"haServerAddr": self._ha_server_addr(),
               "slaveFallBehindMuch": str(max(0, max_offset - ctl.get("confirmed"))),
               "haSlaveCount": str(ctl.get("ha_slaves")), "haLastReportTimestamp": str(ctl.get("ha_report_ms"))}
        for k, end in enumerate(several):
            confirmed = ctl.get("confirmed", log=k)
            out.update({log_key("slaveFallBehindMuch", k): str(max(0, end - confirmed)),
                        log_key("confirmed", k): str(confirmed),
                        log_key("haSlaveCount", k): str(ctl.get("ha_slaves", log=k)),
                        log_key("haLastReportTimestamp", k): str(ctl.get("ha_report_ms", log=k))})
        for slave in ha.get("slaves", []) if ha.get("role") == "master" else []:
            k = slave.get("log", 0)
            figures = {prefix + str(slave.get("slave")): str(slave.get(name, "")) for prefix, name in HA_SLAVE_KEYS.items()}
            if k == 0:  # RocketMQ's keys: log 0's slaves only
                out.update(figures)
            if several and isinstance(k, int):
                out.update({log_key(key, k): value for key, value in figures.items()})
        return out

    def _ha_server_addr(self) -> str:
        """Where this broker's HA service accepts slaves (registered as haServerAddr)."""
        return f"{self.cfg.broker_ip1}:{self.store.ctl.get('ha_port') or self.cfg.ha_listen_port}"

    def _consumer_connections(self, cmd: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (admin): the group's clients and subscriptions."""
        group = field(cmd.ext_fields, "consumerGroup")
        info = self.consumers.group_info(group)
        if info is None:
            return response(cmd, ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {"consumeType": info.consume_type.name if info.consume_type else None,
                "messageModel": info.message_model.name if info.message_model else None,
                "consumeFromWhere": info.consume_from_where.name if info.consume_from_where else None,
                "connectionSet": [{"clientId": c.client_id, "clientAddr": str(ch), "language": c.language,
                                   "version": c.version} for ch, c in info.channels.items()],
                "subscriptionTable": {t: {"topic": t, "subString": sd.sub_string} for t, sd in info.subscriptions.items()}}
        return response(cmd, ResponseCode.SUCCESS, body=json.dumps(body).encode())

    #: the controller's column of the request table (mqstore.broker.table): the clients' requests
    #: its fronts forward and the link's own, each served by the method its row names (defined above)
    _handlers: dict[int, Handler] = handlers_for(locals(), Server.CONTROLLER, Server.LINK)

    # -- periodic work -------------------------------------------------------------------------
    async def _register_loop(self) -> None:
        period = self.cfg.register_name_server_period / 1000
        while True:
            # cleared before, not after, registering: a topic made while a registration is on its
            # way sets it again, and is registered right after
            self._register_now.clear()
            waiting, self._awaiting_registration = self._awaiting_registration, []
            try:
                await self.register_all()
            finally:
                for fut in waiting:
                    if not fut.done():
                        fut.set_result(None)
            try:
                await asyncio.wait_for(self._register_now.wait(), period)
            except asyncio.TimeoutError:
                pass

    def _register_request(self) -> RemotingCommand:
        """REGISTER_BROKER, signed with the broker's own account (inner_access_key) when it has one."""
        body = json.dumps({"topicConfigSerializeWrapper": self.topics.wrapper(), "filterServerList": []}).encode()
        fields = {"brokerAddr": self.addr, "brokerId": str(self.cfg.broker_id), "brokerName": self.cfg.broker_name,
                  "clusterName": self.cfg.broker_cluster_name, "haServerAddr": self._ha_server_addr(),
                  "compressed": "false", "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}
        if self.inner_account is not None:
            sign_fields(fields, body, *self.inner_account)
        return RemotingCommand(RequestCode.REGISTER_BROKER, language="JAVA", version=VERSION, ext_fields=fields,
                               body=body)

    async def register_all(self) -> None:
        """REGISTER_BROKER with every NameServer (registerBrokerAll), each on the broker's one
        connection to it (the NameServer drops the broker's routes when it closes)."""
        await asyncio.gather(*(self._call_namesrv(addr, self._register_request()) for addr in self.namesrv_addrs))

    async def _unregister_all(self) -> None:
        fields = {"brokerAddr": self.addr, "brokerId": str(self.cfg.broker_id), "brokerName": self.cfg.broker_name,
                  "clusterName": self.cfg.broker_cluster_name}
        if self.inner_account is not None:
            sign_fields(fields, None, *self.inner_account)
        cmd = RemotingCommand(RequestCode.UNREGISTER_BROKER, language="JAVA", version=VERSION, ext_fields=fields)
        await asyncio.gather(*(self._call_namesrv(addr, cmd) for addr in self.namesrv_addrs))

    async def _call_namesrv(self, addr: str, cmd: RemotingCommand) -> bool:
        """cmd on the broker's connection to the NameServer at addr (opened, or opened again, here;
        its loss registers again at once); whether it succeeded (a failure is logged)."""
        ns_link = self._namesrv_links.get(addr)
        if ns_link is None:
            # TLS as tls_enable says; the embedded NameServer over a socket pair, whatever its port's TLS
            embedded = self.namesrv
            ns_link = self._namesrv_links[addr] = NameServerLink(
                addr, timeout_s=REGISTER_TIMEOUT_S, on_lost=self._register_now.set,
                tls=config_client_context(self.cfg) if embedded is None else None,
                opener=embedded.connect_local if embedded is not None else None)
        got = await ns_link.call(cmd)
        if got is None:
            return False
        if got.code != ResponseCode.SUCCESS:
            log.warning("NameServer %s refused %d: %s", addr, cmd.code, got.remark)
            return False
        if cmd.code == RequestCode.REGISTER_BROKER:
            self.registrations += 1
            if self.is_slave:
                self._learn_master(got)
        return True

    def _learn_master(self, got: RemotingCommand) -> None:
        """A slave's registration answer names its master (masterAddr) and the master's HA
        address (haServerAddr): the metadata sync asks the one, the HA client follows the other
        unless ha_master_address says where."""
        master, ha = got.ext_fields.get("masterAddr"), got.ext_fields.get("haServerAddr")
        if master and master != self.master_addr:
            log.info("slave: the master of %s is %s", self.cfg.broker_name, master)
            self.master_addr = master
        if ha and not self.cfg.ha_master_address:
            write_ha_master(self.root, ha)

    async def _request(self, addr: str, cmd: RemotingCommand, what: str) -> RemotingCommand | None:
        """One request on a connection of its own; the answer, or None (logged) when there is none."""
        host, _, port = addr.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), REGISTER_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("%s %s: cannot connect (%s)", what, addr, exc)
            return None
        try:
            cmd.opaque = random.getrandbits(31)
            writer.write(cmd.encode())
            frames = FrameReader()
            deadline = time.monotonic() + REGISTER_TIMEOUT_S
            while (got := frames.next()) is None:
                data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
                if not data:
                    raise ConnectionError("closed")
                frames.feed(data)
            return got
        except (OSError, asyncio.TimeoutError, FrameError) as exc:
            log.warning("%s %s: request %d failed (%s)", what, addr, cmd.code, exc)
            return None
        finally:
            writer.close()

    # -- a slave's copy of its master's metadata (SlaveSynchronize) -------------------------------
    async def _slave_sync_loop(self) -> None:
        while True:
            if self.master_addr:
                try:
                    await self.sync_from_master()
                except (ValueError, KeyError, TypeError, OSError) as exc:
                    log.warning("slave: syncing from the master %s failed: %s", self.master_addr, exc)
            await asyncio.sleep(SLAVE_SYNC_PERIOD_S if self.slave_syncs else 0.5)

    async def sync_from_master(self) -> None:
        """The master's topics, consumer offsets, subscription groups and delay offsets, as this
        slave's (GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        GET_ALL_DELAY_OFFSET): a consumer the master sends here finds its topic, group and
        offsets, and a promoted slave delivers delayed messages from where its master was."""
        assert self.master_addr is not None
        answers = []
        for code in (RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_CONSUMER_OFFSET,
                     RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, RequestCode.GET_ALL_DELAY_OFFSET):
            got = await self._request(self.master_addr, RemotingCommand(code, language="JAVA", version=VERSION),
                                      "master")
            if got is None or got.code != ResponseCode.SUCCESS:
                return
            answers.append(got.body.decode("utf-8"))
        topics, offsets, groups, delays = answers
        obj = json.loads(topics)
        table = {str(k): dict(v) for k, v in (obj.get("topicConfigTable") or {}).items()}
        if table != self.topics.table:
            changed = [t for t in set(table) | set(self.topics.table) if table.get(t) != self.topics.table.get(t)]
            self.topics.table = table
            if type(obj.get("dataVersion")) is dict:
                self.topics.data_version = dict(obj["dataVersion"])
            self.topics.persist()
            for topic in changed:
                self._topic_changed(topic)
        self.offsets.replace(decode_offset_table(offsets))
        self.groups.replace(groups)
        self.schedule.replace_offsets(decode_delay_offsets(delays))
        self.slave_syncs += 1

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.flush_consumer_offset_interval / 1000)
            try:
                self.offsets.persist()
            except OSError as exc:
                log.error("writing consumerOffset.json failed: %s", exc)

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(SCAN_INTERVAL_S)
            now = wall_ms()
            for group in self.consumers.scan_expired(now, self.cfg.channel_expired_timeout):
                # 4.9.7 closes the silent channel, which notifies the group's other consumers
                log.info("consumer group %s: a client silent for %d ms was dropped", group,
                         self.cfg.channel_expired_timeout)
                self._notify(group)
            self.producers.scan_expired(now, self.cfg.channel_expired_timeout)
