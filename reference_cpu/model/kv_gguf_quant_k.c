/* The K types of a GGUF file (kv_gguf_quant.h): 256 weights a super-block, cut into sub-blocks
 * of 16 or 32 weights, each with a small integer scale (and, in Q2_K, Q4_K and Q5_K, a small
 * integer minimum) that one or two fp16 numbers of the super-block scale in turn. Two levels
 * of scale cost 4-6 bits per 16-32 weights instead of 16.
 *
 * Each function walks the 256 weights in order and says, for weight w, which bits hold its
 * code and which sub-block its scale, and computes in float what the outside reference (the
 * gguf Python package, tests/test_gguf_quant.c) computes:
 *     scale = d * sc,  min = dmin * m,  w = scale * q - min
 * Every product here is exact in float: an fp16 step carries 11 significant bits, a sub-block
 * scale at most 7 (Q6_K's -128..127; 6 or fewer in the others), a code at most 5 (Q6_K's
 * -32..31, Q5_K's 0..31), 23 in all, within float's 24; and no product leaves float's normal
 * range (at most 65504 * 128 * 32, at least 2^-24). So a weight is rounded once, where the
 * minimum is subtracted, and the grouping of the products, or a fused multiply-add, cannot
 * change a bit: any order is the reference's. What can is computing in lower precision, or
 * rearranging the sum (q - min / scale, a precomputed dmin * m folded into a bias). */
#include "kv_gguf_quant.h"

/* Q2_K, 84 bytes:
 *   struct { uint8_t  scales[16];  sub-block i (16 weights): scale in the low nibble,
 *                                  minimum in the high nibble
 *            uint8_t  qs[64];      2-bit codes q in 0..3
 *            uint16_t d;           fp16 step of the scales
 *            uint16_t dmin; }      fp16 step of the minimums
 *   weight w = 128 g + 32 s + l (g 0..1, s 0..3, l 0..31): q = (qs[32 g + l] >> 2 s) & 3
 *   sub-block i = w / 16:  w = (d * (scales[i] & 15)) * q - dmin * (scales[i] >> 4) */
void kv_ggml_dequant_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *scales = b, *qs = b + 16;
    const float d = kv_ggml_fp16_at(b + 80), dmin = kv_ggml_fp16_at(b + 82);
    for (int w = 0; w < KV_GGML_QK_K; w++) {
        const int g = w / 128, s = (w % 128) / 32, l = w % 32, i = w / 16;
        const int q = (qs[32 * g + l] >> (2 * s)) & 3;
        const float scale = d * (float)(scales[i] & 15), min = dmin * (float)(scales[i] >> 4);
        y[w] = scale * (float)q - min;
    }
}

/* Q3_K, 110 bytes:
 *   struct { uint8_t  hmask[32];   bit b of hmask[l]: the high bit of weight 32 b + l
 *            uint8_t  qs[64];      the low 2 bits, placed as Q2_K's codes
 *            uint8_t  scales[12];  16 6-bit scales, stored plus 32:
 *                                  low 4 bits of scale i: byte i (i < 8, low nibble) or
 *                                  byte i - 8 (high nibble); high 2 bits: bits 2 (i / 4)
 *                                  and up of byte 8 + i % 4
 *            uint16_t d; }         fp16 step of the scales
 *   q = low 2 bits - (high bit ? 0 : 4), in -4..3 (a set bit means no offset)
 *   sub-block i = w / 16:  w = (d * (sc_i - 32)) * q */
void kv_ggml_dequant_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    const float d = kv_ggml_fp16_at(b + 108);
    for (int w = 0; w < KV_GGML_QK_K; w++) {
        const int g = w / 128, s = (w % 128) / 32, l = w % 32, i = w / 16;
        const int low = (qs[32 * g + l] >> (2 * s)) & 3, high = (hmask[l] >> (w / 32)) & 1;
        const int q = low - (high ? 0 : 4);
        const int sc_lo = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4;
        const int sc_hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        const float scale = d * (float)((sc_lo | sc_hi << 4) - 32);
        y[w] = scale * (float)q;
    }
}

/* Q4_K, 144 bytes:
 *   struct { uint16_t d;           fp16 step of the scales
 *            uint16_t dmin;        fp16 step of the minimums
 *            uint8_t  scales[12];  8 6-bit scales and 8 6-bit minimums (kv_ggml_scale_min_k4())
 *            uint8_t  qs[128]; }   4-bit codes q in 0..15
 *   weight w = 64 g + 32 s + l (g 0..3, s 0..1, l 0..31): q = (qs[32 g + l] >> 4 s) & 15
 *   sub-block j = w / 32:  w = (d * sc_j) * q - dmin * m_j */
void kv_ggml_dequant_q4_k(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b), dmin = kv_ggml_fp16_at(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int w = 0; w < KV_GGML_QK_K; w++) {
        const int g = w / 64, s = (w % 64) / 32, l = w % 32;
        const int q = (qs[32 * g + l] >> (4 * s)) & 15;
        int sc, m;
        kv_ggml_scale_min_k4(scales, w / 32, &sc, &m);
        const float scale = d * (float)sc, min = dmin * (float)m;
        y[w] = scale * (float)q - min;
    }
}

/* Q5_K, 176 bytes:
 *   struct { uint16_t d, dmin;     as in Q4_K
 *            uint8_t  scales[12];  as in Q4_K
 *            uint8_t  qh[32];      bit b of qh[l]: the fifth bit of weight 32 b + l
 *            uint8_t  qs[128]; }   the low 4 bits, placed as Q4_K's codes
 *   q = low | high << 4 in 0..31;  sub-block j = w / 32:  w = (d * sc_j) * q - dmin * m_j */
void kv_ggml_dequant_q5_k(const uint8_t *b, float *y)
{
    const float d = kv_ggml_fp16_at(b), dmin = kv_ggml_fp16_at(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int w = 0; w < KV_GGML_QK_K; w++) {
        const int g = w / 64, s = (w % 64) / 32, l = w % 32;
        const int q = ((qs[32 * g + l] >> (4 * s)) & 15) | ((qh[l] >> (w / 32)) & 1) << 4;
        int sc, m;
        kv_ggml_scale_min_k4(scales, w / 32, &sc, &m);
        const float scale = d * (float)sc, min = dmin * (float)m;
        y[w] = scale * (float)q - min;
    }
}

/* Q6_K, 210 bytes:
 *   struct { uint8_t  ql[128];     the low 4 bits
 *            uint8_t  qh[64];      the high 2 bits
 *            int8_t   scales[16];  signed 8-bit scale of each 16-weight sub-block
 *            uint16_t d; }         fp16 step of the scales
 *   weight w = 128 g + r (g 0..1, r 0..127):
 *     low  = (ql[64 g + r % 64] >> 4 (r / 64)) & 15
 *     high = (qh[32 g + r % 32] >> 2 (r / 32)) & 3
 *   q = (low | high << 4) - 32 in -32..31;  sub-block i = w / 16:  w = (d * scales[i]) * q */
void kv_ggml_dequant_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128, *scales = b + 192;
    const float d = kv_ggml_fp16_at(b + 208);
    for (int w = 0; w < KV_GGML_QK_K; w++) {
        const int g = w / 128, r = w % 128;
        const int low = (ql[64 * g + r % 64] >> (4 * (r / 64))) & 15;
        const int high = (qh[32 * g + r % 32] >> (2 * (r / 32))) & 3;
        const float scale = d * (float)(int8_t)scales[w / 16];
        y[w] = scale * (float)((low | high << 4) - 32);
    }
}
