# Header-only declarations shared by the extension modules (no runtime module).
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t

cdef extern from "mq_bytes.h" nogil:
    void mq_put_i16(char *p, int16_t v)
    void mq_put_i32(char *p, int32_t v)
    void mq_put_i64(char *p, int64_t v)
    int16_t mq_get_i16(const char *p)
    int32_t mq_get_i32(const char *p)
    int64_t mq_get_i64(const char *p)
    uint8_t mq_get_u8(const char *p)

cdef extern from "mq_crc32.h" nogil:
    void mq_crc32_init()
    uint32_t mq_crc32_update(uint32_t crc, const unsigned char *p, size_t n)
    int32_t mq_body_crc(const char *p, size_t n)

cdef extern from "mq_atomic.h" nogil:
    int64_t mq_load(const int64_t *p)
    int64_t mq_load_relaxed(const int64_t *p)
    void mq_store(int64_t *p, int64_t v)
    void mq_store_relaxed(int64_t *p, int64_t v)
    bint mq_cas(int64_t *p, int64_t expected, int64_t desired)
    int64_t mq_fetch_add(int64_t *p, int64_t v)
    void mq_add_relaxed(int64_t *p, int64_t v)
    void mq_add_owned(int64_t *p, int64_t v)
    int64_t mq_max(int64_t *p, int64_t v)
    uint32_t mq_load32(const uint32_t *p)
    uint32_t mq_inc32(uint32_t *p)
    bint mq_cas32(uint32_t *p, uint32_t expected, uint32_t desired)
    void mq_store32(uint32_t *p, uint32_t v)
    int64_t mq_now_ms()
    int64_t mq_mono_ns()
    int64_t mq_now_ns()
    int64_t mq_now_ms_coarse()
    int mq_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns)
    int mq_futex_wake(uint32_t *addr, int n)
    void mq_cpu_relax()
    bint mq_pid_alive(int64_t pid)
    int64_t mq_gettid()
