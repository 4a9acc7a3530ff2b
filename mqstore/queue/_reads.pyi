"""Type stubs for the compiled ``mqstore.queue._reads`` (ext/mqstore/queue/_reads.pyx).

The read side (spec §11): getMessage and the look-ups by offset, over zero-copy views.
"""

from collections.abc import Collection, Iterable, Iterator
from typing import Any, final

from typing_extensions import deprecated, disjoint_base

from mqstore.log._mapped import MappedFile
from mqstore.log.record import DecodedRecord

def record_problem(status: int) -> str:
    """What a record status (mqstore.queue._search RECORD_*) says is wrong with a record."""

@disjoint_base
class LogMap:
    """CommitLog files by index for C readers (maps the available files, pins the mappings)."""

    @property
    def file_size(self) -> int: ...
    @property
    def first_from(self) -> int: ...
    @property
    def files(self) -> list[MappedFile]: ...
    def __init__(self, files: Iterable[MappedFile | None], file_size: int, first_from: int | None = None) -> None:
        """files: the CommitLog's MappedFiles in order (None: a file left unmapped); first_from:
        the start of file 0 (default: the first file's)."""
    def __len__(self) -> int: ...
    @property
    def end(self) -> int:
        """First offset past the mapped files."""

    def file_of(self, phy: int) -> MappedFile | None:
        """The MappedFile holding phy, or None."""

    def store_timestamp(self, phy: int) -> int:
        """STORETIMESTAMP of the record at phy, -1 if its file is not mapped."""

@disjoint_base
class GetMessageResult:
    """What getMessage found (spec §11): status, next_begin_offset, min/max offsets, and the
    messages as zero-copy views on the mapped CommitLog files (decoded on access)."""

    status: Any
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_pulling_from_slave: bool
    buffer_total_size: int
    max_phy_offset_pulling: int
    def __init__(self, status: Any, next_begin_offset: int = 0, min_offset: int = 0, max_offset: int = 0) -> None: ...
    @property
    def message_count(self) -> int: ...
    @property
    def ok(self) -> bool: ...
    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __getitem__(self, key: int, /) -> MessageView: ...
    def __iter__(self) -> Iterator[MessageView]: ...
    @property
    def physical_offsets(self) -> list[int]: ...
    @property
    def sizes_list(self) -> list[int]: ...
    def bodies(self, *, decompress: bool = True) -> list[bytes]:
        """Every message's body as bytes, in one call: as the producer sent it (a body stored
        compressed inflated per its sysFlag), or as stored with decompress=False."""

    def records(self) -> bytes:
        """Every message's whole record, concatenated in queue order (a pull response's body)."""
    def buffers(self) -> list[memoryview]:
        """One zero-copy memoryview per message (the whole record)."""

def view_at(log_map: LogMap, phy: int) -> MessageView | None:
    """The record at phy as a MessageView, or None (spec §11 lookMessageByOffset)."""

@final
class MessageView:
    """One stored record, read in place from the mapped CommitLog file."""

    @property
    @deprecated("use physical_offset")
    def phy(self) -> int:
        """Deprecated alias of physical_offset."""
    @property
    @deprecated("use total_size")
    def size(self) -> int:
        """Deprecated alias of total_size."""
    @property
    def physical_offset(self) -> int:
        """Where the record starts in the CommitLog (PHYSICALOFFSET, spec §1)."""
    @property
    def total_size(self) -> int:
        """The record's length in bytes (TOTALSIZE, spec §1)."""
    @property
    def queue_id(self) -> int: ...
    @property
    def flag(self) -> int: ...
    @property
    def queue_offset(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def store_timestamp(self) -> int: ...
    @property
    def body_crc(self) -> int: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...
    def _file_view(self) -> memoryview: ...
    @property
    def buffer(self) -> memoryview:
        """The whole record, zero-copy."""

    @property
    def body(self) -> memoryview:
        """The body as the producer sent it: zero-copy unless stored compressed (then inflated)."""

    @property
    def raw_body(self) -> memoryview:
        """The body as stored, zero-copy (compressed when sys_flag says so)."""

    def body_bytes(self, *, decompress: bool = True) -> bytes:
        """The body as bytes, as the producer sent it; as stored with decompress=False."""

    @property
    def topic(self) -> str: ...
    @property
    def properties_string(self) -> str: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> list[str]: ...
    @property
    def msg_id(self) -> str: ...
    def decode(self, *, read_body: bool = True, check_crc: bool = False) -> DecodedRecord:
        """Every field as a mqstore.log.record.DecodedRecord (copies the body)."""

@disjoint_base
class ReadKernel:
    """The C side of mqstore.queue.reads.MessageReader: getMessage and the look-ups by queue offset
    in one call (units of a queue's current file read through its C append state)."""

    check_crc_on_read: bool
    def __init__(self, queues: dict[tuple[str, int], Any], log_files: Any, control_block: Any) -> None:
        """log_files: the CommitLog's MappedFileQueue, or a list of them, one per CommitLog of a
        store with several (docs/parallel-commitlogs.md)."""
    def set_transfer_limits(
        self, *, max_bytes_memory: int, max_count_memory: int, max_bytes_disk: int, max_count_disk: int
    ) -> None:
        """getMessage's caps for a batch read from memory / from disk (spec §11 isTheBatchFull)."""

    @property
    def in_memory_limit(self) -> int:
        """Bytes behind the CommitLog end still counted as in memory (spec §11)."""

    @in_memory_limit.setter
    def in_memory_limit(self, value: int) -> None: ...
    def log_map(self, log: int = 0) -> LogMap:
        """The files of CommitLog ``log`` as the C readers see them (rebuilt when a file is
        added or removed); an empty map for a log this store does not have."""

    def follow_with(self, follower: Any) -> None:
        """Reads in a process that follows what other processes build: the look-ups by queue
        offset call ``follower.queue`` only when what they need is not there yet. None: this
        process builds what it reads."""

    def forget_log_map(self) -> None:
        """Drop the cached LogMap (its file list changed)."""

    def tag_codes(self, tags: str | None) -> frozenset[int] | None:
        """Tags codes of a subscription expression "A || B" (spec §11), cached; None = all."""

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        tags: str | None = None,
        capped: bool = True,
    ) -> GetMessageResult:
        """getMessage (spec §11): up to max_msg_nums messages of a queue from offset; capped=False
        lifts the transfer caps (a local bulk read)."""

    def look_message_by_offset(self, phy_offset: int, check: bool | None = None) -> MessageView | None:
        """The message at a CommitLog offset, or None (spec §11 lookMessageByOffset); with check
        (default: check_crc_on_read), CorruptRecordError when its record fails its checks or body
        CRC."""

    def look_message_by_queue_offset(self, topic: str, queue_id: int, queue_offset: int) -> MessageView | None:
        """The message at a queue offset, or None; checked as look_message_by_offset."""

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """STORETIMESTAMP of the message at a queue offset, -1 if none (spec §11)."""
