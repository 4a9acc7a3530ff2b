"""Type stubs for the compiled ``mqstore.queue._consumequeue`` (ext/mqstore/queue/_consumequeue.pyx).

The append side and the unit scans of a ConsumeQueue (spec §3).
"""

from typing import Any, Final

from typing_extensions import disjoint_base

from mqstore.log._mapped import MappedFile

CQ_STORE_UNIT_SIZE: Final = 20
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
#: the most a ConsumeQueue file's allocation grows by at once (each step doubles it up to this)
CQ_ALLOCATE_STEP_MAX: Final = 1048576

def filler_units(count: int) -> bytes:
    """count pre-fill units (0, Integer.MAX_VALUE, 0) as RocketMQ's fillPreBlank writes them."""

def scan_units(mapped: Any, start: int, end: int) -> tuple[int, int]:
    """(valid_end, last_phy_end) of the units from start while phyOffset >= 0 and size > 0
    (end clamped to the buffer, phyOffset + size saturated at 2^63 - 1; ValueError for a
    negative start)."""

def order_break(mapped: Any, end: int, file_from: int, prev_end: int, prev_pos: int) -> tuple[int, int, int]:
    """Whether the real units of [0, end) follow each other in the CommitLog after a unit ending
    at prev_end at logical position prev_pos: (position to cut at or -1, end of the last real
    unit, its logical position)."""

def truncate_point(mapped: Any, start: int, end: int, phy_limit: int) -> tuple[int, int]:
    """First unit position whose record starts at or after phy_limit (or that is invalid),
    and phyOffset + size of the last kept unit (end clamped to the buffer; ValueError for a
    negative start)."""

@disjoint_base
class ConsumeQueueKernel:
    """The append state of one ConsumeQueue; see mqstore.queue.consume_queue.ConsumeQueue."""

    def publish_to(self, control_block: Any) -> bool:
        """Publish the unit count after every append in the queue's control-block slot."""
    @property
    def topic(self) -> str: ...
    @property
    def topic_b(self) -> bytes: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def log_id(self) -> int:
        """The CommitLog the queue's units point into."""
    @property
    def file_size(self) -> int: ...
    max_physic_offset: int
    min_logic_offset: int
    #: the read kernel's map of the queue's files (mqstore.queue._reads.LogMap), or None
    queue_map: Any
    @property
    def gaps(self) -> int: ...
    def __init__(self, topic: str, queue_id: int, file_size: int, log_id: int = 0) -> None: ...
    def set_current_file(self, mapped_file: MappedFile | None) -> None:
        """Make mapped_file (the queue's last file) the append target, at its wrote_position."""

    def sync_position(self) -> None:
        """Copy the C write position into the current MappedFile's wrote_position."""

    @property
    def current_file(self) -> MappedFile | None: ...
    @property
    def max_logic_offset(self) -> int:
        """Byte offset after the last unit (min_logic_offset when the queue has no file)."""
    @property
    def max_offset_in_queue(self) -> int:
        """The next queue offset to be built (spec §3 maxOffsetInQueue)."""

    def put_message_position_info(self, phy: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Append the unit of queue_offset; False when it was already built (idempotent)."""

    def next_file(self, expect: int) -> MappedFile:
        """The file to append the unit at byte offset expect to (overridden in Python)."""
