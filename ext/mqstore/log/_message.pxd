# The C seam of mqstore.log._message: the appender (mqstore.log._commitlog) reads a Message's and a
# MessageBatch's fields and fills a PutMessageResult in C.
from libc.stdint cimport int64_t


cdef class Message:
    cdef public str topic
    cdef public bytes body
    cdef public int queue_id
    cdef public int flag
    cdef public int sys_flag
    cdef public int64_t born_timestamp
    cdef public object born_host
    cdef public int reconsume_times
    cdef public int64_t prepared_transaction_offset
    cdef dict _properties


cdef class MessageBatch:
    cdef public str topic
    cdef public int queue_id
    cdef public bytes body
    cdef public dict properties
    cdef public int sys_flag
    cdef public int64_t born_timestamp
    cdef public object born_host
    cdef public int reconsume_times


cdef class PutMessageResult:
    cdef int c_status
    cdef int64_t c_wrote_offset
    cdef int64_t c_wrote_bytes
    cdef int64_t c_queue_offset
    cdef int64_t c_store_timestamp
    cdef int c_msg_num
    cdef object c_detail
    cdef bytes _store_host
    cdef object _record_sizes


# a PutMessageResult of a status (and its detail) with nothing stored
cdef PutMessageResult _result(int status, object detail=*)


# WAIT property absent or anything but "false" (case-insensitive): wait for the flush
cdef inline bint wait_store_msg_ok(dict props):
    return not props or props.get("WAIT", "true").lower() != "false"
