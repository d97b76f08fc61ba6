/* Quantized matrix times activations with integer dot products (kv_gguf_matmul_fast.h): the
 * activations rounded to int8 per 32, the portable row loops, the dispatch to the AVX2 twins
 * (kv_gguf_matmul_avx2.c), and the threads.
 *
 * Each row loop walks the row's blocks in order, takes a block's exact integer sum of code
 * products, and adds its float term (kv_gguf_term(): (scale * dx) * sum) to one accumulator.
 * The AVX2 twins compute the same integer sums in registers and then run these float steps
 * unchanged, so the two give the same bits (tests/test_gguf_matmul.c). */
#include "kv_gguf_matmul_fast.h"
#include "kv_gguf_matmul.h"
#include "kv_gguf_quant.h"
#include "kv_gguf_requant.h"
#include "kv_ops.h"
#include "kv_ops_fast.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* rows a thread takes at a time, and the smallest product worth a parallel region (as
 * kv_ops_fast.c) */
#define ROWS 16
#define PARALLEL_MIN (1 << 15)

/* ---- the activations --------------------------------------------------------------------
 * Per block of 32, as ggml's quantize_row_q8_0 / q8_1 (AVX2: round to nearest even):
 * c = rint(x * fl(127 / amax)), so |x - (amax / 127) c| <= amax / 254 (plus the roundings of
 * the inverse and the product) and the largest magnitude lands on +-127; the step dx is
 * amax / 127 rounded to binary16, as ggml stores it. The clamp is a guard only:
 * |x * fl(127 / amax)| <= 127 (1 + 2u), which rounds to 127 at most. */
void kv_gguf_act_quantize(const float *x, int n, int8_t *q, float *d, float *ds, int16_t *s16)
{
    for (int b = 0; b < n / KV_GGUF_ACT_BLOCK; b++) {
        const float *xb = x + b * KV_GGUF_ACT_BLOCK;
        int8_t *qb = q + b * KV_GGUF_ACT_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < KV_GGUF_ACT_BLOCK; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax || a != a ? a : amax; /* a NaN sticks */
        }
        float dx = amax / 127.0f;
        if (!(amax <= FLT_MAX)) dx = NAN;        /* every term of the block NaN */
        else if (dx < FLT_MIN) dx = 0.0f;       /* all zero, or too small to scale */
        const float id = dx > 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < KV_GGUF_ACT_BLOCK; j++) {
            const float c = dx > 0.0f ? fminf(fmaxf(rintf(xb[j] * id), -127.0f), 127.0f) : 0.0f;
            qb[j] = (int8_t)c;
        }
        int csum = 0;
        for (int h = 0; h < 2; h++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += qb[16 * h + j];
            s16[2 * b + h] = (int16_t)s;
            csum += s;
        }
        /* binary16, as ggml stores them (a NaN step stays NaN) */
        d[b] = dx == dx ? kv_ggml_fp16(kv_ggml_fp32_to_fp16(dx)) : dx;
        ds[b] = dx == dx ? kv_ggml_fp16(kv_ggml_fp32_to_fp16(dx * (float)csum)) : dx;
    }
}

/* the sum of the 32 codes of activation block b */
static int32_t csum32(const kv_gguf_act *a, int b) { return a->s16[2 * b] + a->s16[2 * b + 1]; }

/* ---- the portable rows (layouts: kv_gguf_quant.c, kv_gguf_quant_k.c) -------------------- */

static float dot_q8_0(const uint8_t *row, const kv_gguf_act *a, int n)
{
    float acc = 0.0f;
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        const int8_t *c = a->q + 32 * b;
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += (int8_t)blk[2 + j] * c[j];
        acc += kv_gguf_term(kv_ggml_fp16_at(blk), a->d[b], s);
    }
    return acc;
}

/* sum_j q_j c_j over one block of 16 bytes of nibbles: weight j low, weight j + 16 high */
static int32_t nibble_dot(const uint8_t *qs, const int8_t *c)
{
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += (qs[j] & 15) * c[j] + (qs[j] >> 4) * c[j + 16];
    return s;
}

/* Q4_0 (18-byte blocks: d, codes) and Q4_1 (20 bytes: d, m, codes) */
static float dot_q4(const uint8_t *row, const kv_gguf_act *a, int n, int q4_1)
{
    const int bytes = q4_1 ? 20 : 18;
    float acc = 0.0f;
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *blk = row + bytes * b;
        const int32_t s = nibble_dot(blk + bytes - 16, a->q + 32 * b);
        acc += kv_gguf_q4_term(blk, a, b, s, q4_1);
    }
    return acc;
}
static float dot_q4_0(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_q4(row, a, n, 0); }
static float dot_q4_1(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_q4(row, a, n, 1); }

/* Q4_K (144-byte blocks) and Q5_K (176: the fifth bits in qh, bytes 16-47): sub-block j of 32
 * weights meets activation block 8 sb + j */
static float dot_k45(const uint8_t *row, const kv_gguf_act *a, int n, int q5)
{
    const int bytes = q5 ? 176 : 144;
    float acc = 0.0f;
    for (int sb = 0; sb < n / KV_GGML_QK_K; sb++) {
        const uint8_t *blk = row + bytes * sb, *qh = blk + 16, *qs = blk + bytes - 128;
        for (int j = 0; j < 8; j++) {
            const int b = 8 * sb + j;
            const int8_t *c = a->q + 32 * b;
            int32_t s = 0;
            for (int l = 0; l < 32; l++) {
                const int low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                s += (low | (q5 ? (qh[l] >> j) & 1 : 0) << 4) * c[l];
            }
            acc += kv_gguf_k45_term(blk, j, a->d[b], s, csum32(a, b));
        }
    }
    return acc;
}
static float dot_q4_k(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_k45(row, a, n, 0); }
static float dot_q5_k(const uint8_t *row, const kv_gguf_act *a, int n) { return dot_k45(row, a, n, 1); }

/* Q6_K: the 32 weights 32 k .. 32 k + 31 (k = 0..7) meet activation block 8 sb + k; their
 * two sub-blocks of 16 have scales 2 k and 2 k + 1 */
static float dot_q6_k(const uint8_t *row, const kv_gguf_act *a, int n)
{
    float acc = 0.0f;
    for (int sb = 0; sb < n / KV_GGML_QK_K; sb++) {
        const uint8_t *blk = row + 210 * sb, *ql = blk, *qh = blk + 128;
        const int8_t *scales = (const int8_t *)(blk + 192);
        const float d = kv_ggml_fp16_at(blk + 208);
        for (int k = 0; k < 8; k++) {
            const int b = 8 * sb + k, g = k / 4, t = k % 4;
            const int8_t *c = a->q + 32 * b;
            int32_t isum = 0;
            for (int h = 0; h < 2; h++) {
                int32_t s = 0;
                for (int l = 16 * h; l < 16 * h + 16; l++) {
                    const int r = 32 * t + l;  /* weight 128 g + r */
                    const int low = (ql[64 * g + r % 64] >> (4 * (r / 64))) & 15;
                    const int high = (qh[32 * g + l] >> (2 * t)) & 3;
                    s += (low | high << 4) * c[l];
                }
                isum += scales[2 * k + h] * (s - 32 * a->s16[2 * b + h]);
            }
            acc += kv_gguf_term(d, a->d[b], isum);
        }
    }
    return acc;
}

static const kv_gguf_row_dots PORTABLE = {dot_q4_0, dot_q4_1, dot_q8_0, dot_q4_k, dot_q5_k,
                                          dot_q6_k};

/* the row loop of @p type in a set of loops; NULL for a type without one */
static kv_gguf_row_dot pick(const kv_gguf_row_dots *dots, int type)
{
    switch (type) {
    case KV_GGML_Q4_0: return dots->q4_0;
    case KV_GGML_Q4_1: return dots->q4_1;
    case KV_GGML_Q8_0: return dots->q8_0;
    case KV_GGML_Q4_K: return dots->q4_k;
    case KV_GGML_Q5_K: return dots->q5_k;
    case KV_GGML_Q6_K: return dots->q6_k;
    default: return NULL;
    }
}

int kv_gguf_matmul_fast_has(int type) { return pick(&PORTABLE, type) != NULL; }

/* ---- dispatch ----------------------------------------------------------------------------
 * AVX2 where kv_matmul_fast() runs it (kv_ops_fast.h): one switch, kv_matmul_fast_use_avx2(),
 * for every matrix product of the model. */
static int use_avx2(void) { return strcmp(kv_matmul_fast_isa(), "avx2") == 0; }

int kv_gguf_matmul_fast(float *y, const float *x, const void *W, int type, int T, int in,
                        int out, kv_err *err)
{
    return kv_gguf_matmul_fast_ld(y, x, W, type, T, in, out, 0, err);
}

int kv_gguf_matmul_fast_ld(float *y, const float *x, const void *W, int type, int T, int in,
                           int out, uint64_t ld, kv_err *err)
{
    uint64_t row_bytes = ld; /* the stride between rows */
    const int st = kv_gguf_matmul_ld_check(type, T, in, out, &row_bytes, err);
    if (st != KV_OK) return st;
    const kv_gguf_row_dots *avx2 = use_avx2() ? kv_gguf_row_dots_avx2() : NULL;
    const kv_gguf_row_dot dot = pick(avx2 ? avx2 : &PORTABLE, type);
    if (!dot) /* no integer path */
        return kv_gguf_matmul_ld(y, x, W, type, T, in, out, row_bytes, err);

    /* every token's activations rounded once: codes [T][in], steps [T][in / 32],
     * sums [T][in / 16] */
    int8_t *q = malloc((size_t)T * in + 1);
    float *d = malloc((size_t)T * (in / 32) * sizeof(float) + 1);
    float *ds = malloc((size_t)T * (in / 32) * sizeof(float) + 1);
    int16_t *s16 = malloc((size_t)T * (in / 16) * sizeof(int16_t) + 1);
    kv_gguf_act *act = malloc((size_t)T * sizeof(kv_gguf_act) + 1);
    if (!q || !d || !ds || !s16 || !act) {
        free(q), free(d), free(ds), free(s16), free(act);
        return kv_fail(err, KV_ERR_NOMEM, "matmul: activations of %d tokens", T);
    }
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * in;
        kv_gguf_act_quantize(x + o, in, q + o, d + o / 32, ds + o / 32, s16 + o / 16);
        act[t] = (kv_gguf_act){q + o, d + o / 32, ds + o / 32, s16 + o / 16};
    }
    /* a prefill: whole tiles of 8 tokens first, each row unpacked once for all of them */
    int done = 0;
    const int st_tiles = avx2 ? kv_gguf_matmul_tiles(y, act, W, type, T, in, out, row_bytes,
                                                     &done, err) : KV_OK;
    const int64_t work = (int64_t)(T - done) * in * out;
    /* the tokens left (all of them without tiles) */
    const int n_blocks = done < T && st_tiles == KV_OK ? (out + ROWS - 1) / ROWS : 0;
    #pragma omp parallel for schedule(static) \
        if (work >= PARALLEL_MIN && kv_parallel_worth(INT64_MAX))
    for (int blk = 0; blk < n_blocks; blk++) {
        const int i1 = blk * ROWS + ROWS < out ? blk * ROWS + ROWS : out;
        for (int i = blk * ROWS; i < i1; i++) {
            const uint8_t *row = (const uint8_t *)W + (size_t)i * row_bytes;
            for (int t = done; t < T; t++) y[(size_t)t * out + i] = dot(row, &act[t], in);
        }
    }
    free(q), free(d), free(ds), free(s16), free(act);
    return st_tiles;
}
