/*
 * The commands the chapters print, run: every fenced shell line of README.md, a chapter's
 * README or a file docs/NAME.md that starts with `kvlab` (or ./build/kvlab, build/kvlab,
 * `$ kvlab`) is run and must exit 0.
 *
 *   test_docs_run <source root> <kvlab> [--all] [--start S]
 *
 * --all runs the blocks marked slow too and lets each command finish (the full run, label
 * slow: over 20 minutes on a loaded 2-core machine, the benches and the 1M-token streams
 * stopped at their blocks' caps). --start S is the default test's fast subset: every
 * command is stopped after S seconds (the default test: 1 s, about a minute for the 58 commands
 * on a loaded 2-core machine), and one still running then counts as a pass, so what
 * it checks is that the options parse, the files open and nothing fails early (the mistakes
 * the chapters have had: an option renamed, a format refused, a file that is not there); the
 * quoted outputs of the tours are test_docs_output's.
 *
 * Each command runs in a temporary folder of its own (mkdtemp under $TMPDIR), which holds a
 * symbolic link to each top-level folder of the source root, so `datasets/...` resolves
 * while a file the command writes (`--csv out.csv`, `--out mqa.bin`) lands in the temporary
 * folder, removed afterwards; two runs side by side share nothing. The line is run by bash
 * (pipefail), `./build/kvlab` replaced by the kvlab given, its trailing comment dropped, a line
 * ending in a backslash joined to the next.
 *
 * A block may carry a marker, an HTML comment on the line before its fence (the reader does
 * not see it):
 *     <!-- docs-test: cap 20; quick; skip --device cuda (needs a GPU); slow -->
 * directives separated by ';':
 *   quick             append --quick to each command (the tour's and the benches' small sizes)
 *   cap N             stop each command after N seconds; still running then counts as a pass
 *                     (it parsed its options, read its inputs and ran: a long bench or stream)
 *   skip WORDS (why)  skip the block's commands that contain WORDS (all of them without WORDS);
 *                     the reason is printed
 *   slow              run the block only with --all (the test labelled slow)
 *   needs FILE        skip the block's commands when FILE (~/ for $HOME) is absent: the real
 *                     model, which CI fetches
 * Without a marker a command must finish, with exit 0, within 120 s.
 * Prints one line per command (ok/FAIL/skip, seconds, file:line, the command) and
 * "N passed, M failed".
 */
#include "common/kv_test.h"
#include "common/kv_docs.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

enum { MAX_SKIPS = 8, DEFAULT_CAP = 120 };

typedef struct {
    int quick, slow, cap;
    char needs[512];             /* a file the block's commands need ("~/" = $HOME), or "" */
    int n_skip;
    char skip[MAX_SKIPS][128];   /* "" = every command */
    char reason[MAX_SKIPS][128];
} marker;

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

/* "<!-- docs-test: a; b; c -->" -> m; returns 0 on a directive it does not know */
static int parse_marker(const char *line, marker *m, const char *where)
{
    const char *a = strstr(line, "<!-- docs-test:"), *e = a ? strstr(a, "-->") : NULL;
    if (!a || !e) return 1;
    char body[1024];
    snprintf(body, sizeof body, "%.*s", (int)(e - a - 15), a + 15);
    char *save = NULL;
    for (char *d = strtok_r(body, ";", &save); d; d = strtok_r(NULL, ";", &save)) {
        d = trim(d);
        if (strcmp(d, "quick") == 0) {
            m->quick = 1;
        } else if (strcmp(d, "slow") == 0) {
            m->slow = 1;
        } else if (strncmp(d, "needs ", 6) == 0) {
            const char *f = trim(d + 6), *home = getenv("HOME");
            if (strncmp(f, "~/", 2) == 0)
                snprintf(m->needs, sizeof m->needs, "%s/%s", home ? home : "", f + 2);
            else
                snprintf(m->needs, sizeof m->needs, "%s", f);
        } else if (strncmp(d, "cap ", 4) == 0 && atoi(d + 4) > 0) {
            m->cap = atoi(d + 4);
        } else if ((strcmp(d, "skip") == 0 || strncmp(d, "skip ", 5) == 0) && m->n_skip < MAX_SKIPS) {
            char *why = strchr(d, '('), *words = trim(d + 4);
            snprintf(m->reason[m->n_skip], sizeof m->reason[0], "%s", why ? why : "(marked)");
            if (why) *why = '\0';
            snprintf(m->skip[m->n_skip], sizeof m->skip[0], "%s", trim(words));
            m->n_skip++;
        } else {
            KV_CHECK(0, "%s: a docs-test marker's directive '%s' is not quick, slow, cap N, needs or skip",
                     where, d);
            return 0;
        }
    }
    return 1;
}

/* The command of a shell line, "kvlab ..." without the program, or NULL. */
static const char *kvlab_args(const char *line)
{
    line += strspn(line, " \t");
    if (line[0] == '$' && line[1] == ' ') line += 2;
    static const char *const progs[] = {"./build/kvlab ", "build/kvlab ", "kvlab "};
    for (size_t i = 0; i < sizeof progs / sizeof *progs; i++)
        if (strncmp(line, progs[i], strlen(progs[i])) == 0) return line + strlen(progs[i]);
    return NULL;
}

/* Drop a trailing "# comment" that is outside quotes. */
static void drop_comment(char *s)
{
    char q = 0;
    for (char *p = s; *p; p++) {
        if (q) {
            if (*p == q) q = 0;
        } else if (*p == '"' || *p == '\'') {
            q = *p;
        } else if (*p == '#' && (p == s || p[-1] == ' ' || p[-1] == '\t')) {
            *p = '\0';
            break;
        }
    }
}

static double now_s(void)
{
    struct timeval t;
    gettimeofday(&t, NULL);
    return (double)t.tv_sec + t.tv_usec * 1e-6;
}

/* A temporary folder with a link to each top-level folder of root. */
static int make_sandbox(const char *root, char *dir, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/kvlab-docs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 0;
    DIR *d = opendir(root);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, "build", 5) == 0) continue;
        char from[4400], to[4400];
        snprintf(from, sizeof from, "%s/%s", root, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(from, &st) == 0 && S_ISDIR(st.st_mode) && symlink(from, to) != 0) {
            closedir(d);
            return 0;
        }
    }
    closedir(d);
    return 1;
}

static int ran, skipped;
static double total_s;
static int start_s; /* --start S: every command stopped after S s, a run that far a pass */

static void run_one(const char *root, const char *kvlab, const char *where, const char *args,
                    const marker *m)
{
    for (int i = 0; i < m->n_skip; i++)
        if (!m->skip[i][0] || strstr(args, m->skip[i])) {
            printf("skip        %s: kvlab %s %s\n", where, args, m->reason[i]);
            skipped++;
            return;
        }
    if (m->needs[0] && access(m->needs, R_OK) != 0) {
        printf("skip        %s: kvlab %s (needs %s)\n", where, args, m->needs);
        skipped++;
        return;
    }
    char dir[4096];
    KV_CHECK(make_sandbox(root, dir, sizeof dir), "%s: cannot make a temporary folder", where);
    const int cap = start_s ? start_s : m->cap ? m->cap : DEFAULT_CAP;
    char abs_kvlab[4096];
    if (!realpath(kvlab, abs_kvlab)) snprintf(abs_kvlab, sizeof abs_kvlab, "%s", kvlab);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/cmd.sh", dir); /* the line as written, quotes and all */
    FILE *sh = fopen(cmd, "w");
    KV_CHECK(sh != NULL, "%s: cannot write %s", where, cmd);
    if (!sh) return;
    fprintf(sh, "set -o pipefail\n'%s' %s%s\n", abs_kvlab, args, m->quick ? " --quick" : "");
    fclose(sh);
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout -k 5 %d bash cmd.sh </dev/null >out.txt 2>err.txt", dir, cap);
    const double t0 = now_s();
    const int st = system(cmd);
    const double took = now_s() - t0;
    const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    const int capped = rc == 124 && (m->cap > 0 || start_s > 0);
    const int ok = rc == 0 || capped;
    ran++;
    total_s += took;
    printf("%-4s %6.1fs %s: kvlab %s%s%s\n", ok ? "ok" : "FAIL", took, where, args,
           m->quick ? " --quick" : "", capped ? " (stopped at its cap)" : "");
    if (!ok) {
        char path[4200];
        snprintf(path, sizeof path, "%s/err.txt", dir);
        char *err = kv_docs_slurp(path, NULL);
        printf("     exit %d%s; stderr:\n%.2000s\n", rc,
               rc == 124 ? " (over the time limit: mark the block with cap N or quick)" : "",
               err ? err : "");
        free(err);
    }
    KV_CHECK(ok, "%s: `kvlab %s` exited with %d", where, args, rc);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir); /* the links go, not what they point at */
    if (system(cmd) != 0) printf("     (could not remove %s)\n", dir);
}

static void run_readme(const char *root, const char *kvlab, const char *readme, int all)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", root, readme);
    char *t = kv_docs_slurp(path, NULL);
    if (!t) return;
    marker pending = {0}, block = {0};
    int fenced = 0, shell = 0, line = 0;
    char joined[4096] = "";
    int joined_at = 0;
    for (char *l = t, *next; l && *l; l = next) {
        next = strchr(l, '\n');
        if (next) *next++ = '\0';
        line++;
        char where[512];
        snprintf(where, sizeof where, "%s:%d", readme, line);
        if (strncmp(l, "```", 3) == 0) {
            if (!fenced) {
                const char *info = trim(l + 3);
                shell = !*info || !strcmp(info, "sh") || !strcmp(info, "bash") ||
                        !strcmp(info, "console") || !strcmp(info, "shell");
                block = pending;
            }
            fenced = !fenced;
            memset(&pending, 0, sizeof pending);
            continue;
        }
        if (!fenced) {
            /* a marker is a line of its own; prose that mentions one in a code span is prose */
            if (!strncmp(trim(l), "<!-- docs-test:", 15)) {
                memset(&pending, 0, sizeof pending);
                parse_marker(l, &pending, where);
            } else if (*trim(l)) {
                memset(&pending, 0, sizeof pending);
            }
            continue;
        }
        if (!shell) continue;
        if (!joined[0]) {
            const char *args = kvlab_args(l);
            if (!args) continue;
            snprintf(joined, sizeof joined, "%s", args);
            joined_at = line;
        } else {
            const size_t n = strlen(joined);
            snprintf(joined + n, sizeof joined - n, " %s", trim(l));
        }
        size_t n = strlen(joined);
        while (n && (joined[n - 1] == ' ' || joined[n - 1] == '\r')) joined[--n] = '\0';
        if (n && joined[n - 1] == '\\') { /* continued on the next line */
            joined[n - 1] = '\0';
            continue;
        }
        drop_comment(joined);
        snprintf(where, sizeof where, "%s:%d", readme, joined_at);
        if (block.slow && !all)
            printf("slow        %s: kvlab %s (only with --all)\n", where, trim(joined));
        else
            run_one(root, kvlab, where, trim(joined), &block);
        joined[0] = '\0';
    }
    free(t);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_docs_run <source root> <kvlab> [--all] [--start S]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* each command's line as it ends, under ctest too */
    static char root[4096]; /* absolute: the sandboxes' links point at it */
    if (!realpath(argv[1], root)) snprintf(root, sizeof root, "%s", argv[1]);
    const char *kvlab = argv[2];
    int all = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0) all = 1;
        if (strcmp(argv[i], "--start") == 0 && i + 1 < argc) start_s = atoi(argv[++i]);
    }
    char *readmes[256];
    int n = 0;
    readmes[n++] = strdup("README.md");
    const char *dirs[] = {"chapters", "docs"};
    for (int k = 0; k < 2; k++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", root, dirs[k]);
        DIR *d = opendir(path);
        for (struct dirent *e; d && (e = readdir(d)) && n < 250;) {
            char f[4096];
            if (k == 0 && e->d_name[0] >= '0' && e->d_name[0] <= '9')
                snprintf(f, sizeof f, "chapters/%s/README.md", e->d_name);
            else if (k == 1 && strlen(e->d_name) > 3 &&
                     strcmp(e->d_name + strlen(e->d_name) - 3, ".md") == 0)
                snprintf(f, sizeof f, "docs/%s", e->d_name);
            else
                continue;
            readmes[n++] = strdup(f);
        }
        if (d) closedir(d);
    }
    qsort(readmes + 1, (size_t)n - 1, sizeof *readmes, cmp_str);
    for (int i = 0; i < n; i++) {
        run_readme(root, kvlab, readmes[i], all);
        free(readmes[i]);
    }
    KV_CHECK(ran >= 20, "only %d commands run", ran);
    printf("%d commands run in %.0f s, %d skipped\n", ran, total_s, skipped);
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}
