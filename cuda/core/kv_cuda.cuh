/**
 * @file kv_cuda.cuh
 * The two seams between a real CUDA build and the emulation build (cuda/emu/), and the
 * error-checking macros every CUDA file uses.
 *
 * Kernel sources are identical in both builds. They launch only through KV_LAUNCH and get
 * dynamic shared memory only through KV_DYNAMIC_SMEM; in the emulation build <cuda_runtime.h>
 * and friends resolve to cuda/emu/include/, where the threads of a block are fibers.
 */
#ifndef KV_CUDA_CUH
#define KV_CUDA_CUH

#include <cuda_runtime.h>
#include "kv_common.h"

#ifdef KV_CUDA_EMULATION
/* The kernel body runs once per emulated thread, as a fiber; arguments are captured by value
 * exactly as a real launch copies them. The kernel's address keys its cudaFuncSetAttribute
 * settings, so `kernel` must name one function (give template arguments explicitly). */
#define KV_LAUNCH(kernel, grid, block, smem, stream, ...) \
    kvemu_launch(#kernel, kvemu_func_key(kernel), dim3(grid), dim3(block), (size_t)(smem), \
                 (stream), [=]() { kernel(__VA_ARGS__); })
#define KV_DYNAMIC_SMEM(T, name) T *name = (T *)kvemu_dynamic_smem()
#else
#define KV_LAUNCH(kernel, grid, block, smem, stream, ...) \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define KV_DYNAMIC_SMEM(T, name) \
    extern __shared__ __align__(16) unsigned char kv_dyn_smem_[]; \
    T *name = (T *)kv_dyn_smem_
#endif

/** In a function returning a kv_status: on a failed CUDA call, fill err and return. */
#define KV_CUDA_TRY(call, err)                                                              \
    do {                                                                                    \
        cudaError_t kv_e_ = (call);                                                         \
        if (kv_e_ != cudaSuccess)                                                           \
            return kv_fail((err), kv_e_ == cudaErrorMemoryAllocation ? KV_ERR_NOMEM         \
                                                                     : KV_ERR_DEVICE,       \
                           "%s:%d: %s: %s", __FILE__, __LINE__, #call,                      \
                           cudaGetErrorString(kv_e_));                                      \
    } while (0)

/** cudaMalloc as a status. A failed allocation is also recorded as the runtime's last error;
 * it is cleared here, or the next launch check would report it (and a retry after the
 * memory is freed would fail) again. */
static inline int kvcu_device_alloc(void **p, size_t bytes, kv_err *err)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) (void)cudaGetLastError();
    KV_CUDA_TRY(e, err);
    return KV_OK;
}

/** After KV_LAUNCH: check the launch configuration was accepted. */
#define KV_CUDA_TRY_LAUNCH(err) KV_CUDA_TRY(cudaGetLastError(), err)

static inline unsigned kv_ceil_div(long long a, long long b) { return (unsigned)((a + b - 1) / b); }

#endif
