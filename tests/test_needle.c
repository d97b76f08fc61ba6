/* Needle grid (issue 4): spec parsing, haystack construction, the prediction rules, and the
 * grid itself on the CPU. Predicted before measured: an exact (fp32) cache passes every cell.
 *
 *   test_needle DATASETS/needle          the fast grid (fast.needle)
 *   test_needle DATASETS/needle slow     the full grid (full.needle; label slow)  */
#include "kv_test.h"

#include "kv_needle.h"

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

static int make_cpu(kv_backend **out, const kv_model *m, const kv_cache_spec *spec, void *user,
                    kv_err *err)
{
    (void)user;
    return kv_backend_cpu(out, m, spec, err);
}

static void run_grid(const char *path)
{
    kv_needle_spec s;
    kv_err e;
    kv_needle_spec_default(&s);
    if (kv_needle_spec_read(path, &s, &e)) {
        KV_CHECK(0, "%s", e.msg);
        return;
    }
    double t0 = kv_now();
    kv_needle_result *res;
    int n;
    int rc = kv_needle_grid(&s, make_cpu, NULL, NULL, NULL, &res, &n, &e);
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

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_needle DATASETS/needle [slow]\n");
        return 2;
    }
    kv_recall_vocab_get(&V);
    const int slow = argc > 2 && !strcmp(argv[2], "slow");
    char path[1024];
    test_spec_parse();
    test_build();
    snprintf(path, sizeof path, "%s/%s", argv[1], slow ? "full.needle" : "fast.needle");
    run_grid(path);
    return kv_test_finish();
}
