/* Decode attention, the reference: the math of kv_attention(), written plainly.
 *
 * One query token at position pos attends over the positions its cache retains (all of
 * 0..pos, or with a window, chapter 06, the sinks and the last W). Query head h reads KV
 * head h / G (chapter 03), and over the n retained positions i:
 *
 *     s_i   = q_h · k_i / √d             pass 1: one score per position, and their max m
 *     w_i   = exp(s_i - m),  Z = Σ_i w_i  pass 2: shifting by m keeps exp() from overflowing
 *     out_h = Σ_i w_i · v_i / Z           pass 3: the values, weighted
 *
 * Every key and value element is read through kv_cache_elem(), whatever the storage format
 * (chapter 04) or layout (chapter 05): this file never sees a code, a scale or a block table.
 * Arithmetic in double, so the result is the exact attention of the stored rows to ~1e-15: the
 * oracle the fast path (kv_attention_fast.c, kv_attention_avx2.c) and the GPU kernels are held
 * to, within a stated error bound (tests/test_attn_fast.c). Slow on purpose: no blocking, no
 * vectors, no tables, libm's exp().
 */
#include "kv_attention.h"
#include "kv_window.h"

#include <math.h>
#include <stdlib.h>

/* Key row r of view kh into k [d]. Under KV_POS_CACHE (chapter 06: keys cached before RoPE,
 * rotated by their index i in the cache, so a window's keys keep the distances the model was
 * trained on) the pairs (2j, 2j+1) of the first rotary_dim dims are rotated by the angles
 * kv_rope() gives index i, which the cache keeps in a table: rope_cs [S+W][rotary_dim/2][2]. */
static void key_row(const kv_cache *c, const kv_head_view *kh, int64_t r, int64_t i, double *k)
{
    for (int j = 0; j < c->head_dim; j++) k[j] = kv_cache_elem(kh, r, j);
    if (!c->rope_cs) return;
    const float *cs = c->rope_cs + (size_t)i * (c->rotary_dim / 2) * 2; /* [rotary_dim/2][2] */
    for (int j = 0; j < c->rotary_dim / 2; j++) {
        const double a = k[2 * j], b = k[2 * j + 1], cos_i = cs[2 * j], sin_i = cs[2 * j + 1];
        k[2 * j] = a * cos_i - b * sin_i;
        k[2 * j + 1] = a * sin_i + b * cos_i;
    }
}

int kv_attention_ref(const kv_cache *c, int layer, int slot, int pos, const float *q,
                     float *out, int n_heads)
{
    const int d = c->head_dim, W = c->spec.window.size, S = c->spec.window.n_sinks;
    const int64_t n = kv_window_count(W, S, pos); /* positions this query sees */
    double *att = malloc((size_t)n_heads * n * sizeof(double)); /* [H][n] scores, then w_i */
    double *key = malloc((size_t)n_heads * d * sizeof(double)); /* [H][d] a key row per head */
    double *acc = malloc((size_t)n_heads * d * sizeof(double)); /* [H][d] Σ_i w_i · v_i */
    if (!att || !key || !acc) {
        free(att), free(key), free(acc);
        return KV_ERR_NOMEM;
    }
    #pragma omp parallel for
    for (int h = 0; h < n_heads; h++) {
        const int kvh = kv_attn_kv_head(h, n_heads, c->n_kv_heads);
        const kv_head_view kh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_KEY);
        const kv_head_view vh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_VALUE);
        const float *qh = q + (size_t)h * d;     /* [d] */
        double *s = att + (size_t)h * n;         /* [n] */
        double *k = key + (size_t)h * d;         /* [d] */
        double *o = acc + (size_t)h * d;         /* [d] */

        /* pass 1: the scores, positions in order (i-th retained position, its stored row) */
        double max = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            const int64_t row = kv_window_row(W, S, kv_window_pos(W, S, pos, i));
            key_row(c, &kh, row, i, k);
            double dot = 0.0;
            for (int j = 0; j < d; j++) dot += qh[j] * k[j];
            s[i] = dot / sqrt((double)d);
            if (s[i] > max) max = s[i];
        }

        /* pass 2: exponentials relative to the max (the largest is exp(0) = 1), and their sum */
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            s[i] = exp(s[i] - max);
            sum += s[i];
        }

        /* pass 3: the weighted sum of the value rows, divided once by the sum */
        for (int j = 0; j < d; j++) o[j] = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t row = kv_window_row(W, S, kv_window_pos(W, S, pos, i));
            for (int j = 0; j < d; j++) o[j] += s[i] * kv_cache_elem(&vh, row, j);
        }
        for (int j = 0; j < d; j++) out[(size_t)h * d + j] = (float)(o[j] / sum);
    }
    free(att), free(key), free(acc);
    return KV_OK;
}
