/*
 * Chapter 08 on the GPU: the optimization progression of the one attention family, twin of
 * reference_cpu/attention/kv_flash.c, in numbered versions as llm.c's dev/cuda has them: each
 * paragraph below says what changed from the version before; tests/test_gpu_flash.c holds
 * every version against the CPU reference (kv_flash_naive()) and `kvlab bench attention
 * --device cuda` times them (cuda/eval/kvcu_bench.cu). A job is T queries of one cache slot
 * (positions q_pos0 + t); query t sees keys k_begin <= k < n_keys and, when causal,
 * k <= q_pos0 + t; a query that sees no key outputs zeros. The job's queries are the
 * attention family's rows (attn_rows, flash_args_of()); query head h reads KV head
 * kv_attn_kv_head(h) = h / G. Every version reads K and V through the readers of
 * cuda/core/kvcu_internal.cuh (attn_view(), kv_ld(): contiguous or paged rows, every storage
 * format dequantized inside the loads), the engine's readers (cuda/attention/kvcu_attention.cu).
 *
 * v1, naive (flash_scores_kernel_v1, flash_softmax_kernel_v1, flash_pv_kernel_v1): the
 *   textbook formula in three kernels. Scores S = q·k / sqrt(d) for every (head, query,
 *   visible key) go to global memory, [H][T][n_vis] floats (n_vis = n_keys - k_begin; masked
 *   keys -inf); a softmax kernel reads each row for its max, then rewrites it as exp(s - max)
 *   and sums it; the P·V kernel reads P once more and divides. The scores cost 5·4·H·T·n_vis
 *   bytes (kv_flash.c's count for kv_flash_naive), which at prefill dwarfs the cache. Each
 *   (query, head) block reads the K rows, then the V rows, its query sees: at prefill the
 *   cache is re-read once per query, where kv_flash_naive() reads each row once per head (at
 *   decode, T = 1, the two counts agree). The wrapper refuses jobs of more than
 *   KVCU_FLASH_V1_MAX_SCORES scores.
 *
 * v2, fused tiled prefill (flash_kernel_v2): S never leaves the chip. One block per (tile of
 *   BQ queries, query head) keeps its queries in shared memory and walks the keys BK at a
 *   time: a tile's K and V rows are read once into shared memory, the BQ x BK scores formed
 *   there, and each query row keeps a running max m, a running sum l of exp(s - m) and an
 *   unnormalized accumulator acc, rescaled by exp(m_old - m_new) when a tile raises the max;
 *   one division at the end. m and l live in the registers of the row's lanes (warp
 *   shuffles), acc in those of the threads owning its (row, dim) pairs (flash_rows(), the
 *   body v3 and v4 reuse). Key tiles in the causal future of the block's last query are
 *   skipped. FlashAttention-2's split: queries are the parallel dimension, each block owns
 *   its output rows, no merge. Each head of a group re-reads its KV head's rows.
 *
 * v3, decode (flash_kernel_v3): the rows of a block become the G query heads of one KV group
 *   instead of a tile of queries, so each K/V tile is read once for all G heads (chapter 03's
 *   grouping, attn_decode_kernel_v2, with v2's online softmax in place of its score array): a
 *   decode step reads H_kv·n·d·2·b bytes, G times fewer than v2. Groups whose accumulators do
 *   not fit the registers (G·d > 4096) run as several blocks of up to 4096 / d heads.
 *
 * v4, split-KV (flash_kernel_v3 over ranges + attn_merge_kernel): v3 gives a decode step
 *   only H_kv blocks, each walking the whole context alone, on a GPU of 100+ SMs. v4 launches
 *   v3's kernel once per range of KVCU_FLASH_SPLIT_KEYS (512) keys, the ranges the engine's
 *   split-KV decode cuts (attn_split_span()); each block leaves its heads' partial state
 *   (m_j, l_j, acc_j) in the scratch, and the engine's merge kernel (kvcu_attention.cu)
 *   combines each head's ranges: M = max_j m_j, out = sum_j acc_j e^(m_j - M) /
 *   sum_j l_j e^(m_j - M) (kv_flash_merge() on the CPU). Same K/V bytes as v3, plus the
 *   partials, 2·(d + 2) floats per (query, head, range); a 32k-key decode with H_kv = 8 runs
 *   as 8·64 = 512 blocks instead of 8. There is one split-KV and one merge on the GPU: v4 is
 *   the engine's (kvcu_attention() v3) with chapter 08's online body in each range.
 *
 * v5 and v6, the same tiles on tensor cores: kvcu_flash_mma.cu and kvcu_flash_v6.cu describe
 *   them (v6 is v5 with 32 rows a warp, the longest query tiles first and int8 / fp8 tiles
 *   converted once to fp16); both are held to the CPU by the bound of their 16-bit roundings.
 *
 * None of the versions is bit-identical to the CPU (another summation order; the tests use
 * the fp32 tolerance). Windowed caches (chapter 06) are refused, as on the CPU.
 */
#include <stdlib.h>
#include <string.h>

#include "kvcu_flash.cuh"

#define FLASH_THREADS 128
#define FLASH_MAX_BQ 16            /* v2: queries per tile */
#define FLASH_MAX_D 1024           /* head dims the tiles are sized for */
#define FLASH_SMEM_MAX (48 * 1024) /* default dynamic shared memory per block */

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
    const int t = blockIdx.x, h = blockIdx.y;
    const flash_kv kv = flash_views(a, kv_attn_kv_head(h, a.H, a.src.n_kv_heads));
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
    const int t = blockIdx.x, h = blockIdx.y;
    const flash_kv kv = flash_views(a, kv_attn_kv_head(h, a.H, a.src.n_kv_heads));
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
    const int t0 = blockIdx.x * BQ, h = blockIdx.y;
    const int n = a.T - t0 < BQ ? a.T - t0 : BQ; /* queries of this tile */
    const flash_kv kv = flash_views(a, kv_attn_kv_head(h, a.H, a.src.n_kv_heads));
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
    const int G = kv_heads_group((a).H, (a).src.n_kv_heads);                                  \
    const int n_chunks = (G + (GC) - 1) / (GC);                                               \
    const int kvh = (kvh_chunk) / n_chunks, chunk = (kvh_chunk) % n_chunks;                   \
    const int h0 = kvh * G + chunk * (GC);                                                    \
    const int n = G - chunk * (GC) < (GC) ? G - chunk * (GC) : (GC)

/* Block (t·per_t + kvh·n_chunks + chunk, part), per_t = H_kv·n_chunks: query t's heads of
 * the group (chunk). v3 (parts.po NULL, one part): every key the query sees, normalized into
 * out. v4: the keys of range `part` (attn_split_span(), the engine's ranges), left
 * unnormalized as the partial state (m, l, acc) of each head that attn_merge_kernel merges. */
__global__ void flash_kernel_v3(flash_args a, attn_parts parts, int GC, int BK)
{
    KV_DYNAMIC_SMEM(unsigned char, base);
    const flash_smem sm = flash_carve(base, GC, a.d, BK);
    const int Hkv = a.src.n_kv_heads, G0 = kv_heads_group(a.H, Hkv);
    const int per_t = Hkv * ((G0 + GC - 1) / GC);
    const int t = blockIdx.x / per_t, part = blockIdx.y;
    FLASH_GROUP_BLOCK(a, t, blockIdx.x % per_t, GC);
    const attn_span row = attn_span_of(a.src, a.rows, t);
    int64_t lo = row.p0, hi = row.p1; /* this block's keys */
    if (parts.po && !attn_split_span(row, part, &lo, &hi)) return; /* the merge skips it */
    const flash_kv kv = flash_views(a, kvh);
    flash_load_rows(sm, a, kv, a.q + ((size_t)t * a.H + h0) * a.d, a.d, n, GC, a.d);
    for (int r = threadIdx.x; r < GC; r += blockDim.x) sm.end[r] = r < n ? hi : a.k_begin;
    __syncthreads();
    float acc[FLASH_ACC];
    flash_rows(kv, sm, GC, a.d, BK, lo, hi, a.scale, acc);
    if (!parts.po) {
        flash_store_rows(sm, acc, a.out + ((size_t)t * a.H + h0) * a.d, a.d, n, a.d);
        return;
    }
    const size_t p0 = ((size_t)t * a.H + h0) * parts.n_parts + part; /* head h0's entry */
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        parts.pm[p0 + (size_t)r * parts.n_parts] = sm.m[r];
        parts.pl[p0 + (size_t)r * parts.n_parts] = sm.l[r];
    }
    KV_UNROLL
    for (int c = 0; c < FLASH_ACC; c++) {
        const int e = threadIdx.x + c * blockDim.x;
        if (e < n * a.d) {
            const int r = e / a.d, i = e % a.d;
            parts.po[(p0 + (size_t)r * parts.n_parts) * a.d + i] = acc[c];
        }
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

/* v4's ranges (the scratch keeps at least one). */
static int flash_splits(const kvcu_flash_job *j)
{
    const int n = attn_n_splits(flash_n_vis(j));
    return n > 0 ? n : 1;
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
    if (version < 1 || version > 6)
        return kv_fail(err, KV_ERR_ARG, "%s: version %d (there are v1 to v6)", who, version);
    if (!j || !j->c)
        return kv_fail(err, KV_ERR_ARG, "%s: no job or no cache", who);
    const kvcu_cache *c = j->c;
    if (c->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: the cache keeps a sliding window (W %d); "
                       "the chapter 08 kernels read full caches only", who, c->spec.window.size);
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
    const int64_t rows = c->tables ? (int64_t)c->n_mapped[j->slot] * c->spec.layout.block_size
                                   : (int64_t)c->spec.capacity;
    if (j->n_keys > rows)
        return kv_fail(err, KV_ERR_ARG, "%s: n_keys %lld but slot %d holds %lld rows%s", who,
                       (long long)j->n_keys, j->slot, (long long)rows,
                       c->tables ? " in its mapped blocks" : "");
    if (c->head_dim > FLASH_MAX_D)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: head dim %d (the tiles are sized for "
                       "d <= %d)", who, c->head_dim, FLASH_MAX_D);
    if (version >= 5 && !kvcu_flash_mma_fits(j->n_heads, c->n_kv_heads, c->head_dim))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: v%d (tensor cores) takes head dims that "
                       "are multiples of 16 up to 128 and groups of up to 64 heads (d %d, "
                       "G %d)", who, version, c->head_dim,
                       kv_heads_group(j->n_heads, c->n_kv_heads));
    if (version >= 5 && !kvcu_has_mma())
        return kvcu_fail_arch(err, who, "the tensor cores v5 and v6 run on (mma.sync.m16n8k16 "
                              "with fp32 accumulators)", KVCU_SM_MMA);
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
    a.d = j->c->head_dim;
    a.slot = j->slot;
    a.k_begin = j->k_begin;
    /* query t at q_pos0 + t when causal (it sees up to itself), else every query as if at
     * n_keys - 1; keys from k_begin, never past n_keys */
    const attn_rows rows = {NULL, NULL, NULL, j->slot, j->causal ? 1 : 0,
                            j->causal ? j->q_pos0 : j->n_keys - 1, j->k_begin, j->n_keys};
    a.rows = rows;
    a.scale = 1.0f / sqrtf((float)a.d);
    return a;
}

/* Launch version @p version; the first launch error, else cudaSuccess. */
static cudaError_t flash_launch(int version, const kvcu_flash_job *j, float *scratch)
{
    const flash_args a = flash_args_of(j);
    const int G = kv_heads_group(a.H, a.src.n_kv_heads);
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
    if (version == 5) return kvcu_flash_mma_launch(a);
    if (version == 6) return kvcu_flash_v6_launch(a);
    if (version == 2) {
        const int BQ = flash_tile_rows(a.d), BK = flash_tile_keys(BQ, a.d);
        dim3 grid(kv_ceil_div(a.T, BQ), a.H);
        KV_LAUNCH(flash_kernel_v2, grid, FLASH_THREADS, flash_smem_bytes(BQ, a.d, BK), 0, a, BQ,
                  BK);
        return cudaGetLastError();
    }
    const int GC = flash_group_rows(G, a.d), BK = flash_tile_keys(GC, a.d);
    const int per_t = a.src.n_kv_heads * (int)kv_ceil_div(G, GC); /* blocks of one query */
    const size_t smem = flash_smem_bytes(GC, a.d, BK);
    /* v3: one part, normalized in place; v4: the ranges, then the engine's merge */
    const int n_splits = version == 4 ? flash_splits(j) : 1;
    attn_parts parts = {NULL, NULL, NULL, 1};
    if (version == 4) parts = attn_parts_at(scratch, a.T, a.H, n_splits);
    dim3 grid((unsigned)((int64_t)a.T * per_t), n_splits);
    KV_LAUNCH(flash_kernel_v3, grid, FLASH_THREADS, smem, 0, a, parts, GC, BK);
    if ((e = cudaGetLastError()) != cudaSuccess || version == 3) return e;
    kvcu_attn_merge_launch(a.out, a.src, a.rows, parts, a.T, a.H, a.d);
    return cudaGetLastError();
}

int kvcu_flash_attention(int version, const kvcu_flash_job *j, float *scratch, kv_err *err)
{
    int st = flash_check(version, j, err);
    if (st) return st;
    if (j->T == 0) return KV_OK;
    const int G = kv_heads_group(j->n_heads, j->c->n_kv_heads);
    if (version >= 3 && (int64_t)j->T * j->c->n_kv_heads *
                                kv_ceil_div(G, flash_group_rows(G, j->c->head_dim)) >=
                            ((int64_t)1 << 31))
        return kv_fail(err, KV_ERR_ARG, "kvcu_flash_attention: v%d grid too large (T %d)",
                       version, j->T);
    if (flash_splits(j) > 65535)
        return kv_fail(err, KV_ERR_ARG, "kvcu_flash_attention: %lld keys need more than 65535 "
                       "ranges of %d", (long long)(j->n_keys - j->k_begin), KVCU_FLASH_SPLIT_KEYS);
    const size_t need = kvcu_flash_scratch(version, j);
    float *own = NULL; /* the scratch, when the caller gave none */
    if (need && !scratch) {
        st = kvcu_device_alloc((void **)&own, need * sizeof(float), err);
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
    const int H = j->n_heads, Hkv = j->c->n_kv_heads, G = kv_heads_group(H, Hkv);
    const int d = j->c->head_dim, T = j->T;
    const int64_t n_vis = flash_n_vis(j);
    double kv = 0.0;
    st->q_bytes = (int64_t)T * H * d * 4;
    st->out_bytes = (int64_t)T * H * d * 4;
    if (version == 1) {
        /* a block per (query, head) in the scores and in the P V kernel, each reading the K
         * (then V) rows its query sees: at prefill every query re-reads its visible prefix,
         * where kv_flash_naive()'s loop (key outer, queries inner) reads a row once per head */
        for (int t = 0; t < T; t++)
            kv += (double)H * 2.0 * flash_rows_bytes(j, j->k_begin, flash_end_host(j, t));
        st->score_bytes = 5 * (int64_t)H * T * n_vis * 4;
    } else if (version == 2 || version >= 5) {
        /* v2: a block per (query tile, head); v5, v6: per (query tile, KV head), 64 keys a
         * tile (v6: 128 rows a block, 32 keys a tile past d 64) */
        const int BQ = version == 6   ? kvcu_flash_v6_queries(G)
                       : version == 5 ? kvcu_flash_mma_queries(G)
                                      : flash_tile_rows(d);
        const int BK = version == 6   ? kvcu_flash_v6_keys(d)
                       : version == 5 ? 64
                                      : flash_tile_keys(BQ, d);
        const int nh = version >= 5 ? Hkv : H;
        const int64_t all_tiles = (n_vis + BK - 1) / BK;
        for (int t0 = 0; t0 < T; t0 += BQ) {
            const int t1 = T - t0 < BQ ? T : t0 + BQ;
            const int64_t e = flash_end_host(j, t1 - 1), done = (e - j->k_begin + BK - 1) / BK;
            kv += (double)nh * 2.0 * flash_rows_bytes(j, j->k_begin, e);
            st->tiles_done += nh * done;
            st->tiles_skipped += nh * (all_tiles - done);
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
