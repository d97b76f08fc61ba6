/*
 * The tables the docs quote from a run, against the CSV of that run (label docs).
 *
 * A Markdown table that quotes a run stands right after a marker naming the run's CSV (or
 * several, separated by spaces: one command a cache), committed under docs/data/:
 *
 *   <!-- table-from: docs/data/passkey-ch04-512.csv -->
 *   | cache | 0 % | 50 % | 100 % | keys found |
 *   |---|---|---|---|---|
 *   | `fp32`, `fp16` | yes | yes | yes | 3/3 each |
 *
 * Two kinds of CSV, told apart by their header:
 *
 * - kvlab passkey --csv's (model,cache,haystack,length,depth_pct,key,needle_at,answer,found,
 *   seconds): a column headed "D %" is a cache's cell at depth D: "yes" when every key asked
 *   there was found, "no" when none was, "k/n" otherwise.
 * - kvlab dialogue --csv's (model,cache,script,turn,fact,value,distance,distance_tokens,reply,
 *   pass): a column headed "N turns ..." is a cache's cell at distance N, "k/n" facts recalled
 *   of n asked there, over every script.
 *
 * Every cache named in backticks in a row's first cell must be a cache of the CSV; the last
 * column ("keys found", "all") is the count over all the cache's rows, "k/n" (with " each"
 * after it when the row names several). And every cache of the CSV has a row.
 *
 * A marker ending in "; recalled by CACHE" counts only the asks (a script's turn, or a
 * depth's key) that CACHE passed: the table of a variant against its baseline, where n is
 * the baseline's recalls and CACHE needs no row of its own.
 *
 * So a number in such a table is the CSV's, and a rerun that changes an answer shows in the
 * CSV's diff. main() first holds the check itself to tables written wrong on purpose.
 */
#include "common/kv_test.h"
#include "common/kv_docs.h"
#include "common/kv_docs_table.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 2048
#define MAX_FILES 16

typedef struct {
    char cache[256];
    char ask[800]; /* what pairs a row with the baseline's: length/depth/key, or script/turn */
    int at;        /* the column it counts in: depth in % or distance in turns */
    int found;     /* the key found, the fact recalled */
} csv_row;

typedef struct {
    csv_row rows[MAX_ROWS];
    int n;
    int dialogue; /* 1: kvlab dialogue's rows, 0: kvlab passkey's, -1: none read yet */
} csv_set;

/* One CSV field at *p into out [cap] (quotes removed, "" as one quote, commas and newlines
 * inside quotes kept); *p moves past it and its separator. Returns the separator: ',', '\n'
 * or 0 at the end of the text. */
static int csv_field(const char **p, char *out, size_t cap)
{
    const char *s = *p;
    size_t n = 0;
    const int quoted = *s == '"';
    if (quoted) s++;
    for (; *s; s++) {
        if (quoted && *s == '"') {
            if (s[1] != '"') {
                s++;
                break;
            }
            s++;
        } else if (!quoted && (*s == ',' || *s == '\n')) {
            break;
        }
        if (n + 1 < cap) out[n++] = *s;
    }
    out[n] = '\0';
    const int sep = *s == ',' || *s == '\n' ? *s : 0;
    *p = sep ? s + 1 : s;
    return sep;
}

/* The rows of one CSV's text added to @p set: the number added, -1 for a header of neither
 * kind or of the other kind than the rows already read. */
static int parse_csv(const char *text, csv_set *set)
{
    static const char pk[] = "model,cache,haystack,length,depth_pct,key,needle_at,answer,found,";
    static const char dl[] = "model,cache,script,turn,fact,value,distance,distance_tokens,reply,"
                             "pass";
    const int dialogue = !strncmp(text, dl, sizeof dl - 1) ? 1
                         : !strncmp(text, pk, sizeof pk - 1) ? 0 : -1;
    if (dialogue < 0 || (set->dialogue >= 0 && set->dialogue != dialogue)) return -1;
    set->dialogue = dialogue;
    const char *p = strchr(text, '\n');
    int added = 0;
    while (p && *++p && set->n < MAX_ROWS) {
        char f[10][256];
        int k = 0, sep = ',';
        while (sep == ',' && k < 10) sep = csv_field(&p, f[k++], sizeof f[0]);
        while (sep == ',') sep = csv_field(&p, f[0], sizeof f[0]); /* extra fields: ignored */
        if (k < 10) break;
        csv_row *r = &set->rows[set->n++];
        snprintf(r->cache, sizeof r->cache, "%s", f[1]);
        if (dialogue) {
            snprintf(r->ask, sizeof r->ask, "%s/%s", f[2], f[3]);
            r->at = atoi(f[6]);
            r->found = atoi(f[9]);
        } else {
            snprintf(r->ask, sizeof r->ask, "%s/%s/%s", f[3], f[4], f[5]);
            r->at = atoi(f[4]);
            r->found = atoi(f[8]);
        }
        added++;
        if (!sep) break;
        p--; /* the loop steps past the separator again */
    }
    return added;
}

/* A pass-key cell: "yes", "no" or "k/n" for k found of n asked; a dialogue cell: "k/n". */
static void verdict(int dialogue, int k, int n, char *out, size_t cap)
{
    if (!dialogue && k == n) snprintf(out, cap, "yes");
    else if (!dialogue && k == 0) snprintf(out, cap, "no");
    else snprintf(out, cap, "%d/%d", k, n);
}

/* Whether row @p r counts: every row, or with a baseline, the asks the baseline passed. */
static int counts(const csv_set *set, const csv_row *r, const char *baseline)
{
    if (!baseline) return 1;
    for (int i = 0; i < set->n; i++)
        if (!strcmp(set->rows[i].cache, baseline) && !strcmp(set->rows[i].ask, r->ask))
            return set->rows[i].found;
    return 0;
}

/* One marked table at @p t (its header line) against the CSV's rows; mismatches into bad. */
static void check_table(const char *md, const char *csv, const char *t, const csv_set *set,
                        const char *baseline)
{
    char head[64], c[1024];
    int n_cols = 0, at_of[32];
    while (n_cols < 32 && kv_docs_table_cell(t, n_cols, head, sizeof head)) {
        int d = -1;
        if (set->dialogue ? strstr(head, "turn") != NULL : strchr(head, '%') != NULL)
            d = atoi(head);
        at_of[n_cols++] = d;
    }
    EXPECT(n_cols >= 3 && at_of[n_cols - 1] < 0, "%s: the table after the marker of %s has no "
           "cache, %s and count columns", md, csv, set->dialogue ? "distance" : "depth");
    static int covered[MAX_ROWS];
    memset(covered, 0, sizeof covered);
    const char *line = strchr(t, '\n');
    line = line ? strchr(line + 1, '\n') : NULL; /* past the |---| line */
    for (; line && line[1] == '|'; line = strchr(line + 1, '\n')) {
        const char *row = line + 1;
        if (!kv_docs_table_cell(row, 0, c, sizeof c)) break;
        int names = 0;
        for (const char *b = strchr(c, '`'); b; b = strchr(b, '`')) {
            const char *e = strchr(b + 1, '`');
            if (!e) break;
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(e - b - 1), b + 1);
            b = e + 1;
            names++;
            int k_all = 0, n_all = 0, seen = 0;
            for (int i = 0; i < set->n; i++) {
                const csv_row *r = &set->rows[i];
                if (strcmp(r->cache, name)) continue;
                seen = covered[i] = 1;
                if (!counts(set, r, baseline)) continue;
                k_all += r->found;
                n_all++;
            }
            EXPECT(seen, "%s: `%s` is not a cache of %s", md, name, csv);
            for (int col = 1; seen && col < n_cols; col++) {
                char want[32], got[64];
                if (!kv_docs_table_cell(row, col, got, sizeof got)) break;
                if (at_of[col] >= 0) {
                    int k = 0, m = 0;
                    for (int i = 0; i < set->n; i++) {
                        const csv_row *r = &set->rows[i];
                        if (strcmp(r->cache, name) || r->at != at_of[col]) continue;
                        if (!counts(set, r, baseline)) continue;
                        k += r->found;
                        m++;
                    }
                    char where[48];
                    snprintf(where, sizeof where, set->dialogue ? "%d turns later" : "depth %d %%",
                             at_of[col]);
                    verdict(set->dialogue, k, m, want, sizeof want);
                    EXPECT(m > 0 && !strcmp(got, want), "%s: `%s` at %s: the table says '%s', "
                           "%s '%s'", md, name, where, got, csv, m ? want : "nothing");
                } else if (col == n_cols - 1) {
                    snprintf(want, sizeof want, "%d/%d", k_all, n_all);
                    const size_t w = strlen(want);
                    EXPECT(!strncmp(got, want, w) && (!got[w] || got[w] == ' '),
                           "%s: `%s` found '%s', %s %s", md, name, got, csv, want);
                }
            }
        }
        EXPECT(names > 0, "%s: a row of the table from %s names no cache in backticks", md, csv);
    }
    for (int i = 0; i < set->n; i++)
        EXPECT(covered[i] || (baseline && !strcmp(set->rows[i].cache, baseline)),
               "%s: %s's cache %s has no row in the table", md, csv, set->rows[i].cache);
}

/* The marker's text "FILE [FILE...][; recalled by CACHE]" read into @p set; the number of
 * rows, -1 (with a message) when a file is missing, empty or of another kind. */
static int read_marker(const char *root, const char *rel, char *spec, csv_set *set,
                       const char **baseline)
{
    static const char by[] = "; recalled by ";
    char *semi = strstr(spec, by);
    *baseline = NULL;
    if (semi) {
        *semi = '\0';
        *baseline = semi + sizeof by - 1;
    }
    set->n = 0;
    set->dialogue = -1;
    int files = 0;
    for (char *f = strtok(spec, " "); f; f = strtok(NULL, " ")) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", root, f);
        char *text = kv_docs_slurp(full, NULL);
        const int got = text ? parse_csv(text, set) : -1;
        free(text);
        KV_CHECK(got > 0, "%s: %s is missing, has no rows or is not of its table's kind", rel, f);
        if (got <= 0) return -1;
        files++;
    }
    KV_CHECK(files > 0 && files <= MAX_FILES, "%s: a marker names %d CSVs", rel, files);
    return files > 0 && files <= MAX_FILES ? set->n : -1;
}

static int check_file(const char *root, const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *s = kv_docs_slurp(path, NULL);
    if (!s) return 0;
    int tables = 0;
    static const char mark[] = "<!-- table-from: ";
    for (const char *m = strstr(s, mark); m; m = strstr(m + 1, mark)) {
        const char *a = m + sizeof mark - 1, *e = strstr(a, " -->");
        char spec[2048], name[2048];
        if (!e || (size_t)(e - a) >= sizeof spec) continue;
        snprintf(spec, sizeof spec, "%.*s", (int)(e - a), a);
        snprintf(name, sizeof name, "%s", spec);
        static csv_set set;
        const char *baseline;
        const int n = read_marker(root, rel, spec, &set, &baseline);
        const char *t = strchr(e, '\n');
        KV_CHECK(t && t[1] == '|', "%s: no table right after the marker of %s", rel, name);
        if (n > 0 && t && t[1] == '|') {
            bad = 0;
            check_table(rel, name, t + 1, &set, baseline);
            KV_CHECK(bad == 0, "%s: the table from %s differs from it in %d places (above)", rel,
                     name, bad);
        }
        tables++;
    }
    free(s);
    return tables;
}

/* The check itself: each table against the CSV text, right (0 mismatches) or wrong. */
static int mismatches(const char *csv_text, const char *table, const char *baseline)
{
    static csv_set set;
    set.n = 0;
    set.dialogue = -1;
    if (parse_csv(csv_text, &set) <= 0) return -1;
    bad = 0;
    quiet = 1;
    check_table("self-check", "its CSV", table, &set, baseline);
    quiet = 0;
    return bad;
}

static void self_check(void)
{
    static const char dl[] =
        "model,cache,script,turn,fact,value,distance,distance_tokens,reply,pass\n"
        "m,fp32,s1,5,a,x,2,70,\"r, r\",1\nm,fp32,s1,9,b,y,4,200,r,0\nm,fp32,s2,5,a,x,2,70,r,1\n"
        "m,int8,s1,5,a,x,2,70,r,1\nm,int8,s1,9,b,y,4,200,r,1\nm,int8,s2,5,a,x,2,70,r,0\n";
    static const char hd[] = "| cache | 2 turns (70 tokens) | 4 turns | all |\n|---|---|---|---|\n";
    char t[512];
    snprintf(t, sizeof t, "%s| `fp32` | 2/2 | 0/1 | 2/3 |\n| `int8` | 1/2 | 1/1 | 2/3 |\n", hd);
    KV_CHECK(mismatches(dl, t, NULL) == 0, "self-check: a right dialogue table is refused");
    snprintf(t, sizeof t, "%s| `fp32` | 2/2 | 0/1 | 2/3 |\n| `int8` | 2/2 | 1/1 | 2/3 |\n", hd);
    KV_CHECK(mismatches(dl, t, NULL) == 1, "self-check: a wrong cell passes");
    snprintf(t, sizeof t, "%s| `fp32` | 2/2 | 0/1 | 2/3 |\n| `int8` | 1/2 | 1/1 | 2/32 |\n", hd);
    KV_CHECK(mismatches(dl, t, NULL) == 1, "self-check: a count with a digit more passes");
    snprintf(t, sizeof t, "%s| `fp32` | 2/2 | 0/1 | 2/3 |\n", hd);
    KV_CHECK(mismatches(dl, t, NULL) == 3, "self-check: a cache without a row passes");
    snprintf(t, sizeof t, "%s| `fp32` | 2/2 | 0/1 | 2/3 |\n| `int4` | 1/2 | 1/1 | 2/3 |\n", hd);
    KV_CHECK(mismatches(dl, t, NULL) == 4, "self-check: a cache not in the CSV passes");
    /* against the baseline: only the asks fp32 recalled (s1/5 and s2/5) */
    snprintf(t, sizeof t, "| cache | 2 turns | all |\n|---|---|---|\n| `int8` | 1/2 | 1/2 |\n");
    KV_CHECK(mismatches(dl, t, "fp32") == 0, "self-check: a right baseline table is refused");
    snprintf(t, sizeof t, "| cache | 2 turns | all |\n|---|---|---|\n| `int8` | 1/2 | 2/3 |\n");
    KV_CHECK(mismatches(dl, t, "fp32") == 1, "self-check: the baseline's misses are counted");
    static const char pk[] =
        "model,cache,haystack,length,depth_pct,key,needle_at,answer,found,seconds\n"
        "m,fp32,filler,1024,0,1,5,a,1,1.0\nm,fp32,filler,1024,0,2,5,a,0,1.0\n"
        "m,fp32,filler,1024,50,1,9,a,1,1.0\nm,fp32,filler,1024,50,2,9,a,1,1.0\n";
    static const char ph[] = "| cache | 0 % | 50 % | keys found |\n|---|---|---|---|\n";
    snprintf(t, sizeof t, "%s| `fp32` | 1/2 | yes | 3/4 |\n", ph);
    KV_CHECK(mismatches(pk, t, NULL) == 0, "self-check: a right pass-key table is refused");
    snprintf(t, sizeof t, "%s| `fp32` | no | yes | 3/4 |\n", ph);
    KV_CHECK(mismatches(pk, t, NULL) == 1, "self-check: a wrong pass-key cell passes");
    KV_CHECK(mismatches("model,cache,x\n", t, NULL) < 0, "self-check: an unknown CSV is read");
}

int main(int argc, char **argv)
{
    const char *root = argc > 1 ? argv[1] : NULL;
    if (!root) return fprintf(stderr, "usage: test_docs_tables <source root>\n"), 2;
    self_check();
    glob_t pages;
    char pattern[4096];
    snprintf(pattern, sizeof pattern, "%s/docs/*.md", root);
    const int g = glob(pattern, 0, NULL, &pages);
    KV_CHECK(g == 0, "no page matches %s", pattern);
    int tables = 0;
    const size_t skip = strlen(root) + 1; /* the page's path from the root */
    for (size_t i = 0; g == 0 && i < pages.gl_pathc; i++)
        tables += check_file(root, pages.gl_pathv[i] + skip);
    if (g == 0) globfree(&pages);
    KV_CHECK(tables >= 1, "no table marked <!-- table-from: ... --> under docs/ (%d)", tables);
    printf("%d quoted tables checked against their CSV\n", tables);
    return kv_test_finish();
}
