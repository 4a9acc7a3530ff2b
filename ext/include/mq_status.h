/* The status codes of the hot path: the one definition of their numbers (spec §9.1, §9.3, §11).
 *
 * Each list below is an X-macro of X(c_name, python_name, value). From it come the C enums the
 * kernels use (cimported through ext/mq_status.pxd) and an accessor per list that gives its
 * entries one by one, so the extension can export the names and numbers as they are compiled
 * (mqstore._commitlog._C_STATUS_CODES). mqstore/status.py keeps its IntEnum classes
 * (PutMessageStatus, GetMessageStatus, AppendMessageStatus, RocketMQ 4.9.7's names and
 * ordinals); tests/test_status_codes.py checks that both sides hold the same names with the
 * same numbers, so a code added, renamed or renumbered on one side only fails that test.
 *
 * The numbers are contiguous from 0 in each list: the extensions turn a code into its Python
 * member by indexing a tuple of the enum's members.
 */
#ifndef MQ_STATUS_H
#define MQ_STATUS_H
#include <stddef.h>

/* PutMessageStatus (RocketMQ 4.9.7) */
#define MQ_PUT_STATUS_LIST(X) \
    X(MQ_PUT_OK, PUT_OK, 0) \
    X(MQ_PUT_FLUSH_DISK_TIMEOUT, FLUSH_DISK_TIMEOUT, 1) \
    X(MQ_PUT_FLUSH_SLAVE_TIMEOUT, FLUSH_SLAVE_TIMEOUT, 2) \
    X(MQ_PUT_SLAVE_NOT_AVAILABLE, SLAVE_NOT_AVAILABLE, 3) \
    X(MQ_PUT_SERVICE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE, 4) \
    X(MQ_PUT_CREATE_MAPEDFILE_FAILED, CREATE_MAPEDFILE_FAILED, 5) \
    X(MQ_PUT_MESSAGE_ILLEGAL, MESSAGE_ILLEGAL, 6) \
    X(MQ_PUT_PROPERTIES_SIZE_EXCEEDED, PROPERTIES_SIZE_EXCEEDED, 7) \
    X(MQ_PUT_OS_PAGECACHE_BUSY, OS_PAGECACHE_BUSY, 8) \
    X(MQ_PUT_UNKNOWN_ERROR, UNKNOWN_ERROR, 9) \
    X(MQ_PUT_LMQ_CONSUME_QUEUE_NUM_EXCEEDED, LMQ_CONSUME_QUEUE_NUM_EXCEEDED, 10)

/* GetMessageStatus (RocketMQ 4.9.7), and mqstore's MESSAGE_CORRUPTED (check_crc_on_read) */
#define MQ_GET_STATUS_LIST(X) \
    X(MQ_GET_FOUND, FOUND, 0) \
    X(MQ_GET_NO_MATCHED_MESSAGE, NO_MATCHED_MESSAGE, 1) \
    X(MQ_GET_MESSAGE_WAS_REMOVING, MESSAGE_WAS_REMOVING, 2) \
    X(MQ_GET_OFFSET_FOUND_NULL, OFFSET_FOUND_NULL, 3) \
    X(MQ_GET_OFFSET_OVERFLOW_BADLY, OFFSET_OVERFLOW_BADLY, 4) \
    X(MQ_GET_OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_ONE, 5) \
    X(MQ_GET_OFFSET_TOO_SMALL, OFFSET_TOO_SMALL, 6) \
    X(MQ_GET_NO_MATCHED_LOGIC_QUEUE, NO_MATCHED_LOGIC_QUEUE, 7) \
    X(MQ_GET_NO_MESSAGE_IN_QUEUE, NO_MESSAGE_IN_QUEUE, 8) \
    X(MQ_GET_MESSAGE_CORRUPTED, MESSAGE_CORRUPTED, 9)

/* AppendMessageStatus (RocketMQ 4.9.7): the result of one append into a mapped file. The
 * put kernel's locked append has its own internal results (APPEND_* in _commitlog.pyx). */
#define MQ_APPEND_STATUS_LIST(X) \
    X(MQ_APPEND_PUT_OK, PUT_OK, 0) \
    X(MQ_APPEND_END_OF_FILE, END_OF_FILE, 1) \
    X(MQ_APPEND_MESSAGE_SIZE_EXCEEDED, MESSAGE_SIZE_EXCEEDED, 2) \
    X(MQ_APPEND_PROPERTIES_SIZE_EXCEEDED, PROPERTIES_SIZE_EXCEEDED, 3) \
    X(MQ_APPEND_UNKNOWN_ERROR, UNKNOWN_ERROR, 4)

#define MQ_STATUS_ENUM_(c_name, py_name, value) c_name = value,
#define MQ_STATUS_ENTRY_(c_name, py_name, value) {#py_name, value},

typedef enum { MQ_PUT_STATUS_LIST(MQ_STATUS_ENUM_) } mq_put_status;
typedef enum { MQ_GET_STATUS_LIST(MQ_STATUS_ENUM_) } mq_get_status;
typedef enum { MQ_APPEND_STATUS_LIST(MQ_STATUS_ENUM_) } mq_append_status;

typedef struct {
    const char *name;  /* the Python member's name */
    int value;
} mq_status_entry;

/* The i-th entry of a list: its Python name (value in *value), NULL when i is past the end. */
#define MQ_STATUS_ACCESSOR_(fn, list) \
    static inline const char *fn(int i, int *value) { \
        static const mq_status_entry entries[] = { list(MQ_STATUS_ENTRY_) }; \
        if (i < 0 || (size_t)i >= sizeof entries / sizeof entries[0]) \
            return NULL; \
        *value = entries[i].value; \
        return entries[i].name; \
    }

MQ_STATUS_ACCESSOR_(mq_put_status_entry, MQ_PUT_STATUS_LIST)
MQ_STATUS_ACCESSOR_(mq_get_status_entry, MQ_GET_STATUS_LIST)
MQ_STATUS_ACCESSOR_(mq_append_status_entry, MQ_APPEND_STATUS_LIST)

#undef MQ_STATUS_ACCESSOR_

#endif
