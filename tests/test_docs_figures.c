/*
 * The figures against their frames: no text of an SVG in docs/figures/ runs outside its
 * viewBox (the chapters embed them; a clipped label or title is lost on the page).
 *
 *   test_docs_figures <source root>
 *
 * No renderer is needed: each <text>'s extent is estimated from its font size and its
 * characters' advance widths in DejaVu Sans, the widest of the common sans-serif faces (a
 * browser on Linux draws "sans-serif" with it; Helvetica and Arial are narrower, so a text
 * that fits here fits there). The box runs from 0.8 em above the baseline to 0.25 em below
 * it, is placed by text-anchor (start, middle, end) and carried through every transform of
 * the enclosing groups (translate, rotate: gnuplot's axis labels). Font size, anchor and
 * weight are inherited from the <svg> and <g> elements as SVG inherits them. A tspan's own
 * size (gnuplot's exponents) is not followed: the text's size counts for every character.
 * Prints each text that does not fit, with the figure, the text and by how much, and
 * "N passed, M failed".
 */
#include "common/kv_test.h"
#include "common/kv_docs.h"

#include <dirent.h>
#include <math.h>
#include <string.h>

/* DejaVu Sans advance widths of ASCII 32..126, in hundredths of an em (regular, bold); any
 * other character (UTF-8 sequence) counts as 0.65 em. */
static const unsigned char width_em100[2][95] = {
    {/* regular */
    32, 40, 46, 84, 64, 95, 78, 27, 39, 39, 50, 84, 32, 36, 32, 34, 64, 64, 64, 64, 64, 64, 64, 64,
    64, 64, 34, 34, 84, 84, 84, 53, 100, 68, 69, 70, 77, 63, 58, 77, 75, 29, 29, 66, 56, 86, 75, 79,
    60, 79, 69, 63, 61, 73, 68, 99, 69, 61, 69, 39, 34, 39, 84, 50, 50, 61, 63, 55, 63, 62, 35, 63,
    63, 28, 28, 58, 28, 97, 63, 61, 63, 63, 41, 52, 39, 63, 59, 82, 59, 59, 52, 64, 34, 64, 84},
    {/* bold */
    35, 46, 52, 84, 70, 100, 87, 31, 46, 46, 52, 84, 38, 42, 38, 37, 70, 70, 70, 70, 70, 70, 70, 70,
    70, 70, 40, 40, 84, 84, 84, 58, 100, 77, 76, 73, 83, 68, 68, 82, 84, 37, 37, 77, 64, 100, 84, 85,
    73, 85, 77, 72, 68, 81, 77, 110, 77, 72, 73, 46, 37, 46, 84, 50, 50, 67, 72, 59, 72, 68, 44, 72,
    71, 34, 34, 67, 34, 104, 71, 69, 72, 72, 49, 60, 48, 71, 65, 92, 65, 65, 58, 71, 37, 71, 84}};

/* The width of text in em: ASCII by the table, an entity (&#x27; &amp;) as one character. */
static double text_em(const char *s, size_t n, int bold)
{
    double w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '&') {
            const char *semi = memchr(s + i, ';', n - i);
            if (semi && semi - (s + i) < 10) {
                const char *ent = s + i;
                c = strncmp(ent, "&amp;", 5) == 0 ? '&' : strncmp(ent, "&lt;", 4) == 0 ? '<'
                  : strncmp(ent, "&gt;", 4) == 0 ? '>' : strncmp(ent, "&#x27;", 6) == 0 ? '\''
                  : strncmp(ent, "&quot;", 6) == 0 ? '"' : 0;
                w += c ? width_em100[bold != 0][c - 32] / 100.0 : 0.65;
                i = (size_t)(semi - s) + 1;
                continue;
            }
        }
        if (c >= 32 && c < 127) {
            w += width_em100[bold != 0][c - 32] / 100.0;
            i++;
        } else if (c >= 0xc0 || c < 32) { /* a UTF-8 lead byte (continuations add nothing) */
            w += c < 32 ? 0 : 0.65;
            i++;
        } else {
            i++;
        }
    }
    return w;
}

/* an affine map: (x, y) -> (a x + c y + e, b x + d y + f), as SVG writes matrix(a b c d e f) */
typedef struct { double a, b, c, d, e, f; } affine;

static affine compose(affine m, affine t) /* m then t inside it: m * t */
{
    return (affine){m.a * t.a + m.c * t.b, m.b * t.a + m.d * t.b, m.a * t.c + m.c * t.d,
                    m.b * t.c + m.d * t.d, m.a * t.e + m.c * t.f + m.e, m.b * t.e + m.d * t.f + m.f};
}

/* transform="translate(x,y) rotate(a)": the groups' and texts' transforms (others: identity) */
static affine parse_transform(const char *s, size_t n)
{
    affine m = {1, 0, 0, 1, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double v[6] = {0};
        if (strncmp(s + i, "translate(", 10) == 0) {
            sscanf(s + i + 10, "%lf%*[ ,]%lf", &v[0], &v[1]);
            m = compose(m, (affine){1, 0, 0, 1, v[0], v[1]});
        } else if (strncmp(s + i, "rotate(", 7) == 0) {
            sscanf(s + i + 7, "%lf", &v[0]);
            const double r = v[0] * 3.14159265358979 / 180;
            m = compose(m, (affine){cos(r), sin(r), -sin(r), cos(r), 0, 0});
        } else {
            continue;
        }
        const char *close = memchr(s + i, ')', n - i);
        if (!close) break;
        i = (size_t)(close - s);
    }
    return m;
}

/* The value of attribute name in the tag [t, e), or NULL; *len its length. */
static const char *attr(const char *t, const char *e, const char *name, size_t *len)
{
    const size_t n = strlen(name);
    for (const char *p = t + 1; p + n + 2 < e; p++) { /* t is the tag's '<': p[-1] exists */
        if ((p[-1] == ' ' || p[-1] == '\t' || p[-1] == '\n') && strncmp(p, name, n) == 0 &&
            p[n] == '=' && (p[n + 1] == '"' || p[n + 1] == '\'')) {
            const char q = p[n + 1], *v = p + n + 2, *ve = memchr(v, q, (size_t)(e - v));
            if (!ve) return NULL;
            *len = (size_t)(ve - v);
            return v;
        }
    }
    return NULL;
}

typedef struct {
    double size;
    int anchor; /* 0 start, 1 middle, 2 end */
    int bold;
    affine m;
} text_state;

/* The inherited attributes a tag [t, e) sets on top of s. */
static text_state apply(text_state s, const char *t, const char *e)
{
    size_t n;
    const char *v;
    if ((v = attr(t, e, "font-size", &n))) s.size = atof(v);
    if ((v = attr(t, e, "text-anchor", &n)))
        s.anchor = strncmp(v, "middle", 6) == 0 ? 1 : strncmp(v, "end", 3) == 0 ? 2 : 0;
    if ((v = attr(t, e, "font-weight", &n))) s.bold = strncmp(v, "bold", 4) == 0;
    if ((v = attr(t, e, "transform", &n))) s.m = compose(s.m, parse_transform(v, n));
    return s;
}

static void check_figure(const char *root, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/figures/%s", root, name);
    char *svg = kv_docs_slurp(path, NULL);
    KV_CHECK(svg != NULL, "cannot read %s", path);
    if (!svg) return;

    enum { DEPTH = 64 };
    text_state stack[DEPTH] = {{16, 0, 0, {1, 0, 0, 1, 0, 0}}};
    int top = 0, texts = 0, outside = 0;
    double vx = 0, vy = 0, vw = 0, vh = 0;
    for (const char *t = strchr(svg, '<'); t; t = strchr(t + 1, '<')) {
        const char *e = strchr(t, '>');
        if (!e) break;
        size_t n;
        const char *v;
        if (strncmp(t, "<svg", 4) == 0 && top == 0 && vw == 0) {
            if ((v = attr(t, e, "viewBox", &n))) {
                sscanf(v, "%lf%*[ ,]%lf%*[ ,]%lf%*[ ,]%lf", &vx, &vy, &vw, &vh);
            } else {
                if ((v = attr(t, e, "width", &n))) vw = atof(v);
                if ((v = attr(t, e, "height", &n))) vh = atof(v);
            }
            stack[0] = apply(stack[0], t, e);
        } else if (strncmp(t, "<g", 2) == 0 && (t[2] == ' ' || t[2] == '>')) {
            if (e[-1] != '/' && top + 1 < DEPTH) {
                stack[top + 1] = apply(stack[top], t, e);
                top++;
            }
        } else if (strncmp(t, "</g>", 4) == 0) {
            if (top > 0) top--;
        } else if (strncmp(t, "<text", 5) == 0 && (t[5] == ' ' || t[5] == '>')) {
            const text_state s = apply(stack[top], t, e);
            double x = 0, y = 0;
            if ((v = attr(t, e, "x", &n))) x = atof(v);
            if ((v = attr(t, e, "y", &n))) y = atof(v);
            const char *end = strstr(e, "</text>");
            if (!end) break;
            /* the characters: the body without its tags (tspans) */
            char body[2048];
            size_t k = 0;
            for (const char *c = e + 1; c < end && k + 1 < sizeof body; c++) {
                if (*c == '<') {
                    c = strchr(c, '>');
                    if (!c || c > end) break;
                    continue;
                }
                if (*c != '\n' && *c != '\t') body[k++] = *c;
            }
            body[k] = '\0';
            while (k && body[k - 1] == ' ') body[--k] = '\0';
            const char *b0 = body + strspn(body, " ");
            t = end;
            if (!*b0) continue;
            texts++;
            const double w = text_em(body, k, s.bold) * s.size;
            const double x0 = x - (s.anchor == 1 ? w / 2 : s.anchor == 2 ? w : 0);
            const double cx[2] = {x0, x0 + w}, cy[2] = {y - 0.8 * s.size, y + 0.25 * s.size};
            double lo_x = 1e30, hi_x = -1e30, lo_y = 1e30, hi_y = -1e30;
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) {
                    const double px = s.m.a * cx[i] + s.m.c * cy[j] + s.m.e;
                    const double py = s.m.b * cx[i] + s.m.d * cy[j] + s.m.f;
                    lo_x = fmin(lo_x, px), hi_x = fmax(hi_x, px);
                    lo_y = fmin(lo_y, py), hi_y = fmax(hi_y, py);
                }
            const double over = fmax(fmax(vx - lo_x, hi_x - (vx + vw)), fmax(vy - lo_y, hi_y - (vy + vh)));
            if (over > 1.0) {
                outside++;
                printf("FAIL docs/figures/%s: \"%.60s\" (%.0f px, %.0f px wide at %g px) runs %.0f px "
                         "outside the %gx%g frame\n", name, b0, x0, w, s.size, over, vw, vh);
            }
        }
    }
    KV_CHECK(vw > 0 && vh > 0, "docs/figures/%s: no viewBox or width/height", name);
    KV_CHECK(texts > 0, "docs/figures/%s: no text read", name);
    KV_CHECK(outside == 0, "docs/figures/%s: %d of its %d texts outside the frame", name, outside,
             texts);
    free(svg);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_docs_figures <source root>\n");
        return 2;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/docs/figures", argv[1]);
    DIR *d = opendir(dir);
    KV_CHECK(d != NULL, "cannot open %s", dir);
    char *names[512];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < 512;) {
        const size_t l = strlen(e->d_name);
        if (l > 4 && strcmp(e->d_name + l - 4, ".svg") == 0) names[n++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    KV_CHECK(n >= 20, "only %d figures in %s", n, dir);
    for (int i = 0; i < n; i++) {
        check_figure(argv[1], names[i]);
        free(names[i]);
    }
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}
