/*
 * Chapter 04's part of the device cache: the row codec, kv_cache_codec.c's twin. The kernels
 * here encode token rows into the rows the locator gives, with the bytes the CPU writes.
 *
 * cache_write_kernel: one block per (new token, kv head, K or V), each element or group
 *   encoded by kvcu_quant_math.cuh, the encoders of kvcu_quant.cu: fp32 copies; fp16, bf16
 *   and fp8 convert each element with the device's native types (the bits
 *   kv_quant_math.h's software conversions give); int8 gives each group of G channels a
 *   warp: a shuffle max gives the amax, lane 0 writes s = amax / 127, every lane its codes
 *   (kvq_int8_encode(), the CPU's line); int4-g32 the same with s = amax / 7, each warp's
 *   32 nibbles packed two a byte, low nibble first (kvq_int4_encode(), the CPU's bytes). A
 *   window's ring row written twice in one launch keeps the later token, as on the CPU.
 * cache_write_slots_kernel: the same rows through a flat slot mapping (chapter 05).
 * fp8_calibrate_kernel: one block per prefilled sequence: each head's amax over the chunk
 *   (non-finite values skipped), then amax / max per head or the max over heads.
 */
#include <stdint.h>

#include "kv_quant.h"
#include "kvcu_cache_internal.cuh"
#include "kvcu_quant_math.cuh"

/* The whole block writes row x [d] into pool or slot row prow of head rhead of plane p, in
 * format fmt (not KIVI), with kvcu_quant.cu's encoders (kvcu_quant_math.cuh): int8 and
 * int4-g32 groups one warp each, the other formats one element a thread. Shared by the position writes and the
 * slot-mapping writes. */
static __device__ void write_row(int fmt, const kv_cache_plane *p, int64_t rhead, int rows,
                                 int64_t prow, const float *x, float scale, int d)
{
    uint8_t *row = p->codes + (rhead * rows + prow) * p->row_bytes;
    if (kvq_is_sym(fmt)) {
        const int g = kvq_row_group(fmt, KV_QROLE_VALUE, d), ng = d / g;
        float *meta = (float *)p->meta + rhead * p->meta_entries + prow * ng;
        if (kvq_is_int8(fmt)) {
            for (int gi = threadIdx.x / KV_WARP; gi < ng; gi += blockDim.x / KV_WARP)
                kvcu_encode_group(fmt, x + gi * g, 1, g, meta + gi, row + gi * g, 1);
            return;
        }
        /* int4-g32: a group is one code a lane (g = 32); the warp's 32 nibbles go through
         * shared memory, and lane l packs elements 2l (low nibble) and 2l + 1 into byte l of
         * the group's 16, the CPU's byte */
        __shared__ uint8_t nib[KVCU_CACHE_THREADS]; /* [warps][32] one code a byte */
        uint8_t *q = nib + threadIdx.x / KV_WARP * KV_WARP;
        const int lane = threadIdx.x % KV_WARP;
        for (int gi = threadIdx.x / KV_WARP; gi < ng; gi += blockDim.x / KV_WARP) {
            kvcu_encode_group(fmt, x + gi * g, 1, g, meta + gi, q, 1);
            __syncwarp();
            if (lane < g / 2) row[gi * g / 2 + lane] = (uint8_t)(q[2 * lane] | q[2 * lane + 1] << 4);
            __syncwarp(); /* the group's nibbles are read before the next group's land */
        }
        return;
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) kvcu_encode_float(fmt, row, j, x[j], scale);
}

/* Block (t, h, r): row h of token t's rows of plane r (0 keys, 1 values) into it, in a
 * per-token format. The row locator: retention (chapter 06) maps position pos to its logical
 * row kv_window_row(keep_w, keep_s, pos) (the identity without a window, keep_w 0), the layout
 * maps that to its physical row (paged: tables [n_slots][max_blocks] on the device, codes and
 * metadata in head h of the pool; contiguous: tables NULL, head (slot, h)). */
__global__ void cache_write_kernel(int fmt, kvcu_layer_planes lp, const int *tok_slot,
                                   const int *tok_pos, int n_kv_heads, int d, int rows,
                                   const int *tables, int max_blocks, int block_size,
                                   int keep_w, int keep_s)
{
    const int t = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int slot = tok_slot[t], pos = tok_pos[t];
    const kv_cache_plane *p = &lp.p[r];
    const float *x = lp.x[r] + ((size_t)t * n_kv_heads + h) * d; /* [d] */
    const int64_t head = (int64_t)slot * n_kv_heads + h;      /* scales and windows */
    const int64_t rhead = tables ? h : head;                  /* codes and metadata */
    const int64_t lrow = kv_window_row(keep_w, keep_s, pos);  /* retention: the ring row */
    const int64_t prow = kvcu_slot_row(tables, max_blocks, block_size, slot, lrow);
    /* a ring row a later token of the launch takes again (W positions on, one more lap): the
     * CPU writes in order and the later token's bytes win, so this token is skipped instead of
     * racing it (a scale could pair with another token's codes) */
    if (keep_w > 0 && pos >= keep_s && t + keep_w < (int)gridDim.x &&
        tok_slot[t + keep_w] == slot && tok_pos[t + keep_w] == pos + keep_w)
        return;
    write_row(fmt, p, rhead, rows, prow, x, p->scale ? p->scale[head] : 1.0f, d);
}

/* Block (t, h, r) of a slot-mapping write: token t's row of head h into pool row slots[t]
 * (negative: padding, nothing written). Per-token formats without per-sequence scales. */
__global__ void cache_write_slots_kernel(int fmt, kvcu_layer_planes lp, const int64_t *slots,
                                         int n_kv_heads, int d, int rows)
{
    const int t = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    if (slots[t] < 0) return;
    const kv_cache_plane *p = &lp.p[r];
    const float *x = lp.x[r] + ((size_t)t * n_kv_heads + h) * d; /* [d] */
    write_row(fmt, p, h, rows, slots[t], x, 1.0f, d);
}

/* One block: the fp8 scales of one slot from its prefill chunk x [n][H_kv][d]. */
__global__ void fp8_calibrate_kernel(int fmt, const float *x, int n, int n_kv_heads, int d,
                                     int per_head, float *scales)
{
    KV_DYNAMIC_SMEM(float, smem);
    float *red = smem, *amax = smem + KV_WARP; /* [32] reduction, [H_kv] amax per head */
    for (int h = 0; h < n_kv_heads; h++) {
        float m = 0.0f;
        for (int64_t i = threadIdx.x; i < (int64_t)n * d; i += blockDim.x) {
            const float xv = x[((i / d) * n_kv_heads + h) * d + i % d];
            if (!kvq_nonfinite(xv)) m = fmaxf(m, fabsf(xv));
        }
        m = kv_block_max(m, red);
        if (threadIdx.x == 0) amax[h] = m;
    }
    if (threadIdx.x == 0) {
        float all = 0.0f;
        for (int h = 0; h < n_kv_heads; h++) all = fmaxf(all, amax[h]);
        for (int h = 0; h < n_kv_heads; h++) {
            const float a = per_head ? amax[h] : all; /* kv_quant_fp8_scale() */
            scales[h] = (a > 0.0f && !kvq_nonfinite(a)) ? KVQ_DIV(a, kvq_fp8_max(fmt)) : 1.0f;
        }
    }
}

int kvcu_cache_codec_begin(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                           const float *k, const float *v, kv_err *err)
{
    const int fmt = c->fmt[layer], Hkv = c->n_kv_heads, d = c->head_dim;
    if (!kvq_is_fp8(fmt)) return KV_OK;
    const size_t kvdim = (size_t)Hkv * d;
    const kvcu_layer_planes lp = kvcu_layer_planes_of(c, layer, k, v);
    for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
        if (seqs[i].pos != 0) continue;
        const size_t smem = (KV_WARP + (size_t)Hkv) * sizeof(float);
        for (int r = 0; r < c->n_planes; r++)
            KV_LAUNCH(fp8_calibrate_kernel, 1, KVCU_CACHE_THREADS, smem, 0, fmt,
                      lp.x[r] + t * kvdim, seqs[i].n_tokens, Hkv, d, c->spec.quant.fp8_per_head,
                      lp.p[r].scale + (size_t)seqs[i].slot * Hkv);
        KV_CUDA_TRY_LAUNCH(err);
    }
    return KV_OK;
}

int kvcu_cache_encode_rows(kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                           const float *k, const float *v, int T, kv_err *err)
{
    dim3 grid(T, c->n_kv_heads, c->n_planes);
    KV_LAUNCH(cache_write_kernel, grid, KVCU_CACHE_THREADS, 0, 0, c->fmt[layer],
              kvcu_layer_planes_of(c, layer, k, v), tok_slot, tok_pos, c->n_kv_heads, c->head_dim, c->rows,
              c->d_tables, c->max_blocks, c->spec.layout.block_size, c->spec.window.size,
              c->spec.window.n_sinks);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_cache_encode_slots(kvcu_cache *c, int layer, const int64_t *d_slots, int n,
                            const float *k, const float *v, kv_err *err)
{
    dim3 grid(n, c->n_kv_heads, c->n_planes);
    KV_LAUNCH(cache_write_slots_kernel, grid, KVCU_CACHE_THREADS, 0, 0, c->fmt[layer],
              kvcu_layer_planes_of(c, layer, k, v), d_slots, c->n_kv_heads, c->head_dim, c->rows);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
