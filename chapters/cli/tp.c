/*
 * kvlab tp: tensor-parallel heads (chapter 10) on an embedded model, p ranks as threads.
 *
 * The group (reference_cpu/engine/kv_tp.h) splits the heads and the MLP over --ranks P; each rank
 * caches only its KV heads and the ranks meet in an all-reduce twice per layer. The command
 * generates greedily with p = 1 (plain kv_forward) and with P ranks, and prints what each
 * rank holds, the all-reduce traffic, whether the tokens are the same (measured), and the
 * median time per decoded token of both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model_load.h"
#include "kv_generate.h"
#include "kv_quant.h"
#include "kv_tp.h"
#include "measure.h"

/* Seconds of each generated token, from kv_generate's step callback. */
typedef struct {
    double *sec; /* [n] */
    int n;
} step_times;

static void on_step(void *user, int step, int token, const kv_counters *w, double seconds)
{
    step_times *t = user;
    (void)token, (void)w;
    if (step < t->n) t->sec[step] = seconds;
}

/* Greedy generation on @p b, @p repeats times; median decode-step time (steps 1..n-1: step 0
 * also prefills the prompt) into *per_token. */
static int timed_run(kv_backend *b, const int *prompt, int n_prompt, int n_tokens, int repeats,
                     int *out, double *per_token, kv_err *err)
{
    double *sec = malloc(sizeof(double) * (size_t)n_tokens);
    double *med = malloc(sizeof(double) * (size_t)repeats);
    if (!sec || !med) {
        free(sec);
        free(med);
        return kv_fail(err, KV_ERR_NOMEM, "tp: out of memory");
    }
    int rc = KV_OK;
    for (int r = 0; r < repeats && !rc; r++) {
        step_times t = {sec, n_tokens};
        const kv_gen_opts o = {KV_MODE_CACHED, 0, n_tokens, NULL, on_step, &t, NULL};
        b->reset(b, 0);
        rc = kv_generate(b, prompt, n_prompt, &o, out, NULL, err);
        if (!rc) med[r] = n_tokens > 1 ? kv_median(sec + 1, n_tokens - 1) : sec[0];
    }
    if (!rc) *per_token = kv_median(med, repeats);
    free(sec);
    free(med);
    return rc;
}

/* "a-b", or "a" for a run of one */
static const char *span(char *buf, size_t n, int first, int count)
{
    if (count == 1) snprintf(buf, n, "%d", first);
    else snprintf(buf, n, "%d-%d", first, first + count - 1);
    return buf;
}

static int tp_run(const kv_model *m, const char *name, int p, const char *cache, int n_prompt,
                  int n_tokens, int repeats, int csv, kv_err *err)
{
    const kv_config *c = &m->config;
    const int L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads, d = kv_config_head_dim(c);
    kv_cache_spec spec = kv_cache_spec_default(1, n_prompt + n_tokens);
    spec.quant.dtype = kv_quant_parse(cache);
    int *prompt = malloc(sizeof(int) * (size_t)n_prompt);
    int *want = malloc(sizeof(int) * (size_t)n_tokens), *got = malloc(sizeof(int) * (size_t)n_tokens);
    kv_backend *one = NULL, *tpb = NULL;
    int rc = KV_OK;
    if (!prompt || !want || !got) {
        rc = kv_fail(err, KV_ERR_NOMEM, "tp: out of memory");
        goto done;
    }
    kv_demo_prompt(prompt, n_prompt, c->vocab_size);
    rc = kv_backend_cpu(&one, m, &spec, err);
    if (!rc) rc = kv_tp_backend(&tpb, m, p, &spec, err);
    if (rc) goto done;
    kv_tp *g = kv_tp_of_backend(tpb);
    const size_t rank_bytes = kv_cache_bytes(kv_tp_cache(g, 0));
    if (csv) goto run; /* the rows after the measurement, one per run */

    printf("tensor-parallel heads: %s (dim %d, hidden %d, L %d, H %d, H_kv %d, d %d), cache %s,\n"
           "prompt %d tokens, %d generated greedily; p = %d ranks as threads\n\n",
           name, c->dim, c->hidden_dim, L, H, Hkv, d, cache, n_prompt, n_tokens, p);
    if (p > Hkv)
        printf("p > H_kv: each rank's %d query head%s one KV head, which the rank computes and "
               "caches\nitself; every KV head is replicated on p / H_kv = %d ranks.\n\n",
               H / p, H / p == 1 ? " reads" : "s read", p / Hkv);
    printf("%4s  %-9s %-9s %-13s %14s\n", "rank", "q heads", "KV heads", "hidden units",
           "KV cache");
    for (int r = 0; r < p; r++) {
        const kv_shard *sh = kv_tp_shard(g, r);
        char qh[24], kh[24], hu[32], b[32];
        printf("%4d  %-9s %-9s %-13s %14s\n", r, span(qh, sizeof qh, sh->q_head0, sh->n_q_heads),
               span(kh, sizeof kh, sh->kv_head0, sh->n_kv_heads),
               span(hu, sizeof hu, sh->hidden0, sh->n_hidden),
               kv_fmt_bytes((double)kv_cache_bytes(kv_tp_cache(g, r)), b, sizeof b));
    }
    char b1[32], b2[32];
    printf("\nper-rank KV cache: %zu bytes = %s (p = 1: %s); the same figure as\n"
           "  kvlab calc --config %d,%d,%d,%d,%d,%d,%d --dtype %s --seq %d --tp %d\n",
           rank_bytes, kv_fmt_bytes((double)rank_bytes, b1, sizeof b1),
           kv_fmt_bytes((double)kv_cache_bytes(kv_backend_cpu_cache(one)), b2, sizeof b2),
           c->dim, c->hidden_dim, L, H, Hkv, c->vocab_size, c->seq_len, cache,
           n_prompt + n_tokens, p);
run:;
    double t1 = 0, tp = 0;
    rc = timed_run(one, prompt, n_prompt, n_tokens, repeats, want, &t1, err);
    if (rc) goto done;
    const kv_tp_stats s0 = *kv_tp_get_stats(g);
    rc = timed_run(tpb, prompt, n_prompt, n_tokens, 1, got, &tp, err); /* counted run */
    if (rc) goto done;
    const kv_tp_stats s1 = *kv_tp_get_stats(g);
    const int same = !memcmp(want, got, sizeof(int) * (size_t)n_tokens);
    if (repeats > 1) rc = timed_run(tpb, prompt, n_prompt, n_tokens, repeats, got, &tp, err);
    if (rc) goto done;
    const int64_t n_ar = s1.all_reduces - s0.all_reduces, steps = s1.steps - s0.steps;
    const double floats = s1.reduced_floats - s0.reduced_floats;
    const double moved = s1.rank_bytes[0] - s0.rank_bytes[0];
    if (csv) {
        kv_csv_printf(stdout, "model,ranks,cache,prompt,tokens,repeats,rank_cache_bytes,"
                      "one_device_cache_bytes,all_reduces,steps,decode_ring_bytes,"
                      "prefill_ring_bytes,rank0_bytes_moved,rank0_bytes_formula,tokens_equal,"
                      "ms_per_token_p1,ms_per_token\n");
        kv_csv_printf(stdout, "%s,%d,%s,%d,%d,%d,%zu,%zu,%lld,%lld,%.0f,%.0f,%.0f,%.0f,%d,%.4f,%.4f\n",
                      name, p, cache, n_prompt, n_tokens, repeats, rank_bytes,
                      kv_cache_bytes(kv_backend_cpu_cache(one)), (long long)n_ar, (long long)steps,
                      kv_tp_ring_bytes(p, c->dim), kv_tp_ring_bytes(p, (double)n_prompt * c->dim),
                      moved, kv_tp_ring_bytes(p, floats), same, t1 * 1e3, tp * 1e3);
        goto done;
    }
    char b3[32], b4[32], b5[32];
    printf("\nall-reduces: %lld in %lld steps = %lld per token (2 per layer: after Wo and after "
           "W2, L = %d)\n", (long long)n_ar, (long long)steps, (long long)(n_ar / steps), L);
    printf("bytes each all-reduce moves per rank (ring: 2 (p-1)/p * T * dim * 4):\n"
           "  decode step (T = 1): %s; prefill (T = %d): %s\n",
           kv_fmt_bytes(kv_tp_ring_bytes(p, c->dim), b3, sizeof b3), n_prompt,
           kv_fmt_bytes(kv_tp_ring_bytes(p, (double)n_prompt * c->dim), b4, sizeof b4));
    printf("  whole run, rank 0, measured: %s read from other ranks (formula over its %lld "
           "all-reduces: %s)\n", kv_fmt_bytes(moved, b5, sizeof b5), (long long)n_ar,
           kv_fmt_bytes(kv_tp_ring_bytes(p, floats), b1, sizeof b1));
    printf("tokens equal to p = 1: %s (measured: %d greedy tokens compared)\n", same ? "yes" : "no",
           n_tokens);
    printf("time per decoded token (median of %d run%s): p = 1 %.3f ms, p = %d %.3f ms\n",
           repeats, repeats == 1 ? "" : "s", t1 * 1e3, p, tp * 1e3);
    printf("(ranks are threads of one process sharing this machine's cores; the all-reduce is "
           "a memory\ncopy here, a link transfer between GPUs)\n");
done:
    kv_backend_destroy(one);
    kv_backend_destroy(tpb);
    free(prompt);
    free(want);
    free(got);
    return rc;
}

int cmd_tp(int argc, char **argv)
{
    const char *cmd = "kvlab tp";
    const char *def = NULL, *model_path = NULL, *cache = "fp32";
    int ranks = 2, prompt = 16, tokens = 32, repeats = 3, csv = 0;
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--ranks", KV_OPT_INT, &ranks, 1, KV_TP_MAX_RANKS, NULL, "P", "tensor-parallel ranks (threads; default 2)", 0},
        {"--default", KV_OPT_CHOICE, &def, 0, 0, kv_cli_defaults, "NAME", "embedded model (default small)", 0},
        {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "or a model file: a llama2.c / kvlab checkpoint, `trained`, a GGUF file or smollm2", 0},
        {"--prompt", KV_OPT_INT, &prompt, 1, 1 << 16, NULL, "N", "prompt tokens (default 16)", 0},
        {"--tokens", KV_OPT_INT, &tokens, 1, 1 << 16, NULL, "N", "tokens to generate (default 32)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "FORMAT", "storage: fp32 (default), fp16, bf16, int8, int8-g32/64/128, fp8-e4m3, fp8-e5m2", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 100, NULL, "R", "timed runs, median reported (default 3)", 0},
        {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE", "the numbers as one CSV row, to FILE in place of the text (- : standard output)", 0},
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Tensor-parallel heads (chapter 10): the model's heads and MLP split over P\n"
                          "ranks (threads), each caching only its KV heads (replicated when P > H_kv),\n"
                          "with an all-reduce after attention and after the MLP of every layer.\n"
                          "Prints per-rank cache bytes, all-reduces per token, bytes moved, whether\n"
                          "the greedy tokens equal p = 1's, and time per token.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    const int fmt = kv_quant_parse(cache);
    if (fmt < 0)
        return kv_args_bad(cmd, "--cache", "unknown format '%s' (fp32, fp16, bf16, int8, "
                           "int8-g32, int8-g64, int8-g128, fp8-e4m3, fp8-e5m2)", cache);
    const kv_cli_model_args ma = {model_path, def, "small", NULL, KV_CLI_TEXT_NONE, 0};
    kv_cli_model mdl;
    int st = kv_cli_model_load(cmd, &ma, &mdl);
    if (st) return st;
    kv_err err = {{0}};
    const kv_config *c = &mdl.m.config;
    if (kvq_is_kivi(fmt) && kv_config_head_dim(c) % KV_KIVI_GROUP)
        st = kv_args_bad(cmd, "--cache", "%s needs the head dim to be a multiple of %d; %s has %d",
                         cache, KV_KIVI_GROUP, mdl.name, kv_config_head_dim(c));
    else if (kv_tp_check(c, ranks, &err))
        st = kv_args_bad(cmd, "--ranks", "%s (%s: H %d, H_kv %d)", err.msg, mdl.name, c->n_heads,
                         c->n_kv_heads);
    if (st) {
        kv_cli_model_close(&mdl);
        return st;
    }
    st = tp_run(&mdl.m, mdl.name, ranks, cache, prompt, tokens, repeats, csv, &err);
    kv_cli_model_close(&mdl);
    return st ? kv_cli_fail(cmd, "tp", st, &err) : KV_EXIT_OK;
}
