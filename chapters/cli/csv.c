/* The one CSV writer (csv.h): printf's conversions, RFC 4180's quoting per field. */
#include "csv.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A growing string: the text of the field being formatted. */
typedef struct {
    char *s;
    size_t n, cap;
} text;

static int text_add(text *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        while (cap < t->n + n + 1) cap *= 2;
        char *p = realloc(t->s, cap);
        if (!p) return -1;
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = '\0';
    return 0;
}

/* The field so far, quoted when it must be, then the separator @p sep (0: none); the field
 * is emptied. Returns the bytes written or -1. */
static long emit(FILE *f, text *field, char sep)
{
    long out = 0;
    const char *s = field->s ? field->s : "";
    if (!s[strcspn(s, ",\"\r\n")]) {
        out += (long)fwrite(s, 1, field->n, f);
    } else {
        out += fputc('"', f) != EOF;
        for (; *s; s++) {
            if (*s == '"') out += fputc('"', f) != EOF;
            out += fputc(*s, f) != EOF;
        }
        out += fputc('"', f) != EOF;
    }
    if (sep) out += fputc(sep, f) != EOF;
    field->n = 0;
    if (field->s) field->s[0] = '\0';
    return ferror(f) ? -1 : out;
}

/* Format one conversion @p spec (from '%' to its letter, no '*' left) with the next argument
 * of @p ap by its type, appended to @p field. */
static int convert(text *field, const char *spec, va_list *ap)
{
    char buf[512];
    const size_t len = strlen(spec);
    const char conv = spec[len - 1];
    const char *m = spec + strcspn(spec, "hljztL"); /* the length modifier, if any */
    int n;
    if (conv == '%') {
        n = snprintf(buf, sizeof buf, "%%");
    } else if (conv == 's') {
        const char *s = va_arg(*ap, const char *);
        int k = snprintf(NULL, 0, spec, s);
        if (k < 0) return -1;
        char *big = malloc((size_t)k + 1); /* a string can be longer than buf */
        if (!big) return -1;
        snprintf(big, (size_t)k + 1, spec, s);
        const int rc = text_add(field, big, (size_t)k);
        free(big);
        return rc;
    } else if (conv == 'c') {
        n = snprintf(buf, sizeof buf, spec, va_arg(*ap, int));
    } else if (conv == 'p') {
        n = snprintf(buf, sizeof buf, spec, va_arg(*ap, void *));
    } else if (strchr("fFeEgGaA", conv)) {
        if (*m == 'L') n = snprintf(buf, sizeof buf, spec, va_arg(*ap, long double));
        else n = snprintf(buf, sizeof buf, spec, va_arg(*ap, double));
    } else if (strchr("diuoxX", conv)) {
        const int sgn = conv == 'd' || conv == 'i';
        if (m[0] == 'l' && m[1] == 'l')
            n = sgn ? snprintf(buf, sizeof buf, spec, va_arg(*ap, long long))
                    : snprintf(buf, sizeof buf, spec, va_arg(*ap, unsigned long long));
        else if (m[0] == 'l')
            n = sgn ? snprintf(buf, sizeof buf, spec, va_arg(*ap, long))
                    : snprintf(buf, sizeof buf, spec, va_arg(*ap, unsigned long));
        else if (m[0] == 'z')
            n = sgn ? snprintf(buf, sizeof buf, spec, va_arg(*ap, ptrdiff_t))
                    : snprintf(buf, sizeof buf, spec, va_arg(*ap, size_t));
        else if (m[0] == 'j')
            n = sgn ? snprintf(buf, sizeof buf, spec, va_arg(*ap, intmax_t))
                    : snprintf(buf, sizeof buf, spec, va_arg(*ap, uintmax_t));
        else if (m[0] == 't')
            n = snprintf(buf, sizeof buf, spec, va_arg(*ap, ptrdiff_t));
        else /* int, and h / hh, which arrive promoted to int */
            n = sgn ? snprintf(buf, sizeof buf, spec, va_arg(*ap, int))
                    : snprintf(buf, sizeof buf, spec, va_arg(*ap, unsigned));
    } else {
        return -1; /* %n and the unknown: the format attribute catches them at build time */
    }
    if (n < 0) return -1;
    return text_add(field, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static int csv_vprintf(FILE *f, const char *fmt, va_list ap0)
{
    va_list ap;
    va_copy(ap, ap0);
    text field = {0};
    long total = 0;
    int bad = 0;
    for (const char *p = fmt; *p && !bad;) {
        if (*p == ',' || *p == '\n') { /* a separator ends the field */
            const long w = emit(f, &field, *p++);
            bad = w < 0;
            total += w;
        } else if (*p != '%') {
            const size_t k = strcspn(p, ",\n%");
            bad = text_add(&field, p, k) != 0;
            p += k;
        } else {
            /* one conversion: '%', flags, width, precision, length, letter; a '*' becomes
             * the number it stands for */
            char spec[64];
            size_t k = 0;
            spec[k++] = *p++;
            while (*p && !strchr("diuoxXcsfFeEgGaAp%n", *p) && k + 12 < sizeof spec) {
                if (*p == '*') k += (size_t)snprintf(spec + k, sizeof spec - k, "%d", va_arg(ap, int));
                else spec[k++] = *p;
                p++;
            }
            if (!*p) {
                bad = 1;
                break;
            }
            spec[k++] = *p++;
            spec[k] = '\0';
            bad = convert(&field, spec, &ap) != 0;
        }
    }
    if (!bad && field.n) { /* a row written in parts: this part ends inside a field */
        const long w = emit(f, &field, 0);
        bad = w < 0;
        total += w;
    }
    free(field.s);
    va_end(ap);
    return bad ? -1 : (int)total;
}

int kv_csv_printf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = csv_vprintf(f, fmt, ap);
    va_end(ap);
    return n;
}

int kv_table_printf(FILE *f, int csv, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = csv ? csv_vprintf(f, fmt, ap) : vfprintf(f, fmt, ap);
    va_end(ap);
    return n;
}
