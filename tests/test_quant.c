/* KV-cache quantization formats, CPU reference (chapter 04):
 *
 *  - conversions: fp16 / bf16 / fp8 on an edge-case table (ties to even, overflow, saturation,
 *    subnormals, NaN); every fp16 and fp8 code decodes and re-encodes to itself; fp8 encoding
 *    equals a brute-force nearest-even search over all 256 codes on random values and on every
 *    midpoint between neighbouring codes;
 *  - round trips within each format's bound: |x - deq| <= step/2 for int8 and KIVI (plus the
 *    stated fp32 rounding), a relative bound for the float formats;
 *  - all-zero and constant groups decode without NaN; NaN / inf poison only their own group;
 *  - the layouts: code packing order, metadata indexing, bytes per element, and encoding a
 *    run of rows in the middle of a plane (phase 2's window spill) through offset pointers;
 *  - why keys go per channel: an outlier channel costs the other channels nothing there;
 *  - argument errors, and the same bytes with 1 and 2 threads. */
#include "kv_quant.h"
#include "kv_rng.h"
#include "common/kv_golden_cvt.h"
#include "common/kv_test.h"

#include <float.h>
#include <omp.h>
#include <string.h>

static kv_rng rng;

/* n values: normal(0, 1) times `mag`, with one channel in 16 ten times larger (outliers). */
static float *random_rows(int64_t n, int d, float mag)
{
    float *x = malloc((size_t)(n * d) * sizeof(float));
    for (int64_t i = 0; i < n * d; i++)
        x[i] = kv_rng_normal(&rng) * mag * ((i % d) % 16 == 5 ? 10.0f : 1.0f);
    return x;
}

/* Encode + decode through the public API; buffers freed by the caller. */
typedef struct {
    uint8_t *codes;
    void *meta;
    float *y; /* [n][d] decoded */
} roundtrip;

static roundtrip encode_decode(int fmt, int role, const float *x, int64_t n, int d, float scale)
{
    roundtrip r;
    kv_err e;
    r.codes = malloc(kv_quant_code_bytes(fmt, n, d) + 1);
    r.meta = malloc(kv_quant_meta_bytes(fmt, role, n, d) + 4);
    r.y = malloc((size_t)(n * d) * sizeof(float) + 1);
    int rc = kv_quant_encode(fmt, role, x, n, d, scale, r.codes, r.meta, &e);
    KV_CHECK(rc == KV_OK, "encode %s: %s", kv_quant_name(fmt), e.msg);
    rc = kv_quant_decode(fmt, role, r.codes, r.meta, n, d, scale, r.y, &e);
    KV_CHECK(rc == KV_OK, "decode %s: %s", kv_quant_name(fmt), e.msg);
    return r;
}
static void rt_free(roundtrip *r) { free(r->codes), free(r->meta), free(r->y); }

/* ---- names and sizes ------------------------------------------------------------------------ */

static void test_sizes(void)
{
    for (int f = 0; f < KV_QF_COUNT; f++)
        KV_CHECK(kv_quant_parse(kv_quant_name(f)) == f, "name round trip of %d", f);
    KV_CHECK(kv_quant_parse("int3") == -1 && kv_quant_parse(NULL) == -1, "unknown name");
    KV_CHECK(kv_quant_parse("fp8") == KV_QF_FP8_E4M3 && kv_quant_parse("int4") == KV_QF_INT4_KIVI &&
             kv_quant_parse("int2") == KV_QF_INT2_KIVI, "aliases");
    /* bytes per element, metadata included (kv_quant.h table) */
    const struct { int fmt, d; double b; } bpe[] = {
        {KV_QF_F32, 128, 4.0},       {KV_QF_F16, 128, 2.0},          {KV_QF_BF16, 64, 2.0},
        {KV_QF_INT8, 128, 1.03125},  {KV_QF_INT8, 64, 1.0625},       {KV_QF_INT8_G32, 128, 1.125},
        {KV_QF_INT8_G64, 128, 1.0625}, {KV_QF_INT8_G128, 128, 1.03125}, {KV_QF_FP8_E4M3, 128, 1.0},
        {KV_QF_FP8_E5M2, 64, 1.0},   {KV_QF_INT4_KIVI, 128, 0.625},  {KV_QF_INT2_KIVI, 64, 0.375},
    };
    for (size_t i = 0; i < sizeof bpe / sizeof bpe[0]; i++)
        KV_CHECK(kv_quant_bytes_per_element(bpe[i].fmt, bpe[i].d) == bpe[i].b,
                 "%s d %d: %g bytes/element, expected %g", kv_quant_name(bpe[i].fmt), bpe[i].d,
                 kv_quant_bytes_per_element(bpe[i].fmt, bpe[i].d), bpe[i].b);
    /* the planes: 64 tokens of d = 128 */
    KV_CHECK(kv_quant_code_bytes(KV_QF_INT4_KIVI, 64, 128) == 64 * 64, "int4 codes");
    KV_CHECK(kv_quant_code_bytes(KV_QF_INT2_KIVI, 64, 128) == 64 * 32, "int2 codes");
    KV_CHECK(kv_quant_code_bytes(KV_QF_F16, 64, 128) == 64 * 256, "fp16 codes");
    KV_CHECK(kv_quant_meta_bytes(KV_QF_INT4_KIVI, KV_QROLE_KEY, 64, 128) == 2 * 128 * 4, "int4 K meta");
    KV_CHECK(kv_quant_meta_bytes(KV_QF_INT4_KIVI, KV_QROLE_VALUE, 64, 128) == 64 * 4 * 4, "int4 V meta");
    KV_CHECK(kv_quant_meta_bytes(KV_QF_INT8, KV_QROLE_KEY, 64, 128) == 64 * 4, "int8 meta");
    KV_CHECK(kv_quant_meta_bytes(KV_QF_INT8_G32, KV_QROLE_VALUE, 64, 128) == 64 * 4 * 4, "g32 meta");
    KV_CHECK(kv_quant_meta_bytes(KV_QF_FP8_E4M3, KV_QROLE_VALUE, 64, 128) == 0, "fp8 meta");
    /* steady state: codes + meta of N tokens = N * d * b exactly */
    for (int f = 0; f < KV_QF_COUNT; f++)
        for (int role = 0; role < 2; role++) {
            const double total = (double)kv_quant_code_bytes(f, 4096, 128) +
                                 (double)kv_quant_meta_bytes(f, role, 4096, 128);
            KV_CHECK(total == 4096.0 * 128 * kv_quant_bytes_per_element(f, 128),
                     "%s role %d: planes %g bytes vs N*d*b", kv_quant_name(f), role, total);
        }
    KV_CHECK(kv_quant_fixed_bytes(KV_QF_INT4_KIVI, 128, KV_KIVI_WINDOW) == 128 * 128 * 4, "window");
    KV_CHECK(kv_quant_fixed_bytes(KV_QF_FP8_E5M2, 128, 0) == 4, "fp8 scale");
    KV_CHECK(kv_quant_fixed_bytes(KV_QF_INT8, 128, 0) == 0, "int8 fixed");
}

/* ---- conversions ------------------------------------------------------------------------------ */

/* Expected bits per input: common/kv_golden_cvt.h, the table emu_numerics.cu holds the device
 * conversions to. */
static void test_conversion_table(void)
{
    for (size_t i = 0; i < (size_t)KV_GOLDEN_CVT_N; i++) {
        const float x = kv_golden_cvt[i].in;
        KV_CHECK(kvq_f32_to_f16(x) == kv_golden_cvt[i].half, "%s: half 0x%04x, expected 0x%04x",
                 kv_golden_cvt[i].what, kvq_f32_to_f16(x), kv_golden_cvt[i].half);
        KV_CHECK(kvq_f32_to_bf16(x) == kv_golden_cvt[i].bf16, "%s: bf16 0x%04x, expected 0x%04x",
                 kv_golden_cvt[i].what, kvq_f32_to_bf16(x), kv_golden_cvt[i].bf16);
        KV_CHECK(kvq_f32_to_fp8(x, 0) == kv_golden_cvt[i].e4m3, "%s: e4m3 0x%02x, expected 0x%02x",
                 kv_golden_cvt[i].what, kvq_f32_to_fp8(x, 0), kv_golden_cvt[i].e4m3);
        KV_CHECK(kvq_f32_to_fp8(x, 1) == kv_golden_cvt[i].e5m2, "%s: e5m2 0x%02x, expected 0x%02x",
                 kv_golden_cvt[i].what, kvq_f32_to_fp8(x, 1), kv_golden_cvt[i].e5m2);
    }
    /* NaN of either sign: the canonical patterns */
    const float nans[] = {kvq_bits_f32(0x7fc00000u), kvq_bits_f32(0xffc00000u),
                          kvq_bits_f32(0x7f800001u)};
    for (int i = 0; i < 3; i++) {
        KV_CHECK(kvq_f32_to_f16(nans[i]) == 0x7fff, "NaN %d -> half 0x7fff", i);
        KV_CHECK(kvq_f32_to_bf16(nans[i]) == 0x7fff, "NaN %d -> bf16 0x7fff", i);
        KV_CHECK(kvq_f32_to_fp8(nans[i], 0) == 0x7f && kvq_f32_to_fp8(nans[i], 1) == 0x7f,
                 "NaN %d -> fp8 0x7f", i);
    }
    KV_CHECK(kvq_f32_bits(kvq_fp8_to_f32(0x7f, 0)) == KVQ_F32_NAN, "e4m3 NaN decodes to 0x7fffffff");
    KV_CHECK(kvq_f32_bits(kvq_f16_to_f32(0xfe01)) == KVQ_F32_NAN, "half NaN decodes canonical");
    KV_CHECK(kvq_fp8_to_f32(0x7c, 1) == INFINITY && kvq_fp8_to_f32(0xfc, 1) == -INFINITY, "e5m2 inf");
    KV_CHECK(kvq_fp8_to_f32(0x7e, 0) == 448.0f && kvq_fp8_to_f32(0x7b, 1) == 57344.0f, "fp8 max");
    /* directed fp16 roundings used by the KIVI metadata */
    KV_CHECK(kvq_f32_to_f16_down(3.3f) == 0x4299 && kvq_f32_to_f16_up(3.3f) == 0x429a, "3.3 down/up");
    KV_CHECK(kvq_f32_to_f16_down(-3.3f) == 0xc29a && kvq_f32_to_f16_up(-3.3f) == 0xc299, "-3.3 down/up");
    KV_CHECK(kvq_f32_to_f16_down(1e-9f) == 0x0000 && kvq_f32_to_f16_up(1e-9f) == 0x0001, "tiny +");
    KV_CHECK(kvq_f32_to_f16_down(-1e-9f) == 0x8001 && kvq_f32_to_f16_up(-1e-9f) == 0x8000, "tiny -");
    KV_CHECK(kvq_f32_to_f16_down(2.0f) == 0x4000 && kvq_f32_to_f16_up(2.0f) == 0x4000, "exact");
}

/* Every code decodes and re-encodes to itself (NaN to the canonical NaN, e5m2 inf saturates);
 * positive finite codes are strictly increasing. */
static void test_exhaustive_codes(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const float v = kvq_f16_to_f32((uint16_t)h);
        const int nan = (h & 0x7fffu) > 0x7c00u;
        if (kvq_f32_to_f16(v) != (nan ? 0x7fffu : h)) bad++;
        if (kvq_f32_to_bf16(kvq_bf16_to_f32((uint16_t)h)) != (((h & 0x7fffu) > 0x7f80u) ? 0x7fffu : h))
            bad++;
        if (h > 0 && h < 0x7c00u && !(kvq_f16_to_f32((uint16_t)(h - 1)) < v)) bad++;
    }
    KV_CHECK(bad == 0, "fp16 / bf16: %d codes fail decode -> encode or order", bad);
    for (int e5 = 0; e5 < 2; e5++) {
        bad = 0;
        for (uint32_t b = 0; b < 256; b++) {
            const float v = kvq_fp8_to_f32((uint8_t)b, e5);
            uint32_t want = b;
            if (v != v) want = 0x7f;
            else if (e5 && (b & 0x7fu) == 0x7cu) want = b - 1; /* inf saturates to max */
            if (kvq_f32_to_fp8(v, e5) != want) bad++;
            if (b > 0 && b <= (e5 ? 0x7bu : 0x7eu) && !(kvq_fp8_to_f32((uint8_t)(b - 1), e5) < v)) bad++;
        }
        KV_CHECK(bad == 0, "%s: %d codes fail decode -> encode or order", e5 ? "e5m2" : "e4m3", bad);
    }
}

/* Brute force: the finite fp8 code nearest to x (ties to the even code), same sign as x. */
static uint8_t fp8_oracle(float x, int e5)
{
    const uint32_t sign = (kvq_f32_bits(x) >> 24) & 0x80u, maxcode = e5 ? 0x7bu : 0x7eu;
    const double a = fabs((double)x);
    uint32_t best = 0;
    double bd = INFINITY;
    for (uint32_t c = 0; c <= maxcode; c++) {
        const double dist = fabs((double)kvq_fp8_to_f32((uint8_t)c, e5) - a);
        if (dist < bd || (dist == bd && !(c & 1u))) best = c, bd = dist;
    }
    return (uint8_t)(sign | best);
}

static void test_fp8_oracle(void)
{
    for (int e5 = 0; e5 < 2; e5++) {
        int bad = 0, n = 0;
        const uint32_t maxcode = e5 ? 0x7bu : 0x7eu;
        /* every midpoint between neighbours, exactly and one float ulp either side */
        for (uint32_t c = 0; c < maxcode; c++) {
            const float lo = kvq_fp8_to_f32((uint8_t)c, e5), hi = kvq_fp8_to_f32((uint8_t)(c + 1), e5);
            const float mid = (float)(((double)lo + hi) / 2);
            const float xs[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid};
            for (int k = 0; k < 4; k++, n++)
                if (kvq_f32_to_fp8(xs[k], e5) != fp8_oracle(xs[k], e5)) {
                    if (bad++ < 3) printf("  %s(%a) = 0x%02x, nearest-even 0x%02x\n", e5 ? "e5m2" : "e4m3",
                                          xs[k], kvq_f32_to_fp8(xs[k], e5), fp8_oracle(xs[k], e5));
                }
        }
        /* random magnitudes from far below the subnormals to beyond saturation */
        for (int i = 0; i < 20000; i++, n++) {
            const float x = ldexpf(kv_rng_uniform(&rng, -1, 1), (int)(kv_rng_u32(&rng) % 44) - 26);
            if (kvq_f32_to_fp8(x, e5) != fp8_oracle(x, e5)) bad++;
        }
        KV_CHECK(bad == 0, "%s: %d of %d conversions differ from the nearest-even search",
                 e5 ? "e5m2" : "e4m3", bad, n);
    }
}

/* ---- int8 ------------------------------------------------------------------------------------ */

/* |x - y| <= s/2 + 2^-22 * amax per group: half a step, plus the fp32 rounding of x / s and of
 * q * s (one ulp of amax each, with a factor 2 to spare). Returns the failures. */
static int check_int8(int fmt, const float *x, const float *y, const float *meta, int64_t n, int d)
{
    const int g = kvq_row_group(fmt, KV_QROLE_VALUE, d);
    int bad = 0;
    for (int64_t t = 0; t < n; t++)
        for (int j0 = 0; j0 < d; j0 += g) {
            const float *xg = x + t * d + j0, *yg = y + t * d + j0;
            float amax = 0;
            for (int j = 0; j < g; j++) amax = fmaxf(amax, fabsf(xg[j]));
            const float s = meta[t * (d / g) + j0 / g];
            if (s != amax / 127.0f) bad++;
            for (int j = 0; j < g; j++)
                if (!(fabsf(xg[j] - yg[j]) <= 0.5f * s + 0x1p-22f * amax)) {
                    if (bad++ < 3) printf("  %s row %lld ch %d: x %g, deq %g, s %g\n", kv_quant_name(fmt),
                                          (long long)t, j0 + j, xg[j], yg[j], s);
                }
        }
    return bad;
}

static void test_int8(void)
{
    const int fmts[] = {KV_QF_INT8, KV_QF_INT8_G32, KV_QF_INT8_G64, KV_QF_INT8_G128};
    for (int fi = 0; fi < 4; fi++)
        for (int d = 64; d <= 256; d *= 2) {
            const int fmt = fmts[fi];
            if (d % kvq_row_group(fmt, 0, d)) continue;
            const int64_t n = 37;
            float *x = random_rows(n, d, 0.5f);
            /* a row of ties: x / s lands on k + 0.5 for s = 1 (amax 127) */
            for (int j = 0; j < d; j++) x[3 * d + j] = j == 0 ? 127.0f : (float)(j % 64) - 31.5f;
            roundtrip r = encode_decode(fmt, KV_QROLE_VALUE, x, n, d, 0);
            KV_CHECK(check_int8(fmt, x, r.y, r.meta, n, d) == 0, "%s d %d: round trip beyond s/2",
                     kv_quant_name(fmt), d);
            /* the largest magnitude of each group is exactly +-127; codes never -128 */
            int extreme = 0, g = kvq_row_group(fmt, 0, d);
            for (int64_t i = 0; i < n * d; i += g) {
                int m = 0;
                for (int j = 0; j < g; j++) m = abs((int8_t)r.codes[i + j]) > m ? abs((int8_t)r.codes[i + j]) : m;
                extreme += m == 127;
            }
            KV_CHECK(extreme == n * d / g, "%s d %d: %d of %lld groups reach 127", kv_quant_name(fmt),
                     d, extreme, (long long)(n * d / g));
            /* ties round to even: 30.5 -> 30 and -30.5 -> -30, 31.5 -> 32 (capped row has s = 1) */
            const int8_t *row3 = (const int8_t *)r.codes + 3 * d;
            if (fmt == KV_QF_INT8 || fmt == KV_QF_INT8_G64 || fmt == KV_QF_INT8_G128)
                KV_CHECK(row3[62] == 30 && row3[1] == -30 && row3[63] == 32,
                         "%s: ties 30.5 -> %d, -30.5 -> %d, 31.5 -> %d", kv_quant_name(fmt),
                         row3[62], row3[1], row3[63]);
            free(x), rt_free(&r);
        }
}

/* all-zero, constant, non-finite: the documented special cases */
static void test_int8_special(void)
{
    const int d = 128;
    float x[4 * 128];
    for (int j = 0; j < d; j++) {
        x[j] = 0.0f;                                 /* row 0: all zero */
        x[d + j] = -2.5f;                            /* row 1: constant */
        x[2 * d + j] = j == 7 ? NAN : 1.0f;          /* row 2: one NaN */
        x[3 * d + j] = j == 100 ? -INFINITY : 0.25f; /* row 3: one -inf (group 3 of g32) */
    }
    for (int fmt = KV_QF_INT8; fmt <= KV_QF_INT8_G128; fmt++) {
        roundtrip r = encode_decode(fmt, KV_QROLE_VALUE, x, 4, d, 0);
        const float *s = r.meta;
        const int g = kvq_row_group(fmt, 0, d), ng = d / g;
        KV_CHECK(s[0] == 0.0f, "%s: all-zero row scale %g, expected 0", kv_quant_name(fmt), s[0]);
        int nan_ok = 1, zero_ok = 1, const_ok = 1;
        for (int j = 0; j < d; j++) {
            zero_ok &= r.y[j] == 0.0f && r.codes[j] == 0;
            const_ok &= fabsf(r.y[d + j] + 2.5f) <= 0x1p-20f && (int8_t)r.codes[d + j] == -127;
            /* NaN exactly in the poisoned group, every other group as usual */
            nan_ok &= isnan(r.y[2 * d + j]) == (j / g == 7 / g);
            nan_ok &= isnan(r.y[3 * d + j]) == (j / g == 100 / g);
            if (j / g != 7 / g) nan_ok &= fabsf(r.y[2 * d + j] - 1.0f) <= 0x1p-20f;
        }
        KV_CHECK(zero_ok, "%s: all-zero row decodes to exact zeros", kv_quant_name(fmt));
        KV_CHECK(const_ok, "%s: constant row -2.5 -> codes -127, decodes to -2.5", kv_quant_name(fmt));
        KV_CHECK(nan_ok, "%s: NaN / inf poison their own group only", kv_quant_name(fmt));
        KV_CHECK(isnan(s[2 * ng + 7 / g]) && isnan(s[3 * ng + 100 / g]), "%s: poisoned scale is NaN",
                 kv_quant_name(fmt));
        KV_CHECK(r.codes[2 * d + 7] == 0 && r.codes[3 * d + 100] == 0, "%s: poisoned codes are 0",
                 kv_quant_name(fmt));
        rt_free(&r);
    }
}

/* int4-g32 from its definition (kv_quant.h): per 32 channels s = amax / 7 in fp32, code
 * rint(x / s) in [-7, 7] as a two's-complement nibble, element j in nibble j % 2 of byte j / 2;
 * keys grouped as values; the special groups as int8's. */
static void test_int4_g32(void)
{
    const int d = 128, fmt = KV_QF_INT4_G32;
    const int64_t n = 9;
    KV_CHECK(kv_quant_bytes_per_element(fmt, d) == 0.625 && kv_quant_code_bytes(fmt, n, d) == 9 * 64 &&
                 kv_quant_meta_bytes(fmt, KV_QROLE_KEY, n, d) == 9 * 4 * 4,
             "int4-g32: half a byte a code and a float per 32 channels, keys as values");
    float *x = random_rows(n, d, 0.5f);
    for (int j = 0; j < 32; j++) x[j] = 0.0f;                  /* row 0, group 0: zeros */
    x[d + 40] = NAN;                                           /* row 1, group 1: poisoned */
    for (int j = 0; j < 32; j++) x[2 * d + j] = (float)(j % 15) - 7.0f; /* s = 1 exactly */
    roundtrip r = encode_decode(fmt, KV_QROLE_VALUE, x, n, d, 0);
    roundtrip k = encode_decode(fmt, KV_QROLE_KEY, x, n, d, 0);
    KV_CHECK(!memcmp(r.codes, k.codes, (size_t)kv_quant_code_bytes(fmt, n, d)) &&
                 !memcmp(r.meta, k.meta, (size_t)kv_quant_meta_bytes(fmt, 0, n, d)),
             "int4-g32: keys are grouped per token, byte for byte as values");
    const float *s = r.meta;
    int scale_ok = 1, code_ok = 1, bound_ok = 1, extreme = 0;
    for (int64_t t = 0; t < n; t++)
        for (int gi = 0; gi < d / 32; gi++) {
            const float *xg = x + t * d + gi * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xg[j]));
            const float sg = s[t * (d / 32) + gi];
            if (t == 1 && gi == 1) continue; /* the poisoned group: below */
            scale_ok &= sg == amax / 7.0f;
            int m = 0;
            for (int j = 0; j < 32; j++) {
                const int c = gi * 32 + j, byte = r.codes[t * (d / 2) + c / 2];
                const int nib = (c % 2 ? byte >> 4 : byte) & 0xf, q = nib >= 8 ? nib - 16 : nib;
                const float want = sg > 0.0f ? fminf(fmaxf(rintf(xg[j] / sg), -7.0f), 7.0f) : 0.0f;
                code_ok &= q == (int)want && q != -8;
                bound_ok &= fabsf(r.y[t * d + c] - xg[j]) <= sg * 0.5f * (1.0f + 0x1p-20f) &&
                            r.y[t * d + c] == (float)q * sg;
                m = abs(q) > m ? abs(q) : m;
            }
            extreme += m == 7;
        }
    KV_CHECK(scale_ok, "int4-g32: every group's scale is fl(amax / 7)");
    KV_CHECK(code_ok, "int4-g32: codes rint(x / s) in [-7, 7], two's-complement nibbles, low first");
    KV_CHECK(bound_ok, "int4-g32: decode = q * s, within s / 2 of x");
    KV_CHECK(extreme == n * d / 32 - 2, "int4-g32: the largest magnitude of each group codes +-7 "
             "(%d of %lld groups)", extreme, (long long)(n * d / 32 - 2));
    KV_CHECK(s[0] == 0.0f && r.codes[0] == 0 && r.y[0] == 0.0f, "int4-g32: a zero group: s 0, codes 0");
    int nan_ok = isnan(s[4 + 1]);
    for (int j = 0; j < d; j++) nan_ok &= isnan(r.y[d + j]) == (j / 32 == 1);
    KV_CHECK(nan_ok, "int4-g32: a NaN poisons its own group of 32 only");
    KV_CHECK(s[8] == 1.0f && r.codes[2 * 64] == (uint8_t)((-7 & 0xf) | ((-6 & 0xf) << 4)),
             "int4-g32: -7 and -6 packed into the row's first byte as 0x%02x", r.codes[2 * 64]);
    free(x), rt_free(&r), rt_free(&k);
}

/* ---- fp16 / bf16 / fp8 round trips -------------------------------------------------------- */

static void test_float_formats(void)
{
    const int d = 128, n = 40;
    float *x = random_rows(n, d, 3.0f);
    x[5] = 1e-6f, x[6] = -3e-8f, x[7] = 0.0f, x[8] = -0.0f; /* subnormal territory */
    /* fp16: relative 2^-11 in the normal range, 2^-25 absolute below it */
    roundtrip r = encode_decode(KV_QF_F16, 0, x, n, d, 0);
    int bad = 0;
    for (int i = 0; i < n * d; i++) bad += !(fabsf(x[i] - r.y[i]) <= 0x1p-11f * fabsf(x[i]) + 0x1p-25f);
    KV_CHECK(bad == 0, "fp16 round trip: %d beyond 2^-11 relative", bad);
    rt_free(&r);
    r = encode_decode(KV_QF_BF16, 0, x, n, d, 0);
    bad = 0;
    for (int i = 0; i < n * d; i++) bad += !(fabsf(x[i] - r.y[i]) <= 0x1p-8f * fabsf(x[i]));
    KV_CHECK(bad == 0, "bf16 round trip: %d beyond 2^-8 relative", bad);
    rt_free(&r);
    r = encode_decode(KV_QF_F32, 0, x, n, d, 0);
    KV_CHECK(memcmp(r.y, x, sizeof(float) * n * d) == 0, "fp32 round trip is exact");
    rt_free(&r);

    /* fp8 with per-head scales: 4 heads of different magnitude, calibrated per head and per
     * tensor. Bound: half a mantissa step relative (2^-4 e4m3, 2^-3 e5m2) plus 2 ulps of fp32,
     * and half the smallest subnormal times the scale below the normal range. */
    const int H = 4;
    float *xh = malloc(sizeof(float) * H * n * d);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < n * d; i++) xh[(h * n * d) + i] = x[i] * (h == 2 ? 100.0f : 1.0f);
    for (int fmt = KV_QF_FP8_E4M3; fmt <= KV_QF_FP8_E5M2; fmt++)
        for (int per_head = 0; per_head < 2; per_head++) {
            const int e5 = fmt == KV_QF_FP8_E5M2;
            float scales[4];
            kv_err e;
            KV_CHECK(kv_quant_fp8_calibrate(fmt, xh, H, n, d, per_head, scales, &e) == KV_OK, "calibrate");
            KV_CHECK(per_head ? scales[2] > 50 * scales[0] : scales[0] == scales[2], "%s per_head %d "
                     "scales %g %g", kv_quant_name(fmt), per_head, scales[0], scales[2]);
            bad = 0;
            for (int h = 0; h < H; h++) {
                const float *xs = xh + h * n * d;
                roundtrip q = encode_decode(fmt, 0, xs, n, d, scales[h]);
                const float rel = e5 ? 0x1p-3f : 0x1p-4f, sub = e5 ? 0x1p-17f : 0x1p-10f;
                for (int i = 0; i < n * d; i++) {
                    const float err = fabsf(xs[i] - q.y[i]);
                    bad += !(err <= (rel + 0x1p-22f) * fabsf(xs[i]) + sub * scales[h]);
                }
                /* the head's amax lands on the largest code */
                int top = 0;
                for (int i = 0; i < n * d; i++) top |= (q.codes[i] & 0x7f) == (e5 ? 0x7b : 0x7e);
                if (per_head || h == 2) /* per tensor, only the largest head reaches the top */
                    KV_CHECK(top, "%s head %d: amax reaches the largest code", kv_quant_name(fmt), h);
                rt_free(&q);
            }
            KV_CHECK(bad == 0, "%s per_head %d: %d round trips beyond the bound", kv_quant_name(fmt),
                     per_head, bad);
        }
    /* saturation and NaN through the API: scale 1 */
    float sx[8] = {1000.0f, -1e30f, INFINITY, -INFINITY, NAN, 448.0f, 1e5f, -0.0f};
    roundtrip q = encode_decode(KV_QF_FP8_E4M3, 0, sx, 1, 8, 1.0f);
    KV_CHECK(q.y[0] == 448 && q.y[1] == -448 && q.y[2] == 448 && q.y[3] == -448 && isnan(q.y[4]) &&
             q.y[5] == 448 && q.y[6] == 448 && q.y[7] == 0 && q.codes[7] == 0x80,
             "e4m3 saturates to +-448, NaN stays NaN");
    rt_free(&q);
    q = encode_decode(KV_QF_FP8_E5M2, 0, sx, 1, 8, 1.0f);
    KV_CHECK(q.y[0] == 1024 && q.y[1] == -57344 && q.y[2] == 57344 && q.y[3] == -57344 &&
             isnan(q.y[4]) && q.y[6] == 57344, "e5m2 saturates to +-57344, NaN stays NaN");
    rt_free(&q);
    KV_CHECK(kv_quant_fp8_scale(KV_QF_FP8_E4M3, 0.0f) == 1.0f && kv_quant_fp8_scale(KV_QF_FP8_E4M3, NAN) == 1.0f,
             "fp8 scale of nothing is 1");
    KV_CHECK(kv_quant_fp8_scale(KV_QF_FP8_E4M3, 896.0f) == 2.0f, "fp8 scale = amax / 448");
    free(x), free(xh);
}

/* ---- KIVI int4 / int2 ------------------------------------------------------------------------ */

/* Every KIVI group: the stored grid covers it (zero <= min, zero + (2^b-1) scale >= max up to
 * fp32 rounding) and |x - deq| <= scale/2 + 2^-20 (|x|max + scale), the fp32 rounding of
 * x - zero, of the division and of the fmaf. Returns the failures. */
static int check_kivi(int fmt, int role, const float *x, const float *y, const kv_qsz *meta,
                      int64_t n, int d)
{
    const int bits = kvq_code_bits(fmt), levels = (1 << bits) - 1;
    int bad = 0;
    const int64_t groups = n * d / KV_KIVI_GROUP;
    for (int64_t gi = 0; gi < groups; gi++) {
        int64_t idx[KV_KIVI_GROUP];
        for (int k = 0; k < KV_KIVI_GROUP; k++)
            idx[k] = role == KV_QROLE_KEY ? ((gi / d) * KV_KIVI_GROUP + k) * d + gi % d /* channel */
                                          : gi * KV_KIVI_GROUP + k;                     /* row */
        const kv_qsz p = meta[gi];
        const float scale = kvq_f16_to_f32(p.scale), zero = kvq_f16_to_f32(p.zero);
        float mn = INFINITY, mx = -INFINITY, amax = 0;
        for (int k = 0; k < KV_KIVI_GROUP; k++) {
            mn = fminf(mn, x[idx[k]]), mx = fmaxf(mx, x[idx[k]]);
            amax = fmaxf(amax, fabsf(x[idx[k]]));
        }
        const float slop = 0x1p-20f * (amax + scale);
        if (!(zero <= mn && zero + levels * scale >= mx - slop)) {
            if (bad++ < 3) printf("  %s group %lld: grid [%g, +%d*%g] misses [%g, %g]\n",
                                  kv_quant_name(fmt), (long long)gi, zero, levels, scale, mn, mx);
        }
        for (int k = 0; k < KV_KIVI_GROUP; k++)
            if (!(fabsf(x[idx[k]] - y[idx[k]]) <= 0.5f * scale + slop)) {
                if (bad++ < 3) printf("  %s group %lld: x %g, deq %g, scale %g\n", kv_quant_name(fmt),
                                      (long long)gi, x[idx[k]], y[idx[k]], scale);
            }
    }
    return bad;
}

static void test_kivi(void)
{
    for (int fmt = KV_QF_INT4_KIVI; fmt <= KV_QF_INT2_KIVI; fmt++)
        for (int role = 0; role < 2; role++)
            for (int d = 64; d <= 128; d += 64) {
                const int64_t n = 96;
                float *x = random_rows(n, d, 2.0f);
                for (int j = 0; j < d; j++) x[5 * d + j] += 1000.0f; /* a row with a big offset */
                roundtrip r = encode_decode(fmt, role, x, n, d, 0);
                KV_CHECK(check_kivi(fmt, role, x, r.y, r.meta, n, d) == 0, "%s %s d %d: round trip",
                         kv_quant_name(fmt), role ? "keys" : "values", d);
                free(x), rt_free(&r);
            }
}

/* packing order and metadata placement, on values whose codes are known */
static void test_kivi_layout(void)
{
    const int d = 64;
    float x[32 * 64];
    /* values: row 0 group 0 holds 0..15 twice -> zero 0, scale 1, code j % 16 */
    for (int t = 0; t < 32; t++)
        for (int j = 0; j < d; j++) x[t * d + j] = (float)((j + t) % 16);
    roundtrip r = encode_decode(KV_QF_INT4_KIVI, KV_QROLE_VALUE, x, 32, d, 0);
    const kv_qsz *m = r.meta;
    KV_CHECK(m[0].zero == 0 && kvq_f16_to_f32(m[0].scale) == 1.0f, "int4 V group 0: zero 0, scale 1");
    KV_CHECK(r.codes[0] == 0x10 && r.codes[1] == 0x32 && r.codes[7] == 0xfe,
             "int4 packs element j in nibble j %% 2, low first: 0x%02x 0x%02x 0x%02x", r.codes[0],
             r.codes[1], r.codes[7]);
    KV_CHECK(kvq_meta_index(KV_QF_INT4_KIVI, KV_QROLE_VALUE, 3, 40, d) == 3 * 2 + 1, "V meta index");
    KV_CHECK(r.y[3 * d + 40] == (float)((40 + 3) % 16), "V element (3, 40) decodes exactly");
    rt_free(&r);
    /* keys: channel c holds (t + c) % 4 over the tokens -> int2 zero 0 scale 1, code (t+c)%4 */
    for (int t = 0; t < 32; t++)
        for (int j = 0; j < d; j++) x[t * d + j] = (float)((t + j) % 4);
    r = encode_decode(KV_QF_INT2_KIVI, KV_QROLE_KEY, x, 32, d, 0);
    m = r.meta;
    KV_CHECK(m[9].zero == 0 && kvq_f16_to_f32(m[9].scale) == 1.0f, "int2 K channel 9: zero 0 scale 1");
    /* row 1, channels 0..3 -> codes 1,2,3,0 -> byte 0b00111001 */
    KV_CHECK(r.codes[1 * 16 + 0] == 0x39, "int2 packs element j at bits 2*(j%%4): 0x%02x",
             r.codes[16]);
    KV_CHECK(kvq_meta_index(KV_QF_INT2_KIVI, KV_QROLE_KEY, 40, 9, d) == 1 * d + 9, "K meta index");
    int exact = 1;
    for (int i = 0; i < 32 * d; i++) exact &= r.y[i] == x[i];
    KV_CHECK(exact, "int2 keys on the grid decode exactly");
    rt_free(&r);
}

static void test_kivi_special(void)
{
    const int d = 64, n = 32;
    float x[32 * 64];
    for (int role = 0; role < 2; role++)
        for (int fmt = KV_QF_INT4_KIVI; fmt <= KV_QF_INT2_KIVI; fmt++) {
            for (int i = 0; i < n * d; i++) x[i] = 0.0f;
            roundtrip r = encode_decode(fmt, role, x, n, d, 0);
            const kv_qsz *m = r.meta;
            int ok = 1;
            for (int i = 0; i < n * d; i++) ok &= r.y[i] == 0.0f;
            KV_CHECK(ok && m[0].scale == 0 && m[0].zero == 0, "%s role %d: all zero -> exact zeros, "
                     "scale 0", kv_quant_name(fmt), role);
            rt_free(&r);
            /* constant 3.3 (not an fp16 number): a tiny scale covers it, no NaN */
            for (int i = 0; i < n * d; i++) x[i] = 3.3f;
            r = encode_decode(fmt, role, x, n, d, 0);
            m = r.meta;
            ok = 1;
            for (int i = 0; i < n * d; i++) ok &= fabsf(r.y[i] - 3.3f) <= 0.5f * kvq_f16_to_f32(m[0].scale) + 1e-6f;
            KV_CHECK(ok && kvq_f16_to_f32(m[0].scale) < 1e-3f, "%s role %d: constant 3.3 within scale/2 "
                     "(scale %g)", kv_quant_name(fmt), role, kvq_f16_to_f32(m[0].scale));
            rt_free(&r);
            /* constant 2.0 (an fp16 number): scale 0, exact */
            for (int i = 0; i < n * d; i++) x[i] = 2.0f;
            r = encode_decode(fmt, role, x, n, d, 0);
            m = r.meta;
            ok = 1;
            for (int i = 0; i < n * d; i++) ok &= r.y[i] == 2.0f;
            KV_CHECK(ok && m[0].scale == 0, "%s role %d: constant 2 exact with scale 0", kv_quant_name(fmt), role);
            rt_free(&r);
            /* NaN at (t 4, c 10), inf at (t 20, c 40), 70000 (beyond fp16) at (t 9, c 63) */
            for (int i = 0; i < n * d; i++) x[i] = 0.01f * (float)(i % 97);
            x[4 * d + 10] = NAN, x[20 * d + 40] = INFINITY, x[9 * d + 63] = 70000.0f;
            r = encode_decode(fmt, role, x, n, d, 0);
            int wrong = 0;
            for (int t = 0; t < n; t++)
                for (int c = 0; c < d; c++) {
                    /* the group of (t, c): keys one channel, values 32 channels of one row */
                    int poisoned = role == KV_QROLE_KEY ? (c == 10 || c == 40 || c == 63)
                                                        : ((t == 4 && c < 32) || (t == 20 && c >= 32) ||
                                                           (t == 9 && c >= 32));
                    wrong += isnan(r.y[t * d + c]) != poisoned;
                }
            KV_CHECK(wrong == 0, "%s %s: NaN / inf / >65504 poison exactly their groups (%d wrong)",
                     kv_quant_name(fmt), role ? "keys" : "values", wrong);
            rt_free(&r);
        }
}

/* Keys with one outlier channel (x100): per channel (KIVI keys), the other channels keep their
 * own small steps; grouped per token (the value layout) every group holding the outlier
 * takes its step. Prediction: per-token error on the normal channels ~ 100x larger. */
static void test_outlier_channel(void)
{
    const int d = 128, n = 64;
    float *x = malloc(sizeof(float) * n * d);
    for (int i = 0; i < n * d; i++) x[i] = kv_rng_normal(&rng) * ((i % d) == 17 ? 100.0f : 1.0f);
    roundtrip k = encode_decode(KV_QF_INT4_KIVI, KV_QROLE_KEY, x, n, d, 0);
    roundtrip v = encode_decode(KV_QF_INT4_KIVI, KV_QROLE_VALUE, x, n, d, 0);
    double ek = 0, ev = 0;
    for (int i = 0; i < n * d; i++)
        if (i % d != 17 && i % d < 32) { /* the normal channels sharing a value group with 17 */
            ek += fabs(x[i] - k.y[i]);
            ev += fabs(x[i] - v.y[i]);
        }
    printf("  int4 outlier channel: mean |err| of its 31 neighbours: per channel %.4f, per token %.4f\n",
           ek / (n * 31), ev / (n * 31));
    KV_CHECK(ev > 10 * ek, "per-channel keys protect the neighbours of an outlier channel "
             "(%.4f vs %.4f)", ek / (n * 31), ev / (n * 31));
    rt_free(&k), rt_free(&v), free(x);
}

/* Phase 2 spills 32 rows at a time into the middle of a plane (kv_quant.h): encoding rows
 * 32..63 through offset pointers gives the bytes of encoding all 96 rows at once. */
static void test_subrange(void)
{
    const int d = 128;
    const int64_t n = 96, t0 = 32;
    float *x = random_rows(n, d, 1.0f);
    for (int fmt = 0; fmt < KV_QF_COUNT; fmt++)
        for (int role = 0; role < 2; role++) {
            const size_t cb = kv_quant_code_bytes(fmt, n, d), mb = kv_quant_meta_bytes(fmt, role, n, d);
            uint8_t *c1 = calloc(1, cb), *c2 = calloc(1, cb), *m1 = calloc(1, mb + 4), *m2 = calloc(1, mb + 4);
            kv_err e;
            kv_quant_encode(fmt, role, x, n, d, 0.01f, c1, m1, &e);
            const int64_t rb = kvq_row_bytes(fmt, d), mi = kvq_meta_index(fmt, role, t0, 0, d);
            int rc = kv_quant_encode(fmt, role, x + t0 * d, 32, d, 0.01f, c2 + t0 * rb,
                                     mb ? m2 + mi * 4 : NULL, &e);
            KV_CHECK(rc == KV_OK, "%s: %s", kv_quant_name(fmt), e.msg);
            const size_t mlo = mb ? (size_t)mi * 4 : 0, mhi = mb ? (size_t)kvq_meta_index(fmt, role, t0 + 32, 0, d) * 4 : 0;
            KV_CHECK(!memcmp(c1 + t0 * rb, c2 + t0 * rb, (size_t)(32 * rb)) &&
                     !memcmp(m1 + mlo, m2 + mlo, mhi - mlo),
                     "%s role %d: rows 32..63 encoded alone match the whole", kv_quant_name(fmt), role);
            free(c1), free(c2), free(m1), free(m2);
        }
    free(x);
}

/* ---- arguments and threads -------------------------------------------------------------------- */

static void test_errors(void)
{
    float x[64 * 64] = {0};
    uint8_t codes[64 * 64 * 4];
    float meta[64 * 64];
    kv_err e;
    struct { int fmt, role; int64_t n; int d; float scale; const char *word; } bad[] = {
        {KV_QF_COUNT, 0, 1, 64, 1, "unknown format"},
        {KV_QF_INT8, 2, 1, 64, 1, "role"},
        {KV_QF_INT8, 0, 1, 0, 1, "shape"},
        {KV_QF_INT8, 0, -1, 64, 1, "shape"},
        {KV_QF_INT8_G128, 0, 1, 64, 1, "multiple of the group 128"},
        {KV_QF_INT4_KIVI, 0, 1, 48, 1, "group 32"},
        {KV_QF_INT2_KIVI, 1, 33, 64, 1, "32-token blocks"},
        {KV_QF_FP8_E4M3, 0, 1, 64, 0, "scale"},
        {KV_QF_FP8_E5M2, 0, 1, 64, NAN, "scale"},
        {KV_QF_FP8_E5M2, 0, 1, 64, INFINITY, "scale"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = 0;
        int rc = kv_quant_encode(bad[i].fmt, bad[i].role, x, bad[i].n, bad[i].d, bad[i].scale, codes, meta, &e);
        KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, bad[i].word), "case %zu: rc %d, '%s' should name '%s'",
                 i, rc, e.msg, bad[i].word);
        rc = kv_quant_decode(bad[i].fmt, bad[i].role, codes, meta, bad[i].n, bad[i].d, bad[i].scale, x, &e);
        KV_CHECK(rc == KV_ERR_ARG, "decode case %zu: rc %d", i, rc);
    }
    KV_CHECK(kv_quant_encode(KV_QF_INT8, 0, x, 1, 64, 0, codes, NULL, &e) == KV_ERR_ARG, "NULL meta");
    KV_CHECK(kv_quant_encode(KV_QF_FP8_E4M3, 0, x, 1, 64, 1, codes, NULL, &e) == KV_OK, "fp8: no meta");
    KV_CHECK(kv_quant_encode(KV_QF_INT8, 0, NULL, 0, 64, 0, NULL, NULL, &e) == KV_OK, "n = 0 is a no-op");
    float s[2];
    KV_CHECK(kv_quant_fp8_calibrate(KV_QF_INT8, x, 1, 1, 64, 1, s, &e) == KV_ERR_ARG, "calibrate int8");
}

static void test_threads(void)
{
    const int d = 128;
    const int64_t n = 1024; /* n * d above the parallel threshold */
    float *x = random_rows(n, d, 1.0f);
    for (int fmt = 0; fmt < KV_QF_COUNT; fmt++)
        for (int role = 0; role < 2; role++) {
            const size_t cb = kv_quant_code_bytes(fmt, n, d), mb = kv_quant_meta_bytes(fmt, role, n, d);
            uint8_t *c1 = malloc(cb), *c2 = malloc(cb), *m1 = malloc(mb + 4), *m2 = malloc(mb + 4);
            kv_err e;
            omp_set_num_threads(1);
            kv_quant_encode(fmt, role, x, n, d, 0.01f, c1, m1, &e);
            omp_set_num_threads(2);
            kv_quant_encode(fmt, role, x, n, d, 0.01f, c2, m2, &e);
            KV_CHECK(!memcmp(c1, c2, cb) && !memcmp(m1, m2, mb), "%s role %d: same bytes on 1 and 2 "
                     "threads", kv_quant_name(fmt), role);
            free(c1), free(c2), free(m1), free(m2);
        }
    free(x);
}

int main(void)
{
    kv_rng_seed(&rng, 4);
    test_sizes();
    test_conversion_table();
    test_exhaustive_codes();
    test_fp8_oracle();
    test_int8();
    test_int8_special();
    test_int4_g32();
    test_float_formats();
    test_kivi();
    test_kivi_layout();
    test_kivi_special();
    test_outlier_channel();
    test_subrange();
    test_errors();
    test_threads();
    return kv_test_finish();
}
