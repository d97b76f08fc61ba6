/*
 * kvlab chat: a conversation with a GGUF model (its chat template, kv_chat.h), typed at a
 * terminal or read from a script, with the KV cache kept across turns: each turn prefills
 * only its own new tokens on top of what the cache holds. After each reply a line on stderr
 * says how many tokens the cache gave back and how many were new, the cache's bytes, and the
 * prefill and decode speeds.
 *
 * Script (--script FILE, or stdin when it is not a terminal): one user message per line;
 * a line holding only """ opens a message of several lines, closed by the next such line;
 * lines starting with # and empty lines are skipped; /reset and /stats are commands, as typed.
 */
#define _POSIX_C_SOURCE 200809L /* getline, isatty, fileno */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kv_chat.h"
#include "kv_needle.h"
#include "model_load.h"

/* what the reply's tokens are printed with, and the running totals of /stats */
typedef struct {
    const kv_cli_model *mdl;
    int end_id;
    long turns, reused, fed, replied;
    double prefill_s, decode_s;
    int decode_steps;
} chat_out;

static void on_token(void *user, int token)
{
    const chat_out *o = user;
    if (token == o->end_id) return;
    char piece[256];
    const int n = kv_cli_piece(o->mdl, -1, token, piece, sizeof piece);
    if (n > 0) fwrite(piece, 1, (size_t)n, stdout);
    fflush(stdout);
}

/* the cache's bytes for @p n positions: rows kept (a window keeps S + W) x L x 2 x H_kv x d x b */
static double cache_bytes(const kv_backend *b, int n)
{
    const kv_config *c = b->config;
    const int d = kv_config_head_dim(c);
    int rows = n;
    if (b->spec.window.size > 0 && rows > b->spec.window.size + b->spec.window.n_sinks)
        rows = b->spec.window.size + b->spec.window.n_sinks;
    return (double)rows * c->n_layers * 2 * c->n_kv_heads * d *
           kv_cache_spec_bytes_per_element(&b->spec, c->n_layers, d);
}

static void print_stats(const kv_chat *c, const chat_out *o)
{
    char a[32], b[32];
    fprintf(stderr, "[stats: %ld turn%s, %d tokens in the cache (%s of %s for %d), %ld reused "
            "and %ld new over the turns (recomputing every turn would have prefilled %ld), %ld "
            "reply tokens; prefill %.1f tok/s, decode %.1f tok/s]\n", o->turns,
            o->turns == 1 ? "" : "s", c->n_cached,
            kv_fmt_bytes(cache_bytes(c->b, c->n_cached), a, sizeof a),
            kv_fmt_bytes(cache_bytes(c->b, c->cap), b, sizeof b), c->cap, o->reused, o->fed,
            o->reused + o->fed, o->replied, o->prefill_s > 0 ? o->fed / o->prefill_s : 0.0,
            o->decode_s > 0 ? o->decode_steps / o->decode_s : 0.0);
}

/* The next message from @p in into *msg (getline's buffer): 1 a message or a command, 0 at
 * the end. A """ line opens a block of lines, up to the next """ line. */
static int next_message(FILE *in, int prompt, char **msg, size_t *cap, char **line,
                        size_t *line_cap)
{
    for (;;) {
        if (prompt) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        ssize_t n = getline(line, line_cap, in);
        if (n < 0) return 0;
        while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r')) (*line)[--n] = '\0';
        if (n == 0 || (!prompt && (*line)[0] == '#')) continue;
        size_t len = 0;
        if (strcmp(*line, "\"\"\"") != 0) {
            len = (size_t)n;
            if (len + 1 > *cap && !(*msg = realloc(*msg, *cap = len + 1))) return 0;
            memcpy(*msg, *line, len + 1);
            return 1;
        }
        while ((n = getline(line, line_cap, in)) >= 0) { /* a block: lines up to """ */
            if (!strcmp(*line, "\"\"\"\n") || !strcmp(*line, "\"\"\"")) break;
            if (len + (size_t)n + 1 > *cap && !(*msg = realloc(*msg, *cap = 2 * (len + (size_t)n + 1))))
                return 0;
            memcpy(*msg + len, *line, (size_t)n + 1);
            len += (size_t)n;
        }
        if (len && (*msg)[len - 1] == '\n') (*msg)[--len] = '\0'; /* the block's last newline */
        if (len) return 1;
    }
}

int cmd_chat(int argc, char **argv)
{
    const char *cmd = "kvlab chat";
    const char *model_path = NULL, *script = NULL, *system = NULL, *device = "cpu", *cache = "fp32";
    int max_tokens = 256, ctx = 2048, recompute = 0, print_ids = 0, threads = 0;
    double temperature = 0.0, top_p = 1.0;
    int64_t seed = 42;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_cli_engine en = {NULL, NULL};
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "a GGUF model with a chat template: a .gguf file, or smollm2 (tools/fetch-model.sh smollm2); required", 0},
        {"--script", KV_OPT_STRING, &script, 0, 0, NULL, "FILE", "read the user's messages from FILE (one a line; a \"\"\" line opens and closes a message of several lines; # comments) instead of the terminal", 0},
        {"--system", KV_OPT_TEXT, &system, 0, 0, NULL, "TEXT", "the system message (default: the template's own, if it has one)", 0},
        {"--max-tokens", KV_OPT_INT, &max_tokens, 1, 1 << 20, NULL, "N", "reply tokens at most per turn (default 256)", 0},
        {"--ctx", KV_OPT_INT, &ctx, 16, 1 << 24, NULL, "N", "tokens the cache holds: the whole conversation (default 2048, at most the model's context)", 0},
        KV_CLI_SAMPLER_OPTS(temperature, top_p, seed),
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "SPEC", "cache: fp32 (default), a storage format (int8, fp8-e4m3, int4, ... as kvlab generate), a chapter 06 window window/wN/sS, or a chapter 09 method (as kvlab needle --cache)", 0},
        {"--recompute", KV_OPT_FLAG, &recompute, 0, 0, NULL, NULL, "empty the cache before every turn and prefill the whole conversation again (chapter 01's way: the same replies with a lossless cache, for far more work)", 0},
        {"--ids", KV_OPT_FLAG, &print_ids, 0, 0, NULL, NULL, "after each reply, print its token ids on a line of their own (ids: ...)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        KV_CLI_ENGINE_OPTS(en),
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "A conversation with a GGUF model through its chat template (ChatML or\n"
                          "Llama 3). The KV cache is kept across turns: each turn prefills only its\n"
                          "own tokens on top of the cache. Typed at the terminal, or scripted\n"
                          "(--script FILE, or stdin when it is a pipe); /reset empties the cache and\n"
                          "the conversation, /stats prints the totals. Per reply, on stderr: tokens\n"
                          "reused from the cache and new, the cache's bytes, prefill and decode tok/s.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    if (!model_path) return kv_args_bad(cmd, "--model", "a GGUF model is required (--model smollm2 or FILE.gguf)");
    int e = kv_cli_layout_check(cmd, &lo);
    if (!e) e = kv_cli_check_device(cmd, device);
    if (!e) e = kv_cli_engine_check(cmd, device, &en);
    if (e) return e;
    FILE *in = stdin;
    if (script && !(in = fopen(script, "r"))) {
        perror(script);
        return KV_EXIT_USAGE;
    }
    const int interactive = !script && isatty(fileno(stdin));

    const kv_cli_model_args ma = {model_path, NULL, NULL, NULL, KV_CLI_TEXT_NEED, 0,
                                   kv_cli_engine_storage(device, &en)};
    kv_cli_model mdl;
    if ((e = kv_cli_model_load(cmd, &ma, &mdl))) {
        if (script) fclose(in);
        return e;
    }
    kv_err err = {{0}};
    kv_chat_template tpl;
    kv_backend *b = NULL;
    kv_sampler sampler;
    kv_chat chat = {0};
    int have_sampler = 0, rc = KV_EXIT_OK, st;
    char *msg = NULL, *line = NULL;
    int *reply = malloc((size_t)max_tokens * sizeof(int)); /* [max_tokens] this turn's ids */
    size_t msg_cap = 0, line_cap = 0;
    if (!reply) {
        rc = kv_cli_fail(cmd, "--max-tokens", kv_fail(&err, KV_ERR_NOMEM, "out of memory"), &err);
        goto done;
    }
    if (!mdl.vocab || !mdl.chat_template) {
        rc = kv_args_bad(cmd, "--model", "%s has no chat template: kvlab chat runs a GGUF model "
                         "whose file carries tokenizer.chat_template (a llama2.c or kvlab "
                         "checkpoint has none; `kvlab generate` runs it)", mdl.name);
        goto done;
    }
    if ((st = kv_chat_template_parse(mdl.chat_template, strlen(mdl.chat_template), mdl.vocab,
                                     &tpl, &err))) {
        rc = kv_cli_fail(cmd, mdl.name, st, &err);
        goto done;
    }
    if (ctx > mdl.m.config.seq_len) {
        fprintf(stderr, "%s: note: --ctx %d cut to the model's context, %d tokens\n", cmd, ctx,
                mdl.m.config.seq_len);
        ctx = mdl.m.config.seq_len;
    }
    kv_cache_spec spec;
    if ((st = kv_needle_cache_spec(cache, 1, ctx, &spec, &err))) {
        rc = kv_cli_fail(cmd, "--cache", st, &err);
        goto done;
    }
    kv_cli_layout_apply(&lo, &spec);
    if ((st = kv_cli_backend_engine(&b, device, &mdl.m, &spec, &en, &err)) ||
        (st = kv_sampler_init(&sampler, mdl.m.config.vocab_size, (float)temperature, (float)top_p,
                              (uint64_t)seed, &err))) {
        rc = kv_cli_fail(cmd, b ? "sampler" : "backend", st, &err);
        goto done;
    }
    have_sampler = 1;
    if ((st = kv_chat_init(&chat, b, &tpl, mdl.vocab, system, &err))) {
        rc = kv_cli_fail(cmd, "--system", st, &err);
        goto done;
    }
    chat.recompute = recompute;
    char lname[96], bytes[32];
    fprintf(stderr, "%s: %s, %s template%s%s%s; cache %s (%s), %d tokens (%s), device %s%s\n",
            cmd, mdl.name, kv_chat_format_name(tpl.format), chat.system[0] ? ", system: \"" : "",
            chat.system, chat.system[0] ? "\"" : "", cache,
            kv_cli_layout_name(&spec, lname, sizeof lname), ctx,
            kv_fmt_bytes(cache_bytes(b, ctx), bytes, sizeof bytes), b->name,
            recompute ? "; recomputing every turn" : "");
    if (interactive) fprintf(stderr, "(/reset, /stats; end with Ctrl-D)\n");

    chat_out o = {&mdl, tpl.msg_end, 0, 0, 0, 0, 0, 0, 0};
    int skipping = 0; /* after a full context, a script's messages up to its next /reset */
    while (next_message(in, interactive, &msg, &msg_cap, &line, &line_cap)) {
        if (!strcmp(msg, "/reset")) {
            kv_chat_reset(&chat);
            skipping = 0;
            fprintf(stderr, "[reset: the cache and the conversation are empty]\n");
            continue;
        }
        if (!strcmp(msg, "/stats")) {
            print_stats(&chat, &o);
            continue;
        }
        if (skipping) continue;
        if (!interactive) printf("> %s\n", msg);
        fflush(stdout); /* the message before anything on stderr about it */
        kv_chat_stats ts;
        st = kv_chat_turn(&chat, msg, strlen(msg), max_tokens, &sampler, on_token, &o, reply, &ts,
                          &err);
        if (st == KV_ERR_CAPACITY) { /* said, and the conversation is as it was */
            fprintf(stderr, "%s: %s\n", cmd, err.msg);
            skipping = !interactive;
            continue;
        }
        if (st) {
            rc = kv_cli_fail(cmd, "turn", st, &err);
            goto done;
        }
        printf("\n");
        if (print_ids) {
            printf("ids:");
            for (int i = 0; i < ts.n_reply; i++) printf(" %d", reply[i]);
            printf("\n");
        }
        fflush(stdout); /* the reply's line before the stats line on stderr */
        o.turns++, o.reused += ts.reused, o.fed += ts.fed, o.replied += ts.n_reply;
        o.prefill_s += ts.prefill_s, o.decode_s += ts.decode_s, o.decode_steps += ts.decode_steps;
        fprintf(stderr, "[turn %ld: %d tokens reused from the cache, %d new; reply %d tokens (%s); "
                "cache %d tokens = %s; prefill %.1f tok/s, decode %.1f tok/s]\n", o.turns,
                ts.reused, ts.fed, ts.n_reply, ts.end == KV_CHAT_END_TURN ? "end of turn"
                : ts.end == KV_CHAT_MAX_TOKENS ? "--max-tokens" : "the context is full",
                ts.cached, kv_fmt_bytes(cache_bytes(b, ts.cached), bytes, sizeof bytes),
                ts.fed / (ts.prefill_s > 0 ? ts.prefill_s : 1e-9),
                ts.decode_steps / (ts.decode_s > 0 ? ts.decode_s : 1e-9));
        if (ts.end == KV_CHAT_CONTEXT_FULL) {
            fprintf(stderr, "%s: the context is full (%d tokens): /reset starts again\n", cmd, ctx);
            skipping = !interactive;
        }
    }
done:
    free(msg);
    free(line);
    free(reply);
    kv_chat_free(&chat);
    if (have_sampler) kv_sampler_free(&sampler);
    kv_backend_destroy(b);
    kv_cli_model_close(&mdl);
    if (script) fclose(in);
    return rc;
}
