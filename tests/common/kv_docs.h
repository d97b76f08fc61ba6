/* What the docs tests share (test_docs.c, test_docs_run.c, test_docs_counts.c,
 * test_docs_figures.c): reading a file of the tree whole. */
#ifndef KV_DOCS_H
#define KV_DOCS_H

#include <stdio.h>
#include <stdlib.h>

/* The file's bytes, NUL-terminated (malloc'd; NULL if it cannot be opened); *len its length
 * when len is not NULL. */
static inline char *kv_docs_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)(n > 0 ? n : 0) + 1);
    const size_t got = buf ? fread(buf, 1, (size_t)(n > 0 ? n : 0), f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[got] = '\0';
    if (len) *len = got;
    return buf;
}

#endif
