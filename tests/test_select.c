/* Chapter 09: the selectors of kv_select.h on the CPU, each against a brute-force reference
 * written plainly here: compute every score, sort everything, take the first k.
 *
 * Predicted before measured:
 *  - every selector keeps exactly the set the brute force keeps, ties included: the library
 *    ranks with one heap (O(n log k)), the reference with a full sort under the documented
 *    total order (larger score first, equal scores earlier position first; the smallest-norm
 *    direction and H2O's eviction as the header states). Cases with many exact ties (keys
 *    of small integers, probabilities in eighths, max-pooled votes) make the tie rule decide;
 *  - keys are read through the cache (fp32, fp16, int8, int4-KIVI; contiguous and paged with
 *    blocks in reverse order) and the reference reads them element by element with
 *    kv_cache_elem(), a different path that gives the same bits;
 *  - H2O run step by step (append, observe, evict) keeps and evicts what a recomputation of
 *    every mass from the whole history of probabilities picks at each step;
 *  - Quest: a page's bound >= q·k of each of its keys (both in double, same channel order:
 *    exact products, monotone rounding, so no tolerance). Provable consequence checked: let
 *    s* be the top key's score and c the number of pages with bound >= s*; the top key's page
 *    has bound >= s*, every page ranked above it has bound >= its bound >= s*, so it ranks
 *    within the first c: with k_pages >= c it is always chosen;
 *  - L2 with no window or sinks and B = n/2: the two directions keep complementary sets
 *    (the two ends of one total order), ties included;
 *  - budget accounting: exact byte counts for fp32 / fp16 / int8 / int8-g32 / fp8 rows, KIVI
 *    refused; attention over the full set is kv_attention()'s bits. */
#include "kv_test.h"

#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "kv_select.h"

#include <string.h>

/* ---- a one-layer, one-slot cache of n random tokens ---------------------------------------- */

typedef struct {
    kv_config cfg;
    kv_cache c;
    int H, Hkv, d, n;
} cache_case;

/* ints = 1: keys of small integers in {-1, 0, 1}, so norms and dots tie often; ints = 2:
 * keys clustered by page of 16 (a random centre per page and head, noise 0.05), so Quest's
 * bounds are tight and pages differ. */
static int make_cache(cache_case *cc, int d, int H, int Hkv, int dtype, int B, int n, int ints,
                      uint64_t seed)
{
    memset(cc, 0, sizeof *cc);
    kv_config *g = &cc->cfg;
    g->dim = H * d;
    g->hidden_dim = 64;
    g->n_layers = 1;
    g->n_heads = H;
    g->n_kv_heads = Hkv;
    g->vocab_size = 16;
    g->seq_len = n;
    kv_config_set_defaults(g);
    kv_cache_spec s = kv_cache_spec_default(1, n);
    s.dtype = dtype;
    if (B) {
        s.layout = KV_LAYOUT_PAGED;
        s.block_size = B;
        s.n_blocks = (n + B - 1) / B + 2;
    }
    kv_err e;
    if (kv_cache_create(&cc->c, g, &s, &e)) {
        KV_CHECK(0, "kv_cache_create: %s", e.msg);
        return 0;
    }
    if (B) { /* blocks in reverse order: logical neighbours are not physical ones */
        const int nb = (n + B - 1) / B;
        int *t = malloc((size_t)nb * sizeof(int));
        for (int i = 0; i < nb; i++) t[i] = s.n_blocks - 1 - i;
        const int rc = kv_cache_set_blocks(&cc->c, 0, t, nb, &e);
        free(t);
        if (rc) {
            KV_CHECK(0, "set_blocks: %s", e.msg);
            kv_cache_free(&cc->c);
            return 0;
        }
    }
    kv_rng r;
    kv_rng_seed(&r, seed);
    const size_t m = (size_t)n * Hkv * d;
    float *k = malloc(m * sizeof(float)), *v = malloc(m * sizeof(float)); /* [n][H_kv][d] */
    const size_t pd = (size_t)Hkv * d; /* one token's keys */
    float *centre = malloc(((size_t)n / 16 + 1) * pd * sizeof(float)); /* [pages][H_kv][d] */
    for (size_t i = 0; i < ((size_t)n / 16 + 1) * pd; i++) centre[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < m; i++)
        k[i] = ints == 1   ? (float)((int)(kv_rng_u32(&r) % 3) - 1)
               : ints == 2 ? centre[(i / pd / 16) * pd + i % pd] + kv_rng_uniform(&r, -0.05f, 0.05f)
                           : kv_rng_uniform(&r, -1.0f, 1.0f);
    free(centre);
    for (size_t i = 0; i < m; i++) v[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    const int rc = kv_cache_write_seq(&cc->c, 0, 0, 0, n, k, v, &e);
    free(k);
    free(v);
    if (rc) {
        KV_CHECK(0, "write_seq: %s", e.msg);
        kv_cache_free(&cc->c);
        return 0;
    }
    cc->c.len[0] = n;
    cc->H = H;
    cc->Hkv = Hkv;
    cc->d = d;
    cc->n = n;
    return 1;
}

static float *rand_floats(size_t n, float amp, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = amp * kv_rng_uniform(&r, -1.0f, 1.0f);
    return x;
}

/* ---- the brute force: sort everything, take the first k ------------------------------------ */

static const double *bf_s; /* the scores qsort's comparator reads */
static int bf_larger, bf_earlier;

static int bf_cmp(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    if (bf_s[x] != bf_s[y])
        return bf_larger ? (bf_s[x] > bf_s[y] ? -1 : 1) : (bf_s[x] < bf_s[y] ? -1 : 1);
    return bf_earlier ? (x < y ? -1 : 1) : (x > y ? -1 : 1);
}

/* Indices cand [nc] sorted by score s (indexed by the candidate's value) in the given order;
 * the first k, then sorted ascending, into out; returns how many. */
static int bf_pick(const double *s, const int *cand, int nc, int k, int larger, int earlier,
                   int *out)
{
    int *o = malloc((size_t)(nc ? nc : 1) * sizeof(int));
    memcpy(o, cand, (size_t)nc * sizeof(int));
    bf_s = s;
    bf_larger = larger;
    bf_earlier = earlier;
    qsort(o, (size_t)nc, sizeof(int), bf_cmp);
    if (k > nc) k = nc;
    if (k < 0) k = 0;
    /* ascending: mark and sweep */
    int m = 0, maxv = 0;
    for (int i = 0; i < nc; i++)
        if (cand[i] > maxv) maxv = cand[i];
    char *mark = calloc((size_t)maxv + 1, 1);
    for (int i = 0; i < k; i++) mark[o[i]] = 1;
    for (int i = 0; i <= maxv; i++)
        if (mark[i]) out[m++] = i;
    free(mark);
    free(o);
    return m;
}

static int same_set(const int *a, int na, const int *b, int nb)
{
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static int *iota(int n)
{
    int *x = malloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) x[i] = i;
    return x;
}

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
            s.dtype = fmts[fi];
            s.dtype_layers = sel ? 2 : 0; /* selective: layer 1 in dtype, layer 0 fp16 */
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

/* ---- SnapKV ---------------------------------------------------------------------------------- */

static void test_snapkv(void)
{
    const int dtypes[] = {KV_QF_F32, KV_QF_INT8};
    for (int di = 0; di < 2; di++)
        for (int paged = 0; paged < 2; paged++) {
            cache_case cc;
            const int n = 150, G = 4, w = 8;
            if (!make_cache(&cc, 64, 8, 2, dtypes[di], paged ? 16 : 0, n, 0, 300 + di * 2 + paged))
                continue;
            const int d = cc.d, np = n - w;
            float *q = rand_floats((size_t)w * G * d, 3.0f, 400 + di); /* [w][G][d] */
            double *votes = malloc((size_t)np * sizeof(double)), *ref = calloc((size_t)np, sizeof(double));
            float *att = malloc((size_t)n * sizeof(float)), *row = malloc((size_t)d * sizeof(float));
            kv_err e;
            const kv_head_view h = kv_cache_view(&cc.c, 0, 0, 1, KV_QROLE_KEY);
            KV_CHECK(kv_select_snapkv_votes(&h, n, q, w, G, votes, &e) == KV_OK, "votes");
            /* the reference: each observation query's softmax, element reads, summed plainly */
            const float scale = 1.0f / sqrtf((float)d);
            for (int i = 0; i < w; i++)
                for (int g = 0; g < G; g++) {
                    const int t = np + i;
                    const float *qr = q + ((size_t)i * G + g) * d;
                    float mx = -INFINITY, sum;
                    for (int p = 0; p <= t; p++) {
                        for (int j = 0; j < d; j++) row[j] = kv_cache_elem(&h, p, j);
                        att[p] = kv_dot(qr, row, d) * scale;
                        if (att[p] > mx) mx = att[p];
                    }
                    sum = kv_attn_exp_sum(att, t + 1, mx); /* the family's exp and sum */
                    for (int p = 0; p < np; p++) ref[p] += att[p] / sum;
                }
            int same = 1;
            for (int p = 0; p < np; p++) same &= votes[p] == ref[p];
            KV_CHECK(same, "snapkv votes %s paged %d == reference, bit for bit",
                     kv_dtype_name(dtypes[di]), paged);
            /* pick: on the real votes and on tied votes (quarters), several kernels/budgets */
            double *tied = malloc((size_t)np * sizeof(double)), *pool = malloc((size_t)n * sizeof(double));
            for (int p = 0; p < np; p++) tied[p] = (double)((p * 7919) % 5) / 4.0;
            int *cand = iota(np), *pick = malloc((size_t)n * sizeof(int)), *refset = malloc((size_t)n * sizeof(int));
            kv_select_set got = {0};
            for (int tv = 0; tv < 2; tv++) {
                const double *vv = tv ? tied : votes;
                const int kernels[] = {1, 3, 7};
                const int64_t budgets[] = {4, 8, 20, 64, 150};
                for (int ki = 0; ki < 3; ki++)
                    for (int bi = 0; bi < 5; bi++) {
                        const int kern = kernels[ki];
                        for (int p = 0; p < np; p++) { /* pooled plainly */
                            double m = -INFINITY;
                            for (int j = p - kern / 2; j <= p + kern / 2; j++)
                                if (j >= 0 && j < np && vv[j] > m) m = vv[j];
                            pool[p] = m;
                        }
                        const int64_t rest = budgets[bi] - w;
                        const int m = bf_pick(pool, cand, np, rest > 0 ? (int)rest : 0, 1, 1, pick);
                        for (int i = 0; i < w; i++) pick[m + i] = np + i;
                        const int rc = kv_select_snapkv_pick(vv, np, w, kern, budgets[bi], &got, &e);
                        KV_CHECK(rc == KV_OK && same_set(got.pos, got.n, pick, m + w),
                                 "snapkv pick tied %d kernel %d B %lld: %d vs %d kept", tv, kern,
                                 (long long)budgets[bi], got.n, m + w);
                        if (!tv && ki == 2 && bi == 2) { /* the whole selector: same set */
                            kv_select_set all = {0};
                            KV_CHECK(kv_select_snapkv(&h, n, q, w, G, 7, 20, &all, &e) == KV_OK &&
                                         same_set(all.pos, all.n, pick, m + w),
                                     "kv_select_snapkv == votes + pick");
                            kv_select_set_free(&all);
                        }
                        (void)refset;
                    }
            }
            KV_CHECK(kv_select_snapkv_pick(votes, np, w, 4, 20, &got, &e) == KV_ERR_ARG,
                     "even kernel refused");
            KV_CHECK(kv_select_snapkv_votes(&h, n, q, n + 1, G, votes, &e) == KV_ERR_ARG,
                     "window longer than the prompt refused");
            kv_select_set_free(&got);
            free(q);
            free(votes);
            free(ref);
            free(att);
            free(row);
            free(tied);
            free(pool);
            free(cand);
            free(pick);
            free(refset);
            kv_cache_free(&cc.c);
        }
}

/* ---- Quest pages and exact top-k keys ------------------------------------------------------ */

static double bf_dot(const kv_head_view *h, int p, const float *q)
{
    double s = 0.0;
    for (int j = 0; j < h->d; j++) s += (double)q[j] * kv_cache_elem(h, p, j);
    return s;
}

static int quest_tight; /* cases where fewer pages than all bound above the top key */

static void test_quest(void)
{
    const int dtypes[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8};
    const int lens[] = {1, 16, 17, 333};
    for (int di = 0; di < 3; di++)
        for (int li = 0; li < 4; li++)
            for (int paged = 0; paged < 2; paged++) {
                cache_case cc;
                const int n = lens[li], G = 4, P = KV_SELECT_PAGE;
                if (!make_cache(&cc, 64, 8, 2, dtypes[di], paged ? 8 : 0, n, li == 3 ? 1 + di % 2 : 0,
                                500 + di * 8 + li * 2 + paged))
                    continue;
                const int d = cc.d, npg = (n + P - 1) / P;
                const kv_head_view h = kv_cache_view(&cc.c, 0, 0, 1, KV_QROLE_KEY);
                kv_select_pages pg, pg2;
                kv_err e;
                kv_select_pages_init(&pg, P, d, &e);
                kv_select_pages_init(&pg2, P, d, &e);
                KV_CHECK(kv_select_pages_update(&pg, &h, n, &e) == KV_OK && pg.n_pages == npg,
                         "pages of %d keys", n);
                /* incremental, one token at a time, gives the same min / max */
                for (int t = 1; t <= n; t++) kv_select_pages_update(&pg2, &h, t, &e);
                KV_CHECK(pg2.n_pages == npg &&
                             !memcmp(pg.kmin, pg2.kmin, (size_t)npg * d * sizeof(float)) &&
                             !memcmp(pg.kmax, pg2.kmax, (size_t)npg * d * sizeof(float)),
                         "pages incremental == whole, n %d", n);
                double *bound = malloc((size_t)npg * sizeof(double)), *dot = malloc((size_t)n * sizeof(double));
                int *pages = malloc((size_t)npg * sizeof(int)), *ref = malloc((size_t)npg * sizeof(int));
                int *all = iota(npg), *top = malloc((size_t)n * sizeof(int)), *reft = malloc((size_t)n * sizeof(int));
                int *allk = iota(n);
                char *mark = malloc((size_t)npg);
                for (int trial = 0; trial < 6; trial++) {
                    float *q = rand_floats((size_t)G * d, 3.0f, 600 + trial * 31 + li); /* [G][d] */
                    int bound_ok = 1;
                    for (int g = 0; g < G; g++) {
                        const float *qg = q + (size_t)g * d;
                        for (int i = 0; i < npg; i++) bound[i] = kv_select_page_bound(&pg, i, qg);
                        int best = 0;
                        for (int p = 0; p < n; p++) {
                            dot[p] = bf_dot(&h, p, qg);
                            bound_ok &= bound[p / P] >= dot[p];
                            if (dot[p] > dot[best]) best = p;
                        }
                        /* the provable property: k_pages = c pages with bound >= s* suffice */
                        int c = 0;
                        for (int i = 0; i < npg; i++) c += bound[i] >= dot[best];
                        const int m = kv_select_topk(bound, npg, c, 1, top);
                        int found = 0;
                        for (int i = 0; i < m; i++) found |= top[i] == best / P;
                        KV_CHECK(found, "quest: top key %d's page in the top %d pages", best, c);
                        quest_tight += c < npg; /* the property says something: c < pages */
                        /* exact top-k keys per query vs brute force */
                        const int kk = 5 + trial;
                        const int mk = kv_select_topk_keys(&h, n, qg, kk, top);
                        const int mr = bf_pick(dot, allk, n, kk, 1, 1, reft);
                        KV_CHECK(same_set(top, mk, reft, mr), "topk keys k %d n %d", kk, n);
                    }
                    KV_CHECK(bound_ok, "quest bound >= q.k for every key, %s n %d trial %d",
                             kv_dtype_name(dtypes[di]), n, trial);
                    /* page choice: union over the group of each head's top k, + the last page */
                    const int kp = 1 + trial % 3;
                    memset(mark, 0, (size_t)npg);
                    for (int g = 0; g < G; g++) {
                        for (int i = 0; i < npg; i++)
                            bound[i] = kv_select_page_bound(&pg, i, q + (size_t)g * d);
                        const int m = bf_pick(bound, all, npg, kp, 1, 1, ref);
                        for (int i = 0; i < m; i++) mark[ref[i]] = 1;
                    }
                    mark[npg - 1] = 1;
                    int nr = 0;
                    for (int i = 0; i < npg; i++)
                        if (mark[i]) ref[nr++] = i;
                    const int np = kv_select_quest_pages(&pg, q, G, kp, pages);
                    KV_CHECK(same_set(pages, np, ref, nr), "quest pages k %d n %d: %d vs %d", kp,
                             n, np, nr);
                    kv_select_set set = {0};
                    int cover = kv_select_quest(&pg, q, G, kp, &set, &e) == KV_OK;
                    for (int i = 0; cover && i < set.n; i++)
                        cover = mark[set.pos[i] / P] && (i == 0 || set.pos[i] > set.pos[i - 1]);
                    int count = 0;
                    for (int p = 0; p < n; p++) count += mark[p / P];
                    KV_CHECK(cover && set.n == count && set.pos[set.n - 1] == n - 1,
                             "quest positions = the chosen pages' tokens, n %d", n);
                    kv_select_set_free(&set);
                    free(q);
                }
                free(bound);
                free(dot);
                free(pages);
                free(ref);
                free(all);
                free(top);
                free(reft);
                free(allk);
                free(mark);
                kv_select_pages_free(&pg);
                kv_select_pages_free(&pg2);
                kv_cache_free(&cc.c);
            }
}

/* ---- attention over a kept set ------------------------------------------------------------- */

static void test_attend(void)
{
    const int dtypes[] = {KV_QF_F32, KV_QF_INT8};
    for (int di = 0; di < 2; di++)
        for (int paged = 0; paged < 2; paged++) {
            cache_case cc;
            const int n = 97, H = 8;
            if (!make_cache(&cc, 64, H, 2, dtypes[di], paged ? 16 : 0, n, 0, 700 + di * 2 + paged))
                continue;
            const int d = cc.d;
            float *q = rand_floats((size_t)H * d, 3.0f, 800 + di); /* [H][d] */
            float *full = malloc((size_t)H * d * sizeof(float)), *got = malloc((size_t)d * sizeof(float));
            float *att = malloc((size_t)n * sizeof(float)), *row = malloc((size_t)d * sizeof(float));
            float *ref = malloc((size_t)d * sizeof(float));
            kv_attention(&cc.c, 0, 0, n - 1, q, full, H);
            kv_select_set all = {0}, some = {0};
            kv_err e;
            kv_select_set_reserve(&all, n, &e);
            for (int p = 0; p < n; p++) all.pos[p] = p;
            all.n = n;
            int bits = 1;
            for (int hq = 0; hq < H; hq++) {
                const int kvh = kv_attn_kv_head(hq, H, 2);
                const kv_head_view kh = kv_cache_view(&cc.c, 0, 0, kvh, KV_QROLE_KEY);
                const kv_head_view vh = kv_cache_view(&cc.c, 0, 0, kvh, KV_QROLE_VALUE);
                kv_select_attend(&kh, &vh, &all, q + (size_t)hq * d, got, att, row);
                bits &= !memcmp(got, full + (size_t)hq * d, (size_t)d * sizeof(float));
                /* a kept set: softmax over the kept positions only, computed plainly here */
                kv_select_l2(&kh, n, 30, 1, 8, 2, &some, &e);
                kv_select_attend(&kh, &vh, &some, q + (size_t)hq * d, got, att, row);
                double mx = -INFINITY, sum = 0.0, acc[128] = {0};
                for (int i = 0; i < some.n; i++)
                    if (bf_dot(&kh, some.pos[i], q + (size_t)hq * d) > mx)
                        mx = bf_dot(&kh, some.pos[i], q + (size_t)hq * d);
                for (int i = 0; i < some.n; i++) {
                    const double w = exp((bf_dot(&kh, some.pos[i], q + (size_t)hq * d) - mx) /
                                         sqrt((double)d));
                    sum += w;
                    for (int j = 0; j < d; j++) acc[j] += w * kv_cache_elem(&vh, some.pos[i], j);
                }
                for (int j = 0; j < d; j++) ref[j] = (float)(acc[j] / sum);
                /* att returns the kept positions' probabilities, in the set's order */
                float *pw = malloc((size_t)some.n * sizeof(float));
                for (int i = 0; i < some.n; i++)
                    pw[i] = (float)(exp((bf_dot(&kh, some.pos[i], q + (size_t)hq * d) - mx) /
                                        sqrt((double)d)) / sum);
                KV_CHECK(!kv_test_compare("attend probabilities", att, pw, some.n,
                                          KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
                         "attend returns the probabilities, head %d", hq);
                free(pw);
                KV_CHECK(!kv_test_compare("attend kept set", got, ref, d, KV_TOL_F32_ATOL,
                                          KV_TOL_F32_RTOL),
                         "attend over a kept set, %s paged %d head %d", kv_dtype_name(dtypes[di]),
                         paged, hq);
            }
            KV_CHECK(bits, "attend over every position == kv_attention, bit for bit (%s paged %d)",
                     kv_dtype_name(dtypes[di]), paged);
            /* Quest with k_pages >= the page count reads every page: kv_attention's bits */
            kv_select_pages pg;
            kv_select_set qs = {0};
            kv_select_pages_init(&pg, KV_SELECT_PAGE, d, &e);
            int qbits = 1;
            for (int kvh = 0; kvh < 2; kvh++) {
                const kv_head_view kh = kv_cache_view(&cc.c, 0, 0, kvh, KV_QROLE_KEY);
                const kv_head_view vh = kv_cache_view(&cc.c, 0, 0, kvh, KV_QROLE_VALUE);
                kv_select_pages_free(&pg);
                kv_select_pages_init(&pg, KV_SELECT_PAGE, d, &e);
                kv_select_pages_update(&pg, &kh, n, &e);
                kv_select_quest(&pg, q + (size_t)kvh * 4 * d, 4, pg.n_pages, &qs, &e);
                qbits &= qs.n == n;
                for (int g = 0; g < 4; g++) {
                    const int hq = kvh * 4 + g;
                    kv_select_attend(&kh, &vh, &qs, q + (size_t)hq * d, got, att, row);
                    qbits &= !memcmp(got, full + (size_t)hq * d, (size_t)d * sizeof(float));
                }
            }
            KV_CHECK(qbits, "quest reading every page == kv_attention, bit for bit");
            kv_select_set_free(&qs);
            kv_select_pages_free(&pg);
            kv_select_set empty = {0};
            const kv_head_view kh = kv_cache_view(&cc.c, 0, 0, 0, KV_QROLE_KEY);
            const kv_head_view vh = kv_cache_view(&cc.c, 0, 0, 0, KV_QROLE_VALUE);
            kv_select_attend(&kh, &vh, &empty, q, got, att, row);
            int zeros = 1;
            for (int j = 0; j < d; j++) zeros &= got[j] == 0.0f;
            KV_CHECK(zeros, "an empty set attends to nothing: zeros");
            kv_select_set_free(&all);
            kv_select_set_free(&some);
            free(q);
            free(full);
            free(got);
            free(att);
            free(row);
            free(ref);
            kv_cache_free(&cc.c);
        }
}

int main(void)
{
    test_topk();
    test_bytes();
    test_plan_bytes();
    test_l2();
    test_h2o();
    test_snapkv();
    test_quest();
    KV_CHECK(quest_tight >= 10, "quest property met with c < pages in %d cases", quest_tight);
    printf("quest: %d query heads with c < pages (the property is not vacuous)\n", quest_tight);
    test_attend();
    return kv_test_finish();
}
