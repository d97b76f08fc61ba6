/*
 * What the GGUF tests share: a file's bytes, a (patched) copy of them opened through a
 * temporary file, and the checks of an expected file written by tools/gguf/make_test_files.py
 * (tests/data/gguf/expected.txt, and smollm2.txt for the real model): the file's header, keys,
 * values and tensor table, and a loaded model's config and dequantized weights.
 */
#ifndef KV_TEST_GGUF_H
#define KV_TEST_GGUF_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kv_test.h"
#include "kv_gguf.h"
#include "kv_model.h"

#include <math.h>
#include <stdint.h>

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

/* ---- expected.txt (tools/gguf/make_test_files.py) ------------------------------------ */

/* decode expected.txt's hex ("-" for empty) into buf; returns the length */
static inline size_t unhex(const char *h, char *buf, size_t cap)
{
    size_t n = 0;
    if (strcmp(h, "-") == 0) return 0;
    for (; h[0] && h[1] && n < cap; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        buf[n++] = (char)v;
    }
    return n;
}

static inline int type_of(const char *name)
{
    for (int t = 0; t < KV_GGUF_TYPE_COUNT; t++)
        if (strcmp(kv_gguf_type_name(t), name) == 0) return t;
    return -1;
}

/* element i of an integer array, exactly (memcpy of the raw bytes) */
static inline int is_int_type(int t) { return t != KV_GGUF_F32 && t != KV_GGUF_F64; }

static inline int same_number(int t, const void *data, uint64_t i, const char *want)
{
    if (t == KV_GGUF_U64) {
        uint64_t v;
        memcpy(&v, (const char *)data + 8 * i, 8);
        return v == strtoull(want, NULL, 10);
    }
    if (t == KV_GGUF_I64) {
        int64_t v;
        memcpy(&v, (const char *)data + 8 * i, 8);
        return v == strtoll(want, NULL, 10);
    }
    return kv_gguf_array_num(t, data, i) == strtod(want, NULL);
}

/* kv KEY TYPE VALUE... : @p rest is everything after TYPE */
static inline void check_kv(const kv_gguf *g, const char *file, const char *key, const char *type,
                     char *rest)
{
    kv_err err;
    const int t = type_of(type);
    const kv_gguf_kv *kv = kv_test_gguf_kv(g, key);
    KV_CHECK(kv && kv->type == t && kv_gguf_has(g, key), "%s: key %s of type %s", file, key, type);
    if (!kv || kv->type != t) return;
    if (t == KV_GGUF_STRING) {
        static char want[4096];
        const size_t n = unhex(rest, want, sizeof want);
        kv_gguf_str s = {0};
        KV_CHECK(kv_gguf_get_str(g, key, &s, &err) == KV_OK && s.n == n &&
                 memcmp(s.s, want, n) == 0, "%s: %s: string value", file, key);
        int64_t v;
        KV_CHECK(kv_gguf_get_int(g, key, &v, &err) == KV_ERR_FORMAT && strstr(err.msg, key) &&
                 strstr(err.msg, "not an integer"), "%s: %s: get_int on a string: %s", file, key,
                 err.msg);
    } else if (t == KV_GGUF_ARRAY) {
        char *elem = strtok(rest, " "), *count = strtok(NULL, " ");
        const int et = type_of(elem);
        const uint64_t n = strtoull(count, NULL, 10);
        KV_CHECK(kv->elem_type == et && kv->n == n, "%s: %s: array of %s, %llu", file, key, elem,
                 (unsigned long long)n);
        int got_type;
        uint64_t got_n;
        const void *data;
        const kv_gguf_str *strs;
        if (et == KV_GGUF_STRING) {
            KV_CHECK(kv_gguf_get_strings(g, key, &strs, &got_n, &err) == KV_OK && got_n == n,
                     "%s: %s: get_strings", file, key);
            for (uint64_t i = 0; i < n && got_n == n; i++) {
                static char want[4096];
                const size_t len = unhex(strtok(NULL, " "), want, sizeof want);
                KV_CHECK(strs[i].n == len && memcmp(strs[i].s, want, len) == 0,
                         "%s: %s[%llu]", file, key, (unsigned long long)i);
            }
            KV_CHECK(kv_gguf_get_array(g, key, &got_type, &got_n, &data, &err) == KV_ERR_FORMAT &&
                     strstr(err.msg, "not of numbers"), "%s: %s: get_array refuses strings", file,
                     key);
        } else if (et == KV_GGUF_ARRAY) {
            KV_CHECK(kv_gguf_get_array(g, key, &got_type, &got_n, &data, &err) == KV_ERR_FORMAT &&
                     kv_gguf_get_strings(g, key, &strs, &got_n, &err) == KV_ERR_FORMAT &&
                     strstr(err.msg, "array of array"), "%s: %s: nested arrays refused by the "
                     "getters: %s", file, key, err.msg);
        } else {
            KV_CHECK(kv_gguf_get_array(g, key, &got_type, &got_n, &data, &err) == KV_OK &&
                     got_type == et && got_n == n, "%s: %s: get_array", file, key);
            int bad = 0;
            for (uint64_t i = 0; i < n && got_n == n; i++) bad += !same_number(et, data, i, strtok(NULL, " "));
            KV_CHECK(bad == 0, "%s: %s: %d elements differ", file, key, bad);
        }
    } else {
        int64_t v;
        double d;
        const int rc = kv_gguf_get_int(g, key, &v, &err);
        if (t == KV_GGUF_U64 && strtoull(rest, NULL, 10) > (uint64_t)INT64_MAX)
            KV_CHECK(rc == KV_ERR_FORMAT && strstr(err.msg, "out of range"),
                     "%s: %s: u64 past 2^63 refused by get_int", file, key);
        else if (is_int_type(t))
            KV_CHECK(rc == KV_OK && same_number(t, kv->value, 0, rest), "%s: %s = %s", file, key,
                     rest);
        else
            KV_CHECK(rc == KV_ERR_FORMAT, "%s: %s: get_int on a float", file, key);
        KV_CHECK(kv_gguf_get_float(g, key, &d, &err) == KV_OK && d == strtod(rest, NULL),
                 "%s: %s: get_float %.17g, want %s", file, key, d, rest);
    }
}

/* 64-bit FNV-1a, as the generator hashes each tensor's bytes */
static inline uint64_t kv_test_fnv1a64_more(uint64_t h, const void *data, uint64_t n)
{
    const unsigned char *p = data;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
static inline uint64_t fnv1a64(const unsigned char *p, uint64_t n)
{
    return kv_test_fnv1a64_more(0xcbf29ce484222325ull, p, n);
}

/* tensor NAME TYPE N_DIMS NE0..NE3 OFFSET NBYTES FNV */
static inline void check_tensor(const kv_gguf *g, const char *file, int64_t index, const char *line)
{
    char name[128];
    int type, n_dims;
    long long ne[4];
    unsigned long long off, nbytes, hash;
    KV_CHECK(sscanf(line, "tensor %127s %d %d %lld %lld %lld %lld %llu %llu %llu", name, &type,
                    &n_dims, &ne[0], &ne[1], &ne[2], &ne[3], &off, &nbytes, &hash) == 10,
             "expected.txt: %s", line);
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    KV_CHECK(t && t == kv_gguf_tensor_at(g, index), "%s: tensor %lld '%s' in file order", file,
             (long long)index, name);
    if (!t) return;
    KV_CHECK(t->type == type && t->n_dims == n_dims && t->ne[0] == ne[0] && t->ne[1] == ne[1] &&
             t->ne[2] == ne[2] && t->ne[3] == ne[3], "%s: %s: type and shape", file, name);
    KV_CHECK(t->offset == off && t->nbytes == nbytes, "%s: %s: offset %llu bytes %llu", file,
             name, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
    KV_CHECK(fnv1a64(t->data, t->nbytes) == hash, "%s: %s: the data's hash", file, name);
    KV_CHECK(((const unsigned char *)t->data - kv_test_gguf_base(g)) % kv_gguf_alignment(g) == 0,
             "%s: %s: data aligned in the file", file, name);
}

/* kvhash KEY TYPE N FNV: a long array by the 64-bit FNV-1a of its elements as the file
 * stores them (a string as its u64 length and bytes) */
static inline void check_kv_hash(const kv_gguf *g, const char *file, const char *line)
{
    char key[256], type[32];
    unsigned long long n, hash;
    KV_CHECK(sscanf(line, "kvhash %255s %31s %llu %llu", key, type, &n, &hash) == 4,
             "expected: %s", line);
    const int et = type_of(type);
    const kv_gguf_kv *kv = kv_test_gguf_kv(g, key);
    KV_CHECK(kv && kv->type == KV_GGUF_ARRAY && kv->elem_type == et && kv->n == n,
             "%s: %s: array of %llu %s", file, key, n, type);
    if (!kv || kv->elem_type != et || kv->n != n) return;
    uint64_t h = 0xcbf29ce484222325ull;
    if (et == KV_GGUF_STRING) {
        const kv_gguf_str *s;
        uint64_t count;
        kv_err err;
        KV_CHECK(kv_gguf_get_strings(g, key, &s, &count, &err) == KV_OK, "%s", err.msg);
        for (uint64_t i = 0; i < count; i++) {
            h = kv_test_fnv1a64_more(h, &s[i].n, 8);
            h = kv_test_fnv1a64_more(h, s[i].s, s[i].n);
        }
    } else {
        const uint64_t size[KV_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        h = kv_test_fnv1a64_more(h, kv->value, n * size[et]);
    }
    KV_CHECK(h == hash, "%s: %s: the elements' hash", file, key);
}

/* what kv_test_gguf_expected() checked */
typedef struct {
    int files, kvs, tensors;
} kv_test_gguf_counts;

/* Every "file", "kv", "kvhash" and "tensor" line of the expected file @p path, against the
 * files it names in @p dir. */
static inline kv_test_gguf_counts kv_test_gguf_expected(const char *path, const char *dir)
{
    kv_test_gguf_counts c = {0, 0, 0};
    size_t n;
    char *text = (char *)kv_test_slurp(path, &n);
    KV_CHECK(text != NULL, "cannot read %s", path);
    if (!text) return c;
    kv_gguf *g = NULL;
    char file[256] = "", fpath[1400];
    int64_t tensor = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n'); /* lines by hand: check_kv() uses strtok */
        if (next) *next++ = 0;
        char key[256], type[32];
        int version, n_kv, n_t, at = 0;
        unsigned long long align;
        if (sscanf(line, "file %255s %d %llu %d %d", file, &version, &align, &n_kv, &n_t) == 5) {
            kv_gguf_close(g);
            g = NULL;
            kv_err err;
            snprintf(fpath, sizeof fpath, "%s/%s", dir, file);
            KV_CHECK(kv_gguf_open(fpath, &g, &err) == KV_OK, "%s: %s", file, err.msg);
            if (g)
                KV_CHECK(kv_gguf_version(g) == version && kv_gguf_alignment(g) == align &&
                         kv_gguf_n_kv(g) == n_kv && kv_gguf_n_tensors(g) == n_t,
                         "%s: version %d, alignment %llu, %d keys, %d tensors", file, version,
                         align, n_kv, n_t);
            tensor = 0;
            c.files++;
        } else if (g && strncmp(line, "kvhash ", 7) == 0) {
            check_kv_hash(g, file, line);
            c.kvs++;
        } else if (g && sscanf(line, "kv %255s %31s %n", key, type, &at) == 2 && at > 0) {
            check_kv(g, file, key, type, line + at);
            c.kvs++;
        } else if (g && strncmp(line, "tensor ", 7) == 0) {
            check_tensor(g, file, tensor++, line);
            c.tensors++;
        }
    }
    kv_gguf_close(g);
    free(text);
    return c;
}

/* ---- a loaded model against the package's dequantized weights -------------------------- */

/* where tensor @p name lives in the loaded model, and its weight count */
static inline const float *weight_of(const kv_model *m, const char *name, int64_t *n)
{
    const kv_config *c = &m->config;
    const kv_weights *w = &m->w;
    const int64_t dim = c->dim, hid = c->hidden_dim, kvd = kv_config_kv_dim(c);
    int l;
    char part[64];
    if (strcmp(name, "token_embd.weight") == 0) return *n = c->vocab_size * dim, w->token_embedding;
    if (strcmp(name, "output.weight") == 0) return *n = c->vocab_size * dim, w->wcls;
    if (strcmp(name, "output_norm.weight") == 0) return *n = dim, w->rms_final;
    if (sscanf(name, "blk.%d.%63[a-z_].weight", &l, part) != 2) return NULL;
    const struct { const char *name; const float *p; int64_t n; } t[] = {
        {"attn_norm", w->rms_att + l * dim, dim},       {"attn_q", w->wq + l * dim * dim, dim * dim},
        {"attn_k", w->wk + l * kvd * dim, kvd * dim},   {"attn_v", w->wv + l * kvd * dim, kvd * dim},
        {"attn_output", w->wo + l * dim * dim, dim * dim}, {"ffn_norm", w->rms_ffn + l * dim, dim},
        {"ffn_gate", w->w1 + l * hid * dim, hid * dim}, {"ffn_down", w->w2 + l * dim * hid, dim * hid},
        {"ffn_up", w->w3 + l * hid * dim, hid * dim},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (strcmp(part, t[k].name) == 0) return *n = t[k].n, t[k].p;
    return NULL;
}

/* The "config", "weight" and "sum" lines of the expected text @p text (modified: strtok)
 * against the loaded model @p m; counts what it checked. */
static inline void kv_test_gguf_weights(const kv_model *m, char *text, int *configs, int *weights,
                                        int *sums)
{
    const kv_config *c = &m->config;
    *configs = *weights = *sums = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char name[128];
        long long i, n;
        double v;
        int dim, hid, L, H, Hkv, vocab, seq, rot, tied;
        double theta, eps;
        if (sscanf(line, "config %d %d %d %d %d %d %d %lf %lf %d %d", &dim, &hid, &L, &H, &Hkv,
                   &vocab, &seq, &theta, &eps, &rot, &tied) == 11) {
            KV_CHECK(c->dim == dim && c->hidden_dim == hid && c->n_layers == L && c->n_heads == H &&
                     c->n_kv_heads == Hkv && c->vocab_size == vocab && c->seq_len == seq &&
                     c->rope_theta == (float)theta && c->norm_eps == (float)eps &&
                     c->rotary_dim == rot && c->tied_classifier == tied,
                     "config: %s", line);
            (*configs)++;
        } else if (sscanf(line, "weight %127s %lld %lf", name, &i, &v) == 3) {
            int64_t count = 0;
            const float *p = weight_of(m, name, &count);
            KV_CHECK(p && i < count && p[i] == (float)v, "%s[%lld] = %.9g, the package's %.9g",
                     name, i, p && i < count ? p[i] : NAN, v);
            (*weights)++;
        } else if (sscanf(line, "sum %127s %lld %lf", name, &n, &v) == 3) {
            int64_t count = 0;
            const float *p = weight_of(m, name, &count);
            double s = 0, a = 0;
            for (int64_t k = 0; p && k < count; k++) s += p[k], a += fabs(p[k]);
            /* a double sum of n floats in another order: within n * 2^-53 * sum|x| */
            KV_CHECK(p && count == n && fabs(s - v) <= (double)n * 0x1p-53 * a,
                     "%s: %lld weights summing to %.17g, the package's %lld summing to %.17g",
                     name, (long long)count, s, n, v);
            (*sums)++;
        }
    }
}

#endif
