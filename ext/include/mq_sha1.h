/* SHA-1 (FIPS 180-4) for the request signatures' HMAC-SHA1 (ext/mqstore/_acl.pyx).
 *
 * Why not hashlib: a signature covers a few hundred bytes, and OpenSSL 3's EVP objects cost more
 * per call (copy, update, final: ~1.8 us for one HMAC of 300 bytes) than the hashing. Here a
 * state is 5 words that copy for free, and the blocks go through the x86 SHA extensions when
 * the CPU has them (cpuid leaf 7, EBX bit 29: as fast as OpenSSL's own code) or a portable
 * compression function otherwise. Checked against hashlib by tests/test_acl_signature.py.
 *
 * Header-only; every function is static. */
#ifndef MQ_SHA1_H
#define MQ_SHA1_H

#include <stdint.h>
#include <string.h>

typedef struct {
    uint32_t h[5];
    uint64_t length;       /* bytes fed so far */
    uint32_t used;         /* bytes waiting in block */
    unsigned char block[64];
} mq_sha1_ctx;

#define MQ_ROL32(x, n) (((x) << (n)) | ((x) >> (32 - (n))))

static void mq_sha1_blocks_portable(uint32_t h[5], const unsigned char *p, size_t blocks)
{
    while (blocks--) {
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8)
                   | (uint32_t)p[4 * i + 3];
        for (int i = 16; i < 80; i++)
            w[i] = MQ_ROL32(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999u; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1u; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDCu; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6u; }
            uint32_t t = MQ_ROL32(a, 5) + f + e + k + w[i];
            e = d; d = c; c = MQ_ROL32(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
        p += 64;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

/* Four rounds on the SHA extensions: E is the next rounds' E (sha1nexte of the previous ABCD and
 * the message), F the round function's constant. The message schedule runs four words ahead. */
#define MQ_SHA1_4ROUNDS(F, Ecur, Enext, M0, M1, M2, M3)      \
    Ecur = _mm_sha1nexte_epu32(Ecur, M0);                    \
    Enext = abcd;                                            \
    M1 = _mm_sha1msg2_epu32(M1, M0);                         \
    abcd = _mm_sha1rnds4_epu32(abcd, Ecur, F);               \
    M3 = _mm_sha1msg1_epu32(M3, M0);                         \
    M2 = _mm_xor_si128(M2, M0);

__attribute__((target("sha,sse4.1,ssse3")))
static void mq_sha1_blocks_shani(uint32_t h[5], const unsigned char *p, size_t blocks)
{
    const __m128i mask = _mm_set_epi64x(0x0001020304050607ULL, 0x08090a0b0c0d0e0fULL);
    __m128i abcd = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0x1B);
    __m128i e0 = _mm_set_epi32((int)h[4], 0, 0, 0), e1;
    __m128i m0, m1, m2, m3;
    while (blocks--) {
        __m128i abcd_save = abcd, e0_save = e0;
        /* rounds 0-3 */
        m0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 0)), mask);
        e0 = _mm_add_epi32(e0, m0);
        e1 = abcd;
        abcd = _mm_sha1rnds4_epu32(abcd, e0, 0);
        /* rounds 4-7 */
        m1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), mask);
        e1 = _mm_sha1nexte_epu32(e1, m1);
        e0 = abcd;
        abcd = _mm_sha1rnds4_epu32(abcd, e1, 0);
        m0 = _mm_sha1msg1_epu32(m0, m1);
        /* rounds 8-11 */
        m2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), mask);
        e0 = _mm_sha1nexte_epu32(e0, m2);
        e1 = abcd;
        abcd = _mm_sha1rnds4_epu32(abcd, e0, 0);
        m1 = _mm_sha1msg1_epu32(m1, m2);
        m0 = _mm_xor_si128(m0, m2);
        /* rounds 12-15 */
        m3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), mask);
        e1 = _mm_sha1nexte_epu32(e1, m3);
        e0 = abcd;
        m0 = _mm_sha1msg2_epu32(m0, m3);
        abcd = _mm_sha1rnds4_epu32(abcd, e1, 0);
        m2 = _mm_sha1msg1_epu32(m2, m3);
        m1 = _mm_xor_si128(m1, m3);
        /* rounds 16-71: the schedule rotates through m0..m3 */
        MQ_SHA1_4ROUNDS(0, e0, e1, m0, m1, m2, m3)   /* 16-19 */
        MQ_SHA1_4ROUNDS(1, e1, e0, m1, m2, m3, m0)   /* 20-23 */
        MQ_SHA1_4ROUNDS(1, e0, e1, m2, m3, m0, m1)   /* 24-27 */
        MQ_SHA1_4ROUNDS(1, e1, e0, m3, m0, m1, m2)   /* 28-31 */
        MQ_SHA1_4ROUNDS(1, e0, e1, m0, m1, m2, m3)   /* 32-35 */
        MQ_SHA1_4ROUNDS(1, e1, e0, m1, m2, m3, m0)   /* 36-39 */
        MQ_SHA1_4ROUNDS(2, e0, e1, m2, m3, m0, m1)   /* 40-43 */
        MQ_SHA1_4ROUNDS(2, e1, e0, m3, m0, m1, m2)   /* 44-47 */
        MQ_SHA1_4ROUNDS(2, e0, e1, m0, m1, m2, m3)   /* 48-51 */
        MQ_SHA1_4ROUNDS(2, e1, e0, m1, m2, m3, m0)   /* 52-55 */
        MQ_SHA1_4ROUNDS(2, e0, e1, m2, m3, m0, m1)   /* 56-59 */
        MQ_SHA1_4ROUNDS(3, e1, e0, m3, m0, m1, m2)   /* 60-63 */
        MQ_SHA1_4ROUNDS(3, e0, e1, m0, m1, m2, m3)   /* 64-67 */
        MQ_SHA1_4ROUNDS(3, e1, e0, m1, m2, m3, m0)   /* 68-71 */
        /* rounds 72-75 */
        e0 = _mm_sha1nexte_epu32(e0, m2);
        e1 = abcd;
        m3 = _mm_sha1msg2_epu32(m3, m2);
        abcd = _mm_sha1rnds4_epu32(abcd, e0, 3);
        /* rounds 76-79 */
        e1 = _mm_sha1nexte_epu32(e1, m3);
        e0 = abcd;
        abcd = _mm_sha1rnds4_epu32(abcd, e1, 3);
        /* add this block's result */
        e0 = _mm_sha1nexte_epu32(e0, e0_save);
        abcd = _mm_add_epi32(abcd, abcd_save);
        p += 64;
    }
    abcd = _mm_shuffle_epi32(abcd, 0x1B);
    _mm_storeu_si128((__m128i *)h, abcd);
    h[4] = (uint32_t)_mm_extract_epi32(e0, 3);
}

static int mq_sha1_has_shani(void)
{
    static int known = -1;
    if (known < 0) {
        unsigned int a, b, c, d;
        int sha = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((b >> 29) & 1);
        int sse41 = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 19) & 1) && ((c >> 9) & 1);  /* SSE4.1, SSSE3 */
        known = sha && sse41;
    }
    return known;
}
#endif

/* 1: blocks go through the SHA extensions; 0: the portable function (-1: not asked yet) */
static int mq_sha1_shani_enabled = -1;

static inline void mq_sha1_blocks(uint32_t h[5], const unsigned char *p, size_t blocks)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (mq_sha1_shani_enabled < 0)
        mq_sha1_shani_enabled = mq_sha1_has_shani();
    if (mq_sha1_shani_enabled) {
        mq_sha1_blocks_shani(h, p, blocks);
        return;
    }
#endif
    mq_sha1_blocks_portable(h, p, blocks);
}

static inline void mq_sha1_init(mq_sha1_ctx *ctx)
{
    static const uint32_t iv[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
    memcpy(ctx->h, iv, sizeof iv);
    ctx->length = 0;
    ctx->used = 0;
}

static void mq_sha1_update(mq_sha1_ctx *ctx, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    ctx->length += n;
    if (ctx->used) {
        size_t take = 64 - ctx->used;
        if (take > n)
            take = n;
        memcpy(ctx->block + ctx->used, p, take);
        ctx->used += (uint32_t)take;
        p += take;
        n -= take;
        if (ctx->used < 64)
            return;
        mq_sha1_blocks(ctx->h, ctx->block, 1);
        ctx->used = 0;
    }
    if (n >= 64) {
        mq_sha1_blocks(ctx->h, p, n / 64);
        p += n & ~(size_t)63;
        n &= 63;
    }
    if (n) {
        memcpy(ctx->block, p, n);
        ctx->used = (uint32_t)n;
    }
}

static void mq_sha1_final(mq_sha1_ctx *ctx, unsigned char out[20])
{
    uint64_t bits = ctx->length * 8;
    unsigned char pad[72];
    size_t padn = (ctx->used < 56 ? 56 : 120) - ctx->used;
    memset(pad, 0, sizeof pad);
    pad[0] = 0x80;
    for (int i = 0; i < 8; i++)
        pad[padn + i] = (unsigned char)(bits >> (56 - 8 * i));
    mq_sha1_update(ctx, pad, padn + 8);
    for (int i = 0; i < 5; i++) {
        out[4 * i] = (unsigned char)(ctx->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(ctx->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(ctx->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)ctx->h[i];
    }
}

#endif
