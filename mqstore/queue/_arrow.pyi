"""Arrow column buffers of CommitLog records (ext/mqstore/queue/_arrow.pyx)."""

from collections.abc import Iterable

from typing_extensions import Buffer, disjoint_base
from typing import Any, Final

COLUMNS: Final[tuple[str, ...]]
STRING_COLUMNS: Final[tuple[str, ...]]
NULLABLE_STRING_COLUMNS: Final[tuple[str, ...]]
INT32_COLUMNS: Final[tuple[str, ...]]
INT64_COLUMNS: Final[tuple[str, ...]]

@disjoint_base
class BufferView:
    """A read-only buffer over a batch's memory (no copy)."""

    @property
    def nbytes(self) -> int: ...
    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@disjoint_base
class RecordSource:
    """The mapped CommitLog files a batch reads from: file k starts at first_from + k * file_size."""

    @property
    def first_from(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    def __init__(self, first_from: int, file_size: int, files: Iterable[Buffer]) -> None: ...

@disjoint_base
class BatchColumns:
    """The columns of a batch of records in Arrow's layout."""

    @property
    def rows(self) -> int: ...
    @property
    def names(self) -> tuple[str, ...]: ...
    @property
    def below_min(self) -> int: ...
    @property
    def decompress(self) -> bool:
        """The body column holds bodies as the producer sent them (inflated per sysFlag)."""
    def __init__(self, columns: Iterable[str] | None = None, *, decompress: bool = True) -> None: ...
    def buffers(self) -> dict[str, tuple[Any, ...]]: ...
    def add_units(self, logs: RecordSource, units: Buffer, min_phy: int = 0) -> int: ...
    @property
    def queue_only(self) -> bool:
        """Whether every column wanted is one the ConsumeQueue units and their queue say."""
    def add_queue_units(self, units: Buffer, topic: str, queue_id: int, first_offset: int,
                        min_phy: int = 0) -> int:
        """The rows of ConsumeQueue units from the units alone (only when queue_only)."""
    def add_span(self, logs: RecordSource, phy: int, end: int, max_rows: int = 0,
                 max_bytes: int = 0) -> tuple[int, int]: ...

def keep_freed_memory(max_bytes: int = ...) -> bool:
    """Have this process's malloc keep and reuse the memory of freed batches (no fresh-page
    faults per batch); whether glibc took the settings."""

def cut_units(units: Buffer, start: int, max_rows: int = 0, max_bytes: int = 0) -> int:
    """Where a batch of ConsumeQueue units that starts at unit index start ends (exclusive)."""
