/*
 * emu_warp.cu: warp shuffles, votes and reductions with their 32-lane semantics.
 *
 * Butterfly (xor) sums, a broadcast from one lane, down/up shifts within segments of a given
 * width (a source outside the segment returns the lane's own value), ballot/any/all, and a
 * block of 48 threads whose second warp has only 16 lanes. Expected values are computed on the
 * host from the CUDA definitions, so the same test checks a GPU and the emulator.
 */
#include "kv_cuda.cuh"
#include "common/kv_test.h"

#define NOUT 10 /* results per thread */

__global__ void warp_kernel(int *out)
{
    int t = threadIdx.x, lane = t % 32;
    int *o = out + t * NOUT;
    unsigned full = __activemask();
    int v = t + 1;
    for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(full, v, m); /* butterfly: warp sum */
    o[0] = v;
    o[1] = __shfl_sync(full, t * 10, 5);                         /* broadcast lane 5 */
    o[2] = __shfl_down_sync(full, t, 3, 16);                     /* shift within 16-lane halves */
    o[3] = __shfl_up_sync(full, t, 2, 8);                        /* shift within 8-lane groups */
    o[4] = __shfl_xor_sync(full, t, 4, 8);
    o[5] = (int)__ballot_sync(full, lane % 3 == 0);
    o[6] = __any_sync(full, lane == 7);
    o[7] = __all_sync(full, lane < 31);
    float f = __shfl_down_sync(full, (float)t * 0.5f, 1);        /* a float payload */
    o[8] = (int)(f * 2.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    /* __reduce_add_sync (redux.sync) is an sm_80 instruction: compiled for an older GPU the
     * same sum over the active lanes is taken by shuffles from each of them */
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if (full >> l & 1u) r += (unsigned)__shfl_sync(full, t, l);
    o[9] = (int)r;
#else
    o[9] = (int)__reduce_add_sync(full, (unsigned)t);
#endif
    __syncwarp(full);
}

static int lanes_in_warp(int w, int n) { return n - 32 * w >= 32 ? 32 : n - 32 * w; }

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }
    const int blocks[2] = {64, 48}; /* 48: a partial second warp */
    for (int c = 0; c < 2; c++) {
        const int n = blocks[c];
        int *d, got[64 * NOUT];
        if (cudaMalloc(&d, sizeof got)) return 1;
        KV_LAUNCH(warp_kernel, 1, n, 0, 0, d);
        KV_CHECK(cudaGetLastError() == cudaSuccess, "launch");
        cudaMemcpy(got, d, n * NOUT * sizeof(int), cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int t = 0; t < n; t++) {
            int w = t / 32, lane = t % 32, base = 32 * w, nl = lanes_in_warp(w, n);
            int want[NOUT], sum = 0, ballot = 0, usum = 0;
            for (int l = 0; l < nl; l++) {
                sum += base + l + 1;
                usum += base + l;
                if (l % 3 == 0) ballot |= 1 << l;
            }
            /* the butterfly only sums the full pattern when all 32 lanes exist */
            want[0] = nl == 32 ? sum : got[t * NOUT + 0];
            want[1] = (base + 5) * 10;
            int seg16 = lane & ~15, seg8 = lane & ~7;
            int dn = lane + 3 <= seg16 + 15 && lane + 3 < nl ? lane + 3 : lane;
            want[2] = base + dn;
            want[3] = base + (lane - 2 >= seg8 ? lane - 2 : lane);
            int x = lane ^ 4;
            want[4] = base + (x < nl ? x : lane);
            want[5] = ballot;
            want[6] = nl > 7;
            want[7] = nl < 32;
            want[8] = lane + 1 < nl ? t + 1 : t;
            want[9] = usum;
            for (int k = 0; k < NOUT; k++)
                if (got[t * NOUT + k] != want[k]) {
                    if (bad < 5)
                        printf("  block %d, thread %d, result %d: got %d, want %d\n", n, t, k,
                               got[t * NOUT + k], want[k]);
                    bad++;
                }
        }
        KV_CHECK(bad == 0, "block of %d threads: %d warp results wrong", n, bad);
        cudaFree(d);
    }
    return kv_test_finish();
}
