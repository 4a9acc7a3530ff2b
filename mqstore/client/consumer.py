"""The pull consumer (RocketMQ's DefaultMQPullConsumer, asyncio; docs/rocketmq-remoting-spec.md
§2.4.2, §2.4.3, §2.4.7, §2.4.9, §2.5.3): the application picks the queue and the offset, pulls
(with long polling when it asks for it), keeps or commits its offsets on the broker, and sends
failed messages back for a later retry.

    consumer = PullConsumer("CG", namesrv="127.0.0.1:9876")
    await consumer.start()
    for mq in await consumer.queues("TopicTest"):
        result = await consumer.pull(mq, await consumer.fetch_offset(mq), suspend_ms=5000)
    await consumer.close()
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import TracebackType

from mqstore.remoting._remoting import RemotingCommand
from mqstore.acl.signature import SessionCredentials, as_credentials
from mqstore.client.errors import MQClientError, ProtocolError, RouteError
from mqstore.client.instance import ClientInstance, check_group, response_int
from mqstore.client.message import MessageExt, PullResult, PullStatus, decode_messages
from mqstore.client.protocol import VERSION, PullSysFlag, RequestCode, ResponseCode
from mqstore.client.remoting import TlsOption
from mqstore.client.route import MessageQueue

__all__ = ["PullConsumer", "parse_expression"]

_PULL_STATUS: dict[int, PullStatus] = {ResponseCode.SUCCESS: PullStatus.FOUND,
                                       ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
                                       ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
                                       ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL}
#: DefaultMQPullConsumer.maxReconsumeTimes
MAX_RECONSUME_TIMES = 16


def parse_expression(expression: str) -> frozenset[str] | None:
    """A tag expression (FilterAPI.buildSubscriptionData): "*" or "" -> None (every message);
    "TagA || TagB" -> {"TagA", "TagB"}. ValueError for one that names no tag or is SQL."""
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a str, not {type(expression).__name__}")
    text = expression.strip()
    if text in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        raise ValueError(f"the tag expression {expression!r} names no tag: 'TagA || TagB' or '*'")
    return tags


def _check_mq(mq: object) -> MessageQueue:
    if not isinstance(mq, MessageQueue):
        raise ValueError(f"mq must be a MessageQueue (from queues()), not {type(mq).__name__}")
    return mq


def _check_offset(name: str, value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be an int >= 0, not {value!r}")
    return value


class PullConsumer:
    """A pull consumer of group ``group`` (clustering; its offsets live on the brokers when it
    commits them) over the NameServers ``namesrv`` ("host:port;host:port").

    serialize: "JSON" or "ROCKETMQ" headers. timeout: seconds a request waits for its response
    (a long-polling pull waits suspend_ms longer). max_reconsume_times: sent with send_back (the
    broker moves a message to %DLQ%<group> after that many). on_consumer_ids_changed(group) is
    called when a broker says the group's consumers changed (NOTIFY_CONSUMER_IDS_CHANGED).
    credentials: a SessionCredentials or an (access_key, secret_key) pair: every request is
    signed with it, for a broker with ACL on (docs/client.md). tls: True (the system's CAs) or an
    ssl.SSLContext (mqstore.tls.client_context): every connection over TLS, the server's
    certificate checked against the host of its address; namesrv_tls: the NameServers'
    connections, when they differ (None: as tls; False: plain)."""

    def __init__(self, group: str, namesrv: str, *, serialize: str = "JSON", timeout: float = 3.0,
                 max_reconsume_times: int = MAX_RECONSUME_TIMES,
                 on_consumer_ids_changed: Callable[[str], None] | None = None, heartbeat_interval: float = 30.0,
                 route_ttl: float = 30.0, credentials: SessionCredentials | tuple[str, str] | None = None,
                 tls: TlsOption = None, namesrv_tls: TlsOption = None) -> None:
        self.group = check_group(group, "DEFAULT_CONSUMER")
        if type(max_reconsume_times) is not int or max_reconsume_times < 0:
            raise ValueError(f"max_reconsume_times must be an int >= 0, not {max_reconsume_times!r}")
        self.max_reconsume_times = max_reconsume_times
        self.client = ClientInstance(namesrv, serialize=serialize, timeout=timeout,
                                     heartbeat_interval=heartbeat_interval, route_ttl=route_ttl, version=VERSION,
                                     heartbeat_body=self._heartbeat_body,
                                     unregister_fields={"consumerGroup": self.group},
                                     on_notify=on_consumer_ids_changed, credentials=as_credentials(credentials),
                                     tls=tls, namesrv_tls=namesrv_tls)
        self._suggested: dict[MessageQueue, int] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> PullConsumer:
        """Start the heartbeat timer; a broker gets the first heartbeat when a route names it."""
        self.client.start()
        return self

    async def close(self) -> None:
        """UNREGISTER_CLIENT to every broker this consumer heartbeated, then the connections close."""
        await self.client.close()

    async def __aenter__(self) -> PullConsumer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def heartbeat(self) -> None:
        """HEART_BEAT to every known broker now (it also runs every heartbeat_interval)."""
        self.client.check_open("the consumer")
        await self.client.heartbeat()

    def _heartbeat_body(self, client_id: str) -> bytes:
        consumer = {"groupName": self.group, "consumeType": "CONSUME_ACTIVELY", "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}
        return json.dumps({"clientID": client_id, "consumerDataSet": [consumer], "producerDataSet": []},
                          separators=(",", ":")).encode()

    @property
    def client_id(self) -> str:
        return self.client.client_id

    # -- queues and addresses ------------------------------------------------------------------
    async def queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of topic on every broker (fetchSubscribeMessageQueues);
        MQClientError TOPIC_NOT_EXIST from the NameServer for a topic no broker has."""
        self.client.check_open("the consumer")
        if not isinstance(topic, str):
            raise ValueError(f"topic must be a str, not {type(topic).__name__}")
        return (await self.client.route(topic)).subscribe_queues(topic)

    async def _address(self, mq: MessageQueue, broker_id: int | None) -> str:
        """The address of mq's broker with broker_id (else its lowest id present), from the
        topic's route."""
        self.client.check_open("the consumer")
        _check_mq(mq)
        try:
            await self.client.route(mq.topic)  # cached; refreshed every route_ttl, with the brokers' addresses
        except MQClientError:
            if self.client.broker_address(mq.broker_name, None) is None:
                raise
            # a topic the NameServers do not know: its broker, known from another route, says why
        addr = self.client.broker_address(mq.broker_name, broker_id)
        if addr is None and broker_id is not None:
            addr = self.client.broker_address(mq.broker_name, None)
        if addr is None:
            raise RouteError(f"no address of broker {mq.broker_name} is known for topic {mq.topic}")
        return addr

    # -- pull ----------------------------------------------------------------------------------
    async def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, expression: str = "*",
                   suspend_ms: int = 0, timeout: float | None = None) -> PullResult:
        """PULL_MESSAGE from mq at offset: up to max_nums messages whose tag the expression
        matches ("*", or "TagA || TagB"). With suspend_ms > 0 the broker holds a pull that finds
        nothing until a message arrives or suspend_ms passes (long polling; the broker caps it),
        and this call waits that much longer than timeout for its answer."""
        _check_mq(mq)
        _check_offset("offset", offset)
        if type(max_nums) is not int or max_nums <= 0:
            raise ValueError(f"max_nums must be a positive int, not {max_nums!r}")
        _check_offset("suspend_ms", suspend_ms)
        tags = parse_expression(expression)
        sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms > 0 else 0)
        fields = {"consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id),
                  "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag),
                  "commitOffset": "0", "suspendTimeoutMillis": str(suspend_ms), "subscription": expression.strip() or "*",
                  "subVersion": "0", "expressionType": "TAG"}
        addr = await self._address(mq, self._suggested.get(mq, 0))
        wait = (self.client.timeout if timeout is None else timeout) + suspend_ms / 1000
        response = await self.client.invoke(addr, RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=fields), wait)
        status = _PULL_STATUS.get(response.code)
        if status is None:
            raise MQClientError(response.code, response.remark, address=addr, request=RequestCode.PULL_MESSAGE)
        code = RequestCode.PULL_MESSAGE
        suggest = response_int(response, "suggestWhichBrokerId", addr, code)
        self._suggested[mq] = suggest
        messages: list[MessageExt] = []
        if status is PullStatus.FOUND:
            if not response.body:
                raise ProtocolError(f"the pull response from {addr} says FOUND and has no body")
            messages = decode_messages(response.body, broker_name=mq.broker_name, address=addr)
            if tags is not None:  # the broker filters by tag hash code; the client by the tag itself
                messages = [m for m in messages if m.tags in tags]
        return PullResult(status, response_int(response, "nextBeginOffset", addr, code),
                          response_int(response, "minOffset", addr, code),
                          response_int(response, "maxOffset", addr, code), messages, suggest)

    # -- offsets -------------------------------------------------------------------------------
    async def fetch_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of mq on the broker (QUERY_CONSUMER_OFFSET); -1 when the
        broker has none (QUERY_NOT_FOUND)."""
        addr = await self._address(mq, None)
        response = await self.client.call(addr, RequestCode.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id)},
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        return response_int(response, "offset", addr, RequestCode.QUERY_CONSUMER_OFFSET)

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        """Store offset as the group's offset of mq on the broker (UPDATE_CONSUMER_OFFSET)."""
        _check_offset("offset", offset)
        addr = await self._address(mq, None)
        await self.client.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": self.group, "topic": mq.topic, "queueId": str(mq.queue_id), "commitOffset": str(offset)})

    async def _queue_value(self, mq: MessageQueue, code: int, name: str, extra: dict[str, str] | None = None) -> int:
        addr = await self._address(mq, 0)
        fields = {"topic": mq.topic, "queueId": str(mq.queue_id), **(extra or {})}
        return response_int(await self.client.call(addr, code, fields), name, addr, code)

    async def max_offset(self, mq: MessageQueue) -> int:
        """The offset the next message of mq will get (GET_MAX_OFFSET)."""
        return await self._queue_value(mq, RequestCode.GET_MAX_OFFSET, "offset")

    async def min_offset(self, mq: MessageQueue) -> int:
        """The offset of the oldest message mq still has (GET_MIN_OFFSET)."""
        return await self._queue_value(mq, RequestCode.GET_MIN_OFFSET, "offset")

    async def search_offset(self, mq: MessageQueue, timestamp: int) -> int:
        """The offset of the first message of mq stored at or after timestamp (ms since the
        epoch; SEARCH_OFFSET_BY_TIMESTAMP)."""
        _check_offset("timestamp", timestamp)
        return await self._queue_value(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, "offset",
                                       {"timestamp": str(timestamp)})

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        """When the oldest message of mq was stored, ms since the epoch (GET_EARLIEST_MSG_STORETIME)."""
        return await self._queue_value(mq, RequestCode.GET_EARLIEST_MSG_STORETIME, "timestamp")

    # -- group ---------------------------------------------------------------------------------
    async def send_back(self, msg: MessageExt, delay_level: int = 0) -> None:
        """Give a message the group failed to consume back to the broker (CONSUMER_SEND_MSG_BACK):
        it comes again in %RETRY%<group> after delay_level (0: 3 + its reconsume times), or goes
        to %DLQ%<group> once consumed max_reconsume_times times (or with delay_level < 0)."""
        if not isinstance(msg, MessageExt):
            raise ValueError(f"msg must be a MessageExt (from pull()), not {type(msg).__name__}")
        if type(delay_level) is not int:
            raise ValueError(f"delay_level must be an int, not {delay_level!r}")
        self.client.check_open("the consumer")
        addr = None
        if msg.broker_name:
            addr = self.client.broker_address(msg.broker_name, 0)
        if addr is None:  # the broker that stored it (sendMessageBack without a broker name)
            host, port = msg.store_host
            addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        await self.client.call(addr, RequestCode.CONSUMER_SEND_MSG_BACK, {
            "group": self.group, "offset": str(msg.commit_log_offset), "delayLevel": str(delay_level),
            "originMsgId": msg.msg_id, "originTopic": msg.topic, "unitMode": "false",
            "maxReconsumeTimes": str(self.max_reconsume_times)})

    async def consumer_ids(self, topic: str) -> list[str]:
        """The client ids of the group's consumers a broker of topic knows (GET_CONSUMER_LIST_BY_GROUP)."""
        self.client.check_open("the consumer")
        if not isinstance(topic, str):
            raise ValueError(f"topic must be a str, not {type(topic).__name__}")
        route = await self.client.route(topic)
        brokers = sorted(route.broker_datas, key=lambda b: (b.master is None, b.broker_name))
        addr = next((b.master or b.lowest() for b in brokers if b.addrs), None)
        if addr is None:
            raise RouteError(f"the route of {topic} names no broker address")
        response = await self.client.call(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group})
        try:
            ids = json.loads(response.body.decode("utf-8"))["consumerIdList"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"the consumer list from {addr} is not {{\"consumerIdList\": [...]}}: {exc}") from None
        if type(ids) is not list or any(type(i) is not str for i in ids):
            raise ProtocolError(f"the consumer list from {addr} is not a list of ids: {ids!r}")
        return ids
