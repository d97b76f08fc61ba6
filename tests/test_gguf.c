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

static void check_expected(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.txt", dir);
    kv_test_gguf_counts n = kv_test_gguf_expected(path, dir);
    KV_CHECK(n.files == 6 && n.kvs >= 71 && n.tensors >= 37, "expected.txt: %d files, %d keys, "
             "%d tensors checked", n.files, n.kvs, n.tensors);
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
