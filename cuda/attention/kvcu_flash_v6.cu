/*
 * Chapter 08, v6: v5 (kvcu_flash_mma.cu, kept as it was) with three changes, each for a cost
 * v5's counts show (kvcu_flash_attention(6, ...)). Not yet run on a GPU: what each is
 * predicted to do is chapter 08's to say, the emulation build holds the result to the same
 * reference and bound as v5 (tests/test_gpu_flash.c).
 *
 *  1. 32 rows per warp. A warp holds two m16 tiles of rows (a block: 4 warps, 128 rows, i.e.
 *     128 / G queries times the G heads of a KV group) and multiplies both by every K and V
 *     fragment it reads: one ldmatrix .x4 of K (or of V, .trans) feeds four mma.sync instead
 *     of two, so the shared-memory reads per product halve. The price is registers: O is
 *     2 x 16 x d fp32 per warp, d / 2 floats a thread. So Q's fragments no longer sit in
 *     registers: they are reread each tile from a 16-bit copy of Q in shared memory (one
 *     ldmatrix per m16 tile and 16 dims, shared by KT / 8 products), and the kernel is
 *     compiled per head-dim class D (64 or 128) with KT = 64 keys a tile for D = 64 and 32
 *     for D = 128, so that O, S and P fit __launch_bounds__(128, 2) without spills.
 *  2. Longest blocks first. Under a causal mask the block of query tile i reads i + 1 times
 *     the keys of tile 0, and the hardware hands out blocks in index order: v5's last wave
 *     is its longest blocks, so SMs sit idle while a few finish. The grid is one-dimensional
 *     here and block b takes query tile n_tiles - 1 - b / H_kv of KV head b % H_kv: the
 *     longest blocks start first and the short ones fill the gaps at the end (the
 *     longest-processing-time-first rule of list scheduling).
 *  3. Converting tiles for int8 and fp8 caches. v5 dequantizes such layers element by element
 *     (kv_ld(): a format switch, a scale load and a multiply per element, one byte per load).
 *     Here a per-token int8 or fp8 layer's rows are read 16 codes per 16-byte load and
 *     converted once into the same padded fp16 rows v5's fp16 tiles have: int8 by the
 *     magic-number trick (kvcu_i8x4_f16(): 0x6400 | (b ^ 0x80), minus 1152, exact), fp8 E4M3
 *     by cvt.rn.f16x2.e4m3x2 on sm_89+ (kvcu_e4m3x2_f16()), E5M2 by a byte move (an E5M2 code
 *     is the top byte of the same fp16; kvcu_e5m2x4_f16()), all exact. The codes enter the
 *     tensor cores exactly and the scales stay in fp32: an int8 key's row scale multiplies its
 *     score column, an int8 value's row scale goes into P (times 128, a power of two taken out
 *     again at the end, so that P·s stays clear of fp16's subnormals), fp8's head scales
 *     multiply the score factor and the output. The rest is v5's fp16 path, ldmatrix and all.
 *
 * What is rounded: q (to 16 bits; per-token int8 keys meet it through the 16-bit integer
 * rounding every version applies, kv_int_keys()), P (times an int8 value scale), and, in the
 * dequantizing and raw paths, the K and V tiles as in v5; scores, sums and O stay fp32.
 */
#include "kvcu_flash_tile.cuh"

#define FV6_WARPS 4
#define FV6_MT 2                                /* m16 tiles of rows per warp */
#define FV6_ROWS (16 * FV6_MT * FV6_WARPS)      /* rows (query, head) per block: 128 */
#define FV6_MAX_KT 64                           /* keys per tile, at most */
#define FV6_RAW 4 /* MODE: the tiles by cp.async; 0 dequantized, FLASH_CONV_* converted */

static inline KV_HD int fv6_queries(int G) { return FV6_ROWS / G; }
/* Keys per tile of head-dim class D (and of a head dim d of that class). */
static inline KV_HD constexpr int fv6_keys(int d) { return d <= 64 ? 64 : 32; }

/* Shared memory: [128] row ends, [2 buffers][K, V][64] int8 row scales, Q in 16 bits
 * [128][d + 8], then two buffers of K and V tiles [KT][d + 8]. */
static inline size_t fv6_smem(int d)
{
    const size_t ld = (size_t)d + FLASH_TILE_PAD;
    return FV6_ROWS * sizeof(int64_t) + 4 * FV6_MAX_KT * sizeof(float) + FV6_ROWS * ld * 2 +
           4 * (size_t)fv6_keys(d) * ld * 2;
}

/* Tile [kt, kt + nk) into a buffer, the way MODE says. */
template <int BF16, int MODE>
__device__ inline void fv6_tile(const flash_kv &kv, uint16_t *ks, uint16_t *vs, float *sc, int d,
                                int KT, int64_t kt, int64_t bend)
{
    const int nk = (int)(bend - kt < KT ? bend - kt : KT);
    if (MODE == FV6_RAW) flash_tile_copy(kv, ks, vs, d, KT, kt, nk);
    else if (MODE == 0) flash_tile_dequant<BF16>(kv, ks, vs, d, KT, kt, nk);
    else flash_tile_convert<MODE>(kv, ks, vs, sc, sc + FV6_MAX_KT, d, KT, kt, nk);
}

/* Rows r = 0..127 of a block: query t0 + r / G, head kvh·G + r % G; warp w owns rows
 * 32w .. 32w + 31, its m16 tile mt rows 32w + 16mt ... */
template <int D, int BF16, int MODE>
__global__ void __launch_bounds__(KV_WARP *FV6_WARPS, 2) flash_kernel_v6(flash_args a)
{
    constexpr int KT = fv6_keys(D);
    KV_DYNAMIC_SMEM(unsigned char, base);
    const int Hkv = a.src.n_kv_heads, G = kv_heads_group(a.H, Hkv), QT = fv6_queries(G);
    const int n_tiles = (int)(gridDim.x / Hkv), kvh = (int)(blockIdx.x % Hkv);
    const int t0 = (n_tiles - 1 - (int)(blockIdx.x / Hkv)) * QT; /* the longest tiles first */
    const int d = a.d, ld = d + FLASH_TILE_PAD;
    const int tid = threadIdx.x, warp = tid / KV_WARP, l = tid % KV_WARP, g = l / 4, tq = l % 4;
    int64_t *end = (int64_t *)base;                      /* [128] */
    float *scales = (float *)(end + FV6_ROWS);           /* [2][K, V][64] */
    uint16_t *q16 = (uint16_t *)(scales + 4 * FV6_MAX_KT); /* [128][ld] */
    uint16_t *tiles = q16 + FV6_ROWS * ld;               /* [2][K, V][KT][ld] */
    const flash_kv kv = flash_views(a, kvh);
    const size_t tile = (size_t)KT * ld;

    /* each row's query in 16 bits, a warp per row (coalesced), rounded first where int8 keys
     * meet it (kv_int_keys(): the 16-bit integer grid of kvq_q16_query_step(), its max by
     * shuffles), and each row's end of visible keys */
    const int int_keys = kv_int_keys(kv.kh, a.src.rope_cs);
    for (int r = warp; r < FV6_ROWS; r += FV6_WARPS) {
        const int t = t0 + r / G;
        const bool live = r < QT * G && t < a.T; /* (warp-uniform) */
        const float *qr = a.q + (live ? ((size_t)t * a.H + kvh * G + r % G) * d : 0);
        float x[D / KV_WARP], amax = 0.0f;
        int bad = 0;
        KV_UNROLL
        for (int k = 0; k < D / KV_WARP; k++) {
            const int i = l + KV_WARP * k;
            x[k] = live && i < d ? qr[i] : 0.0f;
            bad |= !(fabsf(x[k]) <= 3.40282347e38f);
            amax = fmaxf(amax, fabsf(x[k]));
        }
        if (int_keys) {
            for (int off = KV_WARP / 2; off > 0; off >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const float step = __any_sync(0xffffffffu, bad) ? kvq_bits_f32(KVQ_F32_NAN)
                                                            : kvq_q16_step(amax, d);
            KV_UNROLL
            for (int k = 0; k < D / KV_WARP; k++)
                x[k] = (float)kvq_q16_encode(x[k], step, d) * step;
        }
        KV_UNROLL
        for (int k = 0; k < D / KV_WARP; k++)
            if (l + KV_WARP * k < d) q16[r * ld + l + KV_WARP * k] = kvcu_bits16<BF16>(x[k]);
        if (l == 0) end[r] = live ? flash_end(a, t) : a.k_begin;
    }
    __syncthreads();
    /* this lane's row of Q's A fragments, + mt·16·ld for tile mt, + kb·16 for dims kb·16 .. */
    const uint16_t *qrow = q16 + (warp * 32 + l % 16) * ld + 8 * (l / 16);
    int64_t wend = a.k_begin, bend = a.k_begin, e[FV6_MT][2]; /* this lane's rows' ends */
    for (int r = 0; r < FV6_ROWS; r++) {
        if (end[r] > bend) bend = end[r];
        if (r / 32 == warp && end[r] > wend) wend = end[r];
    }
    KV_UNROLL
    for (int mt = 0; mt < FV6_MT; mt++)
        KV_UNROLL
        for (int h = 0; h < 2; h++) e[mt][h] = end[warp * 32 + mt * 16 + g + 8 * h];

    float o[FV6_MT][D / 8][4]; /* O: dims nd·8 + 2tq + (i & 1) of rows g, g + 8 of tile mt */
    KV_UNROLL
    for (int mt = 0; mt < FV6_MT; mt++)
        KV_UNROLL
        for (int nd = 0; nd < D / 8; nd++)
            for (int i = 0; i < 4; i++) o[mt][nd][i] = 0.0f;
    float m[FV6_MT][2], lsum[FV6_MT][2];
    KV_UNROLL
    for (int mt = 0; mt < FV6_MT; mt++)
        KV_UNROLL
        for (int h = 0; h < 2; h++) m[mt][h] = -INFINITY, lsum[mt][h] = 0.0f;
    const int fp8 = MODE == FLASH_CONV_E4M3 || MODE == FLASH_CONV_E5M2;
    const float sk = fp8 ? a.scale * kv.kh.scale : a.scale; /* the score factor */
    const float vo = MODE == FLASH_CONV_I8 ? 1.0f / 128.0f : fp8 ? kv.vh.scale : 1.0f;
    int buf = 0;
    if (a.k_begin < bend)
        fv6_tile<BF16, MODE>(kv, tiles, tiles + tile, scales, d, KT, a.k_begin, bend);
    if (MODE != FV6_RAW) __syncthreads();
    for (int64_t kt = a.k_begin; kt < bend; kt += KT, buf ^= 1) {
        const uint16_t *ks = tiles + 2 * tile * buf, *vs = ks + tile;
        const float *ksc = scales + 2 * FV6_MAX_KT * buf, *vsc = ksc + FV6_MAX_KT;
        if (kt + KT < bend) { /* the next tile, into the other buffer */
            uint16_t *kn = tiles + 2 * tile * (buf ^ 1);
            fv6_tile<BF16, MODE>(kv, kn, kn + tile, scales + 2 * FV6_MAX_KT * (buf ^ 1), d, KT,
                                 kt + KT, bend);
        } else if (MODE == FV6_RAW) {
            kvcu_cp_commit(); /* an empty batch: the wait below counts one per tile */
        }
        if (MODE == FV6_RAW) {
            kvcu_cp_wait<1>();
            __syncthreads();
        }
        if (kt < wend) { /* (warp-uniform) some row of this warp sees a key of the tile */
            /* S = Q·Kᵀ: s[mt][nb] keys kt + nb·8 .. of tile mt; each K fragment feeds both */
            float s[FV6_MT][KT / 8][4];
            KV_UNROLL
            for (int mt = 0; mt < FV6_MT; mt++)
                KV_UNROLL
                for (int nb = 0; nb < KT / 8; nb++)
                    for (int i = 0; i < 4; i++) s[mt][nb][i] = 0.0f;
            KV_UNROLL
            for (int kb = 0; kb < D / 16; kb++) {
                if (kb >= d / 16) break;
                uint32_t qf[FV6_MT][4];
                KV_UNROLL
                for (int mt = 0; mt < FV6_MT; mt++)
                    kvcu_ldmatrix_x4(qf[mt], qrow + mt * 16 * ld + kb * 16);
                KV_UNROLL
                for (int nb = 0; nb < KT / 8; nb += 2) {
                    uint32_t b[4]; /* b[0..1]: keys nb·8 .., b[2..3]: keys (nb + 1)·8 .. */
                    kvcu_ldmatrix_x4(b, ks + (nb * 8 + l % 8 + 8 * (l / 16)) * ld + kb * 16 +
                                            8 * ((l / 8) % 2));
                    KV_UNROLL
                    for (int mt = 0; mt < FV6_MT; mt++) {
                        kvcu_mma<BF16>(s[mt][nb], qf[mt], b);
                        kvcu_mma<BF16>(s[mt][nb + 1], qf[mt], b + 2);
                    }
                }
            }
            /* per m16 tile: scale (an int8 key's row scale too), mask, online softmax, and
             * P packed to 16 bits as A fragments (times an int8 value's row scale · 128) */
            uint32_t pa[FV6_MT][KT / 16][4];
            KV_UNROLL
            for (int mt = 0; mt < FV6_MT; mt++) {
                float mx[2] = {-INFINITY, -INFINITY};
                KV_UNROLL
                for (int nb = 0; nb < KT / 8; nb++)
                    for (int i = 0; i < 4; i++) {
                        const int j = nb * 8 + 2 * tq + (i & 1);
                        const float f = MODE == FLASH_CONV_I8 ? sk * ksc[j] : sk;
                        const float x = kt + j < e[mt][i / 2] ? s[mt][nb][i] * f : -INFINITY;
                        s[mt][nb][i] = x;
                        mx[i / 2] = fmaxf(mx[i / 2], x);
                    }
                float alpha[2];
                for (int h = 0; h < 2; h++) {
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                    const float mn = fmaxf(m[mt][h], mx[h]);
                    alpha[h] = mn == -INFINITY ? 1.0f : expf(m[mt][h] - mn);
                    m[mt][h] = mn;
                    lsum[mt][h] *= alpha[h];
                }
                KV_UNROLL
                for (int nb = 0; nb < KT / 8; nb++) {
                    float p[4];
                    for (int i = 0; i < 4; i++) {
                        const float mh = m[mt][i / 2];
                        p[i] = mh == -INFINITY ? 0.0f : expf(s[mt][nb][i] - mh);
                        lsum[mt][i / 2] += p[i];
                        if (MODE == FLASH_CONV_I8) p[i] *= 128.0f * vsc[nb * 8 + 2 * tq + (i & 1)];
                    }
                    pa[mt][nb / 2][2 * (nb % 2)] = kvcu_pack2<BF16>(p[0], p[1]);
                    pa[mt][nb / 2][2 * (nb % 2) + 1] = kvcu_pack2<BF16>(p[2], p[3]);
                }
                KV_UNROLL
                for (int nd = 0; nd < D / 8; nd++)
                    for (int i = 0; i < 4; i++) o[mt][nd][i] *= alpha[i / 2];
            }
            /* O += P·V: each V fragment feeds both m16 tiles */
            KV_UNROLL
            for (int kb = 0; kb < KT / 16; kb++) {
                KV_UNROLL
                for (int nd = 0; nd < D / 8; nd += 2) {
                    if (nd >= d / 8) break;
                    uint32_t b[4]; /* .trans: b[0..1] dims nd·8 .., b[2..3] dims (nd + 1)·8 .. */
                    kvcu_ldmatrix_x4_trans(b, vs + (kb * 16 + l % 8 + 8 * ((l / 8) % 2)) * ld +
                                                  (nd + l / 16) * 8);
                    KV_UNROLL
                    for (int mt = 0; mt < FV6_MT; mt++) {
                        kvcu_mma<BF16>(o[mt][nd], pa[mt][kb], b);
                        kvcu_mma<BF16>(o[mt][nd + 1], pa[mt][kb], b + 2);
                    }
                }
            }
        }
        __syncthreads(); /* the next tile is in; this one may be overwritten */
    }
    /* l of each row: its quad's parts; out = O · vo / l, zeros for a row with no key */
    KV_UNROLL
    for (int mt = 0; mt < FV6_MT; mt++)
        KV_UNROLL
        for (int h = 0; h < 2; h++) {
            float sum = lsum[mt][h];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int r = warp * 32 + mt * 16 + g + 8 * h, t = t0 + r / G;
            if (r < QT * G && t < a.T) {
                float *orow = a.out + ((size_t)t * a.H + kvh * G + r % G) * d; /* [d] */
                const float inv = sum > 0.0f ? vo / sum : 0.0f;
                KV_UNROLL
                for (int nd = 0; nd < D / 8; nd++)
                    if (nd < d / 8) {
                        orow[nd * 8 + 2 * tq] = o[mt][nd][2 * h] * inv;
                        orow[nd * 8 + 2 * tq + 1] = o[mt][nd][2 * h + 1] * inv;
                    }
            }
        }
}

/* ---- host side ---------------------------------------------------------------------------- */

int kvcu_flash_v6_queries(int G) { return fv6_queries(G); }
int kvcu_flash_v6_keys(int head_dim) { return fv6_keys(head_dim); }

int kvcu_flash_v6_fits(int n_heads, int n_kv_heads, int head_dim)
{
    return kvcu_flash_mma_fits(n_heads, n_kv_heads, head_dim) &&
           fv6_smem(head_dim) <= kvcu_smem_optin();
}

int kvcu_flash_prefill_version(int want, int n_heads, int n_kv_heads, int head_dim)
{
    if (want == 6 && kvcu_flash_v6_fits(n_heads, n_kv_heads, head_dim)) return 6;
    if (want >= 5 && kvcu_flash_mma_fits(n_heads, n_kv_heads, head_dim)) return 5;
    return 0;
}

template <int D, int BF16, int MODE>
static cudaError_t fv6_run(const flash_args &a, unsigned blocks, size_t smem)
{
    cudaError_t e = cudaFuncSetAttribute(flash_kernel_v6<D, BF16, MODE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    KV_LAUNCH((flash_kernel_v6<D, BF16, MODE>), blocks, KV_WARP * FV6_WARPS, smem, 0, a);
    return cudaGetLastError();
}

/* The instance of a layer: bf16 tiles for a bf16 cache; raw copies where the rows already are
 * the tile's type; converting tiles for per-token int8 and fp8; dequantized ones else. */
template <int D>
static cudaError_t fv6_pick(const flash_args &a, unsigned blocks, size_t smem)
{
    const int raw = flash_tile_raw(a.src);
    if (a.src.fmt == KV_QF_BF16)
        return raw ? fv6_run<D, 1, FV6_RAW>(a, blocks, smem) : fv6_run<D, 1, 0>(a, blocks, smem);
    if (raw) return fv6_run<D, 0, FV6_RAW>(a, blocks, smem);
    switch (flash_tile_conv_kind(a.src, a.d)) {
    case FLASH_CONV_I8: return fv6_run<D, 0, FLASH_CONV_I8>(a, blocks, smem);
    case FLASH_CONV_E4M3: return fv6_run<D, 0, FLASH_CONV_E4M3>(a, blocks, smem);
    case FLASH_CONV_E5M2: return fv6_run<D, 0, FLASH_CONV_E5M2>(a, blocks, smem);
    default: return fv6_run<D, 0, 0>(a, blocks, smem);
    }
}

cudaError_t kvcu_flash_v6_launch(const flash_args &a)
{
    const int G = kv_heads_group(a.H, a.src.n_kv_heads);
    const int64_t blocks = kv_ceil_div(a.T, fv6_queries(G)) * (int64_t)a.src.n_kv_heads;
    if (blocks >= ((int64_t)1 << 31)) return cudaErrorInvalidConfiguration;
    const size_t smem = fv6_smem(a.d);
    return a.d <= 64 ? fv6_pick<64>(a, (unsigned)blocks, smem)
                     : fv6_pick<128>(a, (unsigned)blocks, smem);
}
