/**
 * @file kv_attention_mla.h
 * Multi-head latent attention over a latent cache (chapter 11), written two ways that give
 * the same answer (tests/test_mla.c holds them together by a derived bound).
 *
 * The cache holds, per token, one row c_t ‖ kR_t of d_c + d_R elements (kv_mla.h), read through
 * a ::kv_head_view like any other cache row (KV head 0, role KV_QROLE_KEY, of a one-plane
 * cache). One new token's heads h = 0..H-1 carry q_nope,h [d_nope] and q_R,h [d_R] (rotated).
 * The scale is 1/sqrt(d_nope + d_R): the width of the key each head would see.
 *
 * (a) naive: up-project every cached row to head h's key and value, then ordinary attention:
 *       k_t,h = [W_UK,h c_t | kR_t],  v_t,h = W_UV,h c_t,
 *       out_h = Σ_t softmax_t(q_h · k_t,h / sqrt(d_nope + d_R)) v_t,h.
 *     Per head and cached token: 2·d_c·(d_nope + d_v) FLOPs of up-projection before the
 *     2·(d_nope + d_R) + 2·d_v of attention.
 * (b) absorbed: move W_UK,h onto the query and W_UV,h after the sum, since both are linear:
 *       q̃_h = W_UK,hᵀ q_nope,h                    [d_c]  once per step
 *       s_t,h = (q̃_h · c_t + q_R,h · kR_t) / sqrt(d_nope + d_R)
 *       o_h = Σ_t p_t,h c_t                        [d_c]  the weighted sum stays in latent space
 *       out_h = W_UV,h o_h                         [d_v]  once per step
 *     Every head reads the same row: MQA with keys of d_c + d_R = 576 and values of d_c = 512
 *     elements (the values are the keys' first d_c elements). Per head and cached token
 *     2·(d_c + d_R) + 2·d_c FLOPs, on 576·b bytes read once for all H heads: 2·H·(2·d_c + d_R)
 *     / ((d_c + d_R)·b) FLOPs per byte (chapter 11's README puts it against the ridge points).
 *
 * kR_t cannot be absorbed the same way: it was rotated by its own position p_t, and so was
 * q_R by the query's; their product depends on p_t − p_q, a different matrix for every cached
 * position (kv_mla.h). That is why it is a separate, small, shared key.
 */
#ifndef KV_ATTENTION_MLA_H
#define KV_ATTENTION_MLA_H

#include "kv_cache.h"
#include "kv_mla.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * (a) Naive MLA attention of one token's H heads over rows 0..n-1 of the latent view @p lat.
 * q_nope [H][d_nope], q_rope [H][d_R], out [H][d_v]. Heads run in parallel (OpenMP); each
 * head's result is computed in one fixed order. KV_ERR_NOMEM (scratch) or KV_ERR_ARG.
 */
int kv_mla_attention_naive(const kv_mla_layer *w, const float *q_nope, const float *q_rope,
                           const kv_head_view *lat, int n, float *out, kv_err *err);

/** (b) Absorbed MLA attention: the same arguments and result as kv_mla_attention_naive(),
 * computed in latent space. */
int kv_mla_attention_absorbed(const kv_mla_layer *w, const float *q_nope, const float *q_rope,
                              const kv_head_view *lat, int n, float *out, kv_err *err);

/** FLOPs of one token's attention over n cached rows: (b) when @p absorbed, else (a)
 * (the formulas of the file comment, with the query and output products of (b) included). */
double kv_mla_attention_flops(const kv_mla_dims *m, int n_heads, int n, int absorbed);

/** A latent cache (one plane, rows [n_tokens][d_c + d_R]) of one slot in storage format
 * @p fmt: contiguous, or paged in blocks of 64 as FlashMLA's, n_tokens' blocks mapped from the
 * top of the pool down (logical order is not physical) and @p spare_blocks more left free.
 * Free it with kv_cache_free(). KV_ERR_ARG / KV_ERR_NOMEM from the cache. */
int kv_mla_cache_open(kv_cache *c, const kv_mla_dims *m, int n_tokens, int fmt, int paged,
                      int spare_blocks, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
