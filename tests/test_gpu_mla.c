/* Chapter 11 on the GPU: the absorbed MLA decode (kvcu_mla_attention_absorbed(),
 * cuda/attention/kvcu_attention_mla.cu) held to the CPU reference kv_mla_attention_absorbed()
 * (reference_cpu/attention/kv_attention_mla.c) over the same latent cache.
 *
 * Predicted before measured:
 *  - a one-plane device cache (kvcu_cache_create_planes(.., 1, ..)) holds the CPU latent
 *    cache's bytes, contiguous and paged (blocks of 64 mapped from the top down), in every
 *    format tried;
 *  - every output is within the bound below of the reference: fp16 and bf16 rows (copied as
 *    they are) and int8, fp8, fp32 rows (dequantized into fp16 tiles); H 4 (12 padded rows),
 *    16, 20 (two head tiles, one block) and 40 (two blocks, one tile all padding); n 1, 65, 70,
 *    100, 130, 200 (not multiples of 64 or of the 32-row tile); DeepSeek's d_c 512, d_R 64 and
 *    small dims;
 *  - paged == contiguous bit for bit (one row locator, the same arithmetic); split-KV (2 or 3
 *    ranges, merged by log-sum-exp) within the same bound as one range;
 *  - a q_R off by 10 % (the RoPE term) is caught by the bound: it can fail;
 *  - bad arguments are refused with messages naming the call.
 *
 * The bound. u = 2^-24 (fp32), u16 the tile type's unit roundoff (2^-11 fp16, 2^-8 bf16), σ the
 * float scale both use, exact quantities in double from the rows the CPU cache returns (the
 * device's, byte for byte). Per head: q̃_j = Σ_i q_i W_UK,ij, qa_j = Σ_i |q_i||W_UK,ij|.
 *  (a) GPU scores. q̃ is an fp32 running sum over d_nope (within d_nope·u·qa_j), then rounded
 *      to 16 bits: |q16_j - q̃_j| <= e_j = u16|q̃_j| + (1 + u16)·d_nope·u·qa_j; q_R rounded
 *      (u16); rows of another format rounded too (rr = 1: u16 on each c); the products of
 *      16-bit values are exact in fp32 and the tensor cores' sums (at most D + 4 additions a
 *      term, the four warps' parts included) are taken at 2u each (truncation allowed). With
 *      A_t = Σ_j (|q̃_j| + e_j)|c_tj| + Σ_r |q_R,r||kR_tr| and R_t = Σ_r |q_R,r||kR_tr|:
 *      δg = max_t σ·(Σ_j e_j|c_tj| + u16·R_t + 2rr·u16·A_t + 2(D + 4)·u·A_t)·1.01 + u|s_t|.
 *  (b) CPU scores (test_mla.c's absorbed half): δc = max_t σ·(d_nope + m(d_c) + m(d_R) + 1)·u
 *      ·Ã_t + u|s_t|, Ã_t = Σ_j qa_j|c_tj| + R_t, m(k) = ⌊k/16⌋ + 20.
 *  (c) weights. A score off by δ moves a weight by a factor within e^{±2δ}; the online softmax
 *      adds its rescalings (R = tiles + ranges + 2 factors, (2S + 5)·u each) and the merge:
 *      εg = u·(R(2S + 5) + 2S + n + 16); the CPU's εc = u·(2S + n + 8); S = max|s_t|. P is
 *      rounded to 16 bits (its sum l is not): Fg = expm1(2δg + 2εg)(1 + u16) + u16,
 *      Fc = expm1(2δc + 2εc).
 *  (d) outputs out_i = Σ_t p_t v_ti, v_t = W_UV c_t: the weights give (Fg + Fc)·Σ_t p_t|v_ti|;
 *      rounded rows rr·u16·B_i, B_i = Σ_t p_t Σ_j |W_UV,ij||c_tj|; the GPU's sums (P·V over n
 *      rows with R rescales, the merge, W_UV by a warp: 2(n + R + ranges + 4) + d_c/32 + 6
 *      roundings) and the CPU's (m(d_c) + n + 1), each u·B_i(1 + Fg).
 *  |gpu - cpu|_i <= 1.01·((Fg + Fc)·Σ_t p_t|v_ti| + rr·u16·B_i + (gpu + cpu sums)·u·B_i·(1 + Fg)).
 * The test prints the worst |err| / bound and checks the bound is small against the outputs.
 * Exits 77 (skipped) without a usable device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_rope.h"
#include "common/kv_test_gpu.h"
#include "kv_attention_mla.h"
#include "kv_cache.h"
#include "kv_mla.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "kvcu.h"

#define DIM 64 /* the model dim the random layer projects from */

static double worst_ratio;

/* One layer, n tokens' rows in a CPU latent cache and its device twin, and the last token's
 * queries on both sides. */
typedef struct {
    kv_mla_layer w;
    kv_mla_dims m;
    int H, n, fmt;
    kv_cache c;
    kvcu_cache *g;
    float *qn, *qr;                            /* host: the last token's [H][d_nope], [H][d_R] */
    float *rows, *dec;                         /* host [n][D]: projected, and as the cache returns */
    float *d_uk, *d_uv, *d_qn, *d_qr, *d_out;  /* device */
} twin;

static float *dev_copy(const float *h, size_t n, kv_err *e)
{
    void *p = NULL;
    if (kvcu_malloc(&p, n * sizeof(float), e) || (h && kvcu_upload(p, h, n * sizeof(float), e))) {
        kvcu_free(p);
        return NULL;
    }
    return (float *)p;
}

static void twin_free(twin *t)
{
    kv_mla_layer_free(&t->w);
    kv_cache_free(&t->c);
    kvcu_cache_free(t->g);
    free(t->qn), free(t->qr), free(t->rows), free(t->dec);
    kvcu_free(t->d_uk), kvcu_free(t->d_uv), kvcu_free(t->d_qn), kvcu_free(t->d_qr);
    kvcu_free(t->d_out);
    memset(t, 0, sizeof *t);
}

static int twin_init(twin *t, int H, const kv_mla_dims *m, int n, int fmt, int paged,
                     uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->m = *m, t->H = H, t->n = n, t->fmt = fmt;
    const int D = kv_mla_row(m);
    kv_err e = {{0}};
    float *x = malloc(sizeof(float) * n * DIM), *qn = malloc(sizeof(float) * n * H * m->d_nope);
    float *qr = malloc(sizeof(float) * n * H * m->d_rope), *d_rows = NULL;
    int *pos = malloc(sizeof(int) * n);
    t->rows = malloc(sizeof(float) * n * D), t->dec = malloc(sizeof(float) * n * D);
    t->qn = malloc(sizeof(float) * H * m->d_nope), t->qr = malloc(sizeof(float) * H * m->d_rope);
    int rc = kv_mla_layer_init(&t->w, DIM, H, m, seed, &e);
    float *scratch = rc ? NULL : malloc(sizeof(float) * (kv_mla_project_scratch(&t->w, n) + 1));
    if (rc || !x || !qn || !qr || !pos || !t->rows || !t->dec || !t->qn || !t->qr || !scratch) {
        printf("  setup: %s\n", e.msg);
        rc = 1;
    }
    if (!rc) {
        kv_rng r;
        kv_rng_seed(&r, seed ^ 0x5eed);
        for (int i = 0; i < n * DIM; i++) x[i] = kv_rng_normal(&r);
        for (int i = 0; i < n; i++) pos[i] = i;
        double freq[KV_ROPE_MAX_PAIRS];
        kv_test_rope_freqs(10000.0f, m->d_rope, freq);
        kv_mla_project(&t->w, x, pos, n, freq, 1e-6f, qn, qr, t->rows, scratch);
        memcpy(t->qn, qn + (size_t)(n - 1) * H * m->d_nope, sizeof(float) * H * m->d_nope);
        memcpy(t->qr, qr + (size_t)(n - 1) * H * m->d_rope, sizeof(float) * H * m->d_rope);
        /* the CPU cache, then its twin on the device: the same shape, spec and table */
        kv_config shape;
        rc = kv_mla_cache_open(&t->c, m, n, fmt, paged, 2, &e);
        if (!rc) rc = kv_cache_write_seq(&t->c, 0, 0, 0, n, t->rows, NULL, &e);
        if (!rc) { /* the rows as the cache returns them: the bound's c_t */
            const kv_head_view v = kv_cache_view(&t->c, 0, 0, 0, KV_QROLE_KEY);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < D; j++) t->dec[(size_t)i * D + j] = kv_cache_elem(&v, i, j);
        }
        if (!rc) rc = kv_mla_cache_config(m, 1, n, &shape, &e);
        if (!rc) rc = kvcu_cache_create_planes(&t->g, &shape, &t->c.spec, 1, &e);
        if (!rc && paged) rc = kvcu_cache_set_blocks(t->g, 0, t->c.tables, t->c.n_mapped[0], &e);
        d_rows = rc ? NULL : dev_copy(t->rows, (size_t)n * D, &e);
        if (!rc) rc = d_rows ? kvcu_cache_write_seq(t->g, 0, 0, 0, n, d_rows, NULL, &e) : 1;
        if (rc) printf("  setup cache: %s\n", e.msg);
    }
    if (!rc) {
        t->d_uk = dev_copy(t->w.w_uk, (size_t)H * m->d_nope * m->d_c, &e);
        t->d_uv = dev_copy(t->w.w_uv, (size_t)H * m->d_v * m->d_c, &e);
        t->d_qn = dev_copy(t->qn, (size_t)H * m->d_nope, &e);
        t->d_qr = dev_copy(t->qr, (size_t)H * m->d_rope, &e);
        t->d_out = dev_copy(NULL, (size_t)H * m->d_v, &e);
        rc = !(t->d_uk && t->d_uv && t->d_qn && t->d_qr && t->d_out);
    }
    /* the device holds the CPU's bytes */
    uint8_t *img = rc ? NULL : malloc(t->c.mem_bytes);
    if (!rc) {
        rc = !img || kvcu_cache_mem_bytes(t->g) != t->c.mem_bytes ||
             kvcu_cache_download(t->g, img, t->c.mem_bytes, &e);
        KV_CHECK(!rc && !memcmp(img, t->c.mem, t->c.mem_bytes), "%s %s: the one-plane device "
                 "cache holds the CPU latent cache's %zu bytes %s", kv_quant_name(fmt),
                 paged ? "paged" : "contiguous", t->c.mem_bytes, e.msg);
    }
    free(img), free(x), free(qn), free(qr), free(pos), free(scratch);
    kvcu_free(d_rows);
    return rc;
}

/* The device's outputs [H][d_v] with n_parts ranges (q_R times @p rope_factor). */
static int gpu_run(twin *t, int n_parts, float rope_factor, float *out, kv_err *e)
{
    const int nr = t->H * t->m.d_rope;
    float *qr = malloc(sizeof(float) * nr);
    for (int i = 0; qr && i < nr; i++) qr[i] = t->qr[i] * rope_factor;
    int rc = qr ? kvcu_upload(t->d_qr, qr, sizeof(float) * nr, e) : KV_ERR_NOMEM;
    if (!rc)
        rc = kvcu_mla_attention_absorbed(t->d_uk, t->d_uv, &t->m, t->H, t->d_qn, t->d_qr, t->g,
                                         0, 0, t->n, t->d_out, NULL, n_parts, e);
    if (!rc) rc = kvcu_download(out, t->d_out, sizeof(float) * t->H * t->m.d_v, e);
    free(qr);
    return rc;
}

static double m16(int k) { return (double)(k / 16 + 20); }

/* The bound of the top of the file for head h: bound [d_v]. */
static void head_bound(const twin *t, int h, int n_parts, double *bound)
{
    const kv_mla_dims *m = &t->m;
    const int n = t->n, dc = m->d_c, dr = m->d_rope, dn = m->d_nope, dv = m->d_v, D = dc + dr;
    const double u = 0x1p-24, u16 = t->fmt == KV_QF_BF16 ? 0x1p-8 : 0x1p-11;
    const double rr = t->fmt == KV_QF_F16 || t->fmt == KV_QF_BF16 ? 0.0 : 1.0;
    const double sigma = (double)(1.0f / sqrtf((float)(dn + dr)));
    const float *uk = t->w.w_uk + (size_t)h * dn * dc, *uv = t->w.w_uv + (size_t)h * dv * dc;
    const float *q = t->qn + (size_t)h * dn, *qr = t->qr + (size_t)h * dr;
    double *qt = calloc(dc, sizeof(double)), *qa = calloc(dc, sizeof(double));
    double *s = calloc(n, sizeof(double)), *pv = calloc(dv, sizeof(double));
    double *B = calloc(dv, sizeof(double));
    for (int i = 0; i < dn; i++)
        for (int j = 0; j < dc; j++) {
            qt[j] += (double)q[i] * uk[(size_t)i * dc + j];
            qa[j] += fabs((double)q[i] * uk[(size_t)i * dc + j]);
        }
    double dg = 0, dcpu = 0, S = 0, mx = -INFINITY, sum = 0;
    for (int t0 = 0; t0 < n; t0++) {
        const float *c = t->dec + (size_t)t0 * D;
        double A = 0, At = 0, R = 0, E = 0, x = 0;
        for (int j = 0; j < dc; j++) {
            const double ej = u16 * fabs(qt[j]) + (1 + u16) * dn * u * qa[j];
            A += (fabs(qt[j]) + ej) * fabs((double)c[j]);
            At += qa[j] * fabs((double)c[j]);
            E += ej * fabs((double)c[j]);
            x += qt[j] * c[j];
        }
        for (int r = 0; r < dr; r++) R += fabs((double)qr[r] * c[dc + r]), x += (double)qr[r] * c[dc + r];
        A += R, At += R;
        s[t0] = sigma * x;
        const double g = 1.01 * sigma * (E + u16 * R + 2 * rr * u16 * A + 2.0 * (D + 4) * u * A) +
                         u * fabs(s[t0]);
        const double cp = sigma * (dn + m16(dc) + m16(dr) + 1) * u * At + u * fabs(s[t0]);
        if (g > dg) dg = g;
        if (cp > dcpu) dcpu = cp;
        if (fabs(s[t0]) > S) S = fabs(s[t0]);
        if (s[t0] > mx) mx = s[t0];
    }
    for (int t0 = 0; t0 < n; t0++) sum += (s[t0] = exp(s[t0] - mx));
    for (int t0 = 0; t0 < n; t0++) {
        const float *c = t->dec + (size_t)t0 * D;
        for (int i = 0; i < dv; i++) {
            double a = 0, v = 0;
            for (int j = 0; j < dc; j++) {
                a += fabs((double)uv[(size_t)i * dc + j] * c[j]);
                v += (double)uv[(size_t)i * dc + j] * c[j];
            }
            B[i] += s[t0] / sum * a;
            pv[i] += s[t0] / sum * fabs(v);
        }
    }
    const double Rn = ceil(n / 32.0) + n_parts + 2;
    const double eg = u * (Rn * (2 * S + 5) + 2 * S + n + 16), ec = u * (2 * S + n + 8);
    const double Fg = expm1(2 * dg + 2 * eg) * (1 + u16) + u16, Fc = expm1(2 * dcpu + 2 * ec);
    const double sums = 2.0 * (n + Rn + n_parts + 4) + dc / 32 + 6 + m16(dc) + n + 1;
    for (int i = 0; i < dv; i++)
        bound[i] = 1.01 * ((Fg + Fc) * pv[i] + rr * u16 * B[i] + sums * u * B[i] * (1 + Fg));
    free(qt), free(qa), free(s), free(pv), free(B);
}

/* The device (n_parts ranges, q_R times rope_factor) against the reference ref [H][d_v];
 * outputs past their bound, the worst |err| / bound into *ratio. */
static long compare(twin *t, int n_parts, float rope_factor, const float *ref, float *got,
                    double *ratio, double *rel, const char *what)
{
    kv_err e = {{0}};
    if (gpu_run(t, n_parts, rope_factor, got, &e)) {
        KV_CHECK(0, "%s: %s", what, e.msg);
        return -1;
    }
    const int dv = t->m.d_v;
    const int np = n_parts > 0 ? n_parts : (t->n + 63) / 64;
    double *bd = malloc(sizeof(double) * dv), max_bound = 0, max_out = 0;
    long over = 0;
    *ratio = 0;
    for (int h = 0; bd && h < t->H; h++) {
        head_bound(t, h, np, bd);
        for (int i = 0; i < dv; i++) {
            const double d = fabs((double)got[h * dv + i] - ref[h * dv + i]);
            if (!(d <= bd[i]) && over++ < 3 && rope_factor == 1.0f)
                printf("  %s: head %d [%d]: got %.9g, ref %.9g, |err| %.3g > %.3g\n", what, h, i,
                       got[h * dv + i], ref[h * dv + i], d, bd[i]);
            if (bd[i] > 0 && d / bd[i] > *ratio) *ratio = d / bd[i];
            max_bound = fmax(max_bound, bd[i]);
            max_out = fmax(max_out, fabs(ref[h * dv + i]));
        }
    }
    if (rope_factor == 1.0f) { /* the bound says something: small against what is computed */
        KV_CHECK(max_bound < 0.25 * max_out, "%s: bound %.3g against outputs up to %.3g", what,
                 max_bound, max_out);
    }
    *rel = max_out > 0 ? max_bound / max_out : 0;
    free(bd);
    return over;
}

/* One shape and format: both layouts, one range and @p split ranges, against the reference. */
static void check_case(const char *name, int H, const kv_mla_dims *m, int n, int fmt, int split,
                       uint64_t seed)
{
    const size_t no = (size_t)H * m->d_v;
    float *ref = malloc(sizeof(float) * no), *ranges = malloc(sizeof(float) * no);
    float *got[2] = {malloc(sizeof(float) * no), malloc(sizeof(float) * no)}; /* one range */
    char what[160];
    for (int paged = 0; paged < 2; paged++) {
        twin t;
        snprintf(what, sizeof what, "%s %s %s n %d", name, kv_quant_name(fmt),
                 paged ? "paged" : "contiguous", n);
        kv_err e = {{0}};
        int rc = twin_init(&t, H, m, n, fmt, paged, seed);
        if (!rc) {
            const kv_head_view v = kv_cache_view(&t.c, 0, 0, 0, KV_QROLE_KEY);
            rc = kv_mla_attention_absorbed(&t.w, t.qn, t.qr, &v, n, ref, &e);
        }
        KV_CHECK(!rc, "%s: setup and reference: %s", what, e.msg);
        for (int s = 0; !rc && s < 2; s++) {
            const int parts = s ? split : 1;
            double ratio, rel;
            const long over = compare(&t, parts, 1.0f, ref, s ? ranges : got[paged], &ratio, &rel,
                                      what);
            KV_CHECK(over == 0, "%s, %d range(s): %ld outputs past the bound (worst %.3g of it)",
                     what, parts, over, ratio);
            worst_ratio = fmax(worst_ratio, ratio);
            printf("  %-42s %d range(s): max |gpu - cpu| %.3g of the bound (<= %.3g of |out|)\n",
                   what, parts, ratio, rel);
            if (paged && !s) /* one range: the same arithmetic on the same rows */
                KV_CHECK(!memcmp(got[0], got[1], sizeof(float) * no),
                         "%s: paged == contiguous, bit for bit", what);
        }
        twin_free(&t);
    }
    free(ref), free(ranges), free(got[0]), free(got[1]);
}

/* The bound can fail: q_R off by 10 % (the RoPE term of every score) is outside it. */
static void check_bound_fails(void)
{
    const kv_mla_dims m = {64, 16, 32, 48, 0};
    twin t;
    kv_err e = {{0}};
    float ref[4 * 48], got[4 * 48];
    int rc = twin_init(&t, 4, &m, 130, KV_QF_F16, 0, 7);
    if (!rc) {
        const kv_head_view v = kv_cache_view(&t.c, 0, 0, 0, KV_QROLE_KEY);
        rc = kv_mla_attention_absorbed(&t.w, t.qn, t.qr, &v, t.n, ref, &e);
    }
    double ratio = 0, rel = 0;
    const long over = rc ? -1 : compare(&t, 1, 1.1f, ref, got, &ratio, &rel, "q_R x 1.1");
    KV_CHECK(over > 0, "a 10%% perturbed RoPE query: %ld outputs outside the bound (worst %.3g "
             "of it) %s", over, ratio, e.msg);
    printf("q_R x 1.1: %ld of %d outputs outside the bound, the worst %.3g times it\n", over,
           4 * 48, ratio);
    twin_free(&t);
}

/* Refusals, each with a message naming the call. */
static void check_refusals(void)
{
    const kv_mla_dims m = {64, 16, 32, 48, 0}, odd = {48, 16, 32, 48, 0};
    const kv_mla_dims kivi = {64, 32, 32, 48, 0}; /* rows of 96: KIVI's groups of 32 fit */
    twin t;
    kv_err e = {{0}};
    if (twin_init(&t, 4, &m, 100, KV_QF_F16, 1, 3)) {
        KV_CHECK(0, "refusals: setup");
        twin_free(&t);
        return;
    }
#define REFUSED(want, call, what)                                                              \
    do {                                                                                       \
        memset(&e, 0, sizeof e);                                                               \
        const int rc_ = (call);                                                                \
        KV_CHECK(rc_ == (want) && strstr(e.msg, "kvcu_"), "%s: status %d (want %d): %s", what, \
                 rc_, want, e.msg);                                                            \
    } while (0)
    float *o = t.d_out;
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_absorbed(t.d_uk, t.d_uv, &m, 4, t.d_qn, t.d_qr, t.g, 0,
                                                    0, 100, NULL, NULL, 0, &e), "NULL out");
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_absorbed(t.d_uk, t.d_uv, &m, 4, t.d_qn, t.d_qr, t.g, 0,
                                                    0, 0, o, NULL, 0, &e), "n 0");
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_absorbed(t.d_uk, t.d_uv, &m, 4, t.d_qn, t.d_qr, t.g, 0,
                                                    0, 101, o, NULL, 0, &e), "n past capacity");
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_absorbed(t.d_uk, t.d_uv, &m, 4, t.d_qn, t.d_qr, t.g, 1,
                                                    0, 100, o, NULL, 0, &e), "layer 1 of 1");
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_absorbed(t.d_uk, t.d_uv, &m, 4, t.d_qn, t.d_qr, t.g, 0,
                                                    0, 100, o, NULL, -1, &e), "n_parts -1");
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_absorbed(t.d_uk, t.d_uv, &odd, 4, t.d_qn, t.d_qr, t.g,
                                                    0, 0, 100, o, NULL, 0, &e),
            "dims whose rows are not the cache's");
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_latent(t.g, 0, 0, 100, t.d_qn, t.d_qr, o, NULL, 4, 24,
                                                  1.0f, 0, &e), "d_R 24, d_c 56");
    /* a paged slot whose table maps fewer rows than asked for */
    const int one = t.c.tables[0];
    KV_CHECK(kvcu_cache_set_blocks(t.g, 0, &one, 1, &e) == KV_OK, "one block: %s", e.msg);
    REFUSED(KV_ERR_ARG, kvcu_mla_attention_latent(t.g, 0, 0, 100, t.d_qn, t.d_qr, o, NULL, 4, 16,
                                                  1.0f, 0, &e), "100 rows over one block of 64");
    /* a two-plane cache is not a latent cache; KIVI is not read; 3 planes do not exist */
    kv_config shape;
    kv_cache_spec spec = kv_cache_spec_default(1, 64);
    kvcu_cache *g2 = NULL;
    int rc = kv_mla_cache_config(&m, 1, 64, &shape, &e);
    if (!rc) rc = kvcu_cache_create(&g2, &shape, &spec, &e);
    if (!rc)
        REFUSED(KV_ERR_ARG, kvcu_mla_attention_latent(g2, 0, 0, 64, t.d_qn, t.d_qr, o, NULL, 4, 16,
                                                      1.0f, 0, &e), "a K/V cache");
    kvcu_cache_free(g2), g2 = NULL;
    spec.quant.dtype = KV_QF_INT4_KIVI;
    if (!rc) rc = kv_mla_cache_config(&kivi, 1, 64, &shape, &e);
    if (!rc) rc = kvcu_cache_create_planes(&g2, &shape, &spec, 1, &e);
    if (!rc)
        REFUSED(KV_ERR_UNSUPPORTED, kvcu_mla_attention_latent(g2, 0, 0, 64, t.d_qn, t.d_qr, o, NULL,
                                                              4, 32, 1.0f, 0, &e), "KIVI");
    kvcu_cache_free(g2), g2 = NULL;
    KV_CHECK(!rc, "refusal caches: %s", e.msg);
    REFUSED(KV_ERR_ARG, kvcu_cache_create_planes(&g2, &shape, &spec, 3, &e), "3 planes");
#undef REFUSED
    twin_free(&t);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    const kv_mla_dims ds = {512, 64, 128, 128, 0}; /* DeepSeek's latent, V2-Lite's heads */
    const kv_mla_dims mid = {128, 32, 64, 64, 0}, small = {64, 16, 32, 48, 0};
    check_case("small dims, H 4", 4, &small, 1, KV_QF_F16, 1, 1);
    check_case("small dims, H 4", 4, &small, 200, KV_QF_F16, 3, 2);
    check_case("small dims, H 4", 4, &small, 200, KV_QF_BF16, 3, 2);
    check_case("dims 128/32, H 20", 20, &mid, 100, KV_QF_F16, 2, 4);
    check_case("small dims, H 40", 40, &small, 65, KV_QF_BF16, 2, 5);
    check_case("DeepSeek dims, H 16", 16, &ds, 70, KV_QF_BF16, 2, 6);
    check_case("DeepSeek dims, H 16", 16, &ds, 70, KV_QF_F16, 2, 6);
    const int deq[] = {KV_QF_INT8, KV_QF_FP8_E4M3, KV_QF_F32};
    for (int i = 0; i < 3; i++) check_case("small dims, H 4", 4, &small, 130, deq[i], 2, 8);
    check_bound_fails();
    check_refusals();
    printf("max |gpu - cpu| / bound over every case: %.3g\n", worst_ratio);
    return kv_test_finish();
}
