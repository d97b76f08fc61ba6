/* Chapter 10 on the CPU: speculative decoding and cache rollback.
 *
 * Predicted before measured:
 *  - all_logits: a chunk's row j is computed exactly as a one-token step at that position (each
 *    row alone, same order), so the rows equal one-token-at-a-time logits bit for bit;
 *  - greedy speculation emits exactly the target's greedy tokens for every k, because a draft
 *    token is kept only when it is the target's argmax at its position, and those logits are
 *    bit-identical to the plain run's; after each rollback the cache holds the rows a plain
 *    run holds (same bytes, same length) and a paged pool holds exactly the blocks those rows
 *    need, none after a reset;
 *  - with sampling the first emitted token follows the target's softmax whatever the draft:
 *    a chi-square test over a vocabulary of 8 (7 degrees of freedom) at 40000 trials with a
 *    fixed seed. Threshold 24.32, the 0.999 quantile of chi-square(7): a correct rule fails it
 *    with probability 0.001 for a random seed, and the fixed seed makes the result repeatable.
 *    The test's power is checked too: always keeping the draft's token would give an expected
 *    statistic far above the threshold.
 *  - windowed and KIVI caches roll back through their undo log (test_spec_window checks the
 *    bytes); cutting into a
 *    block the prefix cache registered, and kv_spec_generate refuses a backend without the
 *    truncate hook. */
#include "common/kv_test.h"
#include "common/test_spec_common.h"

#include "kv_generate.h"
#include "kv_spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define P 7   /* prompt tokens */
#define N 40  /* tokens to emit */
#define CAP 64
#define C 5   /* all_logits: a decode chunk after the prompt */

static const int PROMPT[P] = {17, 301, 5, 88, 240, 17, 9};

static kv_cache_spec make_spec(int paged, int dtype)
{
    return spec_cache_spec(paged, dtype, CAP, 8);
}

/* ---- all_logits rows == one-token steps, bit for bit ----------------------------------- */

static void test_all_logits(const kv_model *m, const kv_cache_spec *spec, const char *what)
{
    kv_err e;
    kv_backend *a = NULL, *b = NULL;
    const int V = m->config.vocab_size; /* a prompt chunk, then a C-token chunk */
    float *rows = malloc(sizeof(float) * (size_t)P * V), *one = malloc(sizeof(float) * V);
    float *last = malloc(sizeof(float) * V);
    int ok = kv_backend_cpu(&a, m, spec, &e) == KV_OK && kv_backend_cpu(&b, m, spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: backends: %s", what, e.msg);
    if (!ok) goto done;
    int tok[P + C];
    memcpy(tok, PROMPT, sizeof PROMPT);
    for (int j = 0; j < C; j++) tok[P + j] = (31 * j + 7) % V;
    long bad = 0, bad_last = 0;
    for (int chunk = 0; chunk < 2; chunk++) {
        const int pos = chunk ? P : 0, n = chunk ? C : P;
        const kv_seq s = {0, pos, n, tok + pos, rows};
        ok = a->forward(a, &s, 1, last, NULL, &e) == KV_OK;
        KV_CHECK(ok, "%s: chunk forward: %s", what, e.msg);
        if (!ok) goto done;
        bad_last += memcmp(last, rows + (size_t)(n - 1) * V, sizeof(float) * V) != 0;
        for (int j = 0; j < n; j++) {
            const kv_seq t = {0, pos + j, 1, tok + pos + j};
            ok = b->forward(b, &t, 1, one, NULL, &e) == KV_OK;
            KV_CHECK(ok, "%s: one-token forward: %s", what, e.msg);
            if (!ok) goto done;
            bad += memcmp(one, rows + (size_t)j * V, sizeof(float) * V) != 0;
        }
    }
    KV_CHECK(bad == 0, "%s: %ld all_logits rows differ from one-token steps", what, bad);
    KV_CHECK(bad_last == 0, "%s: the last all_logits row differs from logits", what);
done:
    kv_backend_destroy(a);
    kv_backend_destroy(b);
    free(rows);
    free(one);
    free(last);
}

/* ---- greedy: the target's tokens, the plain run's cache --------------------------------- */

static void test_greedy(const kv_model *m, const kv_model *dm, int paged, int dtype)
{
    kv_err e;
    char what[64];
    snprintf(what, sizeof what, "greedy %s %s", paged ? "paged" : "contiguous",
             kv_dtype_name(dtype));
    const kv_cache_spec spec = make_spec(paged, dtype);
    kv_backend *plain = NULL, *t = NULL, *d = NULL;
    int ok = kv_backend_cpu(&plain, m, &spec, &e) == KV_OK &&
             kv_backend_cpu(&t, m, &spec, &e) == KV_OK && kv_backend_cpu(&d, dm, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: backends: %s", what, e.msg);
    if (!ok) goto done;
    int want[N], got[N];
    const kv_gen_opts go = {KV_MODE_CACHED, 0, N, NULL, NULL, NULL, NULL};
    ok = kv_generate(plain, PROMPT, P, &go, want, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: plain run: %s", what, e.msg);
    if (!ok) goto done;
    const int L = plain->length(plain, 0);
    KV_CHECK(L == P + N - 1, "%s: plain run caches %d tokens, expected %d", what, L, P + N - 1);
    int64_t accepted = 0;
    for (int k = 1; k <= 8; k++) {
        const kv_spec_opts o = {k, N, 0, 0.0f, 1};
        kv_spec_stats st;
        ok = kv_spec_generate(t, d, PROMPT, P, &o, got, &st, &e) == KV_OK;
        KV_CHECK(ok, "%s k=%d: %s", what, k, e.msg);
        if (!ok) break;
        KV_CHECK(memcmp(got, want, sizeof want) == 0, "%s k=%d: tokens differ from greedy", what, k);
        KV_CHECK(t->length(t, 0) == L, "%s k=%d: target caches %d tokens, plain %d", what, k,
                 t->length(t, 0), L);
        KV_CHECK(d->length(d, 0) <= L, "%s k=%d: draft caches %d > %d", what, k, d->length(d, 0), L);
        const long bad = rows_differ(kv_backend_cpu_cache(t), kv_backend_cpu_cache(plain), L);
        KV_CHECK(bad == 0, "%s k=%d: %ld kept rows/elements differ from the plain run", what, k, bad);
        /* written minus rolled back is exactly what stays cached */
        const double tb = st.target_kv_written - st.target_kv_rolled_back;
        const double per = st.target_kv_written / (double)st.target.tokens;
        KV_CHECK(fabs(tb - L * per) <= 1e-6 * tb, "%s k=%d: written %.0f - rolled back %.0f != "
                 "%d cached tokens' %.0f", what, k, st.target_kv_written,
                 st.target_kv_rolled_back, L, L * per);
        KV_CHECK(st.emitted == N && st.accepted <= st.drafted &&
                 st.target_steps + st.accepted == N,
                 "%s k=%d: emitted %lld, accepted %lld of %lld, %lld target steps", what, k,
                 (long long)st.emitted, (long long)st.accepted, (long long)st.drafted,
                 (long long)st.target_steps);
        if (k > 1) KV_CHECK(st.target_kv_rolled_back > 0 || st.accepted == st.drafted,
                            "%s k=%d: rejections but nothing rolled back", what, k);
        accepted += st.accepted;
        if (paged) { /* exactly the blocks the cached rows need, in each pool */
            const int need = (L + spec.layout.block_size - 1) / spec.layout.block_size;
            const int dneed = (d->length(d, 0) + spec.layout.block_size - 1) / spec.layout.block_size;
            KV_CHECK(t->mem->paged->pool.n_used == need && d->mem->paged->pool.n_used == dneed,
                     "%s k=%d: pools hold %d and %d blocks, the rows need %d and %d", what, k,
                     t->mem->paged->pool.n_used, d->mem->paged->pool.n_used, need, dneed);
        }
    }
    KV_CHECK(accepted > 0, "%s: the draft never agreed: the rollback path alone was tested", what);
    if (paged) {
        t->reset(t, 0);
        d->reset(d, 0);
        KV_CHECK(t->mem->paged->pool.n_used == 0 && d->mem->paged->pool.n_used == 0,
                 "%s: blocks leaked after reset (%d, %d)", what, t->mem->paged->pool.n_used,
                 d->mem->paged->pool.n_used);
    }
done:
    kv_backend_destroy(plain);
    kv_backend_destroy(t);
    kv_backend_destroy(d);
}

/* ---- sampling: the target's distribution, whatever the draft ---------------------------- */

#define SV 8          /* vocabulary */
#define TRIALS 40000
#define CHI2_7_999 24.32 /* 0.999 quantile of chi-square with 7 degrees of freedom */

#define TEMP 2.0f /* flattens this model's peaked logits so every bin expects >= 5 counts */

static void softmax(double *p, const float *l, int n)
{
    double mx = l[0], z = 0;
    for (int i = 1; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < n; i++) z += p[i] = exp((l[i] - mx) / (double)TEMP);
    for (int i = 0; i < n; i++) p[i] /= z;
}

static void test_sampling(int k)
{
    kv_err e;
    const kv_config c = {16, 32, 2, 2, 2, SV, 32, 10000.0f, 8, 1e-5f, 0, KV_MODEL_GENERIC,
                         KV_ATTN_GQA, {0}};
    kv_model m = {0}, dm;
    kv_backend *t = NULL, *d = NULL;
    int ok = kv_model_alloc(&m, &c, &e) == KV_OK;
    KV_CHECK(ok, "sampling: model: %s", e.msg);
    if (!ok) return;
    kv_model_randomize(&m, 77);
    const kv_cache_spec spec = kv_cache_spec_default(1, 32);
    ok = kv_model_layer_prefix(&dm, &m, 1, &e) == KV_OK &&
         kv_backend_cpu(&t, &m, &spec, &e) == KV_OK && kv_backend_cpu(&d, &dm, &spec, &e) == KV_OK;
    KV_CHECK(ok, "sampling: backends: %s", e.msg);
    if (!ok) goto done;
    const int prompt[3] = {1, 5, 2};
    float lt[SV], ld[SV];
    double p[SV], q[SV];
    const kv_seq s = {0, 0, 3, prompt};
    ok = t->forward(t, &s, 1, lt, NULL, &e) == KV_OK && d->forward(d, &s, 1, ld, NULL, &e) == KV_OK;
    KV_CHECK(ok, "sampling: reference logits: %s", e.msg);
    if (!ok) goto done;
    softmax(p, lt, SV);
    softmax(q, ld, SV);
    long count[SV] = {0};
    int out[9];
    const kv_spec_opts o0 = {k, k + 1, 0, TEMP, 0};
    for (int i = 0; i < TRIALS && ok; i++) {
        kv_spec_opts o = o0;
        o.seed = 1000 + (uint64_t)i;
        ok = kv_spec_generate(t, d, prompt, 3, &o, out, NULL, &e) == KV_OK;
        if (ok) count[out[0]]++;
    }
    KV_CHECK(ok, "sampling k=%d: %s", k, e.msg);
    double chi = 0, power = 0, emin = TRIALS;
    for (int v = 0; v < SV; v++) {
        const double E = TRIALS * p[v];
        chi += (count[v] - E) * (count[v] - E) / E;
        power += TRIALS * (q[v] - p[v]) * (q[v] - p[v]) / p[v]; /* E[chi2] - df, keeping q */
        if (E < emin) emin = E;
    }
    KV_CHECK(emin >= 5, "sampling: a bin expects %.1f < 5 counts: chi-square does not apply", emin);
    KV_CHECK(power > 4 * CHI2_7_999, "sampling: the draft is too close to the target (%.1f): "
             "the test could not tell the rule from keeping every draft", power);
    KV_CHECK(chi < CHI2_7_999, "sampling k=%d: chi-square %.2f >= %.2f over %d trials", k, chi,
             CHI2_7_999, TRIALS);
    printf("sampling k=%d: chi-square %.2f (threshold %.2f, always-accept would give ~%.0f)\n",
           k, chi, CHI2_7_999, power + SV - 1);
done:
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    kv_model_free(&m);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void test_refusals(const kv_model *m, const kv_model *dm)
{
    kv_err e;
    kv_cache_spec w = kv_cache_spec_default(1, CAP);
    w.window.size = 16;
    kv_cache_spec kivi = kv_cache_spec_default(1, CAP);
    kivi.quant.dtype = KV_QF_INT4_KIVI;
    kivi.quant.kivi_window = 32;
    const kv_cache_spec *specs[2] = {&w, &kivi};
    for (int i = 0; i < 2; i++) {
        kv_backend *t = NULL, *d = NULL;
        kv_model wide = {0};
        const kv_model *tm = m, *dmm = dm;
        kv_model wd;
        if (i == 1) { /* KIVI needs 32 | d: a d = 32 twin of tiny */
            kv_config c = m->config;
            c.n_heads = 2;
            c.n_kv_heads = 2;
            c.rotary_dim = 32;
            if (kv_model_alloc(&wide, &c, &e) != KV_OK) {
                KV_CHECK(0, "kivi model: %s", e.msg);
                continue;
            }
            kv_model_randomize(&wide, 5);
            kv_model_layer_prefix(&wd, &wide, 1, NULL);
            tm = &wide;
            dmm = &wd;
        }
        int ok = kv_backend_cpu(&t, tm, specs[i], &e) == KV_OK &&
                 kv_backend_cpu(&d, dmm, specs[i], &e) == KV_OK;
        KV_CHECK(ok, "refusal %d: backends: %s", i, e.msg);
        if (ok) {
            int out[4];
            const kv_spec_opts o = {3, 4, 0, 0.0f, 1};
            const int rc = kv_spec_generate(t, d, PROMPT, P, &o, out, NULL, &e);
            KV_CHECK(rc == KV_OK, "%s: kv_spec_generate returned %d: %s (the undo log rolls "
                     "them back; test_spec_window checks the bytes)", i ? "kivi" : "window", rc,
                     e.msg);
        }
        kv_backend_destroy(t);
        kv_backend_destroy(d);
        kv_model_free(&wide);
    }
    /* a backend without the hook, and bad arguments */
    kv_backend *t = NULL, *d = NULL;
    const kv_cache_spec s = kv_cache_spec_default(1, CAP);
    if (kv_backend_cpu(&t, m, &s, &e) == KV_OK && kv_backend_cpu(&d, dm, &s, &e) == KV_OK) {
        int out[N];
        kv_spec_opts o = {0, 4, 0, 0.0f, 1};
        KV_CHECK(kv_spec_generate(t, d, PROMPT, P, &o, out, NULL, &e) == KV_ERR_ARG, "k = 0 accepted");
        o.k = 2;
        o.n_tokens = CAP;
        KV_CHECK(kv_spec_generate(t, d, PROMPT, P, &o, out, NULL, &e) == KV_ERR_CAPACITY,
                 "capacity overflow accepted");
        o.n_tokens = 4;
        d->rollback = NULL;
        KV_CHECK(kv_spec_generate(t, d, PROMPT, P, &o, out, NULL, &e) == KV_ERR_UNSUPPORTED,
                 "a backend without truncate accepted");
        KV_CHECK(t->rollback->truncate(t, 0, 1, &e) == KV_ERR_ARG,
                 "truncate past the length accepted");
        KV_CHECK(kv_model_layer_prefix(&(kv_model){0}, m, 3, &e) == KV_ERR_ARG,
                 "a 3-layer prefix of a 2-layer model accepted");
    }
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    /* a block the prefix cache registered holds exactly its tokens: no cutting into it */
    kv_cache_spec ps = make_spec(1, KV_DTYPE_F32);
    t = NULL;
    if (kv_backend_cpu(&t, m, &ps, &e) == KV_OK && kv_backend_enable_prefix_cache(t, &e) == KV_OK) {
        const kv_seq s = {0, 0, P, PROMPT}; /* P = 7 < B: no full block yet */
        const kv_seq s2 = {0, P, 2, PROMPT}; /* 9 tokens: block 0 is full and registered */
        KV_CHECK(t->forward(t, &s, 1, NULL, NULL, &e) == KV_OK &&
                 t->forward(t, &s2, 1, NULL, NULL, &e) == KV_OK, "prefix: %s", e.msg);
        KV_CHECK(t->rollback->truncate(t, 0, 8, &e) == KV_OK,
                 "prefix: truncating after the registered block refused: %s", e.msg);
        KV_CHECK(t->rollback->truncate(t, 0, 5, &e) == KV_ERR_UNSUPPORTED,
                 "prefix: cutting into a registered block accepted");
        KV_CHECK(t->length(t, 0) == 8, "prefix: a refused truncate changed the length to %d",
                 t->length(t, 0));
    } else {
        KV_CHECK(0, "prefix backend: %s", e.msg);
    }
    kv_backend_destroy(t);
}

int main(void)
{
    kv_err e;
    kv_model m = {0}, dm;
    if (kv_model_default(&m, KV_DEFAULT_TINY, &e) || kv_model_layer_prefix(&dm, &m, 1, &e)) {
        fprintf(stderr, "model: %s\n", e.msg);
        return 1;
    }
    for (int paged = 0; paged < 2; paged++)
        for (int q = 0; q < 2; q++) {
            const kv_cache_spec s = make_spec(paged, q ? KV_QF_INT8 : KV_DTYPE_F32);
            test_all_logits(&m, &s, paged ? (q ? "paged int8" : "paged fp32")
                                           : (q ? "contiguous int8" : "contiguous fp32"));
            test_greedy(&m, &dm, paged, q ? KV_QF_INT8 : KV_DTYPE_F32);
        }
    test_refusals(&m, &dm);
    test_sampling(1);
    test_sampling(4);
    kv_model_free(&m);
    return kv_test_finish();
}
