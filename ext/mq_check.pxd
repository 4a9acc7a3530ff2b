# The body CRC check of reads (spec §1.5, §5.3), shared by the kernels that check records as
# they return them (mqstore.queue._search: getMessage results, mqstore.queue._reads: look-ups by offset).
# A kernel that cimports this calls mq_crc32_init() and mq_crc_fold_detect() at module init.
from libc.stdint cimport int32_t, int64_t, uint32_t

from mq_bytes cimport mq_get_i32
from mq_record cimport MQ_PARSE_OK, MQ_POS_BODYCRC, RecordHead, parse_record_head

cdef extern from "mq_crc_fold.h" nogil:
    int mq_crc_fold_ok
    void mq_crc_fold_detect()
    uint32_t mq_crc32_fast(uint32_t crc, const unsigned char *p, size_t n, int fold)

cdef enum:
    REC_OK = 0
    REC_CRC_MISMATCH = 1
    REC_MALFORMED = 2


cdef inline int c_record_status(const char *p, int64_t avail) noexcept nogil:
    """REC_* of the record at p, avail bytes readable: the structure checks of spec §5.3
    (parse_record_head; a BLANK record is no message either), then the body CRC."""
    cdef RecordHead h
    if parse_record_head(p, avail, &h) != MQ_PARSE_OK:
        return REC_MALFORMED
    cdef uint32_t crc = 0
    if h.body_len:
        crc = mq_crc32_fast(0, <const unsigned char *>p + h.body_pos, h.body_len, 1) & 0x7FFFFFFFu
    return REC_OK if <int32_t>crc == mq_get_i32(p + MQ_POS_BODYCRC) else REC_CRC_MISMATCH
