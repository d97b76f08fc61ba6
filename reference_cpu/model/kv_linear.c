/* The forward pass's matrix product (kv_linear.h): a kv_mat handle per matrix, one function
 * choosing the kernel by the handle's storage type. */
#include "kv_linear.h"
#include "kv_gguf_matmul_fast.h"
#include "kv_gguf_quant.h"
#include "kv_ops.h"
#include "kv_ops_fast.h"

#include <stdio.h>
#include <string.h>

/* an fp32 matrix [rows][cols] at p */
static kv_mat f32_mat(const float *p, int64_t rows, int64_t cols)
{
    return (kv_mat){KV_GGML_F32, (int)rows, (int)cols, (uint64_t)cols * sizeof(float), p};
}

kv_mat kv_model_mat(const kv_model *m, int which, int layer)
{
    const kv_config *c = &m->config;
    if (m->mats) {
        const int i = which < KV_MAT_PER_LAYER ? layer * KV_MAT_PER_LAYER + which
                                               : c->n_layers * KV_MAT_PER_LAYER +
                                                     (which - KV_MAT_PER_LAYER);
        return m->mats[i];
    }
    const kv_weights *w = &m->w;
    const int64_t dim = c->dim, hid = c->hidden_dim, kvd = kv_config_kv_dim(c), l = layer;
    const int64_t qd = (int64_t)c->n_heads * kv_config_head_dim(c);
    switch (which) { /* kv_model_alloc()'s layout: each tensor for every layer in turn */
    case KV_MAT_Q: return f32_mat(w->wq ? w->wq + l * qd * dim : NULL, qd, dim);
    case KV_MAT_K: return f32_mat(w->wk ? w->wk + l * kvd * dim : NULL, kvd, dim);
    case KV_MAT_V: return f32_mat(w->wv ? w->wv + l * kvd * dim : NULL, kvd, dim);
    case KV_MAT_O: return f32_mat(w->wo ? w->wo + l * dim * qd : NULL, dim, qd);
    case KV_MAT_GATE: return f32_mat(w->w1 + l * hid * dim, hid, dim);
    case KV_MAT_DOWN: return f32_mat(w->w2 + l * dim * hid, dim, hid);
    case KV_MAT_UP: return f32_mat(w->w3 + l * hid * dim, hid, dim);
    case KV_MAT_CLS: return f32_mat(w->wcls, c->vocab_size, dim);
    default: return f32_mat(w->token_embedding, c->vocab_size, dim);
    }
}

int kv_linear(float *y, const float *x, const kv_mat *W, int T, int row0, int out, int col0,
              int in, kv_err *err)
{
    if (!W->data || row0 < 0 || out < 0 || row0 + out > W->rows || col0 < 0 || in < 1 ||
        col0 + in > W->cols)
        return kv_fail(err, KV_ERR_ARG, "kv_linear: rows %d..%d, columns %d..%d of a %d x %d "
                       "matrix%s", row0, row0 + out, col0, col0 + in, W->rows, W->cols,
                       W->data ? "" : " without weights");
    const uint8_t *row = (const uint8_t *)W->data + (size_t)row0 * W->row_bytes;
    if (W->type == KV_GGML_F32) {
        kv_matmul_strided_fast(y, x, (const float *)row + col0, T, in, out, W->cols);
        return KV_OK;
    }
    /* a column slice of blocks: it starts and ends on a block boundary */
    const kv_ggml_type_info *t = kv_ggml_type(W->type);
    if (!t) return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_linear: no kernel for %s",
                           kv_ggml_type_name(W->type));
    if (col0 % t->block || in % t->block)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_linear: columns %d..%d of a %s matrix cut "
                       "its blocks of %d weights (tensor parallel needs the slices on block "
                       "boundaries: fewer ranks, or --weights f32)", col0, col0 + in,
                       t->name, t->block);
    row += (size_t)(col0 / t->block) * t->block_bytes;
    return kv_gguf_matmul_fast_ld(y, x, row, W->type, T, in, out, W->row_bytes, err);
}

void kv_model_embed(const kv_model *m, const int *tokens, int T, float *x)
{
    const kv_mat e = kv_model_mat(m, KV_MAT_EMBED, 0);
    if (e.type == KV_GGML_F32) {
        kv_embed(x, e.data, tokens, T, e.cols);
        return;
    }
    for (int t = 0; t < T; t++) /* one row each, dequantized as a token needs it */
        kv_ggml_dequant_row(e.type, (const uint8_t *)e.data + (size_t)tokens[t] * e.row_bytes,
                            x + (size_t)t * e.cols, e.cols);
}

int kv_model_need_fp32(const kv_model *m, const char *who, kv_err *err)
{
    if (!m || !m->mats) return KV_OK;
    char s[64];
    return kv_fail(err, KV_ERR_UNSUPPORTED, "%s needs fp32 weights, and this model keeps its "
                   "matrices as %s (load it with --weights f32)", who,
                   kv_model_storage(m, s, sizeof s));
}

const char *kv_model_storage(const kv_model *m, char *buf, int cap)
{
    if (!m->mats) {
        snprintf(buf, (size_t)cap, "f32");
        return buf;
    }
    const int a = kv_model_mat(m, KV_MAT_Q, 0).type, e = kv_model_mat(m, KV_MAT_EMBED, 0).type;
    if (a == e) snprintf(buf, (size_t)cap, "%s", kv_ggml_type_name(a));
    else snprintf(buf, (size_t)cap, "%s+%s", kv_ggml_type_name(a), kv_ggml_type_name(e));
    return buf;
}

double kv_model_matrix_bytes(const kv_model *m)
{
    double b = 0;
    for (int l = 0; l < m->config.n_layers; l++)
        for (int k = 0; k < KV_MAT_PER_LAYER; k++) {
            const kv_mat w = kv_model_mat(m, k, l);
            b += (double)w.rows * (double)w.row_bytes;
        }
    const kv_mat cls = kv_model_mat(m, KV_MAT_CLS, 0);
    return b + (double)cls.rows * (double)cls.row_bytes;
}
