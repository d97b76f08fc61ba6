/*
 * kvlab bench swap (chapter 07): when is swapping a preempted sequence out and back cheaper
 * than dropping it and computing its cache again?
 *
 * For a sequence of n cached tokens:
 *
 *   swap      = out + in = 2 · (λ + bytes(n) / bw)          (kv_link: one batched copy each way)
 *   bytes(n)  = ceil(n / B) · block_bytes                     (what kv_swap moves: whole blocks)
 *   block_bytes = B · L · 2 · H_kv · d · b                    (kv_cache_block_bytes(), metadata in b)
 *   recompute = a prefill of the n tokens:
 *   FLOPs(n)  = 2·P·n + 2·dim·vocab + 4·L·H·d · n(n+1)/2     (kv_counters_add_step(): projections,
 *                                                              one classifier row, causal attention)
 *
 * with P the weights of the Q, K, V, O and MLP matmuls. On an accelerator sustaining F FLOP/s the
 * recompute takes FLOPs(n) / F (modelled); on this machine's CPU it is measured (median of
 * repeats of a real prefill on the embedded model, in chunks of 512 tokens like a scheduler's).
 *
 * Where they cross. Drop the block rounding (bytes(n) ≈ n · s, s = L·2·H_kv·d·b bytes per token):
 *
 *   recompute(n) − swap(n) = a·n² + (c − 2s/bw)·n + (k − 2λ)
 *     a = 2·L·H·d / F            (attention: grows as n²)
 *     c = (2·P + 2·L·H·d) / F    (projections: linear in n, like the swap)
 *     k = 2·dim·vocab / F        (one classifier row)
 *
 * Both costs are linear in n until the attention term a·n² matters, which it does once
 * n ≈ P / (L·H·d) (the n where attention FLOPs match projection FLOPs; 6.5e9 / 131072, about
 * 49,000 tokens, for Llama-2-7B). Below that the comparison is per token: recompute c·n
 * against swap 2s/bw·n, i.e. 2·P/F against 2·s/bw: the weights' FLOPs per token at the
 * accelerator's rate against the cache's bytes per token at the link's rate. The fixed terms decide only tiny n: two
 * link latencies 2λ make swapping a few tokens dearer than recomputing them.
 * So with a > 0 the difference is an upward parabola with one positive root when k < 2λ:
 * recompute is cheaper below it and dearer above it. If 2P/F < 2s/bw (a slow link, a fast
 * accelerator, a fat cache: MHA, fp32) the root sits where attention has made up the
 * difference, n* ≈ (2s/bw − c) / a; if 2P/F > 2s/bw it sits where the latency is paid back,
 * n* ≈ (2λ − k) / (c − 2s/bw), short unless the two per-token costs are close. The crossover printed below is found exactly
 * (block rounding included) by checking every n in the range.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_quant.h"
#include "kv_swap.h"

#define SWAP_CHUNK 512 /* prefill chunk of the measured recompute */

/* Prefill FLOPs of n tokens from position 0 with one classifier row (kv_counters_add_step). */
static double prefill_flops(const kv_config *c, const kv_cache_spec *spec, int n)
{
    kv_counters cnt = {0};
    kv_seq s = {0, 0, n, NULL};
    kv_counters_add_step(&cnt, c, spec, &s, 1);
    return cnt.flops_proj + cnt.flops_attn;
}

/* P: weights of the Q, K, V, O and MLP matmuls (kv_counters_add_step's P). */
static double matmul_weights(const kv_config *c)
{
    const double d = kv_config_head_dim(c);
    return (double)c->n_layers * (2.0 * c->dim * c->n_heads * d + 2.0 * c->dim * c->n_kv_heads * d +
                                  3.0 * c->dim * c->hidden_dim);
}

static double swap_seconds(const kv_swap_bench *sb, int n)
{
    const int64_t blocks = (n + sb->block_size - 1) / sb->block_size;
    return 2.0 * kv_link_seconds(&sb->link, blocks * (int64_t)sb->block_bytes);
}

static double gpu_seconds(const kv_swap_bench *sb, int n)
{
    return prefill_flops(&sb->cfg, &sb->spec, n) / sb->gpu_flops;
}

int kv_swap_bench_init(kv_swap_bench *sb, const char *model, const char *dtype, int block_size,
                       double link_gbps, double link_us, double gpu_tflops, kv_err *err)
{
    memset(sb, 0, sizeof *sb);
    const kv_preset *p = kv_config_default_by_name(model, NULL, NULL, NULL) ? kv_preset_find(model)
                                                                            : NULL;
    sb->name = model;
    sb->embedded = p == NULL;
    int st = KV_OK;
    if (sb->embedded) {
        st = kv_config_default_by_name(model, &sb->cfg, NULL, err);
        if (st) return kv_fail(err, KV_ERR_ARG, "no embedded model or preset named '%s'", model);
    } else {
        sb->cfg = p->config;
    }
    if (!dtype) dtype = sb->embedded ? "fp32" : "fp16";
    const int fmt = kv_quant_parse(dtype);
    if (fmt < 0) return kv_fail(err, KV_ERR_ARG, "unknown dtype '%s'", dtype);
    if (kvq_is_fp8(fmt) || kvq_is_kivi(fmt))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_swap does not move %s caches (their "
                       "per-sequence scales or windows are not in the blocks)", dtype);
    sb->spec = kv_cache_spec_default(1, 1 << 20);
    sb->spec.quant.dtype = fmt;
    sb->spec.layout.kind = KV_LAYOUT_PAGED;
    sb->spec.layout.block_size = block_size;
    sb->spec.layout.n_blocks = 1;
    sb->block_size = block_size;
    sb->link.bandwidth = link_gbps * 1e9;
    sb->link.latency = link_us * 1e-6;
    sb->link.throttle = 0;
    sb->gpu_flops = gpu_tflops * 1e12;
    /* the bytes of one block as kv_swap moves it: ask a one-block paged cache of this shape */
    kv_cache c;
    st = kv_cache_create(&c, &sb->cfg, &sb->spec, err);
    if (st) return st;
    sb->block_bytes = kv_cache_block_bytes(&c);
    kv_cache_free(&c);
    return KV_OK;
}

/* Prefill tokens[0..n) into slot 0 from scratch, in chunks; logits of the last token. */
static int prefill(kv_backend *b, const int *tokens, int n, float *logits, kv_err *err)
{
    b->reset(b, 0);
    for (int done = 0; done < n; done += SWAP_CHUNK) {
        const int m = n - done < SWAP_CHUNK ? n - done : SWAP_CHUNK;
        kv_seq s = {0, done, m, tokens + done};
        int st = b->forward(b, &s, 1, done + m == n ? logits : NULL, NULL, err);
        if (st) return st;
    }
    return KV_OK;
}

/* The embedded model's rows: a real prefill, timed (median of repeats), and a real swap out
 * and in through kv_swap, whose link counters must show the bytes the formula says. */
static int measure_rows(const kv_swap_bench *sb, kv_swap_row *rows, int n_rows, int max_n,
                        int repeats, kv_err *err)
{
    kv_model m = {0};
    kv_backend *b = NULL;
    kv_swap sw = {0};
    int st = kv_cli_default_model(&m, sb->name, err);
    kv_cache_spec spec = sb->spec;
    spec.capacity = max_n;
    spec.layout.n_blocks = (max_n + sb->block_size - 1) / sb->block_size;
    if (!st) st = kv_backend_cpu(&b, &m, &spec, err);
    if (!st) st = kv_swap_init(&sw, b->mem, spec.layout.n_blocks, &sb->link, err);
    int *tokens = kv_calloc((size_t)max_n * sizeof(int));           /* [max_n] */
    float *logits = kv_calloc((size_t)m.config.vocab_size * sizeof(float)); /* [vocab] */
    double *t = kv_calloc((size_t)repeats * sizeof(double));         /* [repeats] */
    if (!st && (!tokens || !logits || !t)) st = kv_fail(err, KV_ERR_NOMEM, "bench swap: buffers");
    if (!st) kv_demo_prompt(tokens, max_n, m.config.vocab_size);
    double total = 0, done = 0; /* progress in FLOPs, the work that dominates */
    for (int i = 0; i < n_rows; i++)
        if (rows[i].n <= max_n) total += rows[i].flops * (repeats + 1);
    kv_progress prog;
    kv_progress_start(&prog, "bench swap: prefills");
    for (int i = 0; i < n_rows && !st; i++) {
        kv_swap_row *r = &rows[i];
        if (r->n > max_n) continue;
        for (int rep = -1; rep < repeats && !st; rep++) { /* rep -1: warm-up */
            const double t0 = kv_now();
            st = prefill(b, tokens, r->n, logits, err);
            if (rep >= 0) t[rep] = kv_now() - t0;
            done += r->flops;
            kv_progress_update(&prog, (long)(1000.0 * done / total), 1000);
        }
        if (st) break;
        r->cpu_s = kv_median(t, repeats);
        kv_swapped s = {0};
        const kv_link_stats before = sw.stats;
        st = kv_swap_out(&sw, b->mem, 0, &s, err);
        if (!st) st = kv_swap_in(&sw, b->mem, 0, &s, err);
        kv_swapped_drop(&sw, b->mem, &s);
        if (st) break;
        r->moved = sw.stats.bytes[KV_LINK_OUT] - before.bytes[KV_LINK_OUT];
        if (r->moved != r->bytes || sw.stats.bytes[KV_LINK_IN] - before.bytes[KV_LINK_IN] != r->bytes)
            st = -kv_fail(err, KV_ERR_ARG, "bench swap: n %d: kv_swap moved %lld bytes out, "
                         "%lld in; the formula says %lld", r->n, (long long)r->moved,
                         (long long)(sw.stats.bytes[KV_LINK_IN] - before.bytes[KV_LINK_IN]),
                         (long long)r->bytes);
        b->reset(b, 0);
    }
    kv_progress_end(&prog);
    kv_free(tokens);
    kv_free(logits);
    kv_free(t);
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    kv_model_free(&m);
    return st;
}

/* First n in [lo, hi] from which recompute stays dearer than the swap (every n checked);
 * 0 when recompute is never dearer, -1 when it is dearer at lo already and stays so. */
static int exact_crossover(const kv_swap_bench *sb, int lo, int hi)
{
    int from = 0;
    for (int n = hi; n >= lo; n--) {
        if (gpu_seconds(sb, n) > swap_seconds(sb, n)) from = n;
        else break;
    }
    return from == lo ? -1 : from;
}

int kv_swap_bench_run(FILE *f, int csv, const kv_swap_bench *sb, const int *lens, int n_lens,
                      int measure_max, int repeats, kv_err *err)
{
    kv_swap_row *rows = kv_calloc((size_t)n_lens * sizeof *rows); /* [n_lens] */
    if (!rows) return kv_fail(err, KV_ERR_NOMEM, "bench swap: rows");
    int max_n = 0;
    for (int i = 0; i < n_lens; i++) {
        kv_swap_row *r = &rows[i];
        r->n = lens[i];
        r->blocks = (lens[i] + sb->block_size - 1) / sb->block_size;
        r->bytes = r->blocks * (int64_t)sb->block_bytes;
        r->swap_s = swap_seconds(sb, lens[i]);
        r->flops = prefill_flops(&sb->cfg, &sb->spec, lens[i]);
        r->gpu_s = r->flops / sb->gpu_flops;
        r->cpu_s = -1;
        if (sb->embedded && lens[i] <= measure_max && lens[i] > max_n) max_n = lens[i];
    }
    int st = max_n ? measure_rows(sb, rows, n_lens, max_n, repeats, err) : KV_OK;
    if (st) {
        kv_free(rows);
        return st;
    }
    const kv_config *c = &sb->cfg;
    const int d = kv_config_head_dim(c);
    char u[32];
    if (csv) {
        kv_csv_printf(f, "model,dtype,block_size,n,blocks,bytes_each_way,swap_s,flops,cpu_s,gpu_s,"
                         "cpu_over_swap,gpu_over_swap\n");
        for (int i = 0; i < n_lens; i++) {
            const kv_swap_row *r = &rows[i];
            kv_csv_printf(f, "%s,%s,%d,%d,%lld,%lld,%.6e,%.6e,", sb->name,
                          kv_dtype_name(sb->spec.quant.dtype), sb->block_size, r->n,
                          (long long)r->blocks, (long long)r->bytes, r->swap_s, r->flops);
            if (r->cpu_s >= 0) kv_csv_printf(f, "%.6e,", r->cpu_s);
            else kv_csv_printf(f, ",");
            kv_csv_printf(f, "%.6e,", r->gpu_s);
            if (r->cpu_s >= 0) kv_csv_printf(f, "%.4f,", r->cpu_s / r->swap_s);
            else kv_csv_printf(f, ",");
            kv_csv_printf(f, "%.4f\n", r->gpu_s / r->swap_s);
        }
        kv_free(rows);
        return KV_OK;
    }
    char desc[256];
    kv_config_describe(c, desc, sizeof desc);
    fprintf(f, "swap vs recompute: %s '%s' (%s)\n", sb->embedded ? "embedded model" : "preset",
            sb->name, desc);
    fprintf(f, "KV %s, blocks of %d tokens = %s each (kv_cache_block_bytes: B*L*2*H_kv*d*b, "
            "b = %g)\n", kv_dtype_name(sb->spec.quant.dtype), sb->block_size,
            kv_fmt_bytes((double)sb->block_bytes, u, sizeof u),
            kv_cache_spec_bytes_per_element(&sb->spec, c->n_layers, d));
    fprintf(f, "link (kv_link): %.3g GB/s each way, %.3g us per batched copy; swap = out + in = "
            "2*(latency + bytes/bandwidth)\n", sb->link.bandwidth * 1e-9, sb->link.latency * 1e6);
    fprintf(f, "recompute = prefill of n tokens: FLOPs = 2*P*n + 2*dim*vocab + 4*L*H*d*n(n+1)/2"
            " (P = %.4g matmul weights)\n", matmul_weights(c));
    fprintf(f, "  accelerator: modelled, FLOPs / %.4g TFLOP/s sustained\n", sb->gpu_flops * 1e-12);
    if (max_n)
        fprintf(f, "  CPU: measured here, median of %d prefills (chunks of %d tokens, %d OpenMP "
                "threads), n <= %d;\n  every measured row also swapped out and in through "
                "kv_swap: bytes moved = the formula's\n", repeats, SWAP_CHUNK,
                omp_get_max_threads(), max_n);
    else if (!sb->embedded)
        fprintf(f, "  CPU: not measured (a preset is a shape without weights)\n");
    fprintf(f, "\n%7s %7s %11s %12s %12s %12s %9s %12s %9s\n", "n", "blocks", "bytes/way",
            "swap out+in", "FLOPs", "CPU prefill", "CPU/swap", "accel prefl", "acc/swap");
    for (int i = 0; i < n_lens; i++) {
        const kv_swap_row *r = &rows[i];
        fprintf(f, "%7d %7lld %11s %12.3e %12.4g ", r->n, (long long)r->blocks,
                kv_fmt_bytes((double)r->bytes, u, sizeof u), r->swap_s, r->flops);
        if (r->cpu_s >= 0) fprintf(f, "%12.3e %8.2fx ", r->cpu_s, r->cpu_s / r->swap_s);
        else fprintf(f, "%12s %9s ", "-", "-");
        fprintf(f, "%12.3e %8.3fx\n", r->gpu_s, r->gpu_s / r->swap_s);
    }
    /* crossovers: ratio > 1 means recompute is dearer than swapping. Per token (the file
     * comment): the link costs 2s/bw both ways, the projections 2P/F, attention 4·L·H·d·n/F
     * more at length n. */
    const int lo = lens[0], hi = lens[n_lens - 1];
    const int x = exact_crossover(sb, lo, hi);
    const double link_tok = 2.0 * sb->block_bytes / sb->block_size / sb->link.bandwidth;
    const double a = 2.0 * c->n_layers * c->n_heads * d / sb->gpu_flops;
    const double proj_tok = 2.0 * matmul_weights(c) / sb->gpu_flops;
    fprintf(f, "\nper token: swap out + in %.3g s (2 * %s / bandwidth); recompute %.3g s of "
            "projections (2P/F)\n  + %.3g s * (n+1) of attention in a prefill of n "
            "(2*L*H*d*(n+1)/F); fixed: 2 link latencies = %.3g s\n", link_tok,
            kv_fmt_bytes((double)sb->block_bytes / sb->block_size, u, sizeof u), proj_tok,
            a, 2 * sb->link.latency);
    fprintf(f, "crossover, accelerator (every n in [%d, %d] checked):\n  ", lo, hi);
    if (x > 0)
        fprintf(f, "recompute dearer than swap for every n >= %d\n  (below it: %s)\n", x,
                link_tok > proj_tok
                    ? "the link's higher cost per token, until attention's n^2 makes it up"
                    : "a swap's fixed latency, or a partly filled last block that still "
                      "crosses whole");
    else if (x < 0)
        fprintf(f, "recompute dearer at every n in the range: the accelerator recomputes a "
                "token\n  slower than the link moves its KV both ways\n");
    else if (link_tok > proj_tok + a)
        fprintf(f, "none: recompute stays cheaper up to n = %d: the link moves a token's KV "
                "slower than\n  the accelerator recomputes it, until attention's n^2 term makes "
                "up the difference near n ~ %.0f\n", hi, (link_tok - proj_tok - a) / a);
    else
        fprintf(f, "none: recompute stays cheaper up to n = %d: the link's fixed latency is not "
                "paid back in this range\n", hi);
    if (max_n) {
        int first = -1, all = 1;
        for (int i = 0; i < n_lens; i++) {
            if (rows[i].cpu_s < 0) continue;
            if (rows[i].cpu_s > rows[i].swap_s) {
                if (first < 0) first = i;
            } else {
                first = -1;
                all = 0;
            }
        }
        fprintf(f, "crossover, CPU (measured rows):\n  ");
        if (first < 0) fprintf(f, "none: recompute cheaper than the modelled swap at every "
                               "measured n\n");
        else if (all) fprintf(f, "recompute dearer at every measured n (from %d): this CPU "
                              "prefills\n  slower than the modelled link moves the cache\n",
                              rows[first].n);
        else fprintf(f, "recompute dearer from n = %d on (cheaper at n = %d)\n", rows[first].n,
                     rows[first - 1].n);
    }
    kv_free(rows);
    return KV_OK;
}

static const char *const swap_dtypes[] = {"fp32", "fp16", "bf16", "int8", NULL};

int cmd_bench_swap(int argc, char **argv)
{
    const char *cmd = "kvlab bench swap";
    const char *model = "tiny", *dtype = NULL;
    int n_min = 16, n_max = 16384, measure_max = 4096, repeats = 3, B = 16, csv = 0;
    double gbps = KV_LINK_DEFAULT_BANDWIDTH * 1e-9, us = KV_LINK_DEFAULT_LATENCY * 1e6;
    double tflops = KV_SWAP_DEFAULT_TFLOPS;
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "NAME", "embedded model (tiny, tiny-gqa, small; measured on the CPU too) or a kvlab calc preset (llama-2-7b, ...; modelled only). Default tiny", 0},
        {"--dtype", KV_OPT_CHOICE, &dtype, 0, 0, swap_dtypes, "T", "cache format (default fp32 for embedded models, fp16 for presets)", 0},
        {"--block-size", KV_OPT_INT, &B, 1, 4096, NULL, "B", "tokens per block (default 16)", 0},
        {"--min", KV_OPT_INT, &n_min, 1, 1 << 20, NULL, "N", "shortest sequence (default 16); lengths double up to --max", 0},
        {"--max", KV_OPT_INT, &n_max, 1, 1 << 20, NULL, "N", "longest sequence (default 16384)", 0},
        {"--measure-max", KV_OPT_INT, &measure_max, 0, 1 << 20, NULL, "N", "embedded model: measure CPU prefills up to N tokens (default 4096; 0 = none)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "timed prefills per length, after one warm-up (default 3)", 0},
        {"--link-gbps", KV_OPT_FLOAT, &gbps, 1e-3, 1e6, NULL, "G", "link bandwidth each way, GB/s (default 25: PCIe 4.0 x16)", 0},
        {"--link-us", KV_OPT_FLOAT, &us, 0, 1e6, NULL, "U", "link latency per batched copy, us (default 10)", 0},
        {"--gpu-tflops", KV_OPT_FLOAT, &tflops, 1e-3, 1e6, NULL, "T", "modelled accelerator's sustained prefill rate, TFLOP/s (default 300)", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Swap vs recompute by sequence length n (16, 32, ... doubling): the bytes a\n"
                          "swap moves each way (ceil(n/B) blocks of kv_cache_block_bytes), its modelled\n"
                          "time over the link (out + in), the FLOPs of recomputing the cache (a prefill\n"
                          "of n tokens), their time on a modelled accelerator (default 300 TFLOP/s\n"
                          "sustained: about 30% of an H100 SXM's 989 dense bf16 peak, or an A100 near\n"
                          "its 312 peak) and, for the embedded models, measured on this CPU (median of\n"
                          "repeats), then the length where recomputing becomes dearer than swapping.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (n_min > n_max) return kv_args_bad(cmd, "--min", "%d is above --max %d", n_min, n_max);
    kv_err err = {{0}};
    kv_swap_bench sb;
    int st = kv_swap_bench_init(&sb, model, dtype, B, gbps, us, tflops, &err);
    if (st == KV_ERR_ARG && !kv_preset_find(model))
        return kv_args_bad(cmd, "--model", "no embedded model or preset named '%s' (embedded: "
                           "tiny, tiny-gqa, small; presets: kvlab calc --list)", model);
    if (st) return kv_cli_fail(cmd, "setup", st, &err);
    int lens[32], n = 0;
    for (long x = n_min; x <= n_max && n < 32; x *= 2) lens[n++] = (int)x;
    st = kv_swap_bench_run(stdout, csv, &sb, lens, n, measure_max, repeats, &err);
    if (st) return kv_cli_fail(cmd, "run", st, &err);
    return KV_EXIT_OK;
}
