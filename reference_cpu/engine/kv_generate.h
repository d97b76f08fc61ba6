/**
 * @file kv_generate.h
 * Generation loops written once over a ::kv_backend (CPU or GPU):
 *  - chapter 01, naive recompute: before every new token the slot is reset and the whole
 *    prefix (prompt + generated so far) is run again;
 *  - chapter 02, KV cache: the prompt is prefilled once, then one token per step.
 * Both produce the same tokens; only the work differs (see ::kv_counters).
 */
#ifndef KV_GENERATE_H
#define KV_GENERATE_H

#include "kv_backend.h"
#include "kv_sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How kv_generate() runs the model. */
typedef enum {
    KV_MODE_NAIVE = 0, /**< chapter 01: re-run the whole prefix for every new token */
    KV_MODE_CACHED = 1 /**< chapter 02: prefill once, then one token per step */
} kv_gen_mode;

/** Called after each generated token (may be NULL): step index, token, that step's work. */
typedef void (*kv_step_fn)(void *user, int step, int token, const kv_counters *step_work,
                           double seconds);

/** Called before each forward call (may be NULL): the call will feed positions pos .. pos+n-1
 * to the slot (kv_probe.h's KIVI emulation edits the cache here; the signature of
 * kv_ppl_opts.before_step). A non-zero return stops generation with that status. */
typedef int (*kv_before_step_fn)(void *hook, kv_backend *b, int pos, int n, kv_err *err);

typedef struct {
    int mode;          /**< ::kv_gen_mode */
    int slot;          /**< cache slot to use */
    int n_steps;       /**< tokens to generate */
    kv_sampler *sampler; /**< NULL = greedy */
    kv_step_fn on_step;
    void *user;
    float *last_logits;  /**< optional [vocab]: logits that chose the final token */
    const int *stop;     /**< kv_generate_stop(): the ids that end the text [n_stop]; NULL:
                          *   llama2.c's BOS (1) and EOS (2) */
    int n_stop;
    /* appended last: positional initializers of the fields above leave these 0 */
    kv_before_step_fn before_step;
    void *hook;          /**< before_step's first argument */
    int prefill_step;    /**< tokens a forward call feeds of a step with many (the prompt, or a
                          *   naive step's prefix), from its first position; 0: all at once */
} kv_gen_opts;

/**
 * Generate @p opts->n_steps tokens after @p prompt (n_prompt >= 1) into out [n_steps].
 * Total work is added to @p total (may be NULL). The prompt plus generated tokens must fit the
 * backend's cache capacity: otherwise KV_ERR_CAPACITY before any work is done.
 */
int kv_generate(kv_backend *b, const int *prompt, int n_prompt, const kv_gen_opts *opts,
                int *out, kv_counters *total, kv_err *err);

/**
 * kv_generate() that ends early, as llama2.c's run.c does, after choosing BOS (1) or EOS (2)
 * (or one of opts->stop, a GGUF model's end-of-text and end-of-turn tokens):
 * the stop token is written to out, and *n_out says how many tokens were (n_steps when no stop
 * token came). kvlab generate uses it unless --no-stop.
 */
int kv_generate_stop(kv_backend *b, const int *prompt, int n_prompt, const kv_gen_opts *opts,
                     int *out, int *n_out, kv_counters *total, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
