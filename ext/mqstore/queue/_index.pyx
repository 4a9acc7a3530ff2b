# cython: language_level=3
"""IndexFile (spec §4.1-§4.3): the hash index of one ``ROOT/index/<yyyyMMddHHmmssSSS>`` file.

Layout (big-endian): a 40-byte header (beginTimestamp, endTimestamp, beginPhyOffset,
endPhyOffset, hashSlotCount, indexCount), ``hash_slot_num`` 4-byte slots holding the number of
the newest entry of their chain, then ``index_num`` 20-byte entries (keyHash, commitLogOffset,
timeDiff in seconds, previous entry number). Entry #0 is never used, so a file holds
``index_num - 1`` keys.

``IndexFile`` wraps a mapped file: a ``mqstore.log._mapped.MappedFile``, or a wrapper with the same
``file_size``, ``file_name``, ``hold``/``release``, ``flush_range`` and ``destroy`` whose
``mapped`` attribute is the MappedFile (mqstore.queue.index maps index files through such a
wrapper, which carries the file's own name); the mapping must hold at least ``file_size`` bytes.
The header is kept in C fields and written through to the mapping on every change, as
RocketMQ's IndexHeader does. Every access to the mapping happens between ``hold()`` and
``release()``, so a file being destroyed is never read after it is unmapped; the chain walk
of a query runs without the GIL.

Java semantics (spec Appendix B): the key hash is String.hashCode over UTF-16 code units,
|h| with abs(Integer.MIN_VALUE) mapped to 0; timeDiff uses C (truncating) division.

Deliberate deviations from RocketMQ 4.9.7, all only visible on damaged or foreign files:
* a chain walk stops after ``index_count`` steps (a valid chain strictly decreases, so this
  never cuts one short; RocketMQ loops forever on a cycle of two or more entries);
* an entry number (a hash slot's value, an entry's previous-entry number) is valid only in
  [1, indexCount): RocketMQ also follows one equal to indexCount, the entry not yet written,
  which in a full file (indexCount = index_num) lies past the end of the file; and the
  indexCount read from a header is clamped to index_num, so a damaged header can never send a
  read or a write past the entries;
* ``IndexFile.load`` treats a header indexCount of 0 (a file RocketMQ created but never wrote:
  its IndexHeader starts at 1 in memory only) as 1, so entry #0 stays unused.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from mq_bytes cimport mq_get_i32, mq_get_i64, mq_put_i32, mq_put_i64, mq_load, mq_store
from mq_record cimport mq_index_key_hash, mq_java_hash

from mqstore.log._mapped cimport MappedFile

cdef enum:
    HEADER = 40          # spec §4.1 header size
    SLOT = 4             # bytes per hash slot
    ENTRY = 20           # bytes per index entry
    H_BEGIN_TS = 0
    H_END_TS = 8
    H_BEGIN_PHY = 16
    H_END_PHY = 24
    H_SLOT_COUNT = 32
    H_INDEX_COUNT = 36

INDEX_HEADER_SIZE = HEADER
HASH_SLOT_SIZE = SLOT
INDEX_SIZE = ENTRY

cdef int64_t INT32_MAX = 2147483647


cdef inline int32_t key_hash_of(str key):
    """spec §4.2 indexKeyHashMethod: |String.hashCode(key)|, abs(MIN_VALUE) -> 0."""
    return mq_index_key_hash(mq_java_hash(key))


def index_key_hash(str key) -> int:
    """|Java String.hashCode(key)|, with abs(Integer.MIN_VALUE) (still negative in Java) mapped
    to 0 (spec §4.2, Appendix B): "polygenelubricants" -> 0, "TopicTest#key1" -> 1655984460."""
    return key_hash_of(key)


def index_file_size(int64_t hash_slot_num, int64_t index_num) -> int:
    """spec §4.1: 40 + 4 * slots + 20 * entries (420000040 bytes with the defaults)."""
    return HEADER + SLOT * hash_slot_num + ENTRY * index_num


cdef int64_t walk_chain(const char *base, int64_t slots, int64_t count, int64_t begin_ts,
                        int32_t key_hash, int64_t begin, int64_t end,
                        int64_t *out, int64_t max_num) noexcept nogil:
    """spec §4.3 selectPhyOffset over one file: fills out[0 .. n) newest first, returns n."""
    cdef const char *entries = base + HEADER + SLOT * slots
    cdef int64_t n = 0, steps = 0, cur, prev, time_read
    cdef int32_t time_diff
    cdef const char *e
    cur = mq_get_i32(base + HEADER + SLOT * (key_hash % slots))
    # entries 1 .. count - 1 are written; count <= the file's index_num (IndexFile clamps it)
    if cur <= 0 or cur >= count or count <= 1:
        return 0
    while n < max_num and steps < count:
        steps += 1
        e = entries + ENTRY * cur
        time_diff = mq_get_i32(e + 12)
        if time_diff < 0:
            break
        time_read = <int64_t>(<uint64_t>begin_ts + <uint64_t>time_diff * 1000)  # Java long wrap
        if mq_get_i32(e) == key_hash and begin <= time_read <= end:
            out[n] = mq_get_i64(e + 4)
            n += 1
        prev = mq_get_i32(e + 16)
        if prev <= 0 or prev >= count or prev == cur or time_read < begin:
            break
        cur = prev
    return n


@cython.auto_pickle(False)   # a mapping cannot be pickled
cdef class IndexFile:
    """One index file over a mapped file (spec §4).

    ``IndexFile(mapped_file, hash_slot_num, index_num, end_phy_offset=0, end_timestamp=0)``
    starts a NEW file: if the header's indexCount is 0 (a zero-filled file) it is initialised
    with begin = end = (end_phy_offset, end_timestamp) (the previous file's end, spec §4.2),
    hashSlotCount 0 and indexCount 1, written through to the mapping. A header whose
    indexCount is already >= 1 is an existing file and is read as it is (the end_* arguments are
    then ignored). ``IndexFile.load`` opens an existing file and never writes the header.
    The mapped file's size must be ``index_file_size(hash_slot_num, index_num)``.
    """

    cdef object _mapped
    cdef char *base
    cdef int64_t slots
    cdef int64_t entries
    cdef int64_t size
    cdef int64_t begin_ts
    cdef int64_t end_ts
    cdef int64_t begin_phy
    cdef int64_t end_phy
    cdef int64_t slot_count
    cdef int64_t count          # indexCount: release-stored by put, acquire-loaded by queries

    def __init__(self, mapped_file, int hash_slot_num, int index_num, int64_t end_phy_offset=0,
                 int64_t end_timestamp=0):
        self._attach(mapped_file, hash_slot_num, index_num)
        if mq_get_i32(self.base + H_INDEX_COUNT) >= 1:
            self._read_header()
            return
        self.begin_phy = self.end_phy = end_phy_offset
        self.begin_ts = self.end_ts = end_timestamp
        self.slot_count = 0
        self.count = 1
        mq_put_i64(self.base + H_BEGIN_TS, end_timestamp)
        mq_put_i64(self.base + H_END_TS, end_timestamp)
        mq_put_i64(self.base + H_BEGIN_PHY, end_phy_offset)
        mq_put_i64(self.base + H_END_PHY, end_phy_offset)
        mq_put_i32(self.base + H_SLOT_COUNT, 0)
        mq_put_i32(self.base + H_INDEX_COUNT, 1)

    @classmethod
    def load(cls, mapped_file, int hash_slot_num, int index_num):
        """An existing index file: the header is read from the mapping, nothing is written.
        An indexCount of 0 (RocketMQ created the file but never put a key) counts as 1, one
        above index_num (a damaged header) counts as index_num."""
        cdef IndexFile f = cls.__new__(cls)
        f._attach(mapped_file, hash_slot_num, index_num)
        f._read_header()
        return f

    cdef _attach(self, mapped_file, int hash_slot_num, int index_num):
        if hash_slot_num < 1 or index_num < 1:
            raise ValueError(f"hash_slot_num ({hash_slot_num}) and index_num ({index_num}) must be >= 1")
        cdef int64_t want = HEADER + SLOT * <int64_t>hash_slot_num + ENTRY * <int64_t>index_num
        if mapped_file.file_size != want:
            raise ValueError(f"index file {mapped_file.file_name} is {mapped_file.file_size} bytes, but "
                             f"{hash_slot_num} slots and {index_num} entries need {want}")
        self._mapped = mapped_file
        cdef MappedFile mf = mapped_file if isinstance(mapped_file, MappedFile) else mapped_file.mapped
        if mf.file_size < want:
            raise ValueError(f"index file {mapped_file.file_name}: its mapping has {mf.file_size} bytes, "
                             f"{want} are needed")
        self.base = mf._b()
        self.slots = hash_slot_num
        self.entries = index_num
        self.size = want

    cdef _read_header(self):
        """The header's fields; indexCount is clamped to [1, index_num] (a damaged header, or
        a count read while being written, can never send a query or a put past the entries)."""
        self.begin_ts = mq_get_i64(self.base + H_BEGIN_TS)
        self.end_ts = mq_get_i64(self.base + H_END_TS)
        self.begin_phy = mq_get_i64(self.base + H_BEGIN_PHY)
        self.end_phy = mq_get_i64(self.base + H_END_PHY)
        self.slot_count = mq_get_i32(self.base + H_SLOT_COUNT)
        self.count = min(max(1, mq_get_i32(self.base + H_INDEX_COUNT)), self.entries)

    def refresh_header(self):
        """Re-read the header another process (the dispatcher) keeps writing through to the
        mapping: a follower's view of new entries. indexCount is clamped to the file's
        capacity (a count read while being written cannot send a query past the entries)."""
        self._read_header()

    def __repr__(self):
        return (f"IndexFile({self._mapped.file_name}, index_count={self.count}, "
                f"phy=[{self.begin_phy}, {self.end_phy}], ts=[{self.begin_ts}, {self.end_ts}])")

    # -- writing (spec §4.2) ----------------------------------------------------------------
    def put_key(self, str key, int64_t phy_offset, int64_t store_timestamp) -> bool:
        """spec §4.2 putKey: add key -> phy_offset at the head of its slot's chain; the header
        is written through at once. False when the file is full (indexCount >= index_num).
        Raises ValueError if the file was destroyed or closed."""
        return self.put_key_hash(key_hash_of(key), phy_offset, store_timestamp)

    def put_key_hash(self, int32_t key_hash, int64_t phy_offset, int64_t store_timestamp) -> bool:
        """put_key with the key's index_key_hash already computed (0 <= key_hash)."""
        if key_hash < 0:
            raise ValueError(f"key_hash must be >= 0 (an index_key_hash), got {key_hash}")
        if self.count >= self.entries:
            return False
        if not self._mapped.hold():
            raise ValueError(f"index file {self._mapped.file_name} is destroyed or closed")
        try:
            self._put(key_hash, phy_offset, store_timestamp)
        finally:
            self._mapped.release()
        return True

    def put_key_hashes(self, keys, int64_t start=0) -> int:
        """put_key_hash for each (phy_offset, store_timestamp, key_hash) triple of native int64s
        in keys (``mqstore.queue._reput.ParsedBatch.index_keys``), in order from triple number start;
        a triple whose phy_offset is below end_phy_offset is skipped, as build_index skips an
        already indexed message (spec §4.4). Returns the number of the first triple not
        consumed: the count of triples when all were, fewer when the file became full (the
        rest go to the next file). Raises ValueError if the file was destroyed or closed."""
        cdef const unsigned char[::1] view = keys
        cdef int64_t n = view.shape[0] // 24, i = start, bad = -1
        cdef int64_t t[3]
        if i >= n:
            return i
        if not self._mapped.hold():
            raise ValueError(f"index file {self._mapped.file_name} is destroyed or closed")
        try:
            with nogil:
                while i < n and self.count < self.entries:
                    memcpy(t, &view[0] + i * 24, 24)
                    if t[0] >= self.end_phy:
                        if t[2] < 0 or t[2] > INT32_MAX:
                            bad = i
                            break
                        self._put(<int32_t>t[2], t[0], t[1])
                    i += 1
        finally:
            self._mapped.release()
        if bad >= 0:
            raise ValueError(f"key hash {t[2]} of triple {bad} is not an index_key_hash")
        return i

    cdef void _put(self, int32_t key_hash, int64_t phy, int64_t ts) noexcept nogil:
        cdef char *b = self.base
        cdef char *slot = b + HEADER + SLOT * (key_hash % self.slots)
        cdef int64_t n = self.count
        cdef int64_t prev = mq_get_i32(slot)
        cdef int64_t diff
        cdef char *e = b + HEADER + SLOT * self.slots + ENTRY * n
        if prev <= 0 or prev >= n:   # not a written entry (damaged, or a torn put)
            prev = 0
        # QUIRK (RocketMQ 4.9.7): the first entry of a file that follows a full one is
        # measured from the previous file's end timestamp, before begin is set just below.
        diff = <int64_t>(<uint64_t>ts - <uint64_t>self.begin_ts) / 1000   # Java long wrap, truncating
        if self.begin_ts <= 0:
            diff = 0
        elif diff > INT32_MAX:
            diff = INT32_MAX
        elif diff < 0:
            diff = 0
        mq_put_i32(e, key_hash)
        mq_put_i64(e + 4, phy)
        mq_put_i32(e + 12, <int32_t>diff)
        mq_put_i32(e + 16, <int32_t>prev)
        mq_put_i32(slot, <int32_t>n)
        if n <= 1:
            self.begin_phy = phy
            self.begin_ts = ts
            mq_put_i64(b + H_BEGIN_PHY, phy)
            mq_put_i64(b + H_BEGIN_TS, ts)
        if prev == 0:
            self.slot_count += 1
            mq_put_i32(b + H_SLOT_COUNT, <int32_t>self.slot_count)
        mq_put_i32(b + H_INDEX_COUNT, <int32_t>(n + 1))
        self.end_phy = phy
        self.end_ts = ts
        mq_put_i64(b + H_END_PHY, phy)
        mq_put_i64(b + H_END_TS, ts)
        mq_store(&self.count, n + 1)   # publishes the entry and slot to concurrent queries

    # -- reading (spec §4.3) ----------------------------------------------------------------
    def select_phy_offset(self, str key, int max_num, int64_t begin, int64_t end) -> list:
        """spec §4.3 selectPhyOffset: commit log offsets of the entries in key's chain whose
        hash equals key's and whose time (begin + timeDiff s) is in [begin, end], newest first,
        at most max_num. Hash-only match: callers re-check the real key of each record.
        Empty if the file is being destroyed."""
        cdef int32_t key_hash = key_hash_of(key)
        cdef int64_t count = mq_load(&self.count)
        cdef int64_t cap = min(<int64_t>max_num, count), n = 0, i
        if cap <= 0 or not self._mapped.hold():
            return []
        cdef int64_t *out = <int64_t *>malloc(cap * sizeof(int64_t))
        if out == NULL:
            self._mapped.release()
            raise MemoryError()
        try:
            with nogil:
                n = walk_chain(self.base, self.slots, count, self.begin_ts, key_hash, begin, end, out, cap)
            return [out[i] for i in range(n)]
        finally:
            free(out)
            self._mapped.release()

    def is_time_matched(self, int64_t begin, int64_t end) -> bool:
        """spec §4.3 isTimeMatched: [begin, end] overlaps [begin_timestamp, end_timestamp]."""
        return ((begin < self.begin_ts and end > self.end_ts)
                or self.begin_ts <= begin <= self.end_ts
                or self.begin_ts <= end <= self.end_ts)

    @property
    def is_write_full(self) -> bool:
        """indexCount >= index_num: no entry is left (spec §4.2)."""
        return self.count >= self.entries

    # -- header (spec §4.1) -----------------------------------------------------------------
    @property
    def begin_timestamp(self) -> int:
        return self.begin_ts

    @property
    def end_timestamp(self) -> int:
        return self.end_ts

    @property
    def begin_phy_offset(self) -> int:
        return self.begin_phy

    @property
    def end_phy_offset(self) -> int:
        return self.end_phy

    @property
    def hash_slot_count(self) -> int:
        return self.slot_count

    @property
    def index_count(self) -> int:
        return self.count

    @property
    def hash_slot_num(self) -> int:
        return self.slots

    @property
    def index_num(self) -> int:
        return self.entries

    @property
    def mapped_file(self):
        return self._mapped

    @property
    def file_name(self) -> str:
        return self._mapped.file_name

    # -- durability and lifetime ------------------------------------------------------------
    def flush(self) -> bool:
        """msync the whole file (the header is already written through). False if the file is
        being destroyed; OSError if the flush fails."""
        if not self._mapped.hold():
            return False
        try:
            self._mapped.flush_range(0, self.size)
        finally:
            self._mapped.release()
        return True

    def destroy(self, int64_t interval_forcibly_ms) -> bool:
        """Delete the file through its mapped file (spec §6.1 destroy): True once it is gone;
        False while a reader still holds it (call again; forced after the interval)."""
        return self._mapped.destroy(interval_forcibly_ms)
