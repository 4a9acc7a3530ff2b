"""What a check found: problems, summaries of the queues and index files, the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Problem:
    where: str
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.where} @ {self.offset}: {self.message}"


@dataclass
class QueueSummary:
    first_offset: int
    last_offset: int
    count: int


@dataclass
class ConsumeQueueSummary:
    """What one ConsumeQueue holds (queue offsets; max_offset is the next one to be written)."""

    #: offset of the first real unit whose record is still in the log (max_offset if none)
    min_offset: int
    max_offset: int
    #: real units (not fillers), including those pointing below the log (``removed``)
    units: int = 0
    #: pre-fill units before the first real unit (a queue that starts above offset 0)
    fillers: int = 0
    #: filler units after the first real unit: skipped queue offsets
    gaps: int = 0
    #: real units whose record is below the CommitLog's first file (removed by retention)
    removed: int = 0
    files: int = 0


@dataclass
class IndexFileSummary:
    """An index file's header (spec §4.1), as the checker and ``mqstore inspect`` read it."""

    name: str
    size: int
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 0
    #: False when the file's size does not match the slot / entry counts in use (header only)
    entries_checked: bool = False
    #: why the header could not be read ("" when it was)
    error: str = ""


@dataclass
class CheckReport:
    root: str
    files: int = 0
    records: int = 0
    valid_end: int = 0
    torn_tail_bytes: int = 0
    #: with quiescent=False: bytes past the wrote position read before the scan that did not
    #: parse yet (records being written while the checker ran)
    in_flight_bytes: int = 0
    queues: dict[tuple[str, int], QueueSummary] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    control_block: dict[str, int] | None = None
    #: every ConsumeQueue directory found, by (topic, queue id)
    consume_queues: dict[tuple[str, int], ConsumeQueueSummary] = field(default_factory=dict)
    #: whether every record of the log was required to have its unit (check_queues_complete)
    queues_complete_checked: bool = False
    #: ConsumeQueue units and index entries skipped because they point past the end of the
    #: log of a store being written (quiescent=False)
    in_flight_units: int = 0
    index_files: list[IndexFileSummary] = field(default_factory=list)
    #: index entries checked against their records
    index_entries: int = 0
    #: what was not checked, and why (not problems)
    notes: list[str] = field(default_factory=list)
    #: a store with several CommitLogs: the valid end of each, by log id (valid_end is log 0's)
    log_ends: dict[int, int] = field(default_factory=dict)
    #: ... and of each log: its records, the bytes of a torn record after its valid end, and
    #: the problems found in its files and control-block cells (also in ``problems``)
    log_records: dict[int, int] = field(default_factory=dict)
    log_torn_tail_bytes: dict[int, int] = field(default_factory=dict)
    log_problems: dict[int, list[Problem]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> CheckReport:
        if self.problems:
            shown = "\n  ".join(str(p) for p in self.problems[:20])
            raise AssertionError(f"store {self.root} violates {len(self.problems)} invariant(s):\n  {shown}")
        return self


ProblemSink = Callable[[str, int, str], None]
#: progress(what, done, total) of a long check (mqstore.progress)
Progress = Callable[[str, int, int], None]
PROGRESS_EVERY_RECORDS = 4096
