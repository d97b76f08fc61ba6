/**
 * @file kv_quant.h
 * KV-cache quantization formats (chapter 04): encode rows of K or V into a storage format,
 * decode them back, and the exact bytes each format costs.
 *
 * A cache keeps, for every (layer, slot, kv head), a run of rows t = 0, 1, ... of d elements.
 * In a quantized format that run is two planes:
 *
 *   codes  [n][row_bytes]   row t's d codes, packed along d; row_bytes = d * bits / 8
 *   meta   [n_meta]         scales (and zero points) of those rows, see each format
 *
 * and element j of row t is kvq_decode_element() (kv_quant_math.h), the same inline code on
 * the CPU and in CUDA kernels. Codes are always laid out by token, so attention reads a row
 * of K or V as one contiguous run whatever the format; only the metadata index differs.
 *
 * Formats (b = bytes per element including metadata; d = head dim):
 *
 * | format        | codes          | metadata per (layer, slot, kv head)          | b (d=128) |
 * |---------------|----------------|----------------------------------------------|-----------|
 * | fp32          | float          | none                                          | 4         |
 * | fp16          | binary16 bits  | none                                          | 2         |
 * | bf16          | bfloat16 bits  | none                                          | 2         |
 * | int8          | int8           | float scale [n]             (one per row)     | 1 + 4/d   |
 * | int8-g32/64/128 | int8         | float scale [n][d/G]        (per G channels)  | 1 + 4/G   |
 * | fp8-e4m3/e5m2 | fp8 bits       | none per row; one fp32 scale per tensor or    | 1         |
 * |               |                | per kv head, kept by the cache (4 bytes)      |           |
 * | int4-kivi     | 2 codes/byte   | V: kv_qsz [n][d/32]; K: kv_qsz [n/32][d]      | 0.5 + 4/32|
 * | int2-kivi     | 4 codes/byte   | same                                          | 0.25+4/32 |
 * | int4-g32      | 2 codes/byte   | float scale [n][d/32]  (K and V per token)    | 0.5 + 4/32|
 *
 * plus, for KIVI, a full-precision window (below). kv_quant_bytes_per_element() returns b,
 * kv_quant_fixed_bytes() what a format adds per (layer, kv head, K or V) independent of N.
 *
 * Rounding and special values, per format:
 *  - fp16: round to nearest even; beyond 65504 (from 65520 on) -> inf as IEEE; NaN -> 0x7fff.
 *  - bf16: round to nearest even; overflow -> inf; NaN -> 0x7fff.
 *  - fp8: code = fp8(fl(x / scale)), round to nearest even; values beyond the largest finite
 *    value (448 for E4M3, 57344 for E5M2), infinities included, saturate to +-max; NaN stays
 *    NaN (code 0x7f). Decode = fp8 value * scale. The scale is the caller's: per tensor (one
 *    for all kv heads of a layer's K, one for its V) or per kv head; kv_quant_fp8_calibrate()
 *    computes amax / max. The CPU converts in software, CUDA with the __nv_fp8_* types; the
 *    two give the same bits (tests/test_gpu_quant.c).
 *  - int8 (symmetric): s = amax / 127 (fp32), q = rint(x / s) (half to even), |q| <= 127;
 *    decode q * s. |x - decode| <= s / 2 (plus fp32 rounding). An all-zero group has s = 0.
 *    fp32 scales, not fp16: per row they cost 4/d bytes (3 % of an int8 element at d = 128),
 *    and they are exact for any amax, where an fp16 scale would go subnormal below
 *    amax ~ 0.008 and overflow above ~8.3e6, each breaking the s/2 bound.
 *  - int4-g32 (symmetric, plain): int8's rule with 4 bits in groups of 32 channels of a row,
 *    keys as values: s = amax / 7, q = rint(x / s) in [-7, 7], a two's-complement nibble
 *    (low nibble first); |x - decode| <= s / 2. The per-token 4-bit format KIVI compares its
 *    per-channel keys with, and what a cache without KIVI's machinery (no fp32 window, no
 *    32-token key blocks) stores at 4 bits.
 *  - int4 / int2 KIVI (asymmetric): per group, zero = min rounded down to fp16, scale =
 *    (max - zero) / (2^bits - 1) rounded up to fp16 (::kv_qsz), q = rint((x - zero) / scale)
 *    clamped to [0, 2^bits - 1], decode fmaf(q, scale, zero). The directed roundings keep the
 *    stored grid over the whole group, so |x - decode| <= scale / 2 (plus fp32 rounding). A
 *    group whose values are all one fp16 number has scale 0 and decodes exactly.
 *    Values: groups of 32 channels of one token row. Keys: groups of 32 tokens of one
 *    channel (outlier channels then get their own scale instead of inflating every token's).
 *
 * Non-finite input (int8, int4-g32 and KIVI): a group holding a NaN or an infinity (for KIVI also any
 * |x| > 65504, which its fp16 metadata cannot hold) is "poisoned": its codes are 0 and its
 * scale (and zero) are NaN, so every element of that group decodes to NaN, while the other
 * groups are untouched. That is what the fp32 cache would give attention anyway (a NaN or
 * infinite key makes the scores NaN), so quantization neither hides the fault nor spreads
 * it further; encode still returns KV_OK (it reports argument errors only) and the NaN scale
 * is the flag a caller can test.
 *
 * KIVI's full-precision window (phase 2, kv_cache): the newest tokens stay in fp32 (kvlab's
 * model computes in fp32, so recent tokens are then exactly what the fp32 cache holds), in a
 * ring of R = KV_KIVI_WINDOW rows per (layer, slot, kv head), for K and V alike. With Q the
 * number of tokens already quantized (a multiple of 32) and n the slot's length, tokens
 * Q .. n-1 live in ring row t % R. Writing token n when n - Q == R first encodes the oldest
 * 32 tokens Q .. Q+31 (keys as one block per channel, values row by row) into the code/meta
 * planes at rows Q .. Q+31, then Q += 32; the freed ring row (Q_old % R = n % R) takes token n.
 * So the window holds between R - 31 and R tokens once n > R, R must be a multiple of 32, and
 * attention reads row t from the planes when t < Q and from the ring otherwise. The 32 rows
 * to spill are contiguous in the ring (Q and R are multiples of 32), so one call encodes them:
 *   kv_quant_encode(fmt, role, ring + (Q % R) * d, 32, d, 0, codes + Q * row_bytes,
 *                   meta + kvq_meta_index(fmt, role, Q, 0, d), err)   (meta in 4-byte entries)
 * and the same with kvcu_quant_encode() on the device. Any run of rows t0 .. t0+n-1 of a
 * plane is encoded that way (for KIVI keys t0 a multiple of 32).
 */
#ifndef KV_QUANT_H
#define KV_QUANT_H

#include "kv_common.h"
#include "kv_quant_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Short name of a format ("int4-kivi"), or "?" for an unknown value. */
const char *kv_quant_name(int fmt);
/** The format named @p name (as kv_quant_name() spells it, or the short aliases "fp8" =
 * fp8-e4m3, "int4" = int4-kivi, "int2" = int2-kivi), or -1. */
int kv_quant_parse(const char *name);

/** Bytes of the code plane for @p n rows of @p d. */
size_t kv_quant_code_bytes(int fmt, int64_t n, int d);
/** Bytes of the metadata plane for @p n rows of @p d (KIVI keys: n rounded up to 32). */
size_t kv_quant_meta_bytes(int fmt, int role, int64_t n, int d);
/**
 * Bytes per cached element, scales and zero points included (b in L·2·N·H_kv·d·b): the
 * steady state, where the fixed costs below are spread over many tokens.
 * fp32 4, fp16/bf16 2, int8 1 + 4/d, int8-gG 1 + 4/G, fp8 1, int4-kivi 0.625, int2-kivi 0.375.
 */
double kv_quant_bytes_per_element(int fmt, int d);
/**
 * Bytes a format adds per (layer, kv head, K or V) whatever N: KIVI's fp32 window
 * (window · d · 4), fp8's per-head scale (4). 0 for the others.
 */
size_t kv_quant_fixed_bytes(int fmt, int d, int window);

/**
 * Check a call's shape: a known format and role, d >= 1, n >= 0; int8-gG needs G | d; KIVI
 * needs 32 | d, and for keys 32 | n; fp8 needs a finite scale > 0. KV_ERR_ARG, named.
 * Shared by the CPU and CUDA entry points.
 */
int kv_quant_check(int fmt, int role, int64_t n, int d, float scale, kv_err *err);

/**
 * The fp8 scale for data of largest magnitude @p amax: amax / max finite of the format, so
 * amax lands on the largest code. 1 when amax is 0 or not finite (nothing to scale by).
 */
float kv_quant_fp8_scale(int fmt, float amax);

/**
 * Calibrate fp8 scales on sample rows x [n_heads][n][d] (one kv head after another):
 * per_head = 1 gives each head its own amax / max in scales[h]; per_head = 0 one scale from
 * the amax over all heads, written to every scales[h] (so readers index by head either way).
 * Non-finite samples are skipped. scales [n_heads].
 */
int kv_quant_fp8_calibrate(int fmt, const float *x, int n_heads, int64_t n, int d, int per_head,
                           float *scales, kv_err *err);

/**
 * Encode @p n rows of @p d into @p fmt.
 *
 * x      [n][d]                    fp32 rows of one (layer, slot, kv head), oldest first
 * codes  [n][kvq_row_bytes(fmt,d)] out
 * meta   out, kv_quant_meta_bytes(fmt, role, n, d) bytes (NULL allowed when that is 0):
 *        int8: float [n][d/G]; KIVI values: kv_qsz [n][d/32]; KIVI keys: kv_qsz [n/32][d]
 * scale  fp8 only: this head's scale (ignored by other formats)
 * role   ::kv_qrole; only KIVI distinguishes keys (n a multiple of 32: whole token blocks)
 *
 * Returns KV_OK, or KV_ERR_ARG (kv_quant_check()) with nothing written; KIVI keys also
 * KV_ERR_NOMEM when their d-byte-per-token scratch cannot be allocated.
 */
int kv_quant_encode(int fmt, int role, const float *x, int64_t n, int d, float scale,
                    void *codes, void *meta, kv_err *err);

/**
 * Decode @p n rows back to fp32: x[t][j] = kvq_decode_element(fmt, role, codes, meta, t, j,
 * d, scale). x [n][d] out. KV_OK or KV_ERR_ARG.
 */
int kv_quant_decode(int fmt, int role, const void *codes, const void *meta, int64_t n, int d,
                    float scale, float *x, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
