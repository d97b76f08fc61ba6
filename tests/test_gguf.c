/*
 * The GGUF reader (model/kv_gguf.h) against the gguf Python package's writer, and against
 * hostile files.
 *
 * Values: tests/data/gguf/ holds small files written by GGUFWriter (tools/gguf/make_test_files.py:
 * every value type, nested arrays, versions 2 and 3, alignment 64) and expected.txt, what the
 * script handed the writer (cross-checked there with the package's reader). Every key, value,
 * tensor shape, offset, size and data hash read here must equal it.
 *
 * Hostile files, made here from types_v3.gguf: every truncation (each byte count below the
 * end of the last tensor's data must be refused, each at or past it accepted), and one
 * corrupted field at a time (counts, lengths, types, dims, offsets, duplicates, alignment),
 * each refused with KV_ERR_FORMAT and a message naming the field.
 *
 * Usage: test_gguf <tests/data/gguf>
 */
#include "common/kv_test.h"
#include "common/kv_test_gguf.h"

#include "kv_gguf.h"

#include <math.h>
#include <stdint.h>

static const char *dir;

/* ---- values: expected.txt ------------------------------------------------------------- */

/* decode expected.txt's hex ("-" for empty) into buf; returns the length */
static size_t unhex(const char *h, char *buf, size_t cap)
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

static int type_of(const char *name)
{
    for (int t = 0; t < KV_GGUF_TYPE_COUNT; t++)
        if (strcmp(kv_gguf_type_name(t), name) == 0) return t;
    return -1;
}

/* element i of an integer array, exactly (memcpy of the raw bytes) */
static int is_int_type(int t) { return t != KV_GGUF_F32 && t != KV_GGUF_F64; }

static int same_number(int t, const void *data, uint64_t i, const char *want)
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
static void check_kv(const kv_gguf *g, const char *file, const char *key, const char *type,
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
static uint64_t fnv1a64(const unsigned char *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* tensor NAME TYPE N_DIMS NE0..NE3 OFFSET NBYTES FNV */
static void check_tensor(const kv_gguf *g, const char *file, int64_t index, const char *line)
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

static void check_expected(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.txt", dir);
    size_t n;
    char *text = (char *)kv_test_slurp(path, &n);
    KV_CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    kv_gguf *g = NULL;
    char file[256] = "";
    int64_t tensor = 0, files = 0, kvs = 0, tensors = 0;
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
            snprintf(path, sizeof path, "%s/%s", dir, file);
            KV_CHECK(kv_gguf_open(path, &g, &err) == KV_OK, "%s: %s", file, err.msg);
            if (g)
                KV_CHECK(kv_gguf_version(g) == version && kv_gguf_alignment(g) == align &&
                         kv_gguf_n_kv(g) == n_kv && kv_gguf_n_tensors(g) == n_t,
                         "%s: version %d, alignment %llu, %d keys, %d tensors", file, version,
                         align, n_kv, n_t);
            tensor = 0;
            files++;
        } else if (g && sscanf(line, "kv %255s %31s %n", key, type, &at) == 2 && at > 0) {
            check_kv(g, file, key, type, line + at);
            kvs++;
        } else if (g && strncmp(line, "tensor ", 7) == 0) {
            check_tensor(g, file, tensor++, line);
            tensors++;
        }
    }
    kv_gguf_close(g);
    free(text);
    KV_CHECK(files == 5 && kvs >= 70 && tensors >= 36, "expected.txt: %lld files, %lld keys, "
             "%lld tensors checked", (long long)files, (long long)kvs, (long long)tensors);
}

/* ---- hostile files ----------------------------------------------------------------------- */

static unsigned char *good;  /* [good_n] types_v3.gguf */
static size_t good_n;

static void put_u32(unsigned char *b, size_t at, uint32_t v) { memcpy(b + at, &v, 4); }
static void put_u64(unsigned char *b, size_t at, uint64_t v) { memcpy(b + at, &v, 8); }

/* open a copy of @p b: KV_ERR_FORMAT, with every NULL-separated word of @p words in the
 * message, is what must happen */
static void refused(const unsigned char *b, size_t n, const char *what, const char *words)
{
    kv_gguf *g = (kv_gguf *)1;
    kv_err err = {{0}};
    const int rc = kv_test_gguf_bytes(b, n, &g, &err);
    int named = 1;
    for (const char *w = words; *w; w += strlen(w) + 1) named &= strstr(err.msg, w) != NULL;
    KV_CHECK(rc == KV_ERR_FORMAT && g == NULL && named, "%s: status %d, message \"%s\"", what,
             rc, err.msg);
    if (rc == KV_OK) kv_gguf_close(g);
}

/* every byte count short of the last tensor's end is refused; from there on the file reads */
static void truncations(const kv_gguf *g)
{
    uint64_t end = 0;
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        const uint64_t e = kv_gguf_data_offset(g) + t->offset + t->nbytes;
        if (e > end) end = e;
    }
    long wrong = 0, unnamed = 0;
    for (size_t n = 0; n < good_n; n++) {
        kv_gguf *h = NULL;
        kv_err err = {{0}};
        const int rc = kv_test_gguf_bytes(good, n, &h, &err);
        if (rc != (n < end ? KV_ERR_FORMAT : KV_OK)) {
            if (wrong++ < 5) printf("  %zu bytes: status %d (%s)\n", n, rc, err.msg);
        } else if (rc && (!strstr(err.msg, "kvlab-gguf-") || strlen(err.msg) < 40)) {
            if (unnamed++ < 5) printf("  %zu bytes: message \"%s\"\n", n, err.msg);
        }
        kv_gguf_close(h);
    }
    KV_CHECK(wrong == 0 && unnamed == 0 && end > good_n / 2, "truncations of %zu bytes (data end "
             "%llu): %ld wrong statuses, %ld messages without the path", good_n,
             (unsigned long long)end, wrong, unnamed);
}

/* one corrupted field: @p at bytes into the file, written by @p put, must be refused */
#define CORRUPT(what, words, ...)                                                              \
    do {                                                                                       \
        memcpy(b, good, good_n);                                                               \
        __VA_ARGS__;                                                                           \
        refused(b, good_n, what, words);                                                       \
    } while (0)

static void corruptions(const kv_gguf *g)
{
    unsigned char *b = malloc(good_n);
    const unsigned char *base = kv_test_gguf_base(g);
#define AT(p) ((size_t)((const unsigned char *)(p) - base))
    CORRUPT("magic", "not a GGUF file\0", b[3] = 'X');
    CORRUPT("version 1", "version 1\0not supported\0", put_u32(b, 4, 1));
    CORRUPT("version 4", "version 4\0not supported\0", put_u32(b, 4, 4));
    CORRUPT("big-endian", "big-endian\0", put_u32(b, 4, 0x03000000u));
    CORRUPT("n_tensors", "n_tensors 1152921504606846976\0", put_u64(b, 8, 1ull << 60));
    CORRUPT("n_kv", "n_kv 1152921504606846976\0", put_u64(b, 16, 1ull << 60));
    CORRUPT("n_kv + 1", "past the end of the file\0", put_u64(b, 16, kv_gguf_n_kv(g) + 1));
    CORRUPT("key length", "key 0: string length 4611686018427387904\0", put_u64(b, 24, 1ull << 62));
    CORRUPT("key length 0", "key 0: a key must be 1..\0", put_u64(b, 24, 0));

    const kv_gguf_kv *str = kv_test_gguf_kv(g, "test.string");
    const kv_gguf_kv *u32s = kv_test_gguf_kv(g, "test.array.u32");
    const kv_gguf_kv *strs = kv_test_gguf_kv(g, "test.array.string");
    const kv_gguf_kv *nested = kv_test_gguf_kv(g, "test.nested.i32");
    const kv_gguf_kv *flag = kv_test_gguf_kv(g, "test.scalar.bool");
    const kv_gguf_kv *u8 = kv_test_gguf_kv(g, "test.scalar.u8");
    CORRUPT("value type", "'test.string': unknown value type 13\0",
            put_u32(b, AT(str->key.s + str->key.n), 13));
    CORRUPT("string length", "'test.string': string length 1099511627776\0",
            put_u64(b, AT(str->str.s) - 8, 1ull << 40));
    CORRUPT("array count", "'test.array.u32': array of 4611686018427387904 u32\0",
            put_u64(b, AT(u32s->value) - 8, 1ull << 62));
    CORRUPT("string array count", "'test.array.string': array count 1152921504606846976\0",
            put_u64(b, AT(strs->value) - 8, 1ull << 60));
    CORRUPT("array element type", "'test.array.u32': unknown array element type 99\0",
            put_u32(b, AT(u32s->value) - 12, 99));
    CORRUPT("inner array type", "'test.nested.i32': unknown inner array type 77\0",
            put_u32(b, AT(nested->value), 77));
    CORRUPT("inner array count", "'test.nested.i32': array of 1099511627776 i32\0",
            put_u64(b, AT(nested->value) + 4, 1ull << 40));
    CORRUPT("bool", "'test.scalar.bool': bool value 2\0", b[AT(flag->value)] = 2);
    CORRUPT("duplicate key", "key\0'test.scalar.i8' repeats key\0",
            b[AT(u8->key.s) + strlen("test.scalar.")] = 'i');

    const kv_gguf_tensor *t0 = kv_gguf_tensor_at(g, 0), *t1 = kv_gguf_tensor_at(g, 1);
    const kv_gguf_tensor *t5 = kv_gguf_tensor_at(g, 5);
    const size_t dims0 = AT(t0->name.s + t0->name.n); /* n_dims, ne[], type, offset follow */
    const size_t dims1 = AT(t1->name.s + t1->name.n);
    const size_t off1 = dims1 + 4 + 8 * (size_t)t1->n_dims + 4;
    CORRUPT("n_dims 5", "tensor 0 'f32.matrix': n_dims 5 is not in 1..4\0", put_u32(b, dims0, 5));
    CORRUPT("n_dims 0", "tensor 0 'f32.matrix': n_dims 0\0", put_u32(b, dims0, 0));
    CORRUPT("ne 0", "tensor 0 'f32.matrix': ne[0] = 0\0", put_u64(b, dims0 + 4, 0));
    CORRUPT("ne product", "tensor 0 'f32.matrix': ne[1] = 4611686018427387904\0",
            put_u64(b, dims0 + 12, 1ull << 62));
    CORRUPT("ggml type", "tensor 0 'f32.matrix'\0type\0", put_u32(b, dims0 + 20, 99));
    CORRUPT("partial block", "tensor 0 'f32.matrix'\0block\0", put_u32(b, dims0 + 20, 8));
    CORRUPT("misaligned offset", "tensor 1 'f16.vector': data offset 65 is not a multiple of the "
            "alignment 32\0", put_u64(b, off1, t1->offset + 1));
    CORRUPT("offset past the end", "tensor 1 'f16.vector': data [\0past the end of the file\0",
            put_u64(b, off1, 1ull << 40));
    CORRUPT("overlap", "tensor 1 'f16.vector'\0overlaps tensor 0 'f32.matrix'\0",
            put_u64(b, off1, 0));
    CORRUPT("duplicate tensor", "tensor 1 'f32.matrix' repeats tensor 0\0",
            memcpy(b + AT(t1->name.s), "f32.matrix", 10));
    CORRUPT("tensor name length", "tensor 5: a tensor name must be 1..63 bytes\0",
            put_u64(b, AT(t5->name.s) - 8, 64));
    CORRUPT("tensor name NUL", "tensor 5: a tensor name must be 1..63 bytes without NUL\0",
            b[AT(t5->name.s) + 2] = 0);
#undef AT
    free(b);
}

/* general.alignment in align64.gguf: a u32 power of two */
static void alignments(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/align64.gguf", dir);
    size_t n;
    unsigned char *a = kv_test_slurp(path, &n);
    kv_gguf *g = NULL;
    kv_err err;
    KV_CHECK(a && kv_gguf_open(path, &g, &err) == KV_OK, "align64.gguf: %s", err.msg);
    if (!a || !g) return;
    const kv_gguf_kv *kv = kv_test_gguf_kv(g, "general.alignment");
    const size_t at = (size_t)((const unsigned char *)kv->value - kv_test_gguf_base(g));
    const uint32_t bad[] = {0, 3, 48};
    for (int k = 0; k < 3; k++) {
        put_u32(a, at, bad[k]);
        refused(a, n, "alignment", "'general.alignment'\0not a power of two\0");
    }
    put_u32(a, at, 32); /* valid, but the offsets were made for 64: tensor 1 is at 64 */
    kv_gguf *h = NULL;
    KV_CHECK(kv_test_gguf_bytes(a, n, &h, &err) == KV_OK && kv_gguf_alignment(h) == 32,
             "alignment 32: %s", err.msg);
    kv_gguf_close(h);
    put_u32(a, at, 64);
    put_u32(a, at - 4, KV_GGUF_I32);
    refused(a, n, "alignment type", "'general.alignment' is i32, not u32\0");
    kv_gguf_close(g);
    free(a);
}

static void files_that_are_not(void)
{
    kv_gguf *g = (kv_gguf *)1;
    kv_err err;
    KV_CHECK(kv_gguf_open(dir, &g, &err) == KV_ERR_IO && g == NULL && strstr(err.msg, "directory"),
             "a directory: %s", err.msg);
    KV_CHECK(kv_gguf_open("/nonexistent/x.gguf", &g, &err) == KV_ERR_IO, "a missing file");
    refused((const unsigned char *)"", 0, "empty file", "too short\0");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <tests/data/gguf>\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    check_expected();
    char path[1024];
    snprintf(path, sizeof path, "%s/types_v3.gguf", dir);
    good = kv_test_slurp(path, &good_n);
    kv_gguf *g = NULL;
    kv_err err;
    KV_CHECK(good && kv_gguf_open(path, &g, &err) == KV_OK, "types_v3.gguf: %s", err.msg);
    if (g) {
        truncations(g);
        corruptions(g);
        kv_gguf_close(g);
    }
    alignments();
    files_that_are_not();
    free(good);
    return kv_test_finish();
}
