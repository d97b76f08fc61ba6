/*
 * kv_golden_cvt.h: float -> half / bfloat16 / fp8 (E4M3, E5M2) conversions on their edge
 * cases, one table held by the host converters (test_quant.c, reference_cpu/cache/kv_quant_math.h's
 * kvq_f32_to_*) and by the device's own conversions (emu_numerics.cu, cuda_fp16.h and friends).
 *
 * Each row is an input and the bit pattern the format's definition gives for it: round to
 * nearest, ties to even; half overflows to infinity from 65520 up; bfloat16 keeps the float's
 * top 16 bits after rounding; fp8 E4M3 (max 448) and E5M2 (max 57344) saturate to the largest
 * finite value, infinities included. C and C++ (the table is included by a .cu file).
 */
#ifndef KV_GOLDEN_CVT_H
#define KV_GOLDEN_CVT_H

#include <math.h> /* INFINITY */

typedef struct {
    float in;
    unsigned short half, bf16;
    unsigned char e4m3, e5m2;
    const char *what;
} kv_cvt_case;

static const kv_cvt_case kv_golden_cvt[] = {
    /*  input            half    bf16   e4m3  e5m2 */
    {1.0f,               0x3c00, 0x3f80, 0x38, 0x3c, "one"},
    {-0.0f,              0x8000, 0x8000, 0x80, 0x80, "negative zero"},
    {0x1.002p0f,         0x3c00, 0x3f80, 0x38, 0x3c, "1 + 2^-11: half tie to even (down)"},
    {0x1.006p0f,         0x3c02, 0x3f80, 0x38, 0x3c, "1 + 3*2^-11: half tie to even (up)"},
    {0x1.01p0f,          0x3c04, 0x3f80, 0x38, 0x3c, "1 + 2^-8: bf16 tie to even (down)"},
    {0x1.03p0f,          0x3c0c, 0x3f82, 0x38, 0x3c, "1 + 3*2^-8: bf16 tie to even (up)"},
    {0x1.1p0f,           0x3c40, 0x3f88, 0x38, 0x3c, "1 + 2^-4: e4m3 tie to even (down)"},
    {0x1.3p0f,           0x3cc0, 0x3f98, 0x3a, 0x3d, "1.1875: e4m3 tie to even (up)"},
    {0x1.2p0f,           0x3c80, 0x3f90, 0x39, 0x3c, "1.125: e5m2 tie to even (down)"},
    {0x1.6p0f,           0x3d80, 0x3fb0, 0x3b, 0x3e, "1.375: e5m2 tie to even (up)"},
    {65504.0f,           0x7bff, 0x4780, 0x7e, 0x7b, "largest half (bf16 rounds up to 2^16)"},
    {0x1.ffdffep15f,     0x7bff, 0x4780, 0x7e, 0x7b, "just below 65520"},
    {65520.0f,           0x7c00, 0x4780, 0x7e, 0x7b, "65520: half overflows"},
    {448.0f,             0x5f00, 0x43e0, 0x7e, 0x5f, "largest e4m3"},
    {464.0f,             0x5f40, 0x43e8, 0x7e, 0x5f, "e4m3 tie above max stays 448"},
    {480.0f,             0x5f80, 0x43f0, 0x7e, 0x60, "beyond e4m3: saturates (e5m2: tie to 512)"},
    {-1.0e6f,            0xfc00, 0xc974, 0xfe, 0xfb, "large negative: -inf / saturate"},
    {57344.0f,           0x7b00, 0x4760, 0x7e, 0x7b, "largest e5m2"},
    {61440.0f,           0x7b80, 0x4770, 0x7e, 0x7b, "e5m2 tie toward infinity: saturates"},
    {INFINITY,           0x7c00, 0x7f80, 0x7e, 0x7b, "+inf: e4m3/e5m2 saturate"},
    {-INFINITY,          0xfc00, 0xff80, 0xfe, 0xfb, "-inf"},
    {0x1p-24f,           0x0001, 0x3380, 0x00, 0x00, "smallest half subnormal"},
    {0x1p-25f,           0x0000, 0x3300, 0x00, 0x00, "half: tie between 0 and 2^-24"},
    {0x1.000002p-25f,    0x0001, 0x3300, 0x00, 0x00, "just above 2^-25"},
    {0x1.8p-24f,         0x0002, 0x33c0, 0x00, 0x00, "1.5 * 2^-24: tie to even"},
    {0x1.ffcp-15f,       0x0400, 0x3880, 0x00, 0x04, "half: subnormal rounds up to 2^-14"},
    {0x1p-9f,            0x1800, 0x3b00, 0x01, 0x18, "smallest e4m3 subnormal"},
    {0x1p-10f,           0x1400, 0x3a80, 0x00, 0x14, "e4m3: tie between 0 and 2^-9"},
    {0x1.8p-9f,          0x1a00, 0x3b40, 0x02, 0x1a, "e4m3: 1.5 units, tie to even"},
    {0x1p-6f,            0x2400, 0x3c80, 0x08, 0x24, "smallest e4m3 normal"},
    {0x1p-16f,           0x0100, 0x3780, 0x00, 0x01, "smallest e5m2 subnormal"},
    {0x1p-17f,           0x0080, 0x3700, 0x00, 0x00, "e5m2: tie between 0 and 2^-16"},
    {0x1.fffffep127f,    0x7c00, 0x7f80, 0x7e, 0x7b, "largest float"},
    {0x1p-149f,          0x0000, 0x0000, 0x00, 0x00, "smallest float subnormal"},
};
#define KV_GOLDEN_CVT_N ((int)(sizeof kv_golden_cvt / sizeof kv_golden_cvt[0]))

#endif
