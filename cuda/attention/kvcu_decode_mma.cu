/*
 * The engine's decode on tensor cores: version 4 of the attention family for a group large
 * enough that CUDA cores, not memory, would bound it (dec_mma_rule() below says when). The
 * rows come in as in kvcu_decode.cu (the same plan, row locator and cp.async double buffer of
 * raw K/V rows and int8 scales, dec_issue()); what changes is the arithmetic, FlashInfer's
 * arrangement of a decode group on mma.sync.m16n8k16 (cuda/core/kvcu_mma.cuh):
 *
 *  - the G query heads of the KV head are the 16 rows of an A operand (ceil(G / 16) such
 *    blocks, rows past G zero): each warp holds one block's queries, rounded to 16 bits, as A
 *    fragments for the whole range (ldmatrix .x4 once);
 *  - a tile of 64 keys is shared by the warps: with fewer than four 16-head blocks the warps
 *    of a block split the tile's keys (64, 32 or 16 each) and keep their own online softmax,
 *    combined once at the end through shared memory;
 *  - S = Q·Kᵀ: B fragments straight from the raw rows in shared memory, each key's elements
 *    converted to 16 bits exactly (fp16 and bf16 as they are; int8 codes, which fp16 holds
 *    exactly, with the row's scale applied to the fp32 score; fp8 by cvt, its head scale in
 *    the score factor); fp32 accumulators;
 *  - the online softmax in registers (a head's scores in the 4 lanes of a quad, two shuffles),
 *    then O += P·V on the tensor cores: P packed to 16 bits from the accumulators (int8: times
 *    the value row's scale first), V's B fragments gathered from the raw rows, O in registers
 *    (d / 2 floats a thread).
 * Rounded to 16 bits: the query (u = 2^-11 for fp16, 2^-8 for bf16: a score moves by at most
 * u·Σ|q||k|/√d) and the weights P (each by u, the output by u·max|v|); every key and value
 * enters exactly. tests/test_gpu_decode.c holds the kernel to kv_attention_ref() by the bound
 * derived there from those roundings. The partial states go to the family's merge, as the
 * CUDA-core kernel's do; chapter 09's selected sets get their scores as there.
 */
#include "kvcu_decode.cuh"
#include "kvcu_mma.cuh"

#define MMA_TILE 64  /* keys per stage */
#define MMA_MAX_D 128 /* O and the query fragments live in registers */
#define MMA_PAD 8     /* halves after a query row: 16-byte rows, ldmatrix rows in other banks */

/*
 * The rule, in one place. A decode step reads each K/V element once per KV head and spends
 * 2·G FLOP on it (a score and a weighted value for each of the group's G heads): 2G / b FLOP
 * per byte for b-byte elements. On CUDA cores a GPU of the H200's class does ~14-20 FLOP per
 * byte of HBM bandwidth (67 TFLOP/s fp32 over 4.8 TB/s; less once the conversions count), so
 * the fp32 kernel stays memory-bound while 2G / b < ~14: to G ~ 7 with 2-byte elements but
 * only G ~ 3-4 with 1-byte ones (int8, fp8), where the conversions take their share first.
 * mma.sync moves the ridge an order of magnitude up. So tensor cores from G >= 4 for per-token
 * int8 and fp8, and for MQA (one KV head, G = H, usually 8-64) with fp16 and bf16 as well; the
 * CUDA-core kernel below that, where its fp32 arithmetic costs nothing and its bound is
 * tighter, and for fp32 and the staged formats. Shapes: d a multiple of 16 up to 128, G <= 64
 * (four warps of 16 heads). Only on sm_80 and newer (kvcu_has_mma()): a Turing GPU reads every
 * group on its CUDA cores.
 */
static constexpr bool mma_one_byte(int f)
{
    return f == KV_QF_INT8 || f == KV_QF_FP8_E4M3 || f == KV_QF_FP8_E5M2;
}
/* The formats with a tensor-core instance. */
template <int F>
constexpr bool mma_fmt = mma_one_byte(F) || F == KV_QF_F16 || F == KV_QF_BF16;

static int dec_mma_rule(int fmt, int G, int n_kv_heads, int d)
{
    if (d % 16 || d > MMA_MAX_D || G > 64 || G < 4) return 0;
    return mma_one_byte(fmt) || (n_kv_heads == 1 && (fmt == KV_QF_F16 || fmt == KV_QF_BF16));
}

/* Elements j, j + 1 (j even) of a raw stage row as two 16-bit values of the kernel's type,
 * exactly: the B fragment's register of a K row. */
template <int F>
__device__ __forceinline__ uint32_t mma_pair(const uint8_t *row, int j)
{
    if (F == KV_QF_F16 || F == KV_QF_BF16) return *(const uint32_t *)(const void *)(row + 2 * j);
    if (F == KV_QF_INT8)
        return kvcu_pack_f16((float)(int8_t)row[j], (float)(int8_t)row[j + 1]);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(*(const uint16_t *)(const void *)(row + j)),
        F == KV_QF_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
}

/* Element j of a raw stage row as one 16-bit value: half of a V fragment's register. */
template <int F>
__device__ __forceinline__ uint32_t mma_elem(const uint8_t *row, int j)
{
    if (F == KV_QF_F16 || F == KV_QF_BF16) return *(const uint16_t *)(const void *)(row + 2 * j);
    if (F == KV_QF_INT8) return kvcu_bits16<0>((float)(int8_t)row[j]);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)row[j], F == KV_QF_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return (uint32_t)h.x;
}

static __host__ __device__ size_t mma_align16(size_t n) { return (n + 15) / 16 * 16; }

/* The plan's tensor-core part for its G and d: head blocks, warps per block over a tile's keys,
 * the tile, the shared-memory map. */
static __host__ __device__ void mma_shape(dec_plan_t *p)
{
    const int d = p->d;
    p->mb = (p->G + 15) / 16;
    p->ks = p->mb >= 4 ? 1 : p->mb == 1 ? 4 : 2; /* warps over heads x warps over a tile's keys */
    p->tile = MMA_TILE;
    p->off_buf = mma_align16((size_t)p->mb * 16 * (d + MMA_PAD) * 2);
    p->stage = mma_align16((size_t)2 * MMA_TILE * p->rb + (size_t)2 * MMA_TILE * p->ng * 4);
    const size_t cb = (size_t)4 * 16 * (d + 2) * 4;
    p->smem = p->off_buf + (2 * p->stage > cb ? 2 * p->stage : cb);
}

/* The count's shape (dec_count_shape(), tools/ptx-table.sh): the plan above at d DEC_COUNT_D,
 * G DEC_COUNT_G. Nothing in a build. */
template <int F>
__device__ __forceinline__ void mma_count_shape(dec_plan_t &p)
{
#ifdef DEC_COUNT_D
    dec_count_shape<F>(p);
    mma_shape(&p);
#else
    (void)p;
#endif
}

/*
 * Block (kvh, part, t), four warps: launch row t's G heads of KV head kvh over range `part`.
 * Warp w takes head block w / ks (16 heads) and keys [w % ks · 64/ks, +64/ks) of each tile.
 * Shared memory: qh [mb·16][d + 8] the 16-bit queries; the two stages; after the loop each
 * warp's (o [16][d], m [16], l [16]) in cb [4][16][d + 2] for the combine.
 */
template <int F>
__global__ void __launch_bounds__(DEC_THREADS)
attn_mma_kernel(const float *q, attn_src src, attn_rows rows, attn_parts pp, dec_plan_t plan,
                int n_heads)
{
    dec_plan_t p = plan;
    mma_count_shape<F>(p);
    constexpr int BF = F == KV_QF_BF16;
    constexpr bool INT8 = F == KV_QF_INT8, FP8 = F == KV_QF_FP8_E4M3 || F == KV_QF_FP8_E5M2;
    KV_DYNAMIC_SMEM(uint4, smem4);
    uint8_t *sm = (uint8_t *)smem4;
    const int tid = DEC_TID, G = p.G, d = p.d, ld = d + MMA_PAD;
    const int KS = p.ks, NK = MMA_TILE / p.ks;
    uint16_t *qh = (uint16_t *)(void *)sm;
    uint8_t *buf = sm + p.off_buf;
    dec_block blk;
    kv_head_view kh, vh;
    if (!dec_open<F>(blk, kh, vh, q, src, rows, p, MMA_TILE, n_heads, buf)) return;
    const float *qg = blk.qg;
    for (int i = tid; i < p.mb * 16 * ld; i += DEC_THREADS) {
        const int row = i / ld, j = i - row * ld;
        qh[i] = kvcu_bits16<BF>(row < G && j < d ? qg[(size_t)row * d + j] : 0.0f);
    }
    __syncthreads();
    const int warp = tid / KV_WARP, lane = DEC_LANE(tid), gq = lane / 4, tq = lane % 4;
    const int mb = warp / KS, k0 = (warp % KS) * NK; /* head block, first key of the tile */
    const bool active = mb < p.mb;
    uint32_t qa[MMA_MAX_D / 16][4];
    float o[MMA_MAX_D / 8][4];
    KV_UNROLL
    for (int kb = 0; kb < MMA_MAX_D / 16; kb++)
        if (kb < d / 16)
            kvcu_ldmatrix_x4(qa[kb], qh + (size_t)((active ? mb : 0) * 16 + lane % 16) * ld +
                                         kb * 16 + (lane / 16) * 8);
    KV_UNROLL
    for (int nd = 0; nd < MMA_MAX_D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows gq, gq + 8 */
    const float factor = (FP8 ? kh.scale : 1.0f) / sqrtf((float)d);

    for (int it = 0; it < blk.ntiles; it++) {
        const dec_tile tl = dec_turn<F>(blk, kh, vh, p, src, it, MMA_TILE, buf);
        if (active && k0 < tl.n) {
            /* S = Q·Kᵀ over this warp's keys: s[nb] holds keys k0 + 8nb + 2tq, +1 of heads
             * gq (s[nb][0..1]) and gq + 8 (s[nb][2..3]); keys past n read as zeros */
            float s[MMA_TILE / 8][4];
            KV_UNROLL
            for (int nb = 0; nb < MMA_TILE / 8; nb++) {
                s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
                if (nb >= NK / 8) continue;
                const int key = k0 + nb * 8 + gq;
                const uint8_t *kr = tl.k + (size_t)key * p.rb;
                KV_UNROLL
                for (int kb = 0; kb < MMA_MAX_D / 16; kb++) {
                    if (kb >= d / 16) continue;
                    const uint32_t b[2] = {key < tl.n ? mma_pair<F>(kr, kb * 16 + 2 * tq) : 0u,
                                           key < tl.n ? mma_pair<F>(kr, kb * 16 + 2 * tq + 8) : 0u};
                    kvcu_mma<BF>(s[nb], qa[kb], b);
                }
            }
            /* scale (int8: the row's scale, then the factor), mask, the tile's max per head */
            float mx[2] = {-INFINITY, -INFINITY};
            KV_UNROLL
            for (int nb = 0; nb < MMA_TILE / 8; nb++)
                for (int e = 0; e < 4 && nb < NK / 8; e++) {
                    const int key = k0 + nb * 8 + 2 * tq + (e & 1), h = gq + (e >> 1) * 8;
                    float x = -INFINITY;
                    if (key < tl.n) {
                        x = (INT8 ? s[nb][e] * tl.ks[key] : s[nb][e]) * factor;
                        const int hg = mb * 16 + h;
                        if (blk.satt && hg < G)
                            blk.satt[(size_t)hg * rows.sel_stride + tl.i0 + key] = x;
                    }
                    s[nb][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            float pv[MMA_TILE / 8][4]; /* the weights P·V multiplies (int8: times the scale) */
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float mn = fmaxf(m[h], mx[h]);
                const float a = mn == -INFINITY ? 1.0f : expf(m[h] - mn);
                float sum = 0.0f;
                KV_UNROLL
                for (int nb = 0; nb < MMA_TILE / 8; nb++)
                    for (int e = 2 * h; e < 2 * h + 2 && nb < NK / 8; e++) {
                        const int key = k0 + nb * 8 + 2 * tq + (e & 1);
                        const float pe = mn == -INFINITY ? 0.0f : expf(s[nb][e] - mn);
                        sum += pe;
                        pv[nb][e] = INT8 && key < tl.n ? pe * tl.vs[key] : pe;
                    }
                l[h] = fmaf(l[h], a, sum);
                m[h] = mn;
                KV_UNROLL
                for (int nd = 0; nd < MMA_MAX_D / 8; nd++) {
                    o[nd][2 * h] *= a;
                    o[nd][2 * h + 1] *= a;
                }
            }
            /* O += P·V: keys 16kb .. 16kb + 15 of the warp's are one A fragment (two S blocks) */
            KV_UNROLL
            for (int kb = 0; kb < MMA_TILE / 16; kb++) {
                if (kb >= NK / 16) continue;
                const uint32_t a[4] = {kvcu_pack2<BF>(pv[2 * kb][0], pv[2 * kb][1]),
                                       kvcu_pack2<BF>(pv[2 * kb][2], pv[2 * kb][3]),
                                       kvcu_pack2<BF>(pv[2 * kb + 1][0], pv[2 * kb + 1][1]),
                                       kvcu_pack2<BF>(pv[2 * kb + 1][2], pv[2 * kb + 1][3])};
                const int ka = k0 + kb * 16 + 2 * tq; /* keys ka, ka + 1, ka + 8, ka + 9 */
                const uint8_t *v0 = tl.v + (size_t)ka * p.rb, *v1 = v0 + p.rb;
                const uint8_t *v8 = v0 + 8 * p.rb, *v9 = v0 + 9 * p.rb;
                KV_UNROLL
                for (int nd = 0; nd < MMA_MAX_D / 8; nd++) {
                    if (nd >= d / 8) continue;
                    const int j = nd * 8 + gq;
                    const uint32_t b[2] = {
                        (ka < tl.n ? mma_elem<F>(v0, j) : 0u) |
                            (ka + 1 < tl.n ? mma_elem<F>(v1, j) : 0u) << 16,
                        (ka + 8 < tl.n ? mma_elem<F>(v8, j) : 0u) |
                            (ka + 9 < tl.n ? mma_elem<F>(v9, j) : 0u) << 16};
                    kvcu_mma<BF>(o[nd], a, b);
                }
            }
        }
        __syncthreads(); /* the stage is rewritten next */
    }

    /* each warp's state to shared memory (over the stages), then per head the ks warps of its
     * block combined in warp order: M = max m, L = sum l e^(m - M), O = sum o e^(m - M) */
    float *cb = (float *)(void *)buf; /* [4][16][d + 2] */
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        float *row = cb + ((size_t)warp * 16 + gq + 8 * h) * (d + 2);
        KV_UNROLL
        for (int nd = 0; nd < MMA_MAX_D / 8; nd++) {
            if (!active || nd >= d / 8) continue;
            row[nd * 8 + 2 * tq] = o[nd][2 * h];
            row[nd * 8 + 2 * tq + 1] = o[nd][2 * h + 1];
        }
        if (active && tq == 0) {
            row[d] = m[h];
            row[d + 1] = l[h];
        }
    }
    __syncthreads();
    const size_t ph = dec_part_index(p, pp, n_heads);
    const float vs = FP8 ? vh.scale : 1.0f;
    for (int i = tid; i < G * (d + 1); i += DEC_THREADS) {
        const int g = i / (d + 1), j = i - g * (d + 1); /* j == d: the head's m and l */
        const int w0 = (g / 16) * KS, row = g % 16;
        float M = -INFINITY;
        for (int w = w0; w < w0 + KS; w++) M = fmaxf(M, cb[((size_t)w * 16 + row) * (d + 2) + d]);
        float acc = 0.0f;
        for (int w = w0; w < w0 + KS; w++) {
            const float *x = cb + ((size_t)w * 16 + row) * (d + 2);
            const float e = x[d] == -INFINITY ? 0.0f : expf(x[d] - M);
            acc += (j < d ? x[j] : x[d + 1]) * e;
        }
        if (j < d) pp.po[(ph + (size_t)g * pp.n_parts) * d + j] = FP8 ? acc * vs : acc;
        else {
            pp.pm[ph + (size_t)g * pp.n_parts] = M;
            pp.pl[ph + (size_t)g * pp.n_parts] = acc;
        }
    }
}

/* ---- host side ----------------------------------------------------------------------------- */


int kvcu_decode_mma_plan(const attn_src &src, dec_plan_t *p, const void **kernel)
{
    if (p->fmt != src.fmt || !dec_mma_rule(p->fmt, p->G, src.n_kv_heads, p->d)) return 0;
    if (!kvcu_has_mma()) return 0; /* below sm_80: the CUDA-core kernel reads every group */
    mma_shape(p);
    if (p->smem > kvcu_smem_optin()) return 0;
    dec_dispatch(p->fmt, [&](auto c) {
        if constexpr (mma_fmt<decltype(c)::value>)
            *kernel = (const void *)attn_mma_kernel<decltype(c)::value>;
    });
    return 1;
}

void kvcu_decode_mma_launch(dim3 grid, const dec_plan_t &p, const float *q,
                            const attn_src &src, const attn_rows &rows,
                            const attn_parts &parts, int n_heads)
{
    dec_dispatch(p.fmt, [&](auto c) {
        if constexpr (mma_fmt<decltype(c)::value>)
            KV_LAUNCH(attn_mma_kernel<decltype(c)::value>, grid, DEC_THREADS, p.smem, 0, q, src,
                      rows, parts, p, n_heads);
    });
}
