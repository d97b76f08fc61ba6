/*
 * A real model cut to its first layers, as a model of its own (the GPU tests on SmolLM2 run 2
 * of its 30 layers: the emulated device is slow). kv_model_layer_prefix() makes the view
 * (embedding, final norm and tied classifier shared); kvcu_model_upload() copies a model as its
 * one weight block, which a view does not own (data NULL), so the view's tensors are copied
 * into a model of their own: the device then holds the first layers, not all.
 */
#ifndef KV_TEST_MODEL_PREFIX_H
#define KV_TEST_MODEL_PREFIX_H

#include <string.h>

#include "kv_gguf.h"
#include "kv_gguf_model.h"
#include "kv_model.h"
#include "kv_vocab.h"
#include "kv_spec.h" /* kv_model_layer_prefix() */

/* *out a model of its own holding the first @p layers layers of @p m: every per-layer array is
 * [L][...], so its first entries are a prefix. KV_OK, or the status of what failed. */
static inline int kv_test_model_prefix_copy(kv_model *out, const kv_model *m, int layers,
                                            kv_err *e)
{
    kv_model v;
    memset(out, 0, sizeof *out);
    int rc = kv_model_layer_prefix(&v, m, layers, e);
    if (rc) return rc;
    if (v.config.n_layers != layers || v.w.rms_final != m->w.rms_final ||
        v.w.wcls != m->w.wcls || v.w.token_embedding != m->w.token_embedding)
        return kv_fail(e, KV_ERR_ARG, "the layer-prefix view does not keep the embedding, final "
                       "norm and classifier");
    rc = kv_model_alloc(out, &v.config, e);
    if (rc) return rc;
    const kv_config *c = &v.config;
    const size_t L = (size_t)layers, dim = c->dim, hid = c->hidden_dim, V = c->vocab_size;
    const size_t q = (size_t)c->n_heads * kv_config_head_dim(c);
    const size_t kv = (size_t)c->n_kv_heads * kv_config_head_dim(c);
    const struct { float *dst; const float *src; size_t n; } t[] = {
        {out->w.token_embedding, v.w.token_embedding, V * dim},
        {out->w.rms_att, v.w.rms_att, L * dim},       {out->w.wq, v.w.wq, L * q * dim},
        {out->w.wk, v.w.wk, L * kv * dim},            {out->w.wv, v.w.wv, L * kv * dim},
        {out->w.wo, v.w.wo, L * dim * q},             {out->w.rms_ffn, v.w.rms_ffn, L * dim},
        {out->w.w1, v.w.w1, L * hid * dim},           {out->w.w2, v.w.w2, L * dim * hid},
        {out->w.w3, v.w.w3, L * hid * dim},           {out->w.rms_final, v.w.rms_final, dim},
        {out->w.wcls, v.w.wcls, V * dim},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) memcpy(t[i].dst, t[i].src, t[i].n * 4);
    return KV_OK;
}

/* The GGUF file at @p path opened (*g, *voc its tokenizer) and its first @p layers layers as a
 * model of their own (*m): the whole model is loaded, copied from, and freed. The caller frees
 * *m, *voc and *g whatever the status (each stays NULL/zero when not made). */
static inline int kv_test_gguf_prefix_open(const char *path, int layers, kv_gguf **g,
                                           kv_vocab **voc, kv_model *m, kv_err *e)
{
    kv_model full = {0};
    memset(m, 0, sizeof *m);
    int rc = kv_gguf_open(path, g, e);
    if (!rc) rc = kv_vocab_from_gguf(*g, voc, e);
    if (!rc) rc = kv_gguf_model_load(*g, &full, e);
    if (!rc) rc = kv_test_model_prefix_copy(m, &full, layers, e);
    kv_model_free(&full);
    return rc;
}

#endif
