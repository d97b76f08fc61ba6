/*
 * The device KV cache, chapter 02 (kv_cache.c's twin): the CPU kv_cache's spec and layout in
 * device memory. The planes are laid out by the same kv_cache_layout() as on the CPU, so an
 * fp32 cache is chapter 02's k, v [L][n_slots][H_kv][capacity][d] and a quantized one holds the
 * same bytes at the same offsets as its CPU twin (tests/test_gpu_quant_cache.c compares them).
 * The cache is a kv_cache in device memory (struct kvcu_cache in kvcu_internal.cuh): its host
 * state (lengths, KIVI counts, tables) is made, checked and freed by the CPU's functions
 * (kv_cache_state.c), and what the kernels read of it is mirrored to the device.
 *
 * Here are the cache's life and the write that composes the parts; each chapter's part is a
 * file of its own (kvcu_cache_internal.cuh lists them): the row codec's kernels
 * (kvcu_cache_codec.cu), KIVI's window and spills (kvcu_cache_kivi.cu), the paged layout's
 * tables (kvcu_cache_paged.cu; the kernels find a token's row through the slot's table,
 * tables[slot][pos / B]·B + pos % B, read from a device copy the host keeps in step), the
 * window (kvcu_cache_window.cu) and the undo log (kvcu_cache_undo.cu).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_quant.h"
#include "kvcu_cache_internal.cuh"

/* The device's memory for the host state's few moves of the bytes (kv_cache_device: a fork's
 * scales and windows, the undo log's entries): cudaMalloc'ed and zeroed, cudaFree'd, copied
 * device to device. */
static int device_alloc(void **p, size_t bytes, const char *who, kv_err *err)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) e = cudaMemset(*p, 0, bytes);
    if (e == cudaSuccess) return KV_OK;
    cudaFree(*p);
    *p = NULL;
    return kv_fail(err, KVCU_STATUS(kvcu_clear_error(e)), "%s: %zu bytes of device memory: %s",
                   who, bytes, cudaGetErrorString(e));
}
static void device_release(void *p) { cudaFree(p); }
static int device_copy(void *dst, const void *src, size_t bytes, const char *who, kv_err *err)
{
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) return KV_OK;
    return kv_fail(err, KVCU_STATUS(kvcu_clear_error(e)), "%s: %s", who, cudaGetErrorString(e));
}
static const kv_cache_device kvcu_device = {device_alloc, device_release, device_copy};

/* The host's qlen [L][n_slots] into its device mirror. */
int kvcu_cache_sync_qlen(kvcu_cache *c, kv_err *err)
{
    KV_CUDA_TRY(cudaMemcpy(c->d_qlen, c->qlen, (size_t)c->n_layers * c->spec.n_slots * sizeof(int),
                           cudaMemcpyHostToDevice), err);
    return KV_OK;
}

/**
 * Allocate a device cache for a model config; the twin of kv_cache_create().
 * Unsupported spec -> KV_ERR_UNSUPPORTED; device out of memory -> KV_ERR_NOMEM.
 */
int kvcu_cache_create(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                      kv_err *err)
{
    return kvcu_cache_create_planes(out, cfg, spec, KV_CACHE_KV_PLANES, err);
}

/** The twin of kv_cache_create_planes(): @p n_planes planes per layer (1: a latent cache). */
int kvcu_cache_create_planes(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                             int n_planes, kv_err *err)
{
    *out = NULL;
    if (n_planes < 1 || n_planes > KV_CACHE_KV_PLANES)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_create: %d planes per layer (1 or %d)",
                       n_planes, KV_CACHE_KV_PLANES);
    kvcu_cache *c = (kvcu_cache *)calloc(1, sizeof *c);
    if (!c) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: host memory");
    /* the host state both devices share (kv_cache_state.c): checks, tables, the planes' sizes */
    int st = kv_cache_state_create(c, "kvcu_cache_create", cfg, spec, n_planes, err);
    if (st) {
        free(c);
        return st;
    }
    c->device = &kvcu_device;
    const int paged = c->tables != NULL, L = c->n_layers;
    c->span = (int)kv_window_rows(spec->window.size, spec->window.n_sinks, spec->capacity);
    if (paged) c->seg_mark = (int *)calloc(2 * (size_t)spec->layout.n_blocks, sizeof(int));
    if (paged && !c->seg_mark) {
        kvcu_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: host memory");
    }
    const size_t total = c->mem_bytes;
    const size_t n_table = (size_t)spec->n_slots * c->max_blocks;
    uint8_t *mem = NULL;
    cudaError_t e = cudaMalloc(&mem, total);
    /* zeroed like the CPU's calloc, so the two buffers agree byte for byte everywhere */
    if (e == cudaSuccess) e = cudaMemset(mem, 0, total);
    if (e == cudaSuccess) kv_cache_state_place(c, mem);
    if (e == cudaSuccess) e = cudaMalloc(&c->d_qlen, (size_t)L * spec->n_slots * sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(c->d_qlen, 0, (size_t)L * spec->n_slots * sizeof(int));
    if (paged && e == cudaSuccess) e = cudaMalloc(&c->d_tables, n_table * sizeof(int));
    if (paged && e == cudaSuccess) e = cudaMemset(c->d_tables, 0, n_table * sizeof(int));
    if (paged && e == cudaSuccess) e = cudaMalloc(&c->d_planes, (size_t)c->n_planes * L * sizeof(kv_cache_plane));
    if (paged && e == cudaSuccess) e = cudaMalloc(&c->d_fmt, (size_t)L * sizeof(int));
    if (e != cudaSuccess) {
        if (!c->mem) cudaFree(mem);
        kvcu_cache_free(c);
        cudaGetLastError(); /* a failed allocation is not sticky: clear it */
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_create: could not allocate %zu bytes of K/V storage on "
                       "the device: %s", total, cudaGetErrorString(e));
    }
    /* fp8 scales start at 1, as on the CPU (calibration overwrites them at position 0) */
    const size_t heads = (size_t)spec->n_slots * c->n_kv_heads;
    float *ones = NULL;
    for (int pl = 0; pl < c->n_planes * L && e == cudaSuccess; pl++) {
        const kv_cache_plane *p = &c->planes[pl];
        if (!p->scale) continue;
        if (!ones) {
            ones = (float *)malloc(heads * sizeof(float));
            if (!ones) break;
            for (size_t i = 0; i < heads; i++) ones[i] = 1.0f;
        }
        e = cudaMemcpy(p->scale, ones, heads * sizeof(float), cudaMemcpyHostToDevice);
    }
    free(ones);
    if (paged && e == cudaSuccess) /* the planes and formats the block-copy kernel walks */
        e = cudaMemcpy(c->d_planes, c->planes, (size_t)c->n_planes * L * sizeof(kv_cache_plane),
                       cudaMemcpyHostToDevice);
    if (paged && e == cudaSuccess)
        e = cudaMemcpy(c->d_fmt, c->fmt, (size_t)L * sizeof(int), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        kvcu_cache_free(c);
        return kv_fail(err, KVCU_STATUS(kvcu_clear_error(e)), "kvcu_cache_create: %s",
                       cudaGetErrorString(e));
    }
    st = kvcu_cache_window_create(c, cfg, err); /* chapter 06: KV_POS_CACHE's rotations */
    if (st) {
        kvcu_cache_free(c);
        return st;
    }
    *out = c;
    return KV_OK;
}

/** Free a device cache (NULL is fine). */
void kvcu_cache_free(kvcu_cache *c)
{
    if (!c) return;
    cudaFree(c->mem);
    cudaFree(c->d_qlen);
    cudaFree(c->stage);
    cudaFree(c->d_tables);
    cudaFree(c->d_planes);
    cudaFree(c->d_fmt);
    cudaFree(c->d_pairs);
    cudaFree(c->d_rope_cs);
    kv_cache_undo_free(c); /* chapter 10: the logs' rows */
    free(c->seg_mark);
    kv_cache_state_free(c);
    free(c);
}

/** Forget a slot's tokens; the device memory is kept (and not cleared: nothing reads it). */
void kvcu_cache_reset(kvcu_cache *c, int slot)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots) return;
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) any |= c->qlen[(size_t)l * c->spec.n_slots + slot] != 0;
    kv_cache_reset(c, slot); /* the host state: length, KIVI counts, table, undo log */
    if (any) /* the device mirror too; a failure here resurfaces at the next checked call */
        cudaMemcpy(c->d_qlen, c->qlen, (size_t)c->n_layers * c->spec.n_slots * sizeof(int),
                   cudaMemcpyHostToDevice);
}

/** Tokens cached in a slot; -1 for a slot out of range (as the CPU backend's length()). */
int kvcu_cache_length(const kvcu_cache *c, int slot)
{
    return (c && slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

int kvcu_cache_commit_length(kvcu_cache *c, int slot, int len, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots || len < 0 || len > c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_commit_length: slot %d, %d tokens", slot, len);
    c->len[slot] = len;
    return KV_OK;
}

size_t kvcu_cache_mem_bytes(const kvcu_cache *c) { return c ? c->mem_bytes : 0; }

int kvcu_cache_download(const kvcu_cache *c, void *host, size_t bytes, kv_err *err)
{
    if (!c || !host || bytes > c->mem_bytes)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_download: %zu bytes of %zu", bytes,
                       c ? c->mem_bytes : (size_t)0);
    KV_CUDA_TRY(cudaMemcpy(host, c->mem, bytes, cudaMemcpyDeviceToHost), err);
    return KV_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

int kvcu_cache_write(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                     const int *tok_slot, const int *tok_pos, const float *k, const float *v,
                     int T, kv_err *err)
{
    if (layer < 0 || layer >= c->n_layers)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write: layer %d of %d", layer, c->n_layers);
    if (T == 0) return KV_OK;
    int rc = kvcu_cache_codec_begin(c, layer, seqs, n_seqs, k, v, err); /* fp8: calibrate */
    for (int i = 0, t = 0; !rc && c->undo && i < n_seqs; t += seqs[i].n_tokens, i++)
        rc = kvcu_cache_undo_rows(c, layer, &seqs[i], t, k, v, err); /* chapter 10 */
    if (rc) return rc;
    if (kvq_is_kivi(c->fmt[layer])) /* rows wait in a window, then spill in groups */
        return kvcu_cache_kivi_write(c, layer, seqs, n_seqs, tok_slot, tok_pos, k, v, T, err);
    return kvcu_cache_encode_rows(c, layer, tok_slot, tok_pos, k, v, T, err);
}

int kvcu_cache_write_seq(kvcu_cache *c, int layer, int slot, int pos, int n, const float *k,
                         const float *v, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots || n < 1 || pos < 0 ||
        (int64_t)pos + n > c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write_seq: slot %d, pos %d, n %d", slot, pos, n);
    kv_seq s = {slot, pos, n, NULL};
    if (c->tables) { /* a paged slot writes only into the blocks its table maps */
        int rc = kv_cache_check_rows("kvcu_cache_write_seq", c, &s, 1, err);
        if (rc) return rc;
    }
    int *h = (int *)malloc(2 * (size_t)n * sizeof(int)), *dv = NULL;
    if (!h) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_write_seq: host memory");
    for (int i = 0; i < n; i++) {
        h[i] = slot;
        h[n + i] = pos + i;
    }
    int rc = kvcu_device_alloc((void **)&dv, 2 * (size_t)n * sizeof(int), err);
    cudaError_t e = rc ? cudaSuccess
                       : cudaMemcpy(dv, h, 2 * (size_t)n * sizeof(int), cudaMemcpyHostToDevice);
    free(h);
    if (rc) return rc;
    if (e != cudaSuccess) {
        cudaFree(dv);
        return kv_fail(err, KVCU_STATUS(kvcu_clear_error(e)), "kvcu_cache_write_seq: %s",
                       cudaGetErrorString(e));
    }
    rc = kvcu_cache_write(c, layer, &s, 1, dv, dv + n, k, v, n, err);
    e = kvcu_clear_error(cudaFree(dv)); /* waits for the kernels */
    if (!rc && e != cudaSuccess)
        rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write_seq: %s", cudaGetErrorString(e));
    return rc;
}

