/* The reference product of a quantized weight matrix and activations (kv_gguf_matmul.h): a row
 * dequantized into fp32, then the fp32 dot product kv_matmul() uses. Every weight is the value
 * kv_ggml_dequant_row() gives (the gguf package's, bit for bit), so this is the fp32 model a
 * dequantized checkpoint would run, computed without holding the fp32 matrix. */
#include "kv_gguf_matmul.h"
#include "kv_gguf_quant.h"
#include "kv_ops.h"

#include <omp.h>
#include <stdlib.h>

int kv_gguf_matmul_check(int type, int T, int in, int out, uint64_t *row_bytes, kv_err *err)
{
    const kv_ggml_type_info *t = kv_ggml_type(type);
    if (!t)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "matmul: tensor type %s (%d) has no dequantizer",
                       kv_ggml_type_name(type), type);
    if (T < 0 || in <= 0 || out < 0 || in % t->block != 0)
        return kv_fail(err, KV_ERR_ARG, "matmul: %s rows of %d weights (a multiple of %d), "
                       "%d rows, %d tokens", t->name, in, t->block, out, T);
    return kv_ggml_row_bytes(type, in, row_bytes, err);
}

int kv_gguf_matmul_ld_check(int type, int T, int in, int out, uint64_t *ld, kv_err *err)
{
    uint64_t row_bytes = 0;
    const int st = kv_gguf_matmul_check(type, T, in, out, &row_bytes, err);
    if (st != KV_OK) return st;
    if (*ld == 0) *ld = row_bytes;
    if (*ld < row_bytes)
        return kv_fail(err, KV_ERR_ARG, "matmul: rows %llu bytes apart hold %llu bytes of %s",
                       (unsigned long long)*ld, (unsigned long long)row_bytes,
                       kv_ggml_type_name(type));
    return KV_OK;
}

int kv_gguf_matmul(float *y, const float *x, const void *W, int type, int T, int in, int out,
                   kv_err *err)
{
    return kv_gguf_matmul_ld(y, x, W, type, T, in, out, 0, err);
}

int kv_gguf_matmul_ld(float *y, const float *x, const void *W, int type, int T, int in, int out,
                      uint64_t ld, kv_err *err)
{
    uint64_t row_bytes = ld; /* the stride between rows */
    const int st = kv_gguf_matmul_ld_check(type, T, in, out, &row_bytes, err);
    if (st != KV_OK) return st;
    const int64_t work = (int64_t)T * in * out;
    const int threads = kv_parallel_worth(work) ? omp_get_max_threads() : 1;
    float *scratch = malloc((size_t)threads * (size_t)in * sizeof(float)); /* [threads][in] */
    if (!scratch) return kv_fail(err, KV_ERR_NOMEM, "matmul: %d x %d floats of row scratch",
                                 threads, in);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int i = 0; i < out; i++) {
        float *w = scratch + (size_t)omp_get_thread_num() * in; /* [in] row i, dequantized */
        kv_ggml_dequant_row(type, (const uint8_t *)W + (size_t)i * row_bytes, w, in);
        for (int t = 0; t < T; t++) y[(size_t)t * out + i] = kv_dot16(w, x + (size_t)t * in, in);
    }
    free(scratch);
    return KV_OK;
}
