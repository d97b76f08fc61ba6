/* Chapter 09: the query-aware selectors of kv_select.h on the CPU (SnapKV's prefill votes,
 * Quest's page bounds, exact top-k keys) and attention over a kept set, each against the
 * brute force of common/test_select_common.h (the ranking, L2 and H2O: test_select.c).
 *
 * Predicted before measured:
 *  - every selector keeps exactly the set the brute force keeps, ties included (max-pooled
 *    votes make the tie rule decide), keys read through the cache, contiguous and paged;
 *  - Quest: a page's bound >= q·k of each of its keys (both in double, same channel order:
 *    exact products, monotone rounding, so no tolerance). Provable consequence checked: let
 *    s* be the top key's score and c the number of pages with bound >= s*; the top key's page
 *    has bound >= s*, every page ranked above it has bound >= its bound >= s*, so it ranks
 *    within the first c: with k_pages >= c it is always chosen;
 *  - attention over the full set is kv_attention()'s bits. */
#include "common/test_select_common.h"

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
    test_snapkv();
    test_quest();
    KV_CHECK(quest_tight >= 10, "quest property met with c < pages in %d cases", quest_tight);
    printf("quest: %d query heads with c < pages (the property is not vacuous)\n", quest_tight);
    test_attend();
    return kv_test_finish();
}
