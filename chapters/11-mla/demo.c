/*
 * Chapter 11 demo: multi-head latent attention, a cache of one latent row per token.
 *
 *  1. the bill: DeepSeek's presets cache (d_c + d_R)·b per token and layer, against MHA;
 *  2. the same answer two ways: naive (up-project every cached latent to per-head K/V) and
 *     absorbed (attention in latent space) on one DeepSeek-V2-Lite-shaped layer, and their time
 *     in the same run;
 *  3. FLOPs per byte of the absorbed decode for H = 16 and H = 128, against the ridge points;
 *  4. the latent cache in the storage formats of chapter 04, contiguous and paged (B = 64):
 *     bytes per token and layer, and paged == contiguous bit for bit.
 * With --csv: part 3 for H = 1 .. 256, beside MHA, GQA (groups of 8) and MQA of the same head
 * dim, with both ridge points (the figures target draws it as ch11-intensity.svg). Every
 * number in it is counted from the shapes; nothing is timed.
 * Everything runs on the CPU: the absorbed decode's CUDA twin is the chapter's exercise.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kv_attention_mla.h"
#include "kv_cache.h"
#include "kv_mla.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"

#define CH11_DIM 512      /* the layer's input width: only the projections see it */
#define CH11_N 1024       /* cached tokens in part 2 */
#define CH11_N_QUICK 96
#define CH11_REPEATS 3
/* an H100 SXM's datasheet rates (dense): HBM bytes/s, fp32 on CUDA cores, bf16 on tensor cores */
#define CH11_HBM_BPS 3.35e12
#define CH11_CUDA_FP32 67e12
#define CH11_TC_BF16 989e12

/* A one-plane (latent) cache of n tokens of @p fmt, contiguous or paged in blocks of 64
 * (kv_mla_cache_open()), holding @p rows [n][d_c + d_R]. */
static int latent_cache(kv_cache *c, const kv_mla_dims *m, int n, int fmt, int paged,
                        const float *rows, kv_err *err)
{
    int st = kv_mla_cache_open(c, m, n, fmt, paged, 0, err);
    if (!st) st = kv_cache_write_seq(c, 0, 0, 0, n, rows, NULL, err);
    return st;
}

static void part_bill(FILE *f)
{
    int np = 0;
    const kv_mla_preset *p = kv_mla_presets(&np);
    char a[32], b[32];
    fprintf(f, "1. the bill: one row of d_c + d_R elements per token and layer, whatever H (bf16, "
               "b = 2)\n");
    fprintf(f, "   %-17s %3s %4s %12s %14s %8s\n", "model", "L", "H", "MLA/token",
            "MHA d=128/token", "MLA/MHA");
    for (int i = 0; i < np; i++) {
        const double mla = (double)p[i].n_layers * kv_mla_row(&p[i].mla) * 2;
        const double mha = (double)p[i].n_layers * 2 * p[i].n_heads * p[i].mla.d_nope * 2;
        fprintf(f, "   %-17s %3d %4d %12s %14s %7.2f%%\n", p[i].name, p[i].n_layers,
                p[i].n_heads, kv_fmt_bytes(mla, a, sizeof a), kv_fmt_bytes(mha, b, sizeof b),
                100 * mla / mha);
    }
}

/* 2: one layer, a cache of n latent rows, the last token's heads both ways */
static int part_two_ways(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    const kv_mla_dims m = kv_mla_preset_find("deepseek-v2-lite")->mla;
    const int H = 16, n = ctx->quick ? CH11_N_QUICK : CH11_N, width = kv_mla_row(&m);
    const int repeats = ctx->quick ? 1 : CH11_REPEATS;
    kv_mla_layer w;
    kv_cache c = {0};
    float *x = kv_calloc((size_t)n * CH11_DIM * sizeof(float));
    float *row = kv_calloc((size_t)n * width * sizeof(float));
    float *qn = kv_calloc((size_t)n * H * m.d_nope * sizeof(float));
    float *qr = kv_calloc((size_t)n * H * m.d_rope * sizeof(float));
    float *a = kv_calloc((size_t)H * m.d_v * sizeof(float));
    float *b = kv_calloc((size_t)H * m.d_v * sizeof(float));
    int *pos = kv_calloc((size_t)n * sizeof(int));
    int st = kv_mla_layer_init(&w, CH11_DIM, H, &m, 11, err);
    float *scratch = st ? NULL : kv_calloc(kv_mla_project_scratch(&w, n) * sizeof(float));
    if (!st && (!x || !row || !qn || !qr || !a || !b || !pos || !scratch))
        st = kv_fail(err, KV_ERR_NOMEM, "chapter 11 demo: buffers for %d tokens", n);
    if (!st) {
        kv_rng r;
        kv_rng_seed(&r, 11);
        for (int64_t i = 0; i < (int64_t)n * CH11_DIM; i++) x[i] = kv_rng_normal(&r);
        for (int t = 0; t < n; t++) pos[t] = t;
        kv_config rc = {0}; /* RoPE over d_R at llama2.c's base, for kv_rope_freqs() */
        rc.rope_theta = 10000.0f;
        rc.rotary_dim = m.d_rope;
        double freq[KV_ROPE_MAX_PAIRS]; /* [d_R/2] */
        kv_rope_freqs(&rc, freq);
        kv_mla_project(&w, x, pos, n, freq, 1e-6f, qn, qr, row, scratch);
        st = latent_cache(&c, &m, n, KV_QF_F32, 0, row, err);
    }
    double tn = INFINITY, ta = INFINITY;
    const float *q1 = qn + (size_t)(n - 1) * H * m.d_nope, *q2 = qr + (size_t)(n - 1) * H * m.d_rope;
    const kv_head_view v = kv_cache_view(&c, 0, 0, 0, KV_QROLE_KEY);
    for (int r = 0; !st && r < repeats; r++) { /* the fastest of the repeats */
        double t0 = kv_now();
        st = kv_mla_attention_naive(&w, q1, q2, &v, n, a, err);
        double t1 = kv_now();
        if (!st) st = kv_mla_attention_absorbed(&w, q1, q2, &v, n, b, err);
        double t2 = kv_now();
        tn = fmin(tn, t1 - t0), ta = fmin(ta, t2 - t1);
    }
    if (!st) {
        double diff = 0, amax = 0;
        for (int i = 0; i < H * m.d_v; i++) {
            diff = fmax(diff, fabs((double)a[i] - b[i]));
            amax = fmax(amax, fabs((double)a[i]));
        }
        const double fn = kv_mla_attention_flops(&m, H, n, 0), fa = kv_mla_attention_flops(&m, H, n, 1);
        fprintf(f, "\n2. one layer of DeepSeek-V2-Lite's attention (H %d, d_c %d, d_R %d, d_nope %d, "
                   "d_v %d),\n   random weights, one new token over %d cached latent rows, fp32 "
                   "on the CPU:\n", H, m.d_c, m.d_rope, m.d_nope, m.d_v, n);
        fprintf(f, "   %-44s %12s %10s\n", "", "FLOPs", "time (s)");
        fprintf(f, "   %-44s %12.4g %10.4g\n", "(a) naive: up-project to K/V, then attention", fn, tn);
        fprintf(f, "   %-44s %12.4g %10.4g\n", "(b) absorbed: attention in latent space", fa, ta);
        fprintf(f, "   FLOPs (a)/(b) = %.1f (predicted from the shapes); time (a)/(b) = %.1f "
                   "(measured, same run)\n", fn / fa, tn / ta);
        fprintf(f, "   max |(a) - (b)| = %.2g against outputs up to %.3g (tests/test_mla.c holds "
                   "it to a derived bound)\n", diff, amax);
    }
    kv_cache_free(&c);
    kv_mla_layer_free(&w);
    kv_free(x), kv_free(row), kv_free(qn), kv_free(qr), kv_free(a), kv_free(b), kv_free(pos);
    kv_free(scratch);
    return st;
}

static void part_intensity(FILE *f)
{
    const kv_mla_dims m = kv_mla_preset_find("deepseek-v2")->mla;
    const double row = kv_mla_row(&m), per_head = 2.0 * (m.d_c + m.d_rope) + 2.0 * m.d_c;
    fprintf(f, "\n3. FLOPs per byte of the absorbed decode: each cached row (%g elements, b = 2) is "
               "read once\n   for all H heads, each spending 2(d_c + d_R) + 2 d_c = %g FLOPs on it\n",
            row, per_head);
    const int hs[] = {16, 128};
    for (int i = 0; i < 2; i++)
        fprintf(f, "   H = %3d: %g * %d / (%g * 2) = %.1f FLOP/byte\n", hs[i], per_head, hs[i],
                row, per_head * hs[i] / (row * 2));
    fprintf(f, "   ridge points (H100 SXM, 3.35 TB/s): CUDA cores 67 TFLOP/s fp32 -> %.0f; tensor "
               "cores 989 TFLOP/s bf16 -> %.0f\n", CH11_CUDA_FP32 / CH11_HBM_BPS,
            CH11_TC_BF16 / CH11_HBM_BPS);
    fprintf(f, "   (MHA or GQA decode in bf16: 2G/b = G FLOP/byte, G <= 8 for the presets of "
               "chapter 03)\n");
}

/* Part 3 as rows, H = 1, 2, 4 .. 256 query heads, b = 2 (bf16). The absorbed decode reads one
 * row of d_c + d_R elements per cached token for all H heads, each spending
 * 2(d_c + d_R) + 2 d_c FLOPs on it. MHA, GQA and MQA with head dim d = d_nope read 2 d elements
 * per token and KV head, and each of its G query heads spends 2d (score) + 2d (value) FLOPs:
 * 2G/b per byte, G = 1 (MHA), 8 (GQA with H_kv = H/8, from H = 8), H (MQA). */
static void part_intensity_csv(FILE *f)
{
    const kv_mla_dims m = kv_mla_preset_find("deepseek-v2")->mla;
    const double b = 2, row = kv_mla_row(&m), per_head = 2.0 * (m.d_c + m.d_rope) + 2.0 * m.d_c;
    const double d = m.d_nope, gqa_per_g = 4 * d / (2 * d * b);
    kv_csv_printf(f, "H,mla_flops_per_row,mla_row_bytes,mla_absorbed,mha,gqa8,mqa,cuda_core_ridge,"
                     "tensor_core_ridge\n");
    for (int h = 1; h <= 256; h *= 2) {
        char gqa[32] = "";
        if (h >= 8) snprintf(gqa, sizeof gqa, "%g", 8 * gqa_per_g);
        kv_csv_printf(f, "%d,%g,%g,%.4f,%g,%s,%g,%.4f,%.4f\n", h, per_head * h, row * b,
                      per_head * h / (row * b), gqa_per_g, gqa, h * gqa_per_g,
                      CH11_CUDA_FP32 / CH11_HBM_BPS, CH11_TC_BF16 / CH11_HBM_BPS);
    }
}

static int part_formats(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    const kv_mla_dims m = kv_mla_preset_find("deepseek-v2")->mla;
    const int n = 200, width = kv_mla_row(&m);
    const char *fmts[] = {"fp32", "fp16", "bf16", "int8", "fp8-e4m3"};
    float *row = kv_calloc((size_t)n * width * sizeof(float));
    if (!row) return kv_fail(err, KV_ERR_NOMEM, "chapter 11 demo: rows");
    kv_rng r;
    kv_rng_seed(&r, 12);
    for (int64_t i = 0; i < (int64_t)n * width; i++) row[i] = kv_rng_normal(&r);
    fprintf(f, "\n4. the latent cache: a kv_cache of one plane (c_KV ‖ k_R, role K), %d tokens of "
               "%d elements\n", n, width);
    fprintf(f, "   %-9s %16s %16s %22s\n", "format", "bytes/token/layer", "DeepSeek-V2/token",
            "paged (B=64) == contig.");
    int st = KV_OK;
    for (size_t i = 0; !st && i < sizeof fmts / sizeof fmts[0]; i++) {
        const int fmt = kv_quant_parse(fmts[i]);
        kv_cache c = {0}, p = {0};
        st = latent_cache(&c, &m, n, fmt, 0, row, err);
        if (!st) st = latent_cache(&p, &m, n, fmt, 1, row, err);
        if (!st) {
            const kv_head_view cv = kv_cache_view(&c, 0, 0, 0, KV_QROLE_KEY);
            const kv_head_view pv = kv_cache_view(&p, 0, 0, 0, KV_QROLE_KEY);
            long same = 0;
            for (int t = 0; t < n; t++)
                for (int j = 0; j < width; j++) {
                    const float x = kv_cache_elem(&cv, t, j), y = kv_cache_elem(&pv, t, j);
                    same += memcmp(&x, &y, sizeof x) == 0;
                }
            const double per = width * kv_quant_bytes_per_element(fmt, width);
            char u[32];
            fprintf(f, "   %-9s %16g %16s %22s\n", fmts[i], per,
                    kv_fmt_bytes(per * 60, u, sizeof u), same == (long)n * width ? "yes" : "NO");
            if (same != (long)n * width) st = -1;
        }
        kv_cache_free(&c);
        kv_cache_free(&p);
    }
    kv_free(row);
    return st;
}

int kv_demo_ch11(const kv_demo_ctx *ctx, kv_err *err)
{
    if (ctx->csv) { /* the one series to plot: part 3 against H */
        part_intensity_csv(ctx->out);
        return KV_OK;
    }
    part_bill(ctx->out);
    int st = part_two_ways(ctx, err);
    if (!st) part_intensity(ctx->out);
    if (!st) st = part_formats(ctx, err);
    return st;
}
