/**
 * @file cuda_bf16.h
 * __nv_bfloat16 for the emulation build: the top 16 bits of a float, rounded to nearest even
 * (NaN to the canonical 0x7fff, as CUDA's conversion gives). Arithmetic in float, rounded once.
 */
#ifndef KVEMU_CUDA_BF16_H
#define KVEMU_CUDA_BF16_H

#include "cuda_fp16.h"

typedef struct { unsigned short x; } __nv_bfloat16_raw;
typedef struct { unsigned short x, y; } __nv_bfloat162_raw;

#ifdef __cplusplus

inline unsigned short kvemu_f2bf_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    x += 0x7fffu + ((x >> 16) & 1u); /* round half to even on the 16 dropped bits */
    return (unsigned short)(x >> 16);
}
inline float kvemu_bf2f(unsigned short b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

struct __attribute__((aligned(2))) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    constexpr __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(kvemu_f2bf_bits(f)) {}
    __nv_bfloat16(double d) : __x(kvemu_f2bf_bits(kvemu_d2f_odd(d))) {}
    __nv_bfloat16(int v) : __x(kvemu_f2bf_bits(kvemu_d2f_odd((double)v))) {}
    __nv_bfloat16(unsigned v) : __x(kvemu_f2bf_bits(kvemu_d2f_odd((double)v))) {}
    __nv_bfloat16 &operator=(float f) { __x = kvemu_f2bf_bits(f); return *this; }
    operator float() const { return kvemu_bf2f(__x); }
    operator __nv_bfloat16_raw() const { __nv_bfloat16_raw r; r.x = __x; return r; }
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
    __nv_bfloat162() = default;
    constexpr __nv_bfloat162(const __nv_bfloat16 &a, const __nv_bfloat16 &b) : x(a), y(b) {}
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 kvemu_bf(unsigned short bits) { __nv_bfloat16 h; h.__x = bits; return h; }
inline __nv_bfloat16 __float2bfloat16(float f) { return kvemu_bf(kvemu_f2bf_bits(f)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return kvemu_bf(kvemu_f2bf_bits(f)); }
inline __nv_bfloat16 __float2bfloat16_rz(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return kvemu_bf(0x7fffu);
    return kvemu_bf((unsigned short)(x >> 16));
}
inline __nv_bfloat16 __double2bfloat16(double d) { return kvemu_bf(kvemu_f2bf_bits(kvemu_d2f_odd(d))); }
inline float __bfloat162float(__nv_bfloat16 b) { return kvemu_bf2f(b.__x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short v) { return kvemu_bf(v); }

inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(float(a) + float(b)); }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(float(a) - float(b)); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(float(a) * float(b)); }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(float(a) / float(b)); }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c)
{
    return __float2bfloat16(kvemu_d2f_odd((double)float(a) * float(b) + float(c))); /* product exact */
}
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return kvemu_bf((unsigned short)(a.__x ^ 0x8000u)); }
inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return kvemu_bf((unsigned short)(a.__x & 0x7fffu)); }
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(fmaxf(float(a), float(b))); }
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(fminf(float(a), float(b))); }
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }

inline __nv_bfloat16 operator+(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hadd(a, b); }
inline __nv_bfloat16 operator-(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hsub(a, b); }
inline __nv_bfloat16 operator*(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hmul(a, b); }
inline __nv_bfloat16 operator/(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hdiv(a, b); }
inline __nv_bfloat16 &operator+=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { return a = __hadd(a, b); }
inline __nv_bfloat16 &operator*=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { return a = __hmul(a, b); }
inline __nv_bfloat16 operator-(const __nv_bfloat16 &a) { return __hneg(a); }
inline bool operator==(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return float(a) == float(b); }
inline bool operator!=(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return float(a) != float(b); }
inline bool operator<(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return float(a) < float(b); }
inline bool operator>(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return float(a) > float(b); }
inline bool operator<=(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return float(a) <= float(b); }
inline bool operator>=(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return float(a) >= float(b); }

inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162(a, a); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162(__float2bfloat16(a), __float2bfloat16(b));
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return make_float2(float(h.x), float(h.y)); }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline float __low2float(__nv_bfloat162 h) { return float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return float(h.y); }

#endif /* __cplusplus */
#endif
