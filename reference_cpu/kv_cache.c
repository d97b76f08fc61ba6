/* The KV cache (kv_cache.h): chapter 02's contiguous layout, in any storage format of
 * chapter 04.
 *
 *   fp32 layers   k, v  [L][n_slots][H_kv][capacity][d]   (chapter 02, unchanged)
 *   other layers  one kv_cache_plane per layer for K and for V: codes, meta, scale, ring
 *
 * Each (layer, slot, KV head) owns one [capacity][row_bytes] run of codes, so attention over
 * a sequence streams one contiguous run of memory per head whatever the format. The price,
 * which chapter 05 removes, is that every slot reserves capacity tokens whether it uses them
 * or not. All planes live in one allocation, laid out layer after layer, K then V. */
#include "kv_cache.h"
#include "kv_quant.h"

#include <string.h>

/* Limits that catch a mistyped spec before it asks for absurd memory. */
#define KV_CACHE_MAX_SLOTS 65536
#define KV_CACHE_MAX_CAPACITY (1 << 24) /* 16M tokens per slot */
#define KV_CACHE_ALIGN 64               /* every plane starts on a cache line */

size_t kv_dtype_bytes(int dtype)
{
    switch (dtype) {
    case KV_QF_F32: return 4;
    case KV_QF_F16: case KV_QF_BF16: return 2;
    default: return 0;
    }
}

double kv_dtype_bytes_d(int dtype, int d) { return kv_quant_bytes_per_element(dtype, d); }

const char *kv_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < KV_QF_COUNT ? kv_quant_name(dtype) : "unknown";
}

int kv_cache_spec_layer_dtype(const kv_cache_spec *spec, int layer)
{
    if (!spec->dtype_layers) return spec->dtype;
    return layer < 64 && ((spec->dtype_layers >> layer) & 1u) ? spec->dtype : KV_QF_F16;
}

double kv_cache_spec_bytes_per_element(const kv_cache_spec *spec, int n_layers, int d)
{
    double b = 0.0;
    for (int l = 0; l < n_layers; l++) b += kv_quant_bytes_per_element(kv_cache_spec_layer_dtype(spec, l), d);
    return n_layers > 0 ? b / n_layers : 0.0;
}

kv_cache_spec kv_cache_spec_default(int n_slots, int capacity)
{
    kv_cache_spec s;
    memset(&s, 0, sizeof s);
    s.layout = KV_LAYOUT_CONTIGUOUS;
    s.dtype = KV_DTYPE_F32;
    s.n_slots = n_slots;
    s.capacity = capacity;
    return s;
}

int kv_cache_spec_check(const char *who, const kv_config *cfg, const kv_cache_spec *spec,
                        kv_err *err)
{
    if (!cfg || !spec) return kv_fail(err, KV_ERR_ARG, "%s: NULL argument", who);
    if (spec->layout != KV_LAYOUT_CONTIGUOUS)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "%s: cache layout %d is not supported (contiguous = %d)", who,
                       spec->layout, KV_LAYOUT_CONTIGUOUS);
    if (spec->dtype < 0 || spec->dtype >= KV_QF_COUNT)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "%s: cache dtype %d is not supported (known: 0 fp32 .. %d %s)", who,
                       spec->dtype, KV_QF_COUNT - 1, kv_quant_name(KV_QF_COUNT - 1));
    if (spec->n_slots < 1 || spec->n_slots > KV_CACHE_MAX_SLOTS)
        return kv_fail(err, KV_ERR_ARG, "%s: n_slots %d is outside [1, %d]", who,
                       spec->n_slots, KV_CACHE_MAX_SLOTS);
    if (spec->capacity < 1 || spec->capacity > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "%s: capacity %d is outside [1, %d]", who,
                       spec->capacity, KV_CACHE_MAX_CAPACITY);
    if (cfg->n_layers < 1 || cfg->n_heads < 1 || cfg->n_kv_heads < 1 || cfg->dim < cfg->n_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: bad model shape (L %d, H %d, H_kv %d, dim %d)",
                       who, cfg->n_layers, cfg->n_heads, cfg->n_kv_heads, cfg->dim);
    if (spec->dtype_layers && (cfg->n_layers > 64 || (cfg->n_layers < 64 &&
                                                      spec->dtype_layers >> cfg->n_layers)))
        return kv_fail(err, KV_ERR_ARG,
                       "%s: dtype_layers 0x%llx names layers the model (L %d) does not have", who,
                       (unsigned long long)spec->dtype_layers, cfg->n_layers);
    const int d = kv_config_head_dim(cfg), f = spec->dtype;
    const int g = kvq_row_group(f, KV_QROLE_VALUE, d);
    if (g && d % g)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s needs the head dim (%d) to be a "
                       "multiple of its group %d", who, kv_quant_name(f), d, g);
    if (kvq_is_kivi(f)) {
        const int R = spec->kivi_window ? spec->kivi_window : KV_KIVI_WINDOW;
        if (R < KV_KIVI_GROUP || R % KV_KIVI_GROUP)
            return kv_fail(err, KV_ERR_ARG, "%s: %s window %d is not a positive multiple of %d",
                           who, kv_quant_name(f), R, KV_KIVI_GROUP);
    }
    return KV_OK;
}

/* Bytes of each part of one plane (K or V of one layer) for n_heads = n_slots · H_kv heads. */
static void plane_sizes(int fmt, int role, int64_t heads, int capacity, int d, int window,
                        size_t sz[4])
{
    sz[0] = (size_t)heads * kv_quant_code_bytes(fmt, capacity, d);           /* codes */
    sz[1] = (size_t)heads * kv_quant_meta_bytes(fmt, role, capacity, d);     /* meta */
    sz[2] = kvq_is_fp8(fmt) ? (size_t)heads * sizeof(float) : 0;             /* scale */
    sz[3] = kvq_is_kivi(fmt) ? (size_t)heads * window * d * sizeof(float) : 0; /* ring */
}

static size_t align_up(size_t n) { return (n + KV_CACHE_ALIGN - 1) / KV_CACHE_ALIGN * KV_CACHE_ALIGN; }

size_t kv_cache_layout(const kv_cache_spec *spec, int n_layers, int n_kv_heads, int d,
                       uint8_t *base, kv_cache_plane *kp, kv_cache_plane *vp)
{
    /* First the codes of every layer's K, then of every layer's V, each run back to back
     * (4-byte aligned), so an all-fp32 cache is exactly chapter 02's
     * k [L][n_slots][H_kv][capacity][d] followed by v; then metadata, scales and rings,
     * each 64-byte aligned. */
    const int64_t heads = (int64_t)spec->n_slots * n_kv_heads;
    const int window = spec->kivi_window ? spec->kivi_window : KV_KIVI_WINDOW;
    size_t at = 0;
    for (int part = 0; part < 4; part++)
        for (int role = 0; role < 2; role++)
            for (int l = 0; l < n_layers; l++) {
                const int f = kv_cache_spec_layer_dtype(spec, l);
                const int r = role == 0 ? KV_QROLE_KEY : KV_QROLE_VALUE;
                kv_cache_plane *p = role == 0 ? &kp[l] : &vp[l];
                size_t sz[4];
                plane_sizes(f, r, heads, spec->capacity, d, window, sz);
                at = part == 0 ? (at + 3) / 4 * 4 : align_up(at);
                if (part == 0) {
                    memset(p, 0, sizeof *p);
                    p->row_bytes = kvq_row_bytes(f, d);
                    p->meta_entries = (int64_t)(kv_quant_meta_bytes(f, r, spec->capacity, d) / 4);
                }
                if (base && sz[part]) {
                    if (part == 0) p->codes = base + at;
                    if (part == 1) p->meta = base + at;
                    if (part == 2) p->scale = (float *)(void *)(base + at);
                    if (part == 3) p->ring = (float *)(void *)(base + at);
                }
                at += sz[part];
            }
    return align_up(at);
}

int kv_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec, kv_err *err)
{
    if (!c) return kv_fail(err, KV_ERR_ARG, "kv_cache_create: NULL argument");
    memset(c, 0, sizeof *c);
    int rc = kv_cache_spec_check("kv_cache_create", cfg, spec, err);
    if (rc) return rc;

    const int d = kv_config_head_dim(cfg), L = cfg->n_layers;
    const int64_t heads = (int64_t)spec->n_slots * cfg->n_kv_heads;
    const int window = spec->kivi_window ? spec->kivi_window : KV_KIVI_WINDOW;
    /* bytes of codes of one fp32 layer (the largest format), checked for overflow */
    const size_t factors[4] = {(size_t)heads, (size_t)spec->capacity, (size_t)d, 2 * (size_t)L};
    size_t n = sizeof(float);
    for (int i = 0; i < 4; i++) {
        if (n > SIZE_MAX / 4 / factors[i])
            return kv_fail(err, KV_ERR_NOMEM, "kv_cache_create: cache size overflows size_t");
        n *= factors[i];
    }

    c->spec = *spec;
    c->n_layers = L;
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = d;
    c->fmt = kv_calloc((size_t)L * sizeof(int));
    c->kp = kv_calloc((size_t)L * sizeof(kv_cache_plane));
    c->vp = kv_calloc((size_t)L * sizeof(kv_cache_plane));
    c->qlen = kv_calloc((size_t)L * spec->n_slots * sizeof(int));
    c->len = kv_calloc((size_t)spec->n_slots * sizeof(int));
    if (!c->fmt || !c->kp || !c->vp || !c->qlen || !c->len) {
        kv_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM, "kv_cache_create: host memory for the cache tables");
    }
    int all_f32 = 1;
    for (int l = 0; l < L; l++) {
        c->fmt[l] = kv_cache_spec_layer_dtype(spec, l);
        all_f32 &= c->fmt[l] == KV_QF_F32;
        if (kvq_is_kivi(c->fmt[l])) c->window = window;
    }
    const size_t total = kv_cache_layout(spec, L, cfg->n_kv_heads, d, NULL, c->kp, c->vp);
    c->mem = kv_calloc(total);
    if (!c->mem) {
        kv_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM,
                       "kv_cache_create: could not allocate %zu bytes of K/V storage", total);
    }
    c->mem_bytes = total;
    kv_cache_layout(spec, L, cfg->n_kv_heads, d, c->mem, c->kp, c->vp);
    for (int l = 0; l < L; l++)
        for (int role = 0; role < 2; role++) {
            kv_cache_plane *p = role == 0 ? &c->kp[l] : &c->vp[l];
            if (p->scale)
                for (int64_t i = 0; i < heads; i++) p->scale[i] = 1.0f;
        }
    if (all_f32) { /* chapter 02's arrays: kv_cache_k() / kv_cache_v() work on them */
        c->k = (float *)(void *)c->kp[0].codes;
        c->v = (float *)(void *)c->vp[0].codes;
    }
    return KV_OK;
}

void kv_cache_free(kv_cache *c)
{
    if (!c) return;
    kv_free(c->mem);
    kv_free(c->fmt);
    kv_free(c->kp);
    kv_free(c->vp);
    kv_free(c->qlen);
    kv_free(c->len);
    memset(c, 0, sizeof *c);
}

void kv_cache_reset(kv_cache *c, int slot)
{
    /* the stale K/V stay in memory; len (and qlen) make them invisible to attention */
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots) return;
    c->len[slot] = 0;
    for (int l = 0; l < c->n_layers; l++) c->qlen[(size_t)l * c->spec.n_slots + slot] = 0;
}

size_t kv_cache_bytes(const kv_cache *c)
{
    /* fp32: L · 2 · N · H_kv · d · 4 with N = n_slots · capacity reserved tokens; the other
     * formats add their metadata, fp8 scales and KIVI windows (alignment padding excluded) */
    const int64_t heads = (int64_t)c->spec.n_slots * c->n_kv_heads;
    size_t total = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int role = 0; role < 2; role++) {
            size_t sz[4];
            plane_sizes(c->fmt[l], role == 0 ? KV_QROLE_KEY : KV_QROLE_VALUE, heads,
                        c->spec.capacity, c->head_dim, c->window, sz);
            total += sz[0] + sz[1] + sz[2] + sz[3];
        }
    return total;
}

kv_head_view kv_cache_view(const kv_cache *c, int layer, int slot, int kvh, int role)
{
    const kv_cache_plane *p = role == KV_QROLE_KEY ? &c->kp[layer] : &c->vp[layer];
    return kv_cache_plane_view(p, c->fmt[layer], role, c->n_kv_heads, c->spec.capacity,
                               c->head_dim, c->window, slot, kvh,
                               c->qlen[(size_t)layer * c->spec.n_slots + slot]);
}

/* fp8 calibration from a slot's first chunk: amax of each head's finite values over the n
 * rows x [n][H_kv][d]; per tensor, the max over heads. Scales [H_kv] out. */
static void fp8_calibrate_chunk(int fmt, const float *x, int n, int n_kv_heads, int d,
                                int per_head, float *scales)
{
    float all = 0.0f;
    for (int h = 0; h < n_kv_heads; h++) {
        float amax = 0.0f;
        for (int t = 0; t < n; t++) {
            const float *r = x + ((size_t)t * n_kv_heads + h) * d;
            for (int j = 0; j < d; j++)
                if (!kvq_nonfinite(r[j])) amax = fmaxf(amax, fabsf(r[j]));
        }
        scales[h] = amax;
        all = fmaxf(all, amax);
    }
    for (int h = 0; h < n_kv_heads; h++)
        scales[h] = kv_quant_fp8_scale(fmt, per_head ? scales[h] : all);
}

/* One tensor (K or V) of a chunk: x [n][H_kv][d] into plane p of format fmt. */
static int write_plane(kv_cache *c, int layer, kv_cache_plane *p, int role, int slot, int pos,
                       int n, const float *x, int q0, int q1, kv_err *err)
{
    const int fmt = c->fmt[layer], d = c->head_dim, Hkv = c->n_kv_heads, R = c->window;
    const int cap = c->spec.capacity;
    for (int h = 0; h < Hkv; h++) {
        const int64_t head = (int64_t)slot * Hkv + h;
        uint8_t *codes = p->codes + head * cap * p->row_bytes;       /* [capacity][row_bytes] */
        uint8_t *meta = p->meta ? (uint8_t *)p->meta + head * p->meta_entries * 4 : NULL;
        if (!kvq_is_kivi(fmt)) {
            const float scale = p->scale ? p->scale[head] : 1.0f;
            for (int t = 0; t < n; t++) {
                const float *xr = x + ((size_t)t * Hkv + h) * d;    /* [d] */
                const int64_t row = pos + t;
                if (fmt == KV_QF_F32) { /* chapter 02's copy */
                    memcpy(codes + row * p->row_bytes, xr, (size_t)d * sizeof(float));
                    continue;
                }
                int rc = kv_quant_encode(fmt, role, xr, 1, d, scale, codes + row * p->row_bytes,
                                         meta ? meta + kvq_meta_index(fmt, role, row, 0, d) * 4
                                              : NULL, err);
                if (rc) return rc;
            }
            continue;
        }
        /* KIVI: stage rows q0 .. q1-1 (ring for old tokens, input for new), encode them as
         * whole 32-token blocks, then put the tokens that stay unquantized into the ring */
        float *ring = p->ring + head * R * d;                             /* [R][d] */
        if (q1 > q0) {
            float *stage = kv_calloc((size_t)(q1 - q0) * d * sizeof(float)); /* [q1-q0][d] */
            if (!stage)
                return kv_fail(err, KV_ERR_NOMEM, "kv_cache_write: KIVI staging of %d rows",
                               q1 - q0);
            for (int t = q0; t < q1; t++)
                memcpy(stage + (size_t)(t - q0) * d,
                       t < pos ? ring + (size_t)(t % R) * d : x + ((size_t)(t - pos) * Hkv + h) * d,
                       (size_t)d * sizeof(float));
            int rc = kv_quant_encode(fmt, role, stage, q1 - q0, d, 0.0f,
                                     codes + (int64_t)q0 * p->row_bytes,
                                     meta + kvq_meta_index(fmt, role, q0, 0, d) * 4, err);
            kv_free(stage);
            if (rc) return rc;
        }
        for (int t = q1 > pos ? q1 : pos; t < pos + n; t++)
            memcpy(ring + (size_t)(t % R) * d, x + ((size_t)(t - pos) * Hkv + h) * d,
                   (size_t)d * sizeof(float));
    }
    return KV_OK;
}

int kv_cache_write_seq(kv_cache *c, int layer, int slot, int pos, int n, const float *k,
                       const float *v, kv_err *err)
{
    const int fmt = c->fmt[layer];
    if (kvq_is_fp8(fmt) && pos == 0) {
        const int64_t head0 = (int64_t)slot * c->n_kv_heads;
        fp8_calibrate_chunk(fmt, k, n, c->n_kv_heads, c->head_dim, c->spec.fp8_per_head,
                            c->kp[layer].scale + head0);
        fp8_calibrate_chunk(fmt, v, n, c->n_kv_heads, c->head_dim, c->spec.fp8_per_head,
                            c->vp[layer].scale + head0);
    }
    int q0 = 0, q1 = 0;
    int *qlen = &c->qlen[(size_t)layer * c->spec.n_slots + slot];
    if (kvq_is_kivi(fmt)) {
        /* Q1: the smallest multiple of 32, >= Q0, that leaves at most R tokens unquantized */
        q0 = q1 = *qlen;
        const int over = pos + n - c->window;
        if (over > q1) q1 = (over + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP;
    }
    int rc = write_plane(c, layer, &c->kp[layer], KV_QROLE_KEY, slot, pos, n, k, q0, q1, err);
    if (!rc) rc = write_plane(c, layer, &c->vp[layer], KV_QROLE_VALUE, slot, pos, n, v, q0, q1, err);
    if (!rc) *qlen = q1;
    return rc;
}

void kv_cache_write(kv_cache *c, int layer, int slot, int pos, const float *k, const float *v)
{
    kv_cache_write_seq(c, layer, slot, pos, 1, k, v, NULL);
}
