/* Multi-head latent attention, naive and absorbed (kv_attention_mla.h, chapter 11).
 *
 * Both read the latent rows through the cache's view once, into rows [n][d_c + d_R] (every
 * head reads the same rows: what is cached is shared), so the two differ only in the math the
 * file comment of the header derives. Heads run on the OpenMP threads, each with its own slice
 * of one scratch allocation; within a head every sum runs in one fixed order. */
#include "kv_attention_mla.h"
#include "kv_ops.h"

#include <math.h>
#include <omp.h>
#include <string.h>

/* rows [n][width] <- the view's rows 0..n-1, decoded (fp32 rows are copied as they are) */
static float *decode_rows(const kv_head_view *lat, int n, int width)
{
    float *rows = kv_calloc((size_t)n * width * sizeof(float) + sizeof(float));
    if (!rows) return NULL;
    #pragma omp parallel for if (kv_parallel_worth((int64_t)n * width))
    for (int t = 0; t < n; t++)
        for (int j = 0; j < width; j++) rows[(size_t)t * width + j] = kv_cache_elem(lat, t, j);
    return rows;
}

/* The decoded rows and per-thread scratch of @p per floats, or KV_ERR_NOMEM. */
static int buffers(const char *who, const kv_head_view *lat, int n, int width, size_t per,
                   float **rows, float **scratch, kv_err *err)
{
    *rows = decode_rows(lat, n, width);
    *scratch = kv_calloc((size_t)omp_get_max_threads() * per * sizeof(float));
    if (*rows && *scratch) return KV_OK;
    kv_free(*rows);
    kv_free(*scratch);
    return kv_fail(err, KV_ERR_NOMEM, "%s: scratch for %d rows", who, n);
}

static int check(const char *who, const kv_mla_layer *w, const float *q_nope,
                 const float *q_rope, const kv_head_view *lat, int n, float *out, kv_err *err)
{
    if (!w || !q_nope || !q_rope || !lat || !out)
        return kv_fail(err, KV_ERR_ARG, "%s: NULL argument", who);
    if (n < 1) return kv_fail(err, KV_ERR_ARG, "%s: n %d (need >= 1 cached row)", who, n);
    if (lat->d != kv_mla_row(&w->m))
        return kv_fail(err, KV_ERR_ARG, "%s: the view's rows hold %d elements, the layer's "
                       "latent rows d_c + d_R = %d", who, lat->d, kv_mla_row(&w->m));
    return KV_OK;
}

int kv_mla_attention_naive(const kv_mla_layer *w, const float *q_nope, const float *q_rope,
                           const kv_head_view *lat, int n, float *out, kv_err *err)
{
    int rc = check("kv_mla_attention_naive", w, q_nope, q_rope, lat, n, out, err);
    if (rc) return rc;
    const kv_mla_dims *m = &w->m;
    const int H = w->n_heads, dc = m->d_c, dn = m->d_nope, dr = m->d_rope, dv = m->d_v;
    const int qk = dn + dr, width = kv_mla_row(m);
    const float scale = 1.0f / sqrtf((float)qk);
    /* per thread: the head's up-projected keys k [n][qk], values v [n][d_v], scores [n] and
     * its whole query [qk] */
    const size_t per = (size_t)n * (qk + dv + 1) + qk;
    float *rows, *scratch; /* [n][d_c + d_R], [threads][per] */
    rc = buffers("kv_mla_attention_naive", lat, n, width, per, &rows, &scratch, err);
    if (rc) return rc;
    /* a team only when the heads' work pays for one (a decode step of a tiny model does not) */
    #pragma omp parallel for schedule(static) if (kv_parallel_worth((int64_t)H * n * dc * (dn + dv)))
    for (int h = 0; h < H; h++) {
        float *k = scratch + (size_t)omp_get_thread_num() * per; /* [n][qk] */
        float *v = k + (size_t)n * qk;                            /* [n][d_v] */
        float *s = v + (size_t)n * dv;                            /* [n] */
        float *q = s + n;                                         /* [qk] */
        const float *uk = w->w_uk + (size_t)h * dn * dc;          /* [d_nope][d_c] */
        const float *uv = w->w_uv + (size_t)h * dv * dc;          /* [d_v][d_c] */
        /* up-project every cached latent to this head's key and value: the work absorption
         * removes, n·d_c·(d_nope + d_v) multiply-adds per head per step */
        for (int t = 0; t < n; t++) {
            const float *ct = rows + (size_t)t * width, *krt = ct + dc;
            float *kt = k + (size_t)t * qk;
            for (int i = 0; i < dn; i++) kt[i] = kv_dot(uk + (size_t)i * dc, ct, dc);
            memcpy(kt + dn, krt, (size_t)dr * sizeof(float)); /* the shared RoPE key */
            for (int i = 0; i < dv; i++) v[(size_t)t * dv + i] = kv_dot(uv + (size_t)i * dc, ct, dc);
        }
        memcpy(q, q_nope + (size_t)h * dn, (size_t)dn * sizeof(float));
        memcpy(q + dn, q_rope + (size_t)h * dr, (size_t)dr * sizeof(float));
        /* ordinary attention over keys of d_nope + d_R and values of d_v */
        for (int t = 0; t < n; t++) s[t] = kv_dot(q, k + (size_t)t * qk, qk) * scale;
        kv_softmax(s, n);
        float *oh = out + (size_t)h * dv;
        for (int i = 0; i < dv; i++) oh[i] = 0.0f;
        for (int t = 0; t < n; t++)
            for (int i = 0; i < dv; i++) oh[i] += s[t] * v[(size_t)t * dv + i];
    }
    kv_free(rows);
    kv_free(scratch);
    return KV_OK;
}

int kv_mla_attention_absorbed(const kv_mla_layer *w, const float *q_nope, const float *q_rope,
                              const kv_head_view *lat, int n, float *out, kv_err *err)
{
    int rc = check("kv_mla_attention_absorbed", w, q_nope, q_rope, lat, n, out, err);
    if (rc) return rc;
    const kv_mla_dims *m = &w->m;
    const int H = w->n_heads, dc = m->d_c, dn = m->d_nope, dr = m->d_rope, dv = m->d_v;
    const int width = kv_mla_row(m);
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    /* per thread: the absorbed query q̃ [d_c], scores [n], the latent output o [d_c] */
    const size_t per = (size_t)2 * dc + n;
    float *rows, *scratch; /* [n][d_c + d_R]: every head reads these; [threads][per] */
    rc = buffers("kv_mla_attention_absorbed", lat, n, width, per, &rows, &scratch, err);
    if (rc) return rc;
    #pragma omp parallel for schedule(static) if (kv_parallel_worth((int64_t)H * (n + dn) * dc))
    for (int h = 0; h < H; h++) {
        float *qt = scratch + (size_t)omp_get_thread_num() * per; /* [d_c] */
        float *o = qt + dc;                                        /* [d_c] */
        float *s = o + dc;                                         /* [n] */
        const float *uk = w->w_uk + (size_t)h * dn * dc;           /* [d_nope][d_c] */
        const float *uv = w->w_uv + (size_t)h * dv * dc;           /* [d_v][d_c] */
        const float *qn = q_nope + (size_t)h * dn, *qr = q_rope + (size_t)h * dr;
        /* q̃ = W_UKᵀ q_nope: row i of W_UK weighted by q_nope[i], summed in order of i */
        for (int j = 0; j < dc; j++) qt[j] = 0.0f;
        for (int i = 0; i < dn; i++)
            for (int j = 0; j < dc; j++) qt[j] += qn[i] * uk[(size_t)i * dc + j];
        /* scores against the latent and the shared RoPE key, as they are cached */
        for (int t = 0; t < n; t++) {
            const float *ct = rows + (size_t)t * width;
            s[t] = (kv_dot(qt, ct, dc) + kv_dot(qr, ct + dc, dr)) * scale;
        }
        kv_softmax(s, n);
        /* the weighted sum stays in latent space: the values are the keys' first d_c elements */
        for (int j = 0; j < dc; j++) o[j] = 0.0f;
        for (int t = 0; t < n; t++) {
            const float *ct = rows + (size_t)t * width;
            for (int j = 0; j < dc; j++) o[j] += s[t] * ct[j];
        }
        /* W_UV once, after the sum */
        float *oh = out + (size_t)h * dv;
        for (int i = 0; i < dv; i++) oh[i] = kv_dot(uv + (size_t)i * dc, o, dc);
    }
    kv_free(rows);
    kv_free(scratch);
    return KV_OK;
}

double kv_mla_attention_flops(const kv_mla_dims *m, int n_heads, int n, int absorbed)
{
    const double H = n_heads, N = n, dc = m->d_c, dn = m->d_nope, dr = m->d_rope, dv = m->d_v;
    if (absorbed) /* q̃, then per row scores (d_c + d_R) and the latent sum (d_c), then W_UV */
        return H * (2.0 * dn * dc + N * (2.0 * (dc + dr) + 2.0 * dc) + 2.0 * dc * dv);
    /* per row: up-projections, then scores and values */
    return H * N * (2.0 * dc * (dn + dv) + 2.0 * (dn + dr) + 2.0 * dv);
}

/* ---- the latent cache: the chapter-02 cache with one plane, nothing of its own ------------- */

int kv_mla_cache_open(kv_cache *c, const kv_mla_dims *m, int n_tokens, int fmt, int paged,
                      int spare_blocks, kv_err *err)
{
    kv_config shape;
    kv_cache_spec spec = kv_cache_spec_default(1, n_tokens);
    const int nb = (n_tokens + 63) / 64;
    spec.quant.dtype = fmt;
    spec.quant.fp8_per_head = 1;
    if (paged) {
        spec.layout.kind = KV_LAYOUT_PAGED;
        spec.layout.block_size = 64;
        spec.layout.n_blocks = nb + spare_blocks;
    }
    int st = kv_mla_cache_config(m, 1, n_tokens, &shape, err);
    if (!st) st = kv_cache_create_planes(c, &shape, &spec, 1, err);
    if (st || !paged) return st;
    int *blocks = kv_calloc((size_t)nb * sizeof(int));
    if (!blocks) {
        kv_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM, "kv_mla_cache_open: block table of %d", nb);
    }
    for (int i = 0; i < nb; i++) blocks[i] = spec.layout.n_blocks - 1 - i;
    st = kv_cache_set_blocks(c, 0, blocks, nb, err);
    kv_free(blocks);
    if (st) kv_cache_free(c);
    return st;
}
