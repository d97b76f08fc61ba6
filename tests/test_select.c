/* Chapter 09: the selectors of kv_select.h on the CPU, each against a brute-force reference
 * written plainly (common/test_select_common.h): compute every score, sort everything, take
 * the first k. This file: the ranking, budget bytes, L2 norms and H2O heavy hitters; SnapKV,
 * Quest and attention over a kept set: test_select_query.c.
 *
 * Predicted before measured:
 *  - every selector keeps exactly the set the brute force keeps, ties included: the library
 *    ranks with one heap (O(n log k)), the reference with a full sort under the documented
 *    total order (larger score first, equal scores earlier position first; the smallest-norm
 *    direction and H2O's eviction as the header states). Cases with many exact ties (keys
 *    of small integers, probabilities in eighths) make the tie rule decide;
 *  - keys are read through the cache (fp32, fp16, int8, int4-KIVI; contiguous and paged with
 *    blocks in reverse order) and the reference reads them element by element with
 *    kv_cache_elem(), a different path that gives the same bits;
 *  - H2O run step by step (append, observe, evict) keeps and evicts what a recomputation of
 *    every mass from the whole history of probabilities picks at each step;
 *  - L2 with no window or sinks and B = n/2: the two directions keep complementary sets
 *    (the two ends of one total order), ties included;
 *  - budget accounting: exact byte counts for fp32 / fp16 / int8 / int8-g32 / fp8 rows, KIVI
 *    refused. */
#include "common/test_select_common.h"

/* ---- the ranking ---------------------------------------------------------------------------- */

static void test_topk(void)
{
    kv_rng r;
    kv_rng_seed(&r, 91);
    const int sizes[] = {1, 2, 7, 64, 1000};
    for (int si = 0; si < 5; si++) {
        const int n = sizes[si];
        double *s = malloc((size_t)n * sizeof(double));
        int *all = iota(n), *got = malloc((size_t)n * sizeof(int)), *ref = malloc((size_t)n * sizeof(int));
        for (int ties = 0; ties < 2; ties++) {
            for (int i = 0; i < n; i++) /* ties: scores among 5 values */
                s[i] = ties ? (double)(kv_rng_u32(&r) % 5) : (double)kv_rng_float(&r);
            const int ks[] = {0, 1, 3, n / 2, n - 1, n, n + 5};
            for (int ki = 0; ki < 7; ki++)
                for (int largest = 0; largest < 2; largest++) {
                    const int k = ks[ki];
                    const int m = kv_select_topk(s, n, k, largest, got);
                    const int mr = bf_pick(s, all, n, k, largest, largest, ref);
                    KV_CHECK(same_set(got, m, ref, mr),
                             "topk n %d k %d largest %d ties %d: %d vs %d kept", n, k, largest,
                             ties, m, mr);
                }
        }
        free(s);
        free(all);
        free(got);
        free(ref);
    }
}

/* ---- budget accounting ---------------------------------------------------------------------- */

static void test_bytes(void)
{
    kv_select_bytes b;
    kv_err e;
    const int d = 64, rows = 37;
    /* by hand: K and V codes, per-row scales, fp8's two head scales, a 4-byte index per row */
    struct { int fmt; int64_t want; } cases[] = {
        {KV_QF_F32, 37 * 2 * 64 * 4 + 37 * 4},
        {KV_QF_F16, 37 * 2 * 64 * 2 + 37 * 4},
        {KV_QF_BF16, 37 * 2 * 64 * 2 + 37 * 4},
        {KV_QF_INT8, 37 * 2 * (64 + 4) + 37 * 4},
        {KV_QF_INT8_G32, 37 * 2 * (64 + 8) + 37 * 4},
        {KV_QF_FP8_E4M3, 37 * 2 * 64 + 8 + 37 * 4},
    };
    for (int i = 0; i < 6; i++) {
        const int rc = kv_select_bytes_kept(cases[i].fmt, d, rows, &b, &e);
        KV_CHECK(rc == KV_OK && b.total == cases[i].want &&
                     b.total == b.code_bytes + b.meta_bytes + b.index_bytes && b.rows == rows,
                 "bytes %s: %lld, want %lld", kv_quant_name(cases[i].fmt), (long long)b.total,
                 (long long)cases[i].want);
    }
    /* a kept set of every row, index aside, is what the full cache stores per head (int8) */
    KV_CHECK(kv_select_bytes_kept(KV_QF_INT8, d, rows, &b, &e) == KV_OK &&
                 b.code_bytes + b.meta_bytes ==
                     2 * (int64_t)(kv_quant_code_bytes(KV_QF_INT8, rows, d) +
                                   kv_quant_meta_bytes(KV_QF_INT8, KV_QROLE_KEY, rows, d)),
             "int8 kept-all bytes vs kv_quant sizes");
    KV_CHECK(kv_select_bytes_kept(KV_QF_INT4_KIVI, d, rows, &b, &e) == KV_ERR_UNSUPPORTED,
             "KIVI refused");
    KV_CHECK(kv_select_bytes_kept(99, d, rows, &b, &e) == KV_ERR_ARG, "unknown format refused");
    kv_select_budget bt = {0, 0.25};
    KV_CHECK(kv_select_budget_tokens(&bt, 100) == 25, "ratio 0.25 of 100");
    bt.ratio = 0.3;
    KV_CHECK(kv_select_budget_tokens(&bt, 10) == 3, "ratio 0.3 of 10: %lld",
             (long long)kv_select_budget_tokens(&bt, 10));
    bt.ratio = 0.01;
    KV_CHECK(kv_select_budget_tokens(&bt, 10) == 1, "a ratio rounds up");
    bt.tokens = 500;
    KV_CHECK(kv_select_budget_tokens(&bt, 100) == 100, "tokens clamp to n");
}

/* A plan keeping every position of every head costs, index aside, exactly what the cache
 * holds (kv_cache_bytes(), whose layout is kv_cache_layout()): two layers, selective formats. */
static void test_plan_bytes(void)
{
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8, KV_QF_INT8_G32, KV_QF_FP8_E4M3};
    for (int fi = 0; fi < 5; fi++)
        for (int sel = 0; sel < 2; sel++) {
            kv_config g = {0};
            const int d = 64, Hkv = 2, n = 45, L = 2;
            g.dim = 4 * d;
            g.hidden_dim = 64;
            g.n_layers = L;
            g.n_heads = 4;
            g.n_kv_heads = Hkv;
            g.vocab_size = 16;
            g.seq_len = n;
            kv_config_set_defaults(&g);
            kv_cache_spec s = kv_cache_spec_default(1, n);
            s.quant.dtype = fmts[fi];
            s.quant.dtype_layers = sel ? 2 : 0; /* selective: layer 1 in dtype, layer 0 fp16 */
            kv_cache c;
            kv_err e;
            if (kv_cache_create(&c, &g, &s, &e)) {
                KV_CHECK(0, "create: %s", e.msg);
                continue;
            }
            kv_select_plan pl;
            KV_CHECK(kv_select_plan_init(&pl, L, Hkv, &e) == KV_OK, "plan init");
            for (int l = 0; l < L; l++)
                for (int h = 0; h < Hkv; h++) {
                    kv_select_set *set = kv_select_plan_set(&pl, l, h);
                    kv_select_set_reserve(set, n, &e);
                    for (int p = 0; p < n; p++) set->pos[p] = p;
                    set->n = n;
                }
            kv_select_bytes b;
            const int rc = kv_select_plan_bytes(&pl, &s, d, &b, &e);
            KV_CHECK(rc == KV_OK && b.index_bytes == (int64_t)L * Hkv * n * 4 &&
                         b.total - b.index_bytes == (int64_t)kv_cache_bytes(&c),
                     "plan keeping all == kv_cache_bytes, %s selective %d: %lld vs %zu",
                     kv_dtype_name(fmts[fi]), sel, (long long)(b.total - b.index_bytes),
                     kv_cache_bytes(&c));
            /* keep half of layer 0's head 1: its K and V rows leave the count */
            kv_select_plan_set(&pl, 0, 1)->n = n / 2;
            kv_select_bytes half;
            kv_select_plan_bytes(&pl, &s, d, &half, &e);
            const int f0 = kv_cache_spec_layer_dtype(&s, 0), g0 = kvq_row_group(f0, KV_QROLE_KEY, d);
            const int64_t per_row = 2 * (kvq_row_bytes(f0, d) + (g0 ? d / g0 * 4 : 0)) + 4;
            KV_CHECK(b.total - half.total == (n - n / 2) * per_row,
                     "dropping %d rows drops %lld bytes each, %s", n - n / 2, (long long)per_row,
                     kv_dtype_name(fmts[fi]));
            kv_select_plan_free(&pl);
            kv_cache_free(&c);
        }
}

/* ---- L2 norm ------------------------------------------------------------------------------- */

/* ||k_p||^2 read element by element (kv_cache_elem), double, channel order. */
static double bf_norm(const kv_head_view *h, int p)
{
    double s = 0.0;
    for (int j = 0; j < h->d; j++) {
        const float x = kv_cache_elem(h, p, j);
        s += (double)x * x;
    }
    return s;
}

static int bf_l2(const kv_head_view *h, int n, int64_t budget, int largest, int W, int S, int *out)
{
    double *s = malloc((size_t)n * sizeof(double));
    int *cand = malloc((size_t)n * sizeof(int)), *pick = malloc((size_t)n * sizeof(int));
    int nc = 0, nf = 0;
    for (int p = 0; p < n; p++) {
        s[p] = bf_norm(h, p);
        if (p < S || p >= n - W) nf++;
        else cand[nc++] = p;
    }
    const int64_t rest = budget - nf;
    const int m = bf_pick(s, cand, nc, rest > 0 ? (int)rest : 0, largest, largest, pick);
    char *mark = calloc((size_t)n, 1);
    for (int i = 0; i < m; i++) mark[pick[i]] = 1;
    int o = 0;
    for (int p = 0; p < n; p++)
        if (mark[p] || p < S || p >= n - W) out[o++] = p;
    free(s);
    free(cand);
    free(pick);
    free(mark);
    return o;
}

static void test_l2(void)
{
    const int dtypes[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8, KV_QF_INT4_KIVI};
    for (int di = 0; di < 4; di++)
        for (int paged = 0; paged < 2; paged++)
            for (int ints = 0; ints < 2; ints++) {
                cache_case cc;
                const int n = 203;
                if (!make_cache(&cc, 64, 4, 2, dtypes[di], paged ? 32 : 0, n, ints,
                                100 + di * 4 + paged * 2 + ints))
                    continue;
                int *ref = malloc((size_t)n * sizeof(int));
                kv_select_set got = {0};
                kv_err e;
                for (int kvh = 0; kvh < 2; kvh++) {
                    const kv_head_view h = kv_cache_view(&cc.c, 0, 0, kvh, KV_QROLE_KEY);
                    const int64_t budgets[] = {0, 1, 20, 101, 150, 203, 400};
                    const int wins[][2] = {{0, 0}, {16, 0}, {16, 4}, {0, 4}, {250, 0}};
                    for (int bi = 0; bi < 7; bi++)
                        for (int wi = 0; wi < 5; wi++)
                            for (int largest = 0; largest < 2; largest++) {
                                const int W = wins[wi][0], S = wins[wi][1];
                                const int rc = kv_select_l2(&h, n, budgets[bi], largest, W, S,
                                                            &got, &e);
                                const int m = bf_l2(&h, n, budgets[bi], largest, W, S, ref);
                                KV_CHECK(rc == KV_OK && same_set(got.pos, got.n, ref, m),
                                         "l2 %s paged %d ints %d B %lld W %d S %d largest %d: "
                                         "%d vs %d kept", kv_dtype_name(dtypes[di]), paged, ints,
                                         (long long)budgets[bi], W, S, largest, got.n, m);
                            }
                    /* complementary directions: no window, no sinks, B = n/2 (n made even) */
                    kv_select_set big = {0}, small = {0};
                    const int ne = n - 1;
                    kv_select_l2(&h, ne, ne / 2, 1, 0, 0, &big, &e);
                    kv_select_l2(&h, ne, ne / 2, 0, 0, 0, &small, &e);
                    int overlap = 0;
                    for (int i = 0; i < big.n; i++) overlap += kv_select_set_has(&small, big.pos[i]);
                    KV_CHECK(big.n == ne / 2 && small.n == ne / 2 && overlap == 0,
                             "l2 complementary %s ints %d: %d + %d kept, %d overlap",
                             kv_dtype_name(dtypes[di]), ints, big.n, small.n, overlap);
                    kv_select_set_free(&big);
                    kv_select_set_free(&small);
                }
                kv_select_set_free(&got);
                free(ref);
                kv_cache_free(&cc.c);
            }
}

/* ---- heavy hitters (H2O) ------------------------------------------------------------------- */

/* Step-by-step H2O against a recomputation from the whole history. Probabilities are eighths
 * 0 .. (levels-1)/8 (exact in float and double; few levels, many ties; levels 1: all zero, so
 * the tie rule alone decides and H2O degenerates to a window keeping the newest); a step's
 * probs are [G][kept] over the kept set. */
static void test_h2o_case(int G, int budget, int window, int prompt, int steps, int levels,
                          uint64_t seed)
{
    const int N = prompt + steps; /* positions ever */
    const int n_obs = prompt + steps; /* observations: one per prompt query, one per step */
    float *hist = calloc((size_t)n_obs * G * N, sizeof(float)); /* [n_obs][G][N] by position */
    char *kept = calloc((size_t)N, 1);                            /* reference's kept flags */
    double *mass = malloc((size_t)N * sizeof(double));
    int *cand = malloc((size_t)N * sizeof(int)), *ref_ev = malloc((size_t)N * sizeof(int));
    int *ev = malloc((size_t)N * sizeof(int));
    kv_select_h2o s;
    kv_err e;
    kv_rng r;
    kv_rng_seed(&r, seed);
    if (kv_select_h2o_init(&s, budget, window, &e)) {
        KV_CHECK(0, "h2o init: %s", e.msg);
        return;
    }
    int obs = 0, seen = 0, ok = 1;
    for (int stage = 0; stage <= steps && ok; stage++) {
        const int n_new = stage == 0 ? prompt : 1;
        const int n_q = n_new; /* the prompt's queries, or the one new token */
        KV_CHECK(kv_select_h2o_append(&s, n_new, &e) == KV_OK, "append");
        for (int i = 0; i < n_new; i++) kept[seen + i] = 1;
        seen += n_new;
        for (int qi = 0; qi < n_q; qi++, obs++) {
            const int t = seen - n_new + qi; /* this query's position: it sees kept keys <= t */
            float *probs = calloc((size_t)G * s.n, sizeof(float)); /* [G][kept] */
            for (int g = 0; g < G; g++)
                for (int i = 0; i < s.n; i++)
                    if (s.pos[i] <= t) {
                        const float p = (float)(kv_rng_u32(&r) % levels) / 8.0f;
                        probs[(size_t)g * s.n + i] = p;
                        hist[((size_t)obs * G + g) * N + s.pos[i]] = p;
                    }
            kv_select_h2o_observe(&s, probs, G);
            free(probs);
        }
        const int m = kv_select_h2o_evict(&s, ev);
        /* the reference: every kept mass recomputed from the history, the lowest evicted */
        int nk = 0, nc = 0;
        for (int p = 0; p < seen; p++) {
            if (!kept[p]) continue;
            nk++;
            double acc = 0.0;
            for (int o = 0; o < obs; o++) {
                float step = 0.0f;
                for (int g = 0; g < G; g++) step += hist[((size_t)o * G + g) * N + p];
                acc += step;
            }
            mass[p] = acc;
            if (p < seen - window) cand[nc++] = p;
        }
        const int over = nk > budget ? nk - budget : 0;
        const int mr = bf_pick(mass, cand, nc, over, 0, 1, ref_ev);
        for (int i = 0; i < mr; i++) kept[ref_ev[i]] = 0;
        int same = same_set(ev, m, ref_ev, mr) && s.n == nk - mr && s.n <= budget;
        for (int i = 0; same && i < s.n; i++)
            same = kept[s.pos[i]] && s.mass[i] == mass[s.pos[i]];
        KV_CHECK(same, "h2o G %d B %d W %d stage %d: evicted %d vs %d, kept %d", G, budget,
                 window, stage, m, mr, s.n);
        ok = same;
    }
    kv_select_set set = {0};
    KV_CHECK(kv_select_h2o_kept(&s, &set, &e) == KV_OK && set.n == s.n &&
                 (window == 0 || set.pos[s.n - 1] == N - 1),
             "h2o kept set ends at the newest token");
    kv_select_set_free(&set);
    kv_select_h2o_free(&s);
    free(hist);
    free(kept);
    free(mass);
    free(cand);
    free(ref_ev);
    free(ev);
}

static void test_h2o(void)
{
    test_h2o_case(1, 8, 2, 12, 30, 9, 1);
    test_h2o_case(4, 16, 4, 40, 60, 9, 2);
    test_h2o_case(2, 10, 10, 5, 40, 9, 3);  /* W = B: only the window survives */
    test_h2o_case(8, 33, 0, 64, 50, 9, 4);  /* no window */
    test_h2o_case(1, 100, 8, 20, 30, 9, 5); /* never over budget: nothing evicted */
    test_h2o_case(1, 12, 3, 30, 40, 2, 6);  /* masses tie often */
    test_h2o_case(2, 12, 0, 30, 40, 1, 7);  /* all tie: the earliest go first */
    kv_select_h2o s;
    kv_err e;
    KV_CHECK(kv_select_h2o_init(&s, 4, 5, &e) == KV_ERR_ARG, "W > B refused");
    KV_CHECK(kv_select_h2o_init(&s, 0, 0, &e) == KV_ERR_ARG, "B = 0 refused");
}

int main(void)
{
    test_topk();
    test_bytes();
    test_plan_bytes();
    test_l2();
    test_h2o();
    return kv_test_finish();
}
