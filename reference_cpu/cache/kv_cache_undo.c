/* Chapter 10's part of the cache: the undo log of a speculative step (kv_cache.h, kv_undo).
 *
 * A verification step writes its draft tokens like any others; a rejected tail is dropped by a
 * length alone (kv_cache_truncate()) unless a write overwrote something: a window's ring row
 * (chapter 06) or, for KIVI (chapter 04), an fp32 window row and the groups a spill encoded.
 * While a slot's log is armed (kv_cache_speculate()), the writes call the hooks at the end of
 * this file first, which copy what they are about to overwrite; a truncation copies it back,
 * newest first. All of it serves the CUDA cache too: the log's entries live in the cache's own
 * memory (kv_cache_alloc()) and every copy goes through kv_cache_copy(), device to device
 * there. */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <string.h>

int kv_cache_needs_undo(const kv_cache_spec *spec, const int *fmt, int n_layers)
{
    if (spec->window.size > 0) return 1;
    for (int l = 0; l < n_layers; l++)
        if (kvq_is_kivi(fmt[l])) return 1;
    return 0;
}

/* Size an undo log of @p max_tokens for a cache's @p planes [n_planes][n_layers] (@p window:
 * W; ring rows are logged only when W > 0): u->max_tokens, n_groups, the strides, and the
 * bytes of rows + groups returned. */
static size_t undo_plan(kv_undo *u, const kv_cache_plane *planes, int n_planes, const int *fmt,
                        int n_layers, int n_kv_heads, int d, int window, int max_tokens)
{
    /* one stride for every layer: the widest row (codes + its metadata; a KIVI layer's fp32
     * ring row) and the widest KIVI group (32 rows of codes + their metadata) */
    size_t rs = 0, gs = 0;
    int kivi = 0;
    for (int l = 0; l < n_layers; l++)
        for (int i = 0; i < n_planes; i++) {
            const kv_cache_plane *p = &planes[(size_t)i * n_layers + l];
            const int r = p->role;
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
    const size_t heads = (size_t)n_layers * n_planes * n_kv_heads;
    return heads * ((size_t)max_tokens * u->row_stride + (size_t)u->n_groups * u->group_stride);
}

/* The refusals of an undo-log truncation: KV_ERR_UNSUPPORTED unless @p u is armed, len >= its
 * len0 and at most max_tokens positions (up to u->end) are dropped. */
static int undo_check(const char *who, const kv_undo *u, int slot, int len, int cur_len,
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

/* Entry of position p, or of the group starting at row g, for (layer, plane i, head h): the
 * log is [L][n_planes][H_kv]. */
static uint8_t *undo_row(const kv_cache *c, const kv_undo *u, int layer, int i, int h,
                         int64_t p)
{
    const size_t head = ((size_t)layer * c->n_planes + i) * c->n_kv_heads + h;
    return u->rows + (head * u->max_tokens + (size_t)(p % u->max_tokens)) * u->row_stride;
}
static uint8_t *undo_group(const kv_cache *c, const kv_undo *u, int layer, int i, int h,
                           int64_t g)
{
    const size_t head = ((size_t)layer * c->n_planes + i) * c->n_kv_heads + h;
    return u->groups + (head * u->n_groups + (size_t)(g / KV_KIVI_GROUP % u->n_groups)) *
                           u->group_stride;
}

/* Rows prow .. prow+n-1 of one head of plane p: codes then metadata into buf (save 1), or
 * back from it (save 0), in the cache's memory (kv_cache_copy()); *bytes += what moved. */
static int span_copy(const kv_cache *c, int layer, const kv_cache_plane *p, int64_t rhead,
                     int64_t prow, int n, uint8_t *buf, int save, double *bytes, kv_err *err)
{
    size_t off[4];
    kv_cache_span(p, c->fmt[layer], p->role, rhead, c->rows, prow, n, c->head_dim, off);
    uint8_t *codes = p->codes + off[0], *meta = off[3] ? (uint8_t *)p->meta + off[2] : NULL;
    int rc = save ? kv_cache_copy(c, buf, codes, off[1], "undo log", err)
                  : kv_cache_copy(c, codes, buf, off[1], "undo log", err);
    if (!rc && meta)
        rc = save ? kv_cache_copy(c, buf + off[1], meta, off[3], "undo log", err)
                  : kv_cache_copy(c, meta, buf + off[1], off[3], "undo log", err);
    if (bytes) *bytes += (double)(off[1] + off[3]);
    return rc;
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

int kv_cache_state_speculate(kv_cache *c, const char *who, int slot, int max_tokens,
                             kv_err *err)
{
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d outside the cache", who, slot);
    if (max_tokens < 0 || max_tokens > KV_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "%s: %d tokens outside [0, %d]", who, max_tokens,
                       KV_CACHE_MAX_CAPACITY);
    if (!kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) return KV_OK; /* a length does */
    if (!c->undo) {
        c->undo = kv_calloc((size_t)c->spec.n_slots * sizeof(kv_undo));
        if (!c->undo) return kv_fail(err, KV_ERR_NOMEM, "%s: undo logs", who);
    }
    kv_undo *u = &c->undo[slot];
    u->armed = 0;
    if (max_tokens == 0) return KV_OK;
    if (!u->qlen0) u->qlen0 = kv_calloc((size_t)c->n_layers * sizeof(int));
    if (!u->qlen0) return kv_fail(err, KV_ERR_NOMEM, "%s: host memory", who);
    const size_t bytes = undo_plan(u, c->planes, c->n_planes, c->fmt, c->n_layers,
                                      c->n_kv_heads, c->head_dim, c->spec.window.size, max_tokens);
    if (bytes > u->alloc_bytes) { /* grown only: a smaller log fits the same allocation */
        kv_cache_release(c, u->rows);
        u->rows = NULL;
        u->alloc_bytes = 0;
        void *rows = NULL;
        int rc = kv_cache_alloc(c, &rows, bytes, who, err); /* in the cache's memory */
        if (rc) return rc;
        u->rows = rows;
        u->alloc_bytes = bytes;
    }
    /* the group entries follow the row entries in the same allocation */
    u->groups = u->rows +
                (size_t)c->n_layers * c->n_planes * c->n_kv_heads * max_tokens * u->row_stride;
    u->len0 = u->end = c->len[slot];
    for (int l = 0; l < c->n_layers; l++) u->qlen0[l] = c->qlen[(size_t)l * c->spec.n_slots + slot];
    u->armed = 1;
    return KV_OK;
}

int kv_cache_speculate(kv_cache *c, int slot, int max_tokens, kv_err *err)
{
    return kv_cache_state_speculate(c, "kv_cache_speculate", slot, max_tokens, err);
}

/* Copy back, newest first, what the writes of positions len .. end-1 overwrote: the groups
 * spilled past Q(len) (their codes and metadata as before the spill), KIVI's fp32 window
 * rows and a window's ring rows; then the quantized counts. */
static int undo_restore(kv_cache *c, kv_undo *u, int slot, int len, kv_err *err)
{
    const int Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    int rc = KV_OK;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        int *q = &c->qlen[(size_t)l * c->spec.n_slots + slot];
        const int kivi = kvq_is_kivi(c->fmt[l]), qn = kivi ? kv_cache_kivi_qlen(len, R, u->qlen0[l]) : 0;
        for (int kv = 0; kv < c->n_planes && !rc; kv++) {
            kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, kv, l);
            for (int h = 0; h < Hkv && !rc; h++) {
                if (kivi) {
                    for (int g = qn; g < *q && !rc; g += KV_KIVI_GROUP) {
                        const kv_row_loc at = kv_cache_locate(c, slot, h, g);
                        rc = span_copy(c, l, p, at.rhead, at.row, KV_KIVI_GROUP,
                                       undo_group(c, u, l, kv, h, g), 0, NULL, err);
                    }
                    const int64_t head = (int64_t)slot * Hkv + h;
                    for (int64_t t = u->end - 1; t >= len && !rc; t--)
                        rc = kv_cache_copy(c, p->ring + (head * R + t % R) * d,
                                           undo_row(c, u, l, kv, h, t), (size_t)d * sizeof(float),
                                           "undo log", err);
                } else if (c->spec.window.size > 0) {
                    for (int64_t t = u->end - 1; t >= len && !rc; t--) {
                        const kv_row_loc at = kv_cache_locate(c, slot, h, kv_cache_logical_row(c, t));
                        rc = span_copy(c, l, p, at.rhead, at.row, 1, undo_row(c, u, l, kv, h, t),
                                       0, NULL, err);
                    }
                }
            }
        }
        if (kivi && !rc) *q = qn;
    }
    return rc;
}

int kv_cache_state_truncate(kv_cache *c, const char *who, int slot, int len, kv_err *err)
{
    if (!c || !c->len || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d outside the cache", who, slot);
    if (len < 0 || len > c->len[slot])
        return kv_fail(err, KV_ERR_ARG, "%s: %d tokens but slot %d holds %d", who, len, slot,
                       c->len[slot]);
    if (c->spec.retain.select) /* chapter 09's state (the engine's) cannot take back what it saw */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: %s retention already observed and "
                       "evicted with the rejected tokens; its kept sets cannot be rolled back",
                       who, kv_select_method_name(c->spec.retain.select));
    if (len < c->len[slot] && kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) {
        /* a window's ring and KIVI's spills overwrote rows: copy them back (chapter 10) */
        kv_undo *u = c->undo ? &c->undo[slot] : NULL;
        int rc = undo_check(who, u, slot, len, c->len[slot], err);
        if (rc) return rc;
        if (c->len[slot] > u->end) u->end = c->len[slot];
        rc = undo_restore(c, u, slot, len, err);
        if (rc) return rc;
    }
    if (c->undo) c->undo[slot].armed = 0;
    c->len[slot] = len;
    return KV_OK;
}

int kv_cache_truncate(kv_cache *c, int slot, int len, kv_err *err)
{
    return kv_cache_state_truncate(c, "kv_cache_truncate", slot, len, err);
}

/* ---- the hooks of the writes (kv_cache_internal.h) ------------------------------------------ */

int kv_cache_undo_row(kv_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                      kv_row_loc at, int pos, int n, int64_t t, kv_err *err)
{
    kv_undo *u = c->spec.window.size > 0 ? armed_log(c, slot) : NULL;
    if (!u || t < undo_from(u, pos, n)) return KV_OK; /* no rollback reaches it */
    return span_copy(c, layer, p, at.rhead, at.row, 1,
                     undo_row(c, u, layer, kv_cache_role_plane(p->role), h, t), 1, &u->copied,
                     err);
}

int kv_cache_undo_window(kv_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                         int pos, int n, const float *x, const float *ring, kv_err *err)
{
    kv_undo *u = armed_log(c, slot);
    const int R = c->window, Hkv = c->n_kv_heads, d = c->head_dim;
    int rc = KV_OK;
    for (int t = u ? undo_from(u, pos, n) : pos + n; t < pos + n && !rc; t++) {
        rc = kv_cache_copy(c, undo_row(c, u, layer, kv_cache_role_plane(p->role), h, t),
                           t - R >= pos ? x + ((size_t)(t - R - pos) * Hkv + h) * d
                                        : ring + (size_t)(t % R) * d,
                           (size_t)d * sizeof(float), "undo log", err);
        u->copied += (double)d * sizeof(float);
    }
    return rc;
}

int kv_cache_undo_group(kv_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                        kv_row_loc at, int pos, int n, int g, kv_err *err)
{
    kv_undo *u = armed_log(c, slot);
    if (!u || g < kv_cache_kivi_qlen(undo_from(u, pos, n), c->window, 0)) return KV_OK;
    return span_copy(c, layer, p, at.rhead, at.row, KV_KIVI_GROUP,
                     undo_group(c, u, layer, kv_cache_role_plane(p->role), h, g), 1, &u->copied,
                     err);
}

void kv_cache_undo_written(kv_cache *c, int slot, int pos, int n)
{
    kv_undo *u = armed_log(c, slot);
    if (u && pos + n > u->end) u->end = pos + n;
}

void kv_cache_undo_disarm(kv_cache *c, int slot)
{
    if (c->undo) c->undo[slot].armed = 0;
}

void kv_cache_undo_free(kv_cache *c)
{
    for (int i = 0; c->undo && i < c->spec.n_slots; i++) {
        kv_cache_release(c, c->undo[i].rows);
        c->undo[i].rows = NULL;
    }
}
