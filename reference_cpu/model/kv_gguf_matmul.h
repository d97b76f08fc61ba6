/**
 * @file kv_gguf_matmul.h
 * Matrix products with the weights left in a GGUF file's quantized blocks.
 *
 * A weight matrix W [out][in] of ggml type @p type is stored row by row, each row
 * kv_ggml_row_bytes(type, in) bytes (kv_gguf_quant.h), as in a mapped GGUF file. Two ways to
 * multiply it into activations:
 *
 *  - kv_gguf_matmul(), the reference: each row dequantized into fp32 (kv_ggml_dequant_row()),
 *    then kv_dot16() with each token's activations, the same dot as kv_matmul();
 *  - kv_gguf_matmul_fast() (kv_gguf_matmul_fast.h): the activations rounded to int8 per 32, and
 *    integer dot products against the codes, AVX2 where the CPU has it; held to the reference
 *    by a derived bound in tests/test_gguf_matmul.c.
 */
#ifndef KV_GGUF_MATMUL_H
#define KV_GGUF_MATMUL_H

#include <stdint.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * y[t][i] = sum_j dequant(W row i)[j] * x[t][j]  for t < T, i < out.
 *
 * W    [out][row bytes]  quantized rows of @p in weights (any alignment)
 * x    [T][in]           activations
 * y    [T][out]
 *
 * KV_ERR_UNSUPPORTED when kvlab has no dequantizer for @p type, KV_ERR_ARG when @p in is not a
 * multiple of its block (or a size is negative), KV_ERR_NOMEM when the row scratch cannot be
 * allocated. Threads split the rows; every output has the same bits on any thread count.
 */
int kv_gguf_matmul(float *y, const float *x, const void *W, int type, int T, int in, int out,
                   kv_err *err);

/**
 * kv_gguf_matmul() over rows @p ld bytes apart (0: the row bytes of @p in weights), so that
 * a matrix's columns c0 .. c0 + in - 1 are multiplied in place: W points at column c0's
 * block in row 0, and c0 and @p in are multiples of the block (tensor parallel's slices).
 * KV_ERR_ARG when @p ld is below the row bytes of @p in weights.
 */
int kv_gguf_matmul_ld(float *y, const float *x, const void *W, int type, int T, int in, int out,
                      uint64_t ld, kv_err *err);

/** kv_gguf_matmul_check() and the stride: *ld 0 becomes the row bytes. */
int kv_gguf_matmul_ld_check(int type, int T, int in, int out, uint64_t *ld, kv_err *err);

/** The checks kv_gguf_matmul() and kv_gguf_matmul_fast() make, and @p in's row bytes. */
int kv_gguf_matmul_check(int type, int T, int in, int out, uint64_t *row_bytes, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
