/*
 * The parts of the cache (kv_cache.h) and the one small interface they meet at: private to
 * reference_cpu/cache/.
 *
 * Writing token p of (layer, slot, KV head h) is a product of independent choices, each in its
 * own file, none of which knows the others:
 *
 *   retention   position p -> logical row r      kv_cache_logical_row()  kv_cache_window.c (06)
 *   layout      (slot, h, r) -> where it lives   kv_cache_locate()       kv_cache.c (02),
 *                                                                        kv_cache_paged.c (05)
 *   undo        what that row held, saved        kv_cache_undo_row()     kv_cache_undo.c (10)
 *   format      x [d] -> the row's codes + meta  kv_cache_row_encode()   kv_cache_codec.c (04)
 *
 * so every format works on every layout, with or without a window, without a branch for the
 * combination. KIVI (chapter 04) is the one format whose rows are not self-contained: it
 * quantizes groups of 32 rows and stages the newest tokens in an fp32 window, so its write is
 * its own (kv_cache_kivi.c), built from the same locator and the same log.
 * The spec's checks and the spec-string parser are kv_cache_spec.c; the host state both
 * devices share (lengths, tables, every check on them) is kv_cache_state.c. The CUDA cache
 * (cuda/cache/) includes this header too: it is the same cache with device memory.
 */
#ifndef KV_CACHE_INTERNAL_H
#define KV_CACHE_INTERNAL_H

#include "kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits that catch a mistyped spec before it asks for absurd memory. */
#define KV_CACHE_MAX_SLOTS 65536
#define KV_CACHE_MAX_CAPACITY (1 << 24) /* 16M tokens per slot */

/* ---- the cache's memory (kv_cache_state.c): host, or c->device's functions ------------------ */

/** n bytes from src to dst inside the cache's memory. */
int kv_cache_copy(const kv_cache *c, void *dst, const void *src, size_t n, const char *who,
                  kv_err *err);
/** n zeroed bytes of the cache's memory into *p; kv_cache_release() frees them (NULL is fine). */
int kv_cache_alloc(const kv_cache *c, void **p, size_t n, const char *who, kv_err *err);
void kv_cache_release(const kv_cache *c, void *p);

/* ---- the row locator ------------------------------------------------------------------------ */

/** Where one token row of (slot, KV head h) is stored. */
typedef struct {
    int64_t head;  /* slot·H_kv + h: the index of the head's fp8 scale and KIVI window */
    int64_t rhead; /* the head whose codes and metadata hold the row: head itself
                    * (contiguous) or h (paged: the pool's head h) */
    int64_t row;   /* the row in rhead's [rows][row_bytes] codes */
} kv_row_loc;

/** Retention (chapter 06): the logical row of position @p p, a sink's own row or its place in
 * the ring; p itself without a window. */
static inline int64_t kv_cache_logical_row(const kv_cache *c, int64_t p)
{
    return kv_window_row(c->spec.window.size, c->spec.window.n_sinks, p);
}

/** Layout: where logical row @p r of (@p slot, KV head @p h) lives (kv_cache.c; a paged
 * cache asks kv_cache_paged_row()). */
kv_row_loc kv_cache_locate(const kv_cache *c, int slot, int h, int64_t r);
/** Chapter 05: the pool row of a slot's logical row r, through its block table. */
int64_t kv_cache_paged_row(const kv_cache *c, int slot, int64_t r);

/* ---- the row codec (kv_cache_codec.c) ------------------------------------------------------- */

/** A format's per-sequence work before a chunk's rows are written: fp8 calibrates the slot's
 * scales from the chunk that starts at position 0; nothing for the other formats. */
void kv_cache_codec_begin(kv_cache *c, int layer, int slot, int pos, int n,
                          const float *const *x);
/** Encode one row x [d] into the row @p at of plane @p p (layer's format, not KIVI): its codes
 * and, where the format keeps them per row, its scales. */
int kv_cache_row_encode(kv_cache *c, int layer, kv_cache_plane *p, kv_row_loc at,
                        const float *x, kv_err *err);

/* ---- chapter 06: the window (kv_cache_window.c) --------------------------------------------- */

/** The spec rules of a window, for a cache with capabilities @p caps (KV_CACHE_CAN_*). */
int kv_cache_window_check(const char *who, const kv_cache_spec *spec, int caps, kv_err *err);
/** KV_POS_CACHE: c->rope_cs, the rotation of every cache index, in host memory (the CUDA
 * cache uploads it); nothing otherwise. */
int kv_cache_window_create(kv_cache *c, const char *who, const kv_config *cfg, kv_err *err);

/* ---- chapter 04: KIVI (kv_cache_kivi.c) ----------------------------------------------------- */

/** Store a chunk of a KIVI layer, x[i] [n][H_kv][d] for each plane i: the fp32 window, and
 * the 32-token groups that leave it. */
int kv_cache_kivi_write(kv_cache *c, int layer, int slot, int pos, int n, const float *const *x,
                        kv_err *err);
/** Q(len): the tokens a KIVI slot of @p len holds quantized, the smallest multiple of 32 that
 * leaves at most R in the window (every chunking reaches it), never below @p q_armed. */
int kv_cache_kivi_qlen(int len, int R, int q_armed);

/* ---- chapter 10: the undo log (kv_cache_undo.c) --------------------------------------------- */

/** A windowed cache is about to write position t (of a write of n at pos) into row @p at:
 * save what the row holds when the slot's log is armed and a rollback can reach t. */
int kv_cache_undo_row(kv_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                      kv_row_loc at, int pos, int n, int64_t t, kv_err *err);
/** KIVI: save each new token's fp32 window row as a one-token-at-a-time run would find it
 * (the chunk's token t-R when it is in the chunk x [n][H_kv][d], else the window @p ring). */
int kv_cache_undo_window(kv_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                         int pos, int n, const float *x, const float *ring, kv_err *err);
/** KIVI: save the group of 32 rows at @p at (group start @p g) before a spill encodes it. */
int kv_cache_undo_group(kv_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                        kv_row_loc at, int pos, int n, int g, kv_err *err);
/** After a write of n at pos: the end of what the armed log covers. */
void kv_cache_undo_written(kv_cache *c, int slot, int pos, int n);
/** Disarm @p slot's log (nothing to roll back into). */
void kv_cache_undo_disarm(kv_cache *c, int slot);
/** Free every slot's log rows (kv_cache_state_free() frees the rest). */
void kv_cache_undo_free(kv_cache *c);

#ifdef __cplusplus
}
#endif
#endif
