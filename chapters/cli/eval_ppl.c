/*
 * kvlab eval ppl: perplexity of a model over a text file under a cache spec
 * (reference_cpu/eval/kv_eval.h): stride windows, one stream or recompute windows, cached or
 * naive, KL against the exact cache, KIVI's key grouping emulated, several cache variants in
 * lockstep against one exact run (--caches), the model's KV heads pooled or expanded first
 * (--kv-heads, chapter 03); the spread over windows or segments beside every mean, so a
 * difference can be told from noise; progress on stderr, one result line (or CSV row) per
 * variant on stdout, or one row per segment (--segments, a curve along the stream).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_sets.h"
#include "cli.h"
#include "eval_inputs.h"
#include "kv_eval.h"
#include "kv_needle.h"
#include "kv_probe.h"
#include "kv_quant.h"
#include "kv_window.h"

static const char *const modes[] = {"cached", "naive", NULL};
static const char *const schemes[] = {"original", "cache", NULL};
static const char *const kivi_keys[] = {"off", "channel", "token", NULL};

static void on_progress(void *ctx, long done, long total) { kv_progress_update(ctx, done, total); }

/* Per-token scores summed per segment of S targets: segment k holds the targets t with
 * (t - 1) / S == k (in stride mode with S = T - 1, exactly window k's). */
typedef struct {
    int nb, n_seg;
    long seg;       /* S */
    double *nll;    /* [nb][n_seg] sums */
    double *kl;     /* [nb][n_seg] sums */
    long *count;    /* [nb][n_seg] */
} seg_sums;

static void on_token(void *ctx, int v, long t, double nll, double kl, int agree)
{
    (void)agree;
    seg_sums *s = ctx;
    const long k = (t - 1) / s->seg;
    if (k < 0 || k >= s->n_seg) return;
    const size_t i = (size_t)v * s->n_seg + (size_t)k;
    s->nll[i] += nll;
    s->kl[i] += kl;
    s->count[i]++;
}

/* the spread of one variant's segment means: standard error of their mean, min and max */
typedef struct {
    int k;                          /* segments with a prediction */
    double nll_se, kl_se, ppl_min, ppl_max;
} seg_spread;

static seg_spread spread_of(const seg_sums *s, int v)
{
    seg_spread r = {0, 0.0, 0.0, 0.0, 0.0};
    double m[2] = {0, 0}, q[2] = {0, 0};
    for (int k = 0; k < s->n_seg; k++) {
        const size_t i = (size_t)v * s->n_seg + (size_t)k;
        if (!s->count[i]) continue;
        const double x[2] = {s->nll[i] / s->count[i], s->kl[i] / s->count[i]};
        const double p = exp(x[0]);
        if (!r.k || p < r.ppl_min) r.ppl_min = p;
        if (!r.k || p > r.ppl_max) r.ppl_max = p;
        r.k++;
        for (int j = 0; j < 2; j++) { /* Welford: the running mean and sum of squares */
            const double d = x[j] - m[j];
            m[j] += d / r.k;
            q[j] += d * (x[j] - m[j]);
        }
    }
    if (r.k > 1) {
        r.nll_se = sqrt(q[0] / (r.k - 1) / r.k);
        r.kl_se = sqrt(q[1] / (r.k - 1) / r.k);
    }
    return r;
}

int cmd_eval_ppl(int argc, char **argv)
{
    const char *cmd = "kvlab eval ppl";
    const char *model_path = "trained", *tok_path = NULL, *text_path = NULL;
    const char *mode = "cached", *device = "cpu", *cache = "fp32", *scheme = "original";
    const char *kivi = "off", *caches = NULL;
    int window = -1, chunk = 64, recent = 0, sinks = 0, csv = 0, threads = 0, kl = 0;
    int recompute = 0, every = 1, kivi_bits = 2, kivi_window = 128, kv_heads = 0, segment = 0;
    int per_segment = 0;
    int64_t limit = 0;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_cli_engine en = {NULL, NULL};
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "checkpoint, `trained` (default): the shipped model, its tokenizer and its held-out text; a GGUF file or smollm2 (with --text)", 0},
        {"--tokenizer", KV_OPT_STRING, &tok_path, 0, 0, NULL, "FILE", "llama2.c tokenizer.bin (required with a model file)", 0},
        {"--text", KV_OPT_STRING, &text_path, 0, 0, NULL, "FILE", "text to score (default with --model trained: its held-out split)", 0},
        {"--window", KV_OPT_INT, &window, 0, 1 << 24, NULL, "T", "tokens per window, stride T-1 (default: the model's seq_len); 0 = the whole text as one stream", 0},
        {"--chunk", KV_OPT_INT, &chunk, 1, 1 << 16, NULL, "C", "cached: tokens per forward step (default 64)", 0},
        {"--mode", KV_OPT_CHOICE, &mode, 0, 0, modes, "M", "cached (default) or naive: recompute every prefix (O(T^2))", 0},
        {"--recompute", KV_OPT_FLAG, &recompute, 0, 0, NULL, NULL, "every token predicted from a fresh prefill of the T-1 tokens before it (StreamingLLM's recompute baseline)", 0},
        {"--every", KV_OPT_INT, &every, 1, 1 << 20, NULL, "S", "score only the tokens t with t % S == 0 (default 1: all); the same subsample in every mode", 0},
        {"--limit", KV_OPT_I64, &limit, 0, 1 << 30, NULL, "N", "score the first N tokens only (default: all); only the start of the text they need is encoded", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "SPEC", "cache: fp32 (default), a storage format, or a chapter 09 method (as kvlab needle --cache)", 0},
        {"--caches", KV_OPT_STRING, &caches, 0, 0, NULL, "LIST", "several caches in lockstep, one exact run for all (with --kl): specs separated by spaces or ';', or the sets ch04, ch06, ch09", 0},
        {"--kl", KV_OPT_FLAG, &kl, 0, 0, NULL, NULL, "also run the exact fp32 cache: mean KL(exact || this) and top-1 agreement", 0},
        {"--kv-heads", KV_OPT_INT, &kv_heads, 1, 1 << 16, NULL, "N", "run the model with its KV heads mean-pooled (fewer; 1 = MQA) or copied (more, exact) to N; --kl compares with the original model", 0},
        {"--segment", KV_OPT_INT, &segment, 1, 1 << 24, NULL, "S", "the spread is over segments of S targets (default: the windows, T-1; the stream: 1024)", 0},
        {"--segments", KV_OPT_FLAG, &per_segment, 0, 0, NULL, NULL, "print one CSV row per variant and segment (a curve along the stream)", 0},
        {"--kivi-keys", KV_OPT_CHOICE, &kivi, 0, 0, kivi_keys, "G", "emulate KIVI on the fp32 cache, keys grouped per channel or per token (chunks of 32)", 0},
        {"--kivi-bits", KV_OPT_INT, &kivi_bits, 2, 4, NULL, "B", "with --kivi-keys: 2 (default) or 4", 0},
        {"--kivi-window", KV_OPT_INT, &kivi_window, 32, 1 << 20, NULL, "R", "with --kivi-keys: fp32 window (default 128)", 0},
        {"--recent", KV_OPT_INT, &recent, 0, 1 << 24, NULL, "W", "chapter 06 sliding window: keep the W most recent tokens (default 0: all)", 0},
        {"--sinks", KV_OPT_INT, &sinks, 0, 1 << 20, NULL, "S", "with --recent: first tokens kept forever (default 0)", 0},
        {"--scheme", KV_OPT_CHOICE, &scheme, 0, 0, schemes, "P", "with --recent: RoPE by original position (default) or cache index (StreamingLLM)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        KV_CLI_ENGINE_OPTS(en),
        {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE", "a header and one row per variant as CSV, to FILE in place of the table (- : standard output)", 0},
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Perplexity of a model over a text file: the text is encoded with BOS,\n"
                          "cut into windows of T tokens overlapping by one (each token after the\n"
                          "first predicted once) or run as one stream, under any cache. Beside the\n"
                          "mean: its standard error over the windows (or segments) and their\n"
                          "lowest and highest perplexity.",
                          argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    if (sinks && !recent) return kv_args_bad(cmd, "--sinks", "needs --recent W");
    if (kv_args_given(opts, n_opts, "--scheme") && !recent)
        return kv_args_bad(cmd, "--scheme", "needs --recent W");
    if (kivi_bits == 3) return kv_args_bad(cmd, "--kivi-bits", "2 or 4");
    const int emulate = strcmp(kivi, "off") != 0;
    /* options that only KIVI's emulation reads: refused rather than ignored without it */
    if (!emulate && kv_args_given(opts, n_opts, "--kivi-bits"))
        return kv_args_bad(cmd, "--kivi-bits", "needs --kivi-keys channel|token");
    if (!emulate && kv_args_given(opts, n_opts, "--kivi-window"))
        return kv_args_bad(cmd, "--kivi-window", "needs --kivi-keys channel|token");
    /* the emulation steps 32 tokens at a time (its key groups), whatever --chunk says */
    if (emulate && kv_args_given(opts, n_opts, "--chunk") && chunk != KV_KIVI_GROUP)
        return kv_args_bad(cmd, "--chunk", "--kivi-keys steps %d tokens at a time (its key "
                           "groups): leave --chunk out, or give %d", KV_KIVI_GROUP,
                           KV_KIVI_GROUP);
    if (emulate && (strcmp(cache, "fp32") != 0 || recent || strcmp(device, "cpu") != 0))
        return kv_args_bad(cmd, "--kivi-keys", "emulates on the fp32 cache of the CPU, no --recent");
    if (recompute && (kl || emulate || strcmp(mode, "naive") == 0 || window == 0))
        return kv_args_bad(cmd, "--recompute", "needs a window T and cached mode, no --kl or --kivi-keys");
    if (caches && (kv_args_given(opts, n_opts, "--cache") || recent || emulate || recompute ||
                   strcmp(mode, "naive") == 0))
        return kv_args_bad(cmd, "--caches", "runs its variants in cached mode: no --cache, "
                           "--recent, --kivi-keys, --recompute or --mode naive with it");
    if (per_segment && !csv) return kv_args_bad(cmd, "--segments", "needs --csv");
    int e = kv_cli_layout_check(cmd, &lo);
    if (e) return e;
    if ((e = kv_cli_check_device(cmd, device)) || (e = kv_cli_engine_check(cmd, device, &en)))
        return e;

    eval_inputs in;
    int rc = eval_inputs_load(cmd, model_path, tok_path, text_path, (long)limit,
                              kv_cli_engine_storage(device, &en), &in), st;
    kv_err err = {{0}};
    kv_backend *bs[KV_CLI_SETS_MAX] = {NULL}, *ref = NULL;
    char (*specs)[KV_CLI_SPEC_MAX] = calloc(KV_CLI_SETS_MAX, KV_CLI_SPEC_MAX);
    kv_ppl_result res[KV_CLI_SETS_MAX];
    seg_sums sums = {0, 0, 0, NULL, NULL, NULL};
    kv_model conv = {0};
    const kv_model *vm = NULL;
    int nb = 1;
    if (rc) goto done;
    if (!specs) {
        rc = kv_cli_fail(cmd, "--caches", KV_ERR_NOMEM, &err);
        goto done;
    }
    int n = in.n;
    if (limit > 0 && limit < n) n = (int)limit;
    if (window < 0) window = in.mdl.m.config.seq_len;
    const int capacity = window ? (window < n ? window : n) : n;
    if (caches) {
        if ((rc = kv_cli_cache_list(cmd, "--caches", caches, in.mdl.m.config.n_layers, capacity,
                                    specs, KV_CLI_SETS_MAX, &nb)))
            goto done;
    } else {
        snprintf(specs[0], KV_CLI_SPEC_MAX, "%s", cache);
    }
    if ((rc = kv_cli_model_kv_heads(cmd, &in.mdl.m, kv_heads, &conv, &vm))) goto done;

    for (int v = 0; v < nb; v++) {
        kv_cache_spec spec;
        if ((st = kv_needle_cache_spec(specs[v], 1, capacity, &spec, &err))) {
            rc = kv_cli_fail(cmd, caches ? "--caches" : "--cache", st, &err);
            goto done;
        }
        if (recent && spec.window.size) {
            rc = kv_args_bad(cmd, "--recent", "the cache '%s' names its own window", cache);
            goto done;
        }
        if (recent) { /* else the spec's own window, if it names one (window/wN/...) */
            spec.window.size = recent;
            spec.window.n_sinks = sinks;
            spec.window.pos_scheme = kv_window_scheme_parse(scheme);
        }
        kv_cli_layout_apply(&lo, &spec);
        if ((st = kv_cli_backend_engine(&bs[v], device, vm, &spec, &en, &err))) {
            rc = kv_cli_fail(cmd, specs[v], st, &err);
            goto done;
        }
    }
    kv_cache_spec exact = kv_cache_spec_default(1, capacity);
    /* the exact cache of the loaded model on the same engine (weights, prefill), so KL
     * measures the cache (and a --kv-heads conversion) alone */
    if (kl && (st = kv_cli_backend_engine(&ref, device, &in.mdl.m, &exact, &en, &err))) {
        rc = kv_cli_fail(cmd, "--kl backend", st, &err);
        goto done;
    }
    kv_probe_kivi kv_emul;
    const int kivi_fmt = kivi_bits == 4 ? KV_QF_INT4_KIVI : KV_QF_INT2_KIVI;
    if (emulate && (st = kv_probe_kivi_init(&kv_emul, kivi_fmt, strcmp(kivi, "token") == 0,
                                            kivi_window, &err))) {
        rc = kv_cli_fail(cmd, "--kivi-window", st, &err);
        goto done;
    }
    sums.nb = nb;
    sums.seg = segment ? segment : window ? window - 1 : 1024;
    sums.n_seg = (int)((n - 2) / sums.seg + 1);
    sums.nll = calloc((size_t)nb * sums.n_seg, sizeof(double));
    sums.kl = calloc((size_t)nb * sums.n_seg, sizeof(double));
    sums.count = calloc((size_t)nb * sums.n_seg, sizeof(long));
    if (!sums.nll || !sums.kl || !sums.count) {
        rc = kv_cli_fail(cmd, "--segment", kv_fail(&err, KV_ERR_NOMEM, "%d segments", sums.n_seg),
                         &err);
        goto done;
    }
    kv_progress prog;
    kv_progress_start(&prog, "eval ppl");
    kv_ppl_opts o = {window, emulate ? KV_KIVI_GROUP : chunk, strcmp(mode, "naive") == 0, 0, on_progress, &prog,
                     recompute, every, ref, emulate ? kv_probe_kivi_step : NULL, &kv_emul,
                     on_token, &sums};
    st = kv_eval_ppl_many(bs, nb, in.ids, n, &o, res, &err);
    kv_progress_end(&prog);
    if (st) {
        rc = kv_cli_fail(cmd, "eval", st, &err);
        goto done;
    }
    char heads[32] = "";
    if (vm != &in.mdl.m) snprintf(heads, sizeof heads, "/kv%d", kv_heads);
    const char *how = recompute ? "recompute" : mode;
    if (csv && per_segment)
        kv_csv_printf(stdout, "text,window,mode,cache,segment,first,last,predicted,nll,ppl,kl\n");
    else if (csv)
        kv_csv_printf(stdout, "text,tokens,predicted,windows,window,mode,cache,layout,nll,ppl,kl,"
                      "top1,segments,nll_se,kl_se,ppl_min,ppl_max,exact_ppl\n");
    for (int v = 0; v < nb; v++) {
        char lname[96], cname[KV_CLI_SPEC_MAX + 96];
        kv_cache_spec spec;
        kv_needle_cache_spec(specs[v], 1, capacity, &spec, &err); /* parsed above */
        kv_cli_layout_apply(&lo, &spec);
        kv_cli_layout_name(&spec, lname, sizeof lname);
        if (recent) snprintf(cname, sizeof cname, "%s/recent%d/sinks%d/%s%s", specs[v], recent, sinks, scheme, heads);
        else if (emulate) snprintf(cname, sizeof cname, "%s-emulated/keys-per-%s/w%d%s", kv_quant_name(kivi_fmt), kivi, kivi_window, heads);
        else snprintf(cname, sizeof cname, "%s%s", specs[v], heads);
        const kv_ppl_result *q = &res[v];
        const seg_spread sp = spread_of(&sums, v);
        if (csv && per_segment) {
            for (int k = 0; k < sums.n_seg; k++) {
                const size_t i = (size_t)v * sums.n_seg + (size_t)k;
                if (!sums.count[i]) continue;
                const double nll = sums.nll[i] / sums.count[i];
                const long last = (k + 1) * sums.seg < n - 1 ? (k + 1) * sums.seg : n - 1;
                kv_csv_printf(stdout, "%s,%d,%s,%s,%d,%ld,%ld,%ld,%.9f,%.6f,", in.text_path,
                              window, how, cname, k, k * sums.seg + 1, last, sums.count[i], nll,
                              exp(nll));
                if (kl) kv_csv_printf(stdout, "%.9f\n", sums.kl[i] / sums.count[i]);
                else kv_csv_printf(stdout, "\n");
            }
        } else if (csv) {
            kv_csv_printf(stdout, "%s,%d,%ld,%d,%d,%s,%s,%s,%.9f,%.6f,", in.text_path, n,
                          q->n_predicted, q->n_windows, window, how, cname, lname, q->nll, q->ppl);
            if (kl) kv_csv_printf(stdout, "%.9f,%.6f,", q->kl, q->top1);
            else kv_csv_printf(stdout, ",,");
            kv_csv_printf(stdout, "%d,%.9f,", sp.k, sp.nll_se);
            if (kl) kv_csv_printf(stdout, "%.9f,", sp.kl_se);
            else kv_csv_printf(stdout, ",");
            kv_csv_printf(stdout, "%.6f,%.6f,", sp.ppl_min, sp.ppl_max);
            if (kl) kv_csv_printf(stdout, "%.6f\n", exp(q->ref_nll));
            else kv_csv_printf(stdout, "\n");
        } else {
            char span[48];
            if (window) snprintf(span, sizeof span, "%d tokens", window);
            else snprintf(span, sizeof span, "the whole stream");
            printf("perplexity %.4f (NLL %.6f nats/token) over %ld predicted tokens of %s: %d "
                   "%s of %s, mode %s, cache %s (%s)\n", q->ppl, q->nll, q->n_predicted,
                   in.text_path, q->n_windows, recompute ? "recomputed prefill(s)" :
                   q->n_windows == 1 ? "window" : "windows", span, how, cname, lname);
            if (sp.k > 1)
                printf("  over %d segments of %ld targets: NLL standard error %.6f, segment "
                       "perplexity %.4f .. %.4f\n", sp.k, sums.seg, sp.nll_se, sp.ppl_min,
                       sp.ppl_max);
            if (kl)
                printf("  against the exact fp32 cache (perplexity %.4f): KL %.6f nats/token "
                       "(standard error %.6f), top-1 agreement %.2f %%\n", exp(q->ref_nll), q->kl,
                       sp.kl_se, 100.0 * q->top1);
        }
    }
done:
    kv_backend_destroy(ref);
    for (int v = 0; v < KV_CLI_SETS_MAX; v++) kv_backend_destroy(bs[v]);
    free(specs);
    free(sums.nll);
    free(sums.kl);
    free(sums.count);
    kv_model_free(&conv);
    eval_inputs_free(&in);
    return rc;
}
