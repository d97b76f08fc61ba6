/*
 * kv_test_backend.h: backend fixtures the tests share.
 *
 *  - kv_test_config: the small random-weight model shape of the cache and attention tests
 *    (hidden 2·H·d, 64 tokens of vocabulary, full rotary dims);
 *  - kv_test_config_attn: the one-layer shape of the cache and attention tests that build no
 *    model (hidden 64, 16 tokens of vocabulary, the first rot dims of a head rotated);
 *  - kv_test_spec_window: one slot of a dtype with a window of W rows and S sinks;
 *  - kv_test_spec_paged / kv_test_blocks_reversed: a paged layout of B-token blocks, and slot
 *    0's table in reverse pool order (no logical neighbours are physical ones);
 *  - kv_test_cache_open / kv_test_cache_fill: a one-slot cache created (paged: its table
 *    reversed) and filled with n rows of given keys and values;
 *  - kv_test_model_random: a model of a shape with random weights (a failure is a failed check);
 *  - kv_test_make_cpu: the factory kv_needle_grid() and kv_dialogue_run() call to build the CPU
 *    backend for a cell (the needle, dialogue and quantized-grid tests);
 *  - kv_test_pool_shuffle: every free block of a pool allocated, then freed in a shuffled order;
 *    the free stack is LIFO, so tables built afterwards are not 0, 1, 2, ... and a paged path
 *    that assumed consecutive blocks shows;
 *  - kv_test_pool_poison: the same after filling every free block of a cache's memory with 0xFF
 *    bytes (NaN in fp32, fp16 and int8 scales): a swap in lands on other blocks than the swap out left,
 *    and a byte it failed to bring back shows.
 * Include after kv_test.h.
 */
#ifndef KV_TEST_BACKEND_H
#define KV_TEST_BACKEND_H

#include "kv_backend.h"
#include "kv_paged.h"
#include "kv_pool.h"
#include "kv_rng.h"
#include "kv_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline kv_config kv_test_config(int L, int H, int Hkv, int d, int seq_len)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = H * d;
    c.hidden_dim = 2 * c.dim;
    c.n_layers = L;
    c.n_heads = H;
    c.n_kv_heads = Hkv;
    c.vocab_size = 64;
    c.seq_len = seq_len;
    c.rope_theta = 10000.0f;
    c.rotary_dim = d;
    c.norm_eps = 1e-5f;
    return c;
}

static inline kv_config kv_test_config_attn(int H, int Hkv, int d, int rot, int seq_len)
{
    kv_config c = kv_test_config(1, H, Hkv, d, seq_len);
    c.hidden_dim = 64;
    c.vocab_size = 16;
    c.rotary_dim = rot;
    return c;
}

static inline kv_cache_spec kv_test_spec_window(int dtype, int W, int S, int scheme, int capacity)
{
    kv_cache_spec s = kv_cache_spec_default(1, capacity);
    s.quant.dtype = dtype;
    s.window.size = W;
    s.window.n_sinks = S;
    s.window.pos_scheme = scheme;
    return s;
}

/* s paged in n_blocks blocks of B tokens; B = 0 leaves s as it is. */
static inline void kv_test_spec_paged(kv_cache_spec *s, int B, int n_blocks)
{
    if (!B) return;
    s->layout.kind = KV_LAYOUT_PAGED;
    s->layout.block_size = B;
    s->layout.n_blocks = n_blocks;
}

/* Slot 0 of c gets nb logical blocks, the last pool block first (pool of n_pool blocks). */
static inline int kv_test_blocks_reversed(kv_cache *c, int n_pool, int nb, kv_err *e)
{
    int *t = (int *)malloc((size_t)nb * sizeof(int)); /* [nb] */
    for (int i = 0; i < nb; i++) t[i] = n_pool - 1 - i;
    const int rc = kv_cache_set_blocks(c, 0, t, nb, e);
    free(t);
    return rc;
}

/* c of shape cfg and spec s, slot 0's table reversed when paged; a failure is a failed check
 * naming what (and c freed). */
static inline int kv_test_cache_open(kv_cache *c, const kv_config *cfg, const kv_cache_spec *s,
                                     const char *what)
{
    kv_err e;
    if (kv_cache_create(c, cfg, s, &e)) {
        KV_CHECK(0, "%s: kv_cache_create: %s", what, e.msg);
        return -1;
    }
    const int B = s->layout.block_size;
    if (s->layout.kind == KV_LAYOUT_PAGED &&
        kv_test_blocks_reversed(c, s->layout.n_blocks, (int)((s->capacity + B - 1) / B), &e)) {
        KV_CHECK(0, "%s: set_blocks: %s", what, e.msg);
        kv_cache_free(c);
        return -1;
    }
    return 0;
}

/* Rows 0..n-1 of slot 0 written from k and v [n][H_kv][d] (both freed here), the slot's
 * length set to n; a failure is a failed check (and c freed). */
static inline int kv_test_cache_fill(kv_cache *c, int n, float *k, float *v)
{
    kv_err e;
    const int rc = n ? kv_cache_write_seq(c, 0, 0, 0, n, k, v, &e) : KV_OK;
    free(k);
    free(v);
    if (rc) {
        KV_CHECK(0, "write_seq: %s", e.msg);
        kv_cache_free(c);
        return -1;
    }
    c->len[0] = n;
    return 0;
}

static inline int kv_test_model_random(kv_model *m, const kv_config *c, uint64_t seed)
{
    kv_err e;
    const int rc = kv_model_alloc(m, c, &e);
    if (rc)
        KV_CHECK(0, "model: %s", e.msg);
    else
        kv_model_randomize(m, seed);
    return rc;
}

static inline int kv_test_make_cpu(kv_backend **out, const kv_model *m, const kv_cache_spec *spec,
                                   void *user, kv_err *err)
{
    (void)user;
    return kv_backend_cpu(out, m, spec, err);
}

/* Takes every free block of p into ids [p->n_blocks]; returns how many. */
static inline int kv_test_pool_take_all(kv_pool *p, int *ids)
{
    kv_err e;
    int n = 0;
    while (ids && n < p->n_blocks && kv_pool_alloc(p, &ids[n], &e) == KV_OK) n++;
    return n;
}

/* Frees ids [n] in an order shuffled by seed (Fisher-Yates). */
static inline void kv_test_pool_free_shuffled(kv_pool *p, int *ids, int n, uint64_t seed)
{
    kv_err e;
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(kv_rng_u32(&r) % (uint32_t)(i + 1)), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (int i = 0; i < n; i++) kv_pool_unref(p, ids[i], &e);
}

static inline void kv_test_pool_shuffle(kv_pool *p, uint64_t seed)
{
    int *ids = (int *)malloc((size_t)p->n_blocks * sizeof(int)); /* [N] */
    const int n = kv_test_pool_take_all(p, ids);
    kv_test_pool_free_shuffled(p, ids, n, seed);
    free(ids);
}

static inline void kv_test_pool_poison(kv_cache_mem *mem, uint64_t seed)
{
    kv_pool *p = &mem->paged->pool;
    const size_t bb = mem->block_bytes(mem);
    int *ids = (int *)malloc((size_t)p->n_blocks * sizeof(int));                            /* [N] */
    kv_block_copy *pairs = (kv_block_copy *)malloc((size_t)p->n_blocks * sizeof *pairs); /* [N] */
    uint8_t *junk = (uint8_t *)malloc(bb);                                                   /* [block_bytes] */
    memset(junk, 0xFF, bb);
    const int n = kv_test_pool_take_all(p, ids);
    for (int i = 0; i < n; i++) pairs[i] = (kv_block_copy){0, ids[i]};
    kv_err e;
    KV_CHECK(mem->write_blocks(mem, pairs, n, junk, bb, &e) == KV_OK, "poison: %s", e.msg);
    kv_test_pool_free_shuffled(p, ids, n, seed);
    free(ids);
    free(pairs);
    free(junk);
}

#endif
