/*
 * The measured numbers the docs quote from kvlab eval, against the CSV of the run they quote
 * (label docs).
 *
 * A Markdown table of numbers stands right after a marker naming the run's CSV (or several,
 * separated by spaces), committed under docs/data/ as kvlab wrote it:
 *
 *   <!-- numbers-from: docs/data/ppl-ch04-512.csv -->
 *   | cache | perplexity | KL(exact ‖ cache) ± s.e. | top-1 |
 *   |---|---|---|---|
 *   | KIVI int2 `int2-kivi` | 26.131 | 1.48e-01 ± 3.4e-02 | 80.4 % |
 *
 * Every number in a checked column is the CSV's value rounded as the table shows it: "26.131"
 * holds a value in [26.1305, 26.1315], "1.48e-01" one within half of 0.01e-01; a number the
 * table leaves out is not checked, one it shows is. Which value a column holds is said by its
 * heading, for three kinds of CSV told apart by their header:
 *
 * - kvlab eval ppl --csv's one row per cache, found by the cache's name in backticks in the
 *   row's first cell: "perplexity" (ppl, then its change against the exact cache in %),
 *   "exact ..." (exact_ppl), "NLL ± s.e." (nll, nll_se), "Δ NLL" (nll - ln exact_ppl),
 *   "... min–max" (ppl_min, ppl_max), "KL ..." (kl, kl_se), "top-1" (100 top1).
 * - kvlab eval ppl --segments: one row per cache and segment. A column headed with a range of
 *   tokens "A–B" holds the perplexity over the segments from target A to target B (they must
 *   start at A and end at B), "whole stream" over all. A cache scored in another mode than
 *   cached is named MODE/CACHE (recompute/fp32).
 * - kvlab eval keys --csv (mean |K| per layer, KV head and channel): a row's first cell names
 *   a layer, a range of layers "A–B" or "all"; a column headed "... before RoPE" holds the
 *   lowest and highest max/median over those layers of the mean |K| of the layer's channels
 *   (one number when they are the same layer), "after RoPE" the same after RoPE.
 *
 * Columns headed otherwise are words, not checked. Every row names a cache of the CSV (or
 * layers), and every cache of the CSV has a row; FILE#CACHE in the marker reads CACHE's rows
 * of FILE alone (a table that quotes one row of a larger run). main() first holds the check
 * itself to tables written wrong on purpose.
 */
#include "common/kv_test.h"
#include "common/kv_docs.h"
#include "common/kv_docs_table.h"
#include "common/kv_docs_pages.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILES 4
#define MAX_NUMS 8

/* One CSV, split: fields [n_rows][n_cols] (row 0 the header), kind by the header. */
enum { CSV_PPL, CSV_SEGMENTS, CSV_KEYS };
typedef struct {
    char *text;       /* the file's bytes, fields cut in place */
    char **field;     /* [n_rows * n_cols] */
    int n_rows, n_cols, kind;
    char only[256];   /* FILE#NAME in the marker: NAME's rows alone ("" for all) */
} csv;

/* A number as the table shows it: its value and its last digit's place. */
typedef struct {
    double v, ulp;
} shown;

/* Split @p text (owned from here) into fields: one row per line, fields by commas, a field in
 * double quotes may hold commas. 0, or -1 for rows of unequal length or an unknown header. */
static int csv_split(char *text, csv *c)
{
    c->text = text;
    c->field = NULL;
    c->n_rows = c->n_cols = 0;
    size_t cap = 0, n = 0;
    char *p = text;
    while (*p) {
        int cols = 0;
        for (;;) { /* one field */
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                char **f = realloc(c->field, cap * sizeof *f);
                if (!f) return -1;
                c->field = f;
            }
            char *start = p, *w = p;
            if (*p == '"') {
                for (p++; *p && !(*p == '"' && p[1] != '"'); p++) {
                    if (*p == '"') p++; /* "" is one quote */
                    *w++ = *p;
                }
                if (*p == '"') p++;
            } else {
                while (*p && *p != ',' && *p != '\n') *w++ = *p++;
                w = p;
            }
            const char sep = *p;
            *w = '\0';
            c->field[n++] = start;
            cols++;
            if (sep) p++;
            if (sep != ',') break;
        }
        if (!c->n_rows) c->n_cols = cols;
        else if (cols != c->n_cols) return -1;
        c->n_rows++;
    }
    static const char *const first[] = {"text", "text", "layer"}, *const has[] = {
        "ppl_min", "segment", "mean_abs_post_rope"};
    for (c->kind = 0; c->kind < 3; c->kind++) {
        if (c->n_rows < 2 || strcmp(c->field[0], first[c->kind])) continue;
        for (int j = 0; j < c->n_cols; j++)
            if (!strcmp(c->field[j], has[c->kind])) return 0;
    }
    return -1;
}

/* field @p name of row @p r (a number); NAN when the CSV has no such column or it is empty */
static double num(const csv *c, int r, const char *name)
{
    for (int j = 0; j < c->n_cols; j++)
        if (!strcmp(c->field[j], name))
            return *c->field[r * c->n_cols + j] ? atof(c->field[r * c->n_cols + j]) : NAN;
    return NAN;
}

static const char *str(const csv *c, int r, const char *name)
{
    for (int j = 0; j < c->n_cols; j++)
        if (!strcmp(c->field[j], name)) return c->field[r * c->n_cols + j];
    return "";
}

/* A row's name: the cache, MODE/CACHE for a segment scored in another mode than cached. */
static void row_name(const csv *c, int r, char *out, size_t cap)
{
    const char *mode = str(c, r, "mode");
    if (c->kind == CSV_SEGMENTS && strcmp(mode, "cached"))
        snprintf(out, cap, "%s/%s", mode, str(c, r, "cache"));
    else snprintf(out, cap, "%s", str(c, r, "cache"));
}

/* The numbers of a cell (text in backticks skipped; "15,352" is one number), at most cap. */
static int numbers(const char *s, shown *out, int cap)
{
    int n = 0;
    for (const char *p = s; *p && n < cap;) {
        if (*p == '`') {
            const char *e = strchr(p + 1, '`');
            p = e ? e + 1 : p + strlen(p);
            continue;
        }
        const int sign = (*p == '+' || *p == '-') && p[1] >= '0' && p[1] <= '9';
        if (!sign && !(*p >= '0' && *p <= '9')) {
            p++;
            continue;
        }
        char buf[64];
        size_t k = 0;
        int decimals = 0, frac = 0;
        if (sign) buf[k++] = *p++;
        for (; k + 1 < sizeof buf; p++) {
            if (*p >= '0' && *p <= '9') {
                buf[k++] = *p;
                decimals += frac;
            } else if (*p == '.' && !frac && p[1] >= '0' && p[1] <= '9') {
                buf[k++] = '.';
                frac = 1;
            } else if (*p == ',' && !frac && p[1] >= '0' && p[1] <= '9' && p[2] >= '0' &&
                       p[2] <= '9' && p[3] >= '0' && p[3] <= '9' && !(p[4] >= '0' && p[4] <= '9')) {
                continue; /* a thousands comma */
            } else {
                break;
            }
        }
        int exp10 = 0;
        const int digit_after = p[1] >= '0' && p[1] <= '9';
        if ((*p == 'e' || *p == 'E') && (p[1] == '-' || p[1] == '+' || digit_after)) {
            char *end;
            exp10 = (int)strtol(p + 1, &end, 10);
            p = end;
        }
        buf[k] = '\0';
        out[n].v = atof(buf) * pow(10.0, exp10);
        out[n].ulp = pow(10.0, exp10 - decimals);
        n++;
    }
    return n;
}

/* Whether @p s shows @p truth rounded to its digits. */
static int rounds_to(shown s, double truth)
{
    return isfinite(truth) && fabs(s.v - truth) <= 0.5 * s.ulp * (1 + 1e-9) + 1e-12 * fabs(truth);
}

/* The values a column headed @p head holds for the rows of @p name (eval ppl): their count,
 * 0 for a column of words, -1 when the CSV has no such rows or segments. */
static int ppl_values(const csv *c, const char *name, const char *head, double *v)
{
    int r = 0;
    char rn[512];
    for (r = 1; r < c->n_rows; r++) {
        row_name(c, r, rn, sizeof rn);
        if (!strcmp(rn, name)) break;
    }
    if (r == c->n_rows) return -1;
    const double exact = num(c, r, "exact_ppl");
    if (strstr(head, "min–max"))
        return v[0] = num(c, r, "ppl_min"), v[1] = num(c, r, "ppl_max"), 2;
    if (!strncmp(head, "exact", 5)) return v[0] = exact, 1;
    if (!strncmp(head, "perplexity", 10))
        return v[0] = num(c, r, "ppl"), v[1] = 100 * (v[0] / exact - 1), 2;
    if (!strncmp(head, "NLL", 3)) return v[0] = num(c, r, "nll"), v[1] = num(c, r, "nll_se"), 2;
    if (!strncmp(head, "Δ NLL", strlen("Δ NLL"))) return v[0] = num(c, r, "nll") - log(exact), 1;
    if (!strncmp(head, "KL", 2)) return v[0] = num(c, r, "kl"), v[1] = num(c, r, "kl_se"), 2;
    if (!strncmp(head, "top-1", 5)) return v[0] = 100 * num(c, r, "top1"), 1;
    return 0;
}

/* The perplexity of @p name's segments from target a to b (all for a < 0) into v[0]. */
static int segment_values(const csv *c, const char *name, const char *head, double *v)
{
    shown range[2];
    const int whole = strstr(head, "whole") != NULL;
    if (!whole && numbers(head, range, 2) != 2) return 0;
    double nll = 0, count = 0, first = -1, last = -1;
    char rn[512];
    for (int r = 1; r < c->n_rows; r++) {
        row_name(c, r, rn, sizeof rn);
        const double f = num(c, r, "first"), l = num(c, r, "last"), k = num(c, r, "predicted");
        if (strcmp(rn, name) || (!whole && (f < range[0].v || l > range[1].v))) continue;
        if (first < 0) first = f;
        last = l;
        nll += num(c, r, "nll") * k;
        count += k;
    }
    if (!count || (!whole && (first != range[0].v || last != range[1].v))) return -1;
    v[0] = exp(nll / count);
    return 1;
}

/* max/median of the mean |K| over layer @p l's channels, before (col "pre") or after RoPE */
static double key_ratio(const csv *c, int l, const char *col)
{
    double *x = malloc((size_t)c->n_rows * sizeof *x), mx = 0;
    int n = 0;
    for (int r = 1; x && r < c->n_rows; r++)
        if ((int)num(c, r, "layer") == l) {
            x[n] = num(c, r, col);
            if (x[n] > mx) mx = x[n];
            n++;
        }
    for (int i = 1; i < n; i++) /* insertion sort: a layer's few hundred channels */
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
            const double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
    const double med = n ? (n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2])) : NAN;
    free(x);
    return n ? mx / med : NAN;
}

/* The layers a keys row names (first cell): [*a, *b]; 0 when it names none. */
static int key_layers(const csv *c, const char *first_cell, int *a, int *b)
{
    shown s[2];
    const int k = numbers(first_cell, s, 2);
    *a = 0;
    *b = (int)num(c, c->n_rows - 1, "layer");
    if (!strncmp(first_cell, "all", 3)) return 1;
    if (k < 1) return 0;
    *a = (int)s[0].v;
    *b = k > 1 ? (int)s[1].v : *a;
    return *a <= *b;
}

static int key_values(const csv *c, int a, int b, const char *head, double *v)
{
    const char *col = strstr(head, "before") ? "mean_abs_pre_rope"
                      : strstr(head, "after") ? "mean_abs_post_rope" : NULL;
    if (!col) return 0;
    v[0] = INFINITY, v[1] = -INFINITY;
    for (int l = a; l <= b; l++) {
        const double q = key_ratio(c, l, col);
        if (!(q >= v[0])) v[0] = q;
        if (!(q <= v[1])) v[1] = q;
    }
    return 2;
}

/* One cell against the values its column holds; a row's number against its CSV value. */
static void check_cell(const char *where, const char *got, const double *want, int n_want)
{
    shown s[MAX_NUMS];
    const int n = numbers(got, s, MAX_NUMS);
    EXPECT(n <= n_want, "%s: '%s' shows %d numbers, its column holds %d", where, got, n, n_want);
    for (int i = 0; i < n && i < n_want; i++)
        EXPECT(rounds_to(s[i], want[i]), "%s: '%s': number %d is %.9g in the CSV", where, got,
               i + 1, want[i]);
}

/* Whether @p c has rows named @p name. */
static int has_rows(const csv *c, const char *name)
{
    char rn[512];
    if (*c->only && strcmp(name, c->only)) return 0;
    for (int r = 1; r < c->n_rows; r++) {
        row_name(c, r, rn, sizeof rn);
        if (!strcmp(rn, name)) return 1;
    }
    return 0;
}

/* One marked table at @p t (its header line) against the CSVs; covered[f][r]: row r of CSV f
 * has a row in the table. */
static void check_table(const char *md, const char *src, const char *t, const csv *cs, int n_cs,
                        char **covered)
{
    char head[32][128], c0[1024], got[256];
    int n_cols = 0;
    while (n_cols < 32 && kv_docs_table_cell(t, n_cols, head[n_cols], sizeof head[0])) n_cols++;
    EXPECT(n_cols >= 2, "%s: the table after the marker of %s has no columns", md, src);
    const char *line = strchr(t, '\n');
    line = line ? strchr(line + 1, '\n') : NULL; /* past the |---| line */
    for (; line && line[1] == '|'; line = strchr(line + 1, '\n')) {
        const char *row = line + 1;
        if (!kv_docs_table_cell(row, 0, c0, sizeof c0)) break;
        char name[512] = "", where[2600];
        const char *b = strchr(c0, '`'), *e = b ? strchr(b + 1, '`') : NULL;
        if (e) snprintf(name, sizeof name, "%.*s", (int)(e - b - 1), b + 1);
        int found = 0;
        for (int f = 0; f < n_cs; f++) {
            const csv *c = &cs[f];
            int a = 0, z = 0;
            if (c->kind == CSV_KEYS ? !key_layers(c, c0, &a, &z) : !has_rows(c, name)) continue;
            found = 1;
            for (int col = 1; col < n_cols; col++) {
                double v[4];
                const int k = c->kind == CSV_PPL        ? ppl_values(c, name, head[col], v)
                              : c->kind == CSV_SEGMENTS ? segment_values(c, name, head[col], v)
                                                        : key_values(c, a, z, head[col], v);
                if (!kv_docs_table_cell(row, col, got, sizeof got) || !*got) continue; /* not given */
                snprintf(where, sizeof where, "%s: %s, '%s' under '%s'", md, src, c0, head[col]);
                EXPECT(k >= 0, "%s: %s has no such segments", where, src);
                if (k > 0) check_cell(where, got, v, k);
            }
            char rn[512];
            for (int r = 1; r < c->n_rows; r++) {
                row_name(c, r, rn, sizeof rn);
                if (c->kind == CSV_KEYS || !strcmp(rn, name)) covered[f][r] = 1;
            }
        }
        EXPECT(found, "%s: the row '%s' names nothing of %s", md, c0, src);
    }
    for (int f = 0; f < n_cs; f++) {
        char rn[512];
        for (int r = 1; r < cs[f].n_rows; r++) {
            row_name(&cs[f], r, rn, sizeof rn);
            EXPECT(covered[f][r], "%s: %s's %s has no row in the table", md, src, rn);
            if (!covered[f][r]) break; /* once for a cache's segments */
        }
    }
}

static void csv_free(csv *c)
{
    free(c->text);
    free(c->field);
}

/* The marked tables of @p page (its text) against their CSVs, read by @p load (a path, or
 * the self-check's text); mismatches into bad. The number of tables. */
static int check_page(const char *rel, const char *page, char *(*load)(const char *, const char *),
                      const char *root)
{
    static const char mark[] = "<!-- numbers-from: ";
    int tables = 0;
    for (const char *m = strstr(page, mark); m; m = strstr(m + 1, mark)) {
        const char *a = m + sizeof mark - 1, *e = strstr(a, " -->");
        char spec[1024];
        if (!e || (size_t)(e - a) >= sizeof spec) continue;
        snprintf(spec, sizeof spec, "%.*s", (int)(e - a), a);
        csv cs[MAX_FILES];
        char *covered[MAX_FILES];
        int n = 0, ok = 1;
        char names[1024];
        snprintf(names, sizeof names, "%s", spec);
        for (char *f = strtok(names, " "); f && ok; f = strtok(NULL, " ")) {
            char *hash = strchr(f, '#');
            if (hash) *hash = '\0';
            char *text = n < MAX_FILES ? load(root, f) : NULL;
            ok = text && csv_split(text, &cs[n]) == 0;
            EXPECT(ok, "%s: %s is missing, one of too many, or not kvlab eval's CSV", rel, f);
            if (!text) break;
            snprintf(cs[n].only, sizeof cs[n].only, "%s", hash ? hash + 1 : "");
            covered[n] = calloc((size_t)cs[n].n_rows, 1);
            for (int r = 1; covered[n] && *cs[n].only && r < cs[n].n_rows; r++) {
                char rn[512];
                row_name(&cs[n], r, rn, sizeof rn);
                covered[n][r] = strcmp(rn, cs[n].only) != 0; /* not asked for */
            }
            n++;
        }
        const char *t = strchr(e, '\n');
        EXPECT(t && t[1] == '|', "%s: no table right after the marker of %s", rel, spec);
        if (ok && n && t && t[1] == '|') check_table(rel, spec, t + 1, cs, n, covered);
        for (int i = 0; i < n; i++) {
            csv_free(&cs[i]);
            free(covered[i]);
        }
        tables++;
    }
    return tables;
}

static char *load_file(const char *root, const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    return kv_docs_slurp(path, NULL);
}

/* the self-check's CSVs, by name */
static const char ppl_csv[] =
    "text,tokens,predicted,windows,window,mode,cache,layout,nll,ppl,kl,top1,segments,nll_se,"
    "kl_se,ppl_min,ppl_max,exact_ppl\n"
    "t,1024,1023,3,512,cached,fp32,contiguous,3.143292981,23.180073,0.000000000,1.000000,8,"
    "0.086381386,0.000000000,14.565772,29.801009,23.180073\n"
    "t,1024,1023,3,512,cached,\"int2/l0,1\",contiguous,3.263117803,26.130881,0.147939736,"
    "0.804497,8,0.089251324,0.034178718,17.169473,38.302966,23.180073\n";
static const char seg_csv[] =
    "text,window,mode,cache,segment,first,last,predicted,nll,ppl,kl\n"
    "t,0,cached,fp32,0,1,256,256,3.0,20.085537,\nt,0,cached,fp32,1,257,512,256,4.0,54.598150,\n"
    "t,257,recompute,fp32,0,1,512,8,2.0,7.389056,\n";
static const char keys_csv[] =
    "layer,kv_head,channel,mean_abs_pre_rope,mean_abs_post_rope\n"
    "0,0,0,1.0,1.0\n0,0,1,3.0,2.0\n0,0,2,10.0,8.0\n0,0,3,1.0,1.0\n"
    "1,0,0,1.0,1.0\n1,0,1,1.0,1.0\n1,0,2,2.0,2.0\n1,0,3,30.0,5.0\n";

static char *load_text(const char *root, const char *name)
{
    (void)root;
    const char *s = !strcmp(name, "p.csv") ? ppl_csv : !strcmp(name, "s.csv") ? seg_csv
                    : !strcmp(name, "k.csv") ? keys_csv : NULL;
    return s ? strdup(s) : NULL;
}

/* the mismatches in a page of one table */
static int mismatches(const char *page)
{
    bad = 0;
    quiet = 1;
    check_page("self-check", page, load_text, NULL);
    quiet = 0;
    return bad;
}

#define PH "<!-- numbers-from: p.csv -->\n| cache | perplexity | NLL ± s.e. | ppl min–max | Δ NLL | " \
           "KL ± s.e. | top-1 | words |\n|---|---|---|---|---|---|---|---|\n"
#define ONE "<!-- numbers-from: p.csv#fp32 -->\n| cache | perplexity |\n|---|---|\n" \
            "| `fp32` | 23.180 |\n"
/* segments: (256 * 3 + 256 * 4) / 512 = 3.5 nats over 1-512 */
#define SH "<!-- numbers-from: s.csv -->\n| cache | 1–256 | 257–512 | whole stream |\n" \
           "|---|---|---|---|\n"
/* keys: layer 0 pre 10 / 2 = 5, post 8 / 1.5; layer 1 pre 30 / 1.5 = 20, post 5 / 1.5 */
#define KH "<!-- numbers-from: k.csv -->\n| layers | max / median before RoPE | after RoPE |\n" \
           "|---|---|---|\n"

/* Tables written right (0) and wrong on purpose (the mismatches they hold). */
static const struct {
    const char *page, *what;
    int bad;
} cases[] = {
    {PH "| exact `fp32` | 23.180 | 3.1433 ± 0.0864 | 14.57–29.80 | +0.0000 | 0 | 100.0 % | 1 2 |\n"
        "| `int2/l0,1` | 26.13 (+12.7 %) | 3.263 | 17.2–38.3 | +0.1198 | 1.48e-01 ± 3.4e-02 | 80 % | |\n",
     "a right perplexity table", 0},
    {PH "| `fp32` | 23.181 | 3.1433 | 14.57–29.80 | 0 | 0 | 100 % | |\n"
        "| `int2/l0,1` | 26.13 | 3.263 | 17.2–38.3 | +0.1198 | 1.48e-01 | 80 % | |\n",
     "a perplexity off by its last digit", 1},
    {PH "| `fp32` | 23.180 | 3.1433 | 14.57–29.80 | 0 | 0 | 100 % | |\n"
        "| `int2/l0,1` | 26.13 (+12.6 %) | 3.263 | 17.2–38.3 | +0.1198 | 1.49e-01 | 80 % | |\n",
     "a wrong change and KL", 2},
    {PH "| `fp32` | 23.180 | 3.1433 ± 0.0864 ± 1 | | | | | |\n", "an extra number, a missing cache", 2},
    {PH "| `fp32` | 23.180 | | | | | | |\n| `int4` | 1 | | | | | | |\n", "a cache not in the CSV", 2},
    {ONE, "one cache of a CSV", 0},
    {ONE "| `int2/l0,1` | 26.131 |\n", "a cache the marker leaves out", 1},
    {SH "| `fp32` | 20.09 | 54.6 | 33.115 |\n| `recompute/fp32` | | | 7.39 |\n", "a right stream table", 0},
    {SH "| `fp32` | 20.09 | 54.6 | 33.11 |\n| `recompute/fp32` | 7.39 | | 7.39 |\n",
     "a wrong stream mean, a segment not there", 2},
    {KH "| 0 | 5.0 | 5.33 |\n| 1 | 20 | 3.3 |\n| all 2 | 5–20 | 3.3–5.3 |\n", "a right keys table", 0},
    {KH "| 0–1 | 5–21 | 3.3–5.3 |\n", "a wrong key ratio", 1},
    {"<!-- numbers-from: none.csv -->\n| a | b |\n|---|---|\n| `x` | 1 |\n", "a missing CSV", 1},
};

static void self_check(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = mismatches(cases[i].page);
        KV_CHECK(got == cases[i].bad, "self-check: %s: %d mismatches found, %d written",
                 cases[i].what, got, cases[i].bad);
    }
}

int main(int argc, char **argv)
{
    const char *root = argc > 1 ? argv[1] : NULL;
    if (!root) return fprintf(stderr, "usage: test_docs_tables_numbers <source root>\n"), 2;
    self_check();
    int tables = 0;
    glob_t pages;
    const int g = kv_docs_pages(root, &pages);
    KV_CHECK(g == 0, "no page matches %s/docs/*.md", root);
    for (size_t i = 0; g == 0 && i < pages.gl_pathc; i++) {
        const char *rel = pages.gl_pathv[i] + strlen(root) + 1;
        char *page = kv_docs_slurp(pages.gl_pathv[i], NULL);
        bad = 0;
        tables += page ? check_page(rel, page, load_file, root) : 0;
        KV_CHECK(bad == 0, "%s: %d numbers differ from their CSVs (above)", rel, bad);
        free(page);
    }
    if (g == 0) globfree(&pages);
    KV_CHECK(tables >= 1, "no table marked <!-- numbers-from: ... --> under docs/ (%d)", tables);
    printf("%d quoted tables of numbers checked against their CSV\n", tables);
    return kv_test_finish();
}
