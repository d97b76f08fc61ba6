/* Paging for a backend (kv_paged.h): pool, tables, copy-on-write and prefix cache on the
 * host; the bytes move on whatever device the backend's cache lives on, through its
 * cache-memory services (kv_cache_mem). */
#include "kv_paged.h"

#include <string.h>

int kv_paged_create(kv_paged **out, const kv_cache_spec *spec, int prefix_caching, kv_err *err)
{
    *out = NULL;
    if (!spec || spec->layout.kind != KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_ARG, "kv_paged_create: the cache spec is not paged");
    kv_paged *pg = kv_calloc(sizeof *pg);
    if (!pg) return kv_fail(err, KV_ERR_NOMEM, "kv_paged_create: out of memory");
    pg->n_slots = spec->n_slots;
    pg->tables = kv_calloc((size_t)spec->n_slots * sizeof(kv_block_table));
    pg->tokens = kv_calloc((size_t)spec->n_slots * sizeof(int *));
    pg->tok_cap = kv_calloc((size_t)spec->n_slots * sizeof(int64_t));
    kv_copy_list_init(&pg->copies);
    int rc = (!pg->tables || !pg->tokens || !pg->tok_cap)
                 ? kv_fail(err, KV_ERR_NOMEM, "kv_paged_create: out of memory")
                 : kv_pool_init(&pg->pool, spec->layout.n_blocks, spec->layout.block_size, 0, err);
    if (!rc && prefix_caching) {
        rc = kv_prefix_init(&pg->prefix, &pg->pool, err);
        pg->prefix_caching = !rc;
    }
    if (rc) {
        kv_paged_destroy(pg);
        return rc;
    }
    for (int s = 0; s < spec->n_slots; s++) kv_block_table_init(&pg->tables[s], spec->layout.block_size);
    *out = pg;
    return KV_OK;
}

void kv_paged_destroy(kv_paged *pg)
{
    if (!pg) return;
    for (int s = 0; s < pg->n_slots && pg->tables; s++) {
        kv_block_table_release(&pg->tables[s], &pg->pool, NULL);
        if (pg->tokens) kv_free(pg->tokens[s]);
    }
    if (pg->prefix_caching) kv_prefix_free(&pg->prefix);
    kv_pool_free(&pg->pool);
    kv_copy_list_free(&pg->copies);
    kv_free(pg->tables);
    kv_free(pg->tokens);
    kv_free(pg->tok_cap);
    kv_free(pg);
}

/* Grow slot s's token record to hold n tokens. */
static int reserve_tokens(kv_paged *pg, int s, int64_t n, kv_err *err)
{
    if (n <= pg->tok_cap[s]) return KV_OK;
    int64_t cap = pg->tok_cap[s] ? pg->tok_cap[s] : 64;
    while (cap < n) cap *= 2;
    int *t = kv_calloc((size_t)cap * sizeof(int));
    if (!t) return kv_fail(err, KV_ERR_NOMEM, "paged cache: token record of %lld", (long long)cap);
    if (pg->tokens[s]) memcpy(t, pg->tokens[s], (size_t)pg->tables[s].n_tokens * sizeof(int));
    kv_free(pg->tokens[s]);
    pg->tokens[s] = t;
    pg->tok_cap[s] = cap;
    return KV_OK;
}

static int push_table(kv_cache_mem *m, int s, kv_err *err)
{
    const kv_block_table *t = &m->paged->tables[s];
    return m->set_blocks(m, s, t->blocks, t->n_blocks, err);
}

/* Chapter 06: a windowed slot's table holds its rows, min(length, S+W), not its positions:
 * it stops growing once the ring is mapped, and the ring reuses those blocks. */
static int64_t slot_held(const kv_cache_mem *m, int s)
{
    return m->spec.window.size > 0 ? m->length(m, s) : m->paged->tables[s].n_tokens;
}
static int64_t rows_to_add(const kv_cache_mem *m, int s, int64_t pos, int n)
{
    if (m->spec.window.size == 0) return n;
    return kv_window_rows(m->spec.window.size, m->spec.window.n_sinks, pos + n) -
           m->paged->tables[s].n_tokens;
}

int kv_paged_prepare(kv_cache_mem *m, const kv_seq *seqs, int n_seqs, kv_err *err)
{
    kv_paged *pg = m->paged;
    /* check everything first, so a refused step changes no table */
    int64_t need = 0;
    for (int i = 0; i < n_seqs; i++) {
        const int s = seqs[i].slot;
        if (s < 0 || s >= pg->n_slots)
            return kv_fail(err, KV_ERR_ARG, "paged cache: sequence %d: slot %d is outside "
                           "[0, %d)", i, s, pg->n_slots);
        if (seqs[i].n_tokens < 1 || seqs[i].pos != slot_held(m, s))
            return kv_fail(err, KV_ERR_ARG, "paged cache: sequence %d: pos %d, %d tokens, but "
                           "slot %d holds %lld", i, seqs[i].pos, seqs[i].n_tokens, s,
                           (long long)slot_held(m, s));
        if ((int64_t)seqs[i].pos + seqs[i].n_tokens > m->spec.capacity)
            return kv_fail(err, KV_ERR_CAPACITY, "paged cache: sequence %d: pos %d + %d tokens "
                           "exceeds the capacity %d", i, seqs[i].pos, seqs[i].n_tokens,
                           m->spec.capacity);
        for (int t = 0; seqs[i].tokens && t < seqs[i].n_tokens; t++)
            if (seqs[i].tokens[t] < 0 || seqs[i].tokens[t] >= m->config->vocab_size)
                return kv_fail(err, KV_ERR_ARG, "paged cache: sequence %d: token %d is %d, "
                               "outside [0, %d)", i, t, seqs[i].tokens[t], m->config->vocab_size);
        if (!seqs[i].tokens)
            return kv_fail(err, KV_ERR_ARG, "paged cache: sequence %d: tokens is NULL", i);
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == s)
                return kv_fail(err, KV_ERR_ARG, "paged cache: sequences %d and %d both use "
                               "slot %d", j, i, s);
        const kv_block_table *t = &pg->tables[s];
        const int64_t add = rows_to_add(m, s, seqs[i].pos, seqs[i].n_tokens);
        int n = kv_block_table_blocks_needed(t, &pg->pool, add);
        /* Sharers of one partly filled last block that all append in this step: each but the
         * last copies it; the last finds itself alone (refcount 1) and keeps the original. */
        if (add > 0 && t->n_tokens % t->block_size) {
            const int last = t->blocks[t->n_blocks - 1], r = pg->pool.refcount[last];
            int earlier = 0;
            for (int j = 0; j < i; j++) {
                const kv_block_table *u = &pg->tables[seqs[j].slot];
                earlier += u->n_blocks > 0 && u->blocks[u->n_blocks - 1] == last &&
                           rows_to_add(m, seqs[j].slot, seqs[j].pos, seqs[j].n_tokens) > 0;
            }
            if (r > 1 && earlier == r - 1) n--;
        }
        need += n;
    }
    if (need > kv_pool_available(&pg->pool))
        return kv_fail(err, KV_ERR_CAPACITY, "paged cache: the step needs %lld blocks but the "
                       "pool has %d free of %d (blocks of %d tokens)", (long long)need,
                       kv_pool_available(&pg->pool), pg->pool.n_blocks, pg->pool.block_size);
    kv_copy_list_clear(&pg->copies);
    for (int i = 0; i < n_seqs; i++) {
        const int s = seqs[i].slot;
        if (m->spec.window.size > 0) { /* no token record: a window has no prefix cache */
            const int64_t add = rows_to_add(m, s, seqs[i].pos, seqs[i].n_tokens);
            int rc = add > 0 ? kv_block_table_append(&pg->tables[s], &pg->pool, add, NULL,
                                                     &pg->copies, err)
                             : KV_OK;
            if (rc) {
                kv_paged_rollback(m, seqs, i, NULL);
                return rc;
            }
            continue;
        }
        int rc = reserve_tokens(pg, s, (int64_t)seqs[i].pos + seqs[i].n_tokens, err);
        if (!rc) rc = kv_block_table_append(&pg->tables[s], &pg->pool, seqs[i].n_tokens, NULL,
                                            &pg->copies, err);
        if (rc) {
            kv_paged_rollback(m, seqs, i, NULL);
            return rc;
        }
        memcpy(pg->tokens[s] + seqs[i].pos, seqs[i].tokens, (size_t)seqs[i].n_tokens * sizeof(int));
    }
    pg->n_cow += pg->copies.n;
    if (pg->pool.n_used > pg->peak_used) pg->peak_used = pg->pool.n_used;
    /* the copies first (every sharer still reads the old block), then the new tables */
    int rc = pg->copies.n ? m->copy_blocks(m, pg->copies.pairs, pg->copies.n, err) : KV_OK;
    for (int i = 0; i < n_seqs && !rc; i++) rc = push_table(m, seqs[i].slot, err);
    if (rc) kv_paged_rollback(m, seqs, n_seqs, NULL);
    return rc;
}

int kv_paged_rollback(kv_cache_mem *m, const kv_seq *seqs, int n_seqs, kv_err *err)
{
    kv_paged *pg = m->paged;
    int st = KV_OK;
    for (int i = 0; i < n_seqs; i++) {
        const int s = seqs[i].slot;
        /* the rows the slot held before the step: its positions, or its ring's rows */
        const int64_t before = m->spec.window.size > 0
                                   ? kv_window_rows(m->spec.window.size, m->spec.window.n_sinks, seqs[i].pos)
                                   : seqs[i].pos;
        if (before >= pg->tables[s].n_tokens) continue; /* not appended (yet) */
        int rc = kv_block_table_truncate(&pg->tables[s], &pg->pool, before, err);
        if (!rc) rc = push_table(m, s, err);
        if (rc && st == KV_OK) st = rc;
    }
    return st;
}

/* Chapter 10: a block the prefix cache has hashed holds exactly its tokens; cutting into one
 * would let the next step overwrite rows another sequence may adopt. A slot out of range is
 * left for the cache's truncate to name. */
int kv_paged_truncate_check(const kv_cache_mem *m, int slot, int len, kv_err *err)
{
    if (slot < 0 || slot >= m->spec.n_slots) return KV_OK;
    if ((int64_t)len < (int64_t)m->paged->tables[slot].n_hashed * m->spec.layout.block_size)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "truncate: slot %d: %d tokens cuts into a "
                       "block the prefix cache has registered", slot, len);
    return KV_OK;
}

/* The table follows the cache's new length through the path that undoes a failed step:
 * rollback keeps the rows before a sequence's pos. */
int kv_paged_truncate(kv_cache_mem *m, int slot, int len, kv_err *err)
{
    const kv_seq at = {slot, len, 1, NULL};
    return kv_paged_rollback(m, &at, 1, err);
}

int kv_paged_commit(kv_cache_mem *m, const kv_seq *seqs, int n_seqs, kv_err *err)
{
    kv_paged *pg = m->paged;
    if (!pg->prefix_caching || m->spec.window.size > 0) return KV_OK;
    for (int i = 0; i < n_seqs; i++) {
        const int s = seqs[i].slot;
        int rc = kv_prefix_register(&pg->prefix, &pg->tables[s], pg->tokens[s], err);
        if (rc) return rc;
    }
    return KV_OK;
}

int kv_paged_blocks_needed(const kv_cache_mem *m, int slot, int64_t n_new)
{
    if (m->spec.window.size > 0) /* a window's table grows only until its ring is mapped */
        n_new = kv_window_rows(m->spec.window.size, m->spec.window.n_sinks, m->length(m, slot) + n_new) -
                m->paged->tables[slot].n_tokens;
    return kv_block_table_blocks_needed(&m->paged->tables[slot], &m->paged->pool, n_new);
}

int kv_paged_available(const kv_cache_mem *m) { return kv_pool_available(&m->paged->pool); }

int kv_paged_fork(kv_cache_mem *m, int dst, int src, kv_err *err)
{
    kv_paged *pg = m->paged;
    if (dst < 0 || dst >= pg->n_slots || src < 0 || src >= pg->n_slots || dst == src)
        return kv_fail(err, KV_ERR_ARG, "paged cache: fork %d -> %d: bad slots (%d slots)", src,
                       dst, pg->n_slots);
    if (pg->tables[dst].n_blocks)
        return kv_fail(err, KV_ERR_ARG, "paged cache: fork into slot %d, which is in use", dst);
    if (m->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "paged cache: fork of a sliding-window "
                       "sequence (its ring rewrites shared blocks in place)");
    int rc = reserve_tokens(pg, dst, pg->tables[src].n_tokens, err);
    if (!rc) rc = kv_block_table_fork(&pg->tables[dst], &pg->tables[src], &pg->pool, err);
    if (rc) return rc;
    memcpy(pg->tokens[dst], pg->tokens[src], (size_t)pg->tables[src].n_tokens * sizeof(int));
    rc = push_table(m, dst, err);
    return rc ? rc : m->fork_slot(m, dst, src, err);
}

int kv_paged_release(kv_cache_mem *m, int slot, kv_err *err)
{
    kv_paged *pg = m->paged;
    if (slot < 0 || slot >= pg->n_slots)
        return kv_fail(err, KV_ERR_ARG, "paged cache: release of slot %d (%d slots)", slot,
                       pg->n_slots);
    const int rc = kv_block_table_release(&pg->tables[slot], &pg->pool, err);
    m->reset(m, slot);
    return rc;
}

int kv_paged_match_prefix(kv_cache_mem *m, int slot, const int *tokens, int n, int *n_hit,
                          kv_err *err)
{
    kv_paged *pg = m->paged;
    *n_hit = 0;
    if (!pg->prefix_caching) return KV_OK;
    if (m->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "paged cache: prefix caching with a sliding "
                       "window (a ring's blocks do not hold a prefix for long)");
    if (slot < 0 || slot >= pg->n_slots || pg->tables[slot].n_blocks)
        return kv_fail(err, KV_ERR_ARG, "paged cache: prefix match into slot %d, which is "
                       "out of range or in use", slot);
    int64_t hit = 0;
    int rc = reserve_tokens(pg, slot, n, err);
    if (!rc) rc = kv_prefix_match(&pg->prefix, tokens, n, &pg->tables[slot], &hit, err);
    if (rc || hit == 0) return rc;
    memcpy(pg->tokens[slot], tokens, (size_t)hit * sizeof(int));
    rc = push_table(m, slot, err);
    if (!rc) rc = m->set_length(m, slot, (int)hit, err);
    if (rc) {
        kv_block_table_release(&pg->tables[slot], &pg->pool, NULL);
        return rc;
    }
    *n_hit = (int)hit;
    return KV_OK;
}
