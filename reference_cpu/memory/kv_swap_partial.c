/* Swap (kv_swap.h), second half: a paused sequence's blocks between the tiers. Eviction moves
 * the device blocks it alone holds to the host, last logical block first; a prefetch starts
 * copying them back (on the backend's I/O thread or copy stream); kv_swap_in() finishes and
 * rebuilds the slot. Read kv_swap.c first. */
#include "kv_swap_internal.h"

#include <string.h>

int kv_swap_evict(kv_swap *sw, kv_cache_mem *m, kv_swapped *s, int max_blocks, int *moved,
                  kv_err *err)
{
    if (moved) *moved = 0;
    int rc = kv_swap_check(sw, m, 0, "kv_swap_evict", err);
    if (rc) return rc;
    if (!s || !s->resident)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_evict: not a paused sequence");
    /* a sequence being prefetched is on its way back: evicting it would undo that work */
    if (s->ticket) return KV_OK;
    for (int i = 0; i < s->n_blocks; i++)
        if (s->pre_blocks[i] >= 0) return KV_OK;
    kv_pool *dev = &m->paged->pool;
    int want = 0; /* candidates: held by this sequence alone (a shared block frees nothing) */
    for (int i = s->n_blocks - 1; i >= 0 && want < max_blocks; i--)
        if (s->dev_blocks[i] >= 0 && dev->refcount[s->dev_blocks[i]] == 1) want++;
    if (want == 0) return KV_OK;
    const int free_host = kv_pool_available(&sw->pool);
    if (free_host == 0)
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_evict: the host tier is full (%d blocks)",
                       sw->pool.n_blocks);
    if (want > free_host) want = free_host;
    kv_block_copy *pairs = kv_calloc((size_t)want * sizeof *pairs); /* [want] */
    int *logical = kv_calloc((size_t)want * sizeof(int));         /* [want] */
    if (!pairs || !logical) {
        kv_free(pairs);
        kv_free(logical);
        return kv_fail(err, KV_ERR_NOMEM, "kv_swap_evict: out of memory");
    }
    /* last logical block first: the end of a paused sequence is what its owner reads last
     * and what a prefix shares least */
    int k = 0;
    for (int i = s->n_blocks - 1; i >= 0 && k < want && !rc; i--) {
        if (s->dev_blocks[i] < 0 || dev->refcount[s->dev_blocks[i]] != 1) continue;
        int h = -1;
        rc = kv_pool_alloc(&sw->pool, &h, err); /* cannot fail: counted */
        if (rc) break;
        logical[k] = i;
        pairs[k++] = (kv_block_copy){s->dev_blocks[i], h};
    }
    if (!rc) rc = m->read_blocks(m, pairs, k, sw->mem, sw->pool.block_bytes, err);
    if (rc) { /* nothing moved: give the host blocks back */
        for (int j = 0; j < k; j++) kv_pool_unref(&sw->pool, pairs[j].dst, NULL);
    } else {
        kv_swap_link_account(sw, KV_LINK_OUT, k, sw->pool.block_bytes);
        for (int j = 0; j < k; j++) {
            kv_pool_unref(dev, pairs[j].src, NULL); /* the last reference: back to the pool */
            s->dev_blocks[logical[j]] = -1;
            s->host_blocks[logical[j]] = pairs[j].dst;
        }
        s->n_on_host += k;
        if (moved) *moved = k;
    }
    kv_free(pairs);
    kv_free(logical);
    return rc;
}

/* Take device blocks for the host blocks of s that have none yet, into got[i] (-1 elsewhere),
 * and list the (host, device) pairs to copy. All or nothing: KV_ERR_CAPACITY leaves the pool as
 * it was. *n = pairs listed. */
static int take_device_blocks(kv_cache_mem *m, const kv_swapped *s, int *got,
                              kv_block_copy *pairs, int *n, const char *who, kv_err *err)
{
    kv_pool *dev = &m->paged->pool;
    int need = 0;
    for (int i = 0; i < s->n_blocks; i++)
        if (s->host_blocks[i] >= 0 && s->pre_blocks[i] < 0) need++;
    *n = 0;
    if (need > kv_pool_available(dev))
        return kv_fail(err, KV_ERR_CAPACITY, "%s: the sequence needs %d blocks back but the "
                       "device pool has %d free of %d (blocks of %d tokens)", who, need,
                       kv_pool_available(dev), dev->n_blocks, dev->block_size);
    for (int i = 0; i < s->n_blocks; i++) {
        got[i] = -1;
        if (s->host_blocks[i] < 0 || s->pre_blocks[i] >= 0) continue;
        int rc = kv_pool_alloc(dev, &got[i], err); /* cannot fail: counted */
        if (rc) {
            for (int j = 0; j < i; j++)
                if (got[j] >= 0) kv_pool_unref(dev, got[j], NULL);
            return rc;
        }
        pairs[(*n)++] = (kv_block_copy){s->host_blocks[i], got[i]};
    }
    return KV_OK;
}

int kv_swap_prefetch(kv_swap *sw, kv_cache_mem *m, kv_swapped *s, kv_err *err)
{
    int rc = kv_swap_check(sw, m, 0, "kv_swap_prefetch", err);
    if (rc) return rc;
    if (!s || !s->resident)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_prefetch: not a paused sequence");
    const int n = s->n_blocks;
    int *got = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof(int));                  /* [n] */
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs);     /* [n] */
    int k = 0;
    if (!got || !pairs) rc = kv_fail(err, KV_ERR_NOMEM, "kv_swap_prefetch: out of memory");
    if (!rc) rc = take_device_blocks(m, s, got, pairs, &k, "kv_swap_prefetch", err);
    if (!rc && k) {
        /* the new blocks are in no table until kv_swap_in(), so nothing reads them while the
         * copy runs: it may overlap the steps of the other sequences */
        int64_t ticket = 0;
        rc = m->write_blocks_async(m, pairs, k, sw->mem, sw->pool.block_bytes, &ticket, err);
        if (rc) {
            for (int j = 0; j < k; j++) kv_pool_unref(&m->paged->pool, pairs[j].dst, NULL);
        } else {
            kv_swap_link_account(sw, KV_LINK_IN, k, sw->pool.block_bytes);
            for (int i = 0; i < n; i++)
                if (got[i] >= 0) s->pre_blocks[i] = got[i];
            s->ticket = ticket;
        }
    }
    kv_free(got);
    kv_free(pairs);
    return rc;
}

int kv_swap_in(kv_swap *sw, kv_cache_mem *m, int slot, kv_swapped *s, kv_err *err)
{
    int rc = kv_swap_check(sw, m, slot, "kv_swap_in", err);
    if (rc) return rc;
    kv_paged *pg = m->paged;
    kv_block_table *t = &pg->tables[slot];
    if (!s || !s->resident)
        return kv_fail(err, KV_ERR_ARG, "kv_swap_in: not a paused sequence");
    if (t->n_blocks || m->length(m, slot))
        return kv_fail(err, KV_ERR_ARG, "kv_swap_in: slot %d is in use", slot);
    if ((int64_t)s->n_tokens > m->spec.capacity)
        return kv_fail(err, KV_ERR_CAPACITY, "kv_swap_in: %lld tokens exceed the capacity %d",
                       (long long)s->n_tokens, m->spec.capacity);
    if (s->ticket) { /* the prefetch's copy must land before the table points at its blocks */
        rc = m->io_wait(m, s->ticket, err);
        s->ticket = 0;
        if (rc) { /* the prefetched bytes are not to be trusted: the host still has them */
            for (int i = 0; i < s->n_blocks; i++)
                if (s->pre_blocks[i] >= 0) {
                    kv_pool_unref(&pg->pool, s->pre_blocks[i], NULL);
                    s->pre_blocks[i] = -1;
                }
            return rc;
        }
    }
    /* the token record the prefix cache and fork read */
    if (pg->tok_cap[slot] < s->n_tokens) {
        int *tok = kv_calloc((size_t)s->n_tokens * sizeof(int));
        if (!tok) return kv_fail(err, KV_ERR_NOMEM, "kv_swap_in: out of memory");
        kv_free(pg->tokens[slot]);
        pg->tokens[slot] = tok;
        pg->tok_cap[slot] = s->n_tokens;
    }
    const int n = s->n_blocks;
    int *got = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof(int));              /* [n] */
    kv_block_copy *pairs = kv_calloc((size_t)(n > 0 ? n : 1) * sizeof *pairs); /* [n] */
    int k = 0;
    if (!got || !pairs) rc = kv_fail(err, KV_ERR_NOMEM, "kv_swap_in: out of memory");
    if (!rc) rc = take_device_blocks(m, s, got, pairs, &k, "kv_swap_in", err);
    if (rc) {
        kv_free(got);
        kv_free(pairs);
        return rc;
    }
    /* the table in logical order: blocks that never left, blocks a prefetch filled, blocks
     * copied now. Blocks the sequence held get one more reference, for the table, so a
     * failure below (reset) leaves the sequence holding them as before */
    const int B = pg->pool.block_size;
    for (int i = 0; i < n && !rc; i++) {
        const int held = s->dev_blocks[i] >= 0 ? s->dev_blocks[i] : s->pre_blocks[i];
        const int blk = held >= 0 ? held : got[i];
        if (held >= 0) rc = kv_pool_ref(&pg->pool, blk, err);
        if (rc) break;
        const int64_t rows = s->n_tokens - (int64_t)i * B;
        rc = kv_block_table_push(t, blk, (int)(rows < B ? rows : B), err);
        if (rc && held >= 0) kv_pool_unref(&pg->pool, blk, NULL); /* (a new one: below) */
        if (!rc) got[i] = -1; /* the table holds it now */
    }
    /* one batched copy of what is still only on the host */
    if (!rc && k) rc = m->write_blocks(m, pairs, k, sw->mem, sw->pool.block_bytes, err);
    if (!rc) rc = m->set_blocks(m, slot, t->blocks, t->n_blocks, err);
    if (!rc && s->n_tokens) rc = m->set_length(m, slot, (int)s->n_tokens, err);
    for (int i = 0; i < n; i++) /* blocks taken but never pushed (a failed push) */
        if (got[i] >= 0) kv_pool_unref(&pg->pool, got[i], NULL);
    kv_free(got);
    kv_free(pairs);
    if (rc) { /* the table's references go back; the sequence keeps its own, unchanged */
        kv_paged_release(m, slot, NULL);
        return rc;
    }
    kv_swap_link_account(sw, KV_LINK_IN, k, sw->pool.block_bytes);
    if (s->n_tokens) memcpy(pg->tokens[slot], s->tokens, (size_t)s->n_tokens * sizeof(int));
    if (pg->pool.n_used > pg->peak_used) pg->peak_used = pg->pool.n_used;
    kv_swapped_drop(sw, m, s); /* its own device references and its host blocks */
    return KV_OK;
}
