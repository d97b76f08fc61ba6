/*
 * A GGUF model whose matrices stay in a storage type of their own (kv_gguf_model_load_as()):
 * the file's blocks as stored (native), or every row re-quantized to Q8_0 or rounded to
 * binary16. kv_model.data keeps the RMSNorm gains alone (fp32, as the forward pass applies
 * them); the matrices go into one allocation of blocks, described by kv_model.mats
 * (kv_model.h), which kv_linear() multiplies. For SmolLM2-135M Q4_1 that is ~100 MB of blocks
 * where the fp32 model holds ~540 MB: what a token must read, and so its speed (chapter 02).
 *
 * The tensors arrive in the loader's plan order (kv_gguf_internal.h); each matrix has its
 * place in mats: layer l's Q, K, V, O, gate, down, up at l * KV_MAT_PER_LAYER + KV_MAT_*,
 * then the classifier and the embedding. A tied classifier is the embedding's handle.
 */
#include "kv_gguf_internal.h"
#include "kv_gguf_model.h"
#include "kv_gguf_quant.h"
#include "kv_gguf_requant.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* where the plan's per-layer tensors go: -1 for a norm, else the KV_MAT_* of a matrix */
static const int layer_slot[9] = {-1, KV_MAT_Q, KV_MAT_K, KV_MAT_V, KV_MAT_O,
                                  -1, KV_MAT_GATE, KV_MAT_DOWN, KV_MAT_UP};

/* the ggml type a tensor is kept as */
static int kept_type(const kv_gguf_tensor *t, int storage)
{
    if (storage == KV_WEIGHTS_NATIVE) return t->type;
    return storage == KV_WEIGHTS_Q8_0 ? KV_GGML_Q8_0 : KV_GGML_F16;
}

/* Dequantize each row of @p t (checked finite) and, unless it is copied as stored, write it
 * in the kept type into @p out's blocks. Rows are spread over the threads, each with a row
 * of scratch. */
static int fill(const kv_gguf_tensor *t, const kv_mat *out, kv_err *err)
{
    uint64_t src_bytes = 0;
    kv_ggml_row_bytes(t->type, t->ne[0], &src_bytes, NULL); /* checked at open */
    const int copy = out->type == t->type, cols = out->cols;
    if (copy) memcpy((void *)out->data, t->data, (size_t)out->rows * out->row_bytes);
    int64_t bad_row = -1;
    int nomem = 0;
    #pragma omp parallel if (out->rows > 64)
    {
        float *row = malloc((size_t)cols * sizeof(float)); /* [cols] one row, fp32 */
        #pragma omp for schedule(static)
        for (int i = 0; i < out->rows; i++) {
            if (!row) continue;
            kv_ggml_dequant_row(t->type, (const uint8_t *)t->data + (size_t)i * src_bytes, row,
                                cols);
            int finite = 1;
            for (int j = 0; j < cols; j++) finite &= isfinite(row[j]) != 0;
            if (!finite) {
                #pragma omp critical
                if (bad_row < 0 || i < bad_row) bad_row = i;
            }
            if (!copy)
                kv_ggml_quantize_row(out->type, row, (uint8_t *)out->data +
                                     (size_t)i * out->row_bytes, cols);
        }
        if (!row) {
            #pragma omp atomic write
            nomem = 1;
        }
        free(row);
    }
    if (nomem) return kv_fail(err, KV_ERR_NOMEM, "out of memory for a row of %d weights", cols);
    if (bad_row >= 0)
        return kv_fail(err, KV_ERR_FORMAT, "tensor '%.*s' row %lld holds an infinity or NaN",
                       (int)t->name.n, t->name.s, (long long)bad_row);
    return KV_OK;
}

int kv_gguf_store_model(kv_model *m, const kv_gguf_tensor *const *t, int n, int storage,
                        kv_err *err)
{
    if (!kv_weights_storage_name(storage) || storage == KV_WEIGHTS_F32)
        return kv_fail(err, KV_ERR_ARG, "weights storage %d is not a kept type", storage);
    const kv_config *c = &m->config;
    const int L = c->n_layers, dim = c->dim;
    /* the norms, fp32: rms_att [L][dim], rms_ffn [L][dim], rms_final [dim] */
    m->n_floats = (2 * (int64_t)L + 1) * dim;
    m->data = kv_calloc((size_t)m->n_floats * sizeof(float));
    m->mats = kv_calloc((size_t)(L * KV_MAT_PER_LAYER + 2) * sizeof(kv_mat));
    if (!m->data || !m->mats) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    m->w.rms_att = m->data;
    m->w.rms_ffn = m->data + (int64_t)L * dim;
    m->w.rms_final = m->data + 2 * (int64_t)L * dim;

    /* each tensor's matrix slot (or norm destination), in plan order */
    int *slot = calloc((size_t)n, sizeof(int)); /* [n] index into mats, or -1: a norm */
    if (!slot) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    float *norm_dst[3] = {m->w.rms_att, m->w.rms_ffn, m->w.rms_final};
    slot[0] = L * KV_MAT_PER_LAYER + (KV_MAT_EMBED - KV_MAT_PER_LAYER);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 9; k++) {
            const int s = layer_slot[k];
            slot[1 + 9 * l + k] = s < 0 ? -1 : l * KV_MAT_PER_LAYER + s;
        }
    slot[1 + 9 * L] = -1;                                   /* output_norm */
    if (n > 2 + 9 * L) slot[2 + 9 * L] = L * KV_MAT_PER_LAYER; /* output */

    /* the handles and the bytes they need, each matrix 64-byte aligned */
    int rc = KV_OK;
    uint64_t total = 0;
    for (int k = 0; k < n && !rc; k++) {
        if (slot[k] < 0) continue;
        const int type = kept_type(t[k], storage);
        kv_mat *w = &m->mats[slot[k]];
        *w = (kv_mat){type, (int)t[k]->ne[1], (int)t[k]->ne[0], 0, NULL};
        if (type == KV_GGML_Q8_0 && t[k]->ne[0] % 32)
            rc = kv_fail(err, KV_ERR_UNSUPPORTED, "tensor '%.*s': rows of %lld weights are not "
                         "whole Q8_0 blocks of 32", (int)t[k]->name.n, t[k]->name.s,
                         (long long)t[k]->ne[0]);
        if (!rc) rc = kv_ggml_row_bytes(type, t[k]->ne[0], &w->row_bytes, err);
        w->data = (const void *)(uintptr_t)total; /* an offset until the blocks exist */
        total += ((uint64_t)w->rows * w->row_bytes + 63) / 64 * 64;
    }
    if (!rc && !(m->blocks = kv_calloc((size_t)total + 64)))
        rc = kv_fail(err, KV_ERR_NOMEM, "cannot allocate %.1f MiB of weight blocks",
                     (double)total / 1048576.0);
    m->n_block_bytes = (int64_t)total;
    for (int k = 0; k < n && !rc; k++) {
        if (slot[k] < 0) { /* a norm: attn_norm and ffn_norm per layer, then output_norm */
            const int which = k == 1 + 9 * L ? 2 : ((k - 1) % 9 == 0 ? 0 : 1);
            const int layer = which == 2 ? 0 : (k - 1) / 9;
            kv_ggml_dequant_row(t[k]->type, t[k]->data, norm_dst[which] + (int64_t)layer * dim,
                                dim);
            continue;
        }
        kv_mat *w = &m->mats[slot[k]];
        w->data = (uint8_t *)m->blocks + (uintptr_t)w->data;
        rc = fill(t[k], w, err);
    }
    free(slot);
    if (!rc && c->tied_classifier) /* the classifier is the embedding */
        m->mats[L * KV_MAT_PER_LAYER] = m->mats[L * KV_MAT_PER_LAYER + 1];
    if (!rc) rc = kv_model_check_finite(m, err); /* the norms */
    return rc;
}
