/*
 * kvlab needle: the needle-in-a-haystack grid over the recall models (reference_cpu/eval/kv_needle.h):
 * context lengths × needle depths × cache variants. Progress on stderr, a table per model and
 * variant on stdout, optional CSV and an SVG heatmap. Exits 1 when any cell contradicts the
 * outcome its variant predicts.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_checkpoint.h"
#include "kv_needle.h"
#include "kv_file.h"

typedef struct {
    kv_progress p;
    char label[96];
} progress_state;

static void on_progress(void *user, const char *what, long done, long total)
{
    progress_state *s = user;
    if (strcmp(s->label, what)) snprintf(s->label, sizeof s->label, "%s", what);
    s->p.label = s->label;
    kv_progress_update(&s->p, done, total);
}

typedef struct {
    const char *device;
    const kv_cli_layout *layout;
} make_ctx;

/* Each variant's cache, laid out as --layout says. */
static int make_backend(kv_backend **out, const kv_model *m, const kv_cache_spec *spec, void *user,
                        kv_err *err)
{
    const make_ctx *mc = user;
    kv_cache_spec s = *spec;
    kv_cli_layout_apply(mc->layout, &s);
    return kv_cli_backend(out, mc->device, m, &s, err);
}

/* "1024,4096" -> "lengths 1024 4096\n" appended to the spec text */
/* printf onto the end of the spec text @p text [n]; -1 when it does not fit */
static int add_line(char *text, size_t n, const char *fmt, ...)
{
    const size_t k = strlen(text);
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(text + k, n - k, fmt, ap);
    va_end(ap);
    return w < 0 || (size_t)w >= n - k ? -1 : 0;
}

static const char *result_mark(const kv_needle_result *r)
{
    if (r->expected >= 0 && r->expected != r->pass) return r->pass ? "pass!" : "FAIL!";
    return r->pass ? "pass" : "FAIL";
}

/* One table per (model, variant, seed): rows are lengths, columns depths, each cell the
 * outcome and its logit margin; '!' marks a cell that contradicts its prediction. */
static void print_tables(const kv_needle_spec *s, const kv_needle_result *res)
{
    const int per = s->n_lengths * s->n_depths;
    for (int g = 0; g < s->n_models * s->n_variants * s->n_seeds; g++) {
        const kv_needle_result *r0 = res + (size_t)g * per;
        const kv_needle_variant *v = &s->variants[r0->variant];
        char pred[48];
        if (v->rule == KV_EXPECT_WITHIN)
            snprintf(pred, sizeof pred, "pass iff distance <= %ld", v->arg);
        else if (v->rule == KV_EXPECT_KEPT || v->rule == KV_EXPECT_ATLEAST)
            snprintf(pred, sizeof pred, "pass %s fact at < %ld or <= %ld back",
                     v->rule == KV_EXPECT_KEPT ? "iff" : "if", v->arg, v->arg2);
        else if (v->rule == KV_EXPECT_FROM)
            snprintf(pred, sizeof pred, "pass iff fact at >= %ld", v->arg);
        else if (v->rule == KV_EXPECT_PAGE_SPLIT)
            snprintf(pred, sizeof pred, "fail iff the fact straddles a page of %ld", v->arg);
        else
            snprintf(pred, sizeof pred, "%s", v->rule == KV_EXPECT_ALL    ? "every cell passes"
                                              : v->rule == KV_EXPECT_NONE ? "every cell fails"
                                                                          : "not asserted");
        printf("\nmodel %s, cache %s (predicted: %s), seed %llu; cell: answer, logit margin\n",
               kv_recall_kind_name(r0->kind), v->spec, pred, (unsigned long long)r0->seed);
        printf("%8s", "length");
        for (int d = 0; d < s->n_depths; d++) printf(" %12d%%", s->depths[d]);
        printf("\n");
        for (int l = 0; l < s->n_lengths; l++) {
            printf("%8d", s->lengths[l]);
            for (int d = 0; d < s->n_depths; d++) {
                const kv_needle_result *r = r0 + l * s->n_depths + d;
                printf(" %6s %+6.2f", result_mark(r), r->margin);
            }
            printf("\n");
        }
    }
}

static void write_csv(FILE *f, const kv_needle_spec *s, const kv_needle_result *res, int n)
{
    kv_csv_printf(f, "model,cache,seed,length,depth_pct,key,value,position,distance,answer,pass,"
                     "predicted,logit_value,logit_other,margin\n");
    for (int i = 0; i < n; i++) {
        const kv_needle_result *r = &res[i];
        kv_csv_printf(f, "%s,%s,%llu,%d,%d,%d,%d,%d,%ld,%d,%d,%d,%.6f,%.6f,%.6f\n",
                      kv_recall_kind_name(r->kind), s->variants[r->variant].spec,
                      (unsigned long long)r->seed, r->length, r->depth, r->key, r->value,
                      r->position, r->distance, r->answer, r->pass, r->expected, r->logit_value,
                      r->logit_other, r->margin);
    }
}

/* Pixels a text of n characters takes at a font size, wide enough for DejaVu Sans, the widest
 * common sans-serif face (0.62 em a character; test_docs_figures checks the result). */
static int text_px(size_t n, int size) { return (int)(n * size * 62 + 99) / 100; }

/* One cell: green passed (darker = larger margin), red failed; a black border marks a cell that
 * contradicts its prediction. */
static void write_cell(FILE *f, const kv_needle_result *r, int x, int y, int cw, int ch)
{
    double a = r->margin < 0 ? -r->margin : r->margin;
    a = 0.25 + 0.75 * (a > 5.0 ? 1.0 : a / 5.0);
    const int bad = r->expected >= 0 && r->expected != r->pass;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" "
               "fill-opacity=\"%.2f\" stroke=\"%s\" stroke-width=\"%d\"/>\n",
            x, y, cw - 2, ch - 2, r->pass ? "#1a9850" : "#d73027", a, bad ? "black" : "white",
            bad ? 2 : 1);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%+.2f</text>\n", x + cw / 2 - 1,
            y + ch / 2 + 3, r->margin);
}

/* A row of the one-length table: the model and the variant (and the seed, when there are two). */
static void row_label(char *buf, size_t cap, const kv_needle_spec *s, const kv_needle_result *r0)
{
    int at = snprintf(buf, cap, "%s, %s", kv_recall_kind_name(r0->kind), s->variants[r0->variant].spec);
    if (s->n_seeds > 1 && at > 0 && (size_t)at < cap)
        snprintf(buf + at, cap - (size_t)at, ", seed %llu", (unsigned long long)r0->seed);
}

/* The heatmap. A grid of one context length is one table: a row per (model, variant, seed),
 * a column per depth. Otherwise one panel per (model, variant, seed), rows the lengths. Every
 * width is taken from the longest text it holds, so no title or label leaves the frame. */
static void write_svg(FILE *f, const kv_needle_spec *s, const kv_needle_result *res, int n)
{
    (void)n; /* the grid's shape is the spec's */
    const int cw = 56, ch = 26, top = 40, gap = 50;
    const int panels = s->n_models * s->n_variants * s->n_seeds, per = s->n_lengths * s->n_depths;
    char title[256], label[160];
    if (s->n_lengths == 1) {
        int left = 0;
        for (int g = 0; g < panels; g++) {
            const kv_needle_result *r0 = res + (size_t)g * per;
            row_label(label, sizeof label, s, r0);
            const int w = text_px(strlen(label), 11) + 12;
            if (w > left) left = w;
        }
        snprintf(title, sizeof title, "needle: %d tokens (cell: logit margin)", s->lengths[0]);
        int pw = left + cw * s->n_depths + 12;
        if (pw < text_px(strlen(title), 13) + 8) pw = text_px(strlen(title), 13) + 8;
        fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                   "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
                pw, top + ch * panels + 30, pw, top + ch * panels + 30);
        fprintf(f, "<text x=\"4\" y=\"16\" font-size=\"13\">%s</text>\n", title);
        for (int d = 0; d < s->n_depths; d++)
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d%%</text>\n",
                    left + d * cw + cw / 2, top - 6, s->depths[d]);
        for (int g = 0; g < panels; g++) {
            const kv_needle_result *r0 = res + (size_t)g * per;
            row_label(label, sizeof label, s, r0);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", left - 6,
                    top + g * ch + ch / 2 + 4, label);
            for (int d = 0; d < s->n_depths; d++)
                write_cell(f, r0 + d, left + d * cw, top + g * ch, cw, ch);
        }
        fprintf(f, "<text x=\"4\" y=\"%d\" fill=\"#555\">rows: recall model, cache; columns: "
                   "needle depth</text>\n</svg>\n", top + panels * ch + 18);
        return;
    }
    const int left = 70;
    int pw = left + cw * s->n_depths + 20;
    for (int g = 0; g < panels; g++) {
        const kv_needle_result *r0 = res + (size_t)g * per;
        snprintf(title, sizeof title, "needle: %s model, cache %s, seed %llu (cell: logit margin)",
                 kv_recall_kind_name(r0->kind), s->variants[r0->variant].spec,
                 (unsigned long long)r0->seed);
        if (pw < text_px(strlen(title), 13) + 8) pw = text_px(strlen(title), 13) + 8;
    }
    const int ph = top + ch * s->n_lengths + gap;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
            pw, ph * panels + 10, pw, ph * panels + 10);
    for (int g = 0; g < panels; g++) {
        const kv_needle_result *r0 = res + (size_t)g * per;
        const int y0 = g * ph;
        fprintf(f, "<text x=\"4\" y=\"%d\" font-size=\"13\">needle: %s model, cache %s, seed "
                   "%llu (cell: logit margin)</text>\n", y0 + 16, kv_recall_kind_name(r0->kind),
                s->variants[r0->variant].spec, (unsigned long long)r0->seed);
        for (int d = 0; d < s->n_depths; d++)
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d%%</text>\n",
                    left + d * cw + cw / 2, y0 + top - 6, s->depths[d]);
        for (int l = 0; l < s->n_lengths; l++) {
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%d</text>\n", left - 6,
                    y0 + top + l * ch + ch / 2 + 4, s->lengths[l]);
            for (int d = 0; d < s->n_depths; d++)
                write_cell(f, r0 + l * s->n_depths + d, left + d * cw, y0 + top + l * ch, cw, ch);
        }
        fprintf(f, "<text x=\"4\" y=\"%d\" fill=\"#555\">rows: context length (tokens); "
                   "columns: needle depth</text>\n", y0 + top + s->n_lengths * ch + 16);
    }
    fprintf(f, "</svg>\n");
}

typedef void (*grid_writer)(FILE *f, const kv_needle_spec *s, const kv_needle_result *res, int n);

/* --csv / --svg: written beside @p path and renamed over it once complete (kv_file.h); exit
 * code 0, or 1 with a message */
static int write_out(const char *cmd, const char *opt, const char *path, grid_writer fn,
                     const kv_needle_spec *s, const kv_needle_result *res, int n)
{
    if (!strcmp(opt, "--csv") && kv_cli_csv_stdout()) { /* --csv -: the real stdout */
        fn(kv_cli_csv_stdout(), s, res, n);
        return KV_EXIT_OK;
    }
    kv_file_out o;
    kv_err err = {{0}};
    int st = kv_file_create(path, &o, &err);
    if (!st) {
        fn(o.f, s, res, n);
        st = kv_file_commit(&o, &err);
    }
    return st ? kv_cli_write_fail(cmd, opt, &err) : KV_EXIT_OK;
}

/* A list or cache option becomes one line of spec text: a newline (or a '#') in it would
 * add lines of its own (or cut it short). 0 when fine, else the exit code after a message. */
static int one_line(const char *cmd, const char *opt, const char *value)
{
    if (!value || !value[strcspn(value, "\r\n#")]) return 0;
    return kv_args_bad(cmd, opt, "'%s' holds a newline or '#': one value or list, on one line",
                       value);
}

int cmd_needle(int argc, char **argv)
{
    const char *cmd = "kvlab needle";
    const char *spec_path = NULL, *models = NULL, *lengths = NULL, *depths = NULL, *cache = NULL;
    const char *seeds = NULL, *csv = NULL, *svg = NULL, *device = "cpu", *save = NULL;
    const char *model = NULL;
    int chunk = 0;
    kv_cli_layout lo = {"contiguous", 0, 0};
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--spec", KV_OPT_STRING, &spec_path, 0, 0, NULL, "FILE", "grid spec (datasets/needle/*.needle; default: both models, 1k and 4k, depths 0..100 by 25)", 0},
        {"--models", KV_OPT_STRING, &models, 0, 0, NULL, "LIST", "direct,induction (overrides the spec)", 0},
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "M", "refused, with why: the grid runs the constructed recall models only (--models)", 0},
        {"--lengths", KV_OPT_STRING, &lengths, 0, 0, NULL, "LIST", "context lengths, e.g. 1024,65536", 0},
        {"--depths", KV_OPT_STRING, &depths, 0, 0, NULL, "LIST", "needle depths in percent, e.g. 0,50,100", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "SPEC", "cache variant: fp32, or a storage format (fp16 int8 fp8 int4 ... with /head /wR /lA,B; see kvlab generate --help), predicted to pass every cell (int2: measured, not predicted); or a chapter 06 window window/wN with /sN /cache /FORMAT, e.g. window/w512/s4/cache (measured, not predicted: datasets/needle/ch06-grid.needle holds the predictions); or a chapter 09 method l2-large l2-small h2o snapkv quest topk with /bN or /rX and /wN /sN /dN /FORMAT, e.g. h2o/b64/w16 (measured, not predicted: datasets/needle/ch09.txt holds the predictions)", 0},
        {"--chunk", KV_OPT_INT, &chunk, 1, 1 << 24, NULL, "N", "haystack tokens per prefill step (default: the spec's, else 512); chapter 09's methods evict between steps", 0},
        {"--seeds", KV_OPT_STRING, &seeds, 0, 0, NULL, "LIST", "haystack seeds", 0},
        {"--csv", KV_OPT_STRING, &csv, 0, 0, NULL, "FILE", "write every cell as CSV to FILE (- : standard output, the tables then on standard error)", 0},
        {"--svg", KV_OPT_STRING, &svg, 0, 0, NULL, "FILE", "write a heatmap (SVG)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the models run (default cpu)", 0},
        {"--save-models", KV_OPT_STRING, &save, 0, 0, NULL, "PREFIX", "also write the grid's recall models as PREFIX-direct.bin, PREFIX-induction.bin (kvlab checkpoints)", 0},
        KV_CLI_LAYOUT_OPTS(lo),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Plant facts at several depths of a filler context, ask for them at the end,\n"
                          "and check the greedy answers of the recall models (constructed weights,\n"
                          "docs/recall-models.md). A cell passes when the answer is the planted value;\n"
                          "the margin is its logit minus the best other logit. Exit 1 when a cell\n"
                          "contradicts the outcome its cache variant predicts.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (model) /* what the one model loader opens has no planted facts to score */
        return kv_args_bad(cmd, "--model", "'%s': the needle grid runs the constructed recall "
                           "models (--models direct,induction), where a cell passes when the answer "
                           "is the fact planted by construction (docs/recall-models.md); a model "
                           "file, `trained` or a GGUF model has no planted facts to score: `kvlab "
                           "eval ppl --model M --cache SPEC` measures a cache on it", model);
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    int e = kv_cli_layout_check(cmd, &lo);
    if (e) return e;
    e = kv_cli_check_device(cmd, device);
    if (e) return e;

    kv_err err = {{0}};
    kv_needle_spec s;
    kv_needle_spec_default(&s);
    if (spec_path && kv_needle_spec_read(spec_path, &s, &err))
        return kv_cli_fail(cmd, "--spec", KV_ERR_FORMAT, &err);
    /* the lists, each through the shared parsers (no empty item, no stray word, at most what
     * a spec holds), then written as the spec's lines */
    char text[2048] = "";
    char words[2][KV_ARGS_WORD];
    int n_words = 0;
    const char *list_opts[] = {"--models", "--lengths", "--depths", "--seeds"};
    const char *lists[] = {models, lengths, depths, seeds};
    for (int i = 0; i < 4; i++)
        if ((e = one_line(cmd, list_opts[i], lists[i]))) return e;
    if (models && (e = kv_args_word_list(cmd, "--models", models, words, 2, &n_words))) return e;
    for (int i = 0; i < n_words; i++)
        if (add_line(text, sizeof text, i ? " %s" : "models %s", words[i]))
            return kv_args_bad(cmd, "--models", "list too long");
    if (n_words) add_line(text, sizeof text, "\n");
    const char *fields[] = {"lengths", "depths", "seeds"};
    const char *names[] = {"--lengths", "--depths", "--seeds"};
    const char *values[] = {lengths, depths, seeds};
    const int least[] = {16, 0, 0}, most[] = {1 << 24, 100, 1 << 30},
              cap[] = {KV_NEEDLE_MAX_LENGTHS, KV_NEEDLE_MAX_DEPTHS, KV_NEEDLE_MAX_SEEDS};
    for (int i = 0; i < 3; i++) {
        int v[KV_NEEDLE_MAX_LENGTHS + KV_NEEDLE_MAX_DEPTHS + KV_NEEDLE_MAX_SEEDS], n_v = 0;
        if (!values[i]) continue;
        if ((e = kv_args_int_list(cmd, names[i], values[i], v, cap[i], &n_v, least[i], most[i])))
            return e;
        int bad = add_line(text, sizeof text, "%s", fields[i]);
        for (int k = 0; k < n_v; k++) bad |= add_line(text, sizeof text, " %d", v[k]);
        if (bad || add_line(text, sizeof text, "\n"))
            return kv_args_bad(cmd, names[i], "list too long");
    }
    if ((e = one_line(cmd, "--cache", cache))) return e;
    if (cache) {
        size_t k = strlen(text);
        /* int2's outcome is measured, not predicted (chapters/04-quantization/README.md), and
         * so are a window's and a selection's (their grids hold the predictions) */
        kv_cache_spec cs;
        const int forgets = !kv_needle_cache_spec(cache, 1, 16, &cs, &err) &&
                            (cs.retain.select || cs.window.size);
        snprintf(text + k, sizeof text - k, "variant %s %s\n", cache,
                 !strncmp(cache, "int2", 4) || forgets ? "any" : "all");
    }
    if (chunk) {
        size_t k = strlen(text);
        snprintf(text + k, sizeof text - k, "chunk %d\n", chunk);
    }
    if (text[0] && kv_needle_spec_parse(text, &s, &err))
        return kv_args_bad(cmd, "options", "%s", err.msg);
    for (int i = 0; i < s.n_variants; i++) { /* refuse unknown variants before any work */
        kv_cache_spec cs;
        if (kv_needle_cache_spec(s.variants[i].spec, 1, 16, &cs, &err))
            return kv_cli_fail(cmd, cache ? "--cache" : spec_path, KV_ERR_UNSUPPORTED, &err);
    }

    /* every output, --save-models' files included, checked before the grid runs: each can be
     * written, and no two are one file */
    enum { N_MODELS = sizeof s.models / sizeof s.models[0] };
    char saved[N_MODELS][1024];
    kv_cli_output outs[2 + N_MODELS] = {{"--csv", csv}, {"--svg", svg}};
    for (int i = 0; save && i < s.n_models; i++) {
        if (snprintf(saved[i], sizeof saved[i], "%s-%s.bin", save,
                     kv_recall_kind_name(s.models[i])) >= (int)sizeof saved[i])
            /* cut short, it would name another file */
            return kv_args_bad(cmd, "--save-models", "prefix of %zu characters: longer than "
                               "%zu", strlen(save), sizeof saved[i] - 16);
        outs[2 + i] = (kv_cli_output){"--save-models", saved[i]};
    }
    if ((e = kv_cli_outputs_check(cmd, outs, 2 + s.n_models))) return e;

    for (int i = 0; save && i < s.n_models; i++) { /* the same models the grid builds */
        kv_recall_opts o;
        kv_recall_opts_default(&o, s.models[i]);
        o.seed = s.model_seed;
        kv_model m;
        int st = kv_recall_build(&m, &o, &err);
        if (st) return kv_cli_fail(cmd, "--save-models", st, &err);
        st = kv_checkpoint_write(saved[i], &m, KV_FILE_KVLAB, &err);
        kv_model_free(&m);
        if (st) return kv_cli_write_fail(cmd, "--save-models", &err);
        fprintf(stderr, "%s: wrote %s\n", cmd, saved[i]);
    }

    progress_state ps;
    memset(&ps, 0, sizeof ps);
    snprintf(ps.label, sizeof ps.label, "needle");
    kv_progress_start(&ps.p, ps.label);
    make_ctx mc = {device, &lo};
    kv_needle_result *res = NULL;
    int n = 0;
    const double t0 = kv_now();
    int st = kv_needle_grid(&s, make_backend, &mc, on_progress, &ps, &res, &n, &err);
    kv_progress_end(&ps.p);
    if (st) return kv_cli_fail(cmd, s.name, st, &err);

    printf("needle grid '%s' on %s: %d cells in %.1f s\n", s.name, device, n, kv_now() - t0);
    if (!strcmp(lo.layout, "paged")) {
        if (lo.block_size) printf("cache layout: paged, blocks of %d tokens", lo.block_size);
        else printf("cache layout: paged, blocks of 16 tokens (32 for int4/int2)");
        if (lo.n_blocks) printf(", a pool of %d blocks\n", lo.n_blocks);
        else printf(", a pool as large as the contiguous cache\n");
    }
    print_tables(&s, res);
    int pass = 0, unexpected = 0;
    for (int i = 0; i < n; i++) {
        pass += res[i].pass;
        unexpected += res[i].expected >= 0 && res[i].expected != res[i].pass;
    }
    printf("\n%d of %d cells pass; %d contradict their prediction\n", pass, n, unexpected);
    int rc = unexpected ? KV_EXIT_FAIL : KV_EXIT_OK;
    if (csv && write_out(cmd, "--csv", csv, write_csv, &s, res, n)) rc = KV_EXIT_FAIL;
    if (svg && write_out(cmd, "--svg", svg, write_svg, &s, res, n)) rc = KV_EXIT_FAIL;
    free(res);
    return rc;
}
