# cython: language_level=3
# cython: autotestdict=False
"""Time -> queue-offset search over one mapped ConsumeQueue file (spec §3 getOffsetInQueueByTime),
with Kafka's hot/cold ("warm section") split (spec §15, seed 003) and a count of what it touches.

A ConsumeQueue file is a run of 20-byte units ``long commitLogOffset | int msgSize | long
tagsCode`` (big-endian); a unit's time is the STORETIMESTAMP of its CommitLog record, read at
record + 56, or + 68 when the record's SYSFLAG (record + 36) has BORNHOST_V6 (0x10) (spec §1.2).
The search runs in C without the GIL: it reads the CQ and CommitLog mappings through raw
addresses, so the caller must keep every mapping it passes alive for the call (``hold()`` the
MappedFiles, spec §6.1), as RocketMQ's readers do.

Removed units. A unit whose commitLogOffset < min_phy, or whose CommitLog file is out of range
or not mapped (base address 0), or whose fields would lie past its file's end, is *removed*:
older than any time (RocketMQ: ``low = mid + 20``). Removed units are expected to be a prefix
of the range, since the CommitLog is deleted from its head.

QUIRK (decision, deviating from RocketMQ). RocketMQ's binary search returns whichever of several
units with an equal store time it happens to probe first, and a batch shares one store time, so
its answer depends on the file length. We define the result deterministically. Over the units
``low..high`` (byte positions, high = the last unit), key(u) = -inf if removed else its store
time; r = the first unit with key(r) >= ts (the lower bound):

* high < low (empty range) -> low.
* key(r) == ts -> r, the earliest exact match.
* no r -> high (the last unit), or high + 20 when every unit is removed.
* r == low, or the unit before r is removed -> r.
* else l = r - 20 -> l if ts - key(l) <= key(r) - ts (ties go left, as RocketMQ's) else r.

A store time < 0 is compared like any other (RocketMQ returns 0 for it; we do not special-case
it). Differences are taken in unsigned 64-bit arithmetic, so extreme times cannot overflow.

Hot/cold split (spec §15 adapted to 20-byte units and 4 KiB pages). With warm_bytes > 0,
warm_pages = max(1, warm_bytes // 4096); P = the page of the last byte of the last unit
(high + 19) relative to the file start (mappings are page aligned); first_hot = the first unit
at or after page P - warm_pages + 1. If low < first_hot <= high, first_hot is probed: if its key
< ts (strictly, as Kafka), the lower bound is searched in (first_hot, high] only, so a lookup of
a recent time reads at most warm_pages pages of the CQ (the tail, which recent lookups keep in
the page cache); otherwise in [low, first_hot). warm_bytes = 0, or a range that fits in the warm
section, gives a plain binary search over [low, high]. The result is the same either way; only
the pages touched differ.

Counting. Each search reports the distinct CQ pages it read (the pages of bytes [pos, pos + 8) of
each probed unit: only the commitLogOffset is read), the distinct CommitLog pages it read (the
SYSFLAG and STORETIMESTAMP bytes), both by absolute address // 4096, and the number of probes
(units whose key was evaluated). Keys learned while narrowing the range are kept, so the final
left/right comparison probes nothing new. mqstore.twin.search is the pure-Python twin.
"""

from libc.stdint cimport int32_t, int64_t, uint64_t

from mq_bytes cimport mq_get_i32, mq_get_i64

cdef enum:
    CQ_UNIT = 20                # spec §3 CQ_STORE_UNIT_SIZE
    PAGE = 4096
    POS_SYSFLAG = 36            # spec §1.2
    POS_STORETIMESTAMP = 56     # IPv4 born host
    POS_STORETIMESTAMP_V6 = 68  # IPv6 born host (16-byte address)
    BORNHOST_V6_FLAG = 0x10
    # A search probes at most 1 + bit_length(units) <= 65 units; each probe notes <= 2 CQ pages
    # and <= 2 CommitLog pages (the SYSFLAG..STORETIMESTAMP span is < 4 KiB).
    MAX_PAGES = 160

WARM_BYTES_DEFAULT = 8192
CQ_STORE_UNIT_SIZE = CQ_UNIT
OS_PAGE_SIZE = PAGE


cdef struct Search:
    const char *cq
    int64_t ts
    int64_t min_phy
    const int64_t *cl_bases
    int64_t cl_count
    int64_t cl_first_from
    int64_t cl_file_size
    int64_t probes
    int n_cq
    int n_cl
    int64_t cq_pages[MAX_PAGES]
    int64_t cl_pages[MAX_PAGES]


cdef inline void note_page(int64_t *pages, int *n, int64_t page) noexcept nogil:
    cdef int i
    for i in range(n[0]):
        if pages[i] == page:
            return
    if n[0] < MAX_PAGES:
        pages[n[0]] = page
        n[0] += 1


cdef inline void note_bytes(int64_t *pages, int *n, const char *p, int64_t length) noexcept nogil:
    """Note the pages of bytes [p, p + length)."""
    note_page(pages, n, <int64_t>(<size_t>p // PAGE))
    note_page(pages, n, <int64_t>((<size_t>p + length - 1) // PAGE))


cdef bint store_time(Search *s, int64_t phy, int64_t *out) noexcept nogil:
    """The STORETIMESTAMP of the record at CommitLog offset phy into out; False if removed."""
    if phy < s.min_phy or phy < s.cl_first_from:
        return False
    cdef int64_t k = (phy - s.cl_first_from) // s.cl_file_size
    if k >= s.cl_count or s.cl_bases[k] == 0:
        return False
    cdef int64_t file_pos = phy - s.cl_first_from - k * s.cl_file_size
    if file_pos + POS_SYSFLAG + 4 > s.cl_file_size:
        return False
    cdef const char *rec = <const char *><size_t>s.cl_bases[k] + file_pos
    note_bytes(s.cl_pages, &s.n_cl, rec + POS_SYSFLAG, 4)
    cdef int32_t sys_flag = mq_get_i32(rec + POS_SYSFLAG)
    cdef int64_t at = POS_STORETIMESTAMP_V6 if sys_flag & BORNHOST_V6_FLAG else POS_STORETIMESTAMP
    if file_pos + at + 8 > s.cl_file_size:
        return False
    note_bytes(s.cl_pages, &s.n_cl, rec + at, 8)
    out[0] = mq_get_i64(rec + at)
    return True


cdef inline bint probe(Search *s, int64_t pos, int64_t *key) noexcept nogil:
    """Evaluate the unit at byte position pos: True and its store time in key, False if removed."""
    s.probes += 1
    note_bytes(s.cq_pages, &s.n_cq, s.cq + pos, 8)
    return store_time(s, mq_get_i64(s.cq + pos), key)


cdef int64_t search(Search *s, int64_t low, int64_t high, int64_t warm_bytes) noexcept nogil:
    if high < low:
        return low
    # Invariant: the lower bound r lies in [lo, hi]; every unit before lo has key < ts and, when
    # hi <= high, key(hi) >= ts. lo_* remember the key of lo - 20 and hi_* that of hi once probed.
    cdef int64_t lo = low, hi = high + CQ_UNIT, mid, key = 0
    cdef int64_t lo_key = 0, hi_key = 0
    cdef bint lo_live = False, live
    cdef int64_t warm_pages, boundary, first_hot
    if warm_bytes > 0:
        warm_pages = warm_bytes // PAGE if warm_bytes >= PAGE else 1
        boundary = ((high + CQ_UNIT - 1) // PAGE - warm_pages + 1) * PAGE
        if boundary > low:
            first_hot = (boundary + CQ_UNIT - 1) // CQ_UNIT * CQ_UNIT
            if first_hot <= high:
                live = probe(s, first_hot, &key)
                if not live or key < s.ts:
                    lo, lo_live, lo_key = first_hot + CQ_UNIT, live, key
                else:
                    hi, hi_key = first_hot, key
    while lo < hi:
        mid = lo + (hi - lo) // CQ_UNIT // 2 * CQ_UNIT
        live = probe(s, mid, &key)
        if not live or key < s.ts:
            lo, lo_live, lo_key = mid + CQ_UNIT, live, key
        else:
            hi, hi_key = mid, key
    if lo > high:
        # no unit is >= ts; lo > low, so the last unit was probed and lo_live is its state
        return high if lo_live else high + CQ_UNIT
    if hi_key == s.ts or lo == low or not lo_live:
        return lo
    if <uint64_t>s.ts - <uint64_t>lo_key <= <uint64_t>hi_key - <uint64_t>s.ts:
        return lo - CQ_UNIT
    return lo


cdef int init_search(Search *s, int64_t min_phy, const int64_t[::1] cl_bases, int64_t cl_first_from,
                     int64_t cl_file_size) except -1:
    if cl_file_size <= 0:
        raise ValueError(f"cl_file_size must be > 0, got {cl_file_size}")
    s.min_phy = min_phy
    s.cl_count = cl_bases.shape[0]
    s.cl_bases = &cl_bases[0] if s.cl_count > 0 else NULL
    s.cl_first_from = cl_first_from
    s.cl_file_size = cl_file_size
    s.probes = 0
    s.n_cq = 0
    s.n_cl = 0
    return 0


def offset_by_time(size_t cq_address, int64_t low, int64_t high, int64_t ts, int64_t min_phy,
                   const int64_t[::1] cl_bases, int64_t cl_first_from, int64_t cl_file_size,
                   int warm_bytes=WARM_BYTES_DEFAULT):
    """The unit position in [low, high] (byte positions in the CQ file mapped at cq_address)
    whose store time is nearest ts, by the module's rules; (position, cq_pages, cl_pages, probes).

    cl_bases[k] is the base address of CommitLog file k (starting at cl_first_from +
    k * cl_file_size), 0 if not mapped. Every mapping must stay alive during the call.
    Raises ValueError for a position that is negative or not a multiple of 20, a null CQ
    address, cl_file_size <= 0 or warm_bytes < 0.
    """
    if cq_address == 0:
        raise ValueError("cq_address is NULL")
    if low < 0 or low % CQ_UNIT or high % CQ_UNIT:
        raise ValueError(f"low ({low}) and high ({high}) must be unit positions (multiples of 20, low >= 0)")
    if warm_bytes < 0:
        raise ValueError(f"warm_bytes must be >= 0, got {warm_bytes}")
    cdef Search s
    init_search(&s, min_phy, cl_bases, cl_first_from, cl_file_size)
    s.cq = <const char *>cq_address
    s.ts = ts
    cdef int64_t pos
    with nogil:
        pos = search(&s, low, high, warm_bytes)
    return pos, s.n_cq, s.n_cl, s.probes


def store_time_at(int64_t phy_offset, const int64_t[::1] cl_bases, int64_t cl_first_from,
                  int64_t cl_file_size, int64_t min_phy=0):
    """The STORETIMESTAMP of the CommitLog record at phy_offset as the search reads it, or None
    when that unit would count as removed (before min_phy, file not mapped or out of range)."""
    cdef Search s
    init_search(&s, min_phy, cl_bases, cl_first_from, cl_file_size)
    cdef int64_t t = 0
    cdef bint live
    with nogil:
        live = store_time(&s, phy_offset, &t)
    return t if live else None
