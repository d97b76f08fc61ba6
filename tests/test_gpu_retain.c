/* Chapter 09 on the GPU: kvcu_retain_attend() and kvcu_forward() with selected-set retention
 * against kv_retain_attend() and kv_forward().
 *
 * Predicted before measured:
 *  - kvcu_retain_attend() against kv_retain_attend() on identical inputs: the same K/V rows
 *    written to a CPU and a device cache (the same bytes in every format) and the same
 *    queries, a prompt of UP rows then short steps, for every method (l2-large, l2-small,
 *    h2o, snapkv, quest, topk) and fp32, fp16, int8, budgets well below the length. Both run
 *    the one host state (kv_retain.c) on the same dequantized keys, so the kept list of every
 *    (layer, KV head) and the stats (rows read, rows a full attention reads, evicted) are
 *    identical after every step: L2 norms, Quest bounds and top-k scores are bit for bit the
 *    CPU's; H2O masses and SnapKV votes differ only by the attention's summation order (a few
 *    ulps) and the inputs are random, far from ties, so equality is asserted there too. The
 *    outputs agree within kv_test.h's fp32 tolerance (quantized formats included: the codes
 *    read are the same);
 *  - the same token stream (a prompt of P distinct tokens, then DEC greedy steps) through
 *    kv_forward() and kvcu_forward(), every method and format: kept lists and stats identical
 *    after every step, greedy tokens equal, and for fp32 the logits within the fp32
 *    tolerance. Here the keys themselves come from two devices' matmuls and attention, so
 *    norms, masses and votes agree to a few ulps only, and two candidates that tie to that
 *    precision may rank either way. The rule: kept lists must be identical, except that for
 *    L2 and H2O a difference is accepted as a near tie when every position one side keeps
 *    and the other does not carries a score (norm or mass, as its keeper holds it) within
 *    1e-4 relative of all the others; the stream then stops, as the two caches now hold
 *    different sets. A bug in ranking, budget or eviction order moves sets by positions
 *    whose scores differ far more than that, and SnapKV (whose votes are reset after the
 *    prompt) and Quest / top-k (which evict nothing) get no exception; the emulation build
 *    is deterministic and must run every stream to its end without one. Quantized logits
 *    are not held to the fp32 tolerance here: a key the two devices computed in another
 *    order can round to the neighbouring code (test_gpu_window.c), which moves logits by
 *    more; test_attend() holds quantized attention on identical bytes instead;
 *  - a batch of two sequences through kvcu_forward gives each the logits and kept lists it
 *    gets alone, bit for bit (H2O, whose mass is a slot's own rows);
 *  - a budget at least the stream's length evicts nothing and reads everything: the device
 *    logits equal the plain kvcu_forward()'s bit for bit in the emulation build (the list
 *    runs the engine's decode kernel with list[i] in place of i, the same ranges and merge);
 *    on a GPU, within the fp32 tolerance (the compiler may contract differently where the
 *    list and the plain row locator differ);
 *  - the device cache refuses what the CPU cache refuses, with the same words after the
 *    function's name: a paged, windowed or KIVI spec with a selection, a spec without a
 *    budget, an unknown method, and truncate / fork / set_length on a retention cache;
 *    kvcu_retain_attend() on a cache without retention is KV_ERR_ARG.
 * Exits 77 (skipped) without a usable device. */
#include "kv_forward.h"
#include "kv_model.h"
#include "kv_quant.h"
#include "kv_retain.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "kvcu.h"

#include <stdlib.h>
#include <string.h>

enum { P = 96, DEC = 4, UP = 80, CAP = 128, V = 256 };

static kv_config model_config(void)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = 64;
    c.hidden_dim = 96;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2; /* G = 2: the mass sums two heads per row */
    c.vocab_size = V;
    c.seq_len = 1 << 20;
    c.rope_theta = 10000.0f;
    c.rotary_dim = 16;
    c.norm_eps = 1e-5f;
    c.tied_classifier = 1;
    return c;
}

/* One method's spec fields. */
typedef struct {
    int method, budget;
    double ratio;
    int window, sinks, dense;
} method_case;

static const method_case CASES[] = {
    {KV_SELECT_L2_LARGE, 32, 0.0, 8, 4, 0},
    {KV_SELECT_L2_SMALL, 0, 0.25, 8, 4, 0}, /* a ratio budget: B grows with the stream */
    {KV_SELECT_H2O, 24, 0.0, 8, 4, 0},
    {KV_SELECT_SNAPKV, 32, 0.0, 16, 2, 0},
    {KV_SELECT_QUEST, 32, 0.0, 0, 0, 1}, /* layer 0 dense, layer 1 reads 2 pages + its own */
    {KV_SELECT_TOPK, 16, 0.0, 0, 0, 0},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

static kv_cache_spec retain_spec(int dtype, const method_case *mc)
{
    kv_cache_spec s;
    memset(&s, 0, sizeof s);
    s.layout.kind = KV_LAYOUT_CONTIGUOUS;
    s.quant.dtype = dtype;
    s.n_slots = 1;
    s.capacity = CAP;
    if (mc) {
        s.retain.select = mc->method;
        s.retain.budget = mc->budget;
        s.retain.ratio = mc->ratio;
        s.retain.window = mc->window;
        s.retain.sinks = mc->sinks;
        s.retain.dense_layers = mc->dense;
    }
    return s;
}

/* The kept lists of (layer, KV head) on two states: 0 when identical; 1 when @p tie_ok and
 * they differ only by a near tie (the scores of every position one side keeps and the other
 * does not, as its keeper holds them, within 1e-4 relative of each other); 2 otherwise. */
static int kept_compare(const kv_retain *a, const kv_retain *b, int l, int h, int tie_ok)
{
    const kv_retain_head *x = kv_retain_at(a, 0, l, h), *y = kv_retain_at(b, 0, l, h);
    if (x->next == y->next && x->kept.n == y->kept.n &&
        !memcmp(x->kept.pos, y->kept.pos, sizeof(int) * (size_t)x->kept.n))
        return 0;
    if (!tie_ok || x->next != y->next || x->kept.n != y->kept.n) return 2;
    /* the positions one side keeps and the other not, with the score the keeper holds */
    double lo = INFINITY, hi = -INFINITY;
    for (int side = 0; side < 2; side++) {
        const kv_retain_head *u = side ? y : x, *w = side ? x : y;
        for (int i = 0; i < u->kept.n; i++)
            if (!kv_select_set_has(&w->kept, u->kept.pos[i])) {
                lo = fmin(lo, u->score[i]);
                hi = fmax(hi, u->score[i]);
            }
    }
    return hi - lo <= 1e-4 * fmax(fabs(hi), fabs(lo)) ? 1 : 2;
}

/* Over every (layer, KV head): the worst kept_compare(). */
static int kept_worst(const kv_retain *a, const kv_retain *b, int tie_ok)
{
    int worst = 0;
    for (int l = 0; l < a->n_layers; l++)
        for (int h = 0; h < a->n_kv_heads; h++) {
            const int k = kept_compare(a, b, l, h, tie_ok);
            if (k > worst) worst = k;
        }
    return worst;
}

static int stats_equal(const kv_retain *a, const kv_retain *b)
{
    const kv_retain_stats *x = &a->stats[0], *y = &b->stats[0];
    return x->rows_read == y->rows_read && x->rows_full == y->rows_full &&
           x->evicted == y->evicted;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The text of a message after its function's name ("kv_cache_create: ..." -> "..."). */
static const char *after_who(const char *msg)
{
    const char *p = strstr(msg, ": ");
    return p ? p + 2 : msg;
}

static void fill(kv_rng *rng, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_uniform(rng, -scale, scale);
}

/* ---- kvcu_retain_attend == kv_retain_attend on the same cache bytes and queries ------------ */

static void test_attend(const kv_config *cfg, int dtype, const method_case *mc)
{
    char what[96];
    snprintf(what, sizeof what, "attend %s %s", kv_select_method_name(mc->method),
             kv_quant_name(dtype));
    const kv_cache_spec spec = retain_spec(dtype, mc);
    const int L = cfg->n_layers, H = cfg->n_heads, HK = cfg->n_kv_heads;
    const int d = kv_config_head_dim(cfg);
    /* a prompt, decode steps, a short multi-token step (SnapKV: not a prompt), decodes */
    const int steps[] = {UP, 1, 1, 3, 1, 1};
    enum { N_STEPS = sizeof steps / sizeof steps[0] };
    kv_err e;
    kv_cache c;
    kvcu_cache *g = NULL;
    float *k = malloc(sizeof(float) * UP * HK * d), *v = malloc(sizeof(float) * UP * HK * d);
    float *q = malloc(sizeof(float) * UP * H * d), *oc = malloc(sizeof(float) * UP * H * d);
    float *og = malloc(sizeof(float) * UP * H * d);
    float *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL;
    int ok = kv_retain_cache_create(&c, cfg, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: kv_cache_create: %s", what, e.msg);
    if (!ok) goto out;
    ok = kvcu_retain_cache_create(&g, cfg, &spec, &e) == KV_OK &&
         kvcu_malloc((void **)&dk, sizeof(float) * UP * HK * d, &e) == KV_OK &&
         kvcu_malloc((void **)&dv, sizeof(float) * UP * HK * d, &e) == KV_OK &&
         kvcu_malloc((void **)&dq, sizeof(float) * UP * H * d, &e) == KV_OK &&
         kvcu_malloc((void **)&dout, sizeof(float) * UP * H * d, &e) == KV_OK;
    KV_CHECK(ok, "%s: device: %s", what, e.msg);
    if (!ok) goto done;
    kv_rng rng;
    kv_rng_seed(&rng, 300 + 11 * mc->method + dtype);
    long bad_out = 0;
    int bad_sets = 0, bad_stats = 0;
    for (int st = 0, pos = 0; st < N_STEPS && ok; pos += steps[st], st++) {
        const int n = steps[st];
        for (int l = 0; l < L && ok; l++) {
            fill(&rng, k, (size_t)n * HK * d, 1.0f);
            fill(&rng, v, (size_t)n * HK * d, 1.0f);
            fill(&rng, q, (size_t)n * H * d, 2.0f); /* peaked enough to tell positions apart */
            ok = kv_cache_write_seq(&c, l, 0, pos, n, k, v, &e) == KV_OK &&
                 kv_retain_attend(&c, l, 0, pos, n, q, oc, &e) == KV_OK;
            KV_CHECK(ok, "%s: CPU step at %d: %s", what, pos, e.msg);
            if (!ok) break;
            ok = kvcu_upload(dk, k, sizeof(float) * n * HK * d, &e) == KV_OK &&
                 kvcu_upload(dv, v, sizeof(float) * n * HK * d, &e) == KV_OK &&
                 kvcu_upload(dq, q, sizeof(float) * n * H * d, &e) == KV_OK &&
                 kvcu_cache_write_seq(g, l, 0, pos, n, dk, dv, &e) == KV_OK &&
                 kvcu_retain_attend(g, l, 0, pos, n, dq, dout, &e) == KV_OK &&
                 kvcu_download(og, dout, sizeof(float) * n * H * d, &e) == KV_OK;
            KV_CHECK(ok, "%s: device step at %d: %s", what, pos, e.msg);
            if (!ok) break;
            char at[128];
            snprintf(at, sizeof at, "%s layer %d out at %d", what, l, pos);
            bad_out += kv_test_compare(at, og, oc, (long)n * H * d, KV_TOL_F32_ATOL,
                                       KV_TOL_F32_RTOL);
        }
        if (!ok) break;
        const int ks = kept_worst(c.retain, kvcu_cache_retain(g), 0);
        if (ks) printf("  %s: kept lists differ after step at %d\n", what, pos);
        bad_sets += ks != 0;
        bad_stats += !stats_equal(c.retain, kvcu_cache_retain(g));
    }
    if (ok) {
        const kv_retain_stats *a = &c.retain->stats[0];
        KV_CHECK(bad_sets == 0, "%s: kept lists identical after every step", what);
        KV_CHECK(bad_stats == 0, "%s: stats identical after every step", what);
        KV_CHECK(bad_out == 0, "%s: outputs within the fp32 tolerance", what);
        /* the budgets are below the length: the evicting methods evict, the others read less */
        if (kv_select_method_evicts(mc->method))
            KV_CHECK(a->evicted > 0, "%s: positions were evicted", what);
        else
            KV_CHECK(a->rows_read < a->rows_full, "%s: fewer rows read (%lld) than full "
                     "attention (%lld)", what, (long long)a->rows_read, (long long)a->rows_full);
    }
done:
    kvcu_free(dk);
    kvcu_free(dv);
    kvcu_free(dq);
    kvcu_free(dout);
    kvcu_retain_cache_free(g);
    kv_retain_cache_free(&c);
out:
    free(k);
    free(v);
    free(q);
    free(oc);
    free(og);
}

/* ---- the stream through kv_forward and kvcu_forward -------------------------------------- */

static void test_stream(const kv_model *m, const kvcu_model *gm, int dtype, const method_case *mc)
{
    char what[96];
    snprintf(what, sizeof what, "forward %s %s", kv_select_method_name(mc->method),
             kv_quant_name(dtype));
    const kv_cache_spec spec = retain_spec(dtype, mc);
    kv_err e;
    kv_cache c;
    kv_state st;
    kv_state_init(&st);
    kvcu_cache *g = NULL;
    kvcu_state *gs = NULL;
    int ok = kv_retain_cache_create(&c, &m->config, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: kv_cache_create: %s", what, e.msg);
    if (!ok) return;
    ok = kvcu_retain_cache_create(&g, &m->config, &spec, &e) == KV_OK &&
         kvcu_state_create(&gs, &e) == KV_OK;
    KV_CHECK(ok, "%s: device cache: %s", what, e.msg);
    const kv_retain *rc = c.retain, *rg = ok ? kvcu_cache_retain(g) : NULL;
    KV_CHECK(!ok || (rc && rg), "%s: both caches have a retention state", what);
    if (!ok || !rc || !rg) goto done;

    kv_rng rng;
    kv_rng_seed(&rng, 900 + 7 * mc->method + dtype);
    /* distinct prompt tokens: a token met twice has the same key before RoPE, and RoPE keeps
     * its norm, so two positions would tie in L2 up to rounding (and the devices round
     * differently); the DEC greedy tokens stay in the always-kept window */
    int tok[V];
    for (int i = 0; i < V; i++) tok[i] = i;
    for (int i = V - 1; i > 0; i--) {
        const int j = (int)(kv_rng_u32(&rng) % (uint32_t)(i + 1)), t = tok[i];
        tok[i] = tok[j];
        tok[j] = t;
    }
    float lc[V], lg[V];
    long bad_logits = 0;
    int bad_sets = 0, bad_stats = 0, bad_tok = 0, steps = 0;
    /* a quantized cache can round a key the two devices computed in another order to the
     * neighbouring code, which moves logits past the fp32 tolerance (test_gpu_window.c):
     * there the logits are held by the greedy tokens, and test_attend() holds the quantized
     * attention to the fp32 tolerance on identical cache bytes */
    const int vs_logits = dtype == KV_QF_F32;
    for (int step = 0, pos = 0; step <= DEC; step++) {
        const int n = step ? 1 : P;
        const kv_seq s = {0, pos, n, tok + pos};
        ok = kv_forward(m, &c, &st, &s, 1, lc, NULL, &e) == KV_OK;
        KV_CHECK(ok, "%s: kv_forward at %d: %s", what, pos, e.msg);
        if (!ok) break;
        ok = kvcu_forward(gm, g, gs, &s, 1, lg, NULL, &e) == KV_OK;
        KV_CHECK(ok, "%s: kvcu_forward at %d: %s", what, pos, e.msg);
        if (!ok) break;
        pos += n;
        steps++;
        const int ks = kept_worst(rc, rg, mc->method != KV_SELECT_SNAPKV);
        if (ks == 1) { /* a near tie went the other way: the streams part here */
            printf("  %s: a near tie (scores within 1e-4) was ranked differently after "
                   "position %d; the stream stops there\n", what, pos - 1);
            break;
        }
        if (ks) printf("  %s: kept lists differ after position %d\n", what, pos - 1);
        bad_sets += ks != 0;
        bad_stats += !stats_equal(rc, rg);
        char at[128];
        snprintf(at, sizeof at, "%s logits at %d", what, pos - 1);
        if (vs_logits)
            bad_logits += kv_test_compare(at, lg, lc, V, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL);
        if (step < DEC) { /* greedy on each device; the CPU's token feeds both */
            const int tc = argmax(lc, V), tg = argmax(lg, V);
            bad_tok += tc != tg;
            tok[pos] = tc;
        }
    }
    KV_CHECK(bad_sets == 0, "%s: kept lists identical after every step", what);
    KV_CHECK(bad_stats == 0, "%s: selection stats identical (CPU read %lld of %lld, evicted "
             "%lld; GPU %lld of %lld, %lld)", what, (long long)rc->stats[0].rows_read,
             (long long)rc->stats[0].rows_full, (long long)rc->stats[0].evicted,
             (long long)rg->stats[0].rows_read, (long long)rg->stats[0].rows_full,
             (long long)rg->stats[0].evicted);
    if (vs_logits)
        KV_CHECK(bad_logits == 0, "%s: logits within the fp32 tolerance at every step", what);
    KV_CHECK(bad_tok == 0, "%s: greedy tokens equal", what);
    /* a near tie is possible on a GPU, whose rounding differs from one run of the emulation
     * build to none: that build is deterministic and must run every step */
    if (kvcu_is_emulation())
        KV_CHECK(steps == DEC + 1, "%s: every step compared (%d of %d)", what, steps, DEC + 1);
done:
    kv_state_free(&st);
    kv_retain_cache_free(&c);
    kvcu_state_free(gs);
    kvcu_retain_cache_free(g);
}

/* ---- a batch of two sequences == each alone ------------------------------------------------ */

/* kvcu_forward hands each sequence of a batch to kvcu_retain_attend() with its own rows and
 * slot: two prompts in one step, then a decode step of both, give each sequence the logits
 * and kept lists it gets alone in a one-slot cache, bit for bit (per-row arithmetic). */
static void test_batch(const kvcu_model *gm, const kv_config *cfg, const method_case *mc)
{
    char what[96];
    snprintf(what, sizeof what, "batch %s", kv_select_method_name(mc->method));
    enum { N0 = 56, N1 = 72 };
    kv_cache_spec two = retain_spec(KV_QF_F32, mc), one = two;
    two.n_slots = 2;
    int tok[2][N1 + 1];
    for (int i = 0; i <= N1; i++) {
        tok[0][i] = (7 * i + 3) % V;
        tok[1][i] = (11 * i + 1) % V;
    }
    kv_err e;
    kvcu_cache *gb = NULL, *ga[2] = {NULL, NULL};
    kvcu_state *gs = NULL;
    float lb[2 * 2 * V], la[2 * 2 * V]; /* [step][seq][V] */
    int ok = kvcu_retain_cache_create(&gb, cfg, &two, &e) == KV_OK && kvcu_state_create(&gs, &e) == KV_OK;
    const int len[2] = {N0, N1};
    for (int step = 0; ok && step < 2; step++) {
        const kv_seq b[2] = {{0, step ? N0 : 0, step ? 1 : N0, tok[0] + (step ? N0 : 0)},
                             {1, step ? N1 : 0, step ? 1 : N1, tok[1] + (step ? N1 : 0)}};
        ok = kvcu_forward(gm, gb, gs, b, 2, lb + (size_t)step * 2 * V, NULL, &e) == KV_OK;
    }
    for (int i = 0; ok && i < 2; i++) {
        ok = kvcu_retain_cache_create(&ga[i], cfg, &one, &e) == KV_OK;
        for (int step = 0; ok && step < 2; step++) {
            const int p0 = step ? len[i] : 0;
            const kv_seq a = {0, p0, step ? 1 : len[i], tok[i] + p0};
            ok = kvcu_forward(gm, ga[i], gs, &a, 1, la + ((size_t)step * 2 + i) * V, NULL, &e) ==
                 KV_OK;
        }
    }
    KV_CHECK(ok, "%s: runs: %s", what, ok ? "" : e.msg);
    if (ok) {
        KV_CHECK(!memcmp(lb, la, sizeof lb), "%s: batched logits == each sequence alone, bit "
                 "for bit", what);
        const kv_retain *rb = kvcu_cache_retain(gb);
        int same = 1, evicted = 0;
        for (int i = 0; i < 2; i++) {
            const kv_retain *ra = kvcu_cache_retain(ga[i]);
            for (int l = 0; l < cfg->n_layers; l++)
                for (int h = 0; h < cfg->n_kv_heads; h++) {
                    const kv_retain_head *x = kv_retain_at(rb, i, l, h);
                    const kv_retain_head *y = kv_retain_at(ra, 0, l, h);
                    same &= x->next == y->next && x->kept.n == y->kept.n &&
                            !memcmp(x->kept.pos, y->kept.pos, sizeof(int) * (size_t)x->kept.n);
                }
            evicted += rb->stats[i].evicted > 0;
        }
        KV_CHECK(same, "%s: each slot's kept lists == its sequence's alone", what);
        KV_CHECK(evicted == 2, "%s: both sequences evicted", what);
    }
    kvcu_retain_cache_free(gb);
    kvcu_retain_cache_free(ga[0]);
    kvcu_retain_cache_free(ga[1]);
    kvcu_state_free(gs);
}

/* ---- a budget that never evicts == the plain device forward -------------------------------- */

/* The logits of each step of the stream (prompt of P, DEC decodes of fixed tokens) into
 * out [DEC + 1][V]. */
static int gpu_logits(const kvcu_model *gm, const kv_config *cfg, const kv_cache_spec *spec,
                      const int *tok, float *out, kv_err *e)
{
    kvcu_cache *g = NULL;
    kvcu_state *gs = NULL;
    int rc = kvcu_retain_cache_create(&g, cfg, spec, e);
    if (!rc) rc = kvcu_state_create(&gs, e);
    for (int step = 0, pos = 0; !rc && step <= DEC; step++) {
        const int n = step ? 1 : P;
        const kv_seq s = {0, pos, n, tok + pos};
        rc = kvcu_forward(gm, g, gs, &s, 1, out + (size_t)step * V, NULL, e);
        pos += n;
    }
    kvcu_state_free(gs);
    kvcu_retain_cache_free(g);
    return rc;
}

static void test_no_eviction(const kvcu_model *gm, const kv_config *cfg, int dtype, int n_cases)
{
    kv_err e;
    int tok[P + DEC];
    for (int i = 0; i < P + DEC; i++) tok[i] = (13 * i + 5) % V;
    float plain[(DEC + 1) * V], got[(DEC + 1) * V];
    const kv_cache_spec ps = retain_spec(dtype, NULL);
    int ok = gpu_logits(gm, cfg, &ps, tok, plain, &e) == KV_OK;
    KV_CHECK(ok, "plain %s: %s", kv_quant_name(dtype), e.msg);
    if (!ok) return;
    for (int k = 0; k < n_cases; k++) {
        method_case mc = CASES[k];
        mc.budget = CAP; /* >= every length the stream reaches */
        mc.ratio = 0.0;
        char what[96];
        snprintf(what, sizeof what, "%s %s budget %d", kv_select_method_name(mc.method),
                 kv_quant_name(dtype), mc.budget);
        const kv_cache_spec s = retain_spec(dtype, &mc);
        ok = gpu_logits(gm, cfg, &s, tok, got, &e) == KV_OK;
        KV_CHECK(ok, "%s: %s", what, e.msg);
        if (!ok) continue;
        if (kvcu_is_emulation())
            KV_CHECK(memcmp(got, plain, sizeof got) == 0, "%s: logits == the plain "
                     "kvcu_forward's, bit for bit", what);
        else
            KV_CHECK(kv_test_compare(what, got, plain, (DEC + 1) * V, KV_TOL_F32_ATOL,
                                     KV_TOL_F32_RTOL) == 0,
                     "%s: logits within the fp32 tolerance of the plain kvcu_forward's", what);
    }
}

/* ---- refusals --------------------------------------------------------------------------- */

static void same_refusal(const char *what, int rc_cpu, const kv_err *ec, int rc_gpu,
                         const kv_err *eg)
{
    KV_CHECK(rc_cpu != KV_OK && rc_cpu == rc_gpu && !strcmp(after_who(ec->msg), after_who(eg->msg)),
             "%s: CPU %d \"%s\", GPU %d \"%s\"", what, rc_cpu, rc_cpu ? ec->msg : "",
             rc_gpu, rc_gpu ? eg->msg : "");
}

static void test_refusals(const kv_config *cfg)
{
    const method_case h2o = CASES[2];
    struct {
        const char *what;
        kv_cache_spec s;
    } bad[5];
    for (int i = 0; i < 5; i++) bad[i].s = retain_spec(KV_QF_F32, &h2o);
    bad[0].what = "paged";
    bad[0].s.layout.kind = KV_LAYOUT_PAGED;
    bad[0].s.layout.block_size = 16;
    bad[0].s.layout.n_blocks = 32;
    bad[1].what = "window";
    bad[1].s.window.size = 32;
    bad[1].s.window.n_sinks = 4;
    bad[2].what = "KIVI";
    bad[2].s.quant.dtype = KV_QF_INT4_KIVI;
    bad[3].what = "no budget";
    bad[3].s.retain.budget = 0;
    bad[4].what = "unknown method";
    bad[4].s.retain.select = 99;
    for (int i = 0; i < 5; i++) {
        kv_err ec, eg;
        kv_cache c;
        kvcu_cache *g = NULL;
        const int a = kv_retain_cache_create(&c, cfg, &bad[i].s, &ec);
        if (a == KV_OK) kv_retain_cache_free(&c);
        const int b = kvcu_retain_cache_create(&g, cfg, &bad[i].s, &eg);
        kvcu_retain_cache_free(g);
        same_refusal(bad[i].what, a, &ec, b, &eg);
    }

    /* the cache operations that would desynchronize the state */
    const kv_cache_spec s = retain_spec(KV_QF_F32, &h2o);
    kv_cache c;
    kvcu_cache *g = NULL;
    kv_err ec, eg;
    int ok = kv_retain_cache_create(&c, cfg, &s, &ec) == KV_OK;
    KV_CHECK(ok, "retention cache: %s", ec.msg);
    if (!ok) return;
    ok = kvcu_retain_cache_create(&g, cfg, &s, &eg) == KV_OK;
    KV_CHECK(ok, "device retention cache: %s", eg.msg);
    if (ok) {
        int a = kv_cache_truncate(&c, 0, 0, &ec), b = kvcu_cache_truncate(g, 0, 0, &eg);
        same_refusal("truncate", a, &ec, b, &eg);
        a = kv_cache_fork_slot(&c, 0, 0, &ec);
        b = kvcu_cache_fork_slot(g, 0, 0, &eg);
        same_refusal("fork_slot", a, &ec, b, &eg);
        a = kv_cache_set_length(&c, 0, 0, &ec);
        b = kvcu_cache_set_length(g, 0, 0, &eg);
        same_refusal("set_length", a, &ec, b, &eg);
    }
    kvcu_retain_cache_free(g);
    kv_retain_cache_free(&c);

    /* kvcu_retain_attend on a cache without retention */
    const kv_cache_spec plain = retain_spec(KV_QF_F32, NULL);
    g = NULL;
    ok = kvcu_retain_cache_create(&g, cfg, &plain, &eg) == KV_OK;
    KV_CHECK(ok && kvcu_cache_retain(g) == NULL, "plain device cache has no retention state");
    if (ok)
        KV_CHECK(kvcu_retain_attend(g, 0, 0, 0, 1, NULL, NULL, &eg) == KV_ERR_ARG,
                 "kvcu_retain_attend without retention is KV_ERR_ARG");
    kvcu_retain_cache_free(g);
}

int main(void)
{
    kv_err e;
    if (kvcu_device_available(&e) != KV_OK) {
        printf("skipped: %s\n", e.msg);
        return KV_TEST_SKIP;
    }
    const kv_config cfg = model_config();
    kv_model m;
    kvcu_model *gm = NULL;
    if (kv_model_alloc(&m, &cfg, &e) != KV_OK) {
        printf("model: %s\n", e.msg);
        return 1;
    }
    kv_model_randomize(&m, 909);
    if (kvcu_model_upload(&gm, &m, &e) != KV_OK) {
        printf("model upload: %s\n", e.msg);
        kv_model_free(&m);
        return 1;
    }
    test_refusals(&cfg);
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8};
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < N_CASES; k++) test_attend(&cfg, fmts[f], &CASES[k]);
    for (int f = 0; f < 3; f++)
        for (int k = 0; k < N_CASES; k++) test_stream(&m, gm, fmts[f], &CASES[k]);
    test_batch(gm, &cfg, &CASES[2]); /* h2o: the mass of each slot's own rows */
    test_no_eviction(gm, &cfg, KV_QF_F32, N_CASES);
    test_no_eviction(gm, &cfg, KV_QF_INT8, 1); /* l2-large: an evicting method's list */
    kvcu_model_free(gm);
    kv_model_free(&m);
    return kv_test_finish();
}
