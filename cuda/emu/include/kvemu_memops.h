/**
 * @file kvemu_memops.h
 * Memory operations with rules a plain load does not show on a CPU (C++; cuda/emu/memops.cpp):
 *
 *  - vector loads: a 16-byte `ld.global.nc.v4` (an __ldg of a uint4 or float4) faults on a GPU
 *    when its address is not 16-byte aligned; kvemu_check_align() aborts the process with a
 *    message naming the address, the kernel, the block and the thread, as the fault ends the
 *    GPU's context;
 *  - cp.async (cuda_pipeline.h's __pipeline_memcpy_async / _commit / _wait_prior): each copy
 *    is deferred. At issue its source bytes are taken and its destination is filled with 0xff
 *    (NaN as float, -1 as int); __pipeline_commit() closes the thread's open copies into a
 *    batch, and __pipeline_wait_prior(N) lands every batch but the N newest. So a read of a
 *    destination before the wait that covers it sees the poison, and a missing wait or a wait
 *    on the wrong batch fails a test instead of passing by luck. Copies a thread never waited
 *    for never land (their destinations keep the poison).
 */
#ifndef KVEMU_MEMOPS_H
#define KVEMU_MEMOPS_H

#include <stddef.h>
#include <stdint.h>

/** Abort with a message when @p p is not a multiple of @p bytes; @p what names the access. */
void kvemu_misaligned(const void *p, int bytes, const char *what);
static inline void kvemu_check_align(const void *p, int bytes, const char *what)
{
    if ((uintptr_t)p % (uintptr_t)bytes) kvemu_misaligned(p, bytes, what);
}

/** cp.async of @p size (4, 8 or 16) bytes, the last @p zfill of them zeros instead of a copy. */
void kvemu_cp_async(void *dst, const void *src, size_t size, size_t zfill);
void kvemu_cp_commit(void);
void kvemu_cp_wait_prior(size_t prior);
/** The running thread's copies in flight (committed or not): for the emulator's tests. */
int kvemu_cp_pending(void);

#endif
