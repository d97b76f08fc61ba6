/*
 * Chapter 11 on the GPU: absorbed multi-head latent attention over a latent cache, the twin of
 * kv_mla_attention_absorbed() (reference_cpu/attention/kv_attention_mla.c). The absorptions
 * are plain fp32 kernels (q̃_h = W_UK,hᵀ q_nope,h before, out_h = W_UV,h o_h after); the work
 * is the latent attention between them, one decode token's H heads over n cached rows
 * c_t ‖ kR_t of D = d_c + d_R elements:
 *
 *     s_t,h = σ·([q̃_h | q_R,h] · [c_t | kR_t]),   o_h = Σ_t softmax_t(s_·,h) c_t   [d_c]
 *
 * Every head reads the same rows (MQA with 576-wide keys and 512-wide values, the values the
 * keys' first d_c elements), so the heads are the M dimension of the tensor-core tiles
 * (FlashMLA's shape; mma.sync.m16n8k16 and ldmatrix from cuda/core/kvcu_mma.cuh):
 *
 *  - a block owns 16·HT heads (HT = 1 or 2 head tiles of 16; H padded to a multiple of 16 with
 *    zero queries, whose outputs are dropped) and one range of the rows (split-KV); 4 warps
 *    per head tile. The rows stream through shared memory MLA_KT (32) at a time as 16-bit
 *    tiles [32][D + 8], two buffers: an fp16 or bf16 cache's rows by cp.async, 16 bytes a
 *    copy (the copy of tile i + 1 in flight while tile i is multiplied); every other per-token
 *    format dequantized on its way by kv_ld() into an fp16 tile. Each row is found by the
 *    cache's row locator (kv_view_row(): contiguous, or the slot's block table, blocks of 64
 *    as FlashMLA's), so a tile read serves all 16·HT heads;
 *  - scores S = Q·Kᵀ [16 heads][32 rows] over K = D: warp kg of a head tile takes the k-blocks
 *    kb ≡ kg (mod 4) of the row (9 of 36 at D = 576), its query fragments held in registers
 *    for the whole range (ldmatrix .x4 once), the rows' B fragments by ldmatrix .x4; the four
 *    partial S go through shared memory and every warp adds them in the same order (warp
 *    0, 1, 2, 3), so the four warps hold the same S, and run the same online softmax;
 *  - O += P·V: P = exp(S - m) packed to 16 bits straight from the accumulators into A
 *    fragments (two C fragments are one A fragment), V's B fragments from the same tile by
 *    ldmatrix .x4.trans; warp kg owns columns [kg·d_c/4, (kg + 1)·d_c/4) of O: 16 x 128 fp32
 *    at d_c = 512, 64 floats a thread, in registers for the whole range;
 *  - split-KV: the n rows are cut into ranges of a multiple of 64 rows, sized from the SM
 *    count unless the caller fixes the count; each block leaves its heads' (max, exp-sum,
 *    unnormalized o) and mla_merge_kernel combines the ranges by log-sum-exp, as the decode
 *    kernels' merge (kvcu_attention.cu) does.
 *
 * What is rounded: q̃ and q_R to the tile type, P to the tile type (its exp-sum stays fp32),
 * and the rows of a format that is not the tile type; the products are exact in fp32, the
 * sums fp32. tests/test_gpu_mla.c holds the result to kv_mla_attention_absorbed() by the bound
 * derived there from those roundings. Shapes: d_c a multiple of 64 up to 512 (O's columns in
 * registers), d_R a multiple of 16, d_c + d_R <= 576 (9 k-blocks a warp); any H >= 1, any n.
 * A device below sm_80 runs mla_simt_kernel instead: the same ranges and merge on CUDA cores.
 */
#include <stdint.h>
#include <string.h>

#include "kv_quant.h"
#include "kvcu_internal.cuh"
#include "kvcu_mma.cuh"
#include "kvcu_vec.cuh"

#define MLA_WARPS 4      /* warps per head tile */
#define MLA_KT 32        /* rows per tile */
#define MLA_PAD 8        /* halves after each tile row: 16-byte rows, ldmatrix rows in other banks */
#define MLA_MAX_DC 512   /* O's columns: d_c / 4 per warp, 16 n8 blocks */
#define MLA_MAX_KB 9     /* k-blocks of 16 per warp: D <= 4·9·16 = 576 */
#define MLA_RANGE 64     /* a split range is a multiple of one page block of rows */
#define MLA_MIN_RANGE 256
#define MLA_WAVES 2

/* What the kernel reads of the latent cache: plane 0 of one layer, by value. */
typedef struct {
    kv_cache_plane p;
    int fmt, rows, d;      /* format, rows per head of the plane, D = d_c + d_R */
    const int *tables;     /* paged: device [n_slots][max_blocks]; NULL: contiguous */
    int max_blocks, block_size, slot;
} mla_src;

typedef struct {
    const float *q_lat, *q_rope; /* [H][d_c], [H][d_R] */
    float *pm, *pl, *po;         /* [H][n_parts], [H][n_parts], [H][n_parts][d_c] */
    int H, d_c, d_rope, ht, n_parts;
    int64_t n, keys;             /* rows, rows per range */
    float scale;
} mla_args;

__device__ inline kv_head_view mla_view(const mla_src &s)
{
    if (s.tables)
        return kv_cache_plane_view_paged(&s.p, s.fmt, KV_QROLE_KEY, 1, s.rows, s.d, 1, s.slot, 0,
                                         INT64_MAX, s.tables + (size_t)s.slot * s.max_blocks,
                                         s.block_size);
    return kv_cache_plane_view(&s.p, s.fmt, KV_QROLE_KEY, 1, s.rows, s.d, 1, s.slot, 0,
                               INT64_MAX);
}

/* Rows [t0, t0 + nt) into a tile [MLA_KT][D + 8]; rows past nt zeroed (their weight is 0, and
 * 0 · NaN would not be). RAW: the rows are of the tile's type, D / 8 cp.async copies each, one
 * commit for the tile; else each element dequantized (kv_ld()) and rounded to the type. */
template <int BF16, int RAW>
__device__ inline void mla_tile(const kv_head_view &h, uint16_t *ts, int D, int64_t t0, int nt)
{
    const int ld = D + MLA_PAD;
    if (RAW) {
        const int cpr = D / 8;
        const size_t rb = (size_t)D * 2;
        for (int c = threadIdx.x; c < MLA_KT * cpr; c += blockDim.x) {
            const int j = c / cpr, ch = c % cpr;
            uint16_t *dst = ts + j * ld + ch * 8;
            if (j < nt) kvcu_cp16(dst, h.codes + kv_view_row(&h, t0 + j) * rb + ch * 16);
            else *(uint4 *)(void *)dst = make_uint4(0, 0, 0, 0);
        }
        kvcu_cp_commit();
    } else {
        for (int e = threadIdx.x; e < MLA_KT * D; e += blockDim.x) {
            const int j = e / D, i = e % D;
            const float x = j < nt ? kv_ld(h, NULL, t0 + j, kv_view_row(&h, t0 + j), i) : 0.0f;
            ts[j * ld + i] = kvcu_bits16<BF16>(x);
        }
    }
}

/* Below sm_80 (no mma.sync.m16n8k16) the same attention on CUDA cores, fp32 throughout (no
 * 16-bit rounding: within the tensor cores' bound): block (range, head) of MLA_SIMT threads,
 * the head's query [D] in shared memory; per tile of MLA_KT rows, warp w scores rows w, w + 4,
 * ... (a lane per 32 elements, a warp sum), then every thread runs the tile's online softmax
 * and adds the weighted rows into its columns j ≡ tid (mod MLA_SIMT) of o (coalesced reads).
 * It leaves the same partial states for mla_merge_kernel. */
#define MLA_SIMT 128
__global__ void __launch_bounds__(MLA_SIMT) mla_simt_kernel(mla_src src, mla_args a)
{
    __shared__ float qs[MLA_WARPS * MLA_MAX_KB * 16]; /* [D] */
    __shared__ float ss[MLA_KT];                      /* the tile's scores */
    const int D = src.d, dc = a.d_c, h = blockIdx.y, part = blockIdx.x;
    const int tid = threadIdx.x, warp = tid / KV_WARP, l = tid % KV_WARP;
    const int64_t lo = (int64_t)part * a.keys, hi = lo + a.keys < a.n ? lo + a.keys : a.n;
    const kv_head_view hv = mla_view(src);
    for (int i = tid; i < D; i += MLA_SIMT)
        qs[i] = i < dc ? a.q_lat[(size_t)h * dc + i] : a.q_rope[(size_t)h * a.d_rope + i - dc];
    float o[MLA_MAX_DC / MLA_SIMT], m = -INFINITY, lsum = 0.0f;
    for (int k = 0; k < MLA_MAX_DC / MLA_SIMT; k++) o[k] = 0.0f;
    __syncthreads();
    for (int64_t kt = lo; kt < hi; kt += MLA_KT) {
        const int nt = (int)(hi - kt < MLA_KT ? hi - kt : MLA_KT);
        for (int j = warp; j < nt; j += MLA_SIMT / KV_WARP) {
            const int64_t r = kv_view_row(&hv, kt + j);
            float acc = 0.0f;
            for (int i = l; i < D; i += KV_WARP) acc += qs[i] * kv_ld(hv, NULL, kt + j, r, i);
            acc = kv_warp_sum(acc);
            if (l == 0) ss[j] = acc * a.scale;
        }
        __syncthreads();
        float mt = m;
        for (int j = 0; j < nt; j++) mt = fmaxf(mt, ss[j]);
        const float alpha = m == -INFINITY ? 0.0f : expf(m - mt);
        m = mt;
        lsum *= alpha;
        for (int k = 0; k < MLA_MAX_DC / MLA_SIMT; k++) o[k] *= alpha;
        for (int j = 0; j < nt; j++) {
            const float p = expf(ss[j] - m);
            const int64_t r = kv_view_row(&hv, kt + j);
            lsum += p;
            for (int k = 0; k < MLA_MAX_DC / MLA_SIMT; k++)
                if (tid + k * MLA_SIMT < dc)
                    o[k] += p * kv_ld(hv, NULL, kt + j, r, tid + k * MLA_SIMT);
        }
        __syncthreads(); /* ss is rewritten by the next tile */
    }
    const size_t ph = (size_t)h * a.n_parts + part;
    if (tid == 0) {
        a.pm[ph] = m;
        a.pl[ph] = lsum;
    }
    for (int k = 0; k < MLA_MAX_DC / MLA_SIMT; k++)
        if (tid + k * MLA_SIMT < dc) a.po[ph * dc + tid + k * MLA_SIMT] = o[k];
}

/* Block (range, head group): heads 16·HT·blockIdx.y .., rows of range blockIdx.x. */
template <int BF16, int RAW>
__global__ void mla_decode_kernel(mla_src src, mla_args a)
{
    KV_DYNAMIC_SMEM(unsigned char, base);
    const int D = src.d, dc = a.d_c, ld = D + MLA_PAD, HT = a.ht;
    const int tid = threadIdx.x, warp = tid / KV_WARP, l = tid % KV_WARP, g = l / 4, tq = l % 4;
    const int ht = warp / MLA_WARPS, kg = warp % MLA_WARPS; /* head tile, k-group / columns */
    const int h0 = blockIdx.y * 16 * HT;                    /* the block's first head */
    const int part = blockIdx.x;
    const int64_t lo = (int64_t)part * a.keys, hi = lo + a.keys < a.n ? lo + a.keys : a.n;
    float *sp = (float *)base;                        /* [HT][4 warps][16 floats][32 lanes] */
    uint16_t *tiles = (uint16_t *)(sp + HT * MLA_WARPS * 16 * KV_WARP); /* [2][KT][ld] */
    const size_t tile = (size_t)MLA_KT * ld;
    const kv_head_view hv = mla_view(src);

    /* the heads' queries [q̃ | q_R] as 16-bit rows [16·HT][ld] (zeros past H), staged in the
     * tile buffers; each warp keeps its k-blocks as A fragments */
    uint16_t *q16 = tiles;
    for (int e = tid; e < 16 * HT * D; e += blockDim.x) {
        const int r = e / D, i = e % D, h = h0 + r;
        float x = 0.0f;
        if (h < a.H) x = i < dc ? a.q_lat[(size_t)h * dc + i] : a.q_rope[(size_t)h * a.d_rope + i - dc];
        q16[r * ld + i] = kvcu_bits16<BF16>(x);
    }
    __syncthreads();
    const int nkb = D / 16;
    uint32_t qa[MLA_MAX_KB][4];
    KV_UNROLL
    for (int i = 0; i < MLA_MAX_KB; i++) {
        const int kb = kg + MLA_WARPS * i;
        if (kb < nkb)
            kvcu_ldmatrix_x4(qa[i], q16 + (ht * 16 + l % 16) * ld + kb * 16 + 8 * (l / 16));
    }
    __syncthreads(); /* q16 is overwritten by the tiles */

    const int ndw = dc / MLA_WARPS / 8, c0 = kg * (dc / MLA_WARPS); /* this warp's O columns */
    float o[MLA_MAX_DC / MLA_WARPS / 8][4];
    KV_UNROLL
    for (int nd = 0; nd < MLA_MAX_DC / MLA_WARPS / 8; nd++)
        for (int i = 0; i < 4; i++) o[nd][i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}; /* rows g, g + 8 */
    mla_tile<BF16, RAW>(hv, tiles, D, lo, (int)(hi - lo < MLA_KT ? hi - lo : MLA_KT));
    if (!RAW) __syncthreads();
    int buf = 0;
    for (int64_t kt = lo; kt < hi; kt += MLA_KT, buf ^= 1) {
        const uint16_t *ks = tiles + tile * buf;
        const int64_t nx = kt + MLA_KT;
        if (nx < hi)
            mla_tile<BF16, RAW>(hv, tiles + tile * (buf ^ 1), D, nx,
                                (int)(hi - nx < MLA_KT ? hi - nx : MLA_KT));
        else if (RAW)
            kvcu_cp_commit(); /* an empty batch: the wait below counts one per tile */
        if (RAW) {
            kvcu_cp_wait<1>(); /* this tile's copies landed (the next one's may fly) */
            __syncthreads();
        }
        /* this warp's part of S = Q·Kᵀ: its k-blocks, the tile's 32 rows as 4 n-blocks */
        float s[MLA_KT / 8][4];
        KV_UNROLL
        for (int nb = 0; nb < MLA_KT / 8; nb++)
            for (int i = 0; i < 4; i++) s[nb][i] = 0.0f;
        KV_UNROLL
        for (int i = 0; i < MLA_MAX_KB; i++) {
            const int kb = kg + MLA_WARPS * i;
            if (kb >= nkb) break;
            KV_UNROLL
            for (int nb = 0; nb < MLA_KT / 8; nb += 2) {
                uint32_t b[4]; /* b[0..1]: rows nb·8 .., b[2..3]: rows (nb + 1)·8 .. */
                kvcu_ldmatrix_x4(b, ks + (nb * 8 + l % 8 + 8 * (l / 16)) * ld + kb * 16 +
                                        8 * ((l / 8) % 2));
                kvcu_mma<BF16>(s[nb], qa[i], b);
                kvcu_mma<BF16>(s[nb + 1], qa[i], b + 2);
            }
        }
        /* the four warps' parts through shared memory, added in warp order by each */
        float *mine = sp + ((ht * MLA_WARPS + kg) * 16) * KV_WARP;
        KV_UNROLL
        for (int nb = 0; nb < MLA_KT / 8; nb++)
            for (int i = 0; i < 4; i++) mine[(nb * 4 + i) * KV_WARP + l] = s[nb][i];
        __syncthreads();
        const float *all = sp + (ht * MLA_WARPS * 16) * KV_WARP;
        float mt[2] = {-INFINITY, -INFINITY};
        KV_UNROLL
        for (int nb = 0; nb < MLA_KT / 8; nb++)
            for (int i = 0; i < 4; i++) {
                const int e = (nb * 4 + i) * KV_WARP + l;
                float x = all[e];
                for (int w = 1; w < MLA_WARPS; w++) x += all[w * 16 * KV_WARP + e];
                const int64_t row = kt + nb * 8 + 2 * tq + (i & 1);
                x = row < hi ? x * a.scale : -INFINITY;
                s[nb][i] = x;
                mt[i / 2] = fmaxf(mt[i / 2], x);
            }
        /* online softmax: a row's 32 scores sit in the 4 lanes of a quad */
        float alpha[2];
        for (int r = 0; r < 2; r++) {
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
            const float mn = fmaxf(m[r], mt[r]); /* finite: the tile has a row */
            alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            m[r] = mn;
            lsum[r] *= alpha[r];
        }
        uint32_t pa[MLA_KT / 16][4];
        KV_UNROLL
        for (int nb = 0; nb < MLA_KT / 8; nb++) {
            float p[4];
            for (int i = 0; i < 4; i++) {
                p[i] = expf(s[nb][i] - m[i / 2]); /* masked rows: exp(-inf) = 0 */
                lsum[i / 2] += p[i];
            }
            pa[nb / 2][2 * (nb % 2)] = kvcu_pack2<BF16>(p[0], p[1]);
            pa[nb / 2][2 * (nb % 2) + 1] = kvcu_pack2<BF16>(p[2], p[3]);
        }
        /* O = O·alpha + P·V over this warp's columns; V is the tile's first d_c columns */
        KV_UNROLL
        for (int nd = 0; nd < MLA_MAX_DC / MLA_WARPS / 8; nd++)
            for (int i = 0; i < 4; i++) o[nd][i] *= alpha[i / 2];
        KV_UNROLL
        for (int kb = 0; kb < MLA_KT / 16; kb++) {
            KV_UNROLL
            for (int nd = 0; nd < MLA_MAX_DC / MLA_WARPS / 8; nd += 2) {
                if (nd >= ndw) break;
                uint32_t b[4]; /* .trans: b[0..1] columns nd·8 .., b[2..3] (nd + 1)·8 .. */
                kvcu_ldmatrix_x4_trans(b, ks + (kb * 16 + l % 8 + 8 * ((l / 8) % 2)) * ld + c0 +
                                              (nd + l / 16) * 8);
                kvcu_mma<BF16>(o[nd], pa[kb], b);
                kvcu_mma<BF16>(o[nd + 1], pa[kb], b + 2);
            }
        }
        __syncthreads(); /* the next tile is in; this one and sp may be overwritten */
    }
    /* the range's state: l of a row is its quad's sum; warp 0 of a tile writes m and l */
    for (int r = 0; r < 2; r++) {
        lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 1);
        lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 2);
    }
    for (int r = 0; r < 2; r++) {
        const int h = h0 + ht * 16 + g + 8 * r;
        if (h >= a.H) continue;
        const size_t ph = (size_t)h * a.n_parts + part;
        if (kg == 0 && tq == 0) {
            a.pm[ph] = m[r];
            a.pl[ph] = lsum[r];
        }
        float *po = a.po + ph * dc + c0; /* this warp's columns */
        KV_UNROLL
        for (int nd = 0; nd < MLA_MAX_DC / MLA_WARPS / 8; nd++) {
            if (nd >= ndw) break;
            po[nd * 8 + 2 * tq] = o[nd][2 * r];
            po[nd * 8 + 2 * tq + 1] = o[nd][2 * r + 1];
        }
    }
}

/* Block h: o_lat[h] = Σ_j o_j e^(m_j - M) / Σ_j l_j e^(m_j - M) over the ranges j, M = max m_j
 * (every range holds a row, so M is finite). */
__global__ void mla_merge_kernel(mla_args a, float *o_lat)
{
    const int h = blockIdx.x, np = a.n_parts;
    const float *pm = a.pm + (size_t)h * np, *pl = a.pl + (size_t)h * np;
    const float *po = a.po + (size_t)h * np * a.d_c;
    float M = pm[0];
    for (int j = 1; j < np; j++) M = fmaxf(M, pm[j]);
    float L = 0.0f;
    for (int j = 0; j < np; j++) L += pl[j] * expf(pm[j] - M);
    const float inv = 1.0f / L;
    for (int i = threadIdx.x; i < a.d_c; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < np; j++) acc += po[(size_t)j * a.d_c + i] * expf(pm[j] - M);
        o_lat[(size_t)h * a.d_c + i] = acc * inv;
    }
}

/* Block h: q̃_h = W_UK,hᵀ q_nope,h, q_lat [H][d_c] (w_uk [H][d_nope][d_c]): a thread per
 * column j, the sum over i in order, as the CPU's loop. */
__global__ void mla_absorb_kernel(float *q_lat, const float *w_uk, const float *q_nope, int d_c,
                                  int d_nope)
{
    const int h = blockIdx.x;
    const float *uk = w_uk + (size_t)h * d_nope * d_c, *q = q_nope + (size_t)h * d_nope;
    for (int j = threadIdx.x; j < d_c; j += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < d_nope; i++) acc += q[i] * uk[(size_t)i * d_c + j];
        q_lat[(size_t)h * d_c + j] = acc;
    }
}

/* Block h: out_h = W_UV,h o_h, out [H][d_v] (w_uv [H][d_v][d_c]): a warp per output. */
__global__ void mla_out_kernel(float *out, const float *w_uv, const float *o_lat, int d_c, int d_v)
{
    const int h = blockIdx.x, warp = threadIdx.x / KV_WARP, lane = threadIdx.x % KV_WARP;
    const float *o = o_lat + (size_t)h * d_c;
    for (int i = warp; i < d_v; i += blockDim.x / KV_WARP) {
        const float *w = w_uv + ((size_t)h * d_v + i) * d_c;
        float acc = 0.0f;
        for (int j = lane; j < d_c; j += KV_WARP) acc += w[j] * o[j];
        acc = kv_warp_sum(acc);
        if (lane == 0) out[(size_t)h * d_v + i] = acc;
    }
}

/* ---- host side ---------------------------------------------------------------------------- */

static size_t mla_smem(int D, int ht)
{
    return (size_t)ht * MLA_WARPS * 16 * KV_WARP * sizeof(float) +
           2 * (size_t)MLA_KT * (D + MLA_PAD) * sizeof(uint16_t);
}

size_t kvcu_mla_attention_scratch(int n_heads, int d_c, int n)
{
    const size_t parts = n > 0 ? ((size_t)n + MLA_RANGE - 1) / MLA_RANGE : 1;
    return (size_t)n_heads * parts * (d_c + 2) + 2 * (size_t)n_heads * d_c;
}

/* The checks of both entry points: the cache is a latent cache whose rows are d_c + d_R wide
 * and the kernel's shape constraints hold. */
static int mla_check(const char *who, const kvcu_cache *c, int layer, int slot, int n,
                     int n_heads, int d_rope, int d_c, kv_err *err)
{
    if (!c) return kv_fail(err, KV_ERR_ARG, "%s: NULL cache", who);
    if (c->n_planes != 1 || c->n_kv_heads != 1)
        return kv_fail(err, KV_ERR_ARG, "%s: a latent cache has one plane and one KV head "
                       "(this one %d and %d): kvcu_cache_create_planes(.., 1, ..)", who,
                       c->n_planes, c->n_kv_heads);
    if (layer < 0 || layer >= c->n_layers || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: layer %d of %d, slot %d of %d", who, layer,
                       c->n_layers, slot, c->spec.n_slots);
    if (n < 1 || n > c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "%s: n %d rows (1 .. capacity %d)", who, n,
                       c->spec.capacity);
    if (c->tables && (int64_t)c->n_mapped[slot] * c->spec.layout.block_size < n)
        return kv_fail(err, KV_ERR_ARG, "%s: %d rows, slot %d maps %d blocks of %d", who, n,
                       slot, c->n_mapped[slot], c->spec.layout.block_size);
    if (n_heads < 1) return kv_fail(err, KV_ERR_ARG, "%s: %d heads", who, n_heads);
    if (d_rope < 16 || d_rope % 16 || d_c < 64 || d_c % 64 || d_c > MLA_MAX_DC ||
        d_c + d_rope > MLA_WARPS * MLA_MAX_KB * 16)
        return kv_fail(err, KV_ERR_ARG, "%s: d_c %d, d_R %d: need d_c a multiple of 64 up to "
                       "%d, d_R a multiple of 16, d_c + d_R <= %d (the cache's rows: %d)", who,
                       d_c, d_rope, MLA_MAX_DC, MLA_WARPS * MLA_MAX_KB * 16, c->head_dim);
    if (kvq_is_kivi(c->fmt[layer]) || c->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s: KIVI's window and sliding windows are "
                       "not read here (per-token formats only)", who,
                       c->spec.window.size > 0 ? "a windowed cache" : kv_quant_name(c->fmt[layer]));
    return KV_OK;
}

/* Ranges of the n rows: @p want of them (0: from the device, about MLA_WAVES waves of resident
 * blocks over the head groups, none shorter than MLA_MIN_RANGE rows); each a multiple of 64. */
static int64_t mla_keys(const void *kernel, size_t smem, int threads, int groups, int64_t n,
                        int want)
{
    int64_t k;
    if (want > 0) {
        k = (n + want - 1) / want;
    } else {
        const int64_t target = (int64_t)MLA_WAVES * kvcu_resident_blocks(kernel, threads, smem) /
                               groups;
        k = target > 1 ? (n + target - 1) / target : n;
        if (k < MLA_MIN_RANGE) k = MLA_MIN_RANGE;
    }
    return (k + MLA_RANGE - 1) / MLA_RANGE * MLA_RANGE;
}

template <int BF16, int RAW>
static int mla_run(const mla_src &src, mla_args &a, float *o_lat, int want, kv_err *err)
{
    const size_t smem = mla_smem(src.d, a.ht);
    const int threads = KV_WARP * MLA_WARPS * a.ht, tiles16 = (a.H + 15) / 16;
    const dim3 grid0(1, (tiles16 + a.ht - 1) / a.ht);
    KV_CUDA_TRY(cudaFuncSetAttribute(mla_decode_kernel<BF16, RAW>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err);
    a.keys = mla_keys((const void *)mla_decode_kernel<BF16, RAW>, smem, threads, (int)grid0.y,
                      a.n, want);
    a.n_parts = (int)((a.n + a.keys - 1) / a.keys);
    a.pl = a.pm + (size_t)a.H * a.n_parts;
    a.po = a.pl + (size_t)a.H * a.n_parts;
    const dim3 grid(a.n_parts, grid0.y);
    KV_LAUNCH((mla_decode_kernel<BF16, RAW>), grid, threads, smem, 0, src, a);
    KV_CUDA_TRY_LAUNCH(err);
    KV_LAUNCH(mla_merge_kernel, a.H, 128, 0, 0, a, o_lat);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* mla_run() on CUDA cores (mla_simt_kernel: below sm_80), a block per (range, head). */
static int mla_run_simt(const mla_src &src, mla_args &a, float *o_lat, int want, kv_err *err)
{
    a.keys = mla_keys((const void *)mla_simt_kernel, 0, MLA_SIMT, a.H, a.n, want);
    a.n_parts = (int)((a.n + a.keys - 1) / a.keys);
    a.pl = a.pm + (size_t)a.H * a.n_parts;
    a.po = a.pl + (size_t)a.H * a.n_parts;
    KV_LAUNCH(mla_simt_kernel, dim3(a.n_parts, a.H), MLA_SIMT, 0, 0, src, a);
    KV_CUDA_TRY_LAUNCH(err);
    KV_LAUNCH(mla_merge_kernel, a.H, 128, 0, 0, a, o_lat);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* The latent attention into o_lat, partial states in @p parts (kvcu_mla_attention_scratch()
 * minus the absorbed call's 2·H·d_c). */
static int mla_latent(const kvcu_cache *c, int layer, int slot, int n, const float *q_lat,
                      const float *q_rope, float *o_lat, float *parts, int n_heads, int d_rope,
                      float scale, int n_parts, kv_err *err)
{
    mla_src s;
    memset(&s, 0, sizeof s);
    s.p = *kv_cache_plane_of(c->planes, c->n_layers, 0, layer);
    s.fmt = c->fmt[layer];
    s.rows = c->rows;
    s.d = c->head_dim;
    s.tables = c->d_tables;
    s.max_blocks = c->max_blocks;
    s.block_size = c->spec.layout.block_size;
    s.slot = slot;
    mla_args a;
    memset(&a, 0, sizeof a);
    a.q_lat = q_lat, a.q_rope = q_rope, a.pm = parts;
    a.H = n_heads, a.d_c = c->head_dim - d_rope, a.d_rope = d_rope, a.n = n, a.scale = scale;
    a.ht = n_heads > 16 ? 2 : 1;
    if (!kvcu_has_mma()) return mla_run_simt(s, a, o_lat, n_parts, err);
    const int raw = (s.fmt == KV_QF_F16 || s.fmt == KV_QF_BF16) && (uintptr_t)s.p.codes % 16 == 0;
    if (s.fmt == KV_QF_BF16)
        return raw ? mla_run<1, 1>(s, a, o_lat, n_parts, err) : mla_run<1, 0>(s, a, o_lat, n_parts, err);
    return raw ? mla_run<0, 1>(s, a, o_lat, n_parts, err) : mla_run<0, 0>(s, a, o_lat, n_parts, err);
}

/* Scratch given, or allocated for the call (then freed after the kernels: cudaFree waits). */
static int mla_scratch(float **s, float *given, size_t floats, kv_err *err)
{
    *s = given;
    return given ? KV_OK : kvcu_device_alloc((void **)s, floats * sizeof(float), err);
}

static int mla_done(float *s, const float *given, int rc, const char *who, kv_err *err)
{
    if (given) return rc;
    const cudaError_t e = kvcu_clear_error(cudaFree(s));
    if (!rc && e != cudaSuccess)
        rc = kv_fail(err, KVCU_STATUS(e), "%s: %s", who, cudaGetErrorString(e));
    return rc;
}

int kvcu_mla_attention_latent(const kvcu_cache *c, int layer, int slot, int n,
                              const float *q_lat, const float *q_rope, float *o_lat,
                              float *scratch, int n_heads, int d_rope, float scale, int n_parts,
                              kv_err *err)
{
    const char *who = "kvcu_mla_attention_latent";
    int rc = mla_check(who, c, layer, slot, n, n_heads, d_rope, c ? c->head_dim - d_rope : 0, err);
    if (rc) return rc;
    if (!q_lat || !q_rope || !o_lat || n_parts < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: NULL query or output, or n_parts %d", who, n_parts);
    float *s;
    rc = mla_scratch(&s, scratch, kvcu_mla_attention_scratch(n_heads, c->head_dim - d_rope, n), err);
    if (rc) return rc;
    rc = mla_latent(c, layer, slot, n, q_lat, q_rope, o_lat, s, n_heads, d_rope, scale, n_parts,
                    err);
    return mla_done(s, scratch, rc, who, err);
}

int kvcu_mla_attention_absorbed(const float *w_uk, const float *w_uv, const kv_mla_dims *m,
                                int n_heads, const float *q_nope, const float *q_rope,
                                const kvcu_cache *c, int layer, int slot, int n, float *out,
                                float *scratch, int n_parts, kv_err *err)
{
    const char *who = "kvcu_mla_attention_absorbed";
    if (!m || !w_uk || !w_uv || !q_nope || !q_rope || !out || n_parts < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: NULL argument, or n_parts %d", who, n_parts);
    int rc = kv_mla_dims_check(m, err);
    if (rc) return rc;
    if (c && c->head_dim != kv_mla_row(m))
        return kv_fail(err, KV_ERR_ARG, "%s: the cache's rows hold %d elements, the layer's "
                       "latent rows d_c + d_R = %d", who, c->head_dim, kv_mla_row(m));
    rc = mla_check(who, c, layer, slot, n, n_heads, m->d_rope, m->d_c, err);
    if (rc) return rc;
    float *s;
    rc = mla_scratch(&s, scratch, kvcu_mla_attention_scratch(n_heads, m->d_c, n), err);
    if (rc) return rc;
    float *q_lat = s, *o_lat = s + (size_t)n_heads * m->d_c, *parts = o_lat + (size_t)n_heads * m->d_c;
    const float scale = 1.0f / sqrtf((float)(m->d_nope + m->d_rope)); /* the CPU's */
    KV_LAUNCH(mla_absorb_kernel, n_heads, 128, 0, 0, q_lat, w_uk, q_nope, m->d_c, m->d_nope);
    cudaError_t e = kvcu_clear_error(cudaGetLastError());
    if (e != cudaSuccess)
        rc = kv_fail(err, KVCU_STATUS(e), "%s: absorb: %s", who, cudaGetErrorString(e));
    if (!rc)
        rc = mla_latent(c, layer, slot, n, q_lat, q_rope, o_lat, parts, n_heads, m->d_rope,
                        scale, n_parts, err);
    if (!rc) {
        KV_LAUNCH(mla_out_kernel, n_heads, 128, 0, 0, out, w_uv, o_lat, m->d_c, m->d_v);
        e = kvcu_clear_error(cudaGetLastError());
        if (e != cudaSuccess)
            rc = kv_fail(err, KVCU_STATUS(e), "%s: W_UV: %s", who, cudaGetErrorString(e));
    }
    return mla_done(s, scratch, rc, who, err);
}
