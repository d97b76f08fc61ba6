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
 * And two more, for chapters 04 and 06 on the trained model:
 *   recompute  StreamingLLM's "sliding window with re-computation" baseline (window T > 0,
 *           slide = 1): each predicted token t gets a fresh prefill of the T - 1 tokens before
 *           it (fewer at the start), so every token sees exactly a window of context and the
 *           positions are always 0 .. T-2. O(n T) tokens of work: @c every predicts only the
 *           tokens t with t % every == 0, a uniform subsample of the stream (and the other
 *           modes score the same subsample with the same @c every, to compare on it).
 *   reference  with @c ref, a second backend (normally the exact fp32 cache) runs the same
 *           steps; the result adds the mean KL(ref || b) per token and the fraction of tokens
 *           whose argmax agrees (cached mode only). kv_eval_ppl_many() runs several
 *           backends (cache variants) in lockstep against one reference.
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
    /* appended last: positional initializers of the fields above leave these 0 */
    int slide;        /**< 1: recompute mode (needs window T >= 2) */
    int every;        /**< score only the tokens t with t % every == 0 (0 = 1: all), in every
                       *   mode: the same subsample of the stream for each */
    kv_backend *ref;  /**< reference backend for KL and top-1 agreement, or NULL */
    /** Called before each cached forward step of a window (may be NULL): the step will feed
     * positions pos .. pos+n-1 to slot 0 of b (kv_probe.h's KIVI emulation edits the cache
     * here). A non-zero return stops the run with that status. */
    int (*before_step)(void *hook, kv_backend *b, int pos, int n, kv_err *err);
    void *hook;
    /** Called for every predicted token (may be NULL): the backend's index @p v (0 with
     * kv_eval_ppl()), the token's index @p t in the stream, its NLL, and with a reference its
     * KL(ref || b) and whether the argmaxes agree (0, 0 without). What a spread over windows
     * or a curve along the stream is computed from. */
    void (*on_token)(void *ctx, int v, long t, double nll, double kl, int agree);
    void *token_ctx;
} kv_ppl_opts;

typedef struct {
    double nll;        /**< mean negative log-likelihood, nats per predicted token */
    double ppl;        /**< exp(nll) */
    long n_predicted;  /**< tokens predicted (n - number of windows in stride mode) */
    int n_windows;     /**< windows run (1 in stream mode; predictions in recompute mode) */
    double kl;         /**< with ref: mean KL(ref || b) in nats per predicted token */
    double top1;       /**< with ref: fraction of predicted tokens where the argmaxes agree */
    double ref_nll;    /**< with ref: the reference's own mean NLL on the same tokens (its
                        *   perplexity without a run of its own) */
} kv_ppl_result;

/**
 * Perplexity of @p tokens [n] on slot 0 of @p b (its spec's capacity must hold a window, or
 * the stream in stream mode, else KV_ERR_CAPACITY from the engine). Token ids are checked by
 * the engine. n >= 2; a window of T >= 2.
 */
int kv_eval_ppl(kv_backend *b, const int *tokens, long n, const kv_ppl_opts *o,
                kv_ppl_result *r, kv_err *err);

/**
 * kv_eval_ppl() for @p nb backends in lockstep (cached mode, stride or stream): every step's
 * chunk runs through the reference once and through each of @p bs [nb], so one exact run
 * serves the KL of every variant. Results into @p r [nb]. No naive or recompute mode, no
 * before_step hook with nb > 1 (KV_ERR_ARG).
 */
int kv_eval_ppl_many(kv_backend *const *bs, int nb, const int *tokens, long n,
                     const kv_ppl_opts *o, kv_ppl_result *r, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
