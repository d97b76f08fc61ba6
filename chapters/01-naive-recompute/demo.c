/*
 * Chapter 01 demo: generation without a KV cache.
 *
 * Before choosing each new token the model runs the whole prefix again, from position 0.
 * Step i runs n_prompt + i tokens, so its projection work grows like the position p and its
 * attention work like p² (every token attends to all before it). Summed over n generated
 * tokens: projections O(n²), attention O(n³). The table shows it measured, step by step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_config.h"
#include "kv_generate.h"
#include "measure.h"

#define CH01_MODEL "tiny"
#define CH01_PROMPT 16
#define CH01_STEPS 240
#define CH01_STEPS_EMULATED 32 /* --device cuda in the emulation build, and tour --quick */
#define CH01_REPEATS 3
#define CH01_EVERY 16 /* table rows: every 16th step, and the last */

/* What the naive loop recomputes: the key of one early position, read from the cache after
 * step CH01_KEY_STEP and again after the next step, each of which ran the whole prefix from
 * position 0. They are the same floats, bit for bit (on the CPU backend, whose cache a demo
 * can read): the work chapter 02's cache keeps instead of redoing. */
#define CH01_KEY_STEP 7
#define CH01_KEY_POS 5
static int same_key_twice(FILE *f, const kv_model *m, const int *prompt, kv_err *err)
{
    const kv_config *c = &m->config;
    const int d = kv_config_head_dim(c), layer = c->n_layers - 1;
    float key[2][512]; /* [2][d], d <= 512 */
    if (d > 512) return KV_OK;
    kv_cache_spec spec = kv_cache_spec_default(1, CH01_PROMPT + CH01_KEY_STEP + 1);
    int out[CH01_KEY_STEP + 1];
    for (int run = 0; run < 2; run++) {
        kv_backend *cpu = NULL;
        int st = kv_backend_cpu(&cpu, m, &spec, err);
        if (st) return st;
        kv_gen_opts o = {.mode = KV_MODE_NAIVE, .n_steps = CH01_KEY_STEP + run};
        st = kv_generate(cpu, prompt, CH01_PROMPT, &o, out, NULL, err);
        if (!st)
            memcpy(key[run], kv_cache_k(kv_backend_cpu_cache(cpu), layer, 0, 0) +
                                 (size_t)CH01_KEY_POS * d, (size_t)d * sizeof(float));
        kv_backend_destroy(cpu);
        if (st) return st;
    }
    const int same = memcmp(key[0], key[1], (size_t)d * sizeof(float)) == 0;
    fprintf(f, "\nthe key of position %d (layer %d, KV head 0, %d floats), computed from scratch by "
               "step %d and again by step %d:\n  bit-identical: %s (the rows a naive step "
               "recomputes are the ones the step before computed)\n",
            CH01_KEY_POS, layer, d, CH01_KEY_STEP - 1, CH01_KEY_STEP, same ? "yes" : "no");
    return same ? KV_OK : -1; /* a check of the tour: it fails if this does not hold */
}

int kv_demo_ch01(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    kv_model m = {0};
    kv_backend *b = NULL;
    kv_run_log log = {0};
    int st = kv_cli_default_model(&m, CH01_MODEL, err);
    if (st) return st;
    const kv_config *c = &m.config;
    kv_cache_spec spec = kv_cache_spec_default(1, CH01_PROMPT + CH01_STEPS);
    if ((st = kv_cli_backend(&b, ctx->device, &m, &spec, err))) goto done;
    /* the emulated GPU runs every thread as a CPU fiber: it proves the kernels, not speed,
     * so it gets a short run, as does tour --quick */
    const int small = ctx->quick || strcmp(b->name, "cuda-emulation") == 0;
    const int steps = small ? CH01_STEPS_EMULATED : CH01_STEPS, repeats = small ? 1 : CH01_REPEATS;
    if ((st = kv_run_log_init(&log, KV_MODE_NAIVE, steps, repeats, err))) goto done;

    int prompt[CH01_PROMPT];
    kv_demo_prompt(prompt, CH01_PROMPT, c->vocab_size);
    kv_progress prog;
    kv_progress_start(&prog, "chapter 01: naive generation");
    for (int r = 0; r < repeats; r++)
        if ((st = kv_run_once(&log, b, prompt, CH01_PROMPT, &prog, (long)r * steps,
                              (long)repeats * steps, err)))
            goto done;
    kv_progress_end(&prog);

    char desc[256];
    kv_config_describe(c, desc, sizeof desc);
    if (ctx->csv) {
        kv_csv_printf(f, "chapter,mode,step,position,tokens_run,seconds,flops_proj,flops_attn,"
                         "kv_bytes_written,kv_bytes_read\n");
        for (int i = 0; i < steps; i++) {
            const kv_counters *w = &log.work[i];
            kv_csv_printf(f, "1,naive,%d,%d,%lld,%.9g,%.0f,%.0f,%.0f,%.0f\n", i, CH01_PROMPT + i,
                          (long long)w->tokens, kv_run_step_median(&log, i), w->flops_proj,
                          w->flops_attn, w->kv_bytes_written, w->kv_bytes_read);
        }
        goto done;
    }

    fprintf(f, "model '%s' (%s), random weights, greedy, device %s\n", CH01_MODEL, desc, b->name);
    fprintf(f, "prompt %d tokens, %d generated, naive recompute: before each new token the cache is\n"
               "cleared and the whole prefix runs again. Times are medians of %d runs.\n\n",
            CH01_PROMPT, steps, repeats);
    fprintf(f, "cost of the step that chooses the token after position p (it runs p+1 tokens):\n");
    fprintf(f, "%6s %6s %10s %11s %11s %11s %11s\n", "step", "p", "time (s)", "FLOPs proj",
            "FLOPs attn", "KV written", "KV read");
    for (int i = 0; i < steps; i++) {
        if (i % CH01_EVERY && i != steps - 1) continue;
        const kv_counters *w = &log.work[i];
        fprintf(f, "%6d %6d %10.3e %11.3e %11.3e %11.3e %11.3e\n", i, CH01_PROMPT + i - 1,
                kv_run_step_median(&log, i), w->flops_proj, w->flops_attn, w->kv_bytes_written,
                w->kv_bytes_read);
    }
    /* growth check between two steps whose prefixes differ by a factor of 2 */
    const int i1 = steps / 2 - CH01_PROMPT / 2 - 1, i2 = steps - 1;
    const double p1 = CH01_PROMPT + i1, p2 = CH01_PROMPT + i2;
    const kv_counters *w1 = &log.work[i1], *w2 = &log.work[i2];
    const double t1 = kv_run_step_median(&log, i1), t2 = kv_run_step_median(&log, i2);
    fprintf(f, "\nstep %d -> step %d, prefix %.0f -> %.0f tokens (x%.2f): FLOPs proj x%.2f (linear in p),\n"
               "  FLOPs attn x%.2f (quadratic), all FLOPs x%.2f; measured step time x%.2f\n",
            i1, i2, p1, p2, p2 / p1, w2->flops_proj / w1->flops_proj, w2->flops_attn / w1->flops_attn,
            (w2->flops_proj + w2->flops_attn) / (w1->flops_proj + w1->flops_attn), t2 / t1);
    fprintf(f, "\ntotal over %d generated tokens (median run): %.4f s, %lld tokens run through the model,\n"
               "  FLOPs proj %.3e (sum of a linear term: O(n^2)), FLOPs attn %.3e (sum of a quadratic term: O(n^3)),\n"
               "  KV bytes written %.3e, read %.3e\n",
            steps, kv_run_total_median(&log), (long long)log.sum.tokens, log.sum.flops_proj,
            log.sum.flops_attn, log.sum.kv_bytes_written, log.sum.kv_bytes_read);
    fprintf(f, "  (FLOPs and KV bytes are counted from the shapes, kv_counters_add_step; only time is\n"
               "   measured. FLOPs: 2 per multiply-add; proj = Q,K,V,O, MLP and classifier, attn = 4*L*H*d per\n"
               "   (query, key) pair; KV bytes = L*2*H_kv*d*4 per token written or per pair read)\n");
    st = same_key_twice(f, &m, prompt, err);
done:
    kv_run_log_free(&log);
    if (b) kv_backend_destroy(b);
    kv_model_free(&m);
    return st;
}
