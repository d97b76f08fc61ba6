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
#include "kv_test.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <string.h>

struct cvt_case {
    float in;
    unsigned short half, bf16;
    unsigned char e4m3, e5m2;
    const char *what;
};

static const cvt_case cases[] = {
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
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

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
    const int n = N_CASES + 1; /* + a NaN */
    float in[N_CASES + 1], back[4 * (N_CASES + 1)];
    unsigned short h16[N_CASES + 1], b16[N_CASES + 1];
    unsigned char f8a[N_CASES + 1], f8b[N_CASES + 1];
    for (int i = 0; i < N_CASES; i++) in[i] = cases[i].in;
    in[N_CASES] = NAN;

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

    for (int i = 0; i < N_CASES; i++) {
        const cvt_case *c = &cases[i];
        KV_CHECK(h16[i] == c->half, "%s (%a): half 0x%04x, want 0x%04x", c->what, c->in, h16[i], c->half);
        KV_CHECK(b16[i] == c->bf16, "%s (%a): bf16 0x%04x, want 0x%04x", c->what, c->in, b16[i], c->bf16);
        KV_CHECK(f8a[i] == c->e4m3, "%s (%a): e4m3 0x%02x, want 0x%02x", c->what, c->in, f8a[i], c->e4m3);
        KV_CHECK(f8b[i] == c->e5m2, "%s (%a): e5m2 0x%02x, want 0x%02x", c->what, c->in, f8b[i], c->e5m2);
        KV_CHECK(same(back[4 * i + 0], from_bits16(c->half, 0)) && same(back[4 * i + 1], from_bits16(c->bf16, 1)) &&
                     same(back[4 * i + 2], from_fp8(c->e4m3, 0)) && same(back[4 * i + 3], from_fp8(c->e5m2, 1)),
                 "%s: conversion back to float", c->what);
    }
    KV_CHECK(h16[N_CASES] == 0x7fff, "NaN -> half 0x%04x, want 0x7fff", h16[N_CASES]);
    KV_CHECK(b16[N_CASES] == 0x7fff, "NaN -> bf16 0x%04x, want 0x7fff", b16[N_CASES]);
    KV_CHECK(f8a[N_CASES] == 0x7f, "NaN -> e4m3 0x%02x, want 0x7f", f8a[N_CASES]);
    KV_CHECK(f8b[N_CASES] == 0x7f, "NaN -> e5m2 0x%02x, want 0x7f", f8b[N_CASES]);
    KV_CHECK(isnan(back[4 * N_CASES]) && isnan(back[4 * N_CASES + 2]), "NaN survives the round trip");

    /* without saturation, out-of-range values become NaN (E4M3) or infinity (E5M2) */
    KV_CHECK(__nv_cvt_float_to_fp8(480.0f, __NV_NOSAT, __NV_E4M3) == 0x7f, "no-sat e4m3 overflow");
    KV_CHECK(__nv_cvt_float_to_fp8(-INFINITY, __NV_NOSAT, __NV_E5M2) == 0xfc, "no-sat e5m2 -inf");
    KV_CHECK(__nv_cvt_float_to_fp8(61440.0f, __NV_NOSAT, __NV_E5M2) == 0x7c, "no-sat e5m2 tie to inf");

    cudaFree(din); cudaFree(dback); cudaFree(dh); cudaFree(db); cudaFree(da); cudaFree(de);
    return kv_test_finish();
}
