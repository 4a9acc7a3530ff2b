# cython: language_level=3
"""The RocketMQ client's pulled messages (docs/rocketmq-remoting-spec.md §2.4.2, §2.6), in C:
``decode_messages`` walks the CommitLog records of a pull response body and makes one
``MessageExt`` per record.

Each record gets exactly the checks of ``mqstore.log._codec.decode_record`` (spec §5.3
checkMessageAndReturnSize with the body CRC and strict UTF-8), in the same order and with the
same words, so a bad body fails as it did when the client decoded it record by record in Python.

A ``MessageExt`` keeps what it needs from the response body and nothing more: the body (one
bytes copy, inflated as RocketMQ's clients do when the record is flagged compressed: zlib in C,
LZ4 and ZSTD through mqstore.compression, ext/mq_inflate.pxd), the topic (one str, shared with the
record before when that has the same topic), the numbers as C integers, the two hosts' raw
bytes and the raw properties string (a bytes copy). The expensive parts are made on first
access: ``properties`` (the dict), ``msg_id``, ``offset_msg_id`` (the hex string),
``born_host`` and ``store_host`` (the tuples); ``tags``, ``keys`` and ``uniq_key`` read the
raw properties without building the dict. Nothing keeps the response body alive: a
memoryview would save the copies but pin the whole body (up to maxMsgNums records) for as long
as any one of its messages lives.

The numbers are RocketMQ's Java types: queue_id, flag, sys_flag, reconsume_times and body_crc
are int32, queue_offset, commit_log_offset and the timestamps int64 (OverflowError otherwise).

Twin: mqstore.client._twin (hypothesis parity in tests/test_client_decode.py).

The send side lives here too: ``UniqIdGenerator`` makes the message ids (RocketMQ's
MessageClientIDSetter) without a Python call per id, ``encode_properties`` writes a properties
string in Java HashMap order computing each set of names' order once, and ``batch_entries`` /
``encode_batch`` make a SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages) in one
allocation, a plain ``bytes`` item never leaving C. Their twins are in mqstore.client._twin and
mqstore.log._codec (parity in tests/test_client_ids.py).
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memchr, memcmp, memcpy, memset
from libc.time cimport localtime_r, mktime, time_t, tm
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from mq_bytes cimport (mq_body_crc, mq_crc32_init, mq_get_i16, mq_get_i32, mq_get_i64, mq_put_i16, mq_put_i32,
                       mq_put_i64)
from mq_record cimport (MQ_BLANK_MAGIC_CODE, MQ_BORNHOST_V6_FLAG, MQ_MAX_PROPERTIES_BYTES, MQ_MESSAGE_MAGIC_CODE,
                        MQ_MESSAGE_MAGIC_CODE_V2, MQ_STOREHOST_V6_FLAG, java_hashmap_keys, mq_record_length)
from mq_inflate cimport MQ_COMPRESSED_FLAG, mq_body_bytes
from mqstore.log._codec cimport R_OK, Rec, parse_record, record_problem

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

import os
import random
import socket

from mqstore import compression as _compression
from mqstore.errors import BodyDecompressError

mq_crc32_init()

#: MessageSysFlag.COMPRESSED_FLAG: the body is stored compressed (mqstore.compression)
COMPRESSED_FLAG = MQ_COMPRESSED_FLAG

cdef bytes _EMPTY = b""
cdef const char *_HEX = b"0123456789ABCDEF"

# the client's route and protocol names: plain modules of mqstore.client that import neither
# this kernel nor mqstore.client.message, so no cycle (tests/test_layers.py)
from mqstore.client.protocol import SYSTEM_PROPERTIES as _SYSTEM_PROPERTIES
from mqstore.client.route import MessageQueue as _MessageQueue

cdef object _IPv6Address = None


# -- one record: mqstore.log._codec's parse_record (cimported), the same reads and checks as
# decode_record, into a C struct; only the MessageExt built from it is the client's ---------------

cdef inline str _where(object address):
    return f" from {address}" if address else ""


cdef ValueError _no_record(object address, Py_ssize_t pos, Py_ssize_t n, str problem):
    return ValueError(f"the pull response body{_where(address)} has no valid record at byte {pos} of {n}: {problem}")


cdef inline bint _ascii(const char *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef unsigned char acc = 0
    for i in range(n):
        acc |= <unsigned char>p[i]
    return acc < 0x80


# -- the properties string (spec §1.4), read from its UTF-8 bytes ------------------------------
# \x01 and \x02 are single bytes that no other character's UTF-8 contains, so splitting the
# bytes and decoding each piece gives what string_to_properties gives for the decoded string.

cdef inline bint _next_pair(const char *p, int n, int *at, int *name, int *sep, int *end) noexcept nogil:
    """The next name\\x01value pair at or after at[0]: segments split on \\x02, one counts when
    its first \\x01 leaves a non-empty name and a non-empty value (mq_record's next_property,
    with memchr)."""
    cdef int i = at[0], e
    cdef const char *q
    while i < n:
        q = <const char *>memchr(p + i, 2, n - i)
        e = <int>(q - p) if q != NULL else n
        q = <const char *>memchr(p + i, 1, e - i)
        if q != NULL and i < q - p < e - 1:
            name[0] = i
            sep[0] = <int>(q - p)
            end[0] = e
            at[0] = e + 1
            return True
        i = e + 1
    at[0] = i
    return False


# names most stored messages carry: a pair with one of these names gets the one str object
# (hash already computed) instead of a new one
cdef tuple _COMMON_NAMES = ("TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "REAL_TOPIC", "REAL_QID", "RETRY_TOPIC",
                            "ORIGIN_MESSAGE_ID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "TRAN_MSG", "PGROUP",
                            "CLUSTER", "TRACE_ON", "MSG_REGION", "CONSUME_START_TIME", "MIN_OFFSET", "MAX_OFFSET")
cdef tuple _COMMON_NAMES_UTF8 = tuple(name.encode("ascii") for name in _COMMON_NAMES)


cdef inline object _name(const char *p, int n):
    cdef Py_ssize_t i
    cdef bytes known
    for i in range(len(_COMMON_NAMES_UTF8)):
        known = <bytes>_COMMON_NAMES_UTF8[i]
        if PyBytes_GET_SIZE(known) == n and memcmp(PyBytes_AS_STRING(known), p, n) == 0:
            return _COMMON_NAMES[i]
    return PyUnicode_DecodeUTF8(p, n, NULL)


cdef dict _properties_of(bytes raw):
    cdef const char *p = PyBytes_AS_STRING(raw)
    cdef int n = <int>PyBytes_GET_SIZE(raw), at = 0, name = 0, sep = 0, end = 0
    cdef dict out = {}
    while _next_pair(p, n, &at, &name, &sep, &end):
        out[_name(p + name, sep - name)] = PyUnicode_DecodeUTF8(p + sep + 1, end - sep - 1, NULL)
    return out


cdef object _property_of(bytes raw, const char *key, int key_len):
    """properties_of(raw).get(key) without the dict: the value of the last pair named key."""
    cdef const char *p = PyBytes_AS_STRING(raw)
    cdef int n = <int>PyBytes_GET_SIZE(raw), at = 0, name = 0, sep = 0, end = 0, found = -1, found_end = 0
    while _next_pair(p, n, &at, &name, &sep, &end):
        if sep - name == key_len and memcmp(p + name, key, key_len) == 0:
            found = sep + 1
            found_end = end
    if found < 0:
        return None
    return PyUnicode_DecodeUTF8(p + found, found_end - found, NULL)


# -- hosts and the offset message id -----------------------------------------------------------

cdef class _HostCache:
    """The last host tuple made, by its raw bytes: the messages of a pull mostly share their
    store host and often their born host, and a tuple can be shared."""
    cdef unsigned char raw[20]
    cdef int length
    cdef tuple host


cdef _HostCache _last_born = _HostCache()
cdef _HostCache _last_store = _HostCache()


cdef inline int _put_octet(char *out, unsigned char v) noexcept nogil:
    if v >= 100:
        out[0] = <char>(48 + v // 100)
        out[1] = <char>(48 + v // 10 % 10)
        out[2] = <char>(48 + v % 10)
        return 3
    if v >= 10:
        out[0] = <char>(48 + v // 10)
        out[1] = <char>(48 + v % 10)
        return 2
    out[0] = <char>(48 + v)
    return 1


cdef tuple _host(const unsigned char *raw, int length, _HostCache cache):
    """decode_host (mqstore.log.record): (dotted IPv4 or Python's IPv6 text, signed port)."""
    global _IPv6Address
    if cache.length == length and memcmp(cache.raw, raw, length) == 0:
        return cache.host
    cdef int32_t port = mq_get_i32(<const char *>raw + length - 4)
    cdef char text[16]
    cdef int k = 0, j
    if length == 8:
        for j in range(4):
            if j:
                text[k] = b"."
                k += 1
            k += _put_octet(text + k, raw[j])
        ip = PyUnicode_DecodeASCII(text, k, NULL)
    else:
        if _IPv6Address is None:
            from ipaddress import IPv6Address
            _IPv6Address = IPv6Address
        ip = str(_IPv6Address(PyBytes_FromStringAndSize(<const char *>raw, 16)))
    cache.host = (ip, port)
    memcpy(cache.raw, raw, length)
    cache.length = length
    return cache.host


cdef str _offset_msg_id(const unsigned char *host, int host_len, int64_t offset):
    """Upper-case hex of the store host's address and port and the CommitLog offset (spec §1.2)."""
    cdef unsigned char raw[28]
    cdef char text[56]
    cdef int i, n = host_len + 8
    memcpy(raw, host, host_len)
    mq_put_i64(<char *>raw + host_len, offset)
    for i in range(n):
        text[2 * i] = _HEX[raw[i] >> 4]
        text[2 * i + 1] = _HEX[raw[i] & 15]
    return PyUnicode_DecodeASCII(text, 2 * n, NULL)


# -- MessageExt --------------------------------------------------------------------------------

cdef enum:
    # parts of a decoded message not made yet
    LAZY_OFFSET_MSG_ID = 1
    LAZY_MSG_ID = 2
    LAZY_PROPERTIES = 4
    LAZY_BORN_HOST = 8
    LAZY_STORE_HOST = 16
    LAZY_ALL = 31


@cython.freelist(64)
cdef class MessageExt:
    """A message as a pull returns it, decoded from its CommitLog record (§2.6). ``msg_id`` is
    the UNIQ_KEY property when there is one, else ``offset_msg_id``; ``properties`` holds every
    property of the record (system ones included), ``user_properties`` only the user's."""

    cdef public object topic
    cdef public object body
    cdef public int32_t queue_id
    cdef public int64_t queue_offset
    cdef int64_t _commit_log_offset
    cdef object _msg_id
    cdef object _offset_msg_id
    cdef object _properties
    cdef public int32_t flag
    cdef public int32_t sys_flag
    cdef public int64_t born_timestamp
    cdef object _born_host
    cdef public int64_t store_timestamp
    cdef object _store_host
    cdef public int32_t reconsume_times
    cdef public int32_t body_crc
    cdef public object broker_name
    # what the lazy parts are made from (a decoded message only)
    cdef int _lazy
    cdef bytes _raw_properties
    cdef unsigned char _born_raw[20]
    cdef unsigned char _store_raw[20]
    cdef int _born_len
    cdef int _store_len

    __match_args__ = ("topic", "body", "queue_id", "queue_offset", "commit_log_offset", "msg_id", "offset_msg_id",
                      "properties", "flag", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
                      "store_host", "reconsume_times", "body_crc", "broker_name")

    def __init__(self, topic, body, int32_t queue_id, int64_t queue_offset, int64_t commit_log_offset, msg_id,
                 offset_msg_id, properties, int32_t flag, int32_t sys_flag, int64_t born_timestamp, born_host,
                 int64_t store_timestamp, store_host, int32_t reconsume_times, int32_t body_crc, broker_name=""):
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self._commit_log_offset = commit_log_offset
        self._msg_id = msg_id
        self._offset_msg_id = offset_msg_id
        self._properties = properties
        self.flag = flag
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self._born_host = born_host
        self.store_timestamp = store_timestamp
        self._store_host = store_host
        self.reconsume_times = reconsume_times
        self.body_crc = body_crc
        self.broker_name = broker_name
        self._lazy = 0
        self._raw_properties = None

    cdef void _make_all(self) except *:
        """Make every lazy part; a setter calls this first, so that a part made later cannot see
        a value set after decoding (the dataclass made them all at once)."""
        cdef object made
        if self._lazy:
            made = (self.msg_id, self.offset_msg_id, self.properties, self.born_host, self.store_host)
            self._raw_properties = None

    cdef object _get_property(self, const char *key, int key_len, str name):
        if self._lazy & LAZY_PROPERTIES:
            return _property_of(self._raw_properties, key, key_len)
        return self._properties.get(name)

    @property
    def commit_log_offset(self):
        return self._commit_log_offset

    @commit_log_offset.setter
    def commit_log_offset(self, int64_t value):
        self._make_all()
        self._commit_log_offset = value

    @property
    def offset_msg_id(self):
        if self._lazy & LAZY_OFFSET_MSG_ID:
            self._offset_msg_id = _offset_msg_id(self._store_raw, self._store_len, self._commit_log_offset)
            self._lazy &= ~LAZY_OFFSET_MSG_ID
        return self._offset_msg_id

    @offset_msg_id.setter
    def offset_msg_id(self, value):
        self._make_all()
        self._offset_msg_id = value

    @property
    def msg_id(self):
        if self._lazy & LAZY_MSG_ID:
            uniq = _property_of(self._raw_properties, b"UNIQ_KEY", 8)
            self._msg_id = uniq if uniq is not None else self.offset_msg_id
            self._lazy &= ~LAZY_MSG_ID
        return self._msg_id

    @msg_id.setter
    def msg_id(self, value):
        self._make_all()
        self._msg_id = value

    @property
    def properties(self):
        if self._lazy & LAZY_PROPERTIES:
            self._properties = _properties_of(self._raw_properties)
            self._lazy &= ~LAZY_PROPERTIES
        return self._properties

    @properties.setter
    def properties(self, value):
        self._make_all()
        self._properties = value

    @property
    def born_host(self):
        if self._lazy & LAZY_BORN_HOST:
            self._born_host = _host(self._born_raw, self._born_len, _last_born)
            self._lazy &= ~LAZY_BORN_HOST
        return self._born_host

    @born_host.setter
    def born_host(self, value):
        self._make_all()
        self._born_host = value

    @property
    def store_host(self):
        if self._lazy & LAZY_STORE_HOST:
            self._store_host = _host(self._store_raw, self._store_len, _last_store)
            self._lazy &= ~LAZY_STORE_HOST
        return self._store_host

    @store_host.setter
    def store_host(self, value):
        self._make_all()
        self._store_host = value

    @property
    def tags(self):
        return self._get_property(b"TAGS", 4, "TAGS")

    @property
    def keys(self):
        if self._lazy & LAZY_PROPERTIES:
            keys = _property_of(self._raw_properties, b"KEYS", 4)
            if keys is None:
                return []
        else:
            keys = self._properties.get("KEYS", "")
        return [k for k in keys.split(" ") if k]

    @property
    def uniq_key(self):
        return self._get_property(b"UNIQ_KEY", 8, "UNIQ_KEY")

    @property
    def user_properties(self):
        return {k: v for k, v in self.properties.items() if k not in _SYSTEM_PROPERTIES}

    @property
    def message_queue(self):
        return _MessageQueue(self.topic, self.broker_name, self.queue_id)

    cdef tuple _fields(self):
        return (self.topic, self.body, self.queue_id, self.queue_offset, self._commit_log_offset, self.msg_id,
                self.offset_msg_id, self.properties, self.flag, self.sys_flag, self.born_timestamp, self.born_host,
                self.store_timestamp, self.store_host, self.reconsume_times, self.body_crc, self.broker_name)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == (<MessageExt>other)._fields()

    def __ne__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() != (<MessageExt>other)._fields()

    __hash__ = None  # mutable and compared by value, like the dataclass it replaces (eq=True, not frozen)

    def __repr__(self):
        return (f"{type(self).__qualname__}(topic={self.topic!r}, body={self.body!r}, queue_id={self.queue_id!r}, "
                f"queue_offset={self.queue_offset!r}, commit_log_offset={self._commit_log_offset!r}, "
                f"msg_id={self.msg_id!r}, offset_msg_id={self.offset_msg_id!r}, properties={self.properties!r}, "
                f"flag={self.flag!r}, sys_flag={self.sys_flag!r}, born_timestamp={self.born_timestamp!r}, "
                f"born_host={self.born_host!r}, store_timestamp={self.store_timestamp!r}, "
                f"store_host={self.store_host!r}, reconsume_times={self.reconsume_times!r}, "
                f"body_crc={self.body_crc!r}, broker_name={self.broker_name!r})")

    def __reduce__(self):
        return (type(self), self._fields())


# -- a pull response body ----------------------------------------------------------------------

def decode_messages(body, *, broker_name="", address=""):
    """The messages of a pull response body: whole CommitLog records back to back (§2.4.2, §2.6),
    compressed bodies (sys flag bit 0, with RocketMQ 5's type bits) inflated, an empty one left
    empty as MessageDecoder does. ValueError naming the offset and the problem when the body holds
    anything else (mqstore.client.message.decode_messages makes it a
    MessageDecodeError)."""
    cdef const unsigned char[::1] view
    cdef const char *b = NULL
    cdef Py_ssize_t n, pos = 0
    if type(body) is bytes:
        b = PyBytes_AS_STRING(body)
        n = PyBytes_GET_SIZE(body)
    else:
        view = memoryview(body).cast("B")
        n = view.shape[0]
        if n:
            b = <const char *>&view[0]
    cdef list out = []
    cdef Rec r
    cdef int code, expected
    cdef object topic = None, raw_props, raw_body
    cdef const char *last_topic = NULL
    cdef int last_topic_len = -1
    cdef MessageExt m
    while pos < n:
        code = parse_record(b, n, pos, &r, True, True)
        if code != R_OK:
            raise _no_record(address, pos, n, record_problem(code, &r, pos, n))
        try:
            if r.topic_len != last_topic_len or memcmp(b + r.topic_pos, last_topic, r.topic_len) != 0:
                topic = PyUnicode_DecodeUTF8(b + r.topic_pos, r.topic_len, NULL)
                last_topic = b + r.topic_pos
                last_topic_len = r.topic_len
            if r.props_len > 0:
                if not _ascii(b + r.props_pos, r.props_len):
                    PyUnicode_DecodeUTF8(b + r.props_pos, r.props_len, NULL)  # strict: it must be UTF-8
                raw_props = PyBytes_FromStringAndSize(b + r.props_pos, r.props_len)
            else:
                raw_props = _EMPTY
        except UnicodeDecodeError as exc:
            raise _no_record(address, pos, n,
                             f"record at offset {pos}: topic or properties are not UTF-8 ({exc})") from None
        expected = mq_record_length(r.body_len if r.body_len > 0 else 0, r.topic_len,
                                    r.props_len if r.props_len > 0 else 0, r.sys_flag, r.v2)
        if expected != r.total:
            raise _no_record(address, pos, n,
                             f"record at offset {pos}: TOTALSIZE {r.total} but its fields add up to {expected} bytes")
        if r.body_len <= 0:
            raw_body = _EMPTY
        elif r.sys_flag & MQ_COMPRESSED_FLAG:
            try:
                raw_body = mq_body_bytes(b + r.body_pos, r.body_len, r.sys_flag, _compression,
                                         f"the record at byte {pos}{_where(address)}")
            except BodyDecompressError as exc:
                raise ValueError(exc.args[0]) from None
        else:
            raw_body = PyBytes_FromStringAndSize(b + r.body_pos, r.body_len)
        m = MessageExt.__new__(MessageExt)
        m.topic = topic
        m.body = raw_body
        m.queue_id = r.queue_id
        m.queue_offset = r.queue_offset
        m._commit_log_offset = r.physical_offset
        m.flag = r.flag
        m.sys_flag = r.sys_flag
        m.born_timestamp = r.born_timestamp
        m.store_timestamp = r.store_timestamp
        m.reconsume_times = r.reconsume_times
        m.body_crc = r.body_crc
        m.broker_name = broker_name
        m._raw_properties = raw_props
        memcpy(m._born_raw, b + r.born_pos, r.born_len)
        m._born_len = r.born_len
        memcpy(m._store_raw, b + r.store_pos, r.store_len)
        m._store_len = r.store_len
        m._lazy = LAZY_ALL
        out.append(m)
        pos += r.total
    return out



# -- message ids (MessageClientIDSetter.createUniqID) -----------------------------------------

cdef inline int64_t _now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef int _month_bounds(int64_t ms, int64_t *start, int64_t *nxt) except -1:
    """The start of the local month holding ms and of the next, in ms since the epoch (what
    the twin's time.localtime / time.mktime give: the C library's own calls)."""
    cdef time_t secs = <time_t>(ms // 1000)
    cdef tm t, a
    if ms < 0 and ms % 1000:
        secs -= 1  # floor, as time.localtime(ms / 1000)
    if localtime_r(&secs, &t) == NULL:
        raise OverflowError(f"{ms} ms is out of the C library's time range")
    memset(&a, 0, sizeof(tm))
    a.tm_year = t.tm_year
    a.tm_mon = t.tm_mon
    a.tm_mday = 1
    a.tm_isdst = -1
    start[0] = <int64_t>mktime(&a) * 1000
    memset(&a, 0, sizeof(tm))
    a.tm_year = t.tm_year + (1 if t.tm_mon == 11 else 0)
    a.tm_mon = 0 if t.tm_mon == 11 else t.tm_mon + 1
    a.tm_mday = 1
    a.tm_isdst = -1
    nxt[0] = <int64_t>mktime(&a) * 1000
    return 0


cdef inline void _put_hex(char *out, uint32_t value, int digits) noexcept nogil:
    cdef int i
    for i in range(digits - 1, -1, -1):
        out[i] = _HEX[value & 15]
        value >>= 4


@cython.final
cdef class UniqIdGenerator:
    """Message ids like RocketMQ's MessageClientIDSetter.createUniqID: 32 upper-case hex digits of
    IPv4 address (4 bytes; RocketMQ's createFakeIP, 4 bytes of the clock, when ``ip`` is not
    one), pid (2), a per-generator random salt (4; Java uses a class loader's hash), ms since the
    start of the local month (4; the month's bounds recomputed when the clock passes the next
    month's start, a clock stepped back by less than 1000 s reads as the month's start) and a
    counter (2).

    ``fix`` (the first 10 bytes), ``counter`` (the first counter value) and ``now_ms`` (the
    clock reading the month bounds start from) are for tests: ``next_at(now_ms)`` gives the id
    of a given clock reading, so the twin (mqstore.client._twin.UniqIdGenerator) can be
    compared id for id."""

    cdef char _text[32]
    cdef bytes _fix
    cdef int64_t _start
    cdef int64_t _next_start
    cdef uint32_t _counter

    def __init__(self, ip=None, *, fix=None, counter=0, now_ms=None):
        cdef int i
        cdef const unsigned char *f
        if fix is None:
            addr = b""
            if ip is not None:
                try:
                    addr = socket.inet_pton(socket.AF_INET, ip)
                except (OSError, TypeError):
                    addr = b""
            if not addr:  # MessageClientIDSetter.createFakeIP: 4 bytes of the clock
                addr = (_now_ms() & 0xFFFFFFFF).to_bytes(4, "big")
            fix = addr + (os.getpid() & 0xFFFF).to_bytes(2, "big") + random.getrandbits(32).to_bytes(4, "big")
        if type(fix) is not bytes or len(fix) != 10:
            raise ValueError(f"fix must be 10 bytes (ip, pid, salt), not {fix!r}")
        self._fix = fix
        f = <const unsigned char *>PyBytes_AS_STRING(fix)
        for i in range(10):
            self._text[2 * i] = _HEX[f[i] >> 4]
            self._text[2 * i + 1] = _HEX[f[i] & 15]
        self._counter = <uint32_t>(counter & 0xFFFF)
        _month_bounds(_now_ms() if now_ms is None else <int64_t>now_ms, &self._start, &self._next_start)

    @property
    def fix(self):
        """The fixed first 10 bytes of every id: IPv4 address, pid, salt."""
        return self._fix

    cdef str _make(self, int64_t now):
        cdef int64_t diff
        if now >= self._next_start:
            _month_bounds(now, &self._start, &self._next_start)
        diff = now - self._start
        if -1000000 < diff < 0:
            diff = 0  # a clock stepped back a little (NTP)
        _put_hex(self._text + 20, <uint32_t>diff, 8)  # the low 32 bits, as Java's (int) cast
        _put_hex(self._text + 28, self._counter, 4)
        self._counter = (self._counter + 1) & 0xFFFF
        return PyUnicode_DecodeASCII(self._text, 32, NULL)

    def next(self):
        """The next id."""
        return self._make(_now_ms())

    def next_at(self, int64_t now_ms):
        """The next id as if the clock read now_ms (ms since the epoch)."""
        return self._make(now_ms)

    def next_many(self, Py_ssize_t n):
        """The next n ids (the clock read for each)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, not {n}")
        cdef list out = [None] * n
        cdef Py_ssize_t i
        for i in range(n):
            out[i] = self._make(_now_ms())
        return out

    def __repr__(self):
        return f"<UniqIdGenerator {self._fix.hex().upper()}>"


# -- properties and batch bodies on the wire ---------------------------------------------------

cdef dict _ORDERS = {}  # names in insertion order -> the names in Java HashMap order
cdef Py_ssize_t _ORDERS_MAX = 1024


cdef str _properties_string(dict props):
    """mq_record.properties_string(props, java order), each set of names ordered once."""
    cdef Py_ssize_t n = len(props)
    if n == 0:
        return ""
    if n == 1:
        for key, value in props.items():
            return "" if value is None else f"{key}\x01{value}"
    names = tuple(props)
    order = _ORDERS.get(names)
    if order is None:
        order = tuple(java_hashmap_keys(props))
        if len(_ORDERS) >= _ORDERS_MAX:
            _ORDERS.clear()
        _ORDERS[names] = order
    cdef list parts = []
    for key in <tuple>order:
        value = props[key]
        if value is not None:
            parts.append(f"{key}\x01{value}")
    return "\x02".join(parts)


def encode_properties(props):
    """MessageDecoder.messageProperties2String (spec §1.4): name\\x01value pairs joined by \\x02
    in Java HashMap order, None values left out; what mqstore.log._codec.properties_to_string gives,
    the order of each set of names computed once."""
    if props is None:
        return ""
    return _properties_string(props if type(props) is dict else dict(props))


def batch_entries(items, prepare, Py_ssize_t max_body):
    """The entries of a batch, checked: a ``bytes`` item of 1 to max_body bytes as it is (no
    properties, flag 0), any other item as ``prepare(item, index)`` gives it (a (body bytes,
    properties dict or None, flag int32) tuple), or raises."""
    cdef list out = []
    cdef Py_ssize_t i = 0, n
    for item in items:
        if type(item) is bytes:
            n = PyBytes_GET_SIZE(item)
            if 0 < n <= max_body:
                out.append(item)
                i += 1
                continue
        out.append(prepare(item, i))
        i += 1
    return out


def encode_batch(list entries, list ids):
    """A SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages, spec §2.4.1) of batch_entries'
    entries, the i-th message with the UNIQ_KEY ids[i]: for each, [totalSize][magic 0][bodyCRC 0]
    [flag][bodyLen][body][propsLen][props]; what mqstore.log._codec.encode_batch_body gives for
    (body, properties with UNIQ_KEY, flag)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(entries), i, total = 0, size, props_len, body_len
    if PyList_GET_SIZE(ids) != n:
        raise ValueError(f"{n} entries but {PyList_GET_SIZE(ids)} ids")
    cdef list props_strs = [None] * n
    cdef object entry, body, uniq, flag
    cdef dict props
    cdef const char *p
    cdef str s
    for i in range(n):
        entry = <object>PyList_GET_ITEM(entries, i)
        uniq = <object>PyList_GET_ITEM(ids, i)
        if type(uniq) is not str:
            raise TypeError(f"id {i} must be a str, not {type(uniq).__name__}")
        if type(entry) is bytes:
            body = entry
            s = "UNIQ_KEY\x01" + <str>uniq
        else:
            if type(entry) is not tuple or PyTuple_GET_SIZE(entry) != 3:
                raise TypeError(f"batch entry {i} must be bytes or a (body, properties, flag) tuple")
            body = <object>PyTuple_GET_ITEM(entry, 0)
            if type(body) is not bytes:
                raise TypeError(f"the body of batch entry {i} must be bytes, not {type(body).__name__}")
            raw = <object>PyTuple_GET_ITEM(entry, 1)
            props = {} if raw is None else dict(raw)
            props["UNIQ_KEY"] = uniq
            s = _properties_string(props)
        PyUnicode_AsUTF8AndSize(s, &props_len)
        if props_len > MQ_MAX_PROPERTIES_BYTES:
            raise ValueError(f"batch message properties are {props_len} bytes, more than {MQ_MAX_PROPERTIES_BYTES}")
        props_strs[i] = s
        total += 22 + PyBytes_GET_SIZE(body) + props_len
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char *w = PyBytes_AS_STRING(out)
    cdef int32_t flag32
    for i in range(n):
        entry = <object>PyList_GET_ITEM(entries, i)
        if type(entry) is bytes:
            body = entry
            flag32 = 0
        else:
            body = <object>PyTuple_GET_ITEM(entry, 0)
            flag32 = <int32_t>(<object>PyTuple_GET_ITEM(entry, 2))
        p = PyUnicode_AsUTF8AndSize(<object>PyList_GET_ITEM(props_strs, i), &props_len)
        body_len = PyBytes_GET_SIZE(body)
        size = 22 + body_len + props_len
        mq_put_i32(w, <int32_t>size)
        mq_put_i32(w + 4, 0)
        mq_put_i32(w + 8, 0)
        mq_put_i32(w + 12, flag32)
        mq_put_i32(w + 16, <int32_t>body_len)
        memcpy(w + 20, PyBytes_AS_STRING(body), body_len)
        mq_put_i16(w + 20 + body_len, <short>props_len)
        memcpy(w + 22 + body_len, p, props_len)
        w += size
    return out
