/**
 * @file kv_eval.h
 * Perplexity of a model over a token stream, under any cache the backend was built with
 * (format, layout, window + sinks, retention, budget): what `kvlab eval ppl` prints.
 *
 * Two ways to cut the stream:
 *   stride  windows of T tokens overlapping by one (stride T - 1), each run from position 0
 *           in a fresh slot, so every token after the first is predicted exactly once, with up
 *           to T - 1 tokens of context. tools/train/train.py defines held-out perplexity the
 *           same way (T = seq_len), so the two numbers can be compared.
 *   stream  the whole stream as one sequence (T = 0): context grows to the end, which is what
 *           a windowed cache (chapter 06) is for; the cache must hold (or window) n positions.
 * And two ways to run a window:
 *   cached  chunks of C tokens per forward step with every row's logits (kv_seq.all_logits):
 *           row j is the logits a one-token step at that position would give (kv_forward.h).
 *   naive   chapter 01's recompute: for each position, reset and prefill the whole prefix,
 *           keep the last logits. O(T^2) work: for checking cached on short stretches.
 * NLL is summed in double; perplexity = exp(mean NLL over the predicted tokens).
 */
#ifndef KV_EVAL_H
#define KV_EVAL_H

#include "kv_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int window; /**< T: tokens per window (stride mode); 0 = stream mode */
    int chunk;  /**< C: tokens per forward step in cached mode (>= 1; 0 = 64) */
    int naive;  /**< 1: recompute every prefix instead of using the cache */
    long limit; /**< evaluate the first @c limit tokens of the stream only (0 = all) */
    /** Called after each window's step (may be NULL): tokens predicted so far of @p total. */
    void (*progress)(void *ctx, long done, long total);
    void *ctx;
} kv_ppl_opts;

typedef struct {
    double nll;        /**< mean negative log-likelihood, nats per predicted token */
    double ppl;        /**< exp(nll) */
    long n_predicted;  /**< tokens predicted (n - number of windows in stride mode) */
    int n_windows;     /**< windows run (1 in stream mode) */
} kv_ppl_result;

/**
 * Perplexity of @p tokens [n] on slot 0 of @p b (its spec's capacity must hold a window, or
 * the stream in stream mode, else KV_ERR_CAPACITY from the engine). Token ids are checked by
 * the engine. n >= 2; a window of T >= 2.
 */
int kv_eval_ppl(kv_backend *b, const int *tokens, long n, const kv_ppl_opts *o,
                kv_ppl_result *r, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
