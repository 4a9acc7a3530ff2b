# CommitLog record layout (spec §1) and the encoding kernels shared by _codec and _commitlog.
# Header-only: every function here is inline, so cimporting this file adds no runtime module.
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcpy
from mq_bytes cimport mq_put_i16, mq_put_i32, mq_put_i64, mq_get_i16, mq_get_i32, mq_body_crc

cdef extern from "Python.h":
    int PyUnicode_KIND(object o)
    void *PyUnicode_DATA(object o)
    unsigned int PyUnicode_1BYTE_KIND
    unsigned int PyUnicode_2BYTE_KIND

cdef enum:
    MQ_MESSAGE_MAGIC_CODE = -626843481      # 0xDAA320A7
    MQ_MESSAGE_MAGIC_CODE_V2 = -626843477   # 0xDAA320AB
    MQ_BLANK_MAGIC_CODE = -875286124        # 0xCBD43194
    MQ_END_FILE_MIN_BLANK_LENGTH = 8
    MQ_BORNHOST_V6_FLAG = 0x10
    MQ_STOREHOST_V6_FLAG = 0x20
    MQ_TRANSACTION_TYPE_MASK = 0xC
    MQ_TRANSACTION_PREPARED_TYPE = 0x4
    MQ_TRANSACTION_ROLLBACK_TYPE = 0xC
    MQ_POS_TOTALSIZE = 0
    MQ_POS_MAGIC = 4
    MQ_POS_BODYCRC = 8
    MQ_POS_QUEUEID = 12
    MQ_POS_FLAG = 16
    MQ_POS_QUEUEOFFSET = 20
    MQ_POS_PHYSICALOFFSET = 28
    MQ_POS_SYSFLAG = 36
    MQ_POS_BORNTIMESTAMP = 40
    MQ_POS_BORNHOST = 48
    MQ_MIN_RECORD = 91                      # the shortest V1 record (IPv4 hosts, nothing variable)
    MQ_MAX_TOPIC_BYTES_V1 = 127
    MQ_MAX_PROPERTIES_BYTES = 32767


cdef inline int32_t mq_java_hash(str s):
    """Java String.hashCode over UTF-16 code units, with 32-bit wrap-around (spec §1.6)."""
    cdef uint32_t h = 0
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s)
    cdef int kind = PyUnicode_KIND(s)
    cdef void *data = PyUnicode_DATA(s)
    cdef uint32_t cp
    if kind == PyUnicode_1BYTE_KIND:
        for i in range(n):
            h = 31 * h + (<unsigned char *>data)[i]
    elif kind == PyUnicode_2BYTE_KIND:
        for i in range(n):
            h = 31 * h + (<unsigned short *>data)[i]
    else:
        for i in range(n):
            cp = (<uint32_t *>data)[i]
            if cp >= 0x10000:
                cp -= 0x10000
                h = 31 * h + (0xD800 + (cp >> 10))
                h = 31 * h + (0xDC00 + (cp & 0x3FF))
            else:
                h = 31 * h + cp
    return <int32_t>h


cdef inline int32_t mq_index_key_hash(int32_t h) noexcept nogil:
    """spec §4.2 indexKeyHashMethod of a key whose String.hashCode is h: |h|, with
    abs(Integer.MIN_VALUE) (still negative in Java) mapped to 0."""
    if h == -2147483647 - 1:
        return 0
    return -h if h < 0 else h


cdef inline Py_ssize_t utf16_length(str s):
    """Length in UTF-16 code units: what Java's String.length() returns (spec Appendix B)."""
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s), extra = 0
    cdef uint32_t *data
    if PyUnicode_KIND(s) != 4:
        return n
    data = <uint32_t *>PyUnicode_DATA(s)
    for i in range(n):
        if data[i] >= 0x10000:
            extra += 1
    return n + extra


cdef inline int mq_record_length(Py_ssize_t body_len, Py_ssize_t topic_len, Py_ssize_t props_len,
                              int sys_flag, bint v2) noexcept nogil:
    """calMsgLength (spec §1.2): the TOTALSIZE of a record with these variable parts."""
    cdef int born = 20 if sys_flag & MQ_BORNHOST_V6_FLAG else 8
    cdef int store = 20 if sys_flag & MQ_STOREHOST_V6_FLAG else 8
    return <int>(4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + born + 8 + store + 4 + 8
                 + 4 + body_len + (2 if v2 else 1) + topic_len + 2 + props_len)


cdef inline int32_t with_host_flags(int32_t sys_flag, Py_ssize_t born_host_len, Py_ssize_t store_host_len) noexcept nogil:
    """The V6 sysflag bits follow the encoded host lengths (20 bytes = IPv6), spec §1.3."""
    sys_flag &= ~(MQ_BORNHOST_V6_FLAG | MQ_STOREHOST_V6_FLAG)
    if born_host_len == 20:
        sys_flag |= MQ_BORNHOST_V6_FLAG
    if store_host_len == 20:
        sys_flag |= MQ_STOREHOST_V6_FLAG
    return sys_flag


cdef inline int store_timestamp_pos(int sys_flag) noexcept nogil:
    """Byte position of STORETIMESTAMP inside a record (56, or 68 after an IPv6 born host)."""
    return 68 if sys_flag & MQ_BORNHOST_V6_FLAG else 56


cdef inline int body_len_pos(int sys_flag) noexcept nogil:
    """Byte position of BODYLEN inside a record: after the fixed fields and both hosts."""
    return (48 + (20 if sys_flag & MQ_BORNHOST_V6_FLAG else 8) + 8
            + (20 if sys_flag & MQ_STOREHOST_V6_FLAG else 8) + 12)


cdef inline bint next_property(const char *p, int n, int *at, int *name, int *sep, int *end) noexcept nogil:
    """The next name\\x01value pair of a properties string at or after at[0] (spec §1.4
    string2messageProperties: segments split on \\x02; one counts when its first \\x01 leaves a
    non-empty name and a non-empty value, the value being all after that \\x01). Sets the
    name's start, the \\x01's position and the segment's end, and moves at[0] past the
    segment; False when no pair is left."""
    cdef int i = at[0], seg, s, e
    while i < n:
        seg = i
        s = -1
        while i < n and p[i] != 2:
            if s < 0 and p[i] == 1:
                s = i
            i += 1
        e = i
        i += 1
        if seg < s < e - 1:
            name[0] = seg
            sep[0] = s
            end[0] = e
            at[0] = i
            return True
    at[0] = i
    return False


cdef enum:
    MQ_PARSE_OK = 0
    MQ_PARSE_BLANK = 1
    MQ_PARSE_INVALID = -1


cdef struct RecordHead:
    int32_t size
    int32_t sys_flag
    bint v2
    int body_pos        # first byte of the body
    int32_t body_len
    int topic_pos
    int topic_len
    int props_pos       # first byte of the properties string
    int props_len


cdef inline int parse_record_head(const char *p, int64_t avail, RecordHead *h) noexcept nogil:
    """The structure checks of checkMessageAndReturnSize (spec §5.3, without CRC) on the
    record at p, of which avail bytes are readable: MQ_PARSE_BLANK for an END_OF_FILE record,
    MQ_PARSE_INVALID for a bad magic, a record past avail or lengths that disagree with
    TOTALSIZE, else MQ_PARSE_OK with the variable parts located in h."""
    if avail < 8:
        return MQ_PARSE_INVALID
    cdef int32_t size = mq_get_i32(p), magic = mq_get_i32(p + 4)
    if magic == MQ_BLANK_MAGIC_CODE:
        return MQ_PARSE_BLANK
    if (magic != MQ_MESSAGE_MAGIC_CODE and magic != MQ_MESSAGE_MAGIC_CODE_V2) or size < MQ_MIN_RECORD or size > avail:
        return MQ_PARSE_INVALID
    cdef bint v2 = magic == MQ_MESSAGE_MAGIC_CODE_V2
    cdef int32_t sf = mq_get_i32(p + MQ_POS_SYSFLAG)
    cdef int hdr = body_len_pos(sf)
    if hdr + 4 + 3 > size:  # IPv6 host bits make the header longer than a short record
        return MQ_PARSE_INVALID
    cdef int32_t bl = mq_get_i32(p + hdr)
    # in 64 bits: a BODYLEN near 2^31 must not wrap around and pass
    if bl < 0 or <int64_t>hdr + 4 + bl + 3 > size:
        return MQ_PARSE_INVALID
    cdef int tpos = hdr + 4 + bl + (2 if v2 else 1)
    cdef int tlen = mq_get_i16(p + hdr + 4 + bl) if v2 else <signed char>p[hdr + 4 + bl]
    if tlen < 0 or tpos + tlen + 2 > size:
        return MQ_PARSE_INVALID
    cdef int pl = mq_get_i16(p + tpos + tlen)
    if pl < 0 or mq_record_length(bl, tlen, pl, sf, v2) != size:
        return MQ_PARSE_INVALID
    h.size = size
    h.sys_flag = sf
    h.v2 = v2
    h.body_pos = hdr + 4
    h.body_len = bl
    h.topic_pos = tpos
    h.topic_len = tlen
    h.props_pos = tpos + tlen + 2
    h.props_len = pl
    return MQ_PARSE_OK


cdef inline Py_ssize_t encode_record_into(
        char *out, const char *topic, Py_ssize_t topic_len, const char *body, Py_ssize_t body_len,
        const char *props, Py_ssize_t props_len, int32_t queue_id, int32_t flag, int64_t queue_offset,
        int64_t physical_offset, int32_t sys_flag, int64_t born_timestamp, const char *born_host,
        int64_t store_timestamp, const char *store_host, int32_t reconsume_times,
        int64_t prepared_transaction_offset, int32_t body_crc, bint v2) noexcept nogil:
    """Write one record in RocketMQ's V1 (or V2) layout; hosts are pre-encoded addr+port blobs
    whose length (8 or 20 bytes) follows the V6 sysflag bits. Returns the record length."""
    cdef int born_len = 20 if sys_flag & MQ_BORNHOST_V6_FLAG else 8
    cdef int store_len = 20 if sys_flag & MQ_STOREHOST_V6_FLAG else 8
    cdef int total = mq_record_length(body_len, topic_len, props_len, sys_flag, v2)
    cdef char *p = out
    mq_put_i32(p, total); p += 4
    mq_put_i32(p, MQ_MESSAGE_MAGIC_CODE_V2 if v2 else MQ_MESSAGE_MAGIC_CODE); p += 4
    mq_put_i32(p, body_crc); p += 4
    mq_put_i32(p, queue_id); p += 4
    mq_put_i32(p, flag); p += 4
    mq_put_i64(p, queue_offset); p += 8
    mq_put_i64(p, physical_offset); p += 8
    mq_put_i32(p, sys_flag); p += 4
    mq_put_i64(p, born_timestamp); p += 8
    memcpy(p, born_host, born_len); p += born_len
    mq_put_i64(p, store_timestamp); p += 8
    memcpy(p, store_host, store_len); p += store_len
    mq_put_i32(p, reconsume_times); p += 4
    mq_put_i64(p, prepared_transaction_offset); p += 8
    mq_put_i32(p, <int32_t>body_len); p += 4
    if body_len > 0:
        memcpy(p, body, body_len); p += body_len
    if v2:
        mq_put_i16(p, <short>topic_len); p += 2
    else:
        p[0] = <char>topic_len; p += 1
    memcpy(p, topic, topic_len); p += topic_len
    mq_put_i16(p, <short>props_len); p += 2
    if props_len > 0:
        memcpy(p, props, props_len); p += props_len
    return p - out


cdef inline int java_hashmap_capacity(Py_ssize_t n) noexcept:
    """Table size of a java.util.HashMap(default ctor) holding n keys: 16, doubled while n > 0.75 cap."""
    cdef int cap = 16
    while n > (cap * 3) // 4:
        cap *= 2
    return cap


cdef inline int java_hashmap_bucket(str key, int capacity):
    cdef uint32_t h = <uint32_t>mq_java_hash(key)
    return <int>((h ^ (h >> 16)) & <uint32_t>(capacity - 1))


cdef inline list java_hashmap_keys(dict props):
    """Keys of props in the iteration order of a Java HashMap filled in dict order (spec §1.4):
    by bucket, and by insertion order inside a bucket (resizes split buckets stably)."""
    cdef int cap = java_hashmap_capacity(len(props))
    cdef list decorated = []
    cdef Py_ssize_t i = 0
    for key in props:
        decorated.append((java_hashmap_bucket(key, cap), i, key))
        i += 1
    decorated.sort()
    return [t[2] for t in decorated]


cdef inline uint32_t mq_code_point(int kind, const void *data, Py_ssize_t i) noexcept nogil:
    """The code point at index i of a str's data (PyUnicode_KIND / PyUnicode_DATA)."""
    if kind == PyUnicode_1BYTE_KIND:
        return (<const unsigned char *>data)[i]
    if kind == PyUnicode_2BYTE_KIND:
        return (<const unsigned short *>data)[i]
    return (<const uint32_t *>data)[i]


cdef inline bint mq_topic_char_ok(uint32_t c) noexcept nogil:
    """A character RocketMQ's TopicValidator allows: ^[%|a-zA-Z0-9_-]+$."""
    return ((c >= 97 and c <= 122) or (c >= 65 and c <= 90) or (c >= 48 and c <= 57)
            or c == 95 or c == 45 or c == 37 or c == 124)


cdef inline str topic_problem(str topic, Py_ssize_t max_length):
    """None if topic is a valid RocketMQ topic (TopicValidator.validateTopic: not blank,
    only ^[%|a-zA-Z0-9_-]+$, at most max_length characters), else why not. The character
    rule is what keeps a topic from naming a path outside consumequeue/ ('..', '/', NUL)."""
    if topic is None or PyUnicode_GET_LENGTH(topic) == 0:
        return "topic is empty"
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(topic)
    cdef int kind = PyUnicode_KIND(topic)
    cdef void *data = PyUnicode_DATA(topic)
    cdef uint32_t c
    for i in range(n):
        c = mq_code_point(kind, data, i)
        if not mq_topic_char_ok(c):
            shown = topic if n <= 40 else topic[:37] + "..."
            return (f"topic {shown!r} has the character {chr(c)!r} at index {i}; RocketMQ topics use "
                    "only letters, digits and %|_- (^[%|a-zA-Z0-9_-]+$)")
    if n > max_length:
        return f"topic is {n} characters, more than {max_length} (max_topic_length)"
    return None


cdef inline str property_problem(object key, object value):
    """Why one property cannot be stored so that it reads back the same (spec §1.4:
    string2messageProperties splits on \\x01 and \\x02 and skips a pair with an empty name
    or value), or None."""
    if not isinstance(key, str):
        return f"property name {key!r} is a {type(key).__name__}, not a str"
    cdef str k = str(key) if type(key) is not str else <str>key
    cdef str v = value if type(value) is str else str(value)
    if not k:
        return f"a property name is empty (its value {v[:40]!r})"
    if "\x01" in k or "\x02" in k:
        return f"property name {k!r} contains a separator character (\\x01 or \\x02)"
    if not v:
        return f"property {k!r} has an empty value, which RocketMQ's decoder drops"
    if "\x01" in v or "\x02" in v:
        return f"property {k!r} has a value containing a separator character (\\x01 or \\x02)"
    return None


cdef inline str properties_problem(dict props, str s):
    """None if s, properties_string(props), decodes back to exactly props' non-None pairs,
    else the first offending property and why. One pass over s in C: every pair must be
    one non-empty name, one \\x01 and one non-empty value, and there must be one pair per
    non-None value; only when that fails are the pairs looked at one by one."""
    cdef Py_ssize_t pairs = 0, segments = 0, i, n = PyUnicode_GET_LENGTH(s), start = 0, sep = -1
    cdef int kind = PyUnicode_KIND(s)
    cdef void *data = PyUnicode_DATA(s)
    cdef uint32_t c
    cdef bint ok = True
    for key, value in props.items():
        if value is not None:
            pairs += 1
            if not isinstance(key, str):
                ok = False
    if n == 0 and pairs == 0:
        return None
    for i in range(n + 1 if ok else 0):
        c = 2 if i == n else mq_code_point(kind, data, i)  # the end closes the last pair
        if c == 1:
            if sep >= 0:
                ok = False
                break
            sep = i
        elif c == 2:
            if sep <= start or sep == i - 1:
                ok = False
                break
            segments += 1
            start = i + 1
            sep = -1
    if ok and segments == pairs:
        return None
    for key, value in props.items():
        if value is not None:
            problem = property_problem(key, value)
            if problem is not None:
                return problem
    return "the properties do not encode into name\\x01value pairs"


cdef inline str properties_string(dict props, bint java_order):
    """messageProperties2String (spec §1.4): name\\x01value\\x02 ..., last \\x02 dropped."""
    if not props:
        return ""
    cdef list parts = []
    keys = java_hashmap_keys(props) if java_order and len(props) > 1 else props
    for key in keys:
        value = props[key]
        if value is None:
            continue
        parts.append(f"{key}\x01{value}")
    return "\x02".join(parts)


# -- client batch body (spec §1.10): items of TOTALSIZE(4) MAGIC(4) BODYCRC(4) FLAG(4)
#    BODYLEN(4) BODY PROPLEN(2) PROPERTIES; FLAG at +12, BODYLEN at +16 -----------------------

cdef inline str batch_item_problem(const char *b, Py_ssize_t pos, Py_ssize_t end):
    """None if the header, body and properties of the batch item at pos lie inside [pos, end)
    (the properties' UTF-8 is checked by the caller), else why not."""
    if pos + 20 > end:
        return f"batch body truncated at byte {pos}: {end - pos} bytes left, header needs 20"
    cdef int32_t body_len = mq_get_i32(b + pos + 16)
    if body_len < 0 or pos + 20 + body_len + 2 > end:
        return f"batch message at byte {pos}: body length {body_len} runs past the batch end"
    cdef int props_len = mq_get_i16(b + pos + 20 + body_len)
    if props_len < 0 or pos + 22 + body_len + props_len > end:
        return f"batch message at byte {pos}: properties length {props_len} runs past the batch end"
    return None


cdef inline str batch_properties_not_utf8(Py_ssize_t pos, object exc):
    return f"batch message at byte {pos}: properties are not UTF-8 ({exc})"


cdef inline str checked_properties_string(dict props):
    """properties_string(props, java order) when every pair reads back as it is; otherwise
    ValueError naming the property and why (properties_problem)."""
    cdef str s
    try:
        s = properties_string(props, True)
    except TypeError:  # a name that is not a str (perhaps only under a None value, left out)
        present = {k: v for k, v in props.items() if v is not None}
        if len(present) == len(props):
            raise ValueError(properties_problem(props, ""))
        return checked_properties_string(present)
    problem = properties_problem(props, s)
    if problem is not None:
        raise ValueError(problem)
    return s
