/**
 * @file kv_retain.h
 * Chapter 09: "selected set" retention — a cache whose attention reads, per (layer, KV head),
 * only the positions a selection method keeps (kv_select.h), inside the real forward pass.
 *
 * A spec with select != KV_SELECT_NONE (kv_cache_spec's chapter 09 fields; their names and
 * rules, kv_select_method_name() and kv_retain_spec_check(), are the spec's: kv_cache_spec.h)
 * asks the engine for a ::kv_retain beside the cache (kv_retain_cache_create()): host-side state
 * per (slot, layer, KV head), written once here and used by the
 * CPU forward (kv_forward()) and the CUDA forward (kvcu_forward()) alike. Only the attention
 * over a list of positions differs by device (kv_retain_attend() here, kvcu_retain_attend() in
 * cuda/kvcu.h: same arguments, same state changes).
 *
 * One step of one sequence (positions pos0 .. pos0+n-1), for each layer and KV head, after the
 * step's K/V rows are written to the cache:
 *   1. append   the n new keys, as attention will read them (dequantized from the cache), to
 *               the head's state: every new position is kept; L2 records its norm, Quest folds
 *               it into its page summary, top-k into its key copy.
 *   2. read     for each row (position p, in order) the positions the group's G query heads
 *               read (kv_retain_reads()): the kept positions <= p for the evicting methods;
 *               Quest's pages or the exact top-k keys among 0 .. p for the query-aware ones
 *               (layers below retain.dense_layers read everything <= p).
 *   3. attend   each of the G heads over that list: softmax over the listed positions only.
 *   4. observe  H2O adds every probability to the mass of its position; SnapKV adds the last W
 *               rows' probabilities to votes (rows of a step of more than W tokens only: a
 *               prompt). Summation order (the CPU and CUDA paths both follow it): rows in
 *               order, within a row heads g = 0 .. G-1, each probability added to a double.
 *   5. evict    at the end of the step (kv_retain_step_end()), never inside it: a prompt's
 *               rows all see the whole prompt, as the methods' papers run their prefill.
 *
 * Methods (symbols: n positions seen so far, B the budget from retain.budget or retain.ratio,
 * S retain.sinks, W retain.window; S and W positions are always kept and count in B):
 *  - KV_SELECT_L2_LARGE / _SMALL: keep the B - S - W largest (smallest) key norms among the
 *    others (kv_select_l2()'s ranking and ties). Norms never change, so the incremental kept
 *    set equals kv_select_l2() over all n keys at every step (a property test_retain checks).
 *  - KV_SELECT_H2O: evict the lowest accumulated mass outside the sinks and window, equal
 *    masses earlier position first (kv_select_h2o_evict()'s rule); evicted never return.
 *  - KV_SELECT_SNAPKV: after a prompt step (n > W), votes of its last W rows over the kept
 *    positions before them, max-pooled with KV_RETAIN_SNAPKV_KERNEL along the kept list
 *    after the sinks, the best B - S - W kept with the sinks and the window
 *    (kv_select_snapkv_pick()'s ranking);
 *    decode steps evict nothing. The first compression of a fresh sequence with S = 0 equals
 *    kv_select_snapkv(). Votes restart from zero after each compression.
 *  - KV_SELECT_QUEST: nothing evicted; a row at p reads the union over its group of each
 *    head's B / KV_SELECT_PAGE pages of highest bound among pages 0 .. p / KV_SELECT_PAGE,
 *    plus the page holding p (kv_select_quest_pages() over the pages up to p's), clipped to p.
 *  - KV_SELECT_TOPK: nothing evicted; a row reads the union over its group of each head's B
 *    keys of largest q·k among 0 .. p (kv_select_topk_keys()): the oracle Quest approximates.
 *
 * Eviction is logical: the evicted rows stay in the cache's memory, never read again
 * (test_retain overwrites them with NaN and gets the same bits). What a compacted cache would
 * hold is counted exactly by kv_retain_bytes() (kv_select_bytes_kept() per head: codes,
 * scales, a 4-byte position index per kept row), and what a step reads by ::kv_retain_stats.
 * Supported: contiguous layout, every per-token format (fp32, fp16, bf16, int8, int8-gG, fp8,
 * int4/int2 per token), no window. Refused with a message: paged layout, KIVI, a window, and
 * the cache operations that would desynchronize the state (truncate, fork, set_length).
 */
#ifndef KV_RETAIN_H
#define KV_RETAIN_H

#include <stdint.h>

#include "kv_cache.h"
#include "kv_common.h"
#include "kv_select.h"

#ifdef __cplusplus
extern "C" {
#endif

/** SnapKV's max-pooling kernel along the kept positions (odd; SnapKV's default order). */
#define KV_RETAIN_SNAPKV_KERNEL 7

/** One (slot, layer, KV head): what the method keeps and knows. */
typedef struct {
    int next;          /**< positions appended so far (the sequence's length after a step) */
    kv_select_set kept;/**< kept positions, ascending (every position for Quest and top-k) */
    double *score;     /* [kept.cap] per kept entry: key norm^2 (L2), mass (H2O), votes (SnapKV) */
    kv_select_pages pages; /**< Quest: per-page min/max of the keys */
    float *keys;       /* Quest, top-k: [cap_keys][d] a copy of every key (pages, scores) */
    int cap_keys;
    int step_pos0, step_n; /**< the step in progress (kv_retain_step_begin()) */
} kv_retain_head;

/** What selection did, summed over heads and steps since the state was made or reset. */
typedef struct {
    int64_t rows_read;    /**< (row, KV head, layer) triples × positions listed: rows attention read */
    int64_t rows_full;    /**< the same if every position <= p had been read */
    int64_t evicted;      /**< positions evicted, over layers and heads */
} kv_retain_stats;

/** The retention state of a cache: [n_slots][L][H_kv] heads. */
typedef struct kv_retain {
    int method, n_slots, n_layers, n_kv_heads, head_dim, group; /* group: G = H / H_kv */
    int budget;       /**< retain.budget (0: from the ratio) */
    double ratio;     /**< retain.ratio */
    int window, sinks, dense_layers;
    kv_retain_head *heads; /* [n_slots][L][H_kv] */
    kv_retain_stats *stats; /* [n_slots] */
} kv_retain;

/** Build the state for a cache of @p spec over a model with @p n_layers, @p n_kv_heads,
 * head dim @p d and @p n_heads query heads. KV_OK, KV_ERR_ARG (spec rules), KV_ERR_NOMEM. */
int kv_retain_create(kv_retain **out, const kv_cache_spec *spec, int n_layers, int n_heads,
                     int n_kv_heads, int d, kv_err *err);
/** Free the state (NULL is fine). */
void kv_retain_free(kv_retain *r);
/** Forget a slot: no positions, no scores, zero stats (the engine calls it beside
 * kv_cache_reset()). */
void kv_retain_reset_slot(kv_retain *r, int slot);
/**
 * A cache of @p spec for a model @p cfg (kv_cache_create()) with, when the spec selects
 * (select != 0), chapter 09's state beside it: c->retain, which kv_retain_attend() reads and
 * writes. The cache stores rows and knows nothing of which are read; the engine composes the
 * two (kv_backend_cpu does it here, kvcu_retain_cache_create() on the device). KV_OK, or
 * kv_cache_create()'s and kv_retain_create()'s errors (nothing left allocated).
 */
int kv_retain_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                           kv_err *err);
/** Free a cache from kv_retain_cache_create(): its retention state, then the cache. */
void kv_retain_cache_free(kv_cache *c);
/** The head state of (slot, layer, kvh). */
static inline kv_retain_head *kv_retain_at(const kv_retain *r, int slot, int layer, int kvh)
{
    return r->heads + ((size_t)slot * r->n_layers + layer) * r->n_kv_heads + kvh;
}
/** B for a head that has seen @p n positions: retain.budget, or ceil(ratio · n). */
int kv_retain_budget(const kv_retain *r, int n);

/** Step 1 and the start of a step: positions pos0 .. pos0+n-1 arrive at (slot, layer, kvh)
 * with keys krows [n][d] (dequantized as attention reads them). pos0 must equal the head's
 * next. KV_OK, KV_ERR_ARG, KV_ERR_NOMEM. */
int kv_retain_append(kv_retain *r, int slot, int layer, int kvh, int pos0, int n,
                     const float *krows, kv_err *err);
/**
 * Step 2: the positions (ascending) the group's queries q [G][d] at position @p p read at
 * (slot, layer, kvh), into @p out. For the evicting methods q is not used (may be NULL).
 * KV_OK or KV_ERR_NOMEM.
 */
int kv_retain_reads(kv_retain *r, int slot, int layer, int kvh, int p, const float *q,
                    kv_select_set *out, kv_err *err);
/** Which rows of the current step feed kv_retain_observe(): rows j >= the return value
 * (n for none): 0 for H2O, n - W for SnapKV on a step of more than W tokens, else n. */
int kv_retain_observe_from(const kv_retain *r, int slot, int layer, int kvh);
/**
 * Step 4: add @p mass [n_kept] — the step's accumulated probabilities per kept position, in
 * the order of the head's kept list (after append), summed as the file comment says over the
 * rows kv_retain_observe_from() names — to the head's scores (H2O: mass, SnapKV: votes).
 * A no-op for the other methods.
 */
void kv_retain_observe(kv_retain *r, int slot, int layer, int kvh, const double *mass);
/** Step 5: evict at (slot, layer, kvh) as the method says; returns positions evicted, or -1
 * on NOMEM (nothing evicted). */
int kv_retain_step_end(kv_retain *r, int slot, int layer, int kvh);

/**
 * Steps 1-5 for one sequence of a forward step on the CPU, every KV head of @p layer, after
 * its rows were written to @p c (its state is c->retain): q [n][H][d] the step's queries (RoPE applied), out [n][H][d]
 * the attention output. Each head's rows run in parallel, their probabilities then summed in
 * row order (results do not depend on the thread count). Adds to the slot's stats. KV_OK, KV_ERR_NOMEM.
 */
int kv_retain_attend(kv_cache *c, int layer, int slot, int pos0, int n, const float *q,
                     float *out, kv_err *err);

/** Bytes a compacted cache would hold for @p slot now: kv_select_bytes_kept() over every
 * (layer, KV head) in the layer's format, for the kept rows (every row for Quest and top-k). */
int kv_retain_bytes(const kv_retain *r, const kv_cache_spec *spec, int slot,
                    kv_select_bytes *out, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
