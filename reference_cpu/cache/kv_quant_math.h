/**
 * @file kv_quant_math.h
 * The per-element arithmetic of the KV-cache formats (chapter 04), written once for the CPU
 * reference and the CUDA kernels.
 *
 * Everything here is a `static inline` function marked KV_HD, which is `__host__ __device__`
 * under nvcc and nothing in C (or in the emulation build, where device code is host code).
 * The CPU library (kv_quant.c), the CUDA kernels (cuda/cache/kvcu_quant.cu) and, later, the attention
 * kernels that dequantize inside their loops all call these same lines, so an int8 or int4
 * code is rounded by the same expression on both devices and the bytes match.
 *
 * Two rules keep host and device bit-identical:
 *  - every step is one IEEE operation rounded to nearest even (x / s, rintf, a - b) or an
 *    explicit fmaf(); no a * b + c is left for a compiler to fuse on one side only;
 *  - bit patterns are read and written through memcpy, never through casts of pointers.
 *
 * The fp16, bf16 and fp8 conversions here are software; the CUDA kernels convert with the
 * native types of cuda_fp16.h / cuda_bf16.h / cuda_fp8.h instead, and the tests hold the two
 * to the same bits (round to nearest even, the device's NaN patterns).
 *
 * Storage layouts and the meaning of each format are in kv_quant.h.
 */
#ifndef KV_QUANT_MATH_H
#define KV_QUANT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KV_HD __host__ __device__
#else
#define KV_HD
#endif

/* Division correctly rounded even if device code is ever built with --use_fast_math. */
#if defined(__CUDA_ARCH__)
#define KVQ_DIV(a, b) __fdiv_rn((a), (b))
#else
#define KVQ_DIV(a, b) ((a) / (b))
#endif

/** The storage formats of a cached element (kv_quant.h documents each layout). */
typedef enum {
    KV_QF_F32 = 0,   /**< fp32, the reference: 4 bytes, exact */
    KV_QF_F16,       /**< IEEE binary16 */
    KV_QF_BF16,      /**< bfloat16 */
    KV_QF_INT8,      /**< int8 symmetric, one fp32 scale per row of d (token, head) */
    KV_QF_INT8_G32,  /**< int8 symmetric, one fp32 scale per 32 channels of a row */
    KV_QF_INT8_G64,  /**< ... per 64 channels */
    KV_QF_INT8_G128, /**< ... per 128 channels */
    KV_QF_FP8_E4M3,  /**< fp8 E4M3 (max 448) times an fp32 per-tensor or per-head scale */
    KV_QF_FP8_E5M2,  /**< fp8 E5M2 (max 57344) times an fp32 per-tensor or per-head scale */
    KV_QF_INT4_KIVI, /**< int4 asymmetric, KIVI: keys per channel, values per token */
    KV_QF_INT2_KIVI, /**< int2 asymmetric, KIVI */
    KV_QF_INT4_G32,  /**< int4 symmetric, one fp32 scale per 32 channels of a row (keys too) */
    KV_QF_COUNT
} kv_qformat;

/** Which tensor a row belongs to: only the KIVI formats group keys and values differently. */
typedef enum {
    KV_QROLE_VALUE = 0, /**< per token: groups run along the d channels of one row */
    KV_QROLE_KEY = 1    /**< KIVI keys: groups run along 32 tokens of one channel */
} kv_qrole;

#define KV_KIVI_GROUP 32    /**< KIVI group: 32 channels (values) or 32 tokens (keys) */
#define KV_KIVI_WINDOW 128  /**< default full-precision window of the newest tokens */
#define KV_FP8_E4M3_MAX 448.0f
#define KV_FP8_E5M2_MAX 57344.0f
#define KV_F16_MAX 65504.0f

/** Scale and zero point of one KIVI group, both IEEE binary16 bits (4 bytes together). */
typedef struct {
    uint16_t scale; /**< step between codes; 0 when the group is one exact value */
    uint16_t zero;  /**< value of code 0 (the group minimum, rounded down) */
} kv_qsz;

#define KVQ_F16_NAN 0x7fffu  /* the canonical NaN a device conversion produces */
#define KVQ_F32_NAN 0x7fffffffu

/* ---- bits ------------------------------------------------------------------------------ */

static inline KV_HD uint32_t kvq_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline KV_HD float kvq_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/** 1 for NaN and +-inf. */
static inline KV_HD int kvq_nonfinite(float x) { return (kvq_f32_bits(x) & 0x7fffffffu) >= 0x7f800000u; }

/* ---- format table -----------------------------------------------------------------------
 * Every format is one of three codecs, and every path (the CPU's rows, the CUDA write kernels,
 * the attention loops) implements each codec once, reading a format's parameters from its row
 * of this table. So a new storage format is its enum value above and its row here, plus, for a
 * KVQ_ELEM format, its element conversion in kvq_elem_encode() / kvq_elem_decode() below:
 * the one place per device that knows it (docs/design.md §7). */

/** The codecs. */
enum {
    KVQ_ELEM = 0, /**< each element converted on its own (fp32, fp16, bf16; fp8 divided by a
                   *   calibrated per-head scale first) */
    KVQ_SYM,      /**< symmetric integer groups along a row (int8, int4-g32), one fp32 scale
                   *   per group, codes in two's complement of the format's bits */
    KVQ_ASYM      /**< KIVI: asymmetric groups of 2^bits codes, binary16 scale and zero; values
                   *   per token along the row, keys per channel over 32 tokens */
};

/** One row of the format table. */
typedef struct {
    const char *name; /**< what kv_quant_parse() and the spec strings read */
    int bits;         /**< of one stored code */
    int group;        /**< KVQ_SYM, KVQ_ASYM: channels sharing a scale (0: the whole row, d) */
    int codec;        /**< KVQ_ELEM, KVQ_SYM, KVQ_ASYM; -1 for an unknown format */
    int scaled;       /**< KVQ_ELEM: 1 when a calibrated per-head scale divides the values */
} kvq_format;

static inline KV_HD kvq_format kvq_format_row(const char *name, int bits, int group, int codec,
                                              int scaled)
{
    kvq_format f;
    f.name = name;
    f.bits = bits;
    f.group = group;
    f.codec = codec;
    f.scaled = scaled;
    return f;
}

/** The format table. */
static inline KV_HD kvq_format kvq_format_of(int fmt)
{
    switch (fmt) {
    case KV_QF_F32:       return kvq_format_row("fp32", 32, 0, KVQ_ELEM, 0);
    case KV_QF_F16:       return kvq_format_row("fp16", 16, 0, KVQ_ELEM, 0);
    case KV_QF_BF16:      return kvq_format_row("bf16", 16, 0, KVQ_ELEM, 0);
    case KV_QF_INT8:      return kvq_format_row("int8", 8, 0, KVQ_SYM, 0);
    case KV_QF_INT8_G32:  return kvq_format_row("int8-g32", 8, 32, KVQ_SYM, 0);
    case KV_QF_INT8_G64:  return kvq_format_row("int8-g64", 8, 64, KVQ_SYM, 0);
    case KV_QF_INT8_G128: return kvq_format_row("int8-g128", 8, 128, KVQ_SYM, 0);
    case KV_QF_FP8_E4M3:  return kvq_format_row("fp8-e4m3", 8, 0, KVQ_ELEM, 1);
    case KV_QF_FP8_E5M2:  return kvq_format_row("fp8-e5m2", 8, 0, KVQ_ELEM, 1);
    case KV_QF_INT4_KIVI: return kvq_format_row("int4-kivi", 4, KV_KIVI_GROUP, KVQ_ASYM, 0);
    case KV_QF_INT2_KIVI: return kvq_format_row("int2-kivi", 2, KV_KIVI_GROUP, KVQ_ASYM, 0);
    case KV_QF_INT4_G32:  return kvq_format_row("int4-g32", 4, 32, KVQ_SYM, 0);
    default:              return kvq_format_row("?", 0, 0, -1, 0);
    }
}

/** Bits of one stored code (32, 16, 8, 4 or 2); 0 for an unknown format. */
static inline KV_HD int kvq_code_bits(int fmt) { return kvq_format_of(fmt).bits; }

/** Channels sharing one scale along a row: d for per-row int8, 32/64/128 for the grouped
 * int8 and the KIVI values; 0 for formats without per-row metadata (fp, fp8, KIVI keys). */
static inline KV_HD int kvq_row_group(int fmt, int role, int d)
{
    const kvq_format f = kvq_format_of(fmt);
    if (f.codec == KVQ_SYM) return f.group ? f.group : d;
    if (f.codec == KVQ_ASYM) return role == KV_QROLE_KEY ? 0 : f.group;
    return 0;
}

static inline KV_HD int kvq_is_kivi(int fmt) { return kvq_format_of(fmt).codec == KVQ_ASYM; }
/** Symmetric groups of any width (int8, int8-gG, int4-g32). */
static inline KV_HD int kvq_is_sym(int fmt) { return kvq_format_of(fmt).codec == KVQ_SYM; }
/** Symmetric groups of one byte a code (int8, int8-gG): the formats whose codes the fast paths
 * read as int8 (int4-g32 packs two codes a byte). */
static inline KV_HD int kvq_is_int8(int fmt)
{
    const kvq_format f = kvq_format_of(fmt);
    return f.codec == KVQ_SYM && f.bits == 8;
}
static inline KV_HD int kvq_is_fp8(int fmt)
{
    const kvq_format f = kvq_format_of(fmt);
    return f.codec == KVQ_ELEM && f.scaled;
}

/** Bytes of codes in one row of d elements (d * bits / 8; d is a multiple of 32 for KIVI). */
static inline KV_HD int64_t kvq_row_bytes(int fmt, int d) { return (int64_t)d * kvq_code_bits(fmt) / 8; }

/**
 * Index of the metadata entry that element j of row t uses (entries are float for int8,
 * ::kv_qsz for KIVI):
 *   per-row groups (int8, int8 gG, KIVI values):  t * (d / G) + j / G
 *   KIVI keys (per channel over 32 tokens):       (t / 32) * d + j
 */
static inline KV_HD int64_t kvq_meta_index(int fmt, int role, int64_t t, int j, int d)
{
    if (kvq_is_kivi(fmt) && role == KV_QROLE_KEY) return (t / KV_KIVI_GROUP) * d + j;
    const int g = kvq_row_group(fmt, role, d);
    return g ? t * (d / g) + j / g : 0;               /* 0: fp formats keep no per-row entry */
}

/* ---- IEEE binary16 ---------------------------------------------------------------------
 * float -> binary16, round to nearest even: the 13 dropped mantissa bits decide, a tie goes to
 * the even code. 65520 (= 65504 + half a step) and beyond overflow to infinity, as IEEE says;
 * below 2^-14 the result is subnormal (units of 2^-24); NaN becomes the canonical 0x7fff. */
static inline KV_HD uint16_t kvq_f32_to_f16(float f)
{
    const uint32_t x = kvq_f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return KVQ_F16_NAN;
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                           /* normal: rebias exponent 127 -> 15 */
        const uint32_t m = a - 0x38000000u, rem = m & 0x1fffu;
        uint32_t r = m >> 13;
        r += rem > 0x1000u || (rem == 0x1000u && (r & 1u)); /* a carry moves to the exponent */
        return (uint16_t)(sign | r);
    }
    if (a <= 0x33000000u) return (uint16_t)sign;      /* <= 2^-25: the tie goes to even 0 */
    const uint32_t shift = 126u - (a >> 23);          /* 14..24: value in units of 2^-24 */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    uint32_t r = mant >> shift;
    r += rem > half || (rem == half && (r & 1u));
    return (uint16_t)(sign | r);
}

/** binary16 -> float, exact; NaN becomes 0x7fffffff as on the device. */
static inline KV_HD float kvq_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return kvq_bits_f32(m ? KVQ_F32_NAN : (sign | 0x7f800000u));
    if (e == 0) {
        const float v = (float)m * 0x1p-24f;          /* subnormal: exact in float */
        return sign ? -v : v;
    }
    return kvq_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* The next binary16 toward -inf / +inf (finite, non-NaN input). */
static inline KV_HD uint16_t kvq_f16_next_down(uint16_t h)
{
    if (h == 0x0000u) return 0x8001u;
    return (uint16_t)((h & 0x8000u) ? h + 1u : h - 1u);
}
static inline KV_HD uint16_t kvq_f16_next_up(uint16_t h)
{
    if (h == 0x8000u) return 0x0001u;
    return (uint16_t)((h & 0x8000u) ? h - 1u : h + 1u);
}
/** float -> binary16 rounded toward -inf (finite |x| <= 65504). */
static inline KV_HD uint16_t kvq_f32_to_f16_down(float x)
{
    uint16_t h = kvq_f32_to_f16(x);
    return kvq_f16_to_f32(h) > x ? kvq_f16_next_down(h) : h;
}
/** float -> binary16 rounded toward +inf (finite |x| <= 65504). */
static inline KV_HD uint16_t kvq_f32_to_f16_up(float x)
{
    uint16_t h = kvq_f32_to_f16(x);
    return kvq_f16_to_f32(h) < x ? kvq_f16_next_up(h) : h;
}

/* ---- bfloat16 --------------------------------------------------------------------------
 * The top 16 bits of the float, rounded to nearest even on the 16 dropped bits (adding
 * 0x7fff plus the lowest kept bit carries exactly when the rest is above half, or equal to
 * half with an odd kept bit). Overflow reaches infinity by itself; NaN becomes 0x7fff. */
static inline KV_HD uint16_t kvq_f32_to_bf16(float f)
{
    uint32_t x = kvq_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return KVQ_F16_NAN;
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
/** bfloat16 -> float, exact (a NaN keeps its pattern). */
static inline KV_HD float kvq_bf16_to_f32(uint16_t b) { return kvq_bits_f32((uint32_t)b << 16); }

/* ---- fp8 E4M3 / E5M2 -------------------------------------------------------------------
 * E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities; 0x7e = 448 is the largest
 * finite value, 0x7f / 0xff are NaN. E5M2: bias 15, 2 mantissa bits, 0x7b = 57344 the largest
 * finite value, 0x7c infinity, 0x7d..0x7f NaN.
 *
 * float -> fp8 rounds to nearest even from the float's exact value and saturates: anything
 * beyond the largest finite value, infinities included, becomes +-max (the device's
 * cvt.rn.satfinite); NaN of either sign becomes 0x7f. */
static inline KV_HD uint8_t kvq_f32_to_fp8(float f, int e5m2)
{
    const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const uint32_t maxcode = e5m2 ? 0x7bu : 0x7eu;
    const uint32_t x = kvq_f32_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a == 0x7f800000u) return (uint8_t)(sign | maxcode);
    const int e = (int)(a >> 23) - 127;               /* floats below 2^-126 round to 0 here */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;  /* value = mant * 2^(e - 23) */
    uint32_t code;
    if (e > bias + 1) {
        code = maxcode + 1u;                          /* beyond every exponent: saturate below */
    } else if (e >= 1 - bias) {                       /* an fp8 normal */
        const int drop = 23 - mbits;
        const uint32_t rem = mant & ((1u << drop) - 1u), half = 1u << (drop - 1);
        code = ((uint32_t)(e + bias) << mbits) | ((mant >> drop) & ((1u << mbits) - 1u));
        code += rem > half || (rem == half && (code & 1u)); /* may carry into the exponent */
    } else {                                          /* fp8 subnormal: units 2^(1-bias-mbits) */
        const int shift = 24 - bias - mbits - e;      /* >= 21 */
        if (shift >= 32 || a < 0x00800000u) {
            code = 0;                                 /* below a quarter unit: rounds to zero */
        } else {
            const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
            code = mant >> shift;
            code += rem > half || (rem == half && (code & 1u)); /* may become the smallest normal */
        }
    }
    if (code > maxcode) code = maxcode;
    return (uint8_t)(sign | code);
}

/** fp8 -> float, exact; NaN codes give 0x7fffffff (as the device's conversion does). */
static inline KV_HD float kvq_fp8_to_f32(uint8_t b, int e5m2)
{
    const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    const uint32_t e = (b & 0x7fu) >> mbits, m = b & ((1u << mbits) - 1u);
    if (!e5m2 && (b & 0x7fu) == 0x7fu) return kvq_bits_f32(KVQ_F32_NAN);
    if (e5m2 && e == 31u) return kvq_bits_f32(m ? KVQ_F32_NAN : (sign | 0x7f800000u));
    if (e == 0) {                                     /* subnormal: m units, exact in float */
        const float v = (float)m * (e5m2 ? 0x1p-16f : 0x1p-9f);
        return sign ? -v : v;
    }
    return kvq_bits_f32(sign | ((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mbits)));
}

/** Largest finite value of an fp8 format. */
static inline KV_HD float kvq_fp8_max(int fmt) { return fmt == KV_QF_FP8_E5M2 ? KV_FP8_E5M2_MAX : KV_FP8_E4M3_MAX; }

/* ---- int8 symmetric ---------------------------------------------------------------------
 * s = amax / 127 and q = rint(x / s): the largest magnitude lands on +-127, every other value
 * within s/2 of q * s. rintf rounds half to even, the same instruction on both devices. An
 * all-zero group has s = 0 and codes 0 (no 0/0). The clamp only matters at the last ulp,
 * when amax / fl(amax / 127) comes out a hair above 127. */
static inline KV_HD float kvq_int8_scale(float amax) { return KVQ_DIV(amax, 127.0f); }

static inline KV_HD int8_t kvq_int8_encode(float x, float s)
{
    if (!(s > 0.0f)) return 0;
    const float q = fminf(fmaxf(rintf(KVQ_DIV(x, s)), -127.0f), 127.0f);
    return (int8_t)q;
}
static inline KV_HD float kvq_int8_decode(int8_t q, float s) { return (float)q * s; }

/* ---- int4 symmetric (int4-g32) ------------------------------------------------------------
 * int8's formula with 4 bits: s = amax / 7, q = rint(x / s) clamped to [-7, 7] (-8 is never
 * produced, so the grid is symmetric as int8's is), stored as a two's-complement nibble:
 * element j is nibble (j % 2) of byte j / 2, low nibble first, as KIVI packs. */
static inline KV_HD float kvq_int4_scale(float amax) { return KVQ_DIV(amax, 7.0f); }

/** The nibble of x in a group of scale s (0 when s is 0 or not a number). */
static inline KV_HD uint8_t kvq_int4_encode(float x, float s)
{
    if (!(s > 0.0f)) return 0;
    const float q = fminf(fmaxf(rintf(KVQ_DIV(x, s)), -7.0f), 7.0f);
    return (uint8_t)((int)q & 0xf);
}
/** A stored nibble (0..15) back to its value: two's complement, times the scale. */
static inline KV_HD float kvq_int4_decode(uint32_t nib, float s)
{
    return (float)((int)(nib ^ 8u) - 8) * s;
}

/* ---- a query against int8 keys (kv_attention.h, kv_attn_int_keys()) ---------------------
 * Attention rounds a query that meets per-token int8 keys to 16-bit integers first: step =
 * amax / qmax and Q = rint(q / step), |Q| <= qmax, the int8 formula with 16 bits. qmax is
 * 32767, or less for head dims past 512 so that q · k = step · s · Σ Q·c (codes c, at most
 * 128 in magnitude) is a sum of integers that fits an int32 exactly. The CPU computes that
 * integer sum; the GPU and the other CPU paths multiply the rounded query Q·step into the
 * dequantized keys in floats: the same number within a float dot product's rounding. */
static inline KV_HD int kvq_q16_max(int d)
{
    const int64_t fit = (int64_t)2147483647 / (128 * (int64_t)(d > 1 ? d : 1));
    return fit < 32767 ? (int)fit : 32767;
}
static inline KV_HD float kvq_q16_step(float amax, int d)
{
    return KVQ_DIV(amax, (float)kvq_q16_max(d));
}
static inline KV_HD int16_t kvq_q16_encode(float x, float step, int d)
{
    if (!(step > 0.0f)) return 0;
    const float m = (float)kvq_q16_max(d);
    float r = rintf(KVQ_DIV(x, step)); /* |x| <= amax: past m by a rounding at most */
    if (r > m) r = m;
    if (r < -m) r = -m;
    return (int16_t)r;
}
/* A query's step: max_j |q[j]| / kvq_q16_max(d); NaN when an element is inf or NaN (every
 * code 0 then, every score NaN), 0 for a zero query. */
static inline KV_HD float kvq_q16_query_step(const float *q, int d)
{
    float m = 0.0f;
    for (int j = 0; j < d; j++) {
        const float a = fabsf(q[j]);
        if (!(a <= 3.40282347e38f)) return kvq_bits_f32(KVQ_F32_NAN);
        if (a > m) m = a;
    }
    return kvq_q16_step(m, d);
}
/* The rounded query in place: q[j] <- Q[j]·step, what a float path multiplies int8 keys by. */
static inline KV_HD void kvq_q16_round_query(float *q, int d)
{
    const float step = kvq_q16_query_step(q, d);
    for (int j = 0; j < d; j++) q[j] = (float)kvq_q16_encode(q[j], step, d) * step;
}

/* ---- asymmetric int4 / int2 (KIVI) ----------------------------------------------------
 * A group [mn, mx] maps onto 2^bits codes: x = zero + q * scale. Both are stored in binary16,
 * and the rounding directions are chosen so that the stored grid still covers the group:
 * zero = mn rounded down, scale = (mx - zero) / (2^bits - 1) rounded up. Then every x of the
 * group is within scale / 2 of a grid point (plus fp32 rounding), also when mn itself is not
 * representable in binary16 (a constant group of 3.3 gets a tiny nonzero scale, not an error
 * of 3.3's binary16 rounding). */
static inline KV_HD kv_qsz kvq_asym_params(float mn, float mx, int bits)
{
    kv_qsz p;
    /* + 0.0f turns -0 into +0: a min or max over {-0, +0} may be either, and fminf on the
     * two devices need not agree; after this the metadata bits do. */
    p.zero = kvq_f32_to_f16_down(mn + 0.0f);
    const float z = kvq_f16_to_f32(p.zero);
    p.scale = kvq_f32_to_f16_up(KVQ_DIV(mx + 0.0f - z, (float)((1 << bits) - 1)));
    return p;
}

/** The code of x in a group with decoded @p scale and @p zero. */
static inline KV_HD uint8_t kvq_asym_encode(float x, float scale, float zero, int bits)
{
    if (!(scale > 0.0f)) return 0;                    /* a one-value group: every code is 0 */
    const float q = fminf(fmaxf(rintf(KVQ_DIV(x - zero, scale)), 0.0f), (float)((1 << bits) - 1));
    return (uint8_t)q;
}
static inline KV_HD float kvq_asym_decode(uint32_t q, float scale, float zero)
{
    return fmaf((float)q, scale, zero);               /* one rounding on both devices */
}

/** The poisoned group: scale and zero NaN, so every element decodes to NaN. */
static inline KV_HD kv_qsz kvq_asym_poison(void)
{
    kv_qsz p;
    p.scale = KVQ_F16_NAN;
    p.zero = KVQ_F16_NAN;
    return p;
}

/* ---- packing -----------------------------------------------------------------------------
 * Sub-byte codes fill a byte from its low bits: int4 element j is nibble (j % 2) of byte
 * j / 2 (low nibble first); int2 element j is bits 2 * (j % 4) .. +1 of byte j / 4. */
static inline KV_HD uint32_t kvq_unpack(const uint8_t *row, int j, int bits)
{
    const int per = 8 / bits;
    return ((uint32_t)row[j / per] >> ((j % per) * bits)) & ((1u << bits) - 1u);
}

/* ---- one element of a KVQ_ELEM format ---------------------------------------------------
 * The software conversions, one case per element format: the CPU's rows and attention call
 * them, and the CUDA kernels too wherever the device has no native conversion of its own
 * (cuda/cache/kvcu_quant_math.cuh). @p scale: a scaled format's per-head scale (fp8). */
static inline KV_HD void kvq_elem_encode(int fmt, uint8_t *codes, int64_t i, float v, float scale)
{
    switch (fmt) {
    case KV_QF_F32: memcpy(codes + i * 4, &v, 4); break;
    case KV_QF_F16: case KV_QF_BF16: {
        const uint16_t h = fmt == KV_QF_F16 ? kvq_f32_to_f16(v) : kvq_f32_to_bf16(v);
        memcpy(codes + i * 2, &h, 2);
        break;
    }
    case KV_QF_FP8_E4M3: case KV_QF_FP8_E5M2: /* fl(x / scale), then one rounding to fp8 */
        codes[i] = kvq_f32_to_fp8(KVQ_DIV(v, scale), fmt == KV_QF_FP8_E5M2);
        break;
    }
}

static inline KV_HD float kvq_elem_decode(int fmt, const uint8_t *codes, int64_t i, float scale)
{
    switch (fmt) {
    case KV_QF_F32: {
        float v;
        memcpy(&v, codes + i * 4, 4);
        return v;
    }
    case KV_QF_F16: case KV_QF_BF16: {
        uint16_t h;
        memcpy(&h, codes + i * 2, 2);
        return fmt == KV_QF_F16 ? kvq_f16_to_f32(h) : kvq_bf16_to_f32(h);
    }
    case KV_QF_FP8_E4M3: case KV_QF_FP8_E5M2:
        return kvq_fp8_to_f32(codes[i], fmt == KV_QF_FP8_E5M2) * scale;
    default:
        return kvq_bits_f32(KVQ_F32_NAN);
    }
}

/* ---- one element, any format -------------------------------------------------------------
 * "Dequantize element j of row t": what attention calls inline. codes is the [n][row bytes]
 * plane of one (layer, slot, kv head), meta its metadata plane; scale is the fp8 scale of that
 * head (ignored by the other formats). */
static inline KV_HD float kvq_decode_element(int fmt, int role, const void *codes,
                                            const void *meta, int64_t t, int j, int d, float scale)
{
    const uint8_t *row = (const uint8_t *)codes + t * kvq_row_bytes(fmt, d);
    switch (kvq_format_of(fmt).codec) {
    case KVQ_ELEM:
        return kvq_elem_decode(fmt, row, j, scale);
    case KVQ_SYM: {
        const float s = ((const float *)meta)[kvq_meta_index(fmt, role, t, j, d)];
        return kvq_code_bits(fmt) == 8 ? kvq_int8_decode((int8_t)row[j], s)
                                       : kvq_int4_decode(kvq_unpack(row, j, 4), s);
    }
    case KVQ_ASYM: {
        const kv_qsz p = ((const kv_qsz *)meta)[kvq_meta_index(fmt, role, t, j, d)];
        return kvq_asym_decode(kvq_unpack(row, j, kvq_code_bits(fmt)), kvq_f16_to_f32(p.scale),
                               kvq_f16_to_f32(p.zero));
    }
    default:
        return kvq_bits_f32(KVQ_F32_NAN);
    }
}

#endif
