"""Type stubs for the compiled ``mqstore._client`` (ext/mqstore/_client.pyx).

The RocketMQ client's pulled messages (docs/rocketmq-remoting-spec.md §2.4.2, §2.6): the records
of a pull response body decoded into MessageExt, the costly fields made on first access.
Twin: mqstore.client._twin.
"""

from typing import ClassVar, Final

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
