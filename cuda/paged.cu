/*
 * The paged device cache's own operations (chapter 05), twins of kv_cache.h's: map a slot's
 * logical blocks to physical ones, fork a slot's per-sequence state, adopt a cached prefix,
 * and copy blocks on write. The layout itself and the writes through the tables are in
 * cache.cu, the reads in attn_decode.cu.
 *
 * A slot's table lives on the host (the batch checks and KIVI's spill placement read it
 * there) and on the device (the kernels read it); kvcu_cache_set_blocks() writes both, so
 * they never disagree. fork and set_length touch only per-sequence state: lengths and KIVI
 * counts on the host, fp8 scales and KIVI windows copied device to device. A sliding-window
 * slot (chapter 06) maps only its S+W rows and rewrites them in place, so it can neither be
 * forked nor adopt a prefix: both are refused with the CPU's words.
 *
 * copy_blocks_kernel: one block per (pair, layer and K/V, kv head) copies the B rows of codes
 *   and the block's metadata entries, 16 bytes per thread when the addresses allow. A step's
 *   whole copy-on-write list is one launch, every layer, K and V.
 */
#include <stdint.h>
#include <string.h>

#include "kv_quant.h"
#include "kvcu_internal.cuh"

#define COPY_THREADS 128

static int paged_slot(const kvcu_cache *c, const char *who, int slot, kv_err *err)
{
    if (!c || !c->tables)
        return kv_fail(err, KV_ERR_ARG, "%s: the cache is not paged", who);
    if (slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d is outside [0, %d)", who, slot,
                       c->spec.n_slots);
    return KV_OK;
}

int kvcu_cache_set_blocks(kvcu_cache *c, int slot, const int *blocks, int n, kv_err *err)
{
    int rc = paged_slot(c, "kvcu_cache_set_blocks", slot, err);
    if (rc) return rc;
    if (n < 0 || n > c->max_blocks || (n > 0 && !blocks))
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_set_blocks: %d blocks for slot %d (max %d)",
                       n, slot, c->max_blocks);
    if ((int64_t)n * c->spec.block_size <
        kv_window_rows(c->spec.window, c->spec.n_sinks, c->len[slot]))
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_set_blocks: %d blocks cannot hold the %d "
                       "tokens slot %d caches", n, c->len[slot], slot);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= c->spec.n_blocks)
            return kv_fail(err, KV_ERR_ARG, "kvcu_cache_set_blocks: slot %d entry %d is block "
                           "%d, outside the pool [0, %d)", slot, i, blocks[i], c->spec.n_blocks);
    int *row = c->tables + (size_t)slot * c->max_blocks; /* [max_blocks] */
    memcpy(row, blocks, (size_t)n * sizeof(int));
    c->n_mapped[slot] = n;
    if (n > 0) /* entries past n are never read: the batch check keeps positions below n·B */
        KV_CUDA_TRY(cudaMemcpy(c->d_tables + (size_t)slot * c->max_blocks, row,
                               (size_t)n * sizeof(int), cudaMemcpyHostToDevice), err);
    return KV_OK;
}

int kvcu_cache_fork_slot(kvcu_cache *c, int dst, int src, kv_err *err)
{
    int rc = paged_slot(c, "kvcu_cache_fork_slot", dst, err);
    if (!rc) rc = paged_slot(c, "kvcu_cache_fork_slot", src, err);
    if (rc || dst == src) return rc;
    if (c->spec.window > 0) /* the ring would overwrite rows the other sequence still reads */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_cache_fork_slot: a sliding-window "
                       "sequence cannot share its blocks (its ring rewrites them in place)");
    const size_t Hkv = (size_t)c->n_kv_heads, d = (size_t)c->head_dim, ns = (size_t)c->spec.n_slots;
    c->len[dst] = c->len[src];
    for (int l = 0; l < c->n_layers; l++) {
        c->qlen[l * ns + dst] = c->qlen[l * ns + src];
        for (int role = 0; role < 2; role++) {
            const kv_cache_plane *p = role ? &c->vp[l] : &c->kp[l];
            if (p->scale)
                KV_CUDA_TRY(cudaMemcpy(p->scale + dst * Hkv, p->scale + src * Hkv,
                                       Hkv * sizeof(float), cudaMemcpyDeviceToDevice), err);
            if (p->ring) {
                const size_t w = Hkv * c->window * d; /* one slot's [H_kv][window][d] */
                KV_CUDA_TRY(cudaMemcpy(p->ring + dst * w, p->ring + src * w, w * sizeof(float),
                                       cudaMemcpyDeviceToDevice), err);
            }
        }
    }
    KV_CUDA_TRY(cudaMemcpy(c->d_qlen, c->qlen, (size_t)c->n_layers * ns * sizeof(int),
                           cudaMemcpyHostToDevice), err);
    return KV_OK;
}

int kvcu_cache_set_length(kvcu_cache *c, int slot, int len, kv_err *err)
{
    int rc = paged_slot(c, "kvcu_cache_set_length", slot, err);
    if (rc) return rc;
    if (c->spec.window > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_cache_set_length: a sliding-window cache "
                       "cannot adopt another sequence's blocks (its ring rewrites them)");
    for (int l = 0; l < c->n_layers; l++)
        if (kvq_is_fp8(c->fmt[l]) || kvq_is_kivi(c->fmt[l]))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_cache_set_length: layer %d stores %s, "
                           "whose scales or window belong to the sequence that wrote the rows: "
                           "its blocks cannot be adopted by another sequence", l,
                           kv_quant_name(c->fmt[l]));
    if (c->len[slot] != 0)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_set_length: slot %d already holds %d tokens",
                       slot, c->len[slot]);
    if (len < 0 || (int64_t)len > (int64_t)c->n_mapped[slot] * c->spec.block_size)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_set_length: %d tokens but slot %d maps %d "
                       "blocks of %d", len, slot, c->n_mapped[slot], c->spec.block_size);
    c->len[slot] = len;
    return KV_OK;
}

/* n bytes from src to dst by the block's threads, in 16-, 4- or 1-byte words as the
 * addresses and the length allow. */
__device__ inline void block_copy_bytes(uint8_t *dst, const uint8_t *src, int64_t n)
{
    const uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)n;
    if (a % 16 == 0) {
        for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
            ((uint4 *)(void *)dst)[i] = ((const uint4 *)(const void *)src)[i];
    } else if (a % 4 == 0) {
        for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x)
            ((uint32_t *)(void *)dst)[i] = ((const uint32_t *)(const void *)src)[i];
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    }
}

/* Block (i, plane, h): pair i's rows of kv head h in plane `plane` (planes [2][L]: K of every
 * layer, then V), codes and metadata. The metadata of a block is one contiguous run of
 * entries, as kv_cache_copy_blocks() relies on (kv_quant.h: linear in the row, or in the
 * 32-row group for KIVI keys, with 32 | B). */
__global__ void copy_blocks_kernel(const kv_block_copy *pairs, const kv_cache_plane *planes,
                                   const int *fmt, int n_layers, int rows, int block_size, int d)
{
    const int i = blockIdx.x, pl = blockIdx.y, h = blockIdx.z;
    const kv_cache_plane p = planes[pl];
    const int l = pl % n_layers, f = fmt[l];
    const int role = pl < n_layers ? KV_QROLE_KEY : KV_QROLE_VALUE;
    const int64_t s0 = (int64_t)pairs[i].src * block_size, d0 = (int64_t)pairs[i].dst * block_size;
    uint8_t *codes = p.codes + (int64_t)h * rows * p.row_bytes; /* [rows][row_bytes] */
    block_copy_bytes(codes + d0 * p.row_bytes, codes + s0 * p.row_bytes, block_size * p.row_bytes);
    if (!p.meta) return;
    const int64_t m0 = kvq_meta_index(f, role, s0, 0, d), m1 = kvq_meta_index(f, role, d0, 0, d);
    const int64_t mn = kvq_meta_index(f, role, s0 + block_size, 0, d) - m0;
    uint8_t *meta = (uint8_t *)p.meta + (int64_t)h * p.meta_entries * 4;
    block_copy_bytes(meta + m1 * 4, meta + m0 * 4, mn * 4);
}

int kvcu_cache_copy_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n, kv_err *err)
{
    if (!c || !c->tables)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_copy_blocks: the cache is not paged");
    if (n < 0 || (n > 0 && !pairs))
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_copy_blocks: %d pairs", n);
    const int N = c->spec.n_blocks;
    for (int i = 0; i < n; i++)
        if (pairs[i].src < 0 || pairs[i].src >= N || pairs[i].dst < 0 || pairs[i].dst >= N)
            return kv_fail(err, KV_ERR_ARG, "kvcu_cache_copy_blocks: pair %d (%d -> %d) is "
                           "outside the pool [0, %d)", i, pairs[i].src, pairs[i].dst, N);
    if (n == 0) return KV_OK;
    if (n > c->pairs_cap) {
        cudaFree(c->d_pairs);
        c->d_pairs = NULL;
        c->pairs_cap = 0;
        KV_CUDA_TRY(cudaMalloc(&c->d_pairs, (size_t)n * sizeof(kv_block_copy)), err);
        c->pairs_cap = n;
    }
    KV_CUDA_TRY(cudaMemcpy(c->d_pairs, pairs, (size_t)n * sizeof(kv_block_copy),
                           cudaMemcpyHostToDevice), err);
    /* The blocks of one launch copy at the same time, which equals the list order only if no
     * pair reads or overwrites a block an earlier pair of the launch writes, or overwrites one
     * it reads. A step's copy-on-write list always qualifies (each dst is a fresh block), so
     * it is one launch; any other list is cut where that rule would break. */
    int *wrote = c->seg_mark, *read = c->seg_mark + N; /* [N] each, all 0 between calls */
    for (int start = 0, i = 0; i <= n; i++) {
        const int cut = i == n || wrote[pairs[i].src] || wrote[pairs[i].dst] || read[pairs[i].dst];
        if (cut && i > start) {
            dim3 grid(i - start, 2 * c->n_layers, c->n_kv_heads);
            KV_LAUNCH(copy_blocks_kernel, grid, COPY_THREADS, 0, 0, c->d_pairs + start,
                      c->d_planes, c->d_fmt, c->n_layers, c->rows, c->spec.block_size,
                      c->head_dim);
            for (int j = start; j < i; j++) wrote[pairs[j].dst] = read[pairs[j].src] = 0;
            start = i;
        }
        if (i < n) {
            read[pairs[i].src] = 1;
            wrote[pairs[i].dst] = 1;
        }
    }
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
