/**
 * @file kv_attention.h
 * The one attention family (DESIGN.md §2), CPU reference.
 *
 * kv_attn_decode() is the math on plain arrays; kv_attention() reads a ::kv_cache through
 * its spec and calls the right member of the family: fp32 rows directly, any chapter 04
 * storage format dequantized row by row inside the loops (kv_attn_row()). Later chapters add layouts, dtypes and
 * retention to kv_attention(), never a private copy.
 */
#ifndef KV_ATTENTION_H
#define KV_ATTENTION_H

#include "kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The KV head query head @p h reads (chapter 03): heads are grouped in order, G = H / H_kv
 * consecutive query heads per KV head, so h reads h / G. G = 1 is multi-head attention (MHA),
 * 1 < G < H grouped-query attention (GQA), G = H multi-query attention (MQA, H_kv = 1).
 * Every attention path, CPU and CUDA, maps heads through this rule; a checkpoint's Wk/Wv rows
 * must be ordered the same way (llama2.c and Llama-2/3 checkpoints are).
 */
static inline int kv_attn_kv_head(int h, int n_heads, int n_kv_heads)
{
    return h / (n_heads / n_kv_heads);
}

/**
 * Attention of one query token over a contiguous cache.
 *
 * q    [n_heads][head_dim]               this token's queries, RoPE applied
 * k, v [n_kv_heads][max_seq][head_dim]   the cache; positions 0..len-1 are valid
 * out  [n_heads][head_dim]
 *
 * Query head h reads KV head h / G, G = n_heads / n_kv_heads (G = 1 MHA, G = n_heads MQA).
 * Softmax is computed in three passes (max, exp-sum, weighted values) in fp32, in the order
 * of positions, so the result does not depend on thread count.
 *
 * The scores need len floats per head of scratch, allocated here. Returns KV_OK; KV_ERR_ARG
 * when the shapes are inconsistent (H_kv must divide H, 1 <= len <= max_seq); KV_ERR_NOMEM
 * when the scratch cannot be allocated (out untouched in both cases).
 */
int kv_attn_decode(const float *q, const float *k, const float *v, float *out,
                   int n_heads, int n_kv_heads, int head_dim, int max_seq, int len);

/**
 * Attention of one query token at position @p pos of @p slot over cache positions 0..pos of
 * @p layer (causal: the token sees itself and everything before it), or, with a window
 * (chapter 06), over the positions the cache retains: the sinks and the last W positions, in
 * position order (kv_window.h). q [H][d] (rotated by RoPE at the position the spec's scheme
 * gives it: kv_window_query_pos()), out [H][d].
 * Allocates kv_window_count() (pos + 1 without a window) floats of score scratch per head:
 * KV_OK, or KV_ERR_NOMEM.
 */
int kv_attention(const kv_cache *c, int layer, int slot, int pos, const float *q, float *out,
                 int n_heads);

/**
 * One query head @p h of kv_attention(), with the caller's scratch: the unit kv_forward()
 * spreads over threads as (token, head) pairs. Reads the cache through its spec: layout,
 * format and retention (a windowed cache: its retained positions in position order, each
 * from its ring row; KV_POS_CACHE keys rotated by their cache index as they are read).
 * qh [d], oh [d], att [kv_window_count(W, S, pos)] scratch for the scores.
 */
void kv_attention_head(const kv_cache *c, int layer, int slot, int pos, int h, int n_heads,
                       const float *qh, float *oh, float *att);

/**
 * Row @p t of a cache head view dequantized into out [d] (chapter 04): equal, bit for bit,
 * to kv_cache_elem() for every j, with the format's switch hoisted out of the loop. What the
 * CPU attention reads a quantized K or V row with.
 */
void kv_attn_row(const kv_head_view *h, int64_t t, float *out);

#ifdef __cplusplus
}
#endif
#endif
