/*
 * emu_atomic.cu: contended atomics from many blocks.
 *
 * 300 blocks of 256 threads hit one counter each way: integer adds must count exactly, a float
 * sum of small integers is exact (every partial sum is an integer below 2^24), max/min find the
 * extremes, and a compare-and-swap loop builds the same count as atomicAdd. In the emulation
 * build blocks run on several OS threads at once, so these are real races for real atomics.
 */
#include "kv_cuda.cuh"
#include "common/kv_test.h"

struct counters {
    int add;
    unsigned uadd;
    unsigned long long ull;
    float fsum;
    double dsum;
    int mx, mn;
    int cas;
    int exch;
};

__global__ void atomic_kernel(counters *c)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&c->add, 1);
    atomicAdd(&c->uadd, 2u);
    atomicAdd(&c->ull, 1ull << 33);
    atomicAdd(&c->fsum, (float)(i % 7));
    atomicAdd(&c->dsum, 0.5);
    atomicMax(&c->mx, (i * 37) % 100003);
    atomicMin(&c->mn, (i * 37) % 100003 - 50000);
    int old = c->cas, seen;
    while ((seen = atomicCAS(&c->cas, old, old + 3)) != old) old = seen;
    atomicExch(&c->exch, 42);
}

int main(void)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("no CUDA device: skipped\n");
        return KV_TEST_SKIP;
    }
    const int blocks = 300, threads = 256, n = blocks * threads;
    counters h = {0, 0, 0, 0.0f, 0.0, -1000000, 1000000, 0, 0}, got;
    counters *d;
    if (cudaMalloc(&d, sizeof h)) return 1;
    cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice);
    KV_LAUNCH(atomic_kernel, blocks, threads, 0, 0, d);
    KV_CHECK(cudaGetLastError() == cudaSuccess, "launch");
    cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost);

    long long fsum = 0;
    int mx = -1000000, mn = 1000000;
    for (int i = 0; i < n; i++) {
        fsum += i % 7;
        int v = (i * 37) % 100003;
        mx = v > mx ? v : mx;
        mn = v - 50000 < mn ? v - 50000 : mn;
    }
    KV_CHECK(got.add == n, "atomicAdd int: %d, want %d", got.add, n);
    KV_CHECK(got.uadd == 2u * n, "atomicAdd unsigned: %u, want %u", got.uadd, 2u * n);
    KV_CHECK(got.ull == (unsigned long long)n << 33, "atomicAdd unsigned long long");
    KV_CHECK(got.fsum == (float)fsum, "atomicAdd float: %.1f, want %lld", got.fsum, fsum);
    KV_CHECK(got.dsum == 0.5 * n, "atomicAdd double: %.1f, want %.1f", got.dsum, 0.5 * n);
    KV_CHECK(got.mx == mx, "atomicMax: %d, want %d", got.mx, mx);
    KV_CHECK(got.mn == mn, "atomicMin: %d, want %d", got.mn, mn);
    KV_CHECK(got.cas == 3 * n, "atomicCAS loop: %d, want %d", got.cas, 3 * n);
    KV_CHECK(got.exch == 42, "atomicExch");
    cudaFree(d);
    return kv_test_finish();
}
