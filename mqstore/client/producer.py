"""The producer (RocketMQ's DefaultMQProducer, asyncio; docs/rocketmq-remoting-spec.md §2.4.1,
§2.5.1): sends one message (SEND_MESSAGE_V2, or SEND_MESSAGE), a batch (SEND_BATCH_MESSAGE) or a
oneway message to a queue picked round robin over every broker's write queues, and heartbeats
its group to the brokers.

    producer = Producer("PG", namesrv="127.0.0.1:9876")
    await producer.start()
    result = await producer.send("TopicTest", b"hello", tags="TagA", keys="k1")
    await producer.close()
"""

from __future__ import annotations

import itertools
import json
import random
import time
import zlib
from collections.abc import Iterable, Mapping
from types import TracebackType

from mqstore._codec import encode_batch_body
from mqstore._remoting import RemotingCommand
from mqstore.client.errors import MQClientError, ProtocolError, RouteError
from mqstore.client.instance import ClientInstance, check_group, response_int
from mqstore.client.message import MAX_MESSAGE_SIZE, Message, SendResult, SendStatus, encode_properties
from mqstore.client.protocol import (COMPRESSED_FLAG, DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS, VERSION, RequestCode,
                                     ResponseCode)
from mqstore.client.route import MessageQueue, TopicRoute

__all__ = ["BatchItem", "Producer"]

#: SendMessageRequestHeaderV2's one-letter names of SendMessageRequestHeader's fields (§2.4.1)
V2_NAMES = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d", "queueId": "e",
            "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i", "reconsumeTimes": "j",
            "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m"}
_SEND_STATUS: dict[int, SendStatus] = {ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
                ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
                ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
_SEND_CODES = {"SEND_MESSAGE_V2": RequestCode.SEND_MESSAGE_V2, "SEND_MESSAGE": RequestCode.SEND_MESSAGE}

#: an item of send_batch: a body, (body, user properties), or a Message
BatchItem = bytes | tuple[bytes, Mapping[str, str]] | Message


class Producer:
    """A producer of group ``group`` over the NameServers ``namesrv`` ("host:port;host:port").

    serialize: the header serialization of its requests, "JSON" or "ROCKETMQ".
    send_code: "SEND_MESSAGE_V2" (the Java client's, one-letter header names) or "SEND_MESSAGE".
    timeout: seconds a request waits for its response (3, as RocketMQ's sendMsgTimeout).
    compress_over: bodies of at least this many bytes are sent zlib-compressed (sys flag bit 0),
    as RocketMQ's compressMsgBodyOverHowmuch; None (the default) sends every body as it is.
    heartbeat_interval, route_ttl: seconds between heartbeats, and how long a route is cached.
    """

    def __init__(self, group: str, namesrv: str, *, serialize: str = "JSON", send_code: str = "SEND_MESSAGE_V2",
                 timeout: float = 3.0, compress_over: int | None = None, heartbeat_interval: float = 30.0,
                 route_ttl: float = 30.0) -> None:
        self.group = check_group(group, "DEFAULT_PRODUCER")
        if send_code not in _SEND_CODES:
            raise ValueError(f"send_code must be 'SEND_MESSAGE_V2' or 'SEND_MESSAGE', not {send_code!r}")
        self.send_code = _SEND_CODES[send_code]
        if compress_over is not None and (type(compress_over) is not int or compress_over <= 0):
            raise ValueError(f"compress_over must be a positive int or None, not {compress_over!r}")
        self.compress_over = compress_over
        self.client = ClientInstance(namesrv, serialize=serialize, timeout=timeout,
                                     heartbeat_interval=heartbeat_interval, route_ttl=route_ttl, version=VERSION,
                                     heartbeat_body=self._heartbeat_body,
                                     unregister_fields={"producerGroup": self.group})
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._publish_queues: dict[str, tuple[TopicRoute, list[MessageQueue]]] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> Producer:
        """Start the heartbeat timer; nothing is sent until a topic is used (its route names the brokers)."""
        self.client.start()
        return self

    async def close(self) -> None:
        """UNREGISTER_CLIENT to every broker this producer heartbeated, then the connections close."""
        await self.client.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def heartbeat(self) -> None:
        """HEART_BEAT to every known broker now (it also runs every heartbeat_interval)."""
        self.client.check_open("the producer")
        await self.client.heartbeat()

    def _heartbeat_body(self, client_id: str) -> bytes:
        return json.dumps({"clientID": client_id, "consumerDataSet": [],
                           "producerDataSet": [{"groupName": self.group}]}, separators=(",", ":")).encode()

    @property
    def client_id(self) -> str:
        return self.client.client_id

    # -- queues --------------------------------------------------------------------------------
    async def queues(self, topic: str) -> list[MessageQueue]:
        """The queues a send to topic may go to (every broker's write queues)."""
        self.client.check_open("the producer")
        _check_topic(topic)
        return (await self.client.route(topic, publish=True)).publish_queues(topic)

    async def _pick(self, topic: str, queue_id: int | None, broker_name: str | None) -> tuple[MessageQueue, str]:
        """The queue (round robin unless queue_id says) and its broker's master address."""
        route = await self.client.route(topic, publish=True)
        cached = self._publish_queues.get(topic)
        if cached is not None and cached[0] is route:
            queues = cached[1]
        else:  # computed once per route the client fetched, not per send
            queues = route.publish_queues(topic)
            self._publish_queues[topic] = (route, queues)
        if not queues:
            raise RouteError(f"no writable queue of topic {topic} has a master broker")
        if queue_id is not None or broker_name is not None:
            if queue_id is not None and (type(queue_id) is not int or queue_id < 0):
                raise ValueError(f"queue_id must be an int >= 0, not {queue_id!r}")
            fit = [q for q in queues if (queue_id is None or q.queue_id == queue_id)
                   and (broker_name is None or q.broker_name == broker_name)]
            if not fit:
                have = ", ".join(f"{q.broker_name}:{q.queue_id}" for q in queues)
                raise ValueError(f"topic {topic} has no write queue {broker_name or '*'}:"
                                 f"{'*' if queue_id is None else queue_id}; its write queues are {have}")
            queues = fit
        counter = self._round_robin.get(topic)
        if counter is None:
            counter = self._round_robin[topic] = itertools.count(random.randrange(1 << 16))
        mq = queues[next(counter) % len(queues)]
        broker = route.broker(mq.broker_name)
        addr = broker.master if broker is not None else None
        if addr is None:
            raise RouteError(f"broker {mq.broker_name} of topic {topic} has no master address")
        return mq, addr

    # -- sends ---------------------------------------------------------------------------------
    def _header(self, topic: str, mq: MessageQueue, props: str, *, sys_flag: int = 0, flag: int = 0,
                batch: bool = False) -> dict[str, str]:
        fields = {"producerGroup": self.group, "topic": topic, "defaultTopic": DEFAULT_TOPIC,
                  "defaultTopicQueueNums": str(DEFAULT_TOPIC_QUEUE_NUMS), "queueId": str(mq.queue_id),
                  "sysFlag": str(sys_flag), "bornTimestamp": str(time.time_ns() // 1_000_000), "flag": str(flag),
                  "properties": props, "reconsumeTimes": "0", "unitMode": "false", "batch": str(batch).lower()}
        if batch or self.send_code == RequestCode.SEND_MESSAGE_V2:
            return {V2_NAMES[k]: v for k, v in fields.items()}
        return fields

    async def _prepare(self, topic: str, msg: Message, queue_id: int | None,
                       broker_name: str | None) -> tuple[RemotingCommand, MessageQueue, str, str]:
        self.client.check_open("the producer")
        _check_topic(topic)
        body = msg.validated_body()
        msg.property_map(None)  # bad properties are refused before anything is sent
        mq, addr = await self._pick(topic, queue_id, broker_name)
        uniq = self.client.new_msg_id()
        props = msg.property_map(uniq)
        props["WAIT"] = "true"
        sys_flag = 0
        if self.compress_over is not None and len(body) >= self.compress_over:
            body, sys_flag = zlib.compress(body, 5), COMPRESSED_FLAG
        cmd = RemotingCommand(self.send_code, ext_fields=self._header(topic, mq, encode_properties(props),
                                                                        sys_flag=sys_flag, flag=msg.flag), body=body)
        return cmd, mq, addr, uniq

    async def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | list[str] | None = None,
                   properties: Mapping[str, str] | None = None, queue_id: int | None = None,
                   broker_name: str | None = None, flag: int = 0, delay_level: int = 0,
                   timeout: float | None = None) -> SendResult:
        """Send one message and wait for the broker's answer. The queue is picked round robin over
        every broker's write queues unless queue_id (and broker_name) name one. MQClientError for
        an error response (its code and remark), RemotingTimeoutError, ConnectionClosedError."""
        return await self.send_message(topic, Message(body, tags, keys, properties, flag, delay_level),
                                       queue_id=queue_id, broker_name=broker_name, timeout=timeout)

    async def send_message(self, topic: str, message: Message, *, queue_id: int | None = None,
                           broker_name: str | None = None, timeout: float | None = None) -> SendResult:
        """send() for a Message."""
        cmd, mq, addr, uniq = await self._prepare(topic, message, queue_id, broker_name)
        response = await self.client.invoke(addr, cmd, timeout)
        return _send_result(response, topic, mq, uniq, addr, cmd.code)

    async def send_oneway(self, topic: str, body: bytes, *, tags: str | None = None,
                          keys: str | list[str] | None = None, properties: Mapping[str, str] | None = None,
                          queue_id: int | None = None, broker_name: str | None = None, flag: int = 0,
                          delay_level: int = 0) -> str:
        """Send one message with the oneway flag: no response is awaited (and the broker sends
        none), so nothing says whether it was stored. Returns the message's id (UNIQ_KEY)."""
        cmd, _mq, addr, uniq = await self._prepare(topic, Message(body, tags, keys, properties, flag, delay_level),
                                                   queue_id, broker_name)
        conn = await self.client.connection(addr)
        await conn.oneway(cmd)
        return uniq

    async def send_batch(self, topic: str, messages: Iterable[BatchItem], *, queue_id: int | None = None,
                         broker_name: str | None = None, timeout: float | None = None) -> SendResult:
        """Send messages as one batch (SEND_BATCH_MESSAGE; the body is MessageDecoder.encodeMessages,
        spec §2.4.1): all go to one queue, with consecutive queue offsets. Items are bodies,
        (body, user properties) pairs or Messages (for tags, keys, flag). SendResult.msg_id is
        the messages' ids comma-joined, offset_msg_id the broker's offset ids."""
        self.client.check_open("the producer")
        _check_topic(topic)
        msgs = [_batch_message(item, i) for i, item in enumerate(messages)]
        if not msgs:
            raise ValueError("a batch needs at least one message")
        for i, m in enumerate(msgs):
            if m.delay_level:
                raise ValueError(f"batch message {i}: delay_level is not supported for batching")
            m.validated_body()
            m.property_map(None)
        mq, addr = await self._pick(topic, queue_id, broker_name)
        ids = [self.client.new_msg_id() for _ in msgs]
        body = encode_batch_body([(m.validated_body(), m.property_map(u), m.flag) for m, u in zip(msgs, ids)])
        if len(body) > MAX_MESSAGE_SIZE:
            raise ValueError(f"the batch body size over max value, MAX: {MAX_MESSAGE_SIZE}, got {len(body)}")
        cmd = RemotingCommand(RequestCode.SEND_BATCH_MESSAGE,
                              ext_fields=self._header(topic, mq, encode_properties({"WAIT": "true"}), batch=True),
                              body=body)
        response = await self.client.invoke(addr, cmd, timeout)
        return _send_result(response, topic, mq, ",".join(ids), addr, cmd.code)


def _check_topic(topic: object) -> None:
    """The type only: the broker checks the name (and answers why it refuses one)."""
    if not isinstance(topic, str):
        raise ValueError(f"topic must be a str, not {type(topic).__name__}")


def _batch_message(item: object, i: int) -> Message:
    if isinstance(item, Message):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Message(bytes(item))
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
        return Message(item[0], properties=item[1])
    raise ValueError(f"batch item {i} must be bytes, (body, properties) or a Message, not {type(item).__name__}")


def _send_result(response: RemotingCommand, topic: str, mq: MessageQueue, msg_id: str, addr: str,
                 request: int) -> SendResult:
    """processSendResponse: SUCCESS and the three stored-but codes give a SendResult, any other
    code MQClientError."""
    status = _SEND_STATUS.get(response.code)
    if status is None:
        raise MQClientError(response.code, response.remark, address=addr, request=request)
    offset_id = response.ext_fields.get("msgId")
    if offset_id is None:
        raise ProtocolError(f"the send response from {addr} has no msgId")
    return SendResult(status, msg_id, response_int(response, "queueId", addr, request),
                      response_int(response, "queueOffset", addr, request), mq.broker_name, offset_id, topic)
