"""Type stubs for the compiled ``mqstore.log._message`` (ext/mqstore/log/_message.pyx).

The message types of the put path: Message, MessageBatch and PutMessageResult (spec §9).
"""

from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address, IPv6Address
from typing import Any, Self, TypeAlias

from _typeshed import ReadableBuffer
from typing_extensions import disjoint_base

from mqstore.status import PutMessageStatus

# (ip, port); the ip is anything whose str() is an IPv4 or IPv6 address (mqstore.log.record.encode_host).
_Host: TypeAlias = tuple[str | IPv4Address | IPv6Address, int]

@disjoint_base
class Message:
    """A message to put: topic, body and RocketMQ's message fields.

    tags and keys are stored in the TAGS and KEYS properties; wait_store_msg_ok=False sets
    WAIT=false (sync flush then returns without waiting for the disk). born_timestamp 0 means
    "now" at put time; born_host None means the store host.
    """

    topic: str
    body: bytes
    queue_id: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: _Host | None
    reconsume_times: int
    prepared_transaction_offset: int
    def __init__(
        self,
        topic: str,
        body: ReadableBuffer = b"",
        *,
        queue_id: int = 0,
        flag: int = 0,
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        properties: Mapping[str, str] | None = None,
        wait_store_msg_ok: bool | None = None,
        born_timestamp: int = 0,
        born_host: _Host | None = None,
        sys_flag: int = 0,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
    ) -> None: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @properties.setter
    def properties(self, value: Mapping[str, str] | None) -> None: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def wait_store_msg_ok(self) -> bool: ...

@disjoint_base
class MessageBatch:
    """A client batch (MessageExtBatch, spec §9.4): one topic and queue, a §1.10 batch body,
    batch-level properties, flag, born timestamp and host."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]
    sys_flag: int
    born_timestamp: int
    born_host: _Host | None
    reconsume_times: int
    def __init__(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        properties: Mapping[str, str] | None = None,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: _Host | None = None,
        reconsume_times: int = 0,
    ) -> None: ...
    @staticmethod
    def from_messages(
        messages: Iterable[Message],
        *,
        topic: str | None = None,
        queue_id: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> MessageBatch:
        """Encode messages into a batch body like the Java client's encodeMessages (§1.10)."""

@disjoint_base
class PutMessageResult:
    """Outcome of a put (RocketMQ PutMessageResult + AppendMessageResult)."""

    @property
    def status_code(self) -> int:
        """The status as its number (RocketMQ's PutMessageStatus ordinal)."""
    @property
    def wrote_offset(self) -> int:
        """Where the (first) record starts in the CommitLog."""
    @property
    def wrote_bytes(self) -> int:
        """Bytes appended: the record, or every record of a batch."""
    @property
    def queue_offset(self) -> int:
        """The (first) message's offset in its queue."""
    @property
    def store_timestamp(self) -> int:
        """When the store appended it (ms since the epoch)."""
    @property
    def msg_num(self) -> int:
        """Messages stored by this put (1, or a batch's count; 0 when nothing was)."""
    @property
    def detail(self) -> str | None:
        """Why a put failed (or its durability is not confirmed), in words; None when PUT_OK."""
    @property
    def status(self) -> PutMessageStatus:
        """The PutMessageStatus (PUT_OK, MESSAGE_ILLEGAL, ...)."""
    @property
    def ok(self) -> bool:
        """True for PUT_OK (stored and, under SYNC_FLUSH, flushed)."""
    @property
    def msg_id(self) -> str | None:
        """Offset msgId(s) (spec §1.2); comma-joined for a batch (spec §9.4)."""

    def check(self) -> Self:
        """Return self if PUT_OK, else raise PutMessageError naming the status and its cause."""

def topic_problem_of(topic: str, max_length: int = 127) -> str | None:
    """Why topic cannot be put (RocketMQ's TopicValidator: not empty, only letters, digits
    and %|_-, at most max_length characters), or None: the put path's own check."""

def properties_problem_of(props: Mapping[Any, Any]) -> str | None:
    """Why a properties map cannot be stored so that it reads back the same (a name or
    value holding \\x01 or \\x02, an empty name or value, a name that is not a str), or
    None: the put path's own check."""
