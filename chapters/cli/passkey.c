/*
 * kvlab passkey: the pass-key test on a real model (reference_cpu/eval/kv_passkey.h): a grid of
 * prompt lengths x depths, several keys a cell, under one cache or a list of them (--caches,
 * cache_sets.h: the same prompts for every variant), greedy answers checked exactly; a table
 * per variant, a summary, CSV and an SVG heatmap (passkey_out.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "csv.h"
#include "kv_chat.h"
#include "cache_sets.h"
#include "kv_file.h"
#include "kv_needle.h"
#include "kv_passkey.h"
#include "kv_probe.h"
#include "kv_quant.h"
#include "model_load.h"
#include "passkey_out.h"

#define PK_MAX_LIST 16
#define PK_MAX_TEXT (64 << 20) /* a haystack file larger than 64 MiB is refused */

/* the CLI's text codec as the eval layer's callbacks */
static int codec_encode(void *ctx, const char *text, int **ids, int *n, kv_err *err)
{
    return kv_cli_encode(ctx, text, 0, ids, n, err);
}
static int codec_piece(void *ctx, int prev, int id, char *buf, int cap)
{
    return kv_cli_piece(ctx, prev, id, buf, cap);
}

/* The test inside the model's chat template (the default; --plain: a completion). pre = the
 * system message (the template's default) and the user message up to its content; post = the
 * user message's end, the assistant's header and "The pass key is" (so the reply continues
 * with the key). The user message's end is found by rendering it empty: its content sits right
 * before its end-of-turn token, in ChatML and in Llama 3. */
typedef struct {
    int pre[256], n_pre, post[256], n_post;
} pk_frame_ids;

static int chat_frame(const kv_cli_model *mdl, pk_frame_ids *f, kv_err *err)
{
    if (!mdl->vocab || !mdl->chat_template)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "the chat frame needs a model with a chat template "
                       "(a GGUF file carrying tokenizer.chat_template)");
    kv_chat_template t;
    int rc = kv_chat_template_parse(mdl->chat_template, strlen(mdl->chat_template), mdl->vocab,
                                    &t, err);
    f->n_pre = f->n_post = 0;
    int first = 1;
    if (!rc && t.default_system[0]) {
        rc = kv_chat_render_message(&t, mdl->vocab, 1, "system", t.default_system,
                                    strlen(t.default_system), f->pre, 256, &f->n_pre, err);
        first = 0;
    }
    int user[64], nu = 0;
    if (!rc) rc = kv_chat_render_message(&t, mdl->vocab, first, "user", "", 0, user, 64, &nu, err);
    if (rc) return rc;
    int end = nu - 1; /* the last end-of-turn token: the content goes before it */
    while (end >= 0 && user[end] != t.msg_end) end--;
    if (end < 0 || f->n_pre + end > 256 || nu - end > 256)
        return kv_fail(err, KV_ERR_FORMAT, "the template's user message has no "
                       "end-of-turn token");
    memcpy(f->pre + f->n_pre, user, (size_t)end * sizeof(int));
    f->n_pre += end;
    memcpy(f->post, user + end, (size_t)(nu - end) * sizeof(int));
    f->n_post = nu - end;
    rc = kv_chat_render_reply_start(&t, mdl->vocab, f->post, 256, &f->n_post, err);
    int *ids = NULL, n = 0;
    if (!rc) rc = kv_cli_encode(mdl, "The pass key is", 0, &ids, &n, err);
    if (!rc && f->n_post + n > 256) rc = kv_fail(err, KV_ERR_FORMAT, "the chat frame is too long");
    if (!rc) {
        memcpy(f->post + f->n_post, ids, (size_t)n * sizeof(int));
        f->n_post += n;
    }
    free(ids);
    return rc;
}

/* The grid under one variant: cells [n_len][n_dep][keys] of @p out; the keys are the grid's,
 * the same for every variant. 0, or the exit code after a message. */
static int run_variant(const char *cmd, kv_backend *b, const kv_text_codec *tc,
                       const kv_passkey_frame *frame, const kv_passkey_hay *hay,
                       const int *lengths, int n_len, const int *depths, int n_dep, int keys,
                       int64_t seed, kv_probe_kivi *kivi, kv_progress *p, long *done,
                       long total, pk_cell *out)
{
    kv_err err = {{0}};
    int n = 0;
    for (int li = 0; li < n_len; li++)
        for (int di = 0; di < n_dep; di++)
            for (int k = 0; k < keys; k++, n++) {
                pk_cell *c = &out[n];
                c->length = lengths[li];
                c->depth_pct = depths[di];
                const int st = kv_passkey_run_hooked(
                    b, tc, frame, hay, lengths[li], depths[di] / 100.0,
                    kv_passkey_key((uint64_t)seed, n), kivi ? kv_probe_kivi_step : NULL, kivi,
                    &c->r, &err);
                if (st) {
                    kv_progress_end(p);
                    return kv_cli_fail(cmd, "pass-key prompt", st, &err);
                }
                kv_progress_update(p, ++*done, total);
            }
    return KV_EXIT_OK;
}

static const char *const kivi_keys[] = {"off", "channel", "token", NULL};

/* --kivi-keys and its options: KIVI emulated on one fp32 cache of the CPU (kv_probe.h), as
 * eval ppl --kivi-keys; the options that only the emulation reads are refused without it. */
static int kivi_check(const char *cmd, const kv_opt *opts, int n_opts, int emulate, int bits,
                      int window, const char *cache, const char *caches, const char *device,
                      const kv_cli_layout *lo)
{
    if (bits == 3) return kv_args_bad(cmd, "--kivi-bits", "2 or 4");
    if (window % KV_KIVI_GROUP)
        return kv_args_bad(cmd, "--kivi-window", "%d: a multiple of %d", window, KV_KIVI_GROUP);
    if (!emulate && kv_args_given(opts, n_opts, "--kivi-bits"))
        return kv_args_bad(cmd, "--kivi-bits", "needs --kivi-keys channel|token");
    if (!emulate && kv_args_given(opts, n_opts, "--kivi-window"))
        return kv_args_bad(cmd, "--kivi-window", "needs --kivi-keys channel|token");
    if (emulate && (caches || strcmp(cache, "fp32") != 0 || strcmp(device, "cpu") != 0 ||
                    strcmp(lo->layout, "contiguous") != 0))
        return kv_args_bad(cmd, "--kivi-keys", "emulates on one fp32 contiguous cache of the "
                           "CPU: --cache fp32, no --caches, --device or --layout");
    return KV_EXIT_OK;
}

int cmd_passkey(int argc, char **argv)
{
    const char *cmd = "kvlab passkey";
    const char *model = "smollm2", *lengths_s = "1024", *depths_s = "0,25,50,75,100";
    const char *hay_s = "filler", *cache = "fp32", *caches = NULL, *csv = NULL, *svg = NULL;
    const char *device = "cpu", *kivi_s = "off";
    int keys = 3, threads = 0, plain = 0, kv_heads = 0, kivi_bits = 2, kivi_window = 128;
    int64_t seed = 1;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_cli_engine en = {NULL, NULL};
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "M", "a GGUF file, smollm2 (default: SmolLM2-135M-Instruct, tools/fetch-model.sh smollm2) or trained", 0},
        {"--lengths", KV_OPT_STRING, &lengths_s, 0, 0, NULL, "LIST", "prompt lengths in tokens, comma-separated (default 1024)", 0},
        {"--depths", KV_OPT_STRING, &depths_s, 0, 0, NULL, "LIST", "needle depths in percent of the haystack (default 0,25,50,75,100)", 0},
        {"--keys", KV_OPT_INT, &keys, 1, 100, NULL, "K", "keys asked per cell, each a fresh five-digit number (default 3)", 0},
        {"--seed", KV_OPT_I64, &seed, 0, 9.0e15, NULL, "S", "seed of the keys (default 1)", 0},
        {"--haystack", KV_OPT_STRING, &hay_s, 0, 0, NULL, "H", "filler (default: the classic repeated sentences) or a text FILE, from its start (e.g. datasets/models/kjv-heldout.txt, the King James Version)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "SPEC", "the cache, as generate --cache / needle's specs: fp32 (default), fp16, int8, int4, window/w256/s4, h2o/b64/w16, ...", 0},
        {"--caches", KV_OPT_STRING, &caches, 0, 0, NULL, "LIST", "several caches, one after the other on the same prompts: specs separated by spaces or ';', or a chapter's set: ch04 (every format, KIVI, selective layers both ways), ch06 (windows with and without 4 sinks), ch09 (every selector at 10/25/50 %)", 0},
        {"--plain", KV_OPT_FLAG, &plain, 0, 0, NULL, NULL, "a plain completion; default: inside the model's chat template when it has one (system message, user turn, the reply started with \"The pass key is\")", 0},
        {"--csv", KV_OPT_STRING, &csv, 0, 0, NULL, "FILE", "also write one row per prompt (the cache and the answer included) to FILE (- : standard output, the tables then on standard error)", 0},
        {"--svg", KV_OPT_STRING, &svg, 0, 0, NULL, "FILE", "write a heatmap (SVG): a panel per length, a row per cache, a column per depth", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        {"--kv-heads", KV_OPT_INT, &kv_heads, 1, 1 << 16, NULL, "N", "run the model with its KV heads mean-pooled (fewer; 1 = MQA) or copied (more, exact) to N, as eval ppl --kv-heads (chapter 03)", 0},
        {"--kivi-keys", KV_OPT_CHOICE, &kivi_s, 0, 0, kivi_keys, "G", "emulate KIVI on the fp32 cache (--cache fp32, the CPU), keys grouped per channel or per token (KIVI's ablation), as eval ppl --kivi-keys", 0},
        {"--kivi-bits", KV_OPT_INT, &kivi_bits, 2, 4, NULL, "B", "with --kivi-keys: 2 (default) or 4", 0},
        {"--kivi-window", KV_OPT_INT, &kivi_window, 32, 1 << 20, NULL, "R", "with --kivi-keys: fp32 window of the newest R tokens, a multiple of 32 (default 128)", 0},
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_ENGINE_OPTS(en),
        KV_CLI_THREADS_OPT(threads),
    };
    int e, r = kv_args_parse(cmd,
                          "The pass-key test on a trained model: a five-digit key hidden at a depth\n"
                          "of a long haystack, then asked for; a cell passes when the greedy answer\n"
                          "starts with the key's digits. A grid of lengths x depths under one cache,\n"
                          "or under each of a list (--caches ch04: the same prompts for every\n"
                          "variant; read each against the fp32 row: a 135M model also misses on its\n"
                          "own). reference_cpu/eval/kv_passkey.h has the prompt.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    if (caches && kv_args_given(opts, n_opts, "--cache"))
        return kv_args_bad(cmd, "--caches", "give --cache or --caches, not both");
    const int emulate = strcmp(kivi_s, "off") != 0;
    if ((e = kivi_check(cmd, opts, n_opts, emulate, kivi_bits, kivi_window, cache, caches,
                        device, &lo)))
        return e;
    int lengths[PK_MAX_LIST], depths[PK_MAX_LIST], n_len = 0, n_dep = 0;
    if ((e = kv_args_int_list(cmd, "--lengths", lengths_s, lengths, PK_MAX_LIST, &n_len, 16,
                              1 << 20)) ||
        (e = kv_args_int_list(cmd, "--depths", depths_s, depths, PK_MAX_LIST, &n_dep, 0, 100)))
        return e;
    if ((e = kv_cli_layout_check(cmd, &lo)) || (e = kv_cli_check_device(cmd, device)) ||
        (e = kv_cli_engine_check(cmd, device, &en)))
        return e;
    if ((e = kv_cli_outputs_check(cmd, (const kv_cli_output[]){{"--csv", csv}, {"--svg", svg}},
                                  2)))
        return e;
    int max_len = 0, min_len = 1 << 30;
    for (int i = 0; i < n_len; i++) {
        max_len = lengths[i] > max_len ? lengths[i] : max_len;
        min_len = lengths[i] < min_len ? lengths[i] : min_len;
    }
    kv_err err = {{0}};
    kv_cache_spec spec; /* checked before the model is loaded: a bad spec costs nothing */
    int st = caches ? KV_OK : kv_needle_cache_spec(cache, 1, max_len + 8, &spec, &err);
    if (st) return kv_cli_fail(cmd, "--cache", st, &err);

    kv_cli_model_args ma = {model, NULL, NULL, NULL, KV_CLI_TEXT_NEED, 0,
                            kv_cli_engine_storage(device, &en)};
    kv_cli_model mdl;
    if ((e = kv_cli_model_load(cmd, &ma, &mdl))) return e;
    kv_model conv = {0};
    const kv_model *vm = NULL; /* the model the variants run (--kv-heads) */
    kv_probe_kivi kivi;
    e = kv_cli_model_kv_heads(cmd, &mdl.m, kv_heads, &conv, &vm);
    if (!e && emulate &&
        (st = kv_probe_kivi_init(&kivi, kivi_bits == 4 ? KV_QF_INT4_KIVI : KV_QF_INT2_KIVI,
                                 strcmp(kivi_s, "token") == 0, kivi_window, &err)))
        e = kv_cli_fail(cmd, "--kivi-window", st, &err);
    static char specs[KV_CLI_SETS_MAX][KV_CLI_SPEC_MAX];
    int n_var = 1;
    if (!e && caches) { /* the named sets need the model's layer count */
        e = kv_cli_cache_list(cmd, "--caches", caches, mdl.m.config.n_layers, min_len, specs,
                              KV_CLI_SETS_MAX, &n_var);
        for (int v = 0; !e && v < n_var; v++)
            if ((st = kv_needle_cache_spec(specs[v], 1, max_len + 8, &spec, &err)))
                e = kv_cli_fail(cmd, "--caches", st, &err);
    } else {
        snprintf(specs[0], sizeof specs[0], "%s", cache);
    }
    if (!e && max_len + 8 > mdl.m.config.seq_len) {
        fprintf(stderr, "%s: --lengths: %d tokens and an 8-token answer exceed the model's "
                "context of %d\n", cmd, max_len, mdl.m.config.seq_len);
        e = KV_EXIT_USAGE;
    }
    if (e) {
        kv_model_free(&conv);
        kv_cli_model_close(&mdl);
        return e;
    }
    static char names[KV_CLI_SETS_MAX][KV_CLI_SPEC_MAX]; /* as the tables and the CSV say them */
    for (int v = 0; v < n_var; v++) {
        char head[32] = "";
        if (vm != &mdl.m) snprintf(head, sizeof head, "/kv%d", kv_heads);
        if (emulate)
            snprintf(names[v], KV_CLI_SPEC_MAX, "%s-emulated/keys-per-%s/w%d%s",
                     kv_quant_name(kivi.fmt), kivi_s, kivi_window, head);
        else
            snprintf(names[v], KV_CLI_SPEC_MAX, "%s%s", specs[v], head);
    }
    /* BOS only where the tokenizer asks for one (SmolLM2's file does not): what an empty
     * text encodes to with BOS on */
    int bos = -1, *bos_ids = NULL, n_bos = 0;
    kv_err berr = {{0}};
    if (kv_cli_encode(&mdl, "", 1, &bos_ids, &n_bos, &berr) == KV_OK && n_bos >= 1)
        bos = bos_ids[0];
    free(bos_ids);
    int stops[8];
    kv_text_codec tc = {&mdl, codec_encode, codec_piece, bos, stops, 0};
    tc.n_stop = kv_cli_stop_ids(&mdl, stops, 8);
    kv_passkey_hay hay = {0};
    pk_frame_ids fids;
    kv_passkey_frame frame = {fids.pre, 0, " What is the pass key?", fids.post, 0};
    const int per = n_len * n_dep * keys;
    pk_cell *cells = calloc((size_t)n_var * per, sizeof *cells);
    int rc = KV_EXIT_OK;
    if (!cells) {
        rc = kv_cli_fail(cmd, "grid", KV_ERR_NOMEM, &err);
        goto done;
    }
    const int chat = !plain && mdl.vocab && mdl.chat_template;
    if (chat) {
        if ((st = chat_frame(&mdl, &fids, &err))) {
            rc = kv_cli_fail(cmd, "chat template", st, &err);
            goto done;
        }
        frame.n_pre = fids.n_pre;
        frame.n_post = fids.n_post;
    }
    if (strcmp(hay_s, "filler") == 0) {
        st = kv_passkey_filler(&tc, &hay, &err);
    } else {
        char *text = NULL;
        size_t tn = 0;
        st = kv_file_read_text(hay_s, PK_MAX_TEXT, &text, &tn, &err);
        if (!st) st = kv_passkey_text(&tc, text, &hay, &err);
        free(text);
    }
    if (st) {
        rc = kv_cli_fail(cmd, "--haystack", st, &err);
        goto done;
    }
    printf("kvlab passkey: model %s, %d cache%s (%s), device %s, haystack %s, %s, %d key%s a "
           "cell, greedy answers of at most 8 tokens\n", mdl.name, n_var, n_var == 1 ? "" : "s",
           lo.layout, device, hay_s, chat ? "chat template" : "plain completion", keys,
           keys == 1 ? "" : "s");
    kv_progress p;
    kv_progress_start(&p, "pass-key prompts");
    const long total = (long)n_var * per;
    long done_n = 0;
    for (int v = 0; v < n_var && !rc; v++) {
        kv_backend *b = NULL;
        kv_needle_cache_spec(specs[v], 1, max_len + 8, &spec, &err); /* checked above */
        kv_cli_layout_apply(&lo, &spec);
        if ((st = kv_cli_backend_engine(&b, device, vm, &spec, &en, &err))) {
            kv_progress_end(&p);
            rc = kv_cli_fail(cmd, specs[v], st, &err);
            break;
        }
        rc = run_variant(cmd, b, &tc, chat ? &frame : NULL, &hay, lengths, n_len, depths, n_dep,
                         keys, seed, emulate ? &kivi : NULL, &p, &done_n, total,
                         cells + (size_t)v * per);
        kv_backend_destroy(b);
    }
    if (rc) goto done;
    kv_progress_end(&p);
    pk_grid g = {mdl.name, hay_s, lengths, n_len, depths, n_dep, keys, names, n_var, cells};
    for (int v = 0; v < n_var; v++) pk_print_grid(stdout, &g, v);
    if (n_var > 1) pk_print_summary(stdout, &g);
    if (csv && pk_write_file(cmd, "--csv", csv, pk_write_csv, &g)) rc = KV_EXIT_FAIL;
    if (svg && pk_write_file(cmd, "--svg", svg, pk_write_svg, &g)) rc = KV_EXIT_FAIL;
done:
    kv_passkey_hay_free(&hay);
    free(cells);
    kv_model_free(&conv);
    kv_cli_model_close(&mdl);
    return rc;
}
