/*
 * What the current device can run, asked once per decision rather than assumed: the compute
 * capability routes a step to tensor cores (sm_80+) or to the CUDA-core kernels, the opt-in
 * shared memory bounds a plan's tiles, and a build that holds no kernel image for the device
 * says so before the first launch would ("no kernel image is available"), so every GPU test
 * skips with that sentence instead of failing.
 */
#include <stdio.h>
#include <string.h>

#include "kv_cuda.cuh"
#include "kvcu.h"

#ifndef KV_CUDA_ARCHS
#define KV_CUDA_ARCHS "unknown"
#endif

/* A kernel that does nothing: whether the runtime finds an image of it for this device. */
__global__ void kvcu_probe_kernel(void) {}

int kvcu_device_sm(void)
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* no device: an answer, not an error to keep */
        return 0;
    }
    return 10 * major + minor;
}

size_t kvcu_smem_optin(void)
{
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        v < 48 * 1024) {
        (void)cudaGetLastError();
        return 48 * 1024;
    }
    return (size_t)v;
}

/* "NVIDIA T4 (sm_75)": the current device by name and architecture. */
static void device_name(char *buf, size_t n)
{
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(buf, n, "the device");
        return;
    }
    snprintf(buf, n, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
}

int kvcu_fail_arch(kv_err *err, const char *who, const char *what, int need)
{
    char name[300];
    device_name(name, sizeof name);
    return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s lacks %s (sm_%d and newer)", who, name, what,
                   need);
}

/** KV_OK when a CUDA device can run kvlab's kernels: one answers, it is sm_75 or newer, and
 * this build holds an image of its kernels the device can load (always, in emulation, unless
 * KVEMU_SM pretends an older device). */
int kvcu_device_available(kv_err *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* no driver / no device: not an error to keep */
        return kv_fail(err, KV_ERR_DEVICE, "no usable CUDA device: %s", cudaGetErrorString(e));
    }
    if (n < 1) return kv_fail(err, KV_ERR_DEVICE, "no usable CUDA device: none found");
    char name[300];
    device_name(name, sizeof name);
    const int sm = kvcu_device_sm();
    if (sm < KVCU_SM_MIN)
        return kv_fail(err, KV_ERR_DEVICE, "no usable CUDA device: %s is older than kvlab's "
                       "minimum, sm_%d (Turing)", name, KVCU_SM_MIN);
    cudaFuncAttributes fa;
    e = cudaFuncGetAttributes(&fa, (const void *)kvcu_probe_kernel);
    if (e != cudaSuccess)
        return kv_fail(err, KV_ERR_DEVICE, "no usable CUDA device: %s cannot run this build's "
                       "kernels (%s; built for CUDA architectures %s): rebuild with "
                       "-DCMAKE_CUDA_ARCHITECTURES=native", name,
                       cudaGetErrorString(kvcu_clear_error(e)), KV_CUDA_ARCHS);
    return KV_OK;
}

/** "NVIDIA H200, sm_90, 139 GiB" or "emulated (CPU fibers)"; KV_ERR_DEVICE if none. */
int kvcu_device_describe(char *buf, size_t n, kv_err *err)
{
    int st = kvcu_device_available(err);
    if (st) return st;
    if (kvcu_is_emulation()) {
        const int sm = kvcu_device_sm();
        if (sm == 90) snprintf(buf, n, "emulated (CPU fibers)");
        else snprintf(buf, n, "emulated (CPU fibers) as sm_%d", sm);
        return KV_OK;
    }
    int dev = 0;
    cudaDeviceProp prop;
    KV_CUDA_TRY(cudaGetDevice(&dev), err);
    KV_CUDA_TRY(cudaGetDeviceProperties(&prop, dev), err);
    snprintf(buf, n, "%s, sm_%d%d, %.0f GiB", prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return KV_OK;
}
