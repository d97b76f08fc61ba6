/*
 * --json FILE of the benches (cli.h: kv_cli_json_write): one JSON object that holds what a
 * result needs to be compared with another machine's, as llama-bench's JSON does: the build
 * (kvlab's version and the commit it was built from), the machine (CPU model, OpenMP threads,
 * the device, the read bandwidth measured at the end of the run), the command and its options,
 * and the bench's rows (its --csv tables, each row an object keyed by the header).
 */
#include <ctype.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "bench_cmds.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#ifndef KV_GIT_COMMIT
#define KV_GIT_COMMIT "unknown"
#endif

/* @p n bytes of @p s as a JSON string (quotes, backslashes and control bytes escaped). */
static void json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* 1 when [s, s + n) is a number as JSON writes one: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int json_number(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i >= n || !isdigit((unsigned char)s[i])) return 0;
    if (s[i] == '0') i++;
    else
        while (i < n && isdigit((unsigned char)s[i])) i++;
    if (i < n && s[i] == '.') {
        if (++i >= n || !isdigit((unsigned char)s[i])) return 0;
        while (i < n && isdigit((unsigned char)s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !isdigit((unsigned char)s[i])) return 0;
        while (i < n && isdigit((unsigned char)s[i])) i++;
    }
    return i == n;
}

/* The next field of the record [*p, e), e before its line end (RFC 4180: a quoted field's
 * doubled quotes undoubled)
 * into @p buf (cap bytes, cut beyond); returns its length and moves *p past its comma, or -1
 * when the record has no more fields. *quoted tells whether it was quoted. */
static long next_field(const char **p, const char *e, char *buf, size_t cap, int *quoted)
{
    const char *q = *p;
    if (q > e) return -1;
    size_t k = 0;
    *quoted = q < e && *q == '"';
    if (*quoted) {
        for (q++; q < e; q++) {
            if (*q == '"' && q + 1 < e && q[1] == '"') q++;
            else if (*q == '"') { q++; break; }
            if (k + 1 < cap) buf[k++] = *q;
        }
    } else {
        for (; q < e && *q != ','; q++)
            if (k + 1 < cap) buf[k++] = *q;
    }
    buf[k] = '\0';
    *p = q < e && *q == ',' ? q + 1 : e + 1; /* past the comma, or past the record's end */
    return (long)k;
}

int kv_csv_to_json(FILE *f, const char *text, size_t n, kv_err *err)
{
    enum { MAX_COLS = 64, FIELD = 512 };
    char cols[MAX_COLS][64];
    int n_cols = 0, open = 0, rows = 0, tables = 0, quoted;
    char field[FIELD];
    const char *p = text, *end = text + n;
    fputc('[', f);
    while (p < end) {
        const char *e = kv_csv_record_end(p, end);
        if (!e) return kv_fail(err, KV_ERR_FORMAT, "--json: a quoted field never ends");
        const int ends = *p == '#' || *p == '\n' || *p == '\r';
        const char *le = e; /* the record without its line end */
        while (le > p && (le[-1] == '\n' || le[-1] == '\r')) le--;
        if (open && (ends || (rows > 0 && kv_csv_is_header(p, e)))) {
            fputs("]}", f);
            open = 0;
        }
        if (!ends && !open) { /* a header */
            if (!kv_csv_is_header(p, e))
                return kv_fail(err, KV_ERR_FORMAT, "--json: a row before any header: %.*s",
                               (int)(e - p > 80 ? 80 : e - p), p);
            fprintf(f, "%s\n {\"columns\": [", tables++ ? "," : "");
            const char *q = p;
            long k;
            for (n_cols = 0; n_cols < MAX_COLS && (k = next_field(&q, le, field, sizeof cols[0], &quoted)) >= 0; n_cols++) {
                snprintf(cols[n_cols], sizeof cols[0], "%.63s", field);
                if (n_cols) fputs(", ", f);
                json_str(f, field, (size_t)k);
            }
            fputs("], \"rows\": [", f);
            open = 1;
            rows = 0;
        } else if (open) { /* a row: an object of the header's columns */
            fprintf(f, "%s\n  {", rows++ ? "," : "");
            const char *q = p;
            long k;
            for (int c = 0; c < n_cols && (k = next_field(&q, le, field, sizeof field, &quoted)) >= 0; c++) {
                if (c) fputs(", ", f);
                json_str(f, cols[c], strlen(cols[c]));
                fputs(": ", f);
                if (k == 0 && !quoted) fputs("null", f);
                else if (!quoted && json_number(field, (size_t)k)) fputs(field, f);
                else json_str(f, field, (size_t)k);
            }
            fputc('}', f);
        }
        p = e;
    }
    if (open) fputs("]}", f);
    fputs("\n]", f);
    return KV_OK;
}

/* The CPU's model name (Linux: /proc/cpuinfo), else "unknown". */
static void cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        for (v++; *v == ' ' || *v == '\t'; v++) {}
        snprintf(buf, cap, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

int kv_cli_json_write(FILE *f, const char *cmd, int argc, char **argv, const char *rows,
                      size_t n, kv_err *err)
{
    char cpu[256], device[256] = "cpu";
    cpu_model(cpu, sizeof cpu);
    const char *dev = kv_cli_device_arg(argc, argv);
#ifdef KV_HAVE_CUDA
    if (!strcmp(dev, "cuda")) {
        kv_err derr = {{0}};
        char d[200];
        if (kvcu_device_describe(d, sizeof d, &derr) == KV_OK) snprintf(device, sizeof device, "cuda: %s", d);
        else snprintf(device, sizeof device, "cuda");
    }
#else
    (void)dev;
#endif
    /* the host's read bandwidth, now (a shorter pass than bench bandwidth's: 64 MiB, 3 times) */
    kv_bandwidth bw = {0};
    kv_err berr = {{0}};
    const int bw_ok = kv_read_bandwidth(&bw, (size_t)64 << 20, 3, &berr) == KV_OK;
    int level = 0;
    const char *src = NULL;
    const long long llc = (long long)kv_llc_bytes(&level, &src);
    char when[32];
    const time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));

    fputs("{\n\"kvlab\": ", f);
    json_str(f, KV_VERSION_STRING, strlen(KV_VERSION_STRING));
    fputs(",\n\"commit\": ", f);
    json_str(f, KV_GIT_COMMIT, strlen(KV_GIT_COMMIT));
    fputs(",\n\"command\": ", f);
    json_str(f, cmd, strlen(cmd));
    fputs(",\n\"argv\": [", f);
    for (int i = 0; i < argc; i++) {
        if (i) fputs(", ", f);
        json_str(f, argv[i], strlen(argv[i]));
    }
    /* the options as given: --name value (or --name=value), a flag as true */
    fputs("],\n\"options\": {", f);
    for (int i = 0, k = 0; i < argc; i++) {
        if (strncmp(argv[i], "--", 2)) continue;
        const char *eq = strchr(argv[i], '=');
        const size_t len = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
        fputs(k++ ? ", " : "", f);
        json_str(f, argv[i] + 2, len - 2);
        fputs(": ", f);
        if (eq) json_str(f, eq + 1, strlen(eq + 1));
        else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) {
            i++;
            json_str(f, argv[i], strlen(argv[i]));
        } else {
            fputs("true", f);
        }
    }
    fputs("},\n\"machine\": {\"cpu\": ", f);
    json_str(f, cpu, strlen(cpu));
    fprintf(f, ", \"threads\": %d, \"cpus\": %d, \"device\": ", omp_get_max_threads(),
            omp_get_num_procs());
    json_str(f, device, strlen(device));
    if (bw_ok) fprintf(f, ", \"read_bandwidth_gbps\": %.3f", bw.bytes_per_s * 1e-9);
    else fputs(", \"read_bandwidth_gbps\": null", f);
    fprintf(f, ", \"llc_bytes\": %lld, \"llc_level\": %d},\n\"time\": \"%s\",\n\"results\": ",
            llc, level, when);
    const int st = kv_csv_to_json(f, rows, n, err);
    fputs("\n}\n", f);
    return st;
}
