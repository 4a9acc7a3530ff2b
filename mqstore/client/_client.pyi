"""Type stubs for the compiled ``mqstore.client._client`` (ext/mqstore/client/_client.pyx).

The RocketMQ client's pulled messages (docs/rocketmq-remoting-spec.md §2.4.2, §2.6): the records
of a pull response body decoded into MessageExt, the costly fields made on first access; and the
send side's message ids, properties strings and batch bodies (§1.4, §2.4.1).
Twin: mqstore.client._twin (and mqstore.log._codec for the properties and batch bodies).
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final, final

from typing_extensions import Buffer, disjoint_base

from mqstore.client.route import MessageQueue

COMPRESSED_FLAG: Final = 0x1

@disjoint_base
class MessageExt:
    """A message as a pull returns it, decoded from its CommitLog record (§2.6). ``msg_id`` is
    the UNIQ_KEY property when there is one, else ``offset_msg_id``; ``properties`` holds every
    property of the record (system ones included), ``user_properties`` only the user's."""

    __match_args__: ClassVar[tuple[str, ...]]
    # unhashable, like the mutable dataclass (eq=True, not frozen) it replaces
    __hash__: ClassVar[None]  # type: ignore[assignment]

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    body_crc: int
    broker_name: str
    def __init__(
        self,
        topic: str,
        body: bytes,
        queue_id: int,
        queue_offset: int,
        commit_log_offset: int,
        msg_id: str,
        offset_msg_id: str,
        properties: dict[str, str],
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: tuple[str, int],
        store_timestamp: int,
        store_host: tuple[str, int],
        reconsume_times: int,
        body_crc: int,
        broker_name: str = "",
    ) -> None: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def uniq_key(self) -> str | None: ...
    @property
    def user_properties(self) -> dict[str, str]: ...
    @property
    def message_queue(self) -> MessageQueue: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...

def decode_messages(body: Buffer, *, broker_name: str = "", address: str = "") -> list[MessageExt]:
    """The messages of a pull response body: whole CommitLog records back to back (§2.4.2, §2.6),
    compressed bodies (sys flag bit 0) inflated. ValueError naming the offset and the problem when
    the body holds anything else (mqstore.client.message.decode_messages makes it a
    MessageDecodeError)."""

@final
class UniqIdGenerator:
    """Message ids like RocketMQ's MessageClientIDSetter.createUniqID: 32 upper-case hex digits of
    IPv4 address (4 bytes; RocketMQ's createFakeIP, 4 bytes of the clock, when ``ip`` is not
    one), pid (2), a per-generator random salt (4), ms since the start of the local month (4)
    and a counter (2). ``fix``, ``counter`` and ``now_ms`` are for tests."""

    def __init__(self, ip: str | None = None, *, fix: bytes | None = None, counter: int = 0,
                 now_ms: int | None = None) -> None: ...
    @property
    def fix(self) -> bytes:
        """The fixed first 10 bytes of every id: IPv4 address, pid, salt."""
    def next(self) -> str:
        """The next id."""
    def next_at(self, now_ms: int) -> str:
        """The next id as if the clock read now_ms (ms since the epoch)."""
    def next_many(self, n: int) -> list[str]:
        """The next n ids (the clock read for each)."""

def encode_properties(props: Mapping[str, str | None] | None) -> str:
    """MessageDecoder.messageProperties2String (spec §1.4) in Java HashMap order, None values left
    out: what mqstore.log._codec.properties_to_string gives."""

_BatchEntry = bytes | tuple[bytes, dict[str, str] | None, int]

def batch_entries(items: Iterable[Any], prepare: Callable[[Any, int], tuple[bytes, dict[str, str] | None, int]],
                  max_body: int) -> list[_BatchEntry]:
    """The entries of a batch, checked: a bytes item of 1 to max_body bytes as it is, any other
    item as prepare(item, index) gives it, or raises."""

def encode_batch(entries: list[_BatchEntry], ids: list[str]) -> bytes:
    """A SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages, spec §2.4.1), entry i with the
    UNIQ_KEY ids[i]."""
