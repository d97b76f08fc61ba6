/* Changing a model's KV heads (kv_convert.h): pool (MHA → GQA), expand (GQA → duplicated
 * MHA), widen (more heads), and the teacher-forced comparison that measures the change.
 *
 * Every conversion allocates the output with kv_model_alloc() for the new config, copies the
 * tensors whose shape did not change, and rebuilds Wk and Wv (and, for widen, everything
 * whose width grew). Weights are row-major [out][in]; the rows of KV head j in Wk and Wv are
 * j·d .. j·d + d - 1 of each layer's [H_kv·d][dim] block. */
#include "kv_convert.h"
#include "kv_checkpoint.h"
#include "kv_forward.h"
#include "kv_linear.h"
#include "kv_rng.h"

#include <math.h>
#include <string.h>

/* Copy every tensor except wk and wv from @p in to @p out (same dim, hidden, H, vocab). */
static void copy_except_kv(kv_model *out, const kv_model *in)
{
    const kv_config *c = &in->config;
    const size_t L = c->n_layers, dim = c->dim, hidden = c->hidden_dim, V = c->vocab_size;
    const size_t qdim = (size_t)c->n_heads * kv_config_head_dim(c), f = sizeof(float);
    kv_weights *o = &out->w;
    const kv_weights *w = &in->w;
    memcpy(o->token_embedding, w->token_embedding, V * dim * f);
    memcpy(o->rms_att, w->rms_att, L * dim * f);
    memcpy(o->wq, w->wq, L * qdim * dim * f);
    memcpy(o->wo, w->wo, L * dim * qdim * f);
    memcpy(o->rms_ffn, w->rms_ffn, L * dim * f);
    memcpy(o->w1, w->w1, L * hidden * dim * f);
    memcpy(o->w2, w->w2, L * dim * hidden * f);
    memcpy(o->w3, w->w3, L * hidden * dim * f);
    memcpy(o->rms_final, w->rms_final, dim * f);
    if (!c->tied_classifier) memcpy(o->wcls, w->wcls, V * dim * f);
}

/* ---- MHA → GQA: mean-pool the K/V heads of each group ---------------------------------- */

/* dst [L][n_new·d][dim] = mean over groups of r consecutive heads of src [L][n_old·d][dim] */
static void pool_rows(float *dst, const float *src, int L, int n_old, int n_new, int d, int dim)
{
    const int r = n_old / n_new;
    for (int l = 0; l < L; l++)
        for (int j = 0; j < n_new; j++)
            for (int i = 0; i < d; i++)
                for (int x = 0; x < dim; x++) {
                    /* in double: r floats add up exactly (r < 2^29), one rounding at the end,
                     * so r identical heads give back that head bit for bit */
                    double s = 0.0;
                    for (int g = 0; g < r; g++)
                        s += src[(((size_t)l * n_old + (size_t)j * r + g) * d + i) * dim + x];
                    dst[(((size_t)l * n_new + j) * d + i) * dim + x] = (float)(s / r);
                }
}

int kv_convert_pool_kv_heads(kv_model *out, const kv_model *in, int n_kv_heads, kv_err *err)
{
    if (!out || !in || !in->data) return kv_fail(err, KV_ERR_ARG, "kv_convert: NULL model");
    if (kv_model_need_fp32(in, "kv_convert", err)) return KV_ERR_UNSUPPORTED;
    const kv_config *c = &in->config;
    if (c->attn != KV_ATTN_GQA) return kv_config_require_gqa(c, "kv_convert", err); /* K/V heads */
    if (n_kv_heads < 1 || c->n_kv_heads % n_kv_heads)
        return kv_fail(err, KV_ERR_ARG,
                       "kv_convert: %d KV heads cannot be pooled into %d (must divide H_kv %d; "
                       "H %d, so G = H/H_kv must be one of its divisors)", c->n_kv_heads,
                       n_kv_heads, c->n_kv_heads, c->n_heads);
    kv_config nc = *c;
    nc.n_kv_heads = n_kv_heads;
    int rc = kv_model_alloc(out, &nc, err);
    if (rc) return rc;
    copy_except_kv(out, in);
    const int d = kv_config_head_dim(c);
    pool_rows(out->w.wk, in->w.wk, c->n_layers, c->n_kv_heads, n_kv_heads, d, c->dim);
    pool_rows(out->w.wv, in->w.wv, c->n_layers, c->n_kv_heads, n_kv_heads, d, c->dim);
    return KV_OK;
}

/* ---- GQA → MHA-shaped: duplicate each KV head across its group ------------------------- */

int kv_convert_expand_kv_heads(kv_model *out, const kv_model *in, int n_kv_heads, kv_err *err)
{
    if (!out || !in || !in->data) return kv_fail(err, KV_ERR_ARG, "kv_convert: NULL model");
    if (kv_model_need_fp32(in, "kv_convert", err)) return KV_ERR_UNSUPPORTED;
    const kv_config *c = &in->config;
    if (c->attn != KV_ATTN_GQA) return kv_config_require_gqa(c, "kv_convert", err); /* K/V heads */
    if (n_kv_heads < c->n_kv_heads || n_kv_heads % c->n_kv_heads || c->n_heads % n_kv_heads)
        return kv_fail(err, KV_ERR_ARG,
                       "kv_convert: cannot expand %d KV heads to %d (a multiple of H_kv that "
                       "divides H %d)", c->n_kv_heads, n_kv_heads, c->n_heads);
    kv_config nc = *c;
    nc.n_kv_heads = n_kv_heads;
    int rc = kv_model_alloc(out, &nc, err);
    if (rc) return rc;
    copy_except_kv(out, in);
    const int d = kv_config_head_dim(c), r = n_kv_heads / c->n_kv_heads;
    const size_t row = (size_t)d * c->dim; /* floats of one head's rows */
    for (int l = 0; l < c->n_layers; l++)
        for (int j = 0; j < n_kv_heads; j++) {
            /* new head j serves the query heads old head j / r served: h / G_new = j and
             * h / G_old = j / r, since G_old = r·G_new */
            const size_t src = ((size_t)l * c->n_kv_heads + j / r) * row;
            const size_t dst = ((size_t)l * n_kv_heads + j) * row;
            memcpy(out->w.wk + dst, in->w.wk + src, row * sizeof(float));
            memcpy(out->w.wv + dst, in->w.wv + src, row * sizeof(float));
        }
    return KV_OK;
}

/* ---- widen: more heads of the same d, the old function kept ---------------------------- */

/* dst [rows][dst_cols] gets src [src_rows][src_cols] in its top-left corner (dst is zeroed) */
static void pad_copy(float *dst, const float *src, int src_rows, int src_cols, int dst_cols)
{
    for (int r = 0; r < src_rows; r++)
        memcpy(dst + (size_t)r * dst_cols, src + (size_t)r * src_cols,
               (size_t)src_cols * sizeof(float));
}

int kv_convert_widen(kv_model *out, const kv_model *in, int n_heads, uint64_t seed, kv_err *err)
{
    if (!out || !in || !in->data) return kv_fail(err, KV_ERR_ARG, "kv_convert: NULL model");
    if (kv_model_need_fp32(in, "kv_convert", err)) return KV_ERR_UNSUPPORTED;
    const kv_config *c = &in->config;
    if (c->attn != KV_ATTN_GQA) return kv_config_require_gqa(c, "kv_convert", err); /* K/V heads */
    if (c->n_kv_heads != c->n_heads)
        return kv_fail(err, KV_ERR_ARG, "kv_convert_widen: needs an MHA model (H_kv %d != H %d);"
                       " expand its KV heads first", c->n_kv_heads, c->n_heads);
    if (n_heads < c->n_heads)
        return kv_fail(err, KV_ERR_ARG, "kv_convert_widen: %d heads is fewer than the model's %d",
                       n_heads, c->n_heads);
    const int d = kv_config_head_dim(c), H = c->n_heads, L = c->n_layers;
    const int D = c->dim, hidden = c->hidden_dim, V = c->vocab_size;
    kv_config nc = *c;
    nc.dim = n_heads * d;
    nc.n_heads = nc.n_kv_heads = n_heads;
    nc.norm_eps = c->norm_eps * (float)D / (float)nc.dim; /* mean over dim' = mean over dim */
    int rc = kv_model_alloc(out, &nc, err); /* zeroed */
    if (rc) return rc;
    const int D2 = nc.dim, hd = H * d, hd2 = n_heads * d;
    const float gs = sqrtf((float)D / (float)D2); /* RMSNorm gain scale: rms' = rms·sqrt(D/D2) */
    kv_weights *o = &out->w;
    const kv_weights *w = &in->w;

    pad_copy(o->token_embedding, w->token_embedding, V, D, D2);
    if (!c->tied_classifier) pad_copy(o->wcls, w->wcls, V, D, D2);
    for (int i = 0; i < D2; i++) o->rms_final[i] = (i < D ? w->rms_final[i] : 1.0f) * gs;
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    const float a = sqrtf(3.0f / (float)D);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < D2; i++) {
            o->rms_att[(size_t)l * D2 + i] = (i < D ? w->rms_att[(size_t)l * D + i] : 1.0f) * gs;
            o->rms_ffn[(size_t)l * D2 + i] = (i < D ? w->rms_ffn[(size_t)l * D + i] : 1.0f) * gs;
        }
        float *mats2[3] = {o->wq + (size_t)l * hd2 * D2, o->wk + (size_t)l * hd2 * D2,
                           o->wv + (size_t)l * hd2 * D2}; /* [H'·d][D'] */
        const float *mats[3] = {w->wq + (size_t)l * hd * D, w->wk + (size_t)l * hd * D,
                                w->wv + (size_t)l * hd * D}; /* [H·d][D] */
        for (int m = 0; m < 3; m++) {
            pad_copy(mats2[m], mats[m], hd, D, D2);
            /* the new heads' rows: random over the old residual dims 1..D-1 */
            for (int r = hd; r < hd2; r++)
                for (int x = 1; x < D; x++)
                    mats2[m][(size_t)r * D2 + x] = kv_rng_uniform(&rng, -a, a);
        }
        /* Wo [D'][H'·d]: the old heads write where they wrote; the new heads write nothing */
        pad_copy(o->wo + (size_t)l * D2 * hd2, w->wo + (size_t)l * D * hd, D, hd, hd2);
        pad_copy(o->w1 + (size_t)l * hidden * D2, w->w1 + (size_t)l * hidden * D, hidden, D, D2);
        pad_copy(o->w3 + (size_t)l * hidden * D2, w->w3 + (size_t)l * hidden * D, hidden, D, D2);
        /* W2 [D'][hidden]: the first D rows; the new dims get nothing */
        memcpy(o->w2 + (size_t)l * D2 * hidden, w->w2 + (size_t)l * D * hidden,
               (size_t)D * hidden * sizeof(float));
    }
    return KV_OK;
}

/* ---- files ------------------------------------------------------------------------------ */

int kv_convert_file(const char *in_path, const char *out_path, int n_kv_heads, int format,
                    kv_err *err)
{
    kv_model in = {0}, out = {0};
    int rc = kv_checkpoint_read(in_path, &in, err);
    if (!rc) rc = kv_convert_pool_kv_heads(&out, &in, n_kv_heads, err);
    if (!rc) rc = kv_checkpoint_write(out_path, &out, format, err);
    kv_model_free(&in);
    kv_model_free(&out);
    return rc;
}

/* ---- measuring the change --------------------------------------------------------------- */

/* log of sum(exp(z)) over n logits, computed relative to their max */
static double log_sum_exp(const float *z, int n)
{
    double m = z[0], s = 0.0;
    for (int i = 1; i < n; i++) if (z[i] > m) m = z[i];
    for (int i = 0; i < n; i++) s += exp((double)z[i] - m);
    return m + log(s);
}

static int argmax(const float *z, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++) if (z[i] > z[best]) best = i;
    return best;
}

int kv_convert_compare(const kv_model *ref, const kv_model *new_model, const int *tokens, int n,
                       kv_convert_diff *out, kv_err *err)
{
    if (!ref || !new_model || !tokens || !out || n < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_convert_compare: NULL argument or n %d < 1", n);
    const int V = ref->config.vocab_size;
    if (new_model->config.vocab_size != V)
        return kv_fail(err, KV_ERR_ARG, "kv_convert_compare: vocabularies differ (%d vs %d)", V,
                       new_model->config.vocab_size);
    memset(out, 0, sizeof *out);
    const kv_model *m[2] = {ref, new_model};
    kv_cache c[2];
    kv_state s[2];
    memset(c, 0, sizeof c);
    kv_state_init(&s[0]);
    kv_state_init(&s[1]);
    float *logits = kv_calloc(2 * (size_t)V * sizeof(float)); /* [2][V] */
    int rc = logits ? KV_OK : kv_fail(err, KV_ERR_NOMEM, "kv_convert_compare: logits");
    kv_cache_spec spec = kv_cache_spec_default(1, n);
    for (int i = 0; i < 2 && !rc; i++) rc = kv_cache_create(&c[i], &m[i]->config, &spec, err);
    int agree = 0;
    out->identical = 1;
    for (int p = 0; p < n && !rc; p++) {
        kv_seq q = {0, p, 1, tokens + p};
        for (int i = 0; i < 2 && !rc; i++)
            rc = kv_forward(m[i], &c[i], &s[i], &q, 1, logits + (size_t)i * V, NULL, err);
        if (rc) break;
        const float *a = logits, *b = logits + V; /* [V] reference, [V] converted */
        /* KL(p || q) = sum p_i (log p_i - log q_i), log p_i = a_i - lse(a) */
        const double la = log_sum_exp(a, V), lb = log_sum_exp(b, V);
        double kl = 0.0;
        for (int i = 0; i < V; i++) {
            const double lp = a[i] - la, lq = b[i] - lb;
            kl += exp(lp) * (lp - lq);
            const double diff = fabs((double)b[i] - a[i]);
            if (diff > out->max_abs) out->max_abs = diff;
            if (memcmp(&a[i], &b[i], sizeof(float))) out->identical = 0;
        }
        if (kl < 0.0) kl = 0.0; /* rounding below zero: the true KL is >= 0 */
        out->kl_mean += kl;
        if (kl > out->kl_max) out->kl_max = kl;
        agree += argmax(a, V) == argmax(b, V);
        out->positions++;
    }
    if (out->positions) {
        out->kl_mean /= out->positions;
        out->top1_agree = (double)agree / out->positions;
    }
    for (int i = 0; i < 2; i++) {
        kv_cache_free(&c[i]);
        kv_state_free(&s[i]);
    }
    kv_free(logits);
    return rc;
}
