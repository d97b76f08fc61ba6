/*
 * emu_mma.cu: the tensor-core helpers of cuda/core/kvcu_mma.cuh, element by element.
 *
 * ldmatrix (.x1/.x2/.x4, plain and .trans) over a matrix of distinct values, with each lane
 * pointing at a scrambled row, against the PTX ISA's rule for which lane receives which
 * element; then one m16n8k16 product, fp16 and bf16, fragments loaded by ldmatrix (A row
 * major, B both as Kᵀ rows and as V rows with .trans), against a plain loop in double within
 * the bound below; and the same product with two A registers swapped, which must fail it,
 * showing that a wrong fragment index is caught (in emulation too, where each lane reads the
 * others' registers where the ISA puts them). Then the one-byte codes' conversions to fp16
 * operands (kvcu_i8x4_f16()'s magic number, kvcu_e4m3x2_f16()'s cvt.rn.f16x2.e4m3x2,
 * kvcu_e5m2x4_f16()'s byte placement) for every code in every position, against the formats'
 * definitions decoded here from the bits. A CUDA program: it checks a GPU the same way.
 */
#include "kv_cuda.cuh"
#include "kvcu_mma.cuh"
#include "common/kv_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- ldmatrix ---------------------------------------------------------------------------- */

/* Lane l points at row perm(l) of the 32x8 matrix m (rows scrambled, so a lane's own address
 * is what counts); out [32 lanes][4 registers] as ldmatrix returns them, for .x<n>. */
__device__ inline int row_of_lane(int l) { return (l * 13 + 5) % 32; }

__global__ void ldmatrix_kernel(const uint16_t *m, uint32_t *out, int n, int trans)
{
    __shared__ __align__(16) uint16_t s[32 * 8];
    const int l = threadIdx.x;
    for (int i = 0; i < 8; i++) s[l * 8 + i] = m[l * 8 + i];
    __syncthreads();
    uint32_t r[4] = {0, 0, 0, 0};
    const void *row = s + row_of_lane(l) * 8;
    if (n == 1) trans ? kvcu_ldmatrix_x1_trans(r, row) : kvcu_ldmatrix_x1(r, row);
    if (n == 2) trans ? kvcu_ldmatrix_x2_trans(r, row) : kvcu_ldmatrix_x2(r, row);
    if (n == 4) trans ? kvcu_ldmatrix_x4_trans(r, row) : kvcu_ldmatrix_x4(r, row);
    for (int i = 0; i < 4; i++) out[l * 4 + i] = r[i];
}

static int host_row_of_lane(int l) { return (l * 13 + 5) % 32; }

static void check_ldmatrix(const uint16_t *dm, uint32_t *dout, const uint16_t *m)
{
    for (int n = 1; n <= 4; n *= 2)
        for (int trans = 0; trans < 2; trans++) {
            KV_LAUNCH(ldmatrix_kernel, 1, 32, 0, 0, dm, dout, n, trans);
            KV_CHECK(cudaGetLastError() == cudaSuccess, "ldmatrix x%d launch", n);
            uint32_t got[32 * 4];
            KV_CHECK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess,
                     "copy");
            int bad = 0;
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < 2; j++) {
                        /* matrix i's rows are those lanes 8i .. 8i+7 point at; lane l holds
                         * its element (l/4, 2(l%4)+j), or (2(l%4)+j, l/4) transposed */
                        const int rr = trans ? 2 * (l % 4) + j : l / 4;
                        const int cc = trans ? l / 4 : 2 * (l % 4) + j;
                        const uint16_t want = m[host_row_of_lane(8 * i + rr) * 8 + cc];
                        const uint16_t have = (uint16_t)(got[l * 4 + i] >> (16 * j));
                        if (have != want && bad++ < 3)
                            printf("  x%d%s lane %d reg %d half %d: got %u, want %u\n", n,
                                   trans ? ".trans" : "", l, i, j, have, want);
                    }
            KV_CHECK(bad == 0, "ldmatrix x%d%s: %d elements misplaced", n,
                     trans ? ".trans" : "", bad);
        }
}

/* ---- mma.sync m16n8k16 ------------------------------------------------------------------- */

/* D = A·B + C for A [16][16], B given as bt [8 n][16 k] (Kᵀ rows: S = Q·Kᵀ) and as bk
 * [16 k][8 n] (V rows, read with .trans), C [16][8]; a 16-bit copy of A and B is what the
 * product sees, written back rounded (ar, btr) for the host. d1 from bt, d2 from bk. swap:
 * exchange registers a[1] and a[2] (a deliberate fragment error). */
template <int BF16>
__global__ void mma_kernel(const float *A, const float *B, const float *C, float *ar, float *btr,
                           float *d1, float *d2, int swap)
{
    __shared__ __align__(16) uint16_t sa[16 * 16], sbt[8 * 16], sbk[16 * 8];
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    for (int e = l; e < 256; e += 32) sa[e] = kvcu_bits16<BF16>(A[e]);
    for (int e = l; e < 128; e += 32) {
        const int n = e / 16, k = e % 16;
        sbt[e] = kvcu_bits16<BF16>(B[e]);
        sbk[k * 8 + n] = sbt[e];
    }
    __syncthreads();
    for (int e = l; e < 256; e += 32) {
        const uint32_t h = sa[e];
        ar[e] = BF16 ? __bfloat162float(__ushort_as_bfloat16((unsigned short)h))
                     : __half2float(__ushort_as_half((unsigned short)h));
    }
    for (int e = l; e < 128; e += 32) {
        const uint32_t h = sbt[e];
        btr[e] = BF16 ? __bfloat162float(__ushort_as_bfloat16((unsigned short)h))
                      : __half2float(__ushort_as_half((unsigned short)h));
    }
    uint32_t a[4], b1[2], b2[2];
    kvcu_ldmatrix_x4(a, sa + (l % 16) * 16 + 8 * (l / 16)); /* lane -> row l%16, col 8(l/16) */
    kvcu_ldmatrix_x2(b1, sbt + (l % 8) * 16 + 8 * ((l / 8) % 2)); /* rows n, k halves */
    kvcu_ldmatrix_x2_trans(b2, sbk + (l % 16) * 8);               /* rows k 0..15 */
    if (swap) {
        const uint32_t x = a[1];
        a[1] = a[2];
        a[2] = x;
    }
    float c1[4], c2[4];
    for (int i = 0; i < 4; i++) c1[i] = c2[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + (i & 1)];
    kvcu_mma<BF16>(c1, a, b1);
    kvcu_mma<BF16>(c2, a, b2);
    for (int i = 0; i < 4; i++) {
        d1[(g + 8 * (i / 2)) * 8 + 2 * t + (i & 1)] = c1[i];
        d2[(g + 8 * (i / 2)) * 8 + 2 * t + (i & 1)] = c2[i];
    }
}

static float urand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Mismatches of d against A·B + C in double, bound 17·2^-23·(|c| + Σ|a·b|): the exact products
 * summed in fp32, one rounding (or truncation) of at most 2^-23 relative per addition. */
static int mma_errors(const float *ar, const float *btr, const float *C, const float *d, int quiet)
{
    int bad = 0;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = C[r * 8 + n], mag = fabs(C[r * 8 + n]);
            for (int k = 0; k < 16; k++) {
                s += (double)ar[r * 16 + k] * btr[n * 16 + k];
                mag += fabs((double)ar[r * 16 + k] * btr[n * 16 + k]);
            }
            const double bound = 17.0 * ldexp(1.0, -23) * mag;
            if (!(fabs(d[r * 8 + n] - s) <= bound)) {
                if (!quiet && bad < 3)
                    printf("  D[%d][%d] = %.9g, want %.9g (bound %.3g)\n", r, n, d[r * 8 + n], s,
                           bound);
                bad++;
            }
        }
    return bad;
}

template <int BF16>
static void check_mma(unsigned seed)
{
    float hA[256], hB[128], hC[128], ar[256], btr[128], d1[128], d2[128];
    for (int i = 0; i < 256; i++) hA[i] = urand(&seed) * (BF16 ? 100.0f : 2.0f);
    for (int i = 0; i < 128; i++) hB[i] = urand(&seed) * (BF16 ? 100.0f : 2.0f);
    for (int i = 0; i < 128; i++) hC[i] = urand(&seed);
    float *dA, *dB, *dC, *dar, *dbt, *dd1, *dd2;
    cudaMalloc(&dA, sizeof hA);
    cudaMalloc(&dB, sizeof hB);
    cudaMalloc(&dC, sizeof hC);
    cudaMalloc(&dar, sizeof ar);
    cudaMalloc(&dbt, sizeof btr);
    cudaMalloc(&dd1, sizeof d1);
    cudaMalloc(&dd2, sizeof d2);
    cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice);
    const char *ty = BF16 ? "bf16" : "fp16";
    for (int swap = 0; swap < 2; swap++) {
        KV_LAUNCH(mma_kernel<BF16>, 1, 32, 0, 0, dA, dB, dC, dar, dbt, dd1, dd2, swap);
        KV_CHECK(cudaGetLastError() == cudaSuccess, "%s mma launch", ty);
        cudaMemcpy(ar, dar, sizeof ar, cudaMemcpyDeviceToHost);
        cudaMemcpy(btr, dbt, sizeof btr, cudaMemcpyDeviceToHost);
        cudaMemcpy(d1, dd1, sizeof d1, cudaMemcpyDeviceToHost);
        KV_CHECK(cudaMemcpy(d2, dd2, sizeof d2, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
        const int e1 = mma_errors(ar, btr, hC, d1, swap), e2 = mma_errors(ar, btr, hC, d2, swap);
        if (!swap) {
            KV_CHECK(e1 == 0, "%s mma, B from Kᵀ rows: %d of 128 outside the bound", ty, e1);
            KV_CHECK(e2 == 0, "%s mma, B from V rows (.trans): %d of 128 outside the bound", ty,
                     e2);
        } else {
            /* a[1] (rows 8-15) and a[2] (columns 8-15) exchanged: most outputs change */
            KV_CHECK(e1 > 64, "%s mma with a[1], a[2] swapped: only %d of 128 wrong", ty, e1);
        }
    }
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dar);
    cudaFree(dbt);
    cudaFree(dd1);
    cudaFree(dd2);
}

/* ---- one-byte codes to fp16 operands ------------------------------------------------------ */

/* Thread i: e4m3 codes (i, i >> 8) -> out[i][0..1]; int8 codes, the bytes of w = i | (i ^ 0x5a5a)
 * << 16 -> out[i][2..5]; e5m2 codes, the bytes of the same w -> out[i][6..9]. */
__global__ void operand_kernel(float *out)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, w = i | (i ^ 0x5a5au) << 16;
    uint32_t h[5];
    h[0] = kvcu_e4m3x2_f16((uint16_t)i);
    kvcu_i8x4_f16(w, h + 1);
    kvcu_e5m2x4_f16(w, h + 3);
    for (int k = 0; k < 10; k++)
        out[(size_t)i * 10 + k] = __half2float(__ushort_as_half((uint16_t)(h[k / 2] >> (16 * (k & 1)))));
}

/* The value of fp8 code b from the format's definition: sign, E exponent bits of bias B, M
 * mantissa bits, subnormal below; E4M3's S.1111.111 is NaN (it has no infinity), E5M2's top
 * exponent is infinity (mantissa 0) or NaN, as IEEE's. */
static float fp8_value(unsigned b, int E, int M)
{
    const int bias = (1 << (E - 1)) - 1, e = (b >> M) & ((1 << E) - 1), m = b & ((1 << M) - 1);
    float v;
    if (E == 4 && (b & 0x7f) == 0x7f) return NAN;
    if (E == 5 && e == 31) v = m ? NAN : INFINITY;
    else v = e ? ldexpf((float)((1 << M) + m), e - bias - M) : ldexpf((float)m, 1 - bias - M);
    return b & 0x80 ? -v : v;
}

static int same_value(float got, float want)
{
    return isnan(want) ? isnan(got) : memcmp(&got, &want, sizeof got) == 0;
}

static void check_operands(void)
{
    enum { N = 65536 };
    float *d, *h = (float *)malloc(sizeof(float) * 10 * N);
    KV_CHECK(cudaMalloc((void **)&d, sizeof(float) * 10 * N) == cudaSuccess, "operand alloc");
    KV_LAUNCH(operand_kernel, N / 256, 256, 0, 0, d);
    KV_CHECK(cudaMemcpy(h, d, sizeof(float) * 10 * N, cudaMemcpyDeviceToHost) == cudaSuccess,
             "operand copy");
    long bad[3] = {0, 0, 0};
    for (uint32_t i = 0; i < N; i++) {
        const uint32_t w = i | (i ^ 0x5a5au) << 16;
        const float *o = h + (size_t)i * 10;
        for (int k = 0; k < 2; k++) bad[0] += !same_value(o[k], fp8_value((i >> (8 * k)) & 0xff, 4, 3));
        for (int k = 0; k < 4; k++) {
            const unsigned b = (w >> (8 * k)) & 0xff;
            bad[1] += !same_value(o[2 + k], (float)(int8_t)b);
            bad[2] += !same_value(o[6 + k], fp8_value(b, 5, 2));
        }
    }
    KV_CHECK(bad[0] == 0, "e4m3 pairs: %ld of %d halves differ from the format's values", bad[0], 2 * N);
    KV_CHECK(bad[1] == 0, "int8 by the magic number: %ld of %d halves differ from the codes (exact)",
             bad[1], 4 * N);
    KV_CHECK(bad[2] == 0, "e5m2 quads: %ld of %d halves differ from the format's values", bad[2], 4 * N);
    cudaFree(d);
    free(h);
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }
    uint16_t m[32 * 8];
    for (int i = 0; i < 32 * 8; i++) m[i] = (uint16_t)(1000 + i);
    uint16_t *dm;
    uint32_t *dout;
    cudaMalloc(&dm, sizeof m);
    cudaMalloc(&dout, 32 * 4 * sizeof(uint32_t));
    cudaMemcpy(dm, m, sizeof m, cudaMemcpyHostToDevice);
    check_ldmatrix(dm, dout, m);
    cudaFree(dm);
    cudaFree(dout);
    for (unsigned seed = 1; seed <= 3; seed++) {
        check_mma<0>(seed);
        check_mma<1>(seed);
    }
    check_operands();
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}
