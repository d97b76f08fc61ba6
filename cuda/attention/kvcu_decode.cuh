/*
 * What the engine's decode kernels share (cuda/attention/kvcu_decode.cu, the CUDA-core kernel;
 * kvcu_decode_mma.cu, the tensor-core one for large groups): the per-format traits, the
 * launch's plan, the row locator and the cp.async tile copy. kvcu_decode.cu's head comment
 * says what each technique adds.
 */
#ifndef KVCU_DECODE_CUH
#define KVCU_DECODE_CUH

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "kvcu_internal.cuh"
#include "kvcu_vec.cuh"

#define DEC_THREADS 128
#define DEC_MIN_BLOCKS 4                    /* blocks per SM asked of ptxas: <= 128 registers */
#define DEC_STAGE_BYTES 8192                /* K codes of one tile, about */
#define KVCU_DECODE_WAVES 2

/* The staged path's pseudo-format: rows dequantized element by element into fp32 tiles. */
#define DEC_ELEM (-1)

/* Elements per 16 bytes of format F (DEC_ELEM: of its fp32 tiles), as a constant. */
template <int F>
struct dec_fmt {
    static constexpr int kind = F == KV_QF_F32 || F == DEC_ELEM ? KVCU_V_F32
                              : F == KV_QF_F16 ? KVCU_V_F16
                              : F == KV_QF_BF16 ? KVCU_V_BF16 : F == KV_QF_FP8_E4M3 ? KVCU_V_E4M3
                              : F == KV_QF_FP8_E5M2 ? KVCU_V_E5M2 : KVCU_V_I8;
    static constexpr int vec = kvcu_vec_elems(kind);
    static constexpr bool int8 = F >= KV_QF_INT8 && F <= KV_QF_INT8_G128;
    static constexpr bool fp8 = F == KV_QF_FP8_E4M3 || F == KV_QF_FP8_E5M2;
};

/* The one switch from a plan's template (dec_plan_t.fmt) to a kernel's instance: fn(c), c a
 * std::integral_constant<int, F> of that format (every int8 layout runs KV_QF_INT8's, its
 * scales per dec_plan_t.ng). */
template <class Fn>
static inline void dec_dispatch(int f, Fn &&fn)
{
    switch (f) {
    case KV_QF_F32: fn(std::integral_constant<int, KV_QF_F32>()); break;
    case KV_QF_F16: fn(std::integral_constant<int, KV_QF_F16>()); break;
    case KV_QF_BF16: fn(std::integral_constant<int, KV_QF_BF16>()); break;
    case KV_QF_FP8_E4M3: fn(std::integral_constant<int, KV_QF_FP8_E4M3>()); break;
    case KV_QF_FP8_E5M2: fn(std::integral_constant<int, KV_QF_FP8_E5M2>()); break;
    case DEC_ELEM: fn(std::integral_constant<int, DEC_ELEM>()); break;
    default: fn(std::integral_constant<int, KV_QF_INT8>()); break;
    }
}

/* The launch's shape and shared-memory map, computed once on the host (dec_plan()). */
struct dec_plan_t {
    int G, d, lpr, lpr_shift; /* heads per group, head dim, lanes per row (2^lpr_shift) */
    int tile;                 /* rows per pipeline stage */
    int ng;                   /* int8: scales per row (d / group), else 0 */
    int qint;                 /* per-token int8 keys: integer scores of the 16-bit query */
    int fmt;                  /* the template: the layer's format, or DEC_ELEM */
    int mb, ks;               /* tensor cores: 16-head blocks, warps per block over a tile */
    int ns;                   /* tensor cores: stages of raw rows, 3, or 2 where 3 do not fit */
    int64_t rb;               /* bytes per row */
    int64_t srb;              /* bytes per row in a stage: rb, or more where rows are padded */
    size_t off_s, off_m, off_o, off_buf, stage, smem; /* byte offsets; q at 0 */
    size_t off_cv;            /* tensor cores: a tile's K/V rows converted to 16 bits */
};

/* A count of machine code needs a shape: tools/ptx-table.sh compiles the decode kernels with
 * DEC_COUNT_D, DEC_COUNT_G and DEC_COUNT_WARP defined, and each kernel then fixes its plan to
 * that shape in its own format (dec_plan()'s tile; per-token int8), a contiguous cache, whole
 * tiles and one warp's threads (DEC_TID), so that every loop but the tile loop has a constant
 * trip count and unrolls, and the script counts the tile loop's instructions per KV byte.
 * No build defines them. */
template <int F>
__device__ __forceinline__ void dec_count_shape(dec_plan_t &p)
{
#ifdef DEC_COUNT_D
    p.G = DEC_COUNT_G;
    p.d = DEC_COUNT_D;
    p.lpr = DEC_COUNT_D / dec_fmt<F>::vec;
    p.lpr_shift = 0;
    while ((1 << p.lpr_shift) < p.lpr) p.lpr_shift++;
    p.rb = p.srb = 16 * p.lpr;
    p.tile = 8;
    while (p.tile < 64 && 2 * p.tile * p.rb <= DEC_STAGE_BYTES) p.tile *= 2;
    p.ng = dec_fmt<F>::int8 ? 1 : 0;
    p.qint = F == KV_QF_INT8;
#else
    (void)p;
#endif
}

/* The thread: threadIdx.x, or for the count (dec_count_shape()) the first of warp
 * DEC_COUNT_WARP, a constant, so that every loop but the tile loop has a constant trip count;
 * the lane that picks the data stays threadIdx.x's (DEC_LANE), so the data differ across the
 * warp and shuffles stay shuffles ... */
#ifdef DEC_COUNT_D
#define DEC_TID (DEC_COUNT_WARP * KV_WARP)
#define DEC_LANE(tid) ((int)threadIdx.x & (KV_WARP - 1))
#else
#define DEC_TID ((int)threadIdx.x)
#define DEC_LANE(tid) ((tid) & (KV_WARP - 1))
#endif
/* ... and the loops inside the tile loop unrolled whole there (their trip counts are constants
 * of the shape, at most 64); nothing in a build */
#ifdef DEC_COUNT_D
#define DEC_COUNT_UNROLL _Pragma("unroll 64")
#else
#define DEC_COUNT_UNROLL
#endif

/* Index i of the positions a query at tpos retains -> the logical row it lives in: i itself,
 * the i-th of chapter 06's sinks and window (kvcu_attention.cu's attn_row()), or position
 * lst[i] of chapter 09's selected set. kv_view_row() then finds the physical row: the one row
 * locator of contiguous and paged, windowed, selected or not. */
__device__ __forceinline__ int64_t dec_lrow(const attn_src &s, const int *lst, int64_t tpos,
                                            int64_t i)
{
#ifdef DEC_COUNT_D
    return i; /* the count's path: every position, no set (dec_count_shape()) */
#endif
    if (lst) return lst[i];
    return s.keep_w ? kv_window_row(s.keep_w, s.keep_s, kv_window_pos(s.keep_w, s.keep_s, tpos, i))
                    : i;
}

/* Tile `it` of [lo, hi) into stage st: K rows at 0, V rows at tile·srb (rows srb bytes apart in
 * the stage), then (int8) the K and V scales [tile][ng] each. 16-byte copies for codes, 4-byte ones for scales. A thread keeps one
 * chunk column (its lane among the row's lpr) and walks rows, so each row's locator runs once
 * per thread for K and V together, on the views' own copies (by value: an address picked
 * between K and V at run time would put both views in local memory). DEC_ELEM: each element
 * dequantized (kv_ld(), under KV_POS_CACHE rotated by its index, key_ld()) into fp32 rows,
 * plain stores that the tile's barrier publishes. */
template <int F>
__device__ __forceinline__ void dec_issue(const dec_plan_t &p, const attn_src &src,
                                          const int *lst, const kv_head_view kh,
                                          const kv_head_view vh, int64_t tpos, int64_t i0, int n,
                                          uint8_t *st)
{
    if (F == DEC_ELEM) {
        const int dsh = p.lpr_shift + 2, m = n << dsh; /* d = 4·lpr elements a row */
        for (int c = DEC_TID; c < 2 * m; c += DEC_THREADS) {
            const int v = c >= m, cc = v ? c - m : c, row = cc >> dsh, i = cc & (p.d - 1);
            const int64_t lr = dec_lrow(src, lst, tpos, i0 + row);
            const float x = v ? kv_ld(vh, NULL, lr, kv_view_row(&vh, lr), i)
                              : key_ld(kh, NULL, lr, kv_view_row(&kh, lr), i,
                                       attn_rope(src, i0 + row), src.rotary_dim);
            ((float *)(void *)(st + (v ? p.tile * p.srb : 0) + row * p.srb))[i] = x;
        }
        return;
    }
    const int ch = DEC_TID & (p.lpr - 1), step = DEC_THREADS >> p.lpr_shift;
    uint8_t *sk = st + ch * 16, *sv = sk + p.tile * p.srb;
    const uint8_t *gk = kh.codes + ch * 16, *gv = vh.codes + ch * 16;
    DEC_COUNT_UNROLL
    for (int row = DEC_TID >> p.lpr_shift; row < n; row += step) {
        const int64_t lr = dec_lrow(src, lst, tpos, i0 + row);
        kvcu_cp16(sk + row * p.srb, gk + kv_view_row(&kh, lr) * p.rb);
        kvcu_cp16(sv + row * p.srb, gv + kv_view_row(&vh, lr) * p.rb);
    }
    if (dec_fmt<F>::int8) {
        float *sc = (float *)(void *)(st + 2 * p.tile * p.srb); /* [2][tile][ng] */
        const float *mk = (const float *)kh.meta, *mv = (const float *)vh.meta;
        const int m = n * p.ng;
        DEC_COUNT_UNROLL
        for (int c = DEC_TID; c < m; c += DEC_THREADS) {
            const int row = c / p.ng, j = c - row * p.ng;
            const int64_t lr = dec_lrow(src, lst, tpos, i0 + row);
            __pipeline_memcpy_async(sc + c, mk + kv_view_row(&kh, lr) * p.ng + j, 4);
            __pipeline_memcpy_async(sc + p.tile * p.ng + c, mv + kv_view_row(&vh, lr) * p.ng + j,
                                    4);
        }
    }
}

/* Block (kvh, part, t) of grid (H_kv, ranges, T), as both kernels open it: launch row t's G
 * query heads of KV head kvh over range `part` of the row's retained keys (or of its selected
 * set, rows.sel). The head's K and V views stay apart (kv_view_row() takes their address, so
 * they live in local memory; the rest stays in registers). */
struct dec_block {
    attn_span r;         /* the row's keys for this KV head */
    int64_t lo, hi;      /* this block's range of them */
    int ntiles;          /* tiles of `tile` rows over [lo, hi) */
    const int *lst;      /* the row's selected set, or NULL */
    float *satt;         /* its scores [G][sel_stride] by list index, for the mass (the merge
                          * turns them into weights), or NULL */
    const float *qg;     /* [G][d] the group's queries */
};

/* Rows of the tile at i0 of [lo, hi). */
__device__ __forceinline__ int dec_rows(const dec_block &b, int64_t i0, int tile)
{
#ifdef DEC_COUNT_D
    return tile; /* whole tiles (dec_count_shape()) */
#endif
    return (int)(b.hi - i0 < tile ? b.hi - i0 : tile);
}

/* The block's range and views (kh, vh); 0 when the row is shorter than the range (the block
 * leaves). The copies of the first NS - 1 tiles (NS stages: 2 a double buffer, 3 a pipeline of
 * three) go out into stages 0 .. NS - 2 before anything else, one batch each. */
template <int F, int NS = 2>
__device__ __forceinline__ bool dec_open(dec_block &b, kv_head_view &kh, kv_head_view &vh,
                                         const float *q, const attn_src &src,
                                         const attn_rows &rows, const dec_plan_t &p, int tile,
                                         int n_heads, uint8_t *buf)
{
    const int kvh = blockIdx.x;
    b.r = attn_span_kv(src, rows, blockIdx.z, kvh);
    if (!attn_split_span(b.r, blockIdx.y, &b.lo, &b.hi)) return false;
    kh = attn_view(src, KV_QROLE_KEY, p.d, b.r.slot, kvh);
    vh = attn_view(src, KV_QROLE_VALUE, p.d, b.r.slot, kvh);
    b.lst = rows.sel ? rows.sel + rows.sel_off[(size_t)kvh * rows.sel_n + (b.r.tr - rows.sel_j0)]
                     : NULL;
    const size_t h0 = (size_t)kvh * p.G; /* the group's first query head */
    b.satt = rows.sel ? rows.sel_att + ((size_t)blockIdx.z * n_heads + h0) * rows.sel_stride
                      : NULL;
#ifdef DEC_COUNT_D
    kh.blocks = vh.blocks = NULL; /* the count's path: contiguous, no set */
    b.lst = NULL;
    b.satt = NULL;
#endif
    b.ntiles = (int)((b.hi - b.lo + tile - 1) / tile);
    for (int i = 0; i < NS - 1; i++) {
        const int64_t i0 = b.lo + (int64_t)i * tile;
        if (i < b.ntiles)
            dec_issue<F>(p, src, b.lst, kh, vh, b.r.tpos, i0, dec_rows(b, i0, tile),
                         buf + (size_t)i * p.stage);
        kvcu_cp_commit();
    }
    b.qg = q + ((size_t)b.r.tr * n_heads + h0) * p.d;
    return true;
}

/* A tile in its stage: keys i0 .. i0 + n - 1 of the range; K rows, V rows, int8 scales. */
struct dec_tile {
    int64_t i0;
    int n;
    const uint8_t *k, *v; /* [tile][srb] each */
    const float *ks, *vs; /* [tile][ng] each (int8) */
};

/* Tile it's turn in the NS stages: tile it + NS - 1's copies go out into the stage tile it - 1
 * left (an empty batch past the last keeps the wait uniform), then every thread waits for tile
 * it's, the NS - 1 newer batches still in flight. */
template <int F, int NS = 2>
__device__ __forceinline__ dec_tile dec_turn(const dec_block &b, const kv_head_view kh,
                                             const kv_head_view vh, const dec_plan_t &p,
                                             const attn_src &src, int it, int tile, uint8_t *buf)
{
    dec_tile t;
    t.i0 = b.lo + (int64_t)it * tile;
    t.n = dec_rows(b, t.i0, tile);
    if (it + NS - 1 < b.ntiles) {
        const int64_t i1 = t.i0 + (int64_t)(NS - 1) * tile;
        dec_issue<F>(p, src, b.lst, kh, vh, b.r.tpos, i1, dec_rows(b, i1, tile),
                     buf + (size_t)((unsigned)(it + NS - 1) % NS) * p.stage);
    }
    kvcu_cp_commit();
    kvcu_cp_wait<NS - 1>(); /* this tile's copies (this thread's) have landed */
    __syncthreads();        /* ... and every thread's */
    t.k = buf + (size_t)((unsigned)it % NS) * p.stage;
    t.v = t.k + (size_t)tile * p.srb;
    t.ks = (const float *)(const void *)(t.k + 2 * (size_t)tile * p.srb);
    t.vs = t.ks + (size_t)tile * p.ng;
    return t;
}

/* The block's first head in the partial states pp: [T][H][n_parts] entries. */
__device__ __forceinline__ size_t dec_part_index(const dec_plan_t &p, const attn_parts &pp,
                                                 int n_heads)
{
    return ((size_t)blockIdx.z * n_heads + (size_t)blockIdx.x * p.G) * pp.n_parts + blockIdx.y;
}

/* ---- the tensor-core kernel (kvcu_decode_mma.cu) -------------------------------------------- */

/* Whether the group's scores and P·V go to the tensor cores (the one rule; the comment at its
 * definition says why), and if so the plan p becomes that kernel's (its tile, shared memory)
 * and *kernel its entry; 0 leaves p alone. */
int kvcu_decode_mma_plan(const attn_src &src, dec_plan_t *p, const void **kernel);
/* Launch it over grid (H_kv, ranges, T) with plan p. */
void kvcu_decode_mma_launch(dim3 grid, const dec_plan_t &p, const float *q,
                            const attn_src &src, const attn_rows &rows,
                            const attn_parts &parts, int n_heads);

#endif
