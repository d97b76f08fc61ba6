/**
 * @file kv_attn_block.h
 * A layer's attention block behind one interface, so the forward pass (kv_forward.c) runs
 * every kind of model without a branch on the kind. Between the layer's RMSNorm and the
 * residual add the pass only says "attention": the block reads the normed rows s->xb
 * [T][dim], writes what it caches through the cache's write (kv_cache_write_seq()), attends
 * through the cache's views, and leaves the output projection's rows in s->xb2 [T][dim].
 *
 * The block is chosen once per model, by its config's attn field (kv_attn_block_of()):
 *
 *   KV_ATTN_GQA  MHA / GQA / MQA (chapters 02-10): Wq, Wk, Wv, RoPE, a K and a V row per KV
 *                head, the attention family, Wo                       kv_forward_gqa.c
 *   KV_ATTN_MLA  multi-head latent attention (chapter 11): one latent row c_KV ‖ k_R per
 *                token, attention in latent space (absorbed), Wo       kv_forward_mla.c
 *
 * A new kind adds a ::kv_attn_kind value (model/kv_config.h), its weights (model/), a file
 * with its block here, and one row in the table of kv_attn_block.c: files, not branches.
 * What a block cannot run (a window, chapter 09's retention, a tensor-parallel shard) it
 * refuses in check(), with KV_ERR_UNSUPPORTED naming it, before anything is touched.
 */
#ifndef KV_ATTN_BLOCK_H
#define KV_ATTN_BLOCK_H

#include "kv_forward.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One step as the attention block sees it: the batch, flattened by kv_forward_shard() into
 * T rows (s->tok_slot, s->tok_pos, s->q_pos [T]; s->x, s->xb, s->xb2 [T][dim]). */
typedef struct {
    const kv_model *m;
    kv_cache *c;
    kv_state *s;
    const kv_shard *sh; /**< a tensor-parallel rank's part, or NULL (the whole model) */
    const kv_seq *seqs;
    int n_seqs, T;
    float *scratch;     /**< the block's floats for this step, from begin() to end() */
    int max_len;        /**< the longest attention span of any row (set by begin()) */
    double rope_freq[KV_ROPE_MAX_PAIRS]; /**< [rotary_dim/2] RoPE's per-pair frequencies
                                          *   (kv_rope_freqs() of the model, once a step) */
} kv_attn_step;

/** A kind of attention block: the hooks the forward pass and the backends call. */
typedef struct kv_attn_block {
    const char *name; /**< "gqa", "mla" */
    /** KV_ERR_UNSUPPORTED naming what this block cannot run: a cache @p spec, a shard @p sh
     * (NULL: none). Called when the cache is made and again by every step. */
    int (*check)(const kv_config *cfg, const kv_cache_spec *spec, const kv_shard *sh,
                 kv_err *err);
    /** The cache the block writes and reads, for a checked @p spec (kv_forward_cache_create()). */
    int (*cache_create)(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                        kv_err *err);
    /** Make @p shape (a copy of the model's config) describe the cache kv_batch_check()
     * compares: n_layers, n_kv_heads and the head dim dim / n_heads of a cache row. */
    void (*cache_shape)(kv_config *shape, const kv_shard *sh);
    /** Per step: scratch for the step's T rows, and a->max_len. */
    int (*begin)(kv_attn_step *a, kv_err *err);
    /** Layer @p l: s->xb [T][dim] (normed) -> the cache, attention, s->xb2 [T][dim] (after
     * the output projection; a shard's partial sum). */
    int (*layer)(kv_attn_step *a, int l, kv_err *err);
    /** Free what begin() allocated (also after a failed layer). */
    void (*end)(kv_attn_step *a);
    /** The step's work from shapes (kv_counters): what kv_counters_add_step() is for MHA/GQA. */
    void (*count)(kv_counters *cnt, const kv_config *c, const kv_cache_spec *spec,
                  const kv_seq *seqs, int n_seqs);
} kv_attn_block;

extern const kv_attn_block kv_attn_gqa; /**< kv_forward_gqa.c */
extern const kv_attn_block kv_attn_mla; /**< kv_forward_mla.c */

/** The block a model of config @p c runs; NULL for an attn value no block has. */
const kv_attn_block *kv_attn_block_of(const kv_config *c);
/** The end() of a block whose begin() allocated a->scratch with kv_calloc(): frees it. */
void kv_attn_step_end(kv_attn_step *a);

#ifdef __cplusplus
}
#endif
#endif
