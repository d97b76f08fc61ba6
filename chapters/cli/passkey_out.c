/*
 * kvlab passkey's tables, CSV and heatmap (passkey_out.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "csv.h"
#include "kv_file.h"
#include "passkey_out.h"

/* keys found in variant v, length li (all lengths: -1), depth di (all depths: -1) */
static int found(const pk_grid *g, int v, int li, int di, int *asked)
{
    int f = 0, n = 0;
    for (int l = 0; l < g->n_len; l++)
        for (int d = 0; d < g->n_dep; d++) {
            if ((li >= 0 && l != li) || (di >= 0 && d != di)) continue;
            const pk_cell *c = g->cells + (((size_t)v * g->n_len + l) * g->n_dep + d) * g->keys;
            for (int k = 0; k < g->keys; k++) f += c[k].r.found;
            n += g->keys;
        }
    if (asked) *asked = n;
    return f;
}

static void frac(char *buf, size_t n, int f, int asked) { snprintf(buf, n, "%d/%d", f, asked); }

void pk_print_grid(FILE *f, const pk_grid *g, int v)
{
    char cell[32];
    fprintf(f, "\ncache %s\n%-10s", g->specs[v], "depth");
    for (int li = 0; li < g->n_len; li++) fprintf(f, " %9d", g->lengths[li]);
    fprintf(f, "   (prompt tokens)\n");
    for (int di = 0; di < g->n_dep; di++) {
        fprintf(f, "%8d %%", g->depths[di]);
        for (int li = 0; li < g->n_len; li++) {
            int asked, k = found(g, v, li, di, &asked);
            frac(cell, sizeof cell, k, asked);
            fprintf(f, " %9s", cell);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "%-10s", "all");
    for (int li = 0; li < g->n_len; li++) {
        int asked, k = found(g, v, li, -1, &asked);
        frac(cell, sizeof cell, k, asked);
        fprintf(f, " %9s", cell);
    }
    int asked, all = found(g, v, -1, -1, &asked);
    fprintf(f, "\nfound %d of %d keys\n", all, asked);
}

void pk_print_summary(FILE *f, const pk_grid *g)
{
    char cell[32];
    int w = 5;
    for (int v = 0; v < g->n_var; v++) {
        const int n = (int)strlen(g->specs[v]);
        w = n > w ? n : w;
    }
    w = w > 40 ? 40 : w;
    fprintf(f, "\nsummary: keys found per cache (row 1 is the reference: a cell the reference "
               "misses is the model's own miss)\n%-*s", w, "cache");
    for (int li = 0; li < g->n_len; li++) fprintf(f, " %9d", g->lengths[li]);
    fprintf(f, " %9s %8s\n", "all", "vs row 1");
    int ref_asked, ref = found(g, 0, -1, -1, &ref_asked);
    for (int v = 0; v < g->n_var; v++) {
        fprintf(f, "%-*.*s", w, w, g->specs[v]);
        for (int li = 0; li < g->n_len; li++) {
            int asked, k = found(g, v, li, -1, &asked);
            frac(cell, sizeof cell, k, asked);
            fprintf(f, " %9s", cell);
        }
        int asked, k = found(g, v, -1, -1, &asked);
        frac(cell, sizeof cell, k, asked);
        fprintf(f, " %9s %+8d\n", cell, k - ref);
    }
}

void pk_write_csv(FILE *f, const pk_grid *g)
{
    kv_csv_printf(f, "model,cache,haystack,length,depth_pct,key,needle_at,answer,found,seconds\n");
    const int per = g->n_len * g->n_dep * g->keys;
    for (int v = 0; v < g->n_var; v++)
        for (int i = 0; i < per; i++) {
            const pk_cell *c = &g->cells[(size_t)v * per + i];
            kv_csv_printf(f, "%s,%s,%s,%d,%d,%d,%d,%s,%d,%.3f\n", g->model, g->specs[v],
                          g->haystack, c->length, c->depth_pct, c->r.key, c->r.needle_at,
                          c->r.answer, c->r.found, c->r.seconds);
        }
}

/* the XML-safe text of a spec (specs hold no markup, but a file name might) */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else fputc(*s, f);
    }
}

/* A panel per length: a row per variant, a column per depth; the cell's green is the share of
 * keys found (white none, dark all), its text found/asked. */
void pk_write_svg(FILE *f, const pk_grid *g)
{
    /* wide enough for the title: 13 px text, under 8 px a character (DejaVu Sans) */
    const int cw = 48, ch = 20, left = 300, top = 44, gap = 40;
    const int title = 8 * (int)(60 + strlen(g->model) + strlen(g->haystack));
    int pw = left + cw * g->n_dep + 20;
    pw = pw > title ? pw : title;
    const int ph = top + ch * g->n_var + gap;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n", pw,
            ph * g->n_len + 10, pw, ph * g->n_len + 10);
    for (int li = 0; li < g->n_len; li++) {
        const int y0 = li * ph;
        fprintf(f, "<text x=\"4\" y=\"%d\" font-size=\"13\">pass key, %s, %d-token prompts, "
                   "haystack ", y0 + 16, g->model, g->lengths[li]);
        xml_text(f, g->haystack);
        fprintf(f, " (cell: keys found)</text>\n");
        for (int d = 0; d < g->n_dep; d++)
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d%%</text>\n",
                    left + d * cw + cw / 2, y0 + top - 6, g->depths[d]);
        for (int v = 0; v < g->n_var; v++) {
            const int y = y0 + top + v * ch;
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", left - 6, y + ch / 2 + 4);
            char label[48];
            snprintf(label, sizeof label, "%.38s%s", g->specs[v],
                     strlen(g->specs[v]) > 38 ? "..." : "");
            xml_text(f, label);
            fprintf(f, "</text>\n");
            for (int d = 0; d < g->n_dep; d++) {
                int asked, k = found(g, v, li, d, &asked);
                const double share = asked ? (double)k / asked : 0.0;
                fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#1a9850\" "
                           "fill-opacity=\"%.2f\" stroke=\"#999\" stroke-width=\"1\"/>\n",
                        left + d * cw, y, cw - 2, ch - 2, 0.08 + 0.92 * share);
                fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d/%d</text>\n",
                        left + d * cw + cw / 2 - 1, y + ch / 2 + 3, k, asked);
            }
        }
        fprintf(f, "<text x=\"4\" y=\"%d\" fill=\"#555\">rows: cache; columns: needle depth "
                   "in the haystack</text>\n", y0 + top + g->n_var * ch + 16);
    }
    fprintf(f, "</svg>\n");
}

int pk_write_file(const char *cmd, const char *opt, const char *path,
                  void (*fn)(FILE *, const pk_grid *), const pk_grid *g)
{
    if (!strcmp(opt, "--csv") && kv_cli_csv_stdout()) { /* --csv -: the real stdout */
        fn(kv_cli_csv_stdout(), g);
        return KV_EXIT_OK;
    }
    kv_file_out o;
    kv_err err = {{0}};
    int st = kv_file_create(path, &o, &err);
    if (!st) {
        fn(o.f, g);
        st = kv_file_commit(&o, &err);
    }
    return st ? kv_cli_write_fail(cmd, opt, &err) : KV_EXIT_OK;
}
