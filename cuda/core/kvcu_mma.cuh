/**
 * @file kvcu_mma.cuh
 * Tensor cores from CUDA C++: the warp-wide mma.sync.m16n8k16 (fp16 or bf16 inputs, fp32
 * accumulators; sm_80 and newer) and ldmatrix (m8n8 .x1/.x2/.x4, plain and .trans; sm_75),
 * the two instructions the tensor-core kernels are built of (flash prefill,
 * cuda/attention/kvcu_flash_mma.cu; the engine's decode for large groups, kvcu_decode_mma.cu;
 * the absorbed MLA decode, kvcu_attention_mla.cu; the projections' GEMM,
 * cuda/model/kvcu_ops_fast.cu).
 * On a GPU each helper is one inline PTX instruction; in the emulation build (cuda/emu/mma.cpp)
 * the warp meets, each lane reads the fragment registers of the others where the PTX ISA puts
 * them and computes its own, so a kernel holding an element in the wrong register fails there
 * as it would on the device (and an mma on an emulated device below sm_80, KVEMU_SM, aborts).
 *
 * Fragments of one m16n8k16 product D = A·B + C (PTX ISA, "Matrix Fragments for
 * mma.m16n8k16"; g = lane / 4, t = lane % 4; each 32-bit register holds two 16-bit elements,
 * the lower column (or row, for B) in the low half):
 *
 *          A 16x16 (row major)                 B 16x8               C, D 16x8 (fp32)
 *        cols 0..7      cols 8..15          col g                  cols 2t, 2t+1
 *   row g    a[0]: 2t,2t+1  a[2]: 2t+8,2t+9   rows 2t,2t+1:   b[0]    row g:     c[0], c[1]
 *   row g+8  a[1]: 2t,2t+1  a[3]: 2t+8,2t+9   rows 2t+8,2t+9: b[1]    row g + 8: c[2], c[3]
 *
 * ldmatrix gives these without shuffles: lanes 8i .. 8i+7 point at the 8 rows (16 bytes each,
 * 16-byte aligned, shared memory) of 8x8 matrix i, and lane l receives row l/4, elements
 * 2(l%4), 2(l%4)+1 of matrix i in register i; with .trans, of its transpose. So .x4 over a
 * row-major 16x16 tile (lane l -> row l % 16, column 8·(l / 16)) yields a[0..3] in order; an
 * [n][k] tile (K rows: S = Q·Kᵀ) read plainly yields B; a [k][n] tile (V rows: O = P·V) read
 * with .trans yields B; and two adjacent C fragments of a 16x16 block, packed to 16 bits, are
 * an A fragment (FlashAttention-2 keeps P in registers that way).
 */
#ifndef KVCU_MMA_CUH
#define KVCU_MMA_CUH

#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <string.h>

#include "kv_cuda.cuh"

#ifdef KV_CUDA_EMULATION
#include "kvemu_mma.h"
#endif

/* Two floats as one register of two 16-bit elements: lo in the low half. */
__device__ inline uint32_t kvcu_pack_f16(float lo, float hi)
{
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) |
           (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

__device__ inline uint32_t kvcu_pack_bf16(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

/* The pack of the element type: BF16 1 for bf16, 0 for fp16. */
template <int BF16>
__device__ inline uint32_t kvcu_pack2(float lo, float hi)
{
    return BF16 ? kvcu_pack_bf16(lo, hi) : kvcu_pack_f16(lo, hi);
}

/* One 16-bit element of the type as its bits. */
template <int BF16>
__device__ inline uint16_t kvcu_bits16(float x)
{
    return BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                : __half_as_ushort(__float2half_rn(x));
}

/* One-byte codes to fp16 operands, two a register (lo in the low half), exactly; what a kernel
 * runs once per tile to turn int8 or fp8 rows into the 16-bit rows ldmatrix reads.
 *
 * int8, four codes (the bytes of x, lowest first) by the magic number: b ^ 0x80 is b + 128
 * (0 .. 255) as an unsigned byte; PRMT sets it under 0x64, the fp16 1024 whose ulp is 1, so the
 * half reads 1024 + 128 + b; one sub.f16x2 of 1152 (0x6480) leaves b. Exact for every int8:
 * 1152 + b lies in [1024, 1279] and b in [-128, 127], integers fp16 holds, and the difference
 * of two fp16 integers that is an fp16 integer is exact. No integer-to-float conversion.
 * h[0]: codes 0, 1; h[1]: codes 2, 3. */
__device__ __forceinline__ void kvcu_i8x4_f16(uint32_t x, uint32_t h[2])
{
    const uint32_t u = x ^ 0x80808080u, m = 0x64806480u; /* 1152 in both halves */
    const uint32_t lo = __byte_perm(u, 0x64646464u, 0x4140), hi = __byte_perm(u, 0x64646464u, 0x4342);
    __half2 a, b, c;
    memcpy(&c, &m, 4);
    memcpy(&a, &lo, 4);
    memcpy(&b, &hi, 4);
    a = __hsub2(a, c);
    b = __hsub2(b, c);
    memcpy(&h[0], &a, 4);
    memcpy(&h[1], &b, 4);
}

/* fp8 E4M3, two codes (x's low byte first) -> two halves: cvt.rn.f16x2.e4m3x2 from sm_89 on
 * (exact: every E4M3 value is an fp16 one), cuda_fp8.h's software decode below sm_89 and in
 * the emulation build (where it computes what the instruction does, cuda/emu/README.md). */
__device__ __forceinline__ uint32_t kvcu_e4m3x2_f16(uint16_t x)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(KV_CUDA_EMULATION)
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
    return r;
#else
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)x, __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
#endif
}

/* fp8 E5M2, four codes (the bytes of x) -> four halves, on every architecture: an E5M2 code is
 * the high byte of the fp16 of the same value (1 sign, 5 exponent bits of bias 15, the top 2
 * mantissa bits), so PRMT puts each under a zero byte. h[0]: codes 0, 1; h[1]: codes 2, 3. */
__device__ __forceinline__ void kvcu_e5m2x4_f16(uint32_t x, uint32_t h[2])
{
    h[0] = __byte_perm(x, 0u, 0x1404);
    h[1] = __byte_perm(x, 0u, 0x3424);
}

/* The instruction for input type TY ("f16" or "bf16"), accumulating into c in place. It exists
 * from sm_80 on (m16n8k16 with fp32 accumulators, and any bf16 mma): compiled for an older
 * architecture the helper traps instead, and the host never launches a kernel that calls it
 * there (kvcu_has_mma(), kv_cuda.cuh: the CUDA-core paths run instead). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < KVCU_SM_MMA * 10
#define KVCU_MMA_ASM(TY) __trap()
#else
#define KVCU_MMA_ASM(TY)                                                                       \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 "                    \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                    \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#endif

/** c += A·B on the warp's tensor cores: fp16 inputs, fp32 accumulators. */
__device__ inline void kvcu_mma_f16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef KV_CUDA_EMULATION
    kvemu_mma_m16n8k16(0, c, a, b);
#else
    KVCU_MMA_ASM("f16");
#endif
}

/** c += A·B with bf16 inputs, fp32 accumulators. */
__device__ inline void kvcu_mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef KV_CUDA_EMULATION
    kvemu_mma_m16n8k16(1, c, a, b);
#else
    KVCU_MMA_ASM("bf16");
#endif
}

/* The mma of the element type. */
template <int BF16>
__device__ inline void kvcu_mma(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    if (BF16) kvcu_mma_bf16(c, a, b);
    else kvcu_mma_f16(c, a, b);
}

#ifndef KV_CUDA_EMULATION
/* ldmatrix's operand: the 32-bit shared-window address of a generic pointer into shared. */
__device__ inline uint32_t kvcu_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}
#endif

/* One ldmatrix helper: @p row is this lane's row address (lanes 8i .. 8i+7: matrix i).
 * PTX: the instruction text, then the "=r" operands of r[0 .. N-1]. */
#ifdef KV_CUDA_EMULATION
#define KVCU_LDMATRIX_FN(name, N, TRANS, PTX, ...)                                             \
    __device__ inline void name(uint32_t r[N], const void *row)                                \
    {                                                                                          \
        kvemu_ldmatrix(N, TRANS, r, row);                                                      \
    }
#else
#define KVCU_LDMATRIX_FN(name, N, TRANS, PTX, ...)                                             \
    __device__ inline void name(uint32_t r[N], const void *row)                                \
    {                                                                                          \
        asm volatile(PTX : __VA_ARGS__ : "r"(kvcu_smem_addr(row)));                            \
    }
#endif

/** .x1: lanes 0-7 give the rows of one 8x8 matrix; .x2: lanes 0-15, two; .x4: all lanes,
 * four. The _trans forms give each lane elements of the transposed matrices. */
KVCU_LDMATRIX_FN(kvcu_ldmatrix_x1, 1, 0, "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];",
                 "=r"(r[0]))
KVCU_LDMATRIX_FN(kvcu_ldmatrix_x2, 2, 0,
                 "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];", "=r"(r[0]), "=r"(r[1]))
KVCU_LDMATRIX_FN(kvcu_ldmatrix_x4, 4, 0,
                 "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];", "=r"(r[0]),
                 "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))
KVCU_LDMATRIX_FN(kvcu_ldmatrix_x1_trans, 1, 1,
                 "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];", "=r"(r[0]))
KVCU_LDMATRIX_FN(kvcu_ldmatrix_x2_trans, 2, 1,
                 "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];", "=r"(r[0]),
                 "=r"(r[1]))
KVCU_LDMATRIX_FN(kvcu_ldmatrix_x4_trans, 4, 1,
                 "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];",
                 "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))

#endif
