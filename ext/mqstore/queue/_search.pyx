# cython: language_level=3
# cython: autotestdict=False
"""Time -> queue-offset search over one mapped ConsumeQueue file (spec §3 getOffsetInQueueByTime),
with Kafka's hot/cold ("warm section") split (spec §15) and a count of what it touches.

A ConsumeQueue file is a run of 20-byte units ``long commitLogOffset | int msgSize | long
tagsCode`` (big-endian); a unit's time is the STORETIMESTAMP of its CommitLog record, read at
record + 56, or + 68 when the record's SYSFLAG (record + 36) has BORNHOST_V6 (0x10) (spec §1.2).
The search runs in C without the GIL over the CQ file's MappedFile and the CommitLog's LogMap
(mqstore.queue._reads), which keep their mappings alive for the call.

Removed units. A unit whose commitLogOffset < min_phy, or whose CommitLog file is out of range
or not mapped in the LogMap, or whose fields would lie past its file's end, is *removed*:
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

Body CRC on read. ``first_corrupt`` checks every record of a getMessage result (the structure
checks of spec §5.3, then BODYCRC against the CRC of the body) in one call; ``record_status``
checks one record, ``crc32`` is zlib's CRC-32, folded with PCLMULQDQ where the CPU has it
(``CRC_FOLDED``). mqstore.twin.reads is their pure-Python twin.
"""

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from mq_bytes cimport mq_crc32_init, mq_get_i32, mq_get_i64
from mq_check cimport (REC_CRC_MISMATCH, REC_MALFORMED, REC_OK, c_record_status, mq_crc32_fast, mq_crc_fold_detect,
                      mq_crc_fold_ok)

from mqstore.log._mapped cimport MappedFile
from mqstore.queue._reads cimport LogMap

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
    char **cl_bases             # LogMap.bases: file k's mapping or NULL
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
    if k >= s.cl_count or s.cl_bases[k] == NULL:
        return False
    cdef int64_t file_pos = phy - s.cl_first_from - k * s.cl_file_size
    if file_pos + POS_SYSFLAG + 4 > s.cl_file_size:
        return False
    cdef const char *rec = s.cl_bases[k] + file_pos
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


cdef int init_search(Search *s, int64_t min_phy, LogMap log) except -1:
    s.min_phy = min_phy
    s.cl_count = log.n
    s.cl_bases = log.bases
    s.cl_first_from = log.first_from
    s.cl_file_size = log.file_size
    s.probes = 0
    s.n_cq = 0
    s.n_cl = 0
    return 0


def offset_by_time(MappedFile cq not None, int64_t low, int64_t high, int64_t ts, int64_t min_phy,
                   LogMap log not None, int warm_bytes=WARM_BYTES_DEFAULT):
    """The unit position in [low, high] (byte positions in the ConsumeQueue file cq) whose
    store time is nearest ts, by the module's rules; (position, cq_pages, cl_pages, probes).

    log holds the CommitLog files the units point into. Raises ValueError for a position that
    is negative, not a multiple of 20 or whose unit lies past the file, an unmapped file, or
    warm_bytes < 0.
    """
    if low < 0 or low % CQ_UNIT or high % CQ_UNIT:
        raise ValueError(f"low ({low}) and high ({high}) must be unit positions (multiples of 20, low >= 0)")
    if high >= low and high + CQ_UNIT > cq.file_size:
        raise ValueError(f"high ({high}) is past the end of the {cq.file_size}-byte ConsumeQueue file")
    if warm_bytes < 0:
        raise ValueError(f"warm_bytes must be >= 0, got {warm_bytes}")
    cdef Search s
    init_search(&s, min_phy, log)
    s.cq = cq._b()
    s.ts = ts
    cdef int64_t pos
    with nogil:
        pos = search(&s, low, high, warm_bytes)
    return pos, s.n_cq, s.n_cl, s.probes


def store_time_at(int64_t phy_offset, LogMap log not None, int64_t min_phy=0):
    """The STORETIMESTAMP of the CommitLog record at phy_offset as the search reads it, or None
    when that unit would count as removed (before min_phy, file not mapped or out of range)."""
    cdef Search s
    init_search(&s, min_phy, log)
    cdef int64_t t = 0
    cdef bint live
    with nogil:
        live = store_time(&s, phy_offset, &t)
    return t if live else None


# -- body CRC on read -----------------------------------------------------------
#
# A read that returns a record can check its BODYCRC (spec §1.5: UtilAll.crc32 of the body, masked
# to 31 bits, as recovery checks it, spec §5.3) where the check costs least: here, in one C call
# over every record a getMessage result holds, before the caller touches them. The CRC is the
# zlib / IEEE one; on x86-64 CPUs with PCLMULQDQ and SSE4.1 (checked at run time with CPUID) the
# 16-byte multiples are folded with carry-less multiplies (Gopal et al., "Fast CRC Computation for
# Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009; the shape of zlib/Chromium's
# crc32_sse42_simd_; ext/include/mq_crc_fold.h), the rest by mq_crc32.h's slicing-by-8, which is also
# the whole path on other CPUs. mqstore.twin.reads is the pure-Python twin (zlib.crc32 and the spec §5.3 checks).

mq_crc32_init()
mq_crc_fold_detect()

#: True when crc32 and the record checks fold with PCLMULQDQ (this CPU has it and SSE4.1)
CRC_FOLDED = bool(mq_crc_fold_ok)

#: what record_status and first_corrupt say of a record
RECORD_OK = REC_OK
RECORD_CRC_MISMATCH = REC_CRC_MISMATCH
RECORD_MALFORMED = REC_MALFORMED


def crc32(data, uint32_t value=0, *, bint fold=True) -> int:
    """zlib.crc32(data, value), unmasked (RocketMQ's body CRC is this & 0x7FFFFFFF); fold=False
    takes the portable slicing-by-8 path even where PCLMULQDQ folding is available."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    if view.shape[0] == 0:
        return value
    return mq_crc32_fast(value, &view[0], view.shape[0], fold)


def record_status(data) -> int:
    """RECORD_OK, RECORD_CRC_MISMATCH or RECORD_MALFORMED for the record at the start of data
    (a buffer that holds the record and may extend past it)."""
    cdef const unsigned char[::1] view = memoryview(data).cast("B")
    if view.shape[0] == 0:
        return REC_MALFORMED
    return c_record_status(<const char *>&view[0], view.shape[0])


def first_corrupt(list phys not None, LogMap log not None):
    """(index, status) of the first record of phys (CommitLog offsets) that is not RECORD_OK,
    or (-1, RECORD_OK) when every record checks: getMessage's result in one call.

    log holds the CommitLog files. A record whose file is not mapped there (deleted since the
    read) is skipped: there is nothing to check. A record is checked within its file (it may
    not run past the file's end)."""
    cdef Py_ssize_t i, n = len(phys)
    cdef int64_t avail = 0
    cdef const char *p
    cdef int status = REC_OK
    for i in range(n):
        p = log.rest_at(phys[i], &avail)
        if p == NULL:
            continue
        status = c_record_status(p, avail)
        if status != REC_OK:
            return i, status
    return -1, REC_OK
