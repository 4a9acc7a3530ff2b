# cython: language_level=3
"""The CommitLog put path (spec §9, §1.7): the appender. The message types it takes and gives are
in ``mqstore.log._message``, the record scanner in ``mqstore.log._scan``.

``CommitLogAppender.put_message`` does everything of a put in C: the checks before the lock,
encoding outside the lock, and inside it only the queue offset, physical offset and store
timestamp are set, the bytes copied and the positions published in the control block. Slow
paths (mapping or allocating the next file) call back into Python outside the lock.
"""

import os

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_GET_LENGTH, PyUnicode_DecodeUTF8
from libc.errno cimport EBUSY
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

from mq_bytes cimport *
from mq_ctl cimport *
from mq_record cimport *
from mq_status cimport *

from mqstore.log._mapped cimport MappedFile
from mqstore.log._message cimport Message, MessageBatch, PutMessageResult, _result, wait_store_msg_ok
from mqstore.log._shm cimport ControlBlock, TransientStorePool

from mqstore.log._scan import scan_records
from mqstore.errors import StoreClosedError
from mqstore.log.record import encode_host

cdef extern from "<errno.h>":
    int EOWNERDEAD

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    pthread_t pthread_self()

mq_crc32_init()

# internal results of one locked append
cdef enum:
    APPEND_OK = 0
    APPEND_END_OF_FILE = 1
    APPEND_NEED_FILE = 2
    APPEND_TABLE_FULL = 3
    APPEND_NOT_WRITEABLE = 4
    APPEND_POOL_EXHAUSTED = 5
    APPEND_NEED_SPACE = 6       # the current file's blocks are not allocated that far yet

cdef enum:
    VALID_TOPICS_CACHED = 4096
    STACK_RECORD = 2048
    MAX_DELAY_LEVEL = 18

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# running flags that refuse puts, with what each means (RocketMQ RunningFlags)
cdef tuple _RUNNING_FLAG_WHY = (
    ("NOT_WRITEABLE (the owner is shutting down or shut down)", MQ_NOT_WRITEABLE),
    ("WRITE_LOGICS_QUEUE_ERROR (a ConsumeQueue could not be written)", MQ_WRITE_LOGICS_QUEUE_ERROR),
    ("WRITE_INDEX_FILE_ERROR (the index could not be written)", MQ_WRITE_INDEX_FILE_ERROR),
    ("DISK_FULL (the disk is above disk_space_warning_level_ratio)", MQ_DISK_FULL),
)


cdef dict _status_list(const char *(*entry)(int, int *) noexcept nogil):
    cdef dict codes = {}
    cdef int i = 0, value = 0
    cdef const char *name = entry(0, &value)
    while name != NULL:
        codes[name.decode("ascii")] = value
        i += 1
        name = entry(i, &value)
    return codes


#: The status codes as compiled from mq_status.h (the one definition of their numbers), by
#: mqstore.status enum name: {enum name: {member name: value}}. tests/test_status_codes.py
#: checks that mqstore.status agrees with it.
_C_STATUS_CODES = {
    "PutMessageStatus": _status_list(mq_put_status_entry),
    "GetMessageStatus": _status_list(mq_get_status_entry),
    "AppendMessageStatus": _status_list(mq_append_status_entry),
}

cdef int64_t _pid = os.getpid()


def _refresh_pid():
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


cdef struct AppendOut:
    int64_t wrote_offset
    int64_t wrote_bytes
    int64_t queue_offset
    int64_t store_timestamp
    int64_t need_offset
    int64_t flush_errors  # SYNC_FLUSH: the flush error count before the records were published


cdef int delay_level(dict props):
    """The DELAY level a message with these properties is stored under (clamped to the highest
    level), or 0 when it is not delayed (no level, a level <= 0, or one that is not a number)."""
    try:
        level = int(props["DELAY"])
    except (KeyError, ValueError):
        return 0
    return 0 if level <= 0 else min(level, MAX_DELAY_LEVEL)


cdef class BatchPlan:
    """The records of one batch, planned outside the lock: per inner message pointers to its
    body and stored properties, its flag and record size, then all records encoded into one
    buffer (spec §9.4). Owns its C arrays; `keep` holds every bytes object pointed into."""

    cdef Py_ssize_t n
    cdef int64_t total
    cdef int32_t *sizes
    cdef int32_t *body_len
    cdef int32_t *props_len
    cdef int32_t *flags
    cdef const char **body_p
    cdef const char **props_p
    cdef char *buf
    cdef list keep

    cdef int _alloc(self, Py_ssize_t n) except -1:
        self.n = n
        self.total = 0
        self.keep = []
        self.sizes = <int32_t *>malloc(n * 3 * sizeof(int32_t) + n * 2 * sizeof(char *) + n * sizeof(int32_t))
        if self.sizes == NULL:
            raise MemoryError()
        self.body_len = self.sizes + n
        self.props_len = self.sizes + 2 * n
        self.flags = self.sizes + 3 * n
        self.body_p = <const char **>(self.sizes + 4 * n)
        self.props_p = self.body_p + n
        return 0

    cdef object from_messages(self, list msgs, str topic, int queue_id, Py_ssize_t topic_len, int sys_flag,
                              int64_t max_message_size):
        """Plan a list of Messages of one topic and queue; None, or (status, reason)."""
        cdef Py_ssize_t i, n = len(msgs), plen
        cdef int64_t size = 0
        cdef Message m
        cdef bytes body, pb
        self._alloc(n)
        for i in range(n):
            m = <Message?>msgs[i]
            if (m.topic is not topic and m.topic != topic) or m.queue_id != queue_id:
                return MQ_PUT_MESSAGE_ILLEGAL, ("a batch holds messages of one topic and one queue "
                                         f"(got {m.topic!r}/{m.queue_id} after {topic!r}/{queue_id})")
            body = m.body
            self.keep.append(body)
            self.body_p[i] = PyBytes_AS_STRING(body)
            self.body_len[i] = <int32_t>PyBytes_GET_SIZE(body)
            plen = 0
            self.props_p[i] = NULL
            if m._properties:
                try:
                    pb = checked_properties_string(m._properties).encode("utf-8")
                except ValueError as exc:
                    return MQ_PUT_MESSAGE_ILLEGAL, f"message {i} of the batch: {exc}"
                plen = PyBytes_GET_SIZE(pb)
                if plen > MQ_MAX_PROPERTIES_BYTES:
                    return MQ_PUT_PROPERTIES_SIZE_EXCEEDED, (f"message {i} of the batch has properties of {plen} UTF-8 "
                                                      f"bytes, more than {MQ_MAX_PROPERTIES_BYTES}")
                self.keep.append(pb)
                self.props_p[i] = PyBytes_AS_STRING(pb)
            self.props_len[i] = <int32_t>plen
            self.flags[i] = m.flag
            size += 22 + self.body_len[i] + plen
            self.sizes[i] = mq_record_length(self.body_len[i], topic_len, plen, sys_flag, False)
            self.total += self.sizes[i]
        if size > max_message_size:
            return MQ_PUT_MESSAGE_ILLEGAL, f"batch is {size} bytes, more than max_message_size={max_message_size}"
        return None

    cdef object from_bodies(self, list bodies, bytes props_b, int flag, Py_ssize_t topic_len, int sys_flag,
                            int64_t max_message_size):
        """Plan bodies that share one properties string and flag; None, or (status, reason)."""
        cdef Py_ssize_t i, n = len(bodies)
        cdef int64_t size = 0
        cdef Py_ssize_t plen = PyBytes_GET_SIZE(props_b)
        cdef const char *pp = PyBytes_AS_STRING(props_b) if plen else NULL
        cdef object body
        self._alloc(n)
        self.keep.append(props_b)
        for i in range(n):
            body = bodies[i]
            if type(body) is not bytes:
                if not isinstance(body, (bytearray, memoryview)):
                    return MQ_PUT_MESSAGE_ILLEGAL, f"body {i} is a {type(body).__name__}, not bytes"
                body = bytes(body)
            self.keep.append(body)
            self.body_p[i] = PyBytes_AS_STRING(body)
            self.body_len[i] = <int32_t>PyBytes_GET_SIZE(body)
            self.props_p[i] = pp
            self.props_len[i] = <int32_t>plen
            self.flags[i] = flag
            size += 22 + self.body_len[i] + plen
            self.sizes[i] = mq_record_length(self.body_len[i], topic_len, plen, sys_flag, False)
            self.total += self.sizes[i]
        if size > max_message_size:
            return MQ_PUT_MESSAGE_ILLEGAL, f"batch is {size} bytes, more than max_message_size={max_message_size}"
        return None

    cdef object from_body(self, bytes body, bytes batch_b, Py_ssize_t topic_len, int sys_flag):
        """Plan a §1.10 batch body; each inner message stores its properties followed by the
        batch's (joined by \\x02 unless the inner string ends with one). None, or (status, reason)."""
        cdef const char *b = PyBytes_AS_STRING(body)
        cdef Py_ssize_t end = PyBytes_GET_SIZE(body), pos = 0, n = 0, i
        cdef Py_ssize_t batch_len = PyBytes_GET_SIZE(batch_b), plen
        cdef int32_t blen
        cdef int16_t ilen
        cdef const char *p
        cdef bytes merged
        while pos < end:  # pass 1: validate and count
            problem = batch_item_problem(b, pos, end)
            p = b + pos
            if problem is None:
                blen = mq_get_i32(p + 16)
                ilen = mq_get_i16(p + 20 + blen)
                if ilen > 0:
                    try:
                        PyUnicode_DecodeUTF8(p + 22 + blen, ilen, NULL)
                    except UnicodeDecodeError as exc:
                        problem = batch_properties_not_utf8(pos, exc)
            if problem is not None:
                return MQ_PUT_MESSAGE_ILLEGAL, f"batch body does not parse: {problem}"
            pos += 22 + blen + ilen
            n += 1
        if n == 0:
            return MQ_PUT_MESSAGE_ILLEGAL, "the batch is empty"
        self._alloc(n)
        self.keep.append(body)
        pos = 0
        for i in range(n):  # pass 2: plan each record
            p = b + pos
            blen = mq_get_i32(p + 16)
            ilen = mq_get_i16(p + 20 + blen)
            self.body_p[i] = p + 20
            self.body_len[i] = blen
            self.flags[i] = mq_get_i32(p + 12)
            if batch_len == 0:
                self.props_p[i] = p + 22 + blen
                plen = ilen
            elif ilen == 0:
                self.props_p[i] = PyBytes_AS_STRING(batch_b)
                plen = batch_len
            else:
                merged = p[22 + blen:22 + blen + ilen]
                merged = merged + (batch_b if merged.endswith(b"\x02") else b"\x02" + batch_b)
                self.keep.append(merged)
                self.props_p[i] = PyBytes_AS_STRING(merged)
                plen = PyBytes_GET_SIZE(merged)
            if plen > MQ_MAX_PROPERTIES_BYTES:
                return MQ_PUT_PROPERTIES_SIZE_EXCEEDED, (f"message {i} of the batch has properties of {plen} UTF-8 "
                                                  f"bytes, more than {MQ_MAX_PROPERTIES_BYTES}")
            self.props_len[i] = <int32_t>plen
            self.sizes[i] = mq_record_length(blen, topic_len, plen, sys_flag, False)
            self.total += self.sizes[i]
            pos += 22 + blen + ilen
        return None

    cdef int encode(self, bytes topic_b, int queue_id, int sys_flag, int64_t born_ts, bytes born_b,
                    bytes store_b, int reconsume) except -1:
        """Encode every planned record into one buffer (offsets and store timestamp are set
        in the lock)."""
        self.buf = <char *>malloc(self.total)
        if self.buf == NULL:
            raise MemoryError()
        cdef char *p = self.buf
        cdef const char *topic = PyBytes_AS_STRING(topic_b)
        cdef Py_ssize_t topic_len = PyBytes_GET_SIZE(topic_b), i
        cdef const char *born = PyBytes_AS_STRING(born_b)
        cdef const char *store = PyBytes_AS_STRING(store_b)
        with nogil:
            for i in range(self.n):
                p += encode_record_into(
                    p, topic, topic_len, self.body_p[i], self.body_len[i], self.props_p[i], self.props_len[i],
                    queue_id, self.flags[i], 0, 0, sys_flag, born_ts, born, 0, store, reconsume, 0,
                    mq_body_crc(self.body_p[i], self.body_len[i]) if self.body_len[i] else 0, False)
        return 0

    cdef list size_list(self):
        cdef Py_ssize_t i
        cdef list out = []
        for i in range(self.n):
            out.append(self.sizes[i])
        return out

    cdef void release(self) noexcept:
        free(self.sizes)
        free(self.buf)
        self.sizes = NULL
        self.buf = NULL
        self.keep = None

    def __dealloc__(self):
        free(self.sizes)
        free(self.buf)

cdef class CommitLogAppender:
    """The put path of one process over a store's control block and CommitLog files."""

    cdef char *ctl                # the store's cells (header, running flags, statistics, table)
    cdef char *lg                 # this appender's CommitLog's cells (mq_log: ctl itself for log 0)
    cdef int64_t *lhead           # that log's header line (MQ_LOG_*: its put statistics)
    cdef readonly int log_id
    cdef object ctl_obj
    cdef int lock_kind
    cdef readonly int64_t file_size
    cdef MappedFile cur_file
    cdef object cur_view
    cdef char *cur_base
    cdef TransientStorePool pool
    cdef int64_t pool_buffers
    cdef int64_t cur_from
    cdef object file_provider
    cdef int64_t max_message_size
    cdef int64_t busy_timeout_ms
    cdef int64_t sync_flush_timeout_ms
    cdef int64_t lock_hold_warn_ns
    cdef readonly bint sync_flush
    cdef bint wake_flusher
    cdef public bint closed
    cdef public bint slave
    cdef bytes store_host_b
    cdef object store_host
    cdef object last_host         # the born_host last encoded (a front passes its connection's one tuple)
    cdef bytes last_host_b
    cdef object last_topic
    cdef set valid_topics
    cdef Py_ssize_t max_topic_length
    cdef bytes last_topic_b
    cdef bint last_topic_ok
    cdef bytes slot_topic_b
    cdef int slot_queue_id
    cdef mq_tq_slot *slot_cached
    cdef object delay_levels
    cdef int64_t block_created_ms
    cdef object space_provider    # space_provider(end): allocate the current file up to log offset end
    cdef int64_t *wstats          # this process's writer statistics cells (mq_writer_stats)
    cdef int64_t wstats_pid       # the pid they were claimed for (a forked child claims its own)
    cdef object flush_provider    # flush_provider(): flush what is written here, False if a flush is running
    cdef readonly bint sync_master  # broker_role SYNC_MASTER: a waiting put waits for a slave to hold it
    cdef int64_t slave_timeout_ms
    cdef int64_t slave_fallbehind_max

    def __init__(self, control_block, file_provider, *, int64_t file_size, int64_t max_message_size,
                 int64_t os_page_cache_busy_time_out_mills, int64_t sync_flush_timeout, bint sync_flush,
                 bint flush_commit_log_timed, store_host, int64_t lock_hold_warn_ms=500, bint slave=False,
                 delay_levels=None, pool=None, Py_ssize_t max_topic_length=MQ_MAX_TOPIC_BYTES_V1,
                 space_provider=None, flush_provider=None, bint sync_master=False, int64_t slave_timeout_ms=3000,
                 int64_t slave_fallbehind_max=256 * 1024 * 1024, int log=0):
        self.ctl_obj = control_block
        self.sync_master = sync_master
        self.slave_timeout_ms = slave_timeout_ms
        self.slave_fallbehind_max = slave_fallbehind_max
        # with a space provider, a put never writes past the control block's reserved offset:
        # the provider allocates the current file's blocks further first (a full disk is then
        # a status, never SIGBUS on a write into a hole); None: files are allocated whole
        self.space_provider = space_provider
        # SYNC_FLUSH: a waiting put flushes in its own thread when no other is flushing (no hand-off
        # to the group commit thread and back); the group commit service flushes the rest
        self.flush_provider = flush_provider
        if not 1 <= max_topic_length <= MQ_MAX_TOPIC_BYTES_V1:
            raise ValueError(f"max_topic_length={max_topic_length}: must be 1..{MQ_MAX_TOPIC_BYTES_V1}")
        self.max_topic_length = max_topic_length
        self.valid_topics = set()
        self.ctl = (<ControlBlock?>control_block)._w()
        # the CommitLog this appender writes (docs/parallel-commitlogs.md): its lock, positions
        # and flush cells; its positions are encoded offsets (log << 56 | local)
        self.lg = (<ControlBlock>control_block)._lg(log, True)
        self.lhead = mq_cell(mq_log_head(self.ctl, log), 0)
        self.log_id = log
        # which layout of the block this appender writes under: a block laid out again in place
        # (ControlBlock.create on a full disk) has a later created_ms, and then nothing is written
        self.block_created_ms = mq_load(mq_cell(self.ctl, MQ_CTL_CREATED_MS))
        self.lock_kind = <int>mq_cell(self.ctl, MQ_CTL_LOCK_KIND)[0]
        self.file_provider = file_provider
        self.file_size = file_size
        self.max_message_size = max_message_size
        self.busy_timeout_ms = os_page_cache_busy_time_out_mills
        self.sync_flush_timeout_ms = sync_flush_timeout
        self.lock_hold_warn_ns = lock_hold_warn_ms * 1000000
        self.sync_flush = sync_flush
        self.wake_flusher = sync_flush or not flush_commit_log_timed
        self.store_host = tuple(store_host)
        self.store_host_b = encode_host(self.store_host)
        self.slave = slave
        self.delay_levels = delay_levels
        self.cur_base = NULL
        self.cur_from = -1
        self.wstats = NULL
        self.wstats_pid = 0
        # transient store pool (spec §7): appends go to the file's write buffer, and the commit
        # service moves the committed position; without it committed == wrote
        self.pool = pool
        self.pool_buffers = 0 if pool is None else pool.buffers
        if pool is not None and pool.file_size != file_size:
            raise ValueError(f"the transient store pool has buffers of {pool.file_size} bytes, files are {file_size}")
        if pool is not None and pool.log != log:  # each CommitLog has its own pool
            raise ValueError(f"{pool.path} is the transient store pool of CommitLog {pool.log}, not of {log}")

    def set_current_file(self, MappedFile mapped_file not None):
        """Make mapped_file the one appends go to (called by the file provider); with the
        transient store pool, appends go to the file's buffer in the pool."""
        self.cur_file = mapped_file
        self.cur_from = mapped_file.file_from
        if self.pool is None:
            self.cur_view = mapped_file
            self.cur_base = mapped_file._w()
        else:
            self.cur_view = self.pool.buffer_view(self.cur_from)
            self.cur_base = self.pool._buffer(self.cur_from)

    def forget_current_file(self):
        self.cur_file = None
        self.cur_view = None
        self.cur_base = NULL
        self.cur_from = -1

    @property
    def current_file(self):
        return self.cur_file

    cdef inline int64_t *_writer_stats(self) noexcept:
        """The statistics cells every put updates, in this process's writer slot of the control
        block (readers sum the slots): writers on different cores keep to their own line."""
        if self.wstats_pid != _pid:
            self.wstats = mq_writer_stats(self.ctl, _pid)
            self.wstats_pid = _pid
        return self.wstats

    # -- checks before the lock (spec §9.2) -------------------------------------------------
    cdef int _check_service(self, int64_t now) except -1:
        cdef int64_t flags
        if self.closed:
            raise StoreClosedError("the store is shut down: this process called shutdown() (open it again to put)")
        if self.slave:
            return MQ_PUT_SERVICE_NOT_AVAILABLE
        flags = mq_load(mq_cell(self.ctl, MQ_CTL_RUNNING_FLAGS))
        if flags & (MQ_NOT_WRITEABLE | MQ_WRITE_LOGICS_QUEUE_ERROR | MQ_WRITE_INDEX_FILE_ERROR | MQ_DISK_FULL):
            return MQ_PUT_SERVICE_NOT_AVAILABLE
        if mq_load(&self.lhead[MQ_LOG_STATE // 8]) >= MQ_LOG_OFFLINE:  # offline or full
            return MQ_PUT_SERVICE_NOT_AVAILABLE  # this log alone: docs/parallel-commitlogs.md
        if mq_page_cache_busy(self.lg, now, self.busy_timeout_ms):
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_PAGE_CACHE_BUSY), 1)
            return MQ_PUT_OS_PAGECACHE_BUSY
        if self.pool_buffers and not self._pool_has_room(mq_load(mq_cell(self.lg, MQ_CTL_WROTE))):
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_POOL_EXHAUSTED), 1)
            return MQ_PUT_OS_PAGECACHE_BUSY
        return MQ_PUT_OK

    cdef inline bint _pool_has_room(self, int64_t wrote) noexcept:
        """The buffer of the file holding `wrote` is free: the file that used it before (the
        one pool_buffers files back) is committed to its end. RocketMQ refuses sends while
        the pool has no buffer (isTransientStorePoolDeficient), the same back-pressure. Counted
        from the log's first offset: log k's files start at k << 56."""
        cdef int64_t base = mq_log_start(self.log_id)
        cdef int64_t k = (wrote - base) // self.file_size
        return mq_load(mq_cell(self.lg, MQ_CTL_COMMITTED)) - base >= (k - self.pool_buffers + 1) * self.file_size

    cdef PutMessageResult _fail(self, int status, object detail):
        if self.closed:
            pass  # the control block may be unmapped already: no statistics
        elif status == MQ_PUT_MESSAGE_ILLEGAL:
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_MESSAGE_ILLEGAL), 1)
        elif status == MQ_PUT_PROPERTIES_SIZE_EXCEEDED:
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_PROPERTIES_SIZE_EXCEEDED), 1)
        elif status == MQ_PUT_SERVICE_NOT_AVAILABLE:
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_SERVICE_NOT_AVAILABLE), 1)
        elif status == MQ_PUT_CREATE_MAPEDFILE_FAILED:
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_CREATE_MAPPED_FILE_FAILED), 1)
        return _result(status, detail)

    cdef object _service_detail(self, int status):
        if status == MQ_PUT_OS_PAGECACHE_BUSY:
            if self.pool_buffers and not self._pool_has_room(mq_load(mq_cell(self.lg, MQ_CTL_WROTE))):
                return self._pool_detail()
            return f"a put has held the lock longer than {self.busy_timeout_ms} ms"
        if self.closed:
            return "the store is shut down"
        if self.slave:
            return "the store is a slave (broker_role=SLAVE) and does not accept puts"
        if mq_load(mq_cell(self.ctl, MQ_CTL_CREATED_MS)) != self.block_created_ms:
            return "the store was opened again by a new owner since this process attached: attach again"
        flags = mq_load(mq_cell(self.ctl, MQ_CTL_RUNNING_FLAGS))
        names = [name for name, bit in _RUNNING_FLAG_WHY if flags & bit]
        if not names and mq_load(&self.lhead[MQ_LOG_STATE // 8]) == MQ_LOG_FULL:
            return (f"CommitLog {self.log_id} is full: its disk is above disk_space_warning_level_ratio, so the "
                    "queues bound to it take no puts until the cleaner frees space; the other CommitLogs go on")
        if not names and mq_load(&self.lhead[MQ_LOG_STATE // 8]) == MQ_LOG_OFFLINE:
            err = mq_load(mq_cell(self.lg, MQ_CTL_FLUSH_LAST_ERRNO))
            return (f"CommitLog {self.log_id} is offline after an I/O error ({os.strerror(err) if err else 'unknown'}, "
                    f"flushing at offset {mq_load(mq_cell(self.lg, MQ_CTL_FLUSH_ERROR_OFFSET))}): the queues bound "
                    "to it take no puts until the store is opened again; the other CommitLogs go on")
        return f"the store is not writable: {'; '.join(names) or f'running flags 0x{flags:x}'}"

    cdef str _pool_detail(self):
        return (f"the transient store pool is exhausted: all {self.pool_buffers} buffers hold bytes not yet "
                f"committed to the CommitLog (committed {mq_load(mq_cell(self.lg, MQ_CTL_COMMITTED))}, wrote "
                f"{mq_load(mq_cell(self.lg, MQ_CTL_WROTE))}); the commit service is behind or not running")

    cdef bytes _topic_bytes(self, str topic):
        if topic is self.last_topic:
            return self.last_topic_b
        cdef bytes b = topic.encode("utf-8")
        self.last_topic = topic
        self.last_topic_b = b
        self.last_topic_ok = False
        return b

    cdef object _check_topic(self, str topic, bytes topic_b, int queue_id):
        """None if topic and queue id are valid, else the reason (TopicValidator's rule and
        max_topic_length). Topics once found valid are remembered (the last one without a
        lookup; topic_b is then its cached encoding)."""
        if queue_id < 0:
            return f"invalid queue id {queue_id}: queue ids are >= 0"
        if topic is self.last_topic and self.last_topic_ok:
            return None
        if topic in self.valid_topics:
            problem = None
        else:
            problem = topic_problem(topic, self.max_topic_length)
            if problem is not None:
                return problem
            if len(self.valid_topics) >= VALID_TOPICS_CACHED:
                self.valid_topics.clear()
            self.valid_topics.add(topic)
        if topic is self.last_topic:
            self.last_topic_ok = True
        return None

    cdef bytes _host_bytes(self, object host):
        if host is None:
            return self.store_host_b
        if host is self.last_host:  # the same tuple again: a front's connection sends many
            return self.last_host_b
        cdef bytes encoded = encode_host(tuple(host))
        if type(host) is tuple:
            self.last_host, self.last_host_b = host, encoded
        return encoded

    # -- single message ---------------------------------------------------------------------
    def put_message(self, Message msg not None) -> PutMessageResult:
        """Put one message (spec §9.2, §9.3). Returns a PutMessageResult; never raises for a
        bad message (the status names the cause). StoreClosedError after this process shut
        the store down (a store whose owner shut down answers SERVICE_NOT_AVAILABLE)."""
        cdef int status = self._check_service(mq_now_ms_coarse())
        if status != MQ_PUT_OK:
            return self._fail(status, self._service_detail(status))
        mq_add_relaxed(&self._writer_stats()[MQ_STAT_PUT_REQUESTS], 1)
        cdef str topic = msg.topic
        cdef int queue_id = msg.queue_id
        cdef dict props = msg._properties
        cdef int sys_flag = msg.sys_flag
        cdef int tx = sys_flag & MQ_TRANSACTION_TYPE_MASK
        cdef bint wait = True
        cdef bytes props_b = b""
        if props:
            wait = wait_store_msg_ok(props)
            if "DELAY" in props and tx != MQ_TRANSACTION_PREPARED_TYPE and tx != MQ_TRANSACTION_ROLLBACK_TYPE:
                topic, queue_id, props = self._schedule(topic, queue_id, props)
            encoded = self._properties_bytes(props)
            if type(encoded) is not bytes:
                return encoded
            props_b = <bytes>encoded
        cdef bytes topic_b = self._topic_bytes(topic) if topic is not None else b""
        problem = self._check_topic(topic, topic_b, queue_id)
        if problem is not None:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, problem)
        cdef bytes body = msg.body
        cdef Py_ssize_t body_len = PyBytes_GET_SIZE(body)
        if body_len > self.max_message_size:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"body is {body_len} bytes, more than max_message_size={self.max_message_size}")
        cdef bytes born_b = self._host_bytes(msg.born_host)
        sys_flag = with_host_flags(sys_flag, PyBytes_GET_SIZE(born_b), PyBytes_GET_SIZE(self.store_host_b))
        cdef int total = mq_record_length(body_len, PyBytes_GET_SIZE(topic_b), PyBytes_GET_SIZE(props_b), sys_flag, False)
        if total > self.max_message_size + 65536:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"record is {total} bytes, more than max_message_size + 64 KiB")
        if total + MQ_END_FILE_MIN_BLANK_LENGTH > self.file_size:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"record of {total} bytes can never fit in a CommitLog file of "
                              f"{self.file_size} bytes (it needs 8 spare bytes for the end-of-file blank)")
        cdef char stack_buf[STACK_RECORD]
        cdef char *rec = &stack_buf[0]
        if total > STACK_RECORD:
            rec = <char *>malloc(total)
        if rec == NULL:
            raise MemoryError()
        cdef int64_t born_ts = msg.born_timestamp  # 0: "now", set to the store timestamp in the lock
        cdef int32_t crc = mq_body_crc(PyBytes_AS_STRING(body), body_len) if body_len else 0
        cdef AppendOut out
        cdef int32_t rec_size = total
        try:
            encode_record_into(rec, PyBytes_AS_STRING(topic_b), PyBytes_GET_SIZE(topic_b), PyBytes_AS_STRING(body),
                               body_len, PyBytes_AS_STRING(props_b), PyBytes_GET_SIZE(props_b), queue_id, msg.flag,
                               0, 0, sys_flag, born_ts, PyBytes_AS_STRING(born_b), 0,
                               PyBytes_AS_STRING(self.store_host_b), msg.reconsume_times,
                               msg.prepared_transaction_offset, crc, False)
            status = self._append(rec, total, 1, &rec_size, topic_b, queue_id, sys_flag, born_ts == 0, &out)
        finally:
            if rec != &stack_buf[0]:
                free(rec)
        return self._finish(status, &out, 1, None, wait)

    cdef object _properties_bytes(self, dict props):
        """The stored properties string of props as UTF-8 bytes, or the failed PutMessageResult
        saying why it cannot be stored (put_message, put_bodies)."""
        try:
            props_s = checked_properties_string(props)
        except ValueError as exc:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, str(exc))
        cdef Py_ssize_t props_chars = utf16_length(props_s)
        if props_chars > 32767:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"properties string is {props_chars} characters, more than 32767")
        cdef bytes props_b = props_s.encode("utf-8")
        if PyBytes_GET_SIZE(props_b) > MQ_MAX_PROPERTIES_BYTES:
            return self._fail(MQ_PUT_PROPERTIES_SIZE_EXCEEDED, f"properties are {PyBytes_GET_SIZE(props_b)} UTF-8 "
                              f"bytes, more than {MQ_MAX_PROPERTIES_BYTES}")
        return props_b

    cdef tuple _schedule(self, str topic, int queue_id, dict props):
        """Delay messages go to SCHEDULE_TOPIC_XXXX, queue level-1 (spec §9.2 step 4)."""
        cdef int level = delay_level(props)
        if level <= 0:
            return topic, queue_id, props
        props = dict(props)
        props["REAL_TOPIC"] = topic
        props["REAL_QID"] = str(queue_id)
        props["DELAY"] = str(level)
        return SCHEDULE_TOPIC, level - 1, props

    # -- batch (spec §9.4) ---------------------------------------------------------------------
    def put_messages(self, batch) -> PutMessageResult:
        """Put a batch: a MessageBatch (client batch body) or a list of Messages of one topic and
        queue. All records get consecutive queue and physical offsets and one store timestamp.
        StoreClosedError after this process shut the store down."""
        cdef int status = self._check_service(mq_now_ms_coarse())
        if status != MQ_PUT_OK:
            return self._fail(status, self._service_detail(status))
        mq_add_relaxed(&self._writer_stats()[MQ_STAT_PUT_REQUESTS], 1)
        cdef list msgs = None
        cdef MessageBatch mb = None
        cdef Message first
        cdef str topic
        cdef int queue_id, sys_flag, reconsume
        cdef int64_t born_ts
        cdef dict batch_props
        if isinstance(batch, MessageBatch):
            mb = <MessageBatch>batch
            topic, queue_id, sys_flag, born_ts, born_host, reconsume = (
                mb.topic, mb.queue_id, mb.sys_flag, mb.born_timestamp, mb.born_host, mb.reconsume_times)
            batch_props = mb.properties
            if mb.body is None or PyBytes_GET_SIZE(mb.body) > self.max_message_size:
                return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"batch body is {0 if mb.body is None else len(mb.body)} bytes, "
                                  f"more than max_message_size={self.max_message_size}")
        else:
            msgs = batch if type(batch) is list else list(batch)
            if not msgs:
                return self._fail(MQ_PUT_MESSAGE_ILLEGAL, "the batch is empty")
            first = <Message?>msgs[0]
            topic, queue_id, sys_flag, born_ts, born_host, reconsume = (
                first.topic, first.queue_id, first.sys_flag, first.born_timestamp, first.born_host,
                first.reconsume_times)
            batch_props = None
        cdef bint wait = wait_store_msg_ok(batch_props)
        if batch_props:
            if int(batch_props.get("DELAY", "0") or 0) > 0:
                return self._fail(MQ_PUT_MESSAGE_ILLEGAL, "batch messages cannot be delay messages")
        if sys_flag & MQ_TRANSACTION_TYPE_MASK:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, "batch messages cannot be transaction messages")
        cdef bytes topic_b = self._topic_bytes(topic) if topic is not None else b""
        problem = self._check_topic(topic, topic_b, queue_id)
        if problem is not None:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, problem)
        cdef bytes batch_b = b""
        if batch_props:
            try:
                batch_b = checked_properties_string(batch_props).encode("utf-8")
            except ValueError as exc:
                return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"batch properties: {exc}")
        if PyBytes_GET_SIZE(batch_b) > MQ_MAX_PROPERTIES_BYTES:
            return self._fail(MQ_PUT_PROPERTIES_SIZE_EXCEEDED, "batch properties are more than 32767 UTF-8 bytes")
        cdef bytes born_b = self._host_bytes(born_host)
        sys_flag = with_host_flags(sys_flag, PyBytes_GET_SIZE(born_b), PyBytes_GET_SIZE(self.store_host_b))
        cdef BatchPlan plan = BatchPlan()
        try:
            if mb is not None:
                problem = plan.from_body(mb.body, batch_b, PyBytes_GET_SIZE(topic_b), sys_flag)
            else:
                problem = plan.from_messages(msgs, topic, queue_id, PyBytes_GET_SIZE(topic_b), sys_flag,
                                             self.max_message_size)
            if problem is not None:
                return self._fail(problem[0], problem[1])
            return self._put_planned(plan, topic_b, queue_id, sys_flag, born_ts, born_b, reconsume, wait)
        finally:
            plan.release()

    cdef PutMessageResult _put_planned(self, BatchPlan plan, bytes topic_b, int queue_id, int sys_flag,
                                       int64_t born_ts, bytes born_b, int reconsume, bint wait):
        """Encode a planned batch and append it (put_messages, put_bodies)."""
        cdef AppendOut out
        if plan.total + MQ_END_FILE_MIN_BLANK_LENGTH > self.file_size:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, f"batch of {plan.total} bytes can never fit in a CommitLog file "
                              f"of {self.file_size} bytes")
        plan.encode(topic_b, queue_id, sys_flag, born_ts, born_b, self.store_host_b, reconsume)
        cdef int status = self._append(plan.buf, plan.total, plan.n, plan.sizes, topic_b, queue_id, sys_flag,
                                       born_ts == 0, &out)
        record_sizes = plan.size_list() if status == MQ_PUT_OK or status == MQ_PUT_FLUSH_DISK_TIMEOUT else None
        return self._finish(status, &out, plan.n, record_sizes, wait)

    def put_bodies(self, str topic, bodies, int queue_id=0, *, tags=None, properties=None, int flag=0):
        """Put many bodies of one topic and queue as one batch, without a Message each: every
        record gets the same properties (``properties`` and TAGS=tags) and flag, consecutive
        queue offsets and one store timestamp, like put_messages. Returns its PutMessageResult;
        the statuses and limits are put_messages' (the whole batch <= max_message_size)."""
        cdef int status = self._check_service(mq_now_ms_coarse())
        if status != MQ_PUT_OK:
            return self._fail(status, self._service_detail(status))
        mq_add_relaxed(&self._writer_stats()[MQ_STAT_PUT_REQUESTS], 1)
        cdef list items = bodies if type(bodies) is list else list(bodies)
        if not items:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, "the batch is empty")
        cdef dict props = dict(properties) if properties else {}
        if tags is not None:
            props["TAGS"] = tags
        if "DELAY" in props:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, "batch messages cannot be delay messages")
        cdef bint wait = wait_store_msg_ok(props)
        cdef bytes props_b = b""
        if props:
            encoded = self._properties_bytes(props)
            if type(encoded) is not bytes:
                return encoded
            props_b = <bytes>encoded
        cdef bytes topic_b = self._topic_bytes(topic) if topic is not None else b""
        problem = self._check_topic(topic, topic_b, queue_id)
        if problem is not None:
            return self._fail(MQ_PUT_MESSAGE_ILLEGAL, problem)
        cdef bytes born_b = self._host_bytes(None)
        cdef int sys_flag = with_host_flags(0, PyBytes_GET_SIZE(born_b), PyBytes_GET_SIZE(self.store_host_b))
        cdef BatchPlan plan = BatchPlan()
        try:
            problem = plan.from_bodies(items, props_b, flag, PyBytes_GET_SIZE(topic_b), sys_flag, self.max_message_size)
            if problem is not None:
                return self._fail(problem[0], problem[1])
            return self._put_planned(plan, topic_b, queue_id, sys_flag, 0, born_b, 0, wait)
        finally:
            plan.release()

    # -- a slave's appends (CommitLog.appendData) ----------------------------------------------------
    def append_data(self, int64_t phy_offset, data) -> int:
        """A slave appends what its master sent (HAClient -> DefaultMessageStore.appendToCommitLog):
        the master's CommitLog bytes from phy_offset, which must be this log's end (the wrote
        position), else ValueError (the caller drops the connection, as HAClient does on an
        offset mismatch). The bytes go into the mapped files at the same positions, the next
        file mapped or created through the file provider when they reach it (the master never
        sends a chunk across a file's end, but nothing here relies on it).

        The wrote position moves to the end of the bytes: that is what the slave reports to its
        master. The committed position, which the flusher and the dispatcher follow, moves to the
        end of the last whole record (a chunk may end inside a record, and the dispatcher must
        never read half of one); an END_OF_FILE record takes it to the file's end once the file's
        bytes are all here. Returns the new wrote position. Puts are refused on a slave; this
        takes the put lock all the same, so nothing else writes meanwhile."""
        if self.closed:
            raise StoreClosedError("the store is shut down: this process called shutdown()")
        cdef const unsigned char[::1] v = memoryview(data).cast("B")
        cdef Py_ssize_t n = v.shape[0]
        cdef Py_ssize_t done = 0
        cdef char *ctl = self.ctl
        cdef char *lg = self.lg
        cdef int64_t wrote = mq_load(mq_cell(lg, MQ_CTL_WROTE))
        cdef int64_t file_pos, chunk, need = 0
        cdef int want  # 0 copied, 1 a file, 2 disk space, 3 fenced
        if phy_offset != wrote:
            raise ValueError(f"the master sent bytes from CommitLog offset {phy_offset}, but this log ends at {wrote}")
        while done < n:
            self._lock()
            want = 0
            wrote = mq_load(mq_cell(lg, MQ_CTL_WROTE))
            file_pos = wrote - self.cur_from
            if (mq_load(mq_cell(ctl, MQ_CTL_RUNNING_FLAGS)) & MQ_NOT_WRITEABLE
                    or mq_load(mq_cell(ctl, MQ_CTL_CREATED_MS)) != self.block_created_ms):
                want = 3
            elif self.cur_base == NULL or wrote < self.cur_from or file_pos >= self.file_size:
                want = 1
                need = wrote
            else:
                chunk = min(<int64_t>(n - done), self.file_size - file_pos)
                if self.space_provider is not None and mq_load(mq_cell(lg, MQ_CTL_RESERVED)) < wrote + chunk:
                    want = 2
                    need = wrote + chunk
                else:
                    memcpy(self.cur_base + file_pos, &v[done], chunk)
                    mq_store(mq_cell(lg, MQ_CTL_WROTE), wrote + chunk)
                    done += chunk
                    try:
                        self._commit_whole_records(wrote + chunk)
                    except BaseException:
                        mq_put_unlock(lg, self.lock_kind)
                        raise
            mq_put_unlock(lg, self.lock_kind)
            if want == 3:
                raise StoreClosedError("the store is not writable: its owner stopped writers (shutdown or a new owner)")
            if want:
                detail = self.file_provider(need) if want == 1 else self.space_provider(need)
                if detail is not None:
                    raise OSError(f"cannot append the master's bytes at CommitLog offset {need}: {detail}")
        mq_wake_idle_dispatcher(ctl, lg, self.log_id)
        if self.wake_flusher:
            mq_notify(lg, MQ_CH_FLUSH)
        return mq_load(mq_cell(lg, MQ_CTL_WROTE))

    def drop_partial_tail(self) -> int:
        """A slave stopping: the bytes past its last whole record (a record the master had not
        finished sending) are zeroed and the wrote position goes back to the committed one, so
        the log ends at a record's end; the slave asks for them again when it reconnects.
        Returns how many bytes were dropped."""
        if self.closed:
            return 0
        cdef char *ctl = self.ctl
        cdef char *lg = self.lg
        self._lock()
        cdef int64_t wrote = mq_load(mq_cell(lg, MQ_CTL_WROTE))
        cdef int64_t committed = mq_load(mq_cell(lg, MQ_CTL_COMMITTED))
        cdef int64_t dropped = 0
        if (wrote > committed and self.cur_base != NULL and committed >= self.cur_from
                and wrote <= self.cur_from + self.file_size):
            memset(self.cur_base + (committed - self.cur_from), 0, wrote - committed)
            mq_store(mq_cell(lg, MQ_CTL_WROTE), committed)
            dropped = wrote - committed
        mq_put_unlock(lg, self.lock_kind)
        return dropped

    cdef _commit_whole_records(self, int64_t wrote):
        """Move committed over the whole records of the current file below wrote (scan_records
        also raises each queue's next offset in the topic-queue table, as a put would have); an
        END_OF_FILE record takes it to the file's end once the file's bytes are all here. The
        put lock is held."""
        cdef char *ctl = self.ctl
        cdef char *lg = self.lg
        cdef int64_t file_end = self.cur_from + self.file_size
        cdef int64_t old = mq_load(mq_cell(lg, MQ_CTL_COMMITTED))
        if old < self.cur_from:
            old = self.cur_from  # the file before ended with its END_OF_FILE record (no record crosses a file)
        stop, reason, _, last_ts = scan_records(self.cur_view, self.cur_from, old - self.cur_from,
                                                wrote - self.cur_from, False, self.ctl_obj)
        cdef int64_t c = file_end if reason == "blank" and wrote >= file_end else self.cur_from + stop
        if c > old:
            mq_store(mq_cell(lg, MQ_CTL_COMMITTED), c)
        if last_ts > 0:
            mq_store(mq_cell(lg, MQ_CTL_LAST_STORE_TS), last_ts)

    # -- the locked section -----------------------------------------------------------------------
    cdef int _append(self, char *rec, int64_t total, int n, int32_t *sizes, bytes topic_b, int queue_id,
                     int sys_flag, bint born_now, AppendOut *out) except -1:
        """Append pre-encoded records, mapping/allocating the next file outside the lock when
        needed. Returns a PutMessageStatus code."""
        cdef int r
        cdef int attempts = 0
        while True:
            r = self._append_locked(rec, total, n, sizes, topic_b, queue_id, sys_flag, born_now, out)
            if r == APPEND_OK:
                return MQ_PUT_OK
            if r == APPEND_TABLE_FULL:
                self._detail = (f"topic-queue table is full ({mq_cell(self.ctl, MQ_CTL_TABLE_SLOTS)[0]} slots); "
                                "raise topic_queue_table_slots")
                return MQ_PUT_UNKNOWN_ERROR
            if r == APPEND_NOT_WRITEABLE:
                self._detail = self._service_detail(MQ_PUT_SERVICE_NOT_AVAILABLE)
                return MQ_PUT_SERVICE_NOT_AVAILABLE
            if r == APPEND_NEED_SPACE:
                detail = self.space_provider(out.need_offset)
                if detail is not None:
                    self._detail = detail
                    return MQ_PUT_CREATE_MAPEDFILE_FAILED
                attempts += 1
                if attempts > 64:
                    self._detail = "could not reserve disk space in the current CommitLog file after 64 attempts"
                    return MQ_PUT_UNKNOWN_ERROR
                continue
            if r == APPEND_POOL_EXHAUSTED:
                mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_POOL_EXHAUSTED), 1)
                self._detail = self._pool_detail()
                return MQ_PUT_OS_PAGECACHE_BUSY
            attempts += 1
            if attempts > 64:
                self._detail = "could not reach a CommitLog file with room after 64 attempts"
                return MQ_PUT_UNKNOWN_ERROR
            # END_OF_FILE (the blank is written, the file is full) or NEED_FILE: map the file
            # that holds the write position, outside the lock
            detail = self.file_provider(out.need_offset)
            if detail is not None:
                self._detail = detail
                return MQ_PUT_CREATE_MAPEDFILE_FAILED

    cdef object _detail

    cdef int _lock(self) except -1:
        cdef int r = mq_put_trylock(self.lg, self.lock_kind, (_pid << 32) | (<int64_t>pthread_self() & 0xFFFFFFFF))
        cdef int64_t token
        if r == EBUSY:
            mq_add_relaxed(&self.lhead[MQ_LOG_WAITS // 8], 1)
            token = (_pid << 32) | (<int64_t>pthread_self() & 0xFFFFFFFF)
            with nogil:
                r = mq_put_lock(self.lg, self.lock_kind, token)
        if r == EOWNERDEAD:
            mq_add_relaxed(mq_stat(self.ctl, MQ_STAT_LOCK_TAKEOVERS), 1)
            mq_add_relaxed(mq_cell(self.lg, MQ_CTL_LOCK_TAKEOVERS), 1)
            self._repair_after_takeover()
            return 0
        if r != 0:
            raise OSError(r, f"cannot take the put lock: {os.strerror(r)}")
        return 0

    cdef _repair_after_takeover(self):
        """A writer died holding the lock. It publishes the write position before the queue
        offset, so the only half-done state is a published record whose queue offset was not
        counted: re-count the records between its entry position and the write position."""
        cdef int64_t entry = mq_load(mq_cell(self.lg, MQ_CTL_LOCK_ENTRY_WROTE))
        cdef int64_t wrote = mq_load(mq_cell(self.lg, MQ_CTL_WROTE))
        if wrote <= entry or self.cur_base == NULL or entry < self.cur_from or wrote > self.cur_from + self.file_size:
            return
        try:
            scan_records(self.cur_view, self.cur_from, entry - self.cur_from, wrote - self.cur_from, False, self.ctl_obj)
        except OverflowError:
            pass  # a full table: the put that follows reports it with its status

    cdef mq_tq_slot *_slot(self, bytes topic_b, int queue_id):
        """The topic-queue table slot of (topic, queue), remembered for the last pair: slots
        never move once inserted. Called with the put lock held; NULL when the table is full."""
        if topic_b is self.slot_topic_b and queue_id == self.slot_queue_id and self.slot_cached != NULL:
            return self.slot_cached
        cdef mq_tq_slot *slot = mq_tq_get_or_insert(self.ctl, PyBytes_AS_STRING(topic_b), PyBytes_GET_SIZE(topic_b),
                                                    queue_id)
        if slot != NULL:
            self.slot_topic_b = topic_b
            self.slot_queue_id = queue_id
            self.slot_cached = slot
        return slot

    cdef int _append_locked(self, char *rec, int64_t total, int n, int32_t *sizes, bytes topic_b, int queue_id,
                            int sys_flag, bint born_now, AppendOut *out) except -1:
        """The locked section: assign queue offsets, physical offsets and the store timestamp
        (also the born timestamp when born_now), copy, publish. Counters written here are only
        ever written under the put lock, so they take plain stores (mq_add_owned)."""
        cdef char *ctl = self.ctl
        cdef char *lg = self.lg
        cdef int64_t *ws = self._writer_stats()  # claimed before the lock: it may scan the slots
        self._lock()
        cdef int64_t begin_ns = mq_now_ns()
        cdef int64_t begin_ms = begin_ns // 1000000
        mq_store_relaxed(mq_cell(lg, MQ_CTL_LOCK_OWNER_PID), _pid)
        mq_store(mq_cell(lg, MQ_CTL_LOCK_BEGIN_MS), begin_ms)
        cdef int64_t wrote = mq_load(mq_cell(lg, MQ_CTL_WROTE))
        mq_store_relaxed(mq_cell(lg, MQ_CTL_LOCK_ENTRY_WROTE), wrote)
        cdef int64_t file_pos = wrote - self.cur_from
        cdef int64_t remaining, acc, q, hold, need
        cdef int i, tx, ts_pos
        cdef bint advance
        cdef mq_tq_slot *slot
        cdef char *r
        cdef int result = APPEND_OK
        if (mq_load(mq_cell(ctl, MQ_CTL_RUNNING_FLAGS)) & MQ_NOT_WRITEABLE
                or mq_load(mq_cell(ctl, MQ_CTL_CREATED_MS)) != self.block_created_ms):
            # the owner stopped writers (shutdown, or a new owner fenced this block) after this
            # put's check: nothing may be written once it holds the lock
            result = APPEND_NOT_WRITEABLE
        elif self.cur_base == NULL or wrote < self.cur_from or file_pos >= self.file_size:
            out.need_offset = wrote
            result = APPEND_NEED_FILE
        elif self.pool_buffers and not self._pool_has_room(wrote):
            result = APPEND_POOL_EXHAUSTED
        else:
            slot = self._slot(topic_b, queue_id)
            if slot == NULL:
                result = APPEND_TABLE_FULL
            else:
                remaining = self.file_size - file_pos
                # the bytes this append writes: its records and room for the next blank, or the blank
                need = wrote + (total + MQ_END_FILE_MIN_BLANK_LENGTH if total + MQ_END_FILE_MIN_BLANK_LENGTH <= remaining
                                else MQ_END_FILE_MIN_BLANK_LENGTH)
                if self.space_provider is not None and mq_load(mq_cell(lg, MQ_CTL_RESERVED)) < need:
                    out.need_offset = need
                    result = APPEND_NEED_SPACE
                elif total + MQ_END_FILE_MIN_BLANK_LENGTH > remaining:
                    # spec §1.7: blank record, file full, the put goes to the next file
                    mq_put_i32(self.cur_base + file_pos, <int32_t>remaining)
                    mq_put_i32(self.cur_base + file_pos + 4, MQ_BLANK_MAGIC_CODE)
                    mq_store(mq_cell(lg, MQ_CTL_WROTE), self.cur_from + self.file_size)
                    if not self.pool_buffers:
                        mq_store(mq_cell(lg, MQ_CTL_COMMITTED), self.cur_from + self.file_size)
                    mq_add_owned(&ws[MQ_STAT_ROLLS], 1)
                    out.need_offset = self.cur_from + self.file_size
                    result = APPEND_END_OF_FILE
                else:
                    tx = sys_flag & MQ_TRANSACTION_TYPE_MASK
                    advance = tx != MQ_TRANSACTION_PREPARED_TYPE and tx != MQ_TRANSACTION_ROLLBACK_TYPE
                    q = mq_load(&slot.next_offset) if advance else 0
                    ts_pos = store_timestamp_pos(sys_flag)
                    r = rec
                    acc = 0
                    for i in range(n):
                        mq_put_i64(r + MQ_POS_QUEUEOFFSET, q + i if advance else 0)
                        mq_put_i64(r + MQ_POS_PHYSICALOFFSET, wrote + acc)
                        mq_put_i64(r + ts_pos, begin_ms)
                        if born_now:
                            mq_put_i64(r + MQ_POS_BORNTIMESTAMP, begin_ms)
                        acc += sizes[i]
                        r += sizes[i]
                    memcpy(self.cur_base + file_pos, rec, total)
                    if self.sync_flush:
                        # a flush failing from here on may have covered these records: read before
                        # they are published, so a later msync that succeeds over pages the kernel
                        # already failed to write (and marked clean) cannot turn the put into PUT_OK
                        out.flush_errors = mq_load(mq_cell(lg, MQ_CTL_FLUSH_ERROR_COUNT))
                    # publish the write position before the queue offset (see _repair_after_takeover)
                    mq_store(mq_cell(lg, MQ_CTL_WROTE), wrote + total)
                    if not self.pool_buffers:  # no transient pool: committed == wrote
                        mq_store(mq_cell(lg, MQ_CTL_COMMITTED), wrote + total)
                    if advance:
                        mq_store(&slot.next_offset, q + n)
                    mq_store(mq_cell(lg, MQ_CTL_LAST_STORE_TS), begin_ms)
                    out.wrote_offset = wrote
                    out.wrote_bytes = total
                    out.queue_offset = q
                    out.store_timestamp = begin_ms
                    mq_add_owned(&ws[MQ_STAT_PUT_MESSAGES], n)
                    mq_add_owned(&ws[MQ_STAT_PUT_BYTES], total)
                    mq_add_owned(&self.lhead[MQ_LOG_PUTS // 8], n)  # the log's cells: its lock is held
                    mq_add_owned(&self.lhead[MQ_LOG_BYTES // 8], total)
        hold = mq_now_ns() - begin_ns  # wall clock, as RocketMQ's beginTimeInLock; a clock step counts 0
        if hold < 0:
            hold = 0
        mq_add_owned(&ws[MQ_STAT_LOCK_ACQUIRES], 1)
        mq_add_owned(&ws[MQ_STAT_LOCK_HOLD_NS_TOTAL], hold)
        mq_add_owned(&self.lhead[MQ_LOG_HOLD_NS_TOTAL // 8], hold)
        if hold > self.lhead[MQ_LOG_HOLD_NS_MAX // 8]:
            mq_store_relaxed(&self.lhead[MQ_LOG_HOLD_NS_MAX // 8], hold)
        if hold > ws[MQ_STAT_LOCK_HOLD_NS_MAX]:
            mq_max(&ws[MQ_STAT_LOCK_HOLD_NS_MAX], hold)
        if hold > self.lock_hold_warn_ns:
            mq_add_owned(&ws[MQ_STAT_LOCK_HOLD_WARNS], 1)
        mq_store(mq_cell(lg, MQ_CTL_LOCK_BEGIN_MS), 0)
        mq_put_unlock(lg, self.lock_kind)
        return result

    # -- after the lock: flush handling (spec §8.2) -------------------------------------------------
    cdef PutMessageResult _finish(self, int status, AppendOut *out, int n, object record_sizes, bint wait):
        if status != MQ_PUT_OK:
            detail = self._detail
            self._detail = None
            return self._fail(status, detail)
        cdef PutMessageResult res = PutMessageResult.__new__(PutMessageResult)
        res.c_status = MQ_PUT_OK
        res.c_wrote_offset = out.wrote_offset
        res.c_wrote_bytes = out.wrote_bytes
        res.c_queue_offset = out.queue_offset
        res.c_store_timestamp = out.store_timestamp
        res.c_msg_num = n
        res._store_host = self.store_host_b
        res._record_sizes = record_sizes
        if not self.pool_buffers:  # with the pool, the commit that makes the put readable wakes it
            mq_wake_idle_dispatcher(self.ctl, self.lg, self.log_id)
            mq_ha_data(self.lg)
        if self.pool_buffers:
            mq_notify(self.lg, MQ_CH_COMMIT)  # RocketMQ wakes the commit service, which wakes the flush
        elif self.sync_flush:
            if wait:
                self._wait_flushed(res, out.wrote_offset + out.wrote_bytes, out.flush_errors)
            else:
                mq_notify(self.lg, MQ_CH_FLUSH)
        elif self.wake_flusher:
            mq_notify(self.lg, MQ_CH_FLUSH)
        if self.sync_master and wait:
            self._wait_replicated(res, out.wrote_offset + out.wrote_bytes)
        return res

    cdef _wait_replicated(self, PutMessageResult res, int64_t end):
        """SYNC_MASTER (CommitLog.submitReplicaRequest, GroupTransferService): with a slave
        connected and less than ha_slave_fallbehind_max behind, wait until the confirmed
        position (what a slave reported holding) passes `end`: PUT_OK, or FLUSH_SLAVE_TIMEOUT
        after slave_timeout; else SLAVE_NOT_AVAILABLE at once. Every put waiting wakes on the
        one broadcast the HA service makes when a slave reports, so the waits batch like group
        commit. The replication status wins over the flush's, as in 4.9.7's putMessage."""
        cdef char *ctl = self.ctl
        cdef char *lg = self.lg
        cdef int64_t *confirmed = mq_cell(lg, MQ_CTL_CONFIRMED)
        cdef uint32_t *seq = <uint32_t *>(lg + MQ_CTL_HA_SEQ)
        cdef int64_t slaves = mq_load(mq_cell(lg, MQ_CTL_HA_SLAVES))
        cdef int64_t behind = end - mq_load(confirmed)
        if slaves <= 0 or behind >= self.slave_fallbehind_max:
            res.c_status = MQ_PUT_SLAVE_NOT_AVAILABLE
            res.c_detail = ("no slave is connected to the master's HA service" if slaves <= 0 else
                            f"the slave is {behind} bytes behind (ha_slave_fallbehind_max={self.slave_fallbehind_max})")
            return
        cdef int64_t deadline = mq_mono_ns() + self.slave_timeout_ms * 1000000
        cdef int64_t left
        cdef uint32_t s
        with nogil:
            while True:
                s = mq_load32(seq)
                if mq_load(confirmed) >= end:
                    break
                left = deadline - mq_mono_ns()
                if left <= 0:
                    break
                mq_futex_wait(seq, s, left if left < 100000000 else 100000000)
        if mq_load(confirmed) < end:
            res.c_status = MQ_PUT_FLUSH_SLAVE_TIMEOUT
            res.c_detail = (f"no slave reported holding it within slave_timeout={self.slave_timeout_ms} ms "
                            f"(confirmed {mq_load(confirmed)}, the put ends at {end})")

    cdef _wait_flushed(self, PutMessageResult res, int64_t end, int64_t errors0):
        """Group commit: ask the flusher for `end` and wait until the flushed position passes it,
        or a flush fails, or sync_flush_timeout passes (FLUSH_DISK_TIMEOUT). `errors0` is the flush
        error count read before the records were published: any flush failure after it may have
        covered them, and the put is then FLUSH_DISK_TIMEOUT even if a later flush succeeds."""
        cdef char *ctl = self.ctl
        cdef char *lg = self.lg
        cdef int64_t *flushed = mq_cell(lg, MQ_CTL_FLUSHED)
        cdef int64_t t0 = mq_mono_ns()
        cdef int64_t deadline = t0 + self.sync_flush_timeout_ms * 1000000
        cdef int64_t left
        cdef uint32_t *seq = mq_ch_seq(lg, MQ_CH_FLUSHED)
        cdef uint32_t s
        cdef int64_t *errors = mq_cell(lg, MQ_CTL_FLUSH_ERROR_COUNT)
        cdef bint failed
        mq_add_relaxed(mq_stat(ctl, MQ_STAT_GROUP_COMMIT_WAITS), 1)
        mq_max(mq_cell(lg, MQ_CTL_FLUSH_REQUEST_UPTO), end)
        cdef int tries = 0
        if self.flush_provider is not None:
            while tries < 3 and mq_load(flushed) < end and mq_load(errors) == errors0:
                tries += 1
                if not self.flush_provider():
                    break  # another thread is flushing: wait for it below
        with nogil:
            mq_notify(lg, MQ_CH_FLUSH)
            while True:
                s = mq_load32(seq)
                if mq_load(flushed) >= end:
                    break
                if mq_load(errors) != errors0:
                    break
                left = deadline - mq_mono_ns()
                if left <= 0:
                    break
                mq_futex_wait(seq, s, left if left < 100000000 else 100000000)
        mq_add_relaxed(mq_stat(ctl, MQ_STAT_FLUSH_WAIT_NS_TOTAL), mq_mono_ns() - t0)
        failed = mq_load(errors) != errors0  # a failure after the records were published, even if a later flush passed
        if failed or mq_load(flushed) < end:
            mq_add_relaxed(mq_stat(ctl, MQ_STAT_FLUSH_TIMEOUTS), 1)
            res.c_status = MQ_PUT_FLUSH_DISK_TIMEOUT
            if failed:
                err = mq_load(mq_cell(lg, MQ_CTL_FLUSH_LAST_ERRNO))
                res.c_detail = f"the flush failed: {os.strerror(err)} (errno {err})"
            else:
                res.c_detail = f"not flushed within sync_flush_timeout={self.sync_flush_timeout_ms} ms"


# -- several CommitLogs (docs/parallel-commitlogs.md) -------------------------------------------
cdef class LogRouter:
    """The put path of a store with several CommitLogs: each put goes to the appender of the
    CommitLog its queue is bound to (mq_log_of_queue: FNV-1a 64 of the topic plus the queue id,
    modulo the count), the queue it is stored under deciding: a delayed message is stored in
    SCHEDULE_TOPIC_XXXX's queue level - 1, so it goes to that queue's log (and the delay
    service's re-put of it to its real queue's). A put the appender refuses (a bad topic, a
    body too large) is refused by whichever appender it reaches, with the same status."""

    cdef readonly list appenders
    cdef int count
    cdef object last_topic
    cdef bytes last_topic_b

    def __init__(self, appenders):
        self.appenders = list(appenders)
        self.count = len(self.appenders)
        if not 1 <= self.count <= MQ_LOG_MAX:
            raise ValueError(f"{self.count} appenders: a store has 1 .. {MQ_LOG_MAX} CommitLogs")
        self.last_topic = None
        self.last_topic_b = b""

    cpdef int log_of(self, object topic, int queue_id):
        """The CommitLog a put to topic/queue_id is written to (0 for a topic that is not a str
        or does not encode: the appender refuses it)."""
        if type(topic) is not str:
            return 0
        if topic is not self.last_topic:
            try:
                self.last_topic_b = (<str>topic).encode("utf-8")
            except UnicodeEncodeError:
                return 0
            self.last_topic = topic
        return mq_log_of_queue(PyBytes_AS_STRING(self.last_topic_b), <int>PyBytes_GET_SIZE(self.last_topic_b),
                               queue_id, self.count)

    cdef CommitLogAppender _appender_of(self, Message msg):
        cdef object topic = msg.topic
        cdef int queue_id = msg.queue_id
        cdef dict props = msg._properties
        cdef int tx, level
        if props and "DELAY" in props:
            tx = msg.sys_flag & MQ_TRANSACTION_TYPE_MASK
            if tx != MQ_TRANSACTION_PREPARED_TYPE and tx != MQ_TRANSACTION_ROLLBACK_TYPE:
                level = delay_level(props)
                if level > 0:
                    topic, queue_id = SCHEDULE_TOPIC, level - 1
        return <CommitLogAppender>self.appenders[self.log_of(topic, queue_id)]

    def put_message(self, Message msg not None) -> PutMessageResult:
        """CommitLogAppender.put_message in the log of the message's queue."""
        return self._appender_of(msg).put_message(msg)

    def put_messages(self, batch) -> PutMessageResult:
        """CommitLogAppender.put_messages in the log of the batch's queue (a batch is one
        topic and queue, never delayed)."""
        cdef MessageBatch mb
        if isinstance(batch, MessageBatch):
            mb = <MessageBatch>batch
            return (<CommitLogAppender>self.appenders[self.log_of(mb.topic, mb.queue_id)]).put_messages(batch)
        msgs = batch if type(batch) is list else list(batch)
        if msgs and isinstance(msgs[0], Message):
            return (<CommitLogAppender>self.appenders[self.log_of((<Message>msgs[0]).topic,
                                                                  (<Message>msgs[0]).queue_id)]).put_messages(msgs)
        return (<CommitLogAppender>self.appenders[0]).put_messages(msgs)

    def put_bodies(self, str topic, bodies, int queue_id=0, *, tags=None, properties=None, int flag=0):
        """CommitLogAppender.put_bodies in the log of topic/queue_id."""
        return (<CommitLogAppender>self.appenders[self.log_of(topic, queue_id)]).put_bodies(
            topic, bodies, queue_id, tags=tags, properties=properties, flag=flag)
