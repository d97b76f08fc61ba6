/*
 * kvlab eval ppl: perplexity of a model over a text file under a cache spec
 * (reference_cpu/eval/kv_eval.h): stride windows, one stream or recompute windows, cached or
 * naive, KL against the exact cache, KIVI's key grouping emulated; progress on stderr, one
 * result line (or CSV row) on stdout.
 * kvlab eval keys / eval mass: per-channel |K| before and after RoPE, attention mass per
 * position (reference_cpu/eval/kv_probe.h), on the first window of the text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_eval.h"
#include "kv_file.h"
#include "kv_needle.h"
#include "kv_probe.h"
#include "kv_quant.h"
#include "model_load.h"
#include "kv_window.h"

#define KV_EVAL_MAX_TEXT (64 << 20)

static const char *const modes[] = {"cached", "naive", NULL};
static const char *const schemes[] = {"original", "cache", NULL};
static const char *const kivi_keys[] = {"off", "channel", "token", NULL};


/* what every eval subcommand reads: the model, its tokenizer, the text encoded with BOS */
typedef struct {
    kv_cli_model mdl; /* the model and its tokenizer */
    char *text;
    int *ids; /* [n] */
    int n;
    const char *text_path;
} eval_inputs;

static void inputs_free(eval_inputs *in)
{
    kv_cli_model_close(&in->mdl);
    free(in->text);
    free(in->ids);
    memset(in, 0, sizeof *in);
}

/* The ids of the first @p want tokens of @p text [len] (0: all of it), BOS first, into *ids
 * (*n of them, at least @p want where the text has them). A limit needs only a prefix: one cut
 * at a line end, about 8 bytes per token wanted, doubled until two prefixes agree on their
 * first @p want ids (a merge may reach across the cut, never far) or the whole text is taken.
 * So --limit 300 on 64 MiB of text encodes kilobytes, not all of it. */
static int encode_first(const kv_cli_model *mdl, char *text, size_t len, long want, int **ids,
                        int *n, kv_err *err)
{
    if (want <= 0) return kv_cli_encode(mdl, text, 1, ids, n, err);
    int *prev = NULL, n_prev = 0;
    for (size_t bytes = 8 * (size_t)want + 1024;; bytes *= 2) {
        size_t cut = bytes < len ? bytes : len;
        while (cut < len && text[cut - 1] != '\n') cut++; /* a whole line: no codepoint cut */
        const char saved = text[cut];
        text[cut] = '\0';
        int *cur = NULL, n_cur = 0;
        const int st = kv_cli_encode(mdl, text, 1, &cur, &n_cur, err);
        text[cut] = saved;
        const int stable = !st && prev && n_prev > want &&
                           !memcmp(prev, cur, sizeof(int) * (size_t)want);
        free(prev);
        if (st) return st;
        if (cut == len || stable) {
            *ids = cur;
            *n = n_cur;
            return KV_OK;
        }
        prev = cur;
        n_prev = n_cur;
    }
}

/* KV_EXIT_OK, or the exit code after a message on stderr; @p want: the tokens the command
 * reads (0: the whole text, -1: the model's seq_len) */
static int inputs_load(const char *cmd, const char *model_path, const char *tok_path,
                       const char *text_path, long want, eval_inputs *in)
{
    memset(in, 0, sizeof *in);
    kv_err err = {{0}};
    kv_cli_model_args ma = {model_path, NULL, NULL, tok_path, KV_CLI_TEXT_NEED, !text_path};
    int rc = kv_cli_model_load(cmd, &ma, &in->mdl);
    if (rc) return rc;
    if (!text_path && in->mdl.heldout[0]) text_path = in->mdl.heldout;
    if (!text_path) return kv_args_bad(cmd, "--text", "a text file is required with a model file");
    static char text_name[2 * KV_CLI_PATH_MAX];
    const char *base = strrchr(text_path, '/'); /* printed: the file's name, not where it lies */
    snprintf(text_name, sizeof text_name, "%s", base ? base + 1 : text_path);
    in->text_path = text_name;
    int st;
    size_t len = 0;
    if ((st = kv_file_read_text(text_path, KV_EVAL_MAX_TEXT, &in->text, &len, &err)))
        return kv_cli_fail(cmd, text_path, st, &err);
    if (want < 0) want = in->mdl.m.config.seq_len;
    if ((st = encode_first(&in->mdl, in->text, len, want, &in->ids, &in->n, &err)))
        return kv_cli_fail(cmd, text_path, st, &err);
    return KV_EXIT_OK;
}

static void on_progress(void *ctx, long done, long total) { kv_progress_update(ctx, done, total); }

static int cmd_eval_ppl(int argc, char **argv)
{
    const char *cmd = "kvlab eval ppl";
    const char *model_path = "trained", *tok_path = NULL, *text_path = NULL;
    const char *mode = "cached", *device = "cpu", *cache = "fp32", *scheme = "original";
    const char *kivi = "off";
    int window = -1, chunk = 64, recent = 0, sinks = 0, csv = 0, threads = 0, kl = 0;
    int recompute = 0, every = 1, kivi_bits = 2, kivi_window = 128;
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
        {"--kl", KV_OPT_FLAG, &kl, 0, 0, NULL, NULL, "also run the exact fp32 cache: mean KL(exact || this) and top-1 agreement", 0},
        {"--kivi-keys", KV_OPT_CHOICE, &kivi, 0, 0, kivi_keys, "G", "emulate KIVI on the fp32 cache, keys grouped per channel or per token (chunks of 32)", 0},
        {"--kivi-bits", KV_OPT_INT, &kivi_bits, 2, 4, NULL, "B", "with --kivi-keys: 2 (default) or 4", 0},
        {"--kivi-window", KV_OPT_INT, &kivi_window, 32, 1 << 20, NULL, "R", "with --kivi-keys: fp32 window (default 128)", 0},
        {"--recent", KV_OPT_INT, &recent, 0, 1 << 24, NULL, "W", "chapter 06 sliding window: keep the W most recent tokens (default 0: all)", 0},
        {"--sinks", KV_OPT_INT, &sinks, 0, 1 << 20, NULL, "S", "with --recent: first tokens kept forever (default 0)", 0},
        {"--scheme", KV_OPT_CHOICE, &scheme, 0, 0, schemes, "P", "with --recent: RoPE by original position (default) or cache index (StreamingLLM)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        KV_CLI_ENGINE_OPTS(en),
        {"--csv", KV_OPT_FLAG, &csv, 0, 0, NULL, NULL, "print a header and one comma-separated row", 0},
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Perplexity of a model over a text file: the text is encoded with BOS,\n"
                          "cut into windows of T tokens overlapping by one (each token after the\n"
                          "first predicted once) or run as one stream, under any cache.",
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
    int e = kv_cli_layout_check(cmd, &lo);
    if (e) return e;
    if ((e = kv_cli_check_device(cmd, device)) || (e = kv_cli_engine_check(cmd, device, &en)))
        return e;

    eval_inputs in;
    int rc = inputs_load(cmd, model_path, tok_path, text_path, (long)limit, &in), st;
    kv_err err = {{0}};
    kv_backend *b = NULL, *ref = NULL;
    if (rc) goto done;
    int n = in.n;
    if (limit > 0 && limit < n) n = (int)limit;
    if (window < 0) window = in.mdl.m.config.seq_len;
    const int capacity = window ? (window < n ? window : n) : n;

    kv_cache_spec spec;
    if ((st = kv_needle_cache_spec(cache, 1, capacity, &spec, &err))) {
        rc = kv_cli_fail(cmd, "--cache", st, &err);
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
    if ((st = kv_cli_backend_engine(&b, device, &in.mdl.m, &spec, &en, &err))) {
        rc = kv_cli_fail(cmd, "backend", st, &err);
        goto done;
    }
    kv_cache_spec exact = kv_cache_spec_default(1, capacity);
    /* the exact cache on the same engine (weights, prefill), so KL measures the cache alone */
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
    kv_progress prog;
    kv_progress_start(&prog, "eval ppl");
    kv_ppl_opts o = {window, emulate ? KV_KIVI_GROUP : chunk, strcmp(mode, "naive") == 0, 0, on_progress, &prog,
                     recompute, every, ref, emulate ? kv_probe_kivi_step : NULL, &kv_emul};
    kv_ppl_result res;
    st = kv_eval_ppl(b, in.ids, n, &o, &res, &err);
    kv_progress_end(&prog);
    if (st) {
        rc = kv_cli_fail(cmd, "eval", st, &err);
        goto done;
    }
    char lname[96];
    kv_cli_layout_name(&spec, lname, sizeof lname);
    char cname[96];
    if (recent) snprintf(cname, sizeof cname, "%s/recent%d/sinks%d/%s", cache, recent, sinks, scheme);
    else if (emulate) snprintf(cname, sizeof cname, "%s-emulated/keys-per-%s/w%d", kv_quant_name(kivi_fmt), kivi, kivi_window);
    else snprintf(cname, sizeof cname, "%s", cache);
    const char *how = recompute ? "recompute" : mode;
    if (csv) {
        kv_csv_printf(stdout,
                      "text,tokens,predicted,windows,window,mode,cache,layout,nll,ppl,kl,top1\n");
        kv_csv_printf(stdout, "%s,%d,%ld,%d,%d,%s,%s,%s,%.9f,%.6f,", in.text_path, n,
                      res.n_predicted, res.n_windows, window, how, cname, lname, res.nll, res.ppl);
        if (kl) kv_csv_printf(stdout, "%.9f,%.6f\n", res.kl, res.top1);
        else kv_csv_printf(stdout, ",\n");
    } else {
        char span[48];
        if (window) snprintf(span, sizeof span, "%d tokens", window);
        else snprintf(span, sizeof span, "the whole stream");
        printf("perplexity %.4f (NLL %.6f nats/token) over %ld predicted tokens of %s: %d "
               "%s of %s, mode %s, cache %s (%s)\n", res.ppl, res.nll, res.n_predicted,
               in.text_path, res.n_windows, recompute ? "recomputed prefill(s)" :
               res.n_windows == 1 ? "window" : "windows", span, how, cname, lname);
        if (kl) printf("against the exact fp32 cache: KL %.6f nats/token, top-1 agreement %.2f %%\n",
                       res.kl, 100.0 * res.top1);
    }
done:
    kv_backend_destroy(ref);
    kv_backend_destroy(b);
    inputs_free(&in);
    return rc;
}

/* the options kvlab eval keys and eval mass share */
#define PROBE_OPTS                                                                                   \
    {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "checkpoint, `trained` (default), a GGUF file or smollm2", 0}, \
    {"--tokenizer", KV_OPT_STRING, &tok_path, 0, 0, NULL, "FILE", "llama2.c tokenizer.bin (required with a model file)", 0}, \
    {"--text", KV_OPT_STRING, &text_path, 0, 0, NULL, "FILE", "text (default with --model trained: its held-out split)", 0}, \
    {"--tokens", KV_OPT_INT, &tokens, 1, 1 << 20, NULL, "N", "the first N tokens of the text (default: the model's seq_len)", 0}, \
    {"--csv", KV_OPT_FLAG, &csv, 0, 0, NULL, NULL, "comma-separated rows (for plots)", 0}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the median of v [n], sorted in place (so v[n - 1] is the largest) */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* kvlab eval keys / mass: parse, load, and the stretch n (--tokens, else seq_len, else the
 * text). KV_EXIT_OK with *in loaded, -1 after --help, else the exit code (*in freed). */
static int probe_begin(const char *cmd, const char *help, int argc, char **argv, kv_opt *opts,
                       int n_opts, const char *const *paths[3], const int *tokens,
                       eval_inputs *in, int *n)
{
    memset(in, 0, sizeof *in);
    int r = kv_args_parse(cmd, help, argc, argv, opts, n_opts);
    if (r == KV_ARGS_HELP) return -1;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    /* paths point at the option variables: read after parsing */
    int rc = inputs_load(cmd, *paths[0], *paths[1], *paths[2], *tokens ? *tokens : -1, in);
    if (rc) {
        inputs_free(in);
        return rc;
    }
    const int T = in->mdl.m.config.seq_len;
    *n = *tokens && *tokens < in->n ? *tokens : (T < in->n ? T : in->n);
    return KV_EXIT_OK;
}

static int cmd_eval_keys(int argc, char **argv)
{
    const char *cmd = "kvlab eval keys";
    const char *model_path = "trained", *tok_path = NULL, *text_path = NULL;
    int tokens = 0, csv = 0;
    kv_opt opts[] = {PROBE_OPTS};
    eval_inputs in;
    int n, rc = probe_begin(cmd,
                            "Mean |K| of every channel of every layer and KV head over the first N\n"
                            "tokens of a text, before RoPE and after it (what the cache stores).",
                            argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                            (const char *const *[]){&model_path, &tok_path, &text_path}, &tokens, &in, &n);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    const kv_config *cfg = &in.mdl.m.config;
    const int L = cfg->n_layers, Hkv = cfg->n_kv_heads, d = kv_config_head_dim(cfg);
    const size_t cells = (size_t)L * Hkv * d;
    double *pre = malloc(sizeof(double) * cells), *post = malloc(sizeof(double) * cells); /* [L][H_kv][d] */
    double *tmp = malloc(sizeof(double) * (size_t)Hkv * d); /* [H_kv * d] one layer, sorted */
    kv_err err = {{0}};
    int st = pre && post && tmp ? kv_probe_key_channels(&in.mdl.m, in.ids, n, pre, post, &err)
                                : kv_fail(&err, KV_ERR_NOMEM, "out of memory");
    if (st) rc = kv_cli_fail(cmd, "probe", st, &err);
    else if (csv) {
        kv_csv_printf(stdout, "layer,kv_head,channel,mean_abs_pre_rope,mean_abs_post_rope\n");
        for (size_t i = 0; i < cells; i++)
            kv_csv_printf(stdout, "%d,%d,%d,%.6f,%.6f\n", (int)(i / ((size_t)Hkv * d)),
                          (int)(i / d % Hkv), (int)(i % d), pre[i], post[i]);
    } else {
        printf("mean |K| per channel over the first %d tokens of %s (%d KV heads x %d channels "
               "per layer)\n\n%5s  %28s  %28s\n%5s  %8s %8s %10s  %8s %8s %10s\n", n, in.text_path,
               Hkv, d, "layer", "before RoPE", "after RoPE (cached)", "", "median", "max",
               "max/median", "median", "max", "max/median");
        for (int l = 0; l < L; l++) {
            double row[2][3];
            for (int k = 0; k < 2; k++) {
                memcpy(tmp, (k ? post : pre) + (size_t)l * Hkv * d, sizeof(double) * (size_t)Hkv * d);
                row[k][0] = median_of(tmp, Hkv * d);
                row[k][1] = tmp[Hkv * d - 1];
                row[k][2] = row[k][0] > 0.0 ? row[k][1] / row[k][0] : 0.0;
            }
            printf("%5d  %8.3f %8.3f %10.2f  %8.3f %8.3f %10.2f\n", l, row[0][0], row[0][1],
                   row[0][2], row[1][0], row[1][1], row[1][2]);
        }
    }
    free(pre);
    free(post);
    free(tmp);
    inputs_free(&in);
    return rc;
}

static int cmd_eval_mass(int argc, char **argv)
{
    const char *cmd = "kvlab eval mass";
    const char *model_path = "trained", *tok_path = NULL, *text_path = NULL;
    int tokens = 0, csv = 0, first = 4;
    kv_opt opts[] = {
        PROBE_OPTS,
        {"--first", KV_OPT_INT, &first, 1, 1 << 16, NULL, "K", "table: the mass on positions 0 .. K-1 (default 4)", 0},
    };
    eval_inputs in;
    int n, rc = probe_begin(cmd,
                            "Attention mass per position over the first N tokens of a text: the\n"
                            "probability each position receives, summed over every later query row\n"
                            "and every head, over N x H (chapter 09's H2O state, nothing evicted).",
                            argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                            (const char *const *[]){&model_path, &tok_path, &text_path}, &tokens, &in, &n);
    if (rc) return rc < 0 ? KV_EXIT_OK : rc;
    const kv_config *cfg = &in.mdl.m.config;
    const int L = cfg->n_layers;
    if (first > n) first = n;
    double *mass = malloc(sizeof(double) * (size_t)L * n); /* [L][n] */
    kv_err err = {{0}};
    int st = mass ? kv_probe_attention_mass(&in.mdl.m, in.ids, n, mass, &err)
                  : kv_fail(&err, KV_ERR_NOMEM, "out of memory");
    /* the same mass if every row spread its attention evenly over 0 .. t: (1/n) sum 1/(t+1) */
    double even0 = 0.0;
    for (int t = 0; t < n; t++) even0 += 1.0 / (t + 1) / n;
    if (st) rc = kv_cli_fail(cmd, "probe", st, &err);
    else if (csv) {
        kv_csv_printf(stdout, "layer,position,mass\n");
        for (int l = 0; l < L; l++)
            for (int p = 0; p < n; p++)
                kv_csv_printf(stdout, "%d,%d,%.9f\n", l, p, mass[(size_t)l * n + p]);
    } else {
        printf("attention mass per position over the first %d tokens of %s, summed over %d "
               "heads; even causal attention would give position 0 %.4f\n\n%5s %10s %10s %12s "
               "%10s\n", n, in.text_path, cfg->n_heads, even0, "layer", "position 0",
               "first K", "top other p", "its mass");
        for (int l = 0; l < L; l++) {
            const double *row = mass + (size_t)l * n;
            double head = 0.0;
            int top = first < n ? first : 0;
            for (int p = 0; p < first; p++) head += row[p];
            for (int p = first; p < n; p++)
                if (row[p] > row[top]) top = p;
            printf("%5d %10.4f %10.4f %12d %10.4f\n", l, row[0], head, top, row[top]);
        }
        printf("\nfirst K: positions 0 .. %d; top other p: the position after them with the most mass\n",
               first - 1);
    }
    free(mass);
    inputs_free(&in);
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "ppl") == 0) return cmd_eval_ppl(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "keys") == 0) return cmd_eval_keys(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "mass") == 0) return cmd_eval_mass(argc - 2, argv + 2);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: kvlab eval ppl [options]    perplexity of a model over a text file\n"
               "       kvlab eval keys [options]   mean |K| per channel, before and after RoPE\n"
               "       kvlab eval mass [options]   attention mass per position (sinks)\n");
        return KV_EXIT_OK;
    }
    fprintf(stderr, "kvlab eval: unknown or missing subcommand%s%s (known: ppl, keys, mass)\n",
            argc >= 2 ? " " : "", argc >= 2 ? argv[1] : "");
    return KV_EXIT_USAGE;
}
