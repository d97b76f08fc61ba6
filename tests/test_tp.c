/* Chapter 10 on the CPU: tensor-parallel heads (reference_cpu/engine/kv_tp.h).
 *
 * Predicted before measured:
 *  - p = 1: one rank, its all-reduce returns its own partial sums, so the group is
 *    kv_forward() bit for bit (logits and cache).
 *  - p > 1: the only arithmetic that changes is the order of the additions inside the Wo and
 *    W2 products (p partial dot products added in rank order instead of one dot product).
 *    Reassociating a sum of n fp32 terms moves it by at most about (k + p)·u·Σ|terms|, k the
 *    length of its longest addition chain (n/16 + 4 for kv_dot) and u = 2^-24: for these
 *    models (n <= 100) under 1e-6 of Σ|terms|. That perturbation passes through L layers and
 *    the classifier; the logits are compared with the fp32 reduction-order tolerance of
 *    kv_test.h (atol 1e-5, rtol 1e-4), the bound the project uses wherever only summation
 *    order differs, and the measured worst difference is printed beside it. Greedy tokens are
 *    predicted identical: their top-two margins are orders of magnitude above it.
 *    An fp16 cache rounds each later layer's K/V rows to binary16 after that perturbation: an
 *    element lying within it of a rounding midpoint takes the neighbouring code in one run
 *    and not the other, a jump of one binary16 step (2^-11 relative), far above 1e-6. How
 *    often depends on the numbers alone (any change of the arithmetic upstream moves which
 *    elements sit near a midpoint), so the fp16 case allows one binary16 step: atol = rtol =
 *    2^-11.
 *  - layer 0's K/V rows depend on no all-reduce (the embedding, a norm and the rank's rows of
 *    Wk, Wv): each rank's cache holds exactly its KV heads' rows of the p = 1 cache, bit for
 *    bit; later layers within the tolerance. With p > H_kv each KV head appears on p/H_kv
 *    ranks. Cache bytes per rank: L·2·N·(H_kv/p, or 1)·d·4·slots.
 *  - the rank-order sum is deterministic: a second run repeats the logits bit for bit.
 *  - counters: 2·L all-reduces per step; each rank reads 2·(p-1)/p·T·dim·4 bytes per
 *    all-reduce (ring all-reduce data movement) when p divides T·dim.
 */
#include "common/kv_test.h"
#include "common/test_tp_common.h"

#include "kv_generate.h"
#include "kv_tp.h"

#include <string.h>

#define CAP 64
#define NG 24  /* generated tokens */




/* ---- p = 1 is kv_forward bit for bit ----------------------------------------------------- */

static void test_p1_bits(const kv_model *m, const char *what)
{
    kv_err e;
    const int V = m->config.vocab_size;
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_backend *ref = NULL;
    kv_tp *g = NULL;
    int ok = !kv_backend_cpu(&ref, m, &spec, &e) && !kv_tp_create(&g, m, 1, &spec, &e);
    KV_CHECK(ok, "%s: create: %s", what, e.msg);
    if (ok) {
        float a[128], b[128];
        int tok[NP + 6], same = 1;
        memcpy(tok, PROMPT, sizeof PROMPT);
        for (int j = 0; j < 6; j++) tok[NP + j] = (13 * j + 2) % V;
        /* a prefill, then six one-token steps */
        for (int step = 0; step < 7 && ok; step++) {
            const int pos = step ? NP + step - 1 : 0, n = step ? 1 : NP;
            const kv_seq s = {0, pos, n, tok + pos, NULL};
            ok = !ref->forward(ref, &s, 1, a, NULL, &e) && !kv_tp_forward(g, &s, 1, b, NULL, &e);
            same &= !memcmp(a, b, sizeof(float) * V);
        }
        KV_CHECK(ok, "%s: steps: %s", what, e.msg);
        KV_CHECK(same, "%s: p = 1 logits differ from kv_forward", what);
        const kv_cache *c0 = kv_backend_cpu_cache(ref), *c1 = kv_tp_cache(g, 0);
        const size_t n = (size_t)c0->n_layers * c0->n_kv_heads * c0->rows * c0->head_dim;
        KV_CHECK(!memcmp(c0->k, c1->k, n * sizeof(float)) && !memcmp(c0->v, c1->v, n * sizeof(float)),
                 "%s: p = 1 cache differs from kv_forward's", what);
    }
    kv_tp_destroy(g);
    kv_backend_destroy(ref);
}

/* ---- p ranks against p = 1 ---------------------------------------------------------------- */

static void test_ranks(const kv_model *m, int p, const char *what)
{
    kv_err e;
    const kv_config *cfg = &m->config;
    const int V = cfg->vocab_size, L = cfg->n_layers, dim = cfg->dim;
    const int Hkv = cfg->n_kv_heads, d = kv_config_head_dim(cfg);
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_backend *ref = NULL, *tpb = NULL;
    int ok = !kv_backend_cpu(&ref, m, &spec, &e) && !kv_tp_backend(&tpb, m, p, &spec, &e);
    KV_CHECK(ok, "%s p=%d: create: %s", what, p, e.msg);
    if (!ok) {
        kv_backend_destroy(ref);
        kv_backend_destroy(tpb);
        return;
    }
    kv_tp *g = kv_tp_of_backend(tpb);

    /* greedy tokens through kv_generate, the same loop every device runs */
    int want[NG], got[NG];
    float lw[128], lg[128];
    kv_counters cw = {0}, cg = {0};
    kv_gen_opts o = {KV_MODE_CACHED, 0, NG, NULL, NULL, NULL, lw};
    ok = !kv_generate(ref, PROMPT, NP, &o, want, &cw, &e);
    o.last_logits = lg;
    ok = ok && !kv_generate(tpb, PROMPT, NP, &o, got, &cg, &e);
    KV_CHECK(ok, "%s p=%d: generate: %s", what, p, e.msg);
    KV_CHECK(!memcmp(want, got, sizeof want), "%s p=%d: greedy tokens differ from p = 1", what, p);
    KV_CHECK(!kv_test_compare("last logits", lg, lw, V, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
             "%s p=%d: last logits outside the fp32 reduction-order tolerance", what, p);
    double worst = 0;
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs((double)lg[i] - lw[i]));
    printf("%s p=%d: tokens %s, max |logit diff| %.3g\n", what, p,
           memcmp(want, got, sizeof want) ? "DIFFER" : "equal", worst);
    /* the reduction order is fixed (rank order), not a race: a second run repeats the bits */
    float lg2[128];
    int again[NG];
    o.last_logits = lg2;
    tpb->reset(tpb, 0);
    ok = !kv_generate(tpb, PROMPT, NP, &o, again, NULL, &e);
    KV_CHECK(ok && !memcmp(lg, lg2, sizeof(float) * V) && !memcmp(got, again, sizeof got),
             "%s p=%d: a second run differs from the first (%s)", what, p, ok ? "bits" : e.msg);
    KV_CHECK(cw.flops_proj == cg.flops_proj && cw.kv_bytes_written == cg.kv_bytes_written &&
             cw.tokens == cg.tokens, "%s p=%d: work counters differ from kv_forward's", what, p);

    /* every rank's cache: its KV heads' rows of the p = 1 cache */
    const kv_cache *full = kv_backend_cpu_cache(ref);
    const int n_rows = NP + NG - 1; /* the last generated token is never fed back */
    long layer0_bad = 0, rows_bad = 0;
    int heads_bad = 0;
    int copies[64] = {0};
    for (int r = 0; r < p; r++) {
        const kv_cache *c = kv_tp_cache(g, r);
        const kv_shard *sh = kv_tp_shard(g, r);
        const int want_kv = p <= Hkv ? Hkv / p : 1;
        heads_bad += c->n_kv_heads != want_kv || sh->n_kv_heads != want_kv ||
                     c->len[0] != full->len[0];
        const size_t bytes = (size_t)L * 2 * CAP * want_kv * d * sizeof(float);
        KV_CHECK(kv_cache_bytes(c) == bytes, "%s p=%d rank %d: cache %zu bytes, formula %zu", what,
                 p, r, kv_cache_bytes(c), bytes);
        for (int j = 0; j < c->n_kv_heads; j++) {
            const int h = sh->kv_head0 + j; /* the p = 1 head */
            copies[h]++;
            /* query heads of this rank read KV head h: h = q / G for each of its q */
            for (int q = sh->q_head0; q < sh->q_head0 + sh->n_q_heads; q++)
                heads_bad += q / (cfg->n_heads / Hkv) != sh->kv_head0 + (q - sh->q_head0) /
                                                            (sh->n_q_heads / c->n_kv_heads);
            for (int role = 0; role < 2; role++) {
                const size_t n = (size_t)n_rows * d;
                layer0_bad += memcmp(tp_layer_head(c, role, 0, 0, j),
                                     tp_layer_head(full, role, 0, 0, h),
                                     n * sizeof(float)) != 0;
                for (int l = 1; l < L; l++)
                    rows_bad += kv_test_compare("cache rows", tp_layer_head(c, role, l, 0, j),
                                                tp_layer_head(full, role, l, 0, h), (long)n,
                                                KV_TOL_F32_ATOL, KV_TOL_F32_RTOL);
            }
        }
    }
    int copies_bad = 0;
    for (int h = 0; h < Hkv; h++) copies_bad += copies[h] != (p <= Hkv ? 1 : p / Hkv);
    KV_CHECK(!heads_bad, "%s p=%d: rank head counts, lengths or head mapping wrong", what, p);
    KV_CHECK(!copies_bad, "%s p=%d: a KV head is not held by exactly %d rank(s)", what, p,
             p <= Hkv ? 1 : p / Hkv);
    KV_CHECK(!layer0_bad, "%s p=%d: layer-0 rows of a rank differ from the p = 1 cache", what, p);
    KV_CHECK(!rows_bad, "%s p=%d: later layers' rows outside the tolerance", what, p);

    /* counters of one more step of T = 4 tokens (p divides 4·dim) */
    kv_tp_reset(g, 0);
    const kv_tp_stats before = *kv_tp_get_stats(g);
    const kv_seq s = {0, 0, 4, PROMPT, NULL};
    ok = !kv_tp_forward(g, &s, 1, lg, NULL, &e);
    KV_CHECK(ok, "%s p=%d: step: %s", what, p, e.msg);
    const kv_tp_stats *st = kv_tp_get_stats(g);
    KV_CHECK(st->all_reduces - before.all_reduces == 2 * L && st->steps - before.steps == 1,
             "%s p=%d: %lld all-reduces in a step, want 2 L = %d", what, p,
             (long long)(st->all_reduces - before.all_reduces), 2 * L);
    const double ring = kv_tp_ring_bytes(p, 4.0 * dim) * 2 * L;
    int bytes_bad = 0;
    for (int r = 0; r < p; r++) bytes_bad += st->rank_bytes[r] - before.rank_bytes[r] != ring;
    KV_CHECK(!bytes_bad, "%s p=%d: bytes read per rank != 2(p-1)/p * T*dim*4 per all-reduce "
             "(%.0f)", what, p, ring);
    kv_backend_destroy(ref);
    kv_backend_destroy(tpb);
}

/* ---- a batch with all_logits, a window and an fp16 cache --------------------------------- */

static void test_batch(const kv_model *m, int p, int window, int dtype, const char *what)
{
    kv_err e;
    const int V = m->config.vocab_size;
    kv_cache_spec spec = kv_cache_spec_default(2, CAP);
    spec.quant.dtype = dtype;
    spec.window.size = window;
    kv_backend *ref = NULL;
    kv_tp *g = NULL;
    int ok = !kv_backend_cpu(&ref, m, &spec, &e) && !kv_tp_create(&g, m, p, &spec, &e);
    KV_CHECK(ok, "%s p=%d: create: %s", what, p, e.msg);
    /* fp16: one binary16 step (see the top of the file); fp32: the reduction-order bound */
    const double atol = dtype == KV_QF_F16 ? 0x1p-11 : KV_TOL_F32_ATOL;
    const double rtol = dtype == KV_QF_F16 ? 0x1p-11 : KV_TOL_F32_RTOL;
    if (ok) {
        static float ra[2][NP * 128], ga[2][NP * 128], rl[2 * 128], gl[2 * 128];
        long bad = 0;
        int tok[2][40];
        for (int i = 0; i < 40; i++) tok[0][i] = (7 * i + 1) % V, tok[1][i] = (11 * i + 5) % V;
        /* prefills of 7 and 5 tokens with all_logits on slot 1, then one-token steps */
        for (int step = 0; step < 20 && ok; step++) {
            kv_seq rs[2], gs[2];
            const int n0 = step ? 1 : NP, n1 = step ? 1 : 5;
            const int p0 = step ? NP + step - 1 : 0, p1 = step ? 5 + step - 1 : 0;
            rs[0] = (kv_seq){0, p0, n0, tok[0] + p0, NULL};
            rs[1] = (kv_seq){1, p1, n1, tok[1] + p1, ra[1]};
            gs[0] = rs[0];
            gs[1] = rs[1];
            gs[1].all_logits = ga[1];
            ok = !ref->forward(ref, rs, 2, rl, NULL, &e) && !kv_tp_forward(g, gs, 2, gl, NULL, &e);
            bad += kv_test_compare("logits", gl, rl, 2L * V, atol, rtol);
            bad += kv_test_compare("all_logits", ga[1], ra[1], (long)n1 * V, atol, rtol);
        }
        KV_CHECK(ok, "%s p=%d: steps: %s", what, p, e.msg);
        KV_CHECK(!bad, "%s p=%d: batch logits outside the tolerance", what, p);
        (void)ra[0], (void)ga[0];
    }
    kv_tp_destroy(g);
    kv_backend_destroy(ref);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void expect_refusal(int rc, int want, const kv_err *e, const char *needle, const char *what)
{
    KV_CHECK(rc == want && strstr(e->msg, needle), "%s: status %d (want %d), message '%s' "
             "should mention '%s'", what, rc, want, e->msg, needle);
}

static void test_refusals(const kv_model *mha, const kv_model *gqa)
{
    kv_err e;
    kv_tp *g = NULL;
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    expect_refusal(kv_tp_create(&g, mha, 3, &spec, &e), KV_ERR_ARG, &e, "do not divide the 8 query",
                   "p = 3, H = 8");
    expect_refusal(kv_tp_create(&g, mha, 0, &spec, &e), KV_ERR_ARG, &e, "0 ranks", "p = 0");
    expect_refusal(kv_tp_create(&g, mha, 128, &spec, &e), KV_ERR_ARG, &e, "128 ranks", "p = 128");
    kv_config c = mha->config;
    c.n_heads = 12, c.n_kv_heads = 4, c.dim = 96;
    expect_refusal(kv_tp_check(&c, 6, &e), KV_ERR_ARG, &e, "one must divide the other",
                   "p = 6, H_kv = 4");
    c.n_kv_heads = 6;
    expect_refusal(kv_tp_check(&c, 4, &e), KV_ERR_ARG, &e, "one must divide the other",
                   "p = 4, H_kv = 6");
    c = mha->config;
    c.hidden_dim = 2;
    expect_refusal(kv_tp_check(&c, 4, &e), KV_ERR_ARG, &e, "hidden units", "hidden < p");
    kv_cache_spec paged = spec;
    paged.layout.kind = KV_LAYOUT_PAGED, paged.layout.block_size = 16, paged.layout.n_blocks = 8;
    expect_refusal(kv_tp_create(&g, gqa, 2, &paged, &e), KV_ERR_UNSUPPORTED, &e, "paged",
                   "paged cache");
    KV_CHECK(g == NULL, "a refused group is not returned");

    /* a bad step is refused before any rank touches its cache */
    int ok = !kv_tp_create(&g, gqa, 2, &spec, &e);
    KV_CHECK(ok, "create: %s", e.msg);
    if (!ok) return;
    float lg[128];
    const kv_seq s0 = {0, 0, 3, PROMPT, NULL};
    KV_CHECK(!kv_tp_forward(g, &s0, 1, lg, NULL, &e), "step: %s", e.msg);
    const kv_seq wrong_pos = {0, 5, 1, PROMPT, NULL};
    expect_refusal(kv_tp_forward(g, &wrong_pos, 1, lg, NULL, &e), KV_ERR_ARG, &e,
                   "slot 0 holds 3 tokens", "pos mismatch");
    const int bad_tok = 1000;
    const kv_seq bad = {0, 3, 1, &bad_tok, NULL};
    expect_refusal(kv_tp_forward(g, &bad, 1, lg, NULL, &e), KV_ERR_ARG, &e, "outside [0, 97)",
                   "token id");
    const kv_seq too_long = {0, 3, CAP, PROMPT, NULL};
    expect_refusal(kv_tp_forward(g, &too_long, 1, lg, NULL, &e), KV_ERR_CAPACITY, &e,
                   "capacity", "capacity");
    KV_CHECK(kv_tp_cache(g, 0)->len[0] == 3 && kv_tp_cache(g, 1)->len[0] == 3,
             "refused steps changed a rank's cache length");
    KV_CHECK(kv_tp_get_stats(g)->steps == 1 && kv_tp_get_stats(g)->all_reduces == 2 * gqa->config.n_layers,
             "refused steps ran all-reduces");
    kv_tp_destroy(g);
}

int main(void)
{
    kv_model mha, gqa, mqa, odd;
    /* dim 64, H 8, d 8, L 3; hidden 100 is not a multiple of 8: uneven MLP shards */
    if (tp_make_model(&mha, 64, 96, 3, 8, 8, CAP, 11) ||
        tp_make_model(&gqa, 64, 100, 3, 8, 2, CAP, 12) ||
        tp_make_model(&mqa, 64, 96, 2, 8, 1, CAP, 13) ||
        tp_make_model(&odd, 48, 80, 2, 4, 4, CAP, 14))
        return 1;
    test_p1_bits(&mha, "MHA");
    test_p1_bits(&gqa, "GQA");
    const int ps[] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        test_ranks(&mha, ps[i], "MHA H8/Hkv8");
        test_ranks(&gqa, ps[i], "GQA H8/Hkv2"); /* p = 4: each KV head on 2 ranks */
    }
    test_ranks(&gqa, 8, "GQA H8/Hkv2");       /* one query head per rank, KV head on 4 */
    test_ranks(&mqa, 2, "MQA H8/Hkv1");       /* the one KV head on every rank */
    test_ranks(&mqa, 4, "MQA H8/Hkv1");
    test_ranks(&odd, 4, "MHA H4 dim48");
    test_batch(&gqa, 2, 0, KV_DTYPE_F32, "batch fp32");
    test_batch(&gqa, 4, 0, KV_QF_F16, "batch fp16, replicated");
    test_batch(&mha, 2, 9, KV_DTYPE_F32, "batch window 9");
    test_refusals(&mha, &gqa);
    kv_model_free(&mha);
    kv_model_free(&gqa);
    kv_model_free(&mqa);
    kv_model_free(&odd);
    return kv_test_finish();
}
