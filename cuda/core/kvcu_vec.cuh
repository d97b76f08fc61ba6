/**
 * @file kvcu_vec.cuh
 * 16-byte memory operations and the conversions of 16 bytes of a stored row to floats: what
 * a bandwidth-bound kernel (the engine's decode, cuda/attention/kvcu_decode.cu) reads with.
 *
 *   kvcu_ld16(p)        one read-only 16-byte load, `ld.global.nc.v4.u32` (an __ldg of a
 *                       uint4): p must be 16-byte aligned, or the GPU faults. The cache's rows
 *                       are, when a row is a multiple of 16 bytes (kv_cache.c, KV_CACHE_ALIGN).
 *   kvcu_cp16(s, g)     `cp.async` (sm_80+) of 16 bytes from global g to shared s, both
 *                       16-byte aligned; kvcu_cp_commit() closes the thread's copies into a
 *                       batch, kvcu_cp_wait<N>() waits until at most N batches are in flight.
 *                       The copies of a batch are only visible to the thread that waited:
 *                       a __syncthreads() must follow before other threads read them.
 *   kvcu_unpack<K>()    the 16 bytes as kvcu_vec_elems(K) floats of element kind K (the
 *                       storage formats' elements, kv_quant_math.h; the cache layer maps a
 *                       format to its kind, this header sits below it): fp32 as is,
 *                       fp16 by pairs (__half22float2), bf16 pairs by a shift and a mask, fp8 by
 *                       pairs to half2 (cvt.rn.f16x2.e4m3x2 on sm_89+, cuda_fp8.h's software
 *                       path below), int8 by PRMT into the mantissa of 2^23 and one subtraction
 *                       (no integer-to-float conversion). The caller applies the scale.
 *
 * In the emulation build (cuda/emu/) the same calls check what the GPU would: a misaligned
 * kvcu_ld16() or kvcu_cp16() aborts with the address (kvemu_memops.h), and cp.async copies
 * land only at the wait that covers them, the destination reading 0xff bytes before.
 */
#ifndef KVCU_VEC_CUH
#define KVCU_VEC_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline.h>
#include <stdint.h>
#include <string.h>

#include "kv_cuda.cuh"

#ifdef KV_CUDA_EMULATION
#include "kvemu_memops.h"
#define KVCU_VEC_UNROLL _Pragma("GCC unroll 16")
#else
#define KVCU_VEC_UNROLL _Pragma("unroll")
#endif

__device__ __forceinline__ uint4 kvcu_ld16(const void *p)
{
#ifdef KV_CUDA_EMULATION
    kvemu_check_align(p, 16, "16-byte load ld.global.nc.v4");
    uint4 v;
    memcpy(&v, p, 16);
    return v;
#else
    return __ldg((const uint4 *)p);
#endif
}

__device__ __forceinline__ void kvcu_cp16(void *smem, const void *gmem)
{
    __pipeline_memcpy_async(smem, gmem, 16);
}
__device__ __forceinline__ void kvcu_cp_commit() { __pipeline_commit(); }
template <int N>
__device__ __forceinline__ void kvcu_cp_wait() { __pipeline_wait_prior(N); }

/* The kinds of 16 bytes kvcu_unpack() converts, and the elements each holds. */
enum { KVCU_V_F32, KVCU_V_F16, KVCU_V_BF16, KVCU_V_E4M3, KVCU_V_E5M2, KVCU_V_I8 };
__host__ __device__ constexpr int kvcu_vec_elems(int k)
{
    return k == KVCU_V_F32 ? 4 : (k == KVCU_V_F16 || k == KVCU_V_BF16) ? 8 : 16;
}

__device__ __forceinline__ float2 kvcu_h2f2(unsigned w)
{
    __half2 h;
    memcpy(&h, &w, 4);
    return __half22float2(h);
}
/* bf16 is a float's top half: a pair is a shift and a mask, exact (NaNs keep their payload) */
__device__ __forceinline__ float2 kvcu_bf2f2(unsigned w)
{
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <int K>
__device__ __forceinline__ float2 kvcu_fp8x2(unsigned short w)
{
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)w, K == KVCU_V_E5M2 ? __NV_E5M2 : __NV_E4M3);
    __half2 h;
    memcpy(&h, &r, 4);
    return __half22float2(h);
}
/* The signed byte i of w (codes biased by 0x80 first) as a float: 0x4B00_00bb is 2^23 + bb. */
__device__ __forceinline__ float kvcu_i8(unsigned biased, int i)
{
    return __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7540u + (unsigned)i)) -
           8388736.0f; /* 2^23 + 128 */
}

template <int K>
__device__ __forceinline__ void kvcu_unpack(const uint4 &raw, float *x)
{
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
    KVCU_VEC_UNROLL
    for (int k = 0; k < 4; k++) {
        if (K == KVCU_V_F32) {
            x[k] = __uint_as_float(w[k]);
        } else if (K == KVCU_V_F16 || K == KVCU_V_BF16) {
            const float2 f = K == KVCU_V_F16 ? kvcu_h2f2(w[k]) : kvcu_bf2f2(w[k]);
            x[2 * k] = f.x;
            x[2 * k + 1] = f.y;
        } else if (K == KVCU_V_E4M3 || K == KVCU_V_E5M2) {
            const float2 lo = kvcu_fp8x2<K>((unsigned short)(w[k] & 0xffffu));
            const float2 hi = kvcu_fp8x2<K>((unsigned short)(w[k] >> 16));
            x[4 * k] = lo.x;
            x[4 * k + 1] = lo.y;
            x[4 * k + 2] = hi.x;
            x[4 * k + 3] = hi.y;
        } else { /* int8: two's complement codes, biased to unsigned */
            const unsigned b = w[k] ^ 0x80808080u;
            x[4 * k] = kvcu_i8(b, 0);
            x[4 * k + 1] = kvcu_i8(b, 1);
            x[4 * k + 2] = kvcu_i8(b, 2);
            x[4 * k + 3] = kvcu_i8(b, 3);
        }
    }
}

#endif
