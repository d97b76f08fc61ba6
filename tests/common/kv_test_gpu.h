/*
 * kv_test_gpu.h: the CUDA side of the backend fixtures (kv_test_backend.h has the CPU's).
 *
 *  - kv_test_no_gpu: 1, with the reason printed, when no usable device answers; a GPU test's
 *    main() then returns KV_TEST_SKIP (CTest shows it as skipped);
 *  - kv_test_make_cuda: the factory (kv_needle_backend_fn) that builds the CUDA backend, the twin
 *    of kv_test_make_cpu: a test body written against a factory runs on either device.
 * Include after kv_test.h.
 */
#ifndef KV_TEST_GPU_H
#define KV_TEST_GPU_H

#include <stdio.h>

#include "kv_backend.h"
#include "kv_test.h"
#include "kvcu.h"

static inline int kv_test_no_gpu(void)
{
    kv_err e;
    if (kvcu_device_available(&e) == KV_OK) return 0;
    printf("skipped: %s\n", e.msg);
    return 1;
}

static inline int kv_test_make_cuda(kv_backend **out, const kv_model *m, const kv_cache_spec *spec,
                                    void *user, kv_err *err)
{
    (void)user;
    return kvcu_backend_create(out, m, spec, err);
}

#endif
