/*
 * kvlab bench: timing runs, reported as medians of repeats and as ratios measured in the
 * same run (docs/design.md §12). `bench decode`: naive recompute vs the KV cache.
 * `bench attention-gqa`: one decode-attention call per group size G (chapter 03).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_attention.h"
#include "kv_config.h"
#include "kv_rng.h"
#include "measure.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#define BENCH_PROMPT 16

/* Sustained read bandwidth of this machine: kv_read_bandwidth() (kv_bench.h, the same
 * measurement as `kvlab bench bandwidth`) over a 256 MiB buffer, median of 5. */
static double read_bandwidth(void)
{
    kv_bandwidth bw;
    kv_err err = {{0}};
    return kv_read_bandwidth(&bw, (size_t)256 << 20, 5, &err) == KV_OK ? bw.bytes_per_s : 0.0;
}

static int bench_decode(int argc, char **argv)
{
    const char *cmd = "kvlab bench decode";
    const char *model_name = "tiny", *device = "cpu";
    int steps = 200, repeats = 5, csv = 0;
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--default", KV_OPT_CHOICE, &model_name, 0, 0, kv_cli_defaults, "NAME", "embedded model (default tiny)", 0},
        {"--steps", KV_OPT_INT, &steps, 1, 1 << 20, NULL, "N", "tokens to generate (default 200; prompt 16 + N <= the model's seq_len)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "runs of each mode, interleaved (default 5)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        KV_CLI_CSV_OPTS(csv),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Generate N tokens greedily after a fixed 16-token prompt, naive (recompute\n"
                          "the prefix each step) and cached, R times each, interleaved; report medians\n"
                          "and the cached/naive speed-up measured in the same run.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    kv_config probe;
    kv_config_default_by_name(model_name, &probe, NULL, NULL);
    if (BENCH_PROMPT + steps > probe.seq_len)
        return kv_args_bad(cmd, "--steps", "%d steps + the %d-token prompt exceed model '%s''s "
                           "seq_len %d (at most %d steps)", steps, BENCH_PROMPT, model_name,
                           probe.seq_len, probe.seq_len - BENCH_PROMPT);
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;

    kv_err err = {{0}};
    kv_model m = {0};
    kv_backend *b = NULL;
    kv_run_log runs[2] = {{0}};
    int st = kv_cli_default_model(&m, model_name, &err);
    kv_cache_spec spec = kv_cache_spec_default(1, BENCH_PROMPT + steps);
    if (!st) st = kv_cli_backend(&b, device, &m, &spec, &err);
    for (int k = 0; k < 2 && !st; k++) st = kv_run_log_init(&runs[k], k, steps, repeats, &err);
    int prompt[BENCH_PROMPT];
    if (!st) kv_demo_prompt(prompt, BENCH_PROMPT, m.config.vocab_size);
    kv_progress prog;
    kv_progress_start(&prog, "bench decode");
    for (int rep = 0; rep < repeats && !st; rep++)
        for (int k = 0; k < 2 && !st; k++)
            st = kv_run_once(&runs[k], b, prompt, BENCH_PROMPT, &prog, (2L * rep + k) * steps,
                             2L * repeats * steps, &err);
    kv_progress_end(&prog);
    if (st) {
        kv_cli_fail(cmd, "run", st, &err);
        goto done;
    }
    double ratio[64];
    for (int i = 0; i < repeats; i++) ratio[i] = runs[0].total[i] / runs[1].total[i];
    if (csv) { /* one row per mode */
        kv_csv_printf(stdout, "model,device,threads,prompt,steps,repeats,mode,time_s,tokens_per_s,"
                      "gflops,kv_read_gbps,tokens_run,speedup\n");
        for (int k = 0; k < 2; k++) {
            const kv_counters *s = &runs[k].sum;
            const double t = kv_run_total_median(&runs[k]);
            kv_csv_printf(stdout, "%s,%s,%d,%d,%d,%d,%s,%.6e,%.3f,%.4f,%.4f,%lld,%.4f\n",
                          model_name, b->name, omp_get_max_threads(), BENCH_PROMPT, steps,
                          repeats, k ? "cached" : "naive", t, steps / t,
                          (s->flops_proj + s->flops_attn) / t * 1e-9, s->kv_bytes_read / t * 1e-9,
                          (long long)s->tokens, k ? kv_median(ratio, repeats) : 1.0);
        }
        goto done;
    }
    const double bw = strcmp(device, "cpu") == 0 ? read_bandwidth() : 0.0;

    char desc[256];
    kv_config_describe(&m.config, desc, sizeof desc);
    printf("bench decode: model '%s' (%s), device %s, %d OpenMP threads\n", model_name, desc,
           b->name, omp_get_max_threads());
    printf("prompt %d tokens, %d generated, greedy; %d runs of each mode, interleaved; medians\n\n",
           BENCH_PROMPT, steps, repeats);
    printf("%-8s %11s %11s %11s %13s %11s\n", "mode", "time (s)", "tokens/s", "GFLOP/s",
           "KV read GB/s", "tokens run");
    for (int k = 0; k < 2; k++) {
        const kv_counters *s = &runs[k].sum;
        double t = kv_run_total_median(&runs[k]);
        printf("%-8s %11.4f %11.1f %11.2f %13.2f %11lld\n", k ? "cached" : "naive", t, steps / t,
               (s->flops_proj + s->flops_attn) / t * 1e-9, s->kv_bytes_read / t * 1e-9,
               (long long)s->tokens);
    }
    printf("speed-up cached/naive: %.2fx (median over the %d repeats of naive time / cached time,"
           " each pair run back to back)\n", kv_median(ratio, repeats), repeats);

    printf("\nper-position cost (median step time; the step that runs position p):\n");
    printf("%8s %12s %12s %9s\n", "p", "naive (s)", "cached (s)", "ratio");
    for (int j = 0; j < 8; j++) {
        int i = j == 7 ? steps - 1 : (int)((long)j * steps / 7);
        if (j > 0 && i == (int)((long)(j - 1) * steps / 7)) continue;
        double tn = kv_run_step_median(&runs[0], i), tc = kv_run_step_median(&runs[1], i);
        printf("%8d %12.3e %12.3e %8.1fx\n", BENCH_PROMPT + i - 1, tn, tc, tn / tc);
    }
    kv_print_growth_exponents(stdout, runs, BENCH_PROMPT);
    if (bw > 0) {
        double t = kv_run_total_median(&runs[1]);
        printf("\nmachine read bandwidth (sum over a 256 MiB buffer, median of 5): %.2f GB/s\n", bw * 1e-9);
        printf("cached KV read rate / machine bandwidth: %.1f%% (the rate divides by the whole step's\n"
               "time, projections included; a cache that fits the CPU's caches can exceed 100%%)\n",
               100.0 * runs[1].sum.kv_bytes_read / t / bw);
    }
    printf("\nformulas: tokens/s = generated tokens / wall time of the run (prefill included);\n"
           "  FLOPs (2 per multiply-add) = proj 2*P per token run (P = weights in the Q,K,V,O and MLP\n"
           "  matmuls) + 2*dim*vocab per step (classifier) + attn 4*L*H*d per (query, key) pair;\n"
           "  KV read bytes = L*2*H_kv*d*4 per (query, key) pair; GB = 1e9 bytes; cache fp32.\n");
done:
    for (int k = 0; k < 2; k++) kv_run_log_free(&runs[k]);
    if (b) kv_backend_destroy(b);
    kv_model_free(&m);
    return st ? kv_cli_exit_code(st) : KV_EXIT_OK;
}

/* ---- attention-gqa: decode attention time and bytes per G ------------------------------
 *
 * One query token (H heads of d) over N cached positions of H_kv = H / G KV heads, fp32.
 * Bytes are the cache K and V one call must bring in, by formula:
 *   unique KV bytes = 2 · H_kv · N · d · 4     (what the CPU reference and GPU v2 read)
 *   GPU v1 bytes    = 2 · H   · N · d · 4     (every query head's block reads its rows again;
 *                                             repeats of a group may hit L2, so the DRAM
 *                                             traffic can be lower than this figure)
 * GB/s = bytes / median time (GB = 1e9 bytes). Scores scratch (4·H·N bytes written and read
 * back) is not counted. */

/* Groups to measure: 1, 2, 4, 8 and H (MQA), those that divide H. */
static int gqa_groups(int H, int *G)
{
    const int want[] = {1, 2, 4, 8, H};
    int n = 0;
    for (int i = 0; i < 5; i++) {
        if (H % want[i]) continue;
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= G[j] == want[i];
        if (!dup) G[n++] = want[i];
    }
    return n;
}

int kv_attn_gqa_table(FILE *f, const char *device, int H, int d, int N, int repeats, int csv,
                      kv_err *err)
{
    int Gs[5];
    const int nG = gqa_groups(H, Gs);
    const size_t nq = (size_t)H * d, nkv = (size_t)H * N * d; /* q [H][d]; k, v [H][N][d] */
    float *q = kv_calloc(nq * 4), *k = kv_calloc(nkv * 4), *v = kv_calloc(nkv * 4);
    float *out = kv_calloc(nq * 4);
    double *t = kv_calloc((size_t)repeats * sizeof(double));
    if (!q || !k || !v || !out || !t) {
        kv_free(q); kv_free(k); kv_free(v); kv_free(out); kv_free(t);
        return kv_fail(err, KV_ERR_NOMEM, "attention-gqa: %.0f MiB of K/V", 2.0 * nkv * 4 / 1048576);
    }
    kv_rng r;
    kv_rng_seed(&r, 42);
    for (size_t i = 0; i < nq; i++) q[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < nkv; i++) k[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < nkv; i++) v[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    const int gpu = strcmp(device, "cpu") != 0;
    int st = KV_OK;
#ifdef KV_HAVE_CUDA
    float *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dsc = NULL;
    if (gpu) {
        st = kvcu_malloc((void **)&dq, nq * 4, err);
        if (!st) st = kvcu_malloc((void **)&dk, nkv * 4, err);
        if (!st) st = kvcu_malloc((void **)&dv, nkv * 4, err);
        if (!st) st = kvcu_malloc((void **)&dout, nq * 4, err);
        if (!st) st = kvcu_malloc((void **)&dsc, (size_t)H * N * 4, err); /* [H][N] scores */
        if (!st) st = kvcu_upload(dq, q, nq * 4, err);
        if (!st) st = kvcu_upload(dk, k, nkv * 4, err);
        if (!st) st = kvcu_upload(dv, v, nkv * 4, err);
    }
#endif
    const double flops = 4.0 * H * (double)N * d; /* q·k and p·v, 2 FLOPs per multiply-add */
    if (csv)
        kv_csv_printf(f,
                      "device,H,H_kv,G,d,N,version,bytes,flops,seconds,GBps,GFLOPs,time_vs_G1\n");
    else {
        fprintf(f, "decode attention, one token: H %d, d %d, N %d cached positions, fp32; "
                "median of %d calls; device %s\n", H, d, N, repeats, device);
        fprintf(f, "FLOPs = 4*H*N*d = %.4g at every G; KV bytes = 2*H_kv*N*d*4 (GPU v1: 2*H*N*d*4)\n",
                flops);
        fprintf(f, "%5s %4s %3s %4s %12s %12s %10s %10s %10s\n", "H_kv", "G", "ver", "",
                "KV bytes", "time (s)", "GB/s", "GFLOP/s", "time/G1");
    }
    /* the prefix [H_kv][N][d] of the MHA buffers is a valid cache of H_kv heads */
    const int versions = gpu ? 2 : 1;
    double base[2] = {0, 0};
    for (int ver = 1; ver <= versions && !st; ver++)
        for (int gi = 0; gi < nG && !st; gi++) {
            const int G = Gs[gi], Hkv = H / G;
            const double bytes = 2.0 * (gpu && ver == 1 ? H : Hkv) * (double)N * d * 4;
            for (int rep = -1; rep < repeats && !st; rep++) { /* rep -1: warm-up */
                double t0 = kv_now();
                if (!gpu) {
                    st = kv_attn_decode(q, k, v, out, H, Hkv, d, N, N);
                    if (st) kv_fail(err, st, "kv_attn_decode failed");
                }
#ifdef KV_HAVE_CUDA
                else {
                    st = kvcu_attn_decode_version(ver, dq, dk, dv, dout, dsc, H, Hkv, d, N, N, err);
                    if (!st) st = kvcu_synchronize(err);
                }
#endif
                if (rep >= 0) t[rep] = kv_now() - t0;
            }
            if (st) break;
            const double med = kv_median(t, repeats);
            if (G == 1) base[ver - 1] = med;
            const char *what = gpu ? (ver == 1 ? "v1" : "v2") : "cpu";
            if (csv)
                kv_csv_printf(f, "%s,%d,%d,%d,%d,%d,%s,%.0f,%.0f,%.6e,%.3f,%.3f,%.4f\n", device, H,
                              Hkv, G, d, N, what, bytes, flops, med, bytes / med * 1e-9,
                              flops / med * 1e-9, med / base[ver - 1]);
            else {
                char b[32];
                fprintf(f, "%5d %4d %3s %4s %12s %12.3e %10.2f %10.2f %9.3fx\n", Hkv, G, what,
                        G == 1 ? "MHA" : G == H ? "MQA" : "GQA", kv_fmt_bytes(bytes, b, sizeof b),
                        med, bytes / med * 1e-9, flops / med * 1e-9, med / base[ver - 1]);
            }
        }
#ifdef KV_HAVE_CUDA
    kvcu_free(dq); kvcu_free(dk); kvcu_free(dv); kvcu_free(dout); kvcu_free(dsc);
#endif
    kv_free(q); kv_free(k); kv_free(v); kv_free(out); kv_free(t);
    return st;
}

static int bench_attention_gqa(int argc, char **argv)
{
    const char *cmd = "kvlab bench attention-gqa";
    const char *device = "cpu";
    int H = 32, d = 128, N = 8192, repeats = 9, csv = 0;
    kv_opt opts[] = {
        {"--heads", KV_OPT_INT, &H, 1, 256, NULL, "H", "query heads (default 32, Llama-2-7B)", 0},
        {"--head-dim", KV_OPT_INT, &d, 1, 512, NULL, "d", "head dim (default 128)", 0},
        {"--seq", KV_OPT_INT, &N, 1, 1 << 20, NULL, "N", "cached positions (default 8192)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "timed calls per row, after one warm-up (default 9)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cpu, or cuda: both kernel versions (default cpu)", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "One decode-attention call (one token, H query heads over N cached positions)\n"
                          "for G = 1, 2, 4, 8 and H (those dividing H), H_kv = H / G. Reports the\n"
                          "median time, the K/V bytes by formula (2*H_kv*N*d*4; GPU v1: 2*H*N*d*4),\n"
                          "GB/s and the time relative to G = 1 in the same run. On the CPU the machine's\n"
                          "read bandwidth is measured too.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;
    kv_err err = {{0}};
    int st = kv_attn_gqa_table(stdout, device, H, d, N, repeats, csv, &err);
    if (st) return kv_cli_fail(cmd, "run", st, &err);
#ifdef KV_HAVE_CUDA
    if (strcmp(device, "cpu") && kvcu_is_emulation() && !csv)
        printf("\nemulation build: these times are of CPU fibers running the kernels, not of a GPU;\n"
               "the bytes are what a GPU would read.\n");
#endif
    if (!strcmp(device, "cpu") && !csv) {
        printf("\nmachine read bandwidth (sum over a 256 MiB buffer, median of 5): %.2f GB/s; "
               "%d OpenMP threads\n", read_bandwidth() * 1e-9, omp_get_max_threads());
        printf("intensity: FLOPs / KV bytes = G/2 (fp32). Where the machine's GFLOP/s per GB/s is\n"
               "above G/2 the call is bandwidth-bound and time falls ~1/G; where it is below, the\n"
               "FLOPs (the same at every G) set the time and it stays nearly flat.\n");
    }
    return KV_EXIT_OK;
}

typedef struct {
    const char *name;
    kv_cli_cmd run;
    const char *summary;
} kv_bench;

static const kv_bench benches[] = {
    {"decode", bench_decode, "naive vs cached decoding: tokens/s, per-position cost, speed-up"},
    {"attention-gqa", bench_attention_gqa, "decode attention time and KV bytes per G (MHA/GQA/MQA; GPU v1 vs v2)"},
    {"quant", kv_bench_quant, "KV-cache formats vs fp32: bytes, errors, KL/top-1, needles, attention time"},
    {"bandwidth", cmd_bench_bandwidth, "the machine's read bandwidth and last-level cache (the roofline)"},
    {"engine", cmd_bench_engine, "whole-model decoding: tokens/s and the fraction of the memory roofline"},
    {"paged", cmd_bench_paged, "decode attention: contiguous vs paged caches (B 8/16/32); GPU v2 vs v3 (split-KV)"},
    {"attention", cmd_bench_attention, "naive vs tiled vs split-KV attention: time, bytes, GB/s vs read bandwidth"},
    {"prefill", cmd_bench_prefill, "GPU prefill on tensor cores: v5 and the 16-bit GEMM in TFLOP/s vs measured mma, time to first token"},
    {"mla", cmd_bench_mla, "GPU absorbed MLA decode on tensor cores: TFLOP/s vs measured mma, GB/s vs read bandwidth"},
    {"swap", cmd_bench_swap, "swap vs recompute of a preempted sequence by length: bytes, link time, FLOPs, crossover"},
};

int cmd_bench(int argc, char **argv)
{
    const int n = (int)(sizeof benches / sizeof benches[0]);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: kvlab bench <benchmark> [options]   (kvlab bench <benchmark> --help)\n\n"
               "Benchmarks report medians of repeated runs and ratios measured in the same run.\n\n"
               "benchmarks:\n");
        for (int i = 0; i < n; i++) printf("  %-14s %s\n", benches[i].name, benches[i].summary);
        return KV_EXIT_OK;
    }
    if (argc < 2) {
        fprintf(stderr, "kvlab bench: missing the benchmark name (decode, attention-gqa, quant, bandwidth, engine, paged, attention, prefill, mla, swap); see kvlab bench --help\n");
        return KV_EXIT_USAGE;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(argv[1], benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvlab bench: unknown benchmark '%s' (decode, attention-gqa, quant, bandwidth, engine, paged, attention, prefill, mla, swap); see kvlab bench --help\n", argv[1]);
    return KV_EXIT_USAGE;
}

/* argv scans before a command parses its table: which device, and whether a flag is there */
const char *kv_cli_device_arg(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], "--device=", 9)) return argv[i] + 9;
    }
    return "cpu";
}

int kv_cli_has_flag(int argc, char **argv, const char *flag)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag)) return 1;
    return 0;
}
