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
    c->rotary_dim = cfg->rotary_dim;
    if (c->spec.window.size == 0 || c->spec.window.pos_scheme != KV_POS_CACHE) return KV_OK;
    size_t bytes = 0;
    float *cs = kv_cache_rope_table(cfg, &c->spec, &bytes); /* the host's lines, same libm */
    if (!cs)
        return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: RoPE table of %d positions",
                       c->spec.window.n_sinks + c->spec.window.size);
    cudaError_t e = cudaMalloc(&c->d_rope_cs, bytes);
    if (e == cudaSuccess) e = cudaMemcpy(c->d_rope_cs, cs, bytes, cudaMemcpyHostToDevice);
    kv_free(cs);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* a failed allocation is not sticky: clear it */
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_create: %s", cudaGetErrorString(e));
    }
    return KV_OK;
}
