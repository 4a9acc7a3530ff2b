"""What the two producers share (docs/rocketmq-remoting-spec.md §2.4.1): the asyncio ``Producer``
(mqstore.client.producer) and the blocking ``SyncProducer`` (mqstore.client.sync) differ only in
how a request reaches the broker; everything around it is here, with no I/O: the checks of
their arguments, the message's properties and body as sent, the send header, the batch body,
the queue a send goes to, and the SendResult of a response.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import zlib
from collections.abc import Iterable, Mapping

from mqstore.client._client import batch_entries as _batch_entries
from mqstore.client._client import encode_batch as _encode_batch
from mqstore.remoting._remoting import RemotingCommand
from mqstore.client.errors import MQClientError, ProtocolError, RouteError
from mqstore.client.instance import check_group, response_int
from mqstore.client.message import (MAX_MESSAGE_SIZE, Message, SendResult, SendStatus, encode_properties,
                                    new_send_result)
from mqstore.client.protocol import COMPRESSED_FLAG, DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS, RequestCode, ResponseCode
from mqstore.client.route import MessageQueue, TopicRoute

__all__ = ["BatchItem", "QueuePicker", "SEND_CODES", "V2_NAMES", "batch_body", "batch_entries", "check_topic",
           "heartbeat_body", "prepare_message", "producer_options", "send_header", "send_properties", "send_result"]

#: SendMessageRequestHeaderV2's one-letter names of SendMessageRequestHeader's fields (§2.4.1)
V2_NAMES = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d", "queueId": "e",
            "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i", "reconsumeTimes": "j",
            "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m"}
_SEND_STATUS: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK, ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE}
SEND_CODES = {"SEND_MESSAGE_V2": RequestCode.SEND_MESSAGE_V2, "SEND_MESSAGE": RequestCode.SEND_MESSAGE}
_QUEUE_NUMS = str(DEFAULT_TOPIC_QUEUE_NUMS)

#: an item of send_batch: a body, (body, user properties), or a Message
BatchItem = bytes | tuple[bytes, Mapping[str, str]] | Message


def producer_options(group: object, send_code: str, compress_over: int | None) -> tuple[str, int, int | None]:
    """A producer's group, send request code and compression threshold, checked; ValueError
    naming a bad one."""
    group = check_group(group, "DEFAULT_PRODUCER")
    if send_code not in SEND_CODES:
        raise ValueError(f"send_code must be 'SEND_MESSAGE_V2' or 'SEND_MESSAGE', not {send_code!r}")
    if compress_over is not None and (type(compress_over) is not int or compress_over <= 0):
        raise ValueError(f"compress_over must be a positive int or None, not {compress_over!r}")
    return group, SEND_CODES[send_code], compress_over


def heartbeat_body(group: str, client_id: str) -> bytes:
    """The HEART_BEAT body of a producer of group (HeartbeatData with one ProducerData)."""
    return json.dumps({"clientID": client_id, "consumerDataSet": [], "producerDataSet": [{"groupName": group}]},
                      separators=(",", ":")).encode()


def check_topic(topic: object) -> None:
    """The type only: the broker checks the name (and answers why it refuses one)."""
    if not isinstance(topic, str):
        raise ValueError(f"topic must be a str, not {type(topic).__name__}")


# -- one message --------------------------------------------------------------------------------
def prepare_message(msg: Message, compress_over: int | None) -> tuple[bytes, dict[str, str], int]:
    """(body as sent, properties without UNIQ_KEY, sys flag) of a message to send, every argument
    checked (ValueError): done before anything is sent. A body of at least compress_over bytes is
    zlib-compressed (sys flag bit 0)."""
    body = msg.validated_body()
    props = msg.property_map(None)
    if compress_over is not None and len(body) >= compress_over:
        return zlib.compress(body, 5), props, COMPRESSED_FLAG
    return body, props, 0


# the properties string of a message with no properties of its own, around its UNIQ_KEY
_PLAIN_HEAD, _, _PLAIN_TAIL = encode_properties({"UNIQ_KEY": "\x00", "WAIT": "true"}).partition("\x00")


def send_properties(props: dict[str, str], uniq: str) -> str:
    """The properties string of a send: prepare_message's properties with UNIQ_KEY and WAIT=true
    (the producer waits for the store), in Java HashMap order. props is changed."""
    if not props:
        return _PLAIN_HEAD + uniq + _PLAIN_TAIL
    props["UNIQ_KEY"] = uniq
    props["WAIT"] = "true"
    return encode_properties(props)


def send_header(group: str, topic: str, queue_id: int, props: str, *, sys_flag: int = 0, flag: int = 0,
                batch: bool = False, v2: bool = True) -> dict[str, str]:
    """The extFields of SEND_MESSAGE (SendMessageRequestHeader) or, with v2 or for a batch, of
    SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (SendMessageRequestHeaderV2's one-letter names)."""
    born = str(time.time_ns() // 1_000_000)
    if v2 or batch:
        return {"a": group, "b": topic, "c": DEFAULT_TOPIC, "d": _QUEUE_NUMS, "e": str(queue_id), "f": str(sys_flag),
                "g": born, "h": str(flag), "i": props, "j": "0", "k": "false", "m": "true" if batch else "false"}
    return {"producerGroup": group, "topic": topic, "defaultTopic": DEFAULT_TOPIC, "defaultTopicQueueNums": _QUEUE_NUMS,
            "queueId": str(queue_id), "sysFlag": str(sys_flag), "bornTimestamp": born, "flag": str(flag),
            "properties": props, "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}


# -- batches ------------------------------------------------------------------------------------
def batch_message(item: object, i: int) -> Message:
    if isinstance(item, Message):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Message(bytes(item))
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
        return Message(item[0], properties=item[1])
    raise ValueError(f"batch item {i} must be bytes, (body, properties) or a Message, not {type(item).__name__}")


def _batch_entry(item: object, i: int) -> tuple[bytes, dict[str, str] | None, int]:
    msg = batch_message(item, i)
    if msg.delay_level:
        raise ValueError(f"batch message {i}: delay_level is not supported for batching")
    body = msg.validated_body()
    props = msg.property_map(None)
    return body, props or None, msg.flag


def batch_entries(messages: Iterable[BatchItem]) -> list[bytes | tuple[bytes, dict[str, str] | None, int]]:
    """The messages of a batch, every one checked (ValueError naming its index): a plain body
    stays as it is (checked in C), anything else becomes (body, properties, flag)."""
    entries: list[bytes | tuple[bytes, dict[str, str] | None, int]] = _batch_entries(messages, _batch_entry,
                                                                                     MAX_MESSAGE_SIZE)
    if not entries:
        raise ValueError("a batch needs at least one message")
    return entries


def batch_body(entries: list[bytes | tuple[bytes, dict[str, str] | None, int]], ids: list[str]) -> bytes:
    """The SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages), message i with UNIQ_KEY ids[i];
    ValueError when it is larger than a message may be."""
    body: bytes = _encode_batch(entries, ids)
    if len(body) > MAX_MESSAGE_SIZE:
        raise ValueError(f"the batch body size over max value, MAX: {MAX_MESSAGE_SIZE}, got {len(body)}")
    return body


#: the properties of a SEND_BATCH_MESSAGE request itself
BATCH_PROPERTIES = encode_properties({"WAIT": "true"})


# -- queues ---------------------------------------------------------------------------------------
class QueuePicker:
    """The queue a send goes to: round robin over a topic's publish queues (one counter per topic,
    starting at a random place), or the one queue_id and broker_name name. Safe to share between
    threads (a counter's next() and the dicts' reads and writes are atomic)."""

    def __init__(self) -> None:
        self._round_robin: dict[str, itertools.count[int]] = {}
        # topic -> (the route, its publish queues, the master address of each queue's broker)
        self._publish: dict[str, tuple[TopicRoute, list[MessageQueue], list[str | None]]] = {}

    def _publish_of(self, topic: str, route: TopicRoute) -> tuple[TopicRoute, list[MessageQueue], list[str | None]]:
        """Computed once per route fetched, not per send."""
        cached = self._publish.get(topic)
        if cached is None or cached[0] is not route:
            queues = route.publish_queues(topic)
            masters = {b.broker_name: b.master for b in route.broker_datas}
            cached = self._publish[topic] = (route, queues, [masters.get(q.broker_name) for q in queues])
        return cached

    def queues(self, topic: str, route: TopicRoute) -> list[MessageQueue]:
        """route.publish_queues(topic)."""
        return self._publish_of(topic, route)[1]

    def pick(self, topic: str, route: TopicRoute, queue_id: int | None,
             broker_name: str | None) -> tuple[MessageQueue, str]:
        """The queue and its broker's master address; RouteError when there is none, ValueError
        when queue_id / broker_name name no write queue of the topic."""
        cached = self._publish.get(topic)
        if cached is None or cached[0] is not route:
            cached = self._publish_of(topic, route)
        queues, addrs = cached[1], cached[2]
        if not queues:
            raise RouteError(f"no writable queue of topic {topic} has a master broker")
        if queue_id is not None or broker_name is not None:
            if queue_id is not None and (type(queue_id) is not int or queue_id < 0):
                raise ValueError(f"queue_id must be an int >= 0, not {queue_id!r}")
            fit = [i for i, q in enumerate(queues) if (queue_id is None or q.queue_id == queue_id)
                   and (broker_name is None or q.broker_name == broker_name)]
            if not fit:
                have = ", ".join(f"{q.broker_name}:{q.queue_id}" for q in queues)
                raise ValueError(f"topic {topic} has no write queue {broker_name or '*'}:"
                                 f"{'*' if queue_id is None else queue_id}; its write queues are {have}")
            queues, addrs = [queues[i] for i in fit], [addrs[i] for i in fit]
        counter = self._round_robin.get(topic)
        if counter is None:
            counter = self._round_robin.setdefault(topic, itertools.count(random.randrange(1 << 16)))
        i = next(counter) % len(queues)
        mq, addr = queues[i], addrs[i]
        if addr is None:
            raise RouteError(f"broker {mq.broker_name} of topic {topic} has no master address")
        return mq, addr


# -- responses ----------------------------------------------------------------------------------
def send_result(response: RemotingCommand, topic: str, mq: MessageQueue, msg_id: str, addr: str,
                request: int) -> SendResult:
    """processSendResponse: SUCCESS and the three stored-but codes give a SendResult, any other
    code MQClientError."""
    status = _SEND_STATUS.get(response.code)
    if status is None:
        raise MQClientError(response.code, response.remark, address=addr, request=request)
    fields = response.ext_fields
    offset_id = fields.get("msgId")
    if offset_id is None:
        raise ProtocolError(f"the send response from {addr} has no msgId")
    try:
        queue_id, queue_offset = int(fields["queueId"]), int(fields["queueOffset"])
    except (KeyError, TypeError, ValueError):
        queue_id = response_int(response, "queueId", addr, request)
        queue_offset = response_int(response, "queueOffset", addr, request)
    return new_send_result(status, msg_id, queue_id, queue_offset, mq.broker_name, offset_id, topic)
