/*
 * Chapter 11: multi-head latent attention.
 *
 *  1. the presets hold DeepSeek's published dims, and the cache arithmetic the chapter quotes
 *     (576 elements per token and layer; the paper's 93.3 % and "GQA with 2.25 groups");
 *  2. naive (up-project, then attention) == absorbed (attention in latent space) within a bound
 *     derived below, with and without query compression, at DeepSeek's dims and small ones;
 *  3. the latent cache is a one-plane kv_cache: every format (KIVI too), contiguous and paged
 *     (blocks of 64, a scrambled table) hold the same bytes and give the same attention bit for
 *     bit; the per-token formats' bytes are L · (d_c + d_R) · b per token; a block goes to the
 *     host and back (chapter 07) with its bytes intact; a KIVI speculative tail rolls back
 *     through the undo log (chapter 10);
 *  4. decoding token by token into a paged latent cache (absorbed) == the naive path over the
 *     rows projected in one chunk, at every step, within the bound of 2.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_rope.h"
#include "kv_attention_mla.h"
#include "kv_cache.h"
#include "kv_mla.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"

#define THETA 10000.0f
#define EPS 1e-6f

/* ---- 1. presets -------------------------------------------------------------------------- */

static void test_presets(void)
{
    /* the published dims (kv_mla.c names the configs) */
    static const struct { const char *name; int dim, L, H, dc, dr, dn, dv, qr, vocab; } want[] = {
        {"deepseek-v2", 5120, 60, 128, 512, 64, 128, 128, 1536, 102400},
        {"deepseek-v2-lite", 2048, 27, 16, 512, 64, 128, 128, 0, 102400},
        {"deepseek-v3", 7168, 61, 128, 512, 64, 128, 128, 1536, 129280},
    };
    int n = 0;
    kv_mla_presets(&n);
    KV_CHECK(n == 3, "%d MLA presets", n);
    for (int i = 0; i < 3; i++) {
        const kv_mla_preset *p = kv_mla_preset_find(want[i].name);
        KV_CHECK(p != NULL, "preset %s", want[i].name);
        if (!p) continue;
        KV_CHECK(p->dim == want[i].dim && p->n_layers == want[i].L && p->n_heads == want[i].H &&
                     p->mla.d_c == want[i].dc && p->mla.d_rope == want[i].dr &&
                     p->mla.d_nope == want[i].dn && p->mla.d_v == want[i].dv &&
                     p->mla.q_rank == want[i].qr && p->vocab_size == want[i].vocab,
                 "%s dims", want[i].name);
        KV_CHECK(kv_mla_row(&p->mla) == 576, "%s caches %d elements per token and layer",
                 want[i].name, kv_mla_row(&p->mla));
    }
    KV_CHECK(kv_mla_preset_find("DeepSeek-V3") != NULL && kv_mla_preset_find("llama-2-7b") == NULL,
             "lookup is case-insensitive and MLA-only");
    /* DeepSeek-V2 against DeepSeek 67B (95 layers, 8 KV heads of 128): elements per token
     * 60·576 = 34560 vs 95·2·8·128 = 194560, 17.76 % (82.2 % less); with 6-bit elements
     * against 16-bit ones, 34560·6 / (194560·16) = 6.66 %: the paper's 93.3 % reduction */
    const kv_mla_preset *v2 = kv_mla_preset_find("deepseek-v2");
    const kv_config *b = &kv_mla_baseline()->config;
    const double mla = (double)v2->n_layers * kv_mla_row(&v2->mla);
    const double gqa = (double)b->n_layers * 2 * b->n_kv_heads * kv_config_head_dim(b);
    KV_CHECK(mla == 34560 && gqa == 194560, "elements per token %g vs %g", mla, gqa);
    KV_CHECK(fabs((1 - mla / gqa) * 100 - 82.24) < 0.01, "same element width: %.2f %% less",
             (1 - mla / gqa) * 100);
    KV_CHECK(fabs((1 - mla * 6 / (gqa * 16)) * 100 - 93.34) < 0.01, "6 vs 16 bits: %.2f %% less",
             (1 - mla * 6 / (gqa * 16)) * 100);
    /* d_c + d_R = 4.5 d: GQA stores 2·g·d per layer, so g = 2.25 */
    KV_CHECK(kv_mla_row(&v2->mla) == 2.25 * 2 * v2->mla.d_nope, "2.25 groups");
}

/* ---- shared: a layer, a token's queries, a latent cache ---------------------------------- */

typedef struct {
    kv_mla_layer w;
    kv_cache c;
    float *x;      /* [n][dim] inputs (normed) */
    float *row;    /* [n][d_c + d_R] */
    float *qn, *qr; /* [n][H][d_nope], [n][H][d_R] */
    float *scratch;
    int n, pos0;
} setup;

static void setup_free(setup *s)
{
    kv_mla_layer_free(&s->w);
    kv_cache_free(&s->c);
    kv_free(s->x), kv_free(s->row), kv_free(s->qn), kv_free(s->qr), kv_free(s->scratch);
    memset(s, 0, sizeof *s);
}

/* A layer, n tokens of random normed input at positions pos0.., their projections, and a
 * one-plane cache of format fmt (paged in blocks of 64 through a reversed table when paged). */
static int setup_init(setup *s, int dim, int H, const kv_mla_dims *m, int n, int pos0, int fmt,
                      int paged, uint64_t seed)
{
    kv_err err = {{0}};
    memset(s, 0, sizeof *s);
    s->n = n, s->pos0 = pos0;
    int rc = kv_mla_layer_init(&s->w, dim, H, m, seed, &err);
    const int width = kv_mla_row(m), cap = pos0 + n;
    s->x = kv_calloc((size_t)n * dim * sizeof(float));
    s->row = kv_calloc((size_t)n * width * sizeof(float));
    s->qn = kv_calloc((size_t)n * H * m->d_nope * sizeof(float));
    s->qr = kv_calloc((size_t)n * H * m->d_rope * sizeof(float));
    s->scratch = kv_calloc((kv_mla_project_scratch(&s->w, n) + 1) * sizeof(float));
    int *pos = kv_calloc((size_t)n * sizeof(int));
    if (rc || !s->x || !s->row || !s->qn || !s->qr || !s->scratch || !pos) {
        kv_free(pos);
        printf("setup: %s\n", err.msg);
        return 1;
    }
    kv_rng r;
    kv_rng_seed(&r, seed ^ 0x5eed);
    for (int64_t i = 0; i < (int64_t)n * dim; i++) s->x[i] = kv_rng_normal(&r);
    for (int t = 0; t < n; t++) pos[t] = pos0 + t;
    double freq[KV_ROPE_MAX_PAIRS];
    kv_test_rope_freqs(THETA, s->w.m.d_rope, freq);
    kv_mla_project(&s->w, s->x, pos, n, freq, EPS, s->qn, s->qr, s->row, s->scratch);
    kv_free(pos);

    /* paged: blocks from the top of the pool down (logical order is not physical), 2 spare */
    rc = kv_mla_cache_open(&s->c, m, cap, fmt, paged, 2, &err);
    /* positions 0..pos0-1 hold rows of their own (pos0 > 0 tests a later chunk): zeros */
    if (!rc && pos0 > 0) {
        float *z = kv_calloc((size_t)pos0 * width * sizeof(float));
        rc = z ? kv_cache_write_seq(&s->c, 0, 0, 0, pos0, z, NULL, &err) : KV_ERR_NOMEM;
        kv_free(z);
    }
    if (!rc) rc = kv_cache_write_seq(&s->c, 0, 0, pos0, n, s->row, NULL, &err);
    if (rc) printf("setup cache: %s\n", err.msg);
    return rc;
}

/* ---- 2. naive == absorbed, and the bound ---------------------------------------------------
 *
 * Both paths compute the same real numbers; only their fp32 roundings differ. u = 2^-24.
 * kv_dot() of k terms rounds each product once, then at most ⌊k/16⌋ lane adds, 4 fold adds and
 * 15 tail adds: within m(k)·u·Σ|terms|, m(k) = ⌊k/16⌋ + 20 (tests/test_attn_fast.c); a running
 * sum of k terms within k·u·Σ|terms| (first order in u throughout). For the query token
 * (q_nope, q_R per head) over rows c_t ‖ kR_t:
 *
 *  scores. Naive: k = W_UK c by kv_dot (m(d_c)), then q·[k | kR] (m(d_nope + d_R));
 *    absorbed: q̃ = W_UKᵀ q as a running sum over d_nope, then q̃·c (m(d_c)) plus q_R·kR
 *    (m(d_R)) and their add. With A_t = |q|ᵀ|W_UK||c_t| + |q_R|·|kR_t| the two raw scores differ
 *    by at most e·u·A_t, e = m(d_c) + m(d_nope + d_R) + d_nope + m(d_c) + m(d_R) + 1, and the
 *    scale σ = 1/sqrt(d_nope + d_R) adds a rounding to each: δ = max_t e·u·A_t·σ + 2u·|s_t|.
 *  weights. A log-weight off by δ moves p_t by a factor within e^{±δ}; fp32 softmax itself
 *    (s_t − m rounded relative to 2S, S = max|s|; exp within 2 ulp; the sum over n; the
 *    division) adds ε_p = u·(2S + n + 8) per path. So |p̂_a − p̂_b| ≤ p_t·F,
 *    F = expm1(2δ + 4ε_p).
 *  outputs. out_i = Σ_t p_t v_t,i, v_t = W_UV c_t. Naive: v by kv_dot (m(d_c)), then the
 *    running sum over t (n + 1); absorbed: o = Σ_t p_t c_t (n + 1), then W_UV o by kv_dot
 *    (m(d_c)). Both within (m(d_c) + n + 1)·u·B_i of Σ_t p̂_t v_t,i, B_i = Σ_t p_t Σ_j
 *    |W_UV,ij||c_t,j|.
 *  So |out_a − out_b|_i ≤ 1.01·(F·Σ_t p_t|v_t,i| + 2(m(d_c) + n + 1)·u·B_i),
 * the 1.01 for the products of small terms dropped. A, B, S, p and v are computed in double
 * from the fp32 rows the cache returns. Worst cases: random data meets them far from their
 * edge, and the test prints how far (max |err| / bound).
 */
static double m16(int k) { return (double)(k / 16 + 20); }

/* Head h's bound per output: bound [d_v]. */
static void absorb_bound(const kv_mla_layer *w, const float *qn, const float *qr,
                         const float *rows, int n, int h, double *bound)
{
    const kv_mla_dims *m = &w->m;
    const int dc = m->d_c, dn = m->d_nope, dr = m->d_rope, dv = m->d_v, width = dc + dr;
    const double u = 0x1p-24, sigma = 1.0 / sqrt((double)(dn + dr));
    const double e = m16(dc) + m16(dn + dr) + dn + m16(dc) + m16(dr) + 1;
    const float *uk = w->w_uk + (size_t)h * dn * dc, *uv = w->w_uv + (size_t)h * dv * dc;
    const float *q = qn + (size_t)h * dn, *qrh = qr + (size_t)h * dr;
    double S = 0, delta = 0, mx = -INFINITY, sum = 0;
    double *s = kv_calloc((size_t)n * sizeof(double)), *qa = kv_calloc((size_t)dc * sizeof(double));
    double *qt = kv_calloc((size_t)dc * sizeof(double));
    double *pv = kv_calloc((size_t)dv * sizeof(double)), *B = kv_calloc((size_t)dv * sizeof(double));
    for (int j = 0; j < dc; j++)
        for (int i = 0; i < dn; i++) {
            qa[j] += fabs((double)q[i]) * fabs((double)uk[(size_t)i * dc + j]);
            qt[j] += (double)q[i] * uk[(size_t)i * dc + j];
        }
    for (int t = 0; t < n; t++) {
        const float *c = rows + (size_t)t * width;
        double A = 0, x = 0;
        for (int j = 0; j < dc; j++) A += qa[j] * fabs((double)c[j]), x += qt[j] * c[j];
        for (int j = 0; j < dr; j++)
            A += fabs((double)qrh[j] * c[dc + j]), x += (double)qrh[j] * c[dc + j];
        s[t] = x * sigma;
        const double d = e * u * A * sigma + 2 * u * fabs(s[t]);
        if (d > delta) delta = d;
        if (fabs(s[t]) > S) S = fabs(s[t]);
        if (s[t] > mx) mx = s[t];
    }
    for (int t = 0; t < n; t++) sum += (s[t] = exp(s[t] - mx));
    for (int t = 0; t < n; t++) {
        const float *c = rows + (size_t)t * width;
        for (int i = 0; i < dv; i++) {
            double a = 0, v = 0;
            for (int j = 0; j < dc; j++)
                a += fabs((double)uv[(size_t)i * dc + j] * c[j]), v += (double)uv[(size_t)i * dc + j] * c[j];
            B[i] += s[t] / sum * a;
            pv[i] += s[t] / sum * fabs(v);
        }
    }
    const double eps_p = u * (2 * S + n + 8), F = expm1(2 * delta + 4 * eps_p);
    for (int i = 0; i < dv; i++) bound[i] = 1.01 * (F * pv[i] + 2 * (m16(dc) + n + 1) * u * B[i]);
    kv_free(s), kv_free(qa), kv_free(qt), kv_free(pv), kv_free(B);
}

/* naive vs absorbed for the last of n tokens (it attends to all n rows) */
static void test_absorb(const char *what, int dim, int H, const kv_mla_dims *m, int n, int pos0)
{
    setup s;
    if (setup_init(&s, dim, H, m, n, pos0, KV_QF_F32, 0, 11 + n + H)) {
        KV_CHECK(0, "%s: setup", what);
        setup_free(&s);
        return;
    }
    kv_err err = {{0}};
    const int last = n - 1, len = pos0 + n;
    const float *qn = s.qn + (size_t)last * H * m->d_nope, *qr = s.qr + (size_t)last * H * m->d_rope;
    float *a = kv_calloc((size_t)H * m->d_v * sizeof(float));
    float *b = kv_calloc((size_t)H * m->d_v * sizeof(float));
    float *rows = kv_calloc((size_t)len * kv_mla_row(m) * sizeof(float));
    double *bd = kv_calloc((size_t)m->d_v * sizeof(double));
    const kv_head_view v = kv_cache_view(&s.c, 0, 0, 0, KV_QROLE_KEY);
    int rc = kv_mla_attention_naive(&s.w, qn, qr, &v, len, a, &err);
    if (!rc) rc = kv_mla_attention_absorbed(&s.w, qn, qr, &v, len, b, &err);
    KV_CHECK(rc == KV_OK, "%s: %s", what, err.msg);
    for (int t = 0; t < len; t++)
        for (int j = 0; j < kv_mla_row(m); j++)
            rows[(size_t)t * kv_mla_row(m) + j] = kv_cache_elem(&v, t, j);
    double worst = 0, max_out = 0, max_bound = 0;
    long over = 0;
    for (int h = 0; !rc && h < H; h++) {
        absorb_bound(&s.w, qn, qr, rows, len, h, bd);
        for (int i = 0; i < m->d_v; i++) {
            const double d = fabs((double)a[h * m->d_v + i] - b[h * m->d_v + i]);
            const double bound = bd[i];
            over += !(d <= bound);
            if (bound > 0 && d / bound > worst) worst = d / bound;
            if (fabs(a[h * m->d_v + i]) > max_out) max_out = fabs(a[h * m->d_v + i]);
            if (bound > max_bound) max_bound = bound;
        }
    }
    KV_CHECK(!rc && over == 0, "%s: %ld outputs differ by more than the bound (worst %.3g of it)",
             what, over, worst);
    /* the bound says something: it is a small fraction of what is computed */
    KV_CHECK(max_bound < 0.05 * max_out, "%s: bound %.3g against outputs up to %.3g", what,
             max_bound, max_out);
    printf("  %-34s n %4d: max |naive - absorbed| = %.3g of the bound (bound <= %.2g, |out| <= %.3g)\n",
           what, len, worst, max_bound, max_out);
    kv_free(a), kv_free(b), kv_free(rows), kv_free(bd);
    setup_free(&s);
}

/* ---- 3. the latent cache: formats, layouts --------------------------------------------- */

static void test_latent_cache(void)
{
    const kv_mla_dims m = {160, 32, 32, 48, 0}; /* rows of 192: int8-g64's groups fit */
    const char *fmts[] = {"fp32", "fp16", "bf16", "int8", "int8-g64", "fp8-e4m3", "fp8-e5m2",
                          "int4-kivi", "int2-kivi"};
    const int n = 150, H = 4, width = kv_mla_row(&m); /* 150: three blocks, the last partial */
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        const int fmt = kv_quant_parse(fmts[f]);
        setup cs, ps;
        int rc = setup_init(&cs, 64, H, &m, n, 0, fmt, 0, 5);
        rc |= setup_init(&ps, 64, H, &m, n, 0, fmt, 1, 5);
        KV_CHECK(!rc, "%s: setup", fmts[f]);
        if (!rc) {
            const kv_head_view cv = kv_cache_view(&cs.c, 0, 0, 0, KV_QROLE_KEY);
            const kv_head_view pv = kv_cache_view(&ps.c, 0, 0, 0, KV_QROLE_KEY);
            long diff = 0;
            double max_err = 0, amax = 0;
            for (int t = 0; t < n; t++)
                for (int j = 0; j < width; j++) {
                    const float a = kv_cache_elem(&cv, t, j), b = kv_cache_elem(&pv, t, j);
                    diff += memcmp(&a, &b, sizeof a) != 0;
                    const double e = fabs((double)a - cs.row[(size_t)t * width + j]);
                    if (e > max_err) max_err = e;
                    if (fabs(cs.row[(size_t)t * width + j]) > amax)
                        amax = fabs(cs.row[(size_t)t * width + j]);
                }
            KV_CHECK(diff == 0, "%s: %ld elements differ between paged and contiguous", fmts[f], diff);
            if (fmt == KV_QF_F32) KV_CHECK(max_err == 0, "fp32 rows come back exact (%g)", max_err);
            else if (!kvq_is_kivi(fmt)) /* fp16/bf16 relative 2^-11/2^-8, int8 half a step of
                                         * amax/127, fp8 e4m3 2^-4 and e5m2 2^-3 relative */
                KV_CHECK(max_err <= amax / 8 && max_err > 0, "%s: element error %g of amax %g",
                         fmts[f], max_err, amax);
            else /* KIVI: the newest rows wait in the fp32 window, the older are quantized */
                KV_CHECK(cs.c.qlen[0] > 0 && cs.c.qlen[0] < n && max_err > 0,
                         "%s: %d of %d rows quantized, element error %g", fmts[f], cs.c.qlen[0],
                         n, max_err);
            /* the cache holds (d_c + d_R)·b per token, b the format's bytes with metadata
             * (the per-token formats; KIVI adds its fp32 window and per-group metadata) */
            const double per_token = (double)kv_cache_bytes(&cs.c) / cs.c.spec.capacity;
            const double want = width * kv_quant_bytes_per_element(fmt, width) +
                                (double)kv_quant_fixed_bytes(fmt, width, 0) / cs.c.spec.capacity;
            KV_CHECK(kvq_is_kivi(fmt) || fabs(per_token - want) < 1e-9,
                     "%s: %g bytes per token, want %g", fmts[f], per_token, want);
            KV_CHECK(cs.c.n_planes == 1 && cs.c.v == NULL, "%s: one plane", fmts[f]);
            /* attention over either layout: the same rows, so the same bits */
            kv_err err = {{0}};
            float a[4 * 48], b[4 * 48];
            const float *qn = cs.qn + (size_t)(n - 1) * H * m.d_nope;
            const float *qr = cs.qr + (size_t)(n - 1) * H * m.d_rope;
            rc = kv_mla_attention_absorbed(&cs.w, qn, qr, &cv, n, a, &err);
            if (!rc) rc = kv_mla_attention_absorbed(&ps.w, qn, qr, &pv, n, b, &err);
            KV_CHECK(!rc && memcmp(a, b, sizeof a) == 0, "%s: paged attention == contiguous bit "
                     "for bit %s", fmts[f], err.msg);
            /* chapter 07's host tier: a block is one plane's rows, out to the host and back
             * into another pool block, the same bytes */
            const size_t bb = kv_cache_block_bytes(&ps.c);
            const int64_t meta = kv_quant_meta_bytes(fmt, KV_QROLE_KEY, 64, width);
            KV_CHECK(bb == (size_t)(64 * ps.c.planes[0].row_bytes + meta), "%s: block of %zu bytes",
                     fmts[f], bb);
            uint8_t *host = kv_calloc(bb);
            const kv_block_copy out = {ps.c.tables[0], 0}, in = {0, ps.c.tables[0]};
            if (host && !kv_cache_read_blocks(&ps.c, &out, 1, host, bb, &err)) {
                memset(ps.c.planes[0].codes + (size_t)ps.c.tables[0] * 64 * ps.c.planes[0].row_bytes,
                       0xA5, (size_t)64 * ps.c.planes[0].row_bytes);
                rc = kv_cache_write_blocks(&ps.c, &in, 1, host, bb, &err);
                if (!rc) rc = kv_mla_attention_absorbed(&ps.w, qn, qr, &pv, n, b, &err);
                KV_CHECK(!rc && memcmp(a, b, sizeof a) == 0, "%s: block through the host %s",
                         fmts[f], err.msg);
            } else {
                KV_CHECK(0, "%s: block to the host: %s", fmts[f], err.msg);
            }
            kv_free(host);
        }
        setup_free(&cs);
        setup_free(&ps);
    }
}

/* Chapter 10's undo log on a one-plane KIVI cache: a speculative tail that spills rows into
 * 2-bit groups is rolled back to the bytes a cache that never saw it holds. */
static void test_latent_undo(void)
{
    const kv_mla_dims m = {160, 32, 32, 48, 0};
    const int n = 150, tail = 40, width = kv_mla_row(&m);
    setup a, b; /* a: n tokens, then the tail, rolled back; b: n tokens */
    int rc = setup_init(&a, 64, 2, &m, n + tail, 0, KV_QF_INT2_KIVI, 1, 3);
    rc |= setup_init(&b, 64, 2, &m, n, 0, KV_QF_INT2_KIVI, 1, 3);
    kv_err err = {{0}};
    /* rebuild a's cache as n tokens, then a speculative tail */
    kv_cache_reset(&a.c, 0);
    const int blocks[3] = {4, 2, 3}; /* 190 tokens: three blocks of 64 */
    if (!rc) rc = kv_cache_set_blocks(&a.c, 0, blocks, 3, &err);
    if (!rc) rc = kv_cache_write_seq(&a.c, 0, 0, 0, n, a.row, NULL, &err);
    if (!rc) a.c.len[0] = n, rc = kv_cache_speculate(&a.c, 0, tail, &err);
    const int q_before = a.c.qlen[0];
    if (!rc) rc = kv_cache_write_seq(&a.c, 0, 0, n, tail, a.row + (size_t)n * width, NULL, &err);
    const int q_spec = a.c.qlen[0];
    if (!rc) a.c.len[0] = n + tail, rc = kv_cache_truncate(&a.c, 0, n, &err);
    KV_CHECK(!rc && q_spec > q_before && a.c.qlen[0] == b.c.qlen[0],
             "undo: quantized rows %d -> %d -> %d (want %d) %s", q_before, q_spec, a.c.qlen[0],
             b.c.qlen[0], err.msg);
    const kv_head_view av = kv_cache_view(&a.c, 0, 0, 0, KV_QROLE_KEY);
    const kv_head_view bv = kv_cache_view(&b.c, 0, 0, 0, KV_QROLE_KEY);
    long diff = 0;
    for (int t = 0; !rc && t < n; t++)
        for (int j = 0; j < width; j++) {
            const float x = kv_cache_elem(&av, t, j), y = kv_cache_elem(&bv, t, j);
            diff += memcmp(&x, &y, sizeof x) != 0;
        }
    KV_CHECK(!rc && diff == 0, "undo: %ld elements differ from the cache that never speculated", diff);
    setup_free(&a);
    setup_free(&b);
}

/* ---- 4. token by token ------------------------------------------------------------------ */

static void test_decode_steps(void)
{
    const kv_mla_dims m = {64, 16, 32, 32, 48};
    const int n = 70, H = 4; /* 70 tokens: a block of 64 and the next */
    setup full, step;
    int rc = setup_init(&full, 96, H, &m, n, 0, KV_QF_F32, 0, 9);
    rc |= setup_init(&step, 96, H, &m, 1, 0, KV_QF_F32, 1, 9); /* same weights (same seed) */
    kv_cache_free(&step.c);
    kv_err err = {{0}};
    kv_config shape;
    kv_cache_spec spec = kv_cache_spec_default(1, n);
    spec.layout.kind = KV_LAYOUT_PAGED, spec.layout.block_size = 64, spec.layout.n_blocks = 4;
    const int blocks[2] = {3, 1};
    if (!rc) rc = kv_mla_cache_config(&m, 1, n, &shape, &err);
    if (!rc) rc = kv_cache_create_planes(&step.c, &shape, &spec, 1, &err);
    if (!rc) rc = kv_cache_set_blocks(&step.c, 0, blocks, 2, &err);
    KV_CHECK(!rc, "decode steps: setup %s", err.msg);
    float a[4 * 32], b[4 * 32];
    double bd[32];
    const int width = kv_mla_row(&m);
    long over = 0;
    float *rows = kv_calloc((size_t)n * width * sizeof(float));
    const kv_head_view fv = kv_cache_view(&full.c, 0, 0, 0, KV_QROLE_KEY);
    for (int t = 0; !rc && t < n; t++) {
        /* the token's row, as a decode step projects it, into the paged cache */
        rc = kv_cache_write_seq(&step.c, 0, 0, t, 1, full.row + (size_t)t * width, NULL, &err);
        const kv_head_view sv = kv_cache_view(&step.c, 0, 0, 0, KV_QROLE_KEY);
        const float *qn = full.qn + (size_t)t * H * m.d_nope, *qr = full.qr + (size_t)t * H * m.d_rope;
        if (!rc) rc = kv_mla_attention_absorbed(&step.w, qn, qr, &sv, t + 1, a, &err);
        if (!rc) rc = kv_mla_attention_naive(&full.w, qn, qr, &fv, t + 1, b, &err);
        for (int j = 0; j < width; j++) rows[(size_t)t * width + j] = kv_cache_elem(&fv, t, j);
        for (int h = 0; !rc && h < H; h++) {
            absorb_bound(&full.w, qn, qr, rows, t + 1, h, bd);
            for (int i = 0; i < m.d_v; i++)
                over += !(fabs((double)a[h * m.d_v + i] - b[h * m.d_v + i]) <= bd[i]);
        }
    }
    KV_CHECK(!rc && over == 0, "decode steps: %ld outputs outside the bound %s", over, err.msg);
    kv_free(rows);
    setup_free(&full);
    setup_free(&step);
}

int main(void)
{
    kv_mla_dims ds = {512, 64, 128, 128, 0};     /* DeepSeek-V2-Lite's attention */
    kv_mla_dims dsq = {512, 64, 128, 128, 1536}; /* DeepSeek-V2/V3's: queries compressed */
    kv_mla_dims small = {48, 8, 16, 24, 32};
    test_presets();
    printf("naive vs absorbed (the bound is derived above test_absorb):\n");
    test_absorb("DeepSeek dims, H 4", 256, 4, &ds, 1, 0);
    test_absorb("DeepSeek dims, H 4", 256, 4, &ds, 200, 0);
    test_absorb("DeepSeek dims + q_rank 1536, H 2", 256, 2, &dsq, 67, 900);
    test_absorb("small dims + q_rank 32, H 3", 64, 3, &small, 301, 0);
    test_latent_cache();
    test_latent_undo();
    test_decode_steps();
    return kv_test_finish();
}
