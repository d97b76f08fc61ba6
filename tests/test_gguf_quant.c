/* The GGUF tensor types (reference_cpu/model/kv_gguf_quant.h) against an outside reference.
 *
 * tests/data/ggml_quant/ holds, for every type kvlab dequantizes, blocks of raw bytes and the
 * float32 values the gguf Python package (gguf.quants.dequantize, numpy) computes from them,
 * made by tools/gguf/make_quant_golden.py: special fp16 values in every scale field (zeros,
 * subnormals, +-65504, infinities, NaNs), all-minimum and all-maximum codes and sub-block
 * scales, the package's own quantized blocks, and random bytes. Each file's blocks are
 * dequantized as one row from an odd address (a mapped file gives no alignment) and held to
 * the expected values bit for bit: memcmp of the floats, so -0 against +0 fails too.
 *
 * NaN: F32, F16 and BF16 move bits (kvlab and numpy both keep a NaN's payload, a signaling
 * NaN's too), so their NaNs are compared bit for bit like every other value. In the quantized
 * types a NaN comes out of arithmetic (a NaN scale times a code, inf * 0, inf - inf), and which
 * payload an operation returns is the hardware's choice (IEEE 754 leaves it open): there a
 * NaN must meet a NaN, whatever its bits; every non-NaN value still matches bit for bit.
 *
 * exhaustive.txt: the SHA-256 of F16's and BF16's values for all 65536 codes, which kvlab's
 * conversion must reproduce. sizes.txt: every type the package knows (code, name, block,
 * bytes), which names and row sizes are held to. Then the refusals.
 *
 * Usage: test_gguf_quant <tests/data/ggml_quant>
 */
#include "common/kv_test.h"
#include "kv_file.h"
#include "kv_gguf_quant.h"
#include "kv_sha256.h"

#include <stdint.h>
#include <string.h>

#define MAX_FILE (1 << 20)

static const char *dir;

static uint32_t u32_at(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Read all of @p name under dir into a malloc'd buffer; NULL (and a failed check) if absent. */
static uint8_t *slurp(const char *name, int64_t *size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = NULL;
    kv_err err = {{0}};
    if (kv_file_open_read(path, MAX_FILE, &f, size, &err) != KV_OK) {
        KV_CHECK(0, "%s: %s", path, err.msg);
        return NULL;
    }
    uint8_t *buf = malloc((size_t)*size + 1);
    const size_t got = buf ? fread(buf, 1, (size_t)*size, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)*size) {
        KV_CHECK(0, "%s: read %zu of %lld bytes", path, got, (long long)*size);
        free(buf);
        return NULL;
    }
    buf[*size] = 0;
    return buf;
}

/* One golden file: kvlab's row against the package's values. */
static void check_golden(const char *file, int want_type)
{
    int64_t size = 0;
    uint8_t *buf = slurp(file, &size);
    if (!buf) return;
    if (size < 24 || memcmp(buf, "KVGQ", 4) != 0 || u32_at(buf + 4) != 1) {
        KV_CHECK(0, "%s: not a version 1 KVGQ file", file);
        free(buf);
        return;
    }
    const uint32_t type = u32_at(buf + 8), block = u32_at(buf + 12), bytes = u32_at(buf + 16);
    const uint32_t nb = u32_at(buf + 20);
    const int64_t need = 24 + (int64_t)nb * bytes + (int64_t)nb * block * 4;
    KV_CHECK(type == (uint32_t)want_type, "%s: type %u, expected %d", file, type, want_type);
    if (block == 0 || block > 256 || bytes == 0 || bytes > 512 || nb == 0 || nb > 4096 ||
        need != size) {
        KV_CHECK(0, "%s: header (block %u, bytes %u, %u blocks) does not match its %lld bytes",
                 file, block, bytes, nb, (long long)size);
        free(buf);
        return;
    }
    const kv_ggml_type_info *t = kv_ggml_type((int)type);
    KV_CHECK(t != NULL, "%s: kv_ggml_type(%u) is NULL", file, type);
    if (!t) {
        free(buf);
        return;
    }
    KV_CHECK(t->block == (int)block && t->block_bytes == (int)bytes,
             "%s: block %d of %d bytes, the package says %u of %u", t->name, t->block,
             t->block_bytes, block, bytes);
    KV_CHECK(strcmp(t->name, kv_ggml_type_name((int)type)) == 0, "%s: name", t->name);

    const int64_t n = (int64_t)nb * block;
    uint64_t row = 0;
    kv_err err = {{0}};
    KV_CHECK(kv_ggml_row_bytes((int)type, n, &row, &err) == KV_OK && row == (uint64_t)nb * bytes,
             "%s: row_bytes(%lld) = %llu, expected %llu (%s)", t->name, (long long)n,
             (unsigned long long)row, (unsigned long long)nb * bytes, err.msg);

    /* the blocks at an odd address, as a tensor in a mapped file may be */
    uint8_t *src = malloc((size_t)nb * bytes + 1);
    float *got = malloc((size_t)n * sizeof(float));
    float *want = malloc((size_t)n * sizeof(float));
    memcpy(src + 1, buf + 24, (size_t)nb * bytes);
    memcpy(want, buf + 24 + (size_t)nb * bytes, (size_t)n * 4); /* little-endian host */
    kv_ggml_dequant_row((int)type, src + 1, got, n);

    const int moves_bits = type == KV_GGML_F32 || type == KV_GGML_F16 || type == KV_GGML_BF16;
    long bad = 0, nans = 0, infs = 0, neg_zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        const int same = memcmp(&got[i], &want[i], 4) == 0;
        const int both_nan = isnan(got[i]) && isnan(want[i]);
        if (!(same || (!moves_bits && both_nan))) {
            uint32_t g, w;
            memcpy(&g, &got[i], 4);
            memcpy(&w, &want[i], 4);
            if (bad < 5)
                printf("  %s: block %lld weight %lld: got %.9g (0x%08x), expected %.9g (0x%08x)\n",
                       t->name, (long long)(i / block), (long long)(i % block), got[i], g,
                       want[i], w);
            bad++;
        }
        nans += isnan(want[i]) != 0;
        infs += isinf(want[i]) != 0;
        neg_zeros += want[i] == 0.0f && signbit(want[i]);
    }
    KV_CHECK(bad == 0, "%s: %ld of %lld values differ from the gguf package's", t->name, bad,
             (long long)n);
    /* the edge cases are in the data: a file without them would test less than it says */
    KV_CHECK(nans > 0 && infs > 0 && neg_zeros > 0,
             "%s: the data lacks NaN (%ld), infinite (%ld) or -0 (%ld) values", t->name, nans,
             infs, neg_zeros);
    printf("%-5s %4u blocks, %6lld values bit for bit (%ld NaN, %ld inf, %ld -0)\n", t->name,
           nb, (long long)n, nans, infs, neg_zeros);
    free(src), free(got), free(want), free(buf);
}

/* All 65536 codes of F16 and BF16, hashed, against exhaustive.txt. */
static void check_exhaustive(void)
{
    int64_t size = 0;
    char *text = (char *)slurp("exhaustive.txt", &size);
    if (!text) return;
    const int types[2] = {KV_GGML_F16, KV_GGML_BF16};
    for (int k = 0; k < 2; k++) {
        uint8_t codes[65536 * 2];
        static float vals[65536];
        for (int c = 0; c < 65536; c++) codes[2 * c] = (uint8_t)c, codes[2 * c + 1] = (uint8_t)(c >> 8);
        kv_ggml_dequant_row(types[k], codes, vals, 65536);
        kv_sha256 s;
        unsigned char digest[32];
        char hex[65], want[80];
        kv_sha256_init(&s);
        kv_sha256_update(&s, vals, sizeof vals);
        kv_sha256_final(&s, digest, hex);
        snprintf(want, sizeof want, "%s %s\n", kv_ggml_type_name(types[k]), hex);
        KV_CHECK(strstr(text, want) != NULL, "%s: the 65536 codes hash to %s, not the package's",
                 kv_ggml_type_name(types[k]), hex);
    }
    /* the one-value conversion is the row's: every code once more through kv_ggml_fp16() */
    long bad = 0;
    for (int c = 0; c < 65536; c++) {
        const uint8_t p[2] = {(uint8_t)c, (uint8_t)(c >> 8)};
        float a, b = kv_ggml_fp16((uint16_t)c);
        kv_ggml_dequant_row(KV_GGML_F16, p, &a, 1);
        bad += memcmp(&a, &b, 4) != 0;
    }
    KV_CHECK(bad == 0, "kv_ggml_fp16() and the F16 row disagree on %ld codes", bad);
    free(text);
}

/* Names and sizes of every type the package knows. */
static void check_sizes(void)
{
    int64_t size = 0;
    char *text = (char *)slurp("sizes.txt", &size);
    if (!text) return;
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int code, block, bytes;
        char name[32];
        if (sscanf(line, "%d %31s %d %d", &code, name, &block, &bytes) != 4) {
            KV_CHECK(0, "sizes.txt: bad line '%s'", line);
            continue;
        }
        lines++;
        KV_CHECK(strcmp(kv_ggml_type_name(code), name) == 0, "type %d: named %s, the package says %s",
                 code, kv_ggml_type_name(code), name);
        /* Q8_1: the package still has the older 40-byte layout (two float32); ggml's C has
         * two fp16 (static_assert: 2 * sizeof(ggml_half) + 32 = 36), and so has kvlab */
        if (code == KV_GGML_Q8_1) bytes = 36;
        uint64_t got = 0;
        kv_err err = {{0}};
        const int st = kv_ggml_row_bytes(code, (int64_t)block * 3, &got, &err);
        KV_CHECK(st == KV_OK && got == (uint64_t)bytes * 3, "%s: row_bytes(3 blocks) = %llu, "
                 "expected %d (%s)", name, (unsigned long long)got, bytes * 3, err.msg);
    }
    KV_CHECK(lines >= 30, "sizes.txt: %d types", lines);
    free(text);
}

static void check_refusals(void)
{
    /* no dequantizer: refused by kv_ggml_type(), still named */
    const int refused[] = {KV_GGML_Q8_1, KV_GGML_Q8_K, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                           26, 27, 28, 29, 34, 35, 39, 40, 41, 42, 4, 5, 31, 43, -1, 1000};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        KV_CHECK(kv_ggml_type(refused[i]) == NULL, "type %d (%s) has a dequantizer", refused[i],
                 kv_ggml_type_name(refused[i]));
    KV_CHECK(strcmp(kv_ggml_type_name(16), "IQ2_XXS") == 0, "16: %s", kv_ggml_type_name(16));
    KV_CHECK(strcmp(kv_ggml_type_name(43), "unknown") == 0, "43: %s", kv_ggml_type_name(43));
    KV_CHECK(strcmp(kv_ggml_type_name(-1), "unknown") == 0, "-1: %s", kv_ggml_type_name(-1));
    KV_CHECK(strstr(kv_ggml_type_name(4), "removed") != NULL, "4: %s", kv_ggml_type_name(4));
    const int dequantized[] = {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30};
    for (size_t i = 0; i < sizeof dequantized / sizeof dequantized[0]; i++)
        KV_CHECK(kv_ggml_type(dequantized[i]) != NULL, "type %d refused", dequantized[i]);

    /* row sizes: not a multiple of the block, negative, no size, beyond 2^63 - 1 bytes */
    struct { int type; int64_t n; const char *says; } bad[] = {
        {KV_GGML_Q4_0, 33, "Q4_0"},      {KV_GGML_Q4_K, 128, "Q4_K"},
        {KV_GGML_F32, -1, "F32"},        {4, 32, "Q4_2"},
        {99, 1, "unknown"},              {-3, 1, "unknown"},
        {28, INT64_C(1) << 60, "F64"},   {KV_GGML_Q8_0, INT64_MAX / 32 * 32, "Q8_0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t bytes = 12345;
        kv_err err = {{0}};
        const int st = kv_ggml_row_bytes(bad[i].type, bad[i].n, &bytes, &err);
        KV_CHECK(st == KV_ERR_FORMAT && strstr(err.msg, bad[i].says) && bytes == 12345,
                 "row_bytes(%d, %lld): status %d, '%s'", bad[i].type, (long long)bad[i].n, st,
                 err.msg);
    }
    uint64_t bytes = 0;
    KV_CHECK(kv_ggml_row_bytes(28, (INT64_C(1) << 60) - 1, &bytes, NULL) == KV_OK &&
             bytes == ((UINT64_C(1) << 60) - 1) * 8, "F64: the largest row");
    KV_CHECK(kv_ggml_row_bytes(KV_GGML_Q4_K, 0, &bytes, NULL) == KV_OK && bytes == 0, "empty row");

    /* an unknown type writes nothing */
    float y[32];
    uint8_t zeros[64] = {0};
    for (int j = 0; j < 32; j++) y[j] = 7.0f;
    kv_ggml_dequant_row(16, zeros, y, 32);
    kv_ggml_dequant_row(KV_GGML_Q8_1, zeros, y, 32);
    int untouched = 1;
    for (int j = 0; j < 32; j++) untouched &= y[j] == 7.0f;
    KV_CHECK(untouched, "a refused type wrote its row");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s <tests/data/ggml_quant>\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    static const struct { const char *file; int type; } golden[] = {
        {"f32.bin", KV_GGML_F32},   {"f16.bin", KV_GGML_F16},   {"bf16.bin", KV_GGML_BF16},
        {"q4_0.bin", KV_GGML_Q4_0}, {"q4_1.bin", KV_GGML_Q4_1}, {"q5_0.bin", KV_GGML_Q5_0},
        {"q5_1.bin", KV_GGML_Q5_1}, {"q8_0.bin", KV_GGML_Q8_0}, {"q2_k.bin", KV_GGML_Q2_K},
        {"q3_k.bin", KV_GGML_Q3_K}, {"q4_k.bin", KV_GGML_Q4_K}, {"q5_k.bin", KV_GGML_Q5_K},
        {"q6_k.bin", KV_GGML_Q6_K},
    };
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++)
        check_golden(golden[i].file, golden[i].type);
    check_exhaustive();
    check_sizes();
    check_refusals();
    return kv_test_finish();
}
