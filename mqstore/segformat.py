"""The segment object's constants and parsed parts (spec §5.2), shared by the compiled kernel
(``mqstore.tier._segment``) and its twin (``mqstore.twin.segment``), so both hand out equal
values.

Layout of a ``.mqseg`` object: data section (D bytes: every record of one closed CommitLog
file, byte for byte, queue groups in directory order, then the no-queue group) · footer
(F bytes: directory, time samples, phy fences, phy index) · 64-byte trailer. Big-endian.
docs/tiering.md has the tables.
"""

from __future__ import annotations

from typing import NamedTuple

MAGIC = b"MQSEG001"
VERSION = 1
TRAILER_SIZE = 64
SAMPLE_SIZE = 24            # queue offset (8), store timestamp (8), data position (4), size (4)
PHY_ENTRY_SIZE = 8          # file position (4), data position (4)
SAMPLE_EVERY = 64           # a time sample for the first record of a group, every 64th, and the last
FENCE_EVERY = 4096          # a phy fence for every 4096th phy index entry
DIR_FIXED_SIZE = 1 + 4 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 4  # a directory entry without its topic bytes
MAX_DATA_BYTES = 0xFFFFFFFF  # positions in samples and the phy index are 4-byte unsigned


class Trailer(NamedTuple):
    """The 64-byte trailer, checked (magic, trailer CRC, version, D = valid length)."""

    version: int
    log_id: int
    file_start: int
    valid_len: int
    data_len: int
    footer_len: int
    record_count: int
    data_crc: int
    footer_crc: int

    @property
    def object_size(self) -> int:
        return self.data_len + self.footer_len + TRAILER_SIZE


class GroupEntry(NamedTuple):
    """One directory entry: a queue group (records of one topic-queue that have a ConsumeQueue
    unit, in queue-offset order) or the no-queue group (``topic == b""``: the records without
    a unit, in physical order; its first_queue_offset is 0 and it has no time samples)."""

    topic: bytes
    queue_id: int
    first_queue_offset: int
    record_count: int
    data_start: int
    data_length: int
    min_store_timestamp: int
    max_store_timestamp: int
    first_sample: int
    sample_count: int

    @property
    def no_queue(self) -> bool:
        return not self.topic


class TimeSample(NamedTuple):
    queue_offset: int
    store_timestamp: int
    data_pos: int
    size: int


class Footer(NamedTuple):
    """A parsed, CRC-checked footer. ``phy_index`` holds the n_records × 8 index bytes."""

    groups: list[GroupEntry]
    samples: list[TimeSample]
    fences: list[int]
    phy_index: bytes

    def group(self, topic: bytes, queue_id: int) -> int:
        """The directory index of the queue group (topic, queue_id), or -1."""
        lo, hi = 0, len(self.groups)
        key = (topic, queue_id)
        while lo < hi:  # queue groups are sorted by (topic bytes, queue id); the no-queue one is last
            mid = (lo + hi) // 2
            g = self.groups[mid]
            if g.no_queue or (g.topic, g.queue_id) >= key:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(self.groups) and not self.groups[lo].no_queue and \
                (self.groups[lo].topic, self.groups[lo].queue_id) == key:
            return lo
        return -1


# -- the compacted index object (.mqidx, spec §5.3) -------------------------------------------------

INDEX_MAGIC = b"MQIDX001"
INDEX_VERSION = 1
INDEX_HEADER_SIZE = 48      # magic, version, log id, begin ts, end ts, slots, entries, CRC, reserved
INDEX_SLOT_SIZE = 8         # first entry number (4), entries of the slot (4); 0/0 = empty
INDEX_ENTRY_SIZE = 16       # key hash (4), physical offset (8), time diff in seconds from begin (4)
INDEX_RUN_CAP = 1024        # most entries one slot read brings back (RocketMQ's compacted-run cap)
LOCAL_INDEX_HEADER_SIZE = 40  # the local IndexFile: begin/end ts, begin/end phy, slot count, index count
LOCAL_SLOT_SIZE = 4
LOCAL_ENTRY_SIZE = 20


class IndexHeader(NamedTuple):
    """The 48-byte header of a ``.mqidx`` object (magic and version checked)."""

    version: int
    log_id: int
    begin_timestamp: int
    end_timestamp: int
    slot_count: int
    entry_count: int
    crc: int

    @property
    def object_size(self) -> int:
        return INDEX_HEADER_SIZE + self.slot_count * INDEX_SLOT_SIZE + self.entry_count * INDEX_ENTRY_SIZE
