/**
 * @file kv_gguf_quant.h
 * The tensor types of a GGUF file (ggml's type codes) and their dequantization to fp32.
 *
 * A GGUF tensor stores each row of ne[0] weights as blocks: `block` weights packed into
 * `block_bytes` bytes. A float type is a block of one (F32, F16, BF16); a quantized type packs
 * 32 or 256 weights as small integer codes with one or more fp16 scales (Q4_0 ... Q8_0, then
 * the "K" types Q2_K ... Q6_K, whose 256-weight super-blocks carry 6- or 8-bit scales of
 * their 16- or 32-weight sub-blocks). The layout of every block and the formula that turns it
 * into floats are drawn beside its dequantizer in kv_gguf_quant.c (the 32-weight types) and
 * kv_gguf_quant_k.c (the K types).
 *
 * The dequantizers are held bit for bit to the gguf Python package's numpy code
 * (tests/test_gguf_quant.c, data made by tools/gguf/make_quant_golden.py): every value is that
 * code's float32 arithmetic, whose products are exact, so a weight rounds at most once, where
 * a block's offset or minimum is added.
 */
#ifndef KV_GGUF_QUANT_H
#define KV_GGUF_QUANT_H

#include <stdint.h>
#include <string.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** ggml's type codes (the numbers a GGUF file stores). */
enum {
    KV_GGML_F32 = 0,
    KV_GGML_F16 = 1,
    KV_GGML_Q4_0 = 2,
    KV_GGML_Q4_1 = 3,
    KV_GGML_Q5_0 = 6,
    KV_GGML_Q5_1 = 7,
    KV_GGML_Q8_0 = 8,
    KV_GGML_Q8_1 = 9,
    KV_GGML_Q2_K = 10,
    KV_GGML_Q3_K = 11,
    KV_GGML_Q4_K = 12,
    KV_GGML_Q5_K = 13,
    KV_GGML_Q6_K = 14,
    KV_GGML_Q8_K = 15,
    KV_GGML_BF16 = 30
};

/** Weights of a K-type super-block. */
#define KV_GGML_QK_K 256

/** What kvlab knows of a type it dequantizes. */
typedef struct {
    const char *name; /**< "Q4_K" */
    int block;        /**< weights per block */
    int block_bytes;  /**< bytes per block */
} kv_ggml_type_info;

/** The type's row of the table; NULL when kvlab has no dequantizer for it (the IQ and TQ
 * types, Q8_1, Q8_K, MXFP4, the integer types, a code ggml never assigned). */
const kv_ggml_type_info *kv_ggml_type(int type);

/** A name for every code ggml has assigned ("Q4_K", "IQ2_XXS", "F64", "Q4_2 (removed)"),
 * "unknown" for any other: for messages. */
const char *kv_ggml_type_name(int type);

/**
 * Bytes of @p n weights of @p type: n / block * block_bytes. Known for every type whose block
 * size ggml defines, dequantized or not (so a file's tensor table can be checked before any
 * tensor is read). KV_ERR_FORMAT, naming the type, when n is negative, not a multiple of the
 * block, the byte count would pass 2^63 - 1, or the type's size is unknown.
 */
int kv_ggml_row_bytes(int type, int64_t n, uint64_t *bytes, kv_err *err);

/**
 * Dequantize @p n weights (a multiple of the block) of @p type from @p src (any alignment)
 * into @p dst [n]. The type must be one kv_ggml_type() knows; the caller checks it once per
 * tensor (an unknown type writes nothing).
 */
void kv_ggml_dequant_row(int type, const void *src, float *dst, int64_t n);

/* One block of each quantized type: @p b its bytes (any alignment), @p y [block] its weights.
 * The layouts are drawn beside each function. */
void kv_ggml_dequant_q4_0(const uint8_t *b, float *y);
void kv_ggml_dequant_q4_1(const uint8_t *b, float *y);
void kv_ggml_dequant_q5_0(const uint8_t *b, float *y);
void kv_ggml_dequant_q5_1(const uint8_t *b, float *y);
void kv_ggml_dequant_q8_0(const uint8_t *b, float *y);
void kv_ggml_dequant_q2_k(const uint8_t *b, float *y);
void kv_ggml_dequant_q3_k(const uint8_t *b, float *y);
void kv_ggml_dequant_q4_k(const uint8_t *b, float *y);
void kv_ggml_dequant_q5_k(const uint8_t *b, float *y);
void kv_ggml_dequant_q6_k(const uint8_t *b, float *y);

/** IEEE binary16 bits -> float, exact for all 65536 codes: subnormals, infinities, and NaNs
 * with their payload (numpy's conversion, which the outside reference uses). */
static inline float kv_ggml_fp16(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t bits;
    if (e == 0x1fu) {
        bits = sign | 0x7f800000u | (m << 13);      /* inf, or NaN keeping its payload */
    } else if (e != 0) {
        bits = sign | ((e + 112u) << 23) | (m << 13); /* normal: rebias exponent 15 -> 127 */
    } else {
        const float v = (float)m * 0x1p-24f;         /* subnormal (or zero): exact in float */
        memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/** The little-endian binary16 at @p p (any alignment) as a float. */
static inline float kv_ggml_fp16_at(const uint8_t *p)
{
    return kv_ggml_fp16((uint16_t)(p[0] | (p[1] << 8)));
}

/** The 6-bit scale and minimum of sub-block j (0..7) of Q4_K and Q5_K, packed in 12 bytes:
 *   bytes 0-3:  scales 0-3 in their low 6 bits; the top 2 bits: bits 4-5 of scales 4-7
 *   bytes 4-7:  minimums 0-3 likewise, the top 2 bits: bits 4-5 of minimums 4-7
 *   bytes 8-11: low 4 bits of scales 4-7 (low nibble) and of minimums 4-7 (high nibble) */
static inline void kv_ggml_scale_min_k4(const uint8_t *p, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = p[j] & 63;
        *m = p[j + 4] & 63;
    } else {
        *sc = (p[j + 4] & 15) | (p[j - 4] >> 6) << 4;
        *m = (p[j + 4] >> 4) | (p[j] >> 6) << 4;
    }
}

#ifdef __cplusplus
}
#endif
#endif
