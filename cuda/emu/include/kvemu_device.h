/**
 * @file kvemu_device.h
 * Device built-ins for the emulation build (C++ only; included by cuda_runtime.h).
 *
 * threadIdx, blockIdx, blockDim and gridDim are per-OS-thread variables that the scheduler
 * rewrites at every fiber switch, so each fiber reads its own values. __syncthreads() and the
 * warp operations are rendezvous points: the fiber parks there and the scheduler runs the
 * others; a warp operation's results are computed once every lane named in its mask has
 * arrived. Atomics are real atomics, because blocks run on different OS threads.
 */
#ifndef KVEMU_DEVICE_H
#define KVEMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define KVEMU_TLS __attribute__((tls_model("initial-exec")))

extern __thread uint3 threadIdx KVEMU_TLS;
extern __thread uint3 blockIdx KVEMU_TLS;
extern __thread uint3 blockDim KVEMU_TLS;
extern __thread uint3 gridDim KVEMU_TLS;
static const int warpSize = 32;

/* ---- the scheduler's entry points (cuda/emu/block.cpp) ------------------------------------ */
enum {
    KVEMU_BAR_SYNC = 0, KVEMU_BAR_COUNT, KVEMU_BAR_AND, KVEMU_BAR_OR
};
enum {
    KVEMU_W_SYNC = 0, KVEMU_W_IDX, KVEMU_W_UP, KVEMU_W_DOWN, KVEMU_W_XOR, KVEMU_W_BALLOT,
    KVEMU_W_ANY, KVEMU_W_ALL, KVEMU_W_ADD, KVEMU_W_MIN_U, KVEMU_W_MAX_U, KVEMU_W_MIN_I,
    KVEMU_W_MAX_I, KVEMU_W_AND, KVEMU_W_OR, KVEMU_W_XOR_R, KVEMU_W_NOPS
};
extern "C" int kvemu_barrier(int kind, int pred, const char *file, int line);
extern "C" uint64_t kvemu_warp(int op, unsigned mask, uint64_t value, int arg, int width);
extern "C" unsigned kvemu_activemask(void);

/* ---- block-wide barriers (the call site names the barrier, for deadlock reports) ---------- */
#define __syncthreads() ((void)kvemu_barrier(KVEMU_BAR_SYNC, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) kvemu_barrier(KVEMU_BAR_COUNT, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) kvemu_barrier(KVEMU_BAR_AND, (p) != 0, __FILE__, __LINE__)
#define __syncthreads_or(p) kvemu_barrier(KVEMU_BAR_OR, (p) != 0, __FILE__, __LINE__)

/* ---- warp operations ------------------------------------------------------------------- */
template <class T>
inline uint64_t kvemu_bits(T v)
{
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
inline T kvemu_from_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { kvemu_warp(KVEMU_W_SYNC, mask, 0, 0, 32); }
template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32)
{
    return kvemu_from_bits<T>(kvemu_warp(KVEMU_W_IDX, mask, kvemu_bits(var), srcLane, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    return kvemu_from_bits<T>(kvemu_warp(KVEMU_W_UP, mask, kvemu_bits(var), (int)delta, width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    return kvemu_from_bits<T>(kvemu_warp(KVEMU_W_DOWN, mask, kvemu_bits(var), (int)delta, width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32)
{
    return kvemu_from_bits<T>(kvemu_warp(KVEMU_W_XOR, mask, kvemu_bits(var), laneMask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return (unsigned)kvemu_warp(KVEMU_W_BALLOT, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred) { return (int)kvemu_warp(KVEMU_W_ANY, mask, pred != 0, 0, 32); }
inline int __all_sync(unsigned mask, int pred) { return (int)kvemu_warp(KVEMU_W_ALL, mask, pred != 0, 0, 32); }
/** Lanes of the calling warp that have not exited (the emulator does not model divergence). */
inline unsigned __activemask(void) { return kvemu_activemask(); }
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) { return (unsigned)kvemu_warp(KVEMU_W_ADD, mask, v, 0, 32); }
inline int __reduce_add_sync(unsigned mask, int v) { return (int)kvemu_warp(KVEMU_W_ADD, mask, (unsigned)v, 0, 32); }
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) { return (unsigned)kvemu_warp(KVEMU_W_MIN_U, mask, v, 0, 32); }
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) { return (unsigned)kvemu_warp(KVEMU_W_MAX_U, mask, v, 0, 32); }
inline int __reduce_min_sync(unsigned mask, int v) { return (int)kvemu_warp(KVEMU_W_MIN_I, mask, (uint32_t)v, 0, 32); }
inline int __reduce_max_sync(unsigned mask, int v) { return (int)kvemu_warp(KVEMU_W_MAX_I, mask, (uint32_t)v, 0, 32); }
inline unsigned __reduce_and_sync(unsigned mask, unsigned v) { return (unsigned)kvemu_warp(KVEMU_W_AND, mask, v, 0, 32); }
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) { return (unsigned)kvemu_warp(KVEMU_W_OR, mask, v, 0, 32); }
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v) { return (unsigned)kvemu_warp(KVEMU_W_XOR_R, mask, v, 0, 32); }

/* ---- memory fences and atomics (sequentially consistent: blocks are OS threads) ---------- */
inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#define KVEMU_ATOMIC_INT(T)                                                                    \
    inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }      \
    inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }      \
    inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }    \
    inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }      \
    inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }        \
    inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }      \
    inline T atomicCAS(T *p, T cmp, T v)                                                      \
    {                                                                                         \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
        return cmp;                                                                           \
    }                                                                                         \
    inline T atomicMax(T *p, T v)                                                             \
    {                                                                                         \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                         \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST,    \
                                                       __ATOMIC_SEQ_CST)) {}                  \
        return old;                                                                           \
    }                                                                                         \
    inline T atomicMin(T *p, T v)                                                             \
    {                                                                                         \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                         \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST,    \
                                                       __ATOMIC_SEQ_CST)) {}                  \
        return old;                                                                           \
    }
KVEMU_ATOMIC_INT(int)
KVEMU_ATOMIC_INT(unsigned int)
KVEMU_ATOMIC_INT(unsigned long long)
KVEMU_ATOMIC_INT(long long)
#undef KVEMU_ATOMIC_INT

/* Floating-point atomics: compare-and-swap on the bit pattern until no other thread intervened. */
#define KVEMU_ATOMIC_FP(T, U)                                                                  \
    inline T atomicAdd(T *p, T v)                                                             \
    {                                                                                         \
        U *q = (U *)p, old = __atomic_load_n(q, __ATOMIC_SEQ_CST), upd;                       \
        do {                                                                                  \
            T cur, sum;                                                                       \
            memcpy(&cur, &old, sizeof(T));                                                    \
            sum = cur + v;                                                                    \
            memcpy(&upd, &sum, sizeof(T));                                                    \
        } while (!__atomic_compare_exchange_n(q, &old, upd, true, __ATOMIC_SEQ_CST,           \
                                              __ATOMIC_SEQ_CST));                             \
        T r;                                                                                  \
        memcpy(&r, &old, sizeof(T));                                                          \
        return r;                                                                             \
    }                                                                                         \
    inline T atomicExch(T *p, T v)                                                            \
    {                                                                                         \
        U b, r;                                                                               \
        memcpy(&b, &v, sizeof(T));                                                            \
        r = __atomic_exchange_n((U *)p, b, __ATOMIC_SEQ_CST);                                 \
        T out;                                                                                \
        memcpy(&out, &r, sizeof(T));                                                          \
        return out;                                                                           \
    }
KVEMU_ATOMIC_FP(float, uint32_t)
KVEMU_ATOMIC_FP(double, uint64_t)
#undef KVEMU_ATOMIC_FP
inline unsigned atomicInc(unsigned *p, unsigned limit)
{
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST), upd;
    do {
        upd = old >= limit ? 0u : old + 1u;
    } while (!__atomic_compare_exchange_n(p, &old, upd, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
inline unsigned atomicDec(unsigned *p, unsigned limit)
{
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST), upd;
    do {
        upd = (old == 0u || old > limit) ? limit : old - 1u;
    } while (!__atomic_compare_exchange_n(p, &old, upd, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd

/* ---- loads with cache hints: plain loads here ------------------------------------------ */
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcg(const T *p) { return *p; }
template <class T> inline T __ldca(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
template <class T> inline T __ldlu(const T *p) { return *p; }
template <class T> inline T __ldcv(const T *p) { return *p; }
template <class T> inline void __stcg(T *p, T v) { *p = v; }
template <class T> inline void __stcs(T *p, T v) { *p = v; }
template <class T> inline void __stwb(T *p, T v) { *p = v; }
template <class T> inline void __stwt(T *p, T v) { *p = v; }

inline long long clock64(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
inline void __nanosleep(unsigned) {}
inline void __trap(void) { __builtin_trap(); }

/* ---- integer intrinsics ---------------------------------------------------------------- */
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
    __extension__ typedef unsigned __int128 u128;
    return (unsigned long long)(((u128)a * b) >> 64);
}

/* ---- float intrinsics: the fast device forms are the precise host ones here ------------- */
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
/* PRMT: byte n of the result is byte (s >> 4n) & 7 of the pair {y, x} (x is bytes 0-3), or,
 * with bit 3 of that nibble set, that byte's sign bit replicated. */
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const uint64_t xy = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) {
        const unsigned sel = (s >> (4 * n)) & 15u;
        unsigned b = (unsigned)(xy >> (8 * (sel & 7u))) & 0xffu;
        if (sel & 8u) b = (b & 0x80u) ? 0xffu : 0u;
        r |= b << (8 * n);
    }
    return r;
}
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float *s, float *c) { *s = sinf(x); *c = cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline int __double2int_rn(double x) { return (int)nearbyint(x); }

/* ---- min / max: the device overload set (mixed signedness goes unsigned, as in CUDA) ---- */
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long min(long a, unsigned long b) { return min((unsigned long)a, b); }
inline unsigned long min(unsigned long a, long b) { return min(a, (unsigned long)b); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long min(long long a, unsigned long long b) { return min((unsigned long long)a, b); }
inline unsigned long long min(unsigned long long a, long long b) { return min(a, (unsigned long long)b); }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double min(float a, double b) { return fmin((double)a, b); }
inline double min(double a, float b) { return fmin(a, (double)b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline unsigned long max(long a, unsigned long b) { return max((unsigned long)a, b); }
inline unsigned long max(unsigned long a, long b) { return max(a, (unsigned long)b); }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long long max(long long a, unsigned long long b) { return max((unsigned long long)a, b); }
inline unsigned long long max(unsigned long long a, long long b) { return max(a, (unsigned long long)b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double max(float a, double b) { return fmax((double)a, b); }
inline double max(double a, float b) { return fmax(a, (double)b); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

#endif
