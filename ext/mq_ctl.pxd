# Declarations of the control-block layout and operations in mq_ctl.h (no runtime module).
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uint8_t

cdef extern from "mq_ctl.h" nogil:
    unsigned long long MQ_CTL_MAGIC
    int MQ_CTL_VERSION, MQ_CTL_HEADER_SIZE, MQ_TQ_SLOT_SIZE, MQ_TQ_TOPIC_MAX
    int MQ_HEARTBEAT_BASE, MQ_HEARTBEAT_SLOTS
    int MQ_WRITER_BASE, MQ_WRITER_SLOTS, MQ_WRITER_SLOT_SIZE, MQ_WSTAT_COUNT
    int MQ_LOG_MAX, MQ_LOG_SHIFT, MQ_CTL_LOG_COUNT, MQ_CTL_LOG_SHIFT_OFF, MQ_LOG0_HEAD, MQ_LOG_SECTIONS
    int MQ_LOG_SECTION_SIZE
    int MQ_LOG_ID, MQ_LOG_STATE, MQ_LOG_PUTS, MQ_LOG_BYTES, MQ_LOG_HOLD_NS_TOTAL, MQ_LOG_HOLD_NS_MAX, MQ_LOG_WAITS
    int MQ_LOG_UNUSED, MQ_LOG_ONLINE, MQ_LOG_OFFLINE, MQ_LOG_FULL
    int MQ_CTL_MAGIC_OFF, MQ_CTL_VERSION_OFF, MQ_CTL_TOTAL_SIZE, MQ_CTL_TABLE_SLOTS, MQ_CTL_FILE_SIZE
    int MQ_CTL_GENERATION, MQ_CTL_OWNER_PID, MQ_CTL_STATE, MQ_CTL_LOCK_KIND, MQ_CTL_RUNNING_FLAGS
    int MQ_CTL_FLUSH_DISK_TYPE, MQ_CTL_CREATED_MS, MQ_CTL_TABLE_COUNT, MQ_CTL_POOL_BUFFERS, MQ_CTL_COMMITTED_STORE_TS, MQ_CTL_MANUAL_DELETE
    int MQ_CTL_DISPATCH_IDLE
    int MQ_CTL_WROTE, MQ_CTL_COMMITTED, MQ_CTL_FLUSHED, MQ_CTL_DISPATCHED, MQ_CTL_DISPATCHED_STORE_TS, MQ_CTL_CONFIRMED, MQ_CTL_MIN_PHY
    int MQ_CTL_LAST_STORE_TS, MQ_CTL_FLUSHED_STORE_TS
    int MQ_CTL_LOCK_WORD, MQ_CTL_LOCK_BEGIN_MS, MQ_CTL_LOCK_BEGIN_NS, MQ_CTL_LOCK_ENTRY_WROTE, MQ_CTL_LOCK_TAKEOVERS, MQ_CTL_LOCK_OWNER_PID
    int MQ_CTL_MUTEX, MQ_CTL_FUTEX
    int MQ_CTL_FLUSH_REQUEST_UPTO, MQ_CTL_FLUSH_ERROR_COUNT, MQ_CTL_FLUSH_LAST_ERRNO, MQ_CTL_FLUSH_ERROR_OFFSET
    int MQ_CTL_ALLOC_REQUEST_UPTO, MQ_CTL_ALLOC_READY_UPTO, MQ_CTL_ALLOC_ERROR_ERRNO, MQ_CTL_ALLOC_ERROR_OFFSET
    int MQ_CTL_ALLOC_ERROR_COUNT, MQ_CTL_RESERVED, MQ_CTL_STATS
    int MQ_CTL_HA_SLAVES, MQ_CTL_HA_REPORT_MS, MQ_CTL_HA_SEQ, MQ_CTL_HA_DATA_SEQ, MQ_CTL_HA_PORT
    int MQ_CTL_FLAG_LOGS
    int MQ_CH_FLUSH, MQ_CH_FLUSHED, MQ_CH_ALLOC, MQ_CH_ALLOC_DONE, MQ_CH_COMMIT, MQ_CH_DISPATCH
    int MQ_CH_DISPATCHED, MQ_CH_CLEAN, MQ_CHANNELS
    int MQ_STATE_BUILDING, MQ_STATE_READY, MQ_STATE_CLOSED
    int MQ_LOCK_SPIN, MQ_LOCK_MUTEX
    int MQ_NOT_READABLE, MQ_NOT_WRITEABLE, MQ_WRITE_LOGICS_QUEUE_ERROR, MQ_WRITE_INDEX_FILE_ERROR, MQ_DISK_FULL
    int MQ_STAT_PUT_REQUESTS, MQ_STAT_PUT_MESSAGES, MQ_STAT_PUT_BYTES, MQ_STAT_LOCK_ACQUIRES
    int MQ_STAT_LOCK_HOLD_NS_TOTAL, MQ_STAT_LOCK_HOLD_NS_MAX, MQ_STAT_ROLLS, MQ_STAT_LOCK_HOLD_WARNS
    int MQ_STAT_PAGE_CACHE_BUSY, MQ_STAT_FLUSH_TIMEOUTS, MQ_STAT_CREATE_MAPPED_FILE_FAILED
    int MQ_STAT_MESSAGE_ILLEGAL, MQ_STAT_LOCK_TAKEOVERS, MQ_STAT_ROLL_WAIT_NS_TOTAL, MQ_STAT_ROLL_WAIT_NS_MAX
    int MQ_STAT_SERVICE_NOT_AVAILABLE
    int MQ_STAT_FLUSH_COUNT, MQ_STAT_FLUSH_NS_TOTAL, MQ_STAT_FLUSH_NS_MAX, MQ_STAT_FLUSH_NS_LAST
    int MQ_STAT_FLUSH_BYTES, MQ_STAT_FLUSH_ERRORS, MQ_STAT_GROUP_COMMIT_WAITS, MQ_STAT_FLUSH_WAIT_NS_TOTAL
    int MQ_STAT_ALLOC_COUNT, MQ_STAT_ALLOC_NS_TOTAL, MQ_STAT_ALLOC_NS_MAX, MQ_STAT_WARM_NS_TOTAL
    int MQ_STAT_ALLOC_ERRORS, MQ_STAT_PROPERTIES_SIZE_EXCEEDED, MQ_STAT_SPIN_YIELDS, MQ_STAT_ROLL_WAITS
    int MQ_STAT_DISPATCH_RECORDS, MQ_STAT_DISPATCH_UNITS, MQ_STAT_DISPATCH_BATCHES, MQ_STAT_DISPATCH_NS_TOTAL
    int MQ_STAT_DISPATCH_SKIPPED_BYTES, MQ_STAT_DISPATCH_ERRORS, MQ_STAT_INDEX_KEYS, MQ_STAT_INDEX_ERRORS
    int MQ_STAT_COMMIT_COUNT, MQ_STAT_COMMIT_BYTES, MQ_STAT_COMMIT_NS_TOTAL, MQ_STAT_COMMIT_NS_MAX, MQ_STAT_POOL_EXHAUSTED
    int MQ_STAT_COUNT

    ctypedef struct mq_tq_slot:
        uint64_t state
        int64_t next_offset
        int32_t queue_id
        uint8_t topic_len
        char topic[128]
        int64_t dispatched_next
        uint32_t arrival_seq
        uint32_t waiters

    int mq_log_base(int k)
    char *mq_log(char *ctl, int k)
    char *mq_log_head(char *ctl, int k)
    int64_t mq_log_start(int k)
    int mq_log_of(int64_t phy)
    int mq_log_of_queue(const char *topic, int len, int32_t queue_id, int n)
    int64_t *mq_cell(char *ctl, int off)
    int64_t *mq_stat(char *ctl, int idx)
    uint32_t *mq_ch_seq(char *ctl, int ch)
    uint32_t *mq_ch_pending(char *ctl, int ch)
    void mq_stat_max(char *ctl, int idx, int64_t v)
    int64_t *mq_writer_stats(char *ctl, int64_t pid)
    int64_t mq_stat_total(char *ctl, int idx)
    int64_t *mq_wslot_pid(char *ctl, int k)
    int64_t *mq_wslot_stats(char *ctl, int k)
    void mq_notify(char *ctl, int ch)
    void mq_ha_broadcast(char *ctl)
    void mq_ha_data(char *ctl)
    int MQ_IDLE_EVERY_LOG
    int mq_dispatch_idle_arm(char *ctl, int k)
    void mq_dispatch_idle_disarm(char *ctl, int k)
    void mq_wake_idle_dispatcher(char *ctl, char *lg, int k)
    void mq_broadcast(char *ctl, int ch)
    int mq_wait_notified(char *ctl, int ch, int64_t timeout_ns)
    int64_t mq_lock_token()
    int mq_put_trylock(char *ctl, int kind, int64_t token)
    int mq_put_lock(char *ctl, int kind, int64_t token)
    void mq_put_unlock(char *ctl, int kind)
    int mq_mutex_init(char *ctl)
    bint mq_page_cache_busy(char *ctl, int64_t now_ms, int64_t timeout_ms)
    uint64_t mq_tq_hash(const char *topic, int len, int32_t queue_id)
    mq_tq_slot *mq_tq_slots(char *ctl)
    mq_tq_slot *mq_tq_find(char *ctl, const char *topic, int len, int32_t queue_id, uint64_t h)
    mq_tq_slot *mq_tq_insert(char *ctl, const char *topic, int len, int32_t queue_id, uint64_t h, int64_t next_offset)
    mq_tq_slot *mq_tq_get_or_insert(char *ctl, const char *topic, int len, int32_t queue_id)
    void mq_tq_publish_units(int64_t *cell, int64_t units)
    int64_t mq_tq_wait_units(mq_tq_slot *s, int64_t above, int64_t timeout_ns)
