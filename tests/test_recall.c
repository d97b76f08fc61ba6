/* Recall models (issue 4): construction, determinism, checkpoint round trip, and the
 * derivation of docs/recall-models.md checked against the forward pass:
 *  - the previous-token head's positional profile has no near-recurrence up to 128k tokens;
 *  - measured logits of the pure models (noise 0) equal the predicted ones;
 *  - weak models fail exactly where the predicted survival limit n* says;
 *  - a re-positioning bug (keys rotated by the wrong position) breaks the induction model but
 *    not the direct one; swapping cached rows with their rotation does not (attention is a
 *    sum over a set), swapping keys alone does. */
#include "common/kv_test.h"

#include "kv_checkpoint.h"
#include "kv_forward.h"
#include "kv_ops.h"
#include "kv_recall.h"
#include "kv_rng.h"
#include "kv_sampler.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

static kv_recall_vocab V;

/* A haystack: BOS, seeded filler, one fact (key 3 = value 7) at @p at, question at the end.
 * Returns the total length (haystack + question); value position in *value_pos. */
static int haystack(int kind, int n, int at, uint64_t seed, int *tok, int *value_pos)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    tok[0] = V.bos;
    for (int i = 1; i < n; i++) tok[i] = V.filler0 + (int)(kv_rng_u32(&r) % V.n_fillers);
    int nf = kv_recall_fact_tokens(&V, kind, 3, 7, tok + at);
    *value_pos = at + nf - 1;
    return n + kv_recall_question_tokens(&V, kind, 3, tok + n);
}

/* Run tokens[0..n) through a fresh cache in chunks (a chunk boundary at @p cut, where
 * corrupt() may damage the cache), logits of the last token into @p logits. */
typedef void (*corrupt_fn)(kv_cache *c, int len, void *user);

static int run(const kv_model *m, const int *tok, int n, int cut, corrupt_fn corrupt, void *user,
               float *logits)
{
    kv_cache c;
    kv_state s;
    kv_err e;
    kv_cache_spec sp = kv_cache_spec_default(1, n);
    if (kv_cache_create(&c, &m->config, &sp, &e)) {
        printf("cache: %s\n", e.msg);
        return -1;
    }
    kv_state_init(&s);
    int done = 0, rc = 0;
    while (done < n && !rc) {
        int end = done + 512;
        if (cut > done && cut < end) end = cut;
        if (end > n) end = n;
        kv_seq q = {0, done, end - done, tok + done};
        rc = kv_forward(m, &c, &s, &q, 1, end == n ? logits : NULL, NULL, &e);
        if (rc) printf("forward: %s\n", e.msg);
        done = end;
        if (done == cut && corrupt) corrupt(&c, done, user);
    }
    kv_state_free(&s);
    kv_cache_free(&c);
    return rc ? -1 : kv_argmax(logits, m->config.vocab_size);
}

static void test_vocab_and_config(void)
{
    KV_CHECK(V.vocab_size == 3 + 64 + 16 * 3 + 256, "vocab size %d", V.vocab_size);
    char buf[32];
    KV_CHECK(!strcmp(kv_recall_token_name(&V, V.fact0 + 3 * 16 + 7, buf), "k3=v7"), "fact name %s", buf);
    KV_CHECK(!strcmp(kv_recall_token_name(&V, V.key0 + 15, buf), "k15"), "key name %s", buf);
    KV_CHECK(kv_recall_value_of(&V, V.value0 + 9) == 9 && kv_recall_value_of(&V, V.key0) == -1,
             "value_of");
    int t[2];
    KV_CHECK(kv_recall_fact_tokens(&V, KV_MODEL_RECALL_INDUCTION, 3, 7, t) == 2 &&
                 t[0] == V.key0 + 3 && t[1] == V.value0 + 7, "induction fact tokens");
    KV_CHECK(kv_recall_fact_tokens(&V, KV_MODEL_RECALL_DIRECT, 16, 0, t) == -1, "key 16 refused");
    for (int kind = 1; kind <= 2; kind++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind);
        kv_config c;
        kv_err e;
        KV_CHECK(kv_recall_config(&o, &c, &e) == KV_OK, "config kind %d: %s", kind, e.msg);
        KV_CHECK(c.kind == kind && c.n_heads == 2 && c.n_kv_heads == 1 && c.rotary_dim == 32,
                 "config fields");
        o.n_layers = kind == KV_MODEL_RECALL_INDUCTION ? 1 : 0;
        KV_CHECK(kv_recall_config(&o, &c, &e) == KV_ERR_ARG, "too few layers refused");
        kv_recall_opts_default(&o, kind);
        o.beta = -1.0f;
        KV_CHECK(kv_recall_config(&o, &c, &e) == KV_ERR_ARG, "negative beta refused");
    }
}

static void test_determinism_and_checkpoint(void)
{
    for (int kind = 1; kind <= 2; kind++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind);
        kv_model a, b, c, r;
        kv_err e;
        KV_CHECK(kv_recall_build(&a, &o, &e) == KV_OK, "build: %s", e.msg);
        KV_CHECK(kv_recall_build(&b, &o, &e) == KV_OK, "build: %s", e.msg);
        o.seed = 2;
        KV_CHECK(kv_recall_build(&c, &o, &e) == KV_OK, "build: %s", e.msg);
        KV_CHECK(a.n_floats == b.n_floats && !memcmp(a.data, b.data, a.n_floats * sizeof(float)),
                 "same seed, same bytes (kind %d)", kind);
        KV_CHECK(memcmp(a.data, c.data, a.n_floats * sizeof(float)) != 0,
                 "another seed, other bytes (kind %d)", kind);
        KV_CHECK(kv_model_check_finite(&a, &e) == KV_OK, "finite: %s", e.msg);

        char path[64];
        snprintf(path, sizeof path, "test_recall_%d_%d.bin", kind, (int)getpid());
        KV_CHECK(kv_checkpoint_write(path, &a, KV_FILE_KVLAB, &e) == KV_OK, "write: %s", e.msg);
        int rc = kv_checkpoint_read(path, &r, &e);
        KV_CHECK(rc == KV_OK, "read: %s", e.msg);
        if (rc == KV_OK) {
            KV_CHECK(!memcmp(&r.config, &a.config, sizeof a.config), "config round trip");
            KV_CHECK(r.n_floats == a.n_floats &&
                         !memcmp(r.data, a.data, a.n_floats * sizeof(float)),
                     "weights round trip bit for bit");
            kv_model_free(&r);
        }
        KV_CHECK(kv_checkpoint_write(path, &a, KV_FILE_LLAMA2C, &e) == KV_ERR_UNSUPPORTED,
                 "a llama2.c file cannot carry a recall model (kind, theta, rotary)");
        remove(path);
        kv_model_free(&a);
        kv_model_free(&b);
        kv_model_free(&c);
    }
}

/* The previous-token head needs f(delta) well below f(0) = 1 for every offset it can see:
 * incommensurate frequencies nearly recur somewhere, so scan them all. */
static void test_prev_profile(void)
{
    kv_recall_opts o;
    kv_recall_opts_default(&o, KV_MODEL_RECALL_INDUCTION);
    kv_config c;
    kv_recall_config(&o, &c, NULL);
    const long N = 131072;
    double fmax = -2.0;
    long amax = 0;
    for (long delta = 2; delta <= N; delta++) {
        double f = kv_recall_prev_profile(&c, delta);
        if (f > fmax) {
            fmax = f;
            amax = delta;
        }
    }
    const double f1 = kv_recall_prev_profile(&c, 1), fm1 = kv_recall_prev_profile(&c, -1);
    printf("prev-token profile: f(0) %.4f, f(+-1) %.4f, max over 2..%ld %.4f at %ld\n",
           kv_recall_prev_profile(&c, 0), f1, N, fmax, amax);
    KV_CHECK(fabs(kv_recall_prev_profile(&c, 0) - 1.0) < 1e-12, "f(0) = 1");
    KV_CHECK(f1 < 0.75 && fm1 < 0.75, "neighbours f(+-1) = %.4f < 0.75", f1);
    KV_CHECK(fmax < 0.75, "no offset up to %ld comes within 0.25 of the peak (max %.4f at %ld)",
             N, fmax, amax);
    const double w1 = kv_recall_prev_weight(&o, &c, (int)N);
    printf("predicted previous-token weight at position %ld: %.6f\n", N, w1);
    KV_CHECK(w1 > 0.999, "previous-token weight at 128k = %.6f > 0.999", w1);
}

/* Pure models (noise 0): measured logits equal the derivation's. Weak models (small beta)
 * pass below the predicted survival limit n* and fail above it. */
static void test_prediction(void)
{
    static int tok[4200];
    float *logits = malloc(sizeof(float) * V.vocab_size);
    for (int kind = 1; kind <= 2; kind++)
        for (int weak = 0; weak <= 1; weak++) {
            kv_recall_opts o;
            kv_recall_opts_default(&o, kind);
            o.noise = 0.0f;
            if (weak) { /* n* ~ e^7 ~ 1100 attended positions */
                o.beta = 7.0f;
                o.beta_sink = 3.0f;
            }
            kv_model m;
            kv_err e;
            if (kv_recall_build(&m, &o, &e)) {
                KV_CHECK(0, "build: %s", e.msg);
                continue;
            }
            const int lens[] = {256, 700, 1600, 3000};
            kv_recall_prediction p0;
            kv_recall_predict(&o, &m.config, 1000, 300, &p0);
            for (int li = 0; li < 4; li++) {
                int vp, n = haystack(kind, lens[li], lens[li] / 3, 7 + li, tok, &vp);
                int ans = run(&m, tok, n, -1, NULL, NULL, logits);
                kv_recall_prediction p;
                kv_recall_predict(&o, &m.config, n, vp, &p);
                const int want = V.value0 + 7;
                const int predicted_pass = n < p.n_star;
                printf("%-9s beta %4.1f N %5d: logit %.5f (predicted %.5f), ok %.5f (%.5f), "
                       "n* %.0f -> %s\n", kv_recall_kind_name(kind), o.beta, n, logits[want],
                       p.logit, logits[V.ack], p.logit_ack, p.n_star,
                       ans == want ? "pass" : "fail");
                KV_CHECK(fabs(logits[want] - p.logit) <= 1e-3 * fabs(p.logit) + 1e-4,
                         "%s N %d: answer logit %.6f vs predicted %.6f",
                         kv_recall_kind_name(kind), n, logits[want], p.logit);
                KV_CHECK(fabs(logits[V.ack] - p.logit_ack) <= 1e-3 * p.logit_ack,
                         "ok logit %.6f vs predicted %.6f", logits[V.ack], p.logit_ack);
                KV_CHECK((ans == want) == predicted_pass,
                         "%s beta %.1f N %d: %s but n* = %.0f predicts %s",
                         kv_recall_kind_name(kind), o.beta, n, ans == want ? "pass" : "fail",
                         p.n_star, predicted_pass ? "pass" : "fail");
                if (!predicted_pass)
                    KV_CHECK(ans == V.ack, "below threshold the reply is 'ok', got %d", ans);
                if (!weak) break; /* strong models: one length is enough here */
            }
            if (weak)
                KV_CHECK(p0.n_star > 700 && p0.n_star < 1600, "weak n* %.0f lies between the "
                         "lengths tested", p0.n_star);
            kv_model_free(&m);
        }
    free(logits);
}

/* Other depths: the retrieval path works with the fewest layers it needs and with more. */
static void test_depths(void)
{
    static int tok[200];
    float *logits = malloc(sizeof(float) * V.vocab_size);
    const int layers[][2] = {{KV_MODEL_RECALL_DIRECT, 1}, {KV_MODEL_RECALL_INDUCTION, 2},
                             {KV_MODEL_RECALL_DIRECT, 7}, {KV_MODEL_RECALL_INDUCTION, 7}};
    for (int i = 0; i < 4; i++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, layers[i][0]);
        o.n_layers = layers[i][1];
        kv_model m;
        kv_err e;
        if (kv_recall_build(&m, &o, &e)) {
            KV_CHECK(0, "build L %d: %s", o.n_layers, e.msg);
            continue;
        }
        int vp, n = haystack(o.kind, 180, 40, 11, tok, &vp);
        int ans = run(&m, tok, n, -1, NULL, NULL, logits);
        KV_CHECK(ans == V.value0 + 7, "%s model with L = %d answers v7 (got %d)",
                 kv_recall_kind_name(o.kind), o.n_layers, ans);
        kv_model_free(&m);
    }
    free(logits);
}

/* ---- position damage -------------------------------------------------------------------- */

typedef struct {
    int layer, delta;      /* re-rotate keys of this layer by delta positions */
    int swap_a, swap_b;    /* swap rows a and b (both < len) */
    int swap_v;            /* 1: swap V too (with K); 0: K only */
    int rotary_dim;
    const double *freq;    /* [rotary_dim/2] the model's RoPE frequencies */
} damage;

static void rerotate(kv_cache *c, int len, void *user)
{
    const damage *d = user;
    const int dd = d->delta;
    for (int p = 0; p < len; p++) {
        float *k = kv_cache_k(c, d->layer, 0, 0) + (size_t)p * c->head_dim; /* [d] */
        /* RoPE composes: rotating a key stored at p by delta = writing it at p + delta */
        kv_rope(k, &dd, 1, 1, c->head_dim, d->rotary_dim, d->freq);
    }
}

static void swap_rows(kv_cache *c, int len, void *user)
{
    (void)len;
    const damage *d = user;
    const int hd = c->head_dim;
    float *k = kv_cache_k(c, d->layer, 0, 0), *v = kv_cache_v(c, d->layer, 0, 0);
    for (int i = 0; i < hd; i++) {
        float t = k[(size_t)d->swap_a * hd + i];
        k[(size_t)d->swap_a * hd + i] = k[(size_t)d->swap_b * hd + i];
        k[(size_t)d->swap_b * hd + i] = t;
        if (d->swap_v) {
            t = v[(size_t)d->swap_a * hd + i];
            v[(size_t)d->swap_a * hd + i] = v[(size_t)d->swap_b * hd + i];
            v[(size_t)d->swap_b * hd + i] = t;
        }
    }
}

static void test_position_damage(void)
{
    static int tok[600];
    float *logits = malloc(sizeof(float) * V.vocab_size);
    const int want = V.value0 + 7, at = 200;
    for (int kind = 1; kind <= 2; kind++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind); /* the default, noisy model */
        kv_model m;
        kv_err e;
        if (kv_recall_build(&m, &o, &e)) {
            KV_CHECK(0, "build: %s", e.msg);
            continue;
        }
        int prev, ret;
        kv_recall_layers(kind, o.n_layers, &prev, &ret);
        double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] the model's */
        kv_rope_freqs(&m.config, freq);
        /* the layer whose keys carry position: the previous-token layer (induction); for
         * direct, the retrieval layer (its match ignores position) */
        const int layer = kind == KV_MODEL_RECALL_INDUCTION ? prev : ret;
        int vp, n = haystack(kind, 500, at, 3, tok, &vp);
        /* the cut: after the fact's first token (induction: k3 is cached, v3 not yet) */
        const int cut = at + 1;
        /* -1 is printed, not asserted: shifting the fact's key one step toward the query
         * ties it with the query's own key (offsets +1 and -1 score alike, f is even), so
         * half of the previous-token weight survives and the outcome rides on the noise */
        const int deltas[] = {0, 1, 2, -2, 5, 300, -1};
        for (int i = 0; i < 7; i++) {
            damage d = {layer, deltas[i], 0, 0, 0, m.config.rotary_dim, freq};
            int ans = run(&m, tok, n, cut, rerotate, &d, logits);
            const int expect_pass = kind == KV_MODEL_RECALL_DIRECT || deltas[i] == 0;
            printf("%-9s cache keys of layer %d re-positioned by %+4d: answer %s (margin %.3f)\n",
                   kv_recall_kind_name(kind), layer, deltas[i], ans == want ? "right" : "lost",
                   logits[want] - logits[V.ack]);
            if (deltas[i] != -1)
            KV_CHECK((ans == want) == expect_pass, "%s, keys shifted by %d: %s, predicted %s",
                     kv_recall_kind_name(kind), deltas[i], ans == want ? "pass" : "fail",
                     expect_pass ? "pass" : "fail");
        }
        if (kind == KV_MODEL_RECALL_INDUCTION) {
            /* swap the fact's key token with the filler before it, in the previous-token
             * layer, before the value token reads them */
            damage both = {layer, 0, at, at - 1, 1, 0, NULL};
            damage konly = {layer, 0, at, at - 1, 0, 0, NULL};
            int a1 = run(&m, tok, n, cut, swap_rows, &both, logits);
            KV_CHECK(a1 == want, "swapping K and V rows together keeps the answer (attention "
                     "reads the rotation stored in K, not the row index): got %d", a1);
            int a2 = run(&m, tok, n, cut, swap_rows, &konly, logits);
            KV_CHECK(a2 != want, "swapping K rows alone (K and V out of step) loses the answer");
        }
        kv_model_free(&m);
    }
    free(logits);
}

int main(void)
{
    kv_recall_vocab_get(&V);
    double t0 = kv_now();
    test_vocab_and_config();
    test_determinism_and_checkpoint();
    test_prev_profile();
    test_prediction();
    test_depths();
    test_position_damage();
    printf("test_recall: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
