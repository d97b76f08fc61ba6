/*
 * Chapter 06's part of the device cache, kv_cache_window.c's twin. A slot owns S+W rows
 * (contiguous) or ceil((S+W)/B) blocks (paged), and position p is written to its logical row
 * kv_window_row(p) (a sink's own row, or the ring), which the layout then maps as any other
 * row; a per-token row carries its own scales, so overwriting a ring row overwrites everything
 * that belonged to it. Under KV_POS_CACHE the keys arrive before RoPE (kvcu_forward skips their
 * rotation, as kv_forward does) and attention rotates them by cache index with d_rope_cs, the
 * CPU cache's table (kv_cache_rope_table()), bit for bit.
 */
#include <stdint.h>

#include "kvcu_cache_internal.cuh"

int kvcu_cache_window_create(kvcu_cache *c, const kv_config *cfg, kv_err *err)
{
    /* the host's table (the CPU's lines, same libm), then its device copy */
    int rc = kv_cache_window_create(c, "kvcu_cache_create", cfg, err);
    if (rc || !c->rope_cs) return rc;
    const int64_t n = kv_window_keep(c->spec.window.size, c->spec.window.n_sinks) *
                      (c->rotary_dim / 2) * 2; /* [S+W][rotary_dim/2][2] */
    const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
    cudaError_t e = cudaMalloc(&c->d_rope_cs, bytes);
    if (e == cudaSuccess) e = cudaMemcpy(c->d_rope_cs, c->rope_cs, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* a failed allocation is not sticky: clear it */
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_create: %s", cudaGetErrorString(e));
    }
    return KV_OK;
}
