# cython: language_level=3
"""The segment object format (tiered-storage spec §5.2): build a ``.mqseg`` object from the bytes
of one closed CommitLog file, and parse and search one.

Building: one walk over the file's records (``mqstore.log._codec``'s parse_record) lists every
record; each gets a ConsumeQueue unit by the dispatch kernel's rule (transaction type NOT or
COMMIT, a queue that can exist, and ``ConsumeQueueKernel.put_unit``'s acceptance: not below the
queue's end, not more than MAX_GAP_UNITS past it); a stable counting sort by directory rank
regroups them (a queue's accepted records are in queue-offset order already, since each is past
the one before); the footer is written in one pass; the data section is produced on demand by
``read_into`` from the file itself, so the object is never held whole, and its CRC-32 is computed
as it is emitted in order.

Twin: mqstore.twin.segment. Shared types and constants: mqstore.segformat.
"""

cimport cython

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy

from mq_bytes cimport mq_get_i32, mq_get_i64, mq_put_i32, mq_put_i64
from mq_record cimport (MQ_TRANSACTION_PREPARED_TYPE, MQ_TRANSACTION_ROLLBACK_TYPE, MQ_TRANSACTION_TYPE_MASK,
                        mq_record_length)
from mqstore.log._codec cimport R_BLANK, R_OK, Rec, parse_record, record_problem
from mqstore.queue._consumequeue cimport CQ_UNIT, MAX_GAP_UNITS

from mqstore.errors import CorruptRecordError, CorruptSegmentError
from mqstore.queue.consume_queue import queue_problem
from mqstore import segformat as _fmt
from mqstore.segformat import Footer, GroupEntry, IndexHeader, TimeSample, Trailer

# the format's sizes as C values (segformat holds them for Python)
cdef int64_t TRAILER = _fmt.TRAILER_SIZE, SAMPLE = _fmt.SAMPLE_SIZE, PHY_ENTRY = _fmt.PHY_ENTRY_SIZE
cdef int64_t EVERY = _fmt.SAMPLE_EVERY, FENCE = _fmt.FENCE_EVERY, DIR_FIXED = _fmt.DIR_FIXED_SIZE
cdef int64_t MAX_DATA = _fmt.MAX_DATA_BYTES
cdef int32_t FORMAT_VERSION = _fmt.VERSION
cdef bytes MAGIC_B = _fmt.MAGIC
cdef bytes IDX_MAGIC_B = _fmt.INDEX_MAGIC
cdef int32_t IDX_VERSION = _fmt.INDEX_VERSION
cdef int64_t IDX_HEADER = _fmt.INDEX_HEADER_SIZE, IDX_SLOT = _fmt.INDEX_SLOT_SIZE, IDX_ENTRY = _fmt.INDEX_ENTRY_SIZE
cdef int64_t IDX_RUN_CAP = _fmt.INDEX_RUN_CAP, LOCAL_HEADER = _fmt.LOCAL_INDEX_HEADER_SIZE
cdef int64_t LOCAL_SLOT = _fmt.LOCAL_SLOT_SIZE, LOCAL_ENTRY = _fmt.LOCAL_ENTRY_SIZE

cdef enum:
    FIRST_SLOTS = 64


cdef struct Item:            # one record of the file
    int64_t queue_offset
    int64_t store_ts
    int64_t file_pos
    int64_t data_pos         # its position in the data section
    int32_t size
    int32_t group            # its topic-queue, in first-seen order
    int32_t unit             # 1: a ConsumeQueue unit (after the rule; before it: transaction type allows one)


cdef struct Grp:             # one topic-queue named by the file's records
    uint64_t hash
    int64_t topic_at         # file position of its topic bytes (in its first record)
    int64_t end              # the queue's end before the next record (-1: not known yet)
    int32_t topic_len
    int32_t queue_id
    int32_t valid            # the queue can exist (queue_problem is None)
    int32_t rank             # directory position (-1: no record of it has a unit)


cdef inline uint64_t group_hash(const char *p, int n, int32_t qid) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef int i
    for i in range(n):
        h = (h ^ <unsigned char>p[i]) * 1099511628211ULL
    h = (h ^ <uint32_t>qid) * 1099511628211ULL
    return h ^ (h >> 29)


cdef extern from "zlib.h" nogil:
    unsigned long z_crc32 "crc32"(unsigned long crc, const unsigned char *buf, unsigned int n)


cdef inline uint32_t crc_update(uint32_t crc, const char *p, int64_t n) noexcept nogil:
    """CRC-32 (zlib's own, as zlib.crc32) continued over n bytes."""
    cdef unsigned int step
    while n > 0:
        step = <unsigned int>(n if n < (1 << 30) else (1 << 30))
        crc = <uint32_t>z_crc32(crc, <const unsigned char *>p, step)
        p += step
        n -= step
    return crc


cdef inline uint32_t crc_of(const char *p, Py_ssize_t n) noexcept nogil:
    return crc_update(0, p, n)


def _u32(value, str what):
    if value < 0 or value > MAX_DATA:
        raise ValueError(f"{what} {value} does not fit the segment's 4-byte field")


@cython.final
cdef class SegmentBuilder:
    """The ``.mqseg`` object of one closed CommitLog file (spec §5.2), streamed.

    buf: the file's bytes (a MappedFile or any buffer); file_start: its start (encoded physical
    offset); log_id: its CommitLog; valid_len: where its END_OF_FILE blank is (the bytes of
    records). queue_ends: optional {(topic, queue_id): the queue's next offset before this file},
    so a record past it by more than MAX_GAP_UNITS, or below it, goes to the no-queue group as
    dispatch left it; without it a queue's first record in the file is taken as its start.
    check_crc: verify every body's CRC while listing (CorruptRecordError naming the record).

    ``read_into(offset, out)`` fills a writable buffer from the object; ``parts(n)`` yields it in
    n-byte bytes objects. The data CRC is computed as the data is read in order; ``data_crc`` and
    ``trailer`` finish it from the file when the reads were not in order.
    """

    cdef object view                    # the file's bytes (keeps its mapping alive)
    cdef const char *base
    cdef Item *items                    # in physical order
    cdef int64_t *order                 # record numbers in object order
    cdef Grp *groups
    cdef int32_t *slots
    cdef int64_t n_items, items_cap, n_groups, groups_cap, slots_cap
    cdef uint32_t crc
    cdef int64_t crc_pos
    cdef readonly int64_t file_start
    cdef readonly int32_t log_id
    cdef readonly int64_t valid_len
    cdef readonly int64_t data_len
    cdef readonly int64_t footer_len
    cdef readonly int64_t size
    cdef readonly uint32_t footer_crc
    cdef readonly int64_t first_store_timestamp
    cdef readonly int64_t last_store_timestamp
    cdef readonly bytes footer
    cdef readonly list directory
    cdef list _starts                   # between _decide and _emit_footer: first order[] index per rank
    cdef list _keys                     # (topic, queue id, group) in directory order

    def __cinit__(self):
        self.items = NULL
        self.order = NULL
        self.groups = NULL
        self.slots = NULL

    def __dealloc__(self):
        free(self.items)
        free(self.order)
        free(self.groups)
        free(self.slots)

    def __init__(self, buf, int64_t file_start, int log_id, int64_t valid_len, *, queue_ends=None,
                 bint check_crc=False):
        cdef const unsigned char[::1] v = memoryview(buf).cast("B")
        if file_start < 0 or log_id < 0:
            raise ValueError(f"file_start ({file_start}) and log_id ({log_id}) must be >= 0")
        if valid_len < 0 or valid_len > v.shape[0]:
            raise ValueError(f"valid_len {valid_len} is outside the file's {v.shape[0]} bytes")
        _u32(valid_len, "valid_len")
        self.view = v
        self.base = <const char *>&v[0] if v.shape[0] else NULL
        self.file_start = file_start
        self.log_id = log_id
        self.valid_len = valid_len
        self.data_len = valid_len
        self._list(check_crc)
        self._decide(queue_ends)
        self._emit_footer()
        self.size = self.data_len + self.footer_len + TRAILER
        self.crc = 0
        self.crc_pos = 0

    @property
    def record_count(self) -> int:
        return self.n_items

    cdef int _list(self, bint check_crc) except -1:
        """Walk the records of [0, valid_len): the listing and the topic-queues."""
        cdef Rec r
        cdef int code
        cdef int64_t pos = 0
        cdef int tx
        cdef Item *it
        cdef void *bigger
        self.first_store_timestamp = 0
        self.last_store_timestamp = 0
        while pos < self.valid_len:
            code = parse_record(self.base, self.valid_len, pos, &r, check_crc, True)
            if code == R_BLANK:
                raise CorruptRecordError(f"CommitLog file {self.file_start}: END_OF_FILE blank at file position {pos}, "
                                         f"before the valid length {self.valid_len}")
            if code != R_OK:
                raise CorruptRecordError(f"CommitLog file {self.file_start}: "
                                         + record_problem(code, &r, pos, self.valid_len))
            if r.total != mq_record_length(max(r.body_len, 0), r.topic_len, max(r.props_len, 0), r.sys_flag, r.v2):
                raise CorruptRecordError(f"CommitLog file {self.file_start}: record at file position {pos}: TOTALSIZE "
                                         f"{r.total} does not match its fields")
            if pos + r.total > self.valid_len:
                raise CorruptRecordError(f"CommitLog file {self.file_start}: record at file position {pos} of "
                                         f"{r.total} bytes runs past the valid length {self.valid_len}")
            if r.physical_offset != self.file_start + pos:
                raise CorruptRecordError(f"CommitLog file {self.file_start}: record at file position {pos} says "
                                         f"PHYSICALOFFSET {r.physical_offset}, expected {self.file_start + pos}")
            if self.n_items == self.items_cap:
                self.items_cap = self.items_cap * 2 if self.items_cap else 1024
                bigger = realloc(self.items, self.items_cap * sizeof(Item))
                if bigger == NULL:
                    raise MemoryError()
                self.items = <Item *>bigger
            it = &self.items[self.n_items]
            it.queue_offset = r.queue_offset
            it.store_ts = r.store_timestamp
            it.file_pos = pos
            it.data_pos = 0
            it.size = r.total
            tx = r.sys_flag & MQ_TRANSACTION_TYPE_MASK
            it.unit = tx != MQ_TRANSACTION_PREPARED_TYPE and tx != MQ_TRANSACTION_ROLLBACK_TYPE
            it.group = self._group_of(r.topic_pos, r.topic_len, r.queue_id)
            if self.n_items == 0 or r.store_timestamp < self.first_store_timestamp:
                self.first_store_timestamp = r.store_timestamp
            if self.n_items == 0 or r.store_timestamp > self.last_store_timestamp:
                self.last_store_timestamp = r.store_timestamp
            self.n_items += 1
            pos += r.total
        return 0

    cdef int32_t _group_of(self, int64_t topic_at, int topic_len, int32_t qid) except -1:
        cdef uint64_t h = group_hash(self.base + topic_at, topic_len, qid)
        cdef int64_t at
        cdef Grp *g
        cdef void *bigger
        if (self.n_groups + 1) * 2 > self.slots_cap:
            self._rehash(self.slots_cap * 2 if self.slots_cap else FIRST_SLOTS)
        at = <int64_t>(h & <uint64_t>(self.slots_cap - 1))
        while self.slots[at] >= 0:
            g = &self.groups[self.slots[at]]
            if g.hash == h and g.queue_id == qid and g.topic_len == topic_len and \
                    memcmp(self.base + g.topic_at, self.base + topic_at, topic_len) == 0:
                return self.slots[at]
            at = (at + 1) & (self.slots_cap - 1)
        if self.n_groups == self.groups_cap:
            self.groups_cap = self.groups_cap * 2 if self.groups_cap else FIRST_SLOTS
            bigger = realloc(self.groups, self.groups_cap * sizeof(Grp))
            if bigger == NULL:
                raise MemoryError()
            self.groups = <Grp *>bigger
        g = &self.groups[self.n_groups]
        g.hash = h
        g.topic_at = topic_at
        g.topic_len = topic_len
        g.queue_id = qid
        g.end = -1
        g.valid = 0
        g.rank = -1
        self.slots[at] = <int32_t>self.n_groups
        self.n_groups += 1
        return <int32_t>(self.n_groups - 1)

    cdef int _rehash(self, int64_t cap) except -1:
        cdef int32_t *slots = <int32_t *>malloc(cap * sizeof(int32_t))
        cdef int64_t i, at
        if slots == NULL:
            raise MemoryError()
        for i in range(cap):
            slots[i] = -1
        for i in range(self.n_groups):
            at = <int64_t>(self.groups[i].hash & <uint64_t>(cap - 1))
            while slots[at] >= 0:
                at = (at + 1) & (cap - 1)
            slots[at] = <int32_t>i
        free(self.slots)
        self.slots = slots
        self.slots_cap = cap
        return 0

    cdef bytes _topic(self, int64_t g):
        return PyBytes_FromStringAndSize(self.base + self.groups[g].topic_at, self.groups[g].topic_len)

    cdef int _decide(self, queue_ends) except -1:
        """Which records have a unit (dispatch's rule), the directory order, and object order."""
        cdef int64_t g, i, q, k, n_dir, rank
        cdef Grp *gr
        cdef Item *it
        for g in range(self.n_groups):
            gr = &self.groups[g]
            topic = self._topic(g)
            try:
                name = topic.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if gr.topic_len == 0 or queue_problem(name, gr.queue_id) is not None:
                continue
            if gr.topic_len > 255:
                raise ValueError(f"topic {name!r} is {gr.topic_len} bytes: a segment directory entry holds at most 255")
            gr.valid = 1
            if queue_ends is not None:
                end = queue_ends.get((name, gr.queue_id))
                if end is not None:
                    gr.end = max(0, end)
        # ConsumeQueueKernel.put_unit's acceptance, in physical (dispatch) order
        cdef int64_t *counts = <int64_t *>calloc(self.n_groups + 1, sizeof(int64_t))
        if counts == NULL:
            raise MemoryError()
        try:
            for i in range(self.n_items):
                it = &self.items[i]
                gr = &self.groups[it.group]
                if it.unit and gr.valid:
                    q = it.queue_offset
                    if q < 0 or q > INT64_MAX // CQ_UNIT or \
                            (gr.end >= 0 and (q < gr.end or q - gr.end > MAX_GAP_UNITS)):
                        it.unit = 0
                    else:
                        gr.end = q + 1
                        counts[it.group] += 1
                else:
                    it.unit = 0
            keys = sorted((self._topic(g), self.groups[g].queue_id, g) for g in range(self.n_groups) if counts[g])
            n_dir = len(keys)
            for rank, key in enumerate(keys):
                self.groups[key[2]].rank = <int32_t>rank
            # stable counting sort by rank (no-queue group = n_dir): starts of each rank in order[]
            starts = [0] * (n_dir + 2)
            for key in keys:
                starts[self.groups[key[2]].rank + 1] = counts[key[2]]
            starts[n_dir + 1] = 0
            for i in range(self.n_items):
                if not self.items[i].unit:
                    starts[n_dir + 1] += 1
            for rank in range(1, n_dir + 2):
                starts[rank] += starts[rank - 1]
        finally:
            free(counts)
        cdef int64_t *next_at = <int64_t *>malloc((n_dir + 1) * sizeof(int64_t))
        if next_at == NULL:
            raise MemoryError()
        for rank in range(n_dir + 1):
            next_at[rank] = starts[rank]
        self.order = <int64_t *>malloc((self.n_items if self.n_items else 1) * sizeof(int64_t))
        if self.order == NULL:
            free(next_at)
            raise MemoryError()
        for i in range(self.n_items):
            it = &self.items[i]
            rank = self.groups[it.group].rank if it.unit else n_dir
            self.order[next_at[rank]] = i
            next_at[rank] += 1
        free(next_at)
        cdef int64_t pos = 0
        for k in range(self.n_items):
            it = &self.items[self.order[k]]
            it.data_pos = pos
            pos += it.size
        self._starts = starts
        self._keys = keys
        return 0

    cdef int _emit_footer(self) except -1:
        cdef int64_t n_dir = len(self._keys), rank, a, b, j, k, n, i
        cdef list starts = self._starts
        cdef list samples = []      # (record numbers in order[]) per group
        cdef list entries = []
        cdef int64_t n_samples = 0, dir_bytes = 0
        cdef Item *it
        cdef Item *first
        cdef int64_t lo_ts, hi_ts
        for rank in range(n_dir + 1):
            a = starts[rank]
            b = starts[rank + 1]
            if a == b:
                continue
            topic = self._keys[rank][0] if rank < n_dir else b""
            qid = self.groups[self._keys[rank][2]].queue_id if rank < n_dir else 0
            first = &self.items[self.order[a]]
            lo_ts = first.store_ts
            hi_ts = first.store_ts
            for j in range(a, b):
                it = &self.items[self.order[j]]
                if it.store_ts < lo_ts:
                    lo_ts = it.store_ts
                if it.store_ts > hi_ts:
                    hi_ts = it.store_ts
            picks = []
            if rank < n_dir:
                picks = list(range(a, b, EVERY))
                if picks[len(picks) - 1] != b - 1:
                    picks.append(b - 1)
            last = &self.items[self.order[b - 1]]
            entries.append(GroupEntry(topic, qid, first.queue_offset if rank < n_dir else 0, b - a, first.data_pos,
                                      last.data_pos + last.size - first.data_pos, lo_ts, hi_ts, n_samples, len(picks)))
            samples.extend(picks)
            n_samples += len(picks)
            dir_bytes += DIR_FIXED + len(topic)
        n = self.n_items
        cdef int64_t n_fences = (n + FENCE - 1) // FENCE
        self.footer_len = dir_bytes + n_samples * SAMPLE + n_fences * 4 + n * PHY_ENTRY
        _u32(self.footer_len, "footer length")
        cdef bytes out = PyBytes_FromStringAndSize(NULL, self.footer_len)
        cdef char *p = PyBytes_AS_STRING(out)
        for e in entries:
            p[0] = <char>len(e.topic)
            p += 1
            memcpy(p, <const char *>e.topic, len(e.topic))
            p += len(e.topic)
            mq_put_i32(p, e.queue_id); p += 4
            mq_put_i64(p, e.first_queue_offset); p += 8
            mq_put_i32(p, <int32_t>e.record_count); p += 4
            mq_put_i64(p, e.data_start); p += 8
            mq_put_i64(p, e.data_length); p += 8
            mq_put_i64(p, e.min_store_timestamp); p += 8
            mq_put_i64(p, e.max_store_timestamp); p += 8
            mq_put_i32(p, <int32_t>e.first_sample); p += 4
            mq_put_i32(p, <int32_t>e.sample_count); p += 4
        for j in samples:
            it = &self.items[self.order[j]]
            mq_put_i64(p, it.queue_offset); p += 8
            mq_put_i64(p, it.store_ts); p += 8
            mq_put_i32(p, <int32_t><uint32_t>it.data_pos); p += 4
            mq_put_i32(p, it.size); p += 4
        for k in range(n_fences):
            mq_put_i32(p, <int32_t><uint32_t>self.items[k * FENCE].file_pos); p += 4
        for i in range(n):   # items are in physical order: the phy index is sorted already
            mq_put_i32(p, <int32_t><uint32_t>self.items[i].file_pos); p += 4
            mq_put_i32(p, <int32_t><uint32_t>self.items[i].data_pos); p += 4
        self.footer = out
        self.footer_crc = crc_of(PyBytes_AS_STRING(out), self.footer_len)
        self.directory = entries
        self._starts = None
        self._keys = None
        return 0

    cdef int64_t _record_at(self, int64_t data_pos) noexcept nogil:
        """The index in order[] of the record holding data position data_pos."""
        cdef int64_t lo = 0, hi = self.n_items - 1, mid
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.items[self.order[mid]].data_pos <= data_pos:
                lo = mid
            else:
                hi = mid - 1
        return lo

    cdef void _copy_data(self, int64_t offset, char *out, int64_t n) noexcept nogil:
        cdef int64_t k = self._record_at(offset), within, take
        cdef Item *it
        while n > 0:
            it = &self.items[self.order[k]]
            within = offset - it.data_pos
            take = it.size - within
            if take > n:
                take = n
            memcpy(out, self.base + it.file_pos + within, take)
            out += take
            offset += take
            n -= take
            k += 1

    cdef void _crc_data(self, int64_t upto) noexcept nogil:
        """Continue the data CRC from the file up to data position upto."""
        cdef int64_t k, within, take
        cdef Item *it
        if self.crc_pos >= upto:
            return
        k = self._record_at(self.crc_pos)
        while self.crc_pos < upto:
            it = &self.items[self.order[k]]
            within = self.crc_pos - it.data_pos
            take = it.size - within
            if take > upto - self.crc_pos:
                take = upto - self.crc_pos
            self.crc = crc_update(self.crc, self.base + it.file_pos + within, take)
            self.crc_pos += take
            k += 1

    @property
    def data_crc(self) -> int:
        """CRC-32 (zlib) of the data section in object order."""
        with nogil:
            self._crc_data(self.data_len)
        return self.crc

    @property
    def trailer(self) -> bytes:
        cdef uint32_t data_crc = self.data_crc
        cdef bytes t = PyBytes_FromStringAndSize(NULL, TRAILER)
        cdef char *p = PyBytes_AS_STRING(t)
        memcpy(p, <const char *>MAGIC_B, 8)
        mq_put_i32(p + 8, FORMAT_VERSION)
        mq_put_i32(p + 12, self.log_id)
        mq_put_i64(p + 16, self.file_start)
        mq_put_i64(p + 24, self.valid_len)
        mq_put_i64(p + 32, self.data_len)
        mq_put_i32(p + 40, <int32_t><uint32_t>self.footer_len)
        mq_put_i32(p + 44, <int32_t><uint32_t>self.n_items)
        mq_put_i32(p + 48, <int32_t>data_crc)
        mq_put_i32(p + 52, <int32_t>self.footer_crc)
        mq_put_i32(p + 56, <int32_t>crc_of(p, 56))
        mq_put_i32(p + 60, 0)
        return t

    cdef int _fill(self, int64_t offset, char *dst, int64_t n) except -1:
        """Copy n bytes of the object from offset (inside it) to dst."""
        cdef int64_t done = 0, nd, take, at
        cdef bytes t
        if offset < self.data_len and n > 0:
            nd = min(n, self.data_len - offset)
            with nogil:
                self._copy_data(offset, dst, nd)
                if offset <= self.crc_pos < offset + nd:
                    self.crc = crc_update(self.crc, dst + (self.crc_pos - offset), offset + nd - self.crc_pos)
                    self.crc_pos = offset + nd
            done = nd
        at = offset + done
        if done < n and at < self.data_len + self.footer_len:
            take = min(n - done, self.data_len + self.footer_len - at)
            memcpy(dst + done, PyBytes_AS_STRING(self.footer) + (at - self.data_len), take)
            done += take
        at = offset + done
        if done < n:
            t = self.trailer
            memcpy(dst + done, PyBytes_AS_STRING(t) + (at - self.data_len - self.footer_len), n - done)
        return 0

    def read_into(self, int64_t offset, out) -> int:
        """Copy the object's bytes from offset into the writable buffer out (as many as fit and
        exist); returns how many. Reads in order advance the data CRC as they go."""
        cdef unsigned char[::1] o = memoryview(out).cast("B")
        cdef int64_t n = o.shape[0]
        if offset < 0 or offset > self.size:
            raise ValueError(f"offset {offset} is outside the segment's {self.size} bytes")
        if n > self.size - offset:
            n = self.size - offset
        if n > 0:
            self._fill(offset, <char *>&o[0], n)
        return n

    def parts(self, Py_ssize_t part_size):
        """The object in order, as bytes objects of part_size (the last one shorter)."""
        if part_size < 1:
            raise ValueError(f"part_size {part_size} must be >= 1")
        cdef int64_t at = 0, n
        cdef bytes part
        while at < self.size:
            n = min(part_size, self.size - at)
            part = PyBytes_FromStringAndSize(NULL, n)
            self._fill(at, PyBytes_AS_STRING(part), n)
            at += n
            yield part

    def unit_less(self) -> list:
        """The file positions of the records without a ConsumeQueue unit, in physical order."""
        cdef int64_t i
        return [self.items[i].file_pos for i in range(self.n_items) if not self.items[i].unit]


# -- reading side: bytes in, bytes out ---------------------------------------------------------------

def parse_trailer(b) -> Trailer:
    """The fields of a 64-byte trailer; CorruptSegmentError naming the field that fails."""
    cdef const unsigned char[::1] v = memoryview(b).cast("B")
    if v.shape[0] != TRAILER:
        raise CorruptSegmentError(f"segment trailer is {v.shape[0]} bytes, expected {TRAILER}")
    cdef const char *p = <const char *>&v[0]
    if memcmp(p, <const char *>MAGIC_B, 8) != 0:
        raise CorruptSegmentError(f"segment trailer: magic {bytes(v[:8])!r} is not {MAGIC_B!r}")
    cdef uint32_t want = <uint32_t>mq_get_i32(p + 56)
    cdef uint32_t got = crc_of(p, 56)
    if want != got:
        raise CorruptSegmentError(f"segment trailer: trailer CRC 0x{got:08x} does not match the stored 0x{want:08x}")
    cdef int32_t version = mq_get_i32(p + 8)
    if version != FORMAT_VERSION:
        raise CorruptSegmentError(f"segment trailer: format version {version} is not {FORMAT_VERSION}")
    t = Trailer(version, mq_get_i32(p + 12), mq_get_i64(p + 16), mq_get_i64(p + 24), mq_get_i64(p + 32),
                <uint32_t>mq_get_i32(p + 40), <uint32_t>mq_get_i32(p + 44), <uint32_t>mq_get_i32(p + 48),
                <uint32_t>mq_get_i32(p + 52))
    if t.log_id < 0 or t.file_start < 0 or t.data_len != t.valid_len or not 0 <= t.data_len <= MAX_DATA:
        raise CorruptSegmentError(f"segment trailer: log id {t.log_id}, file start {t.file_start}, data length "
                                  f"{t.data_len} and valid length {t.valid_len} do not fit together")
    if mq_get_i32(p + 60) != 0:
        raise CorruptSegmentError("segment trailer: reserved field is not 0")
    return t


def parse_footer(b, trailer) -> Footer:
    """The directory, time samples, phy fences and phy index of a footer (its CRC and layout
    checked against the trailer); CorruptSegmentError naming what fails."""
    cdef const unsigned char[::1] v = memoryview(b).cast("B")
    cdef int64_t n = v.shape[0], c = 0, total = 0, n_records = trailer.record_count, tl, n_samples = 0
    cdef int64_t n_fences, rest, k
    if n != trailer.footer_len:
        raise CorruptSegmentError(f"segment footer is {n} bytes, the trailer says {trailer.footer_len}")
    cdef const char *p = <const char *>&v[0] if n else NULL
    cdef uint32_t got = crc_of(p, n)
    if got != trailer.footer_crc:
        raise CorruptSegmentError(f"segment footer: footer CRC 0x{got:08x} does not match the trailer's "
                                  f"0x{trailer.footer_crc:08x}")
    groups = []
    while total < n_records:
        if c + 1 > n:
            raise CorruptSegmentError(f"segment footer: directory entry {len(groups)} starts past the footer")
        tl = <unsigned char>p[c]
        if c + 1 + tl + DIR_FIXED - 1 > n:
            raise CorruptSegmentError(f"segment footer: directory entry {len(groups)} runs past the footer")
        c += 1
        topic = PyBytes_FromStringAndSize(p + c, tl)
        c += tl
        e = GroupEntry(topic, mq_get_i32(p + c), mq_get_i64(p + c + 4), <uint32_t>mq_get_i32(p + c + 12),
                       mq_get_i64(p + c + 16), mq_get_i64(p + c + 24), mq_get_i64(p + c + 32), mq_get_i64(p + c + 40),
                       <uint32_t>mq_get_i32(p + c + 48), <uint32_t>mq_get_i32(p + c + 52))
        c += DIR_FIXED - 1
        if e.record_count == 0 or e.first_sample != n_samples or e.data_start < 0 or e.data_length < 0 or \
                e.data_start + e.data_length > trailer.data_len or \
                (e.sample_count != 0 if tl == 0 else not 1 <= e.sample_count <= e.record_count):
            raise CorruptSegmentError(f"segment footer: directory entry {len(groups)} ({topic!r}, {e.queue_id}) "
                                      "does not fit the segment")
        n_samples += e.sample_count
        total += e.record_count
        groups.append(e)
    if total != n_records:
        raise CorruptSegmentError(f"segment footer: the directory counts {total} records, the trailer {n_records}")
    n_fences = (n_records + FENCE - 1) // FENCE
    rest = n - c
    if rest != n_samples * SAMPLE + n_fences * 4 + n_records * PHY_ENTRY:
        raise CorruptSegmentError(f"segment footer: {rest} bytes after the directory, expected {n_samples} time "
                                  f"samples, {n_fences} phy fences and {n_records} phy index entries")
    samples = []
    for k in range(n_samples):
        samples.append(TimeSample(mq_get_i64(p + c), mq_get_i64(p + c + 8), <uint32_t>mq_get_i32(p + c + 16),
                                  <uint32_t>mq_get_i32(p + c + 20)))
        c += SAMPLE
    fences = []
    for k in range(n_fences):
        fences.append(<uint32_t>mq_get_i32(p + c))
        c += 4
    phy = PyBytes_FromStringAndSize(p + c, n - c)
    for k in range(n_fences):
        if <uint32_t>mq_get_i32(p + c + k * FENCE * PHY_ENTRY) != fences[k]:
            raise CorruptSegmentError(f"segment footer: phy fence {k} does not match phy index entry {k * FENCE}")
    return Footer(groups, samples, fences, phy)


def parse_segment(obj) -> tuple:
    """(Trailer, Footer) of a whole object; CorruptSegmentError when its size disagrees with its
    trailer or any check fails."""
    cdef const unsigned char[::1] v = memoryview(obj).cast("B")
    cdef int64_t n = v.shape[0]
    if n < TRAILER:
        raise CorruptSegmentError(f"segment object is {n} bytes, shorter than its {TRAILER}-byte trailer")
    t = parse_trailer(v[n - TRAILER:])
    if t.object_size != n:
        raise CorruptSegmentError(f"segment object is {n} bytes, its trailer says {t.object_size}")
    return t, parse_footer(v[t.data_len:t.data_len + t.footer_len], t)


cdef int64_t _last_sample_at_or_below(list samples, int64_t a, int64_t b, int64_t q, bint by_time):
    """The last sample index in [a, b) whose queue offset (by_time: store timestamp, strictly
    below q) is at or below q; a - 1 when none."""
    cdef int64_t lo = a, hi = b
    while lo < hi:
        mid = (lo + hi) // 2
        s = samples[mid]
        if (s.store_timestamp < q) if by_time else (s.queue_offset <= q):
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def queue_offset_range(footer, Py_ssize_t group, int64_t queue_offset):
    """(start, stop): the bytes of the data section to read for the record of queue_offset in
    the directory's queue group (from the time sample at or below it to the end of the next
    sample's record: at most 64 records), or None when the group does not span it."""
    g = footer.groups[group]
    if g.no_queue:
        raise ValueError("the no-queue group has no queue offsets")
    cdef int64_t a = g.first_sample, b = g.first_sample + g.sample_count
    if queue_offset < g.first_queue_offset or queue_offset > footer.samples[b - 1].queue_offset:
        return None
    cdef int64_t j = _last_sample_at_or_below(footer.samples, a, b, queue_offset, False)
    s = footer.samples[j]
    if j + 1 == b:
        return s.data_pos, s.data_pos + s.size
    nxt = footer.samples[j + 1]
    return s.data_pos, nxt.data_pos + nxt.size


def time_range(footer, Py_ssize_t group, int64_t timestamp):
    """(start, stop, after): the bytes of the data section holding the group's first record
    whose store timestamp is at or after timestamp (store timestamps of a queue rise with its
    offsets, as the put lock assigns them), and the queue offset to answer when no record in
    them qualifies (the group's last offset + 1 when timestamp is after all of them)."""
    g = footer.groups[group]
    if g.no_queue:
        raise ValueError("the no-queue group has no queue offsets")
    cdef int64_t a = g.first_sample, b = g.first_sample + g.sample_count
    cdef int64_t j = _last_sample_at_or_below(footer.samples, a, b, timestamp, True)
    if j < a:
        s = footer.samples[a]
        return s.data_pos, s.data_pos + s.size, s.queue_offset
    s = footer.samples[j]
    if j + 1 == b:
        return s.data_pos + s.size, s.data_pos + s.size, s.queue_offset + 1
    nxt = footer.samples[j + 1]
    return s.data_pos + s.size, nxt.data_pos + nxt.size, nxt.queue_offset


cdef int _walk(const char *p, int64_t n, int64_t c, Rec *r) except -1:
    cdef int code = parse_record(p, n, c, r, False, False)
    if code != R_OK or r.total <= 0 or c + r.total > n:
        raise CorruptSegmentError(f"segment data: no whole record at window position {c}")
    return 0


def find_queue_offset(window, int64_t queue_offset):
    """(position in window, size, queue offset) of the first record of the window whose queue
    offset is at or above queue_offset, or None."""
    cdef const unsigned char[::1] v = memoryview(window).cast("B")
    cdef int64_t n = v.shape[0], c = 0
    cdef const char *p = <const char *>&v[0] if n else NULL
    cdef Rec r
    while c < n:
        _walk(p, n, c, &r)
        if r.queue_offset >= queue_offset:
            return c, r.total, r.queue_offset
        c += r.total
    return None


def find_time(window, int64_t timestamp, int64_t after) -> int:
    """The queue offset of the first record of the window stored at or after timestamp, else after."""
    cdef const unsigned char[::1] v = memoryview(window).cast("B")
    cdef int64_t n = v.shape[0], c = 0
    cdef const char *p = <const char *>&v[0] if n else NULL
    cdef Rec r
    while c < n:
        _walk(p, n, c, &r)
        if r.store_timestamp >= timestamp:
            return r.queue_offset
        c += r.total
    return after


def phy_entries_range(trailer, fences, int64_t file_pos):
    """(start, stop) in the object of the phy index entries that hold file_pos (one fence span,
    at most 4096 entries = 32 KiB), or None when file_pos is below the first record."""
    cdef int64_t lo = 0, hi = len(fences), mid, n = trailer.record_count
    while lo < hi:
        mid = (lo + hi) // 2
        if fences[mid] <= file_pos:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return None
    cdef int64_t k = lo - 1
    cdef int64_t base = trailer.data_len + trailer.footer_len - n * PHY_ENTRY
    return base + k * FENCE * PHY_ENTRY, base + min(n, (k + 1) * FENCE) * PHY_ENTRY


def phy_lookup(entries, int64_t file_pos) -> int:
    """The data position of the record at file_pos among phy index entries, or -1."""
    cdef const unsigned char[::1] v = memoryview(entries).cast("B")
    cdef int64_t lo = 0, hi = v.shape[0] // PHY_ENTRY, mid
    cdef const char *p = <const char *>&v[0] if v.shape[0] else NULL
    cdef int64_t at
    while lo < hi:
        mid = (lo + hi) // 2
        at = <uint32_t>mq_get_i32(p + mid * PHY_ENTRY)
        if at < file_pos:
            lo = mid + 1
        elif at > file_pos:
            hi = mid
        else:
            return <uint32_t>mq_get_i32(p + mid * PHY_ENTRY + 4)
    return -1


# -- the compacted index object (.mqidx, spec §5.3) ---------------------------------------------------

cdef inline int64_t chain_walk(const char *b, int64_t entries_at, int64_t count, int32_t v, char *out) noexcept nogil:
    """Walk one slot's chain from entry v as IndexFile.selectPhyOffset does (stop at a negative
    time diff, a prev index outside [1, count), a self-loop, or after count steps); write each
    entry's 16 compacted bytes to out (when not NULL); return how many."""
    cdef int64_t n = 0, steps = 0
    cdef const char *e
    cdef int32_t prev
    if v <= 0 or v >= count:
        return 0
    while steps < count:
        steps += 1
        e = b + entries_at + <int64_t>v * LOCAL_ENTRY
        if mq_get_i32(e + 12) < 0:
            break
        if out != NULL:
            memcpy(out + n * IDX_ENTRY, e, IDX_ENTRY)   # key hash, phy, time diff: the first 16 bytes
        n += 1
        prev = mq_get_i32(e + 16)
        if prev <= 0 or prev >= count or prev == v:
            break
        v = prev
    return n


def compact_index(buf, int64_t hash_slot_num, int64_t index_num, int log_id) -> bytes:
    """The ``.mqidx`` object of a local IndexFile (its bytes, with its geometry): every slot's
    chain as one contiguous run of entries, newest first (spec §5.3)."""
    cdef const unsigned char[::1] v = memoryview(buf).cast("B")
    if hash_slot_num < 1 or index_num < 1 or log_id < 0:
        raise ValueError(f"hash_slot_num ({hash_slot_num}) and index_num ({index_num}) must be >= 1, "
                         f"log_id ({log_id}) >= 0")
    cdef int64_t size = LOCAL_HEADER + LOCAL_SLOT * hash_slot_num + LOCAL_ENTRY * index_num
    if v.shape[0] != size:
        raise ValueError(f"index file is {v.shape[0]} bytes; {hash_slot_num} slots and {index_num} entries "
                         f"make {size}")
    cdef const char *b = <const char *>&v[0]
    cdef int64_t count = mq_get_i32(b + 36)
    count = min(max(1, count), index_num)
    cdef int64_t entries_at = LOCAL_HEADER + LOCAL_SLOT * hash_slot_num, s, total = 0, k
    with nogil:
        for s in range(hash_slot_num):
            total += chain_walk(b, entries_at, count, mq_get_i32(b + LOCAL_HEADER + s * LOCAL_SLOT), NULL)
    if total > 0xFFFFFFFF:
        raise ValueError(f"index file chains hold {total} entries, more than a .mqidx counts")
    cdef bytes out = PyBytes_FromStringAndSize(NULL, IDX_HEADER + IDX_SLOT * hash_slot_num + IDX_ENTRY * total)
    cdef char *o = PyBytes_AS_STRING(out)
    cdef char *slots = o + IDX_HEADER
    cdef char *entries = slots + IDX_SLOT * hash_slot_num
    cdef int64_t at = 0
    with nogil:
        for s in range(hash_slot_num):
            k = chain_walk(b, entries_at, count, mq_get_i32(b + LOCAL_HEADER + s * LOCAL_SLOT),
                           entries + at * IDX_ENTRY)
            mq_put_i32(slots + s * IDX_SLOT, <int32_t><uint32_t>(at if k else 0))
            mq_put_i32(slots + s * IDX_SLOT + 4, <int32_t>k)
            at += k
    memcpy(o, <const char *>IDX_MAGIC_B, 8)
    mq_put_i32(o + 8, IDX_VERSION)
    mq_put_i32(o + 12, log_id)
    mq_put_i64(o + 16, mq_get_i64(b))
    mq_put_i64(o + 24, mq_get_i64(b + 8))
    mq_put_i32(o + 32, <int32_t>hash_slot_num)
    mq_put_i32(o + 36, <int32_t><uint32_t>total)
    mq_put_i32(o + 40, <int32_t>crc_of(slots, IDX_SLOT * hash_slot_num + IDX_ENTRY * total))
    mq_put_i32(o + 44, 0)
    return out


def parse_index_header(b) -> IndexHeader:
    """The fields of a ``.mqidx`` header; CorruptSegmentError naming the field that fails."""
    cdef const unsigned char[::1] v = memoryview(b).cast("B")
    if v.shape[0] != IDX_HEADER:
        raise CorruptSegmentError(f"index object header is {v.shape[0]} bytes, expected {IDX_HEADER}")
    cdef const char *p = <const char *>&v[0]
    if memcmp(p, <const char *>IDX_MAGIC_B, 8) != 0:
        raise CorruptSegmentError(f"index object header: magic {bytes(v[:8])!r} is not {IDX_MAGIC_B!r}")
    if mq_get_i32(p + 8) != IDX_VERSION:
        raise CorruptSegmentError(f"index object header: format version {mq_get_i32(p + 8)} is not {IDX_VERSION}")
    if mq_get_i32(p + 12) < 0 or mq_get_i32(p + 32) < 1 or mq_get_i32(p + 44) != 0:
        raise CorruptSegmentError("index object header: log id, slot count or reserved field is out of range")
    return IndexHeader(IDX_VERSION, mq_get_i32(p + 12), mq_get_i64(p + 16), mq_get_i64(p + 24), mq_get_i32(p + 32),
                       <uint32_t>mq_get_i32(p + 36), <uint32_t>mq_get_i32(p + 40))


def verify_index(obj) -> IndexHeader:
    """The header of a whole ``.mqidx`` object once its size, CRC and slot runs check."""
    cdef const unsigned char[::1] v = memoryview(obj).cast("B")
    cdef int64_t n = v.shape[0], s, first, k, at = 0
    if n < IDX_HEADER:
        raise CorruptSegmentError(f"index object is {n} bytes, shorter than its {IDX_HEADER}-byte header")
    h = parse_index_header(v[:IDX_HEADER])
    if h.object_size != n:
        raise CorruptSegmentError(f"index object is {n} bytes, its header says {h.object_size}")
    cdef const char *p = <const char *>&v[0]
    if crc_of(p + IDX_HEADER, n - IDX_HEADER) != h.crc:
        raise CorruptSegmentError("index object: CRC of slots and entries does not match the header's")
    for s in range(h.slot_count):
        first = <uint32_t>mq_get_i32(p + IDX_HEADER + s * IDX_SLOT)
        k = <uint32_t>mq_get_i32(p + IDX_HEADER + s * IDX_SLOT + 4)
        if (k == 0 and first != 0) or (k and first != at):
            raise CorruptSegmentError(f"index object: slot {s} does not continue the entries at {at}")
        at += k
    if at != h.entry_count:
        raise CorruptSegmentError(f"index object: slots hold {at} entries, the header {h.entry_count}")
    return h


def index_slot_range(header, int64_t key_hash):
    """(start, stop) in the object of the slot of key_hash (IndexFile.indexKeyHashMethod's value)."""
    cdef int64_t s = key_hash % <int64_t>header.slot_count
    if s < 0:
        s += header.slot_count
    return IDX_HEADER + s * IDX_SLOT, IDX_HEADER + (s + 1) * IDX_SLOT


def index_entries_range(header, slot, int64_t max_entries=IDX_RUN_CAP):
    """(start, stop) in the object of a slot's run of entries (capped at max_entries), or None
    for an empty slot; CorruptSegmentError when the slot points outside the entries."""
    cdef const unsigned char[::1] v = memoryview(slot).cast("B")
    if v.shape[0] != IDX_SLOT:
        raise CorruptSegmentError(f"index slot is {v.shape[0]} bytes, expected {IDX_SLOT}")
    cdef int64_t first = <uint32_t>mq_get_i32(<const char *>&v[0]), k = <uint32_t>mq_get_i32(<const char *>&v[4])
    if k == 0:
        return None
    if first + k > header.entry_count:
        raise CorruptSegmentError(f"index slot names entries {first}..{first + k - 1}, the object holds "
                                  f"{header.entry_count}")
    k = min(k, max_entries)
    cdef int64_t base = IDX_HEADER + IDX_SLOT * <int64_t>header.slot_count
    return base + first * IDX_ENTRY, base + (first + k) * IDX_ENTRY


def index_query(entries, header, int64_t key_hash, int64_t max_num, int64_t begin, int64_t end) -> list:
    """The physical offsets of a run's entries for key_hash stored within [begin, end] (ms),
    newest first, at most max_num: IndexFile.selectPhyOffset's filter and early stop."""
    cdef const unsigned char[::1] v = memoryview(entries).cast("B")
    cdef int64_t n = v.shape[0] // IDX_ENTRY, i, t
    cdef const char *p = <const char *>&v[0] if v.shape[0] else NULL
    cdef int64_t base = header.begin_timestamp
    out = []
    for i in range(n):
        if len(out) >= max_num:
            break
        t = base + <int64_t>mq_get_i32(p + i * IDX_ENTRY + 12) * 1000
        if mq_get_i32(p + i * IDX_ENTRY) == key_hash and begin <= t <= end:
            out.append(mq_get_i64(p + i * IDX_ENTRY + 4))
        if t < begin:
            break
    return out
