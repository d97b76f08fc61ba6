/* Needle grid (issue 4): spec parsing, haystack construction, the prediction rules, and the
 * grid itself on the CPU. Predicted before measured: an exact (fp32) cache passes every cell.
 * Chapter 05: a short grid again on paged caches (fp32 and int8), whose every cell must equal
 * the contiguous cell bit for bit, since paging moves rows without changing them.
 *
 *   test_needle DATASETS/needle          the fast grid (fast.needle)
 *   test_needle DATASETS/needle slow     the full grid (full.needle; label slow)  */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_data.h"

#include "kv_needle.h"
#include "kv_quant.h"
#include "kv_rng.h"

#include <string.h>

static kv_recall_vocab V;

static void test_spec_parse(void)
{
    kv_needle_spec s;
    kv_err e;
    kv_needle_spec_default(&s);
    KV_CHECK(s.n_models == 2 && s.n_lengths == 2 && s.n_depths == 5 && s.n_variants == 1 &&
                 s.variants[0].rule == KV_EXPECT_ALL, "default spec");
    const char *text = "# a grid\nname t1\nmodels induction\nlengths 100 200  # two\n"
                       "depths 0 100\nvariant fp32 all\nvariant exact within:150\nseeds 4 5\n";
    KV_CHECK(kv_needle_spec_parse(text, &s, &e) == KV_OK, "parse: %s", e.msg);
    KV_CHECK(!strcmp(s.name, "t1") && s.n_models == 1 && s.models[0] == KV_MODEL_RECALL_INDUCTION,
             "name and models");
    KV_CHECK(s.n_lengths == 2 && s.lengths[1] == 200 && s.n_depths == 2 && s.depths[1] == 100,
             "lengths and depths");
    KV_CHECK(s.n_variants == 2 && s.variants[1].rule == KV_EXPECT_WITHIN &&
                 s.variants[1].arg == 150 && s.n_seeds == 2 && s.seeds[1] == 5, "variants, seeds");
    const char *bad[] = {"lengths 100 abc\n", "depths 0 101\n", "models direct sparse\n",
                         "variant fp32 sometimes\n", "colour blue\n", "lengths\n",
                         "depths 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
                         "variant fp32 within:-3\n"};
    for (int i = 0; i < 8; i++) {
        kv_needle_spec_default(&s);
        int rc = kv_needle_spec_parse(bad[i], &s, &e);
        KV_CHECK(rc == KV_ERR_FORMAT && strstr(e.msg, "line 1"), "bad spec %d refused with its "
                 "line: rc %d '%s'", i, rc, e.msg);
    }
    kv_cache_spec cs;
    KV_CHECK(kv_needle_cache_spec("fp32", 1, 100, &cs, &e) == KV_OK && cs.capacity == 100,
             "fp32 variant");
    KV_CHECK(kv_needle_cache_spec("int3", 1, 100, &cs, &e) == KV_ERR_UNSUPPORTED &&
                 strstr(e.msg, "int3"), "unknown variant named: %s", e.msg);
    /* chapter 06: a window, its sinks, its position scheme and a per-token format */
    KV_CHECK(kv_needle_cache_spec("window/w256/s4/cache/int8", 1, 100, &cs, &e) == KV_OK &&
                 cs.window.size == 256 && cs.window.n_sinks == 4 &&
                 cs.window.pos_scheme == KV_POS_CACHE && cs.quant.dtype == KV_QF_INT8 &&
                 cs.capacity == 100, "window variant: %s", e.msg);
    KV_CHECK(kv_needle_cache_spec("window/w512", 1, 100, &cs, &e) == KV_OK &&
                 cs.window.size == 512 && cs.window.n_sinks == 0 &&
                 cs.window.pos_scheme == KV_POS_ORIGINAL && cs.quant.dtype == KV_DTYPE_F32,
             "window variant, defaults: %s", e.msg);
}

static void test_build(void)
{
    int tok[300];
    kv_needle_item it[16];
    kv_err e;
    const int depths[] = {0, 50, 100, 100, 99};
    for (int kind = 1; kind <= 2; kind++) {
        KV_CHECK(kv_needle_build(kind, 300, depths, 5, 9, tok, it, &e) == KV_OK, "build: %s",
                 e.msg);
        const int nt = kind == KV_MODEL_RECALL_DIRECT ? 1 : 2;
        KV_CHECK(tok[0] == V.bos, "BOS first");
        KV_CHECK(it[0].pos == 1, "depth 0 right after BOS (pos %d)", it[0].pos);
        KV_CHECK(it[1].pos == 1 + (int)(0.5 * (300 - 1 - nt) + 0.5), "depth 50 (pos %d)", it[1].pos);
        int last = 0;
        for (int i = 0; i < 5; i++) {
            if (it[i].pos + nt > last) last = it[i].pos + nt;
            for (int j = 0; j < 5; j++) /* no two needles overlap */
                if (i != j)
                    KV_CHECK(it[i].pos + nt <= it[j].pos || it[j].pos + nt <= it[i].pos,
                             "needles %d and %d overlap (%d, %d)", i, j, it[i].pos, it[j].pos);
            int ft[2];
            kv_recall_fact_tokens(&V, kind, it[i].key, it[i].value, ft);
            KV_CHECK(tok[it[i].pos] == ft[0] && (nt == 1 || tok[it[i].pos + 1] == ft[1]),
                     "needle %d tokens in place", i);
            for (int j = 0; j < i; j++) KV_CHECK(it[i].key != it[j].key, "keys distinct");
        }
        KV_CHECK(last == 300, "depth 100 ends the haystack (ends at %d)", last);
        int fillers = 0;
        for (int i = 1; i < 300; i++) fillers += tok[i] >= V.filler0 && tok[i] < V.key0;
        KV_CHECK(fillers == 299 - 5 * nt, "everything else is filler (%d)", fillers);
    }
    KV_CHECK(kv_needle_build(2, 8, depths, 5, 9, tok, it, &e) == KV_ERR_ARG, "too short refused");

    kv_needle_variant v;
    kv_needle_result r = {0};
    KV_CHECK(kv_needle_variant_parse("window:64", "within:64", &v, &e) == KV_OK, "within");
    r.distance = 64;
    KV_CHECK(kv_needle_expect(&v, &r) == 1, "distance 64 within 64");
    r.distance = 65;
    KV_CHECK(kv_needle_expect(&v, &r) == 0, "distance 65 beyond 64");
    kv_needle_variant_parse("x", "any", &v, &e);
    KV_CHECK(kv_needle_expect(&v, &r) == -1, "any: not asserted");
}

/* Chapter 05: the same cache spec, paged with blocks of *user tokens, the pool's blocks handed
 * out in a shuffled order (all allocated, then freed shuffled: the free stack is LIFO). */
static int make_paged(kv_backend **out, const kv_model *m, const kv_cache_spec *spec, void *user,
                      kv_err *err)
{
    kv_cache_spec s = *spec;
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = *(const int *)user;
    s.layout.n_blocks = s.n_slots * ((s.capacity + s.layout.block_size - 1) / s.layout.block_size);
    int rc = kv_backend_cpu(out, m, &s, err);
    if (rc) return rc;
    kv_pool *p = &(*out)->mem->paged->pool;
    int *ids = malloc((size_t)p->n_blocks * sizeof(int)); /* [N] */
    const int n = kv_test_pool_take_all(p, ids);
    kv_test_pool_free_shuffled(p, ids, n, (uint64_t)n);
    free(ids);
    return KV_OK;
}

static void run_paged(int slow)
{
    /* short lengths by default; the slow label adds the fast grid's lengths */
    const char *text = slow ? "name paged-slow\nmodels direct induction\nlengths 1024 4096\n"
                              "depths 0 25 50 75 100\nvariant fp32 all\nvariant int8 all\nseeds 3\n"
                            : "name paged\nmodels direct induction\nlengths 200 700\n"
                              "depths 0 50 100\nvariant fp32 all\nvariant int8 all\nseeds 3\n";
    kv_needle_spec s;
    kv_err e;
    kv_needle_spec_default(&s);
    if (kv_needle_spec_parse(text, &s, &e)) {
        KV_CHECK(0, "%s", e.msg);
        return;
    }
    kv_needle_result *ref = NULL;
    int n_ref = 0;
    int rc = kv_needle_grid(&s, kv_test_make_cpu, NULL, NULL, NULL, &ref, &n_ref, &e);
    KV_CHECK(rc == KV_OK, "contiguous grid: %s", e.msg);
    for (int B = 8; B <= 32 && !rc; B *= 4) { /* 8 and 32 */
        kv_needle_result *res = NULL;
        int n = 0, same = 0, pass = 0;
        rc = kv_needle_grid(&s, make_paged, &B, NULL, NULL, &res, &n, &e);
        KV_CHECK(rc == KV_OK && n == n_ref, "paged B=%d grid: %s", B, rc ? e.msg : "cells");
        for (int i = 0; i < n && !rc; i++) {
            const kv_needle_result *r = &res[i];
            pass += r->pass;
            KV_CHECK(r->expected < 0 || r->pass == r->expected, "paged B=%d %s L %d depth %d%% "
                     "(%s): %s, predicted %s", B, kv_recall_kind_name(r->kind), r->length,
                     r->depth, s.variants[r->variant].spec, r->pass ? "pass" : "fail",
                     r->expected ? "pass" : "fail");
            same += r->answer == ref[i].answer && !memcmp(&r->margin, &ref[i].margin, sizeof(float));
        }
        KV_CHECK(same == n, "paged B=%d: %d of %d cells differ from contiguous", B, n - same, n);
        printf("grid paged B=%d: %d of %d cells pass, %d identical to contiguous\n", B, pass, n,
               same);
        free(res);
    }
    free(ref);
}

/* The grid of @p file, its lengths up to @p max_len (0: all of them). */
static void run_grid(const char *dir, const char *file, int max_len)
{
    kv_needle_spec s;
    kv_err e;
    if (kv_test_needle_read(dir, file, &s)) return;
    int nl = 0;
    for (int i = 0; i < s.n_lengths; i++)
        if (!max_len || s.lengths[i] <= max_len) s.lengths[nl++] = s.lengths[i];
    s.n_lengths = nl;
    double t0 = kv_now();
    kv_needle_result *res;
    int n;
    int rc = kv_needle_grid(&s, kv_test_make_cpu, NULL, NULL, NULL, &res, &n, &e);
    KV_CHECK(rc == KV_OK, "grid %s: %s", s.name, e.msg);
    if (rc) return;
    int pass = 0;
    float min_margin = 1e9f;
    for (int i = 0; i < n; i++) {
        const kv_needle_result *r = &res[i];
        pass += r->pass;
        if (r->margin < min_margin) min_margin = r->margin;
        if (r->expected >= 0)
            KV_CHECK(r->pass == r->expected, "%s L %d depth %d%% (%s): %s, predicted %s "
                     "(margin %.3f)", kv_recall_kind_name(r->kind), r->length, r->depth,
                     s.variants[r->variant].spec, r->pass ? "pass" : "fail",
                     r->expected ? "pass" : "fail", r->margin);
    }
    printf("grid %s: %d of %d cells pass, smallest margin %.3f, %.1f s\n", s.name, pass, n,
           min_margin, kv_now() - t0);
    free(res);
}

/* Chapter 06: needles through a sliding-window cache, on the position-dependent (induction)
 * recall model. Predicted before measured, per needle: the question at position t finds the
 * fact only if the fact's value token (needle position + 1) is still retained, i.e. the
 * needle is at most W tokens before its question (distance <= W), or it sits in the S sink
 * tokens. So inside the window: retrieved; beyond it: lost (asserted lost); in the sinks:
 * kept whatever the distance. The same for both position schemes (the match is in head dims
 * RoPE leaves alone; the previous-token head sees neighbours at neighbouring positions in
 * both), both layouts and the per-token formats. */
static void run_window(void)
{
    enum { LEN = 1024, W = 256 };
    static const int depths[] = {0, 10, 40, 70, 80, 90, 100};
    const int n_depths = (int)(sizeof depths / sizeof depths[0]);
    /* scheme, sinks, dtype, paged */
    static const int variants[][4] = {{KV_POS_ORIGINAL, 0, KV_QF_F16, 0},
                                      {KV_POS_ORIGINAL, 4, KV_QF_INT8, 1},
                                      {KV_POS_CACHE, 4, KV_QF_F16, 1},
                                      {KV_POS_CACHE, 4, KV_QF_INT8, 0},
                                      {KV_POS_CACHE, 0, KV_QF_F32, 0}};
    kv_recall_opts o;
    kv_recall_opts_default(&o, KV_MODEL_RECALL_INDUCTION);
    kv_model m;
    kv_err e;
    if (kv_recall_build(&m, &o, &e)) {
        KV_CHECK(0, "recall model: %s", e.msg);
        return;
    }
    int tokens[LEN];
    kv_needle_item items[16];
    kv_needle_result res[16];
    if (kv_needle_build(KV_MODEL_RECALL_INDUCTION, LEN, depths, n_depths, 61, tokens, items, &e)) {
        KV_CHECK(0, "haystack: %s", e.msg);
        kv_model_free(&m);
        return;
    }
    printf("window needles (induction model, %d-token haystack, W = %d):\n", LEN, W);
    for (int v = 0; v < 5; v++) {
        const int scheme = variants[v][0], S = variants[v][1];
        kv_cache_spec sp = kv_cache_spec_default(1, LEN + 2 * n_depths);
        sp.quant.dtype = variants[v][2];
        sp.window.size = W;
        sp.window.n_sinks = S;
        sp.window.pos_scheme = scheme;
        if (variants[v][3]) {
            sp.layout.kind = KV_LAYOUT_PAGED;
            sp.layout.block_size = 16;
            sp.layout.n_blocks = (W + S + 15) / 16 + 2;
        }
        kv_backend *b = NULL;
        int rc = kv_backend_cpu(&b, &m, &sp, &e);
        if (!rc) rc = kv_needle_run(b, 0, KV_MODEL_RECALL_INDUCTION, tokens, LEN, items, n_depths,
                                    0, res, NULL, NULL, 0, 0, &e);
        KV_CHECK(rc == KV_OK, "window variant %d: %s", v, e.msg);
        int inside = 0, lost = 0, sunk = 0;
        for (int i = 0; i < n_depths && !rc; i++) {
            const kv_needle_result *r = &res[i];
            const int in_sinks = r->position + 1 < S; /* the value token is a sink */
            const int predicted = r->distance <= W || in_sinks;
            KV_CHECK(r->pass == predicted, "%s W %d S %d %s%s: needle at %d (distance %ld) %s, "
                     "predicted %s (margin %.3f)", kv_window_scheme_name(scheme), W, S,
                     kv_quant_name(sp.quant.dtype), variants[v][3] ? " paged" : "", r->position,
                     r->distance, r->pass ? "retrieved" : "lost", predicted ? "retrieved" : "lost",
                     r->margin);
            inside += r->pass && r->distance <= W;
            lost += !r->pass && !predicted;
            sunk += r->pass && in_sinks && r->distance > W;
        }
        /* the grid covers what it claims: needles retrieved inside, lost beyond, kept by sinks */
        KV_CHECK(inside >= 2 && lost >= 2 && (S == 0 || sunk == 1),
                 "variant %d covers inside (%d), lost (%d) and sink (%d) cells", v, inside, lost,
                 sunk);
        printf("  %-8s S %d %-5s %-10s  inside retrieved %d, beyond lost %d, in sinks kept %d\n",
               kv_window_scheme_name(scheme), S, kv_quant_name(sp.quant.dtype),
               variants[v][3] ? "paged" : "contiguous", inside, lost, sunk);
        kv_backend_destroy(b);
    }
    kv_model_free(&m);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_needle DATASETS/needle [slow]\n");
        return 2;
    }
    kv_recall_vocab_get(&V);
    const int slow = argc > 2 && !strcmp(argv[2], "slow");
    test_spec_parse();
    test_build();
    run_grid(argv[1], slow ? "full.needle" : "fast.needle", 0);
    /* chapter 06's figure: its predictions hold (the 4k contexts with the slow label) */
    run_grid(argv[1], "ch06-grid.needle", slow ? 0 : 2048);
    run_paged(slow);
    run_window();
    return kv_test_finish();
}
