/**
 * @file kv_gguf_requant.h
 * fp32 rows into a GGUF storage type: what `--weights q8_0` and `--weights f16` keep.
 *
 * Q8_0 is ggml's quantize_row_q8_0 reference, bit for bit (tests/test_gguf_requant.c holds it
 * to the gguf package's quantize): per block of 32 weights, d = max|x| / 127, the codes
 * roundf(x * (1 / d)) (halves away from zero), d stored as binary16. binary16 rounds to
 * nearest, ties to even, as IEEE 754 (and numpy's astype(float16)) does.
 */
#ifndef KV_GGUF_REQUANT_H
#define KV_GGUF_REQUANT_H

#include <stdint.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** float -> IEEE binary16 bits, round to nearest even; overflow to infinity, NaN stays NaN. */
uint16_t kv_ggml_fp32_to_fp16(float f);

/** x [n] (n % 32 == 0) -> n / 32 Q8_0 blocks of 34 bytes at @p dst. */
void kv_ggml_quantize_q8_0(const float *x, void *dst, int64_t n);

/** x [n] -> n binary16 values (2 bytes each, little-endian) at @p dst. */
void kv_ggml_quantize_f16(const float *x, void *dst, int64_t n);

/** 1 when kv_ggml_quantize_row() writes @p type (F32, F16, Q8_0), else 0. */
int kv_ggml_can_quantize(int type);

/** x [n] -> one row of @p type at @p dst (kv_ggml_row_bytes(type, n) bytes); a type
 * kv_ggml_can_quantize() refuses writes nothing. */
void kv_ggml_quantize_row(int type, const float *x, void *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
