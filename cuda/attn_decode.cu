/*
 * Decode attention on the GPU: the device side of the one attention family
 * (reference_cpu/kv_attention.c). A query token at position pos reads cache positions
 * 0 .. pos of its sequence; query head h reads KV head h / G (G = H / H_kv: 1 is MHA,
 * H is MQA).
 *
 * attn_decode_kernel_v1: one block per (query token, query head), scores in a global scratch
 *   of [T][H][capacity] floats (a 32k-token context needs 128 KiB of scores per head, more
 *   than a block's shared memory). The softmax runs in the CPU reference's three passes:
 *   (1) each thread takes cached positions p = tid, tid + 128, ... and writes the score
 *       q·k_p / sqrt(d), keeping its running max; a block reduction gives the max;
 *   (2) each thread exponentiates its own scores relative to the max and sums them; a block
 *       reduction gives the sum (subtracting the max keeps expf from overflowing);
 *   (3) each thread takes output dims i = tid, tid + 128, ... and adds up p_p · v_p[i] over
 *       the positions in order, multiplied once by 1/sum at the end.
 *   Pass 3 reads V rows coalesced (consecutive threads, consecutive dims); pass 1 reads K
 *   one row per thread, which is simple rather than fast. Making decode attention fast
 *   (split-KV, the group's query heads sharing one pass over K/V) is chapter 08's subject.
 *
 * kvcu_attn_decode() is the plain-array twin of kv_attn_decode(); kvcu_attention() runs a
 * step's tokens over one layer of a kvcu_cache, as kv_forward() calls kv_attention().
 */
#include "kvcu_internal.cuh"

#define ATTN_THREADS 128

/* tok_slot == NULL: every token is in slot 0 and sees @p len positions (the plain-array
 * entry point); otherwise token t sees tok_pos[t] + 1 positions of slot tok_slot[t]. */
__global__ void attn_decode_kernel_v1(float *out, const float *q, const float *k, const float *v,
                                      float *scores, const int *tok_slot, const int *tok_pos,
                                      int len, int n_heads, int n_kv_heads, int head_dim,
                                      int capacity)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] block reduction scratch */
    const int h = blockIdx.x, t = blockIdx.y;
    const int slot = tok_slot ? tok_slot[t] : 0;
    const int n = tok_slot ? tok_pos[t] + 1 : len; /* causal: itself and everything before */
    const int kvh = h / (n_heads / n_kv_heads);
    const size_t row = (size_t)slot * n_kv_heads + kvh;
    const float *qh = q + ((size_t)t * n_heads + h) * head_dim;   /* [d] */
    const float *kh = k + row * capacity * head_dim;              /* [capacity][d] */
    const float *vh = v + row * capacity * head_dim;              /* [capacity][d] */
    float *att = scores + ((size_t)t * n_heads + h) * capacity;   /* [capacity] */
    float *oh = out + ((size_t)t * n_heads + h) * head_dim;       /* [d] */
    const float scale = 1.0f / sqrtf((float)head_dim);

    /* pass 1: scores and their max */
    float m = -INFINITY;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const float *kp = kh + (size_t)p * head_dim;
        float dot = 0.0f;
        for (int i = 0; i < head_dim; i++) dot += qh[i] * kp[i];
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
        for (int p = 0; p < n; p++) acc += att[p] * vh[(size_t)p * head_dim + i];
        oh[i] = acc * inv;
    }
}

static int check_heads(const char *who, int n_heads, int n_kv_heads, int head_dim, kv_err *err)
{
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: H %d, H_kv %d (must divide H), d %d", who, n_heads,
                       n_kv_heads, head_dim);
    return KV_OK;
}

/**
 * GPU twin of kv_attn_decode(): one query token over a contiguous cache.
 * q, out [n_heads][head_dim]; k, v [n_kv_heads][max_seq][head_dim] device.
 * Allocates (and frees) a [n_heads][max_seq] score scratch on each call; the engine uses
 * kvcu_attention() with its own scratch instead.
 */
int kvcu_attn_decode(const float *q, const float *k, const float *v, float *out, int n_heads,
                     int n_kv_heads, int head_dim, int max_seq, int len, kv_err *err)
{
    int st = check_heads("kvcu_attn_decode", n_heads, n_kv_heads, head_dim, err);
    if (st) return st;
    if (len <= 0 || len > max_seq)
        return kv_fail(err, KV_ERR_ARG, "kvcu_attn_decode: len %d outside 1..max_seq %d", len,
                       max_seq);
    float *scores = NULL; /* [H][max_seq] */
    KV_CUDA_TRY(cudaMalloc(&scores, (size_t)n_heads * max_seq * sizeof(float)), err);
    dim3 grid(n_heads, 1);
    KV_LAUNCH(attn_decode_kernel_v1, grid, ATTN_THREADS, KV_WARP * sizeof(float), 0, out, q, k,
              v, scores, (const int *)NULL, (const int *)NULL, len, n_heads, n_kv_heads,
              head_dim, max_seq);
    cudaError_t e = cudaGetLastError();
    cudaError_t f = cudaFree(scores); /* waits for the kernel */
    KV_CUDA_TRY(e, err);
    KV_CUDA_TRY(f, err);
    return KV_OK;
}

int kvcu_attention(const kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                   const float *q, float *out, float *scores, int T, int n_heads, kv_err *err)
{
    int st = check_heads("kvcu_attention", n_heads, c->n_kv_heads, c->head_dim, err);
    if (st) return st;
    if (T == 0) return KV_OK;
    const size_t per_layer = (size_t)c->spec.n_slots * c->n_kv_heads * c->spec.capacity *
                             c->head_dim;
    dim3 grid(n_heads, T);
    KV_LAUNCH(attn_decode_kernel_v1, grid, ATTN_THREADS, KV_WARP * sizeof(float), 0, out, q,
              c->k + layer * per_layer, c->v + layer * per_layer, scores, tok_slot, tok_pos, 0,
              n_heads, c->n_kv_heads, c->head_dim, c->spec.capacity);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
