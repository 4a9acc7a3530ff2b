"""Type stubs for the compiled ``mqstore.queue._reput`` (ext/mqstore/queue/_reput.pyx).

The parse step of the concurrent dispatch (spec §10.2): ``BatchParser.cut`` cuts a CommitLog
file into batches of whole records, ``BatchParser.parse`` parses one batch without the GIL
into a ``ParsedBatch`` (ConsumeQueue entries and index key hashes), which the dispatcher
applies in batch order. Twin: mqstore.twin.reput.
"""

from collections.abc import Iterable
from typing import Any, Literal, final

from typing_extensions import disjoint_base

@final
class ParsedBatch:
    """One batch of records, parsed (made by BatchParser.parse): its ConsumeQueue units, the
    queues they go to, and its index keys."""

    def __len__(self) -> int: ...
    @property
    def count(self) -> int:
        """Records parsed."""
    @property
    def unit_count(self) -> int: ...
    @property
    def queue_count(self) -> int: ...
    @property
    def file_from(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def stop(self) -> int:
        """Where parsing ended: the batch end, or the record reason names."""
    @property
    def last_store_timestamp(self) -> int: ...
    @property
    def reason(self) -> Literal["end", "blank", "invalid"]: ...
    @property
    def index_keys(self) -> bytes:
        """(phy_offset, store_timestamp, key_hash) triples of native int64s, in dispatch order."""
    @property
    def index_key_count(self) -> int: ...
    def unit_list(self) -> list[tuple[bytes, int, int, int, int, int]]:
        """(topic, queue_id, queue_offset, phy_offset, size, tags_code) of each unit."""

@disjoint_base
class BatchParser:
    """Cuts CommitLog files into batches and parses them (thread-safe)."""

    @property
    def index_enable(self) -> bool: ...
    def __init__(self, delay_levels_ms: Iterable[int] = (), *, index_enable: bool = True) -> None: ...
    def cut(
        self, mapped: Any, start: int, end: int, batch_bytes: int
    ) -> tuple[int, Literal["end", "batch", "blank", "invalid"], int]:
        """(stop, reason, records): the next batch of whole records from start, at least
        batch_bytes long."""
    def parse(self, mapped: Any, file_from: int, start: int, end: int, records: int = 0) -> ParsedBatch:
        """Parse the records of [start, end) (as cut() cut them) without the GIL."""
