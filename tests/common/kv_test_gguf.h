/*
 * What the GGUF tests share: a file's bytes, a (patched) copy of them opened through a
 * temporary file, and the lines of tests/data/gguf/expected.txt
 * (tools/gguf/make_test_files.py).
 */
#ifndef KV_TEST_GGUF_H
#define KV_TEST_GGUF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_gguf.h"

/* the whole file, malloc'd (NULL when it cannot be read) */
static inline unsigned char *kv_test_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)size + 1);
    if (b && fread(b, 1, (size_t)size, f) != (size_t)size) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (!b) return NULL;
    b[size] = 0; /* text files read as strings */
    *n = (size_t)size;
    return b;
}

/* kv_gguf_open() on @p n bytes, written to a temporary file (removed again at once: the
 * mapping keeps the bytes); *g is NULL unless KV_OK */
static inline int kv_test_gguf_bytes(const unsigned char *b, size_t n, kv_gguf **g, kv_err *err)
{
    const char *tmp = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/kvlab-gguf-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    const int fd = mkstemp(path);
    if (fd < 0) return kv_fail(err, KV_ERR_IO, "mkstemp failed");
    const int ok = n == 0 || write(fd, b, n) == (ssize_t)n;
    close(fd);
    const int rc = ok ? kv_gguf_open(path, g, err) : kv_fail(err, KV_ERR_IO, "write failed");
    unlink(path);
    return rc;
}

/* where the file's bytes start in the mapping, from a tensor's data pointer */
static inline const unsigned char *kv_test_gguf_base(const kv_gguf *g)
{
    const kv_gguf_tensor *t = kv_gguf_tensor_at(g, 0);
    return (const unsigned char *)t->data - kv_gguf_data_offset(g) - t->offset;
}

/* the metadata entry of @p key (by walking the list), or NULL */
static inline const kv_gguf_kv *kv_test_gguf_kv(const kv_gguf *g, const char *key)
{
    for (int64_t i = 0; i < kv_gguf_n_kv(g); i++)
        if (kv_gguf_str_eq(kv_gguf_kv_at(g, i)->key, key)) return kv_gguf_kv_at(g, i);
    return NULL;
}

#endif
