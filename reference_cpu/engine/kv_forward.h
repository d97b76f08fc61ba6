/**
 * @file kv_forward.h
 * The transformer step, written once for the CPU (cuda/kvcu.h mirrors it for the GPU).
 *
 * One call advances a batch of sequences, each at its own position by any number of tokens:
 *   embed → for each layer: RMSNorm → Q,K,V → RoPE → cache write → attention → Wo → residual
 *                           → RMSNorm → SwiGLU MLP → residual
 *   → final RMSNorm → classifier (last token of each sequence; every token of a sequence
 *     whose kv_seq.all_logits is set, chapter 10).
 * A prefill is a sequence with many tokens, a decode step a sequence with one. Chapter 01's
 * naive recompute is kv_cache_reset() followed by a prefill of the whole prefix.
 * Chapter 06 (a windowed spec) changes three things only, all chosen by the spec: the query is
 * rotated at kv_window_query_pos(); KV_POS_CACHE keys go into the cache unrotated; and a chunk
 * is written and attended in waves (kv_window_chunk()) because the ring reuses rows.
 * What sits between a layer's RMSNorm and its residual add ("Q,K,V → ... → Wo" above) is the
 * model's attention block (kv_attn_block.h), chosen by its kind: MHA/GQA (kv_forward_gqa.c)
 * or, chapter 11, multi-head latent attention (kv_forward_mla.c). The cache a model's block
 * reads is made by kv_forward_cache_create().
 */
#ifndef KV_FORWARD_H
#define KV_FORWARD_H

#include "kv_model.h"
#include "kv_cache.h"
#include "kv_seq.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Work done by steps, counted from shapes (the same formulas for CPU and CUDA). */
typedef struct {
    double flops_proj;       /**< Q,K,V,O, MLP and classifier matmuls: 2 FLOPs per multiply-add */
    double flops_attn;       /**< q·k and p·v: 4·H·d per (query, cached key) pair per layer */
    double kv_bytes_read;    /**< K and V bytes attention reads: L·2·H_kv·d·b per cached token */
    double kv_bytes_written; /**< K and V bytes written to the cache: L·2·H_kv·d·b per new token */
    int64_t tokens;          /**< tokens processed (prompt and generated) */
    int64_t steps;           /**< forward calls */
} kv_counters;

/** Add the work of one step over @p seqs to @p cnt (NULL cnt: nothing). */
void kv_counters_add_step(kv_counters *cnt, const kv_config *c, const kv_cache_spec *spec,
                          const kv_seq *seqs, int n_seqs);

struct kv_shard;

/**
 * The rules every engine (kv_forward, kvcu_forward) enforces on a step, checked before
 * anything is touched so a refused step leaves the cache as it was: a cache shaped for the
 * model (its KV heads the model's, or with a tensor-parallel shard @p sh the shard's),
 * 1..n_slots sequences in distinct slots, n_tokens >= 1, pos equal to the slot's cached
 * length, pos + n_tokens within capacity, token ids inside the vocabulary.
 *
 * @p c is the cache the step writes (a CUDA cache is one too); *T the total new tokens of
 * the step, on success. @p who names the caller in messages ("kv_forward", "kvcu_forward").
 */
int kv_batch_check(const char *who, const kv_config *cfg, const struct kv_shard *sh,
                   const kv_cache *c, const kv_seq *seqs, int n_seqs, int *T, kv_err *err);


/** Scratch buffers of the CPU forward pass, grown to the largest step seen. A state serves
 *  one model: its buffers are sized by that model's widths. */
typedef struct {
    int max_tokens;  /* tokens the buffers hold */
    float *x;        /* [T][dim]     residual stream */
    float *xb;       /* [T][dim]     normed input / attention output */
    float *xb2;      /* [T][dim]     projection output */
    float *q;        /* [T][H*d] */
    float *k;        /* [T][H_kv*d] */
    float *v;        /* [T][H_kv*d] */
    float *hb;       /* [T][hidden]  gate, then SwiGLU */
    float *hb2;      /* [T][hidden]  up */
    float *xlast;    /* [T][dim] final-normed last token of each sequence (first n_seqs
                      * rows), or every row of a sequence asking for all_logits (chapter 10) */
    int max_seqs;
    int *tok_slot;   /* [T] */
    int *tok_pos;    /* [T] position of each row in its sequence */
    int *q_pos;      /* [T] position its query is rotated by (chapter 06: cache index) */
    int *wave;       /* [T] rows written and attended together (a window's ring: kv_forward) */
    int *done;       /* [n_seqs] rows of each sequence already in the cache this layer */
} kv_state;

/** Zero a state; buffers are allocated by the first kv_forward(). */
void kv_state_init(kv_state *s);
/** Free the state's buffers (safe on an initialized state). */
void kv_state_free(kv_state *s);

/**
 * Run one step. Checks the batch against the cache (slot range, pos == cached length,
 * capacity, token ids) and returns KV_ERR_ARG / KV_ERR_CAPACITY with the problem named.
 *
 * logits [n_seqs][vocab]  logits after the last token of each sequence (may be NULL: the
 *                         classifier is skipped, and so are its FLOPs in @p cnt)
 * A sequence with all_logits set also gets the classifier over each of its rows; row j is
 * bit-identical to the logits of a one-token step at pos + j (each row is computed alone).
 * kvcu_forward() computes all_logits the same way (row j equals its own one-token GPU step).
 */
int kv_forward(const kv_model *m, kv_cache *c, kv_state *s, const kv_seq *seqs, int n_seqs,
               float *logits, kv_counters *cnt, kv_err *err);

/**
 * One tensor-parallel rank's part of the model (chapter 10, kv_tp.h): a contiguous run of
 * query heads, the KV heads they read, and a contiguous run of the MLP's hidden units.
 * Wq, Wk, Wv, W1 and W3 are split by output rows (the rank computes only its heads' q, k, v
 * and its hidden units); Wo and W2 by input columns, so each rank's Wo and W2 products are
 * partial sums of the full ones, which all_reduce adds over the ranks. Embedding, norms and
 * classifier are replicated: every rank holds the whole residual stream.
 */
typedef struct kv_shard {
    int rank;                 /**< this rank, 0 .. n_ranks-1 */
    int q_head0, n_q_heads;   /**< query heads q_head0 .. q_head0+n_q_heads-1 of H */
    int kv_head0, n_kv_heads; /**< KV heads it computes and caches (its cache has n_kv_heads) */
    int hidden0, n_hidden;    /**< MLP hidden units hidden0 .. hidden0+n_hidden-1 */
    /** Replace x [n] by the sum of every rank's x, added in rank order (so every rank gets
     *  the same bits); called by every rank at the same points: twice per layer, after the
     *  Wo product and after the W2 product. */
    void (*all_reduce)(const struct kv_shard *sh, float *x, int64_t n);
    void *ctx;                /**< the group all_reduce talks to */
} kv_shard;

/**
 * kv_forward() as rank @p sh of a tensor-parallel group (chapter 10): the same step,
 * computed over the shard's heads and hidden units with sh->all_reduce() after the attention
 * and MLP blocks. @p c holds the shard's KV heads only. NULL @p sh is kv_forward() itself.
 */
int kv_forward_shard(const kv_model *m, kv_cache *c, kv_state *s, const kv_shard *sh,
                     const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                     kv_err *err);

/**
 * The cache @p spec describes, shaped for the attention block of a model of config @p cfg
 * (kv_attn_block.h): K and V planes of H_kv heads for MHA/GQA, with chapter 09's retention
 * state when the spec selects (kv_retain_cache_create()); one plane of latent rows for MLA
 * (kv_cache_create_planes(), kv_mla_cache_config()). A spec the block cannot run (say a
 * window on an MLA model) is refused first with KV_ERR_UNSUPPORTED, naming it. Free it with
 * kv_retain_cache_free(). What kv_backend_cpu() builds its cache with.
 */
int kv_forward_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                            kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
