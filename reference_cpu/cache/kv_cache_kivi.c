/* Chapter 04's KIVI formats (int4, int2) in the cache: the one storage format whose rows are
 * not self-contained.
 *
 * KIVI quantizes keys per channel over groups of 32 tokens, so a row cannot be encoded alone
 * when it arrives. The newest tokens wait in an fp32 window of R rows per (slot, KV head), the
 * plane's ring, at row t % R; a chunk that makes the slot hold more than R unquantized tokens
 * spills the oldest whole 32-token groups: their rows are gathered (from the window for older
 * tokens, from the chunk for new ones), encoded as groups into the codes and metadata at the
 * rows kv_cache_locate() gives, and the quantized count Q(slot) moves on. Attention reads rows
 * t < Q from the planes and rows t >= Q from the window (kv_cache_elem()). All rows of a
 * chunk see the cache as it is after the whole chunk is written (the spill happens before the
 * chunk's attention), so a chunked prefill reads deterministically. A paged KIVI cache needs
 * 32 | B, so a group never straddles two blocks. */
#include "kv_cache_internal.h"
#include "kv_quant.h"

#include <string.h>

/* KIVI: what len tokens quantize, Q(len) = the smallest multiple of 32 leaving at most R in
 * the window (every chunking reaches the same count), never below the count when armed. */
int kv_cache_kivi_qlen(int len, int R, int q_armed)
{
    const int q = len > R ? (len - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
    return q > q_armed ? q : q_armed;
}

/* One plane of a chunk: x [n][H_kv][d] of a KIVI layer; rows q0 .. q1-1 are spilled. */
static int kivi_write_plane(kv_cache *c, int layer, kv_cache_plane *p, int slot, int pos, int n,
                            const float *x, int q0, int q1, kv_err *err)
{
    const int fmt = c->fmt[layer], d = c->head_dim, Hkv = c->n_kv_heads, R = c->window;
    const int role = p->role;
    for (int h = 0; h < Hkv; h++) {
        float *ring = p->ring + ((int64_t)slot * Hkv + h) * R * d;        /* [R][d] */
        /* chapter 10: each new token's window row, before anything overwrites it */
        int rc = kv_cache_undo_window(c, layer, p, slot, h, pos, n, x, ring, err);
        if (rc) return rc;
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
            for (int g = q0; g < q1 && !rc; g += KV_KIVI_GROUP) {
                const kv_row_loc at = kv_cache_locate(c, slot, h, g);
                rc = kv_cache_undo_group(c, layer, p, slot, h, at, pos, n, g, err); /* chapter 10 */
                if (!rc) rc = kv_quant_encode(fmt, role, stage + (size_t)(g - q0) * d, KV_KIVI_GROUP, d,
                                     0.0f, p->codes + (at.rhead * c->rows + at.row) * p->row_bytes,
                                     (uint8_t *)p->meta + (at.rhead * p->meta_entries +
                                                           kvq_meta_index(fmt, role, at.row, 0, d)) * 4,
                                     err);
            }
            kv_free(stage);
            if (rc) return rc;
        }
        /* the chunk's last R tokens enter the window, spilled or not: it then holds each row's
         * latest token whatever the chunking, so a rollback (chapter 10) that un-spills a group
         * finds its fp32 rows there */
        for (int t = pos + n - R > pos ? pos + n - R : pos; t < pos + n; t++)
            memcpy(ring + (size_t)(t % R) * d, x + ((size_t)(t - pos) * Hkv + h) * d,
                   (size_t)d * sizeof(float));
    }
    return KV_OK;
}

int kv_cache_kivi_write(kv_cache *c, int layer, int slot, int pos, int n, const float *const *x,
                        kv_err *err)
{
    /* Q1: the smallest multiple of 32, >= Q0, that leaves at most R tokens unquantized */
    int *qlen = &c->qlen[(size_t)layer * c->spec.n_slots + slot];
    const int q0 = *qlen, over = pos + n - c->window;
    const int q1 = over > q0 ? (over + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : q0;
    int rc = KV_OK;
    for (int i = 0; i < c->n_planes && !rc; i++)
        rc = kivi_write_plane(c, layer, kv_cache_plane_of(c->planes, c->n_layers, i, layer), slot,
                              pos, n, x[i], q0, q1, err);
    if (!rc) *qlen = q1;
    return rc;
}
