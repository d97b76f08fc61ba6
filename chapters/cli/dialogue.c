/*
 * kvlab dialogue: run a multi-turn dialogue (datasets/dialogues/, .dlg files) on the recall models
 * with an incremental session (reference_cpu/eval/kv_dialogue.h) and print every turn with its
 * expected and actual reply; --recompute also checks each reply against a from-scratch run of
 * the whole history. Exits 1 when a turn fails. With a GGUF chat model (--model smollm2) it
 * runs chat scripts instead (dialogue_chat.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_dialogue.h"
#include "kv_needle.h"

static const char *const model_names[] = {"direct", "induction", "both", NULL};

/* The turn as written in the file, shortened to fit a column. */
static void turn_text(const kv_dialogue *d, int t, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < d->turns[t].n_items && k + 1 < n; i++) {
        const kv_dlg_item *it = &d->items[d->turns[t].first_item + i];
        int w = 0;
        switch (it->type) {
        case KV_DLG_FACT: w = snprintf(buf + k, n - k, "%sk%d=v%d", i ? " " : "", it->key, it->value); break;
        case KV_DLG_QUESTION: w = snprintf(buf + k, n - k, "%sk%d?", i ? " " : "", it->key); break;
        case KV_DLG_FILLER: w = snprintf(buf + k, n - k, "%sf%d", i ? " " : "", it->count); break;
        default: w = snprintf(buf + k, n - k, "%s~%d", i ? " " : "", it->count); break;
        }
        if (w < 0) break;
        k += (size_t)w;
    }
    if (k >= n - 1 && n > 4) strcpy(buf + n - 4, "...");
}

/* Progress on stderr after every turn, in tokens of the history (a long dialogue with
 * --recompute is quadratic: 32k tokens take minutes). */
typedef struct {
    kv_progress p;
    long total;
} dlg_progress;

static int on_turn(void *user, kv_session *s, int t, kv_err *err)
{
    (void)t;
    (void)err;
    dlg_progress *dp = user;
    kv_progress_update(&dp->p, s->n_history, dp->total);
    return KV_OK;
}

static int run_one(const char *cmd, const kv_dialogue *d, int kind, const char *cache,
                   const kv_cli_layout *lo, const char *device, const kv_cli_engine *en,
                   int recompute, int *failed)
{
    kv_recall_vocab v;
    kv_recall_vocab_get(&v);
    kv_err err = {{0}};
    kv_recall_opts o;
    kv_recall_opts_default(&o, kind);
    kv_model m;
    int st = kv_recall_build(&m, &o, &err);
    if (st) return kv_cli_fail(cmd, "recall model", st, &err);
    kv_cache_spec cs;
    kv_backend *b = NULL;
    st = kv_needle_cache_spec(cache, 2, kv_dialogue_length(d, kind), &cs, &err);
    if (!st) kv_cli_layout_apply(lo, &cs);
    if (!st) st = kv_cli_backend_engine(&b, device, &m, &cs, en, &err);
    kv_dlg_result *res = calloc((size_t)d->n_turns, sizeof *res);
    if (!st && !res) st = kv_fail(&err, KV_ERR_NOMEM, "out of memory");
    const double t0 = kv_now();
    dlg_progress dp = {.total = kv_dialogue_length(d, kind)};
    kv_progress_start(&dp.p, "dialogue: tokens");
    if (!st) st = kv_dialogue_run_hooked(b, d, kind, recompute, on_turn, &dp, res, &err);
    kv_progress_end(&dp.p);
    if (st) {
        int rc = kv_cli_fail(cmd, d->name, st, &err);
        free(res);
        kv_backend_destroy(b);
        kv_model_free(&m);
        return rc;
    }
    char lname[96];
    printf("\n%s: %s model, cache %s (%s), %s, %d turns in %.2f s\n", d->name,
           kv_recall_kind_name(kind), cache, kv_cli_layout_name(&cs, lname, sizeof lname), device,
           d->n_turns, kv_now() - t0);
    printf("%4s  %-34s %6s %6s %8s %8s %7s %s\n", "turn", "items", "tokens", "cached", "expected",
           "reply", "margin", recompute ? "result  from-scratch" : "result");
    int pass = 0;
    for (int t = 0; t < d->n_turns; t++) {
        const kv_dlg_result *r = &res[t];
        char items[35], b1[32], b2[32];
        turn_text(d, t, items, sizeof items);
        const int ok = r->pass && (!recompute || r->recompute_token == r->reply);
        pass += ok;
        printf("%4d  %-34s %6d %6d %8s %8s %+7.2f %s", t + 1, items, r->n_tokens, r->cached,
               kv_recall_token_name(&v, r->expected, b1), kv_recall_token_name(&v, r->reply, b2),
               r->margin, r->pass ? "pass" : "FAIL");
        if (recompute)
            printf("    %s (max |dlogit| %.2g)", r->recompute_token == r->reply ? "same" : "DIFFERENT",
                   r->recompute_diff);
        printf("\n");
    }
    printf("%d of %d turns pass\n", pass, d->n_turns);
    if (pass != d->n_turns) *failed = 1;
    free(res);
    kv_backend_destroy(b);
    kv_model_free(&m);
    return KV_EXIT_OK;
}

int cmd_dialogue(int argc, char **argv)
{
    /* a model that is not a recall model: the chat scripts (dialogue_chat.c) */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--model")) {
            int recall = 0;
            for (int k = 0; model_names[k]; k++) recall |= !strcmp(argv[i + 1], model_names[k]);
            if (!recall) return cmd_dialogue_chat(argc, argv);
        }
    const char *cmd = "kvlab dialogue";
    const char *model = "both", *cache = "fp32", *device = "cpu";
    int recompute = 0;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_cli_engine en = {NULL, NULL};
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "M", "recall model: direct, induction or both (default both); a GGUF chat model (smollm2, FILE.gguf) runs chat scripts instead: kvlab dialogue --model smollm2 FILE.chat --help", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "SPEC", "cache variant (default fp32; or a storage format: fp16 int8 fp8 int4 int2 ..., chapter 04)", 0},
        {"--recompute", KV_OPT_FLAG, &recompute, 0, 0, NULL, NULL, "also run each turn's whole history from scratch and compare", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        KV_CLI_ENGINE_OPTS(en),
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_THREADS_OPT(threads),
    };
    /* the file is the one positional word: take it out before parsing the options */
    const char *file = NULL;
    char *rest[64];
    int nrest = 0, nfile = 0;
    if (kv_args_positional(cmd, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), &file, 1,
                           &nfile, rest, 64, &nrest))
        return KV_EXIT_USAGE;
    int r = kv_args_parse(cmd,
                          "usage: kvlab dialogue FILE [options]\n"
                          "Run a dialogue file (datasets/dialogues/*.dlg) turn by turn on the recall\n"
                          "models: each turn is prefilled onto the cache the earlier turns left, and\n"
                          "the one-token reply is decoded and checked (the fact's value for a\n"
                          "question, 'ok' otherwise). Exit 1 when a turn fails.",
                          nrest, rest, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    int known = 0;
    for (int i = 0; model_names[i]; i++) known |= !strcmp(model, model_names[i]);
    if (!known) /* not reached: another --model runs the chat scripts */
        return kv_args_bad(cmd, "--model", "'%s': not a recall model", model);
    if (!file) return kv_args_bad(cmd, "FILE", "a dialogue file is required (datasets/dialogues/*.dlg)");
    int e = kv_cli_layout_check(cmd, &lo);
    if (e) return e;
    e = kv_cli_check_device(cmd, device);
    if (!e) e = kv_cli_engine_check(cmd, device, &en);
    if (!e && kv_cli_engine_storage(device, &en) != KV_WEIGHTS_F32)
        e = kv_args_bad(cmd, "--weights", "%s keeps a GGUF model's blocks; the recall models "
                        "are fp32 (f32 only)", en.weights);
    if (e) return e;
    kv_err err = {{0}};
    kv_cache_spec cs;
    if (kv_needle_cache_spec(cache, 2, 16, &cs, &err))
        return kv_cli_fail(cmd, "--cache", KV_ERR_UNSUPPORTED, &err);
    kv_dialogue d;
    int st = kv_dialogue_read(file, &d, &err);
    if (st) return kv_cli_fail(cmd, file, st, &err);
    int failed = 0, rc = KV_EXIT_OK;
    for (int k = 0; k < 2 && rc == KV_EXIT_OK; k++) {
        const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
        if (strcmp(model, "both") && kv_recall_kind_parse(model) != kind) continue;
        rc = run_one(cmd, &d, kind, cache, &lo, device, &en, recompute, &failed);
    }
    kv_dialogue_free(&d);
    if (rc == KV_EXIT_OK && failed) rc = KV_EXIT_FAIL;
    return rc;
}
