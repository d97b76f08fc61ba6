/*
 * emu_sync.cu: block-wide barriers across phases.
 *
 * Three kernels whose results are right only if every __syncthreads() holds: a tree
 * reduction (log2(n) phases through shared memory), a tiled transpose (write a tile, barrier,
 * read it transposed) on a matrix that is not a multiple of the tile, and the counting forms
 * __syncthreads_count / _and / _or. On a GPU this checks the kernels; in the emulation build it
 * checks that the fiber scheduler opens barriers only when the whole block has arrived.
 */
#include "kv_cuda.cuh"
#include "common/kv_test.h"

#include <stdlib.h>

/* ---- tree reduction: sums[b] = sum of x[b*256 .. b*256+255] ---------------------------- */
__global__ void block_sum_kernel(const int *x, int *sums, int n)
{
    __shared__ int s[256];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = s[0];
}

/* ---- transpose through a 32x33 tile (the +1 column avoids bank conflicts) --------------- */
#define TILE 32
#define ROWS 8
__global__ void transpose_kernel(const float *in, float *out, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y0 = blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += ROWS)
        if (x < cols && y0 + j < rows) tile[j][threadIdx.x] = in[(size_t)(y0 + j) * cols + x];
    __syncthreads();
    int ox = blockIdx.y * TILE + threadIdx.x, oy0 = blockIdx.x * TILE;
    for (int j = threadIdx.y; j < TILE; j += ROWS)
        if (ox < rows && oy0 + j < cols) out[(size_t)(oy0 + j) * rows + ox] = tile[threadIdx.x][j];
}

/* ---- counting barriers: per block, how many threads have an odd id, all / any ---------- */
__global__ void count_kernel(int *out, int limit)
{
    int t = threadIdx.x;
    int c = __syncthreads_count(t % 2 == 1);
    int all = __syncthreads_and(t < limit);
    int any = __syncthreads_or(t == limit);
    if (t == 0) {
        out[3 * blockIdx.x + 0] = c;
        out[3 * blockIdx.x + 1] = all;
        out[3 * blockIdx.x + 2] = any;
    }
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }

    /* tree reduction over 37 blocks, the last one partial */
    {
        const int n = 37 * 256 - 100, nb = kv_ceil_div(n, 256);
        int *h = (int *)malloc(n * sizeof(int)), *ref = (int *)calloc(nb, sizeof(int)), got[37];
        for (int i = 0; i < n; i++) {
            h[i] = (i * 7919) % 1000 - 500;
            ref[i / 256] += h[i];
        }
        int *dx, *ds;
        if (cudaMalloc(&dx, n * sizeof(int)) || cudaMalloc(&ds, nb * sizeof(int))) return 1;
        cudaMemcpy(dx, h, n * sizeof(int), cudaMemcpyHostToDevice);
        KV_LAUNCH(block_sum_kernel, nb, 256, 0, 0, dx, ds, n);
        KV_CHECK(cudaGetLastError() == cudaSuccess, "block_sum launch");
        cudaMemcpy(got, ds, nb * sizeof(int), cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int b = 0; b < nb; b++) bad += got[b] != ref[b];
        KV_CHECK(bad == 0, "tree reduction: %d of %d block sums wrong (block 0: %d vs %d)", bad,
                 nb, got[0], ref[0]);
        cudaFree(dx);
        cudaFree(ds);
        free(h);
        free(ref);
    }

    /* transpose of 75 x 101 (neither a multiple of 32) */
    {
        const int rows = 75, cols = 101;
        float *h = (float *)malloc(rows * cols * sizeof(float));
        float *got = (float *)malloc(rows * cols * sizeof(float));
        float *ref = (float *)malloc(rows * cols * sizeof(float));
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                h[r * cols + c] = (float)(r * 1000 + c);
                ref[c * rows + r] = (float)(r * 1000 + c);
            }
        float *din, *dout;
        if (cudaMalloc(&din, rows * cols * sizeof(float)) || cudaMalloc(&dout, rows * cols * sizeof(float)))
            return 1;
        cudaMemcpy(din, h, rows * cols * sizeof(float), cudaMemcpyHostToDevice);
        dim3 grid(kv_ceil_div(cols, TILE), kv_ceil_div(rows, TILE)), block(TILE, ROWS);
        KV_LAUNCH(transpose_kernel, grid, block, 0, 0, din, dout, rows, cols);
        KV_CHECK(cudaGetLastError() == cudaSuccess, "transpose launch");
        cudaMemcpy(got, dout, rows * cols * sizeof(float), cudaMemcpyDeviceToHost);
        KV_CHECK(kv_test_compare("transpose", got, ref, rows * cols, 0.0, 0.0) == 0, "transpose");
        cudaFree(din);
        cudaFree(dout);
        free(h);
        free(got);
        free(ref);
    }

    /* counting barriers on 3 blocks of 96 threads */
    {
        int *d, got[9];
        if (cudaMalloc(&d, sizeof got)) return 1;
        KV_LAUNCH(count_kernel, 3, 96, 0, 0, d, 96);
        cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost);
        for (int b = 0; b < 3; b++) {
            KV_CHECK(got[3 * b] == 48, "__syncthreads_count: %d, want 48", got[3 * b]);
            KV_CHECK(got[3 * b + 1] != 0, "__syncthreads_and of all-true predicates");
            KV_CHECK(got[3 * b + 2] == 0, "__syncthreads_or of all-false predicates");
        }
        KV_LAUNCH(count_kernel, 1, 96, 0, 0, d, 95);
        cudaMemcpy(got, d, 3 * sizeof(int), cudaMemcpyDeviceToHost);
        KV_CHECK(got[1] == 0, "__syncthreads_and with one false predicate");
        KV_CHECK(got[2] != 0, "__syncthreads_or with one true predicate");
        cudaFree(d);
    }
    return kv_test_finish();
}
