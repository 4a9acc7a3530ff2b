/* CRC-32 (zlib / IEEE 802.3 polynomial, reflected) by slicing-by-8.
 * RocketMQ stores crc32(body) & 0x7FFFFFFF (spec §1.5); masking is the caller's job. */
#ifndef MQ_CRC32_H
#define MQ_CRC32_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>

static uint32_t mq_crc_table[8][256];
static int mq_crc_ready = 0;

static void mq_crc32_init(void) {
    if (mq_crc_ready) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
        mq_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = mq_crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = mq_crc_table[0][c & 0xFF] ^ (c >> 8);
            mq_crc_table[t][i] = c;
        }
    }
    mq_crc_ready = 1;
}

static inline uint32_t mq_crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = mq_crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);            /* little-endian host assumed (x86_64, aarch64) */
        uint32_t lo = (uint32_t)w ^ crc, hi = (uint32_t)(w >> 32);
        crc = mq_crc_table[7][lo & 0xFF] ^ mq_crc_table[6][(lo >> 8) & 0xFF] ^
              mq_crc_table[5][(lo >> 16) & 0xFF] ^ mq_crc_table[4][lo >> 24] ^
              mq_crc_table[3][hi & 0xFF] ^ mq_crc_table[2][(hi >> 8) & 0xFF] ^
              mq_crc_table[1][(hi >> 16) & 0xFF] ^ mq_crc_table[0][hi >> 24];
        p += 8; n -= 8;
    }
    while (n--) crc = mq_crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* RocketMQ's UtilAll.crc32: non-negative int. */
static inline int32_t mq_body_crc(const char *p, size_t n) {
    return (int32_t)(mq_crc32_update(0, (const unsigned char *)p, n) & 0x7FFFFFFFu);
}

#endif
