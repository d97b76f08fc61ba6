/**
 * @file kv_flash_grid.h
 * Chapter 08: how long a causal prefill's grid of blocks takes on a GPU whose SMs run a fixed
 * number of blocks at once, by a model, not a measurement (what v6's longest-first order is
 * predicted to save; kvlab bench prefill --dry-run prints it).
 *
 * The grid: the T queries of a causal job cut into query tiles of q_block queries, one block
 * per (query tile, KV head). Query tile i sees the keys 0 .. min(T, (i + 1)·q_block) - 1, so it
 * reads ceil(min(T, (i + 1)·q_block) / k_tile) key tiles; a block's time is that count plus a
 * fixed cost of @c extra tiles' worth (loading its queries, writing its output).
 *
 * The machine: @c slots blocks run at once (SMs × blocks per SM). The blocks start in grid order,
 * each on the first slot to come free (list scheduling). Two orders:
 *  - index order (v5): query tile 0 first, the KV heads fastest, so the longest blocks come last
 *    and the last wave is all long ones, while other slots idle;
 *  - longest first (v6): block b takes query tile n - 1 - b / H_kv, so the short blocks fill the
 *    end (Graham's longest-processing-time rule, within 4/3 of the best).
 * Balanced is the total time over the slots, or the longest block's time where that is more (a
 * grid of less than one wave): no order ends sooner.
 */
#ifndef KV_FLASH_GRID_H
#define KV_FLASH_GRID_H

#include <stdint.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A causal prefill's grid and the machine it runs on. */
typedef struct {
    int T;          /**< queries and keys (causal: query t sees keys 0 .. t) */
    int q_block;    /**< queries per block (v6: 128 rows / G query heads) */
    int k_tile;     /**< keys per tile (v6 at d = 128: 32, fv6_keys()) */
    int n_kv_heads; /**< blocks per query tile */
    int extra;      /**< a block's fixed cost, in key tiles */
    int slots;      /**< blocks that run at once: SMs × blocks per SM */
} kv_flash_grid;

/** The model's times, in key tiles. */
typedef struct {
    int64_t blocks;   /**< n_query_tiles · n_kv_heads */
    int64_t total;    /**< the blocks' times summed */
    double balanced;  /**< max(total / slots, the longest block's time) */
    int64_t makespan; /**< when the last block ends */
} kv_flash_grid_time;

/**
 * The grid's time when its blocks start in index order (@p longest_first 0) or longest first
 * (1). KV_ERR_ARG for a count below 1 (extra below 0); KV_ERR_NOMEM.
 */
int kv_flash_grid_schedule(const kv_flash_grid *g, int longest_first, kv_flash_grid_time *out,
                           kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
