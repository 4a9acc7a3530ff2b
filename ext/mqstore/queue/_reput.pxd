# The C seam of mqstore.queue._reput: DispatchKernel.apply (mqstore.queue._dispatch) cimports ParsedBatch and
# reads its unit and queue arrays and the base of the file it was parsed from directly.
cimport cython
from libc.stdint cimport int32_t, int64_t, uint32_t

from mq_dispatch cimport BatchQueue, BatchUnit, DispatchEntry


cdef struct KeyItem:
    int64_t phy_offset
    int64_t store_timestamp
    int64_t key_hash         # -1: still to be computed with the GIL (a non-ASCII topic or key)
    int64_t record_at        # file position of the record
    int32_t topic_pos        # the topic's and the key's bytes, inside the record
    int32_t topic_len
    int32_t key_pos
    int32_t key_len


cdef struct PendingTags:     # a unit whose TAGS value is not ASCII
    int64_t unit
    int64_t tags_at          # file position of the value
    int32_t tags_len


@cython.final
cdef class ParsedBatch:
    cdef BatchUnit *units                # unit_count units, in record order
    cdef int64_t units_cap
    cdef BatchQueue *queues              # queue_count queues; a unit's ``queue`` indexes this
    cdef int64_t queues_cap
    cdef int32_t *queue_slots            # hash table: index into queues, -1 = empty
    cdef int64_t slots_cap
    cdef KeyItem *keys
    cdef int64_t keys_cap
    cdef int64_t n_keys
    cdef PendingTags *pending
    cdef int64_t pending_cap
    cdef int64_t n_pending
    cdef const char *base                # the CommitLog file the batch was parsed from
    cdef object view                     # the file's memoryview: keeps that mapping alive
    cdef readonly int64_t count
    cdef readonly int64_t unit_count
    cdef readonly int64_t queue_count
    cdef readonly int64_t file_from
    cdef readonly int64_t start
    cdef readonly int64_t stop
    cdef readonly int64_t last_store_timestamp
    cdef readonly str reason
    cdef readonly bytes index_keys

    cdef int32_t _queue_of(self, const char *topic, int32_t topic_len, int32_t queue_id) noexcept nogil
    cdef bint _rehash(self, int64_t cap) noexcept nogil
    cdef bint _add_unit(self, const DispatchEntry *e) noexcept nogil
    cdef bint _add_key(self, const DispatchEntry *e, uint32_t prefix, bint prefix_ok, int32_t pos,
                       int32_t n) noexcept nogil
    cdef bint _add_keys(self, const DispatchEntry *e) noexcept nogil
    cdef _finish(self)
