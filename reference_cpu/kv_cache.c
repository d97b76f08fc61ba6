/* The KV cache (kv_cache.h): chapter 02's contiguous fp32 layout.
 *
 *   k, v  [L][n_slots][H_kv][capacity][d]
 *
 * Each (layer, slot, KV head) owns one [capacity][d] row block, so attention over a sequence
 * streams one contiguous run of memory per head. The price, which chapter 05 removes, is that
 * every slot reserves capacity tokens whether it uses them or not. */
#include "kv_cache.h"

#include <string.h>

/* Limits that catch a mistyped spec before it asks for absurd memory. */
#define KV_CACHE_MAX_SLOTS 65536
#define KV_CACHE_MAX_CAPACITY (1 << 24) /* 16M tokens per slot */

size_t kv_dtype_bytes(int dtype)
{
    switch (dtype) {
    case KV_DTYPE_F32: return 4;
    default: return 0;
    }
}

const char *kv_dtype_name(int dtype)
{
    switch (dtype) {
    case KV_DTYPE_F32: return "fp32";
    default: return "unknown";
    }
}

kv_cache_spec kv_cache_spec_default(int n_slots, int capacity)
{
    kv_cache_spec s;
    s.layout = KV_LAYOUT_CONTIGUOUS;
    s.dtype = KV_DTYPE_F32;
    s.n_slots = n_slots;
    s.capacity = capacity;
    return s;
}

int kv_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec, kv_err *err)
{
    if (!c || !cfg || !spec) return kv_fail(err, KV_ERR_ARG, "kv_cache_create: NULL argument");
    memset(c, 0, sizeof *c);
    if (spec->layout != KV_LAYOUT_CONTIGUOUS)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "kv_cache_create: cache layout %d is not supported (contiguous = %d)",
                       spec->layout, KV_LAYOUT_CONTIGUOUS);
    if (spec->dtype != KV_DTYPE_F32)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "kv_cache_create: cache dtype %d is not supported (fp32 = %d)", spec->dtype,
                       KV_DTYPE_F32);
    if (spec->n_slots < 1 || spec->n_slots > KV_CACHE_MAX_SLOTS)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_create: n_slots %d is outside [1, %d]",
                       spec->n_slots, KV_CACHE_MAX_SLOTS);
    if (spec->capacity < 1 || spec->capacity > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_create: capacity %d is outside [1, %d]",
                       spec->capacity, KV_CACHE_MAX_CAPACITY);
    if (cfg->n_layers < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 || cfg->dim < cfg->n_heads)
        return kv_fail(err, KV_ERR_ARG,
                       "kv_cache_create: bad model shape (L %d, H %d, H_kv %d, dim %d)",
                       cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->dim);

    const int d = kv_config_head_dim(cfg);
    /* elements of K (and of V): L · n_slots · H_kv · capacity · d, checked for overflow */
    const size_t factors[5] = {(size_t)cfg->n_layers, (size_t)spec->n_slots,
                               (size_t)cfg->n_kv_heads, (size_t)spec->capacity, (size_t)d};
    size_t n = 1;
    for (int i = 0; i < 5; i++) {
        if (n > SIZE_MAX / sizeof(float) / factors[i])
            return kv_fail(err, KV_ERR_NOMEM, "kv_cache_create: cache size overflows size_t");
        n *= factors[i];
    }
    const size_t bytes = n * sizeof(float);

    c->spec = *spec;
    c->n_layers = cfg->n_layers;
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = d;
    c->k = kv_calloc(bytes);
    c->v = kv_calloc(bytes);
    c->len = kv_calloc((size_t)spec->n_slots * sizeof(int));
    if (!c->k || !c->v || !c->len) {
        kv_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM,
                       "kv_cache_create: could not allocate 2 x %zu bytes of K/V storage", bytes);
    }
    return KV_OK;
}

void kv_cache_free(kv_cache *c)
{
    if (!c) return;
    kv_free(c->k);
    kv_free(c->v);
    kv_free(c->len);
    memset(c, 0, sizeof *c);
}

void kv_cache_reset(kv_cache *c, int slot)
{
    /* the stale K/V stay in memory; len is what makes them invisible to attention */
    if (c && c->len && slot >= 0 && slot < c->spec.n_slots) c->len[slot] = 0;
}

size_t kv_cache_bytes(const kv_cache *c)
{
    /* L · 2 · N · H_kv · d · b with N = n_slots · capacity reserved tokens */
    return (size_t)c->n_layers * 2 * (size_t)c->spec.n_slots * (size_t)c->spec.capacity *
           (size_t)c->n_kv_heads * (size_t)c->head_dim * kv_dtype_bytes(c->spec.dtype);
}

void kv_cache_write(kv_cache *c, int layer, int slot, int pos, const float *k, const float *v)
{
    /* contiguous fp32 is the only (layout, dtype) kv_cache_create() accepts so far */
    const int d = c->head_dim;
    for (int h = 0; h < c->n_kv_heads; h++) {
        memcpy(kv_cache_k(c, layer, slot, h) + (size_t)pos * d, k + (size_t)h * d,
               (size_t)d * sizeof(float));
        memcpy(kv_cache_v(c, layer, slot, h) + (size_t)pos * d, v + (size_t)h * d,
               (size_t)d * sizeof(float));
    }
}
