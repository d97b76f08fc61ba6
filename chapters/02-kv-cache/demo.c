/*
 * Chapter 02 demo: the same generation as chapter 01, with a KV cache.
 *
 * The prompt is prefilled once; after that each step runs one token, writes its K and V into
 * the cache and attends over what is already there. Per step: projections O(1), attention
 * O(p). Both runs are measured here, on the same model, prompt and machine, interleaved, so
 * the speed-up is a same-run ratio. Then: identical tokens, and what the cache costs in memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli.h"
#include "kv_config.h"
#include "measure.h"

#define CH02_MODEL "tiny"
#define CH02_PROMPT 16
#define CH02_STEPS 240
#define CH02_STEPS_EMULATED 32 /* --device cuda in the emulation build, and tour --quick */
#define CH02_REPEATS 3
#define CH02_EVERY 16

/* Bytes the heap grew by while a cache was built: what the allocator really handed out
 * (K and V storage, the length array, alignment padding), not what a formula says. */
static double heap_bytes(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    return (double)mi.uordblks + (double)mi.hblkhd;
#else
    return -1.0;
#endif
}

static void print_memory(FILE *f, const kv_config *c, int used, int capacity, kv_err *err)
{
    const double L = c->n_layers, Hkv = c->n_kv_heads, d = kv_config_head_dim(c), b = 4.0;
    const double per_token = L * 2 * Hkv * d * b;
    char u[32];
    fprintf(f, "\ncache memory, bytes = L * 2 * N * H_kv * d * b   (fp32 cache: b = 4)\n");
    fprintf(f, "  per token        %.0f * 2 * %.0f * %.0f * 4 = %.0f bytes (%s)\n", L, Hkv, d,
            per_token, kv_fmt_bytes(per_token, u, sizeof u));
    fprintf(f, "  N = %4d used    %.0f bytes (%s)  <- the tokens this run cached\n", used,
            per_token * used, kv_fmt_bytes(per_token * used, u, sizeof u));
    fprintf(f, "  N = %4d capacity %.0f bytes (%s)  <- what a contiguous cache reserves up front\n",
            capacity, per_token * capacity, kv_fmt_bytes(per_token * capacity, u, sizeof u));
    kv_cache cache;
    kv_cache_spec spec = kv_cache_spec_default(1, capacity);
    double before = heap_bytes();
    if (kv_cache_create(&cache, c, &spec, err) != KV_OK) {
        fprintf(f, "  (could not build a cache to measure: %s)\n", err->msg);
        return;
    }
    double after = heap_bytes();
    fprintf(f, "  kv_cache_bytes() of kv_cache_create(capacity %d): %zu bytes\n", capacity,
            kv_cache_bytes(&cache));
    if (before >= 0)
        fprintf(f, "  heap growth while kv_cache_create() ran (glibc mallinfo2): %.0f bytes"
                   " (+%.0f: length array, alignment, allocator headers, page rounding)\n",
                after - before, after - before - (double)kv_cache_bytes(&cache));
    kv_cache_free(&cache);
}

int kv_demo_ch02(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    kv_model m = {0};
    kv_backend *b = NULL;
    kv_run_log naive = {0}, cached = {0};
    int st = kv_cli_default_model(&m, CH02_MODEL, err);
    if (st) return st;
    const kv_config *c = &m.config;
    const int capacity = c->seq_len; /* sized for the longest context, as a server would */
    kv_cache_spec spec = kv_cache_spec_default(1, capacity);
    if ((st = kv_cli_backend(&b, ctx->device, &m, &spec, err))) goto done;
    /* the emulated GPU runs every thread as a CPU fiber: it proves the kernels, not speed,
     * so it gets a short run, as does tour --quick */
    const int small = ctx->quick || strcmp(b->name, "cuda-emulation") == 0;
    const int steps = small ? CH02_STEPS_EMULATED : CH02_STEPS, repeats = small ? 1 : CH02_REPEATS;
    if ((st = kv_run_log_init(&naive, KV_MODE_NAIVE, steps, repeats, err))) goto done;
    if ((st = kv_run_log_init(&cached, KV_MODE_CACHED, steps, repeats, err))) goto done;

    int prompt[CH02_PROMPT];
    kv_demo_prompt(prompt, CH02_PROMPT, c->vocab_size);
    kv_progress prog;
    kv_progress_start(&prog, "chapter 02: naive and cached generation");
    const long total = 2L * repeats * steps;
    for (int r = 0; r < repeats; r++) { /* interleaved: both see the same machine state */
        if ((st = kv_run_once(&naive, b, prompt, CH02_PROMPT, &prog, 2L * r * steps, total, err)))
            goto done;
        if ((st = kv_run_once(&cached, b, prompt, CH02_PROMPT, &prog, (2L * r + 1) * steps,
                              total, err)))
            goto done;
    }
    kv_progress_end(&prog);

    int first_diff = -1;
    for (int i = 0; i < steps && first_diff < 0; i++)
        if (naive.tokens[i] != cached.tokens[i]) first_diff = i;

    if (ctx->csv) {
        kv_csv_printf(f, "chapter,mode,step,position,tokens_run,seconds,flops_proj,flops_attn,"
                         "kv_bytes_written,kv_bytes_read\n");
        const kv_run_log *runs[2] = {&naive, &cached};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < steps; i++) {
                const kv_counters *w = &runs[k]->work[i];
                kv_csv_printf(f, "2,%s,%d,%d,%lld,%.9g,%.0f,%.0f,%.0f,%.0f\n",
                              k ? "cached" : "naive", i, CH02_PROMPT + i, (long long)w->tokens,
                              kv_run_step_median(runs[k], i), w->flops_proj, w->flops_attn,
                              w->kv_bytes_written, w->kv_bytes_read);
            }
    } else {
        char desc[256];
        kv_config_describe(c, desc, sizeof desc);
        fprintf(f, "model '%s' (%s), random weights, greedy, device %s\n", CH02_MODEL, desc, b->name);
        fprintf(f, "prompt %d tokens, %d generated, naive and cached runs interleaved, %d of each;\n"
                   "times are medians. Step 0 of the cached run is the prefill of the prompt.\n\n",
                CH02_PROMPT, steps, repeats);
        fprintf(f, "%6s %6s | %10s | %10s %8s | %11s %11s %11s %11s\n", "step", "p", "naive (s)",
                "cached (s)", "speed-up", "FLOPs proj", "FLOPs attn", "KV written", "KV read");
        for (int i = 0; i < steps; i++) {
            if (i % CH02_EVERY && i != steps - 1) continue;
            const kv_counters *w = &cached.work[i];
            double tn = kv_run_step_median(&naive, i), tc = kv_run_step_median(&cached, i);
            fprintf(f, "%6d %6d | %10.3e | %10.3e %7.1fx | %11.3e %11.3e %11.3e %11.3e\n", i,
                    CH02_PROMPT + i - 1, tn, tc, tn / tc, w->flops_proj, w->flops_attn,
                    w->kv_bytes_written, w->kv_bytes_read);
        }
        fprintf(f, "(columns after the speed-up: the cached step's work; chapter 01 has the naive one's)\n");
        const double tn = kv_run_total_median(&naive), tc = kv_run_total_median(&cached);
        fprintf(f, "\n%-7s %10s %12s %12s %12s %12s %12s\n", "total", "time (s)", "tokens run",
                "FLOPs proj", "FLOPs attn", "KV written", "KV read");
        const kv_run_log *runs[2] = {&naive, &cached};
        for (int k = 0; k < 2; k++) {
            const kv_counters *s = &runs[k]->sum;
            fprintf(f, "%-7s %10.4f %12lld %12.3e %12.3e %12.3e %12.3e\n", k ? "cached" : "naive",
                    k ? tc : tn, (long long)s->tokens, s->flops_proj, s->flops_attn,
                    s->kv_bytes_written, s->kv_bytes_read);
        }
        fprintf(f, "speed-up of the whole generation, measured in this run: %.1fx"
                   " (FLOPs ratio %.1fx)\n", tn / tc,
                (naive.sum.flops_proj + naive.sum.flops_attn) /
                    (cached.sum.flops_proj + cached.sum.flops_attn));
        if (first_diff < 0)
            fprintf(f, "tokens: naive and cached chose the same %d tokens: identical\n", steps);
        /* the last token chosen is never fed back: the cache holds prompt + steps - 1 rows */
        print_memory(f, c, CH02_PROMPT + steps - 1, capacity, err);
        fprintf(f, "\nthe bill at real sizes (fp16 cache, one sequence; kvlab calc explains a row):\n\n");
        kv_calc_table(f, "fp16", 0, 1);
    }
    if (first_diff >= 0 || naive.repeats_differ || cached.repeats_differ) {
        st = kv_fail(err, -1, "the runs disagree: %s", first_diff >= 0 ?
                     "naive and cached chose different tokens" : "a repeat chose different tokens");
        if (first_diff >= 0)
            fprintf(stderr, "first difference at step %d: naive %d, cached %d\n", first_diff,
                    naive.tokens[first_diff], cached.tokens[first_diff]);
    }
done:
    kv_run_log_free(&naive);
    kv_run_log_free(&cached);
    if (b) kv_backend_destroy(b);
    kv_model_free(&m);
    return st;
}
