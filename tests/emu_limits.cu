/*
 * emu_limits.cu: launch limits, dynamic shared memory, and the runtime calls around a kernel.
 *
 * A launch the device would refuse must fail through cudaGetLastError() with the device's
 * error code (1025 threads, a 65th z-thread, a grid y of 65536: invalid configuration; more
 * dynamic shared memory than the kernel's limit: invalid value), and the next good launch must
 * work. Dynamic shared memory beyond 48 KiB works once raised with cudaFuncSetAttribute.
 * Then memcpy (all kinds), memset, streams and events, as an engine uses them.
 */
#include "kv_cuda.cuh"
#include "common/kv_test.h"

#include <string.h>

/* out[i] = i*3 + 1, staged through `n` ints of dynamic shared memory per block */
__global__ void stage_kernel(int *out, int n)
{
    KV_DYNAMIC_SMEM(int, buf);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i * 3;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + (n - 1 - i)] = buf[n - 1 - i] + 1;
}

__global__ void fill_kernel(float *x, float v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

static int stage_ok(int *d, int blocks, int n)
{
    int *h = (int *)malloc((size_t)blocks * n * sizeof(int)), bad = 0;
    cudaMemcpy(h, d, (size_t)blocks * n * sizeof(int), cudaMemcpyDeviceToHost);
    for (int b = 0; b < blocks; b++)
        for (int i = 0; i < n; i++) bad += h[b * n + i] != i * 3 + 1;
    free(h);
    return bad == 0;
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }
    cudaDeviceProp prop;
    KV_CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess, "cudaGetDeviceProperties");
    KV_CHECK(prop.warpSize == 32 && prop.maxThreadsPerBlock == 1024, "warp size / threads per block");
    KV_CHECK(prop.sharedMemPerBlock == 48 * 1024, "sharedMemPerBlock %zu", prop.sharedMemPerBlock);
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    KV_CHECK((size_t)optin == prop.sharedMemPerBlockOptin && optin > 48 * 1024, "opt-in smem %d", optin);

    /* ---- dynamic shared memory: 40 KiB by default, 100 KiB once raised ---- */
    const int small = 10 * 1024, big = 25 * 1024; /* ints: 40 KiB and 100 KiB */
    int *d;
    if (cudaMalloc(&d, 4 * (size_t)big * sizeof(int))) return 1;
    KV_LAUNCH(stage_kernel, 4, 256, small * sizeof(int), 0, d, small);
    KV_CHECK(cudaGetLastError() == cudaSuccess && stage_ok(d, 4, small), "40 KiB dynamic smem");
    KV_LAUNCH(stage_kernel, 4, 256, big * sizeof(int), 0, d, big);
    KV_CHECK(cudaGetLastError() == cudaErrorInvalidValue, "100 KiB without the attribute must fail");
    KV_CHECK(cudaFuncSetAttribute(stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  big * (int)sizeof(int)) == cudaSuccess, "raise the smem limit");
    KV_LAUNCH(stage_kernel, 4, 256, big * sizeof(int), 0, d, big);
    KV_CHECK(cudaGetLastError() == cudaSuccess && stage_ok(d, 4, big), "100 KiB dynamic smem, raised");
    KV_CHECK(cudaFuncSetAttribute(stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  optin + 1) == cudaErrorInvalidValue, "limit beyond the opt-in maximum");
    cudaGetLastError();

    /* ---- shapes the device refuses, each followed by a good launch ---- */
    float *x;
    if (cudaMalloc(&x, 1024 * sizeof(float))) return 1;
    KV_LAUNCH(fill_kernel, 1, 1025, 0, 0, x, 1.0f, 1024);
    KV_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads per block");
    KV_CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
    KV_LAUNCH(fill_kernel, 1, dim3(1, 1, 65), 0, 0, x, 1.0f, 1024);
    KV_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "block z of 65");
    KV_LAUNCH(fill_kernel, dim3(1, 65536), 32, 0, 0, x, 1.0f, 1024);
    KV_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid y of 65536");
    KV_LAUNCH(fill_kernel, 0, 32, 0, 0, x, 1.0f, 1024);
    KV_CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "empty grid");
    KV_LAUNCH(fill_kernel, 1, 1024, 0, 0, x, 2.5f, 1024);
    KV_CHECK(cudaPeekAtLastError() == cudaSuccess && cudaGetLastError() == cudaSuccess, "1024 threads");

    /* ---- memset, memcpy of every kind, a stream and two events ---- */
    float h[1024], back[1024];
    cudaMemcpy(back, x, sizeof back, cudaMemcpyDeviceToHost);
    int ok = 1;
    for (int i = 0; i < 1024; i++) ok &= back[i] == 2.5f;
    KV_CHECK(ok, "kernel fill read back");
    float *y, *pinned;
    if (cudaMalloc(&y, sizeof h) || cudaMallocHost(&pinned, sizeof h)) return 1;
    KV_CHECK(cudaMemset(y, 0, sizeof h) == cudaSuccess, "memset");
    cudaMemcpy(back, y, sizeof back, cudaMemcpyDeviceToHost);
    ok = 1;
    for (int i = 0; i < 1024; i++) ok &= back[i] == 0.0f;
    KV_CHECK(ok, "memset to zero");
    for (int i = 0; i < 1024; i++) h[i] = (float)i;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    KV_CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream create");
    KV_CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess, "event create");
    cudaEventRecord(e0, s);
    cudaMemcpyAsync(x, h, sizeof h, cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(y, x, sizeof h, cudaMemcpyDeviceToDevice, s);
    KV_LAUNCH(fill_kernel, 4, 256, 0, s, x, -1.0f, 512); /* in order: after the copy to y */
    cudaMemsetAsync(y, 0, 16 * sizeof(float), s);
    cudaMemcpyAsync(pinned, y, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaEventRecord(e1, s);
    KV_CHECK(cudaStreamSynchronize(s) == cudaSuccess, "stream synchronize");
    KV_CHECK(cudaEventSynchronize(e1) == cudaSuccess, "event synchronize");
    ok = 1;
    for (int i = 0; i < 1024; i++) ok &= pinned[i] == (i < 16 ? 0.0f : (float)i);
    KV_CHECK(ok, "stream order: copy, copy, kernel, memset, copy");
    cudaMemcpy(back, x, sizeof back, cudaMemcpyDeviceToHost);
    KV_CHECK(back[0] == -1.0f && back[511] == -1.0f && back[512] == 512.0f, "kernel on the stream");
    float ms = -1.0f;
    KV_CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms >= 0.0f, "elapsed %.3f ms", ms);
    memcpy(back, h, sizeof h);
    KV_CHECK(cudaMemcpy(back, pinned, sizeof h, cudaMemcpyHostToHost) == cudaSuccess, "host to host");
    KV_CHECK(cudaDeviceSynchronize() == cudaSuccess, "device synchronize");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    KV_CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroy");
    cudaFreeHost(pinned);
    cudaFree(x);
    cudaFree(y);
    cudaFree(d);
    return kv_test_finish();
}
