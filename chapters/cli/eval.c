/*
 * kvlab eval ppl: perplexity of a model over a text file under a cache spec
 * (reference_cpu/eval/kv_eval.h): stride windows or one stream, cached or naive, progress on
 * stderr, one result line (or CSV row) on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_checkpoint.h"
#include "kv_eval.h"
#include "kv_file.h"
#include "kv_needle.h"
#include "kv_tokenizer.h"
#include "kv_window.h"

#define KV_EVAL_MAX_TEXT (64 << 20)

static const char *const modes[] = {"cached", "naive", NULL};
static const char *const schemes[] = {"original", "cache", NULL};

static void on_progress(void *ctx, long done, long total) { kv_progress_update(ctx, done, total); }

static int cmd_eval_ppl(int argc, char **argv)
{
    const char *cmd = "kvlab eval ppl";
    const char *model_path = "trained", *tok_path = NULL, *text_path = NULL;
    const char *mode = "cached", *device = "cpu", *cache = "fp32", *scheme = "original";
    int window = -1, chunk = 64, recent = 0, sinks = 0, csv = 0, threads = 0;
    int64_t limit = 0;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "checkpoint, or `trained` (default): the shipped model, its tokenizer and its held-out text", 0},
        {"--tokenizer", KV_OPT_STRING, &tok_path, 0, 0, NULL, "FILE", "llama2.c tokenizer.bin (required with a model file)", 0},
        {"--text", KV_OPT_STRING, &text_path, 0, 0, NULL, "FILE", "text to score (default with --model trained: its held-out split)", 0},
        {"--window", KV_OPT_INT, &window, 0, 1 << 24, NULL, "T", "tokens per window, stride T-1 (default: the model's seq_len); 0 = the whole text as one stream", 0},
        {"--chunk", KV_OPT_INT, &chunk, 1, 1 << 16, NULL, "C", "cached: tokens per forward step (default 64)", 0},
        {"--mode", KV_OPT_CHOICE, &mode, 0, 0, modes, "M", "cached (default) or naive: recompute every prefix (O(T^2))", 0},
        {"--limit", KV_OPT_I64, &limit, 0, 1 << 30, NULL, "N", "score the first N tokens only (default: all)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "SPEC", "cache: fp32 (default), a storage format, or a chapter 09 method (as kvlab needle --cache)", 0},
        {"--recent", KV_OPT_INT, &recent, 0, 1 << 24, NULL, "W", "chapter 06 sliding window: keep the W most recent tokens (default 0: all)", 0},
        {"--sinks", KV_OPT_INT, &sinks, 0, 1 << 20, NULL, "S", "with --recent: first tokens kept forever (default 0)", 0},
        {"--scheme", KV_OPT_CHOICE, &scheme, 0, 0, schemes, "P", "with --recent: RoPE by original position (default) or cache index (StreamingLLM)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
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
    if (sinks && !recent) return kv_args_bad(cmd, "--sinks", "needs --recent W");
    int e = kv_cli_layout_check(cmd, &lo);
    if (e) return e;
    if ((e = kv_cli_check_device(cmd, device))) return e;

    kv_err err = {{0}};
    kv_cli_trained_files trained;
    if (strcmp(model_path, "trained") == 0) {
        int ts = kv_cli_trained(&trained, &err);
        if (ts) return kv_cli_fail(cmd, "--model trained", ts, &err);
        model_path = trained.model;
        if (!tok_path) tok_path = trained.tokenizer;
        if (!text_path) text_path = trained.heldout;
    }
    if (!tok_path) return kv_args_bad(cmd, "--tokenizer", "a model file needs its tokenizer");
    if (!text_path) return kv_args_bad(cmd, "--text", "a text file is required with a model file");

    kv_model m = {0};
    kv_tokenizer tok;
    memset(&tok, 0, sizeof tok);
    char *text = NULL;
    int *ids = NULL, n = 0, rc = KV_EXIT_OK, st;
    kv_backend *b = NULL;
    if ((st = kv_checkpoint_read(model_path, &m, &err))) {
        rc = kv_cli_fail(cmd, model_path, st, &err);
        goto done;
    }
    if ((st = kv_tokenizer_read(tok_path, m.config.vocab_size, &tok, &err))) {
        rc = kv_cli_fail(cmd, tok_path, st, &err);
        goto done;
    }
    size_t len = 0;
    if ((st = kv_file_read_text(text_path, KV_EVAL_MAX_TEXT, &text, &len, &err))) {
        rc = kv_cli_fail(cmd, text_path, st, &err);
        goto done;
    }
    ids = malloc((len + 3) * sizeof(int)); /* [len + 3] as encode asks */
    if (!ids) {
        rc = kv_cli_fail(cmd, "text", KV_ERR_NOMEM, &err);
        goto done;
    }
    if ((st = kv_tokenizer_encode(&tok, text, 1, 0, ids, &n, &err))) {
        rc = kv_cli_fail(cmd, text_path, st, &err);
        goto done;
    }
    if (limit > 0 && limit < n) n = (int)limit;
    if (window < 0) window = m.config.seq_len;
    const int capacity = window ? (window < n ? window : n) : n;

    kv_cache_spec spec;
    if ((st = kv_needle_cache_spec(cache, 1, capacity, &spec, &err))) {
        rc = kv_cli_fail(cmd, "--cache", st, &err);
        goto done;
    }
    spec.window.size = recent;
    spec.window.n_sinks = sinks;
    spec.window.pos_scheme = recent ? kv_window_scheme_parse(scheme) : 0;
    kv_cli_layout_apply(&lo, &spec);
    if ((st = kv_cli_backend(&b, device, &m, &spec, &err))) {
        rc = kv_cli_fail(cmd, "backend", st, &err);
        goto done;
    }
    kv_progress prog;
    kv_progress_start(&prog, "eval ppl");
    kv_ppl_opts o = {window, chunk, strcmp(mode, "naive") == 0, 0, on_progress, &prog};
    kv_ppl_result res;
    double t0 = kv_now();
    st = kv_eval_ppl(b, ids, n, &o, &res, &err);
    double secs = kv_now() - t0;
    kv_progress_end(&prog);
    if (st) {
        rc = kv_cli_fail(cmd, "eval", st, &err);
        goto done;
    }
    char lname[96];
    kv_cli_layout_name(&spec, lname, sizeof lname);
    char cname[64];
    if (recent) snprintf(cname, sizeof cname, "%s/recent%d/sinks%d/%s", cache, recent, sinks, scheme);
    else snprintf(cname, sizeof cname, "%s", cache);
    if (csv) {
        printf("text,tokens,predicted,windows,window,mode,cache,layout,nll,ppl,seconds\n");
        printf("%s,%d,%ld,%d,%d,%s,%s,\"%s\",%.9f,%.6f,%.2f\n", text_path, n, res.n_predicted,
               res.n_windows, window, mode, cname, lname, res.nll, res.ppl, secs);
    } else {
        printf("perplexity %.4f (NLL %.6f nats/token) over %ld predicted tokens of %s: %d "
               "window%s of %s, mode %s, cache %s (%s), %.1f s\n", res.ppl, res.nll,
               res.n_predicted, text_path, res.n_windows, res.n_windows == 1 ? "" : "s",
               window ? "T tokens" : "the whole stream", mode, cname, lname, secs);
    }
done:
    if (b) kv_backend_destroy(b);
    kv_tokenizer_free(&tok);
    kv_model_free(&m);
    free(text);
    free(ids);
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "ppl") == 0) return cmd_eval_ppl(argc - 2, argv + 2);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: kvlab eval ppl [options]   perplexity of a model over a text file\n");
        return KV_EXIT_OK;
    }
    fprintf(stderr, "kvlab eval: unknown or missing subcommand%s%s (known: ppl)\n",
            argc >= 2 ? " " : "", argc >= 2 ? argv[1] : "");
    return KV_EXIT_USAGE;
}
