# cython: language_level=3
"""RocketMQ's replication wire format (docs/rocketmq-remoting-spec.md §4.3; HAConnection,
HAService.HAClient): raw TCP, no remoting frames, every number big-endian.

    slave -> master   8 bytes: the slave's CommitLog end (int64), its "max offset"
    master -> slave   12-byte header: int64 phyOffset (where the bytes start in the log),
                      int32 bodySize; then bodySize bytes of the master's CommitLog
                      (bodySize 0: a heartbeat, phyOffset the next byte the master will send)

``header`` / ``report`` encode; ``last_report`` reads the reports as the master's
ReadSocketService does (the last whole 8-byte value of what arrived); ``SlaveReader`` is the
slave's read side: one buffer (HAClient's 4 MiB), received into in place, frames handed out as
views of it (the bytes go from the socket to the mapped CommitLog with one copy, never through
a Python object per record).

Twin: mqstore/twin/ha.py (hypothesis parity in tests/test_ha_wire.py).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memmove

HEADER_SIZE = 12
REPORT_SIZE = 8
#: HAClient's read buffer (READ_MAX_BUFFER_SIZE): a frame must fit it with its header
READ_BUFFER_SIZE = 4 * 1024 * 1024


cdef inline void _put_be64(char *p, int64_t v) noexcept:
    cdef uint64_t u = <uint64_t>v
    cdef int i
    for i in range(8):
        p[i] = <char>(u >> (56 - 8 * i))


cdef inline int64_t _get_be64(const unsigned char *p) noexcept:
    cdef uint64_t u = 0
    cdef int i
    for i in range(8):
        u = (u << 8) | p[i]
    return <int64_t>u


cdef inline int32_t _get_be32(const unsigned char *p) noexcept:
    return <int32_t>((<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3])


def header(int64_t phy_offset, int32_t size) -> bytes:
    """The master's 12-byte frame header: the chunk's CommitLog offset and its size."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 12)
    cdef char *p = PyBytes_AS_STRING(out)
    _put_be64(p, phy_offset)
    p[8] = <char>(size >> 24)
    p[9] = <char>(size >> 16)
    p[10] = <char>(size >> 8)
    p[11] = <char>size
    return out


def report(int64_t offset) -> bytes:
    """The slave's 8-byte report: its CommitLog end."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 8)
    _put_be64(PyBytes_AS_STRING(out), offset)
    return out


def last_report(buf, Py_ssize_t start, Py_ssize_t end) -> tuple:
    """(value, consumed) of the reports in buf[start:end]: the last whole 8-byte value counted
    from start (ReadSocketService reads only that one) and where the whole values end; (-1,
    start) when fewer than 8 bytes are there."""
    cdef const unsigned char[::1] v = memoryview(buf).cast("B")
    if start < 0 or end > v.shape[0] or start > end:
        raise ValueError(f"[{start}, {end}) is not inside the {v.shape[0]}-byte buffer")
    cdef Py_ssize_t whole = (end - start) // 8 * 8
    if whole == 0:
        return -1, start
    return _get_be64(&v[start + whole - 8]), start + whole


cdef class SlaveReader:
    """The slave's receive buffer (HAClient's byteBufferRead): ``recv_into(sock)`` reads into
    it, ``next()`` hands out the next whole frame as (phy_offset, body view), None when the
    rest has not arrived. A body view is valid until the next ``recv_into``, which moves the
    unread bytes to the buffer's start when they run near its end. ValueError for a frame
    that can never fit the buffer (a negative or too large bodySize)."""

    cdef bytearray buf
    cdef Py_ssize_t start, end, capacity

    def __init__(self, Py_ssize_t capacity=READ_BUFFER_SIZE):
        if capacity < 64:
            raise ValueError(f"a read buffer of {capacity} bytes is too small")
        self.capacity = capacity
        self.buf = bytearray(capacity)
        self.start = 0
        self.end = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not handed out yet."""
        return self.end - self.start

    def recv_into(self, sock) -> int:
        """One recv into the free part of the buffer; its byte count (0: the peer closed)."""
        cdef char *b = self.buf
        if self.start > 0 and (self.end == self.capacity or self.capacity - self.end < 12):
            memmove(b, b + self.start, self.end - self.start)
            self.end -= self.start
            self.start = 0
        elif self.start == self.end:
            self.start = self.end = 0
        if self.end == self.capacity:
            raise ValueError("the read buffer is full of one unfinished frame")
        cdef Py_ssize_t n = sock.recv_into(memoryview(self.buf)[self.end:])
        self.end += n
        return n

    def feed(self, data) -> None:
        """Append bytes as if received (tests, and the twin parity)."""
        cdef const unsigned char[::1] v = memoryview(data).cast("B")
        cdef Py_ssize_t n = v.shape[0]
        cdef char *b = self.buf
        if self.capacity - self.end < n:
            memmove(b, b + self.start, self.end - self.start)
            self.end -= self.start
            self.start = 0
        if self.capacity - self.end < n:
            raise ValueError("the read buffer is full of one unfinished frame")
        self.buf[self.end:self.end + n] = data
        self.end += n

    def next(self):
        """(phy_offset, body) of the next whole frame, body a memoryview into the buffer; None
        when its bytes have not all arrived."""
        cdef Py_ssize_t avail = self.end - self.start
        if avail < 12:
            return None
        cdef const unsigned char *p = <const unsigned char *>PyByteArray_AS_STRING(self.buf) + self.start
        cdef int64_t phy = _get_be64(p)
        cdef int32_t size = _get_be32(p + 8)
        if size < 0 or size > self.capacity - 12:
            raise ValueError(f"a frame of {size} bytes at CommitLog offset {phy}: it cannot fit the "
                             f"{self.capacity}-byte read buffer")
        if avail < 12 + size:
            return None
        cdef Py_ssize_t body_at = self.start + 12
        self.start = body_at + size
        return phy, memoryview(self.buf)[body_at:body_at + size]

