/* Shared-memory primitives: 64-bit atomics, futex waits, clocks, process liveness.
 * All cells live in a MAP_SHARED mapping used by several processes, so futexes are
 * the non-private kind and every atomic is a real hardware atomic. */
#ifndef MQ_ATOMIC_H
#define MQ_ATOMIC_H
#include <stdint.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/syscall.h>

static inline int64_t mq_load(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline int64_t mq_load_relaxed(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void mq_store(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void mq_store_relaxed(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline int mq_cas(int64_t *p, int64_t expected, int64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline int64_t mq_fetch_add(int64_t *p, int64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
static inline void mq_add_relaxed(int64_t *p, int64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
/* Add for a cell that only the put-lock holder writes: a plain load and store (no locked
 * instruction); readers in other processes still see whole 64-bit values. */
static inline void mq_add_owned(int64_t *p, int64_t v) {
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}
/* Raise *p to at least v; returns the value after the call. Positions only move forward. */
static inline int64_t mq_max(int64_t *p, int64_t v) {
    int64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
    return cur < v ? v : cur;
}

static inline uint32_t mq_load32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline uint32_t mq_inc32(uint32_t *p) { return __atomic_add_fetch(p, 1, __ATOMIC_ACQ_REL); }
static inline int mq_cas32(uint32_t *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline void mq_store32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static inline int64_t mq_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
/* Wall clock in ns (one vDSO read gives both the store timestamp and the lock-hold start). */
static inline int64_t mq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
/* Wall clock in ms at tick resolution (~4 ms), a quarter of the cost: for checks that compare
 * against timeouts of hundreds of ms (OS page cache busy), never for stored timestamps. */
static inline int64_t mq_now_ms_coarse(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static inline int64_t mq_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wait while *addr == expected, at most timeout_ns (< 0: forever). Returns 0 when woken or the
 * value changed, ETIMEDOUT on timeout, EINTR on a signal. */
static inline int mq_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tp = NULL;
    if (timeout_ns >= 0) { ts.tv_sec = timeout_ns / 1000000000LL; ts.tv_nsec = timeout_ns % 1000000000LL; tp = &ts; }
    long r = syscall(SYS_futex, addr, FUTEX_WAIT, expected, tp, NULL, 0);
    if (r == 0) return 0;
    if (errno == EAGAIN) return 0;
    return errno;
}
static inline int mq_futex_wake(uint32_t *addr, int n) {
    return (int)syscall(SYS_futex, addr, FUTEX_WAKE, n, NULL, NULL, 0);
}

static inline void mq_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#include <stdio.h>
#include <string.h>
/* 1 if a process with this pid is running, 0 if it is gone or a zombie (dead but not yet
 * reaped: kill(pid, 0) still succeeds on those, yet they hold nothing any more). */
static inline int mq_pid_alive(int64_t pid) {
    if (pid <= 0) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *close_paren = strrchr(buf, ')');
    if (close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X')) return 0;
    return 1;
}
static inline int64_t mq_gettid(void) { return (int64_t)syscall(SYS_gettid); }

#endif
