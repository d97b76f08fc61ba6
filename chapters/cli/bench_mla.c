/*
 * kvlab bench mla --device cuda (chapter 11): the absorbed MLA decode on tensor cores
 * (kvcu_mla_attention_latent(), cuda/attention/kvcu_attention_mla.cu), measured against the
 * same run's ceilings: the device's mma.sync throughput (kvcu_mma_throughput(), fp16 and bf16)
 * and its read bandwidth (kvcu_read_bandwidth()).
 *
 * A row: one decode token's H heads over n latent rows of d_c + d_R = 576 elements (DeepSeek's
 * 512 + 64) in a cache of format b bytes per element, paged in blocks of 64 (FlashMLA's) or
 * contiguous; random rows and queries; the ranges chosen from the SM count. Per row:
 *   FLOPs = H · n · (2(d_c + d_R) + 2 d_c)     scores q̃·c + q_R·k_R, then Σ p·c (2176 per
 *                                             head and row at DeepSeek's dims)
 *   bytes = n · (d_c + d_R) · b                 each row read once for all H heads (+ int8 scales)
 *   FLOP/byte = their ratio: 2176·H / (576·b), what places the decode on the roofline;
 *   TFLOP/s and "of mma" (the mma row of the tile's type: bf16 for a bf16 cache, else fp16),
 *   GB/s and "of bw". Medians of --repeats CUDA-event-timed calls after a warm-up.
 * The W_UK / W_UV absorptions (2·H·d_c·(d_nope + d_v) FLOPs once per step) are not in the
 * rows: they do not grow with n. --quick: sizes the emulation build runs in seconds (its
 * times are the CPU's, not a GPU's).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_mla.h"
#include "kv_quant.h"
#include "kv_rng.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"

typedef struct {
    const kvcu_cache *c;
    const float *q_lat, *q_rope;
    float *o_lat, *scratch;
    int H, n, d_rope;
    float scale;
} mla_call;

static int mla_fn(void *arg, kv_err *err)
{
    const mla_call *m = arg;
    return kvcu_mla_attention_latent(m->c, 0, 0, m->n, m->q_lat, m->q_rope, m->o_lat, m->scratch,
                                     m->H, m->d_rope, m->scale, 0, err);
}

/* Device buffer of n uniform floats in [-a, a]. */
static int upload_uniform(float **d, size_t n, float a, uint64_t seed, kv_err *err)
{
    float *h = malloc(n * sizeof(float) + 4);
    if (!h) return kv_fail(err, KV_ERR_NOMEM, "bench mla: %zu floats", n);
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) h[i] = kv_rng_uniform(&r, -a, a);
    int st = kvcu_malloc((void **)d, n * sizeof(float), err);
    if (!st) st = kvcu_upload(*d, h, n * sizeof(float), err);
    free(h);
    return st;
}

/* One row: a latent cache of n rows in format fmt, H heads, timed; *bytes the rows' bytes. */
static int time_mla(const kv_mla_dims *m, int H, int n, int fmt, int paged, int repeats,
                    double *s, double *bytes, kv_err *err)
{
    const int D = kv_mla_row(m), nb = (n + 63) / 64;
    kv_config shape;
    kv_cache_spec sp = kv_cache_spec_default(1, n);
    sp.quant.dtype = fmt;
    sp.quant.fp8_per_head = 1;
    if (paged) {
        sp.layout.kind = KV_LAYOUT_PAGED;
        sp.layout.block_size = 64;
        sp.layout.n_blocks = nb;
    }
    kvcu_cache *c = NULL;
    float *rows = NULL;
    mla_call call = {NULL, NULL, NULL, NULL, NULL, H, n, m->d_rope,
                     1.0f / sqrtf((float)(m->d_nope + m->d_rope))};
    int *table = malloc(sizeof(int) * nb);
    int st = table ? kv_mla_cache_config(m, 1, n, &shape, err) : kv_fail(err, KV_ERR_NOMEM, "table");
    if (!st) st = kvcu_cache_create_planes(&c, &shape, &sp, 1, err);
    for (int i = 0; table && i < nb; i++) table[i] = nb - 1 - i; /* logical order is not physical */
    if (!st && paged) st = kvcu_cache_set_blocks(c, 0, table, nb, err);
    if (!st) st = upload_uniform(&rows, (size_t)n * D, 1.0f, 31, err);
    if (!st) st = kvcu_cache_write_seq(c, 0, 0, 0, n, rows, NULL, err);
    if (!st) st = upload_uniform((float **)&call.q_lat, (size_t)H * m->d_c, 1.0f, 32, err);
    if (!st) st = upload_uniform((float **)&call.q_rope, (size_t)H * m->d_rope, 1.0f, 33, err);
    if (!st) st = kvcu_malloc((void **)&call.o_lat, sizeof(float) * H * m->d_c, err);
    if (!st)
        st = kvcu_malloc((void **)&call.scratch,
                         sizeof(float) * kvcu_mla_attention_scratch(H, m->d_c, n), err);
    call.c = c;
    if (!st) st = kvcu_time_calls(mla_fn, &call, repeats, s, err);
    *bytes = (double)n * D * kv_quant_bytes_per_element(fmt, D);
    kvcu_free(rows), kvcu_free((void *)call.q_lat), kvcu_free((void *)call.q_rope);
    kvcu_free(call.o_lat), kvcu_free(call.scratch);
    kvcu_cache_free(c);
    free(table);
    return st;
}
#endif

int cmd_bench_mla(int argc, char **argv)
{
    const char *cmd = "kvlab bench mla";
    const char *device = "cpu";
    int quick = 0, repeats = 0, csv = 0;
    kv_opt opts[] = {
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cuda (required: a tensor-core kernel)", 0},
        {"--quick", KV_OPT_FLAG, &quick, 0, 0, NULL, NULL, "small sizes, one repeat (the emulation build's run)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 1000, NULL, "N", "timed runs per row, median (default 5; --quick 1)", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Chapter 11's absorbed MLA decode on tensor cores (all H heads of a sequence as\n"
                          "the M dimension of mma.sync tiles): TFLOP/s against the device's mma.sync\n"
                          "throughput and GB/s against its read bandwidth, both measured in the same run.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (strcmp(device, "cuda") != 0)
        return kv_args_bad(cmd, "--device", "bench mla times a GPU kernel: give --device cuda");
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;
#ifdef KV_HAVE_CUDA
    if (!repeats) repeats = quick ? 1 : 5;
    const kv_mla_dims m = {512, 64, 128, 128, 0}; /* DeepSeek-V2/V3's attention */
    const int Hs[2] = {16, 128}, Ns[2] = {4096, 32768};
    const int fmts[3] = {KV_QF_BF16, KV_QF_F16, KV_QF_FP8_E4M3};
    const int n_h = quick ? 1 : 2, n_n = quick ? 1 : 2, n_f = quick ? 2 : 3;
    const int iters = quick ? 4 : 4096;
    kv_err err = {{0}};
    char dev[128];
    if (kvcu_device_describe(dev, sizeof dev, &err)) return kv_cli_fail(cmd, "device", 1, &err);
    double peak[2], bw = 0.0;
    for (int b = 0; b < 2; b++)
        if (kvcu_mma_throughput(b, iters, repeats, &peak[b], &err))
            return kv_cli_fail(cmd, "mma throughput", 1, &err);
    if (kvcu_read_bandwidth(quick ? ((size_t)1 << 20) : 0, repeats, &bw, &err))
        return kv_cli_fail(cmd, "read bandwidth", 1, &err);
    if (csv) {
        kv_csv_printf(stdout,
                      "layout,dtype,H,n,d_c,d_R,seconds,flop_per_byte,TFLOPs,of_mma,GBps,of_bw\n");
    } else {
        printf("bench mla --device cuda: %s%s; medians of %d runs\n", dev,
               quick ? " (--quick sizes)" : "", repeats);
        printf("ceilings, same run: mma.sync fp16 %.4g TFLOP/s, bf16 %.4g TFLOP/s; read %.1f GB/s\n\n",
               peak[0] * 1e-12, peak[1] * 1e-12, bw * 1e-9);
        printf("%-10s %-9s %4s %6s %12s %9s %9s %7s %9s %7s\n", "layout", "dtype", "H", "n", "time",
               "FLOP/B", "TFLOP/s", "of mma", "GB/s", "of bw");
    }
    for (int f = 0; f < n_f; f++)
        for (int hi = 0; hi < n_h; hi++)
            for (int ni = 0; ni < n_n; ni++)
                for (int paged = 1; paged >= 0; paged--) {
                    /* contiguous: the bf16 rows only, the layouts compared once */
                    if (!paged && (fmts[f] != KV_QF_BF16 || hi != n_h - 1 || ni != n_n - 1))
                        continue;
                    const int H = quick ? 16 : Hs[hi], n = quick ? 256 : Ns[ni];
                    double s = 0.0, bytes = 0.0;
                    if (time_mla(&m, H, n, fmts[f], paged, repeats, &s, &bytes, &err))
                        return kv_cli_fail(cmd, "mla", 1, &err);
                    const double flops = (double)H * n * (2.0 * kv_mla_row(&m) + 2.0 * m.d_c);
                    const double pk = peak[fmts[f] == KV_QF_BF16];
                    const char *lay = paged ? "paged" : "contiguous";
                    if (csv)
                        kv_csv_printf(stdout, "%s,%s,%d,%d,%d,%d,%.6g,%.1f,%.4g,%.3f,%.1f,%.3f\n",
                                      lay, kv_quant_name(fmts[f]), H, n, m.d_c, m.d_rope, s,
                                      flops / bytes, flops / s * 1e-12, flops / s / pk,
                                      bytes / s * 1e-9, bytes / s / bw);
                    else
                        printf("%-10s %-9s %4d %6d %9.3f ms %9.1f %9.4g %6.1f%% %9.1f %6.1f%%\n", lay,
                               kv_quant_name(fmts[f]), H, n, s * 1e3, flops / bytes,
                               flops / s * 1e-12, 100.0 * flops / s / pk, bytes / s * 1e-9,
                               100.0 * bytes / s / bw);
                }
    if (!csv) {
        printf("\nformulas: FLOPs = H·n·(2(d_c + d_R) + 2 d_c); bytes = n·(d_c + d_R)·b (each row once\n"
               "for all H heads); \"of mma\" against the mma.sync row of the tile's type (bf16 for a bf16\n"
               "cache, else fp16), \"of bw\" against the read bandwidth, both measured above.\n");
        if (kvcu_is_emulation())
            printf("(emulation build: CPU fibers run the kernels; the times are not a GPU's)\n");
    }
#endif
    return KV_EXIT_OK;
}
