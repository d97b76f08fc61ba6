/*
 * KV-cache quantization on the GPU (chapter 04), twin of reference_cpu/cache/kv_quant.c.
 * kvcu_quant_encode / kvcu_quant_decode take kv_quant_encode / kv_quant_decode's arguments
 * as device pointers and must produce the same bytes: the integer formats round through the
 * very lines of reference_cpu/cache/kv_quant_math.h, the float formats through the device's own
 * conversions (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h), which the CPU's software conversions
 * match bit for bit.
 *
 * quant_encode_elem_kernel (fp32, fp16, bf16, fp8): one thread per element, grid-stride.
 *   No element depends on another, so this is a plain streaming conversion.
 *
 * quant_encode_rows_kernel (int8, int8-gG, int4-g32, KIVI values): one block per token row, one warp
 *   per group of G channels (G = 32 ... d). Lanes stride over the group, a 5-step shuffle
 *   gives every lane the group's amax (int8) or min and max (KIVI), lane 0 writes the scale,
 *   and each lane its codes, one per byte, into shared memory. After a barrier the block
 *   packs the row (two int4 or four int2 codes per byte) and writes it with consecutive
 *   threads on consecutive bytes.
 *
 * quant_encode_keys_kernel (KIVI keys): one block per 32-token block. A key group is one
 *   channel over the 32 tokens, a column of the [32][d] tile: the block first copies the
 *   tile into shared memory row by row (coalesced), with rows padded to d + 1 floats so that
 *   32 lanes reading one column hit 32 different banks; then lane = token, one warp per
 *   channel, and the same reduce / code / pack steps as the rows kernel.
 *
 * quant_decode_kernel: one thread per element, kvq_decode_element() for the integer formats
 *   (the function attention will call inline) and the native conversions for the float ones.
 *
 * Min, max and amax are exact whatever the order of the shuffles, so a scale depends only on
 * its group's values: the result is the CPU's, bit for bit, in any schedule.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kv_quant.h"
#include "kvcu_internal.cuh"
#include "kvcu_quant_math.cuh"

#define KVQ_THREADS 128   /* threads of the element kernels and at most per row block */
#define KVQ_MAX_GRID 4096 /* element kernels loop beyond grid * block elements */
#define KVQ_SMEM_MAX (48 * 1024)

/* ---- float formats ----------------------------------------------------------------------- */

__global__ void quant_encode_elem_kernel(int fmt, const float *x, int64_t count, float scale,
                                         uint8_t *codes)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        kvcu_encode_float(fmt, codes, i, x[i], scale);
}

/* ---- integer formats: a group is kvcu_encode_group() (kvcu_quant_math.cuh) ----------------- */

/* Pack `rows` rows of d one-per-byte codes q [rows][d] into codes [rows][d * bits / 8]. */
__device__ inline void pack_rows_block(const uint8_t *q, int rows, int d, int bits, uint8_t *codes)
{
    const int per = 8 / bits, rb = d / per;
    for (int i = threadIdx.x; i < rows * rb; i += blockDim.x) {
        const int r = i / rb, b = i % rb;
        uint32_t byte = 0;
        for (int k = 0; k < per; k++) byte |= (uint32_t)q[r * d + b * per + k] << (k * bits);
        codes[(size_t)r * rb + b] = (uint8_t)byte;
    }
}

__global__ void quant_encode_rows_kernel(int fmt, const float *x, int d, int g, uint8_t *codes,
                                         uint8_t *meta)
{
    KV_DYNAMIC_SMEM(uint8_t, q); /* [d] this row's codes, one per byte */
    const int64_t t = blockIdx.x;
    const float *xr = x + t * d; /* [d] */
    const int warp = threadIdx.x / KV_WARP, n_warps = blockDim.x / KV_WARP, ng = d / g;
    for (int gi = warp; gi < ng; gi += n_warps) /* whole warps per group: no lane left out */
        kvcu_encode_group(fmt, xr + gi * g, 1, g, meta + (t * ng + gi) * 4, q + gi * g, 1);
    __syncthreads();
    pack_rows_block(q, 1, d, kvq_code_bits(fmt), codes + t * kvq_row_bytes(fmt, d));
}

__global__ void quant_encode_keys_kernel(int fmt, const float *x, int d, uint8_t *codes,
                                         kv_qsz *meta)
{
    KV_DYNAMIC_SMEM(float, tile);                  /* [32][d + 1] the block's keys */
    uint8_t *q = (uint8_t *)(tile + KV_KIVI_GROUP * (d + 1)); /* [32][d] codes, one a byte */
    const int64_t blk = blockIdx.x;
    const float *xb = x + blk * KV_KIVI_GROUP * d; /* [32][d] */
    for (int i = threadIdx.x; i < KV_KIVI_GROUP * d; i += blockDim.x)
        tile[(i / d) * (d + 1) + i % d] = xb[i];
    __syncthreads();
    const int warp = threadIdx.x / KV_WARP, n_warps = blockDim.x / KV_WARP;
    for (int c = warp; c < d; c += n_warps) /* channel c: a column, lane = token */
        kvcu_encode_group(fmt, tile + c, d + 1, KV_KIVI_GROUP, meta + blk * d + c, q + c, d);
    __syncthreads();
    pack_rows_block(q, KV_KIVI_GROUP, d, kvq_code_bits(fmt),
                    codes + blk * KV_KIVI_GROUP * kvq_row_bytes(fmt, d));
}

/* ---- decode ------------------------------------------------------------------------------- */

__global__ void quant_decode_kernel(int fmt, int role, const uint8_t *codes, const void *meta,
                                    int64_t n, int d, float scale, float *x)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * d;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v;
        switch (fmt) {
        case KV_QF_F16: v = __half2float(__ushort_as_half(((const unsigned short *)codes)[i])); break;
        case KV_QF_BF16:
            v = __bfloat162float(__ushort_as_bfloat16(((const unsigned short *)codes)[i]));
            break;
        case KV_QF_FP8_E4M3: {
            __nv_fp8_e4m3 e;
            e.__x = codes[i];
            v = (float)e * scale;
            break;
        }
        case KV_QF_FP8_E5M2: {
            __nv_fp8_e5m2 e;
            e.__x = codes[i];
            v = (float)e * scale;
            break;
        }
        default: v = kvq_decode_element(fmt, role, codes, meta, i / d, (int)(i % d), d, scale);
        }
        x[i] = v;
    }
}

/* ---- host wrappers --------------------------------------------------------------------------- */

static unsigned elem_grid(int64_t count)
{
    const int64_t blocks = (count + KVQ_THREADS - 1) / KVQ_THREADS;
    return blocks < KVQ_MAX_GRID ? (unsigned)(blocks > 0 ? blocks : 1) : KVQ_MAX_GRID;
}

/* The buffers of a call are there (n > 0) and its row count fits a grid. */
static int check_buffers(const char *fn, int fmt, int role, int64_t n, int d, const void *in,
                         const void *out, const void *meta, kv_err *err)
{
    if (!in || !out || (!meta && kv_quant_meta_bytes(fmt, role, n, d) > 0))
        return kv_fail(err, KV_ERR_ARG, "%s %s: NULL buffer", fn, kv_quant_name(fmt));
    if (n > 0x7fffffffLL)
        return kv_fail(err, KV_ERR_ARG, "%s: %lld rows exceed one launch", fn, (long long)n);
    return KV_OK;
}

extern "C" int kvcu_quant_encode(int fmt, int role, const float *x, int64_t n, int d, float scale,
                                 void *codes, void *meta, kv_err *err)
{
    int rc = kv_quant_check(fmt, role, n, d, scale, err);
    if (rc || n == 0) return rc;
    if ((rc = check_buffers("kvcu_quant_encode", fmt, role, n, d, x, codes, meta, err))) return rc;
    uint8_t *cb = (uint8_t *)codes;
    if (!kvq_is_sym(fmt) && !kvq_is_kivi(fmt)) {
        KV_LAUNCH(quant_encode_elem_kernel, elem_grid(n * d), KVQ_THREADS, 0, 0, fmt, x, n * d,
                  scale, cb);
    } else if (kvq_is_kivi(fmt) && role == KV_QROLE_KEY) {
        const size_t smem = (size_t)KV_KIVI_GROUP * (d + 1) * sizeof(float) + (size_t)KV_KIVI_GROUP * d;
        if (smem > KVQ_SMEM_MAX)
            return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_quant_encode %s keys: d = %d needs %zu "
                           "bytes of shared memory (at most %d)", kv_quant_name(fmt), d, smem,
                           KVQ_SMEM_MAX);
        KV_LAUNCH(quant_encode_keys_kernel, (unsigned)(n / KV_KIVI_GROUP), KVQ_THREADS, smem, 0,
                  fmt, x, d, cb, (kv_qsz *)meta);
    } else {
        const int g = kvq_row_group(fmt, role, d), ng = d / g;
        const int threads = KV_WARP * (ng < KVQ_THREADS / KV_WARP ? ng : KVQ_THREADS / KV_WARP);
        KV_LAUNCH(quant_encode_rows_kernel, (unsigned)n, threads, (size_t)d, 0, fmt, x, d, g, cb,
                  (uint8_t *)meta);
    }
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

extern "C" int kvcu_quant_decode(int fmt, int role, const void *codes, const void *meta, int64_t n,
                                 int d, float scale, float *x, kv_err *err)
{
    int rc = kv_quant_check(fmt, role, n, d, scale, err);
    if (rc || n == 0) return rc;
    if ((rc = check_buffers("kvcu_quant_decode", fmt, role, n, d, codes, x, meta, err))) return rc;
    KV_LAUNCH(quant_decode_kernel, elem_grid(n * d), KVQ_THREADS, 0, 0, fmt, role,
              (const uint8_t *)codes, meta, n, d, scale, x);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}
