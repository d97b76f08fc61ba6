/*
 * The device side of reference_cpu/cache/kv_quant_math.h: how one element of a float format
 * and one group of an integer format are encoded, written once for every kernel that stores
 * codes (kvcu_quant.cu's encoders, kvcu_cache_codec.cu's cache writes). The integer formats
 * round through kv_quant_math.h's own lines, the float formats through the device's
 * conversions (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h: round to nearest even, fp8 saturating),
 * which the CPU's software conversions match bit for bit.
 */
#ifndef KVCU_QUANT_MATH_CUH
#define KVCU_QUANT_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kvcu_internal.cuh"

/* Element i of a KVQ_ELEM buffer (fp32, fp16, bf16, fp8; fp8 divided by its scale first) from
 * v: the device's native conversions where it has them, else kv_quant_math.h's. */
__device__ inline void kvcu_encode_float(int fmt, uint8_t *codes, int64_t i, float v, float scale)
{
    switch (fmt) {
    case KV_QF_F32: ((float *)codes)[i] = v; break;
    case KV_QF_F16: ((unsigned short *)codes)[i] = __half_as_ushort(__float2half_rn(v)); break;
    case KV_QF_BF16:
        ((unsigned short *)codes)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
        break;
    case KV_QF_FP8_E4M3: codes[i] = __nv_fp8_e4m3(__fdiv_rn(v, scale)).__x; break;
    case KV_QF_FP8_E5M2: codes[i] = __nv_fp8_e5m2(__fdiv_rn(v, scale)).__x; break;
    default: kvq_elem_encode(fmt, codes, i, v, scale); /* no native conversion: the CPU's lines */
    }
}

/* One warp encodes one group of g values of an integer format (int8, int8-gG, int4-g32:
 * symmetric, a float scale; KIVI: asymmetric, fp16 scale and zero): element i is
 * xg[i * stride], its code goes to q[i * qstride] one per byte (int4-g32: its nibble, packed
 * by the caller), lane l takes i = l, l + 32, ... Two passes over
 * the group (the second read hits the cache): reduce to amax or min/max, then code. Lane 0
 * writes the metadata. A group holding NaN, inf or (KIVI) a value past fp16 gets the
 * poison metadata and zero codes, as on the CPU. */
__device__ inline void kvcu_encode_group(int fmt, const float *xg, int stride, int g, void *meta,
                                         uint8_t *q, int qstride)
{
    const int lane = threadIdx.x % KV_WARP, bits = kvq_code_bits(fmt);
    const float limit = kvq_is_kivi(fmt) ? KV_F16_MAX : 3.40282347e38f; /* KIVI: fp16 meta */
    float amax = 0.0f, mn = INFINITY, mx = -INFINITY, bad = 0.0f;
    for (int i = lane; i < g; i += KV_WARP) {
        const float v = xg[i * stride];
        bad = fmaxf(bad, fabsf(v) <= limit ? 0.0f : 1.0f); /* NaN, inf, out of range */
        amax = fmaxf(amax, fabsf(v));
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    }
    bad = kv_warp_max(bad); /* every lane reaches the shuffles: the loop sits before them */
    if (kvq_is_sym(fmt)) {
        amax = kv_warp_max(amax);
        const float s = bad > 0.0f ? kvq_bits_f32(KVQ_F32_NAN)
                        : bits == 8 ? kvq_int8_scale(amax) : kvq_int4_scale(amax);
        if (lane == 0) *(float *)meta = s;
        for (int i = lane; i < g; i += KV_WARP)
            q[i * qstride] = bad > 0.0f ? 0
                             : bits == 8 ? (uint8_t)kvq_int8_encode(xg[i * stride], s)
                                         : kvq_int4_encode(xg[i * stride], s);
    } else {
        mn = -kv_warp_max(-mn);
        mx = kv_warp_max(mx);
        const kv_qsz p = bad > 0.0f ? kvq_asym_poison() : kvq_asym_params(mn, mx, bits);
        if (lane == 0) *(kv_qsz *)meta = p;
        const float scale = kvq_f16_to_f32(p.scale), zero = kvq_f16_to_f32(p.zero);
        for (int i = lane; i < g; i += KV_WARP)
            q[i * qstride] = bad > 0.0f ? 0 : kvq_asym_encode(xg[i * stride], scale, zero, bits);
    }
}

#endif
