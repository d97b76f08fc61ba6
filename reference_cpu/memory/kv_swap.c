/* Swap (kv_swap.h), first half: the link model, the host tier, and a sequence leaving its slot
 * (kv_swap_out copies it all to the host, kv_swap_detach keeps it all on the device). The
 * second half, kv_swap_partial.c, moves blocks of a paused sequence between the tiers and puts
 * it back. The paging state (pool, tables, token record) is the backend's kv_paged; the bytes
 * move through the backend's block I/O hooks. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* nanosleep, for the optional throttle */
#endif
#include "kv_swap_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the link ------------------------------------------------------------------------------ */

kv_link kv_link_default(void)
{
    kv_link l = {KV_LINK_DEFAULT_BANDWIDTH, KV_LINK_DEFAULT_LATENCY, 0};
    return l;
}

double kv_link_seconds(const kv_link *l, int64_t bytes)
{
    if (bytes <= 0) return 0.0;
    return l->latency + (double)bytes / l->bandwidth;
}

void kv_swap_link_account(kv_swap *sw, int dir, int n, size_t block_bytes)
{
    if (n <= 0) return;
    const int64_t bytes = (int64_t)n * (int64_t)block_bytes;
    const double s = kv_link_seconds(&sw->link, bytes);
    sw->stats.copies[dir]++;
    sw->stats.blocks[dir] += n;
    sw->stats.bytes[dir] += bytes;
    sw->stats.seconds[dir] += s;
    if (sw->link.throttle) {
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* ---- the host tier -------------------------------------------------------------------------- */

int kv_swap_init(kv_swap *sw, kv_cache_mem *m, int n_host_blocks, const kv_link *link,
                 kv_err *err)
{
    memset(sw, 0, sizeof *sw);
    if (!m) return kv_fail(err, KV_ERR_ARG, "kv_swap_init: needs a paged backend with block I/O");
    const size_t block_bytes = m->block_bytes(m);
    if (block_bytes == 0)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: blocks of 0 bytes");
    sw->link = link ? *link : kv_link_default();
    if (!(sw->link.bandwidth > 0) || !(sw->link.latency >= 0))
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: link of %g B/s and %g s latency",
                       sw->link.bandwidth, sw->link.latency);
    int rc = kv_pool_init(&sw->pool, n_host_blocks, m->paged->pool.block_size, block_bytes, err);
    if (rc) return rc;
    const size_t bytes = (size_t)n_host_blocks * block_bytes;
    sw->owner = m;
    sw->mem = m->host_alloc(m, bytes);
    if (!sw->mem) {
        kv_pool_free(&sw->pool);
        memset(sw, 0, sizeof *sw);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_init: host tier of %d blocks of %zu bytes",
                       n_host_blocks, block_bytes);
    }
    return KV_OK;
}

void kv_swap_free(kv_swap *sw)
{
    if (!sw) return;
    kv_pool_free(&sw->pool);
    if (sw->owner) sw->owner->host_free(sw->owner, sw->mem);
    memset(sw, 0, sizeof *sw);
}

/* Room for a paused sequence of n blocks and n_tokens tokens, every block nowhere yet (-1). */
static int swapped_alloc(kv_swapped *s, int n, int64_t n_tokens)
{
    memset(s, 0, sizeof *s);
    const size_t nb = (size_t)(n > 0 ? n : 1);
    s->host_blocks = kv_calloc(nb * sizeof(int));
    s->dev_blocks = kv_calloc(nb * sizeof(int));
    s->pre_blocks = kv_calloc(nb * sizeof(int));
    s->tokens = kv_calloc((size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof(int));
    if (!s->host_blocks || !s->dev_blocks || !s->pre_blocks || !s->tokens) return KV_ERR_NOMEM;
    for (int i = 0; i < n; i++) s->host_blocks[i] = s->dev_blocks[i] = s->pre_blocks[i] = -1;
    s->n_blocks = n;
    s->n_tokens = n_tokens;
    s->resident = 1;
    return KV_OK;
}

void kv_swapped_drop(kv_swap *sw, kv_cache_mem *m, kv_swapped *s)
{
    if (!s) return;
    /* a prefetch still writing into pre_blocks must end before they can be handed out again */
    if (s->ticket && m) m->io_wait(m, s->ticket, NULL);
    kv_pool *dev = m ? &m->paged->pool : NULL;
    for (int i = 0; s->resident && i < s->n_blocks; i++) {
        if (s->host_blocks && s->host_blocks[i] >= 0 && sw)
            kv_pool_unref(&sw->pool, s->host_blocks[i], NULL);
        if (s->dev_blocks && s->dev_blocks[i] >= 0 && dev)
            kv_pool_unref(dev, s->dev_blocks[i], NULL);
        if (s->pre_blocks && s->pre_blocks[i] >= 0 && dev)
            kv_pool_unref(dev, s->pre_blocks[i], NULL);
    }
    kv_free(s->host_blocks);
    kv_free(s->dev_blocks);
    kv_free(s->pre_blocks);
    kv_free(s->tokens);
    memset(s, 0, sizeof *s);
}

int kv_swap_check(const kv_swap *sw, kv_cache_mem *m, int slot, const char *who, kv_err *err)
{
    if (!sw || !sw->mem || !m)
        return kv_fail(err, KV_ERR_ARG, "%s: needs a host tier and a paged backend with "
                       "block I/O", who);
    if (slot < 0 || slot >= m->paged->n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d outside [0, %d)", who, slot,
                       m->paged->n_slots);
    const size_t bb = m->block_bytes(m);
    if (bb != sw->pool.block_bytes || m->paged->pool.block_size != sw->pool.block_size)
        return kv_fail(err, KV_ERR_ARG, "%s: device blocks of %d tokens, %zu bytes but host "
                       "blocks of %d tokens, %zu bytes", who, m->paged->pool.block_size, bb,
                       sw->pool.block_size, sw->pool.block_bytes);
    if (m->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window sequence (its ring "
                       "position is per sequence state this version does not save)", who);
    if (m->paged->prefix_caching)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: with prefix caching on (a swapped-in "
                       "table would have to be re-registered)", who);
    for (int l = 0; l < m->config->n_layers; l++) {
        const int f = kv_cache_spec_layer_dtype(&m->spec, l);
        if (kvq_is_fp8(f) || kvq_is_kivi(f))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: layer %d stores %s, whose per-sequence "
                           "scales or fp32 window this version does not save", who, l,
                           kv_dtype_name(f));
    }
    return KV_OK;
}

/* The slot's length and token record, copied into a paused sequence. */
static void record_tokens(const kv_paged *pg, int slot, kv_swapped *s)
{
    if (s->n_tokens && pg->tokens[slot])
        memcpy(s->tokens, pg->tokens[slot], (size_t)s->n_tokens * sizeof(int));
}

int kv_swap_out(kv_swap *sw, kv_cache_mem *m, int slot, kv_swapped *out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_swap_out: NULL argument");
    memset(out, 0, sizeof *out);
    int rc = kv_swap_check(sw, m, slot, "kv_swap_out", err);
    if (rc) return rc;
    kv_paged *pg = m->paged;
    const kv_block_table *t = &pg->tables[slot];
    const int n = t->n_blocks;
    if (n > kv_pool_available(&sw->pool))
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_out: slot %d holds %d blocks (%lld "
                       "tokens, %zu bytes a block) but the host tier has %d free of %d",
                       slot, n, (long long)t->n_tokens, sw->pool.block_bytes,
                       kv_pool_available(&sw->pool), sw->pool.n_blocks);
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs); /* [n] */
    if (!pairs || swapped_alloc(out, n, t->n_tokens)) {
        kv_free(pairs);
        kv_swapped_drop(sw, NULL, out);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_out: out of memory");
    }
    for (int i = 0; i < n && !rc; i++) {
        rc = kv_pool_alloc(&sw->pool, &out->host_blocks[i], err); /* cannot fail: checked */
        pairs[i] = (kv_block_copy){t->blocks[i], out->host_blocks[i]};
    }
    /* one pass over the block list: a single batched copy, a single link latency */
    if (!rc && n) rc = m->read_blocks(m, pairs, n, sw->mem, sw->pool.block_bytes, err);
    kv_free(pairs);
    if (rc) {
        kv_swapped_drop(sw, NULL, out);
        return rc;
    }
    kv_swap_link_account(sw, KV_LINK_OUT, n, sw->pool.block_bytes);
    out->n_on_host = n;
    record_tokens(pg, slot, out);
    kv_paged_release(m, slot, NULL);
    return KV_OK;
}

int kv_swap_detach(kv_swap *sw, kv_cache_mem *m, int slot, kv_swapped *out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_swap_detach: NULL argument");
    memset(out, 0, sizeof *out);
    int rc = kv_swap_check(sw, m, slot, "kv_swap_detach", err);
    if (rc) return rc;
    kv_paged *pg = m->paged;
    const kv_block_table *t = &pg->tables[slot];
    if (swapped_alloc(out, t->n_blocks, t->n_tokens)) {
        kv_swapped_drop(sw, NULL, out);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_detach: out of memory");
    }
    /* one more reference on each block: when reset() drops the table's, the blocks stay
     * USED, so the pool never hands them out and their bytes stay where they are */
    for (int i = 0; i < t->n_blocks && !rc; i++) {
        rc = kv_pool_ref(&pg->pool, t->blocks[i], err);
        if (!rc) out->dev_blocks[i] = t->blocks[i];
    }
    if (rc) {
        kv_swapped_drop(sw, m, out);
        return rc;
    }
    record_tokens(pg, slot, out);
    kv_paged_release(m, slot, NULL);
    return KV_OK;
}
