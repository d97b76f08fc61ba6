/**
 * @file cuda_fp16.h
 * __half and __half2 for the emulation build: IEEE binary16 stored in 16 bits, converted with
 * round-to-nearest-even exactly as the device's cvt.rn.f16.f32 does (overflow to infinity,
 * gradual underflow, NaN to the canonical 0x7fff). Arithmetic is done in float and rounded
 * once, which gives the correctly rounded binary16 result for + - * / (float carries more than
 * twice binary16's 11 significant bits, so the double rounding is harmless).
 */
#ifndef KVEMU_CUDA_FP16_H
#define KVEMU_CUDA_FP16_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "vector_types.h"

typedef struct { unsigned short x; } __half_raw;
typedef struct { unsigned short x, y; } __half2_raw;

#ifdef __cplusplus

/* float -> binary16 bits, round to nearest even. */
inline unsigned short kvemu_f2h_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;                 /* NaN */
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* >= 65520: infinity */
    if (a >= 0x38800000u) {                              /* normal: >= 2^-14 */
        uint32_t m = a - 0x38000000u;                    /* rebias 127 -> 15 */
        uint32_t r = m >> 13, rem = m & 0x1fffu;
        r += rem > 0x1000u || (rem == 0x1000u && (r & 1u));
        return (unsigned short)(sign | r);
    }
    if (a <= 0x33000000u) return (unsigned short)sign;   /* <= 2^-25 rounds to zero */
    uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;                           /* units of 2^-24 */
    uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    r += rem > half || (rem == half && (r & 1u));
    return (unsigned short)(sign | r);
}
/* binary16 bits -> float, exact (NaN becomes the canonical 0x7fffffff, as on the device). */
inline float kvemu_h2f(unsigned short h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f) x = m ? 0x7fffffffu : (sign | 0x7f800000u);
    else if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    } else x = sign | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
/* double -> float rounded to odd: a later round-to-nearest to a format of at most 22 bits then
 * equals the direct rounding of the double (no double-rounding error). */
inline float kvemu_d2f_odd(double d)
{
    float f = (float)d;
    if ((double)f != d && f == f && !isinf(f)) {
        uint32_t b;
        memcpy(&b, &f, 4);
        if (!(b & 1u)) {
            float g = nextafterf(f, (double)f < d ? INFINITY : -INFINITY);
            if (!isinf(g)) f = g;
        }
    }
    return f;
}

struct __attribute__((aligned(2))) __half {
    unsigned short __x;
    __half() = default;
    constexpr __half(const __half_raw &r) : __x(r.x) {}
    __half(float f) : __x(kvemu_f2h_bits(f)) {}
    __half(double d) : __x(kvemu_f2h_bits(kvemu_d2f_odd(d))) {}
    __half(int v) : __x(kvemu_f2h_bits((float)v)) {}
    __half(unsigned v) : __x(kvemu_f2h_bits((float)v)) {}
    __half(short v) : __x(kvemu_f2h_bits((float)v)) {}
    __half(unsigned short v) : __x(kvemu_f2h_bits((float)v)) {}
    __half(long long v) : __x(kvemu_f2h_bits(kvemu_d2f_odd((double)v))) {}
    __half(unsigned long long v) : __x(kvemu_f2h_bits(kvemu_d2f_odd((double)v))) {}
    __half &operator=(float f) { __x = kvemu_f2h_bits(f); return *this; }
    __half &operator=(const __half_raw &r) { __x = r.x; return *this; }
    operator float() const { return kvemu_h2f(__x); }
    operator __half_raw() const { __half_raw r; r.x = __x; return r; }
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
    __half2() = default;
    constexpr __half2(const __half &a, const __half &b) : x(a), y(b) {}
    __half2(const __half2_raw &r) { x.__x = r.x; y.__x = r.y; }
    operator __half2_raw() const { __half2_raw r; r.x = x.__x; r.y = y.__x; return r; }
};
typedef __half half;
typedef __half2 half2;

inline __half kvemu_h(unsigned short bits) { __half h; h.__x = bits; return h; }
inline __half __float2half(float f) { return kvemu_h(kvemu_f2h_bits(f)); }
inline __half __float2half_rn(float f) { return kvemu_h(kvemu_f2h_bits(f)); }
inline __half __float2half_rz(float f)
{
    __half h = __float2half(f);
    float back = kvemu_h2f(h.__x);
    if (!isnan(f) && fabsf(back) > fabsf(f)) h.__x = (unsigned short)(h.__x - 1); /* step toward 0 */
    return h;
}
inline __half __double2half(double d) { return kvemu_h(kvemu_f2h_bits(kvemu_d2f_odd(d))); }
inline float __half2float(__half h) { return kvemu_h2f(h.__x); }
inline __half __int2half_rn(int v) { return __half(v); }
inline int __half2int_rn(__half h) { return (int)nearbyintf(kvemu_h2f(h.__x)); }
inline int __half2int_rz(__half h) { return (int)kvemu_h2f(h.__x); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __ushort_as_half(unsigned short v) { return kvemu_h(v); }
inline __half __short_as_half(short v) { return kvemu_h((unsigned short)v); }

inline __half __hadd(__half a, __half b) { return __float2half(float(a) + float(b)); }
inline __half __hsub(__half a, __half b) { return __float2half(float(a) - float(b)); }
inline __half __hmul(__half a, __half b) { return __float2half(float(a) * float(b)); }
inline __half __hdiv(__half a, __half b) { return __float2half(float(a) / float(b)); }
/* a*b is exact in double; round-to-odd of the sum keeps the final rounding single. */
inline __half __hfma(__half a, __half b, __half c)
{
    double p = (double)float(a) * (double)float(b), s = p + (double)float(c);
    double t = s - p, err = (p - (s - t)) + ((double)float(c) - t); /* two-sum error */
    if (err != 0.0 && isfinite(s)) {
        uint64_t bits;
        memcpy(&bits, &s, 8);
        if (!(bits & 1u)) s = nextafter(s, err > 0 ? INFINITY : -INFINITY);
    }
    return __double2half(s);
}
inline __half __hneg(__half a) { return kvemu_h((unsigned short)(a.__x ^ 0x8000u)); }
inline __half __habs(__half a) { return kvemu_h((unsigned short)(a.__x & 0x7fffu)); }
inline __half __hmax(__half a, __half b) { return __float2half(fmaxf(float(a), float(b))); }
inline __half __hmin(__half a, __half b) { return __float2half(fminf(float(a), float(b))); }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u ? ((a.__x & 0x8000u) ? -1 : 1) : 0; }
inline bool __heq(__half a, __half b) { return float(a) == float(b); }
inline bool __hne(__half a, __half b) { return float(a) != float(b); }
inline bool __hlt(__half a, __half b) { return float(a) < float(b); }
inline bool __hle(__half a, __half b) { return float(a) <= float(b); }
inline bool __hgt(__half a, __half b) { return float(a) > float(b); }
inline bool __hge(__half a, __half b) { return float(a) >= float(b); }
inline __half hsqrt(__half a) { return __float2half(sqrtf(float(a))); }
inline __half hexp(__half a) { return __float2half(expf(float(a))); }

inline __half operator+(const __half &a, const __half &b) { return __hadd(a, b); }
inline __half operator-(const __half &a, const __half &b) { return __hsub(a, b); }
inline __half operator*(const __half &a, const __half &b) { return __hmul(a, b); }
inline __half operator/(const __half &a, const __half &b) { return __hdiv(a, b); }
inline __half &operator+=(__half &a, const __half &b) { return a = __hadd(a, b); }
inline __half &operator-=(__half &a, const __half &b) { return a = __hsub(a, b); }
inline __half &operator*=(__half &a, const __half &b) { return a = __hmul(a, b); }
inline __half &operator/=(__half &a, const __half &b) { return a = __hdiv(a, b); }
inline __half operator-(const __half &a) { return __hneg(a); }
inline __half operator+(const __half &a) { return a; }
inline bool operator==(const __half &a, const __half &b) { return __heq(a, b); }
inline bool operator!=(const __half &a, const __half &b) { return __hne(a, b); }
inline bool operator<(const __half &a, const __half &b) { return __hlt(a, b); }
inline bool operator<=(const __half &a, const __half &b) { return __hle(a, b); }
inline bool operator>(const __half &a, const __half &b) { return __hgt(a, b); }
inline bool operator>=(const __half &a, const __half &b) { return __hge(a, b); }

inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __half2half2(__half a) { return __half2(a, a); }
inline __half2 __float2half2_rn(float f) { return __half2(__float2half(f), __float2half(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half(a), __float2half(b)); }
inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline float2 __half22float2(__half2 h) { return make_float2(float(h.x), float(h.y)); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
inline __half2 __hsub2(__half2 a, __half2 b) { return __half2(__hsub(a.x, b.x), __hsub(a.y, b.y)); }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c)
{
    return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}
inline __half2 operator+(const __half2 &a, const __half2 &b) { return __hadd2(a, b); }
inline __half2 operator-(const __half2 &a, const __half2 &b) { return __hsub2(a, b); }
inline __half2 operator*(const __half2 &a, const __half2 &b) { return __hmul2(a, b); }

#endif /* __cplusplus */
#endif
