"""Type stubs for the compiled ``mqstore.log._scan`` (ext/mqstore/log/_scan.pyx).

The CommitLog record scanner (spec §5.3, §5.4).
"""

from collections.abc import Callable
from typing import Literal

from _typeshed import ReadableBuffer

from mqstore.log._shm import ControlBlock

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
