"""Type stubs for the compiled ``mqstore.queue._dispatch`` (ext/mqstore/queue/_dispatch.pyx).

The dispatch (reput) kernel: CommitLog records to ConsumeQueue units (spec §10.1).
"""

from collections.abc import Callable, Iterable
from typing import Any

from typing_extensions import disjoint_base

from mqstore.queue._consumequeue import ConsumeQueueKernel
from mqstore.queue._reput import ParsedBatch

@disjoint_base
class DispatchKernel:
    """Parses CommitLog records (no body) and appends their ConsumeQueue units (spec §10.1)."""

    index_enable: bool
    index_requests: list[tuple[str, str | None, str | None, int, int, int]]
    on_skipped: Callable[[int, bytes, int], object] | None
    @property
    def skipped(self) -> int:
        """Records whose queue cannot exist (lookup returned None), left out of the queues."""
    def __init__(
        self,
        lookup: Callable[[str, int], ConsumeQueueKernel | None],
        *,
        index_enable: bool = True,
        delay_levels_ms: Iterable[int] = (),
        control_block: Any = None,
        on_skipped: Callable[[int, bytes, int], object] | None = None,
    ) -> None: ...
    def forget(self) -> None:
        """Drop every cached queue (after queues were destroyed or replaced)."""

    def dispatch(
        self, mapped: Any, file_from: int, start: int, end: int, raise_table: bool = False, stop_after: int = -1
    ) -> tuple[int, str, int, int, int]:
        """(stop, reason, records, units, last_store_timestamp) for one CommitLog file."""

    def apply(self, batch: ParsedBatch, raise_table: bool = False) -> int:
        """Append the units of a batch parsed by mqstore.queue._reput.BatchParser, in record order;
        returns the units appended."""
