/*
 * Chapter 04's KIVI formats (int4, int2) in the device cache, kv_cache_kivi.c's twin: the newest
 * tokens wait in an fp32 window of R rows per (slot, KV head); a step that leaves more than R
 * unquantized spills the oldest whole 32-token groups.
 *
 * kivi_stage_kernel: gathers the rows a spill encodes (window rows of older tokens, input rows
 *   of new ones) into one [rows][d] run per head; kvcu_quant_encode() then writes codes and
 *   metadata exactly as kv_quant_encode() does on the CPU, one run per block the spill touches
 *   (32 | B, so a group never straddles two blocks), the groups kv_cache_write_seq() encodes.
 *   The spills are decided on the host, which holds the counts and the tables.
 * kivi_window_kernel: a launch's last R tokens of a slot enter the window at t % R, spilled or
 *   not, so it holds each row's latest token whatever the chunking (as kv_cache_kivi.c), which
 *   a rollback that un-spills a group relies on.
 */
#include <stdint.h>

#include "kv_quant.h"
#include "kvcu_cache_internal.cuh"

/* Block (i, h, r): row q0 + i of head h of plane r (0 keys, 1 values) into stage
 * [n_planes][H_kv][rows][d]: from the ring when the token is older than the chunk, else from
 * the chunk's input. */
__global__ void kivi_stage_kernel(float *stage, kvcu_layer_planes lp, int slot, int pos, int q0,
                                  int rows, int n_kv_heads, int d, int window)
{
    const int i = blockIdx.x, h = blockIdx.y, r = blockIdx.z, t = q0 + i;
    const kv_cache_plane *p = &lp.p[r];
    const int64_t head = (int64_t)slot * n_kv_heads + h;
    const float *src = t < pos ? p->ring + (head * window + t % window) * d
                               : lp.x[r] + ((size_t)(t - pos) * n_kv_heads + h) * d;
    float *dst = stage + (((size_t)r * n_kv_heads + h) * rows + i) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
}

/* Block (t, h, r): token t's row of head h into its slot's window at pos % R; a token whose
 * window row a later one of the launch takes is skipped. */
__global__ void kivi_window_kernel(kvcu_layer_planes lp, const int *tok_slot, const int *tok_pos,
                                   int n_kv_heads, int d, int window)
{
    const int t = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int slot = tok_slot[t], pos = tok_pos[t];
    if (t + window < (int)gridDim.x && tok_slot[t + window] == slot &&
        tok_pos[t + window] == pos + window)
        return;
    const kv_cache_plane *p = &lp.p[r];
    const float *x = lp.x[r] + ((size_t)t * n_kv_heads + h) * d; /* [d] */
    float *ring = p->ring + (((int64_t)slot * n_kv_heads + h) * window + pos % window) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ring[j] = x[j];
}

int kvcu_cache_kivi_write(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                          const int *tok_slot, const int *tok_pos, const float *k,
                          const float *v, int T, kv_err *err)
{
    const int fmt = c->fmt[layer], Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    const size_t kvdim = (size_t)Hkv * d;
    const int np = c->n_planes;
    /* spill what no longer fits the window (kv_cache_kivi_write()) */
    int changed = 0;
    for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
        const int slot = seqs[i].slot, pos = seqs[i].pos, n = seqs[i].n_tokens;
        int *qlen = &c->qlen[(size_t)layer * c->spec.n_slots + slot];
        const int q0 = *qlen, over = pos + n - R;
        if (over <= q0) continue;
        const int q1 = (over + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP;
        const int rows = q1 - q0;
        const size_t need = (size_t)np * Hkv * rows * d * sizeof(float);
        if (need > c->stage_bytes) {
            cudaFree(c->stage);
            c->stage = NULL;
            c->stage_bytes = 0;
            KVCU_ALLOC_TRY(&c->stage, need, err);
            c->stage_bytes = need;
        }
        dim3 grid(rows, Hkv, np);
        KV_LAUNCH(kivi_stage_kernel, grid, KVCU_CACHE_THREADS, 0, 0, c->stage,
                  kvcu_layer_planes_of(c, layer, k + t * kvdim, v + t * kvdim), slot, pos, q0,
                  rows, Hkv, d, R);
        KV_CUDA_TRY_LAUNCH(err);
        /* contiguous: one run q0 .. q1-1; paged: one run per block it touches, each at
         * its physical rows (32 | B: a group never straddles two blocks) */
        const int B = c->tables ? c->spec.layout.block_size : q1;
        const int *table = c->tables ? c->tables + (size_t)slot * c->max_blocks : NULL;
        for (int g = q0; g < q1;) {
            const int end = (g / B + 1) * B < q1 ? (g / B + 1) * B : q1;
            const int64_t prow = table ? (int64_t)table[g / B] * B + g % B : g;
            for (int r = 0; r < np; r++)
                for (int h = 0; h < Hkv; h++) {
                    const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, r, layer);
                    const int role = p->role;
                    const int64_t rhead = table ? h : (int64_t)slot * Hkv + h;
                    uint8_t *codes = p->codes + (rhead * c->rows + prow) * p->row_bytes;
                    uint8_t *meta = (uint8_t *)p->meta +
                                    (rhead * p->meta_entries + kvq_meta_index(fmt, role, prow, 0, d)) * 4;
                    const float *x = c->stage + (((size_t)r * Hkv + h) * rows + (g - q0)) * d;
                    for (int gg = g; gg < end; gg += KV_KIVI_GROUP) { /* chapter 10 */
                        const kv_row_loc at = {(int64_t)slot * Hkv + h, rhead, prow + (gg - g)};
                        int rc = kv_cache_undo_group(c, layer, p, slot, h, at, pos, n, gg, err);
                        if (rc) return rc;
                    }
                    int rc = kvcu_quant_encode(fmt, role, x, end - g, d, 0.0f, codes, meta, err);
                    if (rc) return rc;
                }
            g = end;
        }
        *qlen = q1;
        changed = 1;
    }
    if (changed) {
        int rc = kvcu_cache_sync_qlen(c, err);
        if (rc) return rc;
    }
    dim3 grid(T, Hkv, np);
    KV_LAUNCH(kivi_window_kernel, grid, KVCU_CACHE_THREADS, 0, 0, kvcu_layer_planes_of(c, layer, k, v),
              tok_slot, tok_pos, Hkv, d, R);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
