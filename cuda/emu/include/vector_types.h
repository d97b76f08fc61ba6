/**
 * @file vector_types.h
 * The CUDA vector types (float2, float4, int4, dim3, ...) for the emulation build, with the
 * alignment the device gives them: a float4 load through a cast pointer must see the same
 * 16-byte alignment rules here as on the GPU. C-compatible; dim3's constructors are C++ only.
 */
#ifndef KVEMU_VECTOR_TYPES_H
#define KVEMU_VECTOR_TYPES_H

#define KVEMU_VEC1(T, N)          typedef struct { T x; } N##1;
#define KVEMU_VEC2(T, N, A)       typedef struct __attribute__((aligned(A))) { T x, y; } N##2;
#define KVEMU_VEC3(T, N)          typedef struct { T x, y, z; } N##3;
#define KVEMU_VEC4(T, N, A)       typedef struct __attribute__((aligned(A))) { T x, y, z, w; } N##4;
#define KVEMU_VECS(T, N, A2, A4)  KVEMU_VEC1(T, N) KVEMU_VEC2(T, N, A2) KVEMU_VEC3(T, N) KVEMU_VEC4(T, N, A4)

KVEMU_VECS(signed char, char, 2, 4)
KVEMU_VECS(unsigned char, uchar, 2, 4)
KVEMU_VECS(short, short, 4, 8)
KVEMU_VECS(unsigned short, ushort, 4, 8)
KVEMU_VECS(int, int, 8, 16)
KVEMU_VECS(unsigned int, uint, 8, 16)
KVEMU_VECS(float, float, 8, 16)
KVEMU_VEC1(long long, longlong) KVEMU_VEC2(long long, longlong, 16) KVEMU_VEC3(long long, longlong)
KVEMU_VEC1(unsigned long long, ulonglong) KVEMU_VEC2(unsigned long long, ulonglong, 16)
KVEMU_VEC3(unsigned long long, ulonglong)
KVEMU_VEC1(double, double) KVEMU_VEC2(double, double, 16) KVEMU_VEC3(double, double)

#define KVEMU_MAKE1(T, N) static inline N##1 make_##N##1(T x) { N##1 v; v.x = x; return v; }
#define KVEMU_MAKE2(T, N) static inline N##2 make_##N##2(T x, T y) { N##2 v; v.x = x; v.y = y; return v; }
#define KVEMU_MAKE3(T, N) \
    static inline N##3 make_##N##3(T x, T y, T z) { N##3 v; v.x = x; v.y = y; v.z = z; return v; }
#define KVEMU_MAKE4(T, N) static inline N##4 make_##N##4(T x, T y, T z, T w) \
    { N##4 v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
#define KVEMU_MAKES(T, N) KVEMU_MAKE1(T, N) KVEMU_MAKE2(T, N) KVEMU_MAKE3(T, N) KVEMU_MAKE4(T, N)

KVEMU_MAKES(signed char, char)
KVEMU_MAKES(unsigned char, uchar)
KVEMU_MAKES(short, short)
KVEMU_MAKES(unsigned short, ushort)
KVEMU_MAKES(int, int)
KVEMU_MAKES(unsigned int, uint)
KVEMU_MAKES(float, float)
KVEMU_MAKE1(long long, longlong) KVEMU_MAKE2(long long, longlong) KVEMU_MAKE3(long long, longlong)
KVEMU_MAKE1(unsigned long long, ulonglong) KVEMU_MAKE2(unsigned long long, ulonglong)
KVEMU_MAKE3(unsigned long long, ulonglong)
KVEMU_MAKE1(double, double) KVEMU_MAKE2(double, double) KVEMU_MAKE3(double, double)

/** Grid and block sizes; unspecified components are 1, as in CUDA. */
#ifdef __cplusplus
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
#else
typedef struct dim3 { unsigned int x, y, z; } dim3;
#endif

#endif
