/*
 * Pieces test_tp (CPU ranks), test_gpu_tp_shard (CUDA shards on one device) and test_gpu_tp
 * (one GPU per rank, NCCL) share (chapter 10): the prompt, a random-weight model of a given
 * shape, and where one KV head of one layer lives in a host fp32 contiguous cache.
 */
#ifndef TEST_TP_COMMON_H
#define TEST_TP_COMMON_H

#include <stdio.h>
#include <string.h>

#include "kv_cache.h"
#include "kv_model.h"

#define NP 7 /* prompt tokens */
static const int PROMPT[NP] = {3, 41, 17, 88, 5, 60, 23};

/* Random weights (seeded), vocabulary 97, context @p seq_len. 0, or 1 with the reason printed. */
static inline int tp_make_model(kv_model *m, int dim, int hidden, int L, int H, int Hkv,
                                int seq_len, uint64_t seed)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = dim, c.hidden_dim = hidden, c.n_layers = L, c.n_heads = H, c.n_kv_heads = Hkv;
    c.vocab_size = 97, c.seq_len = seq_len;
    kv_config_set_defaults(&c);
    kv_err e;
    if (kv_model_alloc(m, &c, &e)) {
        printf("model: %s\n", e.msg);
        return 1;
    }
    kv_model_randomize(m, seed);
    return 0;
}

/* K (@p role 0) or V (1) rows of KV head @p h, layer @p l, slot @p slot of an fp32 contiguous
 * cache: [capacity][d] inside layer l's plane [n_slots][H_kv][capacity][d]. */
static inline const float *tp_layer_head(const kv_cache *c, int role, int l, int slot, int h)
{
    const float *base =
        (const float *)(const void *)kv_cache_plane_of(c->planes, c->n_layers, role, l)->codes;
    return base + (((size_t)slot * c->n_kv_heads + h) * c->rows) * c->head_dim;
}

#endif
