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
 * matmul_kernel_mma (16-bit weights, kvcu_matmul_w16): y = x·Wᵀ on tensor cores, W stored as
 *   bf16 or fp16 on the device (kvcu_model_set_weights), x rounded to the same type as its
 *   tile is staged. A block of 8 warps computes a BM x 128 tile of y (BM 128 tokens, or 16
 *   when T < 128: decode steps and short chunks), walking in 32 columns at a time through
 *   shared memory (double-buffered); a warp holds its 64 x 32 (or 16 x 16) outputs in fp32
 *   mma accumulators, its A fragments (x) and B fragments (the W rows, Kᵀ-shaped) by
 *   ldmatrix. No split-K: every output is one chain of mma.sync steps over k in order, the
 *   same whichever BM, block or batch its row falls in, so a sequence's rows are bit-identical
 *   alone or in any batch, and at T = 1 as at T = 1000. Against the fp32 reference the
 *   rounding of x and W (unit roundoff u: 2^-11 fp16, 2^-8 bf16) bounds the error:
 *   |y - y_ref| <= (2u + u² + in·2^-23)·Σ_j |x_j·w_j| (tests/test_gpu_ops.c). Below sm_80
 *   (no mma.sync.m16n8k16) kvcu_matmul_w16 runs gemv_kernel_w16 instead, within that bound.
 *
 * gemv_kernel_w16 (16-bit weights, the engine's one-token rows, kvcu_matmul_w16_gemv): a warp
 *   per output, lane l reading 8 weights at a time with one 16-byte load (kvcu_ld16(),
 *   ld.global.nc.v4: a warp streams 512 contiguous bytes of W per load) and applying them to
 *   up to 4 rows of x kept fp32 (only W is rounded: |y - y_ref| <= (u + in·2^-23)·Σ|x·w|);
 *   each row sums in the same order alone or beside others, so its bits do not depend on T.
 *   A one-token step reads every weight once: bandwidth-bound, where mma tiles of 16 rows
 *   would waste 15/16 of their work. Rows not 16-byte aligned take 2-byte loads of the same
 *   values, the same sums.
 *
 * swiglu_kernel, add_kernel, embed_kernel: one thread per element (grid-stride loop).
 */
#include "kvcu_internal.cuh"
#include "kvcu_mma.cuh"
#include "kvcu_vec.cuh"

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

/* ---- matmul on tensor cores (16-bit weights) ------------------------------------------ */

#define MMA_BN 128 /* outputs per block */
#define MMA_BK 32  /* columns per staged tile */
#define MMA_LD (MMA_BK + 8) /* halves per staged row: 16-byte aligned, conflict-free ldmatrix */
#define MMA_THREADS 256

/* Block (token tile, output tile): y[t0 .. t0+BM)[o0 .. o0+128) = x · Wᵀ. Warps WM x WN over
 * the tile; each owns MI x NI fragments of 16 x 8 outputs. */
template <int BM, int BF16>
__global__ void matmul_kernel_mma(float *y, const float *x, const uint16_t *W, int T, int in,
                                  int out, int ldw)
{
    constexpr int WM = BM >= 128 ? 2 : 1, WN = 8 / WM;
    constexpr int MI = BM / WM / 16, NI = MMA_BN / WN / 8;
    KV_DYNAMIC_SMEM(uint16_t, sm);
    uint16_t *as = sm;                      /* [2][BM][MMA_LD] x, 16-bit */
    uint16_t *bs = sm + 2 * BM * MMA_LD;    /* [2][128][MMA_LD] W rows, 16-bit */
    const int tid = threadIdx.x, warp = tid / KV_WARP, l = tid % KV_WARP;
    const int wm = warp / WN, wn = warp % WN, g = l / 4, tq = l % 4;
    const int t0 = blockIdx.x * BM, o0 = blockIdx.y * MMA_BN;
    float acc[MI][NI][4];
    KV_UNROLL
    for (int mi = 0; mi < MI; mi++)
        KV_UNROLL
        for (int ni = 0; ni < NI; ni++)
            for (int i = 0; i < 4; i++) acc[mi][ni][i] = 0.0f;
    const int n_tiles = (in + MMA_BK - 1) / MMA_BK;
    for (int kt = 0; kt <= n_tiles; kt++) {
        /* stage tile kt (zeros outside the matrices) while tile kt - 1 is multiplied */
        if (kt < n_tiles) {
            uint16_t *ab = as + (kt % 2) * BM * MMA_LD, *bb = bs + (kt % 2) * MMA_BN * MMA_LD;
            const int j0 = kt * MMA_BK;
            for (int e = tid; e < BM * MMA_BK; e += MMA_THREADS) {
                const int r = e / MMA_BK, c = e % MMA_BK, j = j0 + c;
                ab[r * MMA_LD + c] = kvcu_bits16<BF16>(
                    t0 + r < T && j < in ? x[(size_t)(t0 + r) * in + j] : 0.0f);
            }
            for (int e = tid; e < MMA_BN * MMA_BK; e += MMA_THREADS) {
                const int r = e / MMA_BK, c = e % MMA_BK, j = j0 + c;
                bb[r * MMA_LD + c] = o0 + r < out && j < in ? W[(size_t)(o0 + r) * ldw + j] : 0;
            }
        }
        if (kt > 0) {
            const uint16_t *ab = as + ((kt - 1) % 2) * BM * MMA_LD;
            const uint16_t *bb = bs + ((kt - 1) % 2) * MMA_BN * MMA_LD;
            KV_UNROLL
            for (int ks = 0; ks < MMA_BK / 16; ks++) {
                uint32_t a[MI][4], b[NI][2];
                KV_UNROLL
                for (int mi = 0; mi < MI; mi++)
                    kvcu_ldmatrix_x4(a[mi], ab + ((wm * MI + mi) * 16 + l % 16) * MMA_LD +
                                                ks * 16 + 8 * (l / 16));
                KV_UNROLL
                for (int ni = 0; ni < NI; ni += 2) {
                    uint32_t r[4]; /* r[0..1]: outputs ni·8 .., r[2..3]: (ni + 1)·8 .. */
                    kvcu_ldmatrix_x4(r, bb + ((wn * NI + ni) * 8 + l % 8 + 8 * (l / 16)) * MMA_LD +
                                            ks * 16 + 8 * ((l / 8) % 2));
                    b[ni][0] = r[0];
                    b[ni][1] = r[1];
                    b[ni + 1][0] = r[2];
                    b[ni + 1][1] = r[3];
                }
                KV_UNROLL
                for (int mi = 0; mi < MI; mi++)
                    KV_UNROLL
                    for (int ni = 0; ni < NI; ni++) kvcu_mma<BF16>(acc[mi][ni], a[mi], b[ni]);
            }
        }
        __syncthreads(); /* tile kt is in; tile kt - 1's buffer may be overwritten */
    }
    KV_UNROLL
    for (int mi = 0; mi < MI; mi++)
        KV_UNROLL
        for (int ni = 0; ni < NI; ni++)
            for (int i = 0; i < 4; i++) {
                const int t = t0 + (wm * MI + mi) * 16 + g + 8 * (i / 2);
                const int o = o0 + (wn * NI + ni) * 8 + 2 * tq + (i & 1);
                if (t < T && o < out) y[(size_t)t * out + o] = acc[mi][ni][i];
            }
}

template <int BM, int BF16>
static void matmul_mma_launch(float *y, const float *x, const uint16_t *W, int T, int in,
                              int out, int ldw)
{
    dim3 grid(kv_ceil_div(T, BM), kv_ceil_div(out, MMA_BN));
    const size_t smem = 2 * (size_t)(BM + MMA_BN) * MMA_LD * sizeof(uint16_t);
    KV_LAUNCH((matmul_kernel_mma<BM, BF16>), grid, MMA_THREADS, smem, 0, y, x, W, T, in, out,
              ldw);
}

int kvcu_matmul_w16(float *y, const float *x, const uint16_t *W, int bf16, int T, int in,
                    int out, int ldw, kv_err *err)
{
    if (T < 0 || in <= 0 || out <= 0 || ldw < in)
        return kv_fail(err, KV_ERR_ARG, "kvcu_matmul_w16: T %d, in %d, out %d, ldw %d", T, in,
                       out, ldw);
    if (T == 0) return KV_OK;
    if (!kvcu_has_mma()) /* below sm_80: the CUDA cores' GEMV, x unrounded (a tighter bound) */
        return kvcu_matmul_w16_gemv(y, x, W, bf16, T, in, out, ldw, err);
    if ((int64_t)kv_ceil_div(out, MMA_BN) > 65535)
        return kv_fail(err, KV_ERR_ARG, "kvcu_matmul_w16: %d outputs need more than 65535 "
                       "tiles of %d", out, MMA_BN);
    if (T >= 128)
        bf16 ? matmul_mma_launch<128, 1>(y, x, W, T, in, out, ldw)
             : matmul_mma_launch<128, 0>(y, x, W, T, in, out, ldw);
    else
        bf16 ? matmul_mma_launch<16, 1>(y, x, W, T, in, out, ldw)
             : matmul_mma_launch<16, 0>(y, x, W, T, in, out, ldw);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* ---- GEMV on 16-bit weights (decode rows) ----------------------------------------------- */

#define GV_WARPS 4 /* outputs per block, a warp each */
#define GV_ROWS 4  /* rows of x per warp: each 16-byte load of W serves all of them */

/* Weights j .. j + 7 of a row as floats (exact: fp16 and bf16 widen without rounding): one
 * 16-byte load (VEC: the row is 16-byte aligned) or eight 2-byte loads, the same values. */
template <int BF16, int VEC>
__device__ inline void gemv_w8(const uint16_t *w, float f[8])
{
    if (VEC)
        kvcu_unpack<BF16 ? KVCU_V_BF16 : KVCU_V_F16>(kvcu_ld16(w), f);
    else
        for (int i = 0; i < 8; i++)
            f[i] = BF16 ? __uint_as_float((uint32_t)w[i] << 16)
                        : __half2float(__ushort_as_half(w[i]));
}

/* Block (output group, row group): warp w computes output o = blockIdx.x·4 + w for rows
 * t0 .. t0 + 3. Lane l takes 8 consecutive weights at j = l·8 + 256·k, so a warp's load is
 * 512 contiguous bytes; each row sums its products in j order per lane, then the xor
 * butterfly. Nothing in that order depends on T or on the other rows of the group. */
template <int BF16, int VEC>
__global__ void gemv_kernel_w16(float *y, const float *x, const uint16_t *W, int T, int in,
                                int out, int ldw)
{
    const int warp = threadIdx.x / KV_WARP, l = threadIdx.x % KV_WARP;
    const int o = blockIdx.x * GV_WARPS + warp, t0 = blockIdx.y * GV_ROWS;
    if (o >= out) return; /* the whole warp */
    const uint16_t *wr = W + (size_t)o * ldw;
    float acc[GV_ROWS];
    for (int r = 0; r < GV_ROWS; r++) acc[r] = 0.0f;
    for (int j0 = l * 8; j0 < in; j0 += KV_WARP * 8) {
        float w[8];
        if (j0 + 8 <= in) {
            gemv_w8<BF16, VEC>(wr + j0, w);
        } else { /* the row's last partial chunk */
            for (int i = 0; i < 8; i++) w[i] = 0.0f;
            for (int i = 0; j0 + i < in; i++)
                w[i] = BF16 ? __uint_as_float((uint32_t)wr[j0 + i] << 16)
                            : __half2float(__ushort_as_half(wr[j0 + i]));
        }
        KV_UNROLL
        for (int r = 0; r < GV_ROWS; r++) {
            if (t0 + r >= T) break;
            const float *xr = x + (size_t)(t0 + r) * in + j0; /* [8] of row t0 + r */
            for (int i = 0; i < 8 && j0 + i < in; i++) acc[r] += xr[i] * w[i];
        }
    }
    for (int r = 0; r < GV_ROWS; r++) {
        float v = acc[r];
        for (int off = KV_WARP / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (l == 0 && t0 + r < T) y[(size_t)(t0 + r) * out + o] = v;
    }
}

int kvcu_matmul_w16_gemv(float *y, const float *x, const uint16_t *W, int bf16, int T, int in,
                         int out, int ldw, kv_err *err)
{
    if (T < 0 || in <= 0 || out <= 0 || ldw < in || kv_ceil_div(T, GV_ROWS) > 65535)
        return kv_fail(err, KV_ERR_ARG, "kvcu_matmul_w16_gemv: T %d, in %d, out %d, ldw %d", T,
                       in, out, ldw);
    if (T == 0) return KV_OK;
    dim3 grid(kv_ceil_div(out, GV_WARPS), kv_ceil_div(T, GV_ROWS));
    const int vec = (uintptr_t)W % 16 == 0 && ldw % 8 == 0; /* every row 16-byte aligned */
#define GV_LAUNCH(B, V) \
    KV_LAUNCH((gemv_kernel_w16<B, V>), grid, GV_WARPS * KV_WARP, 0, 0, y, x, W, T, in, out, ldw)
    if (bf16 && vec) GV_LAUNCH(1, 1);
    else if (bf16) GV_LAUNCH(1, 0);
    else if (vec) GV_LAUNCH(0, 1);
    else GV_LAUNCH(0, 0);
#undef GV_LAUNCH
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

__global__ void to16_kernel(uint16_t *dst, const float *src, int64_t n, int bf16)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = bf16 ? kvcu_bits16<1>(src[i]) : kvcu_bits16<0>(src[i]);
}

int kvcu_to16(uint16_t *dst, const float *src, int64_t n, int bf16, kv_err *err)
{
    if (n < 0) return kv_fail(err, KV_ERR_ARG, "kvcu_to16: n %lld", (long long)n);
    if (n == 0) return KV_OK;
    KV_LAUNCH(to16_kernel, elementwise_grid(n), KV_OPS_THREADS, 0, 0, dst, src, n, bf16);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
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
