/* Big-endian (Java ByteBuffer order) loads and stores on unaligned memory. */
#ifndef MQ_BYTES_H
#define MQ_BYTES_H
#include <stdint.h>
#include <string.h>

static inline void mq_put_i16(char *p, int16_t v) { uint16_t u = __builtin_bswap16((uint16_t)v); memcpy(p, &u, 2); }
static inline void mq_put_i32(char *p, int32_t v) { uint32_t u = __builtin_bswap32((uint32_t)v); memcpy(p, &u, 4); }
static inline void mq_put_i64(char *p, int64_t v) { uint64_t u = __builtin_bswap64((uint64_t)v); memcpy(p, &u, 8); }
static inline int16_t mq_get_i16(const char *p) { uint16_t u; memcpy(&u, p, 2); return (int16_t)__builtin_bswap16(u); }
static inline int32_t mq_get_i32(const char *p) { uint32_t u; memcpy(&u, p, 4); return (int32_t)__builtin_bswap32(u); }
static inline int64_t mq_get_i64(const char *p) { uint64_t u; memcpy(&u, p, 8); return (int64_t)__builtin_bswap64(u); }
static inline uint8_t mq_get_u8(const char *p) { return (uint8_t)p[0]; }

#endif
