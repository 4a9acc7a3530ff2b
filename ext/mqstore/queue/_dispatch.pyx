# cython: language_level=3
"""The dispatch (reput) kernel (spec §10.1): CommitLog records to ConsumeQueue units.

``DispatchKernel`` follows the CommitLog, parses each record without its body
(checkMessageAndReturnSize with readBody=false; the parse of mq_dispatch.pxd), computes the
tags code from the properties, finds the record's queue through a C hash table and appends
its unit to the queue's ``ConsumeQueueKernel`` (mqstore.queue._consumequeue). Records carrying keys
are handed to the index builder in Python afterwards. ``apply`` appends the units of a batch
that mqstore.queue._reput parsed (concurrent dispatch, spec §10.2).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcmp

import logging

from mq_bytes cimport *
from mq_ctl cimport *
from mq_dispatch cimport *
from mq_record cimport *

from mqstore.queue._consumequeue cimport CQ_UNIT, MAX_GAP_UNITS, PUT_UNIT_TOO_FAR, ConsumeQueueKernel
from mqstore.queue._reput cimport ParsedBatch
from mqstore.log._shm cimport ControlBlock

log = logging.getLogger("mqstore.dispatch")


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
        self.ctl = NULL if control_block is None else (<ControlBlock?>control_block)._w()
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
        if r == PUT_UNIT_TOO_FAR:
            self._skip_too_far(e.phy_offset, cq, e.queue_offset)
            return 0
        if raise_table and self.ctl != NULL:
            slot = mq_tq_get_or_insert(self.ctl, topic, tlen, qid)
            if slot == NULL:
                raise OverflowError("topic-queue table is full while rebuilding; raise topic_queue_table_slots")
            mq_max(&slot.next_offset, e.queue_offset + 1)
        return r

    cdef int _skip_too_far(self, int64_t phy, ConsumeQueueKernel cq, int64_t q) except -1:
        """A record whose queue offset lies more than MAX_GAP_UNITS past its queue's end (a
        damaged QUEUEOFFSET): no unit, no filler, counted and reported like the records no
        queue can take."""
        log.error("ConsumeQueue %s/%d: the record at physical offset %d has queue offset %d, more than %d units "
                  "past the queue's end %d: no unit is built for it", cq.topic, cq.queue_id, phy, q, MAX_GAP_UNITS,
                  cq.c_max_logic() // CQ_UNIT)
        self.skipped += 1
        if self.on_skipped is not None:
            self.on_skipped(phy, cq.topic_b, cq.queue_id)
        return 0

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

    def apply(self, ParsedBatch batch not None, bint raise_table=False):
        """Append the units of a batch parsed by mqstore.queue._reput.BatchParser, in record order
        (the in-order step of the concurrent dispatch, spec §10.2); returns the units appended.
        Each queue of the batch is looked up once; the parser computed the tags codes, and its
        index keys go to the index separately. With raise_table as in dispatch()."""
        cdef const char *b = batch.base
        cdef const BatchQueue *queues = batch.queues
        cdef const BatchUnit *units = batch.units
        cdef int64_t i, n = batch.unit_count, nq = batch.queue_count, appended = 0, r
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
                r = cq.put_unit(u.phy_offset, u.size, u.tags_code, u.queue_offset)
                if r == PUT_UNIT_TOO_FAR:
                    self._skip_too_far(u.phy_offset, cq, u.queue_offset)
                    continue
                appended += r
                if slots[u.queue] != NULL:
                    mq_max(&slots[u.queue].next_offset, u.queue_offset + 1)
        finally:
            free(cqs)
            free(slots)
            self._sync_touched()
        return appended
