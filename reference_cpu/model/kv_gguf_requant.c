/* fp32 rows into Q8_0 or binary16 (kv_gguf_requant.h), as ggml's reference quantizers write
 * them. */
#include "kv_gguf_requant.h"
#include "kv_gguf_quant.h"

#include <math.h>
#include <string.h>

/* binary16: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits. A normal value is
 * (1 + f / 1024) 2^(e - 15), e in 1..30; below 2^-14 the subnormals f 2^-24. So a magnitude
 * a is rounded once, on the grid of its binade: units of 2^(E - 10) for 2^E <= a < 2^(E + 1),
 * units of 2^-24 below 2^-14. rintf() rounds halves to even; a count that rounds up to the
 * next binade (1024 units of the subnormals, 2048 of a normal) is that binade's first
 * value, which the bit pattern below already spells. 65520 and beyond round to infinity. */
uint16_t kv_ggml_fp32_to_fp16(float f)
{
    const uint16_t sign = signbit(f) ? 0x8000u : 0;
    const float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14f) return (uint16_t)(sign | (uint16_t)rintf(a * 0x1p24f)); /* exact scaling */
    int E;
    frexpf(a, &E); /* a = m 2^E, m in [0.5, 1): a's binade is 2^(E - 1) */
    E -= 1;
    const float units = rintf(ldexpf(a, 10 - E)); /* 1024 .. 2048 units of 2^(E - 10) */
    const uint32_t bits = (uint32_t)(E + 15) << 10;
    return (uint16_t)(sign | (bits + (uint32_t)units - 1024u)); /* 2048 carries into e */
}

void kv_ggml_quantize_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        uint8_t *blk = out + 34 * b; /* d (binary16), 32 int8 codes */
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f; /* ggml multiplies by the inverse */
        const uint16_t h = kv_ggml_fp32_to_fp16(d);
        blk[0] = (uint8_t)(h & 0xff);
        blk[1] = (uint8_t)(h >> 8);
        /* |x * id| <= 127 (1 + 2u) rounds to 127 at most; the clamp only keeps an infinite or
         * NaN product (a step below 2^-128, whose inverse overflows) a defined int8 */
        for (int j = 0; j < 32; j++)
            blk[2 + j] = (uint8_t)(int8_t)fminf(fmaxf(roundf(xb[j] * id), -127.0f), 127.0f);
    }
}

void kv_ggml_quantize_f16(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    for (int64_t j = 0; j < n; j++) {
        const uint16_t h = kv_ggml_fp32_to_fp16(x[j]);
        out[2 * j] = (uint8_t)(h & 0xff);
        out[2 * j + 1] = (uint8_t)(h >> 8);
    }
}

int kv_ggml_can_quantize(int type)
{
    return type == KV_GGML_F32 || type == KV_GGML_F16 || type == KV_GGML_Q8_0;
}

void kv_ggml_quantize_row(int type, const float *x, void *dst, int64_t n)
{
    if (type == KV_GGML_F32) memcpy(dst, x, (size_t)n * sizeof(float));
    else if (type == KV_GGML_F16) kv_ggml_quantize_f16(x, dst, n);
    else if (type == KV_GGML_Q8_0) kv_ggml_quantize_q8_0(x, dst, n);
}
