/**
 * @file kv_recall.h
 * Recall models: Llama-style checkpoints whose weights are constructed, not trained, so that
 * attention retrieves planted facts. They make the needle and multi-turn suites real: the
 * answer is right only if the cache kept the fact, and (for the induction model) its position.
 *
 * Two kinds, one vocabulary (docs/recall-models.md derives every number below):
 *  - direct lookup (::KV_MODEL_RECALL_DIRECT): a fact is one token "k3=v7" whose embedding
 *    holds key 3 and value 7; a question is one token "q3" holding key 3. One head matches
 *    the question's key against the facts' keys in head dims RoPE leaves alone, so the match
 *    does not depend on where the fact is.
 *  - induction (::KV_MODEL_RECALL_INDUCTION): a fact is two tokens "k3 v7", a question is
 *    "k3". A previous-token head (RoPE only) copies each token's predecessor key into the
 *    residual; a later induction head finds the position whose predecessor was k3 and copies
 *    that position's value. Positions that are wrong by even one step break it.
 *
 * Both: L layers (default 4), dim 128, H 2, H_kv 1 (G 2), d 64, rotary_dim 32, theta 2,
 * SwiGLU hidden 256; layers and heads off the retrieval path carry small seeded random weights.
 * The answer is read from the greedy token after the question: a value token "v7", or "ok"
 * when nothing was retrieved.
 */
#ifndef KV_RECALL_H
#define KV_RECALL_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_RECALL_KEYS 16    /**< A: distinct keys (facts per context at most) */
#define KV_RECALL_VALUES 16  /**< distinct values */
#define KV_RECALL_FILLERS 64 /**< filler tokens */

/**
 * The vocabulary both recall models share (fixed layout):
 *   0 "<s>" BOS, 1 "ok" (nothing retrieved), 2 "|" (turn separator),
 *   then fillers "f0".., keys "k0".., values "v0".., questions "q0".., facts "k0=v0"..
 */
typedef struct {
    int bos, ack, sep;
    int filler0, n_fillers; /**< filler i is filler0 + i */
    int key0, n_keys;       /**< key a is key0 + a */
    int value0, n_values;   /**< value b is value0 + b */
    int query0;             /**< question about key a (direct model) is query0 + a */
    int fact0;              /**< fact (a, b) (direct model) is fact0 + a * n_values + b */
    int vocab_size;
} kv_recall_vocab;

/** The vocabulary layout. */
void kv_recall_vocab_get(kv_recall_vocab *v);
/** Value index b of a value token, or -1 when @p token is not a value. */
int kv_recall_value_of(const kv_recall_vocab *v, int token);
/** Printable name of a token ("<s>", "ok", "|", "f12", "k3", "v7", "q3", "k3=v7"). */
const char *kv_recall_token_name(const kv_recall_vocab *v, int token, char buf[32]);

/**
 * Tokens stating "key @p key has value @p value" for a model kind: 1 token (direct) or
 * 2 (induction). Returns the count written to out (room for 2), or -1 on a bad argument.
 */
int kv_recall_fact_tokens(const kv_recall_vocab *v, int kind, int key, int value, int *out);
/** Tokens asking for @p key (1 token for both kinds); count written, or -1. */
int kv_recall_question_tokens(const kv_recall_vocab *v, int kind, int key, int *out);

/** How a recall model is built. kv_recall_opts_default() fills the documented defaults. */
typedef struct {
    int kind;         /**< KV_MODEL_RECALL_DIRECT or KV_MODEL_RECALL_INDUCTION */
    uint64_t seed;    /**< embeddings' filler parts and the random layers */
    int n_layers;     /**< L (direct >= 1, induction >= 2); default 4 */
    int seq_len;      /**< longest context the model is meant for; default 131072 */
    float beta;       /**< score of the matching key in the retrieval head (logits of attention) */
    float beta_sink;  /**< score of BOS for every query: where queries with no key look */
    float beta_prev;  /**< previous-token head: score at offset 1 (induction only) */
    float noise;      /**< RMS each random sublayer adds to the residual (0 = pure construction) */
    float kappa;      /**< classifier gain: logit of the answer when fully retrieved */
    float tau;        /**< "ok" threshold: an answer wins when retrieved weight * nu > tau */
} kv_recall_opts;

/** Residual bias coordinate B: every token embedding holds B in dim 0 (see the doc). */
#define KV_RECALL_BIAS 32.0f

/** Defaults: L 4, beta 16, beta_sink 8, beta_prev 32, noise 0.02, kappa 10, tau 0.5, seed 1. */
void kv_recall_opts_default(kv_recall_opts *o, int kind);

/** The config a recall model has (validated); KV_ERR_ARG on bad options. */
int kv_recall_config(const kv_recall_opts *o, kv_config *out, kv_err *err);

/**
 * Allocate and construct a recall model. Deterministic: same options -> identical bytes.
 * kv_model_free() releases it.
 */
int kv_recall_build(kv_model *m, const kv_recall_opts *o, kv_err *err);

/** Layers of the retrieval path: previous-token layer (-1 for direct) and retrieval layer. */
void kv_recall_layers(int kind, int n_layers, int *prev_layer, int *retrieval_layer);

/** "direct" / "induction" -> kind (-1 when unknown). */
int kv_recall_kind_parse(const char *name);
/** kind -> "direct" / "induction" (kv_recall_kind_parse() backwards). */
const char *kv_recall_kind_name(int kind);

/* ---- the derivation, as code (docs/recall-models.md) ------------------------------------ */

/**
 * nu for a residual with content norm^2 @p c2 on top of the bias coordinate:
 * the recall models' RMSNorm maps x to nu(x)·x with nu = 1/sqrt(1 + (c2 + dim·eps)/B^2).
 */
double kv_recall_nu(double c2, const kv_config *cfg);

/**
 * Previous-token head's positional profile f(delta) = (1/P) sum_i cos(delta·omega_i) over the
 * P = rotary_dim/2 rotated pairs; the head's score for a key at offset delta+1 behind the
 * query is beta_prev·nu^2·f(delta).
 */
double kv_recall_prev_profile(const kv_config *cfg, long delta);

/**
 * Predicted weight the previous-token head puts on position t-1 for a query at position t
 * (sum over every offset the query sees, so near-recurrences of the frequencies count).
 */
double kv_recall_prev_weight(const kv_recall_opts *o, const kv_config *cfg, int t);

/** Predicted answer and "ok" logits of the pure model (noise 0) for one needle. */
typedef struct {
    double w1;        /**< previous-token weight at the value token (1 for direct) */
    double w;         /**< retrieval head's weight on the fact */
    double logit;     /**< logit of the planted value */
    double logit_ack; /**< logit of "ok" */
    double n_star;    /**< attended positions at which logit == logit_ack (the survival limit) */
} kv_recall_prediction;

/**
 * Predict the question's logits when the question token attends @p n_att positions (BOS, the
 * needle, fillers and itself), the needle's value token sitting at position @p value_pos
 * (induction; ignored for direct). Exact for noise 0 up to terms below 1e-4 (see the doc).
 */
void kv_recall_predict(const kv_recall_opts *o, const kv_config *cfg, long n_att, int value_pos,
                       kv_recall_prediction *p);

#ifdef __cplusplus
}
#endif
#endif
