/*
 * kvlab dialogue --model M FILE.chat ...: a chat model's multi-turn memory
 * (reference_cpu/eval/kv_chat_dialogue.h). Each scripted conversation runs through kv_chat with
 * the cache kept across turns, under each cache of --caches; each ask's reply is checked for
 * its fact's value, and the recall is tabled by the distance (in turns) between the fact and
 * the ask, the first cache (fp32: lossless) beside every other. With --layout paged
 * --prefix-cache the conversations share the blocks of their common opening (the system
 * message): the first turns' hit rate is printed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_sets.h"
#include "cli.h"
#include "csv.h"
#include "kv_chat_dialogue.h"
#include "kv_file.h"
#include "kv_needle.h"
#include "model_load.h"

#define DC_MAX_FILES 32
#define DC_MAX_DIST 64 /* distances tabled: 1 .. DC_MAX_DIST-1 turns */

typedef struct {
    int pass[DC_MAX_DIST], asked[DC_MAX_DIST]; /* by distance in turns */
    long hit, first;                          /* prefix-cache tokens adopted / first turns' */
} dc_tally;

typedef struct {
    kv_progress p;
    long total;
} dc_progress;

static void on_turn(void *user, int turn)
{
    dc_progress *dp = user;
    kv_progress_update(&dp->p, turn + 1, dp->total);
}

/* one cache over every script: tallies, rows of the CSV, a line per script */
static int run_cache(const char *cmd, kv_cli_model *mdl, const kv_chat_template *tpl,
                     const char *spec_s, const kv_cli_layout *lo, const char *device,
                     const kv_cli_engine *en, int prefix, int ctx, int recompute, int max_reply,
                     int max_answer, kv_chat_script *scripts, int n_scripts, FILE *csv,
                     dc_tally *tl)
{
    kv_err err = {{0}};
    kv_cache_spec spec;
    kv_backend *b = NULL;
    kv_chat chat = {0};
    int st = kv_needle_cache_spec(spec_s, 1, ctx, &spec, &err);
    if (!st) kv_cli_layout_apply(lo, &spec);
    if (!st) st = kv_cli_backend_engine(&b, device, &mdl->m, &spec, en, &err);
    if (!st && prefix) st = kv_backend_enable_prefix_cache(b, &err);
    if (!st) st = kv_chat_init(&chat, b, tpl, mdl->vocab, NULL, &err);
    if (st) {
        kv_backend_destroy(b);
        return kv_cli_fail(cmd, spec_s, st, &err);
    }
    chat.recompute = recompute;
    printf("\ncache %s\n", spec_s);
    int rc = KV_EXIT_OK;
    for (int i = 0; i < n_scripts && !rc; i++) {
        const kv_chat_script *s = &scripts[i];
        kv_cd_result *res = calloc((size_t)s->n_turns, sizeof *res);
        dc_progress dp = {.total = s->n_turns};
        kv_progress_start(&dp.p, "turns");
        const double t0 = kv_now();
        st = res ? kv_chat_script_run(&chat, s, max_reply, max_answer, on_turn, &dp, res, &err)
                 : kv_fail(&err, KV_ERR_NOMEM, "out of memory");
        kv_progress_end(&dp.p);
        if (st) {
            rc = kv_cli_fail(cmd, spec_s, st, &err);
            free(res);
            break;
        }
        int pass = 0, asked = 0;
        for (int t = 0; t < s->n_turns; t++) {
            const kv_cd_result *r = &res[t];
            if (r->ask < 0) continue;
            asked++;
            pass += r->pass;
            if (r->distance > 0 && r->distance < DC_MAX_DIST) {
                tl->pass[r->distance] += r->pass;
                tl->asked[r->distance]++;
            }
            if (csv)
                kv_csv_printf(csv, "%s,%s,%s,%d,%s,%s,%d,%d,%s,%d\n", mdl->name, spec_s,
                              s->name, t + 1, s->facts[r->ask].name, s->facts[r->ask].value,
                              r->distance, r->distance_tokens, r->text, r->pass);
        }
        tl->hit += res[0].prefix_hit;
        tl->first += res[0].prefix_hit + res[0].fed;
        printf("  %-44s %2d turns, %5d tokens, %d of %d facts recalled (%.1f s)\n", s->name,
               s->n_turns, chat.n_ids, pass, asked, kv_now() - t0);
        free(res);
    }
    kv_chat_free(&chat);
    kv_backend_destroy(b);
    return rc;
}

/* recall by distance: a row per cache, a column per distance that was asked */
static void print_table(char (*specs)[KV_CLI_SPEC_MAX], int n_var, const dc_tally *tl, int prefix)
{
    int w = 10;
    for (int v = 0; v < n_var; v++) w = (int)strlen(specs[v]) > w ? (int)strlen(specs[v]) : w;
    w = w > 40 ? 40 : w;
    printf("\nrecall by distance (turns from the fact to its ask; facts recalled / asked)\n%-*s", w,
           "cache");
    for (int d = 1; d < DC_MAX_DIST; d++)
        if (tl[0].asked[d]) printf(" %7d", d);
    printf(" %7s%s\n", "all", prefix ? "  prefix-cache hits (first turns)" : "");
    for (int v = 0; v < n_var; v++) {
        printf("%-*.*s", w, w, specs[v]);
        int p = 0, a = 0;
        for (int d = 1; d < DC_MAX_DIST; d++) {
            if (!tl[0].asked[d]) continue;
            char cell[24];
            snprintf(cell, sizeof cell, "%d/%d", tl[v].pass[d], tl[v].asked[d]);
            printf(" %7s", cell);
            p += tl[v].pass[d];
            a += tl[v].asked[d];
        }
        char cell[24];
        snprintf(cell, sizeof cell, "%d/%d", p, a);
        printf(" %7s", cell);
        if (prefix)
            printf("  %ld of %ld tokens (%.0f %%)", tl[v].hit, tl[v].first,
                   tl[v].first ? 100.0 * tl[v].hit / tl[v].first : 0.0);
        printf("\n");
    }
}

int cmd_dialogue_chat(int argc, char **argv)
{
    const char *cmd = "kvlab dialogue";
    const char *model = NULL, *caches = "fp32", *csv_path = NULL, *device = "cpu";
    int max_reply = 32, max_answer = 12, ctx = 4096, recompute = 0, prefix = 0, threads = 0;
    kv_cli_layout lo = {"contiguous", 0, 0};
    kv_cli_engine en = {NULL, NULL};
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "M", "a GGUF chat model: smollm2 (tools/fetch-model.sh smollm2) or a .gguf file", 0},
        {"--caches", KV_OPT_STRING, &caches, 0, 0, NULL, "LIST", "caches, one after the other on the same scripts: specs separated by spaces or ';', or a chapter's set ch04, ch06, ch09 (default fp32; put the lossless fp32 first: the table reads every row against the first)", 0},
        {"--max-reply", KV_OPT_INT, &max_reply, 1, KV_CD_REPLY, NULL, "N", "reply tokens at most for a turn that asks nothing (default 32)", 0},
        {"--max-answer", KV_OPT_INT, &max_answer, 1, KV_CD_REPLY, NULL, "N", "reply tokens at most after an ask's opening words (default 12)", 0},
        {"--ctx", KV_OPT_INT, &ctx, 64, 1 << 20, NULL, "N", "tokens the cache holds: the longest conversation (default 4096, at most the model's context)", 0},
        {"--recompute", KV_OPT_FLAG, &recompute, 0, 0, NULL, NULL, "empty the cache before every turn and prefill the whole conversation again (the same replies with a lossless cache)", 0},
        {"--prefix-cache", KV_OPT_FLAG, &prefix, 0, 0, NULL, NULL, "with --layout paged: the conversations share the cached blocks of their common opening; print the first turns' hit rate", 0},
        {"--csv", KV_OPT_STRING, &csv_path, 0, 0, NULL, "FILE", "one row per ask: cache, script, turn, fact, value, distance in turns and tokens, reply, pass (- : standard output, the table then on standard error)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model runs (default cpu)", 0},
        KV_CLI_ENGINE_OPTS(en),
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_THREADS_OPT(threads),
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    const char *files[DC_MAX_FILES + 1]; /* one more: "more than DC_MAX_FILES" */
    char *rest[64];
    int n_files = 0, nrest = 0;
    if (kv_args_positional(cmd, argc, argv, opts, n_opts, files, DC_MAX_FILES + 1, &n_files,
                           rest, 64, &nrest))
        return KV_EXIT_USAGE;
    if (n_files > DC_MAX_FILES)
        return kv_args_bad(cmd, files[DC_MAX_FILES], "more than %d scripts", DC_MAX_FILES);
    int r = kv_args_parse(cmd,
                          "usage: kvlab dialogue --model M FILE.chat ... [options]\n"
                          "A chat model's multi-turn memory: scripted conversations\n"
                          "(datasets/chat-dialogues/*.chat) in which facts are stated, then asked\n"
                          "for turns later, the reply started with given words; an ask passes when\n"
                          "the fact's value appears in the reply. The cache is kept across turns\n"
                          "(kvlab chat's path), under each cache of --caches; the recall is tabled\n"
                          "by distance in turns. (Without --model, or with the recall models\n"
                          "direct, induction, both: the .dlg files, kvlab dialogue FILE.dlg.)",
                          nrest, rest, opts, n_opts);
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    if (!n_files) return kv_args_bad(cmd, "FILE", "a script is required (datasets/chat-dialogues/*.chat)");
    for (int i = 0; i < n_files; i++) {
        const size_t n = strlen(files[i]);
        if (n >= 4 && !strcmp(files[i] + n - 4, ".dlg")) /* before the model is loaded */
            return kv_args_bad(cmd, "--model", "'%s' is a .dlg file: it runs on the recall models "
                               "(--model direct, induction or both), whose right answers are "
                               "known by construction; a chat model (%s) runs .chat scripts "
                               "(datasets/chat-dialogues/), or talks with kvlab chat", files[i],
                               model ? model : "?");
    }
    int e = kv_cli_layout_check(cmd, &lo);
    if (!e) e = kv_cli_check_device(cmd, device);
    if (!e) e = kv_cli_engine_check(cmd, device, &en);
    if (!e && prefix && strcmp(lo.layout, "paged"))
        e = kv_args_bad(cmd, "--prefix-cache", "shares blocks: it needs --layout paged");
    if (!e) e = kv_cli_outputs_check(cmd, (const kv_cli_output[]){{"--csv", csv_path}}, 1);
    if (e) return e;
    kv_chat_script scripts[DC_MAX_FILES];
    kv_err err = {{0}};
    int n_scripts = 0, st = KV_OK;
    for (; n_scripts < n_files && !st; n_scripts++)
        if ((st = kv_chat_script_read(files[n_scripts], &scripts[n_scripts], &err))) break;
    if (st) {
        for (int i = 0; i < n_scripts; i++) kv_chat_script_free(&scripts[i]);
        return kv_cli_fail(cmd, files[n_scripts], st, &err);
    }
    const kv_cli_model_args ma = {model, NULL, NULL, NULL, KV_CLI_TEXT_NEED, 0};
    kv_cli_model mdl;
    int rc = kv_cli_model_load(cmd, &ma, &mdl);
    if (rc) goto out;
    static char specs[KV_CLI_SETS_MAX][KV_CLI_SPEC_MAX];
    int n_var = 0;
    kv_chat_template tpl;
    FILE *csv = NULL;
    kv_file_out o;
    dc_tally *tl = NULL;
    if (ctx > mdl.m.config.seq_len) ctx = mdl.m.config.seq_len;
    if ((rc = kv_cli_cache_list(cmd, "--caches", caches, mdl.m.config.n_layers, ctx, specs,
                                KV_CLI_SETS_MAX, &n_var)))
        goto close;
    for (int v = 0; v < n_var && !rc; v++) { /* every spec checked before the first run */
        kv_cache_spec spec;
        if ((st = kv_needle_cache_spec(specs[v], 1, ctx, &spec, &err)))
            rc = kv_cli_fail(cmd, "--caches", st, &err);
    }
    if (rc) goto close;
    if (!mdl.vocab || !mdl.chat_template) {
        rc = kv_args_bad(cmd, "--model", "%s has no chat template (tokenizer.chat_template): "
                         "the scripts are conversations", mdl.name);
        goto close;
    }
    if ((st = kv_chat_template_parse(mdl.chat_template, strlen(mdl.chat_template), mdl.vocab,
                                     &tpl, &err))) {
        rc = kv_cli_fail(cmd, mdl.name, st, &err);
        goto close;
    }
    tl = calloc((size_t)n_var, sizeof *tl);
    if (!tl) {
        rc = kv_cli_fail(cmd, "tally", kv_fail(&err, KV_ERR_NOMEM, "out of memory"), &err);
        goto close;
    }
    const int csv_stdout = csv_path && kv_cli_csv_stdout() != NULL; /* --csv -: the real stdout */
    if (csv_path) {
        if (csv_stdout) {
            csv = kv_cli_csv_stdout();
        } else if ((st = kv_file_create(csv_path, &o, &err))) {
            rc = kv_cli_write_fail(cmd, "--csv", &err);
            goto close;
        } else {
            csv = o.f;
        }
        kv_csv_printf(csv, "model,cache,script,turn,fact,value,distance,distance_tokens,reply,"
                           "pass\n");
    }
    printf("kvlab dialogue: model %s, %d script%s, %d cache%s (%s%s), device %s, greedy replies "
           "of at most %d tokens (asks: %d after the opening)\n", mdl.name, n_scripts,
           n_scripts == 1 ? "" : "s", n_var, n_var == 1 ? "" : "s", lo.layout,
           prefix ? ", prefix caching" : "", device, max_reply, max_answer);
    for (int v = 0; v < n_var && !rc; v++)
        rc = run_cache(cmd, &mdl, &tpl, specs[v], &lo, device, &en, prefix, ctx, recompute,
                       max_reply, max_answer, scripts, n_scripts, csv, &tl[v]);
    if (!rc) print_table(specs, n_var, tl, prefix);
    if (csv && csv_stdout) {
        fflush(csv);
    } else if (csv) {
        if (rc) kv_file_abort(&o);
        else if ((st = kv_file_commit(&o, &err))) rc = kv_cli_write_fail(cmd, "--csv", &err);
    }
close:
    free(tl);
    kv_cli_model_close(&mdl);
out:
    for (int i = 0; i < n_scripts; i++) kv_chat_script_free(&scripts[i]);
    return rc;
}
