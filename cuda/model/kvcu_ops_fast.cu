/*
 * The forward pass's matrix products arranged for speed on 16-bit weights, the twin of
 * reference_cpu/model/kv_ops_fast.c (the CPU's fast rows of the same products). Both are held
 * to kv_matmul_strided() of kv_ops.c, here by a stated bound (tests/test_gpu_ops.c) since the
 * operands are rounded to 16 bits; kvcu_ops.cu keeps the fp32 kernels, kv_ops.c's twins.
 *
 * to16_kernel (kvcu_to16): floats to bf16 or fp16 bits, one thread per element. It makes the
 *   16-bit copy of the weights once (kvcu_model_set_weights) and, in the engine, the 16-bit
 *   copy of each projection's input once per layer input (kvcu_forward.cu's stage16()): the
 *   Q, K and V products share one, the FFN's gate and up another, Wo and W2 one each. Rounded
 *   inside the GEMM instead, every block of 128 outputs would convert the same rows again
 *   (5 times per row for dim 576, 12 for a hidden layer of 1 536), and the staged copies could
 *   not be cp.async: cp.async moves bytes, it cannot convert.
 *
 * matmul_kernel_mma (kvcu_matmul_x16): y = x·Wᵀ on tensor cores, x and W both 16-bit (bf16 or
 *   fp16). A block of 8 warps computes a BM x 128 tile of y (BM 128 tokens, or 16 when T < 128:
 *   short chunks), walking 32 columns at a time through shared memory; a warp holds its 64 x 32
 *   (or 16 x 16) outputs in fp32 mma accumulators and takes its A fragments (x) and B fragments
 *   (the W rows, Kᵀ-shaped) by ldmatrix from rows padded to 40 halves (80 bytes: the 8 rows of
 *   an 8x8 matrix start on banks 0, 20, 8, 28, 16, 4, 24, 12, so no two of its 16-byte rows
 *   share a bank). The tiles arrive through a ring of S buffers (S 3 for 128-token tiles,
 *   60 KiB; 4 for 16-token ones, 45 KiB): tile k + S - 1 is copied while tile k is multiplied,
 *   each row of a tile as 16-byte cp.async copies straight from global memory into its padded
 *   row (no registers on the way), zeros stored plainly for rows past T or out and columns past
 *   in. Where a row is not 16-byte aligned (in or ldw not a multiple of 8, or a base pointer
 *   off 16 bytes) the same tiles are staged by 2-byte loads and stores, the same values, the
 *   same sums; below sm_80 cp.async compiles to plain loads and stores (no kernel here runs
 *   there: the host routes those devices to the GEMV). One wait and one __syncthreads() per
 *   tile: the wait lands this thread's copies of tile k, the barrier everyone's, and it also
 *   tells each thread that tile k - 1's buffer, the next one to refill, is read by no one.
 *   No split-K: every output is one chain of mma.sync steps over k in order, the same whichever
 *   BM, block or batch its row falls in, so a sequence's rows are bit-identical alone or in any
 *   batch. Against the fp32 reference the rounding of x and W (unit roundoff u: 2^-11 fp16,
 *   2^-8 bf16) bounds the error: |y - y_ref| <= (2u + u² + in·2^-23)·Σ_j |x_j·w_j|.
 *   kvcu_matmul_w16 is the same product from an fp32 x (rounded first into the caller's scratch:
 *   the same bits); below sm_80 (no mma.sync.m16n8k16) it runs gemv_kernel_w16 instead, within
 *   that bound. It exists for the test of the 16-bit path (tests/test_gpu_ops.c): the engine
 *   stages each layer input once (stage16()) and calls kvcu_matmul_x16 itself.
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
 * None of these has run on a GPU yet: the emulation build (cuda/emu/) runs them on CPU fibers
 * with the PTX ISA's fragment layouts and cp.async's commit/wait order, and docs/ptx-table.md
 * counts what nvcc makes of them per architecture.
 */
#include "kvcu_internal.cuh"
#include "kvcu_mma.cuh"
#include "kvcu_vec.cuh"

#define KV_OPS_THREADS 128 /* threads per block of the element kernel */
#define KV_MAX_GRID 4096   /* it loops when n exceeds grid * block */

/* ---- 16-bit copies ------------------------------------------------------------------------ */

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
    const int64_t blocks = (n + KV_OPS_THREADS - 1) / KV_OPS_THREADS;
    KV_LAUNCH(to16_kernel, blocks < KV_MAX_GRID ? (unsigned)blocks : KV_MAX_GRID, KV_OPS_THREADS,
              0, 0, dst, src, n, bf16);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* ---- matmul on tensor cores (16-bit x and W) ----------------------------------------------- */

#define MMA_BN 128 /* outputs per block */
#define MMA_BK 32  /* columns per staged tile */
#define MMA_LD (MMA_BK + 8) /* halves per staged row: 16-byte aligned, conflict-free ldmatrix */
#define MMA_CHUNKS (MMA_BK / 8) /* 16-byte copies per staged row */
#define MMA_THREADS 256

/* Buffers in the ring of a BM-token block: 3 x 20 KiB for 128 tokens, 4 x 11.25 KiB for 16. */
__host__ __device__ constexpr int mma_stages(int BM) { return BM >= 128 ? 3 : 4; }

/* Rows r0 .. r0 + ROWS - 1 of a 16-bit matrix M [n][ld], columns j0 .. j0 + 31 (zeros past row n
 * and column in), into a staged tile [ROWS][MMA_LD]: cp.async copies of 16 bytes (VEC: every
 * row 16-byte aligned and in a multiple of 8, so a copy is all inside or all outside), or
 * 2-byte loads and stores. A thread's copies are the same chunks in every tile (a count known
 * at compile time: the loop unrolls, its rows and columns are constants plus threadIdx.x);
 * the caller commits the batch. */
template <int ROWS>
__device__ inline void mma_stage(uint16_t *dst, const uint16_t *M, int r0, int n, int ld, int in,
                                 int j0, int vec)
{
    constexpr int N = ROWS * MMA_CHUNKS; /* 16-byte chunks of the tile */
    if (vec) {
        KV_UNROLL
        for (int i = 0; i < (N + MMA_THREADS - 1) / MMA_THREADS; i++) {
            const int e = threadIdx.x + i * MMA_THREADS;
            if (N % MMA_THREADS && e >= N) break;
            const int r = e / MMA_CHUNKS, j = j0 + 8 * (e % MMA_CHUNKS);
            uint16_t *d = dst + r * MMA_LD + 8 * (e % MMA_CHUNKS);
            if (r0 + r < n && j < in) kvcu_cp16(d, M + (size_t)(r0 + r) * ld + j);
            else *(uint4 *)(void *)d = make_uint4(0, 0, 0, 0);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * MMA_BK; e += MMA_THREADS) {
            const int r = e / MMA_BK, c = e % MMA_BK, j = j0 + c;
            dst[r * MMA_LD + c] = r0 + r < n && j < in ? M[(size_t)(r0 + r) * ld + j] : 0;
        }
    }
}

/* Block (token tile, output tile): y[t0 .. t0+BM)[o0 .. o0+128) = x · Wᵀ, x [T][in],
 * W [out][ldw]. Warps WM x WN over the tile; each owns MI x NI fragments of 16 x 8 outputs. */
template <int BM, int BF16>
__global__ void matmul_kernel_mma(float *y, const uint16_t *x, const uint16_t *W, int T, int in,
                                  int out, int ldw, int vec)
{
    constexpr int S = mma_stages(BM), WM = BM >= 128 ? 2 : 1, WN = 8 / WM;
    constexpr int MI = BM / WM / 16, NI = MMA_BN / WN / 8;
    KV_DYNAMIC_SMEM(uint16_t, sm);
    uint16_t *as = sm;                      /* [S][BM][MMA_LD] x, 16-bit */
    uint16_t *bs = sm + S * BM * MMA_LD;    /* [S][128][MMA_LD] W rows, 16-bit */
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
    /* the ring's first S - 1 tiles in flight, one batch each (an empty batch past the last) */
    for (int s = 0; s < S - 1; s++) {
        if (s < n_tiles) {
            mma_stage<BM>(as + s * BM * MMA_LD, x, t0, T, in, in, s * MMA_BK, vec);
            mma_stage<MMA_BN>(bs + s * MMA_BN * MMA_LD, W, o0, out, ldw, in, s * MMA_BK, vec);
        }
        kvcu_cp_commit();
    }
    for (int kt = 0; kt < n_tiles; kt++) {
        kvcu_cp_wait<S - 2>(); /* batches 0 .. kt of this thread have landed: tile kt */
        __syncthreads();       /* every thread's have; and tile kt - 1's buffer is free */
        const int nt = kt + S - 1; /* into the buffer tile kt - 1 held */
        if (nt < n_tiles) {
            mma_stage<BM>(as + (nt % S) * BM * MMA_LD, x, t0, T, in, in, nt * MMA_BK, vec);
            mma_stage<MMA_BN>(bs + (nt % S) * MMA_BN * MMA_LD, W, o0, out, ldw, in, nt * MMA_BK,
                              vec);
        }
        kvcu_cp_commit();
        const uint16_t *ab = as + (kt % S) * BM * MMA_LD, *bb = bs + (kt % S) * MMA_BN * MMA_LD;
        KV_UNROLL
        for (int ks = 0; ks < MMA_BK / 16; ks++) {
            uint32_t a[MI][4], b[NI][2];
            KV_UNROLL
            for (int mi = 0; mi < MI; mi++)
                kvcu_ldmatrix_x4(a[mi], ab + ((wm * MI + mi) * 16 + l % 16) * MMA_LD + ks * 16 +
                                            8 * (l / 16));
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

/* One instantiation on the product's grid; its ring needs more than the default 48 KiB of
 * dynamic shared memory at BM 128 (every sm_80+ device allows 99 KiB or more). */
template <int BM, int BF16>
static cudaError_t matmul_mma_launch(float *y, const uint16_t *x, const uint16_t *W, int T,
                                     int in, int out, int ldw, int vec)
{
    dim3 grid(kv_ceil_div(T, BM), kv_ceil_div(out, MMA_BN));
    const size_t smem = (size_t)mma_stages(BM) * (BM + MMA_BN) * MMA_LD * sizeof(uint16_t);
    const cudaError_t e = cudaFuncSetAttribute(matmul_kernel_mma<BM, BF16>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem);
    if (e != cudaSuccess) return e;
    KV_LAUNCH((matmul_kernel_mma<BM, BF16>), grid, MMA_THREADS, smem, 0, y, x, W, T, in, out, ldw,
              vec);
    return cudaGetLastError();
}

/* The shape checks of the two entries, in the name of @p who. */
static int mm16_check(const char *who, int T, int in, int out, int ldw, kv_err *err)
{
    if (T < 0 || in <= 0 || out <= 0 || ldw < in)
        return kv_fail(err, KV_ERR_ARG, "%s: T %d, in %d, out %d, ldw %d", who, T, in, out, ldw);
    return KV_OK;
}

int kvcu_matmul_x16(float *y, const uint16_t *x, const uint16_t *W, int bf16, int T, int in,
                    int out, int ldw, kv_err *err)
{
    int st = mm16_check("kvcu_matmul_x16", T, in, out, ldw, err);
    if (st || T == 0) return st;
    if (!kvcu_has_mma())
        return kvcu_fail_arch(err, "kvcu_matmul_x16", "mma.sync.m16n8k16 with fp32 accumulators",
                              KVCU_SM_MMA);
    if ((int64_t)kv_ceil_div(out, MMA_BN) > 65535)
        return kv_fail(err, KV_ERR_ARG, "kvcu_matmul_x16: %d outputs need more than 65535 "
                       "tiles of %d", out, MMA_BN);
    const int vec = ((uintptr_t)x | (uintptr_t)W) % 16 == 0 && in % 8 == 0 && ldw % 8 == 0;
    cudaError_t e;
    if (T >= 128)
        e = bf16 ? matmul_mma_launch<128, 1>(y, x, W, T, in, out, ldw, vec)
                 : matmul_mma_launch<128, 0>(y, x, W, T, in, out, ldw, vec);
    else
        e = bf16 ? matmul_mma_launch<16, 1>(y, x, W, T, in, out, ldw, vec)
                 : matmul_mma_launch<16, 0>(y, x, W, T, in, out, ldw, vec);
    KV_CUDA_TRY(e, err);
    return KV_OK;
}

int kvcu_matmul_w16(float *y, const float *x, uint16_t *x16, const uint16_t *W, int bf16,
                    int T, int in, int out, int ldw, kv_err *err)
{
    int st = mm16_check("kvcu_matmul_w16", T, in, out, ldw, err);
    if (st || T == 0) return st;
    if (!kvcu_has_mma()) /* below sm_80: the CUDA cores' GEMV, x unrounded (a tighter bound) */
        return kvcu_matmul_w16_gemv(y, x, W, bf16, T, in, out, ldw, err);
    if (!x16) return kv_fail(err, KV_ERR_ARG, "kvcu_matmul_w16: no scratch for the 16-bit x");
    st = kvcu_to16(x16, x, (int64_t)T * in, bf16, err);
    if (!st) st = kvcu_matmul_x16(y, x16, W, bf16, T, in, out, ldw, err);
    return st;
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
