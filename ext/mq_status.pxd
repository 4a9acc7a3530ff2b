# Declarations of the status codes in mq_status.h (no runtime module). The numbers are defined
# there only; tests/test_status_codes.py pins them to mqstore.status.

cdef extern from "mq_status.h" nogil:
    ctypedef enum mq_put_status:
        MQ_PUT_OK
        MQ_PUT_FLUSH_DISK_TIMEOUT
        MQ_PUT_FLUSH_SLAVE_TIMEOUT
        MQ_PUT_SLAVE_NOT_AVAILABLE
        MQ_PUT_SERVICE_NOT_AVAILABLE
        MQ_PUT_CREATE_MAPEDFILE_FAILED
        MQ_PUT_MESSAGE_ILLEGAL
        MQ_PUT_PROPERTIES_SIZE_EXCEEDED
        MQ_PUT_OS_PAGECACHE_BUSY
        MQ_PUT_UNKNOWN_ERROR
        MQ_PUT_LMQ_CONSUME_QUEUE_NUM_EXCEEDED

    ctypedef enum mq_get_status:
        MQ_GET_FOUND
        MQ_GET_NO_MATCHED_MESSAGE
        MQ_GET_MESSAGE_WAS_REMOVING
        MQ_GET_OFFSET_FOUND_NULL
        MQ_GET_OFFSET_OVERFLOW_BADLY
        MQ_GET_OFFSET_OVERFLOW_ONE
        MQ_GET_OFFSET_TOO_SMALL
        MQ_GET_NO_MATCHED_LOGIC_QUEUE
        MQ_GET_NO_MESSAGE_IN_QUEUE
        MQ_GET_MESSAGE_CORRUPTED

    ctypedef enum mq_append_status:
        MQ_APPEND_PUT_OK
        MQ_APPEND_END_OF_FILE
        MQ_APPEND_MESSAGE_SIZE_EXCEEDED
        MQ_APPEND_PROPERTIES_SIZE_EXCEEDED
        MQ_APPEND_UNKNOWN_ERROR

    # The i-th entry of a list: the Python member's name (its number in *value), NULL past the end.
    const char *mq_put_status_entry(int i, int *value)
    const char *mq_get_status_entry(int i, int *value)
    const char *mq_append_status_entry(int i, int *value)
