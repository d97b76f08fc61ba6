/* The attention family on the CPU (kv_attention.h): the entry points and the switches.
 *
 * Decode attention is written three times, each a file of its own:
 *  - kv_attention_ref.c, the reference: the three passes of the math over kv_cache_elem(),
 *    in double, one query head at a time. The oracle every other path is tested against.
 *  - kv_attention_fast.c, the fast path: the same passes in float as loops the compiler
 *    vectorizes, a KV head's G query heads computed together (a group), rows decoded once
 *    each, the passes of one group split over the team when there are fewer groups than
 *    threads (or a decoded token's do not share out evenly), and an option to score int8
 *    keys against a query rounded to 16-bit integers.
 *  - kv_attention_avx2.c, the fast path's twins for x86-64 with AVX2: the same operations
 *    in the same order with intrinsics, chosen at run time.
 * The engine (kv_forward()) calls kv_attention_rows(): the fast path. This file finds a
 * group's rows in the cache through its spec (chapter 02's fp32 rows, chapter 04's storage
 * formats, chapter 05's blocks, chapter 06's windows: kv_cache_view()), spreads the groups
 * over the threads and sizes their scratch. Grouped-query attention (chapter 03) is which K/V
 * rows a query head is handed: query head h reads KV head kv_attn_kv_head(h) = h / G. */
#include "kv_attention_fast.h"

#include <math.h>
#include <omp.h>

int kv_attn_simd(int mode)
{
    kv_attn_fast_init();
    if (mode >= 0) kv_attn_machine.use_avx2 = mode && kv_attn_machine.avx2;
    return kv_attn_machine.use_avx2;
}

int kv_attn_q16(int mode)
{
    kv_attn_fast_init();
    if (mode >= 0) kv_attn_machine.q16 = mode != 0;
    return kv_attn_machine.q16;
}

/* Scratch of one thread: att [G][max_len], sum [G], mx [G], the row scratch
 * (kv_attn_row_floats()), rounded up to 16 floats (64 bytes) so threads never share a cache
 * line. */
static size_t thread_floats(int G, int d, int64_t max_len)
{
    const size_t n = (size_t)G * (size_t)max_len + 2u * (size_t)G + kv_attn_row_floats(G, d);
    return (n + 15) / 16 * 16;
}

size_t kv_attention_scratch(const kv_cache *c, int n_heads, int64_t max_len)
{
    const int G = kv_heads_group(n_heads, c->n_kv_heads);
    return (size_t)omp_get_max_threads() * thread_floats(G, c->head_dim, max_len);
}

/* Group (row k, KV head kvh) of kv_attention_rows() with att and sum in @p blk. */
static void group_of_cache(kv_attn_group *g, const kv_cache *c, int layer, int slot, int pos,
                           int kvh, int G, const float *q, float *out, float *blk,
                           int64_t max_len)
{
    const int d = c->head_dim;
    memset(g, 0, sizeof *g);
    g->G = G;
    g->d = d;
    g->len = kv_window_count(c->spec.window.size, c->spec.window.n_sinks, pos);
    g->q = q + (size_t)kvh * G * d;
    g->out = out + (size_t)kvh * G * d;
    g->att = blk;
    g->sum = blk + (size_t)G * max_len;
    g->kh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_KEY);
    g->vh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_VALUE);
    const kv_attn_retained w = {c->spec.window.size, c->spec.window.n_sinks, pos, c->rope_cs,
                                c->rotary_dim};
    g->w = w;
}

void kv_attention_rows(const kv_cache *c, int layer, int n, const int *rows, const int *slot,
                       const int *pos, const float *q, float *out, size_t stride, int n_heads,
                       int64_t max_len, float *scratch)
{
    const int Hkv = c->n_kv_heads, G = kv_heads_group(n_heads, Hkv), d = c->head_dim;
    const size_t per = thread_floats(G, d, max_len);
    const int64_t groups = (int64_t)n * Hkv;
    const int par = kv_parallel_worth(groups * G * max_len * d);
    const int nt = omp_get_max_threads();
    /* fewer groups than threads, or one token's groups that do not share out evenly (decode
     * with 3 KV heads on 2 threads: one thread would take two groups, the other one): split
     * each group over the team */
    if (par && (groups < nt || (n == 1 && groups % nt))) {
        for (int k = 0; k < n; k++) {
            const int t = rows ? rows[k] : k;
            for (int kvh = 0; kvh < Hkv; kvh++) {
                kv_attn_group g;
                group_of_cache(&g, c, layer, slot[t], pos[t], kvh, G, q + (size_t)t * stride,
                               out + (size_t)t * stride, scratch, max_len);
                kv_attn_group_run_team(&g, scratch + (size_t)G * max_len + G, per);
            }
        }
        return;
    }
    /* dynamic: in a prefill later rows attend over more positions than earlier ones */
    #pragma omp parallel for collapse(2) schedule(dynamic) if (par)
    for (int k = 0; k < n; k++)
        for (int kvh = 0; kvh < Hkv; kvh++) {
            const int t = rows ? rows[k] : k;
            float *blk = scratch + (size_t)omp_get_thread_num() * per;
            kv_attn_group g;
            group_of_cache(&g, c, layer, slot[t], pos[t], kvh, G, q + (size_t)t * stride,
                           out + (size_t)t * stride, blk, max_len);
            kv_attn_group_run(&g, blk + (size_t)G * max_len + G,
                              blk + (size_t)G * max_len + 2 * G);
        }
}

int kv_attention(const kv_cache *c, int layer, int slot, int pos, const float *q, float *out,
                 int n_heads)
{
    const int64_t len = kv_window_count(c->spec.window.size, c->spec.window.n_sinks, pos);
    float *scratch = kv_calloc(kv_attention_scratch(c, n_heads, len) * sizeof(float));
    if (!scratch) return KV_ERR_NOMEM;
    kv_attention_rows(c, layer, 1, NULL, &slot, &pos, q, out, 0, n_heads, len, scratch);
    kv_free(scratch);
    return KV_OK;
}

void kv_attention_head(const kv_cache *c, int layer, int slot, int pos, int h, int n_heads,
                       const float *qh, float *oh, float *att)
{
    const int kvh = kv_attn_kv_head(h, n_heads, c->n_kv_heads), d = c->head_dim;
    float *row = kv_calloc(kv_attn_row_floats(1, d) * sizeof(float)); /* the row scratch */
    if (!row) { /* no memory: make the failure visible rather than silently wrong */
        for (int i = 0; i < d; i++) oh[i] = NAN;
        return;
    }
    kv_attn_group g;
    float sum, mx;
    const int64_t len = kv_window_count(c->spec.window.size, c->spec.window.n_sinks, pos);
    group_of_cache(&g, c, layer, slot, pos, kvh, 1, qh, oh, att, len);
    /* a group of one: head h alone, its query, output and sum where the caller put them */
    g.q = qh;
    g.out = oh;
    g.sum = &sum;
    kv_attn_group_run(&g, &mx, row);
    kv_free(row);
}

int kv_attn_decode(const float *q, const float *k, const float *v, float *out,
                   int n_heads, int n_kv_heads, int head_dim, int max_seq, int len)
{
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || head_dim < 1 || len < 1 ||
        len > max_seq)
        return KV_ERR_ARG;
    const int G = kv_heads_group(n_heads, n_kv_heads), d = head_dim;
    const size_t per = thread_floats(G, d, len);
    float *scratch = kv_calloc((size_t)omp_get_max_threads() * per * sizeof(float));
    if (!scratch) return KV_ERR_NOMEM;
    #pragma omp parallel for
    for (int kvh = 0; kvh < n_kv_heads; kvh++) {
        float *blk = scratch + (size_t)omp_get_thread_num() * per;
        kv_attn_group g;
        memset(&g, 0, sizeof g);
        g.G = G;
        g.d = d;
        g.len = len;
        g.q = q + (size_t)kvh * G * d;
        g.out = out + (size_t)kvh * G * d;
        g.att = blk;
        g.sum = blk + (size_t)G * len;
        g.k = k + (size_t)kvh * max_seq * d; /* [max_seq][d] */
        g.v = v + (size_t)kvh * max_seq * d;
        g.w.t = len - 1; /* no window: the walk visits rows 0..len-1 */
        kv_attn_group_run(&g, blk + (size_t)G * len + G, blk + (size_t)G * len + 2 * G);
    }
    kv_free(scratch);
    return KV_OK;
}
