# cython: language_level=3
"""The parse step of the concurrent dispatch (spec §10.2, RocketMQ 5.x ConcurrentReputMessageService).

The reput thread cuts the readable part of a CommitLog file into batches of whole records
(``BatchParser.cut``: TOTALSIZE and MAGIC only, 5.x's pre-check); pool threads parse the
batches at the same time (``BatchParser.parse``: the per-record parse of mq_dispatch.pxd that
the serial kernel uses too, without the GIL, plus each unit's queue within the batch and the
index key hashes); the reput thread
then applies each ``ParsedBatch`` strictly in batch order: its ConsumeQueue units through
``mqstore.queue._dispatch.DispatchKernel.apply`` and its index keys through
``IndexFile.put_key_hashes``. So the queues and the index come out as the serial dispatch
builds them.

Twin: mqstore.twin.reput.
"""

cimport cython

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp

from mq_bytes cimport mq_get_i32
from mq_ctl cimport mq_tq_hash
from mq_dispatch cimport *
from mq_record cimport (MQ_BLANK_MAGIC_CODE, MQ_MESSAGE_MAGIC_CODE, MQ_MESSAGE_MAGIC_CODE_V2, mq_index_key_hash,
                        mq_java_hash)

cdef enum:
    MIN_RECORD_SIZE = 91     # a record with no body, topic or properties (parse_record_head's floor)
    FIRST_CAPACITY = 256     # array slots allocated before the first growth
    FIRST_QUEUE_SLOTS = 64   # hash slots of a batch's queue table (a power of two)


# KeyItem and PendingTags: _reput.pxd


cdef bint grow(void **array, int64_t *cap, int64_t used, size_t item) noexcept nogil:
    """Make room for one more item in a malloc'd array (doubling); False when out of memory."""
    cdef int64_t n
    cdef void *bigger
    if used < cap[0]:
        return True
    n = cap[0] * 2 if cap[0] else FIRST_CAPACITY
    bigger = realloc(array[0], n * item)
    if bigger == NULL:
        return False
    array[0] = bigger
    cap[0] = n
    return True


@cython.final
@cython.auto_pickle(False)
cdef class ParsedBatch:
    """One batch of records, parsed: what its ConsumeQueue units are, which queues they go to,
    and its index keys. ``DispatchKernel.apply`` reads the C arrays (mq_dispatch.pxd
    BatchUnit and BatchQueue) through the C attributes _reput.pxd declares: every queue of the batch
    is looked up once, so appending a unit touches neither the record nor a hash table.

    ``stop`` is where parsing ended: the batch's end (``reason`` "end"), or a record that
    does not parse ("invalid") or an END_OF_FILE record ("blank") at stop.
    """

    # attributes: _reput.pxd

    def __cinit__(self):
        self.units = NULL
        self.queues = NULL
        self.queue_slots = NULL
        self.keys = NULL
        self.pending = NULL

    def __dealloc__(self):
        free(self.units)
        free(self.queues)
        free(self.queue_slots)
        free(self.keys)
        free(self.pending)

    def __len__(self):
        return self.count

    @property
    def index_key_count(self) -> int:
        return self.n_keys

    def unit_list(self) -> list:
        """Each unit as (topic bytes, queue_id, queue_offset, phy_offset, size, tags_code), in
        record order: for tests and inspection."""
        cdef int64_t i
        cdef BatchQueue *q
        cdef BatchUnit *u
        out = []
        for i in range(self.unit_count):
            u = &self.units[i]
            q = &self.queues[u.queue]
            out.append((PyBytes_FromStringAndSize(self.base + q.topic_at, q.topic_len), q.queue_id,
                        u.queue_offset, u.phy_offset, u.size, u.tags_code))
        return out

    cdef int32_t _queue_of(self, const char *topic, int32_t topic_len, int32_t queue_id) noexcept nogil:
        """The batch's number for the queue (topic, queue_id), added on first sight; -1 when
        out of memory."""
        cdef uint64_t h = mq_tq_hash(topic, topic_len, queue_id)
        cdef int64_t at, i
        cdef int32_t k
        cdef BatchQueue *q
        if (self.queue_count + 1) * 2 > self.slots_cap and not self._rehash(
                self.slots_cap * 2 if self.slots_cap else FIRST_QUEUE_SLOTS):
            return -1
        at = <int64_t>(h & <uint64_t>(self.slots_cap - 1))
        while self.queue_slots[at] >= 0:
            q = &self.queues[self.queue_slots[at]]
            if q.hash == h and q.queue_id == queue_id and q.topic_len == topic_len and \
                    memcmp(self.base + q.topic_at, topic, topic_len) == 0:
                return self.queue_slots[at]
            at = (at + 1) & (self.slots_cap - 1)
        if not grow(<void **>&self.queues, &self.queues_cap, self.queue_count, sizeof(BatchQueue)):
            return -1
        k = <int32_t>self.queue_count
        q = &self.queues[k]
        q.topic_at = topic - self.base
        q.hash = h
        q.topic_len = topic_len
        q.queue_id = queue_id
        self.queue_slots[at] = k
        self.queue_count += 1
        return k

    cdef bint _rehash(self, int64_t cap) noexcept nogil:
        cdef int32_t *slots = <int32_t *>malloc(cap * sizeof(int32_t))
        cdef int64_t i, at
        if slots == NULL:
            return False
        for i in range(cap):
            slots[i] = -1
        for i in range(self.queue_count):
            at = <int64_t>(self.queues[i].hash & <uint64_t>(cap - 1))
            while slots[at] >= 0:
                at = (at + 1) & (cap - 1)
            slots[at] = <int32_t>i
        free(self.queue_slots)
        self.queue_slots = slots
        self.slots_cap = cap
        return True

    cdef bint _add_unit(self, const DispatchEntry *e) noexcept nogil:
        cdef const char *rec = self.base + e.pos
        cdef int32_t k = self._queue_of(rec + e.topic_pos, e.topic_len, e.queue_id)
        cdef BatchUnit *u
        if k < 0 or not grow(<void **>&self.units, &self.units_cap, self.unit_count, sizeof(BatchUnit)):
            return False
        if e.flags & MQ_ENTRY_TAGS_PENDING:
            if not grow(<void **>&self.pending, &self.pending_cap, self.n_pending, sizeof(PendingTags)):
                return False
            self.pending[self.n_pending].unit = self.unit_count
            self.pending[self.n_pending].tags_at = e.pos + e.tags_pos
            self.pending[self.n_pending].tags_len = e.tags_len
            self.n_pending += 1
        u = &self.units[self.unit_count]
        u.phy_offset = e.phy_offset
        u.queue_offset = e.queue_offset
        u.tags_code = e.tags_code
        u.size = e.size
        u.queue = k
        self.unit_count += 1
        return True

    cdef bint _add_key(self, const DispatchEntry *e, uint32_t prefix, bint prefix_ok, int32_t pos,
                       int32_t n) noexcept nogil:
        """One index key of the record e: its bytes at pos (n of them, inside the record)
        follow "topic#", whose hash state is prefix."""
        cdef KeyItem *k
        cdef uint32_t h = prefix
        if not grow(<void **>&self.keys, &self.keys_cap, self.n_keys, sizeof(KeyItem)):
            return False
        k = &self.keys[self.n_keys]
        self.n_keys += 1
        k.phy_offset = e.phy_offset
        k.store_timestamp = e.store_timestamp
        k.record_at = e.pos
        k.topic_pos = e.topic_pos
        k.topic_len = e.topic_len
        k.key_pos = pos
        k.key_len = n
        if prefix_ok and ascii_java_hash(self.base + e.pos + pos, n, &h):
            k.key_hash = mq_index_key_hash(<int32_t>h)
        else:
            k.key_hash = -1
        return True

    cdef bint _add_keys(self, const DispatchEntry *e) noexcept nogil:
        """The index keys of spec §4.4 buildIndex, in its order: topic#UNIQ_KEY, then topic#k
        for every non-empty k of KEYS split on spaces."""
        cdef const char *rec = self.base + e.pos
        cdef uint32_t prefix = 0
        cdef bint prefix_ok = ascii_java_hash(rec + e.topic_pos, e.topic_len, &prefix)
        cdef int32_t i, seg, end
        prefix = 31 * prefix + 35   # '#'
        if e.uniq_pos >= 0 and not self._add_key(e, prefix, prefix_ok, e.uniq_pos, e.uniq_len):
            return False
        if e.keys_pos >= 0:
            i = e.keys_pos
            end = e.keys_pos + e.keys_len
            while i <= end:
                seg = i
                while i < end and rec[i] != 32:
                    i += 1
                if i > seg and not self._add_key(e, prefix, prefix_ok, seg, i - seg):
                    return False
                i += 1
        return True

    cdef _finish(self):
        """With the GIL: the tags codes and key hashes the parse left pending, and index_keys."""
        cdef int64_t i
        cdef KeyItem *k
        cdef const char *rec
        for i in range(self.n_pending):
            self.units[self.pending[i].unit].tags_code = tags_hash(self.base + self.pending[i].tags_at,
                                                                   self.pending[i].tags_len)
        for i in range(self.n_keys):
            k = &self.keys[i]
            if k.key_hash < 0:
                rec = self.base + k.record_at
                # as build_index does it: the topic decoded strictly, the keys with replacement
                key = (PyUnicode_DecodeUTF8(rec + k.topic_pos, k.topic_len, "replace") + "#"
                       + PyUnicode_DecodeUTF8(rec + k.key_pos, k.key_len, "replace"))
                k.key_hash = mq_index_key_hash(mq_java_hash(key))
        self.index_keys = PyBytes_FromStringAndSize(NULL, self.n_keys * 24)
        cdef int64_t *out = <int64_t *>PyBytes_AS_STRING(self.index_keys)
        for i in range(self.n_keys):
            out[3 * i] = self.keys[i].phy_offset
            out[3 * i + 1] = self.keys[i].store_timestamp
            out[3 * i + 2] = self.keys[i].key_hash
        free(self.keys)
        self.keys = NULL
        free(self.pending)
        self.pending = NULL
        free(self.queue_slots)
        self.queue_slots = NULL


cdef class BatchParser:
    """Cuts CommitLog files into batches and parses them (thread-safe: no mutable state).

    ``delay_levels_ms`` gives the tags codes (delivery times) of SCHEDULE_TOPIC_XXXX records;
    with ``index_enable`` the index keys of every record with KEYS or UNIQ_KEY (not a
    ROLLBACK) are hashed as IndexService.build_index would hash them.
    """

    cdef int64_t delays[MQ_MAX_DELAY_LEVEL]
    cdef int n_delays
    cdef readonly bint index_enable

    def __init__(self, delay_levels_ms=(), *, bint index_enable=True):
        self.index_enable = index_enable
        self.n_delays = set_delay_levels(self.delays, delay_levels_ms)

    def cut(self, mapped, int64_t start, int64_t end, int64_t batch_bytes):
        """The next batch of the file from position start: (stop, reason, records). The batch
        [start, stop) is the shortest run of whole records at least batch_bytes long
        (reason "batch": more follows), or what lies before end ("end"), before an
        END_OF_FILE record ("blank") or before a record whose TOTALSIZE or MAGIC is wrong
        ("invalid"). Only TOTALSIZE and MAGIC are read (5.x's pre-check); the parse checks
        the rest."""
        cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
        if end > view.shape[0]:
            end = view.shape[0]
        cdef const char *b = <const char *>&view[0] if view.shape[0] else NULL
        cdef int64_t pos = start, records = 0
        cdef int32_t size, magic
        cdef int why = 0    # 0 end, 1 batch, 2 blank, 3 invalid
        with nogil:
            while pos < end:
                if pos - start >= batch_bytes:
                    why = 1
                    break
                mq_prefetch(b + pos + MQ_PREFETCH_AHEAD)
                if end - pos < 8:
                    why = 3
                    break
                size = mq_get_i32(b + pos)
                magic = mq_get_i32(b + pos + 4)
                if magic == MQ_BLANK_MAGIC_CODE:
                    why = 2
                    break
                if (magic != MQ_MESSAGE_MAGIC_CODE and magic != MQ_MESSAGE_MAGIC_CODE_V2) or \
                        size < MIN_RECORD_SIZE or size > end - pos:
                    why = 3
                    break
                pos += size
                records += 1
        return pos, ("end", "batch", "blank", "invalid")[why], records

    def parse(self, mapped, int64_t file_from, int64_t start, int64_t end, int64_t records=0) -> ParsedBatch:
        """Parse the records of [start, end) of the CommitLog file mapped (starting at
        file_from), as cut() cut them (records: how many it counted, to size the entry array
        at once); the loop runs without the GIL."""
        cdef ParsedBatch batch = ParsedBatch.__new__(ParsedBatch)
        cdef const unsigned char[::1] view = memoryview(mapped).cast("B")
        if end > view.shape[0]:
            end = view.shape[0]
        batch.view = view
        batch.base = <const char *>&view[0] if view.shape[0] else NULL
        batch.file_from = file_from
        batch.start = start
        batch.last_store_timestamp = -1
        if records > 0:
            batch.units = <BatchUnit *>malloc(records * sizeof(BatchUnit))
            if batch.units == NULL:
                raise MemoryError(f"{records} dispatch units")
            batch.units_cap = records
        cdef const char *b = batch.base
        cdef int64_t pos = start
        cdef int r = MQ_PARSE_OK
        cdef bint index_enable = self.index_enable, out_of_memory = False
        cdef DispatchEntry e
        with nogil:
            while pos < end:
                mq_prefetch(b + pos + MQ_PREFETCH_AHEAD)
                r = parse_dispatch_entry(b + pos, end - pos, pos, self.delays, self.n_delays, &e)
                if r != MQ_PARSE_OK:
                    break
                if (e.flags & MQ_ENTRY_UNIT and not batch._add_unit(&e)) or (
                        index_enable and e.flags & MQ_ENTRY_INDEX and not batch._add_keys(&e)):
                    out_of_memory = True
                    break
                batch.count += 1
                batch.last_store_timestamp = e.store_timestamp
                pos += e.size
        if out_of_memory:
            raise MemoryError(f"parsing dispatch batch [{start}, {end}) of the file at {file_from}")
        batch.stop = pos
        batch.reason = "blank" if r == MQ_PARSE_BLANK else "invalid" if r != MQ_PARSE_OK else "end"
        batch._finish()
        return batch
