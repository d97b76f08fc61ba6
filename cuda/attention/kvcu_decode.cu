/*
 * The engine's decode attention (version 4 of the attention family, kvcu_attention.cu): the
 * kernel a step's rows run over a cache whose layer it can read, held to the CPU reference
 * (reference_cpu/attention/kv_attention_ref.c) by a stated error bound (tests/test_gpu_decode.c).
 * Decode attention reads every retained K/V row once and does little arithmetic with it, so
 * what matters is how the bytes come in. Each technique, and what it adds:
 *
 *  - per-format templates (attn_fast_kernel<F>): the storage format is a template argument,
 *    so the inner loops hold no switch and each conversion is the format's own instructions;
 *  - 16-byte loads: a K or V row is read as d / vec chunks of 16 bytes (vec = 16 / sizeof
 *    element: 4 fp32, 8 fp16/bf16, 16 int8/fp8), one chunk per lane, d / vec lanes per row
 *    and 32·vec / d rows per warp, so a warp's request is whole 128-byte lines;
 *  - cp.async double buffering (kvcu_vec.cuh): the rows of tile i+1 (K, V and int8 scales) are
 *    copied global -> shared while tile i is computed; the loads bypass registers and the
 *    copy engine overlaps them with the arithmetic;
 *  - conversions by pairs (kvcu_unpack(): __half22float2, bf16 pairs, fp8x2 -> half2 by
 *    cvt on sm_89+, int8 through PRMT and one subtraction) and per-row scales applied once
 *    per chunk, fp8's per-head scale folded into the score factor and the output;
 *  - per-token int8 keys scored as the CPU scores them (kv_attn_int_keys()): the query as
 *    16-bit integers, an exact integer dot product with the codes, then ((float)dot · s) ·
 *    (step / √d); int8 groups sum a chunk's codes times the query and scale once;
 *  - the group's G query heads in one block: each K/V row is read once per KV head, whatever G;
 *  - online softmax inside each split (running max, exp-sum and output rescaled per tile), so
 *    no scores go to global memory; within a tile the exp-sum and the weighted values add up
 *    in position order, o = fma(w·s, v, o), the CPU's order (kv_attention_fast.c), so a row
 *    of one tile differs from the CPU by the exponentials alone (chapter 10's GPU test holds
 *    the logits of an int8 cache to the CPU's within fp32 tolerance on that; a warp-tree sum
 *    or P·V in row slices broke it, chapter 08 "Decode at bandwidth");
 *  - the row locator once per row and thread for K and V together, on head views held by
 *    value (dec_issue()): no view in local memory, no address per 16-byte chunk;
 *  - split-KV with the split count from the device: a row's keys are cut into ranges of
 *    attn_split_keys() (kvcu_internal.cuh), enough ranges that one row alone fills about
 *    KVCU_DECODE_WAVES waves of the GPU's blocks, ranges of 256 keys or more, down to 64 for a
 *    row too short to fill them; the count depends on the row's length, the SM count and H_kv
 *    only, never on the batch, so a sequence gets the same bits alone or batched.
 *    attn_merge_kernel (kvcu_attention.cu), the family's one merge, combines them.
 *
 * Rows are found by one locator, dec_lrow() then kv_view_row(): the retained index -> logical
 * row (chapter 06's window and sinks, or chapter 09's selected set) -> physical row
 * (contiguous, or chapter 05's block table). Formats: fp32, fp16, bf16, int8 (per row and per
 * 32/64/128 channels), fp8 E4M3/E5M2 each by its own template; KIVI (groups along tokens, an
 * fp32 ring), keys rotated at attention (KV_POS_CACHE) and rows that are not whole 16-byte
 * chunks by the staged template (DEC_ELEM): each element dequantized with kv_ld() / key_ld(),
 * the lines v2 runs, into fp32 tiles that the same loops read. Chapter 09's selected sets run
 * the same kernel and merge (kvcu_attn_list_launch(); the merge turns the scores it leaves
 * into the weights the methods read), so a set listing every position gives the plain
 * decode's bits. Not here (the engine runs v2/v3, dec_plan() says no): a head dim past 32
 * chunks of 16 bytes even as fp32 (d > 128 staged), and a group whose shared memory passes
 * what a block may opt in to on this device (kvcu_smem_optin(): 99 KiB on sm_86/89, 227 KiB
 * on sm_90).
 */
#include <stdint.h>
#include <string.h>

#include "kvcu_decode.cuh"

/* The integer dot product of 16 int8 codes (one 16-byte chunk) with 16 16-bit query codes:
 * exact, as the CPU's (kv_attn_dot_q16()). */
__device__ __forceinline__ int dec_dot_q16(const uint4 &raw, const int *qi)
{
    const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
    int acc = 0;
    KV_UNROLL
    for (int k = 0; k < 4; k++) {
        const int4 qq = *(const int4 *)(const void *)(qi + 4 * k);
        acc += qq.x * ((int)(w[k] << 24) >> 24) + qq.y * ((int)(w[k] << 16) >> 24) +
               qq.z * ((int)(w[k] << 8) >> 24) + qq.w * ((int)w[k] >> 24);
    }
    return acc;
}

/*
 * Block (kvh, part, t): launch row t's G query heads of KV head kvh over range `part` of its
 * retained keys (or of its selected set, rows.sel), leaving each head's (max, exp-sum,
 * unnormalized output) in pp for the merge. Shared memory (dec_plan()): qs [G][d] the
 * queries (per-token int8 keys: their 16-bit codes as ints, the step times 1/√d in st);
 * ps [G][tile] a tile's scores, then its weights; mx, ls, al, st [G] each head's running max,
 * exp-sum, this tile's rescale factor and query step; os [G][d] the running outputs; two
 * stages of K/V rows (and int8 scales).
 */
template <int F>
__global__ void __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS)
attn_fast_kernel(const float *q, attn_src src, attn_rows rows, attn_parts pp, dec_plan_t plan,
                 int n_heads)
{
    dec_plan_t p = plan;
    dec_count_shape<F>(p);
    constexpr int VEC = dec_fmt<F>::vec;
    KV_DYNAMIC_SMEM(uint4, smem4);
    uint8_t *sm = (uint8_t *)smem4;
    const int tid = DEC_TID, G = p.G, d = p.d, TILE = p.tile;
    uint8_t *buf = sm + p.off_buf;
    dec_block blk;
    kv_head_view kh, vh;
    if (!dec_open<F>(blk, kh, vh, q, src, rows, p, TILE, n_heads, buf))
        return; /* the row is shorter: the block leaves */
    const bool qint = dec_fmt<F>::int8 && p.qint;
    float *qs = (float *)(void *)sm;
    const int *qi = (const int *)(const void *)sm;
    float *ps = (float *)(void *)(sm + p.off_s);
    float *mx = (float *)(void *)(sm + p.off_m), *ls = mx + G, *al = ls + G, *st = al + G;
    float *os = (float *)(void *)(sm + p.off_o);
    const float *qg = blk.qg;
    for (int g = tid; qint && g < G; g += DEC_THREADS)
        st[g] = kvq_q16_query_step(qg + (size_t)g * d, d);
    for (int i = tid; i < G * d; i += DEC_THREADS) os[i] = 0.0f;
    for (int g = tid; g < G; g += DEC_THREADS) {
        mx[g] = -INFINITY;
        ls[g] = 0.0f;
    }
    __syncthreads();
    /* per-token int8 keys meet the query as 16-bit integers, the CPU's exact integer dot
     * product (kv_attn_int_keys()); the score ((float)dot · s) · (step / √d), its roundings */
    for (int i = tid; i < G * d; i += DEC_THREADS) {
        if (qint) ((int *)(void *)qs)[i] = kvq_q16_encode(qg[i], st[i / d], d);
        else qs[i] = qg[i];
    }
    __syncthreads();
    for (int g = tid; qint && g < G; g += DEC_THREADS) st[g] *= 1.0f / sqrtf((float)d);
    const float factor = (dec_fmt<F>::fp8 ? kh.scale : 1.0f) / sqrtf((float)d);
    const int lane = DEC_LANE(tid), warp = tid / KV_WARP, sub = lane & (p.lpr - 1);
    const int grp = tid >> p.lpr_shift, ngrp = DEC_THREADS >> p.lpr_shift; /* row lanes */
    const int gsub = dec_fmt<F>::int8 ? sub * VEC / (d / p.ng) : 0;        /* chunk's scale */

    for (int it = 0; it < blk.ntiles; it++) {
        const dec_tile tl = dec_turn<F>(blk, kh, vh, p, src, it, TILE, buf);

        /* scores: lane `sub` of a row's lanes dots its chunk with each head's, summed across
         * the row's lanes by xor shuffles (all lanes take part, rows past n with zeros); int8
         * sums the codes and scales once, per chunk (groups) or per row (integer keys) */
        DEC_COUNT_UNROLL
        for (int r0 = 0; r0 < tl.n; r0 += ngrp) {
            const int row = r0 + grp;
            const bool live = row < tl.n;
            const uint4 raw = live ? *(const uint4 *)(const void *)(tl.k + row * p.srb + sub * 16)
                                   : make_uint4(0u, 0u, 0u, 0u);
            const float ks = dec_fmt<F>::int8 && live ? tl.ks[row * p.ng + gsub] : 1.0f;
            float x[VEC];
            if (!qint) kvcu_unpack<dec_fmt<F>::kind>(raw, x);
            DEC_COUNT_UNROLL
            for (int g = 0; g < G; g++) {
                float sc;
                if (qint) {
                    int acc = dec_dot_q16(raw, qi + (size_t)g * d + sub * VEC);
                    DEC_COUNT_UNROLL
                    for (int off = p.lpr >> 1; off > 0; off >>= 1)
                        acc += __shfl_xor_sync(0xffffffffu, acc, off);
                    sc = ((float)acc * ks) * st[g];
                } else {
                    const float4 *qv =
                        (const float4 *)(const void *)(qs + (size_t)g * d + sub * VEC);
                    float acc = 0.0f;
                    KV_UNROLL
                    for (int k = 0; k < VEC / 4; k++) {
                        const float4 qq = qv[k];
                        acc = fmaf(qq.x, x[4 * k], acc);
                        acc = fmaf(qq.y, x[4 * k + 1], acc);
                        acc = fmaf(qq.z, x[4 * k + 2], acc);
                        acc = fmaf(qq.w, x[4 * k + 3], acc);
                    }
                    if (dec_fmt<F>::int8) acc *= ks;
                    DEC_COUNT_UNROLL
                    for (int off = p.lpr >> 1; off > 0; off >>= 1)
                        acc += __shfl_xor_sync(0xffffffffu, acc, off);
                    sc = acc * factor;
                }
                if (live && sub == 0) {
                    ps[g * TILE + row] = sc;
                    if (blk.satt) blk.satt[(size_t)g * rows.sel_stride + tl.i0 + row] = sc;
                }
            }
        }
        __syncthreads();

        /* online softmax: warp w takes heads w, w+4, ...; a lane takes rows lane, lane+32 */
        DEC_COUNT_UNROLL
        for (int g = warp; g < G; g += DEC_THREADS / KV_WARP) {
            const float s0 = lane < tl.n ? ps[g * TILE + lane] : -INFINITY;
            const float s1 = lane + KV_WARP < tl.n ? ps[g * TILE + lane + KV_WARP] : -INFINITY;
            const float mo = mx[g], mn = fmaxf(mo, kv_warp_max(fmaxf(s0, s1)));
            const bool any = mn != -INFINITY;
            const float a = any ? expf(mo - mn) : 1.0f;
            const float p0 = any && lane < tl.n ? expf(s0 - mn) : 0.0f;
            const float p1 = any && lane + KV_WARP < tl.n ? expf(s1 - mn) : 0.0f;
            if (lane < tl.n) ps[g * TILE + lane] = p0;
            if (lane + KV_WARP < tl.n) ps[g * TILE + lane + KV_WARP] = p1;
            __syncwarp();
            if (lane == 0) { /* the exp-sum in position order, as the CPU adds it */
                float sum = 0.0f;
                DEC_COUNT_UNROLL
                for (int i = 0; i < tl.n; i++) sum += ps[g * TILE + i];
                mx[g] = mn;
                ls[g] = fmaf(ls[g], a, sum);
                al[g] = a;
            }
        }
        __syncthreads();

        /* P·V: thread (chunk sub, lane group grp) keeps the chunk of heads grp, grp + ngrp, ...
         * over the tile's rows in position order, o = fma(w·s, v, o) from row to row: the
         * CPU's order and roundings (kv_attention_fast.c's values pass); heads past 128 / lpr
         * come round again, and below it threads wait (the pass reads shared memory only) */
        DEC_COUNT_UNROLL
        for (int g = grp; g < G; g += ngrp) {
            float acc[VEC];
            for (int k = 0; k < VEC; k++) acc[k] = 0.0f;
            DEC_COUNT_UNROLL
            for (int row = 0; row < tl.n; row++) {
                float x[VEC];
                const uint4 raw = *(const uint4 *)(const void *)(tl.v + row * p.srb + sub * 16);
                kvcu_unpack<dec_fmt<F>::kind>(raw, x);
                float w = ps[g * TILE + row];
                if (dec_fmt<F>::int8) w *= tl.vs[row * p.ng + gsub];
                KV_UNROLL
                for (int k = 0; k < VEC; k++) acc[k] = fmaf(w, x[k], acc[k]);
            }
            float *o = os + (size_t)g * d + sub * VEC;
            const float a = al[g];
            KV_UNROLL
            for (int k = 0; k < VEC; k++) o[k] = fmaf(o[k], a, acc[k]);
        }
        __syncthreads(); /* the stage and ps are rewritten next */
    }

    /* the range's state, fp8's value scale applied once */
    const size_t ph = dec_part_index(p, pp, n_heads);
    const float vs = dec_fmt<F>::fp8 ? vh.scale : 1.0f;
    for (int i = tid; i < G * d; i += DEC_THREADS) {
        const int g = i / d, j = i - g * d;
        const float o = os[(size_t)g * d + j];
        pp.po[(ph + (size_t)g * pp.n_parts) * d + j] = dec_fmt<F>::fp8 ? o * vs : o;
    }
    for (int g = tid; g < G; g += DEC_THREADS) {
        pp.pm[ph + (size_t)g * pp.n_parts] = mx[g];
        pp.pl[ph + (size_t)g * pp.n_parts] = ls[g];
    }
}

/* ---- host side ----------------------------------------------------------------------------- */

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

/* The formats with a kernel of their own (dec_kernel()); another format goes through the
 * staged template. */
static int dec_has_kernel(int f)
{
    return f == KV_QF_F32 || f == KV_QF_F16 || f == KV_QF_BF16 || f == KV_QF_FP8_E4M3 ||
           f == KV_QF_FP8_E5M2 || kvq_is_int8(f);
}

/* Whether version 4 reads this layer with H query heads, and its shape; 0 when it does not.
 * A format's own template where its rows are whole 16-byte chunks, at most 32 of them, a
 * power of two; else the staged template (DEC_ELEM: KIVI, KV_POS_CACHE, rows of other sizes)
 * where d / 4 is such a count. Nothing else (the engine runs v2/v3 there). */
static int dec_plan(const attn_src &src, int n_heads, int d, dec_plan_t *p)
{
    const int f = src.fmt;
    if (f < 0 || f >= KV_QF_COUNT || d <= 0) return 0;
    memset(p, 0, sizeof *p);
    const int vec = 128 / kvq_code_bits(f), lpr = d / vec;
    const int native = dec_has_kernel(f) && !src.rope_cs && d % vec == 0 && lpr <= KV_WARP &&
                       !(lpr & (lpr - 1)) &&
                       ((uintptr_t)src.kp.codes | (uintptr_t)src.vp.codes) % 16 == 0;
    if (native) {
        p->fmt = f;
        p->lpr = lpr;
        p->rb = p->srb = kvq_row_bytes(f, d);
        p->ng = kvq_is_int8(f) ? d / kvq_row_group(f, KV_QROLE_VALUE, d) : 0;
        p->qint = f == KV_QF_INT8;
    } else {
        if (d % 4 || d / 4 > KV_WARP || ((d / 4) & (d / 4 - 1))) return 0;
        p->fmt = DEC_ELEM;
        p->lpr = d / 4;
        p->rb = p->srb = (int64_t)d * 4;
    }
    p->G = kv_heads_group(n_heads, src.n_kv_heads);
    p->d = d;
    while ((1 << p->lpr_shift) < p->lpr) p->lpr_shift++;
    p->tile = 8;
    while (p->tile < 64 && 2 * p->tile * p->rb <= DEC_STAGE_BYTES) p->tile *= 2;
    p->off_s = align16((size_t)p->G * d * 4);
    p->off_m = p->off_s + align16((size_t)p->G * p->tile * 4);
    p->off_o = p->off_m + align16((size_t)4 * p->G * 4);
    p->off_buf = p->off_o + align16((size_t)p->G * d * 4);
    p->stage = align16((size_t)2 * p->tile * p->rb + (size_t)2 * p->tile * p->ng * 4);
    p->smem = p->off_buf + 2 * p->stage;
    return p->smem <= kvcu_smem_optin();
}

int kvcu_decode_supported(const attn_src &src, int n_heads, int head_dim)
{
    dec_plan_t p;
    return dec_plan(src, n_heads, head_dim, &p);
}

int kvcu_cache_decode_reads(const kvcu_cache *c, int layer, int n_heads)
{
    if (!c || layer < 0 || layer >= c->n_layers || n_heads <= 0 || n_heads % c->n_kv_heads)
        return 0;
    return kvcu_decode_supported(cache_src(c, layer), n_heads, c->head_dim);
}

int kvcu_cache_decode_mma(const kvcu_cache *c, int layer, int n_heads)
{
    dec_plan_t p;
    const void *k;
    if (!kvcu_cache_decode_reads(c, layer, n_heads)) return 0;
    const attn_src src = cache_src(c, layer);
    return dec_plan(src, n_heads, c->head_dim, &p) && kvcu_decode_mma_plan(src, &p, &k);
}

/* The kernel of template f (dec_plan_t.fmt). */
static const void *dec_kernel(int f)
{
    const void *k = NULL;
    dec_dispatch(f, [&](auto c) { k = (const void *)attn_fast_kernel<decltype(c)::value>; });
    return k;
}

/* Ranges a row may be cut into: about KVCU_DECODE_WAVES waves of resident blocks over the
 * H_kv blocks of one row. The same for every launch on a device, so rows keep their bits. */
static int dec_split_target(const void *kernel, size_t smem, int n_kv_heads)
{
    const int target = KVCU_DECODE_WAVES * kvcu_resident_blocks(kernel, DEC_THREADS, smem) /
                       n_kv_heads;
    return target > 1 ? target : 1;
}

size_t kvcu_decode_scratch(int T, int n_heads, int head_dim, int capacity)
{
    const size_t parts = (size_t)attn_split_parts_max(capacity, 0);
    return (size_t)T * n_heads * parts * (head_dim + 2);
}

int kvcu_decode_launch(float *out, const float *q, const attn_src &src, attn_rows rows,
                       float *scratch, int max_len, int T, int n_heads, int head_dim)
{
    dec_plan_t p;
    if (!dec_plan(src, n_heads, head_dim, &p)) return 0;
    const void *kernel = NULL;
    /* the group on tensor cores where the rule says (kvcu_decode_mma.cu) */
    const int mma = kvcu_decode_mma_plan(src, &p, &kernel);
    if (!mma) kernel = dec_kernel(p.fmt);
    /* the plan fits the device's opt-in (dec_plan()); should the runtime still refuse it, the
     * engine's v2/v3 run instead (0: nothing launched), the refusal cleared */
    if (p.smem > 48 * 1024 &&
        kvcu_clear_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)p.smem)) != cudaSuccess)
        return 0;
    rows.split_target = dec_split_target(kernel, p.smem, src.n_kv_heads);
    int n_parts = (int)attn_split_parts_max(max_len, rows.split_target);
    if (n_parts < 1) n_parts = 1;
    const attn_parts parts = attn_parts_at(scratch, T, n_heads, n_parts);
    const dim3 grid(src.n_kv_heads, n_parts, T);
    if (mma)
        kvcu_decode_mma_launch(grid, p, q, src, rows, parts, n_heads);
    else
        dec_dispatch(p.fmt, [&](auto c) {
            KV_LAUNCH(attn_fast_kernel<decltype(c)::value>, grid, DEC_THREADS, p.smem, 0, q, src,
                      rows, parts, p, n_heads);
        });
    kvcu_attn_merge_launch(out, src, rows, parts, T, n_heads, head_dim);
    return 1;
}

/* Chapter 09: the same kernel and merge over selected sets (attn_rows.sel), so a set that
 * lists every position gives the plain decode's bits. */
int kvcu_attn_list_launch(int rows, float *out, const float *q,
                          const attn_src &src, float *att, float *sums, float *parts,
                          const int *off, const int *cnt, const int *lists, int slot, int r0,
                          int j0, int n, int n_heads, int head_dim, int stride)
{
    attn_rows r;
    memset(&r, 0, sizeof r);
    r.slot0 = slot;
    r.n_keys = INT64_MAX;
    r.sel = lists;
    r.sel_off = off;
    r.sel_cnt = cnt;
    r.sel_r0 = r0;
    r.sel_j0 = j0;
    r.sel_n = n;
    r.sel_group = kv_heads_group(n_heads, src.n_kv_heads);
    r.sel_stride = stride;
    r.sel_att = att;
    r.sel_sums = sums;
    return kvcu_decode_launch(out, q, src, r, parts, stride, rows, n_heads, head_dim);
}
