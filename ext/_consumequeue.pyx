# cython: language_level=3
"""ConsumeQueue units, the dispatch (reput) parser and the getMessage scan (spec §3, §10.1, §11).

Three kernels share this module because they share the C-level state of a queue:

* ``ConsumeQueueKernel``: the append side of one ConsumeQueue (``consumequeue/<topic>/<queueId>/``,
  20-byte units ``long commitLogOffset | int size | long tagsCode``). The current file's base
  address and write position are C fields; a unit is appended without a Python call. The
  Python class ``mqstore.queue.consume_queue.ConsumeQueue`` extends it with files, recovery,
  truncation and flush.
* ``DispatchKernel``: follows the CommitLog, parses each record without its body
  (checkMessageAndReturnSize with readBody=false; the parse of mq_dispatch.pxd), computes the
  tags code from the properties, finds the record's queue through a C hash table and appends
  its unit. Records carrying keys are handed to the index builder in Python afterwards.
  ``apply`` appends the units of a batch that mqstore._reput parsed (concurrent dispatch).
* ``LogMap`` and ``get_units``: the CommitLog files by index (base addresses), and the
  getMessage scan over a ConsumeQueue slice (tag filter, transfer caps) in C.
"""

import logging

import warnings

cimport cython

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT32_MAX, INT64_MAX, INT64_MIN, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcmp, memcpy

from mq_bytes cimport *
from mq_ctl cimport *
from mq_dispatch cimport *
from mq_record cimport *
from mq_status cimport *

from mqstore._reput import ParsedBatch as _ParsedBatch

log = logging.getLogger("mqstore.consumequeue")

cdef enum:
    CQ_UNIT = 20
    FILLER_SIZE = 0x7FFFFFFF      # Integer.MAX_VALUE: size of the pre-fill units (spec §3 step 3)

CQ_STORE_UNIT_SIZE = CQ_UNIT
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


cdef inline int64_t unit_end(int64_t phy, int32_t size) noexcept nogil:
    """phyOffset + size of a unit, saturated to the int64 range: a damaged unit's phyOffset may
    lie near 2^63, and a wrapped (negative) end would let the units after it pass the order
    and truncation checks. Twin: mqstore.twin.consume_queue.unit_end."""
    if size > 0 and phy > INT64_MAX - size:
        return INT64_MAX
    if size < 0 and phy < INT64_MIN - size:
        return INT64_MIN
    return phy + size


cdef inline void put_unit_bytes(char *p, int64_t phy, int32_t size, int64_t tags) noexcept nogil:
    mq_put_i64(p, phy)
    mq_put_i32(p + 8, size)
    mq_put_i64(p + 12, tags)


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

    cdef readonly str topic
    cdef readonly bytes topic_b
    cdef readonly int queue_id
    cdef readonly int64_t file_size
    cdef public int64_t max_physic_offset   # phyOffset + size of the last unit built, -1 none
    cdef public int64_t min_logic_offset    # byte offset of the first unit in use
    cdef readonly int64_t gaps              # units written as fillers because an offset was skipped
    cdef object cur_file
    cdef char *cur_base
    cdef int64_t cur_from
    cdef int64_t cur_wrote
    cdef int64_t *published      # the queue's dispatched_next cell in the control block, or NULL
    cdef object published_ctl    # keeps that mapping alive
    cdef bint sync_due                      # the dispatch kernel appended units since the last sync

    def __init__(self, str topic, int queue_id, int64_t file_size):
        if file_size <= 0 or file_size % CQ_UNIT:
            raise ValueError(f"ConsumeQueue file size {file_size} is not a positive multiple of {CQ_UNIT}")
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
        cdef char *ctl = <char *><size_t>control_block.address
        cdef mq_tq_slot *s = mq_tq_find(ctl, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), self.queue_id,
                                        mq_tq_hash(PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), self.queue_id))
        if s == NULL:
            return False
        self.published_ctl = control_block
        self.published = &s.dispatched_next
        mq_tq_publish_units(self.published, self.c_max_logic() // CQ_UNIT)
        return True

    # -- the current (last) file ---------------------------------------------------------
    def set_current_file(self, mapped_file):
        """Make mapped_file (the queue's last file) the append target, at its wrote_position."""
        if mapped_file is None:
            self.cur_file = None
            self.cur_base = NULL
            self.cur_from = -1
            self.cur_wrote = 0
            return
        self.cur_file = mapped_file
        self.cur_base = <char *><size_t>mapped_file.address
        self.cur_from = mapped_file.file_from
        self.cur_wrote = mapped_file.wrote_position

    def sync_position(self):
        """Copy the C write position into the current MappedFile's wrote_position."""
        if self.cur_file is not None:
            self.cur_file.wrote_position = self.cur_wrote

    @property
    def current_file(self):
        return self.cur_file

    cdef inline int64_t c_max_logic(self) noexcept:
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
        """Append the unit of queue_offset; False when it was already built (idempotent)."""
        cdef int r = self.put_unit(phy, size, tags_code, queue_offset)
        self.sync_position()
        return r == 1

    cdef int put_unit(self, int64_t phy, int32_t size, int64_t tags, int64_t q) except -1:
        """1 = appended, 0 = already built. Slow paths (no file, file full, first file of a
        queue that starts above 0, a skipped offset) go through Python."""
        if phy + size <= self.max_physic_offset:
            return 0
        cdef int64_t expect = q * CQ_UNIT
        cdef int64_t current
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
            put_unit_bytes(self.cur_base + self.cur_wrote, 0, FILLER_SIZE, 0)
            self.cur_wrote += CQ_UNIT
            self.gaps += 1
            current += CQ_UNIT
        return 0

    def next_file(self, int64_t expect):
        """The file to append the unit at byte offset expect to (overridden in Python)."""
        raise NotImplementedError


# -- the dispatch kernel -----------------------------------------------------------------------

# Test hook of DispatchKernel._grow (tests/test_status_codes.py): 1 or 2 makes the first
# (hashes) or the second (queues) allocation of the next table growth fail; 0 = none.
cdef int _grow_fault = 0


def _fail_next_grow_allocation(int which) -> None:
    """Test hook: the next DispatchKernel table growth (any kernel's, including the first in
    __init__) sees its allocation number which (1: hashes, 2: queues) fail; 0 disarms."""
    global _grow_fault
    if which < 0 or which > 2:
        raise ValueError(f"which must be 0, 1 or 2, not {which}")
    _grow_fault = which


cdef class DispatchKernel:
    """Parses CommitLog records (no body) and appends their ConsumeQueue units (spec §10.1).

    ``lookup(topic, queue_id)`` returns the ConsumeQueue of a record's queue (created on
    first use), or None for a queue that cannot exist (a topic that is not valid UTF-8 or
    cannot name a directory, a negative queue id: a damaged or foreign record); such a record
    builds no unit, is counted in ``skipped`` and reported to ``on_skipped``, and dispatch
    goes on with the next record. Results are cached in a C hash table keyed like the control block's
    topic-queue table. Records with KEYS or UNIQ_KEY are collected in ``index_requests`` as
    (topic, keys, uniq_key, phy_offset, store_timestamp, sys_flag) when index building is on.
    """

    cdef object lookup
    cdef uint64_t *hashes
    cdef PyObject **queues
    cdef int64_t cap
    cdef int64_t used
    cdef public bint index_enable
    cdef public list index_requests
    cdef int64_t delays[MQ_MAX_DELAY_LEVEL]
    cdef int n_delays
    cdef char *ctl
    cdef object ctl_obj
    cdef ConsumeQueueKernel last_cq   # the queue of the previous record (runs of one queue are common)
    cdef list touched                 # queues appended to since the last sync (their sync_due is set)
    cdef public object on_skipped     # on_skipped(phy_offset, topic_bytes, queue_id) per record skipped
    cdef readonly int64_t skipped     # records whose queue cannot exist (lookup returned None)

    def __cinit__(self):
        self.hashes = NULL
        self.queues = NULL

    def __init__(self, lookup, *, bint index_enable=True, delay_levels_ms=(), control_block=None,
                 on_skipped=None):
        self.lookup = lookup
        self.on_skipped = on_skipped
        self.index_enable = index_enable
        self.index_requests = []
        self.touched = []
        self.n_delays = set_delay_levels(self.delays, delay_levels_ms)
        self.ctl_obj = control_block
        self.ctl = NULL if control_block is None else <char *><size_t>control_block.address
        self._grow(64)

    def __dealloc__(self):
        cdef int64_t i
        if self.queues != NULL:
            for i in range(self.cap):
                Py_XDECREF(self.queues[i])
            free(self.queues)
        if self.hashes != NULL:
            free(self.hashes)

    cdef int _grow(self, int64_t cap) except -1:
        """Rehash the queue cache into tables of cap slots (a power of two). When an allocation
        fails, only what was allocated here is freed and MemoryError raised: the old tables,
        cap and used stay as they were, so the cache keeps working at its old size."""
        global _grow_fault
        cdef int fault = _grow_fault
        _grow_fault = 0
        cdef uint64_t *new_h = NULL
        cdef PyObject **new_q = NULL
        cdef int64_t i, at
        if fault != 1:
            new_h = <uint64_t *>calloc(cap, sizeof(uint64_t))
        if fault != 2:
            new_q = <PyObject **>calloc(cap, sizeof(PyObject *))
        if new_h == NULL or new_q == NULL:
            free(new_h)
            free(new_q)
            raise MemoryError()
        for i in range(self.cap):
            if self.hashes[i] != 0:
                at = <int64_t>(self.hashes[i] & <uint64_t>(cap - 1))
                while new_h[at] != 0:
                    at = (at + 1) & (cap - 1)
                new_h[at] = self.hashes[i]
                new_q[at] = self.queues[i]
        free(self.hashes)
        free(self.queues)
        self.hashes = new_h
        self.queues = new_q
        self.cap = cap
        return 0

    def forget(self):
        """Drop every cached queue (after queues were destroyed or replaced)."""
        cdef int64_t i
        for i in range(self.cap):
            Py_XDECREF(self.queues[i])
            self.queues[i] = NULL
            self.hashes[i] = 0
        self.used = 0

    cdef ConsumeQueueKernel _queue(self, const char *topic, int tlen, int32_t qid):
        cdef uint64_t h = mq_tq_hash(topic, tlen, qid)
        cdef int64_t at = <int64_t>(h & <uint64_t>(self.cap - 1))
        cdef ConsumeQueueKernel cq
        while self.hashes[at] != 0:
            if self.hashes[at] == h:
                cq = <ConsumeQueueKernel>self.queues[at]
                if cq.queue_id == qid and PyBytes_GET_SIZE(cq.topic_b) == tlen and \
                        memcmp(PyBytes_AS_STRING(cq.topic_b), topic, tlen) == 0:
                    return cq
            at = (at + 1) & (self.cap - 1)
        try:
            topic_s = PyUnicode_DecodeUTF8(topic, tlen, "strict")
        except UnicodeDecodeError:
            return None
        cq = self.lookup(topic_s, qid)
        if cq is None:
            return None
        if (self.used + 1) * 2 > self.cap:
            self._grow(self.cap * 2)
            at = <int64_t>(h & <uint64_t>(self.cap - 1))
            while self.hashes[at] != 0:
                at = (at + 1) & (self.cap - 1)
        Py_INCREF(cq)
        self.hashes[at] = h
        self.queues[at] = <PyObject *>cq
        self.used += 1
        return cq

    cdef int _apply_entry(self, const char *rec, DispatchEntry *e, bint raise_table) except -1:
        """Append the unit of the parsed record at rec, if it builds one; 1 if appended, 0 if
        not (no unit, or already built). With raise_table, the queue's next offset in the
        control block's topic-queue table is raised to queue_offset + 1."""
        if not (e.flags & MQ_ENTRY_UNIT):
            return 0
        cdef const char *topic = rec + e.topic_pos
        cdef int tlen = e.topic_len
        cdef int32_t qid = e.queue_id
        cdef ConsumeQueueKernel cq = self.last_cq
        cdef mq_tq_slot *slot
        if cq is None or cq.queue_id != qid or PyBytes_GET_SIZE(cq.topic_b) != tlen or \
                memcmp(PyBytes_AS_STRING(cq.topic_b), topic, tlen) != 0:
            cq = self._queue(topic, tlen, qid)
            if cq is None:
                self._skip(e.phy_offset, topic, tlen, qid)
                return 0
            self.last_cq = cq
            if not cq.sync_due:
                cq.sync_due = True
                self.touched.append(cq)
        cdef int r = cq.put_unit(e.phy_offset, e.size, e.tags_code, e.queue_offset)
        if raise_table and self.ctl != NULL:
            slot = mq_tq_get_or_insert(self.ctl, topic, tlen, qid)
            if slot == NULL:
                raise OverflowError("topic-queue table is full while rebuilding; raise topic_queue_table_slots")
            mq_max(&slot.next_offset, e.queue_offset + 1)
        return r

    cdef int _skip(self, int64_t phy, const char *topic, int tlen, int32_t qid) except -1:
        self.skipped += 1
        if self.on_skipped is not None:
            self.on_skipped(phy, PyBytes_FromStringAndSize(topic, tlen), qid)
        return 0

    cdef int _sync_touched(self) except -1:
        """Publish the write positions of the queues appended to in the MappedFiles (once per
        call, not at every switch between queues: readers use the C positions)."""
        cdef ConsumeQueueKernel cq
        self.last_cq = None
        for cq in self.touched:
            cq.sync_due = False
            cq.sync_position()
        self.touched.clear()
        return 0

    def dispatch(self, mapped, int64_t file_from, int64_t start, int64_t end, bint raise_table=False,
                 int64_t stop_after=-1):
        """Dispatch the records of one CommitLog file from position start to end.

        Returns (stop, reason, records, units, last_store_timestamp) with reason "end",
        "blank" (end-of-file record: continue at the next file) or "invalid" (a record that
        does not parse, at stop). With raise_table, each queue's next offset in the control
        block's topic-queue table is raised to queue_offset + 1 (start-up dispatch).
        stop_after >= 0 ends the call at the first record boundary at or after it (a soft
        limit: ``end`` must be the readable end, so records are never cut).
        """
        cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
        if end > view.shape[0]:
            end = view.shape[0]
        cdef const char *b = <const char *>&view[0] if view.shape[0] else NULL
        cdef int64_t pos = start, records = 0, units = 0, last_ts = -1
        cdef int r
        cdef DispatchEntry e
        reason = "end"
        try:
            while pos < end:
                if 0 <= stop_after <= pos:
                    break
                mq_prefetch(b + pos + MQ_PREFETCH_AHEAD)
                r = parse_dispatch_entry(b + pos, end - pos, pos, self.delays, self.n_delays, &e)
                if r == MQ_PARSE_BLANK:
                    reason = "blank"
                    break
                if r != MQ_PARSE_OK:
                    reason = "invalid"
                    break
                if e.flags & MQ_ENTRY_TAGS_PENDING:
                    e.tags_code = tags_hash(b + pos + e.tags_pos, e.tags_len)
                units += self._apply_entry(b + pos, &e, raise_table)
                if self.index_enable and e.flags & MQ_ENTRY_INDEX:
                    self.index_requests.append((
                        PyUnicode_DecodeUTF8(b + pos + e.topic_pos, e.topic_len, "replace"),
                        PyUnicode_DecodeUTF8(b + pos + e.keys_pos, e.keys_len, "replace") if e.keys_pos >= 0 else None,
                        PyUnicode_DecodeUTF8(b + pos + e.uniq_pos, e.uniq_len, "replace") if e.uniq_pos >= 0 else None,
                        e.phy_offset, e.store_timestamp, e.sys_flag))
                last_ts = e.store_timestamp
                records += 1
                pos += e.size
        finally:
            self._sync_touched()
        return pos, reason, records, units, last_ts

    def apply(self, batch, bint raise_table=False):
        """Append the units of a batch parsed by mqstore._reput.BatchParser, in record order
        (the in-order step of the concurrent dispatch, spec §10.2); returns the units appended.
        Each queue of the batch is looked up once; the parser computed the tags codes, and its
        index keys go to the index separately. With raise_table as in dispatch()."""
        if not isinstance(batch, _ParsedBatch):
            raise TypeError(f"expected a mqstore._reput.ParsedBatch, got {type(batch).__name__}")
        cdef const char *b = <const char *><size_t>batch.mapped_address
        cdef const BatchQueue *queues = <const BatchQueue *><size_t>batch.queues_address
        cdef const BatchUnit *units = <const BatchUnit *><size_t>batch.units_address
        cdef int64_t i, n = batch.unit_count, nq = batch.queue_count, appended = 0
        cdef const BatchUnit *u
        cdef ConsumeQueueKernel cq
        if n == 0:
            return 0
        cdef list targets = []     # holds the queues cqs points to
        cdef PyObject **cqs = <PyObject **>calloc(nq, sizeof(PyObject *))
        cdef mq_tq_slot **slots = <mq_tq_slot **>calloc(nq, sizeof(mq_tq_slot *))
        try:
            if cqs == NULL or slots == NULL:
                raise MemoryError()
            for i in range(nq):
                cq = self._queue(b + queues[i].topic_at, queues[i].topic_len, queues[i].queue_id)
                if cq is None:
                    continue  # its units are skipped (and reported) below
                targets.append(cq)
                cqs[i] = <PyObject *>cq
                if not cq.sync_due:
                    cq.sync_due = True
                    self.touched.append(cq)
                if raise_table and self.ctl != NULL:
                    slots[i] = mq_tq_get_or_insert(self.ctl, b + queues[i].topic_at, queues[i].topic_len,
                                                   queues[i].queue_id)
                    if slots[i] == NULL:
                        raise OverflowError("topic-queue table is full while rebuilding; "
                                            "raise topic_queue_table_slots")
            for i in range(n):
                u = &units[i]
                if cqs[u.queue] == NULL:
                    self._skip(u.phy_offset, b + queues[u.queue].topic_at, queues[u.queue].topic_len,
                               queues[u.queue].queue_id)
                    continue
                cq = <ConsumeQueueKernel>cqs[u.queue]
                appended += cq.put_unit(u.phy_offset, u.size, u.tags_code, u.queue_offset)
                if slots[u.queue] != NULL:
                    mq_max(&slots[u.queue].next_offset, u.queue_offset + 1)
        finally:
            free(cqs)
            free(slots)
            self._sync_touched()
        return appended


# -- reads ----------------------------------------------------------------------------------------

cdef class LogMap:
    """CommitLog files by index for C readers: base address of file k (start first_from +
    k * file_size), NULL when not mapped. Keeps the mappings it points into alive.

    A file is mapped here only while it is available (not being deleted). The map pins each
    mapping with a memoryview, not with the file's reference count: an exported buffer defers
    munmap (MappedFile._cleanup), so the addresses stay valid for as long as this map or any
    result or view taken from it lives, while the retention service can still delete the
    file at once (spec §14; a held reference would stall every deletion until the forced
    interval). Readers rebuild the map when the file list changes, dropping such files."""

    cdef readonly int64_t file_size
    cdef readonly int64_t first_from
    cdef readonly list files
    cdef list views      # one memoryview per mapped file: keeps the mapping alive
    cdef object bases_array
    cdef int64_t n
    cdef char **bases

    def __cinit__(self):
        self.bases = NULL

    def __init__(self, files, int64_t file_size):
        self.file_size = file_size
        self.files = list(files)
        self.n = len(self.files)
        self.first_from = self.files[0].file_from if self.files else 0
        self.bases = <char **>calloc(max(self.n, 1), sizeof(char *))
        if self.bases == NULL:
            raise MemoryError()
        cdef int64_t k
        views = [None] * self.n
        for mf in self.files:
            k = (mf.file_from - self.first_from) // file_size
            if 0 <= k < self.n and mf.is_available:
                try:
                    view = memoryview(mf)
                except ValueError:  # unmapped by a deletion since the list was taken
                    continue
                views[k] = view
                self.bases[k] = <char *><size_t>mf.address
        self.views = views

    def __dealloc__(self):
        free(self.bases)

    def __len__(self):
        return self.n

    @property
    def end(self) -> int:
        """First offset past the mapped files."""
        return self.first_from + self.n * self.file_size

    cdef inline const char *at(self, int64_t phy, int64_t size) noexcept nogil:
        """Address of [phy, phy + size) if it lies inside one mapped file, else NULL."""
        if phy < self.first_from:
            return NULL
        cdef int64_t k = (phy - self.first_from) // self.file_size
        cdef int64_t pos = (phy - self.first_from) % self.file_size
        if k >= self.n or self.bases[k] == NULL or pos + size > self.file_size:
            return NULL
        return self.bases[k] + pos

    cdef object slice_of(self, int64_t phy, int64_t size):
        """A zero-copy memoryview of [phy, phy + size) (inside one file; checked by callers)."""
        cdef int64_t pos = (phy - self.first_from) % self.file_size
        return self.views[(phy - self.first_from) // self.file_size][pos:pos + size]

    def base_addresses(self):
        """The base addresses as an array('q') (0 = not mapped), for the time-search kernel
        (built once per map)."""
        if self.bases_array is None:
            from array import array
            self.bases_array = array("q", [<int64_t><size_t>self.bases[k] for k in range(self.n)])
        return self.bases_array

    def file_of(self, int64_t phy):
        """The MappedFile holding phy, or None."""
        if phy < self.first_from:
            return None
        cdef int64_t k = (phy - self.first_from) // self.file_size
        if k >= self.n:
            return None
        return self.files[k]

    def store_timestamp(self, int64_t phy) -> int:
        """STORETIMESTAMP of the record at phy, -1 if its file is not mapped."""
        cdef const char *r = self.at(phy, 80)
        if r == NULL:
            return -1
        return mq_get_i64(r + store_timestamp_pos(mq_get_i32(r + MQ_POS_SYSFLAG)))


@cython.freelist(64)
cdef class GetMessageResult:
    """What getMessage found (spec §11): status, next_begin_offset, min/max offsets, and the
    messages as zero-copy views on the mapped CommitLog files (decoded on access).

    ``len(result)``, ``result[i]`` and iteration give MessageView objects; ``buffers()``
    gives one memoryview per message. The result keeps the files it points into mapped.
    """

    cdef public object status
    cdef public int64_t next_begin_offset
    cdef public int64_t min_offset
    cdef public int64_t max_offset
    cdef public bint suggest_pulling_from_slave
    cdef public int64_t buffer_total_size
    cdef public int64_t max_phy_offset_pulling
    cdef LogMap log_map
    cdef int64_t *phys
    cdef int32_t *sizes
    cdef int count
    cdef int cap

    def __cinit__(self):
        self.phys = NULL
        self.sizes = NULL
        self.count = 0
        self.cap = 0

    def __init__(self, status, int64_t next_begin_offset=0, int64_t min_offset=0, int64_t max_offset=0):
        self.status = status
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.suggest_pulling_from_slave = False
        self.buffer_total_size = 0
        self.max_phy_offset_pulling = 0

    def __dealloc__(self):
        free(self.phys)
        free(self.sizes)

    cdef int _reserve(self, int n) except -1:
        if n <= self.cap:
            return 0
        cdef int64_t *p = <int64_t *>calloc(n, sizeof(int64_t))
        cdef int32_t *s = <int32_t *>calloc(n, sizeof(int32_t))
        if p == NULL or s == NULL:
            free(p)
            free(s)
            raise MemoryError()
        if self.count:
            memcpy(p, self.phys, self.count * sizeof(int64_t))
            memcpy(s, self.sizes, self.count * sizeof(int32_t))
        free(self.phys)
        free(self.sizes)
        self.phys = p
        self.sizes = s
        self.cap = n
        return 0

    @property
    def message_count(self) -> int:
        return self.count

    @property
    def ok(self) -> bool:
        return self.count > 0

    def __len__(self):
        return self.count

    def __bool__(self):
        return True

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError("message index out of range")
        return self._view(i)

    cdef MessageView _view(self, int i):
        return make_view(self.log_map, self.phys[i], self.sizes[i])

    def __iter__(self):
        cdef int i
        return iter([make_view(self.log_map, self.phys[i], self.sizes[i]) for i in range(self.count)])

    @property
    def physical_offsets(self) -> list:
        return [self.phys[i] for i in range(self.count)]

    @property
    def sizes_list(self) -> list:
        return [self.sizes[i] for i in range(self.count)]

    def buffers(self) -> list:
        """One zero-copy memoryview per message (the whole record)."""
        cdef int i
        cdef LogMap m = self.log_map
        return [m.slice_of(self.phys[i], self.sizes[i]) for i in range(self.count)]

    def __repr__(self):
        return (f"GetMessageResult(status={self.status!r}, messages={self.count}, "
                f"next_begin_offset={self.next_begin_offset}, min_offset={self.min_offset}, "
                f"max_offset={self.max_offset})")


cdef MessageView make_view(LogMap log_map, int64_t phy, int32_t size):
    cdef MessageView v = MessageView.__new__(MessageView)
    v.owner = log_map
    v.p = log_map.at(phy, size)
    v._phy = phy
    v._size = size
    return v


def view_at(LogMap log_map, int64_t phy):
    """The record at phy as a MessageView (its size read from the record), or None when phy
    is not in a mapped file or does not hold a message (spec §11 lookMessageByOffset)."""
    return c_view_at(log_map, phy)


cdef object c_view_at(LogMap log_map, int64_t phy):
    cdef const char *p = log_map.at(phy, 8)
    if p == NULL:
        return None
    cdef int32_t size = mq_get_i32(p), magic = mq_get_i32(p + 4)
    if (magic != MQ_MESSAGE_MAGIC_CODE and magic != MQ_MESSAGE_MAGIC_CODE_V2) or size < 91 or \
            log_map.at(phy, size) == NULL:
        return None
    return make_view(log_map, phy, size)


@cython.freelist(512)
@cython.final
cdef class MessageView:
    """One stored record, read in place from the mapped CommitLog file. Header fields are
    read on access; ``body`` and ``buffer`` are zero-copy memoryviews; ``decode()`` gives
    the full mqstore.log.record.DecodedRecord. The view keeps the files it points into mapped."""

    cdef object owner
    cdef const char *p
    cdef int64_t _phy
    cdef int32_t _size
    cdef RecordHead _h
    cdef bint _parsed

    @property
    def physical_offset(self) -> int:
        """Where the record starts in the CommitLog (PHYSICALOFFSET, spec §1)."""
        return self._phy

    @property
    def total_size(self) -> int:
        """The record's length in bytes (TOTALSIZE, spec §1)."""
        return self._size

    @property
    def phy(self) -> int:
        """Deprecated alias of physical_offset."""
        warnings.warn("MessageView.phy is deprecated; use physical_offset", DeprecationWarning, stacklevel=2)
        return self._phy

    @property
    def size(self) -> int:
        """Deprecated alias of total_size."""
        warnings.warn("MessageView.size is deprecated; use total_size", DeprecationWarning, stacklevel=2)
        return self._size

    cdef inline int _fixed(self) except -1:
        """The fixed header fields lie inside the record (a ConsumeQueue unit may claim a
        size too small for them)."""
        if self._size < MQ_MIN_RECORD:
            from mqstore.errors import CorruptRecordError
            raise CorruptRecordError(f"the record at physical offset {self._phy} is damaged: {self._size} bytes "
                                     f"cannot hold a record's header")
        return 0

    cdef int _parse(self) except -1:
        """Locate the variable parts (spec §5.3 checks, bounded by the record's size); a
        record whose lengths disagree raises CorruptRecordError naming its offset instead
        of reading past it."""
        if self._parsed:
            return 0
        if self._size < MQ_MIN_RECORD or parse_record_head(self.p, self._size, &self._h) != MQ_PARSE_OK:
            from mqstore.errors import CorruptRecordError
            raise CorruptRecordError(f"the record at physical offset {self._phy} is damaged: its lengths do not "
                                     f"fit its {self._size} bytes")
        self._parsed = True
        return 0

    @property
    def queue_id(self) -> int:
        """The queue the record was put to (QUEUEID)."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_QUEUEID)

    @property
    def flag(self) -> int:
        """The message's FLAG, as the producer set it."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_FLAG)

    @property
    def queue_offset(self) -> int:
        """The record's offset in its queue (QUEUEOFFSET)."""
        self._fixed()
        return mq_get_i64(self.p + MQ_POS_QUEUEOFFSET)

    @property
    def sys_flag(self) -> int:
        """SYSFLAG: compression, transaction type, IPv6 host bits (spec §1.3)."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_SYSFLAG)

    @property
    def born_timestamp(self) -> int:
        """When the producer created the message (ms since the epoch)."""
        self._fixed()
        return mq_get_i64(self.p + MQ_POS_BORNTIMESTAMP)

    @property
    def store_timestamp(self) -> int:
        """When the store appended the record (ms since the epoch)."""
        self._fixed()
        return mq_get_i64(self.p + store_timestamp_pos(mq_get_i32(self.p + MQ_POS_SYSFLAG)))

    @property
    def body_crc(self) -> int:
        """The CRC32 of the body as stored (BODYCRC). A store's reads compared it with the body
        before returning the message when check_crc_on_read is on (the default)."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_BODYCRC)

    @property
    def reconsume_times(self) -> int:
        """RECONSUMETIMES: how often the message was redelivered."""
        self._parse()
        return mq_get_i32(self.p + self._h.body_pos - 16)

    @property
    def prepared_transaction_offset(self) -> int:
        """PREPAREDTRANSACTIONOFFSET of a transaction message."""
        self._parse()
        return mq_get_i64(self.p + self._h.body_pos - 12)

    def _file_view(self):
        return (<LogMap>self.owner).slice_of(self._phy, self._size)

    @property
    def buffer(self) -> memoryview:
        """The whole record, zero-copy."""
        return self._file_view()

    @property
    def body(self) -> memoryview:
        """The body bytes, zero-copy (bytes(view.body) copies)."""
        self._parse()
        return (<LogMap>self.owner).slice_of(self._phy + self._h.body_pos, self._h.body_len)

    @property
    def topic(self) -> str:
        """The topic the record was stored under."""
        self._parse()
        return PyUnicode_DecodeUTF8(self.p + self._h.topic_pos, self._h.topic_len, "strict")

    @property
    def properties_string(self) -> str:
        """The properties as stored: name\\x01value pairs joined by \\x02."""
        self._parse()
        return PyUnicode_DecodeUTF8(self.p + self._h.props_pos, self._h.props_len, "strict")

    @property
    def properties(self) -> dict:
        """The properties as a dict (TAGS, KEYS, UNIQ_KEY, user properties ...)."""
        from mqstore._codec import string_to_properties
        return string_to_properties(self.properties_string)

    @property
    def tags(self):
        """The TAGS property, or None."""
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list:
        """The KEYS property split on spaces."""
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def msg_id(self) -> str:
        """RocketMQ's offset message id: the store host and the physical offset, in hex."""
        from mqstore._codec import msg_id
        return msg_id(self.decode(read_body=False).store_host, self._phy)

    def decode(self, *, bint read_body=True, bint check_crc=False):
        """Every field as a mqstore.log.record.DecodedRecord (copies the body)."""
        from mqstore._codec import decode_record
        return decode_record(self._file_view(), 0, check_crc=check_crc, read_body=read_body)

    def __repr__(self):
        return (f"MessageView(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"physical_offset={self._phy}, total_size={self._size})")


cdef struct ScanLimits:
    int64_t min_phy
    int64_t max_phy
    int max_msg_nums
    int64_t in_memory_bytes_limit
    int64_t max_bytes_memory
    int max_count_memory
    int64_t max_bytes_disk
    int max_count_disk
    int64_t scan_bytes_max


cdef int scan_units_into(GetMessageResult result, LogMap log_map, const char *b, int64_t pos, int64_t end,
                         const ScanLimits *lim, tag_codes, int64_t *consumed) except -1:
    """The getMessage scan (spec §11) over units [pos, end) at b; fills result and returns
    the status code (MQ_GET_*), the number of units consumed in *consumed."""
    if pos + lim.scan_bytes_max < end:
        end = pos + lim.scan_bytes_max
    cdef int64_t start = pos, phy, tags, total = 0, next_file_start = -1, last_phy = -1
    cdef int32_t size
    cdef int count = 0, status = MQ_GET_NO_MATCHED_MESSAGE, i, ntags = 0
    cdef int max_msg_nums = lim.max_msg_nums
    cdef bint in_disk, match
    cdef int64_t codes[32]
    cdef bint filter_tags = tag_codes is not None
    cdef frozenset many = None
    if filter_tags:
        if len(tag_codes) <= 32:
            for t in tag_codes:
                codes[ntags] = t
                ntags += 1
        else:
            many = frozenset(tag_codes)
    result.log_map = log_map
    # max_msg_nums < 1 still returns one message, as RocketMQ's isTheBatchFull never ends an
    # empty batch
    result._reserve(1 if max_msg_nums < 1 else max_msg_nums if max_msg_nums < 1024 else 1024)
    while pos + CQ_UNIT <= end:
        phy = mq_get_i64(b + pos)
        size = mq_get_i32(b + pos + 8)
        tags = mq_get_i64(b + pos + 12)
        if next_file_start >= 0 and phy < next_file_start:
            pos += CQ_UNIT
            continue
        in_disk = lim.max_phy - phy > lim.in_memory_bytes_limit
        if count > 0:  # isTheBatchFull: never before something was collected
            if count >= max_msg_nums:
                break
            if in_disk:
                if total + size > lim.max_bytes_disk or count >= lim.max_count_disk:
                    break
            elif total + size > lim.max_bytes_memory or count >= lim.max_count_memory:
                break
        last_phy = phy
        if filter_tags:
            if many is not None:
                match = tags in many
            else:
                match = False
                for i in range(ntags):
                    if codes[i] == tags:
                        match = True
                        break
            if not match:
                pos += CQ_UNIT
                continue
        if phy < lim.min_phy or size <= 0 or size == FILLER_SIZE or log_map.at(phy, size) == NULL:
            if count == 0:
                status = MQ_GET_MESSAGE_WAS_REMOVING
            if phy >= 0:
                next_file_start = phy - phy % log_map.file_size + log_map.file_size
            pos += CQ_UNIT
            continue
        if count >= result.cap:
            result._reserve(result.cap * 2 if result.cap > 0 else 16)
        result.phys[count] = phy
        result.sizes[count] = size
        total += size
        count += 1
        status = MQ_GET_FOUND
        pos += CQ_UNIT
    result.count = count
    result.buffer_total_size = total
    result.max_phy_offset_pulling = last_phy
    consumed[0] = (pos - start) // CQ_UNIT
    return status


# -- the read kernel: getMessage and lookups by queue offset in one C call ---------------------------

cdef enum:
    TAG_CACHE_MAX = 1024

from mqstore.status import GetMessageStatus as _GetMessageStatus

cdef tuple _STATUSES = tuple(sorted(_GetMessageStatus, key=int))


cdef class ReadKernel:
    """The C side of mqstore.queue.reads.MessageReader.

    getMessage and the look-ups by queue offset run here in one call: the queue is found in
    the ConsumeQueue table's dict, its units are read through the queue's C append state
    when they lie in its current (last) file (where consumers near the tail read), else
    through the queue's Python ``get_index_buffer``; the CommitLog files come from a cached
    LogMap rebuilt when the file list changes (its ``version``); the CommitLog's readable end
    is read from the control block. Subscription expressions are parsed once and cached.
    """

    cdef dict k_queues
    cdef object k_log_files
    cdef object k_ctl_obj
    cdef char *k_ctl
    cdef LogMap k_lmap
    cdef object k_lmap_version
    cdef dict k_tag_cache
    cdef ScanLimits k_lim

    def __init__(self, dict queues, log_files, control_block):
        self.k_queues = queues
        self.k_log_files = log_files
        self.k_ctl_obj = control_block
        self.k_ctl = <char *><size_t>control_block.address
        self.k_lmap = None
        self.k_lmap_version = None
        self.k_tag_cache = {}
        # no caps until set_transfer_limits (MessageReader sets them from the store's config)
        self.k_lim.in_memory_bytes_limit = 0
        self.k_lim.max_bytes_memory = INT64_MAX
        self.k_lim.max_count_memory = INT32_MAX
        self.k_lim.max_bytes_disk = INT64_MAX
        self.k_lim.max_count_disk = INT32_MAX

    def set_transfer_limits(self, *, int64_t max_bytes_memory, int max_count_memory, int64_t max_bytes_disk,
                            int max_count_disk):
        """getMessage's caps for a batch read from memory / from disk (spec §11 isTheBatchFull)."""
        self.k_lim.max_bytes_memory = max_bytes_memory
        self.k_lim.max_count_memory = max_count_memory
        self.k_lim.max_bytes_disk = max_bytes_disk
        self.k_lim.max_count_disk = max_count_disk

    @property
    def in_memory_limit(self) -> int:
        """Bytes behind the CommitLog end still counted as in memory (spec §11: RAM ×
        access_message_in_memory_max_ratio); older messages get the on-disk transfer caps."""
        return self.k_lim.in_memory_bytes_limit

    @in_memory_limit.setter
    def in_memory_limit(self, int64_t value):
        self.k_lim.in_memory_bytes_limit = value

    cpdef LogMap log_map(self):
        """The CommitLog files as the C readers see them (rebuilt when a file is added or removed)."""
        version = self.k_log_files.version
        cdef LogMap lmap = self.k_lmap
        if lmap is None or version != self.k_lmap_version:
            lmap = LogMap(self.k_log_files.files, self.k_log_files.file_size)
            self.k_lmap = lmap
            self.k_lmap_version = version
        return lmap

    def forget_log_map(self):
        """Drop the cached LogMap (its file list changed): the mappings of deleted files go
        as soon as no result or view taken from it is left (MappedFileQueue.on_files_removed)."""
        self.k_lmap = None

    cdef inline int64_t readable_end(self) noexcept:
        return mq_load(mq_cell(self.k_ctl, MQ_CTL_WROTE))

    cpdef object tag_codes(self, tags):
        """Tags codes of a subscription expression "A || B" (spec §11), cached; None = all."""
        if tags is None:
            return None
        codes = self.k_tag_cache.get(tags, self)
        if codes is not self:
            return codes
        if type(tags) is not str:
            raise TypeError(f"tags must be a str expression, got {type(tags).__name__}")
        expression = (<str>tags).strip()
        if not expression or expression == "*":
            codes = None
        else:
            from mqstore._codec import java_string_hash
            codes = frozenset(map(java_string_hash, filter(None, map(str.strip, expression.split("||")))))
        if len(self.k_tag_cache) >= TAG_CACHE_MAX:
            self.k_tag_cache.clear()
        self.k_tag_cache[tags] = codes
        return codes

    cdef GetMessageResult _result(self, int status, int64_t next_begin, int64_t min_offset, int64_t max_offset):
        cdef GetMessageResult r = GetMessageResult.__new__(GetMessageResult)
        r.status = _STATUSES[status]
        r.next_begin_offset = next_begin
        r.min_offset = min_offset
        r.max_offset = max_offset
        r.suggest_pulling_from_slave = False
        r.buffer_total_size = 0
        r.max_phy_offset_pulling = 0
        return r

    def get_message(self, group, str topic, int queue_id, int64_t offset, int max_msg_nums, tags=None):
        """getMessage (spec §11): up to max_msg_nums messages of a queue from offset."""
        cq_obj = self.k_queues.get((topic, queue_id))
        if cq_obj is None:
            return self._result(MQ_GET_NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        cdef ConsumeQueueKernel cq = <ConsumeQueueKernel>cq_obj
        cdef int64_t min_offset = cq.min_logic_offset // CQ_UNIT
        cdef int64_t max_offset = cq.c_max_logic() // CQ_UNIT
        if max_offset == 0:
            return self._result(MQ_GET_NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
        if offset < min_offset:
            return self._result(MQ_GET_OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return self._result(MQ_GET_OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            return self._result(MQ_GET_OFFSET_OVERFLOW_BADLY, max_offset, min_offset, max_offset)
        codes = self.tag_codes(tags)
        cdef LogMap lmap = self.log_map()
        cdef GetMessageResult r = self._result(MQ_GET_NO_MATCHED_MESSAGE, offset, min_offset, max_offset)
        cdef int64_t logic = offset * CQ_UNIT, consumed = 0, end, per_file
        cdef int status
        cdef const unsigned char[::1] view
        self.k_lim.max_phy = self.readable_end()
        self.k_lim.min_phy = lmap.first_from
        self.k_lim.max_msg_nums = max_msg_nums
        self.k_lim.scan_bytes_max = max(16000, <int64_t>max_msg_nums * CQ_UNIT)
        if cq.cur_base != NULL and cq.cur_from <= logic:
            # the current file: its units up to the C write position
            end = cq.cur_wrote if cq.cur_wrote < cq.file_size else cq.file_size
            status = scan_units_into(r, lmap, cq.cur_base, logic - cq.cur_from, end, &self.k_lim, codes, &consumed)
        else:
            got = cq_obj.get_index_buffer(offset)
            pinned = None
            if got is not None:
                mf, pos, end = got
                try:
                    pinned = memoryview(mf).cast("B")
                except ValueError:
                    pass  # spec §14: retention deleted the file since the lookup
            if pinned is None:
                # no file holds the offset (RocketMQ getIndexBuffer: null); if retention moved
                # the queue's min offset past it meanwhile, say so
                min_offset = cq.min_logic_offset // CQ_UNIT
                if offset < min_offset:
                    return self._result(MQ_GET_OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
                per_file = cq.file_size // CQ_UNIT
                r.status = _STATUSES[MQ_GET_OFFSET_FOUND_NULL]
                r.next_begin_offset = offset + per_file - offset % per_file
                return r
            view = pinned
            if end > view.shape[0]:
                end = view.shape[0]
            r.log_map = lmap
            status = MQ_GET_NO_MATCHED_MESSAGE
            if pos < end:
                status = scan_units_into(r, lmap, <const char *>&view[0], pos, end, &self.k_lim, codes, &consumed)
        r.status = _STATUSES[status]
        r.next_begin_offset = offset + consumed
        if r.max_phy_offset_pulling >= 0:
            r.suggest_pulling_from_slave = self.k_lim.max_phy - r.max_phy_offset_pulling > self.k_lim.in_memory_bytes_limit
        return r

    cdef int64_t _unit_phy(self, ConsumeQueueKernel cq, object cq_obj, int64_t queue_offset) except? -2:
        """phyOffset of a queue's unit, -1 if the queue has no such unit."""
        cdef int64_t logic = queue_offset * CQ_UNIT
        if queue_offset < 0 or logic < cq.min_logic_offset or logic >= cq.c_max_logic():
            return -1
        if cq.cur_base != NULL and logic >= cq.cur_from:
            return mq_get_i64(cq.cur_base + (logic - cq.cur_from))
        unit = cq_obj.unit(queue_offset)
        return -1 if unit is None else unit[0]

    def look_message_by_offset(self, int64_t phy_offset):
        """The message at a CommitLog offset, or None (at/after the max offset, deleted, or
        not the start of a message; spec §11 lookMessageByOffset)."""
        if phy_offset < 0 or phy_offset >= self.readable_end():
            return None
        return c_view_at(self.log_map(), phy_offset)

    def look_message_by_queue_offset(self, str topic, int queue_id, int64_t queue_offset):
        """The message at a queue offset, or None."""
        cq_obj = self.k_queues.get((topic, queue_id))
        if cq_obj is None:
            return None
        cdef int64_t phy = self._unit_phy(<ConsumeQueueKernel>cq_obj, cq_obj, queue_offset)
        if phy < 0 or phy >= self.readable_end():
            return None
        return c_view_at(self.log_map(), phy)

    def get_message_store_timestamp(self, str topic, int queue_id, int64_t queue_offset):
        """STORETIMESTAMP of the message at a queue offset, -1 if none (spec §11)."""
        cq_obj = self.k_queues.get((topic, queue_id))
        if cq_obj is None:
            return -1
        cdef int64_t phy = self._unit_phy(<ConsumeQueueKernel>cq_obj, cq_obj, queue_offset)
        if phy < 0 or phy >= self.readable_end():
            return -1
        return self.log_map().store_timestamp(phy)
