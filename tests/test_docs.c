/*
 * The documentation against the tree (issue: chapters a student can learn from).
 *
 *   test_docs <source root>            names: every name a README puts in backticks exists
 *   test_docs <source root> <kvlab>    output: every quoted kvlab output still matches
 *
 * Names. In chapters/NN-* /README.md, README.md and docs/NAME.md (but design.md's templates
 * and references.md's files of other projects), outside fenced blocks, each `inline code` span is read for
 *   - a call `name(...)`: name is an identifier of the code (C/CUDA sources with comments and
 *     string literals removed, plus the words of the CMake files, so test names count);
 *   - a bare `kv_x`, `kvq_x`, `kvcu_x`, `KV_X`, `test_x`, `emu_x` or `x_kernel...`: the same;
 *   - a file or path (`kv_cache.c`, `reference_cpu/cache/`, `datasets/traces/bursty.csv`): it
 *     exists, from the root, from the README's folder, or as the tail of a file's path;
 *     `file:N` also needs the file to have N lines;
 *   - "`name()` in `file`": the file contains name;
 *   - "`name()` at `file:N`" (a code walk's anchor): line N of the file contains name;
 *     both also when a line break falls between the name and the file;
 *   and every local link or image, [text](path) / ![alt](path), points at a file of the tree.
 * A code block marked <!-- quote: path/file.c:A-B --> is lines A..B of that file, character for
 * character (a code walk's quotation of the reference).
 * Output. A README block marked
 *     <!-- kvlab: tour --chapter 1 -->
 *     ```text
 *     ...
 *     ```
 * is compared with the stdout of `kvlab tour --chapter 1` run from the source root, line by
 * line, a run of blanks counting as one. In the quoted block, '…' stands for any run of
 * characters (a measured time: "… s", "x…"; a measured size with its unit), and a line that is
 * only '…' skips any number of lines. Every other character, so every counted number, must be
 * exactly what kvlab prints now.
 * Prints each mismatch and "N passed, M failed".
 */
#include "common/kv_test.h"
#include "common/kv_docs.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

/* ---- a set of strings (open addressing) ---------------------------------------------------- */

typedef struct {
    char **slot; /* [cap], NULL = empty */
    size_t cap, n;
} strset;

static size_t hash_of(const char *s, size_t n)
{
    size_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int set_has(const strset *set, const char *s, size_t n)
{
    for (size_t i = hash_of(s, n) & (set->cap - 1);; i = (i + 1) & (set->cap - 1)) {
        const char *e = set->slot[i];
        if (!e) return 0;
        if (strlen(e) == n && memcmp(e, s, n) == 0) return 1;
    }
}

static void set_add(strset *set, const char *s, size_t n)
{
    if (2 * (set->n + 1) > set->cap) {
        strset big = {calloc(set->cap * 2, sizeof(char *)), set->cap * 2, 0};
        for (size_t i = 0; i < set->cap; i++)
            if (set->slot[i]) set_add(&big, set->slot[i], strlen(set->slot[i]));
        for (size_t i = 0; i < set->cap; i++) free(set->slot[i]);
        free(set->slot);
        *set = big;
    }
    if (set_has(set, s, n)) return;
    size_t i = hash_of(s, n) & (set->cap - 1);
    while (set->slot[i]) i = (i + 1) & (set->cap - 1);
    set->slot[i] = strndup(s, n);
    set->n++;
}

/* ---- the tree ---------------------------------------------------------------------------- */

static strset idents;      /* identifiers of the code and words of the CMake files */
static char **files;       /* [n_files] paths relative to the root */
static size_t n_files, cap_files;

static int is_id0(int c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_id(int c) { return is_id0(c) || (c >= '0' && c <= '9'); }

/* Add the identifiers of text; with code = 1, skip comments and string/char literals. */
static void add_words(const char *t, int code)
{
    for (const char *p = t; *p;) {
        if (code && p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
        } else if (code && p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') p++;
        } else if (code && (*p == '"' || *p == '\'')) {
            const char q = *p++;
            while (*p && *p != q && *p != '\n') p += (*p == '\\' && p[1]) ? 2 : 1;
            if (*p) p++;
        } else if (is_id0(*p) && (p == t || !is_id(p[-1]))) {
            const char *s = p;
            while (is_id(*p)) p++;
            set_add(&idents, s, (size_t)(p - s));
        } else {
            p++;
        }
    }
}

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

static void walk(const char *root, const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[4096], full[8192];
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat st;
        if (stat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            /* build folders and the trainer's virtual environments are not the tree */
            if (!*rel && strncmp(e->d_name, "build", 5) == 0) continue;
            if (strcmp(e->d_name, "__pycache__") == 0 || strcmp(e->d_name, "venv") == 0) continue;
            walk(root, sub);
            continue;
        }
        if (n_files == cap_files) {
            cap_files = cap_files ? 2 * cap_files : 1024;
            files = realloc(files, cap_files * sizeof *files);
        }
        files[n_files++] = strdup(sub);
        const int code = ends_with(sub, ".c") || ends_with(sub, ".h") || ends_with(sub, ".cu") ||
                         ends_with(sub, ".cuh");
        const int cmake = ends_with(sub, ".cmake") || strcmp(e->d_name, "CMakeLists.txt") == 0 ||
                          ends_with(sub, ".json");
        if (code || cmake) {
            char *t = kv_docs_slurp(full, NULL);
            if (t) add_words(t, code);
            free(t);
        }
    }
    closedir(d);
}

/* The file a README names: from the root, from the README's folder, or a path tail. */
static const char *find_file(const char *name, const char *readme_dir)
{
    static char hit[4096];
    char want[1024];
    snprintf(want, sizeof want, "%s", name);
    size_t n = strlen(want);
    while (n > 1 && want[n - 1] == '/') want[--n] = '\0';
    for (size_t i = 0; i < n_files; i++) {
        const char *f = files[i];
        size_t fl = strlen(f);
        char local[4096];
        snprintf(local, sizeof local, "%s/%s", readme_dir, want);
        /* a file, or a folder: some file lies under it */
        if (strcmp(f, want) == 0 || strcmp(f, local) == 0 ||
            (strncmp(f, want, n) == 0 && f[n] == '/') ||
            (strncmp(f, local, strlen(local)) == 0 && f[strlen(local)] == '/') ||
            (fl > n && strcmp(f + fl - n, want) == 0 && f[fl - n - 1] == '/')) {
            snprintf(hit, sizeof hit, "%s", f);
            return hit;
        }
    }
    return NULL;
}

static const char *const tops[] = {"reference_cpu/", "cuda/", "chapters/", "tests/", "docs/",
                                   "datasets/", "tools/", "cmake/"};
static const char *const exts[] = {".cuh", ".cu", ".cmake", ".csv", ".c", ".h", ".md", ".sh",
                                   ".needle", ".py"};

/* Is [s, e) a name of the tree: a path under a top folder or a file with a known extension? */
static int looks_like_path(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof tops / sizeof *tops; i++)
        if (n > strlen(tops[i]) && strncmp(s, tops[i], strlen(tops[i])) == 0) return 1;
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++) {
        size_t m = strlen(exts[i]);
        if (n > m && memcmp(s + n - m, exts[i], m) == 0 && is_id(s[n - m - 1])) return 1;
    }
    return 0;
}

static int has_prefix(const char *s, size_t n, const char *pre)
{
    return n > strlen(pre) && strncmp(s, pre, strlen(pre)) == 0;
}

static void check_span(const char *readme, int line, const char *span, const char *readme_dir,
                       const char *root)
{
    const size_t len = strlen(span);
    /* calls: name( */
    for (const char *p = span; *p; p++) {
        if (!is_id0(*p) || (p > span && (is_id(p[-1]) || p[-1] == '.' || p[-1] == '$'))) continue;
        const char *s = p;
        while (is_id(*p)) p++;
        if (*p == '(' && (size_t)(p - s) > 2)
            KV_CHECK(set_has(&idents, s, (size_t)(p - s)), "%s:%d: `%.*s()` is not in the code",
                     readme, line, (int)(p - s), s);
        if (!*p) break;
    }
    /* a bare name of ours */
    int bare = len > 0;
    for (size_t i = 0; i < len; i++) bare &= is_id(span[i]);
    if (bare && is_id0(span[0]) &&
        (has_prefix(span, len, "kv_") || has_prefix(span, len, "kvq_") ||
         has_prefix(span, len, "kvcu_") || has_prefix(span, len, "KV_") ||
         has_prefix(span, len, "KVCU_") || has_prefix(span, len, "test_") ||
         has_prefix(span, len, "emu_") || strstr(span, "_kernel")))
        KV_CHECK(set_has(&idents, span, len), "%s:%d: `%s` is not in the code", readme, line, span);
    /* files and paths, each word of the span; file:N anchors */
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", span);
    char *redirect = strchr(buf, '>'); /* what a command writes need not exist */
    if (redirect) *redirect = '\0';
    int after_option = 0;               /* `--csv out.csv`: an output, unless under a top folder */
    char *save = NULL;
    for (char *w = strtok_r(buf, " ,;()=<>|\"'", &save); w; w = strtok_r(NULL, " ,;()=<>|\"'", &save)) {
        const int option_value = after_option;
        after_option = strncmp(w, "--", 2) == 0;
        if (strncmp(w, "./", 2) == 0 || strncmp(w, "build", 5) == 0 || strchr(w, '*') ||
            strchr(w, '<') || strchr(w, '$'))
            continue;
        int under_top = 0;
        for (size_t i = 0; i < sizeof tops / sizeof *tops; i++)
            under_top |= strncmp(w, tops[i], strlen(tops[i])) == 0;
        if (option_value && !under_top) continue;
        char *colon = strchr(w, ':');
        long at = 0;
        if (colon) {
            at = strtol(colon + 1, NULL, 10);
            *colon = '\0';
        }
        size_t n = strlen(w);
        while (n && (w[n - 1] == '.' || w[n - 1] == '/')) n--; /* a sentence's full stop */
        if (!looks_like_path(w, n) && !(n && w[strlen(w) - 1] == '/' && looks_like_path(w, strlen(w))))
            continue;
        w[n] = '\0';
        const char *f = find_file(w, readme_dir);
        KV_CHECK(f != NULL, "%s:%d: `%s` is not a file of the tree", readme, line, w);
        if (f && at > 0) {
            char full[4096];
            snprintf(full, sizeof full, "%s/%s", root, f);
            char *t = kv_docs_slurp(full, NULL);
            long lines = 0;
            for (const char *c = t; t && *c; c++) lines += *c == '\n';
            KV_CHECK(lines >= at, "%s:%d: `%s:%ld` but the file has %ld lines", readme, line, w,
                     at, lines);
            free(t);
        }
    }
}

/* Line n (from 1) of text, or NULL. */
static const char *line_at(const char *t, long n)
{
    for (long k = 1; t && *t && k < n; k++) {
        t = strchr(t, '\n');
        if (t) t++;
    }
    return t && *t ? t : NULL;
}

/* Does [s, s + n) contain name as a whole word? */
static int has_word(const char *s, size_t n, const char *name)
{
    const size_t m = strlen(name);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(s + i, name, m) == 0 && (i == 0 || !is_id(s[i - 1])) &&
            (i + m == n || !is_id(s[i + m])))
            return 1;
    return 0;
}

/* Does a line of t define (or declare, or #define) name: a line that starts in column 0, not
 * with "return", with name( before any ';' or '='? (A call is indented; a definition,
 * a prototype and a macro are not.) */
static int defines(const char *t, const char *name)
{
    const size_t m = strlen(name);
    for (const char *l = t; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        if (*l == ' ' || *l == '\t' || *l == '\n' || strncmp(l, "return", 6) == 0) continue;
        const char *e = strchr(l, '\n');
        const size_t n = e ? (size_t)(e - l) : strlen(l);
        for (size_t i = 0; i + m < n && l[i] != ';' && l[i] != '='; i++)
            if (memcmp(l + i, name, m) == 0 && (i == 0 || !is_id(l[i - 1])) &&
                (l[i + m] == '(' || (l[i + m] == ' ' && strncmp(l, "#define", 7) == 0)))
                return 1;
    }
    return 0;
}

/* "`name()` in `file`" and "`name()` (`file`)": the file defines name (C and CUDA: a line in
 * column 0, defines() above; any other file: contains it), so prose credits a function to the
 * file that holds it, not to one that calls it. "`name()` at `file:N`" (a code walk's anchor,
 * which may be a call): line N of the file contains name. */
static void check_in_file(const char *readme, int line, const char *text, const char *readme_dir,
                          const char *root, const char *joint)
{
    for (const char *p = strstr(text, joint); p; p = strstr(p + 1, joint)) {
        const char *s = p;
        while (s > text && is_id(s[-1])) s--;
        if (s == p || s == text || s[-1] != '`') continue;
        const char *f0 = p + strlen(joint), *f1 = strchr(f0, '`');
        if (!f1) continue;
        const char *colon = memchr(f0, ':', (size_t)(f1 - f0));
        const long at = colon ? strtol(colon + 1, NULL, 10) : 0;
        if (joint[4] == 'a' && at < 1) continue; /* "at" without a line: not an anchor */
        char name[256], fname[1024];
        snprintf(name, sizeof name, "%.*s", (int)(p - s), s);
        snprintf(fname, sizeof fname, "%.*s", (int)((colon ? colon : f1) - f0), f0);
        const char *f = find_file(fname, readme_dir);
        if (!f) continue; /* reported by check_span */
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", root, f);
        char *t = kv_docs_slurp(full, NULL);
        const char *l = at > 0 ? line_at(t, at) : t;
        const char *e = l && at > 0 ? strchr(l, '\n') : NULL;
        const int code = ends_with(f, ".c") || ends_with(f, ".h") || ends_with(f, ".cu") ||
                         ends_with(f, ".cuh");
        const int found = at > 0 || !code ? l && has_word(l, e ? (size_t)(e - l) : strlen(l), name)
                                          : t && defines(t, name);
        if (at > 0)
            KV_CHECK(found, "%s:%d: line %ld of `%s` does not contain `%s`", readme, line, at,
                     fname, name);
        else
            KV_CHECK(found, "%s:%d: `%s()` is not defined in `%s`", readme, line, name, fname);
        free(t);
    }
}

/* Markdown links and images, [text](target): a local target exists (relative to the README). */
static void check_links(const char *readme, int line, const char *text, const char *readme_dir,
                        const char *root)
{
    for (const char *p = strstr(text, "]("); p; p = strstr(p + 1, "](")) {
        const char *t0 = p + 2, *t1 = strchr(t0, ')');
        if (!t1 || t1 == t0 || strncmp(t0, "http", 4) == 0 || *t0 == '#' ||
            strncmp(t0, "mailto:", 7) == 0)
            continue;
        char target[1024], joined[5200], norm[8192];
        snprintf(target, sizeof target, "%.*s", (int)(t1 - t0), t0);
        char *hash = strchr(target, '#');
        if (hash) *hash = '\0';
        if (!*target || strchr(target, ' ')) continue;
        snprintf(joined, sizeof joined, "%s/%s", readme_dir, target);
        /* resolve "." and ".." segments */
        char *segs[256];
        int n = 0;
        char *save = NULL;
        for (char *g = strtok_r(joined, "/", &save); g && n < 256; g = strtok_r(NULL, "/", &save)) {
            if (strcmp(g, ".") == 0) continue;
            if (strcmp(g, "..") == 0) {
                if (n > 0) n--;
                continue;
            }
            segs[n++] = g;
        }
        size_t at = (size_t)snprintf(norm, sizeof norm, "%s", root);
        for (int i = 0; i < n && at < sizeof norm; i++)
            at += (size_t)snprintf(norm + at, sizeof norm - at, "/%s", segs[i]);
        struct stat st;
        KV_CHECK(stat(norm, &st) == 0, "%s:%d: the link target %s does not exist", readme, line,
                 target);
    }
}

/* <!-- quote: file:A-B --> then a fenced block: the block is lines A..B of the file. */
static void check_quotes(const char *root, const char *readme, const char *text,
                         const char *readme_dir)
{
    for (const char *m = strstr(text, "<!-- quote: "); m; m = strstr(m + 1, "<!-- quote: ")) {
        char fname[1024];
        long a = 0, b = 0;
        if (sscanf(m + strlen("<!-- quote: "), "%1023[^:]:%ld-%ld", fname, &a, &b) != 3 || a < 1 ||
            b < a) {
            KV_CHECK(0, "%s: a quote marker without file:A-B", readme);
            continue;
        }
        const char *open = strstr(m, "\n```"), *body = open ? strchr(open + 1, '\n') : NULL;
        const char *close = body ? strstr(body, "\n```") : NULL;
        const char *f = find_file(fname, readme_dir);
        KV_CHECK(close && f, "%s: the quote of %s has no block or no file", readme, fname);
        if (!close || !f) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", root, f);
        char *src = kv_docs_slurp(full, NULL);
        const char *l = line_at(src, a), *e = line_at(src, b);
        e = e ? strchr(e, '\n') : NULL;
        e = e ? e + 1 : NULL;
        const size_t want = (size_t)(close - body); /* the block's lines with their newlines */
        const int same = l && e && (size_t)(e - l) == want && memcmp(l, body + 1, want) == 0;
        KV_CHECK(same, "%s: the quoted lines %s:%ld-%ld are no longer what the file holds",
                 readme, fname, a, b);
        free(src);
    }
}

/* The same claims when a line break falls inside one ("`name()` at" / "`file:N`"): the line's
 * last backquoted name and the next line's first span, joined by one space. */
static void check_wrapped(const char *readme, int line, const char *l, const char *next,
                          const char *dir, const char *root)
{
    if (!next || strncmp(next, "```", 3) == 0) return;
    size_t n = strlen(l);
    while (n && l[n - 1] == ' ') n--;
    const char *tail = NULL;
    for (const char *p = l; (p = strstr(p, "()`")) && p < l + n; p++) tail = p;
    if (!tail) return;
    const char *rest = tail + 3, *end = l + n; /* what follows the name on this line */
    if (!(rest == end || (end - rest == 3 && (!strncmp(rest, " at", 3) || !strncmp(rest, " in", 3)))))
        return;
    const char *s = tail;
    while (s > l && s[-1] != '`') s--;
    if (s == l) return;
    s--; /* the opening backquote */
    while (*next == ' ') next++;
    const char *b1 = strchr(next, '`'), *nl = strchr(next, '\n');
    const char *b2 = b1 && (!nl || b1 < nl) ? strchr(b1 + 1, '`') : NULL;
    if (!b2 || (nl && b2 > nl)) return;
    char joined[2048];
    snprintf(joined, sizeof joined, "%.*s %.*s", (int)(end - s), s, (int)(b2 + 1 - next), next);
    check_in_file(readme, line, joined, dir, root, "()` in `");
    check_in_file(readme, line, joined, dir, root, "()` at `");
    check_in_file(readme, line, joined, dir, root, "()` (`");
}

static void check_names(const char *root, const char *readme)
{
    char path[4096], dir[4096];
    snprintf(path, sizeof path, "%s/%s", root, readme);
    snprintf(dir, sizeof dir, "%s", readme);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0'; else snprintf(dir, sizeof dir, ".");
    char *t = kv_docs_slurp(path, NULL);
    KV_CHECK(t != NULL, "cannot read %s", readme);
    if (!t) return;
    check_quotes(root, readme, t, dir);
    int fenced = 0, line = 0;
    for (char *l = t, *next; l && *l; l = next) {
        next = strchr(l, '\n');
        if (next) *next++ = '\0';
        line++;
        if (strncmp(l, "```", 3) == 0) { fenced = !fenced; continue; }
        if (fenced) continue;
        check_in_file(readme, line, l, dir, root, "()` in `");
        check_in_file(readme, line, l, dir, root, "()` at `");
        check_in_file(readme, line, l, dir, root, "()` (`");
        check_wrapped(readme, line, l, next, dir, root);
        check_links(readme, line, l, dir, root);
        for (char *a = strchr(l, '`'); a; a = strchr(a, '`')) {
            char *b = strchr(a + 1, '`');
            if (!b) break;
            if (b > a + 1) {
                char span[1024];
                snprintf(span, sizeof span, "%.*s", (int)(b - a - 1), a + 1);
                check_span(readme, line, span, dir, root);
            }
            a = b + 1;
        }
    }
    free(t);
}

/* ---- quoted kvlab output ----------------------------------------------------------------- */

#define ELLIPSIS "\xe2\x80\xa6" /* '…' in UTF-8 */

/* Does word w match pattern p, where '…' in p matches any run of characters? */
static int glob(const char *p, const char *w)
{
    if (!*p) return !*w;
    if (strncmp(p, ELLIPSIS, 3) == 0) {
        for (const char *c = w;; c++) {
            if (glob(p + 3, c)) return 1;
            if (!*c) return 0;
        }
    }
    return *p == *w && glob(p + 1, w + 1);
}

/* Collapse every run of blanks to one space and trim both ends (in place). */
static void squeeze(char *t)
{
    char *w = t;
    for (const char *r = t; *r; r++) {
        if (*r == ' ' || *r == '\t') {
            if (w > t && w[-1] != ' ') *w++ = ' ';
        } else {
            *w++ = *r;
        }
    }
    if (w > t && w[-1] == ' ') w--;
    *w = '\0';
}

/* Do the lines match, blanks aside? A '…' in the README's line stands for any run of
 * characters: a number with its unit ("564 KiB"), or a word ("n/a"). */
static int line_matches(const char *want, const char *got)
{
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s", want);
    snprintf(b, sizeof b, "%s", got);
    squeeze(a);
    squeeze(b);
    return glob(a, b);
}

static int blank(const char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    return !*s;
}

/* Split text into its non-blank lines (in place); returns the count. */
static int lines_of(char *t, char **out, int max)
{
    int n = 0;
    for (char *l = t, *next; l && *l; l = next) {
        next = strchr(l, '\n');
        if (next) *next++ = '\0';
        size_t k = strlen(l);
        while (k && (l[k - 1] == ' ' || l[k - 1] == '\r')) l[--k] = '\0';
        if (!blank(l) && n < max) out[n++] = l;
    }
    return n;
}

/* want[] against got[]; a want line that is only '…' skips got lines up to the next match. */
static int block_matches(char **want, int nw, char **got, int ng, int *bad_w, int *bad_g)
{
    int i = 0, j = 0;
    while (i < nw) {
        if (strcmp(want[i] + strspn(want[i], " "), ELLIPSIS) == 0) {
            if (i + 1 == nw) return 1;
            while (j < ng && !line_matches(want[i + 1], got[j])) j++;
            i++;
            continue;
        }
        if (j >= ng || !line_matches(want[i], got[j])) {
            *bad_w = i;
            *bad_g = j;
            return 0;
        }
        i++, j++;
    }
    *bad_w = nw;
    *bad_g = j;
    return j == ng;
}

static void check_output(const char *root, const char *kvlab, const char *readme)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, readme);
    char *t = kv_docs_slurp(path, NULL);
    if (!t) return;
    for (char *m = strstr(t, "<!-- kvlab: "); m; m = strstr(m + 1, "<!-- kvlab: ")) {
        char args[1024];
        const char *a = m + strlen("<!-- kvlab: "), *e = strstr(a, " -->");
        if (!e) break;
        snprintf(args, sizeof args, "%.*s", (int)(e - a), a);
        const char *open = strstr(e, "\n```"), *body = open ? strchr(open + 1, '\n') : NULL;
        const char *close = body ? strstr(body, "\n```") : NULL;
        KV_CHECK(close != NULL, "%s: no fenced block after <!-- kvlab: %s -->", readme, args);
        if (!close) continue;
        char *want_text = strndup(body + 1, (size_t)(close - body));
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>/dev/null", root, kvlab, args);
        FILE *p = popen(cmd, "r");
        size_t cap = 1 << 16, n = 0;
        char *got_text = malloc(cap);
        for (size_t r; p && (r = fread(got_text + n, 1, cap - n - 1, p)) > 0;)
            if ((n += r) + 1 == cap) got_text = realloc(got_text, cap *= 2);
        got_text[n] = '\0';
        const int rc = p ? pclose(p) : -1;
        KV_CHECK(rc == 0, "%s: `kvlab %s` exited with %d", readme, args, rc);
        enum { MAX_LINES = 4096 };
        static char *want[MAX_LINES], *got[MAX_LINES];
        const int nw = lines_of(want_text, want, MAX_LINES), ng = lines_of(got_text, got, MAX_LINES);
        int bw = 0, bg = 0;
        const int ok = block_matches(want, nw, got, ng, &bw, &bg);
        KV_CHECK(ok, "%s: `kvlab %s` no longer prints what the README quotes:\n  README: %s\n  kvlab:  %s",
                 readme, args, bw < nw ? want[bw] : "(end of the block)",
                 bg < ng ? got[bg] : "(end of the output)");
        free(want_text);
        free(got_text);
    }
    free(t);
}

/* ---- main ------------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_docs <source root> [kvlab]\n");
        return 2;
    }
    const char *root = argv[1];
    idents = (strset){calloc(1 << 14, sizeof(char *)), 1 << 14, 0};
    walk(root, "");
    qsort(files, n_files, sizeof *files, cmp_str);
    KV_CHECK(idents.n > 1000, "only %zu identifiers read under %s", idents.n, root);
    int readmes = 0;
    for (size_t i = 0; i < n_files; i++) {
        const char *f = files[i];
        const int chapter = strncmp(f, "chapters/", 9) == 0 && ends_with(f, "/README.md") &&
                            strchr(f + 9, '/') == strrchr(f, '/');
        /* every docs/NAME.md but the two that name what is not in the tree: design.md's
         * templates (kv_x.c, chapters/NN-name/) and references.md's files of other projects */
        const int doc = strcmp(f, "README.md") == 0 ||
                        (strncmp(f, "docs/", 5) == 0 && !strchr(f + 5, '/') && ends_with(f, ".md") &&
                         strcmp(f, "docs/design.md") != 0 && strcmp(f, "docs/references.md") != 0);
        if (!chapter && !doc) continue;
        readmes++;
        if (argc > 2)
            check_output(root, argv[2], f);
        else
            check_names(root, f);
    }
    KV_CHECK(readmes >= 10, "only %d READMEs found under %s", readmes, root);
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}
