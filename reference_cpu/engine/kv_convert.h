/**
 * @file kv_convert.h
 * Changing how many KV heads a model has (chapter 03), and measuring what that changes.
 *
 * MHA → GQA by mean-pooling (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
 * Transformer Models from Multi-Head Checkpoints"): the G key projection heads of a group are
 * replaced by their mean, and so are the value heads; the query and output projections stay.
 * The paper then uptrains the pooled model for a few percent of its pre-training; kvlab does
 * not train, so the output change measured here is the change *before* uptraining.
 *
 * Symbols (docs/design.md §2): H query heads, H_kv KV heads, G = H / H_kv, d head dim.
 */
#ifndef KV_CONVERT_H
#define KV_CONVERT_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Pool the KV heads of @p in down to @p n_kv_heads: new KV head j is the mean of old KV heads
 * j·r .. j·r + r - 1, r = in H_kv / n_kv_heads (for an MHA input, r = G). Rows of Wk and Wv
 * are averaged in double and rounded once, so a group of identical heads pools to exactly
 * that head and r = 1 is an exact copy. Every other weight is copied.
 *
 * RoPE is the same rotation for every head at a position, so pooling the projections before
 * RoPE equals pooling the rotated keys: the pooled model's cache holds the mean of the keys.
 *
 * @p out is allocated (kv_model_free()). KV_ERR_ARG when n_kv_heads does not divide the
 * input's H_kv.
 */
int kv_convert_pool_kv_heads(kv_model *out, const kv_model *in, int n_kv_heads, kv_err *err);

/**
 * The exact inverse direction: give every query head its own copy of its KV head, so the
 * output has @p n_kv_heads (a multiple of the input's H_kv, at most H) KV heads and computes
 * the same function bit for bit: query head h reads a copy of what it read before.
 * "MHA with each K/V head duplicated across its group" is this with n_kv_heads = H.
 */
int kv_convert_expand_kv_heads(kv_model *out, const kv_model *in, int n_kv_heads, kv_err *err);

/**
 * Widen an MHA model to @p n_heads heads of the same head dim d (dim grows to n_heads·d), so a
 * model with few heads can be grouped by G = 4, 8. The input's residual stream occupies the
 * first dims; the new dims stay exactly zero (their embedding, weights in and out are zero).
 * The new heads have their own random Q, K, V rows (seeded, uniform ±sqrt(3/dim) over the
 * input's residual dims except dim 0, which the recall models use as a constant bias) and a
 * zero output projection: they read but never write, so the wide model computes the input's
 * function. RMSNorm gains are scaled by sqrt(dim/dim') and eps by dim/dim' so that the norm of
 * the padded stream equals the original's (equal in exact arithmetic; rounding differs in the
 * last bits). Requires an MHA input (H_kv = H) and n_heads >= H.
 */
int kv_convert_widen(kv_model *out, const kv_model *in, int n_heads, uint64_t seed, kv_err *err);

/** kv_convert_pool_kv_heads() from one checkpoint file to another (::kv_file_format). */
int kv_convert_file(const char *in_path, const char *out_path, int n_kv_heads, int format,
                    kv_err *err);

/** How far a converted model's next-token distributions are from the original's. */
typedef struct {
    int positions;     /**< positions compared */
    double kl_mean;    /**< mean over positions of KL(p_ref || p_new), nats */
    double kl_max;     /**< largest per-position KL */
    double top1_agree; /**< fraction of positions whose argmax tokens agree */
    double max_abs;    /**< largest |logit_new - logit_ref| */
    int identical;     /**< 1 when every logit is bit-identical */
} kv_convert_diff;

/**
 * Teacher-forced comparison: run @p tokens [n] through @p ref and @p new one token at a time
 * (CPU, fp32 cache) and compare the logits after each token. The two models must share the
 * vocabulary. KV_ERR_ARG on mismatched vocabularies or n < 1.
 */
int kv_convert_compare(const kv_model *ref, const kv_model *new_model, const int *tokens, int n,
                       kv_convert_diff *out, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
