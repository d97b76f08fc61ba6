/**
 * @file kv_trace.h
 * Request traces for the serving chapters (chapters 05 and 07): a seeded generator, the CSV
 * format in datasets/traces/, and its parser.
 *
 * Format (text, one request per line, sorted by arrival):
 *
 *     # comment lines start with '#'
 *     #prefix,<id>,<tokens>          declares shared prefix <id> (a system prompt) and its length
 *     arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id      (this header, once)
 *     0.532,187,402,1,1,-1
 *
 * prompt_len counts every prompt token, the shared prefix included; prefix_id -1 = none.
 * n_samples > 1 is parallel sampling, beam_width > 1 beam search (not both on one request).
 *
 * Priorities (chapter 07): the header may end with a seventh column, priority, 0 (normal)
 * or 1 (high); then every row has seven fields. Without it (every chapter-05 file) every
 * request is normal. kv_trace_format() writes the column only when some request is high,
 * so traces without priorities keep their six-column text.
 *
 * Lengths. The PagedAttention paper (Kwon et al., SOSP 2023, arXiv:2309.06180, §6.1 and
 * Fig. 11) reports mean lengths of its ShareGPT workload as 161.31 input / 337.99 output
 * tokens and of Alpaca as 19.31 / 58.45: ShareGPT prompts 8.4x and outputs 5.8x longer, with
 * higher variance. kvlab does not ship those datasets; it draws each length from a log-normal
 * law whose mean, after clamping to [1, max], equals the published mean. The spreads (sigma)
 * and caps are kvlab's modelling choice, listed in kv_trace_length_model(). Arrivals are a
 * Poisson process (exponential gaps), as in the paper's evaluation.
 *
 * Bursts and priorities (chapter 07). With spec.high_share > 0 a request is high priority
 * with that probability and draws its lengths from spec.high_dist; the high requests form
 * their own Poisson stream (rate * high_share). With spec.burst_size > 1 the normal requests
 * arrive in bursts: burst_size of them at one instant, the bursts a Poisson process of rate
 * rate * (1 - high_share) / burst_size (a batch job dumping its queue). Both at their
 * defaults (0) the generator draws exactly what it drew before they existed.
 */
#ifndef KV_TRACE_H
#define KV_TRACE_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_TRACE_MAX_PREFIXES 64
#define KV_TRACE_MAX_LEN (1 << 20) /* longest prompt or output a trace may ask for */
#define KV_TRACE_MAX_FANOUT 64     /* largest n_samples or beam_width */
#define KV_TRACE_MAX_ARRIVAL 1e9   /* latest arrival_s a trace may hold (about 31 years) */
#define KV_TRACE_MAX_PRIORITY 1    /* priorities are 0 (normal) and 1 (high) */

/** One request. */
typedef struct {
    double arrival_s; /**< seconds from the start of the trace */
    int prompt_len;   /**< prompt tokens, shared prefix included */
    int output_len;   /**< tokens to generate (per sample / beam) */
    int n_samples;    /**< parallel samples (1 = plain) */
    int beam_width;   /**< beam width (1 = no beam search) */
    int prefix_id;    /**< shared prefix the prompt starts with, -1 = none */
    int priority;     /**< 0 normal, 1 high (chapter 07; the optional seventh column) */
} kv_request;

typedef struct {
    kv_request *req; /* [n] sorted by arrival */
    int n;
    int n_prefixes;
    int prefix_len[KV_TRACE_MAX_PREFIXES]; /* tokens of each shared prefix (0 = undeclared) */
    int **ids; /* [n][req[i].prompt_len] real prompts (kv_trace_set_prompts()); NULL: derived */
} kv_trace;

/** Length distributions. */
typedef enum { KV_TRACE_SHAREGPT = 0, KV_TRACE_ALPACA = 1 } kv_trace_dist;

/** A clamped log-normal length law: mean (after clamping to [1, max]), sigma of log, max. */
typedef struct {
    double mean, sigma;
    int max;
} kv_len_model;

/** What to generate. */
typedef struct {
    int dist;         /**< ::kv_trace_dist of the prompt (user part) and output lengths */
    int n_requests;
    double rate;      /**< Poisson arrivals per second */
    int n_samples;    /**< same for every request */
    int beam_width;   /**< same for every request */
    int n_prefixes;   /**< 0, or each prompt starts with one of these shared prefixes */
    int prefix_len[4];
    uint64_t seed;
    /* chapter 07; all 0: plain Poisson arrivals, every request normal */
    double high_share; /**< probability that a request is high priority, in [0, 1) */
    int high_dist;     /**< ::kv_trace_dist of the high-priority requests' lengths */
    int burst_size;    /**< > 1: normal requests arrive this many at one instant */
} kv_trace_spec;

/**
 * The length law of @p dist for prompts (@p output 0) or outputs (1): published mean,
 * kvlab's sigma and cap. KV_ERR_ARG for an unknown dist.
 */
int kv_trace_length_model(int dist, int output, kv_len_model *m, kv_err *err);

/**
 * Location mu of the log-normal whose clamp to [1, max] has mean m->mean (bisection on the
 * closed form E[min(X, max)] = e^(mu + s^2/2) Phi((ln max - mu - s^2)/s)
 *                             + max (1 - Phi((ln max - mu)/s))).
 */
double kv_trace_lognormal_mu(const kv_len_model *m);

/** Generate a trace (deterministic in the spec, seed included). KV_ERR_ARG, KV_ERR_NOMEM. */
int kv_trace_generate(const kv_trace_spec *spec, kv_trace *t, kv_err *err);

/**
 * The trace as file text: @p comment lines (may be NULL; each line gets "# "), the prefix
 * declarations, the header, the rows. *text is malloc'ed; the caller frees it.
 */
int kv_trace_format(const kv_trace *t, const char *comment, char **text, kv_err *err);

/**
 * Parse file text. KV_ERR_FORMAT naming the line and the problem: missing or wrong header,
 * wrong field count, a field that is not a number, negative, decreasing or absurd (past
 * KV_TRACE_MAX_ARRIVAL) arrivals, lengths < 1 or > KV_TRACE_MAX_LEN, n_samples / beam_width
 * outside 1..KV_TRACE_MAX_FANOUT or both > 1, an undeclared prefix id or a prompt not longer
 * than its prefix, a priority other than 0 or 1, no requests at all.
 */
int kv_trace_parse(const char *text, kv_trace *t, kv_err *err);

/** Read and parse a file (KV_ERR_IO when it cannot be read). */
int kv_trace_load(const char *path, kv_trace *t, kv_err *err);

/** Free a trace (safe on a zeroed struct). */
void kv_trace_free(kv_trace *t);

/**
 * Real prompts in place of the derived ones (chapters 05 and 07 on a real model): request i
 * takes prompt i % @p n, ids [len[i % n]] copied, prompt_len its length and prefix_id -1
 * (prompts that open alike, with one system message, share those tokens as they are; the
 * prefix cache finds them by their ids). Arrivals, outputs, fan-out and priorities stay the
 * trace's. KV_ERR_ARG for n < 1 or a length outside 1..KV_TRACE_MAX_LEN; KV_ERR_NOMEM (the
 * trace then unchanged).
 */
int kv_trace_set_prompts(kv_trace *t, const int *const *ids, const int *len, int n, kv_err *err);

/**
 * Prompt tokens of request @p i [prompt_len]: its real prompt when the trace has them
 * (kv_trace_set_prompts()); else in 1..vocab-1 (all 0 when vocab is 1), the shared prefix's
 * tokens depending only on its id (so equal prefixes hash equal in the prefix cache), the
 * rest on i.
 */
void kv_trace_tokens(const kv_trace *t, int i, int vocab, int *out);

/** Number of traces shipped in datasets/traces. */
int kv_trace_builtin_count(void);
/**
 * Recipe of shipped trace @p i: its file name (without ".csv"), a one-line description and
 * its spec. KV_ERR_ARG when @p i is out of range.
 */
int kv_trace_builtin(int i, const char **name, const char **what, kv_trace_spec *spec,
                     kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
