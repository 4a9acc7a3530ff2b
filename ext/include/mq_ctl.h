/* The shared-memory control block (design.md "Processes and shared memory").
 *
 * One MAP_SHARED region per store, mapped by every process that uses the store. Cells are
 * 64-bit, hot cells sit on their own 64-byte cache line, positions only move forward, and
 * every access is atomic so readers never see a torn value.
 *
 *   0      header line: magic, layout version, sizes, generation, owner pid, state
 *   64     store-wide settings every process must agree on (lock kind, flush type, flags,
 *          transient store pool buffers at 104: 0 = no pool); at 120 the dispatcher's idle
 *          flag (puts read this line anyway: they wake an idle dispatcher at no extra cost)
 *   128    what a put writes under the lock: wrote, reserved, committed (when there is no
 *          transient store pool; else the committer's), the newest store timestamp: one line
 *   192..  positions: the store timestamp committed covers (200), flushed, dispatched (+ its
 *          store timestamp at 328), confirmed, min_phy, timestamps
 *   640    put lock: spin word, begin_time_in_lock, entry position, takeovers
 *   704    robust process-shared pthread mutex (the "mutex" lock kind)
 *   768    futex words: wake-up sequence numbers and pending flags per service
 *   832    flush request/error cells, 896 allocation cells, 936 replication cells
 *   1024   statistics counters (MQ_STAT_*), one line per updater
 *   4096   per-process heartbeat slots (MQ_HEARTBEAT_SLOTS x 64 B)
 *   8192   per-writer statistics slots (MQ_WRITER_SLOTS x 128 B): a writer process's pid, and
 *          on its own line the statistics every put updates (MQ_STAT_PUT_REQUESTS ..
 *          MQ_STAT_LOCK_HOLD_WARNS), summed (max for the hold maximum) by readers
 *   16384  the log directory (layout version 4, docs/parallel-commitlogs.md): the number of
 *          CommitLogs and the offset shift at 16384, log 0's header line at 16448 (id, state,
 *          statistics); 17408 + 1024 x (k - 1): the section of log k = 1 .. 31
 *   65536  topic-queue offset table: slots of MQ_TQ_SLOT_SIZE bytes, open addressing
 *
 * Several CommitLogs. Log 0's cells are the ones above, where they always were; log k >= 1 has
 * the same cells at the same offsets inside its own 1 KiB section, so code that addresses a
 * log's cells takes `char *lg = mq_log(ctl, k)` and the offsets it always used (wrote 128,
 * flushed 256, the put lock at 640, the channels FLUSH, FLUSHED, ALLOC_DONE, COMMIT at 768, the
 * HA sequences at 952 ...), and `ctl` for what stays store-wide (the header, running flags, the
 * settings line, the channels ALLOC, DISPATCH, DISPATCHED, CLEAN, the statistics, the table).
 * Offsets 0 .. 127 of a section k >= 1 are its header line (MQ_LOG_ID ..); log 0's header line
 * is at 16448. Every position cell of log k holds an encoded offset (k << MQ_LOG_SHIFT | local).
 */
#ifndef MQ_CTL_H
#define MQ_CTL_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "mq_atomic.h"

#define MQ_CTL_MAGIC 0x314C544354534D51ULL /* "MQSTCTL1" */
#define MQ_CTL_VERSION 4
#define MQ_CTL_HEADER_SIZE 65536
#define MQ_TQ_SLOT_SIZE 192
#define MQ_TQ_TOPIC_MAX 127
#define MQ_TQ_CLAIMED 2        /* a table slot being filled by its inserter (hashes are odd) */
#define MQ_HEARTBEAT_BASE 4096
#define MQ_HEARTBEAT_SLOTS 64
#define MQ_WRITER_BASE 8192
#define MQ_WRITER_SLOTS 64
#define MQ_WRITER_SLOT_SIZE 128
#define MQ_WSTAT_COUNT 8   /* the statistics with per-writer cells: indexes 0 .. 7 */
#define MQ_LOG_MAX 32          /* commit_log_count is 1 .. 32 */
#define MQ_LOG_SHIFT 56        /* phy = log << 56 | local offset */
#define MQ_CTL_LOG_COUNT 16384
#define MQ_CTL_LOG_SHIFT_OFF 16392
#define MQ_LOG0_HEAD 16448
#define MQ_LOG_SECTIONS 16384  /* section k >= 1 at MQ_LOG_SECTIONS + MQ_LOG_SECTION_SIZE * k */
#define MQ_LOG_SECTION_SIZE 1024

enum {
    MQ_CTL_MAGIC_OFF = 0, MQ_CTL_VERSION_OFF = 8, MQ_CTL_TOTAL_SIZE = 16, MQ_CTL_TABLE_SLOTS = 24,
    MQ_CTL_FILE_SIZE = 32, MQ_CTL_GENERATION = 40, MQ_CTL_OWNER_PID = 48, MQ_CTL_STATE = 56,
    MQ_CTL_LOCK_KIND = 64, MQ_CTL_RUNNING_FLAGS = 72, MQ_CTL_FLUSH_DISK_TYPE = 80, MQ_CTL_CREATED_MS = 88,
    MQ_CTL_TABLE_COUNT = 96, MQ_CTL_POOL_BUFFERS = 104, MQ_CTL_MANUAL_DELETE = 112, MQ_CTL_DISPATCH_IDLE = 120,
    MQ_CTL_WROTE = 128,
    /* the log offset up to which the current CommitLog file's disk blocks are allocated
     * (commit_log_allocate_step_bytes): a put never writes past it. On the write position's line:
     * the put lock's holder reads it there, and it changes once per step */
    MQ_CTL_RESERVED = 136, MQ_CTL_COMMITTED = 144, MQ_CTL_LAST_STORE_TS = 152,
    MQ_CTL_COMMITTED_STORE_TS = 200, MQ_CTL_FLUSHED = 256, MQ_CTL_DISPATCHED = 320,
    MQ_CTL_DISPATCHED_STORE_TS = 328, MQ_CTL_CONFIRMED = 384, MQ_CTL_MIN_PHY = 448, MQ_CTL_FLUSHED_STORE_TS = 576,
    MQ_CTL_LOCK_WORD = 640, MQ_CTL_LOCK_BEGIN_MS = 648, MQ_CTL_LOCK_BEGIN_NS = 656,
    MQ_CTL_LOCK_ENTRY_WROTE = 664, MQ_CTL_LOCK_TAKEOVERS = 672, MQ_CTL_LOCK_OWNER_PID = 680,
    MQ_CTL_MUTEX = 704,
    MQ_CTL_FUTEX = 768,
    MQ_CTL_FLUSH_REQUEST_UPTO = 832, MQ_CTL_FLUSH_ERROR_COUNT = 840, MQ_CTL_FLUSH_LAST_ERRNO = 848,
    MQ_CTL_FLUSH_ERROR_OFFSET = 856,
    MQ_CTL_ALLOC_REQUEST_UPTO = 896, MQ_CTL_ALLOC_READY_UPTO = 904, MQ_CTL_ALLOC_ERROR_ERRNO = 912,
    MQ_CTL_ALLOC_ERROR_OFFSET = 920, MQ_CTL_ALLOC_ERROR_COUNT = 928,
    /* replication (spec's HA): the slave connections the master's HA service holds, the wall ms
     * of the newest slave report, at 952 a 32-bit futex word bumped (and waiters woken) whenever
     * the confirmed position (what a slave holds) moves: SYNC_MASTER puts wait on it; at 956 one
     * bumped by puts while slaves are connected (the HA writers wait on it for new data); at 960
     * the port the master's HA service listens on (0 while it does not) */
    MQ_CTL_HA_SLAVES = 936, MQ_CTL_HA_REPORT_MS = 944, MQ_CTL_HA_SEQ = 952, MQ_CTL_HA_DATA_SEQ = 956,
    MQ_CTL_HA_PORT = 960,
    /* the logs a running flag stands for (ControlBlock.set_log_running_flag): bit k while log
     * k's dispatch fails (WRITE_LOGICS_QUEUE_ERROR), bit 32 + k while log k's index cannot be
     * written (WRITE_INDEX_FILE_ERROR); the flag is cleared when its last log's bit is. The
     * store's cell (never a log section's) */
    MQ_CTL_FLAG_LOGS = 968,

    MQ_CTL_STATS = 1024
};

/* Wake-up channels: a (sequence, pending) pair of 32-bit futex words each. */
enum { MQ_CH_FLUSH = 0, MQ_CH_FLUSHED = 1, MQ_CH_ALLOC = 2, MQ_CH_ALLOC_DONE = 3, MQ_CH_COMMIT = 4,
       MQ_CH_DISPATCH = 5, MQ_CH_DISPATCHED = 6, MQ_CH_CLEAN = 7, MQ_CHANNELS = 8 };

/* Control block states. */
enum { MQ_STATE_BUILDING = 0, MQ_STATE_READY = 1, MQ_STATE_CLOSED = 2 };
/* Lock kinds. */
enum { MQ_LOCK_SPIN = 0, MQ_LOCK_MUTEX = 1 };
/* RunningFlags bits (RocketMQ RunningFlags). */
enum { MQ_NOT_READABLE = 1, MQ_NOT_WRITEABLE = 2, MQ_WRITE_LOGICS_QUEUE_ERROR = 4,
       MQ_WRITE_INDEX_FILE_ERROR = 8, MQ_DISK_FULL = 16 };

enum {
    MQ_STAT_PUT_REQUESTS = 0, MQ_STAT_PUT_MESSAGES, MQ_STAT_PUT_BYTES, MQ_STAT_LOCK_ACQUIRES,
    MQ_STAT_LOCK_HOLD_NS_TOTAL, MQ_STAT_LOCK_HOLD_NS_MAX, MQ_STAT_ROLLS, MQ_STAT_LOCK_HOLD_WARNS,
    MQ_STAT_PAGE_CACHE_BUSY = 8, MQ_STAT_FLUSH_TIMEOUTS, MQ_STAT_CREATE_MAPPED_FILE_FAILED,
    MQ_STAT_MESSAGE_ILLEGAL, MQ_STAT_LOCK_TAKEOVERS, MQ_STAT_ROLL_WAIT_NS_TOTAL, MQ_STAT_ROLL_WAIT_NS_MAX,
    MQ_STAT_SERVICE_NOT_AVAILABLE,
    MQ_STAT_FLUSH_COUNT = 16, MQ_STAT_FLUSH_NS_TOTAL, MQ_STAT_FLUSH_NS_MAX, MQ_STAT_FLUSH_NS_LAST,
    MQ_STAT_FLUSH_BYTES, MQ_STAT_FLUSH_ERRORS, MQ_STAT_GROUP_COMMIT_WAITS, MQ_STAT_FLUSH_WAIT_NS_TOTAL,
    MQ_STAT_ALLOC_COUNT = 24, MQ_STAT_ALLOC_NS_TOTAL, MQ_STAT_ALLOC_NS_MAX, MQ_STAT_WARM_NS_TOTAL,
    MQ_STAT_ALLOC_ERRORS, MQ_STAT_PROPERTIES_SIZE_EXCEEDED, MQ_STAT_SPIN_YIELDS, MQ_STAT_ROLL_WAITS,
    MQ_STAT_DISPATCH_RECORDS = 32, MQ_STAT_DISPATCH_UNITS, MQ_STAT_DISPATCH_BATCHES, MQ_STAT_DISPATCH_NS_TOTAL,
    MQ_STAT_DISPATCH_SKIPPED_BYTES, MQ_STAT_DISPATCH_ERRORS, MQ_STAT_INDEX_KEYS, MQ_STAT_INDEX_ERRORS,
    MQ_STAT_COMMIT_COUNT = 40, MQ_STAT_COMMIT_BYTES, MQ_STAT_COMMIT_NS_TOTAL, MQ_STAT_COMMIT_NS_MAX,
    MQ_STAT_POOL_EXHAUSTED, MQ_STAT_DISPATCH_SKIPPED_RECORDS,
    MQ_STAT_COUNT = 46
};

/* A log's header line: id, state (MQ_LOG_*), and the statistics of the puts into it. */
enum { MQ_LOG_ID = 0, MQ_LOG_STATE = 8, MQ_LOG_PUTS = 16, MQ_LOG_BYTES = 24, MQ_LOG_HOLD_NS_TOTAL = 32,
       MQ_LOG_HOLD_NS_MAX = 40, MQ_LOG_WAITS = 48 };
enum { MQ_LOG_UNUSED = 0, MQ_LOG_ONLINE = 1, MQ_LOG_OFFLINE = 2, MQ_LOG_FULL = 3 };

/* The base of log k's cells: the block itself for log 0 (its cells are layout 3's), its
 * section for k >= 1. */
static inline int mq_log_base(int k) { return k == 0 ? 0 : MQ_LOG_SECTIONS + MQ_LOG_SECTION_SIZE * k; }
static inline char *mq_log(char *ctl, int k) { return ctl + mq_log_base(k); }
static inline char *mq_log_head(char *ctl, int k) { return k == 0 ? ctl + MQ_LOG0_HEAD : mq_log(ctl, k); }
/* The first encoded offset of log k, and the log of an encoded offset. */
static inline int64_t mq_log_start(int k) { return (int64_t)k << MQ_LOG_SHIFT; }
static inline int mq_log_of(int64_t phy) { return (int)(phy >> MQ_LOG_SHIFT); }

/* The CommitLog a topic-queue is written to, of n (docs/parallel-commitlogs.md, "Queue to log
 * binding"): FNV-1a 64 of the topic's bytes plus the queue id, modulo n. Consecutive queue ids
 * of a topic go to consecutive logs, so a topic whose queue count is a multiple of n puts the
 * same number of queues in each. */
/* FNV-1a 64 of a topic's bytes: the binding's hash, and the first part of the table's key hash. */
static inline uint64_t mq_fnv1a64(const char *topic, int len) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < len; i++) { h ^= (unsigned char)topic[i]; h *= 0x100000001b3ULL; }
    return h;
}

static inline int mq_log_of_queue(const char *topic, int len, int32_t queue_id, int n) {
    if (n <= 1) return 0;
    return (int)((mq_fnv1a64(topic, len) + (uint32_t)queue_id) % (uint64_t)n);
}

static inline int64_t *mq_cell(char *ctl, int off) { return (int64_t *)(ctl + off); }
static inline int64_t *mq_stat(char *ctl, int idx) { return (int64_t *)(ctl + MQ_CTL_STATS + 8 * idx); }
static inline uint32_t *mq_ch_seq(char *ctl, int ch) { return (uint32_t *)(ctl + MQ_CTL_FUTEX + 8 * ch); }
static inline uint32_t *mq_ch_pending(char *ctl, int ch) { return (uint32_t *)(ctl + MQ_CTL_FUTEX + 8 * ch + 4); }
static inline void mq_stat_max(char *ctl, int idx, int64_t v) { mq_max(mq_stat(ctl, idx), v); }

/* ---- per-writer statistics ---- */

static inline int64_t *mq_wslot_pid(char *ctl, int k) {
    return (int64_t *)(ctl + MQ_WRITER_BASE + k * MQ_WRITER_SLOT_SIZE);
}
static inline int64_t *mq_wslot_stats(char *ctl, int k) {
    return (int64_t *)(ctl + MQ_WRITER_BASE + k * MQ_WRITER_SLOT_SIZE + 64);
}

/* Move a slot's counts into the shared statistics (its process is gone). */
static inline void mq_wslot_fold(char *ctl, int k) {
    int64_t *w = mq_wslot_stats(ctl, k);
    for (int i = 0; i < MQ_WSTAT_COUNT; i++) {
        int64_t v = __atomic_exchange_n(&w[i], 0, __ATOMIC_ACQ_REL);
        if (i == MQ_STAT_LOCK_HOLD_NS_MAX) mq_max(mq_stat(ctl, i), v);
        else if (v) mq_add_relaxed(mq_stat(ctl, i), v);
    }
}

/* The statistics cells (MQ_WSTAT_COUNT of them) a writer process updates on every put: its own
 * slot (the one it has, one whose process is gone, folded into the shared statistics first, or
 * a free one), so writers on different cores do not pull one line back and forth; the
 * shared cells when every slot is taken by a live process. */
static inline int64_t *mq_writer_stats(char *ctl, int64_t pid) {
    int k;
    for (k = 0; k < MQ_WRITER_SLOTS; k++)
        if (mq_load(mq_wslot_pid(ctl, k)) == pid) return mq_wslot_stats(ctl, k);
    for (k = 0; k < MQ_WRITER_SLOTS; k++) {  /* slots of dead processes first: they stay few */
        int64_t cur = mq_load(mq_wslot_pid(ctl, k));
        if (cur > 0 && kill((pid_t)cur, 0) != 0 && errno == ESRCH && mq_cas(mq_wslot_pid(ctl, k), cur, pid)) {
            mq_wslot_fold(ctl, k);
            return mq_wslot_stats(ctl, k);
        }
    }
    for (k = 0; k < MQ_WRITER_SLOTS; k++)
        if (mq_cas(mq_wslot_pid(ctl, k), 0, pid)) return mq_wslot_stats(ctl, k);
    return mq_stat(ctl, 0);
}

/* A statistic as readers see it: the shared cell plus every writer slot's (the maximum of them
 * for the lock hold maximum). */
static inline int64_t mq_stat_total(char *ctl, int i) {
    int64_t v = mq_load_relaxed(mq_stat(ctl, i)), w;
    if (i >= MQ_WSTAT_COUNT) return v;
    for (int k = 0; k < MQ_WRITER_SLOTS; k++) {
        w = mq_load_relaxed(&mq_wslot_stats(ctl, k)[i]);
        if (i == MQ_STAT_LOCK_HOLD_NS_MAX) { if (w > v) v = w; }
        else v += w;
    }
    return v;
}

/* ---- wake-ups (RocketMQ ServiceThread.wakeup / waitForRunning, across processes) ---- */

/* Wake the waiter of a channel; only the first notifier since the last wait pays the syscall. */
static inline void mq_notify(char *ctl, int ch) {
    if (mq_cas32(mq_ch_pending(ctl, ch), 0, 1)) {
        mq_inc32(mq_ch_seq(ctl, ch));
        mq_futex_wake(mq_ch_seq(ctl, ch), INT_MAX);
    }
}
/* Wake every waiter of a broadcast channel (e.g. "flushed moved"). */
static inline void mq_broadcast(char *ctl, int ch) {
    mq_inc32(mq_ch_seq(ctl, ch));
    mq_futex_wake(mq_ch_seq(ctl, ch), INT_MAX);
}
/* Wait until notified or timeout. Returns 1 if a notification was consumed, 0 on timeout. */
static inline int mq_wait_notified(char *ctl, int ch, int64_t timeout_ns) {
    uint32_t *pending = mq_ch_pending(ctl, ch);
    if (mq_cas32(pending, 1, 0)) return 1;
    uint32_t s = mq_load32(mq_ch_seq(ctl, ch));
    if (mq_cas32(pending, 1, 0)) return 1;
    int r = mq_futex_wait(mq_ch_seq(ctl, ch), s, timeout_ns);
    mq_store32(pending, 0);
    return r == 0;
}

/* The confirmed position moved (or the slave count changed): wake every SYNC_MASTER put waiting. */
static inline void mq_ha_broadcast(char *ctl) {
    mq_inc32((uint32_t *)(ctl + MQ_CTL_HA_SEQ));
    mq_futex_wake((uint32_t *)(ctl + MQ_CTL_HA_SEQ), INT_MAX);
}

/* New data is readable: wake the HA writers (only while slaves are connected). */
static inline void mq_ha_data(char *ctl) {
    if (mq_load_relaxed(mq_cell(ctl, MQ_CTL_HA_SLAVES)) > 0) {
        mq_inc32((uint32_t *)(ctl + MQ_CTL_HA_DATA_SEQ));
        mq_futex_wake((uint32_t *)(ctl + MQ_CTL_HA_DATA_SEQ), INT_MAX);
    }
}

/* ---- the put lock ---- */

static inline int64_t mq_lock_token(void) { return ((int64_t)getpid() << 32) | (mq_gettid() & 0xFFFFFFFF); }

static inline int mq_put_trylock(char *ctl, int kind, int64_t token) {
    if (kind == MQ_LOCK_SPIN) return mq_cas(mq_cell(ctl, MQ_CTL_LOCK_WORD), 0, token) ? 0 : EBUSY;
    int r = pthread_mutex_trylock((pthread_mutex_t *)(ctl + MQ_CTL_MUTEX));
    if (r == EOWNERDEAD) { pthread_mutex_consistent((pthread_mutex_t *)(ctl + MQ_CTL_MUTEX)); return EOWNERDEAD; }
    return r;
}

/* Blocking acquire. Returns 0, or EOWNERDEAD when the lock was taken over from a dead holder
 * (the caller must repair what the holder may have left half done), or another errno. */
static inline int mq_put_lock(char *ctl, int kind, int64_t token) {
    if (kind == MQ_LOCK_MUTEX) {
        int r = pthread_mutex_lock((pthread_mutex_t *)(ctl + MQ_CTL_MUTEX));
        if (r == EOWNERDEAD) { pthread_mutex_consistent((pthread_mutex_t *)(ctl + MQ_CTL_MUTEX)); return EOWNERDEAD; }
        return r;
    }
    int64_t *word = mq_cell(ctl, MQ_CTL_LOCK_WORD);
    for (uint64_t spins = 0;; spins++) {
        int64_t cur = mq_load_relaxed(word);
        if (cur == 0 && mq_cas(word, 0, token)) return 0;
        if (spins < 128) { mq_cpu_relax(); continue; }
        /* Long waits: give the core away, and take the lock over from a holder that died. */
        if ((spins & 255) == 0 && cur != 0 && !mq_pid_alive(cur >> 32)) {
            if (mq_cas(word, cur, token)) return EOWNERDEAD;
            continue;
        }
        mq_add_relaxed(mq_stat(ctl, MQ_STAT_SPIN_YIELDS), 1);
        if (spins < 4096) sched_yield();
        else { struct timespec ts = {0, 50000}; nanosleep(&ts, NULL); }
    }
}

static inline void mq_put_unlock(char *ctl, int kind) {
    if (kind == MQ_LOCK_MUTEX) pthread_mutex_unlock((pthread_mutex_t *)(ctl + MQ_CTL_MUTEX));
    else mq_store(mq_cell(ctl, MQ_CTL_LOCK_WORD), 0);
}

static inline int mq_mutex_init(char *ctl) {
    pthread_mutexattr_t attr;
    int r = pthread_mutexattr_init(&attr);
    if (!r) r = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (!r) r = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (!r) r = pthread_mutex_init((pthread_mutex_t *)(ctl + MQ_CTL_MUTEX), &attr);
    pthread_mutexattr_destroy(&attr);
    return r;
}

_Static_assert(sizeof(pthread_mutex_t) <= 64, "pthread_mutex_t must fit its 64-byte cell");

/* OS page cache busy (spec §9.2): a put held the lock longer than timeout_ms. A holder that
 * died inside the lock is not "busy": the next put takes the lock over and repairs. */
static inline int mq_page_cache_busy(char *ctl, int64_t now_ms, int64_t timeout_ms) {
    int64_t begin = mq_load(mq_cell(ctl, MQ_CTL_LOCK_BEGIN_MS));
    int64_t diff = now_ms - begin;
    if (!(begin != 0 && diff < 10000000 && diff > timeout_ms)) return 0;
    return mq_pid_alive(mq_load(mq_cell(ctl, MQ_CTL_LOCK_OWNER_PID)));
}

/* ---- the dispatcher's idle sleep: puts wake it ----
 * An asymmetric Dekker handshake, so the put path pays no fence: a put publishes its
 * position, then (compiler barrier only) reads the idle cell; the dispatcher sets its bit,
 * makes every CPU pass a full barrier (membarrier MEMBARRIER_CMD_GLOBAL), then reads the
 * position. Either the put sees the bit and wakes the dispatcher, or the dispatcher sees the
 * put and does not sleep. Arming returns 0, or -1 where membarrier is unavailable (the bit
 * is then left clear and the dispatcher must keep polling).
 * The idle cell (the store's) holds a bit per sleeper: bit 0 for the one dispatcher of every
 * log, woken on the store's DISPATCH channel by a put into any log; bit 32 + k for log k's own
 * dispatcher (dispatch_logs_in_parallel), woken on log k's DISPATCH channel by a put into log
 * k (log 0's channel is the store's). Each dispatcher sets and clears only its own bit. */
#define MQ_IDLE_EVERY_LOG (-1)
static inline int64_t mq_dispatch_idle_bit(int k) {
    return k == MQ_IDLE_EVERY_LOG ? 1 : (int64_t)((uint64_t)1 << (32 + k));
}
static inline int mq_dispatch_idle_arm(char *ctl, int k) {
    int64_t bit = mq_dispatch_idle_bit(k);
    __atomic_fetch_or(mq_cell(ctl, MQ_CTL_DISPATCH_IDLE), bit, __ATOMIC_SEQ_CST);
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0) {
        __atomic_fetch_and(mq_cell(ctl, MQ_CTL_DISPATCH_IDLE), ~bit, __ATOMIC_SEQ_CST);
        return -1;
    }
    return 0;
}
static inline void mq_dispatch_idle_disarm(char *ctl, int k) {
    __atomic_fetch_and(mq_cell(ctl, MQ_CTL_DISPATCH_IDLE), ~mq_dispatch_idle_bit(k), __ATOMIC_SEQ_CST);
}
/* After a position readers dispatch from (committed) of log k (its cells at lg) moved: wake
 * the dispatcher that sleeps idle for it. */
static inline void mq_wake_idle_dispatcher(char *ctl, char *lg, int k) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    int64_t idle = mq_load_relaxed(mq_cell(ctl, MQ_CTL_DISPATCH_IDLE));
    if (idle) {
        if (idle & 1) mq_notify(ctl, MQ_CH_DISPATCH);
        if (idle & mq_dispatch_idle_bit(k)) mq_notify(lg, MQ_CH_DISPATCH);
    }
}

/* ---- topic-queue offset table ("topic-queueId" -> next queue offset) ---- */

typedef struct {
    uint64_t state;        /* 0 = empty, else the key hash (odd); published last */
    int64_t next_offset;   /* next queue offset to assign */
    int32_t queue_id;
    uint8_t topic_len;
    uint8_t pad[3];
    char topic[128];
    int64_t dispatched_next; /* units the dispatcher has built (release-stored after the unit) */
    uint32_t arrival_seq;    /* long polling: bumped (and futex-woken) when units arrive for waiters */
    uint32_t waiters;        /* readers waiting in mq_tq_wait_units */
    char reserved[24];
} mq_tq_slot;

_Static_assert(sizeof(mq_tq_slot) == MQ_TQ_SLOT_SIZE, "slot layout");
_Static_assert(MQ_WRITER_BASE + MQ_WRITER_SLOTS * MQ_WRITER_SLOT_SIZE <= MQ_CTL_LOG_COUNT, "writer slots end before the logs");
_Static_assert(MQ_LOG_SECTIONS + MQ_LOG_SECTION_SIZE * MQ_LOG_MAX <= MQ_CTL_HEADER_SIZE, "log sections fit the header");
_Static_assert(MQ_CTL_STATS <= MQ_LOG_SECTION_SIZE, "a log's cells fit its section");

/* ---- long polling (spec §12): readers of a queue wait on its slot, the dispatcher wakes them ---- */

/* Publish a queue's unit count (cell = &slot->dispatched_next); wake the readers waiting for
 * the queue, if any (a load per unit when nobody waits, a futex wake when somebody does). The
 * store and the load are sequentially consistent, as in mq_tq_wait_units: either the waiter
 * sees the new count or the publisher sees the waiter. */
static inline void mq_tq_publish_units(int64_t *cell, int64_t units) {
    mq_tq_slot *s = (mq_tq_slot *)((char *)cell - offsetof(mq_tq_slot, dispatched_next));
    __atomic_store_n(cell, units, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(&s->arrival_seq, 1, __ATOMIC_SEQ_CST);
        mq_futex_wake(&s->arrival_seq, INT_MAX);
    }
}

/* Wait until the queue has more than `above` units or timeout_ns passes; returns the unit count
 * seen last. A waiter killed while registered leaves `waiters` raised: later units of that
 * queue then cost the dispatcher a futex wake each (no other effect). */
static inline int64_t mq_tq_wait_units(mq_tq_slot *s, int64_t above, int64_t timeout_ns) {
    int64_t deadline = mq_mono_ns() + timeout_ns, units;
    __atomic_add_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        uint32_t seq = __atomic_load_n(&s->arrival_seq, __ATOMIC_SEQ_CST);
        units = __atomic_load_n(&s->dispatched_next, __ATOMIC_SEQ_CST);
        if (units > above) break;
        int64_t left = deadline - mq_mono_ns();
        if (left <= 0) break;
        mq_futex_wait(&s->arrival_seq, seq, left);
    }
    __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    return units;
}

static inline uint64_t mq_tq_hash(const char *topic, int len, int32_t queue_id) {
    uint64_t h = mq_fnv1a64(topic, len);
    for (int i = 0; i < 4; i++) { h ^= (uint8_t)(queue_id >> (8 * i)); h *= 0x100000001b3ULL; }
    return h | 1;
}

static inline mq_tq_slot *mq_tq_slots(char *ctl) { return (mq_tq_slot *)(ctl + MQ_CTL_HEADER_SIZE); }

/* Lock-free lookup: slots are never moved or removed while the block is in use. */
static inline mq_tq_slot *mq_tq_find(char *ctl, const char *topic, int len, int32_t queue_id, uint64_t h) {
    int64_t n = *mq_cell(ctl, MQ_CTL_TABLE_SLOTS);
    mq_tq_slot *slots = mq_tq_slots(ctl);
    for (int64_t i = 0, at = (int64_t)(h & (uint64_t)(n - 1)); i < n; i++, at = (at + 1) & (n - 1)) {
        uint64_t st = __atomic_load_n(&slots[at].state, __ATOMIC_ACQUIRE);
        if (st == 0) return NULL;
        if (st == h && slots[at].queue_id == queue_id && slots[at].topic_len == len &&
            memcmp(slots[at].topic, topic, len) == 0)
            return &slots[at];
    }
    return NULL;
}

/* Insert a queue that is not in the table. The caller holds the put lock of the queue's log (so
 * nobody inserts the same queue meanwhile) or owns the block exclusively; writers of other logs
 * may insert other queues at the same time, so a free slot is claimed with a CAS (state 2, even,
 * so no lookup matches it) before it is filled and published. A process killed between claim and
 * publish leaves the slot claimed: unusable until the owner rebuilds the block. NULL when the
 * table is 7/8 full: probes stay short and the caller reports the table as full. */
static inline mq_tq_slot *mq_tq_insert(char *ctl, const char *topic, int len, int32_t queue_id, uint64_t h,
                                       int64_t next_offset) {
    int64_t n = *mq_cell(ctl, MQ_CTL_TABLE_SLOTS);
    int64_t *count = mq_cell(ctl, MQ_CTL_TABLE_COUNT);
    if (len > MQ_TQ_TOPIC_MAX || mq_load(count) >= n - n / 8) return NULL;
    mq_tq_slot *slots = mq_tq_slots(ctl);
    for (int64_t i = 0, at = (int64_t)(h & (uint64_t)(n - 1)); i < n; i++, at = (at + 1) & (n - 1)) {
        if (__atomic_load_n(&slots[at].state, __ATOMIC_ACQUIRE) != 0) continue;
        if (!mq_cas((int64_t *)&slots[at].state, 0, MQ_TQ_CLAIMED)) continue;
        slots[at].queue_id = queue_id;
        slots[at].topic_len = (uint8_t)len;
        memcpy(slots[at].topic, topic, len);
        __atomic_store_n(&slots[at].next_offset, next_offset, __ATOMIC_RELEASE);
        __atomic_store_n(&slots[at].state, h, __ATOMIC_RELEASE);
        mq_fetch_add(count, 1);
        return &slots[at];
    }
    return NULL;
}

static inline mq_tq_slot *mq_tq_get_or_insert(char *ctl, const char *topic, int len, int32_t queue_id) {
    uint64_t h = mq_tq_hash(topic, len, queue_id);
    mq_tq_slot *s = mq_tq_find(ctl, topic, len, queue_id, h);
    return s ? s : mq_tq_insert(ctl, topic, len, queue_id, h, 0);
}

#endif
