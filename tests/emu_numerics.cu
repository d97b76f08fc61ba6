/*
 * emu_numerics.cu: float -> half / bfloat16 / fp8 conversions on their edge cases.
 *
 * Each case is an input and the bit pattern the format's definition gives for it: round to
 * nearest, ties to even; half overflows to infinity from 65520 up; bfloat16 keeps the float's
 * top 16 bits after rounding; fp8 E4M3 (max 448) and E5M2 (max 57344) saturate to the largest
 * finite value under the conversion constructors (__NV_SATFINITE), infinities included; NaN
 * becomes the canonical NaN. The conversions run inside a kernel, so on a GPU this is the
 * device's own cvt instruction being checked against the same table.
 */
#include "kv_cuda.cuh"
#include "common/kv_golden_cvt.h"
#include "common/kv_test.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <string.h>


__global__ void convert_kernel(const float *in, unsigned short *half_out, unsigned short *bf16_out,
                               unsigned char *e4m3_out, unsigned char *e5m2_out, float *back,
                               int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    half_out[i] = __half_as_ushort(__float2half(x));
    bf16_out[i] = __bfloat16_as_ushort(__float2bfloat16(x));
    __nv_fp8_e4m3 a(x);
    __nv_fp8_e5m2 b(x);
    e4m3_out[i] = a.__x;
    e5m2_out[i] = b.__x;
    /* the way back is exact: each stored value converts to float without rounding */
    back[4 * i + 0] = __half2float(__float2half(x));
    back[4 * i + 1] = __bfloat162float(__float2bfloat16(x));
    back[4 * i + 2] = (float)a;
    back[4 * i + 3] = (float)b;
}

static float from_bits16(unsigned short h, int bf)
{
    if (bf) {
        unsigned u = (unsigned)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static float from_fp8(unsigned char b, int e5m2)
{
    int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, e = (b & 0x7f) >> mb, m = b & ((1 << mb) - 1);
    float v;
    if (!e5m2 && (b & 0x7f) == 0x7f) return NAN;
    if (e5m2 && e == 31) v = m ? NAN : INFINITY;
    else v = e == 0 ? ldexpf((float)m, 1 - bias - mb) : ldexpf((float)(m + (1 << mb)), e - bias - mb);
    return (b & 0x80) ? -v : v;
}

static int same(float a, float b) { return (isnan(a) && isnan(b)) || a == b; }

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }
    const int n = KV_GOLDEN_CVT_N + 1; /* + a NaN */
    float in[KV_GOLDEN_CVT_N + 1], back[4 * (KV_GOLDEN_CVT_N + 1)];
    unsigned short h16[KV_GOLDEN_CVT_N + 1], b16[KV_GOLDEN_CVT_N + 1];
    unsigned char f8a[KV_GOLDEN_CVT_N + 1], f8b[KV_GOLDEN_CVT_N + 1];
    for (int i = 0; i < KV_GOLDEN_CVT_N; i++) in[i] = kv_golden_cvt[i].in;
    in[KV_GOLDEN_CVT_N] = NAN;

    float *din, *dback;
    unsigned short *dh, *db;
    unsigned char *da, *de;
    if (cudaMalloc(&din, sizeof in) || cudaMalloc(&dback, sizeof back) || cudaMalloc(&dh, sizeof h16) ||
        cudaMalloc(&db, sizeof b16) || cudaMalloc(&da, sizeof f8a) || cudaMalloc(&de, sizeof f8b))
        return 1;
    cudaMemcpy(din, in, sizeof in, cudaMemcpyHostToDevice);
    KV_LAUNCH(convert_kernel, 1, 64, 0, 0, din, dh, db, da, de, dback, n);
    KV_CHECK(cudaGetLastError() == cudaSuccess, "launch");
    cudaMemcpy(h16, dh, sizeof h16, cudaMemcpyDeviceToHost);
    cudaMemcpy(b16, db, sizeof b16, cudaMemcpyDeviceToHost);
    cudaMemcpy(f8a, da, sizeof f8a, cudaMemcpyDeviceToHost);
    cudaMemcpy(f8b, de, sizeof f8b, cudaMemcpyDeviceToHost);
    cudaMemcpy(back, dback, sizeof back, cudaMemcpyDeviceToHost);

    for (int i = 0; i < KV_GOLDEN_CVT_N; i++) {
        const kv_cvt_case *c = &kv_golden_cvt[i];
        KV_CHECK(h16[i] == c->half, "%s (%a): half 0x%04x, want 0x%04x", c->what, c->in, h16[i], c->half);
        KV_CHECK(b16[i] == c->bf16, "%s (%a): bf16 0x%04x, want 0x%04x", c->what, c->in, b16[i], c->bf16);
        KV_CHECK(f8a[i] == c->e4m3, "%s (%a): e4m3 0x%02x, want 0x%02x", c->what, c->in, f8a[i], c->e4m3);
        KV_CHECK(f8b[i] == c->e5m2, "%s (%a): e5m2 0x%02x, want 0x%02x", c->what, c->in, f8b[i], c->e5m2);
        KV_CHECK(same(back[4 * i + 0], from_bits16(c->half, 0)) && same(back[4 * i + 1], from_bits16(c->bf16, 1)) &&
                     same(back[4 * i + 2], from_fp8(c->e4m3, 0)) && same(back[4 * i + 3], from_fp8(c->e5m2, 1)),
                 "%s: conversion back to float", c->what);
    }
    KV_CHECK(h16[KV_GOLDEN_CVT_N] == 0x7fff, "NaN -> half 0x%04x, want 0x7fff", h16[KV_GOLDEN_CVT_N]);
    KV_CHECK(b16[KV_GOLDEN_CVT_N] == 0x7fff, "NaN -> bf16 0x%04x, want 0x7fff", b16[KV_GOLDEN_CVT_N]);
    KV_CHECK(f8a[KV_GOLDEN_CVT_N] == 0x7f, "NaN -> e4m3 0x%02x, want 0x7f", f8a[KV_GOLDEN_CVT_N]);
    KV_CHECK(f8b[KV_GOLDEN_CVT_N] == 0x7f, "NaN -> e5m2 0x%02x, want 0x7f", f8b[KV_GOLDEN_CVT_N]);
    KV_CHECK(isnan(back[4 * KV_GOLDEN_CVT_N]) && isnan(back[4 * KV_GOLDEN_CVT_N + 2]), "NaN survives the round trip");

    /* without saturation, out-of-range values become NaN (E4M3) or infinity (E5M2) */
    KV_CHECK(__nv_cvt_float_to_fp8(480.0f, __NV_NOSAT, __NV_E4M3) == 0x7f, "no-sat e4m3 overflow");
    KV_CHECK(__nv_cvt_float_to_fp8(-INFINITY, __NV_NOSAT, __NV_E5M2) == 0xfc, "no-sat e5m2 -inf");
    KV_CHECK(__nv_cvt_float_to_fp8(61440.0f, __NV_NOSAT, __NV_E5M2) == 0x7c, "no-sat e5m2 tie to inf");

    cudaFree(din); cudaFree(dback); cudaFree(dh); cudaFree(db); cudaFree(da); cudaFree(de);
    return kv_test_finish();
}
