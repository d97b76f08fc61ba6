/* The CPU attention's fast path (kv_attention_fast.c, kv_attention_avx2.c) held to its
 * reference (kv_attention_ref.c), and its parts to themselves.
 *
 * Predicted before measured:
 *  - the fast path is attention: for every storage format, head dim (tails past a multiple of
 *    16 and of 8 included), group size G, layout (contiguous; paged with scrambled blocks of
 *    a power-of-two size and of another size), window and position scheme, with the AVX2 twins
 *    and with the portable loops, with the 16-bit query for int8 keys and without, every output
 *    is within the forward-error bound derived below of kv_attention_ref() (with the 16-bit
 *    query: the reference fed the rounded query, kv_attn_query_rounded(), since rounding the
 *    query is the technique's choice, not an error of the arithmetic). Also, as before, within
 *    the fp32 tolerance of the reference fed the query as it is.
 *  - the AVX2 twins of the passes do the loops' multiplies and adds, unfused, in the loops'
 *    order, so kv_attention() gives the same bits with kv_attn_simd(1) and kv_attn_simd(0),
 *    with the 16-bit query on or off (int8 keys' integer scores: exact in any order). fp32
 *    rows take the loops in both runs (the twins are for rows that need decoding; an fp32
 *    window under KV_POS_CACHE too). On a CPU without AVX2 both runs take the loops: the check
 *    still holds, trivially, and the line printed says so.
 *  - a group's passes split over the team (kv_attention_rows() when there are fewer groups
 *    than threads, or one token's groups do not share out evenly) give the bits of one thread
 *    doing them; a head alone (kv_attention_head())
 *    gives the bits of the same head inside its group.
 *  - kv_attn_exp_sum(): every exponential within 2 ulp of exp() on [-87, 0]; exactly 1 at 0;
 *    0 for -inf and below -87 (under 2^-125); NaN stays NaN; the sum is the plain sum of the
 *    exponentials in order; max = -inf gives zeros and 0.
 *
 * The bound. u = 2^-24 (float's unit roundoff); for one query head over N retained rows, the
 * exact attention of the stored rows (kv_cache_elem()'s values) o = Σ_i p_i v_i with
 * p_i = exp(s_i) / Σ exp(s), s_i = q · k_i / √d. Let S = max_i Σ_j |q_j|·|k_ij| / √d (under
 * KV_POS_CACHE, |k_ij| of a rotated pair is the pair's norm: rotation keeps it) and
 * V = max_ij |v_ij|. To first order in u:
 *  (a) a score: kv_dot16() takes each product through one rounding, at most ⌊d/16⌋ lane
 *      adds, 4 fold adds and 15 tail adds: γ_m Σ|q k| with m = ⌊d/16⌋ + 20; then the row's
 *      factor and 1/√d (3 more). An int8 row read as codes times its scale is c·s where the
 *      reference reads fl(c·s) (1); a rotation in float, 2u of |a·cos| + |b·sin| <= 3u of
 *      the pair's norm (3). So |ŝ_i - s_i| <= (⌊d/16⌋ + 28)·u·S. (The 16-bit query's score
 *      is an exact integer dot product, then 6 roundings, and the reference's fl(Q·step) 1:
 *      fewer.)
 *  (b) the exponentials: ŝ_i - max rounded (2u·S, |ŝ| <= S), exp within 2 ulp (4u): each
 *      weight exp(s_i - m + η_i) with |η_i| <= Δ = u·((⌊d/16⌋ + 30)·S + 4). Perturbing every
 *      log-weight by at most Δ moves each p_i by a factor in [e^-2Δ, e^2Δ], so
 *      Σ|p̂_i - p_i| <= expm1(2Δ), and the output, a convex mix of the rows, by at most
 *      expm1(2Δ)·V. (Weights flushed to 0 below e^-87 weigh under N·2^-125: nothing.)
 *  (c) the values and the sum: running sums in position order (the fast path keeps that
 *      order so a window is full attention under a mask, bit for bit, and thread count does not
 *      matter): Σ ŵ_i v_ij within (N + 3)·u·Σ ŵ_i |v_ij| (N adds, the weight times its
 *      factor, the product or the fused multiply-add, an int8 row's c·s), Σ ŵ_i within
 *      (N - 1)·u, then the reciprocal and the multiply (2): (2N + 4)·u·V; and the reference's
 *      own rounding to a float (u·V; its double arithmetic adds ~1e-16, nothing).
 * So  |ô - o| <= 1.01·(expm1(2Δ) + (2N + 5)·u)·V, ~ u·(c₁·S + c₂·N + c₃)·V with
 * c₁ = 2(⌊d/16⌋ + 30), c₂ = 2, c₃ = 13, the 1.01 for the second-order terms. Linear in N,
 * not log₂N: a running sum's worst case grows with its length (a pairwise sum's would grow as
 * log₂N, at the price of the position order). A worst case: random data meets it far from
 * its edge, and the test prints how far (max |err| / bound).
 */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_attn_bound.h"

#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_quant_math.h"
#include "kv_rng.h"
#include "kv_window.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEN 300

static kv_config make_config(int H, int Hkv, int d) { return kv_test_config_attn(H, Hkv, d, d, 4096); }

/* A cache of one slot holding len random positions (written in a prefill chunk, then singles,
 * so the KIVI window and spills are exercised). B > 0: paged with a scrambled block table. */
static int make_cache(kv_cache *c, const kv_config *cfg, int dtype, int B, int W, int S,
                      int scheme, int len, kv_rng *r)
{
    kv_err e;
    kv_cache_spec s = kv_test_spec_window(dtype, W, S, scheme, MAX_LEN);
    kv_test_spec_paged(&s, B, MAX_LEN / (B ? B : 1) + 4);
    int rc = kv_cache_create(c, cfg, &s, &e);
    if (rc) {
        printf("  cache: %s\n", e.msg);
        return rc;
    }
    if (B && (rc = kv_test_blocks_reversed(c, s.layout.n_blocks, c->max_blocks, &e))) {
        printf("  blocks: %s\n", e.msg);
        return rc;
    }
    const int kvd = cfg->n_kv_heads * (cfg->dim / cfg->n_heads);
    float *k = malloc((size_t)MAX_LEN * kvd * sizeof(float)); /* [len][H_kv·d] */
    float *v = malloc((size_t)MAX_LEN * kvd * sizeof(float));
    for (int i = 0; i < len * kvd; i++) k[i] = kv_rng_uniform(r, -1.0f, 1.0f);
    for (int i = 0; i < len * kvd; i++) v[i] = kv_rng_uniform(r, -1.0f, 1.0f);
    const int first = len > 40 ? len - 7 : len; /* a prefill, then one token at a time */
    for (int p = 0; !rc && p < len;) {
        const int n = p == 0 ? kv_window_chunk(W, S, 0, first) : kv_window_chunk(W, S, p, 1);
        rc = kv_cache_write_seq(c, 0, 0, p, n, k + (size_t)p * kvd, v + (size_t)p * kvd, &e);
        p += n;
    }
    if (rc) printf("  write: %s\n", e.msg);
    free(k);
    free(v);
    return rc;
}

typedef struct {
    int H, Hkv, d;
} shape;

/* The bound of the top of the file for head h of the query at pos: what the reference
 * reads (kv_cache_elem(), keys rotated under KV_POS_CACHE) gives S and V (kv_test_attn_sv()). */
static double bound_of(const kv_cache *c, int pos, int h, int H, const float *qh)
{
    return kv_test_attn_bound(c, pos, h, H, qh, 0, 0);
}

/* The largest |err| / bound seen, over every comparison (how tight the bound is). */
static double worst_ratio;

/* Outputs got [H][d] against the reference ref [H][d] within the bound (reference query qr):
 * the number of heads outside it, the first few printed with their bound. */
static long outside_bound(const char *what, const kv_cache *c, int pos, int H, const float *qr,
                          const float *got, const float *ref)
{
    const int d = c->head_dim;
    long bad = 0;
    for (int h = 0; h < H; h++) {
        const double b = bound_of(c, pos, h, H, qr + (size_t)h * d);
        double err = 0.0;
        int at = 0;
        for (int j = 0; j < d; j++) {
            const double e = fabs((double)got[h * d + j] - ref[h * d + j]);
            if (!(e <= err)) err = e, at = j; /* a NaN is the worst */
        }
        worst_ratio = fmax(worst_ratio, err / b);
        if (!(err <= b) && bad++ < 3)
            printf("  %s pos %d head %d: |err| %.3g at [%d] (got %.9g, ref %.9g) > bound %.3g\n",
                   what, pos, h, err, at, got[h * d + at], ref[h * d + at], b);
    }
    return bad;
}

/* One cache: every check of the top of the file at a few query positions. */
static void check_cache(const char *what, const kv_config *cfg, kv_cache *c, int len,
                        kv_rng *r, int have_simd)
{
    const int H = cfg->n_heads, d = c->head_dim;
    const size_t hd = (size_t)H * d;
    float *q = malloc(hd * 4), *qr = malloc(hd * 4); /* [H][d] the query, and as rounded */
    float *out[2][2];                                /* [q16][simd] [H][d] the fast path */
    for (int a = 0; a < 4; a++) out[a / 2][a % 2] = malloc(hd * 4);
    float *alone = malloc(hd * 4), *one = malloc(hd * 4); /* [H][d] */
    float *ref = malloc(hd * 4), *refr = malloc(hd * 4);  /* [H][d] reference of q, of qr */
    float *att = malloc(MAX_LEN * sizeof(float));
    const int positions[3] = {0, len / 2, len - 1};
    const kv_head_view kh0 = kv_cache_view(c, 0, 0, 0, KV_QROLE_KEY);
    const int q16_keys = kv_attn_int_keys(&kh0) && !c->rope_cs; /* with kv_attn_q16(1) */
    long bad_simd = 0, bad_team = 0, bad_head = 0, bad_ref = 0, bad_bound = 0, bad_call = 0;
    for (int pi = 0; pi < 3; pi++) {
        const int pos = positions[pi];
        if (c->spec.window.size && pos != len - 1) continue; /* a window keeps the newest only */
        for (size_t i = 0; i < hd; i++) q[i] = kv_rng_uniform(r, -1.5f, 1.5f);
        for (int h = 0; h < H; h++)
            if (q16_keys) kv_attn_query_rounded(q + h * d, d, qr + h * d);
            else memcpy(qr + h * d, q + h * d, (size_t)d * 4);
        bad_call += kv_attention_ref(c, 0, 0, pos, q, ref, H) != KV_OK;
        bad_call += kv_attention_ref(c, 0, 0, pos, qr, refr, H) != KV_OK;
        for (int q16 = 0; q16 < 2; q16++)
            for (int simd = 0; simd < 2; simd++) {
                kv_attn_q16(q16);
                kv_attn_simd(simd);
                bad_call += kv_attention(c, 0, 0, pos, q, out[q16][simd], H) != KV_OK;
                bad_bound += outside_bound(what, c, pos, H, q16 ? qr : q, out[q16][simd],
                                           q16 ? refr : ref);
            }
        kv_attn_q16(1); /* the default again */
        kv_attn_simd(have_simd);
        for (int q16 = 0; q16 < 2; q16++)
            bad_simd += memcmp(out[q16][1], out[q16][0], hd * 4) != 0;
        const float *fast = out[1][have_simd]; /* what the engine runs */
        /* one thread against the team (the team splits a group when groups < threads) */
        const int nt = omp_get_max_threads();
        omp_set_num_threads(1);
        kv_attention(c, 0, 0, pos, q, one, H);
        omp_set_num_threads(nt);
        bad_team += memcmp(fast, one, hd * 4) != 0;
        for (int h = 0; h < H; h++)
            kv_attention_head(c, 0, 0, pos, h, H, q + h * d, alone + h * d, att);
        bad_head += memcmp(fast, alone, hd * 4) != 0;
        bad_ref += kv_test_compare(what, fast, ref, (long)hd, KV_TOL_F32_ATOL,
                                   KV_TOL_F32_RTOL) != 0;
    }
    KV_CHECK(!bad_call, "%s: every call KV_OK", what);
    KV_CHECK(!bad_bound, "%s: %ld heads outside the bound of the reference (twins and loops, "
             "16-bit query on and off)", what, bad_bound);
    KV_CHECK(!bad_simd, "%s: AVX2 twin != loops, bit for bit (16-bit query on and off)", what);
    KV_CHECK(!bad_team, "%s: team split != one thread, bit for bit", what);
    KV_CHECK(!bad_head, "%s: kv_attention_head != its group, bit for bit", what);
    KV_CHECK(!bad_ref, "%s: outside the fp32 tolerance of the reference", what);
    free(q), free(qr), free(alone), free(one), free(ref), free(refr), free(att);
    for (int a = 0; a < 4; a++) free(out[a / 2][a % 2]);
}

static void test_formats(int have_simd)
{
    const shape shapes[] = {{8, 2, 128}, {6, 6, 24}, {12, 4, 40}, {4, 1, 64}, {9, 3, 72},
                            {5, 1, 8}};
    const int dtypes[] = {KV_QF_F32,      KV_QF_F16,      KV_QF_BF16,      KV_QF_INT8,
                          KV_QF_INT8_G32, KV_QF_FP8_E4M3, KV_QF_FP8_E5M2,  KV_QF_INT4_KIVI,
                          KV_QF_INT2_KIVI};
    const int blocks[] = {0, 16, 5};
    kv_rng r;
    kv_rng_seed(&r, 2024);
    int cases = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                const shape sh = shapes[si];
                const int dt = dtypes[di], B = blocks[bi];
                if (kvq_is_kivi(dt) && (sh.d % 32 || (B && B % 32))) continue;
                if (dt == KV_QF_INT8_G32 && sh.d % 32) continue;
                const kv_config cfg = make_config(sh.H, sh.Hkv, sh.d);
                const int len = 17 + (int)(kv_rng_u32(&r) % 260);
                kv_cache c;
                char what[96];
                snprintf(what, sizeof what, "%s H %d H_kv %d d %d %s len %d", kv_dtype_name(dt),
                         sh.H, sh.Hkv, sh.d, B ? (B == 16 ? "paged B 16" : "paged B 5") : "contiguous",
                         len);
                const int rc = make_cache(&c, &cfg, dt, B, 0, 0, 0, len, &r);
                KV_CHECK(rc == KV_OK, "%s: cache", what);
                if (rc == KV_OK) check_cache(what, &cfg, &c, len, &r, have_simd);
                kv_cache_free(&c);
                cases++;
            }
    /* windows: sinks and a ring, under both position schemes, contiguous and paged */
    const int wdt[] = {KV_QF_F32, KV_QF_F16, KV_QF_INT8};
    for (int wi = 0; wi < 3; wi++)
        for (int scheme = 0; scheme < 2; scheme++)
            for (int paged = 0; paged < 2; paged++) {
                const kv_config cfg = make_config(8, 2, 40);
                kv_cache c;
                char what[96];
                snprintf(what, sizeof what, "%s window 37 sinks 4 scheme %d %s",
                         kv_dtype_name(wdt[wi]), scheme, paged ? "paged B 8" : "contiguous");
                const int rc = make_cache(&c, &cfg, wdt[wi], paged ? 8 : 0, 37, 4, scheme, 200, &r);
                KV_CHECK(rc == KV_OK, "%s: cache", what);
                if (rc == KV_OK) check_cache(what, &cfg, &c, 200, &r, have_simd);
                kv_cache_free(&c);
                cases++;
            }
    printf("%d caches compared (%s); max |err| / bound %.3g\n", cases,
           have_simd ? "AVX2 twin against the loops" : "no AVX2 on this CPU: loops both times",
           worst_ratio);
}

/* A long cache split over a team of @p team threads (or the machine's, when more): MQA, whose
 * one group is below the thread count, and SmolLM2's 9 heads over 3 KV heads in int8, whose 3
 * groups do not share out evenly over 2 threads, so each is split over the team too
 * (kv_attention_rows()); the team's bits are one thread's, and within the bound at N = 4096. */
static void test_team_long(const char *what, int H, int Hkv, int d, int dtype, int team)
{
    const kv_config cfg = make_config(H, Hkv, d);
    kv_rng r;
    kv_rng_seed(&r, 77);
    kv_cache c;
    kv_err e;
    kv_cache_spec s = kv_cache_spec_default(1, 4096);
    s.quant.dtype = dtype;
    int rc = kv_cache_create(&c, &cfg, &s, &e);
    const size_t kd = (size_t)Hkv * d, hd = (size_t)H * d;
    float *k = malloc((size_t)4096 * kd * sizeof(float)), *v = malloc((size_t)4096 * kd * 4);
    for (size_t i = 0; i < 4096 * kd; i++) k[i] = kv_rng_uniform(&r, -1, 1), v[i] = kv_rng_uniform(&r, -1, 1);
    if (!rc) rc = kv_cache_write_seq(&c, 0, 0, 0, 4096, k, v, &e);
    KV_CHECK(rc == KV_OK, "%s: long cache: %s", what, e.msg);
    float *q = malloc(hd * 4), *qr = malloc(hd * 4), *a = malloc(hd * 4), *b = malloc(hd * 4);
    float *ref = malloc(hd * 4);
    if (!rc) {
        for (size_t i = 0; i < hd; i++) q[i] = kv_rng_uniform(&r, -2, 2);
        const kv_head_view kh0 = kv_cache_view(&c, 0, 0, 0, KV_QROLE_KEY);
        for (int h = 0; h < H; h++) /* the query the fast path scores int8 keys with */
            if (kv_attn_int_keys(&kh0)) kv_attn_query_rounded(q + h * d, d, qr + h * d);
            else memcpy(qr + h * d, q + h * d, (size_t)d * 4);
        kv_parallel_ignore_load(1); /* the team must run even on a busy machine */
        const int nt = omp_get_max_threads(), use = nt > team ? nt : team;
        omp_set_num_threads(use);
        kv_attention(&c, 0, 0, 4095, q, a, H);
        omp_set_num_threads(1);
        kv_attention(&c, 0, 0, 4095, q, b, H);
        omp_set_num_threads(nt);
        kv_parallel_ignore_load(0);
        KV_CHECK(!memcmp(a, b, hd * 4), "%s, 4096 positions: team of %d != one thread", what,
                 use);
        KV_CHECK(kv_attention_ref(&c, 0, 0, 4095, qr, ref, H) == KV_OK &&
                 !outside_bound(what, &c, 4095, H, qr, a, ref),
                 "%s, 4096 positions: within the bound of the reference", what);
    }
    free(q), free(qr), free(a), free(b), free(ref);
    free(k);
    free(v);
    kv_cache_free(&c);
}

/* Every finite fp8 code through both paths (the twin decodes fp8 by way of binary16, the
 * loops through a table): rows of codes written straight into the cache, K and V, then the
 * outputs compared bit for bit; a NaN code in V makes a NaN output in both. */
static void test_fp8_codes(void)
{
    const kv_config cfg = make_config(2, 1, 16);
    for (int e5 = 0; e5 < 2; e5++) {
        kv_rng r;
        kv_rng_seed(&r, 5);
        kv_cache c;
        const int dt = e5 ? KV_QF_FP8_E5M2 : KV_QF_FP8_E4M3;
        int rc = make_cache(&c, &cfg, dt, 0, 0, 0, 0, 256, &r);
        KV_CHECK(rc == KV_OK, "fp8 cache");
        if (rc) continue;
        const kv_head_view kh = kv_cache_view(&c, 0, 0, 0, KV_QROLE_KEY);
        const kv_head_view vh = kv_cache_view(&c, 0, 0, 0, KV_QROLE_VALUE);
        uint8_t *kc = (uint8_t *)(uintptr_t)kh.codes, *vc = (uint8_t *)(uintptr_t)vh.codes;
        int n_codes = 0;
        for (int i = 0; i < 256 * 16; i++) { /* row t, column j: code (t·16 + j) mod 256 */
            const uint8_t b = (uint8_t)i;
            const int special = e5 ? (b & 0x7c) == 0x7c : (b & 0x7f) == 0x7f; /* Inf / NaN */
            kc[i] = vc[(i * 7) % 4096] = special ? 0 : b;
            n_codes += !special && i < 256;
        }
        float q[32], a[32], b[32];
        for (int i = 0; i < 32; i++) q[i] = kv_rng_uniform(&r, -0.01f, 0.01f);
        const int was = kv_attn_simd(-1);
        kv_attn_simd(1);
        kv_attention(&c, 0, 0, 255, q, a, 2);
        kv_attn_simd(0);
        kv_attention(&c, 0, 0, 255, q, b, 2);
        KV_CHECK(!memcmp(a, b, sizeof a), "%s: all %d finite codes, AVX2 twin == loops",
                 kv_dtype_name(dt), n_codes);
        vc[5 * 16 + 3] = e5 ? 0x7e : 0x7f; /* a NaN code in V row 5 */
        kv_attention(&c, 0, 0, 255, q, b, 2);
        kv_attn_simd(1);
        kv_attention(&c, 0, 0, 255, q, a, 2);
        kv_attn_simd(was);
        KV_CHECK(isnan(a[3]) && isnan(b[3]) && isnan(a[16 + 3]) && isnan(b[16 + 3]) &&
                 !isnan(a[4]) && a[4] == b[4],
                 "%s: a NaN code makes its column NaN in both paths, the others unchanged",
                 kv_dtype_name(dt));
        kv_cache_free(&c);
    }
}

static void test_exp(void)
{
    static float x[4096], y[4096];
    long bad = 0;
    double worst = 0.0;
    int n = 0;
    for (float t = 0.0f; t > -87.0f; t -= 0.0213f) x[n++] = t;
    x[n++] = 0.0f;
    x[n++] = -87.0f;
    memcpy(y, x, sizeof x);
    const float sum = kv_attn_exp_sum(y, n, 0.0f);
    float plain = 0.0f;
    for (int i = 0; i < n; i++) {
        const double want = exp((double)x[i]), rel = fabs(y[i] - want) / want;
        if (rel > worst) worst = rel;
        bad += rel > 2 * 0x1p-24 * 2; /* 2 ulp: an ulp is at most 2^-23 relative */
        plain += y[i];
    }
    printf("exp: worst relative error %.3g over %d points in [-87, 0]\n", worst, n);
    KV_CHECK(!bad, "exp: %ld of %d points beyond 2 ulp of exp()", bad, n);
    KV_CHECK(sum == plain, "exp: the sum is the plain sum in order");
    static float z[4096];
    memcpy(z, x, sizeof x);
    const int was = kv_attn_simd(0);
    kv_attn_exp_sum(z, n, 0.0f);
    kv_attn_simd(was);
    KV_CHECK(!memcmp(y, z, (size_t)n * 4), "exp: AVX2 twin == loop on every point");
    float e[6] = {0.0f, -INFINITY, -88.0f, -1000.0f, NAN, -3.0f};
    kv_attn_exp_sum(e, 6, 0.0f);
    KV_CHECK(e[0] == 1.0f && e[1] == 0.0f && e[2] == 0.0f && e[3] == 0.0f && isnan(e[4]),
             "exp: exp(0) = 1, -inf and below -87 give 0, NaN stays NaN");
    /* eight-wide and one-at-a-time agree on every element (the tail is the loop) */
    for (int len = 1; len < 20; len++) {
        float a[20], b[20];
        for (int i = 0; i < len; i++) a[i] = b[i] = -0.37f * (float)i;
        kv_attn_exp_sum(a, len, 0.5f);
        for (int i = 0; i < len; i++) kv_attn_exp_sum(b + i, 1, 0.5f);
        KV_CHECK(!memcmp(a, b, (size_t)len * 4), "exp: length %d, vector == scalar", len);
    }
    float m[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    KV_CHECK(kv_attn_exp_sum(m, 5, -INFINITY) == 0.0f && m[0] == 0.0f && m[4] == 0.0f,
             "exp: nothing visible gives zeros and a zero sum");
}

/* The query int8 keys meet (kv_attn_query_q16()): codes within +-kvq_q16_max(d), the largest
 * element on +-max itself, every element within step/2 (and its division's rounding) of
 * Q·step; kv_attn_query_rounded() is Q·step; a zero query gives step 0, one with a NaN or an
 * inf step NaN, codes 0. And kv_attn_score() of int8 codes against the codes: the exact
 * integer dot product, rounded three times (within 2^-21 of the double-precision value). */
static void test_query_q16(void)
{
    enum { d = 128 };
    kv_rng r;
    kv_rng_seed(&r, 5);
    float q[d], row[d], qr[d];
    int16_t q16[d];
    const int qmax = kvq_q16_max(d);
    long far = 0, range = 0, rounded = 0, top = 0, score_bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        const float span = ldexpf(1.0f, trial % 40 - 20); /* 2^-20 .. 2^19 */
        float m = 0.0f;
        int at = 0;
        for (int j = 0; j < d; j++) {
            q[j] = span * kv_rng_uniform(&r, -1.0f, 1.0f);
            if (fabsf(q[j]) > m) { m = fabsf(q[j]); at = j; }
            row[j] = (float)(int)kv_rng_uniform(&r, -127.9f, 127.9f); /* codes as floats */
        }
        const float step = kv_attn_query_q16(q, d, q16);
        kv_attn_query_rounded(q, d, qr);
        top += abs(q16[at]) != qmax;
        double want = 0.0;
        int64_t dot = 0;
        for (int j = 0; j < d; j++) {
            if (fabs((double)q16[j] * step - q[j]) > 0.5 * step + ldexp(fabs(q[j]), -23)) far++;
            range += abs(q16[j]) > qmax;
            rounded += qr[j] != (float)q16[j] * step;
            dot += (int64_t)q16[j] * (int64_t)row[j];
        }
        const float f = 0.0125f, got = kv_attn_score(q, q16, step, row, f, d);
        want = (double)dot * step * f / sqrt((double)d);
        if (fabs(got - want) > ldexp(fabs(want), -21)) score_bad++;
    }
    KV_CHECK(qmax == 32767 && kvq_q16_max(1024) == 16383, "kvq_q16_max: 32767 at d 128, "
             "%d at d 1024 (expected 16383: 1024 x 128 x max < 2^31)", kvq_q16_max(1024));
    KV_CHECK(!far, "query codes within step/2 of the query: %ld elements off", far);
    KV_CHECK(!range, "query codes within +-%d: %ld off", qmax, range);
    KV_CHECK(!top, "the largest element on +-%d: %ld queries off", qmax, top);
    KV_CHECK(!rounded, "kv_attn_query_rounded() = codes x step: %ld elements off", rounded);
    KV_CHECK(!score_bad, "integer scores within 2^-21 of step x (Q . c) x f / sqrt(d): %ld off",
             score_bad);
    for (int j = 0; j < d; j++) q[j] = 0.0f;
    int nz = 0;
    const float s0 = kv_attn_query_q16(q, d, q16);
    for (int j = 0; j < d; j++) nz += q16[j] != 0;
    KV_CHECK(s0 == 0.0f && !nz, "zero query: step 0 (got %g), codes 0 (%d not)", s0, nz);
    q[3] = NAN;
    const float sn = kv_attn_query_q16(q, d, q16);
    KV_CHECK(isnan(sn) && !q16[3], "a NaN in the query: step NaN (got %g), its code 0", sn);
    q[3] = INFINITY;
    KV_CHECK(isnan(kv_attn_query_q16(q, d, q16)), "an inf in the query: step NaN");
}

/* kv_attn_add_row(): a per-token int8 view's rows fused, each element fmaf()'s (one rounding);
 * every other view's (fp32, int8 with group scales) a multiply then an add (two). A case the two
 * round differently shows the choice is made: w = row = 1 + 2^-12 and o = -(1 + 2^-11), whose
 * exact sum 2^-24 a rounded product (1 + 2^-11) loses. Only the views' kinds are read. */
static void test_add_row(void)
{
    enum { n = 67 }; /* not a multiple of any vector width */
    kv_head_view vi8 = {0}, vf32 = {0}, vg32 = {0};
    vi8.fmt = KV_QF_INT8;
    vf32.fmt = KV_QF_F32;
    vg32.fmt = KV_QF_INT8_G32;
    vi8.role = vf32.role = vg32.role = KV_QROLE_VALUE;
    vi8.d = vf32.d = vg32.d = 128;
    kv_rng r;
    kv_rng_seed(&r, 11);
    float row[n], o[n], of[n], op[n], og[n];
    long fused_bad = 0, plain_bad = 0;
    for (int trial = 0; trial < 50; trial++) {
        const float w = kv_rng_uniform(&r, -2.0f, 2.0f);
        for (int j = 0; j < n; j++) {
            row[j] = (float)(int)kv_rng_uniform(&r, -127.0f, 128.0f); /* int8 codes as floats */
            o[j] = of[j] = op[j] = og[j] = kv_rng_uniform(&r, -100.0f, 100.0f);
        }
        kv_attn_add_row(&vi8, of, w, row, n);
        kv_attn_add_row(&vf32, op, w, row, n);
        kv_attn_add_row(&vg32, og, w, row, n);
        for (int j = 0; j < n; j++) {
            volatile float prod = w * row[j]; /* rounded on its own, then added */
            const float plain = o[j] + prod, fused = fmaf(w, row[j], o[j]);
            fused_bad += memcmp(&of[j], &fused, sizeof(float)) != 0;
            plain_bad += memcmp(&op[j], &plain, sizeof(float)) != 0;
            plain_bad += memcmp(&og[j], &plain, sizeof(float)) != 0;
        }
    }
    KV_CHECK(fused_bad == 0, "kv_attn_add_row, int8 view: %ld elements differ from fmaf()",
             fused_bad);
    KV_CHECK(plain_bad == 0, "kv_attn_add_row, fp32 / int8-g32 views: %ld elements differ from "
             "o + w·row", plain_bad);
    const float a = 1.0f + ldexpf(1.0f, -12), b = -(1.0f + ldexpf(1.0f, -11));
    float f1 = b, f0 = b;
    kv_attn_add_row(&vi8, &f1, a, &a, 1);
    kv_attn_add_row(&vf32, &f0, a, &a, 1);
    KV_CHECK(f1 == ldexpf(1.0f, -24) && f0 == 0.0f,
             "one rounding vs two: int8 view %g (want 2^-24), fp32 view %g (want 0)", f1, f0);
}

int main(void)
{
    const int have_simd = kv_attn_simd(-1);
    kv_parallel_ignore_load(1); /* compare thread counts even on a busy machine */
    test_exp();
    test_formats(have_simd);
    test_fp8_codes();
    test_team_long("MQA fp16", 8, 1, 128, KV_QF_F16, 2);
    test_team_long("9 heads over 3, int8", 9, 3, 64, KV_QF_INT8, 2);
    test_query_q16();
    test_add_row();
    return kv_test_finish();
}
