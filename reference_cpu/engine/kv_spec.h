/**
 * @file kv_spec.h
 * Chapter 10: speculative decoding, and what it does to the KV cache.
 *
 * A cheap draft model proposes k tokens one at a time; the target model then runs all of
 * them in one step (kv_seq.all_logits gives its logits after every one) and keeps the longest
 * prefix it agrees with, plus one token of its own. Every drafted token's K/V entered both
 * caches; the rejected tail is rolled back (kv_backend.rollback->truncate: the length reset,
 * and on a paged cache the blocks past it returned to the pool; a window's ring rows and
 * KIVI's fp32 window and spilled groups copied back from the undo log rollback->speculate
 * armed before the round), so only verified tokens stay cached, byte for byte as in a plain run.
 *
 * Acceptance:
 *  - greedy (temperature 0): draft token d_j is kept while it equals the target's argmax at
 *    its position; the first disagreement is replaced by the target's argmax, and when all k
 *    agree the target's next argmax is added. The output is exactly the target's greedy run.
 *  - sampling (temperature T > 0): with p the target's and q the draft's softmax(logits / T),
 *    d_j is kept with probability min(1, p(d_j) / q(d_j)); a rejected one is replaced by a
 *    sample of norm(max(0, p - q)), and after k acceptances one token is sampled from p. Each
 *    emitted token is then distributed exactly as the target alone would sample it.
 *
 * The draft here is the target with its first n_draft layers only (kv_model_layer_prefix):
 * no second set of weights, the same embedding and classifier, so its guesses are correlated
 * with the target's even on random weights. Any model with the target's vocabulary works.
 */
#ifndef KV_SPEC_H
#define KV_SPEC_H

#include "kv_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How kv_spec_generate() runs. */
typedef struct {
    int k;             /**< draft tokens per round, 1..64 */
    int n_tokens;      /**< tokens to emit (>= 1) */
    int slot;          /**< cache slot, the same in both backends */
    float temperature; /**< 0 = greedy; > 0 sampling at this temperature (no top-p) */
    uint64_t seed;     /**< sampling: the acceptance and draft random stream */
} kv_spec_opts;

/** What a run did. The bytes are K and V (codes and metadata) of every layer. */
typedef struct {
    int64_t emitted;         /**< tokens produced (= n_tokens) */
    int64_t target_steps;    /**< target forward calls; each emits >= 1 token (plain: 1) */
    int64_t draft_steps;     /**< draft forward calls */
    int64_t drafted;         /**< draft tokens the target verified */
    int64_t accepted;        /**< of those, kept */
    double target_kv_written;     /**< bytes the target wrote to its cache */
    double target_kv_rolled_back; /**< of those, dropped as a rejected tail */
    double draft_kv_written;
    double draft_kv_rolled_back;
    kv_counters target, draft;    /**< all the work of each model */
} kv_spec_stats;

/**
 * A model that is the first @p n_layers layers of @p m: its weight pointers alias @p m's
 * (layer-major arrays, so layer l of the view is layer l of m; an MLA model's kv_mla_layer
 * array likewise), embedding, final norm and classifier shared. Nothing is allocated; do not
 * kv_model_free() the view, and keep @p m alive. KV_ERR_ARG unless 1 <= n_layers <= m's
 * layers.
 */
int kv_model_layer_prefix(kv_model *view, const kv_model *m, int n_layers, kv_err *err);

/**
 * Emit @p o->n_tokens tokens after @p prompt [n_prompt >= 1] into out [n_tokens], the target
 * verifying the draft's proposals. Both slots are reset first; afterwards each cache holds
 * exactly the verified tokens it has processed (the target: prompt + out minus the last,
 * as after kv_generate()). The two backends must share the vocabulary and roll back
 * (kv_backend.rollback; KV_ERR_UNSUPPORTED without): truncate drops the rejected tail, and
 * speculate arms a window's or KIVI cache's undo log for k tokens before each round
 * (kv_cache_speculate()). A
 * KIVI target verifies in one step per stretch of rows that read the same quantized count
 * (a new 32-token group is spilled at most once per 32 tokens), so each row reads what a
 * one-token step reads and greedy output stays the target's. The target must
 * accept all_logits (the CPU and CUDA backends do). prompt + n_tokens + k must fit both capacities
 * (KV_ERR_CAPACITY before any work). @p st may be NULL.
 */
int kv_spec_generate(kv_backend *target, kv_backend *draft, const int *prompt, int n_prompt,
                     const kv_spec_opts *o, int *out, kv_spec_stats *st, kv_err *err);

/** Acceptance rate accepted / drafted (0 when nothing was drafted). */
double kv_spec_acceptance(const kv_spec_stats *st);

#ifdef __cplusplus
}
#endif
#endif
