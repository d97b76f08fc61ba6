/*
 * Chapter 05 demo: what its two files (demo.c: parts 1-2, demo_sharing.c: parts 3-4) share,
 * the sizes of the parts and the helpers every part calls.
 */
#ifndef KV_DEMO_CH05_H
#define KV_DEMO_CH05_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_rng.h"

#define CH05_REQUESTS 8  /* part 2: requests taken from the Alpaca-like trace */
#define CH05_SAMPLES 4   /* part 3: parallel samples */
#define CH05_SAMPLE_LEN 24
#define CH05_SYSTEM 80   /* part 4: shared system prompt (the paper's 1-shot prefix length) */
#define CH05_GEN 16      /* part 4: greedy tokens per request */

static inline void seeded_tokens(int *t, int n, int vocab, uint64_t seed)
{
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) t[i] = 1 + (int)(kv_rng_u32(&r) % (uint32_t)(vocab - 1));
}

static inline kv_cache_spec paged_spec(int n_slots, int capacity, int B, int n_blocks)
{
    kv_cache_spec s = kv_cache_spec_default(n_slots, capacity);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = B;
    s.layout.n_blocks = n_blocks;
    return s;
}

/* A paged backend on the demo's device, or on the CPU where that device refuses the layout
 * (kv_demo_backend(); *dev names where it runs), with the prefix cache when asked. */
static inline int paged_backend(const kv_demo_ctx *ctx, const kv_model *m,
                                const kv_cache_spec *spec, int prefix_cache, kv_backend **b,
                                const char **dev, kv_err *err)
{
    int st = kv_demo_backend(ctx, m, spec, b, dev, err);
    if (!st && prefix_cache) st = kv_backend_enable_prefix_cache(*b, err);
    return st;
}

static inline void print_table(FILE *f, const kv_block_table *t, int sep)
{
    fputc('[', f);
    for (int i = 0; i < t->n_blocks; i++) {
        if (i) fputc(sep, f);
        fprintf(f, "%d", t->blocks[i]);
    }
    fputc(']', f);
}

/* Part 3, sharing: parallel samples of one prompt (demo_sharing.c). */
int kv_demo_ch05_sharing(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err);
/* Part 4, prefix caching (demo_sharing.c). */
int kv_demo_ch05_prefix(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err);

#endif
