/* The scheduling model of a causal prefill's grid (kv_flash_grid.h): list scheduling of the
 * blocks, in grid order, on a fixed number of slots. */
#include "kv_flash_grid.h"

#include <stdlib.h>

/* Key tiles query tile i reads: its last query sees keys 0 .. min(T, (i + 1)·q_block) - 1. */
static int64_t key_tiles(const kv_flash_grid *g, int64_t i)
{
    int64_t keys = (i + 1) * g->q_block;
    if (keys > g->T) keys = g->T;
    return (keys + g->k_tile - 1) / g->k_tile;
}

int kv_flash_grid_schedule(const kv_flash_grid *g, int longest_first, kv_flash_grid_time *out,
                           kv_err *err)
{
    if (g->T < 1 || g->q_block < 1 || g->k_tile < 1 || g->n_kv_heads < 1 || g->extra < 0 ||
        g->slots < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_flash_grid_schedule: T %d, q_block %d, k_tile %d, "
                       "n_kv_heads %d, extra %d, slots %d", g->T, g->q_block, g->k_tile,
                       g->n_kv_heads, g->extra, g->slots);
    const int64_t n_tiles = ((int64_t)g->T + g->q_block - 1) / g->q_block;
    int64_t *free_at = calloc((size_t)g->slots, sizeof *free_at); /* [slots] when each is free */
    if (!free_at) return kv_fail(err, KV_ERR_NOMEM, "kv_flash_grid_schedule: %d slots", g->slots);
    out->blocks = n_tiles * g->n_kv_heads;
    out->total = 0;
    out->makespan = 0;
    int64_t longest = 0; /* the longest block's time */
    for (int64_t b = 0; b < out->blocks; b++) {
        const int64_t tile = longest_first ? n_tiles - 1 - b / g->n_kv_heads : b / g->n_kv_heads;
        const int64_t t = key_tiles(g, tile) + g->extra;
        int s = 0; /* the first slot to come free (the lowest index among equals) */
        for (int k = 1; k < g->slots; k++)
            if (free_at[k] < free_at[s]) s = k;
        free_at[s] += t;
        if (free_at[s] > out->makespan) out->makespan = free_at[s];
        out->total += t;
        if (t > longest) longest = t;
    }
    out->balanced = (double)out->total / g->slots;
    if (out->balanced < longest) out->balanced = (double)longest;
    free(free_at);
    return KV_OK;
}
