/*
 * Decode attention on the GPU: the device side of the one attention family
 * (reference_cpu/attention/kv_attention.c). A query token at position pos reads cache positions
 * 0 .. pos of its sequence; query head h reads KV head h / G (G = H / H_kv: 1 is MHA,
 * H is MQA): kv_attn_kv_head() and kv_heads_group() of reference_cpu/core/kv_heads.h, the
 * lines the CPU runs.
 *
 * Versions 1 and 2 compute the CPU reference's three-pass softmax in fp32, scores in a global
 * scratch of [T][H][capacity] floats (32k tokens: 128 KiB per head, past shared memory):
 *   (1) scores q·k_p / sqrt(d), position p taken by thread p mod 128, and their max;
 *   (2) exp(score - max) and their sum (subtracting the max keeps expf from overflowing);
 *   (3) the weighted sum of values in position order, thread i taking output dim i,
 *       multiplied once by 1/sum.
 *
 * attn_decode_kernel_v1: one block per (query token, query head): a group of G heads reads the
 *   same K and V G times, H·N·d·2·b bytes per token per layer, whatever H_kv is.
 *
 * attn_decode_kernel_v2 (chapter 03): one block per (query token, KV head), the group's G query
 *   heads packed in shared memory; each thread loads a K row (pass 1) or a V element (pass 3)
 *   once for up to ATTN_GROUP_REGS heads in registers: G <= 8 heads read K and V once,
 *   H_kv·N·d·2·b bytes, G times fewer than v1; larger groups walk it in chunks of 8, re-reading
 *   the rows (mostly from L2). Per head the arithmetic is v1's, in v1's order. The group takes
 *   G·(d + 2) + 32 floats of shared memory; past 48 KiB (G·(d+2) > 12256, e.g. MQA with 96
 *   heads of d = 128) the launchers run v1 instead.
 *
 * attn_decode_kernel_v3 + attn_merge_kernel (chapter 05, flash-decoding): v2 gives one
 *   decode token H_kv blocks, far fewer than a GPU has multiprocessors, and each of them walks
 *   the whole context alone. v3 splits a token's positions into partitions of 512
 *   (KVCU_FLASH_SPLIT_KEYS), a block per (KV head, partition), which runs v2's three passes
 *   over its span but does not normalize: it writes its local max m_j, its exp-sum
 *   l_j = sum exp(s - m_j) and its unnormalized output o_j = sum exp(s - m_j) v. The merge
 *   kernel, one block per (token, query head), rescales the partitions to their common max
 *   M = max_j m_j:  out = (sum_j o_j e^(m_j - M)) / (sum_j l_j e^(m_j - M)). The same
 *   softmax summed in another order: not the CPU's bits (the tests allow the fp32 tolerance),
 *   but with one partition v2's by construction (v2's code, attn_group_span(), on v2's
 *   positions and threads; the merge multiplies by e^0 = 1 and divides as v2 does). Extra
 *   scratch: [T][H][n_parts][d + 2] floats of partition results. Chapter 08's v4
 *   (kvcu_flash.cu) cuts its keys into the same ranges (attn_split_span()) and ends here too.
 * Version 4 (cuda/attention/kvcu_decode.cu) is the engine's decode kernel: 16-byte loads,
 *   cp.async tiles, online softmax per range, ranges sized from the device; it ends in this
 *   merge. kvcu_attention() runs it on every layer it reads (every format and retention;
 *   kvcu_cache_decode_reads() names the shapes it does not), else v2 (one partition) or v3:
 *   never by the batch, so a row keeps its bits. Chapter 09's selected sets run it too
 *   (kvcu_attn_list_launch()); the merge then also leaves each listed position's weight.
 *   v1 to v3 stay as chapter 03's and chapter 08's numbered steps (kvcu_attn_decode_version(),
 *   kvcu_cache_attention_version()).
 *
 * Chapter 04: every version reads the cache through kv_head_view (kv_cache.h): an fp32 layer
 *   as plain floats, any other format by the per-element decode of kv_quant_math.h inline in
 *   the loops, the lines the CPU runs (or KIVI's fp32 window for its newest rows): no
 *   dequantized copy is written, the bytes read are the quantized ones. Per-token int8 keys
 *   meet the query rounded to 16-bit integers, as on the CPU (kv_attn_int_keys(); group_open()
 *   and v1 round it, kvq_q16_round_query()), multiplied in floats where the CPU takes the
 *   codes' integer dot product: within fp32 tolerance of the CPU.
 * Chapter 05: a paged cache's views (kv_cache_plane_view_paged()) find a row through the slot's
 *   block table, the math unchanged: paged and contiguous give the same bits.
 * Chapter 06 (sliding window + sinks, kv_window.h): every version's index p runs over the
 *   n = kv_window_count() positions the query retains, in position order (sinks, then window),
 *   reading logical row kv_window_row() of the i-th (pass 1 per strided index, pass 3 by
 *   kv_window_walk): the CPU's list; the scratch stride is the cache's span S+W. Under
 *   KV_POS_CACHE keys are stored before RoPE; key_ld() rotates each by its index with the CPU
 *   cache's cos/sin table and rotate_row()'s unfused arithmetic: the CPU's bits.
 *
 * kvcu_attn_decode() is the plain-array twin of kv_attn_decode() (v2); kvcu_attn_decode_version()
 * picks the version. kvcu_attention() runs a step's tokens over one layer of a kvcu_cache.
 */
#include <stdint.h>
#include <string.h>

#include "kvcu_internal.cuh"

#define ATTN_THREADS 128
#define ATTN_GROUP_REGS 8              /* v2, v3: query heads one thread applies a K/V load to */
#define ATTN_SMEM_MAX (48 * 1024)      /* default dynamic shared memory per block */

/* The cache readers (attn_src, attn_view(), kv_ld()) and the rows of a launch (attn_rows) are
 * in kvcu_internal.cuh: chapter 08's kernels (kvcu_flash.cu) use them too. */

/* v2's and v3's shared memory: the packed queries [G][d], the reduction scratch [32], each
 * head's max and exp-sum [G] + [G] */
static size_t group_smem(int group, int head_dim)
{
    return ((size_t)group * (head_dim + 2) + KV_WARP) * sizeof(float);
}

/* Chapter 06. The logical row of the i-th position a query at t retains (kv_window_pos(),
 * then kv_window_row()): i itself without a window. Pass 1 hands positions to threads with a
 * stride, so it asks for any i; pass 3 walks them in order (kv_window_walk, no division). */
__device__ inline int64_t attn_row(const attn_src &s, int64_t t, int64_t i)
{
    return kv_window_row(s.keep_w, s.keep_s, kv_window_pos(s.keep_w, s.keep_s, t, i));
}

/* A walk over the positions a query at t retains, started at the i0-th of them (v3's
 * partitions start mid-list): kv_window_walk_next() then continues from there. */
__device__ inline void attn_walk_from(kv_window_walk *k, const attn_src &s, int64_t t, int64_t i0)
{
    kv_window_walk_start(k, s.keep_w, s.keep_s, t);
    if (i0 > 0) {
        k->pos = kv_window_pos(s.keep_w, s.keep_s, t, i0);
        k->row = kv_window_row(s.keep_w, s.keep_s, k->pos);
    }
}

/* A launch's block t handles the row attn_span_of() names (kvcu_internal.cuh): token row tr
 * of slot `slot`, its query at tpos; n: how many positions it attends (t + 1, or
 * min(t + 1, S+W) with a window). The engine's rows start at index 0. */
#define ATTN_TOKEN(t)                                                                 \
    const attn_span row_ = attn_span_of(src, rows, (t));                                \
    const int tr = row_.tr, slot = row_.slot;                                         \
    const int64_t tpos = row_.tpos;                                                   \
    const int n = (int)row_.p1

__global__ void attn_decode_kernel_v1(float *out, const float *q, attn_src src, float *scores,
                                      attn_rows rows, int n_heads, int head_dim, int stride)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] block reduction scratch, then the query [d] */
    const int h = blockIdx.x, t = blockIdx.y;
    ATTN_TOKEN(t);
    const int kvh = kv_attn_kv_head(h, n_heads, src.n_kv_heads);
    const kv_head_view kh = attn_view(src, KV_QROLE_KEY, head_dim, slot, kvh);
    const kv_head_view vh = attn_view(src, KV_QROLE_VALUE, head_dim, slot, kvh);
    const float *kf = src.fmt == KV_QF_F32 ? (const float *)(const void *)kh.codes : NULL;
    const float *vf = src.fmt == KV_QF_F32 ? (const float *)(const void *)vh.codes : NULL;
    float *qh = red + KV_WARP; /* [d] the query, rounded where int8 keys meet it */
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
        qh[i] = q[((size_t)tr * n_heads + h) * head_dim + i];
    __syncthreads();
    if (kv_int_keys(kh, src.rope_cs)) {
        if (threadIdx.x == 0) kvq_q16_round_query(qh, head_dim);
        __syncthreads();
    }
    float *att = scores + ((size_t)t * n_heads + h) * stride;     /* [stride] */
    float *oh = out + ((size_t)tr * n_heads + h) * head_dim;      /* [d] */
    const float scale = 1.0f / sqrtf((float)head_dim);

    /* pass 1: scores and their max; p is the index in the retained list (the position
     * itself without a window) */
    float m = -INFINITY;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const int64_t lr = attn_row(src, tpos, p), r = kv_view_row(&kh, lr);
        const float *cs = attn_rope(src, p);
        float dot = 0.0f;
        for (int i = 0; i < head_dim; i++)
            dot += qh[i] * key_ld(kh, kf, lr, r, i, cs, src.rotary_dim);
        att[p] = dot * scale;
        m = fmaxf(m, att[p]);
    }
    m = kv_block_max(m, red);

    /* pass 2: exponentiate relative to the max, and sum */
    float sum = 0.0f;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        att[p] = expf(att[p] - m);
        sum += att[p];
    }
    sum = kv_block_sum(sum, red); /* its barriers also publish every att[p] to the block */

    /* pass 3: weighted sum of values, in position order, times 1/sum */
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float acc = 0.0f;
        kv_window_walk w;
        attn_walk_from(&w, src, tpos, 0);
        for (int p = 0; p < n; p++, kv_window_walk_next(&w))
            acc += att[p] * kv_ld(vh, vf, w.row, kv_view_row(&vh, w.row), i);
        oh[i] = acc * inv;
    }
}

/* A block's group: the G query heads of KV head kvh, as v2 and v3 hold it. Shared memory
 * (group_smem()): the packed queries, the reduction scratch and each head's max and exp-sum;
 * the views of the KV head's K and V rows. */
struct attn_group {
    int G, d;
    float *qs;            /* [G][d] the group's queries */
    float *red;           /* [32] block reduction scratch */
    float *mx, *l;        /* [G] each: each head's max and exp-sum */
    kv_head_view kh, vh;  /* KV head kvh's K and V rows in sequence slot `slot` */
    const float *kf, *vf; /* the same rows as plain floats when the cache is fp32, else NULL */
};

/* The group of KV head kvh for token row t (q [t][H][d]): shared memory carved, views
 * opened, the G queries copied in. Every thread of the block calls it (a barrier inside). */
__device__ inline attn_group group_open(float *smem, const attn_src &src, const float *q, int t,
                                        int slot, int kvh, int n_heads, int head_dim)
{
    attn_group a;
    a.G = kv_heads_group(n_heads, src.n_kv_heads);
    a.d = head_dim;
    a.qs = smem;
    a.red = smem + (size_t)a.G * head_dim;
    a.mx = a.red + KV_WARP;
    a.l = a.mx + a.G;
    a.kh = attn_view(src, KV_QROLE_KEY, head_dim, slot, kvh);
    a.vh = attn_view(src, KV_QROLE_VALUE, head_dim, slot, kvh);
    a.kf = src.fmt == KV_QF_F32 ? (const float *)(const void *)a.kh.codes : NULL;
    a.vf = src.fmt == KV_QF_F32 ? (const float *)(const void *)a.vh.codes : NULL;
    const float *qg = q + ((size_t)t * n_heads + (size_t)kvh * a.G) * head_dim; /* [G][d] */
    for (int i = threadIdx.x; i < a.G * head_dim; i += blockDim.x) a.qs[i] = qg[i];
    __syncthreads();
    if (kv_int_keys(a.kh, src.rope_cs)) { /* int8 keys meet the queries rounded: thread g, head g */
        for (int g = threadIdx.x; g < a.G; g += blockDim.x)
            kvq_q16_round_query(a.qs + (size_t)g * head_dim, head_dim);
        __syncthreads();
    }
    return a;
}

/*
 * The three passes of a group's G query heads over the retained positions p0 .. p1-1
 * (indices in the list a query at tpos sees): v2's body, and v3's for one partition.
 * att: the group's scores, [G][stride] indexed by list index. Per head g: its max goes to
 * a.mx[g], its exp-sum to a.l[g], and the weighted values to o + g·o_stride [d], divided by
 * the sum when @p normalize (v2) and left unnormalized otherwise (v3).
 */
static __device__ void attn_group_span(const attn_group &a, const attn_src &src, int64_t tpos,
                                float *att, int stride, int p0, int p1, float *o,
                                size_t o_stride, int normalize)
{
    const int G = a.G, head_dim = a.d;
    const float *qs = a.qs, *kf = a.kf, *vf = a.vf;
    const kv_head_view &kh = a.kh, &vh = a.vh;
    float *red = a.red, *mx = a.mx, *l = a.l;
    const float scale = 1.0f / sqrtf((float)head_dim);
    /* pass 1: scores of every head of the group; each K row is loaded once per chunk of
     * ATTN_GROUP_REGS heads and multiplied into each of them */
    for (int g0 = 0; g0 < G; g0 += ATTN_GROUP_REGS) {
        const int ng = G - g0 < ATTN_GROUP_REGS ? G - g0 : ATTN_GROUP_REGS;
        for (int p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
            const int64_t lr = attn_row(src, tpos, p);
            const int64_t r = kv_view_row(&kh, lr);
            const float *cs = attn_rope(src, p);
            float dot[ATTN_GROUP_REGS];
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++) dot[g] = 0.0f;
            for (int i = 0; i < head_dim; i++) {
                const float ki = key_ld(kh, kf, lr, r, i, cs, src.rotary_dim);
                KV_UNROLL
                for (int g = 0; g < ATTN_GROUP_REGS; g++)
                    if (g < ng) dot[g] += qs[(size_t)(g0 + g) * head_dim + i] * ki;
            }
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++)
                if (g < ng) att[(size_t)(g0 + g) * stride + p] = dot[g] * scale;
        }
    }

    /* pass 2, per head: max, then exponentiate and sum. A thread touches only the scores it
     * wrote itself; the reductions' barriers publish them to the block for pass 3. */
    for (int g = 0; g < G; g++) {
        float *ag = att + (size_t)g * stride;
        float m = -INFINITY;
        for (int p = p0 + threadIdx.x; p < p1; p += blockDim.x) m = fmaxf(m, ag[p]);
        m = kv_block_max(m, red);
        float sum = 0.0f;
        for (int p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
            ag[p] = expf(ag[p] - m);
            sum += ag[p];
        }
        sum = kv_block_sum(sum, red);
        if (threadIdx.x == 0) {
            mx[g] = m;
            l[g] = sum;
        }
    }
    __syncthreads();

    /* pass 3: weighted values in position order; each V element is loaded once per chunk
     * of heads */
    for (int g0 = 0; g0 < G; g0 += ATTN_GROUP_REGS) {
        const int ng = G - g0 < ATTN_GROUP_REGS ? G - g0 : ATTN_GROUP_REGS;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            float acc[ATTN_GROUP_REGS];
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++) acc[g] = 0.0f;
            kv_window_walk w;
            attn_walk_from(&w, src, tpos, p0);
            for (int p = p0; p < p1; p++, kv_window_walk_next(&w)) {
                const float vi = kv_ld(vh, vf, w.row, kv_view_row(&vh, w.row), i);
                KV_UNROLL
                for (int g = 0; g < ATTN_GROUP_REGS; g++)
                    if (g < ng) acc[g] += att[(size_t)(g0 + g) * stride + p] * vi;
            }
            /* an empty span (a selected set can be empty) gives zeros, not 0 / 0 */
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++)
                if (g < ng)
                    o[(size_t)(g0 + g) * o_stride + i] =
                        !normalize ? acc[g] : p1 > p0 ? acc[g] * (1.0f / l[g0 + g]) : 0.0f;
        }
    }
}

/* Block (kvh, t) computes query heads kvh·G .. kvh·G + G - 1 over all n positions. */
__global__ void attn_decode_kernel_v2(float *out, const float *q, attn_src src, float *scores,
                                      attn_rows rows, int n_heads, int head_dim, int stride)
{
    KV_DYNAMIC_SMEM(float, smem);
    const int kvh = blockIdx.x, t = blockIdx.y;
    ATTN_TOKEN(t);
    const attn_group a = group_open(smem, src, q, tr, slot, kvh, n_heads, head_dim);
    const int h0 = kvh * a.G;
    float *att = scores + ((size_t)t * n_heads + h0) * stride; /* [G][stride] */
    float *oh = out + ((size_t)tr * n_heads + h0) * head_dim;  /* [G][d] */
    attn_group_span(a, src, tpos, att, stride, 0, n, oh, head_dim, 1);
}

/* Block (kvh, part, t): v2's passes over partition `part` of token t, unnormalized, into
 * the partition results that follow the scores [T][H][stride] in the same scratch. */
__global__ void attn_decode_kernel_v3(const float *q, attn_src src, float *scores, attn_rows rows,
                                      int T, int n_heads, int head_dim, int stride, int n_parts)
{
    KV_DYNAMIC_SMEM(float, smem);
    const int kvh = blockIdx.x, part = blockIdx.y, t = blockIdx.z;
    const attn_span r = attn_span_of(src, rows, t);
    int64_t lo, hi;
    if (!attn_split_span(r, part, &lo, &hi)) return; /* the token is shorter: the block leaves */
    const attn_parts pp =
        attn_parts_at(scores + (size_t)T * n_heads * stride, T, n_heads, n_parts);
    const attn_group a = group_open(smem, src, q, r.tr, r.slot, kvh, n_heads, head_dim);
    const int h0 = kvh * a.G;
    float *att = scores + ((size_t)t * n_heads + h0) * stride;     /* [G][stride] */
    const size_t ph = ((size_t)t * n_heads + h0) * n_parts + part; /* head h0's entry */
    attn_group_span(a, src, r.tpos, att, stride, (int)lo, (int)hi, pp.po + ph * head_dim,
                    (size_t)n_parts * head_dim, 0);
    for (int g = threadIdx.x; g < a.G; g += blockDim.x) {
        pp.pm[ph + (size_t)g * n_parts] = a.mx[g];
        pp.pl[ph + (size_t)g * n_parts] = a.l[g];
    }
}

/* Block (t, h): launch row t's query head h from the partial states of its ranges (those
 * attn_split_span() gives it), out = sum_j o_j e^(m_j - M) / sum_j l_j e^(m_j - M),
 * M = max_j m_j. The first range starts the sums (no 0 + x), so one range gives
 * o_0 · (1 / l_0): v2's bits. A row that sees no key (chapter 08's masked rows) gets zeros.
 * A selected set's row (rows.sel, chapter 09) also turns the scores v4 left in sel_att into
 * exp(s - M) and leaves L in sel_sums: the weights the methods' mass adds up. */
__global__ void attn_merge_kernel(float *out, attn_src src, attn_rows rows, attn_parts pp,
                                  int n_heads, int head_dim)
{
    const int t = blockIdx.x, h = blockIdx.y;
    const attn_span r = attn_span_kv(src, rows, t, rows.sel ? h / rows.sel_group : 0);
    const int np = r.p1 > r.p0 ? (int)((r.p1 - r.p0 + r.keys - 1) / r.keys) : 0;
    const size_t ph = ((size_t)t * n_heads + h) * pp.n_parts; /* [n_parts] of this head */
    const float *pm = pp.pm + ph, *pl = pp.pl + ph, *po = pp.po + ph * head_dim;
    float *oh = out + ((size_t)r.tr * n_heads + h) * head_dim; /* [d] */
    float *sa = rows.sel ? rows.sel_att + ((size_t)t * n_heads + h) * rows.sel_stride : NULL;
    float M = np > 0 ? pm[0] : -INFINITY;
    for (int j = 1; j < np; j++) M = fmaxf(M, pm[j]);
    if (M == -INFINITY) { /* no key, or (a row of one range) every score -inf */
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) oh[i] = 0.0f;
        for (int64_t i = threadIdx.x; sa && i < r.p1; i += blockDim.x) sa[i] = 0.0f;
        if (sa && threadIdx.x == 0) rows.sel_sums[(size_t)t * n_heads + h] = 0.0f;
        return;
    }
    float L = pl[0] * expf(pm[0] - M);
    for (int j = 1; j < np; j++) L += pl[j] * expf(pm[j] - M);
    const float inv = 1.0f / L;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float acc = po[i] * expf(pm[0] - M);
        for (int j = 1; j < np; j++) acc += po[(size_t)j * head_dim + i] * expf(pm[j] - M);
        oh[i] = acc * inv;
    }
    /* a selected set: its scores become the weights the mass kernel adds, exp(s - M) / L */
    for (int64_t i = threadIdx.x; sa && i < r.p1; i += blockDim.x) sa[i] = expf(sa[i] - M);
    if (sa && threadIdx.x == 0) rows.sel_sums[(size_t)t * n_heads + h] = L;
}

void kvcu_attn_merge_launch(float *out, const attn_src &src, const attn_rows &rows,
                            const attn_parts &parts, int T, int n_heads, int head_dim)
{
    KV_LAUNCH(attn_merge_kernel, dim3(T, n_heads), ATTN_THREADS, 0, 0, out, src, rows, parts,
              n_heads, head_dim);
}

static int check_heads(const char *who, int n_heads, int n_kv_heads, int head_dim, kv_err *err)
{
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: H %d, H_kv %d (must divide H), d %d", who, n_heads,
                       n_kv_heads, head_dim);
    return KV_OK;
}

/* v4 takes its partial states from the same scratch, or falls back to v3 */
static size_t scratch_floats(int T, int version, int n_heads, int head_dim, int stride)
{
    size_t f = (size_t)T * n_heads * stride, f4 = kvcu_decode_scratch(T, n_heads, head_dim, stride);
    if (version >= 3) f += (size_t)T * n_heads * attn_n_splits(stride) * (head_dim + 2);
    return version == 4 && f4 > f ? f4 : f;
}

size_t kvcu_attention_scratch(int T, int n_heads, int head_dim, int capacity)
{
    return scratch_floats(T, 4, n_heads, head_dim, capacity);
}

size_t kvcu_attn_decode_scratch(int version, int n_heads, int head_dim, int max_seq)
{
    return scratch_floats(1, version, n_heads, head_dim, max_seq);
}

/* The rows of an engine launch: a batch's tokens (tok_slot, tok_pos, row_of), or with
 * tok_slot NULL one query at position pos of slot `slot`; all from index 0. */
static attn_rows engine_rows(const int *tok_slot, const int *tok_pos, const int *row_of,
                             int slot, int64_t pos)
{
    attn_rows r = {tok_slot, tok_pos, row_of, slot, 0, pos, 0, INT64_MAX};
    return r;
}

/* Launch version @p version (1 to 4; 4 falls back to the engine's v2/v3 on a layer it does not
 * read, 2 and 3 to 1 when the group's shared memory would not fit) over T tokens whose longest
 * sees max_len positions. stride: positions per head of the scores scratch (>= max_len); v3's
 * partition results follow them. */
static void launch(int version, float *out, const float *q, const attn_src &src, float *scores,
                   const attn_rows &rows, int max_len, int T, int n_heads, int head_dim,
                   int stride)
{
    if (version == 4 &&
        !kvcu_decode_launch(out, q, src, rows, scores, max_len, T, n_heads, head_dim))
        version = max_len > KVCU_FLASH_SPLIT_KEYS ? 3 : 2;
    if (version == 4) return;
    const size_t smem = group_smem(kv_heads_group(n_heads, src.n_kv_heads), head_dim);
    if (version == 3 && smem <= ATTN_SMEM_MAX) {
        const int n_parts = attn_n_splits(stride);
        dim3 grid(src.n_kv_heads, attn_n_splits(max_len), T);
        KV_LAUNCH(attn_decode_kernel_v3, grid, ATTN_THREADS, smem, 0, q, src, scores, rows, T,
                  n_heads, head_dim, stride, n_parts);
        float *parts = scores + (size_t)T * n_heads * stride; /* after the scores */
        kvcu_attn_merge_launch(out, src, rows, attn_parts_at(parts, T, n_heads, n_parts), T,
                               n_heads, head_dim);
    } else if (version >= 2 && smem <= ATTN_SMEM_MAX) {
        dim3 grid(src.n_kv_heads, T);
        KV_LAUNCH(attn_decode_kernel_v2, grid, ATTN_THREADS, smem, 0, out, q, src, scores, rows,
                  n_heads, head_dim, stride);
    } else {
        dim3 grid(n_heads, T);
        const size_t smem1 = (KV_WARP + (size_t)head_dim) * sizeof(float); /* red, query */
        KV_LAUNCH(attn_decode_kernel_v1, grid, ATTN_THREADS, smem1, 0, out, q, src, scores, rows,
                  n_heads, head_dim, stride);
    }
}

/* One query at position pos of slot `slot` (n positions), with the caller's scratch or, when
 * @p scores is NULL, kvcu_attn_decode_scratch() floats allocated and freed here (cudaFree
 * waits for the kernels); the first error of the launch or of the free. */
static int launch_one(int version, float *out, const float *q, const attn_src &src,
                      float *scores, int slot, int64_t pos, int n, int n_heads, int head_dim,
                      int stride, kv_err *err)
{
    float *own = NULL;
    if (!scores) {
        const size_t f = kvcu_attn_decode_scratch(version, n_heads, head_dim, stride);
        const int st = kvcu_device_alloc((void **)&own, f * sizeof(float), err);
        if (st) return st;
        scores = own;
    }
    launch(version, out, q, src, scores, engine_rows(NULL, NULL, NULL, slot, pos), n, 1, n_heads,
           head_dim, stride);
    cudaError_t e = cudaGetLastError(), f = own ? cudaFree(own) : cudaSuccess;
    KV_CUDA_TRY(e, err);
    KV_CUDA_TRY(f, err);
    return KV_OK;
}

/* fp32 arrays [H_kv][max_seq][d] as a layer: what the plain-array entry points read. */
static attn_src f32_src(const float *k, const float *v, int n_kv_heads, int head_dim,
                        int max_seq)
{
    attn_src s;
    memset(&s, 0, sizeof s);
    s.n_kv_heads = n_kv_heads;
    s.kp.codes = (uint8_t *)(void *)k;
    s.kp.row_bytes = (int64_t)head_dim * 4;
    s.vp.codes = (uint8_t *)(void *)v;
    s.vp.row_bytes = (int64_t)head_dim * 4;
    s.fmt = KV_QF_F32;
    s.window = 1;
    s.rows = max_seq;
    return s;
}

int kvcu_attn_decode_version(int version, const float *q, const float *k, const float *v,
                             float *out, float *scores, int n_heads, int n_kv_heads, int head_dim,
                             int max_seq, int len, kv_err *err)
{
    int st = check_heads("kvcu_attn_decode", n_heads, n_kv_heads, head_dim, err);
    if (st) return st;
    if (version < 1 || version > 4)
        return kv_fail(err, KV_ERR_ARG, "kvcu_attn_decode: version %d (there are v1 to v4)",
                       version);
    if (len <= 0 || len > max_seq)
        return kv_fail(err, KV_ERR_ARG, "kvcu_attn_decode: len %d outside 1..max_seq %d", len,
                       max_seq);
    return launch_one(version, out, q, f32_src(k, v, n_kv_heads, head_dim, max_seq), scores, 0,
                      len - 1, len, n_heads, head_dim, max_seq, err);
}

int kvcu_attn_decode(const float *q, const float *k, const float *v, float *out, int n_heads,
                     int n_kv_heads, int head_dim, int max_seq, int len, kv_err *err)
{
    return kvcu_attn_decode_version(2, q, k, v, out, NULL, n_heads, n_kv_heads, head_dim,
                                    max_seq, len, err);
}

int kvcu_attention(const kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                   const int *row_of, const float *q, float *out, float *scores, int T,
                   int n_heads, int max_len, kv_err *err)
{
    int st = check_heads("kvcu_attention", n_heads, c->n_kv_heads, c->head_dim, err);
    if (st) return st;
    if (T == 0) return KV_OK;
    if (T > 65535) /* the rows are a grid dimension (y, or z for v3) */
        return kv_fail(err, KV_ERR_ARG, "kvcu_attention: %d rows in one launch, more than the "
                       "65535 a grid dimension holds; split the step into waves", T);
    /* v4, or where it does not read the layer (launch() says which) v2 / v3: never chosen
     * by the batch */
    launch(4, out, q, cache_src(c, layer), scores,
           engine_rows(tok_slot, tok_pos, row_of, 0, 0), max_len, T, n_heads, c->head_dim,
           c->span);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_cache_attention_version(int version, const kvcu_cache *c, int layer, int slot, int pos,
                                 const float *q, float *out, float *scratch, int n_heads,
                                 kv_err *err)
{
    if (!c || layer < 0 || layer >= c->n_layers || slot < 0 || slot >= c->spec.n_slots ||
        pos < 0 || pos >= c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_attention: layer %d, slot %d, pos %d", layer,
                       slot, pos);
    if (version < 0 || version > 4)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_attention: version %d (0 = the engine's "
                       "choice, 1 to 4)", version);
    /* the rows the query reads: positions 0 .. pos, or with a window min(pos + 1, S+W) */
    const int n = (int)kv_window_count(c->spec.window.size, c->spec.window.n_sinks, pos);
    if (c->tables && (int64_t)kv_window_rows(c->spec.window.size, c->spec.window.n_sinks, (int64_t)pos + 1) >
                         (int64_t)c->n_mapped[slot] * c->spec.layout.block_size)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_attention: position %d of slot %d is past "
                       "its %d mapped blocks", pos, slot, c->n_mapped[slot]);
    int st = check_heads("kvcu_cache_attention", n_heads, c->n_kv_heads, c->head_dim, err);
    if (st) return st;
    if (version == 0) version = 4;
    return launch_one(version, out, q, cache_src(c, layer), scratch, slot, pos, n, n_heads,
                      c->head_dim, c->span, err);
}

int kvcu_cache_attention(const kvcu_cache *c, int layer, int slot, int pos, const float *q,
                         float *out, int n_heads, kv_err *err)
{
    return kvcu_cache_attention_version(0, c, layer, slot, pos, q, out, NULL, n_heads, err);
}
