/*
 * The device KV cache (chapter 02): the CPU kv_cache's spec and layout in device memory,
 *   k, v  [L][n_slots][H_kv][capacity][d]
 * so its size is the same formula, L · 2 · N · H_kv · d · b bytes. Slot lengths stay on the
 * host (struct kvcu_cache in kvcu_internal.cuh).
 *
 * cache_write_kernel: one block per new token; the threads copy its H_kv · d keys and values
 *   to position tok_pos[t] of slot tok_slot[t]. Consecutive threads write consecutive dims of
 *   one head's row, so both the reads and the writes are coalesced.
 */
#include <stdint.h>
#include <stdlib.h>

#include "kvcu_internal.cuh"

#define CACHE_THREADS 128

/* Limits of kv_cache_create(), so a spec one device refuses the other refuses too. */
#define KVCU_CACHE_MAX_SLOTS 65536
#define KVCU_CACHE_MAX_CAPACITY (1 << 24)

/* Why a spec cannot be built: the same rules as kv_cache_create(). Elements of K (and of V)
 * in *n, checked for overflow. */
static int check_spec(const kv_config *cfg, const kv_cache_spec *spec, size_t *n, kv_err *err)
{
    if (!cfg || !spec) return kv_fail(err, KV_ERR_ARG, "kvcu_cache_create: NULL argument");
    if (spec->layout != KV_LAYOUT_CONTIGUOUS)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "kvcu_cache_create: cache layout %d is not supported (contiguous = %d)",
                       spec->layout, KV_LAYOUT_CONTIGUOUS);
    if (spec->dtype != KV_DTYPE_F32)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "kvcu_cache_create: cache dtype %d is not supported (fp32 = %d)",
                       spec->dtype, KV_DTYPE_F32);
    if (spec->n_slots < 1 || spec->n_slots > KVCU_CACHE_MAX_SLOTS)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_create: n_slots %d is outside [1, %d]",
                       spec->n_slots, KVCU_CACHE_MAX_SLOTS);
    if (spec->capacity < 1 || spec->capacity > KVCU_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_create: capacity %d is outside [1, %d]",
                       spec->capacity, KVCU_CACHE_MAX_CAPACITY);
    if (cfg->n_layers < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 || cfg->dim < cfg->n_heads)
        return kv_fail(err, KV_ERR_ARG,
                       "kvcu_cache_create: bad model shape (L %d, H %d, H_kv %d, dim %d)",
                       cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->dim);
    const size_t factors[5] = {(size_t)cfg->n_layers, (size_t)spec->n_slots,
                               (size_t)cfg->n_kv_heads, (size_t)spec->capacity,
                               (size_t)kv_config_head_dim(cfg)};
    *n = 1;
    for (int i = 0; i < 5; i++) {
        if (*n > SIZE_MAX / sizeof(float) / factors[i])
            return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: cache size overflows size_t");
        *n *= factors[i];
    }
    return KV_OK;
}

/**
 * Allocate a device cache for a model config; the twin of kv_cache_create().
 * Unsupported spec -> KV_ERR_UNSUPPORTED; device out of memory -> KV_ERR_NOMEM.
 */
int kvcu_cache_create(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                      kv_err *err)
{
    *out = NULL;
    size_t n = 0; /* elements of K, and of V */
    int st = check_spec(cfg, spec, &n, err);
    if (st) return st;
    kvcu_cache *c = (kvcu_cache *)calloc(1, sizeof *c);
    if (c) c->len = (int *)calloc((size_t)spec->n_slots, sizeof(int));
    if (!c || !c->len) {
        free(c);
        return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: host memory");
    }
    c->spec = *spec;
    c->n_layers = cfg->n_layers;
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = kv_config_head_dim(cfg);
    cudaError_t e = cudaMalloc(&c->k, n * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc(&c->v, n * sizeof(float));
    if (e != cudaSuccess) {
        kvcu_cache_free(c);
        cudaGetLastError(); /* a failed allocation is not sticky: clear it */
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_create: could not allocate 2 x %zu bytes of K/V storage on "
                       "the device: %s", n * sizeof(float), cudaGetErrorString(e));
    }
    *out = c;
    return KV_OK;
}

/** Free a device cache (NULL is fine). */
void kvcu_cache_free(kvcu_cache *c)
{
    if (!c) return;
    cudaFree(c->k);
    cudaFree(c->v);
    free(c->len);
    free(c);
}

/** Forget a slot's tokens; the device memory is kept (and not cleared: nothing reads it). */
void kvcu_cache_reset(kvcu_cache *c, int slot)
{
    if (c && slot >= 0 && slot < c->spec.n_slots) c->len[slot] = 0;
}

/** Tokens cached in a slot; -1 for a slot out of range (as the CPU backend's length()). */
int kvcu_cache_length(const kvcu_cache *c, int slot)
{
    return (c && slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

__global__ void cache_write_kernel(float *kc, float *vc, const float *k, const float *v,
                                   const int *tok_slot, const int *tok_pos, int n_kv_heads,
                                   int head_dim, int capacity)
{
    const int t = blockIdx.x, slot = tok_slot[t], pos = tok_pos[t];
    const int kv_dim = n_kv_heads * head_dim;
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {
        const int h = e / head_dim, i = e % head_dim;
        const size_t dst = (((size_t)slot * n_kv_heads + h) * capacity + pos) * head_dim + i;
        kc[dst] = k[(size_t)t * kv_dim + e];
        vc[dst] = v[(size_t)t * kv_dim + e];
    }
}

int kvcu_cache_write(kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                     const float *k, const float *v, int T, kv_err *err)
{
    if (layer < 0 || layer >= c->n_layers)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write: layer %d of %d", layer, c->n_layers);
    if (T == 0) return KV_OK;
    const size_t per_layer = (size_t)c->spec.n_slots * c->n_kv_heads * c->spec.capacity *
                             c->head_dim;
    KV_LAUNCH(cache_write_kernel, T, CACHE_THREADS, 0, 0, c->k + layer * per_layer,
              c->v + layer * per_layer, k, v, tok_slot, tok_pos, c->n_kv_heads, c->head_dim,
              c->spec.capacity);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
