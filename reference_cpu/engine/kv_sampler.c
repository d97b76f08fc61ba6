/* Choosing the next token (kv_sampler.h): greedy, temperature, top-p.
 *
 * Sampling is host-side logic written once: the CUDA engine copies logits back and calls
 * these same functions, so a seed gives the same tokens on either device. */
#include "kv_sampler.h"
#include "kv_ops.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

typedef struct {
    float prob;
    int index;
} prob_index;

int kv_sampler_init(kv_sampler *s, int vocab_size, float temperature, float top_p,
                    uint64_t seed, kv_err *err)
{
    if (!s) return kv_fail(err, KV_ERR_ARG, "kv_sampler_init: NULL sampler");
    s->scratch = NULL;
    if (vocab_size < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_sampler_init: vocab_size %d (need >= 1)", vocab_size);
    if (!(temperature >= 0.0f) || isinf(temperature))
        return kv_fail(err, KV_ERR_ARG, "kv_sampler_init: temperature %g (need finite >= 0)",
                       (double)temperature);
    if (!(top_p > 0.0f && top_p <= 1.0f))
        return kv_fail(err, KV_ERR_ARG, "kv_sampler_init: top_p %g (need 0 < top_p <= 1)",
                       (double)top_p);
    s->temperature = temperature;
    s->top_p = top_p;
    s->vocab_size = vocab_size;
    kv_rng_seed(&s->rng, seed);
    s->scratch = malloc((size_t)vocab_size * sizeof(prob_index)); /* [vocab] */
    if (!s->scratch)
        return kv_fail(err, KV_ERR_NOMEM, "kv_sampler_init: no memory for %d candidates",
                       vocab_size);
    return KV_OK;
}

void kv_sampler_free(kv_sampler *s)
{
    if (!s) return;
    free(s->scratch);
    s->scratch = NULL;
}

int kv_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i; /* strict: the lowest index wins a tie */
    return best;
}

/* Index drawn from probs [n] (summing to ~1) with the uniform number r in [0, 1). */
static int sample_cdf(const float *probs, int n, float r)
{
    float cdf = 0.0f;
    int last = 0;
    for (int i = 0; i < n; i++) {
        cdf += probs[i];
        if (r < cdf) return i;
        if (probs[i] > 0.0f) last = i;
    }
    return last; /* r landed in the rounding gap above the final cdf: the last token that can
                  * be drawn, never one of probability 0 (a -inf logit) */
}

/* Larger probability first; equal probabilities by index, so the order is fully determined
 * (qsort is not stable). */
static int by_prob_desc(const void *a, const void *b)
{
    const prob_index *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return x->index - y->index;
}

/* The (prob, index) pairs of @p probs [n] with prob >= @p cutoff into @p cand; their count. */
static int keep_from(const float *probs, int n, float cutoff, prob_index *cand)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] >= cutoff) {
            cand[m].prob = probs[i];
            cand[m].index = i;
            m++;
        }
    return m;
}

/*
 * Nucleus sampling: keep the most probable tokens whose mass first reaches top_p, renormalize,
 * draw. Sorting the whole vocabulary is the slow part, so tokens that cannot be in the nucleus
 * are dropped first: if every dropped token has prob < (1 - top_p)/(n - 1), at most n - 1 of
 * them weigh < 1 - top_p together, so the kept ones already hold more than top_p and the
 * nucleus (a prefix of the sorted order) lies entirely among them.
 */
static int sample_top_p(const float *probs, int n, float top_p, prob_index *cand, float r)
{
    if (n == 1) return 0;
    /* never a cutoff of 0: a token of probability 0 is never a candidate */
    int m = keep_from(probs, n, fmaxf((1.0f - top_p) / (float)(n - 1), FLT_TRUE_MIN), cand);
    /* the argument needs one token kept: when all n fall below the cutoff (a flat distribution
     * with top_p < 1/n) they may weigh more than 1 - top_p together, so every token that can
     * be drawn is a candidate. The softmax's largest prob is >= 1/n > 0, so m >= 1. */
    if (m == 0) m = keep_from(probs, n, FLT_TRUE_MIN, cand);
    qsort(cand, (size_t)m, sizeof *cand, by_prob_desc);

    /* smallest prefix with mass >= top_p (all candidates if rounding keeps it below) */
    int last = m - 1;
    float mass = 0.0f;
    for (int i = 0; i < m; i++) {
        mass += cand[i].prob;
        if (mass >= top_p) {
            last = i;
            break;
        }
    }
    /* draw within the prefix: r scaled to its mass instead of renormalizing every prob */
    float nucleus = 0.0f;
    for (int i = 0; i <= last; i++) nucleus += cand[i].prob;
    const float target = r * nucleus;
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += cand[i].prob;
        if (target < cdf) return cand[i].index;
    }
    return cand[last].index;
}

int kv_logits_check(const float *logits, int n, kv_err *err)
{
    int finite = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return kv_fail(err, KV_ERR_ARG, "no finite logits: logit %d of %d is %s (the "
                           "model's forward pass overflowed)", i, n,
                           isnan(logits[i]) ? "NaN" : "+inf");
        finite += logits[i] != -INFINITY;
    }
    if (!finite) return kv_fail(err, KV_ERR_ARG, "no finite logits: all %d are -inf", n);
    return KV_OK;
}

int kv_sample(kv_sampler *s, float *logits)
{
    const int n = s->vocab_size;
    if (kv_logits_check(logits, n, NULL)) return -1; /* NaN would order nothing below */
    if (s->temperature == 0.0f) return kv_argmax(logits, n);
    /* (x - max) / T, not x / T: a tiny temperature then sends every other logit to -inf and
     * the largest to 0, where x / T would overflow to inf and the softmax to NaN */
    const float max = logits[kv_argmax(logits, n)];
    for (int i = 0; i < n; i++) logits[i] = (logits[i] - max) / s->temperature;
    kv_softmax(logits, n);
    const float r = kv_rng_float(&s->rng);
    if (s->top_p >= 1.0f) return sample_cdf(logits, n, r);
    return sample_top_p(logits, n, s->top_p, s->scratch, r);
}
