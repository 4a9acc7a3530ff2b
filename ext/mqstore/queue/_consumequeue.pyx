# cython: language_level=3
"""The append side and the unit scans of a ConsumeQueue (spec §3).

``ConsumeQueueKernel`` is the append state of one ConsumeQueue (``consumequeue/<topic>/<queueId>/``,
20-byte units ``long commitLogOffset | int size | long tagsCode``). The current file's base
address and write position are C fields; a unit is appended without a Python call. The
Python class ``mqstore.queue.consume_queue.ConsumeQueue`` extends it with files, recovery,
truncation and flush; the dispatch kernel (mqstore.queue._dispatch) appends to it and the read kernel
(mqstore.queue._reads) reads its current file through the declarations in _consumequeue.pxd.
``scan_units``, ``order_break`` and ``truncate_point`` are the recovery scans over a file's units.
"""

import logging

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t

from mq_bytes cimport mq_get_i32, mq_get_i64
from mq_ctl cimport mq_tq_find, mq_tq_hash, mq_tq_publish_units, mq_tq_slot

from mqstore.log._mapped cimport MappedFile
from mqstore.log._shm cimport ControlBlock

log = logging.getLogger("mqstore.consumequeue")

CQ_STORE_UNIT_SIZE = CQ_UNIT
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
cdef int64_t PAGE = 4096
#: the most a ConsumeQueue file's allocation grows by at once (each step doubles it up to this)
CQ_ALLOCATE_STEP_MAX = 1 << 20
cdef int64_t ALLOCATE_STEP_MAX = CQ_ALLOCATE_STEP_MAX


cdef int allocate_for_units(MappedFile mf, int64_t end) except -1:
    """Allocate mf's disk blocks up to end and a step past it, before units go there. A
    ConsumeQueue file is created with one page allocated and sparse after it, so a topic costs
    no disk until it holds messages and a queue's file grows with its units; each step doubles
    what is allocated (at least a page, at most ALLOCATE_STEP_MAX). A unit is never written
    into a hole: a full disk is an OSError here (the dispatch retries), never a SIGBUS."""
    cdef int64_t step = mf.allocated
    if step < PAGE:
        step = PAGE
    elif step > ALLOCATE_STEP_MAX:
        step = ALLOCATE_STEP_MAX
    cdef int64_t target = (end + PAGE - 1) // PAGE * PAGE
    if target < mf.allocated + step:
        target = mf.allocated + step
    mf.allocate_to(target)
    return 0


def filler_units(int64_t count) -> bytes:
    """count pre-fill units (0, Integer.MAX_VALUE, 0) as RocketMQ's fillPreBlank writes them."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, count * CQ_UNIT)
    cdef char *p = PyBytes_AS_STRING(out)
    cdef int64_t i
    for i in range(count):
        put_unit_bytes(p + i * CQ_UNIT, 0, FILLER_SIZE, 0)
    return out


def scan_units(mapped, int64_t start, int64_t end):
    """Walk units from start while ``phyOffset >= 0 and size > 0`` (spec §3 recovery).

    Returns (valid_end, last_phy_end): the position after the last valid unit and
    phyOffset + size of that unit (-1 if none; filler units do not count). end is clamped to
    the buffer; ValueError for a negative start.
    """
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
    if end > view.shape[0]:
        end = view.shape[0]
    if end < 0:
        end = 0
    cdef const char *b = <const char *>&view[0] if view.shape[0] else NULL
    cdef int64_t pos = start, phy, last = -1
    cdef int32_t size
    with nogil:
        while pos <= end - CQ_UNIT:   # pos + CQ_UNIT could overflow
            phy = mq_get_i64(b + pos)
            size = mq_get_i32(b + pos + 8)
            if phy < 0 or size <= 0:
                break
            if size != FILLER_SIZE or phy != 0:
                last = unit_end(phy, size)
            pos += CQ_UNIT
    return pos, last


def order_break(mapped, int64_t end, int64_t file_from, int64_t prev_end, int64_t prev_pos):
    """Check that the real units of [0, end) of a ConsumeQueue file follow each other in the
    CommitLog (phyOffset >= the previous real unit's phyOffset + size; fillers skipped), after
    a unit ending at prev_end (-1: none) at logical position prev_pos. Returns (logical
    position to cut at or -1, phyOffset + size of the last real unit, its logical position).
    The cut drops the unit before the first break as well: either may be the damaged one.
    Twin: mqstore.twin.consume_queue.order_break."""
    cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
    if end > view.shape[0]:
        end = view.shape[0]
    cdef const char *b = <const char *>&view[0] if view.shape[0] else NULL
    cdef int64_t pos = 0, phy, cut = -1
    cdef int32_t size
    with nogil:
        while pos + CQ_UNIT <= end:
            phy = mq_get_i64(b + pos)
            size = mq_get_i32(b + pos + 8)
            pos += CQ_UNIT
            if phy == 0 and size == FILLER_SIZE:
                continue
            if phy < prev_end:
                cut = prev_pos if prev_pos >= 0 else file_from + pos - CQ_UNIT
                break
            prev_end = unit_end(phy, size)
            prev_pos = file_from + pos - CQ_UNIT
    return cut, prev_end, prev_pos


def truncate_point(mapped, int64_t start, int64_t end, int64_t phy_limit):
    """First unit position in [start, end) whose record starts at or after phy_limit or that is
    invalid (spec §3 truncateDirtyLogicFiles), and phyOffset + size of the last kept unit.
    end is clamped to the buffer; ValueError for a negative start."""
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
    if end > view.shape[0]:
        end = view.shape[0]
    if end < 0:
        end = 0
    cdef const char *b = <const char *>&view[0] if view.shape[0] else NULL
    cdef int64_t pos = start, phy, last = -1
    cdef int32_t size
    while pos <= end - CQ_UNIT:
        phy = mq_get_i64(b + pos)
        size = mq_get_i32(b + pos + 8)
        if phy < 0 or size <= 0:
            break
        if size != FILLER_SIZE or phy != 0:
            if phy >= phy_limit:
                break
            last = unit_end(phy, size)
        pos += CQ_UNIT
    return pos, last


cdef class ConsumeQueueKernel:
    """The append state of one ConsumeQueue; see mqstore.queue.consume_queue.ConsumeQueue."""

    # attributes: _consumequeue.pxd

    def __init__(self, str topic, int queue_id, int64_t file_size, int log_id=0):
        if file_size <= 0 or file_size % CQ_UNIT:
            raise ValueError(f"ConsumeQueue file size {file_size} is not a positive multiple of {CQ_UNIT}")
        self.log_id = log_id
        self.topic = topic
        self.topic_b = topic.encode()
        self.queue_id = queue_id
        self.file_size = file_size
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        self.cur_file = None
        self.cur_base = NULL
        self.cur_from = -1
        self.cur_wrote = 0

    # -- publication to other processes ----------------------------------------------------
    def publish_to(self, control_block):
        """Publish the unit count after every append in the queue's topic-queue table slot of
        control_block (its ``dispatched_next``), so readers in other processes know how far the
        queue is built. Returns False (nothing published) when the queue has no slot."""
        self.published = NULL
        self.published_ctl = None
        if control_block is None:
            return False
        cdef bytes t = self.topic_b
        cdef char *ctl = (<ControlBlock?>control_block)._w()
        cdef mq_tq_slot *s = mq_tq_find(ctl, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), self.queue_id,
                                        mq_tq_hash(PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), self.queue_id))
        if s == NULL:
            return False
        self.published_ctl = control_block
        self.published = &s.dispatched_next
        mq_tq_publish_units(self.published, self.c_max_logic() // CQ_UNIT)
        return True

    # -- the current (last) file ---------------------------------------------------------
    def set_current_file(self, MappedFile mapped_file):
        """Make mapped_file (the queue's last file) the append target, at its wrote_position."""
        if mapped_file is None:
            self.cur_file = None
            self.cur_base = NULL
            self.cur_from = -1
            self.cur_wrote = 0
            return
        self.cur_file = mapped_file
        self.cur_base = mapped_file._b()
        self.cur_from = mapped_file.file_from
        self.cur_wrote = mapped_file.wrote_position
        # a file mapped from disk may be sparse past its units (allocate_for_units): it is taken
        # as allocated up to them only, so the blocks after them are allocated before a unit goes there
        cdef int64_t held = (self.cur_wrote + PAGE - 1) // PAGE * PAGE
        if mapped_file.allocated > held:
            mapped_file.allocated = held

    def sync_position(self):
        """Copy the C write position into the current MappedFile's wrote_position."""
        if self.cur_file is not None:
            self.cur_file.wrote_position = self.cur_wrote

    @property
    def current_file(self):
        return self.cur_file

    cdef int64_t c_max_logic(self) noexcept:
        # a queue whose files were all deleted keeps its logical position
        if self.cur_base == NULL:
            return self.min_logic_offset
        return self.cur_from + self.cur_wrote

    @property
    def max_logic_offset(self) -> int:
        """Byte offset after the last unit (min_logic_offset when the queue has no file)."""
        return self.c_max_logic()

    @property
    def max_offset_in_queue(self) -> int:
        """The next queue offset to be built (spec §3 maxOffsetInQueue)."""
        return self.max_logic_offset // CQ_UNIT

    # -- the append (spec §3 putMessagePositionInfo) --------------------------------------
    def put_message_position_info(self, int64_t phy, int32_t size, int64_t tags_code, int64_t queue_offset) -> bool:
        """Append the unit of queue_offset; False when it was already built (idempotent).
        ValueError when queue_offset lies more than MAX_GAP_UNITS past the queue's end."""
        cdef int r = self.put_unit(phy, size, tags_code, queue_offset)
        self.sync_position()
        if r == PUT_UNIT_TOO_FAR:
            raise ValueError(f"ConsumeQueue {self.topic}/{self.queue_id}: queue offset {queue_offset} lies more than "
                             f"{MAX_GAP_UNITS} units past the queue's end {self.c_max_logic() // CQ_UNIT}")
        return r == 1

    cdef int put_unit(self, int64_t phy, int32_t size, int64_t tags, int64_t q) except -1:
        """1 = appended, 0 = already built, PUT_UNIT_TOO_FAR = refused: q lies more than
        MAX_GAP_UNITS past the queue's end (a damaged QUEUEOFFSET, which no CRC covers; filling
        the gap could take the whole disk), nothing written. Slow paths (no file, file full,
        first file of a queue that starts above 0, a skipped offset) go through Python."""
        if phy + size <= self.max_physic_offset:
            return 0
        if q > INT64_MAX // CQ_UNIT:
            return PUT_UNIT_TOO_FAR
        cdef int64_t expect = q * CQ_UNIT
        cdef int64_t current
        if self.cur_base != NULL and self.cur_from >= 0 and \
                expect - (self.cur_from + self.cur_wrote) > <int64_t>MAX_GAP_UNITS * CQ_UNIT:
            return PUT_UNIT_TOO_FAR
        if self.cur_base == NULL or self.cur_wrote >= self.file_size or self.cur_from < 0:
            self._roll(expect)
        current = self.cur_from + self.cur_wrote
        if expect < current:
            return 0  # duplicate
        if expect > current:
            # RocketMQ logs "[BUG] order maybe wrong" and appends at the current position,
            # which breaks q <-> position for every later unit. We keep the mapping: the
            # skipped offsets become filler units (read as removed), counted in `gaps`.
            self._fill_gap(expect)
            if self.cur_base == NULL or self.cur_wrote >= self.file_size:
                self._roll(expect)
        if self.cur_wrote + CQ_UNIT > self.cur_file.allocated:
            allocate_for_units(self.cur_file, self.cur_wrote + CQ_UNIT)
        put_unit_bytes(self.cur_base + self.cur_wrote, phy, size, tags)
        self.cur_wrote += CQ_UNIT
        self.max_physic_offset = phy + size
        if self.published != NULL:
            mq_tq_publish_units(self.published, (self.cur_from + self.cur_wrote) // CQ_UNIT)
        return 1

    cdef int _roll(self, int64_t expect) except -1:
        self.sync_position()
        self.set_current_file(self.next_file(expect))
        if self.cur_base == NULL:
            raise OSError(f"ConsumeQueue {self.topic}/{self.queue_id}: no file for offset {expect // CQ_UNIT}")
        return 0

    cdef int _fill_gap(self, int64_t expect) except -1:
        cdef int64_t current = self.cur_from + self.cur_wrote
        log.error("ConsumeQueue %s/%d: expected queue offset %d but the queue ends at %d; the skipped "
                  "offsets are written as filler units", self.topic, self.queue_id, expect // CQ_UNIT,
                  current // CQ_UNIT)
        while current < expect:
            if self.cur_wrote >= self.file_size:
                self._roll(current)
            if self.cur_wrote + CQ_UNIT > self.cur_file.allocated:
                allocate_for_units(self.cur_file, self.cur_wrote + CQ_UNIT)
            put_unit_bytes(self.cur_base + self.cur_wrote, 0, FILLER_SIZE, 0)
            self.cur_wrote += CQ_UNIT
            self.gaps += 1
            current += CQ_UNIT
        return 0

    def next_file(self, int64_t expect):
        """The file to append the unit at byte offset expect to (overridden in Python)."""
        raise NotImplementedError
