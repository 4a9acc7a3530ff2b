# The C seam of mqstore.queue._consumequeue: the unit layout and ConsumeQueueKernel, cimported by the
# dispatch kernel (mqstore.queue._dispatch, which appends units) and the read kernel (mqstore.queue._reads,
# which reads the current file's units through cur_base / cur_wrote).
from libc.stdint cimport INT64_MAX, INT64_MIN, int32_t, int64_t

from mq_bytes cimport mq_put_i32, mq_put_i64
from mqstore.log._mapped cimport MappedFile

cdef enum:
    CQ_UNIT = 20
    FILLER_SIZE = 0x7FFFFFFF      # Integer.MAX_VALUE: size of the pre-fill units (spec §3 step 3)
    # a unit whose queue offset lies further past its queue's end is refused (put_unit returns
    # PUT_UNIT_TOO_FAR; dispatch skips the record and counts it): skipped offsets become filler
    # units, and a damaged QUEUEOFFSET (no CRC covers it) must not fill the disk with them
    MAX_GAP_UNITS = 1000000
    PUT_UNIT_TOO_FAR = 2


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


cdef class ConsumeQueueKernel:
    cdef readonly str topic
    cdef readonly bytes topic_b
    cdef readonly int queue_id
    cdef readonly int log_id                # the CommitLog its units point into (docs/parallel-commitlogs.md)
    cdef readonly int64_t file_size
    cdef public int64_t max_physic_offset   # phyOffset + size of the last unit built, -1 none
    cdef public int64_t min_logic_offset    # byte offset of the first unit in use
    cdef readonly int64_t gaps              # units written as fillers because an offset was skipped
    cdef MappedFile cur_file                # the current (last) file, appended to; None: no file
    cdef char *cur_base                     # its mapping
    cdef int64_t cur_from
    cdef int64_t cur_wrote                  # the C write position in it
    cdef int64_t *published      # the queue's dispatched_next cell in the control block, or NULL
    cdef object published_ctl    # keeps that mapping alive
    cdef bint sync_due                      # the dispatch kernel appended units since the last sync
    cdef public object queue_map            # the read kernel's mqstore.queue._reads.LogMap of the files, or None
    cdef object queue_map_version           # the files' version it was built at

    # byte offset after the last unit (min_logic_offset when the queue has no file)
    cdef int64_t c_max_logic(self) noexcept
    # 1 = appended, 0 = already built (the queue's unit of queue offset q), PUT_UNIT_TOO_FAR
    cdef int put_unit(self, int64_t phy, int32_t size, int64_t tags, int64_t q) except -1
    cdef int _roll(self, int64_t expect) except -1
    cdef int _fill_gap(self, int64_t expect) except -1
