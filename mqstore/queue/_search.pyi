"""Type stubs for the compiled ``mqstore.queue._search`` (ext/mqstore/queue/_search.pyx).

Time -> queue-offset search over one mapped ConsumeQueue file (spec §3 getOffsetInQueueByTime),
with Kafka's hot/cold ("warm section") split (spec §15) and a count of the pages it touches.
Result rules (a QUIRK decision, see the module docstring): over the units low..high, r = the
first unit whose store time is >= ts (removed units are older than any time); an exact match
returns the earliest such unit, otherwise the nearer of r - 20 and r (ties left); no r returns
high (high + 20 if every unit is removed); an empty range returns low.

And the body CRC check of reads (check_crc_on_read): crc32, record_status, first_corrupt.
"""

from typing import Final

from _typeshed import ReadableBuffer

from mqstore.log._mapped import MappedFile
from mqstore.queue._reads import LogMap

WARM_BYTES_DEFAULT: Final = 8192
CQ_STORE_UNIT_SIZE: Final = 20
OS_PAGE_SIZE: Final = 4096

def offset_by_time(
    cq: MappedFile, low: int, high: int, ts: int, min_phy: int, log: LogMap, warm_bytes: int = 8192
) -> tuple[int, int, int, int]:
    """The unit position in [low, high] (byte positions in the ConsumeQueue file cq) whose
    store time is nearest ts, by the module's rules; (position, cq_pages, cl_pages, probes).

    log holds the CommitLog files the units point into. Raises ValueError for a position that
    is negative, not a multiple of 20 or whose unit lies past the file, an unmapped file, or
    warm_bytes < 0.
    """

def store_time_at(phy_offset: int, log: LogMap, min_phy: int = 0) -> int | None:
    """The STORETIMESTAMP of the CommitLog record at phy_offset as the search reads it, or None
    when that unit would count as removed (before min_phy, file not mapped or out of range)."""

# -- body CRC on read -------------------------------------------------------------------------

CRC_FOLDED: bool
"""True when crc32 and the record checks fold with PCLMULQDQ (this CPU has it and SSE4.1)."""
RECORD_OK: Final = 0
RECORD_CRC_MISMATCH: Final = 1
RECORD_MALFORMED: Final = 2

def crc32(data: ReadableBuffer, value: int = 0, *, fold: bool = True) -> int:
    """zlib.crc32(data, value), unmasked (RocketMQ's body CRC is this & 0x7FFFFFFF); fold=False
    takes the portable slicing-by-8 path even where PCLMULQDQ folding is available."""

def record_status(data: ReadableBuffer) -> int:
    """RECORD_OK, RECORD_CRC_MISMATCH or RECORD_MALFORMED for the record at the start of data
    (a buffer that holds the record and may extend past it): the structure checks of spec §5.3,
    then BODYCRC against UtilAll.crc32 of the body."""

def first_corrupt(phys: list[int], log: LogMap) -> tuple[int, int]:
    """(index, status) of the first record of phys (CommitLog offsets) that is not RECORD_OK,
    or (-1, RECORD_OK) when every record checks; a record whose file is not mapped in log is
    skipped."""
