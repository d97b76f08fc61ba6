/**
 * @file kvcu_flash.cuh
 * The fused body of chapter 08's kernels v2-v4 (cuda/attention/kvcu_flash.cu describes them):
 * R rows that read one KV head walk its keys a tile at a time with the online softmax, the
 * GPU's writing of kv_flash.c's online_update(). A tile's K and V rows are read once into
 * shared memory for all R rows; each row's running max and exp-sum sit in the registers of
 * its lanes, its unnormalized output in the registers of the threads that own its dims.
 */
#ifndef KVCU_FLASH_CUH
#define KVCU_FLASH_CUH

#include "kvcu_internal.cuh"

#define FLASH_ACC 32 /* acc registers per thread: a block's rows·d <= blockDim.x·32 */

/* K and V views of KV head kvh of the job's slot, and the plain floats of an fp32 layer. */
typedef struct {
    kv_head_view kh, vh;
    const float *kf, *vf;
} flash_kv;

/* What every kernel of a job needs, passed by value. */
typedef struct {
    attn_src src;          /* the layer's planes, KV heads, tables, format */
    attn_rows rows;        /* the job's queries as the attention family's rows (flash_rows_of()) */
    const float *q;        /* [T][H][d] */
    float *out;            /* [T][H][d] */
    int T, H, d, slot;
    int64_t k_begin;       /* first key a query may see */
    float scale;           /* 1 / sqrt(d) */
} flash_args;

/* End (exclusive) of the keys query t sees (attn_span_of()); k_begin when it sees none or does
 * not exist. */
__device__ inline int64_t flash_end(const flash_args &a, int t)
{
    if (t < 0 || t >= a.T) return a.k_begin;
    return attn_span_of(a.src, a.rows, t).p1;
}

/* K and V views of KV head kvh of the job's slot (flash_kv, kvcu_flash.cuh). */
__device__ inline flash_kv flash_views(const flash_args &a, int kvh)
{
    flash_kv v;
    v.kh = attn_view(a.src, KV_QROLE_KEY, a.d, a.slot, kvh);
    v.vh = attn_view(a.src, KV_QROLE_VALUE, a.d, a.slot, kvh);
    v.kf = a.src.fmt == KV_QF_F32 ? (const float *)(const void *)v.kh.codes : NULL;
    v.vf = a.src.fmt == KV_QF_F32 ? (const float *)(const void *)v.vh.codes : NULL;
    return v;
}


/* v5, the tiles on tensor cores (kvcu_flash_mma.cu): whether a shape fits it (head dim a
 * multiple of 16 up to 128, a group of at most 64 heads), the queries of one of its blocks
 * (64 / G, each with the G heads of its group), and its launch on a job's arguments. */
int kvcu_flash_mma_fits(int n_heads, int n_kv_heads, int head_dim);
int kvcu_flash_mma_queries(int G);
cudaError_t kvcu_flash_mma_launch(const flash_args &a);

/* v6, v5 with 32 rows per warp, the longest blocks first and converting int8/fp8 tiles
 * (kvcu_flash_v6.cu; the shapes v5 fits): the queries of one of its blocks (128 / G), the
 * keys of one of its tiles (64 for head dims up to 64, else 32), and its launch. */
int kvcu_flash_v6_queries(int G);
int kvcu_flash_v6_keys(int head_dim);
cudaError_t kvcu_flash_v6_launch(const flash_args &a);
/* Whether v6 takes a shape on this device: v5's shapes, and v6's shared memory (up to 70 KiB
 * at d 128) within what a block may opt in to. kvcu_flash_prefill_version() (kvcu.h) asks. */
int kvcu_flash_v6_fits(int n_heads, int n_kv_heads, int head_dim);

/* A block's shared memory, carved from the dynamic allocation (flash_smem_bytes()):
 * R rows that read the same KV head, key tiles of BK. */
typedef struct {
    int64_t *end; /* [R] each row's end of visible keys */
    float *qs;    /* [R][d+1] the rows' queries (padded: no bank conflicts in the dots) */
    float *ks;    /* [BK][d+1] the tile's keys, dequantized */
    float *vs;    /* [BK][d] the tile's values, dequantized */
    float *s;     /* [R][BK] scores, then exp(s - m) */
    float *alpha; /* [R] this tile's rescale of each row, exp(m_old - m_new) */
    float *m, *l; /* [R] each row's final max and exp-sum */
} flash_smem;

static inline size_t flash_smem_bytes(int R, int d, int BK)
{
    return (size_t)R * sizeof(int64_t) +
           ((size_t)R * (d + 1) + (size_t)BK * (2 * d + 1) + (size_t)R * BK + 3 * (size_t)R) *
               sizeof(float);
}

__device__ inline flash_smem flash_carve(void *base, int R, int d, int BK)
{
    flash_smem sm;
    sm.end = (int64_t *)base;
    sm.qs = (float *)(sm.end + R);
    sm.ks = sm.qs + (size_t)R * (d + 1);
    sm.vs = sm.ks + (size_t)BK * (d + 1);
    sm.s = sm.vs + (size_t)BK * d;
    sm.alpha = sm.s + (size_t)R * BK;
    sm.m = sm.alpha + R;
    sm.l = sm.m + R;
    return sm;
}

/* Lanes that share one row's softmax: the largest power of two <= 32 with R·P <= blockDim.x,
 * so each thread serves at most one row and a row's lanes sit in one warp. */
__device__ inline int flash_row_lanes(int R)
{
    int P = 1;
    while (P < KV_WARP && 2 * P * R <= (int)blockDim.x) P *= 2;
    return P;
}

/* Max and sum over the P lanes of a row (xor butterfly inside aligned groups of P lanes;
 * every lane of the warp takes part, so the whole block calls these together). */
__device__ inline float flash_group_max(float v, int P)
{
    for (int off = P / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ inline float flash_group_sum(float v, int P)
{
    for (int off = P / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/*
 * The fused loop of one block: R rows (sm.qs, sm.end filled and synchronized by the caller)
 * over keys [k0, k1), BK at a time, all reading the KV head of @p kv. Row r's softmax is kept
 * by its P lanes (threads r·P .. r·P + P - 1): its running max m and sum l sit in their
 * registers, the same value in each. acc[c] (registers) is the unnormalized output of pair
 * e = threadIdx.x + c·blockDim.x, row e / d, dim e % d. On return sm.m, sm.l hold each row's
 * final max and exp-sum (m = -inf, l = 0 for a row that saw no key), visible to the block.
 */
__device__ inline void flash_rows(const flash_kv &kv, const flash_smem &sm, int R, int d,
                                  int BK, int64_t k0, int64_t k1, float scale, float *acc)
{
    const int tid = threadIdx.x, nt = blockDim.x;
    const int P = flash_row_lanes(R), row = tid / P, lane = tid % P; /* this thread's row */
    float m = -INFINITY, l = 0.0f; /* the row's running max and sum (row < R) */
    KV_UNROLL
    for (int c = 0; c < FLASH_ACC; c++) acc[c] = 0.0f;
    for (int64_t kt = k0; kt < k1; kt += BK) {
        const int nk = k1 - kt < BK ? (int)(k1 - kt) : BK;
        /* the tile's K and V rows, read from the cache once for all R rows */
        for (int e = tid; e < nk * d; e += nt) {
            const int j = e / d, i = e % d;
            const int64_t p = kt + j;
            sm.ks[(size_t)j * (d + 1) + i] = kv_ld(kv.kh, kv.kf, p, kv_view_row(&kv.kh, p), i);
            sm.vs[(size_t)j * d + i] = kv_ld(kv.vh, kv.vf, p, kv_view_row(&kv.vh, p), i);
        }
        __syncthreads();
        /* scores of every (row, key) pair of the tile; masked pairs -inf */
        for (int e = tid; e < R * BK; e += nt) {
            const int r = e / BK, j = e % BK;
            float s = -INFINITY;
            if (j < nk && kt + j < sm.end[r]) {
                const float *qr = sm.qs + (size_t)r * (d + 1), *kj = sm.ks + (size_t)j * (d + 1);
                float dot = 0.0f;
                for (int i = 0; i < d; i++) dot += qr[i] * kj[i];
                s = dot * scale;
            }
            sm.s[e] = s;
        }
        __syncthreads();
        /* online softmax of each row by its lanes: the new max, the rescale of what was
         * summed so far, exp of the tile's scores and their sum */
        float *sr = sm.s + (size_t)(row < R ? row : 0) * BK;
        float mt = -INFINITY;
        if (row < R)
            for (int j = lane; j < nk; j += P) mt = fmaxf(mt, sr[j]);
        const float mn = fmaxf(m, flash_group_max(mt, P));
        const float a = mn == -INFINITY ? 1.0f : expf(m - mn); /* exp(-inf) = 0: first tile */
        float sum = 0.0f;
        if (row < R)
            for (int j = lane; j < nk; j += P) {
                const float p = mn == -INFINITY ? 0.0f : expf(sr[j] - mn);
                sr[j] = p;
                sum += p;
            }
        l = l * a + flash_group_sum(sum, P);
        m = mn;
        if (row < R && lane == 0) sm.alpha[row] = a;
        __syncthreads();
        /* acc = acc · alpha + P V for the pairs this thread owns */
        KV_UNROLL
        for (int c = 0; c < FLASH_ACC; c++) {
            const int e = tid + c * nt;
            if (e < R * d) {
                const int r = e / d, i = e % d;
                const float *pr = sm.s + (size_t)r * BK;
                float x = acc[c] * sm.alpha[r];
                for (int j = 0; j < nk; j++) x += pr[j] * sm.vs[(size_t)j * d + i];
                acc[c] = x;
            }
        }
        __syncthreads(); /* the next tile overwrites ks, vs, s */
    }
    if (row < R && lane == 0) {
        sm.m[row] = m;
        sm.l[row] = l;
    }
    __syncthreads();
}

#endif
