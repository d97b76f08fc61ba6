/**
 * @file kv_cache.h
 * The KV cache as a pluggable strategy: where K/V live, in what format, which are kept.
 *
 * The forward pass (kv_forward.h) never indexes cache memory itself: it calls
 * kv_cache_write() for new tokens and kv_attention_head() (kv_attention.h) to read them, and
 * both dispatch on the ::kv_cache_spec. Chapters add layouts, dtypes and retention policies here
 * instead of copying the forward pass.
 *
 * Chapter 02 layout (contiguous, fp32), per layer and per sequence slot:
 *   k, v  [L][n_slots][H_kv][capacity][d]
 * Cache size = L · 2 · N · H_kv · d · b bytes (b = 4 for fp32).
 */
#ifndef KV_CACHE_H
#define KV_CACHE_H

#include "kv_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Where a sequence's K/V rows live. */
typedef enum {
    KV_LAYOUT_CONTIGUOUS = 0 /**< one [capacity][d] row block per (layer, slot, kv head) */
} kv_layout;
/** How a cached element is stored. */
typedef enum {
    KV_DTYPE_F32 = 0 /**< fp32, b = 4 */
} kv_dtype;

/** How a cache is built: chosen by the caller, checked by kv_cache_create(). */
typedef struct {
    int layout;   /**< ::kv_layout */
    int dtype;    /**< ::kv_dtype */
    int n_slots;  /**< sequences the cache holds at once (the batch) */
    int capacity; /**< tokens per sequence slot (N max) */
} kv_cache_spec;

/** Bytes one stored element takes (b), for the memory formula. */
size_t kv_dtype_bytes(int dtype);
/** Name of a dtype ("fp32"). */
const char *kv_dtype_name(int dtype);

typedef struct {
    kv_cache_spec spec;
    int n_layers, n_kv_heads, head_dim;
    float *k;  /* [L][n_slots][H_kv][capacity][d] */
    float *v;  /* [L][n_slots][H_kv][capacity][d] */
    int *len;  /* [n_slots] tokens currently stored per slot */
} kv_cache;

/** A spec for @p n_slots sequences of @p capacity tokens, contiguous fp32. */
kv_cache_spec kv_cache_spec_default(int n_slots, int capacity);

/** Allocate a cache for a model config; unsupported spec -> KV_ERR_UNSUPPORTED, named. */
int kv_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec, kv_err *err);
void kv_cache_free(kv_cache *c);
/** Forget a slot's tokens (length 0); the memory is kept. */
void kv_cache_reset(kv_cache *c, int slot);
/** Bytes of K and V storage the cache holds in total. */
size_t kv_cache_bytes(const kv_cache *c);

/**
 * Store one token's keys and values at position @p pos of @p slot in @p layer.
 * k, v  [H_kv][d]   (k already rotated by RoPE)
 */
void kv_cache_write(kv_cache *c, int layer, int slot, int pos, const float *k, const float *v);

/** Row of keys for (layer, slot, kv head): [capacity][d]. Contiguous layout only. */
static inline float *kv_cache_k(const kv_cache *c, int layer, int slot, int kvh)
{
    size_t row = (((size_t)layer * c->spec.n_slots + slot) * c->n_kv_heads + kvh);
    return c->k + row * (size_t)c->spec.capacity * c->head_dim;
}
/** Row of values for (layer, slot, kv head): [capacity][d]. */
static inline float *kv_cache_v(const kv_cache *c, int layer, int slot, int kvh)
{
    size_t row = (((size_t)layer * c->spec.n_slots + slot) * c->n_kv_heads + kvh);
    return c->v + row * (size_t)c->spec.capacity * c->head_dim;
}

#ifdef __cplusplus
}
#endif
#endif
