/* fp32 rows into Q8_0 and binary16 (reference_cpu/model/kv_gguf_requant.h), what
 * `--weights q8_0` and `--weights f16` keep, held byte for byte to the gguf Python package's
 * quantize (tests/data/ggml_quant/requant_*.bin, written by tools/gguf/make_requant_golden.py:
 * ties, scales beyond binary16's range both ways, infinities). Then the round trip: a Q8_0 row
 * dequantized is within half a step of its input, |x - d q| <= d / 2 (1 + 2^-10) with d the
 * stored step (the binary16 step differs from max|x| / 127 by at most 2^-11 of it, which
 * moves a code's value by at most 127 * 2^-11 d), and binary16 is within half a unit in
 * the last place.
 *
 * Usage: test_gguf_requant <tests/data/ggml_quant>
 */
#include "common/kv_test.h"
#include "common/kv_test_gguf.h"
#include "kv_gguf_quant.h"
#include "kv_gguf_requant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* requant_NAME.bin: "KVGR", version, type, n, n floats, the package's bytes of them */
static void check_file(const char *dir, const char *name, int type)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/requant_%s.bin", dir, name);
    size_t size = 0;
    unsigned char *buf = kv_test_slurp(path, &size);
    KV_CHECK(buf != NULL && size >= 16 && memcmp(buf, "KVGR", 4) == 0, "%s: not a KVGR file",
             path);
    if (!buf || size < 16) return free(buf);
    uint32_t hdr[3];
    memcpy(hdr, buf + 4, sizeof hdr);
    const int64_t n = hdr[2];
    uint64_t rb = 0;
    KV_CHECK(hdr[0] == 1 && (int)hdr[1] == type && n % 32 == 0, "%s: version %u type %u n %lld",
             path, hdr[0], hdr[1], (long long)n);
    const int ok = kv_ggml_row_bytes(type, n, &rb, NULL) == KV_OK && size == 16 + 4 * n + rb;
    KV_CHECK(ok, "%s: %zu bytes for %lld inputs", path, size, (long long)n);
    if (!ok) return free(buf);
    float *x = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
    unsigned char *got = malloc(rb);
    memcpy(x, buf + 16, sizeof(float) * (size_t)n);
    const unsigned char *want = buf + 16 + 4 * n;

    kv_ggml_quantize_row(type, x, got, n);
    uint64_t first = rb;
    for (uint64_t i = 0; i < rb && first == rb; i++)
        if (got[i] != want[i]) first = i;
    KV_CHECK(first == rb, "%s: byte %llu is 0x%02x, the gguf package wrote 0x%02x", name,
             (unsigned long long)first, first < rb ? got[first] : 0, first < rb ? want[first] : 0);

    /* the round trip, on the finite blocks whose step is a finite, normal binary16 */
    kv_ggml_dequant_row(type, got, back, n);
    long checked = 0, bad = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        for (int j = 0; j < 32; j++) {
            const float v = x[32 * b + j], r = back[32 * b + j];
            double lim;
            if (type == KV_GGML_Q8_0) {
                const float d = kv_ggml_fp16_at(got + 34 * b);
                if (!(d >= 0x1p-14f && d <= 65504.0f)) continue;
                lim = d / 2.0 * (1 + 0x1p-10) + 127.0 * d * 0x1p-11;
            } else {
                if (!(fabsf(v) >= 0x1p-14f && fabsf(v) <= 65504.0f)) continue;
                int e;
                frexpf(v, &e);
                lim = ldexp(1.0, e - 1 - 11); /* half a unit of 11 significant bits */
            }
            checked++;
            bad += fabs((double)v - r) > lim;
        }
    }
    KV_CHECK(bad == 0, "%s: %ld of %ld values beyond half a step after the round trip", name,
             bad, checked);
    printf("%s: %lld inputs, %llu bytes as the gguf package's; %ld values round-tripped\n", name,
           (long long)n, (unsigned long long)rb, checked);
    free(x), free(back), free(got), free(buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <tests/data/ggml_quant>\n", argv[0]);
        return 2;
    }
    check_file(argv[1], "q8_0", KV_GGML_Q8_0);
    check_file(argv[1], "f16", KV_GGML_F16);
    /* binary16 of a few values by hand: the largest finite, the overflow, ties to even */
    KV_CHECK(kv_ggml_fp32_to_fp16(65504.0f) == 0x7bff, "65504");
    KV_CHECK(kv_ggml_fp32_to_fp16(65520.0f) == 0x7c00, "65520 -> inf");
    KV_CHECK(kv_ggml_fp32_to_fp16(1.0f + 0x1p-11f) == 0x3c00, "1 + 2^-11 ties to 1");
    KV_CHECK(kv_ggml_fp32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02, "1 + 3 2^-11 ties up");
    KV_CHECK(kv_ggml_fp32_to_fp16(0x1p-25f) == 0x0000, "2^-25 ties to 0");
    KV_CHECK(kv_ggml_fp32_to_fp16(-0x1p-24f) == 0x8001, "-2^-24");
    KV_CHECK(kv_ggml_fp32_to_fp16(0x1p-14f - 0x1p-25f) == 0x0400, "rounds up to the smallest normal");
    return kv_test_finish();
}
