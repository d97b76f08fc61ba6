/* Multi-head latent attention's shapes, presets and projections (kv_mla.h, chapter 11). */
#include "kv_mla.h"
#include "kv_ops.h"
#include "kv_rng.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/* ----------------------------------------------------------------------------
 * Presets: the attention shapes of DeepSeek's MLA models, from the configs DeepSeek published
 * with its models: config.json of deepseek-ai/DeepSeek-V2 and DeepSeek-V2-Lite
 * (hidden_size, num_hidden_layers, num_attention_heads, kv_lora_rank, q_lora_rank,
 * qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vocab_size, max_position_embeddings), which
 * the inference configs of deepseek-ai/DeepSeek-V3 repeat as config_236B.json, config_16B.json
 * (q_lora_rank 0 there: no query compression) and config_671B.json (DeepSeek-V3).
 *
 *              dim   L    H   d_c  d_R  nope  d_v  q_rank  vocab   context
 *   V2        5120  60  128   512   64   128  128    1536  102400  163840
 *   V2-Lite   2048  27   16   512   64   128  128       -  102400  163840
 *   V3        7168  61  128   512   64   128  128    1536  129280  163840
 */
static const kv_mla_preset kv_mla_table[] = {
    {"deepseek-v2", 5120, 60, 128, 102400, 163840, {512, 64, 128, 128, 1536}},
    {"deepseek-v2-lite", 2048, 27, 16, 102400, 163840, {512, 64, 128, 128, 0}},
    {"deepseek-v3", 7168, 61, 128, 129280, 163840, {512, 64, 128, 128, 1536}},
};

/* DeepSeek 67B (deepseek-ai/deepseek-llm-67b-base, config.json: hidden_size 8192,
 * intermediate_size 22016, num_hidden_layers 95, num_attention_heads 64,
 * num_key_value_heads 8, vocab_size 102400, max_position_embeddings 4096): the dense GQA
 * model the DeepSeek-V2 paper names when it reports its 93.3 % smaller KV cache. */
static const kv_preset kv_mla_base = {
    "deepseek-67b", {8192, 22016, 95, 64, 8, 102400, 4096, 10000.0f, 128, 1e-6f, 0,
                     KV_MODEL_GENERIC, KV_ATTN_GQA, {0}}, 0};

const kv_mla_preset *kv_mla_presets(int *n)
{
    if (n) *n = (int)(sizeof kv_mla_table / sizeof kv_mla_table[0]);
    return kv_mla_table;
}

const kv_mla_preset *kv_mla_preset_find(const char *name)
{
    int n = 0;
    const kv_mla_preset *p = kv_mla_presets(&n);
    for (int i = 0; name && i < n; i++)
        if (strcasecmp(name, p[i].name) == 0) return &p[i];
    return NULL;
}

const kv_preset *kv_mla_baseline(void) { return &kv_mla_base; }

int kv_mla_cache_config(const kv_mla_dims *m, int n_layers, int seq_len, kv_config *out,
                        kv_err *err)
{
    int rc = kv_mla_dims_check(m, err);
    if (rc) return rc;
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_mla_cache_config: NULL config");
    memset(out, 0, sizeof *out);
    out->dim = kv_mla_row(m); /* one head of d_c + d_R: dim / n_heads is the row */
    out->hidden_dim = 1;
    out->n_layers = n_layers;
    out->n_heads = 1;
    out->n_kv_heads = 1;
    out->vocab_size = 1;
    out->seq_len = seq_len;
    kv_config_set_defaults(out);
    out->rotary_dim = m->d_rope & ~1; /* only k_R is rotated (and before it is cached) */
    return kv_config_validate(out, err);
}

/* ---- weights ------------------------------------------------------------------------------ */

int kv_mla_dims_check(const kv_mla_dims *m, kv_err *err)
{
    if (!m) return kv_fail(err, KV_ERR_ARG, "MLA dims: NULL");
    const struct { const char *name; int v, lo, hi; } f[] = {
        {"d_c (kv_lora_rank)", m->d_c, 1, 4096},
        {"d_R (qk_rope_head_dim)", m->d_rope, 2, 512},
        {"d_nope (qk_nope_head_dim)", m->d_nope, 1, 4096},
        {"d_v (v_head_dim)", m->d_v, 1, 4096},
        {"q_rank (q_lora_rank)", m->q_rank, 0, 16384},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return kv_fail(err, KV_ERR_ARG, "MLA dims: %s is %d, outside [%d, %d]", f[i].name,
                           f[i].v, f[i].lo, f[i].hi);
    if (m->d_rope % 2)
        return kv_fail(err, KV_ERR_ARG, "MLA dims: d_R (%d) must be even (RoPE rotates pairs)",
                       m->d_rope);
    /* the latent row is cached as one head of d_c + d_R (kv_mla_cache_config()), and a head's
     * width is even (kv_config_validate()): say so here, naming the dims, not a head dim later */
    if (kv_mla_row(m) % 2)
        return kv_fail(err, KV_ERR_ARG, "MLA dims: d_c + d_R (%d) must be even: the latent row "
                       "is cached as one head, whose width is even", kv_mla_row(m));
    return KV_OK;
}

/* uniform ±sqrt(3/fan_in): unit-variance outputs for unit-variance inputs (kv_model.c) */
static void fill(float *x, int64_t n, int fan_in, kv_rng *r)
{
    const float a = sqrtf(3.0f / (float)fan_in);
    for (int64_t i = 0; i < n; i++) x[i] = kv_rng_uniform(r, -a, a);
}

/* floats per layer of each tensor, in the order they are laid out and filled */
typedef struct {
    int64_t wq, qa, qn, qb, kva, kvn, uk, uv, wo;
} mla_sizes;

static mla_sizes sizes(const kv_mla_dims *m, int dim, int n_heads)
{
    const int64_t H = n_heads, qk = m->d_nope + m->d_rope, R = m->q_rank;
    mla_sizes z;
    z.wq = R ? 0 : H * qk * dim;
    z.qa = R * dim;
    z.qn = R;
    z.qb = R ? H * qk * R : 0;
    z.kva = (int64_t)kv_mla_row(m) * dim;
    z.kvn = m->d_c;
    z.uk = H * m->d_nope * m->d_c;
    z.uv = H * m->d_v * m->d_c;
    z.wo = (int64_t)dim * H * m->d_v;
    return z;
}

int64_t kv_mla_layer_floats(const kv_mla_dims *m, int dim, int n_heads)
{
    const mla_sizes z = sizes(m, dim, n_heads);
    return z.wq + z.qa + z.qn + z.qb + z.kva + z.kvn + z.uk + z.uv + z.wo;
}

float *kv_mla_layers_carve(kv_mla_layer *w, int n_layers, int dim, int n_heads,
                           const kv_mla_dims *m, float *p)
{
    const mla_sizes z = sizes(m, dim, n_heads);
    const int64_t L = n_layers;
    /* tensor by tensor: layer l of a tensor of n floats per layer starts at base + l·n */
    float *wq = p, *qa = wq + L * z.wq, *qn = qa + L * z.qa, *qb = qn + L * z.qn;
    float *kva = qb + L * z.qb, *kvn = kva + L * z.kva, *uk = kvn + L * z.kvn;
    float *uv = uk + L * z.uk, *wo = uv + L * z.uv;
    for (int64_t l = 0; l < L; l++) {
        kv_mla_layer *x = &w[l];
        x->dim = dim;
        x->n_heads = n_heads;
        x->m = *m;
        x->wq = z.wq ? wq + l * z.wq : NULL;
        x->wq_a = z.qa ? qa + l * z.qa : NULL;
        x->q_norm = z.qn ? qn + l * z.qn : NULL;
        x->wq_b = z.qb ? qb + l * z.qb : NULL;
        x->wkv_a = kva + l * z.kva;
        x->kv_norm = kvn + l * z.kvn;
        x->w_uk = uk + l * z.uk;
        x->w_uv = uv + l * z.uv;
        x->wo = wo + l * z.wo;
    }
    return wo + L * z.wo;
}

int kv_mla_layer_init(kv_mla_layer *w, int dim, int n_heads, const kv_mla_dims *m,
                      uint64_t seed, kv_err *err)
{
    if (!w) return kv_fail(err, KV_ERR_ARG, "kv_mla_layer_init: NULL layer");
    memset(w, 0, sizeof *w);
    int rc = kv_mla_dims_check(m, err);
    if (rc) return rc;
    if (dim < 1 || dim > 65536 || n_heads < 1 || n_heads > 1024)
        return kv_fail(err, KV_ERR_ARG, "kv_mla_layer_init: dim %d, H %d (need 1..65536, 1..1024)",
                       dim, n_heads);
    const mla_sizes z = sizes(m, dim, n_heads);
    const int64_t total = kv_mla_layer_floats(m, dim, n_heads);
    float *data = kv_calloc((size_t)total * sizeof(float));
    if (!data)
        return kv_fail(err, KV_ERR_NOMEM, "kv_mla_layer_init: %.1f MiB of weights",
                       (double)total * 4 / 1048576.0);
    kv_mla_layers_carve(w, 1, dim, n_heads, m, data);
    w->data = data;

    kv_rng r;
    kv_rng_seed(&r, seed);
    if (w->wq) fill(w->wq, z.wq, dim, &r);
    if (m->q_rank) {
        fill(w->wq_a, z.qa, dim, &r);
        for (int64_t i = 0; i < z.qn; i++) w->q_norm[i] = 1.0f;
        fill(w->wq_b, z.qb, m->q_rank, &r);
    }
    fill(w->wkv_a, z.kva, dim, &r);
    for (int i = 0; i < m->d_c; i++) w->kv_norm[i] = 1.0f;
    fill(w->w_uk, z.uk, m->d_c, &r);
    fill(w->w_uv, z.uv, m->d_c, &r);
    fill(w->wo, z.wo, n_heads * m->d_v, &r);
    return KV_OK;
}

void kv_mla_layer_free(kv_mla_layer *w)
{
    if (!w) return;
    kv_free(w->data);
    memset(w, 0, sizeof *w);
}

/* ---- projections -------------------------------------------------------------------------- */

size_t kv_mla_project_scratch(const kv_mla_layer *w, int T)
{
    return (size_t)T * ((size_t)w->m.q_rank + (size_t)w->n_heads * (w->m.d_nope + w->m.d_rope));
}

void kv_mla_project(const kv_mla_layer *w, const float *x, const int *pos, int T,
                    const double *rope_freq, float eps, float *q_nope, float *q_rope, float *row,
                    float *scratch)
{
    const kv_mla_dims *m = &w->m;
    const int H = w->n_heads, qk = m->d_nope + m->d_rope, width = kv_mla_row(m);
    float *q = scratch;                                  /* [T][H][d_nope + d_R] */
    float *cq = scratch + (size_t)T * H * qk;            /* [T][q_rank] */
    if (m->q_rank) { /* query compression: q = W_UQ · RMSNorm(W_DQ · x) */
        kv_matmul(cq, x, w->wq_a, T, w->dim, m->q_rank);
        kv_rmsnorm(cq, cq, w->q_norm, T, m->q_rank, eps);
        kv_matmul(q, cq, w->wq_b, T, m->q_rank, H * qk);
    } else {
        kv_matmul(q, x, w->wq, T, w->dim, H * qk);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *qh = q + ((size_t)t * H + h) * qk;
            memcpy(q_nope + ((size_t)t * H + h) * m->d_nope, qh, (size_t)m->d_nope * sizeof(float));
            memcpy(q_rope + ((size_t)t * H + h) * m->d_rope, qh + m->d_nope,
                   (size_t)m->d_rope * sizeof(float));
        }
    /* the cache row: c_KV = RMSNorm(W_DKV x), then k_R = W_KR x, rotated at its position once */
    kv_matmul(row, x, w->wkv_a, T, w->dim, width);
    for (int t = 0; t < T; t++) {
        float *rt = row + (size_t)t * width;
        kv_rmsnorm(rt, rt, w->kv_norm, 1, m->d_c, eps);
        kv_rope(rt + m->d_c, pos + t, 1, 1, m->d_rope, m->d_rope, rope_freq);
    }
    kv_rope(q_rope, pos, T, H, m->d_rope, m->d_rope, rope_freq);
}
