"""Messages going out and coming back, and the results of sends and pulls
(docs/rocketmq-remoting-spec.md §2.4.1, §2.4.2, §2.6).

``Message`` is what a producer sends (RocketMQ's Message); ``MessageExt`` is what a pull returns,
decoded from the CommitLog records of the response body by the compiled client kernel
(``mqstore.client._client``: the record checks of the record codec, the costly fields made on first
access; its pure-Python twin is ``mqstore.client._twin``); message ids are made like RocketMQ's
MessageClientIDSetter, by the same kernel's ``UniqIdGenerator`` (twin:
``mqstore.client._twin.UniqIdGenerator``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mqstore.client._client import MessageExt, UniqIdGenerator
from mqstore.client._client import decode_messages as _decode_messages
from mqstore.client._client import encode_properties as _encode_properties
from mqstore.client.errors import MessageDecodeError
from mqstore.client.protocol import SYSTEM_PROPERTIES
from mqstore.client.route import MessageQueue

__all__ = ["Message", "MessageExt", "PullResult", "PullStatus", "SendResult", "SendStatus", "UniqIdGenerator",
           "decode_messages"]

#: the largest body RocketMQ's client accepts (DefaultMQProducer.maxMessageSize, 4 MiB)
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
_SEPARATORS = ("\x01", "\x02")


def _check_text(what: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, not {type(value).__name__}")
    if not value and not allow_empty:
        raise ValueError(f"{what} is empty")
    for sep in _SEPARATORS:
        if sep in value:
            raise ValueError(f"{what} {value!r} contains {sep!r}, a separator of the properties string")
    return value


def _keys_text(keys: str | Iterable[str] | None) -> str | None:
    """KEYS: one key, or several joined by a space (MessageConst.KEY_SEPARATOR)."""
    if keys is None:
        return None
    if isinstance(keys, str):
        return _check_text("keys", keys)
    items = [_check_text("a key", k) for k in keys]
    for k in items:
        if " " in k:
            raise ValueError(f"key {k!r} contains a space, the separator of KEYS")
    if not items:
        raise ValueError("keys is an empty list")
    return " ".join(items)


@dataclass
class Message:
    """A message to send: body, tags (one tag; what consumers filter on), keys (indexed: one str,
    or a list), user properties (names RocketMQ reserves, e.g. TAGS or UNIQ_KEY, are refused),
    flag (stored as is) and delay_level (> 0: delivered after that delay level of the broker's
    ``messageDelayLevel``)."""

    body: bytes
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: Mapping[str, str] | None = None
    flag: int = 0
    delay_level: int = 0

    def validated_body(self) -> bytes:
        body = self.body
        if isinstance(body, (bytearray, memoryview)):
            body = bytes(body)
        if not isinstance(body, bytes):
            raise ValueError(f"a message body must be bytes, not {type(body).__name__}")
        if not body:
            raise ValueError("the message body length is zero")
        if len(body) > MAX_MESSAGE_SIZE:
            raise ValueError(f"the message body size over max value, MAX: {MAX_MESSAGE_SIZE}, got {len(body)}")
        return body

    def property_map(self, uniq_key: str | None) -> dict[str, str]:
        """Every property the message carries on the wire: the user's, TAGS, KEYS, DELAY and
        UNIQ_KEY; ValueError naming a bad one (checked here, once per send). A message with no
        user properties whose tags and keys are plain strs takes the short way."""
        props: dict[str, str] = {}
        user = self.properties
        if user:
            for name, value in user.items():
                _check_text("a property name", name)
                _check_text(f"property {name!r}", value, allow_empty=False)
                if name in SYSTEM_PROPERTIES:
                    raise ValueError(f"the property {name!r} is used by the system; give tags, keys and "
                                     "delay_level as their own arguments")
                props[name] = value
        tags = self.tags
        if tags is not None:
            if type(tags) is str and tags and "\x01" not in tags and "\x02" not in tags:
                props["TAGS"] = tags
            else:
                props["TAGS"] = _check_text("tags", tags)
        keys = self.keys
        if keys is not None:
            if type(keys) is str and keys and "\x01" not in keys and "\x02" not in keys:
                props["KEYS"] = keys
            else:
                text = _keys_text(keys)
                if text is not None:
                    props["KEYS"] = text
        flag = self.flag
        if type(flag) is not int or not -2**31 <= flag < 2**31:
            raise ValueError(f"flag must be an int32, not {flag!r}")
        delay = self.delay_level
        if type(delay) is not int or delay < 0:
            raise ValueError(f"delay_level must be an int >= 0, not {delay!r}")
        if delay:
            props["DELAY"] = str(delay)
        if uniq_key is not None:
            props["UNIQ_KEY"] = uniq_key
        return props


def encode_properties(props: Mapping[str, str]) -> str:
    """MessageDecoder.messageProperties2String, in Java HashMap order (spec §1.4): what
    mqstore.log._codec.properties_to_string gives, each set of names' order computed once."""
    return _encode_properties(props)


class SendStatus(enum.Enum):
    """How a send ended: stored (SEND_OK), or stored without the durability asked for."""

    SEND_OK = 0
    FLUSH_DISK_TIMEOUT = 10
    FLUSH_SLAVE_TIMEOUT = 12
    SLAVE_NOT_AVAILABLE = 11


@dataclass(frozen=True)
class SendResult:
    """A send's outcome: ``msg_id`` is the UNIQ_KEY the client gave the message (comma-joined
    for a batch), ``offset_msg_id`` the broker's offset message id (store host + CommitLog
    offset), ``queue_offset`` the (first) message's offset in its queue."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    broker_name: str
    offset_msg_id: str
    topic: str = ""

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


_new_object = object.__new__


def new_send_result(status: SendStatus, msg_id: str, queue_id: int, queue_offset: int, broker_name: str,
                    offset_msg_id: str, topic: str) -> SendResult:
    """SendResult(status, msg_id, ...) made without the frozen dataclass's __init__ (one
    object.__setattr__ per field): the fields go straight into the instance's __dict__. A
    send's result is made once per send; the object is the same (tests/test_client_ids.py)."""
    result = _new_object(SendResult)
    fields = result.__dict__
    fields["status"] = status
    fields["msg_id"] = msg_id
    fields["queue_id"] = queue_id
    fields["queue_offset"] = queue_offset
    fields["broker_name"] = broker_name
    fields["offset_msg_id"] = offset_msg_id
    fields["topic"] = topic
    return result


class PullStatus(enum.Enum):
    """A pull's outcome (RocketMQ's PullStatus) by response code (§2.4.2)."""

    FOUND = 0  # SUCCESS
    NO_NEW_MSG = 19  # PULL_NOT_FOUND: the offset is the queue's end
    NO_MATCHED_MSG = 20  # PULL_RETRY_IMMEDIATELY: entries scanned, none matched the expression
    OFFSET_ILLEGAL = 21  # PULL_OFFSET_MOVED: the offset is outside the queue; use next_begin_offset


@dataclass(frozen=True)
class PullResult:
    """A pull's outcome: status, where to pull next (``next_begin_offset``), the queue's bounds
    when the broker answered, and the messages (FOUND only; after the client's own tag check, so
    FOUND may come with none when tags collided by hash)."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0


def decode_messages(body: bytes, *, broker_name: str = "", address: str = "") -> list[MessageExt]:
    """The messages of a pull response body: whole CommitLog records back to back (§2.4.2, §2.6),
    compressed bodies (sys flag bit 0) inflated. MessageDecodeError naming the offset and the
    problem when the body holds anything else."""
    try:
        return _decode_messages(body, broker_name=broker_name, address=address)
    except ValueError as exc:
        raise MessageDecodeError(str(exc)) from None
