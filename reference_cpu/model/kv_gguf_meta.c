/*
 * GGUF metadata and tensor lookups (kv_gguf.h): the sorted name tables, the typed getters.
 *
 * Keys and tensor names are sorted once at open, so a duplicate is two neighbours (refused:
 * which of two values would a reader mean?) and a lookup is a binary search. Values are read
 * from the mapping with memcpy: the file packs them with no alignment.
 */
#include "kv_gguf_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- names: sorted tables, duplicates, lookups ---------------------------------------- */

static int str_cmp(kv_gguf_str a, kv_gguf_str b)
{
    const uint64_t n = a.n < b.n ? a.n : b.n;
    const int c = n ? memcmp(a.s, b.s, (size_t)n) : 0;
    if (c) return c;
    return a.n < b.n ? -1 : a.n > b.n;
}

static int name_ix_cmp(const void *x, const void *y)
{
    const kv_gguf_name_ix *a = x, *b = y;
    const int c = str_cmp(a->name, b->name);
    if (c) return c;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* sort @p n names; KV_ERR_FORMAT naming the first duplicate (by its later index) */
static int index_names(kv_gguf_name_ix *t, int64_t n, const char *what, const char *path,
                       kv_err *err)
{
    qsort(t, (size_t)n, sizeof *t, name_ix_cmp);
    for (int64_t k = 1; k < n; k++)
        if (str_cmp(t[k - 1].name, t[k].name) == 0)
            return kv_fail(err, KV_ERR_FORMAT, "'%s': %s %lld '%.*s' repeats %s %lld", path,
                           what, (long long)t[k].i, (int)(t[k].name.n < 96 ? t[k].name.n : 96),
                           t[k].name.s, what, (long long)t[k - 1].i);
    return KV_OK;
}

int kv_gguf_index_keys(kv_gguf *g, const char *path, kv_err *err)
{
    g->kv_sorted = malloc((size_t)(g->n_kv ? g->n_kv : 1) * sizeof *g->kv_sorted);
    if (!g->kv_sorted) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < g->n_kv; i++)
        g->kv_sorted[i] = (kv_gguf_name_ix){g->kvs[i].kv.key, i};
    return index_names(g->kv_sorted, g->n_kv, "key", path, err);
}

int kv_gguf_index_tensors(kv_gguf *g, const char *path, kv_err *err)
{
    g->t_sorted = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *g->t_sorted);
    if (!g->t_sorted) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < g->n_tensors; i++)
        g->t_sorted[i] = (kv_gguf_name_ix){g->tensors[i].name, i};
    return index_names(g->t_sorted, g->n_tensors, "tensor", path, err);
}

/* index of @p name in a sorted table, -1 when absent */
static int64_t find(const kv_gguf_name_ix *t, int64_t n, const char *name)
{
    if (!name) return -1;
    const kv_gguf_str key = {name, strlen(name)};
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        const int c = str_cmp(t[mid].name, key);
        if (c == 0) return t[mid].i;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

const kv_gguf_kv *kv_gguf_lookup(const kv_gguf *g, const char *key)
{
    const int64_t i = find(g->kv_sorted, g->n_kv, key);
    return i < 0 ? NULL : &g->kvs[i].kv;
}

typedef struct {
    uint64_t off;
    int64_t i;
} off_ix;

static int off_ix_cmp(const void *x, const void *y)
{
    const off_ix *a = x, *b = y;
    if (a->off != b->off) return a->off < b->off ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

int64_t *kv_gguf_tensors_by_offset(const kv_gguf *g)
{
    const size_t n = (size_t)g->n_tensors;
    off_ix *t = malloc((n ? n : 1) * sizeof *t);
    int64_t *out = malloc((n ? n : 1) * sizeof *out);
    if (!t || !out) {
        free(t);
        free(out);
        return NULL;
    }
    for (size_t k = 0; k < n; k++) t[k] = (off_ix){g->tensors[k].offset, (int64_t)k};
    qsort(t, n, sizeof *t, off_ix_cmp);
    for (size_t k = 0; k < n; k++) out[k] = t[k].i;
    free(t);
    return out;
}

/* ---- the file as a whole ---------------------------------------------------------------- */

int kv_gguf_version(const kv_gguf *g) { return g->version; }
uint64_t kv_gguf_alignment(const kv_gguf *g) { return g->alignment; }
uint64_t kv_gguf_file_size(const kv_gguf *g) { return g->size; }
uint64_t kv_gguf_data_offset(const kv_gguf *g) { return g->data_off; }
int64_t kv_gguf_n_kv(const kv_gguf *g) { return g->n_kv; }

const kv_gguf_kv *kv_gguf_kv_at(const kv_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kvs[i].kv : NULL;
}

int64_t kv_gguf_n_tensors(const kv_gguf *g) { return g->n_tensors; }

const kv_gguf_tensor *kv_gguf_tensor_at(const kv_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name)
{
    const int64_t i = find(g->t_sorted, g->n_tensors, name);
    return i < 0 ? NULL : &g->tensors[i];
}

int kv_gguf_str_eq(kv_gguf_str s, const char *z)
{
    const size_t n = strlen(z);
    return s.n == n && (n == 0 || memcmp(s.s, z, n) == 0);
}

const char *kv_gguf_type_name(int type)
{
    static const char *names[KV_GGUF_TYPE_COUNT] = {"u8",  "i8",     "u16",   "i16", "u32",
                                                    "i32", "f32",    "bool",  "string",
                                                    "array", "u64",  "i64",   "f64"};
    return type >= 0 && type < KV_GGUF_TYPE_COUNT ? names[type] : "?";
}

/* ---- typed getters ------------------------------------------------------------------------- */

static int is_int(int t) { return t <= KV_GGUF_I32 || t == KV_GGUF_BOOL || t == KV_GGUF_U64 || t == KV_GGUF_I64; }
static int is_num(int t) { return is_int(t) || t == KV_GGUF_F32 || t == KV_GGUF_F64; }

double kv_gguf_array_num(int elem_type, const void *data, uint64_t i)
{
    const unsigned char *p = data;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            float f32; uint64_t u64; int64_t i64; double f64; } v;
    switch (elem_type) {
    case KV_GGUF_U8: case KV_GGUF_BOOL: memcpy(&v.u8, p + i, 1); return v.u8;
    case KV_GGUF_I8: memcpy(&v.i8, p + i, 1); return v.i8;
    case KV_GGUF_U16: memcpy(&v.u16, p + 2 * i, 2); return v.u16;
    case KV_GGUF_I16: memcpy(&v.i16, p + 2 * i, 2); return v.i16;
    case KV_GGUF_U32: memcpy(&v.u32, p + 4 * i, 4); return v.u32;
    case KV_GGUF_I32: memcpy(&v.i32, p + 4 * i, 4); return v.i32;
    case KV_GGUF_F32: memcpy(&v.f32, p + 4 * i, 4); return v.f32;
    case KV_GGUF_U64: memcpy(&v.u64, p + 8 * i, 8); return (double)v.u64;
    case KV_GGUF_I64: memcpy(&v.i64, p + 8 * i, 8); return (double)v.i64;
    case KV_GGUF_F64: memcpy(&v.f64, p + 8 * i, 8); return v.f64;
    default: return 0.0;
    }
}

/* the entry of @p key when it exists and @p ok accepts its type, else KV_ERR_FORMAT */
static int entry(const kv_gguf *g, const char *key, int (*ok)(int), const char *want,
                 const kv_gguf_kv **kv, kv_err *err)
{
    *kv = kv_gguf_lookup(g, key);
    if (!*kv) return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' is missing", key ? key : "");
    if (!ok((*kv)->type))
        return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' is %s%s%s, not %s", key,
                       kv_gguf_type_name((*kv)->type), (*kv)->type == KV_GGUF_ARRAY ? " of " : "",
                       (*kv)->type == KV_GGUF_ARRAY ? kv_gguf_type_name((*kv)->elem_type) : "",
                       want);
    return KV_OK;
}

int kv_gguf_get_int(const kv_gguf *g, const char *key, int64_t *out, kv_err *err)
{
    const kv_gguf_kv *kv;
    int rc = entry(g, key, is_int, "an integer", &kv, err);
    if (rc) return rc;
    if (kv->type == KV_GGUF_U64) {
        uint64_t u;
        memcpy(&u, kv->value, 8);
        if (u > (uint64_t)INT64_MAX)
            return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' = %llu is out of range", key,
                           (unsigned long long)u);
        *out = (int64_t)u;
    } else if (kv->type == KV_GGUF_I64) {
        memcpy(out, kv->value, 8);
    } else {
        *out = (int64_t)kv_gguf_array_num(kv->type, kv->value, 0); /* exact below 2^32 */
    }
    return KV_OK;
}

int kv_gguf_get_float(const kv_gguf *g, const char *key, double *out, kv_err *err)
{
    const kv_gguf_kv *kv;
    int rc = entry(g, key, is_num, "a number", &kv, err);
    if (rc) return rc;
    *out = kv_gguf_array_num(kv->type, kv->value, 0);
    return KV_OK;
}

static int is_string(int t) { return t == KV_GGUF_STRING; }
static int is_array(int t) { return t == KV_GGUF_ARRAY; }

int kv_gguf_get_str(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_err *err)
{
    const kv_gguf_kv *kv;
    int rc = entry(g, key, is_string, "a string", &kv, err);
    if (rc) return rc;
    *out = kv->str;
    return KV_OK;
}

int kv_gguf_has(const kv_gguf *g, const char *key) { return kv_gguf_lookup(g, key) != NULL; }

int kv_gguf_get_strings(const kv_gguf *g, const char *key, const kv_gguf_str **strs, uint64_t *n,
                        kv_err *err)
{
    const kv_gguf_kv *kv;
    int rc = entry(g, key, is_array, "an array of strings", &kv, err);
    if (rc) return rc;
    if (kv->elem_type != KV_GGUF_STRING)
        return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' is an array of %s, not of strings",
                       key, kv_gguf_type_name(kv->elem_type));
    const kv_gguf_entry *e = (const kv_gguf_entry *)kv; /* kv is the entry's first member */
    *strs = g->strs + e->str_first;
    *n = kv->n;
    return KV_OK;
}

int kv_gguf_get_array(const kv_gguf *g, const char *key, int *elem_type, uint64_t *n,
                      const void **data, kv_err *err)
{
    const kv_gguf_kv *kv;
    int rc = entry(g, key, is_array, "an array of numbers", &kv, err);
    if (rc) return rc;
    if (!is_num(kv->elem_type))
        return kv_fail(err, KV_ERR_FORMAT, "GGUF key '%s' is an array of %s, not of numbers",
                       key, kv_gguf_type_name(kv->elem_type));
    *elem_type = kv->elem_type;
    *n = kv->n;
    *data = kv->value;
    return KV_OK;
}
