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

/* ---- what the device can run (cuda/core/kvcu_device.cu) ----------------------------------
 * kvlab runs on sm_75 (Turing) and newer. The tensor-core kernels (mma.sync.m16n8k16 with fp32
 * accumulators, bf16 inputs: cuda/core/kvcu_mma.cuh) need sm_80; below it the host routes every
 * step to a CUDA-core path, chosen on the device's compute capability at run time, and refuses
 * (kvcu_fail_arch()) only where there is none. */
#define KVCU_SM_MIN 75 /* Turing: the oldest architecture CUDA 13 compiles for that kvlab runs */
#define KVCU_SM_MMA 80 /* Ampere: mma.sync.m16n8k16 .f32.{f16,bf16}, cp.async */
extern "C" {
/** The current device's compute capability as 10·major + minor (75 Turing, 80 A100, 86/89
 * RTX 30/40, 90 H100); 0 when none answers. The emulation build reports KVEMU_SM (90 unset). */
int kvcu_device_sm(void);
}
/** 1 when the current device runs the tensor-core kernels (sm_80 and newer). */
static inline int kvcu_has_mma(void) { return kvcu_device_sm() >= KVCU_SM_MMA; }
/** Shared memory one block may opt in to on the current device
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin: 64 KiB on sm_75, 163 KiB on sm_80, 99 KiB on
 * sm_86/89/120, 227 KiB on sm_90); 48 KiB, every device's default, when it cannot be read. */
size_t kvcu_smem_optin(void);
/** KV_ERR_UNSUPPORTED: "@p who: the GPU by name (sm_XY) lacks @p what (sm_NN and newer)". */
int kvcu_fail_arch(kv_err *err, const char *who, const char *what, int need);

static inline unsigned kv_ceil_div(long long a, long long b) { return (unsigned)((a + b - 1) / b); }

#endif
