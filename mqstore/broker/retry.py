"""Consumer send-back: the message a failed consumption puts back, to the group's retry topic (after
a delay) or to its dead-letter queue (docs/rocketmq-remoting-spec.md §2.4.9, §6).

The pure part of RocketMQ 4.9.7's ``SendMessageProcessor.asyncConsumerSendMsgBack`` (and
``MixAll.getRetryTopic`` / ``getDLQTopic``): from the stored record a CONSUMER_SEND_MSG_BACK names,
build the message to put and say where it goes. What stays with the request handler: the
subscription group's lookup, the broker's and the topic's permissions, creating the retry or DLQ
topic (``SendBack.queue_nums`` queues, perm R|W), looking the record up by its CommitLog offset, the
put, and the answer (SUCCESS, or SYSTEM_ERROR with the put status's name).
"""

from __future__ import annotations

import random as _random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqstore.log._message import Message

if TYPE_CHECKING:
    from mqstore.queue._reads import MessageView

__all__ = ["DLQ_GROUP_TOPIC_PREFIX", "DLQ_NUMS_PER_GROUP", "RETRY_GROUP_TOPIC_PREFIX", "SendBack",
           "dlq_topic", "max_reconsume_times", "retry_topic", "send_back_message"]

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
#: queues of a group's DLQ topic (AbstractSendMessageProcessor.DLQ_NUMS_PER_GROUP)
DLQ_NUMS_PER_GROUP = 1
#: the first request version whose maxReconsumeTimes header the broker honours (MQVersion V3_4_9)
V3_4_9 = 121
#: a subscription group's retryMaxTimes unless configured (SubscriptionGroupConfig)
DEFAULT_RETRY_MAX_TIMES = 16
#: the level of the first retry is this plus the reconsume times when the client asks for level 0
FIRST_RETRY_LEVEL = 3
#: ThreadLocalRandom.nextInt's bound in asyncConsumerSendMsgBack (the queue id is it modulo the queues)
_RANDOM_BOUND = 99_999_999
#: the longest topic RocketMQ accepts (TopicValidator.TOPIC_MAX_LENGTH)
_TOPIC_MAX_LENGTH = 127
_GROUP_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"


def _check_group(group: object) -> str:
    if type(group) is not str:
        raise ValueError(f"group must be a str, not {type(group).__name__}")
    if not _GROUP_CHARS.fullmatch(group):
        raise ValueError(f"group {group!r} is blank or has characters outside ^[%|a-zA-Z0-9_-]+$ "
                         "(its retry and DLQ topics would be refused)")
    if len(RETRY_GROUP_TOPIC_PREFIX + group) > _TOPIC_MAX_LENGTH:
        raise ValueError(f"group {group!r} is too long: its retry topic would be longer than "
                         f"{_TOPIC_MAX_LENGTH} characters")
    return group


def _check_int(name: str, value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    return value


def retry_topic(group: str) -> str:
    """The group's retry topic, ``%RETRY%<group>`` (MixAll.getRetryTopic)."""
    return RETRY_GROUP_TOPIC_PREFIX + _check_group(group)


def dlq_topic(group: str) -> str:
    """The group's dead-letter topic, ``%DLQ%<group>`` (MixAll.getDLQTopic)."""
    return DLQ_GROUP_TOPIC_PREFIX + _check_group(group)


def max_reconsume_times(retry_max_times: int, header_max_reconsume_times: int | None, request_version: int) -> int:
    """How many consumptions a message gets before its DLQ: the group's ``retryMaxTimes``, replaced
    by the request's ``maxReconsumeTimes`` only when the request's version is V3_4_9 (121) or later
    and it has one (the C++ client sends version 63 and no such field)."""
    _check_int("retry_max_times", retry_max_times)
    _check_int("request_version", request_version)
    if header_max_reconsume_times is not None and request_version >= V3_4_9:
        return _check_int("header_max_reconsume_times", header_max_reconsume_times)
    return retry_max_times


@dataclass(frozen=True)
class SendBack:
    """Where a sent-back message goes and the message to put there.

    ``queue_nums`` is how many queues its topic has when the handler creates it (the group's
    retryQueueNums, or 1 for the DLQ); ``delay_level`` is the DELAY the message carries (0 for the
    DLQ: the store puts it straight into the topic, any other level into SCHEDULE_TOPIC_XXXX)."""

    topic: str
    queue_id: int
    message: Message
    to_dlq: bool
    delay_level: int
    queue_nums: int


def send_back_message(view: MessageView, *, group: str, delay_level: int, max_reconsume_times: int,
                      retry_queue_nums: int, random: _random.Random | None = None) -> SendBack | None:
    """The message asyncConsumerSendMsgBack puts for a consumption of `view` (the record at the
    request's ``offset``, from ``store.look_message_by_offset``) that failed, and where it goes.

    None when ``retry_queue_nums`` <= 0: RocketMQ then answers SUCCESS and puts nothing (it checks
    this before it looks the record up). Otherwise, as 4.9.7 does:

    * the properties are the record's, with ``RETRY_TOPIC`` = the record's topic unless it has one,
      ``WAIT`` = false, ``DELAY`` = the level below and ``ORIGIN_MESSAGE_ID`` = the record's own
      ORIGIN_MESSAGE_ID when not blank, else its offset msgId (the record's, not the request's
      ``originMsgId``, which RocketMQ only hands to its consume hook);
    * to the DLQ ``%DLQ%<group>``, queue 0 of DLQ_NUMS_PER_GROUP, DELAY 0, when the record's
      reconsume times >= max_reconsume_times or delay_level < 0; otherwise to ``%RETRY%<group>``,
      a random queue of retry_queue_nums, with DELAY = delay_level, or 3 + reconsume times when
      delay_level is 0 (the store clamps a level above its highest);
    * body, flag, sys flag, born timestamp and born host are the record's; reconsume times + 1.

    ValueError naming the argument for a bad one."""
    _check_group(group)
    _check_int("delay_level", delay_level)
    _check_int("max_reconsume_times", max_reconsume_times)
    _check_int("retry_queue_nums", retry_queue_nums)
    if random is not None and not isinstance(random, _random.Random):
        raise ValueError(f"random must be a random.Random, not {type(random).__name__}")
    if retry_queue_nums <= 0:
        return None
    if view is None:
        raise ValueError("view is None: the record the request names was not found "
                         "(RocketMQ answers SYSTEM_ERROR 'look message by offset failed')")
    decode = getattr(view, "decode", None)
    if decode is None:
        raise ValueError(f"view must be a MessageView (store.look_message_by_offset), not {type(view).__name__}")
    rng = random if random is not None else _random.Random()
    record = decode(read_body=True)
    props = dict(record.properties)
    props.setdefault(PROPERTY_RETRY_TOPIC, record.topic)
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    to_dlq = record.reconsume_times >= max_reconsume_times or delay_level < 0
    if to_dlq:
        topic, queue_nums, level = dlq_topic(group), DLQ_NUMS_PER_GROUP, 0
    else:
        topic, queue_nums = retry_topic(group), retry_queue_nums
        level = delay_level if delay_level != 0 else FIRST_RETRY_LEVEL + record.reconsume_times
    queue_id = rng.randrange(_RANDOM_BOUND) % queue_nums
    props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    origin = props.get(PROPERTY_ORIGIN_MESSAGE_ID, "")
    if not origin.strip():
        props[PROPERTY_ORIGIN_MESSAGE_ID] = record.msg_id
    message = Message(topic, record.body or b"", queue_id=queue_id, flag=record.flag, properties=props,
                      born_timestamp=record.born_timestamp, born_host=record.born_host, sys_flag=record.sys_flag,
                      reconsume_times=record.reconsume_times + 1)
    return SendBack(topic, queue_id, message, to_dlq, level, queue_nums)
