/**
 * @file kv_linear.h
 * The one matrix product of the forward pass, whatever a weight's storage: y = W x.
 *
 * A model's matrices are kv_mat handles (kv_model.h): fp32 rows in kv_model.data, or rows kept
 * in a type of their own (a GGUF file's Q4_1 / Q8_0 / Q4_K blocks as stored, rows re-quantized
 * to Q8_0, or binary16; kv_gguf_model_load_as()). The forward pass asks kv_model_mat() for a
 * matrix and multiplies with kv_linear(); which kernel runs is decided here, once:
 *
 *   fp32        kv_matmul_strided_fast()      (kv_ops_fast.h: kv_matmul()'s bits)
 *   quantized   kv_gguf_matmul_fast_ld()      (activations rounded to int8 per 32, integer
 *                                              dots; binary16 rows dequantized, fp32 dots)
 *
 * A new storage type adds a case behind this file, not a branch in the forward pass.
 * Every product takes a block of T tokens at once: each weight row is read once for the
 * block, its dots with every token taken while it is in cache (a prefill is one GEMM).
 */
#ifndef KV_LINEAR_H
#define KV_LINEAR_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Matrix @p which (KV_MAT_Q .. KV_MAT_UP of layer @p layer, or KV_MAT_CLS, KV_MAT_EMBED) of
 * @p m: its kv_model.mats entry, or an fp32 handle onto kv_model.data when the model keeps
 * none (data NULL for an MLA model's attention matrices, which are not handles).
 */
kv_mat kv_model_mat(const kv_model *m, int which, int layer);

/**
 * y[t][i] = sum_j W[row0 + i][col0 + j] x[t][j]   for t < T, i < out, j < in.
 *
 * x [T][in], y [T][out]. A row slice (row0, out: tensor parallel's Wq, W1 rows) is free; a
 * column slice (col0, in: its Wo, W2 columns) must start and end on a block of the storage
 * type (32 weights for Q8_0 / Q4_x, 256 for the K types), else KV_ERR_UNSUPPORTED saying so.
 * fp32 gives kv_matmul()'s bits; a quantized type is within the bound kv_gguf_matmul_fast.h
 * states of the fp32 product with its dequantized weights.
 */
int kv_linear(float *y, const float *x, const kv_mat *W, int T, int row0, int out, int col0,
              int in, kv_err *err);

/** x [T][dim] = the embedding rows of @p tokens [T] (dequantized when stored as blocks). */
void kv_model_embed(const kv_model *m, const int *tokens, int T, float *x);

/** KV_OK when every weight of @p m is fp32 in kv_model.data; else KV_ERR_UNSUPPORTED naming
 * @p who (a GPU upload, a checkpoint, a conversion) as needing fp32 weights. */
int kv_model_need_fp32(const kv_model *m, const char *who, kv_err *err);

/** The storage type of @p m's matrices as a name: "f32", or the GGUF type names ("Q4_1",
 * "Q8_0", "F16"; "Q4_1+Q8_0" when the layers and the embedding differ). */
const char *kv_model_storage(const kv_model *m, char *buf, int cap);

/** Bytes of every matrix a token multiplies (the layers' and the classifier's), as stored. */
double kv_model_matrix_bytes(const kv_model *m);

#ifdef __cplusplus
}
#endif
#endif
