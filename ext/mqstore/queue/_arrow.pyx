# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Arrow column buffers of CommitLog records (the Spark reader builds its record
batches from these). Bytes only: the buffers follow Arrow's columnar layout (little-endian
fixed-width values, int32 offsets + data for strings and binaries, validity bitmaps for the
nullable columns, list offsets for the properties map) and ``mqstore.spark`` wraps them into
``pyarrow`` arrays without copying. The pure-Python twin is ``mqstore.twin.arrow``.

Columns, per record (spec §1):

    topic, queue_id, queue_offset, commitlog_offset, store_size, born_timestamp (µs),
    store_timestamp (µs), born_host, store_host ("ip:port", "[ipv6]:port"), tags and keys
    (the TAGS and KEYS properties, null when absent), msg_id (the offset message id: store host
    and physical offset in hex), properties (every name/value pair, in stored order), body,
    reconsume_times, sys_flag

The body is the one the producer sent: a body stored compressed (sysFlag bit 0, the RocketMQ 5
type bits) is inflated (ext/mq_inflate.pxd: C zlib; LZ4 and ZSTD through mqstore.compression),
unless the batch is made with ``decompress=False``; sys_flag stays the stored one.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

from mq_bytes cimport mq_get_i32, mq_get_i64
from mq_dispatch cimport key_is
from mq_inflate cimport MqBuf as Buf
from mq_inflate cimport MQ_COMPRESSED_FLAG, mq_body_into, mq_buf_room
from mq_record cimport *

from mqstore import compression as _compression

cdef extern from "<arpa/inet.h>" nogil:
    const char *inet_ntop(int af, const void *src, char *dst, unsigned int size)
    int AF_INET
    int AF_INET6

cdef extern from "malloc.h" nogil:
    int mallopt(int param, int value)
    int M_MMAP_THRESHOLD
    int M_TRIM_THRESHOLD


def keep_freed_memory(int max_bytes=256 << 20) -> bool:
    """Have this process's malloc keep and reuse the memory of freed batches (blocks up to
    max_bytes come from the heap, not from fresh mmaps, and freed heap is not given back):
    a batch's buffers are tens of MB, and first touches of fresh pages cost more than decoding
    into them (0.3 GB/s on the 2-core VM). For reader processes such as Spark's Python
    workers; whether glibc took both settings."""
    return mallopt(M_MMAP_THRESHOLD, max_bytes) == 1 and mallopt(M_TRIM_THRESHOLD, max_bytes) == 1


cdef enum:
    CQ_UNIT = 20
    FILLER_SIZE = 0x7FFFFFFF

#: the columns a batch can hold, in schema order
COLUMNS = ("topic", "queue_id", "queue_offset", "commitlog_offset", "store_size", "born_timestamp",
           "store_timestamp", "born_host", "store_host", "tags", "keys", "msg_id", "properties", "body",
           "reconsume_times", "sys_flag")
#: which columns are strings / binary (offsets + data), nullable strings, fixed-width int32 / int64
STRING_COLUMNS = ("topic", "born_host", "store_host", "msg_id", "body")
NULLABLE_STRING_COLUMNS = ("tags", "keys")
INT32_COLUMNS = ("queue_id", "store_size", "reconsume_times", "sys_flag")
INT64_COLUMNS = ("queue_offset", "commitlog_offset", "born_timestamp", "store_timestamp")

cdef enum:
    C_TOPIC, C_QUEUE_ID, C_QUEUE_OFFSET, C_PHY, C_SIZE, C_BORN_TS, C_STORE_TS, C_BORN_HOST, C_STORE_HOST,
    C_TAGS, C_KEYS, C_MSG_ID, C_PROPS, C_BODY, C_RECONSUME, C_SYS_FLAG, C_COUNT


cdef int buf_reserve(Buf *b, Py_ssize_t extra) except -1 nogil:
    if mq_buf_room(b, extra) < 0:
        with gil:
            raise MemoryError(f"cannot grow an Arrow buffer of {b.len} bytes by {extra} bytes")
    return 0


cdef inline int buf_put(Buf *b, const void *src, Py_ssize_t n) except -1 nogil:
    if b.len + n > b.cap:
        buf_reserve(b, n)
    memcpy(b.data + b.len, src, n)
    b.len += n
    return 0


cdef inline int buf_i32(Buf *b, int32_t v) except -1 nogil:
    return buf_put(b, &v, 4)  # Arrow buffers are little-endian, as this machine


cdef inline int buf_i64(Buf *b, int64_t v) except -1 nogil:
    return buf_put(b, &v, 8)


cdef class BufferView:
    """A read-only buffer over a column's memory, without a copy (pyarrow.py_buffer and
    memoryview take it); it keeps the batch that owns the memory alive."""

    cdef object owner
    cdef char *data
    cdef readonly Py_ssize_t nbytes

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, <void *>(self.data if self.data != NULL else EMPTY), self.nbytes, 1, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __len__(self):
        return self.nbytes

    def __bytes__(self):
        return PyBytes_FromStringAndSize(self.data if self.data != NULL else EMPTY, self.nbytes)


cdef char EMPTY[1]


cdef BufferView buf_view(object owner, Buf *b):
    cdef BufferView v = BufferView.__new__(BufferView)
    v.owner = owner
    v.data = b.data
    v.nbytes = b.len
    return v


cdef class _Column:
    """One column's buffers: values (fixed width) or offsets + data (+ validity)."""
    cdef Buf values
    cdef Buf offsets
    cdef Buf validity
    cdef Py_ssize_t nulls

    def __dealloc__(self):
        free(self.values.data)
        free(self.offsets.data)
        free(self.validity.data)


cdef inline int host_string(Buf *b, const char *raw, bint v6) except -1 nogil:
    """'a.b.c.d:port' or '[v6]:port' of a BORNHOST/STOREHOST field."""
    cdef char text[64]
    cdef char port[16]
    cdef int32_t p = mq_get_i32(raw + (16 if v6 else 4))
    cdef int n = 0
    cdef unsigned int up
    if inet_ntop(AF_INET6 if v6 else AF_INET, raw, text, 64) == NULL:
        text[0] = 0
    if v6:
        buf_put(b, "[", 1)
    while text[n] != 0:
        n += 1
    buf_put(b, text, n)
    if v6:
        buf_put(b, "]", 1)
    buf_put(b, ":", 1)
    if p < 0:
        buf_put(b, "-", 1)
        up = <unsigned int>(-(<int64_t>p))
    else:
        up = <unsigned int>p
    n = 0
    while True:
        port[15 - n] = <char>(48 + up % 10)
        n += 1
        up //= 10
        if up == 0:
            break
    buf_put(b, port + 16 - n, n)
    return 0


cdef inline int32_t mq_get_i32_native(Buf *b) noexcept nogil:
    """The last int32 of a buffer (native byte order)."""
    cdef int32_t v
    memcpy(&v, b.data + b.len - 4, 4)
    return v


cdef int64_t MAX_MS = 9223372036854775  # the most milliseconds an int64 of microseconds holds


cdef inline int64_t micros(int64_t ms, int64_t phy, str field) except? -1:
    if ms > MAX_MS or ms < -MAX_MS:
        raise OverflowError(f"the record at physical offset {phy} has {field} {ms} ms, which a timestamp in "
                            "microseconds cannot hold")
    return ms * 1000


cdef inline void put_reserved(_Column col, const char *src, int n) noexcept:
    """Append a string to col (data and its end offset) where buf_reserve made room."""
    cdef int32_t end
    memcpy(col.values.data + col.values.len, src, n)
    col.values.len += n
    end = <int32_t>col.values.len
    memcpy(col.offsets.data + col.offsets.len, &end, 4)
    col.offsets.len += 4


cdef struct HostCache:
    # the last host field formatted: records of one store repeat their store host (and
    # mostly a few born hosts), so formatting each one again is wasted
    char raw[20]
    int raw_len
    char text[64]
    int text_len


cdef inline int cached_host(Buf *b, HostCache *c, const char *raw, bint v6) except -1 nogil:
    cdef int n = 20 if v6 else 8
    cdef Buf tmp
    if c.raw_len != n or memcmp(c.raw, raw, n) != 0:
        tmp.data = NULL
        tmp.len = 0
        tmp.cap = 0
        try:
            host_string(&tmp, raw, v6)
            memcpy(c.text, tmp.data, tmp.len)
            c.text_len = <int>tmp.len
        finally:
            free(tmp.data)
        memcpy(c.raw, raw, n)
        c.raw_len = n
    return buf_put(b, c.text, c.text_len)


cdef const char *HEX = "0123456789ABCDEF"
#: most name/value pairs one properties string can hold (32767 bytes, 3 bytes a pair at least)
cdef enum:
    MAX_PAIRS = 10923


cdef inline void hex_chars(char *out, const char *raw, int n) noexcept nogil:
    cdef int i
    cdef unsigned char c
    for i in range(n):
        c = <unsigned char>raw[i]
        out[2 * i] = HEX[c >> 4]
        out[2 * i + 1] = HEX[c & 15]


cdef inline int hex_into(Buf *b, const char *raw, int n) except -1 nogil:
    buf_reserve(b, 2 * n)
    hex_chars(b.data + b.len, raw, n)
    b.len += 2 * n
    return 0


cdef inline bint unit_kept(const char *u, int64_t min_phy, int64_t *phy, int32_t *size,
                           Py_ssize_t *below_min) noexcept nogil:
    """A ConsumeQueue unit's phyOffset and size, and whether its record is read: not a filler
    unit, and not below min_phy (deleted by retention: counted in below_min)."""
    phy[0] = mq_get_i64(u)
    size[0] = mq_get_i32(u + 8)
    if phy[0] == 0 and size[0] == FILLER_SIZE:
        return False
    if phy[0] < min_phy:
        below_min[0] += 1
        return False
    return True


cdef class BatchColumns:
    """The columns of a batch of records, appended one record at a time (``add_units``,
    ``add_span``), read out by ``buffers()``. ``columns`` names the columns wanted (default:
    all); the others are not decoded (the body and the properties are the costly ones).
    ``decompress`` (default True): the body column holds the bodies as the producer sent them,
    those stored compressed inflated per their sysFlag (BodyDecompressError naming the record
    when one does not inflate; CompressionLibraryMissingError when LZ4 or ZSTD needs a package
    that is not installed); False: as stored."""

    cdef readonly Py_ssize_t rows
    cdef bint want[C_COUNT]
    cdef list cols
    cdef readonly tuple names
    cdef _Column _prop_keys
    cdef _Column _prop_values
    cdef int32_t *pairs  # scratch: (name start, name end, value start, value end) per pair of a record
    cdef HostCache born_cache
    cdef HostCache store_cache
    cdef HostCache id_cache  # the store host in hex, the first half of a msg_id
    cdef bint sealed  # buffers() handed out views of the memory: it must not move any more
    cdef readonly Py_ssize_t below_min  # units add_units skipped because their record is below min_phy
    cdef readonly bint decompress

    def __cinit__(self):
        self.pairs = NULL
        self.born_cache.raw_len = 0
        self.store_cache.raw_len = 0
        self.id_cache.raw_len = 0

    def __init__(self, columns=None, *, bint decompress=True):
        cdef int i
        self.decompress = decompress
        names = COLUMNS if columns is None else tuple(columns)
        unknown = [c for c in names if c not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; the columns are {', '.join(COLUMNS)}")
        self.names = tuple(c for c in COLUMNS if c in names)
        self.cols = [_Column() for _ in range(C_COUNT)]
        for i in range(C_COUNT):
            self.want[i] = COLUMNS[i] in self.names
            if COLUMNS[i] in STRING_COLUMNS or COLUMNS[i] in NULLABLE_STRING_COLUMNS or i == C_PROPS:
                buf_i32(&(<_Column>self.cols[i]).offsets, 0)
        self._prop_keys = _Column()
        self._prop_values = _Column()
        buf_i32(&self._prop_keys.offsets, 0)
        buf_i32(&self._prop_values.offsets, 0)
        self.pairs = <int32_t *>malloc(MAX_PAIRS * 4 * sizeof(int32_t))
        if self.pairs == NULL:
            raise MemoryError()
        self.rows = 0

    def __dealloc__(self):
        free(self.pairs)

    cdef inline Buf *_data(self, int c):
        return &(<_Column>self.cols[c]).values

    cdef inline int _end_string(self, int c) except -1:
        cdef _Column col = <_Column>self.cols[c]
        return buf_i32(&col.offsets, <int32_t>col.values.len)

    cdef int _check_offsets(self, int c) except -1:
        if (<_Column>self.cols[c]).values.len > 0x7FFFFFFF:
            raise OverflowError(f"column {COLUMNS[c]} holds over 2 GiB in one batch; make batches smaller")
        return 0

    cdef int _validity(self, int c, bint valid) except -1:
        cdef _Column col = <_Column>self.cols[c]
        cdef Py_ssize_t row = self.rows
        if row % 8 == 0:
            buf_put(&col.validity, "\0", 1)
        if valid:
            col.validity.data[row // 8] |= <char>(1 << (row % 8))
        else:
            col.nulls += 1
        return 0

    cdef int _pairs(self, const char *props, int n) noexcept nogil:
        """spec §1.4 string2messageProperties on the bytes of a properties string: segments
        split on \\x02; a segment counts if its first \\x01 leaves a non-empty name and a
        non-empty value (everything after it); a later duplicate name replaces the value and
        keeps the first position. Fills self.pairs; returns the number of pairs."""
        cdef int i = 0, seg = 0, sep = 0, end = 0, j, m, npairs = 0
        cdef int32_t *q
        while next_property(props, n, &i, &seg, &sep, &end):
            m = -1
            for j in range(npairs):
                q = self.pairs + 4 * j
                if q[1] - q[0] == sep - seg and memcmp(props + q[0], props + seg, sep - seg) == 0:
                    m = j
                    break
            if m < 0:
                m = npairs
                npairs += 1
                q = self.pairs + 4 * m
                q[0] = seg
                q[1] = sep
            q = self.pairs + 4 * m
            q[2] = sep + 1
            q[3] = end
        return npairs

    cdef int add(self, const char *p, int64_t avail, int64_t phy) except -1:
        """Append the record at p (phy is its physical offset). Raises ValueError when the
        bytes there are not a record."""
        cdef RecordHead h
        cdef int r = parse_record_head(p, avail, &h)
        if r != MQ_PARSE_OK:
            raise ValueError(f"no record at physical offset {phy}" + (" (an END_OF_FILE blank)" if r == MQ_PARSE_BLANK
                                                                       else ""))
        cdef int32_t sf = h.sys_flag
        cdef bint born_v6 = (sf & MQ_BORNHOST_V6_FLAG) != 0
        cdef bint store_v6 = (sf & MQ_STOREHOST_V6_FLAG) != 0
        cdef int store_ts_pos = store_timestamp_pos(sf)
        cdef int store_host_pos = store_ts_pos + 8
        cdef int store_len = 20 if store_v6 else 8
        cdef const char *props = p + h.props_pos
        cdef int i, npairs
        cdef int32_t *k
        cdef bint has_tags = False, has_keys = False
        cdef int tags_at = 0, tags_len = 0, keys_at = 0, keys_len = 0
        if self.want[C_TOPIC]:
            buf_put(self._data(C_TOPIC), p + h.topic_pos, h.topic_len)
            self._end_string(C_TOPIC)
        if self.want[C_QUEUE_ID]:
            buf_i32(self._data(C_QUEUE_ID), mq_get_i32(p + MQ_POS_QUEUEID))
        if self.want[C_QUEUE_OFFSET]:
            buf_i64(self._data(C_QUEUE_OFFSET), mq_get_i64(p + MQ_POS_QUEUEOFFSET))
        if self.want[C_PHY]:
            buf_i64(self._data(C_PHY), mq_get_i64(p + MQ_POS_PHYSICALOFFSET))
        if self.want[C_SIZE]:
            buf_i32(self._data(C_SIZE), h.size)
        if self.want[C_BORN_TS]:
            buf_i64(self._data(C_BORN_TS), micros(mq_get_i64(p + MQ_POS_BORNTIMESTAMP), phy, "BORNTIMESTAMP"))
        if self.want[C_STORE_TS]:
            buf_i64(self._data(C_STORE_TS), micros(mq_get_i64(p + store_ts_pos), phy, "STORETIMESTAMP"))
        if self.want[C_BORN_HOST]:
            cached_host(self._data(C_BORN_HOST), &self.born_cache, p + MQ_POS_BORNHOST, born_v6)
            self._end_string(C_BORN_HOST)
        if self.want[C_STORE_HOST]:
            cached_host(self._data(C_STORE_HOST), &self.store_cache, p + store_host_pos, store_v6)
            self._end_string(C_STORE_HOST)
        if self.want[C_MSG_ID]:
            # the offset message id: the store host's address and port, then the physical offset
            if self.id_cache.raw_len != store_len or memcmp(self.id_cache.raw, p + store_host_pos, store_len) != 0:
                memcpy(self.id_cache.raw, p + store_host_pos, store_len)
                self.id_cache.raw_len = store_len
                hex_chars(self.id_cache.text, p + store_host_pos, store_len)
                self.id_cache.text_len = 2 * store_len
            buf_put(self._data(C_MSG_ID), self.id_cache.text, self.id_cache.text_len)
            hex_into(self._data(C_MSG_ID), p + MQ_POS_PHYSICALOFFSET, 8)
            self._end_string(C_MSG_ID)
        if self.want[C_BODY]:
            if self.decompress and sf & MQ_COMPRESSED_FLAG and h.body_len > 0:
                mq_body_into(self._data(C_BODY), p + h.body_pos, h.body_len, sf, _compression,
                             (PyBytes_FromStringAndSize(p + h.topic_pos, h.topic_len),
                              mq_get_i32(p + MQ_POS_QUEUEID), mq_get_i64(p + MQ_POS_QUEUEOFFSET), phy))
            else:
                buf_put(self._data(C_BODY), p + h.body_pos, h.body_len)
            self._check_offsets(C_BODY)
            self._end_string(C_BODY)
        if self.want[C_RECONSUME]:
            buf_i32(self._data(C_RECONSUME), mq_get_i32(p + h.body_pos - 16))
        if self.want[C_SYS_FLAG]:
            buf_i32(self._data(C_SYS_FLAG), sf)
        if self.want[C_TAGS] or self.want[C_KEYS] or self.want[C_PROPS]:
            npairs = self._pairs(props, h.props_len)
            if self.want[C_PROPS]:  # room for every pair at once: the loop below only copies
                buf_reserve(&self._prop_keys.values, h.props_len)
                buf_reserve(&self._prop_values.values, h.props_len)
                buf_reserve(&self._prop_keys.offsets, 4 * npairs)
                buf_reserve(&self._prop_values.offsets, 4 * npairs)
            for i in range(npairs):
                k = self.pairs + 4 * i
                if key_is(props + k[0], k[1] - k[0], "TAGS", 4):
                    has_tags, tags_at, tags_len = True, k[2], k[3] - k[2]
                elif key_is(props + k[0], k[1] - k[0], "KEYS", 4):
                    has_keys, keys_at, keys_len = True, k[2], k[3] - k[2]
                if self.want[C_PROPS]:
                    put_reserved(self._prop_keys, props + k[0], k[1] - k[0])
                    put_reserved(self._prop_values, props + k[2], k[3] - k[2])
            if self.want[C_TAGS]:
                self._validity(C_TAGS, has_tags)
                if has_tags:
                    buf_put(self._data(C_TAGS), props + tags_at, tags_len)
                self._end_string(C_TAGS)
            if self.want[C_KEYS]:
                self._validity(C_KEYS, has_keys)
                if has_keys:
                    buf_put(self._data(C_KEYS), props + keys_at, keys_len)
                self._end_string(C_KEYS)
            if self.want[C_PROPS]:
                buf_i32(&(<_Column>self.cols[C_PROPS]).offsets,
                        mq_get_i32_native(&(<_Column>self.cols[C_PROPS]).offsets) + npairs)
        self.rows += 1
        return 0

    def buffers(self) -> dict:
        """{column: buffers} in Arrow's layout, as BufferViews over this batch's memory (no
        copy; nothing can be added to the batch afterwards): int32 / int64 columns
        ``(values,)``; strings and binaries ``(offsets, data)``; tags and keys
        ``(validity or None, offsets, data, null_count)``; properties ``(list offsets,
        key offsets, key data, value offsets, value data)``."""
        out = {}
        cdef _Column col
        cdef int i
        self.sealed = True
        for i in range(C_COUNT):
            if not self.want[i]:
                continue
            name = COLUMNS[i]
            col = <_Column>self.cols[i]
            if i == C_PROPS:
                out[name] = (buf_view(self, &col.offsets), buf_view(self, &self._prop_keys.offsets),
                             buf_view(self, &self._prop_keys.values), buf_view(self, &self._prop_values.offsets),
                             buf_view(self, &self._prop_values.values))
            elif name in NULLABLE_STRING_COLUMNS:
                out[name] = (buf_view(self, &col.validity) if col.nulls else None, buf_view(self, &col.offsets),
                             buf_view(self, &col.values), col.nulls)
            elif name in STRING_COLUMNS:
                out[name] = (buf_view(self, &col.offsets), buf_view(self, &col.values))
            else:
                out[name] = (buf_view(self, &col.values),)
        return out

    cdef int _check_open(self) except -1:
        if self.sealed:
            raise ValueError("this batch's buffers were handed out (buffers()); start a new BatchColumns")
        return 0

    def add_units(self, logs, const unsigned char[:] units, int64_t min_phy=0) -> int:
        """Append the records that ConsumeQueue units point at: units is a run of 20-byte units
        (big-endian phyOffset, size, tagsCode); filler units and units below min_phy (the
        CommitLog's first available byte: deleted by retention, counted in below_min) are
        skipped. logs is a RecordSource. Returns the records appended."""
        self._check_open()
        return (<RecordSource?>logs).add_units(self, units, min_phy)

    @property
    def queue_only(self) -> bool:
        """Whether every column wanted is one a ConsumeQueue unit and its queue say (topic,
        queue_id, queue_offset, commitlog_offset, store_size): add_queue_units fills them
        without reading the CommitLog."""
        cdef int i
        for i in range(C_COUNT):
            if self.want[i] and i not in (C_TOPIC, C_QUEUE_ID, C_QUEUE_OFFSET, C_PHY, C_SIZE):
                return False
        return True

    def add_queue_units(self, const unsigned char[:] units, str topic, int32_t queue_id, int64_t first_offset,
                        int64_t min_phy=0) -> int:
        """Append the rows of ConsumeQueue units (a run of 20-byte units of queue topic/queue_id,
        the first at queue offset first_offset) from the units alone, as add_units would from
        their records: topic and queue_id are the queue's, queue_offset the unit's place,
        commitlog_offset and store_size the unit's. Only when ``queue_only``. Filler units and
        units below min_phy (counted in below_min) are skipped, as add_units skips them. Returns
        the rows appended."""
        self._check_open()
        if not self.queue_only:
            raise ValueError(f"columns {', '.join(self.names)} need the records: add_queue_units fills only "
                             "topic, queue_id, queue_offset, commitlog_offset and store_size")
        if first_offset < 0:
            raise ValueError(f"first_offset must be >= 0, got {first_offset}")
        cdef bytes topic_bytes = topic.encode("utf-8")
        cdef const char *t = topic_bytes
        cdef Py_ssize_t tn = len(topic_bytes)
        cdef Py_ssize_t n = units.shape[0] // CQ_UNIT, i, added = 0
        cdef int64_t phy
        cdef int32_t size
        if n and self.want[C_TOPIC]:
            buf_reserve(self._data(C_TOPIC), tn * n)
        for i in range(n):
            if not unit_kept(<const char *>&units[i * CQ_UNIT], min_phy, &phy, &size, &self.below_min):
                continue
            if self.want[C_TOPIC]:
                buf_put(self._data(C_TOPIC), t, tn)
                self._end_string(C_TOPIC)
            if self.want[C_QUEUE_ID]:
                buf_i32(self._data(C_QUEUE_ID), queue_id)
            if self.want[C_QUEUE_OFFSET]:
                buf_i64(self._data(C_QUEUE_OFFSET), first_offset + i)
            if self.want[C_PHY]:
                buf_i64(self._data(C_PHY), phy)
            if self.want[C_SIZE]:
                buf_i32(self._data(C_SIZE), size)
            self.rows += 1
            added += 1
        return added

    def add_span(self, logs, int64_t phy, int64_t end, Py_ssize_t max_rows=0, int64_t max_bytes=0) -> tuple:
        """Append the records in [phy, end) of the CommitLog, in order, at most max_rows of
        them (0: all) and at most max_bytes of records (0: no limit; the first record is
        always taken, however big); an END_OF_FILE blank ends a file (the next record starts
        the next file). Returns (records appended, where the next record starts)."""
        cdef int64_t at = phy
        self._check_open()
        cdef Py_ssize_t added = (<RecordSource?>logs).add_span(self, &at, end, max_rows, max_bytes)
        return added, at


def cut_units(const unsigned char[:] units, Py_ssize_t start, Py_ssize_t max_rows=0, int64_t max_bytes=0):
    """Where a batch of ConsumeQueue units that starts at unit index start ends (exclusive):
    after at most max_rows units (0: no limit) whose records add up to at most max_bytes (0:
    no limit; the first unit is always taken). Filler units count as rows of no bytes."""
    cdef Py_ssize_t n = units.shape[0] // CQ_UNIT, i = start
    cdef int64_t taken = 0
    cdef int32_t size
    if start < 0 or start > n:
        raise ValueError(f"start {start} is outside the {n} units")
    while i < n and (max_rows <= 0 or i - start < max_rows):
        size = mq_get_i32(<const char *>&units[i * CQ_UNIT] + 8)
        if size == FILLER_SIZE or size < 0:
            size = 0
        if max_bytes > 0 and i > start and taken + size > max_bytes:
            break
        taken += size
        i += 1
    return i


cdef class RecordSource:
    """Addresses of the mapped CommitLog files a batch reads from. files: buffers (e.g.
    memoryviews of mapped files), each holding the file that starts at first_from +
    k * file_size for k = 0, 1, ... The buffers must stay alive and mapped while in use."""

    cdef const char **bases
    cdef Py_ssize_t count
    cdef readonly int64_t first_from
    cdef readonly int64_t file_size
    cdef list _views

    def __cinit__(self):
        self.bases = NULL

    def __init__(self, int64_t first_from, int64_t file_size, files):
        cdef Py_ssize_t i
        cdef const unsigned char[:] mv
        if file_size <= 0:
            raise ValueError(f"file_size must be > 0, got {file_size}")
        self.first_from = first_from
        self.file_size = file_size
        self._views = []
        files = list(files)
        self.bases = <const char **>malloc(max(1, len(files)) * sizeof(char *))
        if self.bases == NULL:
            raise MemoryError()
        self.count = len(files)
        for i in range(self.count):
            mv = files[i]
            if mv.shape[0] < file_size:
                raise ValueError(f"file {i} holds {mv.shape[0]} bytes, less than file_size {file_size}")
            self._views.append(mv)
            self.bases[i] = <const char *>&mv[0]

    def __dealloc__(self):
        free(self.bases)

    cdef inline const char *_at(self, int64_t phy, int64_t *avail) except NULL:
        cdef int64_t k = (phy - self.first_from) // self.file_size if phy >= self.first_from else -1
        if k < 0 or k >= self.count:
            raise ValueError(f"physical offset {phy} is not in the mapped CommitLog files "
                             f"[{self.first_from}, {self.first_from + self.count * self.file_size})")
        cdef int64_t pos = phy - self.first_from - k * self.file_size
        avail[0] = self.file_size - pos
        return self.bases[k] + pos

    cdef Py_ssize_t add_units(self, BatchColumns cols, const unsigned char[:] units, int64_t min_phy) except -1:
        cdef Py_ssize_t n = units.shape[0] // CQ_UNIT, i, added = 0
        cdef int64_t phy, avail = 0
        cdef int32_t size
        cdef const char *rec
        for i in range(n):
            if not unit_kept(<const char *>&units[i * CQ_UNIT], min_phy, &phy, &size, &cols.below_min):
                continue
            rec = self._at(phy, &avail)
            if size > avail:
                raise ValueError(f"the ConsumeQueue unit at {phy} says {size} bytes, past the end of its file")
            cols.add(rec, size, phy)
            added += 1
        return added

    cdef Py_ssize_t add_span(self, BatchColumns cols, int64_t *at, int64_t end, Py_ssize_t max_rows,
                             int64_t max_bytes) except -1:
        cdef Py_ssize_t added = 0
        cdef int64_t avail = 0, phy = at[0], taken = 0
        cdef const char *rec
        cdef RecordHead h
        cdef int r
        while phy < end and (max_rows <= 0 or added < max_rows):
            rec = self._at(phy, &avail)
            if avail > end - phy:
                avail = end - phy
            r = parse_record_head(rec, avail, &h)
            if r == MQ_PARSE_BLANK:  # END_OF_FILE: the next record starts the next file
                phy += self.file_size - (phy - self.first_from) % self.file_size
                continue
            if r != MQ_PARSE_OK:
                raise ValueError(f"no record at physical offset {phy} (the span ends at {end})")
            if max_bytes > 0 and added > 0 and taken + h.size > max_bytes:
                break
            cols.add(rec, h.size, phy)
            taken += h.size
            phy += h.size
            at[0] = phy
            added += 1
        at[0] = phy
        return added
