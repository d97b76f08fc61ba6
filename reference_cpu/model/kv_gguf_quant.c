/* The tensor types of a GGUF file and their dequantization (kv_gguf_quant.h): the type table,
 * row sizes, and the float and 32-weight block types. The 256-weight K types are in
 * kv_gguf_quant_k.c.
 *
 * Every block is read byte by byte from its little-endian layout (a tensor in a mapped file
 * has no alignment a struct could rely on), and every value is computed in float as the outside
 * reference computes it (the gguf Python package's numpy code, which tests/test_gguf_quant.c
 * holds this file to bit for bit): d * q, plus the offset m where the type has one. The product
 * is exact (an fp16 significand of 11 bits times a code of at most 7), so a weight rounds at
 * most once, at the addition of m, and the order of operations, a fused multiply-add
 * included, cannot change its bits. */
#include "kv_gguf_quant.h"

#include <inttypes.h>

/* ---- the table --------------------------------------------------------------------------
 * Every code ggml has assigned, with its block size where ggml defines one (block 0: none; the
 * removed codes 4, 5, 31-33 and 36-38 have no size left). Q8_1 has ggml's size, 2 fp16 + 32
 * codes = 36 bytes, but is not dequantized: it is the activations' format of ggml's integer dot
 * products, not found in model files, and the gguf Python package still gives it the 40 bytes
 * of an older layout (two float32), so no outside reference agrees on its bytes. */
static const kv_ggml_type_info TYPES[] = {
    [0] = {"F32", 1, 4},          [1] = {"F16", 1, 2},
    [2] = {"Q4_0", 32, 18},       [3] = {"Q4_1", 32, 20},
    [4] = {"Q4_2 (removed)", 0, 0}, [5] = {"Q4_3 (removed)", 0, 0},
    [6] = {"Q5_0", 32, 22},       [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},       [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},     [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},    [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},    [15] = {"Q8_K", 256, 292},
    [16] = {"IQ2_XXS", 256, 66},  [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98},  [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},    [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},    [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},          [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},         [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},         [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},
    [31] = {"Q4_0_4_4 (removed)", 0, 0}, [32] = {"Q4_0_4_8 (removed)", 0, 0},
    [33] = {"Q4_0_8_8 (removed)", 0, 0},
    [34] = {"TQ1_0", 256, 54},    [35] = {"TQ2_0", 256, 66},
    [36] = {"IQ4_NL_4_4 (removed)", 0, 0}, [37] = {"IQ4_NL_4_8 (removed)", 0, 0},
    [38] = {"IQ4_NL_8_8 (removed)", 0, 0},
    [39] = {"MXFP4", 32, 17},     [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},     [42] = {"Q2_0", 64, 18},
};
#define N_TYPES ((int)(sizeof(TYPES) / sizeof(TYPES[0])))

/* The types kvlab dequantizes (kv_ggml_dequant_row()'s cases). */
static int dequantized(int type)
{
    switch (type) {
    case KV_GGML_F32: case KV_GGML_F16: case KV_GGML_BF16:
    case KV_GGML_Q4_0: case KV_GGML_Q4_1: case KV_GGML_Q5_0: case KV_GGML_Q5_1:
    case KV_GGML_Q8_0:
    case KV_GGML_Q2_K: case KV_GGML_Q3_K: case KV_GGML_Q4_K: case KV_GGML_Q5_K:
    case KV_GGML_Q6_K:
        return 1;
    default:
        return 0;
    }
}

const kv_ggml_type_info *kv_ggml_type(int type)
{
    return type >= 0 && type < N_TYPES && dequantized(type) ? &TYPES[type] : NULL;
}

const char *kv_ggml_type_name(int type)
{
    if (type < 0 || type >= N_TYPES || !TYPES[type].name) return "unknown";
    return TYPES[type].name;
}

int kv_ggml_row_bytes(int type, int64_t n, uint64_t *bytes, kv_err *err)
{
    if (type < 0 || type >= N_TYPES || TYPES[type].block == 0)
        return kv_fail(err, KV_ERR_FORMAT, "tensor type %d (%s): block size unknown", type,
                       kv_ggml_type_name(type));
    const kv_ggml_type_info *t = &TYPES[type];
    if (n < 0 || n % t->block != 0)
        return kv_fail(err, KV_ERR_FORMAT, "%s: %" PRId64 " weights is not a multiple of the "
                       "block of %d", t->name, n, t->block);
    const uint64_t blocks = (uint64_t)(n / t->block);
    if (blocks > (uint64_t)INT64_MAX / (uint64_t)t->block_bytes) /* offsets stay int64_t */
        return kv_fail(err, KV_ERR_FORMAT, "%s: %" PRId64 " weights is more than 2^63 - 1 bytes",
                       t->name, n);
    *bytes = blocks * (uint64_t)t->block_bytes;
    return KV_OK;
}

/* ---- the float types --------------------------------------------------------------------
 * F32: 4 bytes, the value (its bits copied, a signaling NaN included).
 * F16: 2 bytes, IEEE binary16 (kv_ggml_fp16(): exact, NaN payload kept).
 * BF16: 2 bytes, the top half of a float32: bits << 16 (exact, NaN payload kept). */
static float f32_at(const uint8_t *p)
{
    const uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                       (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float bf16_at(const uint8_t *p)
{
    const uint32_t u = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the 32-weight types ----------------------------------------------------------------
 * Each block holds 32 consecutive weights of a row. In the 4- and 5-bit types byte j of qs
 * holds weight j in its low nibble and weight j + 16 in its high nibble. */

/* Q4_0, 18 bytes:
 *   struct { uint16_t d;          fp16 scale
 *            uint8_t  qs[16]; }   32 4-bit codes q in 0..15
 *   w = d * (q - 8) */
void kv_ggml_dequant_q4_0(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0x0f) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

/* Q4_1, 20 bytes:
 *   struct { uint16_t d;          fp16 scale
 *            uint16_t m;          fp16 offset (the block's minimum)
 *            uint8_t  qs[16]; }   32 4-bit codes q in 0..15
 *   w = d * q + m                 (the product exact, the sum rounded once) */
void kv_ggml_dequant_q4_1(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b), m = kv_ggml_fp16_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0x0f) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* The fifth bit of weight j in a Q5 block: bit j of the little-endian uint32 qh. */
static int fifth_bit(const uint8_t *qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

/* Q5_0, 22 bytes:
 *   struct { uint16_t d;          fp16 scale
 *            uint8_t  qh[4];      bit j: the high bit of weight j (a little-endian uint32)
 *            uint8_t  qs[16]; }   the low 4 bits, nibbles as in Q4_0
 *   q = low | high << 4 in 0..31,  w = d * (q - 16) */
void kv_ggml_dequant_q5_0(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b);
    const uint8_t *qh = b + 2, *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const int q0 = (qs[j] & 0x0f) | fifth_bit(qh, j) << 4;
        const int q1 = (qs[j] >> 4) | fifth_bit(qh, j + 16) << 4;
        y[j] = d * (float)(q0 - 16);
        y[j + 16] = d * (float)(q1 - 16);
    }
}

/* Q5_1, 24 bytes:
 *   struct { uint16_t d, m;       fp16 scale and offset
 *            uint8_t  qh[4];      the high bits, as in Q5_0
 *            uint8_t  qs[16]; }   the low 4 bits
 *   w = d * q + m,  q in 0..31 */
void kv_ggml_dequant_q5_1(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b), m = kv_ggml_fp16_at(b + 2);
    const uint8_t *qh = b + 4, *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const int q0 = (qs[j] & 0x0f) | fifth_bit(qh, j) << 4;
        const int q1 = (qs[j] >> 4) | fifth_bit(qh, j + 16) << 4;
        y[j] = d * (float)q0 + m;
        y[j + 16] = d * (float)q1 + m;
    }
}

/* Q8_0, 34 bytes:
 *   struct { uint16_t d;          fp16 scale
 *            int8_t   qs[32]; }   one signed code per weight
 *   w = d * q */
void kv_ggml_dequant_q8_0(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}

/* ---- a row ------------------------------------------------------------------------------ */

void kv_ggml_dequant_row(int type, const void *src, float *dst, int64_t n)
{
    const kv_ggml_type_info *t = kv_ggml_type(type);
    if (!t) return;
    const uint8_t *b = (const uint8_t *)src;
    void (*block)(const uint8_t *, float *) = NULL;
    switch (type) {
    case KV_GGML_F32:
        for (int64_t j = 0; j < n; j++) dst[j] = f32_at(b + 4 * j);
        return;
    case KV_GGML_F16:
        for (int64_t j = 0; j < n; j++) dst[j] = kv_ggml_fp16_at(b + 2 * j);
        return;
    case KV_GGML_BF16:
        for (int64_t j = 0; j < n; j++) dst[j] = bf16_at(b + 2 * j);
        return;
    case KV_GGML_Q4_0: block = kv_ggml_dequant_q4_0; break;
    case KV_GGML_Q4_1: block = kv_ggml_dequant_q4_1; break;
    case KV_GGML_Q5_0: block = kv_ggml_dequant_q5_0; break;
    case KV_GGML_Q5_1: block = kv_ggml_dequant_q5_1; break;
    case KV_GGML_Q8_0: block = kv_ggml_dequant_q8_0; break;
    case KV_GGML_Q2_K: block = kv_ggml_dequant_q2_k; break;
    case KV_GGML_Q3_K: block = kv_ggml_dequant_q3_k; break;
    case KV_GGML_Q4_K: block = kv_ggml_dequant_q4_k; break;
    case KV_GGML_Q5_K: block = kv_ggml_dequant_q5_k; break;
    case KV_GGML_Q6_K: block = kv_ggml_dequant_q6_k; break;
    default: return;
    }
    for (int64_t i = 0; i < n / t->block; i++)
        block(b + i * t->block_bytes, dst + i * t->block);
}
