/**
 * @file kvemu.h
 * Control of kvlab's CUDA emulator (cuda/emu/README.md): schedule modes, statistics, the
 * detail of the last kernel failure, an emulated device-memory limit. C-compatible.
 *
 * Schedule modes decide the order in which the runnable threads of a block run between two
 * synchronization points: lane order (forward), reverse lane order, or a seeded random
 * permutation drawn afresh at every step. A kernel that is missing a __syncthreads() gives
 * different results under different orders; a correct kernel gives the same in all of them.
 */
#ifndef KVEMU_H
#define KVEMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Counters since the last kvemu_stats_reset(), summed over all worker threads. */
typedef struct {
    uint64_t launches; /**< kernels launched (accepted configurations) */
    uint64_t blocks;   /**< blocks run */
    uint64_t threads;  /**< fibers run (one per CUDA thread) */
    uint64_t switches; /**< fiber context switches, in both directions */
} kvemu_stats;

/**
 * Set the schedule: "forward", "reverse" or "random:<seed>" (decimal seed).
 * Returns 0, or -1 (schedule unchanged) when @p spec is not one of those.
 * The environment variable KVEMU_SCHEDULE sets the initial value.
 */
int kvemu_set_schedule(const char *spec);
/** The current schedule as a spec string ("forward", "reverse", "random:7"). */
const char *kvemu_get_schedule(void);
/** Number of OS worker threads blocks are spread over (KVEMU_THREADS, else all hardware threads). */
int kvemu_num_workers(void);
/** Message of the last failed launch or kernel ("" if none): kernel name, block, what went wrong. */
const char *kvemu_last_message(void);
/** Device-memory limit in bytes for cudaMalloc (0: none); KVEMU_MEM_LIMIT sets the initial value
 * (a number with optional K, M or G suffix). */
void kvemu_set_mem_limit(size_t bytes);
/** Bytes currently allocated with cudaMalloc / cudaMallocManaged. */
size_t kvemu_mem_in_use(void);
/**
 * Fault injection: the @p n-th allocation from now (cudaMalloc, cudaMallocManaged,
 * cudaMallocHost, cudaHostAlloc; n >= 1, this thread or any other) fails once with
 * cudaErrorMemoryAllocation, as an out-of-memory device would, and is recorded as the last
 * error; 0 disarms. Lets a test fail each allocation of an operation in turn.
 */
void kvemu_fail_alloc(long n);
/** 1 once the allocation armed by kvemu_fail_alloc() has failed (reading it disarms nothing). */
int kvemu_alloc_failed(void);
/** Read the counters. */
void kvemu_stats_get(kvemu_stats *out);
/** Zero the counters. */
void kvemu_stats_reset(void);

/* ---- the launch seam (KV_LAUNCH in kv_cuda.cuh) ------------------------------------------ */
struct CUstream_st;
/**
 * Run @p body once per thread of a grid. @p key identifies the kernel for cudaFuncSetAttribute;
 * @p name is what error messages print. Configuration errors and kernel failures are reported
 * through cudaGetLastError(), as a real launch reports them.
 */
void kvemu_launch_raw(const char *name, const void *key, unsigned gx, unsigned gy, unsigned gz,
                      unsigned bx, unsigned by, unsigned bz, size_t smem, struct CUstream_st *stream,
                      void (*body)(const void *), const void *arg);
/** The calling block's dynamic shared memory (KV_DYNAMIC_SMEM). */
void *kvemu_dynamic_smem(void);

#ifdef __cplusplus
} /* extern "C" */

/** Key of a kernel for the attribute table: its address. */
template <class F>
inline const void *kvemu_func_key(F *kernel)
{
    return (const void *)kernel;
}

/** KV_LAUNCH's target: @p body is a lambda that calls the kernel with its captured arguments. */
template <class F>
inline void kvemu_launch(const char *name, const void *key, dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, const F &body)
{
    kvemu_launch_raw(name, key, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, stream,
                     [](const void *p) { (*static_cast<const F *>(p))(); }, &body);
}
#endif

#endif
