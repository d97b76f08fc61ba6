/* The x86 twins of kv_gguf_matmul_fast.c's row loops: a block's integer sum of code products
 * taken 32 codes at a time in 256-bit registers, then the portable loop's float steps
 * (kv_gguf_term()) unchanged, in the same order, so every output has the portable loop's bits.
 *
 * The integer step: _mm256_maddubs_epi16 multiplies 32 unsigned bytes (the weight codes) by 32
 * signed bytes (the activation codes) and adds neighbours into 16 int16 (at most
 * 2 * 63 * 127 = 16002 for 6-bit codes: no saturation), _mm256_madd_epi16 by ones (or by the
 * sub-block scales, Q6_K) widens them into 8 int32, and a horizontal add gives the block's sum.
 * Signed weight codes (Q8_0) go through the sign trick: |w| as the unsigned operand and c with
 * w's sign as the signed one (|w| <= 128, so 2 * 128 * 127 = 32512 still fits). Four-bit codes
 * are unpacked in registers: the low nibbles with a mask, the high ones by a 16-bit shift and
 * the same mask.
 *
 * The functions carry their instruction set as a target attribute (the library is built for
 * any x86-64) and run only where kv_ops_cpu_avx2() says the CPU has it. */
#include "kv_gguf_matmul_fast.h"
#include "kv_gguf_quant.h"

#if !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
const kv_gguf_row_dots *kv_gguf_row_dots_avx2(void) { return NULL; }
#else
#include <immintrin.h>

#define KV_AVX2 __attribute__((target("avx2")))

/* the sum of 8 int32 */
KV_AVX2 static inline int32_t hsum(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* the sums of eight vectors of 8 int32: lane i of the result is the sum of v[i]'s lanes (two
 * rounds of pairwise adds within 128-bit halves, then the halves added), one reduction for
 * eight blocks where hsum() per block is five dependent steps */
KV_AVX2 static inline __m256i hsum8(const __m256i v[8])
{
    const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20),
                            _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* Eight binary16 values, the 16-bit words at p, p + stride, ..., as kv_ggml_fp16() converts
 * them, bit for bit, with AVX2 integer steps (no F16C needed): a normal number rebiases its
 * exponent (+112 << 23) under its 10 mantissa bits moved up 13, an infinity or NaN keeps its
 * payload under exponent 255, a subnormal or zero is its mantissa times 2^-24 (exact in
 * float); the sign goes on top. */
KV_AVX2 static inline __m256 fp16x8(const uint8_t *p, int stride)
{
    const __m256i h = _mm256_setr_epi32(
        p[0] | p[1] << 8, p[stride] | p[stride + 1] << 8, p[2 * stride] | p[2 * stride + 1] << 8,
        p[3 * stride] | p[3 * stride + 1] << 8, p[4 * stride] | p[4 * stride + 1] << 8,
        p[5 * stride] | p[5 * stride + 1] << 8, p[6 * stride] | p[6 * stride + 1] << 8,
        p[7 * stride] | p[7 * stride + 1] << 8);
    const __m256i em = _mm256_and_si256(h, _mm256_set1_epi32(0x7fff));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
    const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 13), _mm256_set1_epi32(112 << 23));
    const __m256i special = _mm256_or_si256(_mm256_slli_epi32(em, 13), _mm256_set1_epi32(0x7f800000));
    const __m256i small = _mm256_castps_si256(
        _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-24f)));
    const __m256i is_special = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7bff));
    const __m256i is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x0400), em);
    __m256i bits = _mm256_blendv_epi8(normal, special, is_special);
    bits = _mm256_blendv_epi8(bits, small, is_small);
    return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

/* sum_j u_j c_j as 8 int32 partial sums: u 32 unsigned codes (< 64), c 32 signed codes */
KV_AVX2 static inline __m256i udot8(__m256i u, const int8_t *c)
{
    const __m256i p = _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)c));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* sum_j u_j c_j: u 32 unsigned codes (< 64), c 32 signed codes */
KV_AVX2 static inline int32_t udot(__m256i u, const int8_t *c) { return hsum(udot8(u, c)); }

/* 16 bytes of nibbles as 32 codes in weight order: the low nibbles (weights 0-15), then the
 * high ones (weights 16-31) */
KV_AVX2 static inline __m256i nibbles16(const uint8_t *qs)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

static int32_t csum32(const kv_gguf_act *a, int b) { return a->s16[2 * b] + a->s16[2 * b + 1]; }

/* Q8_0's integer sum of block b as 8 partial sums: |w| against c with w's sign */
KV_AVX2 static inline __m256i q8_0_sums(const uint8_t *blk, const kv_gguf_act *a, int b)
{
    const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m256i c = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(c, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* A row's blocks eight at a time: their integer sums reduced together (hsum8()) and their
 * binary16 scales converted together (fp16x8(): d at byte 0 of each block, and with @p has_m
 * Q4_1's minimum m at byte 2), their eight float terms made together in one vector
 * (TERMS8(blk, b, s, d, m): lane i is block b + i's term, by the portable loop's operations on
 * that lane alone, so the same bits), then added to the one accumulator in block order, the
 * portable loop's order; the last n / 32 mod 8 blocks one at a time (TERM(blk, b, s, d, m)).
 * Made one by one, the terms' loads, conversions and multiplies were most of a block's
 * instructions: the row ran at what one core issues, not at what memory gives.
 * BLOCK_SUMS(blk, b) is block b's 8 partial sums. */
#define KV_ROW_DOT(bytes, has_m, BLOCK_SUMS, TERMS8, TERM)                                      \
    do {                                                                                      \
        const int nb_ = n / 32;                                                               \
        int b_ = 0;                                                                           \
        for (; b_ + 8 <= nb_; b_ += 8) {                                                      \
            const uint8_t *r_ = row + (bytes) * b_;                                           \
            __m256i v_[8];                                                                    \
            float t_[8];                                                                      \
            for (int i_ = 0; i_ < 8; i_++) v_[i_] = BLOCK_SUMS(r_ + (bytes) * i_, b_ + i_);   \
            const __m256 d_ = fp16x8(r_, bytes);                                              \
            const __m256 m_ = (has_m) ? fp16x8(r_ + 2, bytes) : _mm256_setzero_ps();          \
            (void)m_;                                                                         \
            _mm256_storeu_ps(t_, TERMS8(r_, b_, hsum8(v_), d_, m_));                           \
            for (int i_ = 0; i_ < 8; i_++) acc += t_[i_];                                     \
        }                                                                                     \
        for (; b_ < nb_; b_++) {                                                              \
            const uint8_t *r_ = row + (bytes) * b_;                                           \
            acc += TERM(r_, b_, hsum(BLOCK_SUMS(r_, b_)), kv_ggml_fp16_at(r_),                 \
                        (has_m) ? kv_ggml_fp16_at(r_ + 2) : 0.0f);                            \
        }                                                                                     \
    } while (0)

/* kv_gguf_term() of eight blocks, lane by lane: (scale dx) isum, two rounded products */
KV_AVX2 static inline __m256 term8(__m256 scale, const float *dx, __m256i isum)
{
    return _mm256_mul_ps(_mm256_mul_ps(scale, _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(isum));
}

/* the code sums of activation blocks b .. b + 7 (s16's halves added pairwise) */
KV_AVX2 static inline __m256i csum8(const kv_gguf_act *a, int b)
{
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a->s16 + 2 * b)),
                             _mm256_set1_epi16(1));
}

KV_AVX2 static float dot_q8_0(const uint8_t *row, const kv_gguf_act *a, int n)
{
    float acc = 0.0f;
#define Q8_SUMS(blk, b) q8_0_sums(blk, a, b)
#define Q8_TERMS8(blk, b, s, sc, mn) term8(sc, a->d + (b), s)
#define Q8_TERM(blk, b, s, sc, mn) kv_gguf_term(sc, a->d[b], s)
    KV_ROW_DOT(34, 0, Q8_SUMS, Q8_TERMS8, Q8_TERM);
    return acc;
}

/* Q4_0 (18-byte blocks: d, codes) and Q4_1 (20 bytes: d, m, codes): kv_gguf_q4_term()'s
 * steps, eight blocks a vector: Q4_1's (d dx) s + m ds, Q4_0's (d dx) (s - 8 sum c) */
KV_AVX2 static inline float dot_q4(const uint8_t *row, const kv_gguf_act *a, int n, int q4_1)
{
    const int bytes = q4_1 ? 20 : 18;
    float acc = 0.0f;
#define Q4_SUMS(blk, b) udot8(nibbles16((blk) + bytes - 16), a->q + 32 * (b))
#define Q4_TERMS8(blk, b, s, sc, mn)                                                          \
    (q4_1 ? _mm256_add_ps(term8(sc, a->d + (b), s),                                           \
                          _mm256_mul_ps(mn, _mm256_loadu_ps(a->ds + (b))))                     \
          : term8(sc, a->d + (b), _mm256_sub_epi32(s, _mm256_slli_epi32(csum8(a, b), 3))))
#define Q4_TERM(blk, b, s, sc, mn)                                                            \
    (q4_1 ? kv_gguf_term(sc, a->d[b], s) + (mn) * a->ds[b]                                    \
          : kv_gguf_term(sc, a->d[b], (s) - 8 * (a->s16[2 * (b)] + a->s16[2 * (b) + 1])))
    KV_ROW_DOT(bytes, q4_1, Q4_SUMS, Q4_TERMS8, Q4_TERM);
    return acc;
}
KV_AVX2 static float dot_q4_0(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_q4(row, a, n, 0); }
KV_AVX2 static float dot_q4_1(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_q4(row, a, n, 1); }

/* Q4_K and Q5_K: 32 bytes of qs hold sub-block 2 g (low nibbles) and 2 g + 1 (high nibbles);
 * Q5_K's fifth bit of sub-block j is bit j of the 32 bytes of qh, moved to bit 4 */
KV_AVX2 static inline float dot_k45(const uint8_t *row, const kv_gguf_act *a, int n, int q5)
{
    const int bytes = q5 ? 176 : 144;
    const __m256i m = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    float acc = 0.0f;
    for (int sb = 0; sb < n / KV_GGML_QK_K; sb++) {
        const uint8_t *blk = row + bytes * sb;
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + bytes - 128 + 32 * g));
            const __m256i half[2] = {_mm256_and_si256(v, m),
                                     _mm256_and_si256(_mm256_srli_epi16(v, 4), m)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * g + h, b = 8 * sb + j;
                const __m256i fifth = _mm256_and_si256(_mm256_srli_epi16(qh, j), one);
                const __m256i q = _mm256_or_si256(half[h], _mm256_slli_epi16(fifth, 4));
                const int32_t s = udot(q, a->q + 32 * b);
                acc += kv_gguf_k45_term(blk, j, a->d[b], s, csum32(a, b));
            }
        }
    }
    return acc;
}
KV_AVX2 static float dot_q4_k(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_k45(row, a, n, 0); }
KV_AVX2 static float dot_q5_k(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_k45(row, a, n, 1); }

/* Q6_K: for half g of a super-block, ql bytes 64 g .. +31 (A) and +32 .. +63 (B) and qh bytes
 * 32 g .. +31 give the four runs of 32 weights: A's low nibbles with qh bits 0-1, B's low with
 * bits 2-3, A's high with bits 4-5, B's high with bits 6-7 */
KV_AVX2 static float dot_q6_k(const uint8_t *row, const kv_gguf_act *a, int n)
{
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    float acc = 0.0f;
    for (int sb = 0; sb < n / KV_GGML_QK_K; sb++) {
        const uint8_t *blk = row + 210 * sb;
        const int8_t *scales = (const int8_t *)(blk + 192);
        const float d = kv_ggml_fp16_at(blk + 208);
        for (int g = 0; g < 2; g++) {
            const __m256i A = _mm256_loadu_si256((const __m256i *)(blk + 64 * g));
            const __m256i B = _mm256_loadu_si256((const __m256i *)(blk + 64 * g + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * g));
            const __m256i low[4] = {_mm256_and_si256(A, m4), _mm256_and_si256(B, m4),
                                    _mm256_and_si256(_mm256_srli_epi16(A, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(B, 4), m4)};
            for (int t = 0; t < 4; t++) {
                const int k = 4 * g + t, b = 8 * sb + k;
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(H, 2 * t), m2);
                const __m256i q = _mm256_or_si256(low[t], _mm256_slli_epi16(high, 4));
                const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256(
                                                              (const __m256i *)(a->q + 32 * b)));
                /* int16 lanes 0-7 are weights 0-15 (scale 2 k), lanes 8-15 weights 16-31 */
                const __m256i sc = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_set1_epi16(scales[2 * k])),
                    _mm_set1_epi16(scales[2 * k + 1]), 1);
                const int32_t isum = hsum(_mm256_madd_epi16(p, sc)) -
                                     32 * (scales[2 * k] * a->s16[2 * b] +
                                           scales[2 * k + 1] * a->s16[2 * b + 1]);
                acc += kv_gguf_term(d, a->d[b], isum);
            }
        }
    }
    return acc;
}

static const kv_gguf_row_dots DOTS = {dot_q4_0, dot_q4_1, dot_q8_0, dot_q4_k, dot_q5_k, dot_q6_k};
const kv_gguf_row_dots *kv_gguf_row_dots_avx2(void) { return &DOTS; }
#endif
