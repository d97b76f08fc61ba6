/* One stream of CSV tables split into one file per table (csv.h: kv_csv_split), for
 * `kvlab tour --csv-dir`: each file one header and rows of its width, as pandas reads a file. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "csv.h"
#include "kv_file.h"

const char *kv_csv_record_end(const char *p, const char *end)
{
    int quoted = 0;
    for (; p < end; p++) {
        if (*p == '"') quoted = !quoted; /* a doubled quote flips twice */
        else if (*p == '\n' && !quoted) return p + 1;
    }
    return quoted ? NULL : end;
}

int kv_csv_is_header(const char *p, const char *e)
{
    while (e > p && (e[-1] == '\n' || e[-1] == '\r')) e--;
    int at_start = 1;
    for (; p < e; p++) {
        if (*p == ',') {
            if (at_start) return 0;
            at_start = 1;
        } else if (at_start) {
            if (!isalpha((unsigned char)*p) && *p != '_') return 0;
            at_start = 0;
        } else if (!isalnum((unsigned char)*p) && *p != '_') {
            return 0;
        }
    }
    return !at_start;
}

/* The header's first column other than "part" and "chapter" (else its first), lowercased
 * into @p name. */
static void table_name(const char *p, const char *e, char *name, size_t cap)
{
    while (e > p && (e[-1] == '\n' || e[-1] == '\r')) e--;
    const char *f = p, *fe = p + strcspn(p, ",\r\n"); /* the first column */
    for (const char *q = p; q < e;) {
        const char *qe = q + strcspn(q, ",\r\n");
        const size_t k = (size_t)(qe - q);
        if (!(k == 4 && !strncmp(q, "part", 4)) && !(k == 7 && !strncmp(q, "chapter", 7))) {
            f = q;
            fe = qe;
            break;
        }
        q = qe + 1;
    }
    size_t k = 0;
    for (; f < fe && k + 1 < cap; f++) name[k++] = (char)tolower((unsigned char)*f);
    name[k] = '\0';
}

int kv_csv_split(const char *text, size_t n, const char *dir, const char *prefix, FILE *log,
                 kv_err *err)
{
    const char *p = text, *end = text + n;
    kv_file_out o = {0};
    int open = 0, tables = 0;
    long rows = 0;
    char path[4096];
    while (p < end) {
        const char *e = kv_csv_record_end(p, end);
        if (!e) {
            kv_file_abort(&o);
            return kv_fail(err, KV_ERR_FORMAT, "%s: a quoted field never ends", prefix);
        }
        const int ends = *p == '#' || *p == '\n' || *p == '\r';
        if (open && (ends || (rows > 0 && kv_csv_is_header(p, e)))) { /* the open table ends here */
            open = 0;
            const int st = kv_file_commit(&o, err);
            if (st != KV_OK) return st;
            if (log) fprintf(log, "%s (%ld rows)\n", path, rows);
        }
        if (!ends && !open) { /* a table starts: its header */
            if (!kv_csv_is_header(p, e))
                return kv_fail(err, KV_ERR_FORMAT, "%s: a row before any header: %.*s", prefix,
                               (int)(e - p > 80 ? 80 : e - p), p);
            char name[64];
            table_name(p, e, name, sizeof name);
            if (snprintf(path, sizeof path, "%s/%s-%d-%s.csv", dir, prefix, ++tables, name) >=
                (int)sizeof path)
                return kv_fail(err, KV_ERR_ARG, "the folder name %s is too long", dir);
            int st = kv_file_create(path, &o, err);
            if (st != KV_OK) return st;
            open = 1;
            rows = -1; /* the header is not a row */
        }
        if (open) {
            if (fwrite(p, 1, (size_t)(e - p), o.f) != (size_t)(e - p)) {
                kv_file_abort(&o);
                return kv_fail(err, KV_ERR_IO, "%s: write failed", path);
            }
            rows++;
        }
        p = e;
    }
    if (open) {
        const int st = kv_file_commit(&o, err);
        if (st != KV_OK) return st;
        if (log) fprintf(log, "%s (%ld rows)\n", path, rows);
    }
    return KV_OK;
}
