/* Chapter 08: naive, tiled and split-KV attention on the CPU (kv_flash.h).
 *
 * Predicted before measured:
 *  - naive == kv_attention() bit for bit for a decode query (the same passes in the same
 *    order), so the naive reference is the attention family's;
 *  - tiled and split == naive within KV_TOL_F32 (tests/common/kv_test.h) on the grid d in {64, 128},
 *    G in {1, 4, 8}, lengths 1, 17, 4097 (decode everywhere, prefill 4097 in a few cells: it
 *    is O(T·n·d)), causal and not, caches fp32 / fp16 / bf16 / int8 (and int4-KIVI),
 *    contiguous and paged with B = 16 and B = 24. The cache's format does not enter the
 *    tolerance: all three read the very same dequantized rows (and meet int8 keys with the
 *    same 16-bit query, naive's integer dot products exact), so they differ only in the
 *    order fp32 sums are taken (online rescaling, tile and split partial sums). That is the
 *    difference KV_TOL_F32 is stated for (fp32 vs fp32, summation order only);
 *  - decode over n_keys = 32768 with 1, 2, 7, 64 splits == naive, and partials merged in
 *    range order, reversed, shuffled or as a tree give the same output within KV_TOL_F32:
 *    the log-sum-exp merge is associative and commutative up to rounding;
 *  - a query that sees no key (k_begin beyond its position, or n_keys = 0) gives zeros,
 *    never NaN, in every algorithm;
 *  - bytes: for T > tile, tiled K/V bytes < naive K/V bytes + score bytes, and the causal
 *    tile count of a small case is the one worked out by hand below.
 *
 *   test_flash [slow]     slow adds a causal prefill of 32768 tokens (tiled vs split, and
 *                         naive on sampled rows) */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"

#include "kv_attention.h"
#include "kv_flash.h"
#include "kv_quant.h"
#include "kv_rng.h"

#include <string.h>

/* One cache of one layer and one slot holding n random tokens, and its model shape. */
typedef struct {
    kv_config cfg;
    kv_cache c;
    int H, d;
} cache_case;

static int make_cache(cache_case *cc, int d, int H, int Hkv, int dtype, int B, int n,
                      uint64_t seed)
{
    memset(cc, 0, sizeof *cc);
    const int cap = n > 1 ? n : 1;
    cc->cfg = kv_test_config_attn(H, Hkv, d, d, cap);
    kv_cache_spec s = kv_cache_spec_default(1, cap);
    s.quant.dtype = dtype;
    /* a few spare blocks: the table skips them */
    kv_test_spec_paged(&s, B, (cap + B - 1) / (B ? B : 1) + 3);
    char what[64];
    snprintf(what, sizeof what, "d %d H %d/%d %s B %d", d, H, Hkv, kv_dtype_name(dtype), B);
    if (kv_test_cache_open(&cc->c, &cc->cfg, &s, what)) return 0;
    kv_rng r;
    kv_rng_seed(&r, seed);
    const size_t m = (size_t)n * Hkv * d;
    float *k = malloc((m ? m : 1) * sizeof(float)), *v = malloc((m ? m : 1) * sizeof(float));
    for (size_t i = 0; i < m; i++) k[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < m; i++) v[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    if (kv_test_cache_fill(&cc->c, n, k, v)) return 0;
    cc->H = H;
    cc->d = d;
    return 1;
}

/* Random queries [T][H][d], scaled by 3 so some rows' softmax is peaked, some flat. */
static float *make_q(int T, int H, int d, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    const size_t n = (size_t)T * H * d;
    float *q = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) q[i] = 3.0f * kv_rng_uniform(&r, -1.0f, 1.0f);
    return q;
}

static float *nan_buf(size_t n) /* outputs start as NaN: a value never written shows */
{
    float *o = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) o[i] = NAN;
    return o;
}

static kv_flash_job job_of(const cache_case *cc, const float *q, int T, int64_t q_pos0,
                           int64_t k_begin, int64_t n_keys, int causal, float *out)
{
    kv_flash_job j = {&cc->c, 0, 0, cc->H, q, T, q_pos0, k_begin, n_keys, causal, out};
    return j;
}

/*
 * naive, tiled (two tile shapes) and split (two counts) on one job; tiled and split against
 * naive within KV_TOL_F32. Returns 1 when every algorithm ran.
 */
static int check_job(const char *what, const cache_case *cc, int T, int64_t q_pos0,
                     int64_t n_keys, int causal, int S)
{
    const size_t n = (size_t)T * cc->H * cc->d;
    float *q = make_q(T, cc->H, cc->d, 7 + T), *ref = nan_buf(n), *got = nan_buf(n);
    kv_err e;
    kv_flash_job j = job_of(cc, q, T, q_pos0, 0, n_keys, causal, ref);
    int ok = kv_flash_naive(&j, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s naive: %s", what, e.msg);
    const int tiles[2][2] = {{16, 16}, {5, 7}}; /* aligned and ragged tiles */
    for (int ti = 0; ok && ti < 2; ti++) {
        j.out = got;
        int rc = kv_flash_tiled(&j, tiles[ti][0], tiles[ti][1], NULL, &e);
        KV_CHECK(rc == KV_OK, "%s tiled: %s", what, e.msg);
        char w[160];
        snprintf(w, sizeof w, "%s tiled %dx%d", what, tiles[ti][0], tiles[ti][1]);
        KV_CHECK(!rc && !kv_test_compare(w, got, ref, (long)n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
                 "%s", w);
    }
    const int splits[2] = {1, S};
    for (int si = 0; ok && si < 2; si++) {
        j.out = got;
        int rc = kv_flash_split(&j, splits[si], 16, NULL, &e);
        KV_CHECK(rc == KV_OK, "%s split: %s", what, e.msg);
        char w[160];
        snprintf(w, sizeof w, "%s split %d", what, splits[si]);
        KV_CHECK(!rc && !kv_test_compare(w, got, ref, (long)n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
                 "%s", w);
    }
    /* a decode query at the end of the cache is kv_attention()'s job: the same bits */
    if (ok && T == 1 && causal && q_pos0 == n_keys - 1 && n_keys > 0) {
        kv_attention(&cc->c, 0, 0, (int)q_pos0, q, got, cc->H);
        KV_CHECK(!memcmp(got, ref, n * sizeof(float)), "%s: naive != kv_attention bit for bit",
                 what);
    }
    free(q);
    free(ref);
    free(got);
    return ok;
}

/* ---- the grid ----------------------------------------------------------------------------- */

static void test_grid(void)
{
    const int ds[] = {64, 128}, Gs[] = {1, 4, 8};
    const int dtypes[] = {KV_QF_F32, KV_QF_F16, KV_QF_BF16, KV_QF_INT8};
    const int Bs[] = {0, 16, 24};
    const int lens[] = {1, 17};
    int cells = 0;
    /* lengths 1 and 17: decode, prefill (causal and not) on every combination */
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int fi = 0; fi < 4; fi++)
                for (int bi = 0; bi < 3; bi++)
                    for (int li = 0; li < 2; li++) {
                        const int d = ds[di], G = Gs[gi], Hkv = G == 1 ? 2 : 1, L = lens[li];
                        cache_case cc;
                        if (!make_cache(&cc, d, G * Hkv, Hkv, dtypes[fi], Bs[bi], L,
                                        100 + cells))
                            continue;
                        char w[128];
                        snprintf(w, sizeof w, "d %d G %d %s B %d L %d", d, G,
                                 kv_dtype_name(dtypes[fi]), Bs[bi], L);
                        for (int causal = 0; causal < 2; causal++) {
                            check_job(w, &cc, 1, L - 1, L, causal, 3);  /* decode */
                            check_job(w, &cc, L, 0, L, causal, 3);      /* prefill */
                        }
                        kv_cache_free(&cc.c);
                        cells++;
                    }
    /* length 4097: decode and a 17-token chunk at the end (causal) everywhere in fp32 /
     * fp16 / bf16, contiguous and B = 16 */
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int fi = 0; fi < 3; fi++)
                for (int bi = 0; bi < 2; bi++) {
                    const int d = ds[di], G = Gs[gi], Hkv = 1, L = 4097;
                    cache_case cc;
                    if (!make_cache(&cc, d, G * Hkv, Hkv, dtypes[fi], Bs[bi], L, 200 + cells))
                        continue;
                    char w[128];
                    snprintf(w, sizeof w, "d %d G %d %s B %d L %d", d, G,
                             kv_dtype_name(dtypes[fi]), Bs[bi], L);
                    check_job(w, &cc, 1, L - 1, L, 1, 7);
                    check_job(w, &cc, 1, L - 1, L, 0, 7);
                    check_job(w, &cc, 17, L - 17, L, 1, 7);
                    kv_cache_free(&cc.c);
                    cells++;
                }
    /* prefill of 4097 tokens: three cells (O(T·n·d) each) */
    const struct { int d, G, dtype, B, causal; } pre[] = {
        {64, 1, KV_QF_F32, 24, 1}, {128, 1, KV_QF_F16, 0, 0}, {64, 4, KV_QF_BF16, 16, 1}};
    for (int i = 0; i < 3; i++) {
        cache_case cc;
        if (!make_cache(&cc, pre[i].d, pre[i].G, 1, pre[i].dtype, pre[i].B, 4097, 300 + i))
            continue;
        char w[128];
        snprintf(w, sizeof w, "prefill d %d G %d %s B %d L 4097", pre[i].d, pre[i].G,
                 kv_dtype_name(pre[i].dtype), pre[i].B);
        check_job(w, &cc, 4097, 0, 4097, pre[i].causal, 5);
        kv_cache_free(&cc.c);
        cells++;
    }
    /* int4-KIVI: codes for the old rows, the fp32 window for the newest, through the same
     * row reader */
    {
        cache_case cc;
        if (make_cache(&cc, 64, 4, 1, KV_QF_INT4_KIVI, 32, 300, 400)) {
            check_job("int4-kivi B 32 L 300", &cc, 1, 299, 300, 1, 5);
            check_job("int4-kivi B 32 L 300", &cc, 300, 0, 300, 1, 5);
            kv_cache_free(&cc.c);
            cells++;
        }
    }
    printf("grid: %d cache cells\n", cells);
}

/* ---- long decode: split counts and the merge ----------------------------------------------- */

/* The partial result of one query head over keys [k0, k1), from the definition:
 * m = max s, l = sum e^(s - m), acc = sum e^(s - m) v. */
static void part_of(const cache_case *cc, const float *qh, int kvh, int64_t k0, int64_t k1,
                    kv_flash_part *p)
{
    const int d = cc->d;
    const kv_head_view kh = kv_cache_view(&cc->c, 0, 0, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(&cc->c, 0, 0, kvh, KV_QROLE_VALUE);
    float *row = malloc((size_t)d * sizeof(float));
    p->m = -INFINITY;
    p->l = 0.0f;
    for (int i = 0; i < d; i++) p->acc[i] = 0.0f;
    for (int64_t t = k0; t < k1; t++) {
        kv_attn_row(&kh, t, row);
        float s = 0.0f;
        for (int i = 0; i < d; i++) s += qh[i] * row[i];
        s /= sqrtf((float)d);
        if (s > p->m) p->m = s;
    }
    for (int64_t t = k0; t < k1; t++) {
        kv_attn_row(&kh, t, row);
        float s = 0.0f;
        for (int i = 0; i < d; i++) s += qh[i] * row[i];
        const float w = expf(s / sqrtf((float)d) - p->m);
        p->l += w;
        kv_attn_row(&vh, t, row);
        for (int i = 0; i < d; i++) p->acc[i] += w * row[i];
    }
    free(row);
}

static void test_long_decode(void)
{
    const int N = 32768, d = 128, G = 8, Hkv = 1, H = G * Hkv;
    const int dtypes[2] = {KV_QF_F32, KV_QF_F16}, Bs[2] = {0, 16};
    for (int ci = 0; ci < 2; ci++) {
        cache_case cc;
        if (!make_cache(&cc, d, H, Hkv, dtypes[ci], Bs[ci], N, 500 + ci)) continue;
        const size_t n = (size_t)H * d;
        float *q = make_q(1, H, d, 9), *ref = nan_buf(n), *got = nan_buf(n);
        kv_err e;
        kv_flash_job j = job_of(&cc, q, 1, N - 1, 0, N, 1, ref);
        KV_CHECK(kv_flash_naive(&j, NULL, &e) == KV_OK, "naive 32k: %s", e.msg);
        char w[96];
        const int splits[4] = {1, 2, 7, 64};
        for (int si = 0; si < 4; si++) {
            j.out = got;
            int rc = kv_flash_split(&j, splits[si], 64, NULL, &e);
            snprintf(w, sizeof w, "32k decode %s B %d, %d splits", kv_dtype_name(dtypes[ci]),
                     Bs[ci], splits[si]);
            KV_CHECK(!rc && !kv_test_compare(w, got, ref, (long)n, KV_TOL_F32_ATOL,
                                             KV_TOL_F32_RTOL), "%s", w);
        }
        j.out = got;
        snprintf(w, sizeof w, "32k decode %s B %d, tiled", kv_dtype_name(dtypes[ci]), Bs[ci]);
        KV_CHECK(!kv_flash_tiled(&j, 1, 128, NULL, &e) &&
                     !kv_test_compare(w, got, ref, (long)n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
                 "%s", w);

        /* the merge itself: head 0's partials over 13 uneven ranges, merged in four orders */
        enum { P = 13 };
        kv_flash_part parts[P], acc;
        float *mem = malloc((size_t)(P + 1) * d * sizeof(float)), out[4][128];
        int64_t cut[P + 1];
        for (int i = 0; i <= P; i++) cut[i] = (int64_t)N * i * i / (P * P); /* growing ranges */
        for (int i = 0; i < P; i++) {
            parts[i].acc = mem + (size_t)i * d;
            part_of(&cc, q, 0, cut[i], cut[i + 1], &parts[i]);
        }
        acc.acc = mem + (size_t)P * d;
        int order[P];
        for (int way = 0; way < 3; way++) {
            for (int i = 0; i < P; i++) order[i] = way == 0 ? i : way == 1 ? P - 1 - i : (i * 5) % P;
            acc.m = -INFINITY;
            acc.l = 0.0f;
            memset(acc.acc, 0, (size_t)d * sizeof(float));
            for (int i = 0; i < P; i++) kv_flash_merge(&acc, &parts[order[i]], d);
            kv_flash_finish(&acc, d, out[way]);
        }
        /* a tree: pairs, then pairs of pairs (merging into the left one in place) */
        for (int step = 1; step < P; step *= 2)
            for (int i = 0; i + step < P; i += 2 * step) kv_flash_merge(&parts[i], &parts[i + step], d);
        kv_flash_finish(&parts[0], d, out[3]);
        const char *ways[4] = {"in order", "reversed", "shuffled", "tree"};
        for (int way = 0; way < 4; way++) {
            snprintf(w, sizeof w, "merge of 13 partials %s (%s)", ways[way],
                     kv_dtype_name(dtypes[ci]));
            KV_CHECK(!kv_test_compare(w, out[way], ref, d, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
                     "%s", w);
        }
        free(mem);
        free(q);
        free(ref);
        free(got);
        kv_cache_free(&cc.c);
    }
    /* empty parts are identities; kv_flash_finish of an empty part is zeros */
    float a_acc[4] = {1, 2, 3, 4}, b_acc[4] = {0};
    kv_flash_part a = {0.5f, 2.0f, a_acc}, b = {-INFINITY, 0.0f, b_acc};
    kv_flash_merge(&a, &b, 4);
    KV_CHECK(a.m == 0.5f && a.l == 2.0f && a_acc[3] == 4.0f, "merge with an empty part changed it");
    kv_flash_merge(&b, &a, 4);
    KV_CHECK(b.m == 0.5f && b.l == 2.0f && b_acc[2] == 3.0f, "empty merged with a: not a");
    float z[4] = {NAN, NAN, NAN, NAN};
    kv_flash_part empty = {-INFINITY, 0.0f, (float[4]){0}};
    kv_flash_finish(&empty, 4, z);
    KV_CHECK(z[0] == 0.0f && z[3] == 0.0f, "finish of an empty part: %g", z[0]);
}

/* ---- masked rows -------------------------------------------------------------------------- */

static int run_algo(int a, const kv_flash_job *j, kv_flash_stats *st, kv_err *e)
{
    return a == 0 ? kv_flash_naive(j, st, e) : a == 1 ? kv_flash_tiled(j, 4, 8, st, e)
                                                      : kv_flash_split(j, 3, 8, st, e);
}

static void test_masked(void)
{
    const char *names[3] = {"naive", "tiled", "split"};
    cache_case cc;
    if (!make_cache(&cc, 64, 4, 2, KV_QF_F16, 16, 40, 600)) return;
    const int T = 8, H = 4, d = 64;
    float *q = make_q(T, H, d, 11);
    for (int a = 0; a < 3; a++) {
        kv_err e;
        /* causal, queries at 0..7, keys from 5: rows 0..4 see nothing, rows 5..7 see some */
        float *o = nan_buf((size_t)T * H * d);
        kv_flash_job j = job_of(&cc, q, T, 0, 5, 40, 1, o);
        KV_CHECK(run_algo(a, &j, NULL, &e) == KV_OK, "%s masked: %s", names[a], e.msg);
        int zeros = 1, finite = 1, nonzero = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H * d; i++) {
                const float x = o[(size_t)t * H * d + i];
                if (isnan(x) || isinf(x)) finite = 0;
                if (t < 5 && x != 0.0f) zeros = 0;
                if (t >= 5 && x != 0.0f) nonzero = 1;
            }
        KV_CHECK(zeros && finite && nonzero, "%s: k_begin beyond the position: zeros %d, "
                 "finite %d, later rows nonzero %d", names[a], zeros, finite, nonzero);
        /* no keys at all */
        for (size_t i = 0; i < (size_t)T * H * d; i++) o[i] = NAN;
        j = job_of(&cc, q, T, 0, 0, 0, 0, o);
        KV_CHECK(run_algo(a, &j, NULL, &e) == KV_OK, "%s n_keys 0: %s", names[a], e.msg);
        zeros = 1;
        for (size_t i = 0; i < (size_t)T * H * d; i++) zeros &= o[i] == 0.0f;
        KV_CHECK(zeros, "%s: n_keys = 0 does not give zeros", names[a]);
        free(o);
    }
    /* refusals */
    kv_err e;
    float o[4 * 64];
    kv_flash_job j = job_of(&cc, q, 1, 0, 0, 40, 1, o);
    j.n_heads = 3;
    KV_CHECK(kv_flash_tiled(&j, 4, 4, NULL, &e) == KV_ERR_ARG, "3 heads over H_kv 2 accepted");
    j.n_heads = 4;
    KV_CHECK(kv_flash_tiled(&j, 0, 4, NULL, &e) == KV_ERR_ARG, "tile_q 0 accepted");
    KV_CHECK(kv_flash_split(&j, 0, 4, NULL, &e) == KV_ERR_ARG, "0 splits accepted");
    j.n_keys = 1000;
    KV_CHECK(kv_flash_naive(&j, NULL, &e) == KV_ERR_ARG, "n_keys beyond the slot accepted");
    free(q);
    kv_cache_free(&cc.c);

    /* a sliding-window cache is refused, by name */
    kv_cache_spec s = kv_cache_spec_default(1, 64);
    s.window.size = 16;
    kv_cache wc;
    if (kv_cache_create(&wc, &cc.cfg, &s, &e) == KV_OK) {
        float qq[4 * 64] = {0};
        kv_flash_job wj = {&wc, 0, 0, 4, qq, 1, 0, 0, 1, 1, o};
        const int rc = kv_flash_tiled(&wj, 1, 16, NULL, &e);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "window"),
                 "windowed cache: rc %d '%s'", rc, rc ? e.msg : "");
        kv_cache_free(&wc);
    } else {
        KV_CHECK(0, "windowed cache: %s", e.msg);
    }
}

/* ---- bytes and tiles ---------------------------------------------------------------------- */

static void test_stats(void)
{
    cache_case cc;
    if (!make_cache(&cc, 64, 2, 2, KV_QF_F32, 0, 1024, 700)) return;
    const int H = 2, d = 64;
    float *q = make_q(1024, H, d, 13), *o = nan_buf((size_t)1024 * H * d);
    kv_err e;
    /*
     * By hand: T = n = 100 causal from position 0, tile_q 16, tile_k 32. Query tiles end at
     * t1 = 16, 32, 48, 64, 80, 96, 100; key tiles start at 0, 32, 64, 96. A key tile is
     * skipped when its first key is past the tile's last query (start >= t1):
     *   t1 16: 32 64 96   t1 32: 32 64 96   t1 48: 64 96   t1 64: 64 96
     *   t1 80: 96         t1 96: 96         t1 100: none               -> 12 per head
     * so 2 heads skip 24 of 7 x 4 x 2 = 56 pairs and compute 32. The keys of the computed
     * tiles per head: 32 + 32 + 64 + 64 + 96 + 96 + 100 = 484; K and V, fp32 rows of 256
     * bytes, 2 heads: 484 x 2 x 256 x 2 = 495616 bytes.
     */
    kv_flash_stats st = {0};
    kv_flash_job j = job_of(&cc, q, 100, 0, 0, 100, 1, o);
    KV_CHECK(kv_flash_tiled(&j, 16, 32, &st, &e) == KV_OK, "tiled: %s", e.msg);
    KV_CHECK(st.tiles_skipped == 24 && st.tiles_done == 32,
             "causal tiles: skipped %lld (24 by hand), done %lld (32)",
             (long long)st.tiles_skipped, (long long)st.tiles_done);
    KV_CHECK(st.kv_bytes == 495616, "tiled K/V bytes %lld, 495616 by hand",
             (long long)st.kv_bytes);
    KV_CHECK(st.q_bytes == 100LL * H * d * 4 && st.out_bytes == 100LL * H * d * 4,
             "q bytes %lld out bytes %lld", (long long)st.q_bytes, (long long)st.out_bytes);
    /* not causal: nothing skipped */
    memset(&st, 0, sizeof st);
    j.causal = 0;
    kv_flash_tiled(&j, 16, 32, &st, &e);
    KV_CHECK(st.tiles_skipped == 0 && st.tiles_done == 56, "non-causal: skipped %lld done %lld",
             (long long)st.tiles_skipped, (long long)st.tiles_done);

    /* T = n = 1024 > tile: tiled moves fewer bytes than naive's K/V + scores */
    kv_flash_stats sn = {0}, sT = {0}, sS = {0};
    j = job_of(&cc, q, 1024, 0, 0, 1024, 1, o);
    KV_CHECK(kv_flash_naive(&j, &sn, &e) == KV_OK, "naive: %s", e.msg);
    KV_CHECK(kv_flash_tiled(&j, 64, 64, &sT, &e) == KV_OK, "tiled: %s", e.msg);
    KV_CHECK(sn.kv_bytes == 2LL * H * 1024 * d * 4 &&
                 sn.score_bytes == 5LL * H * 1024 * 1024 * 4,
             "naive bytes: kv %lld score %lld", (long long)sn.kv_bytes,
             (long long)sn.score_bytes);
    KV_CHECK(sT.kv_bytes < sn.kv_bytes + sn.score_bytes && sT.score_bytes == 0,
             "tiled %lld bytes >= naive %lld + %lld", (long long)sT.kv_bytes,
             (long long)sn.kv_bytes, (long long)sn.score_bytes);
    /* causal with 64 x 64 tiles: query tile i computes i + 1 key tiles, 16·17/2 = 136 of 256 */
    KV_CHECK(sT.tiles_done == 136LL * H && sT.tiles_skipped == 120LL * H,
             "1024 causal: done %lld skipped %lld", (long long)sT.tiles_done,
             (long long)sT.tiles_skipped);
    /* decode: every algorithm reads each visible K/V row of each head once */
    j = job_of(&cc, q, 1, 1023, 0, 1024, 1, o);
    memset(&sn, 0, sizeof sn);
    memset(&sT, 0, sizeof sT);
    kv_flash_naive(&j, &sn, &e);
    kv_flash_tiled(&j, 1, 64, &sT, &e);
    kv_flash_split(&j, 4, 64, &sS, &e);
    KV_CHECK(sn.kv_bytes == 2LL * H * 1024 * d * 4 && sT.kv_bytes == sn.kv_bytes &&
                 sS.kv_bytes == sn.kv_bytes,
             "decode K/V bytes: naive %lld tiled %lld split %lld", (long long)sn.kv_bytes,
             (long long)sT.kv_bytes, (long long)sS.kv_bytes);
    KV_CHECK(sS.out_bytes == (long long)H * (2 * 4 * (d + 2) + d) * 4,
             "split out bytes %lld", (long long)sS.out_bytes);
    free(q);
    free(o);
    kv_cache_free(&cc.c);

    /* quantized rows count as stored: int8 rows are d codes + one fp32 scale */
    if (make_cache(&cc, 64, 1, 1, KV_QF_INT8, 0, 256, 701)) {
        float *q1 = make_q(1, 1, 64, 3), o1[64];
        kv_flash_stats s8 = {0};
        j = job_of(&cc, q1, 1, 255, 0, 256, 1, o1);
        kv_flash_tiled(&j, 1, 32, &s8, &e);
        KV_CHECK(s8.kv_bytes == 2LL * 256 * (64 + 4), "int8 K/V bytes %lld, %lld expected",
                 (long long)s8.kv_bytes, 2LL * 256 * (64 + 4));
        free(q1);
        kv_cache_free(&cc.c);
    }
}

/* ---- slow: a causal prefill of 32768 tokens ----------------------------------------------- */

static void test_long_prefill(void)
{
    const int N = 32768, d = 64, H = 1;
    cache_case cc;
    if (!make_cache(&cc, d, H, 1, KV_QF_F16, 16, N, 800)) return;
    const size_t n = (size_t)N * H * d;
    float *q = make_q(N, H, d, 17), *a = nan_buf(n), *b = nan_buf(n), *r = nan_buf(d);
    kv_err e;
    kv_flash_job j = job_of(&cc, q, N, 0, 0, N, 1, a);
    double t0 = kv_now();
    KV_CHECK(kv_flash_tiled(&j, 64, 64, NULL, &e) == KV_OK, "tiled 32k prefill: %s", e.msg);
    double t1 = kv_now();
    j.out = b;
    KV_CHECK(kv_flash_split(&j, 4, 64, NULL, &e) == KV_OK, "split 32k prefill: %s", e.msg);
    printf("32k causal prefill: tiled %.1f s, split %.1f s\n", t1 - t0, kv_now() - t1);
    KV_CHECK(!kv_test_compare("32k prefill split vs tiled", b, a, (long)n, KV_TOL_F32_ATOL,
                              KV_TOL_F32_RTOL), "split vs tiled");
    /* naive on sampled rows: row t alone is a decode at position t */
    const int rows[] = {0, 1, 63, 64, 4095, 20000, N - 1};
    for (int i = 0; i < 7; i++) {
        kv_flash_job rj = job_of(&cc, q + (size_t)rows[i] * H * d, 1, rows[i], 0, N, 1, r);
        kv_flash_naive(&rj, NULL, &e);
        char w[64];
        snprintf(w, sizeof w, "32k prefill row %d vs naive", rows[i]);
        KV_CHECK(!kv_test_compare(w, a + (size_t)rows[i] * H * d, r, (long)H * d,
                                  KV_TOL_F32_ATOL, KV_TOL_F32_RTOL), "%s", w);
    }
    free(q);
    free(a);
    free(b);
    free(r);
    kv_cache_free(&cc.c);
}

int main(int argc, char **argv)
{
    const int slow = argc > 1 && !strcmp(argv[1], "slow");
    double t0 = kv_now();
    test_masked();
    test_stats();
    test_grid();
    printf("grid done: %.1f s\n", kv_now() - t0);
    test_long_decode();
    printf("long decode done: %.1f s\n", kv_now() - t0);
    if (slow) test_long_prefill();
    printf("test_flash: %.1f s\n", kv_now() - t0);
    return kv_test_finish();
}
