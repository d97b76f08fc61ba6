/**
 * @file kv_flash.h
 * Chapter 08: the attention family's optimization progression, CPU reference.
 *
 * Attention of T query tokens over the keys of one cache slot, as three algorithms that give
 * the same answer and move different amounts of memory:
 *
 *  - naive:  S = Q K^T for the whole [T][n_keys] score matrix per head, materialized; softmax
 *            over each row of S; O = P V. Reads and writes S: O(T * n_keys) extra traffic.
 *  - tiled:  FlashAttention's loop. For a tile of tile_q queries, walk the keys tile_k at a
 *            time keeping, per query, a running max m, a running sum l of exp(s - m) and an
 *            unnormalized output accumulator acc; when a new tile raises the max, rescale l
 *            and acc by exp(m_old - m_new). Divide by l once at the end. Tiles entirely in
 *            the causal future of a query tile are skipped. S never exists as a whole.
 *  - split:  decode (T = 1) over a long cache with few heads: split the keys into n_splits
 *            ranges, run the tiled loop on each (in parallel), keep each range's (m, l, acc),
 *            then merge them by log-sum-exp (kv_flash_merge()). The merge is associative and
 *            commutative up to rounding: any split count and order give the same result
 *            within fp32 tolerance.
 *
 * Keys and values are read from a ::kv_cache through its spec (kv_attn_row()): contiguous or
 * paged layout, fp32 / fp16 / bf16 / int8 / ... storage, dequantized as rows are read, so the
 * same loops serve every chapter's cache. Sliding-window caches (chapter 06) are refused.
 *
 * Masking: query t sits at position q_pos0 + t and sees keys k_begin <= k < n_keys, and,
 * when causal, k <= q_pos0 + t. A query that sees no key (fully masked row) outputs zeros,
 * never NaN.
 */
#ifndef KV_FLASH_H
#define KV_FLASH_H

#include "kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One attention job: T queries of one slot over its cached keys. */
typedef struct {
    const kv_cache *c;   /**< the cache holding K and V (host memory) */
    int layer, slot;
    int n_heads;         /**< H; the cache's spec has H_kv, G = H / H_kv */
    const float *q;      /* [T][H][d] queries, RoPE applied */
    int T;
    int64_t q_pos0;      /**< position of query 0; query t is at q_pos0 + t */
    int64_t k_begin;     /**< first key a query may see (0 for ordinary attention) */
    int64_t n_keys;      /**< keys 0 .. n_keys - 1 of the slot are valid */
    int causal;          /**< 1: query at p sees keys <= p */
    float *out;          /* [T][H][d] */
} kv_flash_job;

/** Memory traffic an algorithm performed, in bytes, counted where it happens. */
typedef struct {
    int64_t kv_bytes;      /**< K and V bytes read from the cache (as stored: codes + meta) */
    int64_t q_bytes;       /**< query bytes read */
    int64_t out_bytes;     /**< output bytes written */
    int64_t score_bytes;   /**< score matrix bytes written and read back (naive only) */
    int64_t tiles_done;    /**< (query tile, key tile) pairs computed */
    int64_t tiles_skipped; /**< pairs skipped by the causal mask */
} kv_flash_stats;

/** A partial result of attention over one key range, per (query, head):
 * m = max score, l = sum exp(s - m), acc [d] = sum exp(s - m) v (unnormalized).
 * An empty range has m = -INFINITY, l = 0, acc = 0. */
typedef struct {
    float m, l;
    float *acc; /* [d] */
} kv_flash_part;

/**
 * Naive attention: the scores of each head, [T][n_keys], materialized (allocated here, one
 * matrix per thread, reused head after head), softmax in three passes, then P V. The
 * reference the others are held against. @p st may be NULL.
 * KV_ERR_ARG on inconsistent shapes, KV_ERR_UNSUPPORTED for a windowed cache, KV_ERR_NOMEM.
 */
int kv_flash_naive(const kv_flash_job *j, kv_flash_stats *st, kv_err *err);

/**
 * Tiled attention with online softmax (tiles of @p tile_q queries and @p tile_k keys, both
 * >= 1), causal tiles skipped. Threads over (query tile, head). @p st may be NULL.
 */
int kv_flash_tiled(const kv_flash_job *j, int tile_q, int tile_k, kv_flash_stats *st,
                   kv_err *err);

/**
 * Split-KV attention: the visible keys cut into @p n_splits near-equal ranges, each reduced
 * by the tiled loop (tile_k keys at a time) into a ::kv_flash_part, merged in range order.
 * Threads over (head, split). Any T works; it is meant for decode (T = 1).
 */
int kv_flash_split(const kv_flash_job *j, int n_splits, int tile_k, kv_flash_stats *st,
                   kv_err *err);

/**
 * Merge partial result @p b into @p a (both over disjoint key ranges of the same query and
 * head, d floats of acc): m = max(ma, mb), l = la e^(ma-m) + lb e^(mb-m), acc likewise.
 * Empty parts are identities.
 */
void kv_flash_merge(kv_flash_part *a, const kv_flash_part *b, int d);

/** out [d] = acc / l, or zeros when l == 0 (no key was visible). */
void kv_flash_finish(const kv_flash_part *p, int d, float *out);

#ifdef __cplusplus
}
#endif
#endif
