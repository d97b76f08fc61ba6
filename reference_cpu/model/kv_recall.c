/* Recall models (kv_recall.h): weights constructed so that attention retrieves planted facts.
 *
 * Everything below is the construction of docs/recall-models.md, in the order the forward pass
 * runs. Shapes: dim D = 128, H = 2 query heads, H_kv = 1 KV head, d = 64, rotary_dim r = 32.
 *
 * Residual stream x [D], one block per meaning (one-hot codes, so different keys score 0):
 *   0        BIAS  B = 32 in every token: RMSNorm then divides by ~B, a near constant
 *   1        BOSF  1 in "<s>" only: what the attention sink's key reads
 *   2..17    KEY   key a of the token (induction: "k_a"; direct: the fact "k_a=v_b")
 *   18..33   QKEY  key a being asked (direct: "q_a")
 *   34..49   VAL   value b of the token ("v_b"; direct: also the fact "k_a=v_b")
 *   50..65   PREV  key of the previous token, written by the previous-token head (induction)
 *   66..81   OUT   retrieved value, written by the retrieval head; the classifier reads it
 *   82..127  NOISE a seeded random direction per token, so fillers differ (nothing reads it
 *                  on the retrieval path); its norm makes every token's content norm^2 = 2
 *
 * Head dims [d = 64]: 0..31 rotated by RoPE (16 pairs), 32..47 the key match (unrotated,
 * so it ignores position), 48 the sink, V/O carry 16 dims 0..15.
 *
 * Every RMSNorm gain is B/sqrt(D), so a sublayer reads nu(x)·x with
 * nu = B / sqrt(|x|^2 + D·eps) = 1/sqrt(1 + (|c|^2 + D·eps)/B^2), c the content: 0.999 here. */
#include "kv_recall.h"
#include "kv_rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { R_BIAS = 0, R_BOSF = 1, R_KEY = 2, R_QKEY = 18, R_VAL = 34, R_PREV = 50, R_OUT = 66,
       R_NOISE = 82, R_NOISE_N = 46 };
enum { H_MATCH = 32, H_SINK = 48 };
#define RC_DIM 128
#define RC_HEADS 2
#define RC_KV_HEADS 1
#define RC_HIDDEN 256
#define RC_ROTARY 32
#define RC_THETA 2.0f

/* ---- vocabulary ------------------------------------------------------------------------- */

void kv_recall_vocab_get(kv_recall_vocab *v)
{
    v->bos = 0;
    v->ack = 1;
    v->sep = 2;
    v->filler0 = 3;
    v->n_fillers = KV_RECALL_FILLERS;
    v->key0 = v->filler0 + v->n_fillers;
    v->n_keys = KV_RECALL_KEYS;
    v->value0 = v->key0 + v->n_keys;
    v->n_values = KV_RECALL_VALUES;
    v->query0 = v->value0 + v->n_values;
    v->fact0 = v->query0 + v->n_keys;
    v->vocab_size = v->fact0 + v->n_keys * v->n_values;
}

int kv_recall_value_of(const kv_recall_vocab *v, int token)
{
    return (token >= v->value0 && token < v->value0 + v->n_values) ? token - v->value0 : -1;
}

const char *kv_recall_token_name(const kv_recall_vocab *v, int t, char buf[32])
{
    if (t == v->bos) return "<s>";
    if (t == v->ack) return "ok";
    if (t == v->sep) return "|";
    if (t >= v->filler0 && t < v->key0) snprintf(buf, 32, "f%d", t - v->filler0);
    else if (t >= v->key0 && t < v->value0) snprintf(buf, 32, "k%d", t - v->key0);
    else if (t >= v->value0 && t < v->query0) snprintf(buf, 32, "v%d", t - v->value0);
    else if (t >= v->query0 && t < v->fact0) snprintf(buf, 32, "q%d", t - v->query0);
    else if (t >= v->fact0 && t < v->vocab_size)
        snprintf(buf, 32, "k%d=v%d", (t - v->fact0) / v->n_values,
                 (t - v->fact0) % v->n_values);
    else snprintf(buf, 32, "#%d", t);
    return buf;
}

int kv_recall_fact_tokens(const kv_recall_vocab *v, int kind, int key, int value, int *out)
{
    if (key < 0 || key >= v->n_keys || value < 0 || value >= v->n_values) return -1;
    if (kind == KV_MODEL_RECALL_DIRECT) {
        out[0] = v->fact0 + key * v->n_values + value;
        return 1;
    }
    if (kind == KV_MODEL_RECALL_INDUCTION) {
        out[0] = v->key0 + key;
        out[1] = v->value0 + value;
        return 2;
    }
    return -1;
}

int kv_recall_question_tokens(const kv_recall_vocab *v, int kind, int key, int *out)
{
    if (key < 0 || key >= v->n_keys) return -1;
    if (kind == KV_MODEL_RECALL_DIRECT) out[0] = v->query0 + key;
    else if (kind == KV_MODEL_RECALL_INDUCTION) out[0] = v->key0 + key;
    else return -1;
    return 1;
}

int kv_recall_kind_parse(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "direct") || !strcmp(s, "recall-direct")) return KV_MODEL_RECALL_DIRECT;
    if (!strcmp(s, "induction") || !strcmp(s, "recall-induction")) return KV_MODEL_RECALL_INDUCTION;
    return -1;
}

const char *kv_recall_kind_name(int kind)
{
    return kind == KV_MODEL_RECALL_DIRECT      ? "direct"
           : kind == KV_MODEL_RECALL_INDUCTION ? "induction"
                                               : "?";
}

/* ---- options and config ----------------------------------------------------------------- */

void kv_recall_opts_default(kv_recall_opts *o, int kind)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->seed = 1;
    o->n_layers = 4;
    o->seq_len = 131072;
    o->beta = 16.0f;
    o->beta_sink = 8.0f;
    o->beta_prev = 32.0f;
    o->noise = 0.02f;
    o->kappa = 10.0f;
    o->tau = 0.5f;
}

void kv_recall_layers(int kind, int n_layers, int *prev_layer, int *retrieval_layer)
{
    if (kind == KV_MODEL_RECALL_INDUCTION) {
        /* previous-token head in the middle, induction head last: the layers before, between
         * and after are random, so every position on the path passes through them */
        *prev_layer = n_layers / 2 - 1;
        *retrieval_layer = n_layers - 1;
    } else {
        *prev_layer = -1;
        *retrieval_layer = n_layers / 2;
    }
}

int kv_recall_config(const kv_recall_opts *o, kv_config *c, kv_err *err)
{
    if (!o || !c) return kv_fail(err, KV_ERR_ARG, "kv_recall_config: NULL argument");
    if (o->kind != KV_MODEL_RECALL_DIRECT && o->kind != KV_MODEL_RECALL_INDUCTION)
        return kv_fail(err, KV_ERR_ARG, "recall model kind %d is neither direct (%d) nor "
                       "induction (%d)", o->kind, KV_MODEL_RECALL_DIRECT, KV_MODEL_RECALL_INDUCTION);
    const int min_layers = o->kind == KV_MODEL_RECALL_INDUCTION ? 2 : 1;
    if (o->n_layers < min_layers || o->n_layers > 64)
        return kv_fail(err, KV_ERR_ARG, "recall model: n_layers %d (the %s model needs %d..64)",
                       o->n_layers, kv_recall_kind_name(o->kind), min_layers);
    const float params[] = {o->beta, o->beta_sink, o->beta_prev, o->kappa, o->tau};
    const char *names[] = {"beta", "beta_sink", "beta_prev", "kappa", "tau"};
    for (int i = 0; i < 5; i++)
        if (!(params[i] > 0.0f && params[i] < 1e4f))
            return kv_fail(err, KV_ERR_ARG, "recall model: %s %g must be in (0, 1e4)", names[i],
                           (double)params[i]);
    if (!(o->noise >= 0.0f && o->noise <= 1.0f))
        return kv_fail(err, KV_ERR_ARG, "recall model: noise %g must be in [0, 1]", (double)o->noise);
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    memset(c, 0, sizeof *c);
    c->dim = RC_DIM;
    c->hidden_dim = RC_HIDDEN;
    c->n_layers = o->n_layers;
    c->n_heads = RC_HEADS;
    c->n_kv_heads = RC_KV_HEADS;
    c->vocab_size = v.vocab_size;
    c->seq_len = o->seq_len;
    c->rope_theta = RC_THETA;
    c->rotary_dim = RC_ROTARY;
    c->norm_eps = 1e-5f;
    c->tied_classifier = 0;
    c->kind = o->kind;
    return kv_config_validate(c, err);
}

/* ---- construction ----------------------------------------------------------------------- */

/* Angle per position of rotated pair i, computed exactly as kv_rope() does. */
static double pair_freq(const kv_config *c, int i)
{
    return pow((double)c->rope_theta, -(double)(2 * i) / (double)c->rotary_dim);
}

/* Token embeddings: bias, identity one-hots, and a seeded NOISE direction that brings every
 * token's content norm^2 to exactly 2 (so nu is the same for every fresh token). */
static void build_embeddings(kv_model *m, const kv_recall_opts *o, kv_rng *rng)
{
    const int D = m->config.dim;
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    const int direct = o->kind == KV_MODEL_RECALL_DIRECT;
    for (int t = 0; t < v.vocab_size; t++) {
        float *e = m->w.token_embedding + (size_t)t * D; /* [D] */
        float noise[R_NOISE_N];
        double n2 = 0.0;
        for (int i = 0; i < R_NOISE_N; i++) {
            noise[i] = kv_rng_normal(rng);
            n2 += (double)noise[i] * noise[i];
        }
        e[R_BIAS] = KV_RECALL_BIAS;
        double ident = 0.0; /* norm^2 of the identity parts set below */
        if (t == v.bos) {
            e[R_BOSF] = 1.0f;
            ident = 1.0;
        } else if (t >= v.key0 && t < v.value0 && !direct) {
            e[R_KEY + (t - v.key0)] = 1.0f;
            ident = 1.0;
        } else if (t >= v.value0 && t < v.query0) {
            e[R_VAL + (t - v.value0)] = 1.0f;
            ident = 1.0;
        } else if (t >= v.query0 && t < v.fact0 && direct) {
            e[R_QKEY + (t - v.query0)] = 1.0f;
            ident = 1.0;
        } else if (t >= v.fact0 && direct) {
            e[R_KEY + (t - v.fact0) / v.n_values] = 1.0f;
            e[R_VAL + (t - v.fact0) % v.n_values] = 1.0f;
            ident = 2.0;
        }
        const double scale = sqrt(2.0 - ident) / sqrt(n2);
        for (int i = 0; i < R_NOISE_N; i++) e[R_NOISE + i] = (float)(noise[i] * scale);
    }
}

/* Fill a [rows][cols] matrix with U(-a, a). A matrix that reads the residual (reads_x) keeps
 * column 0 (the bias) at zero, so the random sublayers respond to token content, not to the
 * constant every token shares. Rows [keep_lo, keep_hi) and columns [kc_lo, kc_hi) are left as
 * they are (the constructed path). One number is drawn per entry either way, so the random
 * weights do not depend on which entries are constructed. */
static void random_fill(float *W, int rows, int cols, float a, kv_rng *rng, int reads_x,
                        int keep_lo, int keep_hi, int kc_lo, int kc_hi)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float x = kv_rng_uniform(rng, -a, a);
            const int kept = (r >= keep_lo && r < keep_hi) || (c >= kc_lo && c < kc_hi);
            if (!kept && !(reads_x && c == R_BIAS)) W[(size_t)r * cols + c] = x;
        }
}

int kv_recall_build(kv_model *m, const kv_recall_opts *o, kv_err *err)
{
    kv_config c;
    int rc = kv_recall_config(o, &c, err);
    if (rc) return rc;
    rc = kv_model_alloc(m, &c, err);
    if (rc) return rc;
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    const int D = c.dim, H = c.n_heads, d = kv_config_head_dim(&c), L = c.n_layers;
    const int qdim = H * d, kvdim = kv_config_kv_dim(&c), hidden = c.hidden_dim;
    const float B = KV_RECALL_BIAS, sqd = sqrtf((float)d);
    kv_rng rng;
    kv_rng_seed(&rng, o->seed);

    build_embeddings(m, o, &rng);

    /* every RMSNorm gain B/sqrt(D): a sublayer reads nu(x)·x, nu ~ 1 */
    const float gain = B / sqrtf((float)D);
    for (int i = 0; i < L * D; i++) m->w.rms_att[i] = m->w.rms_ffn[i] = gain;
    for (int i = 0; i < D; i++) m->w.rms_final[i] = gain;

    int prev_layer, ret_layer;
    kv_recall_layers(o->kind, L, &prev_layer, &ret_layer);

    /* random sublayers: Q, K, V, W1, W3 read content of norm ~sqrt(2) and give outputs of
     * RMS ~1 (a real, non-uniform attention pattern); Wo and W2 scale what goes back into the
     * residual to RMS ~noise per dim (Wo twice the plain 1/sqrt(fan_in) scale: a head's output
     * is an average of values, smaller than one value; W2: SwiGLU units have RMS ~0.6).
     * Measured: 0.051 RMS per dim after 8 sublayers at noise 0.02 (docs/recall-models.md §5).
     * noise 0 leaves them all zero (the pure construction). */
    const float a_in = o->noise > 0.0f ? sqrtf(3.0f / 2.0f) : 0.0f;
    const float a_o = o->noise * sqrtf(3.0f) / sqrtf((float)qdim) * 2.0f;
    const float a_2 = o->noise * sqrtf(3.0f) / (0.6f * sqrtf((float)hidden));
    for (int l = 0; l < L; l++) {
        const int on_path = (l == prev_layer || l == ret_layer);
        float *wq = m->w.wq + (size_t)l * qdim * D;   /* [H*d][D] */
        float *wk = m->w.wk + (size_t)l * kvdim * D;  /* [H_kv*d][D] */
        float *wv = m->w.wv + (size_t)l * kvdim * D;  /* [H_kv*d][D] */
        float *wo = m->w.wo + (size_t)l * D * qdim;   /* [D][H*d] */
        /* on the path, query head 0 and KV head 0 (the only one) are constructed; query head 1
         * stays random and reads the constructed K/V, as a real GQA sibling head would */
        random_fill(wq, qdim, D, a_in, &rng, 1, on_path ? 0 : -1, on_path ? d : -1, -1, -1);
        random_fill(wk, kvdim, D, a_in, &rng, 1, on_path ? 0 : -1, on_path ? kvdim : -1, -1, -1);
        random_fill(wv, kvdim, D, a_in, &rng, 1, on_path ? 0 : -1, on_path ? kvdim : -1, -1, -1);
        random_fill(wo, D, qdim, a_o, &rng, 0, -1, -1, on_path ? 0 : -1, on_path ? d : -1);
        random_fill(m->w.w1 + (size_t)l * hidden * D, hidden, D, a_in, &rng, 1, -1, -1, -1, -1);
        random_fill(m->w.w3 + (size_t)l * hidden * D, hidden, D, a_in, &rng, 1, -1, -1, -1, -1);
        random_fill(m->w.w2 + (size_t)l * D * hidden, D, hidden, a_2, &rng, 0, -1, -1, -1, -1);

        if (l == prev_layer) {
            /* previous-token head: q = alpha·(1,0) in every rotated pair, k = alpha·(cos w_i,
             * sin w_i), both from the bias. After RoPE q_t·k_s = alpha^2 nu^2 sum_i
             * cos((t - s - 1) w_i): largest at s = t - 1. alpha^2 = beta_prev·sqrt(d)/P. */
            const int P = c.rotary_dim / 2;
            const float alpha = sqrtf(o->beta_prev * sqd / (float)P);
            for (int i = 0; i < P; i++) {
                const double w = pair_freq(&c, i);
                wq[(size_t)(2 * i) * D + R_BIAS] = alpha / B;
                wk[(size_t)(2 * i) * D + R_BIAS] = (float)(alpha * cos(w)) / B;
                wk[(size_t)(2 * i + 1) * D + R_BIAS] = (float)(alpha * sin(w)) / B;
            }
            /* value: the token's own key; output: the PREV block of the later token */
            for (int j = 0; j < KV_RECALL_KEYS; j++) {
                wv[(size_t)j * D + R_KEY + j] = 1.0f;
                wo[(size_t)(R_PREV + j) * qdim + j] = 1.0f;
            }
        }
        if (l == ret_layer) {
            /* retrieval head: q = lambda·(asked key) + sigma·[bias], k = lambda·(stored key) +
             * sigma·[BOS]; match score lambda^2 nu^2/sqrt(d) = beta, BOS score beta_sink. The
             * direct model asks with QKEY and stores in KEY; the induction model asks with the
             * current token's KEY and stores in PREV (the key that came just before). */
            const float lambda = sqrtf(o->beta * sqd), sigma = sqrtf(o->beta_sink * sqd);
            const int ask = o->kind == KV_MODEL_RECALL_DIRECT ? R_QKEY : R_KEY;
            const int stored = o->kind == KV_MODEL_RECALL_DIRECT ? R_KEY : R_PREV;
            for (int j = 0; j < KV_RECALL_KEYS; j++) {
                wq[(size_t)(H_MATCH + j) * D + ask + j] = lambda;
                wk[(size_t)(H_MATCH + j) * D + stored + j] = lambda;
            }
            wq[(size_t)H_SINK * D + R_BIAS] = sigma / B;
            wk[(size_t)H_SINK * D + R_BOSF] = sigma;
            /* value: the token's value; output: the OUT block */
            for (int j = 0; j < KV_RECALL_VALUES; j++) {
                wv[(size_t)j * D + R_VAL + j] = 1.0f;
                wo[(size_t)(R_OUT + j) * qdim + j] = 1.0f;
            }
        }
    }

    /* classifier: value b reads OUT_b with gain kappa; "ok" reads the bias at kappa·tau, so an
     * answer wins only when its retrieved weight (times nu) exceeds tau. Every other token
     * (fillers, keys, facts) has logit 0 < kappa·tau: the reply is always a value or "ok". */
    for (int b = 0; b < KV_RECALL_VALUES; b++)
        m->w.wcls[(size_t)(v.value0 + b) * D + R_OUT + b] = o->kappa;
    m->w.wcls[(size_t)v.ack * D + R_BIAS] = o->kappa * o->tau / B;
    return KV_OK;
}

/* ---- the derivation as code ------------------------------------------------------------- */

double kv_recall_nu(double c2, const kv_config *cfg)
{
    const double B = KV_RECALL_BIAS;
    return 1.0 / sqrt(1.0 + (c2 + cfg->dim * (double)cfg->norm_eps) / (B * B));
}

double kv_recall_prev_profile(const kv_config *cfg, long delta)
{
    const int P = cfg->rotary_dim / 2;
    double f = 0.0;
    for (int i = 0; i < P; i++) f += cos((double)delta * pair_freq(cfg, i));
    return f / P;
}

double kv_recall_prev_weight(const kv_recall_opts *o, const kv_config *cfg, int t)
{
    /* the query at t sees s = 0..t, offsets delta = t - s - 1 in [-1, t-1]; delta 0 scores
     * beta_prev·nu0^2, every other offset beta_prev·nu0^2·f(delta) */
    const double nu0 = kv_recall_nu(2.0, cfg), b = o->beta_prev * nu0 * nu0;
    double sum = 0.0;
    for (long delta = -1; delta <= t - 1; delta++)
        sum += exp(b * (kv_recall_prev_profile(cfg, delta) - 1.0));
    return 1.0 / sum;
}

void kv_recall_predict(const kv_recall_opts *o, const kv_config *cfg, long n_att, int value_pos,
                       kv_recall_prediction *p)
{
    const double nu0 = kv_recall_nu(2.0, cfg);
    double w1 = 1.0, nu_m = nu0, match;
    if (o->kind == KV_MODEL_RECALL_INDUCTION) {
        /* stage 1: the value token's PREV = w1·nu0·e_a; its nu at the retrieval layer grows
         * with that block; stage 2 matches lambda·e_a against lambda·PREV */
        w1 = kv_recall_prev_weight(o, cfg, value_pos);
        nu_m = kv_recall_nu(2.0 + (w1 * nu0) * (w1 * nu0), cfg);
        match = o->beta * nu0 * nu_m * w1 * nu0;
    } else {
        match = o->beta * nu0 * nu0;
    }
    const double sink = o->beta_sink * nu0 * nu0;
    /* softmax over: the fact (match), BOS (sink), and n_att - 2 positions scoring 0 */
    const double others = (double)(n_att - 2);
    const double w = 1.0 / (1.0 + exp(sink - match) + others * exp(-match));
    const double out = w * nu_m; /* OUT_b: the value row is nu·e_b at that position */
    const double nu_f = kv_recall_nu(2.0 + out * out, cfg);
    p->w1 = w1;
    p->w = w;
    p->logit = o->kappa * nu_f * out;
    p->logit_ack = o->kappa * o->tau * nu_f;
    /* w·nu_m = tau  <=>  n_att = 2 + e^match (nu_m/tau - 1) - e^sink */
    p->n_star = 2.0 + exp(match) * (nu_m / o->tau - 1.0) - exp(sink);
}
