/* The sampler (kv_sampler.h): greedy is argmax, temperature sampling follows the softmax,
 * top-p stays inside the nucleus, a seed fixes the draws, bad parameters are refused.
 *
 * Statistical checks: with N draws, a token of probability p is counted N·p ± sqrt(N·p(1-p))
 * (binomial). Each frequency must lie within 5 standard deviations of its probability; for a
 * correct sampler that fails with probability < 6e-7 per token, and the seed is fixed, so the
 * test is deterministic. A wrong temperature or a missing renormalization moves frequencies
 * by far more than 5 sigma at N = 200000. */
#include "kv_sampler.h"
#include "common/kv_test.h"

#include <math.h>
#include <string.h>

#define N_DRAWS 200000

static void test_init_rejects(void)
{
    kv_sampler s;
    kv_err e;
    const float bad_t[3] = {-0.5f, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        int rc = kv_sampler_init(&s, 10, bad_t[i], 1.0f, 1, &e);
        KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "temperature"), "temperature %g refused: %s",
                 (double)bad_t[i], rc ? e.msg : "accepted");
        kv_sampler_free(&s);
    }
    const float bad_p[4] = {0.0f, -0.1f, 1.5f, NAN};
    for (int i = 0; i < 4; i++) {
        int rc = kv_sampler_init(&s, 10, 1.0f, bad_p[i], 1, &e);
        KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "top_p"), "top_p %g refused: %s",
                 (double)bad_p[i], rc ? e.msg : "accepted");
        kv_sampler_free(&s);
    }
    int rc = kv_sampler_init(&s, 0, 1.0f, 1.0f, 1, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "vocab"), "vocab 0 refused");
    kv_sampler_free(&s);
}

static void test_greedy(void)
{
    kv_rng r;
    kv_rng_seed(&r, 7);
    kv_sampler s;
    KV_CHECK(kv_sampler_init(&s, 300, 0.0f, 0.9f, 1, NULL) == 0, "greedy init");
    for (int trial = 0; trial < 20; trial++) {
        float logits[300];
        int best = 0;
        for (int i = 0; i < 300; i++) {
            logits[i] = kv_rng_normal(&r);
            if (logits[i] > logits[best]) best = i;
        }
        KV_CHECK(kv_argmax(logits, 300) == best, "argmax");
        KV_CHECK(kv_sample(&s, logits) == best, "temperature 0 samples the argmax");
    }
    const float tie[5] = {1, 3, 2, 3, 3};
    KV_CHECK(kv_argmax(tie, 5) == 1, "argmax takes the lowest index on a tie");
    kv_sampler_free(&s);
}

/* Frequencies of N_DRAWS draws vs probabilities p [n]; returns tokens outside 5 sigma. */
static int freq_mismatches(const char *what, const int *count, const double *p, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        double f = (double)count[i] / N_DRAWS, sigma = sqrt(p[i] * (1 - p[i]) / N_DRAWS);
        if (fabs(f - p[i]) > 5 * sigma + 1e-12) {
            printf("  %s: token %d drawn with frequency %.5f, probability %.5f (5 sigma %.5f)\n",
                   what, i, f, p[i], 5 * sigma);
            bad++;
        }
    }
    return bad;
}

static void test_temperature(void)
{
    const float logits0[6] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.0f};
    const float temps[2] = {0.8f, 2.0f};
    for (int ti = 0; ti < 2; ti++) {
        const float temp = temps[ti];
        double p[6], sum = 0;
        for (int i = 0; i < 6; i++) sum += (p[i] = exp((double)logits0[i] / temp));
        for (int i = 0; i < 6; i++) p[i] /= sum;
        kv_sampler s;
        KV_CHECK(kv_sampler_init(&s, 6, temp, 1.0f, 42, NULL) == 0, "init");
        int count[6] = {0};
        for (int k = 0; k < N_DRAWS; k++) {
            float logits[6];
            memcpy(logits, logits0, sizeof logits);
            count[kv_sample(&s, logits)]++;
        }
        KV_CHECK(freq_mismatches("temperature", count, p, 6) == 0,
                 "temperature %g: frequencies follow softmax(logits / T)", (double)temp);
        kv_sampler_free(&s);
    }
}

/* Probabilities 0.4, 0.2, 0.15, 0.1, 0.05, then 0.1 spread over 95 tokens: with top_p 0.7
 * the nucleus is {0, 1, 2} (mass 0.75; 0.6 before token 2 is short of 0.7). */
static void test_top_p(void)
{
    enum { V = 100 };
    float logits0[V];
    const double head[5] = {0.4, 0.2, 0.15, 0.1, 0.05};
    for (int i = 0; i < V; i++) logits0[i] = (float)log(i < 5 ? head[i] : 0.1 / 95);
    kv_sampler s;
    KV_CHECK(kv_sampler_init(&s, V, 1.0f, 0.7f, 99, NULL) == 0, "init");
    int count[V] = {0};
    for (int k = 0; k < N_DRAWS; k++) {
        float logits[V];
        memcpy(logits, logits0, sizeof logits);
        count[kv_sample(&s, logits)]++;
    }
    int outside = 0;
    for (int i = 3; i < V; i++) outside += count[i];
    KV_CHECK(outside == 0, "top-p 0.7: %d draws outside the nucleus {0, 1, 2}", outside);
    const double p[3] = {0.4 / 0.75, 0.2 / 0.75, 0.15 / 0.75}; /* renormalized nucleus */
    KV_CHECK(freq_mismatches("top-p", count, p, 3) == 0, "top-p: frequencies renormalized");
    kv_sampler_free(&s);

    /* a wide, flat vocabulary (most tokens fall below the (1-p)/(n-1) pre-filter): every
     * draw must come from the smallest prefix of the sorted probabilities with mass >= p */
    enum { W = 4000 };
    static float wl[W], work[W];
    kv_rng r;
    kv_rng_seed(&r, 5);
    for (int i = 0; i < W; i++) wl[i] = 3.0f * kv_rng_normal(&r);
    const float top_p = 0.9f;
    double prob[W], mx = -INFINITY, sum = 0;
    for (int i = 0; i < W; i++) mx = fmax(mx, wl[i]);
    for (int i = 0; i < W; i++) sum += (prob[i] = exp(wl[i] - mx));
    for (int i = 0; i < W; i++) prob[i] /= sum;
    /* threshold: the nucleus is every token at least as probable as the k-th most probable,
     * where k is the first count whose mass reaches top_p; found by repeated max selection */
    static char in[W];
    memset(in, 0, sizeof in);
    double mass = 0, thresh = 0;
    while (mass < top_p) {
        int best = -1;
        for (int i = 0; i < W; i++)
            if (!in[i] && (best < 0 || prob[i] > prob[best])) best = i;
        in[best] = 1;
        mass += prob[best];
        thresh = prob[best];
    }
    int nucleus = 0;
    for (int i = 0; i < W; i++) nucleus += in[i];
    KV_CHECK(kv_sampler_init(&s, W, 1.0f, top_p, 3, NULL) == 0, "init");
    int outside_w = 0;
    for (int k = 0; k < 20000; k++) {
        memcpy(work, wl, sizeof work);
        const int t = kv_sample(&s, work);
        /* a token exactly at the threshold is the float-rounding edge: only clearly smaller
         * probabilities are counted as outside */
        if (!in[t] && prob[t] < thresh * (1 - 1e-4)) outside_w++;
    }
    KV_CHECK(outside_w == 0, "top-p %g over %d tokens (nucleus %d): %d draws outside",
             (double)top_p, W, nucleus, outside_w);
    kv_sampler_free(&s);
}

static void test_seeded(void)
{
    kv_sampler a, b, c;
    KV_CHECK(kv_sampler_init(&a, 50, 1.0f, 0.95f, 2024, NULL) == 0, "init");
    KV_CHECK(kv_sampler_init(&b, 50, 1.0f, 0.95f, 2024, NULL) == 0, "init");
    KV_CHECK(kv_sampler_init(&c, 50, 1.0f, 0.95f, 2025, NULL) == 0, "init");
    kv_rng r;
    kv_rng_seed(&r, 1);
    float base[50];
    for (int i = 0; i < 50; i++) base[i] = kv_rng_normal(&r);
    int same_ab = 1, same_ac = 1;
    for (int k = 0; k < 1000; k++) {
        float la[50], lb[50], lc[50];
        memcpy(la, base, sizeof la), memcpy(lb, base, sizeof lb), memcpy(lc, base, sizeof lc);
        int ta = kv_sample(&a, la), tb = kv_sample(&b, lb), tc = kv_sample(&c, lc);
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    KV_CHECK(same_ab, "same seed, same 1000 tokens");
    KV_CHECK(!same_ac, "a different seed gives a different sequence");
    kv_sampler_free(&a), kv_sampler_free(&b), kv_sampler_free(&c);

    /* huge logits: the max shift keeps the softmax finite, and the top token dominates */
    kv_sampler s;
    KV_CHECK(kv_sampler_init(&s, 4, 1.0f, 1.0f, 9, NULL) == 0, "init");
    float big[4] = {1e4f, 1e4f - 100.0f, -1e4f, 0.0f};
    KV_CHECK(kv_sample(&s, big) == 0, "logits near 1e4 sample the dominant token");
    kv_sampler_free(&s);
}

int main(void)
{
    test_init_rejects();
    test_greedy();
    test_temperature();
    test_top_p();
    test_seeded();
    return kv_test_finish();
}
