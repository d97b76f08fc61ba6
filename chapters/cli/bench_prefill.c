/*
 * kvlab bench prefill --device cuda (chapter 08): the prefill on tensor cores, measured
 * against the same run's ceiling.
 *
 *   mma      the device's mma.sync throughput (kvcu_mma_throughput(): warps issuing
 *            independent m16n8k16 products on registers), fp16 and bf16: the ceiling;
 *   v5, v6   chapter 08's flash_kernel_v5 and flash_kernel_v6 on one layer, T queries over T
 *            keys, causal, an fp16 cache, then an int8 one (v6's converting tiles):
 *            FLOPs 4·H·d·T(T+1)/2 (S = QKᵀ and P·V, 2 per multiply-add, the visible
 *            pairs), TFLOP/s and % of the mma row;
 *   gemm     kvcu_matmul_x16() at T x in x out (bf16 and fp16 weights, x rounded to 16 bits
 *            beforehand as the engine rounds each layer input once), 2·T·in·out FLOPs,
 *            beside the fp32 SIMT matmul (kvcu_matmul()) on the same shape;
 *   gemv     kvcu_matmul_w16_gemv() on one row: the weight bytes over the time, against the
 *            read bandwidth of the same run (kvcu_read_bandwidth());
 *   ttft     a P-token prompt's first token on a random-weight model (one kvcu_forward of the
 *            whole prompt, host wall time): the per-row prefill (simt) against the engine's
 *            tensor-core prefill (mma: v6, or v5 where v6 does not fit), fp32 and bf16
 *            weights.
 *
 * Medians of --repeats runs after a warm-up. --quick: the same rows at sizes the emulation
 * build runs in seconds (its times are the CPU's, not a GPU's).
 *
 * --dry-run needs no device: it prints the scheduling model behind v6's longest-first order
 * (kv_flash_grid.h) for the v5 and v6 rows' causal grid at T = --prompt, on an H100's 132 SMs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_flash_grid.h"
#include "kv_rng.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#ifdef KV_HAVE_CUDA
typedef struct {
    float *y, *x;
    const float *w32;
    const uint16_t *w16, *x16;
    int bf16, T, in, out, gemv;
} gemm_call;

static int gemm_fn(void *arg, kv_err *err)
{
    const gemm_call *g = arg;
    if (!g->w16) return kvcu_matmul(g->y, g->x, g->w32, g->T, g->in, g->out, err);
    if (g->gemv)
        return kvcu_matmul_w16_gemv(g->y, g->x, g->w16, g->bf16, g->T, g->in, g->out, g->in, err);
    return kvcu_matmul_x16(g->y, g->x16, g->w16, g->bf16, g->T, g->in, g->out, g->in, err);
}

/* Device buffer of n uniform floats in [-1, 1]. */
static int upload_random(float **d, size_t n, uint64_t seed, kv_err *err)
{
    float *h = malloc(n * sizeof(float));
    if (!h) return kv_fail(err, KV_ERR_NOMEM, "bench prefill: %zu floats", n);
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) h[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    int st = kvcu_malloc((void **)d, n * sizeof(float), err);
    if (!st) st = kvcu_upload(*d, h, n * sizeof(float), err);
    free(h);
    return st;
}

/* Chapter 08's v5 or v6 (@p version) on one layer: T queries of H heads over T keys of H_kv
 * heads, causal, a cache of format @p fmt (fp16, or int8: v6's converting tiles). */
static int time_flash(int version, int fmt, int T, int H, int Hkv, int d, int repeats, double *s,
                      kv_err *err)
{
    kv_config g;
    memset(&g, 0, sizeof g);
    g.dim = H * d, g.hidden_dim = g.dim, g.n_layers = 1, g.n_heads = H, g.n_kv_heads = Hkv;
    g.vocab_size = 2, g.seq_len = T;
    kv_config_set_defaults(&g);
    kv_cache_spec sp = kv_cache_spec_default(1, T);
    sp.quant.dtype = fmt;
    kvcu_cache *c = NULL;
    float *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    int st = kvcu_cache_create(&c, &g, &sp, err);
    if (!st) st = upload_random(&k, (size_t)T * Hkv * d, 11, err);
    if (!st) st = upload_random(&v, (size_t)T * Hkv * d, 12, err);
    if (!st) st = kvcu_cache_write_seq(c, 0, 0, 0, T, k, v, err);
    if (!st) st = upload_random(&q, (size_t)T * H * d, 13, err);
    if (!st) st = kvcu_malloc((void **)&out, (size_t)T * H * d * sizeof(float), err);
    const kvcu_flash_job j = {c, 0, 0, H, q, T, 0, 0, T, 1, out};
    if (!st) st = kvcu_flash_time(version, &j, NULL, repeats, s, err);
    kvcu_free(q), kvcu_free(k), kvcu_free(v), kvcu_free(out);
    kvcu_cache_free(c);
    return st;
}

/* kvcu_matmul_x16 (dtype KV_QF_BF16 / F16; the GEMV kvcu_matmul_w16_gemv when @p gemv) or
 * kvcu_matmul (KV_QF_F32) at T x in x out. */
static int time_gemm(int dtype, int gemv, int T, int in, int out, int repeats, double *s,
                     kv_err *err)
{
    gemm_call g = {NULL, NULL, NULL, NULL, NULL, dtype == KV_QF_BF16, T, in, out, gemv};
    float *w = NULL;
    uint16_t *w16 = NULL, *x16 = NULL;
    int st = upload_random(&g.x, (size_t)T * in, 21, err);
    if (!st) st = upload_random(&w, (size_t)out * in, 22, err);
    if (!st) st = kvcu_malloc((void **)&g.y, (size_t)T * out * sizeof(float), err);
    if (!st && dtype != KV_QF_F32) st = kvcu_malloc((void **)&w16, (size_t)out * in * 2, err);
    if (!st && w16) st = kvcu_to16(w16, w, (int64_t)out * in, g.bf16, err);
    if (!st && w16 && !gemv) st = kvcu_malloc((void **)&x16, (size_t)T * in * 2, err);
    if (!st && x16) st = kvcu_to16(x16, g.x, (int64_t)T * in, g.bf16, err);
    g.w32 = w, g.w16 = w16, g.x16 = x16;
    if (!st) st = kvcu_time_calls(gemm_fn, &g, repeats, s, err);
    kvcu_free(g.x), kvcu_free(g.y), kvcu_free(w), kvcu_free(w16), kvcu_free(x16);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Time to first token of a P-token prompt: one forward of the prompt, host wall time. */
static int time_ttft(const kv_model *m, int P, const kvcu_engine_opts *o, int repeats,
                     double *s, kv_err *err)
{
    kv_cache_spec sp = kv_cache_spec_default(1, P);
    kv_backend *b = NULL;
    int *tok = malloc((size_t)P * sizeof(int));
    float *logits = malloc((size_t)m->config.vocab_size * sizeof(float));
    double *t = malloc((size_t)(repeats + 1) * sizeof(double));
    int st = tok && logits && t ? kvcu_backend_create_opts(&b, m, &sp, o, err)
                                : kv_fail(err, KV_ERR_NOMEM, "bench prefill: prompt");
    for (int i = 0; i < P && tok; i++) tok[i] = 1 + (7 * i) % (m->config.vocab_size - 1);
    for (int r = 0; !st && r <= repeats; r++) { /* run 0: the warm-up */
        b->reset(b, 0);
        const kv_seq q = {0, 0, P, tok};
        const double t0 = kv_now();
        st = b->forward(b, &q, 1, logits, NULL, err);
        t[r] = kv_now() - t0;
    }
    if (!st) {
        qsort(t + 1, (size_t)repeats, sizeof(double), cmp_double);
        *s = repeats % 2 ? t[1 + repeats / 2] : 0.5 * (t[repeats / 2] + t[1 + repeats / 2]);
    }
    if (b) kv_backend_destroy(b);
    free(tok), free(logits), free(t);
    return st;
}
#endif

#ifdef KV_HAVE_CUDA
/* One result row: the table's columns, or with --csv one CSV row (row, time_s, tflops,
 * pct_of_mma, gbps, pct_of_bandwidth, speedup; a column a row has no value for is empty). */
static void result_row(int csv, const char *name, double s, double tflops, double pct,
                       double gbps, double bw_pct, double speedup)
{
    if (!csv) {
        if (gbps > 0)
            printf("\n%-34s %10.3f ms %8.1f GB/s %6.1f%% of the read bandwidth\n", name, s * 1e3,
                   gbps, bw_pct);
        else if (speedup > 0)
            printf("  %-32s %10.3f ms  %6.2fx\n", name, s * 1e3, speedup);
        else if (s > 0)
            printf("%-34s %10.3f ms %10.4g %7.1f%%\n", name, s * 1e3, tflops, pct);
        else
            printf("%-34s %12s %10.4g %8s\n", name, "-", tflops, "100%");
        return;
    }
    char v[6][32];
    const double x[6] = {s, tflops, pct, gbps, bw_pct, speedup};
    for (int i = 0; i < 6; i++)
        if (x[i] > 0) snprintf(v[i], sizeof v[i], "%.6g", x[i]);
        else v[i][0] = '\0';
    kv_csv_printf(stdout, "%s,%s,%s,%s,%s,%s,%s\n", name, v[0], v[1], v[2], v[3], v[4], v[5]);
}
#endif

/* --dry-run: the v5 and v6 rows' grid (H 32, H_kv 8, d 128) under kv_flash_grid_schedule():
 * a block of 128 rows holds 128 / G queries, a key tile at d 128 is 32 keys (fv6_keys()), a
 * block's fixed cost 2 tiles' worth; 132 SMs (an H100) with 2 blocks each. */
static int dry_run(const char *cmd, int T)
{
    const int H = 32, Hkv = 8, d = 128, sms = 132, per_sm = 2, G = H / Hkv;
    const kv_flash_grid g = {T, 128 / G, 32, Hkv, 2, sms * per_sm};
    kv_flash_grid_time t[2];
    kv_err err = {{0}};
    for (int o = 0; o < 2; o++)
        if (kv_flash_grid_schedule(&g, o, &t[o], &err))
            return kv_cli_fail(cmd, "scheduling model", 1, &err);
    printf("bench prefill --dry-run: the scheduling model of the v5 and v6 rows' causal grid "
           "(counted, not timed)\n"
           "T %d, H %d / H_kv %d, d %d: blocks of %d queries (128 rows / G %d), key tiles of %d "
           "keys;\na block's time: its key tiles + %d; %lld blocks on %d SMs x %d = %d slots\n\n",
           T, H, Hkv, d, g.q_block, G, g.k_tile, g.extra, (long long)t[0].blocks, sms, per_sm,
           g.slots);
    printf("%-26s %12s %14s\n", "order", "last ends", "after balanced");
    printf("%-26s %12.2f %13.1f%%\n", "balanced (none ends sooner)", t[0].balanced, 0.0);
    const char *name[2] = {"index order (v5)", "longest first (v6)"};
    for (int o = 0; o < 2; o++)
        printf("%-26s %12lld %13.1f%%\n", name[o], (long long)t[o].makespan,
               100.0 * (t[o].makespan / t[0].balanced - 1.0));
    printf("\npredicted speed-up of v6's order alone: %.2fx (%lld / %lld tile-times)\n",
           (double)t[0].makespan / t[1].makespan, (long long)t[0].makespan,
           (long long)t[1].makespan);
    return KV_EXIT_OK;
}

int cmd_bench_prefill(int argc, char **argv)
{
    const char *cmd = "kvlab bench prefill";
    const char *device = "cpu", *model = "small";
    int quick = 0, repeats = 0, prompt = 0, csv = 0, dry = 0;
    kv_opt opts[] = {
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cuda (required: these are tensor-core kernels)", 0},
        {"--quick", KV_OPT_FLAG, &quick, 0, 0, NULL, NULL, "small sizes, one repeat (the emulation build's run)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 1000, NULL, "N", "timed runs per row, median (default 5; --quick 1)", 0},
        {"--default", KV_OPT_CHOICE, &model, 0, 0, kv_cli_defaults, "NAME", "model of the time-to-first-token rows (default small; --quick tiny)", 0},
        {"--prompt", KV_OPT_INT, &prompt, 2, 1 << 17, NULL, "P", "prompt tokens of the time-to-first-token rows and T of the v5 and v6 rows (default 4096; --quick 64)", 0},
        {"--dry-run", KV_OPT_FLAG, &dry, 0, 0, NULL, NULL, "no device: print the scheduling model of the v5 and v6 rows' causal grid (index order against longest first) at T = --prompt", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Chapter 08's prefill on tensor cores: v5, v6 and the 16-bit GEMM in TFLOP/s against\n"
                          "the device's mma.sync throughput measured in the same run, and the time to\n"
                          "first token of a prompt with the per-row (simt) and tensor-core (mma) prefill.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (dry) {
        if (csv) return kv_args_bad(cmd, "--dry-run", "prints the model as text: not with --csv");
        return dry_run(cmd, prompt ? prompt : 4096);
    }
    if (strcmp(device, "cuda") != 0)
        return kv_args_bad(cmd, "--device", "bench prefill times GPU kernels: give --device cuda");
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;
#ifdef KV_HAVE_CUDA
    if (!repeats) repeats = quick ? 1 : 5;
    if (!prompt) prompt = quick ? 64 : 4096;
    if (quick && !kv_cli_has_flag(argc, argv, "--default")) model = "tiny";
    const int H = quick ? 4 : 32, Hkv = quick ? 2 : 8, d = quick ? 64 : 128;
    const int GT = quick ? 32 : 4096, GN = quick ? 128 : 4096, iters = quick ? 4 : 4096;
    kv_err err = {{0}};
    char dev[128];
    if (kvcu_device_describe(dev, sizeof dev, &err)) return kv_cli_fail(cmd, "device", 1, &err);
    if (csv)
        kv_csv_printf(stdout, "row,time_s,tflops,pct_of_mma,gbps,pct_of_bandwidth,speedup\n");
    else
        printf("bench prefill --device cuda: %s%s; medians of %d runs\n\n", dev,
               quick ? " (--quick sizes)" : "", repeats);
    double peak[2];
    for (int b = 0; b < 2; b++)
        if (kvcu_mma_throughput(b, iters, repeats, &peak[b], &err))
            return kv_cli_fail(cmd, "mma throughput", 1, &err);
    if (!csv) printf("%-34s %12s %10s %8s\n", "row", "time", "TFLOP/s", "of mma");
    result_row(csv, "mma.sync fp16 (measured ceiling)", 0, peak[0] * 1e-12, 100, 0, 0, 0);
    result_row(csv, "mma.sync bf16 (measured ceiling)", 0, peak[1] * 1e-12, 100, 0, 0, 0);
    double s = 0.0, f = 4.0 * H * d * ((double)prompt * (prompt + 1) / 2.0);
    char name[64];
    for (int i = 0; i < 4; i++) { /* v5, v6 on an fp16 cache, then on an int8 one */
        const int ver = 5 + i % 2, fmt = i < 2 ? KV_QF_F16 : KV_QF_INT8;
        if (time_flash(ver, fmt, prompt, H, Hkv, d, repeats, &s, &err))
            return kv_cli_fail(cmd, ver == 5 ? "v5" : "v6", 1, &err);
        snprintf(name, sizeof name, "v%d T %d H %d/%d d %d causal %s", ver, prompt, H, Hkv, d,
                 i < 2 ? "fp16" : "int8");
        result_row(csv, name, s, f / s * 1e-12, 100.0 * f / s / peak[0], 0, 0, 0);
    }
    const int dts[3] = {KV_QF_BF16, KV_QF_F16, KV_QF_F32};
    const char *dtn[3] = {"bf16 (mma)", "fp16 (mma)", "fp32 (simt)"};
    for (int i = 0; i < 3; i++) {
        if (time_gemm(dts[i], 0, GT, GN, GN, repeats, &s, &err)) return kv_cli_fail(cmd, "gemm", 1, &err);
        f = 2.0 * GT * GN * GN;
        snprintf(name, sizeof name, "gemm %dx%dx%d %s", GT, GN, GN, dtn[i]);
        const double pk = peak[dts[i] == KV_QF_BF16];
        result_row(csv, name, s, f / s * 1e-12, 100.0 * f / s / pk, 0, 0, 0);
    }
    /* the one-token rows: bandwidth-bound, against the read bandwidth of the same run */
    double bw = 0.0;
    if (kvcu_read_bandwidth(quick ? ((size_t)1 << 20) : 0, repeats, &bw, &err))
        return kv_cli_fail(cmd, "read bandwidth", 1, &err);
    if (time_gemm(KV_QF_BF16, 1, 1, GN, GN, repeats, &s, &err)) return kv_cli_fail(cmd, "gemv", 1, &err);
    const double wb = 2.0 * GN * GN;
    if (!csv) printf("\nread bandwidth of the device, this run: %.1f GB/s", bw * 1e-9);
    result_row(csv, "gemv 1 row, bf16 weights (ld16)", s, 0, 0, wb / s * 1e-9, 100.0 * wb / s / bw, 0);
    kv_model m = {0};
    if (kv_cli_default_model(&m, model, &err)) return kv_cli_fail(cmd, model, 1, &err);
    if (m.config.seq_len < prompt) m.config.seq_len = prompt; /* RoPE has no hard limit */
    if (!csv)
        printf("\ntime to first token, %s model, %d-token prompt (one forward of the prompt):\n",
               model, prompt);
    const kvcu_engine_opts eo[3] = {{KV_QF_F32, 0}, {KV_QF_F32, 6}, {KV_QF_BF16, 6}};
    const char *eon[3] = {"simt prefill, fp32 weights", "mma prefill, fp32 weights",
                          "mma prefill, bf16 weights"};
    double base = 0.0;
    for (int i = 0; i < 3; i++) {
        if (time_ttft(&m, prompt, &eo[i], repeats, &s, &err)) {
            kv_model_free(&m);
            return kv_cli_fail(cmd, "time to first token", 1, &err);
        }
        if (!i) base = s;
        char ttft[96];
        snprintf(ttft, sizeof ttft, csv ? "ttft %s, %s, P %d" : "%s", eon[i], model, prompt);
        result_row(csv, ttft, s, 0, 0, 0, 0, base / s);
    }
    kv_model_free(&m);
    if (csv) return KV_EXIT_OK;
    printf("\nformulas: v5, v6 FLOPs = 4·H·d·T(T+1)/2 (causal pairs; S and P·V); gemm FLOPs = 2·T·in·out;\n"
           "\"of mma\" = TFLOP/s / the mma.sync row of the same input type (fp32: fp16's), measured above.\n");
    if (kvcu_is_emulation())
        printf("(emulation build: CPU fibers run the kernels; the times are not a GPU's)\n");
#endif
    return KV_EXIT_OK;
}
