/**
 * @file cuda_pipeline_primitives.h
 * The CUDA pipeline primitives (cp.async on sm_80+) for the emulation build: deferred copies
 * whose commit/wait order is checked, kvemu_memops.h explains how.
 */
#ifndef KVEMU_CUDA_PIPELINE_PRIMITIVES_H
#define KVEMU_CUDA_PIPELINE_PRIMITIVES_H

#include "kvemu_memops.h"

inline void __pipeline_memcpy_async(void *dst_shared, const void *src_global, size_t size_and_align,
                                    size_t zfill = 0)
{
    kvemu_cp_async(dst_shared, src_global, size_and_align, zfill);
}
inline void __pipeline_commit(void) { kvemu_cp_commit(); }
inline void __pipeline_wait_prior(size_t prior) { kvemu_cp_wait_prior(prior); }

#endif
