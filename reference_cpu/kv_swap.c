/* Swap (kv_swap.h): a host tier of blocks, the link model, and a whole sequence swapped out of
 * a paged backend and back. The paging state (pool, tables, token record) is the backend's
 * kv_paged; the bytes move through the backend's read_blocks / write_blocks. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* nanosleep, for the optional throttle */
#endif
#include "kv_swap.h"

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

/* Account one batched copy of n blocks in direction dir (and sleep for it if asked). */
static void link_account(kv_swap *sw, int dir, int n, size_t block_bytes)
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

int kv_swap_init(kv_swap *sw, kv_backend *b, int n_host_blocks, const kv_link *link,
                 kv_err *err)
{
    memset(sw, 0, sizeof *sw);
    if (!b || !b->paged || !b->block_bytes || !b->read_blocks || !b->write_blocks)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: needs a paged backend with block I/O");
    const size_t block_bytes = b->block_bytes(b);
    if (block_bytes == 0)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: blocks of 0 bytes");
    sw->link = link ? *link : kv_link_default();
    if (!(sw->link.bandwidth > 0) || !(sw->link.latency >= 0))
        return kv_fail(err, KV_ERR_ARG, "kv_swap_init: link of %g B/s and %g s latency",
                       sw->link.bandwidth, sw->link.latency);
    int rc = kv_pool_init(&sw->pool, n_host_blocks, b->paged->pool.block_size, block_bytes, err);
    if (rc) return rc;
    const size_t bytes = (size_t)n_host_blocks * block_bytes;
    sw->owner = b;
    sw->mem = b->host_alloc ? b->host_alloc(b, bytes) : kv_calloc(bytes);
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
    if (sw->owner && sw->owner->host_free) sw->owner->host_free(sw->owner, sw->mem);
    else kv_free(sw->mem);
    memset(sw, 0, sizeof *sw);
}

void kv_swapped_drop(kv_swap *sw, kv_swapped *s)
{
    if (!s) return;
    for (int i = 0; s->resident && i < s->n_blocks; i++)
        kv_pool_unref(&sw->pool, s->host_blocks[i], NULL);
    kv_free(s->host_blocks);
    kv_free(s->tokens);
    memset(s, 0, sizeof *s);
}

/* What this first version can swap: per-token formats, no window, no prefix cache. */
static int check_swappable(const kv_swap *sw, kv_backend *b, int slot, const char *who,
                           kv_err *err)
{
    if (!sw || !sw->mem || !b || !b->paged || !b->block_bytes || !b->read_blocks ||
        !b->write_blocks)
        return kv_fail(err, KV_ERR_ARG, "%s: needs a host tier and a paged backend with "
                       "block I/O", who);
    if (slot < 0 || slot >= b->paged->n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: slot %d outside [0, %d)", who, slot,
                       b->paged->n_slots);
    const size_t bb = b->block_bytes(b);
    if (bb != sw->pool.block_bytes || b->paged->pool.block_size != sw->pool.block_size)
        return kv_fail(err, KV_ERR_ARG, "%s: device blocks of %d tokens, %zu bytes but host "
                       "blocks of %d tokens, %zu bytes", who, b->paged->pool.block_size, bb,
                       sw->pool.block_size, sw->pool.block_bytes);
    if (b->spec.window > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window sequence (its ring "
                       "position is per sequence state this version does not save)", who);
    if (b->paged->prefix_caching)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: with prefix caching on (a swapped-in "
                       "table would have to be re-registered)", who);
    for (int l = 0; l < b->config->n_layers; l++) {
        const int f = kv_cache_spec_layer_dtype(&b->spec, l);
        if (kvq_is_fp8(f) || kvq_is_kivi(f))
            return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: layer %d stores %s, whose per-sequence "
                           "scales or fp32 window this version does not save", who, l,
                           kv_dtype_name(f));
    }
    return KV_OK;
}

int kv_swap_out(kv_swap *sw, kv_backend *b, int slot, kv_swapped *out, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_swap_out: NULL argument");
    memset(out, 0, sizeof *out);
    int rc = check_swappable(sw, b, slot, "kv_swap_out", err);
    if (rc) return rc;
    kv_paged *pg = b->paged;
    const kv_block_table *t = &pg->tables[slot];
    const int n = t->n_blocks;
    if (n > kv_pool_available(&sw->pool))
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_out: slot %d holds %d blocks (%lld "
                       "tokens, %zu bytes a block) but the host tier has %d free of %d",
                       slot, n, (long long)t->n_tokens, sw->pool.block_bytes,
                       kv_pool_available(&sw->pool), sw->pool.n_blocks);
    out->host_blocks = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    out->tokens = kv_calloc((size_t)(t->n_tokens > 0 ? t->n_tokens : 1) * sizeof(int));
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs); /* [n] */
    if (!out->host_blocks || !out->tokens || !pairs) {
        kv_free(pairs);
        kv_swapped_drop(sw, out);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_out: out of memory");
    }
    out->resident = 1;
    for (int i = 0; i < n && !rc; i++) {
        rc = kv_pool_alloc(&sw->pool, &out->host_blocks[i], err); /* cannot fail: checked */
        if (!rc) out->n_blocks = i + 1;
        pairs[i] = (kv_block_copy){t->blocks[i], out->host_blocks[i]};
    }
    /* one pass over the block list: a single batched copy, a single link latency */
    if (!rc && n) rc = b->read_blocks(b, pairs, n, sw->mem, sw->pool.block_bytes, err);
    kv_free(pairs);
    if (rc) {
        kv_swapped_drop(sw, out);
        return rc;
    }
    link_account(sw, KV_LINK_OUT, n, sw->pool.block_bytes);
    out->n_tokens = t->n_tokens;
    if (t->n_tokens && pg->tokens[slot])
        memcpy(out->tokens, pg->tokens[slot], (size_t)t->n_tokens * sizeof(int));
    b->reset(b, slot);
    return KV_OK;
}

int kv_swap_in(kv_swap *sw, kv_backend *b, int slot, kv_swapped *s, kv_err *err)
{
    int rc = check_swappable(sw, b, slot, "kv_swap_in", err);
    if (rc) return rc;
    kv_paged *pg = b->paged;
    kv_block_table *t = &pg->tables[slot];
    if (!s || !s->resident)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_in: the sequence is not in the host tier");
    if (t->n_blocks || b->length(b, slot))
        return kv_fail(err, KV_ERR_ARG, "kv_swap_in: slot %d is in use", slot);
    if ((int64_t)s->n_tokens > b->spec.capacity)
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_in: %lld tokens exceed the capacity %d",
                       (long long)s->n_tokens, b->spec.capacity);
    const int n = s->n_blocks;
    if (n > kv_pool_available(&pg->pool))
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_in: the sequence needs %d blocks but "
                       "the device pool has %d free of %d (blocks of %d tokens)", n,
                       kv_pool_available(&pg->pool), pg->pool.n_blocks, pg->pool.block_size);
    /* the token record the prefix cache and fork read */
    if (pg->tok_cap[slot] < s->n_tokens) {
        int *tok = kv_calloc((size_t)s->n_tokens * sizeof(int));
        if (!tok) return kv_fail(err, KV_ERR_NOMEM, "kv_swap_in: out of memory");
        kv_free(pg->tokens[slot]);
        pg->tokens[slot] = tok;
        pg->tok_cap[slot] = s->n_tokens;
    }
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs); /* [n] */
    if (!pairs) return kv_fail(err, KV_ERR_NOMEM, "kv_swap_in: out of memory");
    const int B = pg->pool.block_size;
    for (int i = 0; i < n && !rc; i++) {
        int blk = -1;
        rc = kv_pool_alloc(&pg->pool, &blk, err);
        if (rc) break;
        const int64_t rows = s->n_tokens - (int64_t)i * B;
        rc = kv_block_table_push(t, blk, (int)(rows < B ? rows : B), err);
        if (rc) kv_pool_unref(&pg->pool, blk, NULL);
        pairs[i] = (kv_block_copy){s->host_blocks[i], blk};
    }
    if (!rc && n) rc = b->write_blocks(b, pairs, n, sw->mem, sw->pool.block_bytes, err);
    kv_free(pairs);
    if (!rc) rc = b->set_blocks(b, slot, t->blocks, t->n_blocks, err);
    if (!rc && s->n_tokens) rc = b->set_length(b, slot, (int)s->n_tokens, err);
    if (rc) { /* give the device blocks back; the sequence stays in the host tier */
        b->reset(b, slot);
        return rc;
    }
    link_account(sw, KV_LINK_IN, n, sw->pool.block_bytes);
    if (s->n_tokens) memcpy(pg->tokens[slot], s->tokens, (size_t)s->n_tokens * sizeof(int));
    if (pg->pool.n_used > pg->peak_used) pg->peak_used = pg->pool.n_used;
    kv_swapped_drop(sw, s);
    return KV_OK;
}
