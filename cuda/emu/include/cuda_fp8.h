/**
 * @file cuda_fp8.h
 * The two 8-bit float formats for the emulation build, converted as the device converts them
 * (cvt.rn.satfinite on sm_89+):
 *
 *   E4M3: bias 7, no infinities, largest finite 448 (0x7e), NaN 0x7f / 0xff.
 *   E5M2: bias 15, infinities 0x7c / 0xfc, largest finite 57344 (0x7b).
 *
 * Rounding is to nearest even from the exact value (a float or double input is rounded once).
 * __NV_SATFINITE clamps anything beyond the largest finite value, infinities included, to
 * +-max; __NV_NOSAT gives NaN (E4M3) or infinity (E5M2) there. A NaN input becomes 0x7f. The
 * conversion constructors of __nv_fp8_e4m3 / __nv_fp8_e5m2 use __NV_SATFINITE.
 */
#ifndef KVEMU_CUDA_FP8_H
#define KVEMU_CUDA_FP8_H

#include "cuda_fp16.h"
#include "cuda_bf16.h"

typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short __nv_fp8x2_storage_t;
typedef unsigned int __nv_fp8x4_storage_t;
typedef enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE } __nv_saturation_t;
typedef enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 } __nv_fp8_interpretation_t;

#ifdef __cplusplus

/* double -> fp8, round to nearest even on the double's bits (floats convert exactly to double). */
inline __nv_fp8_storage_t __nv_cvt_double_to_fp8(double d, __nv_saturation_t sat,
                                                 __nv_fp8_interpretation_t fmt)
{
    const int mbits = fmt == __NV_E4M3 ? 3 : 2, bias = fmt == __NV_E4M3 ? 7 : 15;
    const unsigned maxcode = fmt == __NV_E4M3 ? 0x7eu : 0x7bu;
    uint64_t x;
    memcpy(&x, &d, 8);
    unsigned sign = (unsigned)(x >> 56) & 0x80u;
    uint64_t a = x & 0x7fffffffffffffffull;
    if (a > 0x7ff0000000000000ull) return 0x7f;                       /* NaN */
    int e = (int)(a >> 52) - 1023;
    uint64_t mant = (a & 0xfffffffffffffull) | (1ull << 52);
    uint64_t code;
    if (a == 0x7ff0000000000000ull) {
        code = maxcode + 1;                                              /* infinity: overflow */
    } else if (e >= 1 - bias) {                                          /* normal range */
        if (e > bias + 1) code = maxcode + 1;
        else {
            int drop = 52 - mbits;
            uint64_t rem = mant & ((1ull << drop) - 1), halfq = 1ull << (drop - 1);
            code = ((uint64_t)(e + bias) << mbits) | ((mant >> drop) & ((1ull << mbits) - 1));
            code += rem > halfq || (rem == halfq && (code & 1));          /* may carry into exponent */
        }
    } else {                                                             /* subnormal: units 2^(1-bias-mbits) */
        int shift = 52 + (1 - bias - mbits) - e;
        if (shift > 60 || (a >> 52) == 0) code = 0;
        else {
            uint64_t rem = mant & ((1ull << shift) - 1), halfq = 1ull << (shift - 1);
            code = mant >> shift;
            code += rem > halfq || (rem == halfq && (code & 1));
        }
    }
    if (code > maxcode) {
        if (sat == __NV_SATFINITE) code = maxcode;
        else code = fmt == __NV_E4M3 ? 0x7f : 0x7c;
    }
    return (__nv_fp8_storage_t)(sign | code);
}
inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float f, __nv_saturation_t sat,
                                                __nv_fp8_interpretation_t fmt)
{
    return __nv_cvt_double_to_fp8((double)f, sat, fmt);
}
inline __nv_fp8_storage_t __nv_cvt_halfraw_to_fp8(__half_raw h, __nv_saturation_t sat,
                                                  __nv_fp8_interpretation_t fmt)
{
    return __nv_cvt_double_to_fp8((double)kvemu_h2f(h.x), sat, fmt);
}
inline __nv_fp8_storage_t __nv_cvt_bfloat16raw_to_fp8(__nv_bfloat16_raw b, __nv_saturation_t sat,
                                                      __nv_fp8_interpretation_t fmt)
{
    return __nv_cvt_double_to_fp8((double)kvemu_bf2f(b.x), sat, fmt);
}
inline __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(float2 v, __nv_saturation_t sat,
                                                     __nv_fp8_interpretation_t fmt)
{
    return (__nv_fp8x2_storage_t)(__nv_cvt_float_to_fp8(v.x, sat, fmt) |
                                  (__nv_cvt_float_to_fp8(v.y, sat, fmt) << 8));
}
inline float kvemu_nan(void)
{
    uint32_t x = 0x7fffffffu;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
/* fp8 -> float, exact; NaN becomes the canonical 0x7fffffff. */
inline float kvemu_fp8_to_float(__nv_fp8_storage_t b, __nv_fp8_interpretation_t fmt)
{
    const int mbits = fmt == __NV_E4M3 ? 3 : 2, bias = fmt == __NV_E4M3 ? 7 : 15;
    const int ebits = 7 - mbits;
    int sign = b & 0x80, e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
    float v;
    if (fmt == __NV_E4M3 && (b & 0x7f) == 0x7f) return kvemu_nan();
    if (fmt == __NV_E5M2 && e == 31) {
        if (m) return kvemu_nan();
        v = INFINITY;
    } else if (e == 0) v = ldexpf((float)m, 1 - bias - mbits);
    else v = ldexpf((float)(m + (1 << mbits)), e - bias - mbits);
    return sign ? -v : v;
}
inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t b, __nv_fp8_interpretation_t fmt)
{
    __half_raw r;
    r.x = kvemu_f2h_bits(kvemu_fp8_to_float(b, fmt)); /* exact: both formats fit in binary16 */
    return r;
}
/* Two fp8 codes (low byte first) -> two halves: cvt.rn.f16x2.e4m3x2 / e5m2x2 on sm_89+. */
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t b, __nv_fp8_interpretation_t fmt)
{
    __half2_raw r;
    r.x = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)(b & 0xff), fmt).x;
    r.y = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)(b >> 8), fmt).x;
    return r;
}

#define KVEMU_FP8_TYPE(NAME, FMT)                                                              \
    struct __attribute__((aligned(1))) NAME {                                                 \
        __nv_fp8_storage_t __x;                                                               \
        NAME() = default;                                                                     \
        explicit NAME(float f) : __x(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, FMT)) {}        \
        explicit NAME(double d) : __x(__nv_cvt_double_to_fp8(d, __NV_SATFINITE, FMT)) {}      \
        explicit NAME(__half h) : __x(__nv_cvt_halfraw_to_fp8(h, __NV_SATFINITE, FMT)) {}     \
        explicit NAME(__nv_bfloat16 b)                                                        \
            : __x(__nv_cvt_bfloat16raw_to_fp8(b, __NV_SATFINITE, FMT)) {}                     \
        explicit NAME(int v) : __x(__nv_cvt_float_to_fp8((float)v, __NV_SATFINITE, FMT)) {}  \
        explicit NAME(unsigned v)                                                             \
            : __x(__nv_cvt_float_to_fp8((float)v, __NV_SATFINITE, FMT)) {}                    \
        explicit NAME(long long v)                                                            \
            : __x(__nv_cvt_float_to_fp8((float)v, __NV_SATFINITE, FMT)) {}                    \
        explicit operator float() const { return kvemu_fp8_to_float(__x, FMT); }              \
        explicit operator double() const { return kvemu_fp8_to_float(__x, FMT); }             \
        explicit operator __half() const { return __half(__nv_cvt_fp8_to_halfraw(__x, FMT)); }\
        explicit operator __nv_bfloat16() const                                               \
        {                                                                                     \
            return __float2bfloat16_rz(kvemu_fp8_to_float(__x, FMT));                         \
        }                                                                                     \
    };
KVEMU_FP8_TYPE(__nv_fp8_e4m3, __NV_E4M3)
KVEMU_FP8_TYPE(__nv_fp8_e5m2, __NV_E5M2)
#undef KVEMU_FP8_TYPE

#define KVEMU_FP8X2_TYPE(NAME, FMT)                                                            \
    struct __attribute__((aligned(2))) NAME {                                                 \
        __nv_fp8x2_storage_t __x;                                                             \
        NAME() = default;                                                                     \
        explicit NAME(float2 v) : __x(__nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, FMT)) {}    \
        explicit operator float2() const                                                      \
        {                                                                                     \
            return make_float2(kvemu_fp8_to_float((__nv_fp8_storage_t)(__x & 0xff), FMT),     \
                               kvemu_fp8_to_float((__nv_fp8_storage_t)(__x >> 8), FMT));      \
        }                                                                                     \
    };
KVEMU_FP8X2_TYPE(__nv_fp8x2_e4m3, __NV_E4M3)
KVEMU_FP8X2_TYPE(__nv_fp8x2_e5m2, __NV_E5M2)
#undef KVEMU_FP8X2_TYPE

#define KVEMU_FP8X4_TYPE(NAME, FMT)                                                            \
    struct __attribute__((aligned(4))) NAME {                                                 \
        __nv_fp8x4_storage_t __x;                                                             \
        NAME() = default;                                                                     \
        explicit NAME(float4 v)                                                               \
        {                                                                                     \
            __x = (unsigned)__nv_cvt_float_to_fp8(v.x, __NV_SATFINITE, FMT) |                 \
                  ((unsigned)__nv_cvt_float_to_fp8(v.y, __NV_SATFINITE, FMT) << 8) |          \
                  ((unsigned)__nv_cvt_float_to_fp8(v.z, __NV_SATFINITE, FMT) << 16) |         \
                  ((unsigned)__nv_cvt_float_to_fp8(v.w, __NV_SATFINITE, FMT) << 24);          \
        }                                                                                     \
        explicit operator float4() const                                                      \
        {                                                                                     \
            return make_float4(kvemu_fp8_to_float((__nv_fp8_storage_t)__x, FMT),              \
                               kvemu_fp8_to_float((__nv_fp8_storage_t)(__x >> 8), FMT),       \
                               kvemu_fp8_to_float((__nv_fp8_storage_t)(__x >> 16), FMT),      \
                               kvemu_fp8_to_float((__nv_fp8_storage_t)(__x >> 24), FMT));     \
        }                                                                                     \
    };
KVEMU_FP8X4_TYPE(__nv_fp8x4_e4m3, __NV_E4M3)
KVEMU_FP8X4_TYPE(__nv_fp8x4_e5m2, __NV_E5M2)
#undef KVEMU_FP8X4_TYPE

#endif /* __cplusplus */
#endif
