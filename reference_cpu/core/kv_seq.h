/**
 * @file kv_seq.h
 * One sequence's part of a step: what every layer that plans or runs a step speaks (the
 * paging of memory/kv_paged.h before the step, the forward pass of engine/kv_forward.h).
 */
#ifndef KV_SEQ_H
#define KV_SEQ_H

#ifdef __cplusplus
extern "C" {
#endif

/** One sequence's part of a step. */
typedef struct {
    int slot;          /**< cache slot of the sequence */
    int pos;           /**< position of tokens[0]; must equal the slot's cached length */
    int n_tokens;      /**< tokens to process this step (>= 1) */
    const int *tokens; /**< [n_tokens] */
    /** Chapter 10 (speculative verification): NULL, or [n_tokens][vocab] host memory that
     *  receives the logits after every token of the step, not only the last. Last so every
     *  positional initializer {slot, pos, n, tokens} leaves it NULL. */
    float *all_logits;
} kv_seq;

#ifdef __cplusplus
}
#endif

#endif /* KV_SEQ_H */
