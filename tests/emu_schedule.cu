/*
 * emu_schedule.cu: what only the emulator can check (emulation build only).
 *
 * 1. Schedule modes catch a missing __syncthreads(): each thread writes its slot of shared
 *    memory and reads its left neighbour's. With the barrier the result is right under every
 *    order; without it, forward lane order happens to give the right answer (the neighbour ran
 *    first) and reverse order does not, which is why gpu tests run under several modes.
 * 2. Broken synchronization fails the launch with a message, never hangs: an early return
 *    before a barrier, barriers at different call sites, mismatched warp operations.
 * 3. Emulated device-memory limit (cudaErrorMemoryAllocation) and copies touching memory that
 *    no allocation owns (cudaErrorInvalidValue).
 * 4. Prints the cost of a fiber switch and of an emulated thread.
 */
#include "kv_cuda.cuh"
#include "common/kv_test.h"
#include "kvemu.h"

#include <string.h>
#include <time.h>

#define N 256

__global__ void neighbour_kernel(const int *in, int *out, int with_barrier)
{
    __shared__ int s[N];
    int t = threadIdx.x;
    s[t] = in[blockIdx.x * N + t] * 2;
    if (with_barrier) __syncthreads();
    out[blockIdx.x * N + t] = t > 0 ? s[t - 1] : -1;
}

__global__ void early_return_kernel(int *out, int n)
{
    __shared__ int s[N];
    int t = threadIdx.x;
    if (t >= n) return; /* the bug: threads past n never reach the barrier */
    s[t] = t;
    __syncthreads();
    out[t] = s[n - 1 - t];
}

__global__ void split_barrier_kernel(int *out)
{
    if (threadIdx.x < 32) {
        out[threadIdx.x] = 1;
        __syncthreads();
    } else {
        out[threadIdx.x] = 2;
        __syncthreads();
    }
}

__global__ void mismatched_warp_kernel(int *out)
{
    int lane = threadIdx.x % 32, v;
    if (lane < 16) v = __shfl_xor_sync(0xffffffffu, lane, 1);
    else v = (int)__ballot_sync(0xffffffffu, 1);
    out[threadIdx.x] = v;
}

__global__ void barrier_loop_kernel(int *out, int rounds)
{
    __shared__ int s[1024];
    int t = threadIdx.x, acc = 0;
    for (int r = 0; r < rounds; r++) {
        s[t] = t + r;
        __syncthreads();
        acc += s[(t + 1) % blockDim.x];
        __syncthreads();
    }
    out[t] = acc;
}

__global__ void plain_kernel(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Run the neighbour kernel under `mode`; returns the number of wrong outputs. */
static int neighbour_errors(const char *mode, int with_barrier, const int *din, int *dout, const int *h, int blocks)
{
    static int got[64 * N];
    kvemu_set_schedule(mode);
    KV_LAUNCH(neighbour_kernel, blocks, N, 0, 0, din, dout, with_barrier);
    if (cudaGetLastError() != cudaSuccess) return -1;
    cudaMemcpy(got, dout, (size_t)blocks * N * sizeof(int), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < N; t++) bad += got[b * N + t] != (t > 0 ? 2 * h[b * N + t - 1] : -1);
    return bad;
}

int main(void)
{
    const char *initial = kvemu_get_schedule();
    char saved[64];
    snprintf(saved, sizeof saved, "%s", initial);
    KV_CHECK(kvemu_set_schedule("sideways") == -1, "an unknown schedule is refused");
    KV_CHECK(!strcmp(kvemu_get_schedule(), saved), "and leaves the schedule unchanged");

    /* ---- 1. the schedule modes catch a missing barrier ---- */
    const int blocks = 64;
    int *h = (int *)malloc(blocks * N * sizeof(int)), *din, *dout;
    for (int i = 0; i < blocks * N; i++) h[i] = i * 7 + 3;
    if (cudaMalloc(&din, blocks * N * sizeof(int)) || cudaMalloc(&dout, blocks * N * sizeof(int))) return 1;
    cudaMemcpy(din, h, blocks * N * sizeof(int), cudaMemcpyHostToDevice);
    const char *modes[] = {"forward", "reverse", "random:1", "random:2", "random:12345"};
    for (int m = 0; m < 5; m++)
        KV_CHECK(neighbour_errors(modes[m], 1, din, dout, h, blocks) == 0,
                 "with the barrier, %s order gives the right result", modes[m]);
    int fwd = neighbour_errors("forward", 0, din, dout, h, blocks);
    int rev = neighbour_errors("reverse", 0, din, dout, h, blocks);
    int rnd = neighbour_errors("random:1", 0, din, dout, h, blocks);
    printf("missing barrier: wrong outputs forward %d, reverse %d, random:1 %d (of %d)\n", fwd, rev,
           rnd, blocks * N);
    KV_CHECK(fwd == 0, "forward order hides this missing barrier (the neighbour wrote first)");
    KV_CHECK(rev > 0 && rnd > 0, "reverse and random orders expose it");
    int again = neighbour_errors("random:1", 0, din, dout, h, blocks);
    KV_CHECK(again == rnd, "a random schedule is reproducible from its seed (%d vs %d)", again, rnd);
    kvemu_set_schedule(saved);

    /* ---- 2. broken synchronization fails the launch, and the next launch works ---- */
    KV_LAUNCH(early_return_kernel, 3, N, 0, 0, dout, 200);
    KV_CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "early return before a barrier fails");
    const char *msg = kvemu_last_message();
    KV_CHECK(strstr(msg, "early_return_kernel") && strstr(msg, "deadlock") && strstr(msg, "block (") &&
                 strstr(msg, "exited"), "message names kernel, block and cause: %s", msg);
    KV_LAUNCH(split_barrier_kernel, 1, 64, 0, 0, dout);
    KV_CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "a sync call reports the failure");
    KV_CHECK(strstr(kvemu_last_message(), "different barriers") != NULL, "%s", kvemu_last_message());
    KV_CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "and so does cudaGetLastError");
    KV_LAUNCH(mismatched_warp_kernel, 1, 32, 0, 0, dout);
    KV_CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "mismatched warp operations fail");
    KV_CHECK(strstr(kvemu_last_message(), "__ballot_sync") != NULL, "%s", kvemu_last_message());
    KV_CHECK(neighbour_errors(saved, 1, din, dout, h, blocks) == 0, "a good launch afterwards works");
    KV_CHECK(cudaDeviceSynchronize() == cudaSuccess, "and leaves no error behind");

    /* ---- 3. memory limit and ownership checks ---- */
    void *p = NULL, *q = NULL;
    size_t in_use = kvemu_mem_in_use();
    kvemu_set_mem_limit(in_use + (1 << 20));
    KV_CHECK(cudaMalloc(&p, 2 << 20) == cudaErrorMemoryAllocation && p == NULL, "over the limit: OOM");
    KV_CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "OOM is the last error");
    KV_CHECK(cudaMalloc(&p, 512 << 10) == cudaSuccess, "under the limit");
    KV_CHECK(cudaMalloc(&q, 768 << 10) == cudaErrorMemoryAllocation, "the limit counts live allocations");
    cudaFree(p);
    KV_CHECK(cudaMalloc(&q, 768 << 10) == cudaSuccess, "freed memory counts no more");
    cudaFree(q);
    kvemu_set_mem_limit(0);
    int host_a[16], host_b[16] = {0};
    KV_CHECK(cudaMemcpy(host_a, host_b, sizeof host_a, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
             "a host pointer as the device side of a copy");
    KV_CHECK(cudaMemcpy(din + blocks * N - 4, host_b, 16 * sizeof(int), cudaMemcpyHostToDevice) ==
                 cudaErrorInvalidValue, "a copy running past the end of an allocation");
    KV_CHECK(cudaFree(host_a) == cudaErrorInvalidValue, "freeing memory cudaMalloc did not give");
    cudaGetLastError();

    /* ---- 4. cost of a switch and of a thread ---- */
    int *dl;
    if (cudaMalloc(&dl, 1024 * sizeof(int))) return 1;
    kvemu_stats st;
    kvemu_stats_reset();
    double t0 = now();
    KV_LAUNCH(barrier_loop_kernel, 1, 1024, 0, 0, dl, 200);
    double t1 = now();
    kvemu_stats_get(&st);
    int got[1024], bad = 0;
    cudaMemcpy(got, dl, sizeof got, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 1024; t++) bad += got[t] != 200 * ((t + 1) % 1024) + 199 * 200 / 2;
    KV_CHECK(bad == 0, "barrier loop: %d wrong", bad);
    KV_CHECK(st.switches >= 2ull * 1024 * 401, "every barrier costs each thread a switch out and in");
    printf("fiber switch: %.1f ns (%llu switches in %.1f ms, 1 block of 1024 threads, 400 barriers)\n",
           1e9 * (t1 - t0) / (double)st.switches, (unsigned long long)st.switches, 1e3 * (t1 - t0));
    const int n = 1 << 22;
    float *x;
    if (cudaMalloc(&x, n * sizeof(float))) return 1;
    cudaMemset(x, 0, n * sizeof(float));
    kvemu_stats_reset();
    t0 = now();
    KV_LAUNCH(plain_kernel, n / 256, 256, 0, 0, x, n);
    t1 = now();
    kvemu_stats_get(&st);
    KV_CHECK(st.threads == (uint64_t)n && st.blocks == (uint64_t)n / 256, "stats count threads and blocks");
    printf("emulated thread without barriers: %.1f ns (%d threads on %d workers in %.1f ms)\n",
           1e9 * (t1 - t0) / n, n, kvemu_num_workers(), 1e3 * (t1 - t0));
    cudaFree(x);
    cudaFree(dl);
    cudaFree(din);
    cudaFree(dout);
    free(h);
    return kv_test_finish();
}
