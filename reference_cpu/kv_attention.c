/* The attention family on the CPU (kv_attention.h).
 *
 * attend_head() is the math, written once: one query head over len cached positions.
 * kv_attn_decode() feeds it plain arrays; kv_attention() and kv_attention_head() feed it the
 * rows of a kv_cache, found through the cache's spec. Chapter 04's storage formats are
 * attend_head_view(): the same passes, each K/V row dequantized as it is read (fused), by
 * the per-element decode the CUDA kernels share. Later layouts are new cases of the dispatch
 * in kv_attention_head(), not new copies of the math.
 *
 * Grouped-query attention (chapter 03) is not a separate routine: it is which K/V rows a query
 * head is handed. Query head h reads KV head kv_attn_kv_head(h) = h / G, so the G heads of a
 * group attend over the same cached rows with their own queries, and MHA (G = 1), GQA and MQA
 * (G = H) are the same code. That is also why "GQA" and "MHA whose K/V heads are duplicated
 * across each group" give bit-identical outputs: attend_head() sees identical inputs either way
 * (tests/test_gqa.c checks it). The CPU threads over query heads, so it reads a group's rows
 * G times, from cache after the first; the GPU's v2 kernel packs a group into one block so
 * device memory is read once per group (cuda/attn_decode.cu). */
#include "kv_attention.h"
#include "kv_ops.h"

#include <math.h>

/*
 * out = softmax(q·K^T / sqrt(d)) V for one head, positions 0..len-1 in order.
 * qh [d], kh, vh [>= len][d], oh [d], att [len] scratch.
 * Three passes so no exp() can overflow and only one division is made per output:
 *   1) scores and their max   2) exp(score - max) and their sum   3) weighted sum of values
 */
static void attend_head(const float *qh, const float *kh, const float *vh, float *oh, float *att,
                        int d, int len)
{
    const float scale = 1.0f / sqrtf((float)d);

    /* pass 1: scores q·k/√d, and their max */
    float max = -INFINITY;
    for (int p = 0; p < len; p++) {
        att[p] = kv_dot(qh, kh + (size_t)p * d, d) * scale;
        if (att[p] > max) max = att[p];
    }
    /* pass 2: exponentiate relative to the max (the largest becomes 1), and sum */
    float sum = 0.0f;
    for (int p = 0; p < len; p++) {
        att[p] = expf(att[p] - max);
        sum += att[p];
    }
    /* pass 3: weighted sum of values, divided once by the sum */
    for (int i = 0; i < d; i++) oh[i] = 0.0f;
    for (int p = 0; p < len; p++) {
        const float w = att[p];
        const float *vp = vh + (size_t)p * d;
        for (int i = 0; i < d; i++) oh[i] += w * vp[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < d; i++) oh[i] *= inv;
}

int kv_attn_decode(const float *q, const float *k, const float *v, float *out,
                   int n_heads, int n_kv_heads, int head_dim, int max_seq, int len)
{
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || head_dim < 1 || len < 1 ||
        len > max_seq)
        return KV_ERR_ARG;
    float *att = kv_calloc((size_t)n_heads * len * sizeof(float)); /* [H][len] */
    if (!att) return KV_ERR_NOMEM;
    #pragma omp parallel for
    for (int h = 0; h < n_heads; h++) {
        const int kvh = kv_attn_kv_head(h, n_heads, n_kv_heads); /* h / G */
        const float *kh = k + (size_t)kvh * max_seq * head_dim; /* [max_seq][d] */
        const float *vh = v + (size_t)kvh * max_seq * head_dim; /* [max_seq][d] */
        attend_head(q + (size_t)h * head_dim, kh, vh, out + (size_t)h * head_dim,
                    att + (size_t)h * len, head_dim, len);
    }
    kv_free(att);
    return KV_OK;
}

/* attend_head() over a quantized cache (chapter 04): the same three passes, with each K and
 * V row dequantized inside the loop into a d-float run (kv_cache_elem(): kv_quant_math.h's
 * kvq_decode_element(), the very code the CUDA kernels inline, or the KIVI fp32 window) and
 * never materialized for the whole cache. row [d] scratch. */
static void attend_head_view(const float *qh, const kv_head_view *kh, const kv_head_view *vh,
                             float *oh, float *att, float *row, int d, int len)
{
    const float scale = 1.0f / sqrtf((float)d);
    float max = -INFINITY;
    for (int p = 0; p < len; p++) {
        for (int j = 0; j < d; j++) row[j] = kv_cache_elem(kh, p, j);
        att[p] = kv_dot(qh, row, d) * scale;
        if (att[p] > max) max = att[p];
    }
    float sum = 0.0f;
    for (int p = 0; p < len; p++) {
        att[p] = expf(att[p] - max);
        sum += att[p];
    }
    for (int i = 0; i < d; i++) oh[i] = 0.0f;
    for (int p = 0; p < len; p++) {
        const float w = att[p];
        for (int j = 0; j < d; j++) row[j] = kv_cache_elem(vh, p, j);
        for (int i = 0; i < d; i++) oh[i] += w * row[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < d; i++) oh[i] *= inv;
}

void kv_attention_head(const kv_cache *c, int layer, int slot, int pos, int h, int n_heads,
                       const float *qh, float *oh, float *att)
{
    const int kvh = kv_attn_kv_head(h, n_heads, c->n_kv_heads), d = c->head_dim;
    const kv_head_view kh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_VALUE);
    if (c->fmt[layer] == KV_QF_F32) { /* chapter 02: the rows are plain floats */
        attend_head(qh, (const float *)(const void *)kh.codes,
                    (const float *)(const void *)vh.codes, oh, att, d, pos + 1);
        return;
    }
    /* a run of d floats for the dequantized row: on the stack up to d = 256, else heap */
    float stack[256], *row = d <= 256 ? stack : kv_calloc((size_t)d * sizeof(float));
    if (!row) { /* no memory: make the failure visible rather than silently wrong */
        for (int i = 0; i < d; i++) oh[i] = NAN;
        return;
    }
    attend_head_view(qh, &kh, &vh, oh, att, row, d, pos + 1);
    if (row != stack) kv_free(row);
}

int kv_attention(const kv_cache *c, int layer, int slot, int pos, const float *q, float *out,
                 int n_heads)
{
    const int d = c->head_dim;
    const size_t len = (size_t)pos + 1;
    float *att = kv_calloc((size_t)n_heads * len * sizeof(float)); /* [H][pos+1] */
    if (!att) return KV_ERR_NOMEM;
    #pragma omp parallel for
    for (int h = 0; h < n_heads; h++)
        kv_attention_head(c, layer, slot, pos, h, n_heads, q + (size_t)h * d,
                          out + (size_t)h * d, att + (size_t)h * len);
    kv_free(att);
    return KV_OK;
}
