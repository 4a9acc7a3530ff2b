"""Type stubs for the compiled ``mqstore.log._commitlog`` (ext/mqstore/log/_commitlog.pyx).

The CommitLog put path (spec §9, §1.7): the appender.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from ipaddress import IPv4Address, IPv6Address
from typing import Any, Final, Literal, Self, TypeAlias

from _typeshed import ReadableBuffer
from typing_extensions import disjoint_base

from mqstore.log._mapped import MappedFile
from mqstore.log._message import Message, MessageBatch, PutMessageResult, _Host
from mqstore.log._shm import ControlBlock, TransientStorePool

SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"

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

@disjoint_base
class LogRouter:
    """The put path of a store with several CommitLogs: each put goes to the appender of the
    CommitLog its queue is bound to (a delayed message: SCHEDULE_TOPIC_XXXX's queue level - 1)."""

    @property
    def appenders(self) -> list[CommitLogAppender]: ...
    def __init__(self, appenders: Iterable[CommitLogAppender]) -> None: ...
    def log_of(self, topic: object, queue_id: int) -> int:
        """The CommitLog a put to topic/queue_id is written to."""
    def put_message(self, msg: Message) -> PutMessageResult: ...
    def put_messages(self, batch: MessageBatch | Iterable[Message]) -> PutMessageResult: ...
    def put_bodies(self, topic: str, bodies: Iterable[bytes], queue_id: int = 0, *, tags: str | None = None,
                   properties: dict[str, str] | None = None, flag: int = 0) -> PutMessageResult: ...
