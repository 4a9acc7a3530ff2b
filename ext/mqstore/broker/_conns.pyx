# cython: language_level=3
"""A broker's open client connections, counted in shared memory by all its front processes, so
``max_connections`` and ``max_connections_per_ip`` hold for the broker, not for each front
(docs/security.md "Limits on every connection").

The owner lays the table out in a region every front maps (``mqstore.broker.limits``: a memfd
inherited as the listening socket is). Each front owns one slot array and writes only that;
a front admits a connection when the sums over every front's arrays are under the caps:

    0      header: magic "MQCONNS1", fronts, ip_slots, stride (bytes between two fronts' arrays)
    64     front 0's array: its open connections, then ip_slots counters indexed by
           address_slot(source address), 64-bit each (stride: a multiple of 64 bytes)
    64 + stride * k   front k's array

A front that starts zeroes its array (``reset``): the connections of a front that died (its
sockets closed with it) stop counting as soon as its successor starts. Two addresses of one
slot count together (a refusal comes early for both, never late), and two fronts that admit at
the same moment may both pass the last free place (at most one over per front accepting at that
moment). Only the front's own event loop thread writes its array: plain stores, and whole
64-bit loads in the other fronts.

Twin: ``mqstore.twin.conns`` (tests/test_conns.py checks parity with hypothesis).
"""

from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset

from mq_bytes cimport mq_load_relaxed, mq_store_relaxed

cdef extern from *:
    """
    #define MQ_CONNS_MAGIC 0x31534E4E4F43514DULL  /* "MQCONNS1", little-endian */
    #define MQ_FNV_OFFSET 0xCBF29CE484222325ULL
    #define MQ_FNV_PRIME 0x100000001B3ULL
    """
    uint64_t MAGIC "MQ_CONNS_MAGIC"
    uint64_t FNV_OFFSET "MQ_FNV_OFFSET"
    uint64_t FNV_PRIME "MQ_FNV_PRIME"

DEF HEADER = 64

HEADER_SIZE = HEADER
ADMITTED = 0
OVER_TOTAL = 1
OVER_PER_IP = 2


cdef inline Py_ssize_t _stride(Py_ssize_t ip_slots) noexcept:
    return (8 * (1 + ip_slots) + 63) // 64 * 64


def table_size(Py_ssize_t fronts, Py_ssize_t ip_slots) -> int:
    """Bytes of a table for ``fronts`` front processes with ``ip_slots`` address counters each."""
    if fronts < 1 or ip_slots < 1:
        raise ValueError(f"a connection table needs fronts >= 1 and ip_slots >= 1, not {fronts} and {ip_slots}")
    return HEADER + fronts * _stride(ip_slots)


cdef inline uint64_t _fnv1a(str ip):
    cdef bytes raw = ip.encode("utf-8")
    cdef const unsigned char *p = raw
    cdef Py_ssize_t i
    cdef uint64_t h = FNV_OFFSET
    for i in range(len(raw)):
        h = (h ^ p[i]) * FNV_PRIME
    return h


def address_slot(str ip, Py_ssize_t ip_slots) -> int:
    """The counter a source address counts in: FNV-1a 64 of its UTF-8 text, modulo ip_slots."""
    if ip_slots < 1:
        raise ValueError(f"ip_slots must be >= 1, not {ip_slots}")
    return <Py_ssize_t>(_fnv1a(ip) % <uint64_t>ip_slots)


cdef class ConnectionTable:
    """The table laid out in ``buffer`` (writable, at least ``table_size`` bytes): its fronts'
    connection counts (see the module)."""

    cdef unsigned char[::1] view
    cdef char *base
    cdef readonly Py_ssize_t fronts
    cdef readonly Py_ssize_t ip_slots
    cdef Py_ssize_t stride

    def __init__(self, unsigned char[::1] buffer):
        self.view = buffer
        if buffer.shape[0] < HEADER_SIZE:
            raise ValueError(f"a connection table is at least {HEADER_SIZE} bytes, not {buffer.shape[0]}")
        self.base = <char *>&buffer[0]
        if <uint64_t>(<int64_t *>self.base)[0] != MAGIC:
            raise ValueError("not a connection table (no MQCONNS1 magic): lay it out with ConnectionTable.format")
        self.fronts = (<int64_t *>self.base)[1]
        self.ip_slots = (<int64_t *>self.base)[2]
        self.stride = (<int64_t *>self.base)[3]
        if (self.fronts < 1 or self.ip_slots < 1 or self.stride != _stride(self.ip_slots)
                or buffer.shape[0] < table_size(self.fronts, self.ip_slots)):
            raise ValueError(f"a damaged connection table header (fronts {self.fronts}, ip_slots {self.ip_slots}, "
                             f"stride {self.stride}, {buffer.shape[0]} bytes)")

    @staticmethod
    def format(unsigned char[::1] buffer, Py_ssize_t fronts, Py_ssize_t ip_slots) -> ConnectionTable:
        """Lay out an empty table in buffer (the owner, before any front maps it)."""
        cdef Py_ssize_t size = table_size(fronts, ip_slots)
        if buffer.shape[0] < size:
            raise ValueError(f"a connection table of {fronts} fronts and {ip_slots} slots needs {size} bytes, "
                             f"not {buffer.shape[0]}")
        cdef int64_t *head = <int64_t *>&buffer[0]
        memset(head, 0, size)
        head[1] = fronts
        head[2] = ip_slots
        head[3] = _stride(ip_slots)
        head[0] = <int64_t>MAGIC
        return ConnectionTable(buffer)

    cdef inline int64_t *_array(self, Py_ssize_t front) except NULL:
        if not 0 <= front < self.fronts:
            raise IndexError(f"front {front} of a table of {self.fronts} fronts")
        return <int64_t *>(self.base + HEADER + front * self.stride)

    cdef int64_t _sum(self, Py_ssize_t cell) noexcept:
        cdef int64_t n = 0
        cdef Py_ssize_t k
        for k in range(self.fronts):
            n += mq_load_relaxed(<int64_t *>(self.base + HEADER + k * self.stride) + cell)
        return n

    def reset(self, Py_ssize_t front) -> None:
        """Zero front's array: a front starting (its predecessor's connections died with it)."""
        cdef int64_t *arr = self._array(front)
        cdef Py_ssize_t i
        for i in range(1 + self.ip_slots):
            mq_store_relaxed(&arr[i], 0)

    def admit(self, Py_ssize_t front, str ip, int64_t max_total, int64_t max_per_ip) -> int:
        """Count a connection from ip in front's array if the broker's connections are under
        max_total and those of ip's slot under max_per_ip: ADMITTED; else OVER_TOTAL or
        OVER_PER_IP, and nothing is counted."""
        cdef int64_t *arr = self._array(front)
        cdef Py_ssize_t cell = 1 + <Py_ssize_t>(_fnv1a(ip) % <uint64_t>self.ip_slots)
        if self._sum(0) >= max_total:
            return OVER_TOTAL
        if self._sum(cell) >= max_per_ip:
            return OVER_PER_IP
        mq_store_relaxed(&arr[0], mq_load_relaxed(&arr[0]) + 1)
        mq_store_relaxed(&arr[cell], mq_load_relaxed(&arr[cell]) + 1)
        return ADMITTED

    def release(self, Py_ssize_t front, str ip) -> bool:
        """A connection front admitted from ip closed; False (nothing changes) when front's
        array holds none from ip's slot."""
        cdef int64_t *arr = self._array(front)
        cdef Py_ssize_t cell = 1 + <Py_ssize_t>(_fnv1a(ip) % <uint64_t>self.ip_slots)
        cdef int64_t held = mq_load_relaxed(&arr[cell])
        if held <= 0 or mq_load_relaxed(&arr[0]) <= 0:
            return False
        mq_store_relaxed(&arr[cell], held - 1)
        mq_store_relaxed(&arr[0], mq_load_relaxed(&arr[0]) - 1)
        return True

    def total(self) -> int:
        """The broker's open connections (every front's)."""
        return self._sum(0)

    def held(self, str ip) -> int:
        """The broker's open connections counted in ip's slot."""
        return self._sum(1 + <Py_ssize_t>(_fnv1a(ip) % <uint64_t>self.ip_slots))

    def front_total(self, Py_ssize_t front) -> int:
        """front's open connections."""
        return mq_load_relaxed(self._array(front))
