# cython: language_level=3
"""The CommitLog record scanner (spec §5.3, §5.4): recovery, the checker, the table rebuild and
the put path's repair after a lock takeover walk a file's records with it."""

from libc.stdint cimport int32_t, int64_t

from mq_bytes cimport *
from mq_ctl cimport *
from mq_record cimport *

from mqstore.queue._consumequeue cimport MAX_GAP_UNITS
from mqstore.log._shm cimport ControlBlock

mq_crc32_init()


cdef enum:
    SCAN_END = 0
    SCAN_BLANK = 1
    SCAN_INVALID = 2
    SCAN_HEADER = 3
    SCAN_TABLE_FULL = 4
    SCAN_LIMIT = 5

cdef tuple _SCAN_REASONS = ("end", "blank", "invalid", "header", "table full")


cdef int scan_loop(const char *b, int64_t file_from, int64_t *at, int64_t end, bint check_crc, bint check_header,
                   char *ctl, int64_t *count, int64_t *last_ts, int64_t limit) noexcept nogil:
    """scan_records' walk (see there) of at most ``limit`` records (-1: no limit), callable
    without the GIL; the position reached in *at, the reason as SCAN_* (SCAN_LIMIT: stopped
    after ``limit`` records, before ``end``)."""
    cdef int64_t pos = at[0], qoff, phy, ts
    cdef int32_t qid, sf
    cdef int r, reason = SCAN_END
    cdef RecordHead h
    cdef const char *p
    cdef mq_tq_slot *slot
    cdef int64_t done = 0
    while pos < end:
        if done == limit:
            reason = SCAN_LIMIT
            break
        p = b + pos
        r = parse_record_head(p, end - pos, &h)
        if r == MQ_PARSE_BLANK:
            reason = SCAN_BLANK
            break
        if r != MQ_PARSE_OK:
            reason = SCAN_INVALID
            break
        if check_crc and (mq_body_crc(p + h.body_pos, h.body_len) if h.body_len else 0) != mq_get_i32(p + MQ_POS_BODYCRC):
            reason = SCAN_INVALID
            break
        sf = h.sys_flag
        qid = mq_get_i32(p + MQ_POS_QUEUEID)
        qoff = mq_get_i64(p + MQ_POS_QUEUEOFFSET)
        phy = mq_get_i64(p + MQ_POS_PHYSICALOFFSET)
        ts = mq_get_i64(p + store_timestamp_pos(sf))
        if check_header and (phy != file_from + pos or qid < 0):
            reason = SCAN_HEADER
            break
        if ctl != NULL and (sf & MQ_TRANSACTION_TYPE_MASK) != MQ_TRANSACTION_PREPARED_TYPE and \
                (sf & MQ_TRANSACTION_TYPE_MASK) != MQ_TRANSACTION_ROLLBACK_TYPE:
            slot = mq_tq_get_or_insert(ctl, p + h.topic_pos, h.topic_len, qid)
            if slot == NULL:
                reason = SCAN_TABLE_FULL
                break
            if slot.next_offset == 0 or qoff - slot.next_offset < MAX_GAP_UNITS:
                mq_max(&slot.next_offset, qoff + 1)
        last_ts[0] = ts
        count[0] += 1
        done += 1
        pos += h.size
    at[0] = pos
    return reason


def scan_records(mapped, int64_t file_from, int64_t start, int64_t end, bint check_crc, control_block=None,
                 on_record=None, bint check_header=False):
    """Walk the records of one file from start while they are valid (spec §5.3/§5.4).

    Returns (stop_position, reason, count, last_store_timestamp) with reason one of
    "blank" (end-of-file record: continue with the next file), "end" (reached `end`),
    "invalid" (bad magic, CRC, length or a record running past `end`), and with check_header
    "header": a record that parses (and whose CRC matches) but whose PHYSICALOFFSET is not
    file_from + its position or whose QUEUEID is negative, fields no CRC covers (recovery
    stops trusting the log there; mqstore.queue.recovery.header_problem says which).
    With control_block, raises each queue's next offset in its topic-queue table to
    queue_offset + 1 (not for a queue offset MAX_GAP_UNITS or more past it: a damaged
    QUEUEOFFSET, which dispatch skips too). on_record(pos, size, topic_bytes, queue_id, queue_offset, physical_offset,
    sys_flag, store_timestamp) is called per valid record if given.
    """
    cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
    if end > view.shape[0]:
        end = view.shape[0]
    cdef const char *b = <const char *>&view[0] if view.shape[0] else NULL
    cdef char *ctl = NULL
    if control_block is not None:
        ctl = (<ControlBlock?>control_block)._w()
    cdef int64_t pos = start, count = 0, last_ts = -1, at
    cdef int stop
    cdef RecordHead h
    cdef const char *p
    if on_record is None:
        # recovery's scan: no Python per record, so the GIL is let go and the CommitLogs of a
        # store with several are scanned in parallel (docs/parallel-commitlogs.md)
        with nogil:
            stop = scan_loop(b, file_from, &pos, end, check_crc, check_header, ctl, &count, &last_ts, -1)
    else:  # one record at a time, each handed to on_record
        while True:
            at = pos
            stop = scan_loop(b, file_from, &pos, end, check_crc, check_header, ctl, &count, &last_ts, 1)
            if pos == at:
                break
            p = b + at
            parse_record_head(p, end - at, &h)
            on_record(at, h.size, p[h.topic_pos:h.topic_pos + h.topic_len], mq_get_i32(p + MQ_POS_QUEUEID),
                      mq_get_i64(p + MQ_POS_QUEUEOFFSET), mq_get_i64(p + MQ_POS_PHYSICALOFFSET), h.sys_flag, last_ts)
            if stop != SCAN_LIMIT:
                break
    if stop == SCAN_TABLE_FULL:
        raise OverflowError("topic-queue table is full while rebuilding; raise topic_queue_table_slots")
    return pos, _SCAN_REASONS[SCAN_END if stop == SCAN_LIMIT else stop], count, last_ts
