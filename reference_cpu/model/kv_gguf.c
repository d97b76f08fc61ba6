/*
 * GGUF files (kv_gguf.h): mapping, parsing and checking, versions 2 and 3.
 *
 * The file, little-endian throughout:
 *
 *   offset  field
 *   0       magic "GGUF"                        4 bytes
 *   4       version                             u32: 2 or 3 (1 had u32 counts; refused)
 *   8       n_tensors                           u64
 *   16      n_kv                                u64
 *   24      n_kv metadata entries:
 *             key                               string
 *             value type                        u32 (KV_GGUF_*)
 *             value                             by type: 1/2/4/8 bytes, a string, or an array
 *   ...     n_tensors tensor infos:
 *             name                              string
 *             n_dims                            u32, 1..4
 *             ne[n_dims]                        u64 each, ne[0] the row length
 *             type                              u32 (ggml type, kv_gguf_quant.h)
 *             offset                            u64, from the data section, a multiple of
 *                                               the alignment
 *   ...     zero padding up to a multiple of general.alignment (32 unless the key says)
 *   data    the tensors' bytes: tensor t at data + offset_t, nbytes_t long
 *
 *   string  u64 length, then that many bytes (no NUL)
 *   array   u32 element type, u64 count, the elements (an element may itself be an array)
 *
 * Nothing here trusts a number before checking it against the bytes that remain: a count is
 * bounded by the remaining bytes over the smallest encoding of one element before anything is
 * allocated for it, a length before it is read, a product of sizes before it is used. A
 * refusal names the field ("key 3 'general.name': string length ... past the end of the
 * file"), so a truncated download and a hostile file both say where they went wrong.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#include "kv_gguf_internal.h"
#include "kv_gguf_quant.h"
#include "kv_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME 63     /* a tensor name's bytes (ggml's GGML_MAX_NAME less its NUL) */
#define GGUF_MAX_KEY 65535   /* the specification's longest key */
#define GGUF_MAX_DEPTH 8     /* arrays of arrays: deeper nesting is refused */

/* a read position in the mapping; every read goes through need() first */
typedef struct {
    const unsigned char *p; /* [size] the mapped file */
    uint64_t pos, size;
    kv_err *err;
    const char *path;
    char ctx[160];          /* what is being read, for the messages: "key 3 'general.name'" */
} cursor;

static int need(cursor *c, uint64_t n, const char *what)
{
    if (n <= c->size - c->pos) return KV_OK;
    return kv_fail(c->err, KV_ERR_FORMAT,
                   "'%s': %s: %s at offset %llu needs %llu bytes, past the end of the file "
                   "(size %llu)", c->path, c->ctx, what, (unsigned long long)c->pos,
                   (unsigned long long)n, (unsigned long long)c->size);
}

static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static int read_u32(cursor *c, const char *what, uint32_t *v)
{
    if (need(c, 4, what)) return KV_ERR_FORMAT;
    *v = get_u32(c->p + c->pos);
    c->pos += 4;
    return KV_OK;
}

static int read_u64(cursor *c, const char *what, uint64_t *v)
{
    if (need(c, 8, what)) return KV_ERR_FORMAT;
    *v = get_u64(c->p + c->pos);
    c->pos += 8;
    return KV_OK;
}

/* a string: its u64 length, then the bytes, which must lie inside the file */
static int read_str(cursor *c, kv_gguf_str *s)
{
    uint64_t n;
    if (read_u64(c, "string length", &n)) return KV_ERR_FORMAT;
    if (n > c->size - c->pos)
        return kv_fail(c->err, KV_ERR_FORMAT,
                       "'%s': %s: string length %llu at offset %llu past the end of the file "
                       "(size %llu)", c->path, c->ctx, (unsigned long long)n,
                       (unsigned long long)(c->pos - 8), (unsigned long long)c->size);
    s->s = (const char *)c->p + c->pos;
    s->n = n;
    c->pos += n;
    return KV_OK;
}

/* bytes of one element of a fixed-size value type; 0 for string and array */
static uint64_t type_size(int type)
{
    static const unsigned char size[KV_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type >= 0 && type < KV_GGUF_TYPE_COUNT ? size[type] : 0;
}

static int check_type(cursor *c, uint32_t type, const char *what)
{
    if (type < KV_GGUF_TYPE_COUNT) return KV_OK;
    return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: unknown %s %u (GGUF has 0..%d)", c->path,
                   c->ctx, what, type, KV_GGUF_TYPE_COUNT - 1);
}

/* A string array's elements, appended to g->strs (all the file's string arrays share it). */
static int push_str(kv_gguf *g, kv_gguf_str s, kv_err *err)
{
    if (g->n_strs == g->cap_strs) {
        uint64_t cap = g->cap_strs ? 2 * g->cap_strs : 256;
        kv_gguf_str *p = realloc(g->strs, cap * sizeof *p);
        if (!p) return kv_fail(err, KV_ERR_NOMEM, "out of memory for %llu strings",
                               (unsigned long long)cap);
        g->strs = p;
        g->cap_strs = cap;
    }
    g->strs[g->n_strs++] = s;
    return KV_OK;
}

/*
 * The elements of an array (its type and count already read): fixed-size elements are one
 * bounded block; strings and inner arrays are walked one by one, each at least 8 (12) bytes,
 * so the walk ends within the file's size. @p keep: append strings to g->strs (the top level).
 */
static int read_elems(cursor *c, kv_gguf *g, uint32_t type, uint64_t n, int depth, int keep)
{
    const uint64_t size = type_size((int)type);
    if (size) {
        if (n > (c->size - c->pos) / size)
            return kv_fail(c->err, KV_ERR_FORMAT,
                           "'%s': %s: array of %llu %s elements at offset %llu past the end of "
                           "the file (size %llu)", c->path, c->ctx, (unsigned long long)n,
                           kv_gguf_type_name((int)type), (unsigned long long)c->pos,
                           (unsigned long long)c->size);
        c->pos += n * size;
        return KV_OK;
    }
    const uint64_t least = type == KV_GGUF_STRING ? 8 : 12;
    if (n > (c->size - c->pos) / least)
        return kv_fail(c->err, KV_ERR_FORMAT,
                       "'%s': %s: array count %llu at offset %llu: %llu elements of at least "
                       "%llu bytes cannot fit in the file (size %llu)", c->path, c->ctx,
                       (unsigned long long)n, (unsigned long long)c->pos,
                       (unsigned long long)n, (unsigned long long)least,
                       (unsigned long long)c->size);
    for (uint64_t i = 0; i < n; i++) {
        if (type == KV_GGUF_STRING) {
            kv_gguf_str s;
            if (read_str(c, &s)) return KV_ERR_FORMAT;
            if (keep && push_str(g, s, c->err)) return KV_ERR_NOMEM;
            continue;
        }
        /* an inner array: its own element type and count */
        if (depth + 1 >= GGUF_MAX_DEPTH)
            return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: arrays nested deeper than %d",
                           c->path, c->ctx, GGUF_MAX_DEPTH);
        uint32_t t;
        uint64_t m;
        if (read_u32(c, "inner array type", &t) || check_type(c, t, "inner array type") ||
            read_u64(c, "inner array count", &m))
            return KV_ERR_FORMAT;
        int rc = read_elems(c, g, t, m, depth + 1, 0);
        if (rc) return rc;
    }
    return KV_OK;
}

/* One metadata entry: key, type, value. */
static int read_kv(cursor *c, kv_gguf *g, int64_t i)
{
    kv_gguf_entry *e = &g->kvs[i];
    kv_gguf_kv *kv = &e->kv;
    snprintf(c->ctx, sizeof c->ctx, "key %lld", (long long)i);
    if (read_str(c, &kv->key)) return KV_ERR_FORMAT;
    if (kv->key.n == 0 || kv->key.n > GGUF_MAX_KEY || memchr(kv->key.s, 0, kv->key.n))
        return kv_fail(c->err, KV_ERR_FORMAT,
                       "'%s': key %lld: a key must be 1..%d bytes without NUL (length %llu)",
                       c->path, (long long)i, GGUF_MAX_KEY, (unsigned long long)kv->key.n);
    snprintf(c->ctx, sizeof c->ctx, "key %lld '%.*s'", (long long)i,
             (int)(kv->key.n < 96 ? kv->key.n : 96), kv->key.s);
    uint32_t type;
    if (read_u32(c, "value type", &type) || check_type(c, type, "value type"))
        return KV_ERR_FORMAT;
    kv->type = (int)type;
    e->str_first = UINT64_MAX;
    if (type == KV_GGUF_STRING) return read_str(c, &kv->str);
    if (type != KV_GGUF_ARRAY) {
        if (need(c, type_size((int)type), "value")) return KV_ERR_FORMAT;
        kv->value = c->p + c->pos;
        c->pos += type_size((int)type);
        if (type == KV_GGUF_BOOL && *(const unsigned char *)kv->value > 1)
            return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: bool value %u is neither 0 nor 1",
                           c->path, c->ctx, *(const unsigned char *)kv->value);
        return KV_OK;
    }
    uint32_t et;
    if (read_u32(c, "array element type", &et) || check_type(c, et, "array element type") ||
        read_u64(c, "array count", &kv->n))
        return KV_ERR_FORMAT;
    kv->elem_type = (int)et;
    kv->value = c->p + c->pos;
    if (et == KV_GGUF_STRING) e->str_first = g->n_strs;
    return read_elems(c, g, et, kv->n, 0, 1);
}

/* One tensor info: name, dims, type, offset; its byte count from the type's block size. */
static int read_tensor(cursor *c, kv_gguf *g, int64_t i)
{
    kv_gguf_tensor *t = &g->tensors[i];
    snprintf(c->ctx, sizeof c->ctx, "tensor %lld", (long long)i);
    if (read_str(c, &t->name)) return KV_ERR_FORMAT;
    if (t->name.n == 0 || t->name.n > GGUF_MAX_NAME || memchr(t->name.s, 0, t->name.n))
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': tensor %lld: a tensor name must be 1..%d "
                       "bytes without NUL (length %llu)", c->path, (long long)i, GGUF_MAX_NAME,
                       (unsigned long long)t->name.n);
    snprintf(c->ctx, sizeof c->ctx, "tensor %lld '%.*s'", (long long)i, (int)t->name.n,
             t->name.s);
    uint32_t n_dims;
    if (read_u32(c, "n_dims", &n_dims)) return KV_ERR_FORMAT;
    if (n_dims < 1 || n_dims > KV_GGUF_MAX_DIMS)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: n_dims %u is not in 1..%d", c->path,
                       c->ctx, n_dims, KV_GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    int64_t count = 1;
    for (int d = 0; d < KV_GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && read_u64(c, "ne", &ne)) return KV_ERR_FORMAT;
        if (ne < 1 || ne > (uint64_t)(INT64_MAX / count))
            return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: ne[%d] = %llu: each dimension "
                           "must be at least 1 and their product below 2^63", c->path, c->ctx,
                           d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
        count *= (int64_t)ne;
    }
    uint32_t type;
    if (read_u32(c, "type", &type) || read_u64(c, "offset", &t->offset)) return KV_ERR_FORMAT;
    t->type = (int)type;
    /* bytes of one row of ne[0] elements, times the rows */
    uint64_t row;
    kv_err why;
    if (kv_ggml_row_bytes(t->type, t->ne[0], &row, &why))
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: %s", c->path, c->ctx, why.msg);
    const uint64_t rows = (uint64_t)(count / t->ne[0]);
    if (rows && row > UINT64_MAX / rows)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: %llu rows of %llu bytes overflow",
                       c->path, c->ctx, (unsigned long long)rows, (unsigned long long)row);
    t->nbytes = row * rows;
    if (t->offset % g->alignment)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': %s: data offset %llu is not a multiple of "
                       "the alignment %llu", c->path, c->ctx, (unsigned long long)t->offset,
                       (unsigned long long)g->alignment);
    return KV_OK;
}

/* general.alignment, when the file sets it: a u32 power of two */
static int read_alignment(cursor *c, kv_gguf *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const kv_gguf_kv *kv = kv_gguf_lookup(g, "general.alignment");
    if (!kv) return KV_OK;
    if (kv->type != KV_GGUF_U32)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': key 'general.alignment' is %s, not u32",
                       c->path, kv_gguf_type_name(kv->type));
    const uint32_t a = get_u32(kv->value);
    if (a == 0 || (a & (a - 1)))
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': key 'general.alignment' = %u is not a "
                       "power of two", c->path, a);
    g->alignment = a;
    return KV_OK;
}

/* Every tensor's data inside the file and no two overlapping (checked in offset order). */
static int check_data(cursor *c, kv_gguf *g)
{
    const uint64_t a = g->alignment;
    g->data_off = (c->pos + a - 1) / a * a; /* pos <= size < 2^63 and a <= 2^31: no overflow */
    if (g->n_tensors == 0) return KV_OK;
    if (g->data_off > c->size)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': the data section (offset %llu) starts past "
                       "the end of the file (size %llu)", c->path,
                       (unsigned long long)g->data_off, (unsigned long long)c->size);
    const uint64_t avail = c->size - g->data_off;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kv_gguf_tensor *t = &g->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return kv_fail(c->err, KV_ERR_FORMAT, "'%s': tensor %lld '%.*s': data [%llu, %llu) "
                           "past the end of the file (size %llu)", c->path, (long long)i,
                           (int)t->name.n, t->name.s,
                           (unsigned long long)(g->data_off + t->offset),
                           (unsigned long long)(g->data_off + t->offset + t->nbytes),
                           (unsigned long long)c->size);
        t->data = c->p + g->data_off + t->offset;
    }
    int64_t *by_off = kv_gguf_tensors_by_offset(g);
    if (!by_off) return kv_fail(c->err, KV_ERR_NOMEM, "out of memory");
    int rc = KV_OK;
    for (int64_t k = 1; k < g->n_tensors && !rc; k++) {
        const kv_gguf_tensor *p = &g->tensors[by_off[k - 1]], *t = &g->tensors[by_off[k]];
        if (p->offset + p->nbytes > t->offset)
            rc = kv_fail(c->err, KV_ERR_FORMAT, "'%s': tensor %lld '%.*s': data [%llu, %llu) "
                         "overlaps tensor %lld '%.*s' at %llu", c->path, (long long)by_off[k],
                         (int)t->name.n, t->name.s, (unsigned long long)t->offset,
                         (unsigned long long)(t->offset + t->nbytes), (long long)by_off[k - 1],
                         (int)p->name.n, p->name.s, (unsigned long long)p->offset);
    }
    free(by_off);
    return rc;
}

/* The header: magic, version, the two counts, each count bounded by the bytes left. */
static int read_header(cursor *c, kv_gguf *g, uint64_t *n_tensors, uint64_t *n_kv)
{
    snprintf(c->ctx, sizeof c->ctx, "header");
    if (need(c, 4, "magic")) return KV_ERR_FORMAT;
    if (memcmp(c->p, GGUF_MAGIC, 4) != 0)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s' is not a GGUF file (magic %02x %02x %02x "
                       "%02x, expected \"GGUF\")", c->path, c->p[0], c->p[1], c->p[2], c->p[3]);
    c->pos = 4;
    uint32_t v;
    if (read_u32(c, "version", &v)) return KV_ERR_FORMAT;
    if (v == 1)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': GGUF version 1 (32-bit counts) is not "
                       "supported: kvlab reads versions 2 and 3", c->path);
    if (v == 0x02000000u || v == 0x03000000u)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': a big-endian GGUF file (version %u "
                       "byte-swapped): kvlab reads little-endian files", c->path,
                       (unsigned)(v >> 24));
    if (v != 2 && v != 3)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': GGUF version %u is not supported: kvlab "
                       "reads versions 2 and 3", c->path, v);
    g->version = (int)v;
    if (read_u64(c, "n_tensors", n_tensors) || read_u64(c, "n_kv", n_kv)) return KV_ERR_FORMAT;
    /* an entry takes at least 13 bytes (key length, type, one byte of value), a tensor info
     * at least 32 (name length, n_dims, one ne, type, offset): more cannot be in the file */
    const uint64_t left = c->size - c->pos;
    if (*n_kv > left / 13)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': n_kv %llu: that many entries cannot fit "
                       "in the file (size %llu)", c->path, (unsigned long long)*n_kv,
                       (unsigned long long)c->size);
    if (*n_tensors > left / 32)
        return kv_fail(c->err, KV_ERR_FORMAT, "'%s': n_tensors %llu: that many tensor infos "
                       "cannot fit in the file (size %llu)", c->path,
                       (unsigned long long)*n_tensors, (unsigned long long)c->size);
    return KV_OK;
}

static int parse(cursor *c, kv_gguf *g)
{
    uint64_t n_tensors = 0, n_kv = 0;
    int rc = read_header(c, g, &n_tensors, &n_kv);
    if (rc) return rc;
    g->kvs = calloc(n_kv ? n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return kv_fail(c->err, KV_ERR_NOMEM, "out of memory");
    for (g->n_kv = 0; g->n_kv < (int64_t)n_kv; g->n_kv++)
        if ((rc = read_kv(c, g, g->n_kv))) return rc;
    if ((rc = kv_gguf_index_keys(g, c->path, c->err))) return rc;
    if ((rc = read_alignment(c, g))) return rc;
    for (g->n_tensors = 0; g->n_tensors < (int64_t)n_tensors; g->n_tensors++)
        if ((rc = read_tensor(c, g, g->n_tensors))) return rc;
    if ((rc = kv_gguf_index_tensors(g, c->path, c->err))) return rc;
    return check_data(c, g);
}

int kv_gguf_open(const char *path, kv_gguf **out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_gguf_open: out is NULL");
    *out = NULL;
    FILE *f;
    int64_t size;
    int rc = kv_file_open_read(path, 0, &f, &size, err);
    if (rc) return rc;
    if (size < 8) {
        fclose(f);
        return kv_fail(err, KV_ERR_FORMAT, "'%s' is too short for a GGUF file (%lld bytes)",
                       path, (long long)size);
    }
    kv_gguf *g = calloc(1, sizeof *g);
    void *map = g ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fileno(f), 0) : NULL;
    const int e = errno;
    fclose(f); /* the mapping stays valid without the descriptor */
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    if (map == MAP_FAILED) {
        free(g);
        return kv_fail(err, KV_ERR_IO, "cannot map '%s': %s", path, strerror(e));
    }
    g->map = map;
    g->size = (uint64_t)size;
    cursor c = {.p = map, .pos = 0, .size = (uint64_t)size, .err = err, .path = path};
    if ((rc = parse(&c, g))) {
        kv_gguf_close(g);
        return rc;
    }
    *out = g;
    return KV_OK;
}

void kv_gguf_close(kv_gguf *g)
{
    if (!g) return;
    if (g->map) munmap((void *)g->map, (size_t)g->size);
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    free(g->strs);
    free(g);
}
