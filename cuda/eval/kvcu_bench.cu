/*
 * Measuring the device for the benchmarks, twin of reference_cpu/eval/kv_bench.c: CUDA-event
 * timing of any call (kvcu_time_calls()) and of chapter 08's kernel versions
 * (kvcu_flash_time()), the device's read and copy bandwidth of the same run
 * (kvcu_read_bandwidth(), kvcu_copy_bandwidth(): the rooflines the benches compare each row
 * against), and the engine's batched decode attention as a call of its own
 * (kvcu_decode_batch(), what `kvlab bench attention --device cuda` times as "engine").
 */
#include <stdlib.h>

#include "kvcu_internal.cuh"

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median of @p repeats event-timed runs of fn(arg) after one warm-up; 0 or a status. */
typedef int (*flash_timed_fn)(void *arg, kv_err *err);

static int time_events(flash_timed_fn fn, void *arg, int repeats, double *seconds, kv_err *err);

int kvcu_time_calls(int (*fn)(void *arg, kv_err *err), void *arg, int repeats, double *seconds,
                    kv_err *err)
{
    if (!fn || !seconds) return kv_fail(err, KV_ERR_ARG, "kvcu_time_calls: NULL argument");
    return time_events(fn, arg, repeats, seconds, err);
}

static int time_events(flash_timed_fn fn, void *arg, int repeats, double *seconds, kv_err *err)
{
    if (repeats < 1)
        return kv_fail(err, KV_ERR_ARG, "timing: repeats %d (at least 1)", repeats);
    double *t = (double *)malloc((size_t)repeats * sizeof(double));
    if (!t) return kv_fail(err, KV_ERR_NOMEM, "timing: %d repeats", repeats);
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t ce = cudaEventCreate(&e0);
    if (ce == cudaSuccess) ce = cudaEventCreate(&e1);
    int st = ce == cudaSuccess ? fn(arg, err) : KV_OK; /* warm-up */
    for (int r = 0; r < repeats && ce == cudaSuccess && !st; r++) {
        float ms = 0.0f;
        ce = cudaEventRecord(e0, 0);
        if (ce == cudaSuccess) st = fn(arg, err);
        if (ce == cudaSuccess && !st) ce = cudaEventRecord(e1, 0);
        if (ce == cudaSuccess && !st) ce = cudaEventSynchronize(e1);
        if (ce == cudaSuccess && !st) ce = cudaEventElapsedTime(&ms, e0, e1);
        t[r] = ms * 1e-3;
    }
    if (ce == cudaSuccess && !st) {
        qsort(t, (size_t)repeats, sizeof(double), cmp_double);
        *seconds = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    }
    free(t);
    cudaError_t d0 = e0 ? cudaEventDestroy(e0) : cudaSuccess;
    cudaError_t d1 = e1 ? cudaEventDestroy(e1) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(ce, err);
    KV_CUDA_TRY(d0, err);
    KV_CUDA_TRY(d1, err);
    return KV_OK;
}

typedef struct {
    int version;
    const kvcu_flash_job *j;
    float *scratch;
} flash_call;

static int flash_call_fn(void *arg, kv_err *err)
{
    const flash_call *c = (const flash_call *)arg;
    return kvcu_flash_attention(c->version, c->j, c->scratch, err);
}

int kvcu_flash_time(int version, const kvcu_flash_job *j, float *scratch, int repeats,
                    double *seconds, kv_err *err)
{
    kv_flash_stats bytes;
    int st = kvcu_flash_bytes(version, j, &bytes, err); /* the checks of kvcu_flash_attention() */
    if (st) return st;
    const size_t need = kvcu_flash_scratch(version, j);
    float *own = NULL; /* allocated once here, so cudaMalloc is not what is timed */
    if (need && !scratch) {
        st = kvcu_device_alloc((void **)&own, need * sizeof(float), err);
        if (st) return st;
        scratch = own;
    }
    flash_call c = {version, j, scratch};
    st = time_events(flash_call_fn, &c, repeats, seconds, err);
    cudaError_t f = own ? cudaFree(own) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(f, err);
    return KV_OK;
}

/* Each thread sums float4s with a grid stride; the block's sum goes to sink[block] so the
 * loads cannot be optimized away. */
__global__ void read_bandwidth_kernel(const float4 *x, size_t n, float *sink)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] */
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        s += (v.x + v.y) + (v.z + v.w);
    }
    s = kv_block_sum(s, red);
    if (threadIdx.x == 0) sink[blockIdx.x] = s;
}

typedef struct {
    const float4 *x;
    size_t n;
    float *sink;
    int blocks;
} read_call;

static int read_call_fn(void *arg, kv_err *err)
{
    const read_call *c = (const read_call *)arg;
    KV_LAUNCH(read_bandwidth_kernel, c->blocks, 256, KV_WARP * sizeof(float), 0, c->x, c->n,
              c->sink);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_read_bandwidth(size_t bytes, int repeats, double *bytes_per_s, kv_err *err)
{
    if (bytes == 0) bytes = (size_t)1 << 30;
    const size_t n = bytes / sizeof(float4);
    if (n == 0) return kv_fail(err, KV_ERR_ARG, "kvcu_read_bandwidth: %zu bytes", bytes);
    int sms = 0;
    KV_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), err);
    read_call c;
    c.n = n;
    c.blocks = (sms > 0 ? sms : 1) * 8;
    float4 *x = NULL;
    float *sink = NULL;
    int st = kvcu_device_alloc((void **)&x, n * sizeof(float4), err);
    if (st) return st;
    st = kvcu_device_alloc((void **)&sink, (size_t)c.blocks * sizeof(float), err);
    cudaError_t ce = st ? cudaSuccess : cudaMemset(x, 0, n * sizeof(float4));
    double sec = 0.0;
    if (!st && ce == cudaSuccess) {
        c.x = x;
        c.sink = sink;
        st = time_events(read_call_fn, &c, repeats, &sec, err);
    }
    cudaError_t f0 = cudaFree(x), f1 = sink ? cudaFree(sink) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(ce, err);
    KV_CUDA_TRY(f0, err);
    KV_CUDA_TRY(f1, err);
    *bytes_per_s = sec > 0.0 ? (double)(n * sizeof(float4)) / sec : 0.0;
    return KV_OK;
}

/* Each thread copies float4s with a grid stride: a device-to-device copy, the traffic of
 * cudaMemcpy without its choice of engine. */
__global__ void copy_bandwidth_kernel(float4 *dst, const float4 *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

typedef struct {
    float4 *dst;
    const float4 *src;
    size_t n;
    int blocks;
} copy_call;

static int copy_call_fn(void *arg, kv_err *err)
{
    const copy_call *c = (const copy_call *)arg;
    KV_LAUNCH(copy_bandwidth_kernel, c->blocks, 256, 0, 0, c->dst, c->src, c->n);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_copy_bandwidth(size_t bytes, int repeats, double *bytes_per_s, kv_err *err)
{
    if (bytes == 0) bytes = (size_t)1 << 30;
    const size_t n = bytes / sizeof(float4);
    if (n == 0) return kv_fail(err, KV_ERR_ARG, "kvcu_copy_bandwidth: %zu bytes", bytes);
    int sms = 0;
    KV_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), err);
    copy_call c;
    c.n = n;
    c.blocks = (sms > 0 ? sms : 1) * 8;
    float4 *src = NULL, *dst = NULL;
    int st = kvcu_device_alloc((void **)&src, n * sizeof(float4), err);
    if (!st) st = kvcu_device_alloc((void **)&dst, n * sizeof(float4), err);
    cudaError_t ce = st ? cudaSuccess : kvcu_clear_error(cudaMemset(src, 0, n * sizeof(float4)));
    double sec = 0.0;
    if (!st && ce == cudaSuccess) {
        c.src = src;
        c.dst = dst;
        st = time_events(copy_call_fn, &c, repeats, &sec, err);
    }
    cudaError_t f0 = src ? cudaFree(src) : cudaSuccess, f1 = dst ? cudaFree(dst) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(ce, err);
    KV_CUDA_TRY(f0, err);
    KV_CUDA_TRY(f1, err);
    /* every byte is read once and written once */
    *bytes_per_s = sec > 0.0 ? 2.0 * (double)(n * sizeof(float4)) / sec : 0.0;
    return KV_OK;
}

size_t kvcu_decode_batch_scratch(const kvcu_cache *c, int B, int n_heads)
{
    return c ? kvcu_attention_scratch(B, n_heads, c->head_dim, c->span) : 0;
}

int kvcu_decode_batch(const kvcu_cache *c, int layer, const int *slots, const int *pos,
                      const float *q, float *out, float *scratch, int B, int n_heads,
                      int max_len, kv_err *err)
{
    if (!c || !slots || !pos || !q || !out || !scratch || B < 1 || layer < 0 ||
        layer >= c->n_layers || max_len < 1)
        return kv_fail(err, KV_ERR_ARG, "kvcu_decode_batch: bad argument");
    return kvcu_attention(c, layer, slots, pos, NULL, q, out, scratch, B, n_heads, max_len, err);
}
