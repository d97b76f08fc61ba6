/*
 * The pass-key tables the docs quote, against the CSV of the run they quote (label docs).
 *
 * A Markdown table that quotes a run stands right after a marker naming the run's CSV,
 * committed under docs/data/:
 *
 *   <!-- table-from: docs/data/passkey-ch04-512.csv -->
 *   | cache | 0 % | 50 % | 100 % | keys found |
 *   |---|---|---|---|---|
 *   | `fp32`, `fp16` | yes | yes | yes | 3/3 each |
 *
 * The CSV is kvlab passkey --csv's (model,cache,haystack,length,depth_pct,key,needle_at,answer,
 * found,seconds). Every cache named in backticks in a row's first cell must be a cache of the
 * CSV; a column headed "D %" is that cache's cell at depth D: "yes" when every key asked there
 * was found, "no" when none was, "k/n" otherwise; the last column ("keys found") is the count
 * over all the cache's rows, "k/n" (with " each" after it when the row names several). And
 * every cache of the CSV has a row. So a number in such a table is the CSV's, and a rerun
 * that changes an answer shows in the CSV's diff.
 */
#include "common/kv_test.h"
#include "common/kv_docs.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 512

typedef struct {
    char cache[256];
    int depth, found;
} csv_row;

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

/* The CSV's rows: the cache (field 2), the depth (field 5) and found (field 9). */
static int read_csv(const char *path, csv_row *rows, int cap)
{
    char *text = kv_docs_slurp(path, NULL);
    if (!text) return -1;
    const char *p = strchr(text, '\n');
    int n = 0;
    while (p && *++p && n < cap) {
        char f[10][256];
        int k = 0, sep = ',';
        while (sep == ',' && k < 10) sep = csv_field(&p, f[k++], sizeof f[0]);
        while (sep == ',') sep = csv_field(&p, f[0], sizeof f[0]); /* extra fields: ignored */
        if (k < 10) break;
        snprintf(rows[n].cache, sizeof rows[n].cache, "%s", f[1]);
        rows[n].depth = atoi(f[4]);
        rows[n].found = atoi(f[8]);
        n++;
        if (!sep) break;
        p--; /* the loop steps past the separator again */
    }
    free(text);
    return n;
}

/* cell k (0-based) of a table line "| a | b | c |" into out [cap]; 0 when absent */
static int cell(const char *line, int k, char *out, size_t cap)
{
    const char *p = strchr(line, '|');
    for (int i = 0; p && i < k; i++) p = strchr(p + 1, '|');
    const char *e = p ? strchr(p + 1, '|') : NULL;
    const char *nl = p ? strchr(p, '\n') : NULL;
    if (!p || !e || (nl && e > nl)) return 0;
    p++;
    while (*p == ' ') p++;
    size_t len = (size_t)(e - p);
    while (len && p[len - 1] == ' ') len--;
    if (len >= cap) len = cap - 1;
    memcpy(out, p, len);
    out[len] = '\0';
    return 1;
}

/* "yes", "no" or "k/n" for k found of n asked */
static void verdict(int k, int n, char *out, size_t cap)
{
    if (k == n) snprintf(out, cap, "yes");
    else if (k == 0) snprintf(out, cap, "no");
    else snprintf(out, cap, "%d/%d", k, n);
}

/* One marked table at @p t (its header line) against the CSV's rows. */
static void check_table(const char *md, const char *csv, const char *t, const csv_row *rows,
                        int n)
{
    char head[64], c[1024];
    int n_cols = 0, depth_of[32];
    while (n_cols < 32 && cell(t, n_cols, head, sizeof head)) {
        int d = -1;
        if (strchr(head, '%')) d = atoi(head);
        depth_of[n_cols++] = d;
    }
    KV_CHECK(n_cols >= 3 && depth_of[n_cols - 1] < 0, "%s: the table after the marker of %s has "
             "no cache, depth and count columns", md, csv);
    int covered[MAX_ROWS] = {0};
    const char *line = strchr(t, '\n');
    line = line ? strchr(line + 1, '\n') : NULL; /* past the |---| line */
    for (; line && line[1] == '|'; line = strchr(line + 1, '\n')) {
        const char *row = line + 1;
        if (!cell(row, 0, c, sizeof c)) break;
        int names = 0;
        for (const char *b = strchr(c, '`'); b; b = strchr(b, '`')) {
            const char *e = strchr(b + 1, '`');
            if (!e) break;
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(e - b - 1), b + 1);
            b = e + 1;
            names++;
            int k_all = 0, n_all = 0;
            for (int i = 0; i < n; i++)
                if (!strcmp(rows[i].cache, name)) {
                    k_all += rows[i].found;
                    n_all++;
                    covered[i] = 1;
                }
            KV_CHECK(n_all > 0, "%s: `%s` is not a cache of %s", md, name, csv);
            for (int col = 1; n_all && col < n_cols; col++) {
                char want[32], got[64];
                if (!cell(row, col, got, sizeof got)) break;
                if (depth_of[col] >= 0) {
                    int k = 0, m = 0;
                    for (int i = 0; i < n; i++)
                        if (!strcmp(rows[i].cache, name) && rows[i].depth == depth_of[col]) {
                            k += rows[i].found;
                            m++;
                        }
                    verdict(k, m, want, sizeof want);
                    KV_CHECK(m > 0 && !strcmp(got, want), "%s: `%s` at depth %d %%: the table says "
                             "'%s', %s '%s'", md, name, depth_of[col], got, csv, m ? want : "nothing");
                } else if (col == n_cols - 1) {
                    snprintf(want, sizeof want, "%d/%d", k_all, n_all);
                    KV_CHECK(!strncmp(got, want, strlen(want)), "%s: `%s` found '%s', %s %s", md,
                             name, got, csv, want);
                }
            }
        }
        KV_CHECK(names > 0, "%s: a row of the table from %s names no cache in backticks", md, csv);
    }
    for (int i = 0; i < n; i++)
        KV_CHECK(covered[i], "%s: %s's cache %s has no row in the table", md, csv, rows[i].cache);
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
        char csv[512], full[4096];
        if (!e || (size_t)(e - a) >= sizeof csv) continue;
        snprintf(csv, sizeof csv, "%.*s", (int)(e - a), a);
        snprintf(full, sizeof full, "%s/%s", root, csv);
        static csv_row rows[MAX_ROWS];
        const int n = read_csv(full, rows, MAX_ROWS);
        KV_CHECK(n > 0, "%s: %s is missing or has no rows", rel, csv);
        const char *t = strchr(e, '\n');
        KV_CHECK(t && t[1] == '|', "%s: no table right after the marker of %s", rel, csv);
        if (n > 0 && t && t[1] == '|') check_table(rel, csv, t + 1, rows, n);
        tables++;
    }
    free(s);
    return tables;
}

int main(int argc, char **argv)
{
    const char *root = argc > 1 ? argv[1] : NULL;
    if (!root) return fprintf(stderr, "usage: test_docs_tables <source root>\n"), 2;
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
