/* The KV cache (kv_cache.h): chapter 02's contiguous layout, in any storage format of
 * chapter 04.
 *
 *   fp32 layers   k, v  [L][n_slots][H_kv][capacity][d]   (chapter 02, unchanged)
 *   other layers  one kv_cache_plane per layer for K and for V: codes, meta, scale, ring
 *
 * Each (layer, slot, KV head) owns one [capacity][row_bytes] run of codes, so attention over
 * a sequence streams one contiguous run of memory per head whatever the format. The price,
 * which chapter 05 removes, is that every slot reserves capacity tokens whether it uses them
 * or not. All planes live in one allocation, laid out layer after layer, K then V.
 *
 * The paged layout (chapter 05) is laid out and written here too; its block operations
 * (block tables, fork, adopting blocks, copy-on-write) are in kv_cache_paged.c. */
#include "kv_cache.h"
#include "kv_quant.h"
#include "kv_retain.h"

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
    return kv_cache_spec_check_caps(who, cfg, spec, 0, err);
}

/* Chapter 06's rules on a spec's retention fields (kv_window.h). */
static int window_check(const char *who, const kv_cache_spec *spec, int caps, kv_err *err)
{
    if (spec->window == 0 && spec->n_sinks == 0 && spec->pos_scheme == KV_POS_ORIGINAL)
        return KV_OK;
    if (spec->window < 0 || spec->window > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "%s: window %d is outside [0, %d] (0 keeps every "
                       "token)", who, spec->window, KV_CACHE_MAX_CAPACITY);
    if (spec->n_sinks < 0 || spec->n_sinks > KV_CACHE_MAX_CAPACITY - spec->window)
        return kv_fail(err, KV_ERR_ARG, "%s: %d sink tokens (need 0 <= S and S + W <= %d)",
                       who, spec->n_sinks, KV_CACHE_MAX_CAPACITY);
    if (spec->pos_scheme != KV_POS_ORIGINAL && spec->pos_scheme != KV_POS_CACHE)
        return kv_fail(err, KV_ERR_ARG, "%s: position scheme %d is neither original (%d) nor "
                       "cache (%d)", who, spec->pos_scheme, KV_POS_ORIGINAL, KV_POS_CACHE);
    if (spec->window == 0)
        return kv_fail(err, KV_ERR_ARG, "%s: %d sinks or the cache position scheme without a "
                       "window (window 0 keeps every token: nothing to sink or renumber)", who,
                       spec->n_sinks);
    if (!(caps & KV_CACHE_CAN_WINDOW))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window cache (window %d, %d "
                       "sinks) is not built on this device yet", who, spec->window,
                       spec->n_sinks);
    if (kvq_is_kivi(spec->dtype))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s with a sliding window: KIVI quantizes "
                       "32-token groups and keeps an fp32 window of rows that never move, "
                       "which a ring of reused rows breaks (use a per-token format: fp16, "
                       "bf16, int8, int8-gG, fp8)", who, kv_quant_name(spec->dtype));
    return KV_OK;
}

int kv_cache_spec_check_caps(const char *who, const kv_config *cfg, const kv_cache_spec *spec,
                             int caps, kv_err *err)
{
    if (!cfg || !spec) return kv_fail(err, KV_ERR_ARG, "%s: NULL argument", who);
    if (spec->layout != KV_LAYOUT_CONTIGUOUS && spec->layout != KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "%s: cache layout %d is not supported (contiguous = %d, paged = %d)",
                       who, spec->layout, KV_LAYOUT_CONTIGUOUS, KV_LAYOUT_PAGED);
    if (spec->layout == KV_LAYOUT_PAGED) {
        if (spec->block_size < 1 || spec->block_size > 4096)
            return kv_fail(err, KV_ERR_ARG, "%s: block size %d is outside [1, 4096]", who,
                           spec->block_size);
        if (spec->n_blocks < 1 || (int64_t)spec->n_blocks * spec->block_size > KV_CACHE_MAX_CAPACITY)
            return kv_fail(err, KV_ERR_ARG, "%s: %d blocks of %d tokens: the pool must hold "
                           "1 .. %d tokens", who, spec->n_blocks, spec->block_size,
                           KV_CACHE_MAX_CAPACITY);
        if (kvq_is_kivi(spec->dtype) && spec->block_size % KV_KIVI_GROUP)
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a paged %s cache needs the block size "
                           "(%d) to be a multiple of %d, the tokens one key scale covers", who,
                           kv_quant_name(spec->dtype), spec->block_size, KV_KIVI_GROUP);
    }
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
    const int rc = kv_retain_spec_check(who, spec, cfg->n_layers, err); /* chapter 09 */
    return rc ? rc : window_check(who, spec, caps, err);
}

/* Bytes of each part of one plane (K or V of one layer): codes and metadata of row_heads
 * heads of rows rows each (contiguous: n_slots · H_kv heads of capacity rows; paged: H_kv
 * heads of N·B pool rows), scales and windows of slot_heads = n_slots · H_kv heads. */
static void plane_sizes(int fmt, int role, int64_t row_heads, int rows, int64_t slot_heads,
                        int d, int window, size_t sz[4])
{
    sz[0] = (size_t)row_heads * kv_quant_code_bytes(fmt, rows, d);                /* codes */
    sz[1] = (size_t)row_heads * kv_quant_meta_bytes(fmt, role, rows, d);          /* meta */
    sz[2] = kvq_is_fp8(fmt) ? (size_t)slot_heads * sizeof(float) : 0;             /* scale */
    sz[3] = kvq_is_kivi(fmt) ? (size_t)slot_heads * window * d * sizeof(float) : 0; /* ring */
}

/* Rows one slot ever holds: its capacity, or S+W when a window forgets the rest. */
static int slot_rows(const kv_cache_spec *spec)
{
    return (int)kv_window_rows(spec->window, spec->n_sinks, spec->capacity);
}

/* Rows per head of a plane and the heads that own rows, for either layout. */
static int spec_rows(const kv_cache_spec *spec)
{
    return spec->layout == KV_LAYOUT_PAGED ? spec->n_blocks * spec->block_size : slot_rows(spec);
}
static int64_t spec_row_heads(const kv_cache_spec *spec, int n_kv_heads)
{
    return spec->layout == KV_LAYOUT_PAGED ? n_kv_heads : (int64_t)spec->n_slots * n_kv_heads;
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
    const int64_t row_heads = spec_row_heads(spec, n_kv_heads);
    const int rows = spec_rows(spec);
    const int window = spec->kivi_window ? spec->kivi_window : KV_KIVI_WINDOW;
    size_t at = 0;
    for (int part = 0; part < 4; part++)
        for (int role = 0; role < 2; role++)
            for (int l = 0; l < n_layers; l++) {
                const int f = kv_cache_spec_layer_dtype(spec, l);
                const int r = role == 0 ? KV_QROLE_KEY : KV_QROLE_VALUE;
                kv_cache_plane *p = role == 0 ? &kp[l] : &vp[l];
                size_t sz[4];
                plane_sizes(f, r, row_heads, rows, heads, d, window, sz);
                at = part == 0 ? (at + 3) / 4 * 4 : align_up(at);
                if (part == 0) {
                    memset(p, 0, sizeof *p);
                    p->row_bytes = kvq_row_bytes(f, d);
                    p->meta_entries = (int64_t)(kv_quant_meta_bytes(f, r, rows, d) / 4);
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
    int rc = kv_cache_spec_check_caps("kv_cache_create", cfg, spec, KV_CACHE_CAN_WINDOW, err);
    if (rc) return rc;

    const int d = kv_config_head_dim(cfg), L = cfg->n_layers;
    const int64_t heads = (int64_t)spec->n_slots * cfg->n_kv_heads;
    const int window = spec->kivi_window ? spec->kivi_window : KV_KIVI_WINDOW;
    /* bytes of codes of one fp32 layer (the largest format), checked for overflow */
    const size_t factors[4] = {(size_t)spec_row_heads(spec, cfg->n_kv_heads),
                               (size_t)spec_rows(spec), (size_t)d, 2 * (size_t)L};
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
    c->rows = spec_rows(spec);
    if (spec->layout == KV_LAYOUT_PAGED) {
        c->max_blocks = (slot_rows(spec) + spec->block_size - 1) / spec->block_size;
        c->tables = kv_calloc((size_t)spec->n_slots * c->max_blocks * sizeof(int));
        c->n_mapped = kv_calloc((size_t)spec->n_slots * sizeof(int));
    }
    if (!c->fmt || !c->kp || !c->vp || !c->qlen || !c->len ||
        (spec->layout == KV_LAYOUT_PAGED && (!c->tables || !c->n_mapped))) {
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
    c->rotary_dim = cfg->rotary_dim;
    if (spec->window > 0 && spec->pos_scheme == KV_POS_CACHE) {
        /* cos and sin of every cache index, computed as kv_rope() computes them, so a key
         * rotated at attention time has the bits kv_rope() would have given it */
        const int64_t keep = kv_window_keep(spec->window, spec->n_sinks), P = cfg->rotary_dim / 2;
        c->rope_cs = kv_calloc((size_t)(keep * P * 2) * sizeof(float)); /* [S+W][P][2] */
        if (!c->rope_cs) {
            kv_cache_free(c);
            return kv_fail(err, KV_ERR_NOMEM, "kv_cache_create: RoPE table of %lld positions",
                           (long long)keep);
        }
        for (int64_t p = 0; p < keep; p++)
            for (int64_t i = 0; i < P; i++) {
                const double freq = pow((double)cfg->rope_theta,
                                        -(double)(2 * i) / (double)cfg->rotary_dim);
                const double angle = (double)p * freq;
                c->rope_cs[(p * P + i) * 2] = (float)cos(angle);
                c->rope_cs[(p * P + i) * 2 + 1] = (float)sin(angle);
            }
    }
    if (spec->select) { /* chapter 09: the selection state of every (slot, layer, KV head) */
        rc = kv_retain_create(&c->retain, spec, L, cfg->n_heads, cfg->n_kv_heads, d, err);
        if (rc) {
            kv_cache_free(c);
            return rc;
        }
    }
    if (all_f32 && !c->tables && spec->window == 0) {
        /* chapter 02's arrays: kv_cache_k() / kv_cache_v() work on them */
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
    kv_free(c->tables);
    kv_free(c->n_mapped);
    kv_free(c->rope_cs);
    for (int i = 0; c->undo && i < c->spec.n_slots; i++) { /* chapter 10 */
        kv_free(c->undo[i].rows);
        kv_free(c->undo[i].qlen0);
    }
    kv_free(c->undo);
    kv_retain_free(c->retain);
    memset(c, 0, sizeof *c);
}

void kv_cache_reset(kv_cache *c, int slot)
{
    /* the stale K/V stay in memory; len (and qlen) make them invisible to attention */
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots) return;
    c->len[slot] = 0;
    for (int l = 0; l < c->n_layers; l++) c->qlen[(size_t)l * c->spec.n_slots + slot] = 0;
    if (c->n_mapped) c->n_mapped[slot] = 0; /* paged: the blocks go back with the table */
    if (c->undo) c->undo[slot].armed = 0;  /* chapter 10: nothing to roll back into */
    kv_retain_reset_slot(c->retain, slot);
}

/* ---- chapter 10: the undo log of a speculative step (kv_cache.h, kv_undo) ---------------- */

int kv_cache_needs_undo(const kv_cache_spec *spec, const int *fmt, int n_layers)
{
    if (spec->window > 0) return 1;
    for (int l = 0; l < n_layers; l++)
        if (kvq_is_kivi(fmt[l])) return 1;
    return 0;
}

size_t kv_undo_plan(kv_undo *u, const kv_cache_plane *kp, const kv_cache_plane *vp,
                    const int *fmt, int n_layers, int n_kv_heads, int d, int window,
                    int max_tokens)
{
    /* one stride for every layer: the widest row (codes + its metadata; a KIVI layer's fp32
     * ring row) and the widest KIVI group (32 rows of codes + their metadata) */
    size_t rs = 0, gs = 0;
    int kivi = 0;
    for (int l = 0; l < n_layers; l++)
        for (int role = 0; role < 2; role++) {
            const kv_cache_plane *p = role ? &vp[l] : &kp[l];
            const int r = role ? KV_QROLE_VALUE : KV_QROLE_KEY;
            size_t off[4];
            if (kvq_is_kivi(fmt[l])) {
                kivi = 1;
                kv_cache_span(p, fmt[l], r, 0, 0, 0, KV_KIVI_GROUP, d, off);
                if (off[1] + off[3] > gs) gs = off[1] + off[3];
                if ((size_t)d * sizeof(float) > rs) rs = (size_t)d * sizeof(float);
            } else if (window > 0) {
                kv_cache_span(p, fmt[l], r, 0, 0, 0, 1, d, off);
                if (off[1] + off[3] > rs) rs = off[1] + off[3];
            }
        }
    u->max_tokens = max_tokens;
    u->n_groups = kivi ? (max_tokens + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP + 1 : 0;
    u->row_stride = (rs + 15) / 16 * 16;
    u->group_stride = (gs + 15) / 16 * 16;
    const size_t heads = (size_t)n_layers * 2 * n_kv_heads;
    return heads * ((size_t)max_tokens * u->row_stride + (size_t)u->n_groups * u->group_stride);
}

int kv_undo_check(const char *who, const kv_undo *u, int slot, int len, int cur_len,
                  kv_err *err)
{
    if (!u || !u->armed)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: slot %d: a windowed or KIVI cache rolls "
                       "back only what its undo log saved (the ring and the spills overwrite "
                       "rows); arm it with speculate before the step", who, slot);
    if (len < u->len0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: slot %d: %d tokens lies before the %d the "
                       "slot held when its undo log was armed; older rows were not saved", who,
                       slot, len, u->len0);
    const int end = u->end > cur_len ? u->end : cur_len;
    if (end - len > u->max_tokens)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: slot %d: dropping %d tokens, but the undo "
                       "log holds the last %d", who, slot, end - len, u->max_tokens);
    return KV_OK;
}

/* Entry of position p, or of the group starting at row g, for (layer, K/V, head h). */
static uint8_t *undo_row(const kv_cache *c, const kv_undo *u, int layer, int kv, int h,
                         int64_t p)
{
    const size_t head = ((size_t)layer * 2 + kv) * c->n_kv_heads + h;
    return u->rows + (head * u->max_tokens + (size_t)(p % u->max_tokens)) * u->row_stride;
}
static uint8_t *undo_group(const kv_cache *c, const kv_undo *u, int layer, int kv, int h,
                           int64_t g)
{
    const size_t head = ((size_t)layer * 2 + kv) * c->n_kv_heads + h;
    return u->groups + (head * u->n_groups + (size_t)(g / KV_KIVI_GROUP % u->n_groups)) *
                           u->group_stride;
}

/* Rows prow .. prow+n-1 of one head of plane p: codes then metadata into buf (save 1), or
 * back from it (save 0). Returns the bytes copied. */
static size_t span_copy(const kv_cache *c, int layer, const kv_cache_plane *p, int role,
                      int64_t rhead, int64_t prow, int n, uint8_t *buf, int save)
{
    size_t off[4];
    kv_cache_span(p, c->fmt[layer], role, rhead, c->rows, prow, n, c->head_dim, off);
    uint8_t *codes = p->codes + off[0], *meta = off[3] ? (uint8_t *)p->meta + off[2] : NULL;
    if (save) {
        memcpy(buf, codes, off[1]);
        if (meta) memcpy(buf + off[1], meta, off[3]);
    } else {
        memcpy(codes, buf, off[1]);
        if (meta) memcpy(meta, buf + off[1], off[3]);
    }
    return off[1] + off[3];
}

/* Physical row of a slot's logical row r (contiguous: r itself). */
static int64_t phys_row(const kv_cache *c, int slot, int64_t r)
{
    if (!c->tables) return r;
    const int B = c->spec.block_size;
    return (int64_t)c->tables[(size_t)slot * c->max_blocks + r / B] * B + r % B;
}

static kv_undo *armed_log(const kv_cache *c, int slot)
{
    return c->undo && c->undo[slot].armed ? &c->undo[slot] : NULL;
}

/* The first position of a write of n at pos worth logging: after it the slot holds at least
 * pos + n, and a truncation keeps at least that minus max_tokens (and the armed length), so
 * older rows are never copied back: a long prefill logs only its last max_tokens rows. */
static int undo_from(const kv_undo *u, int pos, int n)
{
    const int f = pos + n - u->max_tokens;
    return f > u->len0 ? (f > pos ? f : pos) : (u->len0 > pos ? u->len0 : pos);
}

int kv_cache_speculate(kv_cache *c, int slot, int max_tokens, kv_err *err)
{
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_speculate: slot %d outside the cache", slot);
    if (max_tokens < 0 || max_tokens > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_speculate: %d tokens outside [0, %d]",
                       max_tokens, KV_CACHE_MAX_CAPACITY);
    if (!kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) return KV_OK; /* a length does */
    if (!c->undo) {
        c->undo = kv_calloc((size_t)c->spec.n_slots * sizeof(kv_undo));
        if (!c->undo) return kv_fail(err, KV_ERR_NOMEM, "kv_cache_speculate: undo logs");
    }
    kv_undo *u = &c->undo[slot];
    u->armed = 0;
    if (max_tokens == 0) return KV_OK;
    if (!u->qlen0) u->qlen0 = kv_calloc((size_t)c->n_layers * sizeof(int));
    const size_t bytes = kv_undo_plan(u, c->kp, c->vp, c->fmt, c->n_layers, c->n_kv_heads,
                                      c->head_dim, c->spec.window, max_tokens);
    if (bytes > u->alloc_bytes) { /* grown only: a smaller log fits the same allocation */
        kv_free(u->rows);
        u->rows = kv_calloc(bytes);
        u->alloc_bytes = u->rows ? bytes : 0;
    }
    if (!u->rows || !u->qlen0)
        return kv_fail(err, KV_ERR_NOMEM, "kv_cache_speculate: %zu bytes of undo log", bytes);
    /* the group entries follow the row entries in the same allocation */
    u->groups = u->rows + (size_t)c->n_layers * 2 * c->n_kv_heads * max_tokens * u->row_stride;
    u->len0 = u->end = c->len[slot];
    for (int l = 0; l < c->n_layers; l++) u->qlen0[l] = c->qlen[(size_t)l * c->spec.n_slots + slot];
    u->armed = 1;
    return KV_OK;
}

/* KIVI: what len tokens quantize, Q(len) = the smallest multiple of 32 leaving at most R in
 * the window (every chunking reaches the same count), never below the count when armed. */
static int kivi_qlen(int len, int R, int q_armed)
{
    const int q = len > R ? (len - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
    return q > q_armed ? q : q_armed;
}

/* Copy back, newest first, what the writes of positions len .. end-1 overwrote: the groups
 * spilled past Q(len) (their codes and metadata as before the spill), KIVI's fp32 window
 * rows and a window's ring rows; then the quantized counts. */
static void undo_restore(kv_cache *c, kv_undo *u, int slot, int len)
{
    const int Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    for (int l = 0; l < c->n_layers; l++) {
        int *q = &c->qlen[(size_t)l * c->spec.n_slots + slot];
        const int kivi = kvq_is_kivi(c->fmt[l]), qn = kivi ? kivi_qlen(len, R, u->qlen0[l]) : 0;
        for (int kv = 0; kv < 2; kv++) {
            kv_cache_plane *p = kv ? &c->vp[l] : &c->kp[l];
            const int role = kv ? KV_QROLE_VALUE : KV_QROLE_KEY;
            for (int h = 0; h < Hkv; h++) {
                const int64_t head = (int64_t)slot * Hkv + h, rhead = c->tables ? h : head;
                if (kivi) {
                    for (int g = qn; g < *q; g += KV_KIVI_GROUP)
                        span_copy(c, l, p, role, rhead, phys_row(c, slot, g), KV_KIVI_GROUP,
                                  undo_group(c, u, l, kv, h, g), 0);
                    for (int64_t t = u->end - 1; t >= len; t--)
                        memcpy(p->ring + (head * R + t % R) * d, undo_row(c, u, l, kv, h, t),
                               (size_t)d * sizeof(float));
                } else if (c->spec.window > 0) {
                    for (int64_t t = u->end - 1; t >= len; t--) {
                        const int64_t lr = kv_window_row(c->spec.window, c->spec.n_sinks, t);
                        span_copy(c, l, p, role, rhead, phys_row(c, slot, lr), 1,
                                  undo_row(c, u, l, kv, h, t), 0);
                    }
                }
            }
        }
        if (kivi) *q = qn;
    }
}

int kv_cache_truncate(kv_cache *c, int slot, int len, kv_err *err)
{
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_truncate: slot %d outside the cache", slot);
    if (len < 0 || len > c->len[slot])
        return kv_fail(err, KV_ERR_ARG, "kv_cache_truncate: %d tokens but slot %d holds %d",
                       len, slot, c->len[slot]);
    if (c->retain)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_cache_truncate: %s retention already "
                       "observed and evicted with the rejected tokens; its kept sets cannot "
                       "be rolled back", kv_select_method_name(c->spec.select));
    if (len < c->len[slot] && kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) {
        /* a window's ring and KIVI's spills overwrote rows: copy them back (chapter 10) */
        kv_undo *u = c->undo ? &c->undo[slot] : NULL;
        int rc = kv_undo_check("kv_cache_truncate", u, slot, len, c->len[slot], err);
        if (rc) return rc;
        if (c->len[slot] > u->end) u->end = c->len[slot];
        undo_restore(c, u, slot, len);
    }
    if (c->undo) c->undo[slot].armed = 0;
    c->len[slot] = len;
    return KV_OK;
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
            plane_sizes(c->fmt[l], role == 0 ? KV_QROLE_KEY : KV_QROLE_VALUE,
                        spec_row_heads(&c->spec, c->n_kv_heads), c->rows, heads, c->head_dim,
                        c->window, sz);
            total += sz[0] + sz[1] + sz[2] + sz[3];
        }
    return total;
}

kv_head_view kv_cache_view(const kv_cache *c, int layer, int slot, int kvh, int role)
{
    const kv_cache_plane *p = role == KV_QROLE_KEY ? &c->kp[layer] : &c->vp[layer];
    const int64_t q = c->qlen[(size_t)layer * c->spec.n_slots + slot];
    if (c->tables)
        return kv_cache_plane_view_paged(p, c->fmt[layer], role, c->n_kv_heads, c->rows,
                                         c->head_dim, c->window, slot, kvh, q,
                                         c->tables + (size_t)slot * c->max_blocks,
                                         c->spec.block_size);
    return kv_cache_plane_view(p, c->fmt[layer], role, c->n_kv_heads, c->rows,
                               c->head_dim, c->window, slot, kvh, q);
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
    /* contiguous: the slot's own rows; paged: the pool's rows, found through the table */
    const int *table = c->tables ? c->tables + (size_t)slot * c->max_blocks : NULL;
    const int B = c->spec.block_size;
    for (int h = 0; h < Hkv; h++) {
        const int64_t head = (int64_t)slot * Hkv + h;            /* scales and windows */
        const int64_t rhead = table ? h : head;                  /* codes and metadata */
        uint8_t *codes = p->codes + rhead * c->rows * p->row_bytes;  /* [rows][row_bytes] */
        uint8_t *meta = p->meta ? (uint8_t *)p->meta + rhead * p->meta_entries * 4 : NULL;
        if (!kvq_is_kivi(fmt)) {
            const float scale = p->scale ? p->scale[head] : 1.0f;
            for (int t = 0; t < n; t++) {
                const float *xr = x + ((size_t)t * Hkv + h) * d;    /* [d] */
                /* retention picks the logical row (a ring row with a window), the layout
                 * where that row is stored */
                const int64_t r = kv_window_row(c->spec.window, c->spec.n_sinks, (int64_t)pos + t);
                const int64_t row = table ? (int64_t)table[r / B] * B + r % B : r;
                kv_undo *u = c->spec.window > 0 ? armed_log(c, slot) : NULL;
                if (u && pos + t >= undo_from(u, pos, n)) { /* chapter 10: what the row held */
                    u->copied += (double)span_copy(c, layer, p, role, rhead, row, 1,
                                                   undo_row(c, u, layer, role == KV_QROLE_VALUE,
                                                            h, pos + t), 1);
                }
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
        kv_undo *u = armed_log(c, slot);
        if (u) /* chapter 10: each new token's ring row as a one-token-at-a-time run would
                * find it: the chunk's own token t-R when that is in the chunk, else the ring */
            for (int t = undo_from(u, pos, n); t < pos + n; t++) {
                memcpy(undo_row(c, u, layer, role == KV_QROLE_VALUE, h, t),
                       t - R >= pos ? x + ((size_t)(t - R - pos) * Hkv + h) * d
                                    : ring + (size_t)(t % R) * d,
                       (size_t)d * sizeof(float));
                u->copied += (double)d * sizeof(float);
            }
        if (q1 > q0) {
            float *stage = kv_calloc((size_t)(q1 - q0) * d * sizeof(float)); /* [q1-q0][d] */
            if (!stage)
                return kv_fail(err, KV_ERR_NOMEM, "kv_cache_write: KIVI staging of %d rows",
                               q1 - q0);
            for (int t = q0; t < q1; t++)
                memcpy(stage + (size_t)(t - q0) * d,
                       t < pos ? ring + (size_t)(t % R) * d : x + ((size_t)(t - pos) * Hkv + h) * d,
                       (size_t)d * sizeof(float));
            /* one 32-token group at a time: a group never straddles two blocks (32 | B) */
            int rc = KV_OK;
            for (int g = q0; g < q1 && !rc; g += KV_KIVI_GROUP) {
                const int64_t row = table ? (int64_t)table[g / B] * B + g % B : g;
                if (u && g >= kivi_qlen(undo_from(u, pos, n), R, 0)) { /* chapter 10: the
                                                * group as it was, if a rollback can reach it */
                    u->copied += (double)span_copy(c, layer, p, role, rhead, row, KV_KIVI_GROUP,
                                                   undo_group(c, u, layer,
                                                              role == KV_QROLE_VALUE, h, g), 1);
                }
                rc = kv_quant_encode(fmt, role, stage + (size_t)(g - q0) * d, KV_KIVI_GROUP, d,
                                     0.0f, codes + row * p->row_bytes,
                                     meta + kvq_meta_index(fmt, role, row, 0, d) * 4, err);
            }
            kv_free(stage);
            if (rc) return rc;
        }
        /* the chunk's last R tokens enter the ring, spilled or not: the ring then holds each
         * row's latest token whatever the chunking, so a rollback (chapter 10) that un-spills
         * a group finds its fp32 rows there */
        for (int t = pos + n - R > pos ? pos + n - R : pos; t < pos + n; t++)
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
    kv_undo *u = armed_log(c, slot);
    if (!rc && u && pos + n > u->end) u->end = pos + n; /* chapter 10 */
    return rc;
}

void kv_cache_write(kv_cache *c, int layer, int slot, int pos, const float *k, const float *v)
{
    kv_cache_write_seq(c, layer, slot, pos, 1, k, v, NULL);
}
