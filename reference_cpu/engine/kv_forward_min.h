/**
 * @file kv_forward_min.h
 * The first forward pass on one screen (chapters 01 and 02): one token of an MHA/GQA model,
 * fp32 weights, a plain contiguous fp32 cache, in llama2.c's order.
 *
 * It is the engine (kv_forward.c, kv_forward_gqa.c) with everything the later chapters plug in
 * taken out: no batches of sequences, no cache spec (formats, pages, windows, retention, undo
 * log), no tensor-parallel shard, no attention kinds. What is left is the transformer step and
 * the cache's two operations, write a row and read every row. It calls the same ops in the
 * same order as the engine, so its logits equal the engine's bit for bit on an fp32
 * contiguous cache (tests/test_forward_min.c holds it to that): the engine is this function
 * plus the interfaces.
 */
#ifndef KV_FORWARD_MIN_H
#define KV_FORWARD_MIN_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The cache of one sequence: every layer's keys and values for positions 0..max_seq-1. */
typedef struct {
    float *k;    /* [L][H_kv][max_seq][d]  keys, RoPE applied */
    float *v;    /* [L][H_kv][max_seq][d]  values */
    int max_seq; /* positions it holds */
} kv_min_cache;

/** The step's activations (llama2.c's RunState), sized for one model. */
typedef struct {
    float *x;      /* [dim]     the residual stream */
    float *xb;     /* [dim]     x normed; then the attention output (H*d = dim) */
    float *xb2;    /* [dim]     a block's output before the residual add */
    float *q;      /* [H*d]     queries */
    float *k, *v;  /* [H_kv*d]  this token's key and value */
    float *hb;     /* [hidden]  SwiGLU gate, then silu(gate) * up */
    float *hb2;    /* [hidden]  SwiGLU up */
    float *logits; /* [vocab] */
} kv_min_state;

/** Allocate a cache of @p max_seq positions and the activations for @p m (an MHA/GQA model:
 * KV_ERR_UNSUPPORTED for MLA; KV_ERR_ARG for max_seq outside 1..seq_len; KV_ERR_NOMEM). */
int kv_min_create(const kv_model *m, int max_seq, kv_min_cache *c, kv_min_state *s, kv_err *err);
/** Free both (safe on zeroed structs). */
void kv_min_free(kv_min_cache *c, kv_min_state *s);

/**
 * One step: token @p token at position @p pos (0 <= pos < max_seq; positions 0..pos-1 must
 * have been run before, in order). Writes this token's K and V at @p pos and leaves the
 * next-token logits in s->logits. KV_OK, or KV_ERR_ARG for a token or position out of range.
 */
int kv_forward_min(const kv_model *m, kv_min_cache *c, kv_min_state *s, int token, int pos,
                   kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
