# cython: language_level=3
"""CommitLog record codec, byte-for-byte as RocketMQ 4.9.7 (spec §1, §5.3).

Python-facing functions over the inline kernels of ``mq_record.pxd``. The put path
(``_commitlog``) uses the same kernels without going through Python objects.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t
from libc.stdlib cimport malloc, free

from mq_bytes cimport mq_get_i16, mq_get_i32, mq_get_i64, mq_get_u8, mq_put_i16, mq_put_i32, mq_crc32_init, mq_crc32_update, mq_body_crc
from mq_record cimport *

from mqstore.errors import CorruptRecordError
from mqstore.log.record import DecodedRecord, decode_host, encode_host

mq_crc32_init()

MESSAGE_MAGIC_CODE = MQ_MESSAGE_MAGIC_CODE
MESSAGE_MAGIC_CODE_V2 = MQ_MESSAGE_MAGIC_CODE_V2
BLANK_MAGIC_CODE = MQ_BLANK_MAGIC_CODE
END_FILE_MIN_BLANK_LENGTH = MQ_END_FILE_MIN_BLANK_LENGTH
BORNHOST_V6_FLAG = MQ_BORNHOST_V6_FLAG
STOREHOSTADDRESS_V6_FLAG = MQ_STOREHOST_V6_FLAG
MAX_TOPIC_BYTES_V1 = MQ_MAX_TOPIC_BYTES_V1
MAX_PROPERTIES_BYTES = MQ_MAX_PROPERTIES_BYTES

cdef int64_t JAVA_INT_MIN = -2147483648
cdef int64_t JAVA_INT_MAX = 2147483647


def crc32(data) -> int:
    """crc32(bytes) & 0x7FFFFFFF, RocketMQ's body CRC (spec §1.5)."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    if view.shape[0] == 0:
        return 0
    return mq_body_crc(<const char *>&view[0], view.shape[0])


def crc32_update(uint32_t crc, data) -> int:
    """Plain CRC-32 (zlib) continued from crc; equals zlib.crc32(data, crc)."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    if view.shape[0] == 0:
        return crc
    return mq_crc32_update(<uint32_t>crc, &view[0], view.shape[0])


def java_string_hash(str s) -> int:
    """Java String.hashCode (UTF-16 code units, signed 32-bit) (spec §1.6)."""
    return mq_java_hash(s)


def tags_code(tags) -> int:
    """The ConsumeQueue tags code of a TAGS value; 0 for none (spec §1.6)."""
    if not tags:
        return 0
    return mq_java_hash(<str>tags)


def java_hashmap_order(keys) -> list:
    """Iteration order of a java.util.HashMap into which keys were put in this order."""
    return java_hashmap_keys(dict.fromkeys(keys))


def properties_to_string(props, bint java_order=True) -> str:
    """Map -> properties string (spec §1.4); Java HashMap order unless java_order is False."""
    if props is None:
        return ""
    return properties_string(dict(props), java_order)


cpdef dict string_to_properties(str s):
    """Properties string -> map with RocketMQ's parsing rules (spec §1.4)."""
    cdef dict out = {}
    cdef Py_ssize_t idx
    if not s:
        return out
    for segment in s.split("\x02"):
        if len(segment) < 3:
            continue
        idx = segment.find("\x01")
        if 0 < idx < len(segment) - 1:
            out[segment[:idx]] = segment[idx + 1:]
    return out


def record_length(Py_ssize_t body_len, Py_ssize_t topic_len, Py_ssize_t props_len, int sys_flag=0, bint v2=False) -> int:
    """calMsgLength (spec §1.2)."""
    return mq_record_length(max(body_len, 0), topic_len, max(props_len, 0), sys_flag, v2)


cpdef str msg_id(store_host, int64_t physical_offset):
    """Offset message id: hex of store address + port + physical offset (spec §1.2)."""
    return (encode_host(store_host) + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


cdef inline void _check_int(str name, value, int64_t lo, int64_t hi) except *:
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} is out of the Java range [{lo}, {hi}]")


def encode_record(*, str topic, body, int64_t queue_id=0, int64_t flag=0, int64_t queue_offset=0,
                  int64_t physical_offset=0, int64_t sys_flag=0, int64_t born_timestamp=0,
                  born_host=("127.0.0.1", 0), int64_t store_timestamp=0, store_host=("127.0.0.1", 0),
                  int64_t reconsume_times=0, int64_t prepared_transaction_offset=0, properties=None,
                  body_crc=None, bint v2=False) -> bytes:
    """Encode one CommitLog record from all of its fields (spec §1.2, §1.8).

    properties: a dict (serialized in Java HashMap order) or an exact properties string.
    The IPv6 sysflag bits follow the host address families.
    """
    for name, value in (("queue_id", queue_id), ("flag", flag), ("sys_flag", sys_flag),
                        ("reconsume_times", reconsume_times)):
        _check_int(name, value, JAVA_INT_MIN, JAVA_INT_MAX)
    cdef bytes body_b = bytes(body)
    cdef bytes topic_b = topic.encode("utf-8")
    if not v2 and len(topic_b) > MQ_MAX_TOPIC_BYTES_V1:
        raise ValueError(f"topic is {len(topic_b)} UTF-8 bytes; a V1 record holds at most 127 "
                         "(RocketMQ would wrap the 1-byte length)")
    if v2 and len(topic_b) > 32767:
        raise ValueError(f"topic is {len(topic_b)} UTF-8 bytes; a V2 record holds at most 32767")
    cdef str props_s
    if properties is None:
        props_s = ""
    elif isinstance(properties, str):
        props_s = properties
    else:
        props_s = properties_string(dict(properties), True)
    cdef bytes props_b = props_s.encode("utf-8")
    if len(props_b) > MQ_MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(props_b)} UTF-8 bytes, more than {MQ_MAX_PROPERTIES_BYTES}")
    cdef bytes born_b = encode_host(tuple(born_host))
    cdef bytes store_b = encode_host(tuple(store_host))
    cdef int32_t sf = with_host_flags(<int32_t>sys_flag, len(born_b), len(store_b))
    cdef int32_t crc
    if body_crc is None:
        crc = mq_body_crc(PyBytes_AS_STRING(body_b), len(body_b)) if len(body_b) else 0
    else:
        _check_int("body_crc", body_crc, JAVA_INT_MIN, JAVA_INT_MAX)
        crc = <int32_t>body_crc
    cdef int total = mq_record_length(len(body_b), len(topic_b), len(props_b), sf, v2)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    encode_record_into(PyBytes_AS_STRING(out), PyBytes_AS_STRING(topic_b), len(topic_b),
                       PyBytes_AS_STRING(body_b), len(body_b), PyBytes_AS_STRING(props_b), len(props_b),
                       <int32_t>queue_id, <int32_t>flag, queue_offset, physical_offset, sf, born_timestamp,
                       PyBytes_AS_STRING(born_b), store_timestamp, PyBytes_AS_STRING(store_b),
                       <int32_t>reconsume_times, prepared_transaction_offset, crc, v2)
    return out


# -- one record, in C (the client's decode_messages walks a pull body with it too) ---------------

cdef inline int _short(Rec *r, Py_ssize_t at, Py_ssize_t need) noexcept nogil:
    r.at = at
    r.need = need
    return R_TRUNCATED


cdef int parse_record(const char *b, Py_ssize_t n, Py_ssize_t c, Rec *r, bint check_crc, bint read_body) noexcept nogil:
    """See _codec.pxd."""
    if c + 4 > n:
        return _short(r, c, 4)
    r.total = mq_get_i32(b + c)
    c += 4
    if c + 4 > n:
        return _short(r, c, 4)
    r.magic = mq_get_i32(b + c)
    c += 4
    if r.magic == MQ_BLANK_MAGIC_CODE:
        return R_BLANK
    if r.magic != MQ_MESSAGE_MAGIC_CODE and r.magic != MQ_MESSAGE_MAGIC_CODE_V2:
        return R_MAGIC
    if r.total < 0:
        return R_NEGATIVE_TOTAL
    r.v2 = r.magic == MQ_MESSAGE_MAGIC_CODE_V2
    if c + 4 > n:
        return _short(r, c, 4)
    r.body_crc = mq_get_i32(b + c)
    c += 4
    if c + 4 > n:
        return _short(r, c, 4)
    r.queue_id = mq_get_i32(b + c)
    c += 4
    if c + 4 > n:
        return _short(r, c, 4)
    r.flag = mq_get_i32(b + c)
    c += 4
    if c + 8 > n:
        return _short(r, c, 8)
    r.queue_offset = mq_get_i64(b + c)
    c += 8
    if c + 8 > n:
        return _short(r, c, 8)
    r.physical_offset = mq_get_i64(b + c)
    c += 8
    if c + 4 > n:
        return _short(r, c, 4)
    r.sys_flag = mq_get_i32(b + c)
    c += 4
    if c + 8 > n:
        return _short(r, c, 8)
    r.born_timestamp = mq_get_i64(b + c)
    c += 8
    r.born_len = 20 if r.sys_flag & MQ_BORNHOST_V6_FLAG else 8
    r.store_len = 20 if r.sys_flag & MQ_STOREHOST_V6_FLAG else 8
    if r.born_len > r.total:
        return R_BORN_HOST
    if c + r.born_len > n:
        return _short(r, c, r.born_len)
    r.born_pos = c
    c += r.born_len
    if c + 8 > n:
        return _short(r, c, 8)
    r.store_timestamp = mq_get_i64(b + c)
    c += 8
    if r.store_len > r.total:
        return R_STORE_HOST
    if c + r.store_len > n:
        return _short(r, c, r.store_len)
    r.store_pos = c
    c += r.store_len
    if c + 4 > n:
        return _short(r, c, 4)
    r.reconsume_times = mq_get_i32(b + c)
    c += 4
    if c + 8 > n:
        return _short(r, c, 8)
    r.prepared = mq_get_i64(b + c)
    c += 8
    if c + 4 > n:
        return _short(r, c, 4)
    r.body_len = mq_get_i32(b + c)
    c += 4
    r.body_pos = c
    if r.body_len > 0:  # a negative BODYLENGTH reads as an empty body, and only a body has a CRC
        if read_body and r.body_len > r.total:
            return R_BODY
        if c + r.body_len > n:
            return _short(r, c, r.body_len)
        c += r.body_len
        if read_body and check_crc:
            r.actual = mq_body_crc(b + r.body_pos, r.body_len)
            if r.actual != r.body_crc:
                return R_CRC
    if r.v2:
        if c + 2 > n:
            return _short(r, c, 2)
        r.topic_len = mq_get_i16(b + c)
        c += 2
    else:
        if c + 1 > n:
            return _short(r, c, 1)
        r.topic_len = <signed char>b[c]
        c += 1
    if r.topic_len < 0:
        return R_NEGATIVE_TOPIC
    if r.topic_len > r.total:
        return R_TOPIC
    if c + r.topic_len > n:
        return _short(r, c, r.topic_len)
    r.topic_pos = c
    c += r.topic_len
    if c + 2 > n:
        return _short(r, c, 2)
    r.props_len = mq_get_i16(b + c)
    c += 2
    r.props_pos = c
    if r.props_len > 0:  # a negative PROPERTIESLENGTH means no properties
        if r.props_len > r.total:
            return R_PROPERTIES
        if c + r.props_len > n:
            return _short(r, c, r.props_len)
    return R_OK


cdef str record_problem(int code, Rec *r, Py_ssize_t offset, Py_ssize_t n):
    """See _codec.pxd."""
    if code == R_TRUNCATED:
        return (f"record at buffer offset {offset} is truncated: needs {r.need} bytes at {r.at}, "
                f"buffer ends at {n}")
    if code == R_BLANK:
        return (f"offset {offset} holds a BLANK (end of file) record, not a message; "
                "use check_record to detect blanks")
    if code == R_MAGIC:
        return f"record at offset {offset}: unknown magic code 0x{<uint32_t>r.magic:08X}"
    if code == R_NEGATIVE_TOTAL:
        return f"record at offset {offset}: negative TOTALSIZE {r.total}"
    if code == R_BORN_HOST:
        return f"record at offset {offset}: BORNHOST is longer than TOTALSIZE {r.total}"
    if code == R_STORE_HOST:
        return f"record at offset {offset}: STOREHOST is longer than TOTALSIZE {r.total}"
    if code == R_BODY:
        return f"record at offset {offset}: BODY of {r.body_len} bytes is longer than TOTALSIZE {r.total}"
    if code == R_CRC:
        return f"record at offset {offset}: body CRC {r.actual} does not match stored BODYCRC {r.body_crc}"
    if code == R_NEGATIVE_TOPIC:
        return f"record at offset {offset}: negative topic length {r.topic_len}"
    if code == R_TOPIC:
        return f"record at offset {offset}: TOPIC is longer than TOTALSIZE {r.total}"
    if code == R_PROPERTIES:
        return f"record at offset {offset}: PROPERTIES are longer than TOTALSIZE {r.total}"
    return f"record at offset {offset}: unknown problem {code}"


class _Fail(Exception):
    """checkMessageAndReturnSize returned (size, false)."""

    def __init__(self, int size, str message):
        super().__init__(message)
        self.size = size


class _Blank(Exception):
    pass


def _java_parse_int(str text):
    """Integer.parseInt, or None where Java throws NumberFormatException."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all(c.isdecimal() for c in digits):
        return None
    value = int("".join(str(int(c)) for c in digits))
    if text[:1] == "-":
        value = -value
    return value if JAVA_INT_MIN <= value <= JAVA_INT_MAX else None


cdef object _parse(buf, Py_ssize_t offset, bint check_crc, bint read_body, bint strict_utf8, bint check_delay):
    """Follow checkMessageAndReturnSize (spec §5.3) step by step (parse_record: the same reads in
    the same order, and Java's quirks: its new byte[totalSize] scratch array, negative lengths
    read as empty, CRC only for a non-empty body), then the UTF-8, DELAY and TOTALSIZE checks.
    Raises _Blank, or _Fail(size, why)."""
    cdef const unsigned char[::1] view = memoryview(buf).cast("B")
    cdef Py_ssize_t n = view.shape[0]
    if offset < 0 or offset > n:
        raise _Fail(-1, f"offset {offset} is outside the buffer of {n} bytes")
    cdef const char *b = <const char *>&view[0] if n else NULL
    cdef Rec r
    cdef int code = parse_record(b, n, offset, &r, check_crc, read_body)
    if code == R_BLANK:
        raise _Blank()
    if code != R_OK:
        raise _Fail(-1, record_problem(code, &r, offset, n))
    born_raw = b[r.born_pos:r.born_pos + r.born_len]
    store_raw = b[r.store_pos:r.store_pos + r.store_len]
    if r.body_len > 0:
        body = b[r.body_pos:r.body_pos + r.body_len] if read_body else None
    else:
        body = b"" if read_body else None
    topic_raw = b[r.topic_pos:r.topic_pos + r.topic_len]
    props_raw = b[r.props_pos:r.props_pos + r.props_len] if r.props_len > 0 else b""
    try:
        topic = topic_raw.decode("utf-8", "strict" if strict_utf8 else "replace")
        props_s = props_raw.decode("utf-8", "strict" if strict_utf8 else "replace")
    except UnicodeDecodeError as exc:
        raise _Fail(-1, f"record at offset {offset}: topic or properties are not UTF-8 ({exc})") from None
    properties = string_to_properties(props_s)
    if check_delay and topic == "SCHEDULE_TOPIC_XXXX" and "DELAY" in properties:
        if _java_parse_int(properties["DELAY"]) is None:
            raise _Fail(-1, f"record at offset {offset}: DELAY {properties['DELAY']!r} is not a Java int")
    cdef int expected = mq_record_length(max(r.body_len, 0), r.topic_len, max(r.props_len, 0), r.sys_flag, r.v2)
    if expected != r.total:
        raise _Fail(r.total, f"record at offset {offset}: TOTALSIZE {r.total} but its fields add up to {expected} bytes")
    return DecodedRecord(r.total, r.magic, r.body_crc, r.queue_id, r.flag, r.queue_offset, r.physical_offset,
                         r.sys_flag, r.born_timestamp, decode_host(born_raw), r.store_timestamp,
                         decode_host(store_raw), r.reconsume_times, r.prepared, body, topic, properties, props_s,
                         tags_code(properties.get("TAGS")))


def decode_record(buf, Py_ssize_t offset=0, *, bint check_crc=True, bint read_body=True):
    """Decode the record at offset into a DecodedRecord (spec §1.2, §1.8).

    Raises CorruptRecordError naming what is wrong: blank record, bad magic, truncation,
    length mismatch, CRC mismatch, bad UTF-8.
    """
    return decode_at(buf, offset, check_crc, read_body)


cdef object decode_at(buf, Py_ssize_t offset, bint check_crc, bint read_body):
    try:
        return _parse(buf, offset, check_crc, read_body, True, False)
    except _Blank:
        raise CorruptRecordError(f"offset {offset} holds a BLANK (end of file) record, not a message; "
                                 "use check_record to detect blanks") from None
    except _Fail as exc:
        raise CorruptRecordError(str(exc)) from None


def check_record(buf, Py_ssize_t offset=0, *, bint check_crc=True, bint read_body=True):
    """checkMessageAndReturnSize (spec §5.3): (total_size, True) for a valid record, (0, True)
    for a blank, (-1, False) for a bad magic / CRC / truncation, (total_size, False) when
    TOTALSIZE disagrees with the fields."""
    if offset < 0:
        raise ValueError(f"offset {offset} is negative")
    try:
        rec = _parse(buf, offset, check_crc, read_body, False, True)
    except _Blank:
        return (0, True)
    except _Fail as exc:
        return (exc.size, False)
    return (rec.total_size, True)


def encode_batch_body(messages) -> bytes:
    """Client batch body, MessageDecoder.encodeMessages (spec §1.10): for each
    (body, properties, flag): [totalSize][magic=0][bodyCRC=0][flag][bodyLen][body][propsLen][props]."""
    parts = []
    for body, props, flag in messages:
        body_b = bytes(body)
        if props is None:
            props_b = b""
        elif isinstance(props, str):
            props_b = props.encode("utf-8")
        else:
            props_b = properties_string(dict(props), True).encode("utf-8")
        if len(props_b) > MQ_MAX_PROPERTIES_BYTES:
            raise ValueError(f"batch message properties are {len(props_b)} bytes, more than {MQ_MAX_PROPERTIES_BYTES}")
        _check_int("flag", flag, JAVA_INT_MIN, JAVA_INT_MAX)
        total = 20 + len(body_b) + 2 + len(props_b)
        parts.append(total.to_bytes(4, "big") + b"\x00" * 8 + int(flag).to_bytes(4, "big", signed=True)
                     + len(body_b).to_bytes(4, "big") + body_b + len(props_b).to_bytes(2, "big") + props_b)
    return b"".join(parts)


def decode_batch_body(data) -> list:
    """Inverse of encode_batch_body: [(flag, body, properties_string)]."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    cdef Py_ssize_t pos = 0, n = view.shape[0]
    cdef const char *p
    cdef int32_t body_len
    cdef int16_t props_len
    out = []
    while pos < n:
        p = <const char *>&view[0]
        problem = batch_item_problem(p, pos, n)
        if problem is not None:
            raise CorruptRecordError(problem)
        p += pos
        body_len = mq_get_i32(p + 16)
        props_len = mq_get_i16(p + 20 + body_len)
        try:
            props_s = p[22 + body_len:22 + body_len + props_len].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(batch_properties_not_utf8(pos, exc)) from None
        out.append((mq_get_i32(p + 12), p[20:20 + body_len], props_s))
        pos += 22 + body_len + props_len
    return out


def batch_inner_properties(str inner, str batch) -> str:
    """Properties of an inner batch message as stored (spec §9.4)."""
    if inner and batch and not inner.endswith("\x02"):
        return inner + "\x02" + batch
    return inner + batch
