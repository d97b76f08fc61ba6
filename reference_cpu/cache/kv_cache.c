/* The KV cache (kv_cache.h), chapter 02: contiguous rows, one run per (layer, slot, KV head).
 *
 *   fp32 layers   k, v  [L][n_slots][H_kv][capacity][d]   (chapter 02, unchanged)
 *   other layers  a list of kv_cache_plane per layer (K, then V): codes, meta, scale, ring
 *
 * Each (layer, slot, KV head) owns one [capacity][row_bytes] run of codes, so attention over
 * a sequence streams one contiguous run of memory per head whatever the format. The price,
 * which chapter 05 removes, is that every slot reserves capacity tokens whether it uses them
 * or not. All planes live in one allocation, laid out layer after layer, K then V.
 *
 * Here are the layout, the life of a cache and the write; what later chapters add is in files
 * of their own, met through kv_cache_internal.h (a row locator and a row codec):
 *   kv_cache_spec.c    the spec's checks and its strings
 *   kv_cache_codec.c   chapter 04: one row in a storage format (fp8's calibration)
 *   kv_cache_kivi.c    chapter 04: KIVI's window and 32-token spills
 *   kv_cache_paged.c   chapter 05: rows in a pool of blocks, and the block operations
 *   kv_cache_window.c  chapter 06: sliding window and sinks
 *   kv_cache_undo.c    chapter 10: rolling back a speculative step */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <string.h>

/* Every part of every plane starts a multiple of 128 bytes into the allocation (a GPU's cache
 * line, two of a CPU's); the allocation itself starts on 256 bytes on the GPU (cudaMalloc) and on 64, a CPU's
 * line, here (kv_calloc()). With rows a multiple of 16 bytes (fp16 with 8 | d, int8 and fp8
 * with 16 | d, fp32 with 4 | d) every row then starts on 16 bytes, what the GPU's 16-byte loads
 * ask of it (cuda/core/kvcu_vec.cuh). The metadata (int8 scales, KIVI kv_qsz) live in planes
 * of their own, never between rows. Padding is not counted: kv_cache_bytes() stays the sum of
 * the parts, and so does every byte count the chapters print. */
#define KV_CACHE_ALIGN 128

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
    return (int)kv_window_rows(spec->window.size, spec->window.n_sinks, spec->capacity);
}

/* Rows per head of a plane and the heads that own rows, for either layout. */
static int spec_rows(const kv_cache_spec *spec)
{
    return spec->layout.kind == KV_LAYOUT_PAGED ? spec->layout.n_blocks * spec->layout.block_size
                                                : slot_rows(spec);
}
static int64_t spec_row_heads(const kv_cache_spec *spec, int n_kv_heads)
{
    return spec->layout.kind == KV_LAYOUT_PAGED ? n_kv_heads : (int64_t)spec->n_slots * n_kv_heads;
}

static size_t align_up(size_t n) { return (n + KV_CACHE_ALIGN - 1) / KV_CACHE_ALIGN * KV_CACHE_ALIGN; }

size_t kv_cache_layout(const kv_cache_spec *spec, int n_layers, int n_kv_heads, int d,
                       uint8_t *base, kv_cache_plane *planes)
{
    return kv_cache_layout_planes(spec, KV_CACHE_KV_PLANES, n_layers, n_kv_heads, d, base, planes);
}

size_t kv_cache_layout_planes(const kv_cache_spec *spec, int n_planes, int n_layers,
                              int n_kv_heads, int d, uint8_t *base, kv_cache_plane *planes)
{
    /* First the codes of every layer's K, then of every layer's V, then metadata, scales and
     * rings, each part 128-byte aligned (KV_CACHE_ALIGN). An all-fp32 cache is chapter 02's
     * k [L][n_slots][H_kv][capacity][d] followed by v, with no padding between layers when
     * a layer's plane is a multiple of 128 bytes (any d that is a multiple of 32); the
     * accessors kv_cache_k() / kv_cache_v() find a layer through its plane either way. */
    const int64_t heads = (int64_t)spec->n_slots * n_kv_heads;
    const int64_t row_heads = spec_row_heads(spec, n_kv_heads);
    const int rows = spec_rows(spec);
    const int window = spec->quant.kivi_window ? spec->quant.kivi_window : KV_KIVI_WINDOW;
    size_t at = 0;
    for (int part = 0; part < 4; part++)
        for (int i = 0; i < n_planes; i++)
            for (int l = 0; l < n_layers; l++) {
                const int f = kv_cache_spec_layer_dtype(spec, l);
                const int r = kv_cache_plane_role(i);
                kv_cache_plane *p = kv_cache_plane_of(planes, n_layers, i, l);
                size_t sz[4];
                plane_sizes(f, r, row_heads, rows, heads, d, window, sz);
                at = align_up(at);
                if (part == 0) {
                    memset(p, 0, sizeof *p);
                    p->role = r;
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
    return kv_cache_create_planes(c, cfg, spec, KV_CACHE_KV_PLANES, err);
}

int kv_cache_create_planes(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                           int n_planes, kv_err *err)
{
    if (!c) return kv_fail(err, KV_ERR_ARG, "kv_cache_create: NULL argument");
    if (n_planes < 1 || n_planes > KV_CACHE_KV_PLANES)
        return kv_fail(err, KV_ERR_ARG, "kv_cache_create: %d planes per layer (1 or %d)",
                       n_planes, KV_CACHE_KV_PLANES);
    /* the host state both devices share (kv_cache_state.c): checks, tables, the planes' sizes */
    int rc = kv_cache_state_create(c, "kv_cache_create", cfg, spec, n_planes, err);
    if (rc) return rc;
    const size_t total = c->mem_bytes;
    uint8_t *mem = kv_calloc(total);
    if (!mem) {
        kv_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM,
                       "kv_cache_create: could not allocate %zu bytes of K/V storage", total);
    }
    kv_cache_state_place(c, mem);
    const int64_t heads = (int64_t)spec->n_slots * c->n_kv_heads;
    for (int i = 0; i < c->n_planes * c->n_layers; i++) {
        kv_cache_plane *p = &c->planes[i];
        if (p->scale) /* fp8 scales start at 1 (calibration overwrites them at position 0) */
            for (int64_t h = 0; h < heads; h++) p->scale[h] = 1.0f;
    }
    rc = kv_cache_window_create(c, "kv_cache_create", cfg, err); /* chapter 06: KV_POS_CACHE */
    if (rc) kv_cache_free(c);
    return rc;
}

void kv_cache_free(kv_cache *c)
{
    if (!c) return;
    kv_free(c->mem);
    kv_cache_undo_free(c); /* chapter 10: the logs' rows */
    kv_cache_state_free(c);
}

void kv_cache_reset(kv_cache *c, int slot)
{
    /* the stale K/V stay in memory; len (and qlen) make them invisible to attention */
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots) return;
    c->len[slot] = 0;
    for (int l = 0; l < c->n_layers; l++) c->qlen[(size_t)l * c->spec.n_slots + slot] = 0;
    if (c->n_mapped) c->n_mapped[slot] = 0; /* paged: the blocks go back with the table */
    kv_cache_undo_disarm(c, slot);          /* chapter 10: nothing to roll back into */
}

size_t kv_cache_bytes(const kv_cache *c)
{
    /* fp32: L · 2 · N · H_kv · d · 4 with N = n_slots · capacity reserved tokens; the other
     * formats add their metadata, fp8 scales and KIVI windows (alignment padding excluded) */
    const int64_t heads = (int64_t)c->spec.n_slots * c->n_kv_heads;
    size_t total = 0;
    for (int i = 0; i < c->n_planes; i++)
        for (int l = 0; l < c->n_layers; l++) {
            size_t sz[4];
            plane_sizes(c->fmt[l], kv_cache_plane_of(c->planes, c->n_layers, i, l)->role,
                        spec_row_heads(&c->spec, c->n_kv_heads), c->rows, heads, c->head_dim,
                        c->window, sz);
            total += sz[0] + sz[1] + sz[2] + sz[3];
        }
    return total;
}

kv_head_view kv_cache_view(const kv_cache *c, int layer, int slot, int kvh, int role)
{
    const kv_cache_plane *p =
        kv_cache_plane_of(c->planes, c->n_layers, kv_cache_role_plane(role), layer);
    const int64_t q = c->qlen[(size_t)layer * c->spec.n_slots + slot];
    if (c->tables)
        return kv_cache_plane_view_paged(p, c->fmt[layer], role, c->n_kv_heads, c->rows,
                                         c->head_dim, c->window, slot, kvh, q,
                                         c->tables + (size_t)slot * c->max_blocks,
                                         c->spec.layout.block_size);
    return kv_cache_plane_view(p, c->fmt[layer], role, c->n_kv_heads, c->rows,
                               c->head_dim, c->window, slot, kvh, q);
}

kv_row_loc kv_cache_locate(const kv_cache *c, int slot, int h, int64_t r)
{
    kv_row_loc at;
    at.head = (int64_t)slot * c->n_kv_heads + h;
    at.rhead = c->tables ? h : at.head; /* paged: the pool's head h (kv_cache_paged.c) */
    at.row = c->tables ? kv_cache_paged_row(c, slot, r) : r;
    return at;
}

/* One plane of a chunk in a per-token format: x [n][H_kv][d], token t at position pos + t.
 * Each row is the product of the parts: retention picks its logical row, the layout where that
 * row lives, the undo log keeps what it held, the codec writes it. */
static int write_rows(kv_cache *c, int layer, kv_cache_plane *p, int slot, int pos, int n,
                      const float *x, kv_err *err)
{
    for (int h = 0; h < c->n_kv_heads; h++)
        for (int t = 0; t < n; t++) {
            const float *xr = x + ((size_t)t * c->n_kv_heads + h) * c->head_dim; /* [d] */
            const kv_row_loc at = kv_cache_locate(c, slot, h, kv_cache_logical_row(c, pos + t));
            int rc = kv_cache_undo_row(c, layer, p, slot, h, at, pos, n, pos + t, err);
            if (!rc) rc = kv_cache_row_encode(c, layer, p, at, xr, err);
            if (rc) return rc;
        }
    return KV_OK;
}

int kv_cache_write_seq(kv_cache *c, int layer, int slot, int pos, int n, const float *k,
                       const float *v, kv_err *err)
{
    const float *x[KV_CACHE_KV_PLANES] = {k, v}; /* each plane's rows [n][H_kv][d] */
    kv_cache_codec_begin(c, layer, slot, pos, n, x); /* fp8: calibrate at position 0 */
    int rc = KV_OK;
    if (kvq_is_kivi(c->fmt[layer])) /* rows wait in a window, then spill in groups */
        rc = kv_cache_kivi_write(c, layer, slot, pos, n, x, err);
    else
        for (int i = 0; i < c->n_planes && !rc; i++)
            rc = write_rows(c, layer, kv_cache_plane_of(c->planes, c->n_layers, i, layer), slot,
                            pos, n, x[i], err);
    if (!rc) kv_cache_undo_written(c, slot, pos, n); /* chapter 10 */
    return rc;
}

void kv_cache_write(kv_cache *c, int layer, int slot, int pos, const float *k, const float *v)
{
    kv_cache_write_seq(c, layer, slot, pos, 1, k, v, NULL);
}
