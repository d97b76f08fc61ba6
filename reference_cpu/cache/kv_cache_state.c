/* The host state of a cache (kv_cache.h), written once for both devices.
 *
 * A cache's spec, shapes and formats, its slots' lengths and KIVI counts, its block tables
 * and the bookkeeping of its undo logs are host memory whichever device holds the rows: the
 * CUDA cache is a kv_cache whose planes (and k, v, mem) point to device memory (struct
 * kvcu_cache in cuda/core/kvcu_internal.cuh derives from it). So the state's life and every
 * check on it are here, and each device calls them before it moves its own bytes: a refusal
 * has one text on both devices, @p who naming the entry point that refuses.
 *
 *   kv_cache_state_create  the spec's checks, the host arrays, the planes' sizes
 *   kv_cache_state_place   the planes into one buffer (host or device memory)
 *   kv_cache_state_free    the host arrays
 *   kv_cache_state_*       a slot's table, length and fork (chapter 05)
 *   kv_cache_check_*       a step's rows, a copy list, a block I/O list, a slot mapping */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <string.h>

/* ---- the cache's memory: host, or the device's functions (c->device) ------------------------ */

int kv_cache_copy(const kv_cache *c, void *dst, const void *src, size_t n, const char *who,
                  kv_err *err)
{
    if (c->device) return c->device->copy(dst, src, n, who, err);
    memcpy(dst, src, n);
    return KV_OK;
}

int kv_cache_alloc(const kv_cache *c, void **p, size_t n, const char *who, kv_err *err)
{
    if (c->device) return c->device->alloc(p, n, who, err);
    *p = kv_calloc(n);
    return *p ? KV_OK : kv_fail(err, KV_ERR_NOMEM, "%s: %zu bytes", who, n);
}

void kv_cache_release(const kv_cache *c, void *p)
{
    if (c->device) c->device->release(p);
    else kv_free(p);
}

/* ---- life ----------------------------------------------------------------------------------- */

int kv_cache_state_create(kv_cache *c, const char *who, const kv_config *cfg,
                          const kv_cache_spec *spec, int n_planes, kv_err *err)
{
    memset(c, 0, sizeof *c);
    int rc = kv_cache_spec_check_caps(who, cfg, spec, KV_CACHE_CAN_WINDOW, err);
    if (rc) return rc;
    const int d = kv_config_head_dim(cfg), L = cfg->n_layers, paged = spec->layout.kind == KV_LAYOUT_PAGED;
    const int span = (int)kv_window_rows(spec->window.size, spec->window.n_sinks, spec->capacity);
    const int rows = paged ? spec->layout.n_blocks * spec->layout.block_size : span;
    /* bytes of codes of one fp32 layer (the largest format), checked for overflow; a paged
     * pool's rows belong to no slot, so its heads are the H_kv of one pool */
    const size_t factors[4] = {paged ? (size_t)cfg->n_kv_heads : (size_t)spec->n_slots * cfg->n_kv_heads,
                               (size_t)rows, (size_t)d, 2 * (size_t)L};
    size_t n = sizeof(float);
    for (int i = 0; i < 4; i++) {
        if (n > SIZE_MAX / 4 / factors[i])
            return kv_fail(err, KV_ERR_NOMEM, "%s: cache size overflows size_t", who);
        n *= factors[i];
    }
    c->spec = *spec;
    c->n_layers = L;
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = d;
    c->rows = rows;
    c->rotary_dim = cfg->rotary_dim;
    c->fmt = kv_calloc((size_t)L * sizeof(int));
    c->n_planes = n_planes;
    c->planes = kv_calloc((size_t)c->n_planes * L * sizeof(kv_cache_plane));
    c->qlen = kv_calloc((size_t)L * spec->n_slots * sizeof(int));
    c->len = kv_calloc((size_t)spec->n_slots * sizeof(int));
    if (paged) {
        c->max_blocks = (span + spec->layout.block_size - 1) / spec->layout.block_size;
        c->tables = kv_calloc((size_t)spec->n_slots * c->max_blocks * sizeof(int));
        c->n_mapped = kv_calloc((size_t)spec->n_slots * sizeof(int));
    }
    if (!c->fmt || !c->planes || !c->qlen || !c->len || (paged && (!c->tables || !c->n_mapped))) {
        kv_cache_state_free(c);
        return kv_fail(err, KV_ERR_NOMEM, "%s: host memory for the cache tables", who);
    }
    for (int l = 0; l < L; l++) {
        c->fmt[l] = kv_cache_spec_layer_dtype(spec, l);
        if (kvq_is_kivi(c->fmt[l]))
            c->window = spec->quant.kivi_window ? spec->quant.kivi_window : KV_KIVI_WINDOW;
    }
    c->mem_bytes = kv_cache_layout_planes(spec, n_planes, L, c->n_kv_heads, d, NULL, c->planes);
    return KV_OK;
}

void kv_cache_state_place(kv_cache *c, uint8_t *base)
{
    kv_cache_layout_planes(&c->spec, c->n_planes, c->n_layers, c->n_kv_heads, c->head_dim, base,
                           c->planes);
    c->mem = base;
    int all_f32 = 1;
    for (int l = 0; l < c->n_layers; l++) all_f32 &= c->fmt[l] == KV_QF_F32;
    if (all_f32 && !c->tables && c->spec.window.size == 0) {
        /* chapter 02's arrays: kv_cache_k() / kv_cache_v() work on them */
        c->k = (float *)(void *)kv_cache_plane_of(c->planes, c->n_layers, 0, 0)->codes;
        c->v = c->n_planes > 1 ? (float *)(void *)kv_cache_plane_of(c->planes, c->n_layers, 1, 0)->codes
                               : NULL;
    }
}

void kv_cache_state_free(kv_cache *c)
{
    for (int i = 0; c->undo && i < c->spec.n_slots; i++) kv_free(c->undo[i].qlen0);
    kv_free(c->undo);
    kv_free(c->fmt);
    kv_free(c->planes);
    kv_free(c->qlen);
    kv_free(c->len);
    kv_free(c->tables);
    kv_free(c->n_mapped);
    kv_free(c->rope_cs);
    memset(c, 0, sizeof *c);
}

/* ---- chapter 05: a slot's table, length and fork ---------------------------------------------- */

/* Every operation on a slot's table needs a paged cache and a slot inside it. */
static int paged_slot(const char *who, const kv_cache *c, int slot, kv_err *err)
{
    if (!c || !c->tables) return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d is outside [0, %d)", who, slot,
                       c->spec.n_slots);
    return KV_OK;
}

int kv_cache_state_set_blocks(kv_cache *c, const char *who, int slot, const int *blocks, int n,
                              kv_err *err)
{
    int rc = paged_slot(who, c, slot, err);
    if (rc) return rc;
    const kv_cache_spec *spec = &c->spec;
    if (n < 0 || n > c->max_blocks || (n > 0 && !blocks))
        return kv_fail(err, KV_ERR_ARG, "%s: %d blocks for slot %d (max %d)", who, n, slot,
                       c->max_blocks);
    if ((int64_t)n * spec->layout.block_size <
        kv_window_rows(spec->window.size, spec->window.n_sinks, c->len[slot]))
        return kv_fail(err, KV_ERR_ARG, "%s: %d blocks cannot hold the %d tokens slot %d "
                       "caches", who, n, c->len[slot], slot);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= spec->layout.n_blocks)
            return kv_fail(err, KV_ERR_ARG, "%s: slot %d entry %d is block %d, outside the pool "
                           "[0, %d)", who, slot, i, blocks[i], spec->layout.n_blocks);
    if (n > 0) memcpy(c->tables + (size_t)slot * c->max_blocks, blocks, (size_t)n * sizeof(int));
    c->n_mapped[slot] = n;
    return KV_OK;
}

int kv_cache_state_set_length(kv_cache *c, const char *who, int slot, int len, kv_err *err)
{
    if (c && c->spec.retain.select) /* chapter 09: adopted rows were never seen by the selection */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a cache with %s retention would adopt "
                       "rows its selection state never saw", who,
                       kv_select_method_name(c->spec.retain.select));
    int rc = paged_slot(who, c, slot, err);
    if (rc) return rc;
    if (c->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window cache cannot adopt "
                       "another sequence's blocks (its ring rewrites them)", who);
    for (int l = 0; l < c->n_layers; l++)
        if (kvq_is_fp8(c->fmt[l]) || kvq_is_kivi(c->fmt[l]))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: layer %d stores %s, whose scales or "
                           "window belong to the sequence that wrote the rows: its blocks "
                           "cannot be adopted by another sequence", who, l,
                           kv_quant_name(c->fmt[l]));
    if (c->len[slot] != 0)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d already holds %d tokens", who, slot,
                       c->len[slot]);
    if (len < 0 || (int64_t)len > (int64_t)c->n_mapped[slot] * c->spec.layout.block_size)
        return kv_fail(err, KV_ERR_ARG, "%s: %d tokens but slot %d maps %d blocks of %d", who,
                       len, slot, c->n_mapped[slot], c->spec.layout.block_size);
    c->len[slot] = len;
    return KV_OK;
}

int kv_cache_state_fork(kv_cache *c, const char *who, int dst, int src, kv_err *err)
{
    if (c && c->spec.retain.select) /* chapter 09: the kept sets are per sequence, not per block */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a cache with %s retention keeps "
                       "per-sequence selection state that a fork would not copy", who,
                       kv_select_method_name(c->spec.retain.select));
    int rc = paged_slot(who, c, dst, err);
    if (!rc) rc = paged_slot(who, c, src, err);
    if (rc || dst == src) return rc;
    if (c->spec.window.size > 0) /* the ring would overwrite rows the other sequence still reads */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window sequence cannot share "
                       "its blocks (its ring rewrites them in place)", who);
    const size_t ns = (size_t)c->spec.n_slots, Hkv = (size_t)c->n_kv_heads;
    const size_t w = Hkv * (size_t)c->window * (size_t)c->head_dim; /* a slot's [H_kv][R][d] */
    c->len[dst] = c->len[src];
    for (int l = 0; l < c->n_layers && !rc; l++) {
        c->qlen[l * ns + dst] = c->qlen[l * ns + src];
        for (int i = 0; i < c->n_planes && !rc; i++) { /* the slot's own bytes: scales, window */
            const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, l);
            if (p->scale)
                rc = kv_cache_copy(c, p->scale + dst * Hkv, p->scale + src * Hkv,
                                   Hkv * sizeof(float), who, err);
            if (p->ring && !rc)
                rc = kv_cache_copy(c, p->ring + dst * w, p->ring + src * w, w * sizeof(float),
                                   who, err);
        }
    }
    return rc;
}

/* ---- the checks of a step, a copy list, a block I/O list, a slot mapping ---------------------- */

int kv_cache_check_rows(const char *who, const kv_cache *c, const kv_seq *seqs, int n_seqs,
                        kv_err *err)
{
    const kv_cache_spec *spec = &c->spec;
    const int B = spec->layout.block_size, W = spec->window.size, S = spec->window.n_sinks;
    for (int i = 0; i < n_seqs; i++) {
        const int64_t end = (int64_t)seqs[i].pos + seqs[i].n_tokens;
        const int64_t mapped = (int64_t)c->n_mapped[seqs[i].slot] * B;
        if (W == 0 && end > mapped) /* a write past the mapped blocks has nowhere to go */
            return kv_fail(err, KV_ERR_CAPACITY,
                           "%s: sequence %d: positions up to %lld but slot %d has %d blocks "
                           "(%lld tokens) mapped", who, i, (long long)end - 1, seqs[i].slot,
                           c->n_mapped[seqs[i].slot], (long long)mapped);
        const int64_t rows = kv_window_rows(W, S, end); /* chapter 06: stops growing at S+W */
        if (W > 0 && rows > mapped)
            return kv_fail(err, KV_ERR_CAPACITY, "%s: sequence %d: its window needs %lld rows "
                           "but slot %d has %d blocks (%lld rows) mapped", who, i,
                           (long long)rows, seqs[i].slot, c->n_mapped[seqs[i].slot],
                           (long long)mapped);
    }
    return KV_OK;
}

int kv_cache_check_pairs(const char *who, const kv_cache *c, const kv_block_copy *pairs, int n,
                         kv_err *err)
{
    if (!c || !c->tables) return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (n < 0 || (n > 0 && !pairs)) return kv_fail(err, KV_ERR_ARG, "%s: %d pairs", who, n);
    const int N = c->spec.layout.n_blocks;
    for (int i = 0; i < n; i++)
        if (pairs[i].src < 0 || pairs[i].src >= N || pairs[i].dst < 0 || pairs[i].dst >= N)
            return kv_fail(err, KV_ERR_ARG, "%s: pair %d (%d -> %d) is outside the pool [0, %d)",
                           who, i, pairs[i].src, pairs[i].dst, N);
    return KV_OK;
}

int kv_cache_check_block_io(const char *who, const kv_cache *c, const kv_block_copy *pairs,
                            int n, const void *host, size_t block_bytes, int dev_is_src,
                            kv_err *err)
{
    if (!c || !c->tables) return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (n < 0 || (n > 0 && (!pairs || !host)))
        return kv_fail(err, KV_ERR_ARG, "%s: %d pairs", who, n);
    if (block_bytes != kv_cache_block_bytes(c))
        return kv_fail(err, KV_ERR_ARG, "%s: host blocks of %zu bytes but the cache's blocks "
                       "are %zu bytes", who, block_bytes, kv_cache_block_bytes(c));
    for (int i = 0; i < n; i++) {
        const int dev = dev_is_src ? pairs[i].src : pairs[i].dst;
        const int host_blk = dev_is_src ? pairs[i].dst : pairs[i].src;
        if (dev < 0 || dev >= c->spec.layout.n_blocks || host_blk < 0)
            return kv_fail(err, KV_ERR_ARG, "%s: pair %d (%d -> %d): pool block outside "
                           "[0, %d) or negative host block", who, i, pairs[i].src,
                           pairs[i].dst, c->spec.layout.n_blocks);
    }
    return KV_OK;
}

int kv_cache_check_slots(const char *who, const kv_cache *c, int layer, const int64_t *slots,
                         int n, const float *k, const float *v, kv_err *err)
{
    if (!c || !c->tables) return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (layer < 0 || layer >= c->n_layers || n < 0 || (n > 0 && (!slots || !k || !v)))
        return kv_fail(err, KV_ERR_ARG, "%s: layer %d, %d tokens", who, layer, n);
    const int fmt = c->fmt[layer];
    if (kvq_is_fp8(fmt) || kvq_is_kivi(fmt))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: layer %d stores %s, whose scales or "
                       "window belong to a sequence, not to a slot", who, layer,
                       kv_quant_name(fmt));
    for (int i = 0; i < n; i++)
        if (slots[i] >= c->rows)
            return kv_fail(err, KV_ERR_ARG, "%s: token %d goes to slot %lld, outside the pool's "
                           "%d rows", who, i, (long long)slots[i], c->rows);
    return KV_OK;
}
