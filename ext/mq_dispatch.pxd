# The per-record parse of dispatch (spec §10.1): what CommitLogDispatcherBuildConsumeQueue and
# CommitLogDispatcherBuildIndex need of one record, without its body. Shared by the serial
# kernel (_consumequeue.DispatchKernel) and the concurrent batch parser (_reput.BatchParser), so
# both modes read records alike. Header-only: every function is inline; the parse itself needs
# no GIL (a non-ASCII TAGS value is hashed afterwards with it, see MQ_ENTRY_TAGS_PENDING).
# Twin: mqstore.twin.reput.
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp
from mq_bytes cimport mq_get_i32, mq_get_i64
from mq_record cimport (RecordHead, parse_record_head, mq_java_hash, store_timestamp_pos, next_property, MQ_PARSE_OK,
                        MQ_PARSE_BLANK, MQ_PARSE_INVALID, MQ_POS_QUEUEID, MQ_POS_QUEUEOFFSET,
                        MQ_POS_PHYSICALOFFSET, MQ_TRANSACTION_TYPE_MASK, MQ_TRANSACTION_PREPARED_TYPE,
                        MQ_TRANSACTION_ROLLBACK_TYPE)

cdef extern from *:
    void mq_prefetch "__builtin_prefetch"(const void *p) nogil   # never faults, even past a mapping

cdef enum:
    MQ_PREFETCH_AHEAD = 4096    # a walk over records asks for the page ahead: ~4x faster on cold lines
    MQ_MAX_DELAY_LEVEL = 18
    MQ_ENTRY_UNIT = 1           # builds a ConsumeQueue unit: transaction type NOT or COMMIT
    MQ_ENTRY_INDEX = 2          # KEYS or UNIQ_KEY present and not a ROLLBACK: goes to the index
    MQ_ENTRY_TAGS_PENDING = 4   # TAGS is not ASCII: tags_code still to be computed (with the GIL)


cdef struct Props:
    const char *tags
    int tags_len
    const char *keys
    int keys_len
    const char *uniq
    int uniq_len
    const char *delay
    int delay_len


cdef struct DispatchEntry:
    int64_t pos                 # file position of the record's first byte
    int64_t phy_offset          # PHYSICALOFFSET
    int64_t queue_offset
    int64_t tags_code
    int64_t store_timestamp
    int32_t size
    int32_t queue_id
    int32_t sys_flag
    int32_t flags               # MQ_ENTRY_*
    int32_t topic_pos           # the positions below are inside the record
    int32_t topic_len
    int32_t tags_pos            # only read while MQ_ENTRY_TAGS_PENDING
    int32_t tags_len
    int32_t keys_pos            # -1: no KEYS
    int32_t keys_len
    int32_t uniq_pos            # -1: no UNIQ_KEY
    int32_t uniq_len


cdef inline bint key_is(const char *k, int klen, const char *name, int nlen) noexcept nogil:
    return klen == nlen and memcmp(k, name, nlen) == 0


cdef inline void parse_props(const char *p, int n, Props *out) noexcept nogil:
    """Find TAGS, KEYS, UNIQ_KEY and DELAY with string2messageProperties' rules (spec §1.4):
    segments split on \\x02, key before the first \\x01, both non-empty; the last one wins."""
    out.tags = NULL; out.keys = NULL; out.uniq = NULL; out.delay = NULL
    out.tags_len = 0; out.keys_len = 0; out.uniq_len = 0; out.delay_len = 0
    cdef int i = 0, seg = 0, sep = 0, end = 0
    while next_property(p, n, &i, &seg, &sep, &end):
        if key_is(p + seg, sep - seg, "TAGS", 4):
            out.tags = p + sep + 1; out.tags_len = end - sep - 1
        elif key_is(p + seg, sep - seg, "KEYS", 4):
            out.keys = p + sep + 1; out.keys_len = end - sep - 1
        elif key_is(p + seg, sep - seg, "UNIQ_KEY", 8):
            out.uniq = p + sep + 1; out.uniq_len = end - sep - 1
        elif key_is(p + seg, sep - seg, "DELAY", 5):
            out.delay = p + sep + 1; out.delay_len = end - sep - 1


cdef inline bint ascii_java_hash(const char *p, int n, uint32_t *h) noexcept nogil:
    """Continue the Java String.hashCode h over n bytes; False (h undefined) at a non-ASCII
    byte, whose UTF-16 units only a decoder knows."""
    cdef int i
    cdef uint32_t v = h[0]
    for i in range(n):
        if <unsigned char>p[i] >= 0x80:
            return False
        v = 31 * v + <unsigned char>p[i]
    h[0] = v
    return True


cdef inline int64_t tags_hash(const char *p, int n) except? -1:
    """Java String.hashCode of a UTF-8 tags value (spec §1.6); ASCII is hashed in place."""
    cdef uint32_t h = 0
    if ascii_java_hash(p, n, &h):
        return <int64_t><int32_t>h
    return <int64_t>mq_java_hash(PyUnicode_DecodeUTF8(p, n, "replace"))


cdef inline int parse_small_int(const char *p, int n) noexcept nogil:
    """Integer.parseInt for a delay level; -1 when not a plain decimal."""
    cdef int v = 0, i
    if n <= 0 or n > 9:
        return -1
    for i in range(n):
        if p[i] < 48 or p[i] > 57:
            return -1
        v = v * 10 + (p[i] - 48)
    return v


cdef inline int set_delay_levels(int64_t *delays, levels) except -1:
    """Copy the delay of each level (message_delay_level, ms) into delays (at most
    MQ_MAX_DELAY_LEVEL); returns how many."""
    cdef int n = 0
    for d in levels:
        if n < MQ_MAX_DELAY_LEVEL:
            delays[n] = d
            n += 1
    return n


cdef inline int parse_dispatch_entry(const char *p, int64_t avail, int64_t pos, const int64_t *delays,
                                     int n_delays, DispatchEntry *e) noexcept nogil:
    """Parse the record at p (file position pos, avail bytes readable) into e: MQ_PARSE_OK,
    MQ_PARSE_BLANK (END_OF_FILE record) or MQ_PARSE_INVALID (see parse_record_head; a record
    without a topic is invalid too: a queue needs one)."""
    cdef RecordHead h
    cdef Props props
    cdef int r = parse_record_head(p, avail, &h)
    cdef int level, tx
    cdef uint32_t th
    if r != MQ_PARSE_OK:
        return r
    if h.topic_len == 0:
        return MQ_PARSE_INVALID
    e.pos = pos
    e.size = h.size
    e.sys_flag = h.sys_flag
    e.topic_pos = h.topic_pos
    e.topic_len = h.topic_len
    e.queue_id = mq_get_i32(p + MQ_POS_QUEUEID)
    e.queue_offset = mq_get_i64(p + MQ_POS_QUEUEOFFSET)
    e.phy_offset = mq_get_i64(p + MQ_POS_PHYSICALOFFSET)
    e.store_timestamp = mq_get_i64(p + store_timestamp_pos(h.sys_flag))
    e.flags = 0
    parse_props(p + h.props_pos, h.props_len, &props)
    e.tags_code = 0
    if props.tags != NULL:
        th = 0
        if ascii_java_hash(props.tags, props.tags_len, &th):
            e.tags_code = <int64_t><int32_t>th
        else:
            e.flags |= MQ_ENTRY_TAGS_PENDING
            e.tags_pos = <int32_t>(props.tags - p)
            e.tags_len = props.tags_len
    if props.delay != NULL and h.topic_len == 19 and memcmp(p + h.topic_pos, "SCHEDULE_TOPIC_XXXX", 19) == 0:
        # the tags code of a delayed message is its delivery time (spec §3)
        level = parse_small_int(props.delay, props.delay_len)
        if level > n_delays:
            level = n_delays
        e.tags_code = e.store_timestamp + (delays[level - 1] if level > 0 else 1000)
        e.flags &= ~MQ_ENTRY_TAGS_PENDING
    tx = h.sys_flag & MQ_TRANSACTION_TYPE_MASK
    if tx != MQ_TRANSACTION_PREPARED_TYPE and tx != MQ_TRANSACTION_ROLLBACK_TYPE:
        e.flags |= MQ_ENTRY_UNIT     # CommitLogDispatcherBuildConsumeQueue: NOT and COMMIT only
    e.keys_pos = -1
    e.uniq_pos = -1
    e.keys_len = 0
    e.uniq_len = 0
    if props.keys != NULL:
        e.keys_pos = <int32_t>(props.keys - p)
        e.keys_len = props.keys_len
    if props.uniq != NULL:
        e.uniq_pos = <int32_t>(props.uniq - p)
        e.uniq_len = props.uniq_len
    if (props.keys != NULL or props.uniq != NULL) and tx != MQ_TRANSACTION_ROLLBACK_TYPE:
        e.flags |= MQ_ENTRY_INDEX
    return MQ_PARSE_OK


# -- a parsed batch of the concurrent dispatch (_reput.ParsedBatch), as DispatchKernel.apply reads it

cdef struct BatchQueue:
    int64_t topic_at            # file position of the topic's bytes (in the queue's first record)
    uint64_t hash               # mq_tq_hash(topic, queue_id)
    int32_t topic_len
    int32_t queue_id


cdef struct BatchUnit:
    int64_t phy_offset
    int64_t queue_offset
    int64_t tags_code
    int32_t size
    int32_t queue               # index into the batch's BatchQueue array
