# cython: language_level=3
"""The read side (spec §11): getMessage and the look-ups by offset, over zero-copy views.

* ``LogMap``: the CommitLog files by index (their mappings), for every C reader (declared in
  _reads.pxd: mqstore.queue._search cimports it).
* ``GetMessageResult`` and ``MessageView``: what getMessage returns, read in place from the
  mapped CommitLog files.
* ``ReadKernel``: getMessage and the look-ups by queue offset in one C call, reading a queue's
  current file through its ``ConsumeQueueKernel`` (mqstore.queue._consumequeue).
"""

import logging
import warnings

cimport cython

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT32_MAX, INT64_MAX, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from mq_bytes cimport *
from mq_ctl cimport *
from mq_record cimport *
from mq_status cimport *

from mq_check cimport REC_CRC_MISMATCH, REC_OK, c_record_status, mq_crc_fold_detect
from mq_inflate cimport MQ_COMPRESSED_FLAG, mq_body_bytes

from mqstore.log._codec cimport decode_at, msg_id, string_to_properties
from mqstore.queue._consumequeue cimport CQ_UNIT, FILLER_SIZE, ConsumeQueueKernel
from mqstore.log._mapped cimport MappedFile
from mqstore.log._shm cimport ControlBlock

from mqstore import compression as _compression
from mqstore.errors import CorruptRecordError

_log = logging.getLogger("mqstore.reads")
mq_crc32_init()
mq_crc_fold_detect()


def record_problem(int status) -> str:
    """What a record status (mqstore.queue._search RECORD_*) says is wrong with a record."""
    if status == REC_CRC_MISMATCH:
        return "its body does not match its BODYCRC"
    return "its header does not parse (magic code or lengths damaged)"


cdef object _checked(object view, bint check):
    """view, or CorruptRecordError naming its physical offset when check is on and its record
    fails the structure checks or its body CRC (the look-ups that return one message)."""
    if not check or view is None:
        return view
    cdef MessageView v = <MessageView>view
    cdef int status = c_record_status(v.p, v._size)
    if status == REC_OK:
        return view
    problem = record_problem(status)
    _log.error("the record at physical offset %d is damaged: %s", v._phy, problem)
    raise CorruptRecordError(f"the record at physical offset {v._phy} is damaged: {problem}")


cdef class LogMap:
    """CommitLog files by index for C readers: the mapping of file k (start first_from +
    k * file_size), NULL when not mapped. Keeps the mappings it points into alive.

    A file is mapped here only while it is available (not being deleted). The map pins each
    mapping with a memoryview, not with the file's reference count: an exported buffer defers
    munmap (MappedFile._cleanup), so the addresses stay valid for as long as this map or any
    result or view taken from it lives, while the retention service can still delete the
    file at once (spec §14; a held reference would stall every deletion until the forced
    interval). Readers rebuild the map when the file list changes, dropping such files."""

    # attributes and at(): _reads.pxd

    def __cinit__(self):
        self.bases = NULL

    def __init__(self, files, int64_t file_size, first_from=None):
        """files: the CommitLog's MappedFiles in order; an entry may be None (a file this map
        leaves unmapped). first_from: the start of file 0 (default: the first file's)."""
        if file_size <= 0:
            raise ValueError(f"file_size must be > 0, got {file_size}")
        self.file_size = file_size
        self.files = list(files)
        self.n = len(self.files)
        for mf in self.files:
            if mf is not None and not isinstance(mf, MappedFile):
                raise TypeError(f"a LogMap maps MappedFiles (or None), not {type(mf).__name__}")
        if first_from is not None:
            self.first_from = first_from
        else:
            self.first_from = next((f.file_from for f in self.files if f is not None), 0)
        self.bases = <char **>calloc(max(self.n, 1), sizeof(char *))
        if self.bases == NULL:
            raise MemoryError()
        cdef int64_t k
        cdef MappedFile f
        views = [None] * self.n
        for mf in self.files:
            if mf is None:
                continue
            f = <MappedFile?>mf
            k = (f.file_from - self.first_from) // file_size
            if 0 <= k < self.n and f.available and f.base != NULL:
                try:
                    view = memoryview(f)
                except ValueError:  # unmapped by a deletion since the list was taken
                    continue
                views[k] = view
                self.bases[k] = f._b()
        self.views = views

    def __dealloc__(self):
        free(self.bases)

    def __len__(self):
        return self.n

    @property
    def end(self) -> int:
        """First offset past the mapped files."""
        return self.first_from + self.n * self.file_size

    cdef object slice_of(self, int64_t phy, int64_t size):
        """A zero-copy memoryview of [phy, phy + size) (inside one file; checked by callers)."""
        cdef int64_t pos = (phy - self.first_from) % self.file_size
        return self.views[(phy - self.first_from) // self.file_size][pos:pos + size]

    def file_of(self, int64_t phy):
        """The MappedFile holding phy, or None."""
        if phy < self.first_from:
            return None
        cdef int64_t k = (phy - self.first_from) // self.file_size
        if k >= self.n:
            return None
        return self.files[k]

    def store_timestamp(self, int64_t phy) -> int:
        """STORETIMESTAMP of the record at phy, -1 if its file is not mapped."""
        cdef const char *r = self.at(phy, 80)
        if r == NULL:
            return -1
        return mq_get_i64(r + store_timestamp_pos(mq_get_i32(r + MQ_POS_SYSFLAG)))


@cython.freelist(64)
cdef class GetMessageResult:
    """What getMessage found (spec §11): status, next_begin_offset, min/max offsets, and the
    messages as zero-copy views on the mapped CommitLog files (decoded on access).

    ``len(result)``, ``result[i]`` and iteration give MessageView objects; ``buffers()``
    gives one memoryview per message. The result keeps the files it points into mapped.
    """

    cdef public object status
    cdef public int64_t next_begin_offset
    cdef public int64_t min_offset
    cdef public int64_t max_offset
    cdef public bint suggest_pulling_from_slave
    cdef public int64_t buffer_total_size
    cdef public int64_t max_phy_offset_pulling
    cdef LogMap log_map
    cdef int64_t *phys
    cdef int32_t *sizes
    cdef int count
    cdef int cap

    def __cinit__(self):
        self.phys = NULL
        self.sizes = NULL
        self.count = 0
        self.cap = 0

    def __init__(self, status, int64_t next_begin_offset=0, int64_t min_offset=0, int64_t max_offset=0):
        self.status = status
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.suggest_pulling_from_slave = False
        self.buffer_total_size = 0
        self.max_phy_offset_pulling = 0

    def __dealloc__(self):
        free(self.phys)
        free(self.sizes)

    cdef int _reserve(self, int n) except -1:
        if n <= self.cap:
            return 0
        cdef int64_t *p = <int64_t *>calloc(n, sizeof(int64_t))
        cdef int32_t *s = <int32_t *>calloc(n, sizeof(int32_t))
        if p == NULL or s == NULL:
            free(p)
            free(s)
            raise MemoryError()
        if self.count:
            memcpy(p, self.phys, self.count * sizeof(int64_t))
            memcpy(s, self.sizes, self.count * sizeof(int32_t))
        free(self.phys)
        free(self.sizes)
        self.phys = p
        self.sizes = s
        self.cap = n
        return 0

    @property
    def message_count(self) -> int:
        return self.count

    @property
    def ok(self) -> bool:
        return self.count > 0

    def __len__(self):
        return self.count

    def __bool__(self):
        return True

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError("message index out of range")
        return self._view(i)

    cdef MessageView _view(self, int i):
        return make_view(self.log_map, self.phys[i], self.sizes[i])

    def __iter__(self):
        cdef int i
        return iter([make_view(self.log_map, self.phys[i], self.sizes[i]) for i in range(self.count)])

    @property
    def physical_offsets(self) -> list:
        return [self.phys[i] for i in range(self.count)]

    @property
    def sizes_list(self) -> list:
        return [self.sizes[i] for i in range(self.count)]

    def bodies(self, *, bint decompress=True) -> list:
        """Every message's body as bytes, in one call (what ``[m.body_bytes() for m in result]``
        gives, without a view per message): as the producer sent it, a body stored compressed
        inflated per its sysFlag (mqstore.compression; BodyDecompressError naming the message
        when it does not inflate); with decompress=False, as stored."""
        cdef int i
        cdef LogMap m = self.log_map
        cdef const char *p
        cdef RecordHead h
        cdef list out = []
        for i in range(self.count):
            p = m.at(self.phys[i], self.sizes[i])
            if p == NULL or self.sizes[i] < MQ_MIN_RECORD or parse_record_head(p, self.sizes[i], &h) != MQ_PARSE_OK:
                raise CorruptRecordError(f"the record at physical offset {self.phys[i]} is damaged: its lengths "
                                         f"do not fit its {self.sizes[i]} bytes")
            if decompress:
                out.append(_body(p, &h, self.phys[i]))
            else:
                out.append(PyBytes_FromStringAndSize(p + h.body_pos, h.body_len))
        return out

    def records(self) -> bytes:
        """Every message's whole record, concatenated in queue order, as one bytes object: the
        body of a pull response (RocketMQ's readGetMessageResult), copied once from the mapped
        files without a Python object per record."""
        cdef int i
        cdef LogMap m = self.log_map
        cdef const char *p
        cdef Py_ssize_t total = 0, at = 0
        for i in range(self.count):
            total += self.sizes[i]
        cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
        cdef char *dst = PyBytes_AS_STRING(out)
        for i in range(self.count):
            p = m.at(self.phys[i], self.sizes[i])
            if p == NULL:
                raise CorruptRecordError(f"the record at physical offset {self.phys[i]} is no longer mapped")
            memcpy(dst + at, p, self.sizes[i])
            at += self.sizes[i]
        return out

    def buffers(self) -> list:
        """One zero-copy memoryview per message (the whole record)."""
        cdef int i
        cdef LogMap m = self.log_map
        return [m.slice_of(self.phys[i], self.sizes[i]) for i in range(self.count)]

    def __repr__(self):
        return (f"GetMessageResult(status={self.status!r}, messages={self.count}, "
                f"next_begin_offset={self.next_begin_offset}, min_offset={self.min_offset}, "
                f"max_offset={self.max_offset})")


cdef bytes _body(const char *p, RecordHead *h, int64_t phy):
    """The body of the record at p as the producer sent it (ext/mq_inflate.pxd); errors name
    the record by topic, queue, queue offset and physical offset."""
    if h.body_len == 0 or not h.sys_flag & MQ_COMPRESSED_FLAG:
        return PyBytes_FromStringAndSize(p + h.body_pos, h.body_len)
    return mq_body_bytes(p + h.body_pos, h.body_len, h.sys_flag, _compression,
                         (PyBytes_FromStringAndSize(p + h.topic_pos, h.topic_len), mq_get_i32(p + MQ_POS_QUEUEID),
                          mq_get_i64(p + MQ_POS_QUEUEOFFSET), phy))


cdef MessageView make_view(LogMap log_map, int64_t phy, int32_t size):
    cdef MessageView v = MessageView.__new__(MessageView)
    v.owner = log_map
    v.p = log_map.at(phy, size)
    v._phy = phy
    v._size = size
    return v


def view_at(LogMap log_map, int64_t phy):
    """The record at phy as a MessageView (its size read from the record), or None when phy
    is not in a mapped file or does not hold a message (spec §11 lookMessageByOffset)."""
    return c_view_at(log_map, phy)


cdef object c_view_at(LogMap log_map, int64_t phy):
    cdef const char *p = log_map.at(phy, 8)
    if p == NULL:
        return None
    cdef int32_t size = mq_get_i32(p), magic = mq_get_i32(p + 4)
    if (magic != MQ_MESSAGE_MAGIC_CODE and magic != MQ_MESSAGE_MAGIC_CODE_V2) or size < 91 or \
            log_map.at(phy, size) == NULL:
        return None
    return make_view(log_map, phy, size)


@cython.freelist(512)
@cython.final
cdef class MessageView:
    """One stored record, read in place from the mapped CommitLog file. Header fields are
    read on access; ``body`` and ``buffer`` are zero-copy memoryviews; ``decode()`` gives
    the full mqstore.log.record.DecodedRecord. The view keeps the files it points into mapped."""

    cdef object owner
    cdef const char *p
    cdef int64_t _phy
    cdef int32_t _size
    cdef RecordHead _h
    cdef bint _parsed

    @property
    def physical_offset(self) -> int:
        """Where the record starts in the CommitLog (PHYSICALOFFSET, spec §1)."""
        return self._phy

    @property
    def total_size(self) -> int:
        """The record's length in bytes (TOTALSIZE, spec §1)."""
        return self._size

    @property
    def phy(self) -> int:
        """Deprecated alias of physical_offset."""
        warnings.warn("MessageView.phy is deprecated; use physical_offset", DeprecationWarning, stacklevel=2)
        return self._phy

    @property
    def size(self) -> int:
        """Deprecated alias of total_size."""
        warnings.warn("MessageView.size is deprecated; use total_size", DeprecationWarning, stacklevel=2)
        return self._size

    cdef inline int _fixed(self) except -1:
        """The fixed header fields lie inside the record (a ConsumeQueue unit may claim a
        size too small for them)."""
        if self._size < MQ_MIN_RECORD:
            from mqstore.errors import CorruptRecordError
            raise CorruptRecordError(f"the record at physical offset {self._phy} is damaged: {self._size} bytes "
                                     f"cannot hold a record's header")
        return 0

    cdef int _parse(self) except -1:
        """Locate the variable parts (spec §5.3 checks, bounded by the record's size); a
        record whose lengths disagree raises CorruptRecordError naming its offset instead
        of reading past it."""
        if self._parsed:
            return 0
        if self._size < MQ_MIN_RECORD or parse_record_head(self.p, self._size, &self._h) != MQ_PARSE_OK:
            from mqstore.errors import CorruptRecordError
            raise CorruptRecordError(f"the record at physical offset {self._phy} is damaged: its lengths do not "
                                     f"fit its {self._size} bytes")
        self._parsed = True
        return 0

    @property
    def queue_id(self) -> int:
        """The queue the record was put to (QUEUEID)."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_QUEUEID)

    @property
    def flag(self) -> int:
        """The message's FLAG, as the producer set it."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_FLAG)

    @property
    def queue_offset(self) -> int:
        """The record's offset in its queue (QUEUEOFFSET)."""
        self._fixed()
        return mq_get_i64(self.p + MQ_POS_QUEUEOFFSET)

    @property
    def sys_flag(self) -> int:
        """SYSFLAG: compression, transaction type, IPv6 host bits (spec §1.3)."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_SYSFLAG)

    @property
    def born_timestamp(self) -> int:
        """When the producer created the message (ms since the epoch)."""
        self._fixed()
        return mq_get_i64(self.p + MQ_POS_BORNTIMESTAMP)

    @property
    def store_timestamp(self) -> int:
        """When the store appended the record (ms since the epoch)."""
        self._fixed()
        return mq_get_i64(self.p + store_timestamp_pos(mq_get_i32(self.p + MQ_POS_SYSFLAG)))

    @property
    def body_crc(self) -> int:
        """The CRC32 of the body as stored (BODYCRC). A store's reads compared it with the body
        before returning the message when check_crc_on_read is on (the default)."""
        self._fixed()
        return mq_get_i32(self.p + MQ_POS_BODYCRC)

    @property
    def reconsume_times(self) -> int:
        """RECONSUMETIMES: how often the message was redelivered."""
        self._parse()
        return mq_get_i32(self.p + self._h.body_pos - 16)

    @property
    def prepared_transaction_offset(self) -> int:
        """PREPAREDTRANSACTIONOFFSET of a transaction message."""
        self._parse()
        return mq_get_i64(self.p + self._h.body_pos - 12)

    def _file_view(self):
        return (<LogMap>self.owner).slice_of(self._phy, self._size)

    @property
    def buffer(self) -> memoryview:
        """The whole record, zero-copy."""
        return self._file_view()

    @property
    def body(self) -> memoryview:
        """The body as the producer sent it: zero-copy when stored as sent (bytes(view.body)
        copies); a body stored compressed (sysFlag, mqstore.compression) is inflated, into new
        memory, on each access (BodyDecompressError naming the message when it does not)."""
        self._parse()
        if self._h.body_len == 0 or not self._h.sys_flag & MQ_COMPRESSED_FLAG:
            return (<LogMap>self.owner).slice_of(self._phy + self._h.body_pos, self._h.body_len)
        return memoryview(_body(self.p, &self._h, self._phy))

    @property
    def raw_body(self) -> memoryview:
        """The body as stored, zero-copy: compressed when sys_flag says so (BODYCRC is over
        these bytes)."""
        self._parse()
        return (<LogMap>self.owner).slice_of(self._phy + self._h.body_pos, self._h.body_len)

    def body_bytes(self, *, bint decompress=True) -> bytes:
        """The body as bytes, as the producer sent it (see ``body``), without the memoryview
        ``bytes(view.body)`` goes through; with decompress=False, as stored."""
        self._parse()
        if decompress:
            return _body(self.p, &self._h, self._phy)
        return PyBytes_FromStringAndSize(self.p + self._h.body_pos, self._h.body_len)

    @property
    def topic(self) -> str:
        """The topic the record was stored under."""
        self._parse()
        return PyUnicode_DecodeUTF8(self.p + self._h.topic_pos, self._h.topic_len, "strict")

    @property
    def properties_string(self) -> str:
        """The properties as stored: name\\x01value pairs joined by \\x02."""
        self._parse()
        return PyUnicode_DecodeUTF8(self.p + self._h.props_pos, self._h.props_len, "strict")

    @property
    def properties(self) -> dict:
        """The properties as a dict (TAGS, KEYS, UNIQ_KEY, user properties ...)."""
        return string_to_properties(self.properties_string)

    @property
    def tags(self):
        """The TAGS property, or None."""
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list:
        """The KEYS property split on spaces."""
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def msg_id(self) -> str:
        """RocketMQ's offset message id: the store host and the physical offset, in hex."""
        return msg_id(self.decode(read_body=False).store_host, self._phy)

    def decode(self, *, bint read_body=True, bint check_crc=False):
        """Every field as a mqstore.log.record.DecodedRecord (copies the body): the record as
        stored, its body too (compressed when sys_flag says so; what a re-put keeps, with the
        flag; ``body_bytes()`` gives it as sent)."""
        return decode_at(self._file_view(), 0, check_crc, read_body)

    def __repr__(self):
        return (f"MessageView(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"physical_offset={self._phy}, total_size={self._size})")


cdef struct ScanLimits:
    int64_t min_phy
    int64_t max_phy
    int max_msg_nums
    int64_t in_memory_bytes_limit
    int64_t max_bytes_memory
    int max_count_memory
    int64_t max_bytes_disk
    int max_count_disk
    int64_t scan_bytes_max


cdef int scan_units_into(GetMessageResult result, LogMap log_map, const char *b, int64_t pos, int64_t end,
                         const ScanLimits *lim, tag_codes, int64_t *consumed) except -1:
    """The getMessage scan (spec §11) over units [pos, end) at b; fills result and returns
    the status code (MQ_GET_*), the number of units consumed in *consumed."""
    if pos + lim.scan_bytes_max < end:
        end = pos + lim.scan_bytes_max
    cdef int64_t start = pos, phy, tags, total = 0, next_file_start = -1, last_phy = -1
    cdef int32_t size
    cdef int count = 0, status = MQ_GET_NO_MATCHED_MESSAGE, i, ntags = 0
    cdef int max_msg_nums = lim.max_msg_nums
    cdef bint in_disk, match
    cdef int64_t codes[32]
    cdef bint filter_tags = tag_codes is not None
    cdef frozenset many = None
    if filter_tags:
        if len(tag_codes) <= 32:
            for t in tag_codes:
                codes[ntags] = t
                ntags += 1
        else:
            many = frozenset(tag_codes)
    result.log_map = log_map
    # max_msg_nums < 1 still returns one message, as RocketMQ's isTheBatchFull never ends an
    # empty batch
    result._reserve(1 if max_msg_nums < 1 else max_msg_nums if max_msg_nums < 1024 else 1024)
    while pos + CQ_UNIT <= end:
        phy = mq_get_i64(b + pos)
        size = mq_get_i32(b + pos + 8)
        tags = mq_get_i64(b + pos + 12)
        if next_file_start >= 0 and phy < next_file_start:
            pos += CQ_UNIT
            continue
        in_disk = lim.max_phy - phy > lim.in_memory_bytes_limit
        if count > 0:  # isTheBatchFull: never before something was collected
            if count >= max_msg_nums:
                break
            if in_disk:
                if total + size > lim.max_bytes_disk or count >= lim.max_count_disk:
                    break
            elif total + size > lim.max_bytes_memory or count >= lim.max_count_memory:
                break
        last_phy = phy
        if filter_tags:
            if many is not None:
                match = tags in many
            else:
                match = False
                for i in range(ntags):
                    if codes[i] == tags:
                        match = True
                        break
            if not match:
                pos += CQ_UNIT
                continue
        if phy < lim.min_phy or size <= 0 or size == FILLER_SIZE or log_map.at(phy, size) == NULL:
            if count == 0:
                status = MQ_GET_MESSAGE_WAS_REMOVING
            if phy >= 0:
                next_file_start = phy - phy % log_map.file_size + log_map.file_size
            pos += CQ_UNIT
            continue
        if count >= result.cap:
            result.count = count  # _reserve keeps the first `count` entries
            result._reserve(result.cap * 2 if result.cap > 0 else 16)
        result.phys[count] = phy
        result.sizes[count] = size
        total += size
        count += 1
        status = MQ_GET_FOUND
        pos += CQ_UNIT
    result.count = count
    result.buffer_total_size = total
    result.max_phy_offset_pulling = last_phy
    consumed[0] = (pos - start) // CQ_UNIT
    return status


# -- the read kernel: getMessage and lookups by queue offset in one C call ---------------------------

cdef enum:
    TAG_CACHE_MAX = 1024

from mqstore.status import GetMessageStatus as _GetMessageStatus

cdef tuple _STATUSES = tuple(sorted(_GetMessageStatus, key=int))


cdef class ReadKernel:
    """The C side of mqstore.queue.reads.MessageReader.

    getMessage and the look-ups by queue offset run here in one call: the queue is found in
    the ConsumeQueue table's dict, its units are read through the queue's C append state
    when they lie in its current (last) file (where consumers near the tail read), else
    through the queue's Python ``get_index_buffer``; the CommitLog files come from a cached
    LogMap rebuilt when the file list changes (its ``version``); the CommitLog's readable end
    is read from the control block. Subscription expressions are parsed once and cached.
    """

    cdef dict k_queues
    cdef list k_log_files                # the MappedFileQueue of each CommitLog, by log id
    cdef object k_ctl_obj
    cdef char *k_ctl
    cdef list k_lmaps                    # a cached LogMap per CommitLog (None: to build)
    cdef list k_lmap_versions
    cdef dict k_tag_cache
    cdef ScanLimits k_lim
    cdef public bint check_crc_on_read   # the look-ups check the record they return
    cdef object k_follower               # None, or what catches this process up (follow_with)
    cdef int64_t k_seen_min_phy          # the min_phys the follower last caught up to (_min_phys)

    def __init__(self, dict queues, log_files, control_block):
        """log_files: the CommitLog's MappedFileQueue, or a list of them, one per CommitLog of a
        store with several (docs/parallel-commitlogs.md): a queue's units are read in the log
        its ConsumeQueue names (log_id), a record by its offset in the log the offset names."""
        self.k_queues = queues
        self.k_log_files = list(log_files) if isinstance(log_files, (list, tuple)) else [log_files]
        self.k_ctl_obj = control_block
        self.k_ctl = (<ControlBlock?>control_block)._b()
        if len(self.k_log_files) > (<ControlBlock>control_block).log_count:
            raise ValueError(f"{len(self.k_log_files)} CommitLogs given, the control block has "
                             f"{(<ControlBlock>control_block).log_count}")
        self.k_lmaps = [None] * len(self.k_log_files)
        self.k_lmap_versions = [None] * len(self.k_log_files)
        self.k_tag_cache = {}
        self.k_follower = None
        self.k_seen_min_phy = -1
        # no caps until set_transfer_limits (MessageReader sets them from the store's config)
        self.k_lim.in_memory_bytes_limit = 0
        self.k_lim.max_bytes_memory = INT64_MAX
        self.k_lim.max_count_memory = INT32_MAX
        self.k_lim.max_bytes_disk = INT64_MAX
        self.k_lim.max_count_disk = INT32_MAX

    def set_transfer_limits(self, *, int64_t max_bytes_memory, int max_count_memory, int64_t max_bytes_disk,
                            int max_count_disk):
        """getMessage's caps for a batch read from memory / from disk (spec §11 isTheBatchFull)."""
        self.k_lim.max_bytes_memory = max_bytes_memory
        self.k_lim.max_count_memory = max_count_memory
        self.k_lim.max_bytes_disk = max_bytes_disk
        self.k_lim.max_count_disk = max_count_disk

    @property
    def in_memory_limit(self) -> int:
        """Bytes behind the CommitLog end still counted as in memory (spec §11: RAM ×
        access_message_in_memory_max_ratio); older messages get the on-disk transfer caps."""
        return self.k_lim.in_memory_bytes_limit

    @in_memory_limit.setter
    def in_memory_limit(self, int64_t value):
        self.k_lim.in_memory_bytes_limit = value

    cpdef LogMap log_map(self, int log=0):
        """The files of CommitLog ``log`` as the C readers see them (rebuilt when a file is
        added or removed); an empty map for a log this store does not have."""
        if not 0 <= log < len(self.k_log_files):
            return LogMap((), 4096)
        files = self.k_log_files[log]
        version = files.version
        cdef LogMap lmap = self.k_lmaps[log]
        if lmap is None or version != self.k_lmap_versions[log]:
            lmap = LogMap(files.files, files.file_size)
            self.k_lmaps[log] = lmap
            self.k_lmap_versions[log] = version
        return lmap

    def follow_with(self, follower):
        """Reads in a process that follows what other processes build (an attached store, a
        node's owner): the look-ups by queue offset call ``follower.queue(topic, queue_id)``
        (mqstore.queue.follow.Follower) only when what they need is not there yet (the queue,
        a unit past the last one followed, a CommitLog file not mapped) or the cleaner moved
        min_phy, instead of on every call. None: this process builds what it reads."""
        self.k_follower = follower
        self.k_seen_min_phy = -1

    cdef inline int64_t _min_phys(self) noexcept:
        """Every CommitLog's min_phy folded into one number (a wrapping sum: it moves when the
        cleaner moved any log's; one CommitLog: log 0's min_phy itself)."""
        cdef uint64_t total = <uint64_t>mq_load(mq_cell(self.k_ctl, MQ_CTL_MIN_PHY))
        cdef int n = <int>mq_cell(self.k_ctl, MQ_CTL_LOG_COUNT)[0]
        cdef int k
        for k in range(1, n):
            total += <uint64_t>mq_load(mq_cell(self.k_ctl + mq_log_base(k), MQ_CTL_MIN_PHY))
        return <int64_t>total

    cdef inline bint _min_phy_moved(self) noexcept:
        """The cleaner moved a log's min_phy since the follower last caught up."""
        return self._min_phys() != self.k_seen_min_phy

    cdef _follow(self, str topic=None, int queue_id=0):
        """The follower catches the logs up (and the queue, given one); remember the min_phys it saw."""
        cdef int64_t min_phy = self._min_phys()
        if topic is None:
            self.k_follower.log()
        else:
            self.k_follower.queue(topic, queue_id)  # the log, then the queue
        self.k_seen_min_phy = min_phy

    cdef object _view(self, int64_t phy):
        """The record at phy; a following reader maps the CommitLog file another process
        created since, when phy lies in one it has not mapped yet."""
        view = c_view_at(self.log_map(mq_log_of(phy)), phy)
        if view is None and self.k_follower is not None:
            self._follow()
            view = c_view_at(self.log_map(mq_log_of(phy)), phy)
        return view

    def forget_log_map(self):
        """Drop the cached LogMap (its file list changed): the mappings of deleted files go
        as soon as no result or view taken from it is left (MappedFileQueue.on_files_removed)."""
        self.k_lmaps = [None] * len(self.k_log_files)

    cdef inline int64_t readable_end(self, int log) noexcept:
        """The end of what is readable in CommitLog ``log`` (its wrote position); 0 for a log
        this store does not have."""
        if not 0 <= log < len(self.k_log_files):
            return 0
        return mq_load(mq_cell(mq_log(self.k_ctl, log), MQ_CTL_WROTE))

    cpdef object tag_codes(self, tags):
        """Tags codes of a subscription expression "A || B" (spec §11), cached; None = all."""
        if tags is None:
            return None
        codes = self.k_tag_cache.get(tags, self)
        if codes is not self:
            return codes
        if type(tags) is not str:
            raise TypeError(f"tags must be a str expression, got {type(tags).__name__}")
        expression = (<str>tags).strip()
        if not expression or expression == "*":
            codes = None
        else:
            hashes = []
            for part in expression.split("||"):
                part = part.strip()
                if part:
                    hashes.append(mq_java_hash(part))
            codes = frozenset(hashes)
        if len(self.k_tag_cache) >= TAG_CACHE_MAX:
            self.k_tag_cache.clear()
        self.k_tag_cache[tags] = codes
        return codes

    cdef GetMessageResult _result(self, int status, int64_t next_begin, int64_t min_offset, int64_t max_offset):
        cdef GetMessageResult r = GetMessageResult.__new__(GetMessageResult)
        r.status = _STATUSES[status]
        r.next_begin_offset = next_begin
        r.min_offset = min_offset
        r.max_offset = max_offset
        r.suggest_pulling_from_slave = False
        r.buffer_total_size = 0
        r.max_phy_offset_pulling = 0
        return r

    def get_message(self, group, str topic, int queue_id, int64_t offset, int max_msg_nums, tags=None,
                    bint capped=True):
        """getMessage (spec §11): up to max_msg_nums messages of a queue from offset. capped=False
        lifts the transfer caps (count and bytes, from memory and from disk), which RocketMQ sets
        for a network pull: a local bulk read takes max_msg_nums messages."""
        cdef ScanLimits lim = self.k_lim
        if not capped:
            lim.max_bytes_memory = INT64_MAX
            lim.max_count_memory = INT32_MAX
            lim.max_bytes_disk = INT64_MAX
            lim.max_count_disk = INT32_MAX
        cq_obj = self.k_queues.get((topic, queue_id))
        if cq_obj is None:
            return self._result(MQ_GET_NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        cdef ConsumeQueueKernel cq = <ConsumeQueueKernel>cq_obj
        cdef int64_t min_offset = cq.min_logic_offset // CQ_UNIT
        cdef int64_t max_offset = cq.c_max_logic() // CQ_UNIT
        if max_offset == 0:
            return self._result(MQ_GET_NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
        if offset < min_offset:
            return self._result(MQ_GET_OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return self._result(MQ_GET_OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            return self._result(MQ_GET_OFFSET_OVERFLOW_BADLY, max_offset, min_offset, max_offset)
        codes = self.tag_codes(tags)
        cdef LogMap lmap = self.log_map(cq.log_id)
        cdef GetMessageResult r = self._result(MQ_GET_NO_MATCHED_MESSAGE, offset, min_offset, max_offset)
        cdef int64_t logic = offset * CQ_UNIT, consumed = 0, end, per_file
        cdef const char *older = NULL
        cdef int status
        cdef const unsigned char[::1] view
        lim.max_phy = self.readable_end(cq.log_id)
        lim.min_phy = lmap.first_from
        lim.max_msg_nums = max_msg_nums
        lim.scan_bytes_max = max(16000, <int64_t>max_msg_nums * CQ_UNIT)
        if cq.cur_base != NULL and cq.cur_from <= logic:
            # the current file: its units up to the C write position
            end = cq.cur_wrote if cq.cur_wrote < cq.file_size else cq.file_size
            status = scan_units_into(r, lmap, cq.cur_base, logic - cq.cur_from, end, &lim, codes, &consumed)
        else:
            older = self._older_units(cq, cq_obj, logic, &end)
            queue_map = cq.queue_map  # keeps the file older points into mapped while it is scanned
            if older != NULL:
                # an older file of the queue, through its LogMap (which keeps the file mapped)
                r.log_map = lmap
                status = MQ_GET_NO_MATCHED_MESSAGE
                if logic % cq.file_size < end:
                    status = scan_units_into(r, lmap, older, logic % cq.file_size, end, &lim, codes, &consumed)
            else:
                got = cq_obj.get_index_buffer(offset)
                pinned = None
                if got is not None:
                    mf, pos, end = got
                    try:
                        pinned = memoryview(mf).cast("B")
                    except ValueError:
                        pass  # spec §14: retention deleted the file since the lookup
                if pinned is None:
                    # no file holds the offset (RocketMQ getIndexBuffer: null); if retention moved
                    # the queue's min offset past it meanwhile, say so
                    min_offset = cq.min_logic_offset // CQ_UNIT
                    if offset < min_offset:
                        return self._result(MQ_GET_OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
                    per_file = cq.file_size // CQ_UNIT
                    r.status = _STATUSES[MQ_GET_OFFSET_FOUND_NULL]
                    r.next_begin_offset = offset + per_file - offset % per_file
                    return r
                view = pinned
                if end > view.shape[0]:
                    end = view.shape[0]
                r.log_map = lmap
                status = MQ_GET_NO_MATCHED_MESSAGE
                if pos < end:
                    status = scan_units_into(r, lmap, <const char *>&view[0], pos, end, &lim, codes, &consumed)
        r.status = _STATUSES[status]
        r.next_begin_offset = offset + consumed
        if r.max_phy_offset_pulling >= 0:
            r.suggest_pulling_from_slave = lim.max_phy - r.max_phy_offset_pulling > lim.in_memory_bytes_limit
        return r

    cdef LogMap _queue_map(self, ConsumeQueueKernel cq, object cq_obj):
        """The queue's files as a LogMap (kept on the queue, rebuilt when its file list changes;
        dropped when files are removed): units in files before the current one are read in C."""
        files = cq_obj.files
        version = files.version
        if cq.queue_map is None or cq.queue_map_version != version:
            cq.queue_map = LogMap(files.files, cq.file_size)
            cq.queue_map_version = version
        return <LogMap>cq.queue_map

    cdef const char *_older_units(self, ConsumeQueueKernel cq, object cq_obj, int64_t logic, int64_t *end):
        """The base of the (not current) queue file holding byte logic, and in end its written
        end (the file's wrote_position, at most its size); NULL when that file is not mapped."""
        cdef LogMap qm = self._queue_map(cq, cq_obj)
        cdef int64_t avail = 0
        cdef const char *p = qm.rest_at(logic, &avail)
        if p == NULL:
            return NULL
        cdef MappedFile mf = <MappedFile?>qm.file_of(logic)
        end[0] = mf.wrote_position if mf.wrote_position < cq.file_size else cq.file_size
        return p - (logic - mf.file_from)

    cdef int64_t _unit_phy(self, ConsumeQueueKernel cq, object cq_obj, int64_t queue_offset) except? -2:
        """phyOffset of a queue's unit, -1 if the queue has no such unit."""
        cdef int64_t logic = queue_offset * CQ_UNIT
        cdef int64_t end = 0
        cdef const char *base
        if queue_offset < 0 or logic < cq.min_logic_offset or logic >= cq.c_max_logic():
            return -1
        if cq.cur_base != NULL and logic >= cq.cur_from:
            return mq_get_i64(cq.cur_base + (logic - cq.cur_from))
        base = self._older_units(cq, cq_obj, logic, &end)
        if base != NULL:
            if logic % cq.file_size + CQ_UNIT <= end:
                return mq_get_i64(base + logic % cq.file_size)
            return -1
        unit = cq_obj.unit(queue_offset)
        return -1 if unit is None else unit[0]

    def look_message_by_offset(self, int64_t phy_offset, check=None):
        """The message at a CommitLog offset, or None (at/after the max offset, deleted, or
        not the start of a message; spec §11 lookMessageByOffset). With check (default:
        check_crc_on_read), CorruptRecordError when its record fails its structure checks or
        body CRC."""
        if phy_offset < 0 or phy_offset >= self.readable_end(mq_log_of(phy_offset)):
            return None
        if self.k_follower is not None and self._min_phy_moved():
            self._follow()
        return _checked(self._view(phy_offset), self.check_crc_on_read if check is None else check)

    def look_message_by_queue_offset(self, str topic, int queue_id, int64_t queue_offset):
        """The message at a queue offset, or None; checked as look_message_by_offset."""
        cq_obj = self.k_queues.get((topic, queue_id))
        if self.k_follower is not None and (
                cq_obj is None or self._min_phy_moved()
                or queue_offset >= (<ConsumeQueueKernel>cq_obj).c_max_logic() // CQ_UNIT):
            self._follow(topic, queue_id)
            cq_obj = self.k_queues.get((topic, queue_id))
        if cq_obj is None:
            return None
        cdef int64_t phy = self._unit_phy(<ConsumeQueueKernel>cq_obj, cq_obj, queue_offset)
        if phy < 0 or phy >= self.readable_end(mq_log_of(phy)):
            return None
        return _checked(self._view(phy), self.check_crc_on_read)

    def get_message_store_timestamp(self, str topic, int queue_id, int64_t queue_offset):
        """STORETIMESTAMP of the message at a queue offset, -1 if none (spec §11)."""
        cq_obj = self.k_queues.get((topic, queue_id))
        if cq_obj is None:
            return -1
        cdef int64_t phy = self._unit_phy(<ConsumeQueueKernel>cq_obj, cq_obj, queue_offset)
        if phy < 0 or phy >= self.readable_end(mq_log_of(phy)):
            return -1
        return self.log_map(mq_log_of(phy)).store_timestamp(phy)
