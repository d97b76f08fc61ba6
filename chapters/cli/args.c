/* Option parsing shared by every kvlab subcommand (args.h). */
#include "args.h"
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out, const char **why)
{
    /* strtoll would skip leading spaces and stop at the first non-digit: "12abc" -> 12.
     * Demand a digit (after an optional sign) first and the end of the string last. */
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) {
        *why = "is not an integer";
        return -1;
    }
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0') {
        *why = "is not an integer";
        return -1;
    }
    if (errno == ERANGE || v < min || v > max) {
        *why = "is out of range";
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int kv_parse_double(const char *s, double min, double max, double *out, const char **why)
{
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1]))) {
        *why = "is not a number"; /* also refuses "nan", "inf" */
        return -1;
    }
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        *why = "is not a number"; /* strtod would read "0x10" as a hex float, 16 */
        return -1;
    }
    errno = 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (*end != '\0') {
        *why = "is not a number";
        return -1;
    }
    if (errno == ERANGE || !isfinite(v) || v < min || v > max) {
        *why = "is out of range";
        return -1;
    }
    *out = v;
    return 0;
}

int kv_args_bad(const char *cmd, const char *opt, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: %s: ", cmd, opt);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run '%s --help' for the options)\n", cmd);
    va_end(ap);
    return KV_EXIT_USAGE;
}

int kv_args_positional(const char *cmd, int argc, char **argv, const kv_opt *opts, int n_opts,
                       const char **pos, int max_pos, int *n_pos, char **rest, int cap,
                       int *n_rest)
{
    *n_pos = *n_rest = 0;
    for (int i = 1; i < argc; i++) {
        int takes_value = 0;
        for (int j = 0; j < n_opts; j++)
            if (!strcmp(argv[i], opts[j].name) && opts[j].type != KV_OPT_FLAG) takes_value = 1;
        if (argv[i][0] != '-' && *n_pos < max_pos) {
            pos[(*n_pos)++] = argv[i];
            continue;
        }
        if (*n_rest + 2 > cap) return kv_args_bad(cmd, argv[i], "too many arguments");
        rest[(*n_rest)++] = argv[i];
        if (takes_value && i + 1 < argc) rest[(*n_rest)++] = argv[++i];
    }
    return 0;
}

int kv_args_int_list(const char *cmd, const char *opt, const char *s, int *out, int max, int *n,
                     int64_t lo, int64_t hi)
{
    *n = 0;
    for (const char *p = s;; p++) {
        char item[24];
        const size_t len = strcspn(p, ",");
        const char *why = "is too long";
        int64_t v = 0;
        if (*n == max)
            return kv_args_bad(cmd, opt, "'%.60s': more than %d items", s, max);
        if (len < sizeof item) {
            memcpy(item, p, len);
            item[len] = '\0';
        }
        if (len == 0)
            return kv_args_bad(cmd, opt, "'%.60s': an empty item (expected comma-separated "
                               "numbers %lld..%lld)", s, (long long)lo, (long long)hi);
        if (len >= sizeof item || kv_parse_i64(item, lo, hi, &v, &why))
            return kv_args_bad(cmd, opt, "'%.*s' %s (expected comma-separated numbers %lld..%lld)",
                               (int)(len < 40 ? len : 40), p, why, (long long)lo, (long long)hi);
        out[(*n)++] = (int)v;
        p += len;
        if (!*p) return 0;
    }
}

int kv_args_word_list(const char *cmd, const char *opt, const char *s,
                      char (*words)[KV_ARGS_WORD], int max, int *n)
{
    *n = 0;
    for (const char *p = s;; p++) {
        const size_t len = strcspn(p, ",");
        if (len == 0)
            return kv_args_bad(cmd, opt, "'%.60s': an empty item", s);
        if (*n == max)
            return kv_args_bad(cmd, opt, "'%.60s': more than %d items", s, max);
        if (len >= KV_ARGS_WORD)
            return kv_args_bad(cmd, opt, "'%.40s...': an item longer than %d characters", p,
                               KV_ARGS_WORD - 1);
        memcpy(words[*n], p, len);
        words[*n][len] = '\0';
        for (int i = 0; i < *n; i++)
            if (!strcmp(words[i], words[*n]))
                return kv_args_bad(cmd, opt, "'%s' given twice", words[i]);
        (*n)++;
        p += len;
        if (!*p) return 0;
    }
}

int kv_args_given(const kv_opt *opts, int n_opts, const char *name)
{
    for (int i = 0; i < n_opts; i++)
        if (!strcmp(opts[i].name, name)) return opts[i].seen;
    return 0;
}

/* "1..4096", ">= 1" or "0..1": the range as a reader would write it. */
static void range_text(const kv_opt *o, char *buf, size_t n)
{
    int integral = o->type != KV_OPT_FLOAT;
    if (o->max >= 1e15)
        snprintf(buf, n, integral ? ">= %.0f" : ">= %g", o->min);
    else
        snprintf(buf, n, integral ? "%.0f..%.0f" : "%g..%g", o->min, o->max);
}

static void choices_text(const kv_opt *o, char *buf, size_t n)
{
    buf[0] = '\0';
    for (int i = 0; o->choices[i]; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, n - used, "%s%s", i ? "|" : "", o->choices[i]);
    }
}

/* Store the text @p val into option @p o; 0 or an error already printed. */
static int set_value(const char *cmd, kv_opt *o, const char *val)
{
    const char *why = NULL;
    char range[96];
    switch (o->type) {
    case KV_OPT_INT:
    case KV_OPT_I64: {
        int64_t v;
        if (kv_parse_i64(val, (int64_t)o->min, (int64_t)o->max, &v, &why)) {
            range_text(o, range, sizeof range);
            kv_args_bad(cmd, o->name, "'%s' %s (expected an integer, %s)", val, why, range);
            return -1;
        }
        if (o->type == KV_OPT_INT) *(int *)o->dest = (int)v;
        else *(int64_t *)o->dest = v;
        return 0;
    }
    case KV_OPT_FLOAT: {
        double v;
        if (kv_parse_double(val, o->min, o->max, &v, &why)) {
            range_text(o, range, sizeof range);
            kv_args_bad(cmd, o->name, "'%s' %s (expected a number, %s)", val, why, range);
            return -1;
        }
        *(double *)o->dest = v;
        return 0;
    }
    case KV_OPT_STRING:
        if (val[0] == '\0') {
            kv_args_bad(cmd, o->name, "the value is empty");
            return -1;
        }
        *(const char **)o->dest = val;
        return 0;
    case KV_OPT_TEXT:
        *(const char **)o->dest = val;
        return 0;
    case KV_OPT_CSV: /* the file itself is main.c's (kv_cli_csv_begin): the command prints */
        if (val[0] == '\0') {
            kv_args_bad(cmd, o->name, "the value is empty (a FILE, or - for standard output)");
            return -1;
        }
        *(int *)o->dest = 1;
        return 0;
    case KV_OPT_CHOICE:
        for (int i = 0; o->choices[i]; i++)
            if (strcmp(val, o->choices[i]) == 0) {
                *(const char **)o->dest = o->choices[i];
                return 0;
            }
        choices_text(o, range, sizeof range);
        kv_args_bad(cmd, o->name, "'%s' is not one of %s", val, range);
        return -1;
    case KV_OPT_FLAG:
        break;
    }
    return -1;
}

void kv_args_help(const char *cmd, const char *about, const kv_opt *opts, int n_opts)
{
    printf("usage: %s", cmd);
    for (int i = 0; i < n_opts; i++) {
        if (opts[i].type == KV_OPT_FLAG) printf(" [%s]", opts[i].name);
        else printf(" [%s %s]", opts[i].name, opts[i].meta ? opts[i].meta : "X");
    }
    printf("\n\n%s\n\noptions:\n", about);
    for (int i = 0; i < n_opts; i++) {
        const kv_opt *o = &opts[i];
        char left[64], extra[160] = "";
        if (o->type == KV_OPT_FLAG) snprintf(left, sizeof left, "%s", o->name);
        else snprintf(left, sizeof left, "%s %s", o->name, o->meta ? o->meta : "X");
        if (o->type == KV_OPT_CHOICE) {
            char c[128];
            choices_text(o, c, sizeof c);
            snprintf(extra, sizeof extra, " (%s)", c);
        } else if (o->type == KV_OPT_INT || o->type == KV_OPT_I64 || o->type == KV_OPT_FLOAT) {
            char r[96];
            range_text(o, r, sizeof r);
            snprintf(extra, sizeof extra, " (%s)", r);
        }
        printf("  %-22s %s%s\n", left, o->help, extra);
    }
    printf("  %-22s %s\n", "--help", "print this help and exit");
}

static kv_args_result parse(const char *cmd, const char *about, int argc, char **argv,
                            kv_opt *opts, int n_opts);

/* The most options a command's table may hold (the largest has 17). */
#define KV_ARGS_MAX 48

kv_args_result kv_args_parse(const char *cmd, const char *about, int argc, char **argv,
                             kv_opt *opts, int n_opts)
{
    for (int i = 0; i < n_opts; i++)
        if (strcmp(opts[i].name, "--threads") == 0) /* the command sets the team itself */
            return parse(cmd, about, argc, argv, opts, n_opts);
    /* every other command gets --threads here: the table plus one row, parsed as one */
    kv_opt all[KV_ARGS_MAX + 1];
    int threads = 0;
    if (n_opts > KV_ARGS_MAX) n_opts = KV_ARGS_MAX; /* never: a table is written by hand */
    if (n_opts > 0) memcpy(all, opts, (size_t)n_opts * sizeof *opts); /* info has no table */
    all[n_opts] = (kv_opt)KV_CLI_THREADS_OPT(threads);
    kv_args_result r = parse(cmd, about, argc, argv, all, n_opts + 1);
    if (n_opts > 0) memcpy(opts, all, (size_t)n_opts * sizeof *opts); /* the seen flags */
    if (r == KV_ARGS_OK && kv_cli_threads(cmd, threads)) return KV_ARGS_BAD;
    return r;
}

static kv_args_result parse(const char *cmd, const char *about, int argc, char **argv,
                            kv_opt *opts, int n_opts)
{
    for (int i = 0; i < n_opts; i++) opts[i].seen = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            kv_args_help(cmd, about, opts, n_opts);
            return KV_ARGS_HELP;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            fprintf(stderr, "%s: unexpected argument '%s' (options start with --)\n"
                            "(run '%s --help' for the options)\n", cmd, a, cmd);
            return KV_ARGS_BAD;
        }
        /* --name=value or --name value */
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        kv_opt *o = NULL;
        for (int k = 0; k < n_opts; k++)
            if (strlen(opts[k].name) == name_len && strncmp(opts[k].name, a, name_len) == 0)
                o = &opts[k];
        if (!o) {
            fprintf(stderr, "%s: unknown option '%.*s'\n(run '%s --help' for the options)\n",
                    cmd, (int)name_len, a, cmd);
            return KV_ARGS_BAD;
        }
        if (o->seen) {
            kv_args_bad(cmd, o->name, "given twice");
            return KV_ARGS_BAD;
        }
        o->seen = 1;
        if (o->type == KV_OPT_FLAG) {
            if (eq) {
                kv_args_bad(cmd, o->name, "takes no value");
                return KV_ARGS_BAD;
            }
            *(int *)o->dest = 1;
            continue;
        }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else {
            /* a following "--x" is the next option, not this one's value ("-5" is a value) */
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                if (!strcmp(o->name, "--csv")) /* the flag it once was, in every command */
                    kv_args_bad(cmd, o->name, "missing value: --csv FILE writes the rows to "
                                "FILE, --csv - to standard output");
                else
                    kv_args_bad(cmd, o->name, "missing value (%s)", o->meta ? o->meta : "X");
                return KV_ARGS_BAD;
            }
            val = argv[++i];
        }
        if (set_value(cmd, o, val)) return KV_ARGS_BAD;
    }
    return KV_ARGS_OK;
}
