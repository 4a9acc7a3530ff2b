# Bodies as the producer sent them (mqstore.compression): a body flagged compressed in its record's
# sysFlag is inflated before a kernel hands it out; zlib here, through C zlib (setup.py links -lz),
# LZ4 and ZSTD through mqstore.compression (the PyPI packages lz4 and zstandard), which also words
# every error. Header-only: every function here is inline.
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memset

cdef extern from "zlib.h" nogil:
    ctypedef struct z_stream:
        unsigned char *next_in
        unsigned int avail_in
        unsigned char *next_out
        unsigned int avail_out
        char *msg
    int Z_OK
    int Z_STREAM_END
    int Z_NO_FLUSH
    int Z_BUF_ERROR
    int Z_NEED_DICT
    int Z_MEM_ERROR
    int inflateInit(z_stream *strm)
    int inflate(z_stream *strm, int flush)
    int inflateEnd(z_stream *strm)

cdef enum:
    MQ_COMPRESSED_FLAG = 0x1                 # MessageSysFlag.COMPRESSED_FLAG
    MQ_COMPRESSION_TYPE_COMPARATOR = 0x700   # RocketMQ 5: the compression type in bits 8-10
    MQ_COMPRESSION_NONE = 0
    MQ_COMPRESSION_LZ4 = 1
    MQ_COMPRESSION_ZSTD = 2
    MQ_COMPRESSION_ZLIB = 3
    MQ_INFLATE_OK = 0
    MQ_INFLATE_BAD = 1                       # not zlib data, or cut short: *msg says which
    MQ_INFLATE_TOO_BIG = 2                   # past the limit
    MQ_INFLATE_NO_MEMORY = 3


cdef struct MqBuf:
    # a growable byte buffer (malloc'd; the owner frees data)
    char *data
    Py_ssize_t len
    Py_ssize_t cap


cdef inline int mq_body_compression(int32_t sys_flag) noexcept nogil:
    """How a body is stored (CompressionType.findByValue): MQ_COMPRESSION_NONE without
    COMPRESSED_FLAG, else the type bits, 0 meaning ZLIB (4.x producers set no type); 4-7 are
    returned as they are (no reader knows them)."""
    cdef int value
    if not sys_flag & MQ_COMPRESSED_FLAG:
        return MQ_COMPRESSION_NONE
    value = (sys_flag & MQ_COMPRESSION_TYPE_COMPARATOR) >> 8
    return MQ_COMPRESSION_ZLIB if value == 0 else value


cdef inline int mq_buf_room(MqBuf *b, Py_ssize_t extra) noexcept nogil:
    """Room for extra more bytes (the capacity doubles); -1 when out of memory."""
    cdef Py_ssize_t need = b.len + extra, cap
    cdef char *p
    if need <= b.cap:
        return 0
    cap = b.cap * 2 if b.cap else 4096
    while cap < need:
        cap *= 2
    p = <char *>realloc(b.data, cap)
    if p == NULL:
        return -1
    b.data = p
    b.cap = cap
    return 0


cdef inline int mq_inflate_zlib(MqBuf *out, const char *src, Py_ssize_t n, Py_ssize_t limit,
                                const char **msg) noexcept nogil:
    """Append the zlib stream src[0:n] inflated to out (what java.util.zip.InflaterInputStream
    reads: bytes after the stream's end are ignored). MQ_INFLATE_OK, or another MQ_INFLATE_*
    with out as it was (*msg: zlib's reason for MQ_INFLATE_BAD)."""
    cdef z_stream zs
    cdef Py_ssize_t start = out.len, produced, want, room
    cdef int r, status = MQ_INFLATE_OK
    memset(&zs, 0, sizeof(z_stream))
    msg[0] = NULL
    if inflateInit(&zs) != Z_OK:
        return MQ_INFLATE_NO_MEMORY
    zs.next_in = <unsigned char *>src
    zs.avail_in = <unsigned int>n  # BODYLEN is an int32
    while True:
        produced = out.len - start
        if produced > limit:
            status = MQ_INFLATE_TOO_BIG
            break
        if out.cap == out.len:
            want = produced if produced > 0 else 4 * n + 64  # double what came so far
            if want > limit + 1 - produced:
                want = limit + 1 - produced
            if mq_buf_room(out, want) < 0:
                status = MQ_INFLATE_NO_MEMORY
                break
        room = out.cap - out.len
        if room > 0x40000000:
            room = 0x40000000
        zs.next_out = <unsigned char *>(out.data + out.len)
        zs.avail_out = <unsigned int>room
        r = inflate(&zs, Z_NO_FLUSH)
        out.len += room - zs.avail_out
        if r == Z_STREAM_END:
            if out.len - start > limit:
                status = MQ_INFLATE_TOO_BIG
            break
        if r == Z_OK:
            continue
        if r == Z_BUF_ERROR and zs.avail_out > 0:  # no progress with room to write: the input ran out
            status = MQ_INFLATE_BAD
            msg[0] = "the stream is cut short"
        elif r == Z_NEED_DICT:
            status = MQ_INFLATE_BAD
            msg[0] = "it needs a preset dictionary"
        elif r == Z_MEM_ERROR:
            status = MQ_INFLATE_NO_MEMORY
        else:
            status = MQ_INFLATE_BAD
            msg[0] = zs.msg
            if msg[0] == NULL:
                msg[0] = "not zlib data"
        break
    inflateEnd(&zs)
    if status != MQ_INFLATE_OK:
        out.len = start
    return status


cdef inline int mq_body_into(MqBuf *out, const char *body, Py_ssize_t n, int32_t sys_flag, object compression,
                             object where) except -1:
    """Append a stored body (body[0:n], its record's sys_flag) to out as the producer sent it:
    copied when not compressed (or empty, as MessageDecoder leaves it), inflated otherwise.
    compression: the module mqstore.compression; where: how its errors name the record (a str,
    or the arguments of compression.record_where, formatted only for an error)."""
    cdef int kind = mq_body_compression(sys_flag), r
    cdef const char *msg = NULL
    cdef bytes got
    if kind == MQ_COMPRESSION_NONE or n == 0:
        if mq_buf_room(out, n) < 0:
            raise MemoryError(f"cannot hold a body of {n} bytes")
        memcpy(out.data + out.len, body, n)
        out.len += n
        return 0
    if kind != MQ_COMPRESSION_ZLIB:
        got = compression.inflate_body(PyBytes_FromStringAndSize(body, n), sys_flag, where)
        if mq_buf_room(out, len(got)) < 0:
            raise MemoryError(f"cannot hold a body of {len(got)} bytes")
        memcpy(out.data + out.len, <const char *>got, len(got))
        out.len += len(got)
        return 0
    cdef Py_ssize_t limit = compression.MAX_INFLATED_BYTES
    with nogil:
        r = mq_inflate_zlib(out, body, n, limit, &msg)
    if r == MQ_INFLATE_NO_MEMORY:
        raise MemoryError(f"out of memory inflating a body of {n} bytes")
    if r == MQ_INFLATE_TOO_BIG:
        raise compression.inflated_too_big("zlib", where, limit)
    if r != MQ_INFLATE_OK:
        raise compression.inflate_failed("zlib", (<bytes>msg).decode("utf-8", "replace"), where)
    return 0


cdef inline bytes mq_body_bytes(const char *body, Py_ssize_t n, int32_t sys_flag, object compression, object where):
    """A stored body as bytes, as the producer sent it (mq_body_into)."""
    cdef MqBuf tmp
    if mq_body_compression(sys_flag) == MQ_COMPRESSION_NONE or n == 0:
        return PyBytes_FromStringAndSize(body, n)
    if mq_body_compression(sys_flag) != MQ_COMPRESSION_ZLIB:
        return compression.inflate_body(PyBytes_FromStringAndSize(body, n), sys_flag, where)
    tmp.data = NULL
    tmp.len = 0
    tmp.cap = 0
    try:
        mq_body_into(&tmp, body, n, sys_flag, compression, where)
        return PyBytes_FromStringAndSize(tmp.data, tmp.len)
    finally:
        free(tmp.data)
