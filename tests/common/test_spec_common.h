/*
 * Pieces test_spec (CPU) and test_gpu_spec (CUDA) share (chapter 10): the cache spec of a
 * one-slot run, and the comparison of the rows two host caches keep after a rollback; and the
 * models test_spec_window and test_gpu_spec_window roll back on.
 */
#ifndef TEST_SPEC_COMMON_H
#define TEST_SPEC_COMMON_H

#include <stdio.h>
#include <string.h>

#include "kv_cache.h"
#include "kv_model.h"
#include "kv_spec.h"

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

/* The models of the window and KIVI rounds: tiny (m) and its one-layer draft view (dm), and a
 * d = 32 twin of tiny (KIVI needs 32 | d) of shape c with random weights (wide) and its draft
 * view (wd). 1, with the message on stderr, when one cannot be built. */
static inline int spec_window_models(kv_model *m, kv_model *dm, kv_model *wide, kv_model *wd,
                                     kv_config *c)
{
    kv_err e;
    if (kv_model_default(m, KV_DEFAULT_TINY, &e) || kv_model_layer_prefix(dm, m, 1, &e))
        goto fail;
    *c = m->config;
    c->n_heads = 2;
    c->n_kv_heads = 2;
    c->rotary_dim = 32;
    if (kv_model_alloc(wide, c, &e) || kv_model_layer_prefix(wd, wide, 1, &e)) goto fail;
    kv_model_randomize(wide, 5);
    return 0;
fail:
    fprintf(stderr, "model: %s\n", e.msg);
    return 1;
}

#endif
