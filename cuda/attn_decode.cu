/*
 * Decode attention on the GPU: the device side of the one attention family
 * (reference_cpu/kv_attention.c). A query token at position pos reads cache positions
 * 0 .. pos of its sequence; query head h reads KV head h / G (G = H / H_kv: 1 is MHA,
 * H is MQA), the grouping kv_attn_kv_head() names on the CPU.
 *
 * Both versions compute the CPU reference's three-pass softmax in fp32, scores in a global
 * scratch of [T][H][capacity] floats (a 32k-token context needs 128 KiB of scores per head,
 * more than a block's shared memory):
 *   (1) scores q·k_p / sqrt(d), position p taken by thread p mod 128, and their max;
 *   (2) exp(score - max) and their sum (subtracting the max keeps expf from overflowing);
 *   (3) the weighted sum of values in position order, thread i taking output dim i,
 *       multiplied once by 1/sum.
 *
 * attn_decode_kernel_v1: one block per (query token, query head). Every query head streams
 *   its KV head's rows from memory on its own, so a group of G heads reads the same K and V
 *   G times: H·N·d·2·b bytes per token per layer, whatever H_kv is. Pass 1 reads K one row
 *   per thread, which is simple rather than fast.
 *
 * attn_decode_kernel_v2 (chapter 03): one block per (query token, KV head). The group's G
 *   query heads are packed together in shared memory; each thread loads a K row (pass 1) or
 *   a V element (pass 3) once and applies it to up to ATTN_GROUP_REGS heads held in registers.
 *   A group of G <= 8 heads therefore reads K and V once: H_kv·N·d·2·b bytes, G times fewer
 *   than v1. Larger groups (MQA with many heads) walk the group in chunks of 8 and re-read
 *   the rows once per chunk, mostly from L2. Per head the arithmetic is v1's, in v1's order.
 *   The group takes G·(d + 1) + 32 floats of shared memory; past 48 KiB (G·(d+1) > 12256,
 *   e.g. MQA with 96 heads of d = 128) the launchers run v1 instead.
 *
 * Chapter 04: both versions read the cache through kv_head_view (kv_cache.h): an fp32 layer
 *   as plain floats, any other format by kv_cache_elem() inline in the loops, i.e.
 *   kvq_decode_element() of reference_cpu/kv_quant_math.h, the very lines the CPU's attention
 *   runs (or KIVI's fp32 window for its newest rows). Dequantization is fused: no dequantized
 *   copy of the cache is ever written, and the bytes read are the quantized ones.
 *
 * kvcu_attn_decode() is the plain-array twin of kv_attn_decode() and runs v2;
 * kvcu_attn_decode_version() picks the version (the tests hold both against the CPU, the
 * bench times both). kvcu_attention() runs a step's tokens over one layer of a kvcu_cache,
 * as kv_forward() calls kv_attention(); the engine uses v2.
 */
#include <string.h>

#include "kvcu_internal.cuh"

#define ATTN_THREADS 128
#define ATTN_GROUP_REGS 8              /* v2: query heads one thread applies a K/V load to */
#define ATTN_SMEM_MAX (48 * 1024)      /* default dynamic shared memory per block */

/* v2's shared memory: the packed queries [G][d], the reduction scratch [32], 1/sums [G] */
static size_t v2_smem(int group, int head_dim)
{
    return ((size_t)group * (head_dim + 1) + KV_WARP) * sizeof(float);
}

/* tok_slot == NULL: every token is in slot 0 and sees @p len positions (the plain-array
 * entry point); otherwise token t sees tok_pos[t] + 1 positions of slot tok_slot[t]. */
/* Element (p, i) of a head: plain floats for fp32 (f32 != NULL), else the fused decode. */
__device__ inline float kv_ld(const kv_head_view &hv, const float *f32, int64_t p, int i)
{
    return f32 ? f32[p * hv.d + i] : kv_cache_elem(&hv, p, i);
}

/* The views of (slot, kvh) of one layer's K and V planes; qlen NULL: nothing is KIVI. */
#define ATTN_VIEWS(kh, vh, kf, vf)                                                                  \
    const int64_t q_ = qlen ? qlen[slot] : 0;                                                      \
    const kv_head_view kh = kv_cache_plane_view(&kp, fmt, KV_QROLE_KEY, n_kv_heads, capacity,      \
                                                head_dim, window, slot, kvh, q_);                  \
    const kv_head_view vh = kv_cache_plane_view(&vp, fmt, KV_QROLE_VALUE, n_kv_heads, capacity,    \
                                                head_dim, window, slot, kvh, q_);                  \
    const float *kf = fmt == KV_QF_F32 ? (const float *)(const void *)kh.codes : NULL;             \
    const float *vf = fmt == KV_QF_F32 ? (const float *)(const void *)vh.codes : NULL

__global__ void attn_decode_kernel_v1(float *out, const float *q, kv_cache_plane kp,
                                      kv_cache_plane vp, int fmt, const int *qlen, int window,
                                      float *scores, const int *tok_slot, const int *tok_pos,
                                      int len, int n_heads, int n_kv_heads, int head_dim,
                                      int capacity)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] block reduction scratch */
    const int h = blockIdx.x, t = blockIdx.y;
    const int slot = tok_slot ? tok_slot[t] : 0;
    const int n = tok_slot ? tok_pos[t] + 1 : len; /* causal: itself and everything before */
    const int kvh = h / (n_heads / n_kv_heads); /* kv_attn_kv_head(): h / G */
    ATTN_VIEWS(kh, vh, kf, vf);                                   /* [capacity][d] each */
    const float *qh = q + ((size_t)t * n_heads + h) * head_dim;   /* [d] */
    float *att = scores + ((size_t)t * n_heads + h) * capacity;   /* [capacity] */
    float *oh = out + ((size_t)t * n_heads + h) * head_dim;       /* [d] */
    const float scale = 1.0f / sqrtf((float)head_dim);

    /* pass 1: scores and their max */
    float m = -INFINITY;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        float dot = 0.0f;
        for (int i = 0; i < head_dim; i++) dot += qh[i] * kv_ld(kh, kf, p, i);
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
        for (int p = 0; p < n; p++) acc += att[p] * kv_ld(vh, vf, p, i);
        oh[i] = acc * inv;
    }
}

/* tok_slot == NULL as in v1. Block (kvh, t) computes query heads kvh·G .. kvh·G + G - 1. */
__global__ void attn_decode_kernel_v2(float *out, const float *q, kv_cache_plane kp,
                                      kv_cache_plane vp, int fmt, const int *qlen, int window,
                                      float *scores, const int *tok_slot, const int *tok_pos,
                                      int len, int n_heads, int n_kv_heads, int head_dim,
                                      int capacity)
{
    KV_DYNAMIC_SMEM(float, smem);
    const int kvh = blockIdx.x, t = blockIdx.y;
    const int G = n_heads / n_kv_heads, h0 = kvh * G;
    float *qs = smem;                            /* [G][d] the group's queries */
    float *red = smem + (size_t)G * head_dim;    /* [32] block reduction scratch */
    float *inv = red + KV_WARP;                  /* [G] 1/sum of each head's softmax */
    const int slot = tok_slot ? tok_slot[t] : 0;
    const int n = tok_slot ? tok_pos[t] + 1 : len;
    ATTN_VIEWS(kh, vh, kf, vf);                                  /* [capacity][d] each */
    float *att = scores + ((size_t)t * n_heads + h0) * capacity; /* [G][capacity] */
    float *oh = out + ((size_t)t * n_heads + h0) * head_dim;     /* [G][d] */
    const float scale = 1.0f / sqrtf((float)head_dim);

    /* the group's G query rows are contiguous in q: one coalesced copy */
    const float *qg = q + ((size_t)t * n_heads + h0) * head_dim; /* [G][d] */
    for (int i = threadIdx.x; i < G * head_dim; i += blockDim.x) qs[i] = qg[i];
    __syncthreads();

    /* pass 1: scores of every head of the group; each K row is loaded once per chunk of
     * ATTN_GROUP_REGS heads and multiplied into each of them */
    for (int g0 = 0; g0 < G; g0 += ATTN_GROUP_REGS) {
        const int ng = G - g0 < ATTN_GROUP_REGS ? G - g0 : ATTN_GROUP_REGS;
        for (int p = threadIdx.x; p < n; p += blockDim.x) {
            float dot[ATTN_GROUP_REGS];
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++) dot[g] = 0.0f;
            for (int i = 0; i < head_dim; i++) {
                const float ki = kv_ld(kh, kf, p, i);
                KV_UNROLL
                for (int g = 0; g < ATTN_GROUP_REGS; g++)
                    if (g < ng) dot[g] += qs[(size_t)(g0 + g) * head_dim + i] * ki;
            }
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++)
                if (g < ng) att[(size_t)(g0 + g) * capacity + p] = dot[g] * scale;
        }
    }

    /* pass 2, per head: max, then exponentiate and sum. A thread touches only the scores it
     * wrote itself; the reductions' barriers publish them to the block for pass 3. */
    for (int g = 0; g < G; g++) {
        float *ag = att + (size_t)g * capacity;
        float m = -INFINITY;
        for (int p = threadIdx.x; p < n; p += blockDim.x) m = fmaxf(m, ag[p]);
        m = kv_block_max(m, red);
        float sum = 0.0f;
        for (int p = threadIdx.x; p < n; p += blockDim.x) {
            ag[p] = expf(ag[p] - m);
            sum += ag[p];
        }
        sum = kv_block_sum(sum, red);
        if (threadIdx.x == 0) inv[g] = 1.0f / sum;
    }
    __syncthreads();

    /* pass 3: weighted values; each V element is loaded once per chunk of heads */
    for (int g0 = 0; g0 < G; g0 += ATTN_GROUP_REGS) {
        const int ng = G - g0 < ATTN_GROUP_REGS ? G - g0 : ATTN_GROUP_REGS;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            float acc[ATTN_GROUP_REGS];
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++) acc[g] = 0.0f;
            for (int p = 0; p < n; p++) {
                const float vi = kv_ld(vh, vf, p, i);
                KV_UNROLL
                for (int g = 0; g < ATTN_GROUP_REGS; g++)
                    if (g < ng) acc[g] += att[(size_t)(g0 + g) * capacity + p] * vi;
            }
            KV_UNROLL
            for (int g = 0; g < ATTN_GROUP_REGS; g++)
                if (g < ng) oh[(size_t)(g0 + g) * head_dim + i] = acc[g] * inv[g0 + g];
        }
    }
}

static int check_heads(const char *who, int n_heads, int n_kv_heads, int head_dim, kv_err *err)
{
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: H %d, H_kv %d (must divide H), d %d", who, n_heads,
                       n_kv_heads, head_dim);
    return KV_OK;
}

/* Launch version @p version (1 or 2; 2 falls back to 1 when its shared memory would not fit)
 * over T tokens; kp, vp are one layer's planes in format fmt. */
static void launch(int version, float *out, const float *q, const kv_cache_plane &kp,
                   const kv_cache_plane &vp, int fmt, const int *qlen, int window, float *scores,
                   const int *tok_slot, const int *tok_pos, int len, int T, int n_heads,
                   int n_kv_heads, int head_dim, int capacity)
{
    const size_t smem2 = v2_smem(n_heads / n_kv_heads, head_dim);
    if (window < 1) window = 1;
    if (version == 2 && smem2 <= ATTN_SMEM_MAX) {
        dim3 grid(n_kv_heads, T);
        KV_LAUNCH(attn_decode_kernel_v2, grid, ATTN_THREADS, smem2, 0, out, q, kp, vp, fmt, qlen,
                  window, scores, tok_slot, tok_pos, len, n_heads, n_kv_heads, head_dim,
                  capacity);
    } else {
        dim3 grid(n_heads, T);
        KV_LAUNCH(attn_decode_kernel_v1, grid, ATTN_THREADS, KV_WARP * sizeof(float), 0, out,
                  q, kp, vp, fmt, qlen, window, scores, tok_slot, tok_pos, len, n_heads,
                  n_kv_heads, head_dim, capacity);
    }
}

/* fp32 arrays [H_kv][max_seq][d] as a plane: what the plain-array entry points read. */
static kv_cache_plane f32_plane(const float *x, int head_dim)
{
    kv_cache_plane p;
    memset(&p, 0, sizeof p);
    p.codes = (uint8_t *)(void *)x;
    p.row_bytes = (int64_t)head_dim * 4;
    return p;
}

int kvcu_attn_decode_version(int version, const float *q, const float *k, const float *v,
                             float *out, float *scores, int n_heads, int n_kv_heads, int head_dim,
                             int max_seq, int len, kv_err *err)
{
    int st = check_heads("kvcu_attn_decode", n_heads, n_kv_heads, head_dim, err);
    if (st) return st;
    if (version != 1 && version != 2)
        return kv_fail(err, KV_ERR_ARG, "kvcu_attn_decode: version %d (there are v1 and v2)",
                       version);
    if (len <= 0 || len > max_seq)
        return kv_fail(err, KV_ERR_ARG, "kvcu_attn_decode: len %d outside 1..max_seq %d", len,
                       max_seq);
    float *own = NULL; /* [H][max_seq] when the caller gave no scratch */
    if (!scores) {
        KV_CUDA_TRY(cudaMalloc(&own, (size_t)n_heads * max_seq * sizeof(float)), err);
        scores = own;
    }
    launch(version, out, q, f32_plane(k, head_dim), f32_plane(v, head_dim), KV_QF_F32, NULL, 1,
           scores, NULL, NULL, len, 1, n_heads, n_kv_heads, head_dim, max_seq);
    cudaError_t e = cudaGetLastError();
    cudaError_t f = own ? cudaFree(own) : cudaSuccess; /* cudaFree waits for the kernel */
    KV_CUDA_TRY(e, err);
    KV_CUDA_TRY(f, err);
    return KV_OK;
}

int kvcu_attn_decode(const float *q, const float *k, const float *v, float *out, int n_heads,
                     int n_kv_heads, int head_dim, int max_seq, int len, kv_err *err)
{
    return kvcu_attn_decode_version(2, q, k, v, out, NULL, n_heads, n_kv_heads, head_dim,
                                    max_seq, len, err);
}

int kvcu_attention(const kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                   const float *q, float *out, float *scores, int T, int n_heads, kv_err *err)
{
    int st = check_heads("kvcu_attention", n_heads, c->n_kv_heads, c->head_dim, err);
    if (st) return st;
    if (T == 0) return KV_OK;
    const int fmt = c->fmt[layer];
    launch(2, out, q, c->kp[layer], c->vp[layer], fmt,
           kvq_is_kivi(fmt) ? c->d_qlen + (size_t)layer * c->spec.n_slots : NULL, c->window,
           scores, tok_slot, tok_pos, 0, T, n_heads, c->n_kv_heads, c->head_dim,
           c->spec.capacity);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_cache_attention(const kvcu_cache *c, int layer, int slot, int pos, const float *q,
                         float *out, int n_heads, kv_err *err)
{
    if (!c || layer < 0 || layer >= c->n_layers || slot < 0 || slot >= c->spec.n_slots ||
        pos < 0 || pos >= c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_attention: layer %d, slot %d, pos %d", layer,
                       slot, pos);
    int *dv = NULL, h[2] = {slot, pos};
    float *scores = NULL; /* [H][capacity] */
    cudaError_t e = cudaMalloc(&dv, 2 * sizeof(int));
    if (e == cudaSuccess) e = cudaMemcpy(dv, h, 2 * sizeof(int), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMalloc(&scores, (size_t)n_heads * c->spec.capacity * sizeof(float));
    int rc = e == cudaSuccess ? kvcu_attention(c, layer, dv, dv + 1, q, out, scores, 1, n_heads, err)
                              : kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_attention: %s",
                                        cudaGetErrorString(e));
    cudaFree(scores); /* waits for the kernel */
    cudaFree(dv);
    return rc;
}
