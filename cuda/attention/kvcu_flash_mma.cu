/*
 * Chapter 08, v5: v2's tiles on tensor cores (kvcu_flash_attention(5, ...); the versions
 * before it are in kvcu_flash.cu). FlashAttention-2's structure with mma.sync.m16n8k16 and
 * ldmatrix (cuda/core/kvcu_mma.cuh):
 *
 *  - a block of 4 warps owns FLASH_MMA_ROWS (64) rows, a warp 16 of them. A row is a (query,
 *    head) pair: the block takes 64 / G consecutive queries times the G heads of one KV group,
 *    so every K/V tile read into shared memory serves the whole group (GQA), as v3 does for
 *    one query;
 *  - K and V stream through shared memory FLASH_MMA_KEYS (64) keys at a time, converted to
 *    16-bit floats as they are read (every chapter-04 format dequantized by kv_ld(), the
 *    paged rows found through the slot's table): fp16 tiles, or bf16 for a bf16 cache (its
 *    values then enter the tensor cores exactly). Two buffers: the next tile is loaded while
 *    the current one is multiplied. Where the cache's rows already are the tile's type (an
 *    fp16 cache, or bf16; RAW) the rows stream by cp.async, 16 bytes a copy straight into
 *    shared memory without passing through registers, the copy of tile i + 1 in flight while
 *    tile i is multiplied (kvcu_cp16(), cuda/core/kvcu_vec.cuh); every other format is
 *    dequantized element by element on its way (plain loads: cp.async cannot convert);
 *  - each warp keeps its 16 queries as A fragments in registers (ldmatrix .x4 once), forms
 *    S = Q·Kᵀ for the tile as 16 x 64 fp32 accumulators (B fragments of the K rows by ldmatrix
 *    .x4), scales and masks them, and runs the online softmax in registers: a row's values sit
 *    in the 4 lanes of a quad, whose max and sum take two shuffles;
 *  - P = exp(S - m) is packed to 16 bits straight from the accumulators into A fragments (two
 *    adjacent 16 x 8 C fragments are one 16 x 16 A fragment) and O += P·V runs on the tensor
 *    cores, V's B fragments by ldmatrix .x4.trans; O stays in registers (16 x d fp32 per warp,
 *    d / 2 floats per thread), rescaled by exp(m_old - m_new) per tile, divided by l once;
 *  - causal: the block stops at its last row's end (the tiles past every row's end are never
 *    read), and a warp whose 16 rows all end before a tile skips its products.
 *
 * Scores and the exp-sums l are fp32; what is rounded is q, the K and V tiles, and P to the
 * 16-bit type (unit roundoff u = 2^-11 for fp16, 2^-8 for bf16). tests/test_gpu_flash_mma.c
 * holds v5 to kv_flash_naive() by the bound derived there from those roundings. Head dims: a
 * multiple of 16 up to FLASH_MMA_MAX_D (the O accumulators are registers).
 */
#include "kvcu_flash_tile.cuh"

#define FLASH_MMA_WARPS 4
#define FLASH_MMA_ROWS (16 * FLASH_MMA_WARPS) /* rows (query, head) per block */
#define FLASH_MMA_KEYS 64                     /* keys per tile */
#define FLASH_MMA_MAX_D 128
#define FLASH_MMA_PAD FLASH_TILE_PAD /* halves after each tile row: 16-byte aligned rows,
                                     * and ldmatrix's 8 rows of a matrix fall in different banks */

/* Queries per block: 64 / G of them, times the G heads of the group. */
static inline KV_HD int flash_mma_queries(int G) { return FLASH_MMA_ROWS / G; }

/* Shared memory of a block: [64] row ends, then two buffers of K and V tiles
 * [64 keys][d + 8] 16-bit; before the loop the buffers hold the fp32 queries [64][d]. */
static inline KV_HD size_t flash_mma_smem(int d)
{
    const size_t tiles = 4 * (size_t)FLASH_MMA_KEYS * (d + FLASH_MMA_PAD) * 2;
    const size_t q32 = (size_t)FLASH_MMA_ROWS * d * 4;
    return FLASH_MMA_ROWS * sizeof(int64_t) + (tiles > q32 ? tiles : q32);
}

/* Tile [kt, kt + nk) into a buffer: cp.async copies (RAW) or dequantized plain loads
 * (kvcu_flash_tile.cuh). */
template <int BF16, int RAW>
__device__ inline void flash_mma_tile(const flash_kv &kv, uint16_t *ks, uint16_t *vs, int d,
                                      int64_t kt, int nk)
{
    if (RAW) flash_tile_copy(kv, ks, vs, d, FLASH_MMA_KEYS, kt, nk);
    else flash_tile_dequant<BF16>(kv, ks, vs, d, FLASH_MMA_KEYS, kt, nk);
}

/* Block (query tile, KV head): rows r = 0..63 are query t0 + r / G, head kvh·G + r % G. */
template <int BF16, int RAW>
__global__ void flash_kernel_v5(flash_args a)
{
    KV_DYNAMIC_SMEM(unsigned char, base);
    const int G = kv_heads_group(a.H, a.src.n_kv_heads), QT = flash_mma_queries(G);
    const int t0 = blockIdx.x * QT, kvh = blockIdx.y, d = a.d, ld = d + FLASH_MMA_PAD;
    const int tid = threadIdx.x, warp = tid / KV_WARP, l = tid % KV_WARP, g = l / 4, tq = l % 4;
    int64_t *end = (int64_t *)base;                                  /* [64] */
    uint16_t *tiles = (uint16_t *)(end + FLASH_MMA_ROWS);            /* [2][K, V][64][ld] */
    float *q32 = (float *)tiles;                                     /* [64][d], first */
    const flash_kv kv = flash_views(a, kvh);
    const size_t tile = (size_t)FLASH_MMA_KEYS * ld;

    /* the rows' queries (zeros for rows past the job), rounded where int8 keys meet them
     * (kv_int_keys(), as every version does), and each row's end of visible keys */
    for (int e = tid; e < FLASH_MMA_ROWS * d; e += blockDim.x) {
        const int r = e / d, i = e % d, t = t0 + r / G;
        q32[e] = r < QT * G && t < a.T ? a.q[((size_t)t * a.H + kvh * G + r % G) * d + i] : 0.0f;
    }
    for (int r = tid; r < FLASH_MMA_ROWS; r += blockDim.x)
        end[r] = r < QT * G ? flash_end(a, t0 + r / G) : a.k_begin;
    __syncthreads();
    if (kv_int_keys(kv.kh, a.src.rope_cs)) {
        for (int r = tid; r < FLASH_MMA_ROWS; r += blockDim.x) kvq_q16_round_query(q32 + r * d, d);
        __syncthreads();
    }
    /* this warp's 16 rows as A fragments: d / 16 of them, via a 16-bit copy in tile 0's K */
    uint16_t *q16 = tiles + 2 * tile; /* buffer 1's K tile: past q32's first 64·d·2 bytes */
    for (int e = tid; e < FLASH_MMA_ROWS * d; e += blockDim.x)
        q16[(e / d) * ld + e % d] = kvcu_bits16<BF16>(q32[e]);
    __syncthreads();
    uint32_t qa[FLASH_MMA_MAX_D / 16][4];
    KV_UNROLL
    for (int kb = 0; kb < FLASH_MMA_MAX_D / 16; kb++)
        if (kb < d / 16)
            kvcu_ldmatrix_x4(qa[kb], q16 + (warp * 16 + l % 16) * ld + kb * 16 + 8 * (l / 16));
    int64_t wend = a.k_begin, bend = a.k_begin; /* the warp's and the block's last end */
    for (int r = 0; r < FLASH_MMA_ROWS; r++) {
        if (end[r] > bend) bend = end[r];
        if (r / 16 == warp && end[r] > wend) wend = end[r];
    }
    const int64_t e0 = end[warp * 16 + g], e1 = end[warp * 16 + g + 8]; /* this lane's rows */
    __syncthreads(); /* q16 and q32 are overwritten by the tiles */

    float o[FLASH_MMA_MAX_D / 8][4]; /* O: dims nd·8 + 2tq + (i & 1) of rows g, g + 8 */
    KV_UNROLL
    for (int nd = 0; nd < FLASH_MMA_MAX_D / 8; nd++)
        for (int i = 0; i < 4; i++) o[nd][i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f}; /* rows g, g + 8 */
    const float scale = a.scale;
    int buf = 0;
    if (a.k_begin < bend)
        flash_mma_tile<BF16, RAW>(kv, tiles, tiles + tile, d, a.k_begin,
                                  (int)(bend - a.k_begin < FLASH_MMA_KEYS ? bend - a.k_begin
                                                                          : FLASH_MMA_KEYS));
    if (!RAW) __syncthreads();
    for (int64_t kt = a.k_begin; kt < bend; kt += FLASH_MMA_KEYS, buf ^= 1) {
        const uint16_t *ks = tiles + 2 * tile * buf, *vs = ks + tile;
        const int64_t nx = kt + FLASH_MMA_KEYS; /* the next tile, into the other buffer */
        if (nx < bend) {
            uint16_t *kn = tiles + 2 * tile * (buf ^ 1);
            flash_mma_tile<BF16, RAW>(kv, kn, kn + tile, d, nx,
                                      (int)(bend - nx < FLASH_MMA_KEYS ? bend - nx
                                                                       : FLASH_MMA_KEYS));
        } else if (RAW) {
            kvcu_cp_commit(); /* an empty batch: the wait below counts one per tile */
        }
        if (RAW) { /* this tile's copies landed (the next tile's may still fly), for all */
            kvcu_cp_wait<1>();
            __syncthreads();
        }
        if (kt < wend) { /* (warp-uniform) some row of this warp sees a key of the tile */
            /* S = Q·Kᵀ: s[nb] is keys kt + nb·8 .., as a 16 x 8 C fragment */
            float s[FLASH_MMA_KEYS / 8][4];
            KV_UNROLL
            for (int nb = 0; nb < FLASH_MMA_KEYS / 8; nb++)
                for (int i = 0; i < 4; i++) s[nb][i] = 0.0f;
            KV_UNROLL
            for (int kb = 0; kb < FLASH_MMA_MAX_D / 16; kb++) {
                if (kb >= d / 16) break;
                KV_UNROLL
                for (int nb = 0; nb < FLASH_MMA_KEYS / 8; nb += 2) {
                    uint32_t b[4]; /* b[0..1]: keys nb·8 .., b[2..3]: keys (nb + 1)·8 .. */
                    kvcu_ldmatrix_x4(b, ks + (nb * 8 + l % 8 + 8 * (l / 16)) * ld + kb * 16 +
                                            8 * ((l / 8) % 2));
                    kvcu_mma<BF16>(s[nb], qa[kb], b);
                    kvcu_mma<BF16>(s[nb + 1], qa[kb], b + 2);
                }
            }
            /* scale, mask (past a row's end: -inf), the tile's max per row (a quad's lanes) */
            float mt[2] = {-INFINITY, -INFINITY};
            KV_UNROLL
            for (int nb = 0; nb < FLASH_MMA_KEYS / 8; nb++)
                for (int i = 0; i < 4; i++) {
                    const int64_t key = kt + nb * 8 + 2 * tq + (i & 1);
                    const float x = key < (i < 2 ? e0 : e1) ? s[nb][i] * scale : -INFINITY;
                    s[nb][i] = x;
                    mt[i / 2] = fmaxf(mt[i / 2], x);
                }
            float alpha[2];
            for (int h = 0; h < 2; h++) {
                mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 1));
                mt[h] = fmaxf(mt[h], __shfl_xor_sync(0xffffffffu, mt[h], 2));
                const float mn = fmaxf(m[h], mt[h]);
                alpha[h] = mn == -INFINITY ? 1.0f : expf(m[h] - mn); /* exp(-inf) = 0 */
                m[h] = mn;
                lsum[h] *= alpha[h]; /* this lane's part of the row's sum */
            }
            /* P = exp(S - m) (fp32 into l), packed to 16 bits as A fragments of P·V */
            uint32_t pa[FLASH_MMA_KEYS / 16][4];
            KV_UNROLL
            for (int nb = 0; nb < FLASH_MMA_KEYS / 8; nb++) {
                float p[4];
                for (int i = 0; i < 4; i++) {
                    const float mh = m[i / 2];
                    p[i] = mh == -INFINITY ? 0.0f : expf(s[nb][i] - mh);
                    lsum[i / 2] += p[i];
                }
                /* keys nb·8 + 2tq, +1 of rows g (p0, p1) and g + 8 (p2, p3): registers
                 * a0, a1 of key block nb / 2 when nb is even, a2, a3 when odd */
                pa[nb / 2][2 * (nb % 2)] = kvcu_pack2<BF16>(p[0], p[1]);
                pa[nb / 2][2 * (nb % 2) + 1] = kvcu_pack2<BF16>(p[2], p[3]);
            }
            /* O = O·alpha + P·V */
            KV_UNROLL
            for (int nd = 0; nd < FLASH_MMA_MAX_D / 8; nd++)
                for (int i = 0; i < 4; i++) o[nd][i] *= alpha[i / 2];
            KV_UNROLL
            for (int kb = 0; kb < FLASH_MMA_KEYS / 16; kb++) {
                KV_UNROLL
                for (int nd = 0; nd < FLASH_MMA_MAX_D / 8; nd += 2) {
                    if (nd >= d / 8) break;
                    uint32_t b[4]; /* .trans: b[0..1] dims nd·8 .., b[2..3] dims (nd + 1)·8 .. */
                    kvcu_ldmatrix_x4_trans(b, vs + (kb * 16 + l % 8 + 8 * ((l / 8) % 2)) * ld +
                                                  (nd + l / 16) * 8);
                    kvcu_mma<BF16>(o[nd], pa[kb], b);
                    kvcu_mma<BF16>(o[nd + 1], pa[kb], b + 2);
                }
            }
        }
        __syncthreads(); /* the next tile is in; this one may be overwritten */
    }
    /* l of each row: the sum of its quad's parts; out = O / l, zeros for a row with no key */
    for (int h = 0; h < 2; h++) {
        lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 1);
        lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 2);
    }
    for (int h = 0; h < 2; h++) {
        const int r = warp * 16 + g + 8 * h, t = t0 + r / G;
        if (r >= QT * G || t >= a.T) continue;
        float *orow = a.out + ((size_t)t * a.H + kvh * G + r % G) * d; /* [d] */
        const float inv = lsum[h] > 0.0f ? 1.0f / lsum[h] : 0.0f;
        KV_UNROLL
        for (int nd = 0; nd < FLASH_MMA_MAX_D / 8; nd++) {
            if (nd >= d / 8) break;
            orow[nd * 8 + 2 * tq] = o[nd][2 * h] * inv;
            orow[nd * 8 + 2 * tq + 1] = o[nd][2 * h + 1] * inv;
        }
    }
}

/* ---- host side ---------------------------------------------------------------------------- */

int kvcu_flash_mma_queries(int G) { return flash_mma_queries(G); }

int kvcu_flash_mma_fits(int n_heads, int n_kv_heads, int head_dim)
{
    return head_dim % 16 == 0 && head_dim <= FLASH_MMA_MAX_D && n_kv_heads > 0 &&
           n_heads % n_kv_heads == 0 && kv_heads_group(n_heads, n_kv_heads) <= FLASH_MMA_ROWS;
}

/* One instantiation of the kernel on the job's grid. */
template <int BF16, int RAW>
static cudaError_t flash_mma_run(const flash_args &a, dim3 grid, size_t smem)
{
    cudaError_t e = cudaFuncSetAttribute(flash_kernel_v5<BF16, RAW>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    KV_LAUNCH((flash_kernel_v5<BF16, RAW>), grid, KV_WARP * FLASH_MMA_WARPS, smem, 0, a);
    return cudaGetLastError();
}

cudaError_t kvcu_flash_mma_launch(const flash_args &a)
{
    const int G = kv_heads_group(a.H, a.src.n_kv_heads);
    const size_t smem = flash_mma_smem(a.d);
    dim3 grid(kv_ceil_div(a.T, flash_mma_queries(G)), a.src.n_kv_heads);
    const int raw = flash_tile_raw(a.src);
    if (a.src.fmt == KV_QF_BF16)
        return raw ? flash_mma_run<1, 1>(a, grid, smem) : flash_mma_run<1, 0>(a, grid, smem);
    return raw ? flash_mma_run<0, 1>(a, grid, smem) : flash_mma_run<0, 0>(a, grid, smem);
}
