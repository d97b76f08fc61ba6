/*
 * Pieces test_spec (CPU) and test_gpu_spec (CUDA) share (chapter 10): the cache spec of a
 * one-slot run, and the comparison of the rows two host caches keep after a rollback.
 */
#ifndef TEST_SPEC_COMMON_H
#define TEST_SPEC_COMMON_H

#include <string.h>

#include "kv_cache.h"

/* One slot of @p cap tokens; paged: blocks of @p block tokens, two spare. */
static inline kv_cache_spec spec_cache_spec(int paged, int dtype, int cap, int block)
{
    kv_cache_spec s = kv_cache_spec_default(1, cap);
    s.quant.dtype = dtype;
    if (paged) {
        s.layout.kind = KV_LAYOUT_PAGED;
        s.layout.block_size = block;
        s.layout.n_blocks = cap / block + 2;
    }
    return s;
}

/* Rows 0..len-1 of slot 0 equal in two caches: codes bytes and every decoded element. */
static long rows_differ(const kv_cache *x, const kv_cache *y, int len)
{
    long bad = 0;
    for (int l = 0; l < x->n_layers; l++)
        for (int i = 0; i < x->n_planes; i++)
            for (int h = 0; h < x->n_kv_heads; h++) {
                const int r = kv_cache_plane_role(i);
                const kv_head_view a = kv_cache_view(x, l, 0, h, r);
                const kv_head_view b = kv_cache_view(y, l, 0, h, r);
                const int64_t rb = kv_cache_plane_of(x->planes, x->n_layers, i, l)->row_bytes;
                for (int t = 0; t < len; t++) {
                    bad += memcmp(a.codes + kv_view_row(&a, t) * rb,
                                  b.codes + kv_view_row(&b, t) * rb, (size_t)rb) != 0;
                    for (int j = 0; j < x->head_dim; j++) {
                        const float u = kv_cache_elem(&a, t, j), v = kv_cache_elem(&b, t, j);
                        bad += memcmp(&u, &v, sizeof u) != 0;
                    }
                }
            }
    return bad;
}

#endif
