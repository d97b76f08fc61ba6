/*
 * Chapter 10's part of the device cache: rollback of a speculative step. The undo log is
 * kv_cache_undo.c's, whole: its checks, its bookkeeping on the host, its entries in the cache's
 * memory, here device memory (the cache's kv_cache_device allocates them and copies device to
 * device). kvcu_cache_speculate() arms a slot's log; kvcu_cache_write() then saves, before a
 * step's rows are encoded, each ring row a window overwrites and each KIVI window row as a
 * one-token run would find it (below), and the KIVI spill each group it is about to encode
 * (kvcu_cache_kivi.cu); kvcu_cache_truncate() copies them back newest first, so the bytes
 * equal the CPU's after every round.
 */
#include <stdint.h>
#include <stdlib.h>

#include "kv_quant.h"
#include "kvcu_cache_internal.cuh"

/** GPU twin of kv_cache_speculate(): the same function, the entries on the device. */
int kvcu_cache_speculate(kvcu_cache *c, int slot, int max_tokens, kv_err *err)
{
    return kv_cache_state_speculate(c, "kvcu_cache_speculate", slot, max_tokens, err);
}

/** GPU twin of kv_cache_truncate() (chapter 10): only the host's length changes; the rows
 * past it stay on the device, invisible, until the next step overwrites them. A window's
 * ring and KIVI's spills are copied back from the undo log, and the KIVI counts' device
 * mirror follows. */
int kvcu_cache_truncate(kvcu_cache *c, int slot, int len, kv_err *err)
{
    const int before = c && slot >= 0 && slot < c->spec.n_slots ? c->len[slot] : 0;
    int rc = kv_cache_state_truncate(c, "kvcu_cache_truncate", slot, len, err);
    if (!rc && len < before && kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers))
        rc = kvcu_cache_sync_qlen(c, err);
    return rc;
}

/* Before layer's write of sequence s (its rows at t0 of the step's k, v): the ring rows a
 * window overwrites, or KIVI's window rows, into the slot's armed log (kv_cache_undo.c's
 * hooks, which pass over a slot whose log is not armed). */
int kvcu_cache_undo_rows(kvcu_cache *c, int layer, const kv_seq *s, int t0, const float *k,
                         const float *v, kv_err *err)
{
    const int kivi = kvq_is_kivi(c->fmt[layer]), Hkv = c->n_kv_heads, d = c->head_dim;
    if (!kivi && c->spec.window.size <= 0) return KV_OK;
    const float *x[KV_CACHE_KV_PLANES] = {k, v}; /* each plane's rows [T][H_kv][d] */
    int rc = KV_OK;
    for (int i = 0; i < c->n_planes && !rc; i++) {
        const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, layer);
        for (int h = 0; h < Hkv && !rc; h++) {
            if (kivi) {
                const float *ring = p->ring + ((int64_t)s->slot * Hkv + h) * c->window * d;
                rc = kv_cache_undo_window(c, layer, p, s->slot, h, s->pos, s->n_tokens,
                                          x[i] + (size_t)t0 * Hkv * d, ring, err);
            } else {
                for (int t = s->pos; t < s->pos + s->n_tokens && !rc; t++) {
                    const kv_row_loc at =
                        kv_cache_locate(c, s->slot, h, kv_cache_logical_row(c, t));
                    rc = kv_cache_undo_row(c, layer, p, s->slot, h, at, s->pos, s->n_tokens, t,
                                           err);
                }
            }
        }
    }
    if (!rc) kv_cache_undo_written(c, s->slot, s->pos, s->n_tokens);
    return rc;
}
