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

/** A failed runtime call is also recorded as the runtime's last error. Unless it is cleared,
 * the next launch check (cudaGetLastError() after a launch) reports it again, for a launch
 * that went well, and a retry after the memory was freed fails once more. A failure already
 * turned into a status is cleared with this (a sticky error, a kernel fault, stays: the
 * context is lost and every later call says so). Returns @p e. */
static inline cudaError_t kvcu_clear_error(cudaError_t e)
{
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}

/** The status of a failed CUDA call: KV_ERR_NOMEM for an allocation, else KV_ERR_DEVICE. */
#define KVCU_STATUS(e) ((e) == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE)

/** In a function returning a kv_status: on a failed CUDA call, clear it as the last error
 * (kvcu_clear_error()), fill err and return. */
#define KV_CUDA_TRY(call, err)                                                              \
    do {                                                                                    \
        cudaError_t kv_e_ = (call);                                                         \
        if (kv_e_ != cudaSuccess)                                                           \
            return kv_fail((err), KVCU_STATUS(kvcu_clear_error(kv_e_)), "%s:%d: %s: %s",     \
                           __FILE__, __LINE__, #call, cudaGetErrorString(kv_e_));           \
    } while (0)

/** cudaMalloc as a status (KV_ERR_NOMEM when the device is full), the failure cleared as the
 * last error (KV_CUDA_TRY). Every device allocation of the library goes through this. */
static inline int kvcu_device_alloc(void **p, size_t bytes, kv_err *err)
{
    *p = NULL;
    const cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) return KV_OK;
    return kv_fail(err, KVCU_STATUS(kvcu_clear_error(e)), "%zu bytes of device memory: %s",
                   bytes, cudaGetErrorString(e));
}

/** In a function returning a kv_status: kvcu_device_alloc() or return its status. */
#define KVCU_ALLOC_TRY(ptr, bytes, err)                                                     \
    do {                                                                                    \
        const int kv_rc_ = kvcu_device_alloc((void **)(ptr), (bytes), (err));               \
        if (kv_rc_) return kv_rc_;                                                          \
    } while (0)

/** After KV_LAUNCH: check the launch configuration was accepted. */
#define KV_CUDA_TRY_LAUNCH(err) KV_CUDA_TRY(cudaGetLastError(), err)

static inline unsigned kv_ceil_div(long long a, long long b) { return (unsigned)((a + b - 1) / b); }

#endif
