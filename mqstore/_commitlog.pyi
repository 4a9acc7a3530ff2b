"""Type stubs for the compiled ``mqstore._commitlog`` (ext/mqstore/_commitlog.pyx).

The CommitLog put path and record scanner (spec §9, §1.7, §5.3).
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from ipaddress import IPv4Address, IPv6Address
from typing import Any, Final, Literal, Self, TypeAlias

from _typeshed import ReadableBuffer
from typing_extensions import disjoint_base

from mqstore._mapped import MappedFile
from mqstore._shm import ControlBlock, TransientStorePool
from mqstore.status import PutMessageStatus

# (ip, port); the ip is anything whose str() is an IPv4 or IPv6 address (mqstore.log.record.encode_host).
_Host: TypeAlias = tuple[str | IPv4Address | IPv6Address, int]

SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"

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

@disjoint_base
class BatchPlan:
    """The records of one batch, planned outside the lock: per inner message pointers to its
    body and stored properties, its flag and record size, then all records encoded into one
    buffer (spec §9.4). Owns its C arrays; `keep` holds every bytes object pointed into.

    Internal to the put path: it has no Python-visible attributes or methods.
    """

@disjoint_base
class CommitLogAppender:
    """The put path of one process over a store's control block and CommitLog files."""

    @property
    def file_size(self) -> int: ...
    @property
    def sync_flush(self) -> bool: ...
    @property
    def sync_master(self) -> bool: ...
    @property
    def log_id(self) -> int:
        """The CommitLog this appender writes (its lock, positions, flush and HA cells)."""
    closed: bool
    slave: bool
    def __init__(
        self,
        control_block: ControlBlock,
        file_provider: Callable[[int], str | None],
        *,
        file_size: int,
        max_message_size: int,
        os_page_cache_busy_time_out_mills: int,
        sync_flush_timeout: int,
        sync_flush: bool,
        flush_commit_log_timed: bool,
        store_host: _Host,
        lock_hold_warn_ms: int = 500,
        slave: bool = False,
        delay_levels: Sequence[int] | None = None,
        pool: TransientStorePool | None = None,
        max_topic_length: int = 127,
        space_provider: Callable[[int], str | None] | None = None,
        flush_provider: Callable[[], bool] | None = None,
        sync_master: bool = False,
        slave_timeout_ms: int = 3000,
        slave_fallbehind_max: int = 268435456,
        log: int = 0,
    ) -> None:
        """file_provider(offset) maps the file holding offset and makes it current (with
        set_current_file); it returns None, or a detail string for CREATE_MAPEDFILE_FAILED."""

    def set_current_file(self, mapped_file: MappedFile) -> None:
        """Make mapped_file the one appends go to (called by the file provider)."""

    def forget_current_file(self) -> None: ...
    @property
    def current_file(self) -> MappedFile | None: ...
    def put_message(self, msg: Message) -> PutMessageResult:
        """Put one message (spec §9.2, §9.3). Returns a PutMessageResult; never raises for a
        bad message (the status names the cause). StoreClosedError after this process shut
        the store down (a store whose owner shut down answers SERVICE_NOT_AVAILABLE)."""

    def put_messages(self, batch: MessageBatch | Iterable[Message]) -> PutMessageResult:
        """Put a batch: a MessageBatch (client batch body) or a list of Messages of one topic and
        queue. All records get consecutive queue and physical offsets and one store timestamp.
        StoreClosedError after this process shut the store down."""
    def append_data(self, phy_offset: int, data: bytes | bytearray | memoryview) -> int:
        """A slave appends what its master sent (the master's CommitLog bytes from phy_offset,
        which must be this log's end, else ValueError): into the mapped files at the same
        positions; wrote moves to their end (what the slave reports), committed to the end of
        the last whole record (what the dispatcher reads). Returns the new wrote position."""
    def drop_partial_tail(self) -> int:
        """A slave stopping: the bytes past its last whole record are zeroed and wrote goes back
        to committed (the slave asks for them again when it reconnects); the bytes dropped."""
    def put_bodies(
        self,
        topic: str,
        bodies: Iterable[bytes | bytearray | memoryview],
        queue_id: int = 0,
        *,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
        flag: int = 0,
    ) -> PutMessageResult:
        """Put many bodies of one topic and queue as one batch, without a Message each: every
        record gets the same properties (``properties`` and TAGS=tags) and flag, consecutive
        queue offsets and one store timestamp, like put_messages."""

def topic_problem_of(topic: str, max_length: int = 127) -> str | None:
    """Why topic cannot be put (RocketMQ's TopicValidator: not empty, only letters, digits
    and %|_-, at most max_length characters), or None: the put path's own check."""

def properties_problem_of(props: Mapping[Any, Any]) -> str | None:
    """Why a properties map cannot be stored so that it reads back the same (a name or
    value holding \\x01 or \\x02, an empty name or value, a name that is not a str), or
    None: the put path's own check."""

def scan_records(
    mapped: ReadableBuffer,
    file_from: int,
    start: int,
    end: int,
    check_crc: bool,
    control_block: ControlBlock | None = None,
    on_record: Callable[[int, int, bytes, int, int, int, int, int], object] | None = None,
    check_header: bool = False,
) -> tuple[int, Literal["blank", "end", "invalid", "header"], int, int]:
    """Walk the records of one file from start while they are valid (spec §5.3/§5.4).

    Returns (stop_position, reason, count, last_store_timestamp) with reason one of
    "blank" (end-of-file record: continue with the next file), "end" (reached `end`),
    "invalid" (bad magic, CRC, length or a record running past `end`), and with check_header
    "header": a record that parses (and whose CRC matches) but whose PHYSICALOFFSET is not
    file_from + its position or whose QUEUEID is negative, fields no CRC covers (recovery
    stops trusting the log there; mqstore.queue.recovery.header_problem says which).
    With control_block, raises each queue's next offset in its topic-queue table to
    queue_offset + 1. on_record(pos, size, topic_bytes, queue_id, queue_offset, physical_offset,
    sys_flag, store_timestamp) is called per valid record if given.
    """
