/**
 * @file kvcu_flash_tile.cuh
 * How chapter 08's tensor-core kernels (v5, kvcu_flash_mma.cu; v6, kvcu_flash_v6.cu) fill a
 * K and a V tile: nk keys of one KV head as rows of 16-bit floats in shared memory, [keys][ld]
 * with ld = d + 8 halves (16-byte aligned rows; ldmatrix's 8 row addresses fall in 8 different
 * bank groups), zeros in the rows past nk. Three ways in:
 *
 *  - flash_tile_copy(): the cache's rows already are the tile's type (an fp16 cache, or bf16):
 *    d / 8 cp.async copies of 16 bytes per row, straight into shared memory (one commit closes
 *    the tile's batch; kvcu_cp_wait() and a barrier before use);
 *  - flash_tile_dequant(): any format, element by element through kv_ld() (the chapter-04
 *    decoder, scale included), each value rounded to the tile's type;
 *  - flash_tile_convert<C>() (v6): per-token int8 or fp8 rows, 16 codes per 16-byte load,
 *    converted to fp16 exactly (every int8 and every fp8 value is an fp16; kvcu_i8x4_f16(),
 *    kvcu_e4m3x2_f16(), kvcu_e5m2x4_f16() in cuda/core/kvcu_mma.cuh): the scales stay
 *    out of the tile, per key in kscale / vscale (int8: the rows' scales) or per head (fp8:
 *    the view's scale), applied by the kernel in fp32.
 */
#ifndef KVCU_FLASH_TILE_CUH
#define KVCU_FLASH_TILE_CUH

#include "kvcu_flash.cuh"
#include "kvcu_mma.cuh"
#include "kvcu_vec.cuh"

#define FLASH_TILE_PAD 8 /* halves after each tile row */

/* The converting kinds of flash_tile_convert(): per-token int8 (a row's one scale), fp8. */
enum { FLASH_CONV_I8 = 1, FLASH_CONV_E4M3, FLASH_CONV_E5M2 };

/* Keys [kt, kt + nk) of @p kv into a K and a V tile of KT rows, dequantized element by element. */
template <int BF16>
__device__ inline void flash_tile_dequant(const flash_kv &kv, uint16_t *ks, uint16_t *vs, int d,
                                          int KT, int64_t kt, int nk)
{
    const int ld = d + FLASH_TILE_PAD;
    for (int e = threadIdx.x; e < KT * d; e += blockDim.x) {
        const int j = e / d, i = e % d;
        float kx = 0.0f, vx = 0.0f;
        if (j < nk) {
            const int64_t p = kt + j;
            kx = kv_ld(kv.kh, kv.kf, p, kv_view_row(&kv.kh, p), i);
            vx = kv_ld(kv.vh, kv.vf, p, kv_view_row(&kv.vh, p), i);
        }
        ks[j * ld + i] = kvcu_bits16<BF16>(kx);
        vs[j * ld + i] = kvcu_bits16<BF16>(vx);
    }
}

/* The same tiles copied raw: 16-bit rows of the tile's type, 2d bytes each (16-byte aligned). */
__device__ inline void flash_tile_copy(const flash_kv &kv, uint16_t *ks, uint16_t *vs, int d,
                                       int KT, int64_t kt, int nk)
{
    const int ld = d + FLASH_TILE_PAD, cpr = d / 8; /* 16-byte chunks per row */
    const size_t rb = (size_t)d * 2;
    for (int c = threadIdx.x; c < KT * cpr; c += blockDim.x) {
        const int j = c / cpr, ch = c % cpr;
        uint16_t *kd = ks + j * ld + ch * 8, *vd = vs + j * ld + ch * 8;
        if (j < nk) {
            const int64_t p = kt + j;
            kvcu_cp16(kd, kv.kh.codes + kv_view_row(&kv.kh, p) * rb + ch * 16);
            kvcu_cp16(vd, kv.vh.codes + kv_view_row(&kv.vh, p) * rb + ch * 16);
        } else {
            *(uint4 *)(void *)kd = make_uint4(0, 0, 0, 0);
            *(uint4 *)(void *)vd = make_uint4(0, 0, 0, 0);
        }
    }
    kvcu_cp_commit();
}

/* 16 codes (one 16-byte load) of kind C as 16 fp16 values, element i in half i of out. */
template <int C>
__device__ inline void flash_codes_f16(const uint4 &raw, uint4 out[2])
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t h[8];
    KV_UNROLL
    for (int k = 0; k < 4; k++) {
        if (C == FLASH_CONV_I8) {
            kvcu_i8x4_f16(w[k], h + 2 * k);
        } else if (C == FLASH_CONV_E5M2) {
            kvcu_e5m2x4_f16(w[k], h + 2 * k);
        } else {
            h[2 * k] = kvcu_e4m3x2_f16((uint16_t)(w[k] & 0xffffu));
            h[2 * k + 1] = kvcu_e4m3x2_f16((uint16_t)(w[k] >> 16));
        }
    }
    out[0] = make_uint4(h[0], h[1], h[2], h[3]);
    out[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

/* Keys [kt, kt + nk) of a per-token int8 or an fp8 layer into fp16 tiles of KT rows, each
 * row converted once (d / 16 loads of 16 codes), and, for int8, each key's K and V row scale
 * into kscale[KT], vscale[KT] (0 past nk). The rows are d bytes, 16-byte aligned. */
template <int C>
__device__ inline void flash_tile_convert(const flash_kv &kv, uint16_t *ks, uint16_t *vs,
                                          float *kscale, float *vscale, int d, int KT,
                                          int64_t kt, int nk)
{
    const int ld = d + FLASH_TILE_PAD, cpr = d / 16; /* 16-byte chunks (16 codes) per row */
    for (int c = threadIdx.x; c < KT * cpr; c += blockDim.x) {
        const int j = c / cpr, ch = c % cpr;
        uint4 kh[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)}, vh[2] = {kh[0], kh[0]};
        if (j < nk) {
            const int64_t p = kt + j;
            flash_codes_f16<C>(kvcu_ld16(kv.kh.codes + kv_view_row(&kv.kh, p) * d + ch * 16), kh);
            flash_codes_f16<C>(kvcu_ld16(kv.vh.codes + kv_view_row(&kv.vh, p) * d + ch * 16), vh);
        }
        uint4 *kd = (uint4 *)(void *)(ks + j * ld + ch * 16);
        uint4 *vd = (uint4 *)(void *)(vs + j * ld + ch * 16);
        kd[0] = kh[0];
        kd[1] = kh[1];
        vd[0] = vh[0];
        vd[1] = vh[1];
    }
    if (C == FLASH_CONV_I8)
        for (int j = threadIdx.x; j < KT; j += blockDim.x) {
            const int64_t p = kt + j;
            kscale[j] = j < nk ? ((const float *)kv.kh.meta)[kv_view_row(&kv.kh, p)] : 0.0f;
            vscale[j] = j < nk ? ((const float *)kv.vh.meta)[kv_view_row(&kv.vh, p)] : 0.0f;
        }
}

/* Host side: whether a layer's K/V rows can be copied raw into 16-bit tiles (stored as fp16
 * or bf16, not rotated at attention, the planes 16-byte aligned). */
static inline int flash_tile_raw(const attn_src &src)
{
    return (src.fmt == KV_QF_F16 || src.fmt == KV_QF_BF16) && !src.rope_cs &&
           ((uintptr_t)src.kp.codes | (uintptr_t)src.vp.codes) % 16 == 0;
}

/* Host side: the converting kind of a layer of head dim d (flash_tile_convert()), 0 where it
 * has none: int8 with one scale per row of d (KV_QF_INT8, or a group as long as the row), fp8
 * E4M3 or E5M2 with the view's scale; 16-byte aligned planes, d a multiple of 16. */
static inline int flash_tile_conv_kind(const attn_src &src, int d)
{
    if (src.rope_cs || d % 16 || ((uintptr_t)src.kp.codes | (uintptr_t)src.vp.codes) % 16)
        return 0;
    if (kvq_is_int8(src.fmt) && kvq_row_group(src.fmt, KV_QROLE_KEY, d) == d)
        return FLASH_CONV_I8;
    if (src.fmt == KV_QF_FP8_E4M3) return FLASH_CONV_E4M3;
    if (src.fmt == KV_QF_FP8_E5M2) return FLASH_CONV_E5M2;
    return 0;
}

#endif
