# The C seam of mqstore.log._codec: the record decoder and the properties parser, cimported by the
# kernels that hand records out (mqstore.queue._reads' MessageView, mqstore.client._client's
# decode_messages) instead of a second parser or a lazy import.
from libc.stdint cimport int32_t, int64_t


# what parse_record found: R_OK, or the first check that failed
cdef enum:
    R_OK = 0
    R_TRUNCATED
    R_BLANK
    R_MAGIC
    R_NEGATIVE_TOTAL
    R_BORN_HOST
    R_STORE_HOST
    R_BODY
    R_CRC
    R_NEGATIVE_TOPIC
    R_TOPIC
    R_PROPERTIES


# one record's fields and where its variable parts lie in the buffer (offsets into it)
cdef struct Rec:
    int32_t total
    int32_t magic
    int32_t body_crc
    int32_t queue_id
    int32_t flag
    int64_t queue_offset
    int64_t physical_offset
    int32_t sys_flag
    int64_t born_timestamp
    Py_ssize_t born_pos
    int born_len
    int64_t store_timestamp
    Py_ssize_t store_pos
    int store_len
    int32_t reconsume_times
    int64_t prepared
    int32_t body_len
    Py_ssize_t body_pos
    int topic_len
    Py_ssize_t topic_pos
    int props_len
    Py_ssize_t props_pos
    bint v2
    # what failed: a read of `need` bytes at `at`, or a CRC that came out as `actual`
    Py_ssize_t need
    Py_ssize_t at
    int32_t actual



# checkMessageAndReturnSize's reads and checks (spec §5.3) on the record at c of the n bytes at b,
# in its order, without the GIL: R_OK or what failed first (the UTF-8 and TOTALSIZE-against-fields
# checks are the caller's). check_crc: verify a non-empty body's CRC; read_body: bound the body by
# TOTALSIZE (a reader that skips the body only needs it inside the buffer)
cdef int parse_record(const char *b, Py_ssize_t n, Py_ssize_t c, Rec *r, bint check_crc, bint read_body) noexcept nogil
# decode_record's words for what parse_record found at offset (its CorruptRecordError text)
cdef str record_problem(int code, Rec *r, Py_ssize_t offset, Py_ssize_t n)


# Properties string -> dict with RocketMQ's parsing rules (spec §1.4)
cpdef dict string_to_properties(str s)
# Offset message id: hex of store address + port + physical offset (spec §1.2)
cpdef str msg_id(store_host, int64_t physical_offset)
# decode_record's body: the DecodedRecord at offset, or CorruptRecordError naming what is wrong
cdef object decode_at(buf, Py_ssize_t offset, bint check_crc, bint read_body)
