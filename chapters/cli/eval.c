/*
 * kvlab eval (eval ppl in eval_ppl.c) and the inputs every eval subcommand reads.
 * kvlab eval keys / eval mass: per-channel |K| before and after RoPE, attention mass per
 * position (reference_cpu/eval/kv_probe.h), on the first window of the text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eval_inputs.h"
#include "kv_file.h"
#include "kv_probe.h"
#include "model_load.h"

#define KV_EVAL_MAX_TEXT (64 << 20)

/* eval_inputs.h */
void eval_inputs_free(eval_inputs *in)
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

/* eval_inputs.h */
int eval_inputs_load(const char *cmd, const char *model_path, const char *tok_path,
                     const char *text_path, long want, int storage, eval_inputs *in)
{
    memset(in, 0, sizeof *in);
    kv_err err = {{0}};
    kv_cli_model_args ma = {model_path, NULL, NULL, tok_path, KV_CLI_TEXT_NEED, !text_path,
                            storage};
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

/* the options kvlab eval keys and eval mass share */
#define PROBE_OPTS                                                                                   \
    {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "checkpoint, `trained` (default), a GGUF file or smollm2", 0}, \
    {"--tokenizer", KV_OPT_STRING, &tok_path, 0, 0, NULL, "FILE", "llama2.c tokenizer.bin (required with a model file)", 0}, \
    {"--text", KV_OPT_STRING, &text_path, 0, 0, NULL, "FILE", "text (default with --model trained: its held-out split)", 0}, \
    {"--tokens", KV_OPT_INT, &tokens, 1, 1 << 20, NULL, "N", "the first N tokens of the text (default: the model's seq_len)", 0}, \
    {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE", "the rows as CSV, to FILE in place of the table (- : standard output)", 0}

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
    int rc = eval_inputs_load(cmd, *paths[0], *paths[1], *paths[2], *tokens ? *tokens : -1,
                              KV_WEIGHTS_F32, in);
    if (rc) {
        eval_inputs_free(in);
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
    eval_inputs_free(&in);
    return rc;
}

/* kvlab eval mass --heads: position 0's mass per layer and KV head (kv_probe.h) */
static int mass_heads(const eval_inputs *in, int n, int csv)
{
    const char *cmd = "kvlab eval mass";
    const kv_config *cfg = &in->mdl.m.config;
    const int L = cfg->n_layers, Hkv = cfg->n_kv_heads;
    double *mass = malloc(sizeof(double) * (size_t)L * Hkv * n); /* [L][H_kv][n] */
    kv_err err = {{0}};
    int st = mass ? kv_probe_attention_mass_heads(&in->mdl.m, in->ids, n, mass, &err)
                  : kv_fail(&err, KV_ERR_NOMEM, "out of memory");
    if (st) {
        free(mass);
        return kv_cli_fail(cmd, "probe", st, &err);
    }
    if (csv) {
        kv_csv_printf(stdout, "layer,kv_head,position,mass\n");
        for (int l = 0; l < L; l++)
            for (int h = 0; h < Hkv; h++)
                for (int p = 0; p < n; p++)
                    kv_csv_printf(stdout, "%d,%d,%d,%.9f\n", l, h, p,
                                  mass[((size_t)l * Hkv + h) * n + p]);
    } else {
        printf("attention mass on position 0 over the first %d tokens of %s, per KV head (the "
               "mean of its %d query heads)\n\n%5s", n, in->text_path, cfg->n_heads / Hkv,
               "layer");
        for (int h = 0; h < Hkv; h++) printf("  kv head %2d", h);
        printf("\n");
        for (int l = 0; l < L; l++) {
            printf("%5d", l);
            for (int h = 0; h < Hkv; h++) printf(" %11.4f", mass[((size_t)l * Hkv + h) * n]);
            printf("\n");
        }
    }
    free(mass);
    return KV_EXIT_OK;
}

static int cmd_eval_mass(int argc, char **argv)
{
    const char *cmd = "kvlab eval mass";
    const char *model_path = "trained", *tok_path = NULL, *text_path = NULL;
    int tokens = 0, csv = 0, first = 4, per_head = 0;
    kv_opt opts[] = {
        PROBE_OPTS,
        {"--first", KV_OPT_INT, &first, 1, 1 << 16, NULL, "K", "table: the mass on positions 0 .. K-1 (default 4)", 0},
        {"--heads", KV_OPT_FLAG, &per_head, 0, 0, NULL, NULL, "per KV head (its group of query heads): the table gives each one's mass on position 0, the CSV a kv_head column", 0},
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
    if (per_head) {
        rc = mass_heads(&in, n, csv);
        eval_inputs_free(&in);
        return rc;
    }
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
    eval_inputs_free(&in);
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
