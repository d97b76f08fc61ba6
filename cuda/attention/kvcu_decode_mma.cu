/*
 * The engine's decode on tensor cores: version 4 of the attention family for a group large
 * enough that CUDA cores, not memory, would bound it (dec_mma_rule() below says when). The
 * rows come in as in kvcu_decode.cu (the same plan, row locator and cp.async copies of raw
 * K/V rows and int8 scales, dec_issue()), here three stages deep (two tiles in flight while
 * one is read; two stages where three do not fit); what changes is the
 * arithmetic, FlashInfer's arrangement of a decode group on mma.sync.m16n8k16
 * (cuda/core/kvcu_mma.cuh):
 *
 *  - the G query heads of the KV head are the 16 rows of an A operand (ceil(G / 16) such
 *    blocks, rows past G zero): the block's queries, rounded to 16 bits, stay in shared
 *    memory, and a warp loads its A fragments by ldmatrix .x4 where S needs them;
 *  - a tile of 64 keys is shared by the warps: with fewer than four 16-head blocks the warps
 *    of a block split the tile's keys (64, 32 or 16 each) and keep their own online softmax,
 *    combined once at the end through shared memory;
 *  - every operand by ldmatrix from 16-bit rows padded by 8 halves (rows 2(d + 8) bytes apart:
 *    the 8 rows of a matrix fall in 8 distinct groups of 4 banks): fp16 and bf16 rows are
 *    copied into padded stage rows as they are; one-byte rows are converted once per tile, by
 *    all threads, into such rows (mma_convert(): int8 codes by the magic number, which fp16
 *    holds exactly, the row's scale applied to the fp32 score; fp8 E4M3 by cvt, E5M2 by
 *    placing each code under a zero byte, its head scale in the score factor);
 *  - S = Q·Kᵀ: the K rows read plainly are B (ldmatrix .x4: two 16-column blocks); fp32
 *    accumulators;
 *  - the online softmax in registers (a head's scores in the 4 lanes of a quad, two shuffles),
 *    then O += P·V on the tensor cores: P packed to 16 bits from the accumulators (int8: times
 *    the value row's scale first), the V rows read with .trans are B, O in registers (d / 2
 *    floats a thread).
 * Rounded to 16 bits: the query (u = 2^-11 for fp16, 2^-8 for bf16: a score moves by at most
 * u·Σ|q||k|/√d) and the weights P (each by u, the output by u·max|v|); every key and value
 * enters exactly. tests/test_gpu_decode.c holds the kernel to kv_attention_ref() by the bound
 * derived there from those roundings. The partial states go to the family's merge, as the
 * CUDA-core kernel's do; chapter 09's selected sets get their scores as there.
 */
#include "kvcu_decode.cuh"
#include "kvcu_mma.cuh"

#define MMA_TILE 64  /* keys per stage */
#define MMA_MAX_D 128 /* O lives in registers */
#define MMA_PAD 8     /* halves after each 16-bit row (queries, K, V): ldmatrix rows in other banks */
#define MMA_STAGES 3  /* raw tiles in shared memory: two in flight while one is read (2 where
                       * 3 do not fit: d 128 in 16 bits on a GPU of 99 KiB a block) */
#define MMA_MIN_BLOCKS 3 /* blocks per SM asked of ptxas: at most 168 registers a thread */

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

/* The formats whose rows are already 16-bit operands (copied into padded stage rows). */
static __host__ __device__ constexpr bool mma_wide(int f) { return f == KV_QF_F16 || f == KV_QF_BF16; }

/* Four one-byte codes (the bytes of w) as four fp16 operands, exactly (kvcu_mma.cuh). */
template <int F>
__device__ __forceinline__ void mma_codes_f16(uint32_t w, uint32_t h[2])
{
    if (F == KV_QF_INT8) kvcu_i8x4_f16(w, h);
    else if (F == KV_QF_FP8_E5M2) kvcu_e5m2x4_f16(w, h);
    else {
        h[0] = kvcu_e4m3x2_f16((uint16_t)w);
        h[1] = kvcu_e4m3x2_f16((uint16_t)(w >> 16));
    }
}

/* A one-byte tile into 16-bit rows: the stage's 2·tile raw rows (K then V, srb bytes apart
 * from st) into cv [2·tile][ld], 8 codes a step (an 8-byte load, a 16-byte store); rows at
 * or past n as zeros, so keys past the range add exact zeros to P·V. */
template <int F>
__device__ __forceinline__ void mma_convert(const uint8_t *st, uint16_t *cv, const dec_plan_t &p,
                                            int n, int tid)
{
    const int cpr = p.d / 8, ld = p.d + MMA_PAD; /* 8-code chunks a row */
    DEC_COUNT_UNROLL
    for (int i = tid; i < 2 * MMA_TILE * cpr; i += DEC_THREADS) {
        const int row = i / cpr, c = i - row * cpr;
        uint4 h = make_uint4(0u, 0u, 0u, 0u);
        if ((row & (MMA_TILE - 1)) < n) {
            const uint2 w = *(const uint2 *)(const void *)(st + row * p.srb + 8 * c);
            mma_codes_f16<F>(w.x, &h.x);
            mma_codes_f16<F>(w.y, &h.z);
        }
        *(uint4 *)(void *)(cv + (size_t)row * ld + 8 * c) = h;
    }
}

/* x, as a value the compiler cannot see through: the one-byte path's ldmatrix addresses into
 * cv are the same every tile, and hoisted out of the tile loop they held registers the kernel
 * does not have under 168 (ptxas spilled); derived from this they are computed where used. */
__device__ __forceinline__ const uint16_t *mma_opaque(const uint16_t *x)
{
#if defined(__CUDA_ARCH__)
    asm volatile("" : "+l"(x));
#endif
    return x;
}

/* A 16-bit tile of n < tile keys: its V rows from n on as zeros (the stage holds an earlier
 * tile's rows there, or nothing), so those keys add exact zeros to P·V. */
__device__ __forceinline__ void mma_zero_tail(uint8_t *v, const dec_plan_t &p, int n, int tid)
{
    const int cpr = p.d / 8; /* 16-byte chunks a row */
    for (int c = tid; c < (MMA_TILE - n) * cpr; c += DEC_THREADS) {
        const int row = n + c / cpr;
        *(uint4 *)(void *)(v + row * p.srb + 16 * (c - (row - n) * cpr)) = make_uint4(0u, 0u, 0u, 0u);
    }
}

static __host__ __device__ size_t mma_align16(size_t n) { return (n + 15) / 16 * 16; }

/* The plan's tensor-core part for its G and d: head blocks, warps per block over a tile's keys,
 * the tile, the shared-memory map. */
static __host__ __device__ void mma_shape(dec_plan_t *p, int fmt, int ns)
{
    const int d = p->d, ld = d + MMA_PAD;
    p->mb = (p->G + 15) / 16;
    p->ks = p->mb >= 4 ? 1 : p->mb == 1 ? 4 : 2; /* warps over heads x warps over a tile's keys */
    p->tile = MMA_TILE;
    p->srb = mma_wide(fmt) ? 2 * ld : p->rb;
    p->off_cv = mma_align16((size_t)p->mb * 16 * ld * 2);
    p->off_buf = p->off_cv + (mma_wide(fmt) ? 0 : (size_t)2 * MMA_TILE * ld * 2);
    p->stage = mma_align16((size_t)2 * MMA_TILE * p->srb + (size_t)2 * MMA_TILE * p->ng * 4);
    const size_t cb = (size_t)4 * 16 * (d + 2) * 4;
    p->ns = ns;
    p->smem = p->off_buf + (ns * p->stage > cb ? ns * p->stage : cb);
}

/* The count's shape (dec_count_shape(), tools/ptx-table.sh): the plan above at d DEC_COUNT_D,
 * G DEC_COUNT_G. Nothing in a build. */
template <int F>
__device__ __forceinline__ void mma_count_shape(dec_plan_t &p)
{
#ifdef DEC_COUNT_D
    dec_count_shape<F>(p);
    mma_shape(&p, F, MMA_STAGES);
#else
    (void)p;
#endif
}

/*
 * Block (kvh, part, t), four warps: launch row t's G heads of KV head kvh over range `part`.
 * Warp w takes head block w / ks (16 heads) and keys [w % ks · 64/ks, +64/ks) of each tile.
 * Shared memory: qh [mb·16][d + 8] the 16-bit queries; one-byte formats: cv [2][tile][d + 8]
 * a tile's K and V rows in 16 bits; the three stages of raw rows (16-bit formats: rows of
 * d + 8 halves, read in place); after the loop each warp's (o [16][d], m [16], l [16]) in
 * cb [4][16][d + 2] for the combine.
 */
template <int F, int NS>
__global__ void __launch_bounds__(DEC_THREADS, MMA_MIN_BLOCKS)
attn_mma_kernel(const float *q, attn_src src, attn_rows rows, attn_parts pp, dec_plan_t plan,
                int n_heads)
{
    dec_plan_t p = plan;
    mma_count_shape<F>(p);
    constexpr int BF = F == KV_QF_BF16;
    constexpr bool INT8 = F == KV_QF_INT8, FP8 = F == KV_QF_FP8_E4M3 || F == KV_QF_FP8_E5M2;
    constexpr bool WIDE = mma_wide(F);
    KV_DYNAMIC_SMEM(uint4, smem4);
    uint8_t *sm = (uint8_t *)smem4;
    const int tid = DEC_TID, G = p.G, d = p.d, ld = d + MMA_PAD;
    const int KS = p.ks, NK = MMA_TILE / p.ks;
    uint16_t *qh = (uint16_t *)(void *)sm;
    uint16_t *cv = (uint16_t *)(void *)(sm + p.off_cv);
    uint8_t *buf = sm + p.off_buf;
    dec_block blk;
    kv_head_view kh, vh;
    if (!dec_open<F, NS>(blk, kh, vh, q, src, rows, p, MMA_TILE, n_heads, buf)) return;
    const float *qg = blk.qg;
    for (int i = tid; i < p.mb * 16 * ld; i += DEC_THREADS) {
        const int row = i / ld, j = i - row * ld;
        qh[i] = kvcu_bits16<BF>(row < G && j < d ? qg[(size_t)row * d + j] : 0.0f);
    }
    __syncthreads();
    const int warp = tid / KV_WARP, lane = DEC_LANE(tid), gq = lane / 4, tq = lane % 4;
    const int mb = warp / KS, k0 = (warp % KS) * NK; /* head block, first key of the tile */
    const bool active = mb < p.mb;
    /* the query's A fragments come from qh by ldmatrix where S needs them: kept in registers
     * for the whole range they were 32 of them, and the kernel spilled under 168 */
    const uint16_t *qrow = qh + (size_t)((active ? mb : 0) * 16 + lane % 16) * ld + (lane / 16) * 8;
    float o[MMA_MAX_D / 8][4];
    KV_UNROLL
    for (int nd = 0; nd < MMA_MAX_D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* rows gq, gq + 8 */
    const float factor = (FP8 ? kh.scale : 1.0f) / sqrtf((float)d);
    /* this lane's ldmatrix rows in a [tile][ld] tile: for S, key k0 + lane % 8 of a block of 8,
     * columns 8·(lane / 8) on of a pair of 16-column blocks; for P·V (.trans), key
     * k0 + 8·(lane / 8 % 2) + lane % 8 of a block of 16, columns 8·(lane / 16) on of a pair of
     * 8-column blocks */
    const int koff = (k0 + (lane & 7)) * ld + (lane >> 3) * 8;
    const int voff = (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + (lane >> 4) * 8;

    for (int it = 0; it < blk.ntiles; it++) {
        const dec_tile tl = dec_turn<F, NS>(blk, kh, vh, p, src, it, MMA_TILE, buf);
        const uint16_t *kt = mma_opaque(cv), *vt = kt + MMA_TILE * ld;
        if (WIDE) {
            kt = (const uint16_t *)(const void *)tl.k;
            vt = (const uint16_t *)(const void *)tl.v;
            if (tl.n < MMA_TILE) {
                mma_zero_tail((uint8_t *)(void *)(uintptr_t)tl.v, p, tl.n, tid);
                __syncthreads();
            }
        } else {
            mma_convert<F>(tl.k, cv, p, tl.n, tid);
            __syncthreads(); /* the 16-bit rows are every thread's */
        }
        if (active && k0 < tl.n) {
            /* S = Q·Kᵀ over this warp's keys: s[nb] holds keys k0 + 8nb + 2tq, +1 of heads
             * gq (s[nb][0..1]) and gq + 8 (s[nb][2..3]) */
            float s[MMA_TILE / 8][4];
            KV_UNROLL
            for (int nb = 0; nb < MMA_TILE / 8; nb++) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
            KV_UNROLL
            for (int kb = 0; kb < MMA_MAX_D / 16; kb += 2) { /* two 16-column blocks of d */
                if (kb >= d / 16) continue;
                const bool two = kb + 1 < d / 16;
                uint32_t qa[2][4];
                kvcu_ldmatrix_x4(qa[0], qrow + kb * 16);
                if (two) kvcu_ldmatrix_x4(qa[1], qrow + kb * 16 + 16);
                KV_UNROLL
                for (int nb = 0; nb < MMA_TILE / 8; nb++) {
                    if (nb >= NK / 8) continue;
                    uint32_t b[4];
                    const uint16_t *kr = kt + koff + nb * 8 * ld + kb * 16;
                    if (two) kvcu_ldmatrix_x4(b, kr);
                    else kvcu_ldmatrix_x2(b, kr);
                    kvcu_mma<BF>(s[nb], qa[0], b);
                    if (two) kvcu_mma<BF>(s[nb], qa[1], b + 2);
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
            /* s becomes the weights P·V multiplies (int8: times the value row's scale) */
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
                        s[nb][e] = INT8 && key < tl.n ? pe * tl.vs[key] : pe;
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
                const uint32_t a[4] = {kvcu_pack2<BF>(s[2 * kb][0], s[2 * kb][1]),
                                       kvcu_pack2<BF>(s[2 * kb][2], s[2 * kb][3]),
                                       kvcu_pack2<BF>(s[2 * kb + 1][0], s[2 * kb + 1][1]),
                                       kvcu_pack2<BF>(s[2 * kb + 1][2], s[2 * kb + 1][3])};
                const uint16_t *vr = vt + voff + kb * 16 * ld;
                KV_UNROLL
                for (int nd = 0; nd < MMA_MAX_D / 8; nd += 2) {
                    if (nd >= d / 8) continue;
                    uint32_t b[4];
                    kvcu_ldmatrix_x4_trans(b, vr + nd * 8);
                    kvcu_mma<BF>(o[nd], a, b);
                    kvcu_mma<BF>(o[nd + 1], a, b + 2);
                }
            }
        }
        __syncthreads(); /* the 16-bit rows (and a 16-bit stage) are rewritten next */
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
    mma_shape(p, p->fmt, MMA_STAGES);
    if (p->smem > kvcu_smem_optin()) mma_shape(p, p->fmt, 2);
    if (p->smem > kvcu_smem_optin()) return 0;
    dec_dispatch(p->fmt, [&](auto c) {
        if constexpr (mma_fmt<decltype(c)::value>)
            *kernel = p->ns == MMA_STAGES
                          ? (const void *)attn_mma_kernel<decltype(c)::value, MMA_STAGES>
                          : (const void *)attn_mma_kernel<decltype(c)::value, 2>;
    });
    return 1;
}

void kvcu_decode_mma_launch(dim3 grid, const dec_plan_t &p, const float *q,
                            const attn_src &src, const attn_rows &rows,
                            const attn_parts &parts, int n_heads)
{
    dec_dispatch(p.fmt, [&](auto c) {
        if constexpr (mma_fmt<decltype(c)::value>) {
            if (p.ns == MMA_STAGES)
                KV_LAUNCH((attn_mma_kernel<decltype(c)::value, MMA_STAGES>), grid, DEC_THREADS,
                          p.smem, 0, q, src, rows, parts, p, n_heads);
            else
                KV_LAUNCH((attn_mma_kernel<decltype(c)::value, 2>), grid, DEC_THREADS, p.smem, 0, q,
                          src, rows, parts, p, n_heads);
        }
    });
}
