/* Model weights: one allocation in llama2.c order, deterministic random init, finiteness check. */
#include "kv_model.h"
#include "kv_rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Weights actually held in memory: 2^34 fp32 values = 64 GiB. kv_config_validate accepts
 * larger shapes (for kvlab calc); allocating them is refused here with a clear message. */
#define KV_MAX_MODEL_FLOATS ((int64_t)1 << 34)

/* One tensor of the model, for walking them all in file order. */
typedef struct {
    const char *name;
    float *data;
    int64_t per_layer; /* floats per layer (or the whole tensor when layers == 1) */
    int layers;
    int fan_in;        /* input width of the matrix; 0 for RMSNorm gains, -1 for embeddings */
} kv_tensor;

#define KV_MAX_TENSORS 17 /* an MLA model with query compression and an untied wcls */

/* An MLA model's attention tensors (kv_mla.h), in the order kv_mla_layers_carve() lays them
 * out: each tensor for every layer in turn, from layer 0's pointer. Returns how many (6, or 8
 * with query compression). */
static int mla_tensors(const kv_model *m, kv_tensor *t)
{
    const kv_config *c = &m->config;
    const kv_mla_layer *w = &m->mla[0];
    const kv_mla_dims *d = &c->mla;
    const int64_t dim = c->dim, H = c->n_heads, qk = d->d_nope + d->d_rope, R = d->q_rank;
    const int L = c->n_layers;
    int n = 0;
    if (R) {
        t[n++] = (kv_tensor){"wq_a", w->wq_a, R * dim, L, c->dim};
        t[n++] = (kv_tensor){"q_norm", w->q_norm, R, L, 0};
        t[n++] = (kv_tensor){"wq_b", w->wq_b, H * qk * R, L, d->q_rank};
    } else {
        t[n++] = (kv_tensor){"wq", w->wq, H * qk * dim, L, c->dim};
    }
    t[n++] = (kv_tensor){"wkv_a", w->wkv_a, (int64_t)kv_mla_row(d) * dim, L, c->dim};
    t[n++] = (kv_tensor){"kv_norm", w->kv_norm, d->d_c, L, 0};
    t[n++] = (kv_tensor){"w_uk", w->w_uk, H * d->d_nope * d->d_c, L, d->d_c};
    t[n++] = (kv_tensor){"w_uv", w->w_uv, H * d->d_v * d->d_c, L, d->d_c};
    t[n++] = (kv_tensor){"wo", w->wo, dim * H * d->d_v, L, (int)(H * d->d_v)};
    return n;
}

/* The tensors in llama2.c file order; returns how many (11, or 12 with an untied wcls; an MLA
 * model has its attention tensors in place of wq, wk, wv, wo). */
static int kv_model_tensors(const kv_model *m, kv_tensor t[KV_MAX_TENSORS])
{
    const kv_config *c = &m->config;
    const int64_t dim = c->dim, hidden = c->hidden_dim, kv_dim = kv_config_kv_dim(c);
    const int L = c->n_layers;
    int n = 0;
    t[n++] = (kv_tensor){"token_embedding", m->w.token_embedding, c->vocab_size * dim, 1, -1};
    t[n++] = (kv_tensor){"rms_att", m->w.rms_att, dim, L, 0};
    if (m->mla) {
        n += mla_tensors(m, t + n);
    } else {
        t[n++] = (kv_tensor){"wq", m->w.wq, dim * dim, L, c->dim};
        t[n++] = (kv_tensor){"wk", m->w.wk, kv_dim * dim, L, c->dim};
        t[n++] = (kv_tensor){"wv", m->w.wv, kv_dim * dim, L, c->dim};
        t[n++] = (kv_tensor){"wo", m->w.wo, dim * dim, L, c->dim};
    }
    t[n++] = (kv_tensor){"rms_ffn", m->w.rms_ffn, dim, L, 0};
    t[n++] = (kv_tensor){"w1", m->w.w1, hidden * dim, L, c->dim};
    t[n++] = (kv_tensor){"w2", m->w.w2, dim * hidden, L, c->hidden_dim};
    t[n++] = (kv_tensor){"w3", m->w.w3, hidden * dim, L, c->dim};
    t[n++] = (kv_tensor){"rms_final", m->w.rms_final, dim, 1, 0};
    if (!c->tied_classifier)
        t[n++] = (kv_tensor){"wcls", m->w.wcls, c->vocab_size * dim, 1, -1};
    return n;
}

int kv_model_alloc(kv_model *m, const kv_config *c, kv_err *err)
{
    if (!m) return kv_fail(err, KV_ERR_ARG, "model is NULL");
    memset(m, 0, sizeof *m);
    int rc = kv_config_validate(c, err);
    if (rc) return rc;
    const int64_t n = kv_config_param_count(c);
    if (n > KV_MAX_MODEL_FLOATS || (uint64_t)n > SIZE_MAX / sizeof(float))
        return kv_fail(err, KV_ERR_NOMEM,
                       "model has %lld parameters; kvlab holds at most 2^34 (64 GiB of fp32)",
                       (long long)n);
    float *p = kv_calloc((size_t)n * sizeof(float));
    if (!p)
        return kv_fail(err, KV_ERR_NOMEM, "cannot allocate %.1f MiB for %lld weights",
                       (double)n * 4.0 / 1048576.0, (long long)n);
    m->config = *c;
    m->data = p;
    m->n_floats = n;

    /* carve the one block in llama2.c order; sizes are int64 because L * dim * hidden
     * passes 2^31 for 7B-class models */
    const int64_t dim = c->dim, hidden = c->hidden_dim, L = c->n_layers;
    const int64_t kv_dim = kv_config_kv_dim(c), vocab = c->vocab_size;
    kv_weights *w = &m->w;
    w->token_embedding = p; p += vocab * dim;
    w->rms_att = p;         p += L * dim;
    if (c->attn == KV_ATTN_MLA) { /* kv_mla.h's tensors where wq, wk, wv, wo would be */
        m->mla = kv_calloc((size_t)L * sizeof(kv_mla_layer));
        if (!m->mla) {
            kv_model_free(m);
            return kv_fail(err, KV_ERR_NOMEM, "cannot allocate %d MLA layers", (int)L);
        }
        p = kv_mla_layers_carve(m->mla, c->n_layers, c->dim, c->n_heads, &c->mla, p);
    } else {
        w->wq = p;          p += L * dim * dim;
        w->wk = p;          p += L * kv_dim * dim;
        w->wv = p;          p += L * kv_dim * dim;
        w->wo = p;          p += L * dim * dim;
    }
    w->rms_ffn = p;         p += L * dim;
    w->w1 = p;              p += L * hidden * dim;
    w->w2 = p;              p += L * dim * hidden;
    w->w3 = p;              p += L * hidden * dim;
    w->rms_final = p;       p += dim;
    if (c->tied_classifier) {
        w->wcls = w->token_embedding;
    } else {
        w->wcls = p;        p += vocab * dim;
    }
    if (p != m->data + n) { /* the layout above and kv_config_param_count must agree */
        kv_model_free(m);
        return kv_fail(err, KV_ERR_ARG, "internal: weight layout does not match parameter count");
    }
    return KV_OK;
}

void kv_model_free(kv_model *m)
{
    if (!m) return;
    kv_free(m->data);
    kv_free(m->mla);
    kv_free(m->mats);
    kv_free(m->blocks);
    memset(m, 0, sizeof *m);
}

/*
 * Random init, chosen so that a random model behaves like a trained one in the ways the
 * chapters measure (attention that is not uniform, logits that are not flat):
 *
 *   matrices   uniform(-a, a), a = sqrt(3) / sqrt(fan_in). Uniform(-a, a) has variance a^2/3,
 *              so Var(W x) = fan_in * a^2/3 * Var(x) = Var(x): each projection keeps the
 *              unit scale RMSNorm gives its input. With q and k of unit scale the scores
 *              q.k/sqrt(d) have spread ~1, so attention prefers some positions over others.
 *              (Plain ±1/sqrt(fan_in) would shrink every projection by sqrt(3) and leave
 *              attention nearly uniform.)
 *   embedding  normal * 2/sqrt(dim). Through the tied classifier a unit-scale final state then
 *              gives logits of spread ~2: peaked enough that sampling is not uniform, flat
 *              enough that it is not always the argmax. An untied wcls is drawn the same way.
 *   RMSNorm    gains 1.
 *
 * One xorshift stream walks the tensors in file order, so the same seed and config give the
 * same bytes everywhere (kv_rng.h).
 */
void kv_model_randomize(kv_model *m, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    kv_tensor t[KV_MAX_TENSORS];
    const int nt = kv_model_tensors(m, t);
    const float emb_scale = 2.0f / sqrtf((float)m->config.dim);
    for (int i = 0; i < nt; i++) {
        const int64_t n = t[i].per_layer * t[i].layers;
        float *x = t[i].data;
        if (t[i].fan_in < 0) {
            for (int64_t j = 0; j < n; j++) x[j] = emb_scale * kv_rng_normal(&r);
        } else if (t[i].fan_in == 0) {
            for (int64_t j = 0; j < n; j++) x[j] = 1.0f;
        } else {
            const float a = sqrtf(3.0f / (float)t[i].fan_in);
            for (int64_t j = 0; j < n; j++) x[j] = kv_rng_uniform(&r, -a, a);
        }
    }
}

int kv_model_default(kv_model *m, kv_default_model which, kv_err *err)
{
    if (!m) return kv_fail(err, KV_ERR_ARG, "model is NULL");
    memset(m, 0, sizeof *m);
    const char *name = kv_config_default_name(which);
    if (!name)
        return kv_fail(err, KV_ERR_ARG, "no embedded default model number %d", (int)which);
    kv_config c;
    uint64_t seed;
    int rc = kv_config_default_by_name(name, &c, &seed, err);
    if (rc) return rc;
    if ((rc = kv_model_alloc(m, &c, err))) return rc;
    kv_model_randomize(m, seed);
    return KV_OK;
}

int kv_model_check_finite(const kv_model *m, kv_err *err)
{
    if (!m || !m->data) return kv_fail(err, KV_ERR_ARG, "model has no weights");
    kv_tensor t[KV_MAX_TENSORS];
    const int nt = kv_model_tensors(m, t);
    for (int i = 0; i < nt; i++) {
        if (!t[i].data) continue; /* a matrix kept in its storage type (kv_model.mats) */
        for (int l = 0; l < t[i].layers; l++) {
            const float *x = t[i].data + (int64_t)l * t[i].per_layer;
            for (int64_t j = 0; j < t[i].per_layer; j++) {
                if (isfinite(x[j])) continue;
                if (t[i].layers > 1)
                    return kv_fail(err, KV_ERR_FORMAT, "weight %s layer %d index %lld is %s",
                                   t[i].name, l, (long long)j, isnan(x[j]) ? "NaN" : "inf");
                return kv_fail(err, KV_ERR_FORMAT, "weight %s index %lld is %s", t[i].name,
                               (long long)j, isnan(x[j]) ? "NaN" : "inf");
            }
        }
    }
    return KV_OK;
}
