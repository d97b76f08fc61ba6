/**
 * @file kv_beam.h
 * Beam search's one decision (chapter 05): given the logits of every live beam, which k
 * (parent, token) continuations survive.
 *
 * A beam's score is its cumulative log-probability, sum over its tokens of
 * log softmax(logits)[token], formed in double so that a long beam's sum does not lose the
 * small terms. Candidates are ordered by score, highest first; equal scores by parent beam,
 * then by token, lowest first, so the choice never depends on how the sort was done. The
 * output is fixed length (no end-of-sequence token), so every beam has the same number of
 * tokens and scores compare without a length penalty. Width 1 is greedy decoding: the best
 * continuation of one beam is the argmax of its logits (lowest token on ties, as kv_argmax).
 */
#ifndef KV_BEAM_H
#define KV_BEAM_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One continuation: beam @c parent extended by @c token, with the new cumulative score. */
typedef struct {
    double score; /**< parent's score + log softmax(parent's logits)[token] */
    int parent;   /**< index of the parent among the beams passed in */
    int token;
} kv_beam_cand;

/**
 * out[v] = x[v] - log sum_j exp(x[j]), in double (the max is subtracted first, so no
 * overflow). @p x [n] float logits, @p out [n].
 */
void kv_log_softmax(const float *x, int n, double *out);

/** log softmax(x)[token] alone (same arithmetic as kv_log_softmax). */
double kv_log_prob(const float *x, int n, int token);

/**
 * The @p k best continuations of @p n_parents beams: logits[p] [vocab] and cum[p] are beam
 * p's logits and score. Writes min(k, n_parents * vocab) candidates to @p out [k], best
 * first in the order of the file comment, and returns their count. @p scratch [vocab].
 * NaN logits are never chosen.
 */
int kv_beam_select(const float *const *logits, const double *cum, int n_parents, int vocab,
                   int k, kv_beam_cand *out, double *scratch);

#ifdef __cplusplus
}
#endif
#endif
