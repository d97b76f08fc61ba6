/**
 * @file kv_gguf_matmul_fast.h
 * kv_gguf_matmul() (kv_gguf_matmul.h) arranged for speed: integer dot products against the
 * quantized codes, as ggml computes them.
 *
 * The activations of a token are rounded to int8 in blocks of 32 as ggml's quantize_row_q8_0
 * and quantize_row_q8_1 round them (kv_gguf_act_quantize(): code c = rint(x * (127 / max|x|)),
 * step dx = max|x| / 127 stored as binary16, and for Q4_1's minimum the block's sum
 * ds = binary16(dx * sum c)), so that a block of 32 weights times 32 activations is one integer
 * sum of code products, exact in int32, times a float scale:
 *     Q8_0: sum_j d q_j  x_j  ~  (d dx) * sum q_j c_j
 *     Q4_0: sum_j d (q_j - 8) x_j  ~  (d dx) * (sum q_j c_j - 8 sum c_j)
 *     Q4_1: sum_j (d q_j + m) x_j  ~  (d dx) * sum q_j c_j + m * ds
 *     Q4_K, Q5_K: per 32-weight sub-block, (d dx) * sc * sum q_j c_j - (dmin dx) * mn * sum c_j
 *     Q6_K: per 32 weights (two sub-blocks of 16), (d dx) * sum_h sc_h (sum q c - 32 sum c)
 * The only approximation is the rounding of the activations, |x - dx c| <= max|x| / 254 per
 * block plus 127 times the binary16 rounding of dx (and, for Q4_1, that of ds), so
 * |fast - reference| <= sum_j |w_j| (max|x|_block / 254 + ...) plus float roundings (derived
 * in tests/test_gguf_matmul.c, which holds every type to it). Rounding as ggml does makes the
 * codes llama.cpp's own: the same model on the same file gives nearly its logits. Other types
 * go through the reference's row (dequantize, then fp32 dot).
 *
 * Where kv_matmul_fast() runs AVX2 (kv_matmul_fast_isa(); kv_matmul_fast_use_avx2() switches
 * both) the integer sums are taken 32 codes a step in 256-bit registers, the 4-bit codes
 * unpacked there (kv_gguf_matmul_avx2.c); elsewhere by the plain loops of kv_gguf_matmul_fast.c. The integer
 * sums are exact either way and the float steps after them are the same operations in the
 * same order, so both give the same bits. Threads split the rows (OpenMP). A prefill (8
 * tokens or more) under AVX2 runs in tiles of 8 tokens, each row's blocks unpacked once for
 * the whole prompt (kv_gguf_matmul_tiles()), with the same bits.
 */
#ifndef KV_GGUF_MATMUL_FAST_H
#define KV_GGUF_MATMUL_FAST_H

#include <stdint.h>

#include "kv_common.h"
#include "kv_gguf_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Activations per rounding block. */
#define KV_GGUF_ACT_BLOCK 32

/**
 * kv_gguf_matmul() within the bound above: y[t][i] ~ sum_j dequant(W row i)[j] x[t][j].
 * x [T][in], y [T][out], W [out][row bytes]; the same checks and statuses. A token with an
 * infinite or NaN activation gets NaN in every output.
 */
int kv_gguf_matmul_fast(float *y, const float *x, const void *W, int type, int T, int in,
                        int out, kv_err *err);

/** kv_gguf_matmul_fast() over rows @p ld bytes apart, as kv_gguf_matmul_ld(). */
int kv_gguf_matmul_fast_ld(float *y, const float *x, const void *W, int type, int T, int in,
                           int out, uint64_t ld, kv_err *err);

/** 1 when kv_gguf_matmul_fast() has integer dot products for @p type (Q4_0, Q4_1, Q8_0, Q4_K,
 * Q5_K, Q6_K); 0 when it runs the reference's row. */
int kv_gguf_matmul_fast_has(int type);

/** One token's activations rounded to int8 codes, blocks of 32. */
typedef struct {
    const int8_t *q;    /**< [n] codes, |c| <= 127 */
    const float *d;     /**< [n / 32] steps dx (binary16 values); 0 for an all-zero (or below
                         *   1.5e-36) block, NaN for a block holding an infinity or NaN */
    const float *ds;    /**< [n / 32] binary16(fl(max|x| / 127) * sum of the block's codes) */
    const int16_t *s16; /**< [n / 16] sums of 16 codes (the offsets' and minimums' terms) */
} kv_gguf_act;

/**
 * Round x [n] (n a multiple of 32) to codes as ggml does: per block c = rint(x * fl(127 /
 * amax)) within +-127 (amax = max |x|), dx = binary16(fl(amax / 127)), ds = binary16(fl(amax
 * / 127) * sum c). A block whose step would fall below FLT_MIN gets dx = ds = 0 and codes 0
 * (its values are below 127 * 2^-126). q [n], d [n / 32], ds [n / 32], s16 [n / 16].
 */
void kv_gguf_act_quantize(const float *x, int n, int8_t *q, float *d, float *ds, int16_t *s16);

/* ---- the rows, private to kv_gguf_matmul_fast.c and kv_gguf_matmul_avx2.c --------------- */

/** One row's dot with one token: the portable loops and their AVX2 twins, per type. */
typedef float (*kv_gguf_row_dot)(const uint8_t *row, const kv_gguf_act *a, int n);

/** The row loops of the types with integer dot products. */
typedef struct { kv_gguf_row_dot q4_0, q4_1, q8_0, q4_k, q5_k, q6_k; } kv_gguf_row_dots;

/** The AVX2 twins (kv_gguf_matmul_avx2.c); NULL off x86-64. */
const kv_gguf_row_dots *kv_gguf_row_dots_avx2(void);

/**
 * Tokens 0 .. T8 - 1 of y (T8 = T rounded down to a multiple of 8; *done = T8) in tiles of 8
 * tokens, each weight row unpacked once for all of them (kv_gguf_matmul_tile.c, AVX2): the
 * same integer sums and float steps per token as the AVX2 row loops, so the same bits. *done
 * = 0 (nothing written) for T < 8, a type without integer dots or off x86-64; the
 * caller's row loops take the tokens from *done on. act [T] as kv_gguf_matmul_fast_ld()
 * rounds them; the caller has checked the shapes. KV_ERR_NOMEM for the regrouped codes.
 */
int kv_gguf_matmul_tiles(float *y, const kv_gguf_act *act, const void *W, int type, int T,
                         int in, int out, uint64_t row_bytes, int *done, kv_err *err);

/** The float steps shared by both: a block's term from its exact integer sums. */
static inline float kv_gguf_term(float scale, float dx, int32_t isum)
{
    return (scale * dx) * (float)isum;
}

/** Activation block @p b's Q4_0 or Q4_1 term from sum q c (@p s):
 * (d dx) (s - 8 sum c), or (d dx) s + m ds. */
static inline float kv_gguf_q4_term(const uint8_t *blk, const kv_gguf_act *a, int b, int32_t s,
                                    int q4_1)
{
    const float d = kv_ggml_fp16_at(blk);
    if (q4_1) return kv_gguf_term(d, a->d[b], s) + kv_ggml_fp16_at(blk + 2) * a->ds[b];
    return kv_gguf_term(d, a->d[b], s - 8 * (a->s16[2 * b] + a->s16[2 * b + 1]));
}

/** Sub-block @p j's term of a Q4_K or Q5_K block from sum q c (@p s) and sum c (@p csum):
 * (d dx) (sc s) - (dmin dx) (mn csum). */
static inline float kv_gguf_k45_term(const uint8_t *blk, int j, float dx, int32_t s, int32_t csum)
{
    int sc, mn;
    kv_ggml_scale_min_k4(blk + 4, j, &sc, &mn);
    return kv_gguf_term(kv_ggml_fp16_at(blk), dx, sc * s) -
           kv_gguf_term(kv_ggml_fp16_at(blk + 2), dx, mn * csum);
}

#ifdef __cplusplus
}
#endif
#endif
