/* KV-cache quantization, CPU reference (kv_quant.h). The arithmetic of every element is in
 * kv_quant_math.h, shared with cuda/cache/kvcu_quant.cu; this file walks rows and groups.
 *
 * A group's scale depends only on the group's own values (a max or min, which does not care
 * about order), and each code only on its element and the group's scale, so the result is the
 * same for any thread count and any split of the rows. */
#include "kv_quant.h"

#include <string.h>

#define KVQ_SYM_GROUP_MAX 32 /* the group of the sub-byte symmetric formats (int4-g32) */

/* The names are the format table's (kv_quant_math.h, kvq_format_of()). */
const char *kv_quant_name(int fmt) { return fmt >= 0 && fmt < KV_QF_COUNT ? kvq_format_of(fmt).name : "?"; }

int kv_quant_parse(const char *name)
{
    static const struct { const char *alias; int fmt; } aliases[] = {
        {"fp8", KV_QF_FP8_E4M3}, {"int4", KV_QF_INT4_KIVI}, {"int2", KV_QF_INT2_KIVI},
    };
    if (!name) return -1;
    for (int f = 0; f < KV_QF_COUNT; f++)
        if (!strcmp(name, kv_quant_name(f))) return f;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias)) return aliases[i].fmt;
    return -1;
}

/* ---- sizes ------------------------------------------------------------------------------ */

size_t kv_quant_code_bytes(int fmt, int64_t n, int d) { return (size_t)(n * kvq_row_bytes(fmt, d)); }

/* int8 keeps a 4-byte float per group, KIVI a 4-byte kv_qsz: every entry is 4 bytes. */
size_t kv_quant_meta_bytes(int fmt, int role, int64_t n, int d)
{
    if (kvq_is_kivi(fmt) && role == KV_QROLE_KEY)
        return (size_t)((n + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP) * (size_t)d * 4;
    const int g = kvq_row_group(fmt, role, d);
    return g ? (size_t)n * (size_t)(d / g) * 4 : 0;
}

double kv_quant_bytes_per_element(int fmt, int d)
{
    if (fmt < 0 || fmt >= KV_QF_COUNT || d < 1) return 0.0;
    const double code = kvq_code_bits(fmt) / 8.0;
    if (kvq_is_kivi(fmt)) return code + 4.0 / KV_KIVI_GROUP; /* kv_qsz per 32, K and V alike */
    const int g = kvq_row_group(fmt, KV_QROLE_VALUE, d);
    return g ? code + 4.0 / g : code;
}

size_t kv_quant_fixed_bytes(int fmt, int d, int window)
{
    if (kvq_is_kivi(fmt)) return (size_t)window * (size_t)d * sizeof(float);
    if (kvq_is_fp8(fmt)) return sizeof(float);
    return 0;
}

/* ---- argument checks --------------------------------------------------------------------- */

int kv_quant_check(int fmt, int role, int64_t n, int d, float scale, kv_err *err)
{
    if (fmt < 0 || fmt >= KV_QF_COUNT)
        return kv_fail(err, KV_ERR_ARG, "kv_quant: unknown format %d", fmt);
    if (role != KV_QROLE_VALUE && role != KV_QROLE_KEY)
        return kv_fail(err, KV_ERR_ARG, "kv_quant: role %d is neither value (0) nor key (1)", role);
    if (d < 1 || n < 0)
        return kv_fail(err, KV_ERR_ARG, "kv_quant %s: bad shape n %lld, d %d", kv_quant_name(fmt),
                       (long long)n, d);
    const int g = kvq_row_group(fmt, role, d);
    if (g && d % g)
        return kv_fail(err, KV_ERR_ARG, "kv_quant %s: d = %d is not a multiple of the group %d",
                       kv_quant_name(fmt), d, g);
    if (kvq_is_kivi(fmt) && d % KV_KIVI_GROUP)
        return kv_fail(err, KV_ERR_ARG, "kv_quant %s: d = %d is not a multiple of %d",
                       kv_quant_name(fmt), d, KV_KIVI_GROUP);
    if (kvq_is_kivi(fmt) && role == KV_QROLE_KEY && n % KV_KIVI_GROUP)
        return kv_fail(err, KV_ERR_ARG, "kv_quant %s keys: %lld rows is not a whole number of "
                       "%d-token blocks", kv_quant_name(fmt), (long long)n, KV_KIVI_GROUP);
    if (kvq_is_fp8(fmt) && !(scale > 0.0f && !kvq_nonfinite(scale)))
        return kv_fail(err, KV_ERR_ARG, "kv_quant %s: scale %g must be finite and > 0",
                       kv_quant_name(fmt), (double)scale);
    return KV_OK;
}

/* ---- fp8 scales ------------------------------------------------------------------------- */

float kv_quant_fp8_scale(int fmt, float amax)
{
    if (!(amax > 0.0f) || kvq_nonfinite(amax)) return 1.0f;
    return amax / kvq_fp8_max(fmt);
}

int kv_quant_fp8_calibrate(int fmt, const float *x, int n_heads, int64_t n, int d, int per_head,
                           float *scales, kv_err *err)
{
    if (!kvq_is_fp8(fmt))
        return kv_fail(err, KV_ERR_ARG, "kv_quant_fp8_calibrate: %s is not an fp8 format",
                       kv_quant_name(fmt));
    if (n_heads < 1 || n < 0 || d < 1 || (!x && n > 0) || !scales)
        return kv_fail(err, KV_ERR_ARG, "kv_quant_fp8_calibrate: bad shape (heads %d, n %lld, "
                       "d %d)", n_heads, (long long)n, d);
    float all = 0.0f;
    for (int h = 0; h < n_heads; h++) {
        const float *xh = x + (size_t)h * n * d; /* [n][d] */
        float amax = 0.0f;
        for (int64_t i = 0; i < n * d; i++)
            if (!kvq_nonfinite(xh[i])) amax = fmaxf(amax, fabsf(xh[i]));
        scales[h] = kv_quant_fp8_scale(fmt, amax);
        all = fmaxf(all, amax);
    }
    if (!per_head)
        for (int h = 0; h < n_heads; h++) scales[h] = kv_quant_fp8_scale(fmt, all);
    return KV_OK;
}

/* ---- encode ------------------------------------------------------------------------------ */

/* Pack d codes (one per byte in q) into a row of d * bits / 8 bytes, low bits first. */
static void pack_row(uint8_t *row, const uint8_t *q, int d, int bits)
{
    const int per = 8 / bits;
    for (int b = 0; b < d / per; b++) {
        uint32_t byte = 0;
        for (int k = 0; k < per; k++) byte |= (uint32_t)q[b * per + k] << (k * bits);
        row[b] = (uint8_t)byte;
    }
}

/* One symmetric group of g values: scale from its amax, then the codes, one per byte (int8's
 * bytes, or int4's nibbles for pack_row()). */
static void encode_sym_group(const float *x, int g, int bits, uint8_t *q, float *scale)
{
    float amax = 0.0f;
    int bad = 0;
    for (int j = 0; j < g; j++) {
        bad |= kvq_nonfinite(x[j]);
        amax = fmaxf(amax, fabsf(x[j]));
    }
    if (bad) { /* poisoned: see kv_quant.h */
        *scale = kvq_bits_f32(KVQ_F32_NAN);
        memset(q, 0, (size_t)g);
        return;
    }
    const float s = bits == 8 ? kvq_int8_scale(amax) : kvq_int4_scale(amax);
    *scale = s;
    for (int j = 0; j < g; j++)
        q[j] = bits == 8 ? (uint8_t)kvq_int8_encode(x[j], s) : kvq_int4_encode(x[j], s);
}

/* One KIVI group of g values x[0], x[stride], ...: its scale/zero, then codes q[0..g-1]. */
static kv_qsz encode_kivi_group(const float *x, int64_t stride, int g, int bits, uint8_t *q)
{
    float mn = INFINITY, mx = -INFINITY;
    int bad = 0;
    for (int i = 0; i < g; i++) {
        const float v = x[i * stride];
        bad |= !(fabsf(v) <= KV_F16_MAX); /* NaN, inf, or beyond the fp16 metadata */
        mn = fminf(mn, v);
        mx = fmaxf(mx, v);
    }
    if (bad) {
        memset(q, 0, (size_t)g);
        return kvq_asym_poison();
    }
    const kv_qsz p = kvq_asym_params(mn, mx, bits);
    const float scale = kvq_f16_to_f32(p.scale), zero = kvq_f16_to_f32(p.zero);
    for (int i = 0; i < g; i++) q[i] = kvq_asym_encode(x[i * stride], scale, zero, bits);
    return p;
}

/* One token row of a per-token format (everything but KIVI keys), by the format's codec.
 * x [d]; row [d * bits / 8]; meta_row: this row's d / G entries (int8, KIVI values) or NULL. */
static void encode_row(int fmt, const float *x, int d, float scale, uint8_t *row, void *meta_row)
{
    switch (kvq_format_of(fmt).codec) {
    case KVQ_ELEM: /* element by element: fp32, fp16, bf16; fp8 divided by its scale */
        for (int j = 0; j < d; j++) kvq_elem_encode(fmt, row, j, x[j], scale);
        break;
    case KVQ_SYM: {
        const int g = kvq_row_group(fmt, KV_QROLE_VALUE, d), bits = kvq_code_bits(fmt);
        uint8_t q[KVQ_SYM_GROUP_MAX];
        for (int j0 = 0; j0 < d; j0 += g) {
            if (bits == 8) { /* one code a byte: straight into the row */
                encode_sym_group(x + j0, g, 8, row + j0, (float *)meta_row + j0 / g);
                continue;
            }
            encode_sym_group(x + j0, g, bits, q, (float *)meta_row + j0 / g);
            pack_row(row + j0 * bits / 8, q, g, bits);
        }
        break;
    }
    case KVQ_ASYM: {
        const int bits = kvq_code_bits(fmt);
        uint8_t q[KV_KIVI_GROUP];
        for (int j0 = 0; j0 < d; j0 += KV_KIVI_GROUP) {
            ((kv_qsz *)meta_row)[j0 / KV_KIVI_GROUP] = encode_kivi_group(x + j0, 1, KV_KIVI_GROUP, bits, q);
            pack_row(row + j0 * bits / 8, q, KV_KIVI_GROUP, bits);
        }
        break;
    }
    }
}

/* One block of 32 key rows, KIVI: channel c is one group over the 32 tokens.
 * x [32][d], codes [32][row_bytes], meta [d], q [32][d] scratch (one code per byte). */
static void encode_key_block(int fmt, const float *x, int d, uint8_t *codes, kv_qsz *meta,
                             uint8_t *q)
{
    const int bits = kvq_code_bits(fmt);
    uint8_t col[KV_KIVI_GROUP];
    for (int c = 0; c < d; c++) {
        meta[c] = encode_kivi_group(x + c, d, KV_KIVI_GROUP, bits, col);
        for (int t = 0; t < KV_KIVI_GROUP; t++) q[(size_t)t * d + c] = col[t];
    }
    for (int t = 0; t < KV_KIVI_GROUP; t++)
        pack_row(codes + t * kvq_row_bytes(fmt, d), q + (size_t)t * d, d, bits);
}

int kv_quant_encode(int fmt, int role, const float *x, int64_t n, int d, float scale,
                    void *codes, void *meta, kv_err *err)
{
    int rc = kv_quant_check(fmt, role, n, d, scale, err);
    if (rc) return rc;
    if (n > 0 && (!x || !codes || (!meta && kv_quant_meta_bytes(fmt, role, n, d) > 0)))
        return kv_fail(err, KV_ERR_ARG, "kv_quant_encode %s: NULL buffer", kv_quant_name(fmt));
    const int64_t rb = kvq_row_bytes(fmt, d);
    uint8_t *cb = (uint8_t *)codes;

    if (kvq_is_kivi(fmt) && role == KV_QROLE_KEY) {
        const int64_t blocks = n / KV_KIVI_GROUP;
        int nomem = 0;
        #pragma omp parallel if (n * d >= (1 << 16))
        {
            uint8_t *scratch = kv_calloc((size_t)KV_KIVI_GROUP * d); /* [32][d] one code a byte */
            if (!scratch) {
                #pragma omp atomic write
                nomem = 1;
            }
            #pragma omp for
            for (int64_t b = 0; b < blocks; b++)
                if (scratch)
                    encode_key_block(fmt, x + (size_t)b * KV_KIVI_GROUP * d, d,
                                     cb + (size_t)(b * KV_KIVI_GROUP * rb),
                                     (kv_qsz *)meta + (size_t)b * d, scratch);
            kv_free(scratch);
        }
        if (nomem) return kv_fail(err, KV_ERR_NOMEM, "kv_quant_encode: no scratch memory");
        return KV_OK;
    }
    const int g = kvq_row_group(fmt, role, d);
    const int64_t meta_per_row = g ? d / g : 0;
    #pragma omp parallel for if (n * d >= (1 << 16))
    for (int64_t t = 0; t < n; t++)
        encode_row(fmt, x + (size_t)t * d, d, scale, cb + (size_t)(t * rb),
                   meta ? (uint8_t *)meta + (size_t)(t * meta_per_row * 4) : NULL);
    return KV_OK;
}

/* ---- decode ------------------------------------------------------------------------------ */

int kv_quant_decode(int fmt, int role, const void *codes, const void *meta, int64_t n, int d,
                    float scale, float *x, kv_err *err)
{
    int rc = kv_quant_check(fmt, role, n, d, scale, err);
    if (rc) return rc;
    if (n > 0 && (!x || !codes || (!meta && kv_quant_meta_bytes(fmt, role, n, d) > 0)))
        return kv_fail(err, KV_ERR_ARG, "kv_quant_decode %s: NULL buffer", kv_quant_name(fmt));
    #pragma omp parallel for if (n * d >= (1 << 16))
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < d; j++)
            x[(size_t)t * d + j] = kvq_decode_element(fmt, role, codes, meta, t, j, d, scale);
    return KV_OK;
}
