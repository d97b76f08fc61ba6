/* Chapter 04 formats on the GPU against the CPU reference: quantization must match bit for
 * bit (docs/design.md §8), so codes and metadata are compared as bytes and decoded values as
 * fp32 bit patterns (any NaN equals any NaN: a NaN's payload is not part of the format).
 *
 *  - every format and role, head_dim 64 and 128, on random rows with outlier channels and
 *    injected specials (NaN, +-inf, +-0, subnormals, 65504 / 65520 / 70000, ties, all-zero,
 *    mixed +-0 and constant groups);
 *  - the float conversions on edge lists: every fp8 midpoint and its float neighbours, a
 *    sweep of binary16 midpoints, saturation, NaN; the device's native fp16 / bf16 / fp8
 *    types against the CPU's software conversions;
 *  - decoding: every fp16 / bf16 / fp8 bit pattern, random int8 and KIVI codes and metadata;
 *  - rows whose magnitudes span 1e-6 .. 1e4 through every integer format;
 *  - argument errors are the CPU's; KIVI keys too wide for shared memory are refused.
 * Exits 77 (skipped) without a usable device. */
#include "kv_quant.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"

#include <string.h>

static kv_rng rng;

static void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    kv_err e;
    int rc = kvcu_malloc(&d, bytes ? bytes : 1, &e);
    KV_CHECK(rc == KV_OK, "device alloc of %zu bytes: %s", bytes, e.msg);
    return rc ? NULL : d;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = dev_alloc(bytes);
    kv_err e;
    if (d && bytes) {
        int rc = kvcu_upload(d, host, bytes, &e);
        KV_CHECK(rc == KV_OK, "upload: %s", e.msg);
    }
    return d;
}

static void *host_from_dev(const void *dev, size_t bytes)
{
    void *h = calloc(1, bytes ? bytes : 1);
    kv_err e;
    if (bytes) {
        int rc = kvcu_download(h, dev, bytes, &e);
        KV_CHECK(rc == KV_OK, "download: %s", e.msg);
    }
    return h;
}

/* Bytes equal; prints the first differing offsets. */
static int same_bytes(const char *what, const uint8_t *got, const uint8_t *ref, size_t n)
{
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ref[i] && bad++ < 4)
            printf("  %s: byte %zu: gpu 0x%02x, cpu 0x%02x\n", what, i, got[i], ref[i]);
    if (bad) printf("  %s: %ld of %zu bytes differ\n", what, bad, n);
    return bad == 0;
}

/* Floats bit-identical, or both NaN. */
static int same_floats(const char *what, const float *got, const float *ref, size_t n)
{
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        const int both_nan = isnan(got[i]) && isnan(ref[i]);
        if (!both_nan && kvq_f32_bits(got[i]) != kvq_f32_bits(ref[i]) && bad++ < 4)
            printf("  %s: [%zu]: gpu %a, cpu %a\n", what, i, got[i], ref[i]);
    }
    if (bad) printf("  %s: %ld of %zu values differ\n", what, bad, n);
    return bad == 0;
}

/* Encode x [n][d] on both devices, compare codes and metadata; decode the codes on both and
 * compare the floats. */
static void compare(const char *label, int fmt, int role, const float *x, int64_t n, int d, float scale)
{
    char what[160];
    kv_err e;
    const size_t cb = kv_quant_code_bytes(fmt, n, d), mb = kv_quant_meta_bytes(fmt, role, n, d);
    const size_t xb = (size_t)(n * d) * sizeof(float);
    uint8_t *codes = malloc(cb), *meta = malloc(mb + 4);
    float *y = malloc(xb);
    snprintf(what, sizeof what, "%s %s %s d %d", label, kv_quant_name(fmt), role ? "K" : "V", d);
    int rc = kv_quant_encode(fmt, role, x, n, d, scale, codes, meta, &e);
    KV_CHECK(rc == KV_OK, "%s: cpu encode: %s", what, e.msg);
    rc = kv_quant_decode(fmt, role, codes, meta, n, d, scale, y, &e);
    KV_CHECK(rc == KV_OK, "%s: cpu decode: %s", what, e.msg);

    float *dx = dev_copy(x, xb), *dy = dev_alloc(xb);
    uint8_t *dcodes = dev_alloc(cb), *dmeta = dev_alloc(mb + 4);
    if (dx && dy && dcodes && dmeta) {
        rc = kvcu_quant_encode(fmt, role, dx, n, d, scale, dcodes, mb ? dmeta : NULL, &e);
        KV_CHECK(rc == KV_OK, "%s: gpu encode: %s", what, e.msg);
        uint8_t *gc = host_from_dev(dcodes, cb), *gm = host_from_dev(dmeta, mb);
        KV_CHECK(same_bytes(what, gc, codes, cb), "%s: codes differ from the CPU's", what);
        KV_CHECK(same_bytes(what, gm, meta, mb), "%s: metadata differs from the CPU's", what);
        rc = kvcu_quant_decode(fmt, role, dcodes, mb ? dmeta : NULL, n, d, scale, dy, &e);
        KV_CHECK(rc == KV_OK, "%s: gpu decode: %s", what, e.msg);
        float *gy = host_from_dev(dy, xb);
        KV_CHECK(same_floats(what, gy, y, (size_t)(n * d)), "%s: decoded values differ", what);
        free(gc), free(gm), free(gy);
    }
    kvcu_free(dx), kvcu_free(dy), kvcu_free(dcodes), kvcu_free(dmeta);
    free(codes), free(meta), free(y);
}

/* ---- every format on rows with specials ----------------------------------------------------- */

static const float specials[] = {
    0.0f, -0.0f, 1e-40f, -3e-42f, 0x1p-149f, 65504.0f, 65520.0f, -70000.0f, 0x1.1p0f, 0x1.3p0f,
    0x1.2p0f, 0x1.6p0f, 464.0f, 480.0f, 61440.0f, 1e30f, -1e-20f, 0x1p-10f, 0x1.8p-9f, 0x1p-17f,
};
#define N_SPECIALS ((int)(sizeof specials / sizeof specials[0]))

/* n rows of d: normal values with an outlier channel (x20), specials spread over some rows,
 * NaN / inf in two rows, an all-zero row, a constant row. */
static float *test_rows(int64_t n, int d)
{
    float *x = malloc((size_t)(n * d) * sizeof(float));
    for (int64_t i = 0; i < n * d; i++)
        x[i] = kv_rng_normal(&rng) * ((i % d) == 3 ? 20.0f : 1.0f);
    for (int k = 0; k < N_SPECIALS; k++) x[(int64_t)(k % 4) * d + (k * 7) % d] = specials[k];
    if (n > 6) {
        for (int j = 0; j < d; j++) x[4 * d + j] = 0.0f;  /* all zero */
        for (int j = 0; j < d; j++) x[5 * d + j] = 3.3f;  /* constant */
        x[6 * d + 9] = NAN, x[6 * d + d - 1] = -INFINITY; /* poisoned groups */
    }
    /* int8 ties: a row whose amax is 127, so x / s hits k + 0.5 exactly */
    if (n > 7)
        for (int j = 0; j < d; j++) x[7 * d + j] = j == 0 ? 127.0f : (float)(j % 40) - 19.5f;
    /* groups of +0 and -0 only: min and max may come out as either zero, the metadata must not */
    if (n > 8)
        for (int j = 0; j < d; j++) x[8 * d + j] = j % 3 ? -0.0f : 0.0f;
    for (int64_t t = 32; t < n; t++) x[t * d + 10] = t % 2 ? -0.0f : 0.0f; /* a key channel */
    return x;
}

static void test_all_formats(void)
{
    for (int d = 64; d <= 128; d += 64)
        for (int fmt = 0; fmt < KV_QF_COUNT; fmt++)
            for (int role = 0; role < 2; role++) {
                if (role == KV_QROLE_KEY && !kvq_is_kivi(fmt) && fmt != KV_QF_INT8) continue;
                if (d % (kvq_row_group(fmt, role, d) ? kvq_row_group(fmt, role, d) : 1)) continue;
                const int64_t n = role == KV_QROLE_KEY ? 64 : 13; /* keys: two 32-token blocks */
                float *x = test_rows(n, d);
                if (kvq_is_fp8(fmt)) {
                    float s;
                    kv_err e;
                    kv_quant_fp8_calibrate(fmt, x, 1, n, d, 1, &s, &e);
                    compare("calibrated", fmt, role, x, n, d, s);
                    compare("scale 1", fmt, role, x, n, d, 1.0f);
                } else {
                    compare("rows", fmt, role, x, n, d, 1.0f);
                }
                free(x);
            }
}

/* ---- float conversions on edge lists --------------------------------------------------------- */

static void test_conversion_edges(void)
{
    /* every fp8 midpoint (both formats), one float ulp either side, both signs */
    float *x = malloc(sizeof(float) * 4096);
    int n = 0;
    for (int e5 = 0; e5 < 2; e5++)
        for (uint32_t c = 0; c < (e5 ? 0x7cu : 0x7fu); c++) {
            const float lo = kvq_fp8_to_f32((uint8_t)c, e5), hi = kvq_fp8_to_f32((uint8_t)(c + 1), e5);
            const float mid = (float)(((double)lo + hi) / 2);
            x[n++] = mid, x[n++] = nextafterf(mid, 0), x[n++] = nextafterf(mid, INFINITY), x[n++] = -mid;
        }
    for (int k = 0; k < N_SPECIALS; k++) x[n++] = specials[k];
    x[n++] = NAN, x[n++] = -NAN, x[n++] = INFINITY, x[n++] = -INFINITY;
    while (n % 32) x[n++] = 1.0f;
    for (int fmt = 0; fmt < KV_QF_COUNT; fmt++)
        if (fmt <= KV_QF_BF16 || kvq_is_fp8(fmt)) compare("fp8 midpoints", fmt, 0, x, 1, n, 1.0f);

    /* binary16 and bfloat16 midpoints: every 61st finite code of each (subnormals to 2^121),
     * with neighbours */
    n = 0;
    for (uint32_t h = 0; h < 0x7c00u && n + 8 <= 4096; h += 61) {
        const float mh = (float)(((double)kvq_f16_to_f32((uint16_t)h) + kvq_f16_to_f32((uint16_t)(h + 1))) / 2);
        const float mb = (float)(((double)kvq_bf16_to_f32((uint16_t)h) + kvq_bf16_to_f32((uint16_t)(h + 1))) / 2);
        x[n++] = mh, x[n++] = nextafterf(mh, INFINITY), x[n++] = -mh, x[n++] = nextafterf(mh, 0);
        x[n++] = mb, x[n++] = nextafterf(mb, 0), x[n++] = -mb, x[n++] = nextafterf(mb, INFINITY);
    }
    compare("16-bit midpoints", KV_QF_F16, 0, x, 1, n, 1.0f);
    compare("16-bit midpoints", KV_QF_BF16, 0, x, 1, n, 1.0f);

    /* random floats over the whole fp32 range (random bits), NaNs included */
    for (int i = 0; i < 4096; i++) x[i] = kvq_bits_f32(kv_rng_u32(&rng));
    for (int fmt = 0; fmt < KV_QF_COUNT; fmt++)
        if (fmt <= KV_QF_BF16 || kvq_is_fp8(fmt)) compare("random bits", fmt, 0, x, 32, 128, 1.0f);
    /* fp8 with a scale that is not a power of two: the division rounds the same way */
    for (int i = 0; i < 4096; i++) x[i] = kv_rng_normal(&rng) * 50.0f;
    compare("scale 0.0731", KV_QF_FP8_E4M3, 0, x, 32, 128, 0.0731f);
    compare("scale 0.0731", KV_QF_FP8_E5M2, 0, x, 32, 128, 0.0731f);
    free(x);
}

/* Decode the same code and metadata bytes on both devices: every 16-bit and 8-bit pattern
 * (NaNs, infinities, subnormals), and random bytes as int8 / KIVI codes with random scales
 * and zero points (NaN and inf among them). */
static void compare_decode(const char *label, int fmt, int role, const uint8_t *codes,
                           const uint8_t *meta, int64_t n, int d, float scale)
{
    char what[160];
    kv_err e;
    const size_t cb = kv_quant_code_bytes(fmt, n, d), mb = kv_quant_meta_bytes(fmt, role, n, d);
    const size_t xb = (size_t)(n * d) * sizeof(float);
    snprintf(what, sizeof what, "%s %s %s", label, kv_quant_name(fmt), role ? "K" : "V");
    float *y = malloc(xb), *dy = dev_alloc(xb);
    uint8_t *dc = dev_copy(codes, cb), *dm = dev_copy(meta, mb);
    KV_CHECK(kv_quant_decode(fmt, role, codes, meta, n, d, scale, y, &e) == KV_OK, "%s: %s", what, e.msg);
    if (dy && dc && dm) {
        KV_CHECK(kvcu_quant_decode(fmt, role, dc, mb ? dm : NULL, n, d, scale, dy, &e) == KV_OK,
                 "%s: gpu decode: %s", what, e.msg);
        float *gy = host_from_dev(dy, xb);
        KV_CHECK(same_floats(what, gy, y, (size_t)(n * d)), "%s: decoded values differ", what);
        free(gy);
    }
    kvcu_free(dy), kvcu_free(dc), kvcu_free(dm), free(y);
}

static void test_decode_codes(void)
{
    const int d = 128, n = 512; /* 65536 elements: every 16-bit pattern once */
    uint8_t *codes = malloc((size_t)n * d * 4), *meta = malloc((size_t)n * d * 4);
    for (uint32_t i = 0; i < 65536; i++) codes[2 * i] = (uint8_t)i, codes[2 * i + 1] = (uint8_t)(i >> 8);
    compare_decode("every pattern", KV_QF_F16, 0, codes, meta, n, d, 1.0f);
    compare_decode("every pattern", KV_QF_BF16, 0, codes, meta, n, d, 1.0f);
    for (uint32_t i = 0; i < 256 * 8; i++) codes[i] = (uint8_t)i;
    compare_decode("every pattern", KV_QF_FP8_E4M3, 0, codes, meta, 16, d, 1.0f);
    compare_decode("every pattern", KV_QF_FP8_E5M2, 0, codes, meta, 16, d, 0.37f);
    /* random codes; metadata: random scales / fp16 pairs, plus NaN and inf entries */
    for (size_t i = 0; i < (size_t)n * d * 4; i++) codes[i] = (uint8_t)kv_rng_u32(&rng);
    float *ms = (float *)meta;
    for (int i = 0; i < n * d; i++) ms[i] = kv_rng_normal(&rng) * 0.01f;
    ms[3] = NAN, ms[5] = INFINITY, ms[7] = 0.0f;
    for (int fmt = KV_QF_INT8; fmt <= KV_QF_INT8_G128; fmt++)
        compare_decode("random codes", fmt, 0, codes, meta, 64, d, 1.0f);
    compare_decode("random codes", KV_QF_INT4_G32, 0, codes, meta, 64, d, 1.0f);
    kv_qsz *mq = (kv_qsz *)meta;
    for (int i = 0; i < n * d; i++)
        mq[i].scale = (uint16_t)(kv_rng_u32(&rng) & 0x3fffu), /* positive, finite, small */
        mq[i].zero = (uint16_t)kv_rng_u32(&rng);                /* any pattern, NaN and inf too */
    for (int fmt = KV_QF_INT4_KIVI; fmt <= KV_QF_INT2_KIVI; fmt++)
        for (int role = 0; role < 2; role++)
            compare_decode("random codes", fmt, role, codes, meta, 64, d, 1.0f);
    free(codes), free(meta);
}

/* Many rows of very different magnitudes (1e-6 ... 1e4 per row): scales from subnormal-ish
 * to large, through every integer format. */
static void test_magnitudes(void)
{
    const int d = 128, n = 256;
    float *x = malloc(sizeof(float) * n * d);
    for (int t = 0; t < n; t++) {
        const float mag = powf(10.0f, kv_rng_uniform(&rng, -6.0f, 4.0f));
        for (int j = 0; j < d; j++) x[t * d + j] = kv_rng_normal(&rng) * mag + (t % 5 == 0 ? 3 * mag : 0);
    }
    for (int fmt = KV_QF_INT8; fmt < KV_QF_COUNT; fmt++)
        for (int role = 0; role < 2; role++) {
            if (role == KV_QROLE_KEY && !kvq_is_kivi(fmt)) continue;
            compare("magnitudes", fmt, role, x, n, d, kvq_is_fp8(fmt) ? 0.01f : 1.0f);
        }
    free(x);
}

/* ---- arguments ----------------------------------------------------------------------------- */

static void test_errors(void)
{
    kv_err e;
    float *dx = dev_alloc(4096 * sizeof(float));
    uint8_t *dc = dev_alloc(4096 * 4), *dm = dev_alloc(4096 * 4);
    KV_CHECK(kvcu_quant_encode(KV_QF_INT8_G128, 0, dx, 1, 64, 0, dc, dm, &e) == KV_ERR_ARG,
             "g128 with d 64 refused");
    KV_CHECK(kvcu_quant_encode(KV_QF_INT4_KIVI, 1, dx, 33, 64, 0, dc, dm, &e) == KV_ERR_ARG,
             "keys: 33 rows refused");
    KV_CHECK(kvcu_quant_encode(KV_QF_FP8_E4M3, 0, dx, 1, 64, 0, dc, NULL, &e) == KV_ERR_ARG,
             "fp8 scale 0 refused");
    KV_CHECK(kvcu_quant_encode(KV_QF_INT8, 0, dx, 1, 64, 0, dc, NULL, &e) == KV_ERR_ARG,
             "int8 without meta refused");
    KV_CHECK(kvcu_quant_decode(KV_QF_COUNT, 0, dc, dm, 1, 64, 1, dx, &e) == KV_ERR_ARG,
             "unknown format refused");
    int rc = kvcu_quant_encode(KV_QF_INT2_KIVI, 1, dx, 32, 320, 0, dc, dm, &e);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "shared memory"),
             "keys with d = 320 refused by name: %d %s", rc, e.msg);
    KV_CHECK(kvcu_quant_encode(KV_QF_INT8, 0, NULL, 0, 64, 0, NULL, NULL, &e) == KV_OK, "n = 0");
    KV_CHECK(kvcu_synchronize(&e) == KV_OK, "no kernel failed: %s", e.msg);
    kvcu_free(dx), kvcu_free(dc), kvcu_free(dm);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_rng_seed(&rng, 44);
    test_all_formats();
    test_conversion_edges();
    test_decode_codes();
    test_magnitudes();
    test_errors();
    return kv_test_finish();
}
