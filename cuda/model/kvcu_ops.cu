/*
 * The building blocks of the forward pass on the GPU, twins of reference_cpu/model/kv_ops.c.
 * Each kvcu_x() takes the arguments of kv_x() as device pointers and returns a kv_status.
 *
 * rmsnorm_kernel: one block per row (token). The threads stride over the row summing
 *   squares, a block reduction (warp shuffles, then one float per warp in shared memory)
 *   gives every thread the total, and each thread scales its own elements. Rows are
 *   independent, so a token's result does not depend on the other tokens of the step.
 *
 * matmul_kernel_v1 (decode, T = 1): one warp per output element. Lane l sums the products
 *   j = l, l+32, l+64, ... of its row of W with x (consecutive lanes read consecutive floats,
 *   so each warp reads its row of W coalesced), then a 5-step xor shuffle adds the 32
 *   partial sums; lane 0 writes. Decode reads every weight once per token: it is bound by
 *   memory bandwidth, and this is the shape that streams W at full width.
 * matmul_kernel_v2 (prefill, T > 1): a 16x16 block computes a 16-token by 16-output tile of
 *   y. Tiles of x and W, 32 columns wide, are staged in shared memory, so each weight is read
 *   from global memory once per 16 tokens instead of once per token. Each thread keeps 32
 *   partial sums, one per column of the tile, and adds them in the end in the butterfly order
 *   of v1's shuffles: the two versions produce the same bits for the same row (both write
 *   acc += x * w, which the compiler turns into the same fused multiply-add). That makes a
 *   sequence's result independent of who shares its step (batched vs solo, docs/design.md §8).
 * Both take W's row stride ldw (>= in) apart from in: a tensor-parallel rank (chapter 10)
 *   multiplies a column slice of Wo and W2 in place (kvcu_matmul_strided); kvcu_matmul is
 *   ldw = in.
 *
 * rope_kernel: one thread per rotated pair (token, head, i). As in the CPU reference the
 *   angle pos * theta^(-2i/rotary_dim) is formed in double (in fp32, position 32k times a
 *   frequency near 1 is already ~2e-3 rad off) and only the rotation is fp32. The frequencies
 *   depend on i alone: the caller's host table (kv_rope_freqs(), Llama 3's factors included)
 *   is passed by value, so both devices start from the same bits.
 *
 * The 16-bit products (the tensor-core GEMM, the GEMV of one-token rows, the conversion to
 *   16 bits) are kvcu_ops_fast.cu, as the CPU's fast rows are kv_ops_fast.c.
 *
 * swiglu_kernel, add_kernel, embed_kernel: one thread per element (grid-stride loop).
 */
#include "kvcu_internal.cuh"

#define KV_OPS_THREADS 128 /* threads per block of the row and element kernels */
#define KV_MAX_GRID 4096   /* element kernels loop when n exceeds grid * block */

/* Blocks for n independent elements: one thread each, up to KV_MAX_GRID blocks. */
static unsigned elementwise_grid(int64_t n)
{
    const int64_t blocks = (n + KV_OPS_THREADS - 1) / KV_OPS_THREADS;
    return blocks < KV_MAX_GRID ? (unsigned)(blocks > 0 ? blocks : 1) : KV_MAX_GRID;
}

/* ---- rmsnorm --------------------------------------------------------------------------- */

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int n, float eps)
{
    KV_DYNAMIC_SMEM(float, red); /* [32] one partial sum per warp */
    const float *xr = x + (size_t)blockIdx.x * n; /* [n] */
    float *outr = out + (size_t)blockIdx.x * n;   /* [n] */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = kv_block_sum(ss, red); /* every thread gets the total */
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        outr[i] = xr[i] * inv * w[i];
}

/** GPU twin of kv_rmsnorm(); out, x [T][n], w [n] device. out may alias x. */
int kvcu_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps, kv_err *err)
{
    if (T < 0 || n <= 0) return kv_fail(err, KV_ERR_ARG, "kvcu_rmsnorm: T %d, n %d", T, n);
    if (T == 0) return KV_OK;
    KV_LAUNCH(rmsnorm_kernel, T, KV_OPS_THREADS, KV_WARP * sizeof(float), 0, out, x, w, n, eps);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* ---- matmul ---------------------------------------------------------------------------- */

#define MM_V1_WARPS 4 /* output elements per block of v1 */
#define MM_TILE 16    /* v2: tokens and outputs per block side */
#define MM_K 32       /* v2: columns per shared tile = the 32 lanes of v1 */

__global__ void matmul_kernel_v1(float *y, const float *x, const float *W, int in, int out,
                                 int ldw)
{
    const int lane = threadIdx.x % KV_WARP;
    const int o = blockIdx.x * MM_V1_WARPS + threadIdx.x / KV_WARP;
    const int t = blockIdx.y;
    if (o >= out) return; /* o is the same for the whole warp: no shuffle loses a lane */
    const float *xr = x + (size_t)t * in; /* [in] */
    const float *wr = W + (size_t)o * ldw; /* [in] of a row ldw floats long */
    float acc = 0.0f;
    for (int j = lane; j < in; j += KV_WARP)
        acc += xr[j] * wr[j];
    acc = kv_warp_sum(acc);
    if (lane == 0) y[(size_t)t * out + o] = acc;
}

__global__ void matmul_kernel_v2(float *y, const float *x, const float *W, int T, int in, int out,
                                 int ldw)
{
    KV_DYNAMIC_SMEM(float, smem);
    float *xs = smem;                           /* [MM_TILE][MM_K + 1] tokens  x columns */
    float *ws = smem + MM_TILE * (MM_K + 1);    /* [MM_TILE][MM_K + 1] outputs x columns */
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * MM_TILE + tx;
    const int t0 = blockIdx.x * MM_TILE, o0 = blockIdx.y * MM_TILE;
    float part[MM_K]; /* part[c]: products of columns j = c (mod 32), as v1's lane c */
    KV_UNROLL
    for (int c = 0; c < MM_K; c++) part[c] = 0.0f;

    for (int j0 = 0; j0 < in; j0 += MM_K) {
        /* the 256 threads load both 16x32 tiles; outside the matrices they load zeros,
         * and adding 0 * 0 leaves a partial sum unchanged */
        for (int e = tid; e < MM_TILE * MM_K; e += MM_TILE * MM_TILE) {
            const int r = e / MM_K, c = e % MM_K, j = j0 + c;
            xs[r * (MM_K + 1) + c] = (t0 + r < T && j < in) ? x[(size_t)(t0 + r) * in + j] : 0.0f;
            ws[r * (MM_K + 1) + c] = (o0 + r < out && j < in) ? W[(size_t)(o0 + r) * ldw + j] : 0.0f;
        }
        __syncthreads();
        KV_UNROLL
        for (int c = 0; c < MM_K; c++)
            part[c] += xs[ty * (MM_K + 1) + c] * ws[tx * (MM_K + 1) + c];
        __syncthreads(); /* the tiles are overwritten next round */
    }
    /* v1's butterfly as lane 0 sees it: the step at distance off adds lane l + off into
     * lane l. Written out with constant bounds so part[] stays in registers. */
    KV_UNROLL
    for (int l = 0; l < 16; l++) part[l] += part[l + 16];
    KV_UNROLL
    for (int l = 0; l < 8; l++) part[l] += part[l + 8];
    KV_UNROLL
    for (int l = 0; l < 4; l++) part[l] += part[l + 4];
    part[0] += part[2];
    part[1] += part[3];
    part[0] += part[1];
    if (t0 + ty < T && o0 + tx < out) y[(size_t)(t0 + ty) * out + o0 + tx] = part[0];
}

/** GPU twin of kv_matmul_strided(); x [T][in], W [out][ldw] (columns 0 .. in-1 used),
 * y [T][out] device. v1 for T = 1, else v2. ldw == in is kvcu_matmul(), bit for bit: only
 * the address of a weight changes, not the order of the additions. */
int kvcu_matmul_strided(float *y, const float *x, const float *W, int T, int in, int out,
                        int ldw, kv_err *err)
{
    if (T < 0 || in <= 0 || out <= 0 || ldw < in)
        return kv_fail(err, KV_ERR_ARG, "kvcu_matmul: T %d, in %d, out %d, ldw %d", T, in, out,
                       ldw);
    if (T == 0) return KV_OK;
    if (T == 1) {
        dim3 grid(kv_ceil_div(out, MM_V1_WARPS), T); /* y: tokens */
        KV_LAUNCH(matmul_kernel_v1, grid, MM_V1_WARPS * KV_WARP, 0, 0, y, x, W, in, out, ldw);
    } else {
        /* token tiles in x (up to 2^31 blocks), output tiles in y (65535 x 16 outputs) */
        dim3 grid(kv_ceil_div(T, MM_TILE), kv_ceil_div(out, MM_TILE));
        dim3 block(MM_TILE, MM_TILE);
        size_t smem = 2 * MM_TILE * (MM_K + 1) * sizeof(float);
        KV_LAUNCH(matmul_kernel_v2, grid, block, smem, 0, y, x, W, T, in, out, ldw);
    }
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/** GPU twin of kv_matmul(); x [T][in], W [out][in], y [T][out] device. */
int kvcu_matmul(float *y, const float *x, const float *W, int T, int in, int out, kv_err *err)
{
    return kvcu_matmul_strided(y, x, W, T, in, out, in, err);
}

/* ---- rope ------------------------------------------------------------------------------ */

/* KV_ROPE_MAX_PAIRS (kv_config.h) 256: 2 KiB of kernel parameters (4 KiB max) */
typedef struct {
    double freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim / 2]  kv_rope_freqs(): theta^(-2i/d) / f_i */
} rope_freqs;

__global__ void rope_kernel(float *x, const int *pos, int T, int n_heads, int head_dim,
                            int n_pairs, rope_freqs f)
{
    const int64_t total = (int64_t)T * n_heads * n_pairs;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(e % n_pairs);
        const int64_t th = e / n_pairs; /* t * n_heads + h */
        const int t = (int)(th / n_heads);
        const double angle = (double)pos[t] * f.freq[i];
        const float c = (float)cos(angle), s = (float)sin(angle);
        float *p = x + th * head_dim + 2 * i; /* the pair (2i, 2i+1) of head h of token t */
        const float a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
    }
}

/** GPU twin of kv_rope(); x [T][n_heads][head_dim], pos [T] device. */
int kvcu_rope(float *x, const int *pos, int T, int n_heads, int head_dim, int rotary_dim,
              const double *freq, kv_err *err)
{
    if (T < 0 || n_heads <= 0 || head_dim <= 0 || rotary_dim < 0 || rotary_dim > head_dim ||
        rotary_dim % 2)
        return kv_fail(err, KV_ERR_ARG, "kvcu_rope: T %d, heads %d, head_dim %d, rotary_dim %d",
                       T, n_heads, head_dim, rotary_dim);
    const int n_pairs = rotary_dim / 2;
    if (n_pairs > KV_ROPE_MAX_PAIRS)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_rope: rotary_dim %d > %d", rotary_dim,
                       2 * KV_ROPE_MAX_PAIRS);
    if (T == 0 || n_pairs == 0) return KV_OK;
    rope_freqs f;
    for (int i = 0; i < n_pairs; i++) f.freq[i] = freq[i];
    KV_LAUNCH(rope_kernel, elementwise_grid((int64_t)T * n_heads * n_pairs), KV_OPS_THREADS, 0,
              0, x, pos, T, n_heads, head_dim, n_pairs, f);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* ---- element-wise: swiglu, add, embed -------------------------------------------------- */

__global__ void swiglu_kernel(float *g, const float *u, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float a = g[i];
        g[i] = a / (1.0f + expf(-a)) * u[i]; /* silu(a) = a·sigmoid(a) */
    }
}

/** GPU twin of kv_swiglu(); g, u [n] device. */
int kvcu_swiglu(float *g, const float *u, int64_t n, kv_err *err)
{
    if (n < 0) return kv_fail(err, KV_ERR_ARG, "kvcu_swiglu: n %lld", (long long)n);
    if (n == 0) return KV_OK;
    KV_LAUNCH(swiglu_kernel, elementwise_grid(n), KV_OPS_THREADS, 0, 0, g, u, n);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

__global__ void add_kernel(float *x, const float *y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

/** GPU twin of kv_add(); x, y [n] device. */
int kvcu_add(float *x, const float *y, int64_t n, kv_err *err)
{
    if (n < 0) return kv_fail(err, KV_ERR_ARG, "kvcu_add: n %lld", (long long)n);
    if (n == 0) return KV_OK;
    KV_LAUNCH(add_kernel, elementwise_grid(n), KV_OPS_THREADS, 0, 0, x, y, n);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

__global__ void embed_kernel(float *out, const float *table, const int *tokens, int T, int dim)
{
    const int64_t n = (int64_t)T * dim;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(e / dim), i = (int)(e % dim);
        out[e] = table[(size_t)tokens[t] * dim + i];
    }
}

/**
 * GPU twin of kv_embed(); table [vocab][dim], tokens [T], out [T][dim] device.
 * Token ids are not checked here (they are on the device): kvcu_forward() checks them first.
 */
int kvcu_embed(float *out, const float *table, const int *tokens, int T, int dim, kv_err *err)
{
    if (T < 0 || dim <= 0) return kv_fail(err, KV_ERR_ARG, "kvcu_embed: T %d, dim %d", T, dim);
    if (T == 0) return KV_OK;
    KV_LAUNCH(embed_kernel, elementwise_grid((int64_t)T * dim), KV_OPS_THREADS, 0, 0, out,
              table, tokens, T, dim);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
