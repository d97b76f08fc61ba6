/*
 * The parts of the device cache and the host launchers they meet at: private to cuda/cache/,
 * the mirror of reference_cpu/cache/kv_cache_internal.h, file for file:
 *
 *   kvcu_cache.cu         chapter 02: the cache's life, and the write that composes the parts
 *   kvcu_cache_codec.cu   chapter 04: the write kernels, one token row in a storage format
 *   kvcu_cache_kivi.cu    chapter 04: KIVI's fp32 window and 32-token spills
 *   kvcu_cache_paged.cu   chapter 05: block tables and the block operations
 *   kvcu_cache_window.cu  chapter 06: the rotation table of KV_POS_CACHE
 *   kvcu_cache_undo.cu    chapter 10: the undo log of a speculative step
 *
 * The row locator is device code shared with attention (kvcu_internal.cuh): kv_window_row()
 * maps a position to its logical row (chapter 06), kvcu_slot_row() a logical row to its
 * physical one (contiguous: itself; paged: through the slot's table).
 */
#ifndef KVCU_CACHE_INTERNAL_CUH
#define KVCU_CACHE_INTERNAL_CUH

#include "kv_cache_internal.h" /* the CPU cache's parts: the locator, the undo log's hooks */
#include "kvcu_internal.cuh"

#define KVCU_CACHE_THREADS 128
/* kv_cache_create()'s limits, so a spec one device refuses the other refuses too */
#define KVCU_CACHE_MAX_CAPACITY (1 << 24)

/* A layer's planes and a chunk's rows for each, by value for the write kernels: block z of a
 * launch with gridDim.z = n planes works on plane z. */
typedef struct {
    kv_cache_plane p[KV_CACHE_KV_PLANES];
    const float *x[KV_CACHE_KV_PLANES]; /* device [T][H_kv][d]: plane i's rows (K, then V) */
} kvcu_layer_planes;

/* The planes of @p layer with the rows k and v (K's and V's, in plane order). */
static inline kvcu_layer_planes kvcu_layer_planes_of(const kvcu_cache *c, int layer,
                                                     const float *k, const float *v)
{
    kvcu_layer_planes lp;
    const float *x[KV_CACHE_KV_PLANES] = {k, v};
    for (int i = 0; i < c->n_planes; i++) {
        lp.p[i] = *kv_cache_plane_of(c->planes, c->n_layers, i, layer);
        lp.x[i] = x[i];
    }
    return lp;
}

/* ---- the row codec (kvcu_cache_codec.cu) ---------------------------------------------------- */

/* fp8: calibrate the scales of each sequence of the step that starts at position 0, from its
 * chunk (k, v [T][H_kv][d] device, seqs host); nothing for the other formats. */
int kvcu_cache_codec_begin(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                           const float *k, const float *v, kv_err *err);
/* Encode T token rows of a per-token format (not KIVI): token t at position tok_pos[t] of slot
 * tok_slot[t] (device arrays), into its located row. */
int kvcu_cache_encode_rows(kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                           const float *k, const float *v, int T, kv_err *err);
/* Encode n token rows into pool rows d_slots[i] (device; negative: padding). */
int kvcu_cache_encode_slots(kvcu_cache *c, int layer, const int64_t *d_slots, int n,
                            const float *k, const float *v, kv_err *err);

/* ---- chapter 06 (kvcu_cache_window.cu) ------------------------------------------------------ */

/* KV_POS_CACHE: d_rope_cs, kv_cache_rope_table() on the device; nothing otherwise. */
int kvcu_cache_window_create(kvcu_cache *c, const kv_config *cfg, kv_err *err);

/* ---- chapter 04, KIVI (kvcu_cache_kivi.cu) -------------------------------------------------- */

/* The step's KIVI write of one layer: spills, then the fp32 window (kvcu_cache_write()'s
 * arguments). */
int kvcu_cache_kivi_write(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                          const int *tok_slot, const int *tok_pos, const float *k,
                          const float *v, int T, kv_err *err);

/* ---- chapter 10 (kvcu_cache_undo.cu) -------------------------------------------------------- */

/* Before layer's write of sequence s (its rows at t0 of the step's k, v): the ring rows a
 * window overwrites, or KIVI's window rows, into the slot's armed log. */
int kvcu_cache_undo_rows(kvcu_cache *c, int layer, const kv_seq *s, int t0, const float *k,
                         const float *v, kv_err *err);

/* ---- the device's memory for the host state (kvcu_cache.cu) --------------------------------- */

/* The host's qlen [L][n_slots] into its device mirror d_qlen. */
int kvcu_cache_sync_qlen(kvcu_cache *c, kv_err *err);

#endif
