/*
 * Chapter 08 on the GPU: the optimization progression of the one attention family, twin of
 * reference_cpu/attention/kv_flash.h. A job is T queries of one cache slot (positions q_pos0 + t) over
 * the slot's keys; query t sees keys k_begin <= k < n_keys and, when causal, k <= q_pos0 + t.
 * A query that sees no key outputs zeros. Query head h reads KV head h / G. Every version
 * reads K and V through the cache views of cuda/core/kvcu_internal.cuh (attn_view(), kv_ld():
 * contiguous or paged rows, every storage format dequantized inside the loads), the readers
 * the decode kernels of cuda/attention/kvcu_attention.cu use, so there is one reader for the whole family.
 *
 * flash_*_kernel_v1 (naive): three kernels, the textbook formula. Scores S = q·k / sqrt(d) for
 *   every (head, query, visible key) are written to global memory, [H][T][n_vis] floats with
 *   n_vis = n_keys - k_begin (keys the causal mask hides: -inf); a softmax kernel reads each
 *   row back for its max, then again to rewrite it as exp(s - max) and sum it; the P·V kernel
 *   reads P once more and divides by the sum. The scores cost 5·4·H·T·n_vis bytes of traffic
 *   (written, read, read and rewritten, read: kv_flash.c's count for kv_flash_naive), which
 *   at prefill sizes dwarfs the cache itself: the traffic the fused versions remove. The
 *   wrapper refuses jobs of more than KVCU_FLASH_V1_MAX_SCORES scores.
 *
 * flash_kernel_v2 (fused tiled prefill): one block per (tile of BQ queries, query head). The
 *   block keeps its queries in shared memory and walks the keys BK at a time: the K and V rows
 *   of a tile are read once from the cache into shared memory, the BQ x BK scores are formed
 *   there, and each query row keeps a running max m, a running sum l of exp(s - m) and an
 *   unnormalized accumulator acc. When a tile raises a row's max, l and acc are rescaled by
 *   exp(m_old - m_new); the division by l happens once at the end, and S never leaves the
 *   chip. m and l live in the registers of the row's lanes (128 / BQ threads reduce a row
 *   with warp shuffles), acc in the registers of the threads owning its (row, dim) pairs.
 *   Key tiles entirely in the causal future of the last query of the block are never
 *   visited (the loop stops at that query's last key). This is FlashAttention-2's split:
 *   queries are the outer, parallel dimension and each block owns its output rows outright,
 *   so no two blocks write the same output and no merge is needed. Each head of a group
 *   re-reads its KV head's rows (G times the bytes of v3 at decode).
 *
 * flash_kernel_v3 (decode): one block per (query, KV head). Its rows are the G query heads of
 *   the group instead of a tile of queries: each K/V tile is read from the cache once and
 *   used by all G heads (chapter 03's grouping, attn_decode_kernel_v2, done with v2's online
 *   softmax instead of a score array in global memory), so a decode step reads
 *   H_kv·n·d·2·b bytes. Groups too large for the registers (G·d > 4096) run as several blocks
 *   of up to 4096 / d heads, each re-reading the tiles. The body is v2's (flash_rows()).
 *
 * flash_kernel_v4 + flash_merge_kernel (split-KV, flash-decoding): v3 gives a decode step
 *   only H_kv blocks, each walking the whole context alone, while a GPU has ~100+ SMs. v4 cuts
 *   the keys into ranges of KVCU_FLASH_SPLIT_KEYS (512) and gives every (query, KV head,
 *   range) its own block, which runs v3's body over its range and writes, per head, the
 *   partial result (m_j, l_j, acc_j) unnormalized to the scratch. The merge kernel, one block
 *   per (query, head), combines them by log-sum-exp: M = max_j m_j,
 *   out = sum_j acc_j e^(m_j - M) / sum_j l_j e^(m_j - M) (kv_flash_merge(), in range order;
 *   empty ranges have m = -inf and weigh nothing). Same bytes of K/V as v3, plus the
 *   partials written and read back, 2·(d + 2) floats per (query, head, range); in exchange a
 *   32k-key decode with H_kv = 8 runs as 8·64 = 512 blocks instead of 8.
 *
 * None of the versions is bit-identical to the CPU (another summation order; the tests use
 * the fp32 tolerance). Windowed caches (chapter 06) are refused, as on the CPU.
 */
#include <stdlib.h>
#include <string.h>

#include "kvcu_internal.cuh"

#define FLASH_THREADS 128
#define FLASH_ACC 32               /* acc registers per thread: a block's rows·d <= 128·32 */
#define FLASH_MAX_BQ 16            /* v2: queries per tile */
#define FLASH_MAX_D 1024           /* head dims the tiles are sized for */
#define FLASH_SMEM_MAX (48 * 1024) /* default dynamic shared memory per block */

/* What every kernel of a job needs, passed by value. */
typedef struct {
    attn_src src;          /* the layer's planes, tables, format */
    const float *q;        /* [T][H][d] */
    float *out;            /* [T][H][d] */
    int T, H, H_kv, d, slot;
    int64_t q_pos0, k_begin, n_keys;
    int causal;
    float scale;           /* 1 / sqrt(d) */
} flash_args;

/* End (exclusive) of the keys query t sees; k_begin when it sees none or does not exist. */
__device__ inline int64_t flash_end(const flash_args &a, int t)
{
    if (t < 0 || t >= a.T) return a.k_begin;
    int64_t e = a.n_keys;
    if (a.causal && a.q_pos0 + t + 1 < e) e = a.q_pos0 + t + 1;
    return e > a.k_begin ? e : a.k_begin;
}

/* K and V views of KV head kvh of the job's slot, and the plain floats of an fp32 layer. */
typedef struct {
    kv_head_view kh, vh;
    const float *kf, *vf;
} flash_kv;

__device__ inline flash_kv flash_views(const flash_args &a, int kvh)
{
    flash_kv v;
    v.kh = attn_view(a.src, KV_QROLE_KEY, a.H_kv, a.d, a.slot, kvh);
    v.vh = attn_view(a.src, KV_QROLE_VALUE, a.H_kv, a.d, a.slot, kvh);
    v.kf = a.src.fmt == KV_QF_F32 ? (const float *)(const void *)v.kh.codes : NULL;
    v.vf = a.src.fmt == KV_QF_F32 ? (const float *)(const void *)v.vh.codes : NULL;
    return v;
}

/* ---- v1: naive ------------------------------------------------------------------------- */

/* v1's scratch: S [H][T][n_vis] scores then exp(s - max), rowsum [H][T] each row's sum of
 * them; n_vis = n_keys - k_begin, the keys any query may see. */
typedef struct {
    float *S, *rowsum;
    int64_t n_vis;
} flash_scores;

/* Block (t, h): row S[h][t] of scores, -inf where the causal mask hides a key. */
__global__ void flash_scores_kernel_v1(flash_args a, flash_scores sc)
{
    KV_DYNAMIC_SMEM(float, qh); /* [d] the query, rounded where int8 keys meet it */
    const int t = blockIdx.x, h = blockIdx.y, G = a.H / a.H_kv;
    const flash_kv kv = flash_views(a, h / G);
    const float *q = a.q + ((size_t)t * a.H + h) * a.d; /* [d] */
    for (int i = threadIdx.x; i < a.d; i += blockDim.x) qh[i] = q[i];
    __syncthreads();
    if (kv_int_keys(kv.kh, a.src.rope_cs)) {
        if (threadIdx.x == 0) kvq_q16_round_query(qh, a.d);
        __syncthreads();
    }
    float *row = sc.S + ((size_t)h * a.T + t) * sc.n_vis;     /* [n_vis] */
    const int64_t end = flash_end(a, t);
    for (int64_t i = threadIdx.x; i < sc.n_vis; i += blockDim.x) {
        const int64_t k = a.k_begin + i;
        float s = -INFINITY;
        if (k < end) {
            const int64_t r = kv_view_row(&kv.kh, k);
            float dot = 0.0f;
            for (int c = 0; c < a.d; c++) dot += qh[c] * kv_ld(kv.kh, kv.kf, k, r, c);
            s = dot * a.scale;
        }
        row[i] = s;
    }
}

/* Block (t, h): the row's max, then exp(s - max) in place and their sum (0 for a row that
 * sees no key: every entry -inf becomes 0). The division is left to P V. */
__global__ void flash_softmax_kernel_v1(flash_args a, flash_scores sc)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] block reduction scratch */
    const int t = blockIdx.x, h = blockIdx.y;
    float *row = sc.S + ((size_t)h * a.T + t) * sc.n_vis; /* [n_vis] */
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < sc.n_vis; i += blockDim.x) m = fmaxf(m, row[i]);
    m = kv_block_max(m, red);
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < sc.n_vis; i += blockDim.x) {
        const float p = m == -INFINITY ? 0.0f : expf(row[i] - m);
        row[i] = p;
        sum += p;
    }
    sum = kv_block_sum(sum, red);
    if (threadIdx.x == 0) sc.rowsum[(size_t)h * a.T + t] = sum;
}

/* Block (t, h): out = (P V) / sum over the visible keys, thread i taking output dim i. */
__global__ void flash_pv_kernel_v1(flash_args a, flash_scores sc)
{
    const int t = blockIdx.x, h = blockIdx.y, G = a.H / a.H_kv;
    const flash_kv kv = flash_views(a, h / G);
    const float *row = sc.S + ((size_t)h * a.T + t) * sc.n_vis; /* [n_vis] */
    const float sum = sc.rowsum[(size_t)h * a.T + t];
    float *oh = a.out + ((size_t)t * a.H + h) * a.d;             /* [d] */
    const int64_t end = flash_end(a, t);
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
        float acc = 0.0f;
        for (int64_t k = a.k_begin; k < end; k++)
            acc += row[k - a.k_begin] * kv_ld(kv.vh, kv.vf, k, kv_view_row(&kv.vh, k), c);
        oh[c] = sum > 0.0f ? acc / sum : 0.0f;
    }
}

/* ---- v2, v3, v4: the fused body --------------------------------------------------------- */

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

static size_t flash_smem_bytes(int R, int d, int BK)
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

/* Rows' queries into shared memory: row r <- q_row(r) [d], zeros for r >= n (unused rows);
 * rounded (thread r, row r) where int8 keys meet them (kv_int_keys()). Barriers inside. */
__device__ inline void flash_load_rows(const flash_smem &sm, const flash_args &a,
                                       const flash_kv &kv, const float *q0, size_t stride,
                                       int n, int R, int d)
{
    for (int e = threadIdx.x; e < R * d; e += blockDim.x) {
        const int r = e / d, i = e % d;
        sm.qs[(size_t)r * (d + 1) + i] = r < n ? q0[(size_t)r * stride + i] : 0.0f;
    }
    __syncthreads();
    if (kv_int_keys(kv.kh, a.src.rope_cs)) {
        for (int r = threadIdx.x; r < n; r += blockDim.x)
            kvq_q16_round_query(sm.qs + (size_t)r * (d + 1), d);
        __syncthreads();
    }
}

/* out row r (dims of this thread's pairs) = acc / l, zeros when the row saw no key. */
__device__ inline void flash_store_rows(const flash_smem &sm, const float *acc, float *o0,
                                        size_t stride, int n, int d)
{
    KV_UNROLL
    for (int c = 0; c < FLASH_ACC; c++) {
        const int e = threadIdx.x + c * blockDim.x;
        if (e < n * d) {
            const int r = e / d, i = e % d;
            o0[(size_t)r * stride + i] = sm.l[r] > 0.0f ? acc[c] / sm.l[r] : 0.0f;
        }
    }
}

/* Block (tile, h): queries tile·BQ .. tile·BQ + BQ - 1 of head h. */
__global__ void flash_kernel_v2(flash_args a, int BQ, int BK)
{
    KV_DYNAMIC_SMEM(unsigned char, base);
    const flash_smem sm = flash_carve(base, BQ, a.d, BK);
    const int t0 = blockIdx.x * BQ, h = blockIdx.y, G = a.H / a.H_kv;
    const int n = a.T - t0 < BQ ? a.T - t0 : BQ; /* queries of this tile */
    const flash_kv kv = flash_views(a, h / G);
    const size_t stride = (size_t)a.H * a.d; /* from one query's row of head h to the next */
    flash_load_rows(sm, a, kv, a.q + ((size_t)t0 * a.H + h) * a.d, stride, n, BQ, a.d);
    for (int r = threadIdx.x; r < BQ; r += blockDim.x) sm.end[r] = flash_end(a, t0 + r);
    __syncthreads();
    /* the last query sees the most keys: tiles past its end are skipped (causal) */
    float acc[FLASH_ACC];
    flash_rows(kv, sm, BQ, a.d, BK, a.k_begin, flash_end(a, t0 + n - 1), a.scale, acc);
    flash_store_rows(sm, acc, a.out + ((size_t)t0 * a.H + h) * a.d, stride, n, a.d);
}

/* The heads of the (query, KV head, chunk) a v3/v4 block computes: heads h0 .. h0 + n - 1. */
#define FLASH_GROUP_BLOCK(a, t, kvh_chunk, GC)                                                \
    const int G = (a).H / (a).H_kv, n_chunks = (G + (GC) - 1) / (GC);                         \
    const int kvh = (kvh_chunk) / n_chunks, chunk = (kvh_chunk) % n_chunks;                   \
    const int h0 = kvh * G + chunk * (GC);                                                    \
    const int n = G - chunk * (GC) < (GC) ? G - chunk * (GC) : (GC)

/* Block (t, kvh·n_chunks + chunk): query t's heads of the group (chunk), every visible key. */
__global__ void flash_kernel_v3(flash_args a, int GC, int BK)
{
    KV_DYNAMIC_SMEM(unsigned char, base);
    const flash_smem sm = flash_carve(base, GC, a.d, BK);
    const int t = blockIdx.x;
    FLASH_GROUP_BLOCK(a, t, blockIdx.y, GC);
    const flash_kv kv = flash_views(a, kvh);
    flash_load_rows(sm, a, kv, a.q + ((size_t)t * a.H + h0) * a.d, a.d, n, GC, a.d);
    const int64_t end = flash_end(a, t);
    for (int r = threadIdx.x; r < GC; r += blockDim.x) sm.end[r] = r < n ? end : a.k_begin;
    __syncthreads();
    float acc[FLASH_ACC];
    flash_rows(kv, sm, GC, a.d, BK, a.k_begin, end, a.scale, acc);
    flash_store_rows(sm, acc, a.out + ((size_t)t * a.H + h0) * a.d, a.d, n, a.d);
}

/* v4's partial results in the scratch: pm, pl [T][H][n_splits], pacc [T][H][n_splits][d]. */
typedef struct {
    float *pm, *pl, *pacc;
} flash_parts;

static flash_parts flash_parts_of(float *scratch, int T, int H, int n_splits)
{
    flash_parts p;
    const size_t n = (size_t)T * H * n_splits;
    p.pm = scratch;
    p.pl = scratch + n;
    p.pacc = scratch + 2 * n;
    return p;
}

/* Block (t·(H_kv·n_chunks) + kvh·n_chunks + chunk, split): v3's body over key range `split`,
 * left unnormalized in the partial results. */
__global__ void flash_kernel_v4(flash_args a, flash_parts parts, int n_splits, int GC, int BK)
{
    KV_DYNAMIC_SMEM(unsigned char, base);
    const flash_smem sm = flash_carve(base, GC, a.d, BK);
    const int G0 = a.H / a.H_kv, per_t = a.H_kv * ((G0 + GC - 1) / GC);
    const int t = blockIdx.x / per_t, split = blockIdx.y;
    FLASH_GROUP_BLOCK(a, t, blockIdx.x % per_t, GC);
    const flash_kv kv = flash_views(a, kvh);
    /* this block's range, cut to what query t sees */
    const int64_t lo = a.k_begin + (int64_t)split * KVCU_FLASH_SPLIT_KEYS;
    const int64_t end = flash_end(a, t);
    const int64_t hi = lo + KVCU_FLASH_SPLIT_KEYS < end ? lo + KVCU_FLASH_SPLIT_KEYS : end;
    flash_load_rows(sm, a, kv, a.q + ((size_t)t * a.H + h0) * a.d, a.d, n, GC, a.d);
    for (int r = threadIdx.x; r < GC; r += blockDim.x) sm.end[r] = r < n ? hi : a.k_begin;
    __syncthreads();
    float acc[FLASH_ACC];
    flash_rows(kv, sm, GC, a.d, BK, lo, hi, a.scale, acc); /* lo >= hi: no tile, empty parts */
    const size_t p0 = ((size_t)t * a.H + h0) * n_splits + split; /* head h0's entry */
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        parts.pm[p0 + (size_t)r * n_splits] = sm.m[r];
        parts.pl[p0 + (size_t)r * n_splits] = sm.l[r];
    }
    KV_UNROLL
    for (int c = 0; c < FLASH_ACC; c++) {
        const int e = threadIdx.x + c * blockDim.x;
        if (e < n * a.d) {
            const int r = e / a.d, i = e % a.d;
            parts.pacc[(p0 + (size_t)r * n_splits) * a.d + i] = acc[c];
        }
    }
}

/* Block (t, h): out = sum_j acc_j e^(m_j - M) / sum_j l_j e^(m_j - M), M = max_j m_j, in
 * range order; zeros when every range was empty (M = -inf). */
__global__ void flash_merge_kernel(flash_args a, flash_parts parts, int n_splits)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t p0 = ((size_t)t * a.H + h) * n_splits; /* [n_splits] of this head */
    float *oh = a.out + ((size_t)t * a.H + h) * a.d;    /* [d] */
    float M = -INFINITY;
    for (int j = 0; j < n_splits; j++) M = fmaxf(M, parts.pm[p0 + j]);
    float L = 0.0f;
    if (M != -INFINITY)
        for (int j = 0; j < n_splits; j++) L += parts.pl[p0 + j] * expf(parts.pm[p0 + j] - M);
    for (int i = threadIdx.x; i < a.d; i += blockDim.x) {
        float acc = 0.0f;
        if (M != -INFINITY)
            for (int j = 0; j < n_splits; j++)
                acc += parts.pacc[(p0 + j) * a.d + i] * expf(parts.pm[p0 + j] - M);
        oh[i] = L > 0.0f ? acc / L : 0.0f;
    }
}

/* ---- host side ---------------------------------------------------------------------------- */

/* Rows of a v3/v4 block: the whole group when its accumulators fit the registers. */
static int flash_group_rows(int G, int d)
{
    int gc = FLASH_THREADS * FLASH_ACC / d;
    if (gc > FLASH_THREADS) gc = FLASH_THREADS;
    return G < gc ? G : gc;
}

/* Queries per v2 tile. */
static int flash_tile_rows(int d)
{
    const int bq = FLASH_THREADS * FLASH_ACC / d;
    return bq < FLASH_MAX_BQ ? bq : FLASH_MAX_BQ;
}

/* Keys per tile: the most (64 down to 1) whose tiles fit 48 KiB of shared memory with R rows. */
static int flash_tile_keys(int R, int d)
{
    int bk = 64;
    while (bk > 1 && flash_smem_bytes(R, d, bk) > FLASH_SMEM_MAX) bk /= 2;
    return bk;
}

/* Keys any query of the job may see: n_keys - k_begin, or 0. */
static int64_t flash_n_vis(const kvcu_flash_job *j)
{
    return j->n_keys > j->k_begin ? j->n_keys - j->k_begin : 0;
}

static int flash_splits(const kvcu_flash_job *j)
{
    const int64_t n = flash_n_vis(j);
    return n == 0 ? 1 : (int)((n + KVCU_FLASH_SPLIT_KEYS - 1) / KVCU_FLASH_SPLIT_KEYS);
}

size_t kvcu_flash_scratch(int version, const kvcu_flash_job *j)
{
    if (!j || !j->c || j->T <= 0 || j->n_heads <= 0 || j->n_keys < 0) return 0;
    if (version == 1) return (size_t)j->n_heads * j->T * ((size_t)flash_n_vis(j) + 1);
    if (version == 4)
        return (size_t)j->T * j->n_heads * flash_splits(j) * ((size_t)j->c->head_dim + 2);
    return 0;
}

/* The checks of a job (the CPU's kv_flash_* refuse the same jobs). */
static int flash_check(int version, const kvcu_flash_job *j, kv_err *err)
{
    const char *who = "kvcu_flash_attention";
    if (version < 1 || version > 4)
        return kv_fail(err, KV_ERR_ARG, "%s: version %d (there are v1 to v4)", who, version);
    if (!j || !j->c)
        return kv_fail(err, KV_ERR_ARG, "%s: no job or no cache", who);
    const kvcu_cache *c = j->c;
    if (c->spec.window > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: the cache keeps a sliding window (W %d); "
                       "the chapter 08 kernels read full caches only", who, c->spec.window);
    if (j->layer < 0 || j->layer >= c->n_layers || j->slot < 0 || j->slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: layer %d of %d, slot %d of %d", who, j->layer,
                       c->n_layers, j->slot, c->spec.n_slots);
    if (j->n_heads <= 0 || j->n_heads % c->n_kv_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: H %d is not a multiple of H_kv %d", who,
                       j->n_heads, c->n_kv_heads);
    if (j->T < 0 || (j->T > 0 && (!j->q || !j->out)))
        return kv_fail(err, KV_ERR_ARG, "%s: T %d with q %p, out %p", who, j->T,
                       (const void *)j->q, (void *)j->out);
    if (j->k_begin < 0 || j->n_keys < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: k_begin %lld, n_keys %lld (neither may be "
                       "negative)", who, (long long)j->k_begin, (long long)j->n_keys);
    /* the rows the keys occupy must exist: the slot's capacity, or its mapped blocks */
    const int64_t rows = c->tables ? (int64_t)c->n_mapped[j->slot] * c->spec.block_size
                                   : (int64_t)c->spec.capacity;
    if (j->n_keys > rows)
        return kv_fail(err, KV_ERR_ARG, "%s: n_keys %lld but slot %d holds %lld rows%s", who,
                       (long long)j->n_keys, j->slot, (long long)rows,
                       c->tables ? " in its mapped blocks" : "");
    if (c->head_dim > FLASH_MAX_D)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: head dim %d (the tiles are sized for "
                       "d <= %d)", who, c->head_dim, FLASH_MAX_D);
    if (version == 1 && (int64_t)j->n_heads * j->T * flash_n_vis(j) > KVCU_FLASH_V1_MAX_SCORES)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: v1 would materialize %lld scores "
                       "(H %d x T %d x %lld keys), more than its limit of %lld; use v2-v4",
                       who, (long long)((int64_t)j->n_heads * j->T * flash_n_vis(j)), j->n_heads,
                       j->T, (long long)flash_n_vis(j), (long long)KVCU_FLASH_V1_MAX_SCORES);
    return KV_OK;
}

static flash_args flash_args_of(const kvcu_flash_job *j)
{
    flash_args a;
    memset(&a, 0, sizeof a);
    a.src = cache_src(j->c, j->layer);
    a.q = j->q;
    a.out = j->out;
    a.T = j->T;
    a.H = j->n_heads;
    a.H_kv = j->c->n_kv_heads;
    a.d = j->c->head_dim;
    a.slot = j->slot;
    a.q_pos0 = j->q_pos0;
    a.k_begin = j->k_begin;
    a.n_keys = j->n_keys;
    a.causal = j->causal;
    a.scale = 1.0f / sqrtf((float)a.d);
    return a;
}

/* Launch version @p version; the first launch error, else cudaSuccess. */
static cudaError_t flash_launch(int version, const kvcu_flash_job *j, float *scratch)
{
    const flash_args a = flash_args_of(j);
    const int G = a.H / a.H_kv;
    cudaError_t e = cudaSuccess;
    if (version == 1) {
        flash_scores sc;
        sc.n_vis = flash_n_vis(j);
        sc.S = scratch;
        sc.rowsum = scratch + (size_t)a.H * a.T * sc.n_vis;
        dim3 grid(a.T, a.H);
        KV_LAUNCH(flash_scores_kernel_v1, grid, FLASH_THREADS, (size_t)a.d * sizeof(float), 0,
                  a, sc);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        KV_LAUNCH(flash_softmax_kernel_v1, grid, FLASH_THREADS, KV_WARP * sizeof(float), 0, a,
                  sc);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        KV_LAUNCH(flash_pv_kernel_v1, grid, FLASH_THREADS, 0, 0, a, sc);
        return cudaGetLastError();
    }
    if (version == 2) {
        const int BQ = flash_tile_rows(a.d), BK = flash_tile_keys(BQ, a.d);
        dim3 grid(kv_ceil_div(a.T, BQ), a.H);
        KV_LAUNCH(flash_kernel_v2, grid, FLASH_THREADS, flash_smem_bytes(BQ, a.d, BK), 0, a, BQ,
                  BK);
        return cudaGetLastError();
    }
    const int GC = flash_group_rows(G, a.d), BK = flash_tile_keys(GC, a.d);
    const int per_t = a.H_kv * (int)kv_ceil_div(G, GC); /* blocks of one query */
    const size_t smem = flash_smem_bytes(GC, a.d, BK);
    if (version == 3) {
        dim3 grid(a.T, per_t);
        KV_LAUNCH(flash_kernel_v3, grid, FLASH_THREADS, smem, 0, a, GC, BK);
        return cudaGetLastError();
    }
    const int n_splits = flash_splits(j);
    const flash_parts parts = flash_parts_of(scratch, a.T, a.H, n_splits);
    dim3 grid((unsigned)((int64_t)a.T * per_t), n_splits);
    KV_LAUNCH(flash_kernel_v4, grid, FLASH_THREADS, smem, 0, a, parts, n_splits, GC, BK);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    dim3 grid2(a.T, a.H);
    KV_LAUNCH(flash_merge_kernel, grid2, FLASH_THREADS, 0, 0, a, parts, n_splits);
    return cudaGetLastError();
}

/* cudaMalloc as a status. A failed allocation is also recorded as the runtime's last error;
 * it is cleared here, or the next launch check would report it again. */
static int flash_alloc(void **p, size_t bytes, kv_err *err)
{
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) (void)cudaGetLastError();
    KV_CUDA_TRY(e, err);
    return KV_OK;
}

int kvcu_flash_attention(int version, const kvcu_flash_job *j, float *scratch, kv_err *err)
{
    int st = flash_check(version, j, err);
    if (st) return st;
    if (j->T == 0) return KV_OK;
    if (version == 4 && (int64_t)j->T * j->c->n_kv_heads *
                                kv_ceil_div(j->n_heads / j->c->n_kv_heads,
                                            flash_group_rows(j->n_heads / j->c->n_kv_heads,
                                                             j->c->head_dim)) >= ((int64_t)1 << 31))
        return kv_fail(err, KV_ERR_ARG, "kvcu_flash_attention: v4 grid too large (T %d)", j->T);
    if (flash_splits(j) > 65535)
        return kv_fail(err, KV_ERR_ARG, "kvcu_flash_attention: %lld keys need more than 65535 "
                       "ranges of %d", (long long)(j->n_keys - j->k_begin), KVCU_FLASH_SPLIT_KEYS);
    const size_t need = kvcu_flash_scratch(version, j);
    float *own = NULL; /* the scratch, when the caller gave none */
    if (need && !scratch) {
        st = flash_alloc((void **)&own, need * sizeof(float), err);
        if (st) return st;
        scratch = own;
    }
    cudaError_t e = flash_launch(version, j, scratch);
    cudaError_t f = own ? cudaFree(own) : cudaSuccess; /* cudaFree waits for the kernels */
    KV_CUDA_TRY(e, err);
    KV_CUDA_TRY(f, err);
    return KV_OK;
}

/* ---- bytes moved, kv_flash.c's formulas on the kernels' work split -------------------------- */

/* Bytes of stored rows [a, b) of one KV head of the job's layer and slot: d·b per row, or
 * 4·d for a row still in KIVI's fp32 window (rows >= the slot's quantized count). */
static double flash_rows_bytes(const kvcu_flash_job *j, int64_t a, int64_t b)
{
    if (b <= a) return 0.0;
    const kvcu_cache *c = j->c;
    const int fmt = c->fmt[j->layer], d = c->head_dim;
    const int64_t q = kvq_is_kivi(fmt) ? c->qlen[(size_t)j->layer * c->spec.n_slots + j->slot]
                                       : b;
    const int64_t mid = q < a ? a : q > b ? b : q; /* [a, mid) quantized, [mid, b) fp32 */
    return (double)(mid - a) * kv_dtype_bytes_d(fmt, d) * d + (double)(b - mid) * 4.0 * d;
}

/* Host twin of flash_end(). */
static int64_t flash_end_host(const kvcu_flash_job *j, int t)
{
    int64_t e = j->n_keys;
    if (j->causal && j->q_pos0 + t + 1 < e) e = j->q_pos0 + t + 1;
    return e > j->k_begin ? e : j->k_begin;
}

int kvcu_flash_bytes(int version, const kvcu_flash_job *j, kv_flash_stats *st, kv_err *err)
{
    int s = flash_check(version, j, err);
    if (s) return s;
    memset(st, 0, sizeof *st);
    const int H = j->n_heads, Hkv = j->c->n_kv_heads, G = H / Hkv, d = j->c->head_dim, T = j->T;
    const int64_t n_vis = flash_n_vis(j);
    double kv = 0.0;
    st->q_bytes = (int64_t)T * H * d * 4;
    st->out_bytes = (int64_t)T * H * d * 4;
    if (version == 1) {
        kv = (double)H * 2.0 * flash_rows_bytes(j, j->k_begin, j->n_keys);
        st->score_bytes = 5 * (int64_t)H * T * n_vis * 4;
    } else if (version == 2) {
        const int BQ = flash_tile_rows(d), BK = flash_tile_keys(BQ, d);
        const int64_t all_tiles = (n_vis + BK - 1) / BK;
        for (int t0 = 0; t0 < T; t0 += BQ) {
            const int t1 = T - t0 < BQ ? T : t0 + BQ;
            const int64_t e = flash_end_host(j, t1 - 1), done = (e - j->k_begin + BK - 1) / BK;
            kv += (double)H * 2.0 * flash_rows_bytes(j, j->k_begin, e);
            st->tiles_done += H * done;
            st->tiles_skipped += H * (all_tiles - done);
        }
    } else { /* v3 and v4: each (query, KV head, chunk of the group) reads its visible keys */
        const int GC = flash_group_rows(G, d), BK = flash_tile_keys(GC, d);
        const int64_t blocks = (int64_t)Hkv * kv_ceil_div(G, GC); /* per query */
        for (int t = 0; t < T; t++) {
            const int64_t e = flash_end_host(j, t);
            kv += (double)blocks * 2.0 * flash_rows_bytes(j, j->k_begin, e);
            st->tiles_done += blocks * ((e - j->k_begin + BK - 1) / BK);
        }
        if (version == 4)
            st->out_bytes = (int64_t)H * T * (2 * (int64_t)flash_splits(j) * (d + 2) + d) * 4;
    }
    st->kv_bytes = (int64_t)llround(kv);
    return KV_OK;
}

/* ---- timing ---------------------------------------------------------------------------------- */

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Median of @p repeats event-timed runs of fn(arg) after one warm-up; 0 or a status. */
typedef int (*flash_timed_fn)(void *arg, kv_err *err);

static int time_events(flash_timed_fn fn, void *arg, int repeats, double *seconds, kv_err *err)
{
    if (repeats < 1)
        return kv_fail(err, KV_ERR_ARG, "timing: repeats %d (at least 1)", repeats);
    double *t = (double *)malloc((size_t)repeats * sizeof(double));
    if (!t) return kv_fail(err, KV_ERR_NOMEM, "timing: %d repeats", repeats);
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t ce = cudaEventCreate(&e0);
    if (ce == cudaSuccess) ce = cudaEventCreate(&e1);
    int st = ce == cudaSuccess ? fn(arg, err) : KV_OK; /* warm-up */
    for (int r = 0; r < repeats && ce == cudaSuccess && !st; r++) {
        float ms = 0.0f;
        ce = cudaEventRecord(e0, 0);
        if (ce == cudaSuccess) st = fn(arg, err);
        if (ce == cudaSuccess && !st) ce = cudaEventRecord(e1, 0);
        if (ce == cudaSuccess && !st) ce = cudaEventSynchronize(e1);
        if (ce == cudaSuccess && !st) ce = cudaEventElapsedTime(&ms, e0, e1);
        t[r] = ms * 1e-3;
    }
    if (ce == cudaSuccess && !st) {
        qsort(t, (size_t)repeats, sizeof(double), cmp_double);
        *seconds = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    }
    free(t);
    cudaError_t d0 = e0 ? cudaEventDestroy(e0) : cudaSuccess;
    cudaError_t d1 = e1 ? cudaEventDestroy(e1) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(ce, err);
    KV_CUDA_TRY(d0, err);
    KV_CUDA_TRY(d1, err);
    return KV_OK;
}

typedef struct {
    int version;
    const kvcu_flash_job *j;
    float *scratch;
} flash_call;

static int flash_call_fn(void *arg, kv_err *err)
{
    const flash_call *c = (const flash_call *)arg;
    return kvcu_flash_attention(c->version, c->j, c->scratch, err);
}

int kvcu_flash_time(int version, const kvcu_flash_job *j, float *scratch, int repeats,
                    double *seconds, kv_err *err)
{
    int st = flash_check(version, j, err);
    if (st) return st;
    const size_t need = kvcu_flash_scratch(version, j);
    float *own = NULL; /* allocated once here, so cudaMalloc is not what is timed */
    if (need && !scratch) {
        st = flash_alloc((void **)&own, need * sizeof(float), err);
        if (st) return st;
        scratch = own;
    }
    flash_call c = {version, j, scratch};
    st = time_events(flash_call_fn, &c, repeats, seconds, err);
    cudaError_t f = own ? cudaFree(own) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(f, err);
    return KV_OK;
}

/* Each thread sums float4s with a grid stride; the block's sum goes to sink[block] so the
 * loads cannot be optimized away. */
__global__ void read_bandwidth_kernel(const float4 *x, size_t n, float *sink)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] */
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        s += (v.x + v.y) + (v.z + v.w);
    }
    s = kv_block_sum(s, red);
    if (threadIdx.x == 0) sink[blockIdx.x] = s;
}

typedef struct {
    const float4 *x;
    size_t n;
    float *sink;
    int blocks;
} read_call;

static int read_call_fn(void *arg, kv_err *err)
{
    const read_call *c = (const read_call *)arg;
    KV_LAUNCH(read_bandwidth_kernel, c->blocks, 256, KV_WARP * sizeof(float), 0, c->x, c->n,
              c->sink);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_read_bandwidth(size_t bytes, int repeats, double *bytes_per_s, kv_err *err)
{
    if (bytes == 0) bytes = (size_t)1 << 30;
    const size_t n = bytes / sizeof(float4);
    if (n == 0) return kv_fail(err, KV_ERR_ARG, "kvcu_read_bandwidth: %zu bytes", bytes);
    int sms = 0;
    KV_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), err);
    read_call c;
    c.n = n;
    c.blocks = (sms > 0 ? sms : 1) * 8;
    float4 *x = NULL;
    float *sink = NULL;
    int st = flash_alloc((void **)&x, n * sizeof(float4), err);
    if (st) return st;
    st = flash_alloc((void **)&sink, (size_t)c.blocks * sizeof(float), err);
    cudaError_t ce = st ? cudaSuccess : cudaMemset(x, 0, n * sizeof(float4));
    double sec = 0.0;
    if (!st && ce == cudaSuccess) {
        c.x = x;
        c.sink = sink;
        st = time_events(read_call_fn, &c, repeats, &sec, err);
    }
    cudaError_t f0 = cudaFree(x), f1 = sink ? cudaFree(sink) : cudaSuccess;
    if (st) return st;
    KV_CUDA_TRY(ce, err);
    KV_CUDA_TRY(f0, err);
    KV_CUDA_TRY(f1, err);
    *bytes_per_s = sec > 0.0 ? (double)(n * sizeof(float4)) / sec : 0.0;
    return KV_OK;
}
