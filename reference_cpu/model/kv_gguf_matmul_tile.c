/* A prefill's quantized matrix product in tiles of 8 tokens (kv_gguf_matmul_fast.h,
 * kv_gguf_matmul_tiles()): each weight row's blocks unpacked once, then multiplied by every
 * tile of the prompt, with each token's integer sums and float steps exactly those of
 * kv_gguf_matmul_avx2.c's row loops, so a token's outputs keep their bits whatever T is.
 *
 * Why a tile: the row loops take one token at a time, and a token's block costs the four-bit
 * unpacking, a horizontal sum of eight int32 and the scalar float steps. Here the 8 tokens of
 * a tile sit side by side in one register, so none of that is repeated per token:
 *
 *   activations, regrouped once per call:  q[tile][block][group g of 4 codes][token][4]
 *   a weight block's group g (4 codes):    broadcast to the 8 tokens (one 32-bit load)
 *   _mm256_maddubs_epi16 + _mm256_madd_epi16: lane l = sum of the group's 4 products for
 *                                          token l; 8 groups added = the block's exact sum
 *
 * No horizontal sum: lane l of the accumulated vector is token l's sum q_j c_j over the
 * block's 32 codes (the same integer as the row loop's), and the float term that follows,
 * (d dx) * (float)s (+ m ds for Q4_1) added into an accumulator per token, is the row loop's
 * kv_gguf_term() lane by lane, in block order (no FMA: the two roundings stay two).
 *
 * The K types the same way per 32 weights: Q4_K and Q5_K's (d dx) (sc s) - (dmin dx) (mn sum c)
 * with the sub-block's sc and mn, Q6_K's (d dx) sum_h sc_h (s_h - 32 sum_h c) over its two
 * halves of 16 (kv_gguf_matmul_fast.h's terms, the row loops' order).
 *
 * Integer range: codes below 32 (Q4_x, Q4_K, Q5_K) against |c| <= 127 give |pair| <= 7874
 * per int16 lane, so four groups are added in int16 (31496) before one widening; Q6_K's
 * codes (< 64, pairs up to 16002) two groups, widened by its half's scale; Q8_0's codes go
 * through the sign trick of kv_gguf_matmul_avx2.c (|w| <= 128, pairs up to 32512), each
 * group widened on its own. */
#include "kv_gguf_matmul_fast.h"
#include "kv_gguf_quant.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv_ops.h"

#define TILE 8          /* tokens per tile: one per float lane */
#define ROWS 16         /* rows unpacked together, each then met by every tile */
#define PARALLEL_MIN (1 << 15)

#if !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
int kv_gguf_matmul_tiles(float *y, const kv_gguf_act *act, const void *W, int type, int T,
                         int in, int out, uint64_t row_bytes, int *done, kv_err *err)
{
    (void)y, (void)act, (void)W, (void)type, (void)T, (void)in, (void)out, (void)row_bytes;
    (void)err;
    *done = 0;
    return KV_OK;
}
#else
#include <immintrin.h>

#define KV_AVX2 __attribute__((target("avx2")))

/* A row unpacked: per block of 32, its codes in weight order (Q8_0: |w|, then w for the
 * signs), its scale d and (Q4_1) minimum m as floats (Q4_K, Q5_K: d and dmin of its
 * super-block, Q6_K: d), and the K types' integer scales: sc[2 b] and sc[2 b + 1] (Q4_K,
 * Q5_K: the sub-block's scale and minimum; Q6_K: its two halves' scales). */
typedef struct { uint8_t *u; float *d, *m; int32_t *sc; } unpacked;

/* bytes of one unpacked block of 32 */
#define UNPACKED_BYTES (64 + 2 * sizeof(float) + 2 * sizeof(int32_t))

/* the activations of tokens 0 .. T8 - 1 regrouped (layout in the file comment):
 * q [T8 / 8][nb][8][8][4], dx, ds [T8 / 8][nb][8], csum [T8 / 8][nb][8] (sum of the block's
 * 32 codes: Q4_0's -8, the minimums), s16 [T8 / 8][nb][2][8] (its halves' sums, Q6_K's -32) */
typedef struct { int8_t *q; float *dx, *ds; int32_t *csum, *s16; } tiles;

static void regroup(tiles *a, const kv_gguf_act *act, int T8, int nb)
{
    for (int t = 0; t < T8; t++) {
        const int k = t / TILE, l = t % TILE;
        for (int b = 0; b < nb; b++) {
            const size_t kb = (size_t)k * nb + b;
            for (int g = 0; g < 8; g++)
                memcpy(a->q + ((kb * 8 + g) * TILE + l) * 4, act[t].q + 32 * b + 4 * g, 4);
            a->dx[kb * TILE + l] = act[t].d[b];
            a->ds[kb * TILE + l] = act[t].ds[b];
            a->csum[kb * TILE + l] = act[t].s16[2 * b] + act[t].s16[2 * b + 1];
            a->s16[(2 * kb) * TILE + l] = act[t].s16[2 * b];
            a->s16[(2 * kb + 1) * TILE + l] = act[t].s16[2 * b + 1];
        }
    }
}

/* a K-type row's super-blocks into @p r, as the portable row loops read them
 * (kv_gguf_matmul_fast.c) */
static void unpack_k(const unpacked *r, const uint8_t *row, int type, int nb)
{
    for (int sb = 0; sb < nb / 8; sb++) {
        if (type == KV_GGML_Q6_K) {
            const uint8_t *blk = row + 210 * sb, *ql = blk, *qh = blk + 128;
            for (int k = 0; k < 8; k++) {
                const int b = 8 * sb + k, g = k / 4, t = k % 4;
                for (int l = 0; l < 32; l++) {
                    const int q = 32 * t + l;  /* weight 128 g + q */
                    r->u[32 * b + l] = (uint8_t)(((ql[64 * g + q % 64] >> (4 * (q / 64))) & 15) |
                                                 ((qh[32 * g + l] >> (2 * t)) & 3) << 4);
                }
                r->d[b] = kv_ggml_fp16_at(blk + 208);
                r->sc[2 * b] = ((const int8_t *)blk)[192 + 2 * k];
                r->sc[2 * b + 1] = ((const int8_t *)blk)[192 + 2 * k + 1];
            }
            continue;
        }
        const int q5 = type == KV_GGML_Q5_K, bytes = q5 ? 176 : 144;
        const uint8_t *blk = row + (size_t)bytes * sb, *qh = blk + 16, *qs = blk + bytes - 128;
        for (int j = 0; j < 8; j++) {
            const int b = 8 * sb + j;
            for (int l = 0; l < 32; l++)
                r->u[32 * b + l] = (uint8_t)(((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) |
                                             (q5 ? (qh[l] >> j) & 1 : 0) << 4);
            r->d[b] = kv_ggml_fp16_at(blk);
            r->m[b] = kv_ggml_fp16_at(blk + 2);
            kv_ggml_scale_min_k4(blk + 4, j, &r->sc[2 * b], &r->sc[2 * b + 1]);
        }
    }
}

/* row @p row's nb blocks into @p r */
KV_AVX2 static void unpack_row(const unpacked *r, const uint8_t *row, int type, int nb)
{
    if (type != KV_GGML_Q4_0 && type != KV_GGML_Q4_1 && type != KV_GGML_Q8_0) {
        unpack_k(r, row, type, nb);
        return;
    }
    const int q8 = type == KV_GGML_Q8_0, q4_1 = type == KV_GGML_Q4_1;
    const int bytes = q8 ? 34 : q4_1 ? 20 : 18;
    const __m128i m4 = _mm_set1_epi8(15);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)bytes * b;
        r->d[b] = kv_ggml_fp16_at(blk);
        r->m[b] = q4_1 ? kv_ggml_fp16_at(blk + 2) : 0.0f;
        if (q8) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
            _mm256_storeu_si256((__m256i *)(r->u + 64 * b), _mm256_sign_epi8(w, w));
            _mm256_storeu_si256((__m256i *)(r->u + 64 * b + 32), w);
        } else { /* low nibbles: weights 0-15, high: 16-31 */
            const __m128i v = _mm_loadu_si128((const __m128i *)(blk + bytes - 16));
            _mm_storeu_si128((__m128i *)(r->u + 32 * b), _mm_and_si128(v, m4));
            _mm_storeu_si128((__m128i *)(r->u + 32 * b + 16),
                             _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        }
    }
}

/* four bytes at p to every 32-bit lane */
KV_AVX2 static inline __m256i bcast4(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Q4_0 / Q4_1 (and Q4_K, Q5_K: codes < 32): block b's sums q_j c_j, lane l for token l
 * (u: 32 codes; c: the tile's block, 8 groups of [8 tokens][4]) */
KV_AVX2 static inline __m256i sums_q4(const uint8_t *u, const int8_t *c)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) { /* four groups in int16, then widened */
        __m256i p = _mm256_setzero_si256();
        for (int g = 4 * h; g < 4 * h + 4; g++)
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(
                                        bcast4(u + 4 * g),
                                        _mm256_loadu_si256((const __m256i *)(c + 32 * g))));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
    }
    return s;
}

/* Q8_0: the same with |w| against c carrying w's sign (u: |w| [32], then w [32]) */
KV_AVX2 static inline __m256i sums_q8(const uint8_t *u, const int8_t *c)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        const __m256i cg = _mm256_loadu_si256((const __m256i *)(c + 32 * g));
        const __m256i p = _mm256_maddubs_epi16(bcast4(u + 4 * g),
                                               _mm256_sign_epi8(cg, bcast4(u + 32 + 4 * g)));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
    }
    return s;
}

/* Q6_K: block b's sum_h sc_h (sum q c over half h - 32 sum c over half h), lane l for token
 * l; s16: the tile's half sums [2][8] */
KV_AVX2 static inline __m256i sums_q6(const uint8_t *u, const int8_t *c, const int32_t *sc,
                                     const int32_t *s16)
{
    __m256i s = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i sch = _mm256_set1_epi16((int16_t)sc[h]);
        for (int g = 4 * h; g < 4 * h + 4; g += 2) { /* two groups in int16 */
            const __m256i p = _mm256_add_epi16(
                _mm256_maddubs_epi16(bcast4(u + 4 * g),
                                     _mm256_loadu_si256((const __m256i *)(c + 32 * g))),
                _mm256_maddubs_epi16(bcast4(u + 4 * g + 4),
                                     _mm256_loadu_si256((const __m256i *)(c + 32 * g + 32))));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, sch));
        }
        s = _mm256_sub_epi32(s, _mm256_mullo_epi32(_mm256_set1_epi32(32 * sc[h]),
                                                   _mm256_loadu_si256((const __m256i *)
                                                                      (s16 + TILE * h))));
    }
    return s;
}

/* y[token 8 k + l][i] for the 8 tokens of tile k and unpacked row r: the row loop's float
 * steps, one token per lane */
KV_AVX2 static void tile_row(float *y, int out, int i, const unpacked *r, const tiles *a, int k,
                             int nb, int type)
{
    const size_t kb = (size_t)k * nb;
    const int8_t *c = a->q + kb * 256;
    const float *dx = a->dx + kb * TILE, *ds = a->ds + kb * TILE;
    const int32_t *cs = a->csum + kb * TILE;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256 sdx = _mm256_mul_ps(_mm256_set1_ps(r->d[b]),
                                         _mm256_loadu_ps(dx + TILE * b));   /* d dx */
        __m256 term;
        if (type == KV_GGML_Q8_0) {
            term = _mm256_mul_ps(sdx, _mm256_cvtepi32_ps(sums_q8(r->u + 64 * b, c + 256 * b)));
        } else if (type == KV_GGML_Q4_0) { /* (d dx) (s - 8 sum c) */
            const __m256i s = _mm256_sub_epi32(
                sums_q4(r->u + 32 * b, c + 256 * b),
                _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(cs + TILE * b)), 3));
            term = _mm256_mul_ps(sdx, _mm256_cvtepi32_ps(s));
        } else if (type == KV_GGML_Q6_K) {
            term = _mm256_mul_ps(sdx, _mm256_cvtepi32_ps(sums_q6(r->u + 32 * b, c + 256 * b,
                                                                 r->sc + 2 * b,
                                                                 a->s16 + 2 * (kb + b) * TILE)));
        } else if (type != KV_GGML_Q4_1) { /* Q4_K, Q5_K: (d dx) (sc s) - (dmin dx) (mn sum c) */
            const __m256i s = sums_q4(r->u + 32 * b, c + 256 * b);
            const __m256i cs_b = _mm256_loadu_si256((const __m256i *)(cs + TILE * b));
            term = _mm256_sub_ps(
                _mm256_mul_ps(sdx, _mm256_cvtepi32_ps(
                                       _mm256_mullo_epi32(_mm256_set1_epi32(r->sc[2 * b]), s))),
                _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(r->m[b]),
                                            _mm256_loadu_ps(dx + TILE * b)),
                              _mm256_cvtepi32_ps(_mm256_mullo_epi32(
                                  _mm256_set1_epi32(r->sc[2 * b + 1]), cs_b))));
        } else { /* Q4_1: (d dx) s + m ds */
            term = _mm256_add_ps(
                _mm256_mul_ps(sdx, _mm256_cvtepi32_ps(sums_q4(r->u + 32 * b, c + 256 * b))),
                _mm256_mul_ps(_mm256_set1_ps(r->m[b]), _mm256_loadu_ps(ds + TILE * b)));
        }
        acc = _mm256_add_ps(acc, term);
    }
    float v[TILE];
    _mm256_storeu_ps(v, acc);
    for (int l = 0; l < TILE; l++) y[(size_t)(TILE * k + l) * out + i] = v[l];
}

/* rows i0 .. i1 - 1 (at most ROWS) for every tile; scratch: ROWS unpacked rows */
KV_AVX2 static void tile_rows(float *y, const tiles *a, const uint8_t *W, uint64_t row_bytes,
                              int type, int n_tiles, int nb, int out, int i0, int i1,
                              uint8_t *scratch)
{
    unpacked r[ROWS];
    for (int i = i0; i < i1; i++) {
        uint8_t *p = scratch + (size_t)(i - i0) * nb * UNPACKED_BYTES;
        float *f = (float *)(p + (size_t)nb * 64);
        r[i - i0] = (unpacked){p, f, f + nb, (int32_t *)(f + 2 * nb)};
        unpack_row(&r[i - i0], W + (size_t)i * row_bytes, type, nb);
    }
    for (int k = 0; k < n_tiles; k++) /* the tile's activations stay in cache for ROWS rows */
        for (int i = i0; i < i1; i++) tile_row(y, out, i, &r[i - i0], a, k, nb, type);
}

int kv_gguf_matmul_tiles(float *y, const kv_gguf_act *act, const void *W, int type, int T,
                         int in, int out, uint64_t row_bytes, int *done, kv_err *err)
{
    *done = 0;
    if (T < TILE || !kv_gguf_matmul_fast_has(type)) return KV_OK;
    const int nb = in / 32, n_tiles = T / TILE, T8 = n_tiles * TILE;
    const size_t row_scratch = (size_t)nb * UNPACKED_BYTES;
    const int threads = omp_get_max_threads();
    tiles a = {malloc((size_t)T8 * in), malloc(sizeof(float) * T8 * nb),
               malloc(sizeof(float) * T8 * nb), malloc(sizeof(int32_t) * T8 * nb),
               malloc(sizeof(int32_t) * T8 * nb * 2)};
    uint8_t *scratch = malloc(row_scratch * ROWS * threads);
    if (!a.q || !a.dx || !a.ds || !a.csum || !a.s16 || !scratch) {
        free(a.q), free(a.dx), free(a.ds), free(a.csum), free(a.s16), free(scratch);
        return kv_fail(err, KV_ERR_NOMEM, "matmul: tiles of %d tokens", T8);
    }
    regroup(&a, act, T8, nb);
    const int64_t work = (int64_t)T8 * in * out;
    const int n_blocks = (out + ROWS - 1) / ROWS;
    #pragma omp parallel for schedule(static) \
        if (work >= PARALLEL_MIN && kv_parallel_worth(INT64_MAX))
    for (int blk = 0; blk < n_blocks; blk++) {
        const int i1 = blk * ROWS + ROWS < out ? blk * ROWS + ROWS : out;
        tile_rows(y, &a, (const uint8_t *)W, row_bytes, type, n_tiles, nb, out, blk * ROWS,
                  i1, scratch + row_scratch * ROWS * omp_get_thread_num());
    }
    free(a.q), free(a.dx), free(a.ds), free(a.csum), free(a.s16), free(scratch);
    *done = T8;
    return KV_OK;
}
#endif
