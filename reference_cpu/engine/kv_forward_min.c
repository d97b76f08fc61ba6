/*
 * The first forward pass on one screen (kv_forward_min.h): one token through an MHA/GQA model
 * with a contiguous fp32 cache, llama2.c's forward() with a KV cache and GQA.
 *
 *   x = embedding[token]
 *   per layer l:
 *     xb = RMSNorm(x)
 *     q = Wq·xb, k = Wk·xb, v = Wv·xb          q [H][d], k and v [H_kv][d]
 *     RoPE(q, pos), RoPE(k, pos)
 *     cache[l] row pos <- k, v                 the KV cache: written once, read every step
 *     xb = attention(q, cache[l] rows 0..pos)  query head h reads KV head h / G
 *     x += Wo·xb
 *     xb = RMSNorm(x)
 *     x += W2·(silu(W1·xb) * W3·xb)            SwiGLU
 *   logits = Wcls·RMSNorm(x)
 *
 * Every line calls the op the engine calls, in the engine's order, so the bits are the
 * engine's (tests/test_forward_min.c).
 */
#include <string.h>

#include "kv_attention.h"
#include "kv_forward_min.h"
#include "kv_linear.h"
#include "kv_ops.h"

int kv_min_create(const kv_model *m, int max_seq, kv_min_cache *c, kv_min_state *s, kv_err *err)
{
    memset(c, 0, sizeof *c);
    memset(s, 0, sizeof *s);
    if (kv_model_need_fp32(m, "kv_forward_min", err)) return KV_ERR_UNSUPPORTED;
    const kv_config *p = &m->config;
    if (kv_config_require_gqa(p, "kv_forward_min", err)) return KV_ERR_UNSUPPORTED;
    if (max_seq < 1 || max_seq > p->seq_len)
        return kv_fail(err, KV_ERR_ARG, "kv_min_create: max_seq %d outside 1..%d (seq_len)",
                       max_seq, p->seq_len);
    const size_t dim = p->dim, kvd = kv_config_kv_dim(p), hid = p->hidden_dim;
    const size_t rows = (size_t)p->n_layers * max_seq * kvd; /* L · H_kv · max_seq · d */
    c->max_seq = max_seq;
    c->k = kv_calloc(rows * sizeof(float));
    c->v = kv_calloc(rows * sizeof(float));
    s->x = kv_calloc(dim * sizeof(float));
    s->xb = kv_calloc(dim * sizeof(float));
    s->xb2 = kv_calloc(dim * sizeof(float));
    s->q = kv_calloc(dim * sizeof(float));
    s->k = kv_calloc(kvd * sizeof(float));
    s->v = kv_calloc(kvd * sizeof(float));
    s->hb = kv_calloc(hid * sizeof(float));
    s->hb2 = kv_calloc(hid * sizeof(float));
    s->logits = kv_calloc((size_t)p->vocab_size * sizeof(float));
    if (!c->k || !c->v || !s->x || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->hb ||
        !s->hb2 || !s->logits) {
        kv_min_free(c, s);
        return kv_fail(err, KV_ERR_NOMEM, "kv_min_create: out of memory (cache %.1f MiB)",
                       2.0 * rows * sizeof(float) / 1048576.0);
    }
    return KV_OK;
}

void kv_min_free(kv_min_cache *c, kv_min_state *s)
{
    if (c) {
        kv_free(c->k);
        kv_free(c->v);
        memset(c, 0, sizeof *c);
    }
    if (s) {
        float *bufs[] = {s->x, s->xb, s->xb2, s->q, s->k, s->v, s->hb, s->hb2, s->logits};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kv_free(bufs[i]);
        memset(s, 0, sizeof *s);
    }
}

int kv_forward_min(const kv_model *m, kv_min_cache *c, kv_min_state *s, int token, int pos,
                   kv_err *err)
{
    const kv_config *p = &m->config;
    const kv_weights *w = &m->w;
    const int dim = p->dim, hidden = p->hidden_dim, L = p->n_layers;
    const int H = p->n_heads, Hkv = p->n_kv_heads, d = kv_config_head_dim(p);
    const int kvdim = Hkv * d;
    if (token < 0 || token >= p->vocab_size)
        return kv_fail(err, KV_ERR_ARG, "kv_forward_min: token %d outside 0..%d", token,
                       p->vocab_size - 1);
    if (pos < 0 || pos >= c->max_seq)
        return kv_fail(err, KV_ERR_ARG, "kv_forward_min: position %d outside the cache's 0..%d",
                       pos, c->max_seq - 1);

    double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] RoPE's per-pair frequencies */
    kv_rope_freqs(p, freq);
    kv_embed(s->x, w->token_embedding, &token, 1, dim);
    for (int l = 0; l < L; l++) {
        /* attention: x += Wo · attention(RoPE(Wq·xb), cache(RoPE(Wk·xb), Wv·xb)) */
        kv_rmsnorm(s->xb, s->x, w->rms_att + (size_t)l * dim, 1, dim, p->norm_eps);
        kv_matmul(s->q, s->xb, w->wq + (size_t)l * dim * dim, 1, dim, dim);
        kv_matmul(s->k, s->xb, w->wk + (size_t)l * kvdim * dim, 1, dim, kvdim);
        kv_matmul(s->v, s->xb, w->wv + (size_t)l * kvdim * dim, 1, dim, kvdim);
        kv_rope(s->q, &pos, 1, H, d, p->rotary_dim, freq);
        kv_rope(s->k, &pos, 1, Hkv, d, p->rotary_dim, freq);

        /* the cache: this token's row of each KV head, at its position. Written before the
         * attention below reads it: a token attends to itself. */
        float *kl = c->k + (size_t)l * Hkv * c->max_seq * d; /* [H_kv][max_seq][d] */
        float *vl = c->v + (size_t)l * Hkv * c->max_seq * d;
        for (int h = 0; h < Hkv; h++) {
            memcpy(kl + ((size_t)h * c->max_seq + pos) * d, s->k + (size_t)h * d, d * sizeof(float));
            memcpy(vl + ((size_t)h * c->max_seq + pos) * d, s->v + (size_t)h * d, d * sizeof(float));
        }
        /* softmax(q·k / √d) · v over rows 0..pos, query head h on KV head h / G: the engine's
         * attention on plain arrays (kv_attention.h) */
        if (kv_attn_decode(s->q, kl, vl, s->xb, H, Hkv, d, c->max_seq, pos + 1))
            return kv_fail(err, KV_ERR_NOMEM, "kv_forward_min: no memory for the scores");
        kv_matmul(s->xb2, s->xb, w->wo + (size_t)l * dim * dim, 1, dim, dim);
        kv_add(s->x, s->xb2, dim);

        /* MLP: x += W2 · (silu(W1·xb) * W3·xb) */
        kv_rmsnorm(s->xb, s->x, w->rms_ffn + (size_t)l * dim, 1, dim, p->norm_eps);
        kv_matmul(s->hb, s->xb, w->w1 + (size_t)l * hidden * dim, 1, dim, hidden);
        kv_matmul(s->hb2, s->xb, w->w3 + (size_t)l * hidden * dim, 1, dim, hidden);
        kv_swiglu(s->hb, s->hb2, hidden);
        kv_matmul(s->xb2, s->hb, w->w2 + (size_t)l * dim * hidden, 1, hidden, dim);
        kv_add(s->x, s->xb2, dim);
    }
    kv_rmsnorm(s->xb, s->x, w->rms_final, 1, dim, p->norm_eps);
    kv_matmul(s->logits, s->xb, w->wcls, 1, dim, p->vocab_size);
    return KV_OK;
}
