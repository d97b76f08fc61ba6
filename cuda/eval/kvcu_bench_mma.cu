/*
 * The device's tensor-core throughput, measured in the run that times the tensor-core kernels
 * (`kvlab bench prefill --device cuda`): the ceiling their TFLOP/s are read against, as
 * kvcu_read_bandwidth() is the ceiling of a decode step.
 *
 * mma_peak_kernel: each warp keeps MMA_CHAINS independent accumulators and issues
 * mma.sync.m16n8k16 on register fragments in a loop, no memory traffic inside it; the chains
 * are independent so the tensor cores' pipeline stays full. A block of 4 warps per SM
 * quarter, several blocks per SM: enough warps that issue is the limit. 4 096 FLOPs per
 * mma (16·8·16 multiply-adds). The accumulators are written out at the end (one float per
 * thread), so the compiler cannot drop the loop.
 */
#include "kvcu_internal.cuh"
#include "kvcu_mma.cuh"

#define MMA_CHAINS 8
#define MMA_PEAK_THREADS 128

template <int BF16>
__global__ void mma_peak_kernel(float *out, int iters, uint32_t seed)
{
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; i++) a[i] = seed ^ (threadIdx.x * 2654435761u + i);
    for (int i = 0; i < 2; i++) b[i] = seed ^ (threadIdx.x * 40503u + 7 * i);
    /* small exponents: fp16/bf16 values near 1, so nothing overflows over the chain */
    for (int i = 0; i < 4; i++) a[i] = (a[i] & 0x03ff03ffu) | (BF16 ? 0x3f803f80u : 0x3c003c00u);
    for (int i = 0; i < 2; i++) b[i] = (b[i] & 0x03ff03ffu) | (BF16 ? 0x3f803f80u : 0x3c003c00u);
    float c[MMA_CHAINS][4];
    KV_UNROLL
    for (int k = 0; k < MMA_CHAINS; k++)
        for (int i = 0; i < 4; i++) c[k][i] = 0.0f;
    for (int it = 0; it < iters; it++)
        KV_UNROLL
        for (int k = 0; k < MMA_CHAINS; k++) kvcu_mma<BF16>(c[k], a, b);
    float s = 0.0f;
    for (int k = 0; k < MMA_CHAINS; k++)
        for (int i = 0; i < 4; i++) s += c[k][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

typedef struct {
    float *out;
    int blocks, iters, bf16;
} mma_peak_call;

static int mma_peak_fn(void *arg, kv_err *err)
{
    const mma_peak_call *p = (const mma_peak_call *)arg;
    if (p->bf16)
        KV_LAUNCH(mma_peak_kernel<1>, p->blocks, MMA_PEAK_THREADS, 0, 0, p->out, p->iters, 1u);
    else
        KV_LAUNCH(mma_peak_kernel<0>, p->blocks, MMA_PEAK_THREADS, 0, 0, p->out, p->iters, 1u);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_mma_throughput(int bf16, int iters, int repeats, double *flop_per_s, kv_err *err)
{
    if (!flop_per_s || iters < 1)
        return kv_fail(err, KV_ERR_ARG, "kvcu_mma_throughput: iters %d", iters);
    if (!kvcu_has_mma())
        return kvcu_fail_arch(err, "kvcu_mma_throughput", "mma.sync.m16n8k16 with fp32 "
                              "accumulators", KVCU_SM_MMA);
    int dev = 0, sms = 1;
    KV_CUDA_TRY(cudaGetDevice(&dev), err);
    KV_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), err);
    mma_peak_call c = {NULL, 8 * sms, iters, bf16};
    int st = kvcu_device_alloc((void **)&c.out,
                               (size_t)c.blocks * MMA_PEAK_THREADS * sizeof(float), err);
    double s = 0.0;
    if (!st) st = kvcu_time_calls(mma_peak_fn, &c, repeats, &s, err);
    cudaFree(c.out);
    if (st) return st;
    const double mmas = (double)c.blocks * (MMA_PEAK_THREADS / KV_WARP) * iters * MMA_CHAINS;
    *flop_per_s = s > 0.0 ? mmas * 4096.0 / s : 0.0;
    return KV_OK;
}
