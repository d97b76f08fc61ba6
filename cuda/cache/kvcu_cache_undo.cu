/*
 * Chapter 10's part of the device cache: rollback of a speculative step, kv_cache_undo.c's
 * twin. kvcu_cache_speculate() arms a slot's undo log (kv_cache.h's kv_undo, entries in device
 * memory); kvcu_cache_write() then copies, device to device, each ring row a window overwrites,
 * each KIVI window row as a one-token run would find it and each group a spill is about to
 * encode, and kvcu_cache_truncate() copies them back newest first, so the bytes equal the CPU's
 * after every round.
 */
#include <stdint.h>
#include <stdlib.h>

#include "kv_quant.h"
#include "kvcu_cache_internal.cuh"

/* The CPU's bookkeeping (kv_undo_plan(), kv_undo_check()) with the entries in device memory:
 * each write that overwrites a ring row, a KIVI window row or a spilled group first copies
 * it device to device into its entry, and kvcu_cache_truncate() copies the entries back,
 * newest first. Position p's entry is p mod M, as on the CPU. */

static kv_undo *armed_log(const kvcu_cache *c, int slot)
{
    return c->undo && c->undo[slot].armed ? &c->undo[slot] : NULL;
}

/* kv_cache.c's undo_from(): the first position of a write worth logging (a rollback keeps
 * at least pos + n - max_tokens and the armed length), and Q(len), what len tokens quantize. */
static int undo_from(const kv_undo *u, int pos, int n)
{
    const int f = pos + n - u->max_tokens;
    return f > u->len0 ? (f > pos ? f : pos) : (u->len0 > pos ? u->len0 : pos);
}
static int kivi_q(int len, int R)
{
    return len > R ? (len - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
}

static uint8_t *undo_row(const kvcu_cache *c, const kv_undo *u, int layer, int kv, int h,
                         int64_t p)
{
    const size_t head = ((size_t)layer * c->n_planes + kv) * c->n_kv_heads + h;
    return u->rows + (head * u->max_tokens + (size_t)(p % u->max_tokens)) * u->row_stride;
}

static uint8_t *undo_group(const kvcu_cache *c, const kv_undo *u, int layer, int kv, int h,
                           int64_t g)
{
    const size_t head = ((size_t)layer * c->n_planes + kv) * c->n_kv_heads + h;
    return u->groups + (head * u->n_groups + (size_t)(g / KV_KIVI_GROUP % u->n_groups)) *
                           u->group_stride;
}

/* Rows prow .. prow+n-1 of one head: codes then metadata into buf (save 1) or back (0). */
static cudaError_t span_copy(const kvcu_cache *c, int layer, const kv_cache_plane *p,
                             int64_t rhead, int64_t prow, int n, uint8_t *buf, int save)
{
    size_t off[4];
    kv_cache_span(p, c->fmt[layer], p->role, rhead, c->rows, prow, n, c->head_dim, off);
    uint8_t *codes = p->codes + off[0], *meta = off[3] ? (uint8_t *)p->meta + off[2] : NULL;
    cudaError_t e = save ? cudaMemcpy(buf, codes, off[1], cudaMemcpyDeviceToDevice)
                         : cudaMemcpy(codes, buf, off[1], cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess && meta)
        e = save ? cudaMemcpy(buf + off[1], meta, off[3], cudaMemcpyDeviceToDevice)
                 : cudaMemcpy(meta, buf + off[1], off[3], cudaMemcpyDeviceToDevice);
    return e;
}

static int64_t phys_row(const kvcu_cache *c, int slot, int64_t r)
{
    if (!c->tables) return r;
    const int B = c->spec.layout.block_size;
    return (int64_t)c->tables[(size_t)slot * c->max_blocks + r / B] * B + r % B;
}

/** GPU twin of kv_cache_speculate(): the same arguments, checks and log; entries on the
 * device. */
int kvcu_cache_speculate(kvcu_cache *c, int slot, int max_tokens, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_speculate: slot %d outside the cache", slot);
    if (max_tokens < 0 || max_tokens > KVCU_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_speculate: %d tokens outside [0, %d]",
                       max_tokens, KVCU_CACHE_MAX_CAPACITY);
    if (!kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) return KV_OK;
    if (!c->undo) {
        c->undo = (kv_undo *)calloc((size_t)c->spec.n_slots, sizeof(kv_undo));
        if (!c->undo) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_speculate: undo logs");
    }
    kv_undo *u = &c->undo[slot];
    u->armed = 0;
    if (max_tokens == 0) return KV_OK;
    if (!u->qlen0) u->qlen0 = (int *)calloc((size_t)c->n_layers, sizeof(int));
    if (!u->qlen0) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_speculate: host memory");
    const size_t bytes = kv_undo_plan(u, c->planes, c->n_planes, c->fmt, c->n_layers,
                                      c->n_kv_heads, c->head_dim, c->spec.window.size, max_tokens);
    if (bytes > u->alloc_bytes) {
        cudaFree(u->rows);
        u->rows = NULL;
        u->alloc_bytes = 0;
        KVCU_ALLOC_TRY(&u->rows, bytes, err);
        u->alloc_bytes = bytes;
    }
    u->groups = u->rows +
                (size_t)c->n_layers * c->n_planes * c->n_kv_heads * max_tokens * u->row_stride;
    u->len0 = u->end = c->len[slot];
    for (int l = 0; l < c->n_layers; l++) u->qlen0[l] = c->qlen[(size_t)l * c->spec.n_slots + slot];
    u->armed = 1;
    return KV_OK;
}

/* KIVI's window rows are saved as a one-token run would find them (the step's own row t-R
 * when it is in the step, else the window). */
int kvcu_cache_undo_rows(kvcu_cache *c, int layer, const kv_seq *s, int t0, const float *k,
                          const float *v, kv_err *err)
{
    kv_undo *u = armed_log(c, s->slot);
    if (!u) return KV_OK;
    const int fmt = c->fmt[layer], Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    const int kivi = kvq_is_kivi(fmt);
    if (!kivi && c->spec.window.size <= 0) return KV_OK;
    for (int t = undo_from(u, s->pos, s->n_tokens); t < s->pos + s->n_tokens; t++) {
        const int64_t prow = phys_row(c, s->slot, kv_window_row(c->spec.window.size, c->spec.window.n_sinks, t));
        const float *x[KV_CACHE_KV_PLANES] = {k, v}; /* each plane's rows [T][H_kv][d] */
        for (int kv = 0; kv < c->n_planes; kv++) {
            const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, kv, layer);
            for (int h = 0; h < Hkv; h++) {
                const int64_t head = (int64_t)s->slot * Hkv + h;
                cudaError_t e;
                if (kivi) {
                    const float *src = t - R >= s->pos
                        ? x[kv] + ((size_t)(t0 + t - R - s->pos) * Hkv + h) * d
                        : p->ring + (head * R + t % R) * d;
                    e = cudaMemcpy(undo_row(c, u, layer, kv, h, t), src, (size_t)d * sizeof(float),
                                   cudaMemcpyDeviceToDevice);
                    u->copied += (double)d * sizeof(float);
                } else {
                    size_t off[4];
                    kv_cache_span(p, fmt, p->role, 0, 0, 0, 1, d, off);
                    e = span_copy(c, layer, p, c->tables ? h : head, prow, 1,
                                  undo_row(c, u, layer, kv, h, t), 1);
                    u->copied += (double)(off[1] + off[3]);
                }
                if (kvcu_clear_error(e) != cudaSuccess)
                    return kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write: undo log: %s",
                                   cudaGetErrorString(e));
            }
        }
    }
    if (s->pos + s->n_tokens > u->end) u->end = s->pos + s->n_tokens;
    return KV_OK;
}

/* Copy back, newest first, what the writes of positions len .. end-1 overwrote, then the
 * quantized counts (kv_cache.c's undo_restore()). */
static cudaError_t undo_restore(kvcu_cache *c, kv_undo *u, int slot, int len)
{
    const int Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < c->n_layers && e == cudaSuccess; l++) {
        int *q = &c->qlen[(size_t)l * c->spec.n_slots + slot];
        const int kivi = kvq_is_kivi(c->fmt[l]);
        int qn = kivi && len > R ? (len - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
        if (kivi && qn < u->qlen0[l]) qn = u->qlen0[l];
        for (int kv = 0; kv < c->n_planes; kv++) {
            const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, kv, l);
            for (int h = 0; h < Hkv && e == cudaSuccess; h++) {
                const int64_t head = (int64_t)slot * Hkv + h, rhead = c->tables ? h : head;
                if (kivi) {
                    for (int g = qn; g < *q && e == cudaSuccess; g += KV_KIVI_GROUP)
                        e = span_copy(c, l, p, rhead, phys_row(c, slot, g), KV_KIVI_GROUP,
                                      undo_group(c, u, l, kv, h, g), 0);
                    for (int64_t t = u->end - 1; t >= len && e == cudaSuccess; t--)
                        e = cudaMemcpy(p->ring + (head * R + t % R) * d, undo_row(c, u, l, kv, h, t),
                                       (size_t)d * sizeof(float), cudaMemcpyDeviceToDevice);
                } else if (c->spec.window.size > 0) {
                    for (int64_t t = u->end - 1; t >= len && e == cudaSuccess; t--) {
                        const int64_t lr = kv_window_row(c->spec.window.size, c->spec.window.n_sinks, t);
                        e = span_copy(c, l, p, rhead, phys_row(c, slot, lr), 1,
                                      undo_row(c, u, l, kv, h, t), 0);
                    }
                }
            }
        }
        if (kivi) *q = qn;
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(c->d_qlen, c->qlen, (size_t)c->n_layers * c->spec.n_slots * sizeof(int),
                       cudaMemcpyHostToDevice);
    return e;
}

/** GPU twin of kv_cache_truncate() (chapter 10): only the host's length changes; the rows
 * past it stay on the device, invisible, until the next step overwrites them. A window's
 * ring and KIVI's spills are copied back from the undo log, with the same refusals. */
int kvcu_cache_truncate(kvcu_cache *c, int slot, int len, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_truncate: slot %d outside the cache", slot);
    if (len < 0 || len > c->len[slot])
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_truncate: %d tokens but slot %d holds %d",
                       len, slot, c->len[slot]);
    if (c->spec.retain.select) /* chapter 09: kv_cache_truncate()'s refusal, in its words */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_cache_truncate: %s retention already "
                       "observed and evicted with the rejected tokens; its kept sets cannot "
                       "be rolled back", kv_select_method_name(c->spec.retain.select));
    if (len < c->len[slot] && kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) {
        kv_undo *u = c->undo ? &c->undo[slot] : NULL;
        int rc = kv_undo_check("kvcu_cache_truncate", u, slot, len, c->len[slot], err);
        if (rc) return rc;
        if (c->len[slot] > u->end) u->end = c->len[slot];
        KV_CUDA_TRY(undo_restore(c, u, slot, len), err);
    }
    if (c->undo) c->undo[slot].armed = 0;
    c->len[slot] = len;
    return KV_OK;
}

int kvcu_cache_undo_group(kvcu_cache *c, int layer, const kv_cache_plane *p, int slot, int h,
                          int64_t rhead, int64_t prow, int pos, int n, int g, kv_err *err)
{
    kv_undo *u = armed_log(c, slot);
    if (!u || g < kivi_q(undo_from(u, pos, n), c->window)) return KV_OK; /* no rollback reaches it */
    KV_CUDA_TRY(span_copy(c, layer, p, rhead, prow, KV_KIVI_GROUP,
                          undo_group(c, u, layer, kv_cache_role_plane(p->role), h, g), 1), err);
    size_t off[4];
    kv_cache_span(p, c->fmt[layer], p->role, 0, 0, 0, KV_KIVI_GROUP, c->head_dim, off);
    u->copied += (double)(off[1] + off[3]);
    return KV_OK;
}

void kvcu_cache_undo_disarm(kvcu_cache *c, int slot)
{
    if (c->undo) c->undo[slot].armed = 0;
}

void kvcu_cache_undo_free(kvcu_cache *c)
{
    for (int i = 0; c->undo && i < c->spec.n_slots; i++) {
        cudaFree(c->undo[i].rows);
        free(c->undo[i].qlen0);
    }
    free(c->undo);
    c->undo = NULL;
}
