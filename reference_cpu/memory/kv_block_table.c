/* Block tables (chapter 05): on-demand growth, fork by sharing, copy-on-write of the last
 * block. Bytes never move here: copies are recorded for the cache to perform. */
#include "kv_block_table.h"

#include <stdlib.h>
#include <string.h>

void kv_copy_list_init(kv_copy_list *l) { memset(l, 0, sizeof(*l)); }

static int copy_reserve(kv_copy_list *l, int n, kv_err *err)
{
    if (n <= l->cap) return KV_OK;
    int cap = l->cap ? 2 * l->cap : 16;
    kv_block_copy *np = realloc(l->pairs, (size_t)cap * sizeof(*np));
    if (!np) return kv_fail(err, KV_ERR_NOMEM, "copy list: no memory for %d pairs", cap);
    l->pairs = np;
    l->cap = cap;
    return KV_OK;
}

int kv_copy_list_push(kv_copy_list *l, int src, int dst, kv_err *err)
{
    if (copy_reserve(l, l->n + 1, err)) return KV_ERR_NOMEM;
    l->pairs[l->n].src = src;
    l->pairs[l->n].dst = dst;
    l->n++;
    return KV_OK;
}

void kv_copy_list_free(kv_copy_list *l)
{
    free(l->pairs);
    memset(l, 0, sizeof(*l));
}

void kv_block_table_init(kv_block_table *t, int block_size)
{
    memset(t, 0, sizeof(*t));
    t->block_size = block_size;
    t->hash_parent = -1;
}

static int reserve(kv_block_table *t, int n, kv_err *err)
{
    if (n <= t->cap) return KV_OK;
    int cap = t->cap ? t->cap : 4;
    while (cap < n) cap *= 2;
    int *nb = realloc(t->blocks, (size_t)cap * sizeof(int));
    if (!nb) return kv_fail(err, KV_ERR_NOMEM, "block table: no memory for %d entries", cap);
    t->blocks = nb;
    t->cap = cap;
    return KV_OK;
}

int kv_block_table_release(kv_block_table *t, kv_pool *p, kv_err *err)
{
    int st = KV_OK;
    for (int i = t->n_blocks - 1; i >= 0; i--) {
        kv_err e;
        if (kv_pool_unref(p, t->blocks[i], &e) && st == KV_OK)
            st = kv_fail(err, KV_ERR_ARG, "block table entry %d: %s", i, e.msg);
    }
    free(t->blocks);
    kv_block_table_init(t, t->block_size);
    return st;
}

int kv_block_table_truncate(kv_block_table *t, kv_pool *p, int64_t n_tokens, kv_err *err)
{
    if (n_tokens < 0 || n_tokens > t->n_tokens)
        return kv_fail(err, KV_ERR_ARG, "truncate: %lld tokens, the table holds %lld",
                       (long long)n_tokens, (long long)t->n_tokens);
    const int keep = (int)((n_tokens + t->block_size - 1) / t->block_size);
    int st = KV_OK;
    for (int i = t->n_blocks - 1; i >= keep; i--) { /* last first, as a release */
        kv_err e;
        if (kv_pool_unref(p, t->blocks[i], &e) && st == KV_OK)
            st = kv_fail(err, KV_ERR_ARG, "block table entry %d: %s", i, e.msg);
    }
    t->n_blocks = keep;
    t->n_tokens = n_tokens;
    if (t->n_hashed > keep) t->n_hashed = keep; /* never: only blocks full before a step are */
    return st;
}

int kv_block_table_fork(kv_block_table *dst, const kv_block_table *src, kv_pool *p,
                        kv_err *err)
{
    if (dst->n_blocks != 0)
        return kv_fail(err, KV_ERR_ARG, "fork: destination table is not empty");
    for (int i = 0; i < src->n_blocks; i++) /* all live, else nothing changes */
        if (kv_pool_touch(p, src->blocks[i], err)) return KV_ERR_ARG;
    if (reserve(dst, src->n_blocks, err)) return KV_ERR_NOMEM;
    for (int i = 0; i < src->n_blocks; i++) {
        kv_pool_ref(p, src->blocks[i], NULL);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->block_size = src->block_size;
    dst->n_hashed = src->n_hashed;
    dst->last_hash = src->last_hash;
    dst->hash_parent = src->hash_parent;
    dst->hash_parent_gen = src->hash_parent_gen;
    return KV_OK;
}

/* does the next token land in a partly filled last block that someone else also reads? */
static int needs_cow(const kv_block_table *t, const kv_pool *p)
{
    return t->n_tokens % t->block_size != 0 && p->refcount[t->blocks[t->n_blocks - 1]] > 1;
}

int kv_block_table_blocks_needed(const kv_block_table *t, const kv_pool *p, int64_t n_new)
{
    if (n_new <= 0) return 0;
    const int B = t->block_size;
    int64_t have = (int64_t)t->n_blocks;
    int64_t want = (t->n_tokens + n_new + B - 1) / B;
    return (int)(want - have) + needs_cow(t, p);
}

int kv_block_table_append(kv_block_table *t, kv_pool *p, int64_t n_new, int64_t *slots,
                          kv_copy_list *copies, kv_err *err)
{
    const int B = t->block_size;
    if (n_new < 0) return kv_fail(err, KV_ERR_ARG, "append: n_new %lld < 0", (long long)n_new);
    if (B != p->block_size)
        return kv_fail(err, KV_ERR_ARG, "append: table block size %d, pool %d", B,
                       p->block_size);
    if (n_new == 0) return KV_OK;
    if (t->n_blocks > 0 && kv_pool_touch(p, t->blocks[t->n_blocks - 1], err)) return KV_ERR_ARG;
    int need = kv_block_table_blocks_needed(t, p, n_new);
    if (need > kv_pool_available(p))
        return kv_fail(err, KV_ERR_CAPACITY, "append: %d blocks needed, %d available", need,
                       kv_pool_available(p));
    int64_t want = (t->n_tokens + n_new + B - 1) / B;
    if (reserve(t, (int)want, err)) return KV_ERR_NOMEM;
    const int cow = needs_cow(t, p);
    /* every allocation happens before any state changes, so nothing below can fail */
    if (cow && !copies)
        return kv_fail(err, KV_ERR_ARG, "append: shared last block needs a copy list for its copy");
    if (cow && copy_reserve(copies, copies->n + 1, err)) return KV_ERR_NOMEM;

    /* copy-on-write: our writes go to a private copy, the other sharers keep the original */
    if (cow) {
        int src = t->blocks[t->n_blocks - 1], dst;
        kv_pool_alloc(p, &dst, NULL); /* cannot fail: counted in need */
        kv_pool_unref(p, src, NULL);  /* refcount was > 1: stays USED for the others */
        kv_copy_list_push(copies, src, dst, NULL);
        t->blocks[t->n_blocks - 1] = dst;
    }
    /* new blocks on demand, then the slots: block * B + offset */
    while (t->n_blocks < want) kv_pool_alloc(p, &t->blocks[t->n_blocks++], NULL);
    if (slots)
        for (int64_t i = 0; i < n_new; i++) {
            int64_t pos = t->n_tokens + i;
            slots[i] = (int64_t)t->blocks[pos / B] * B + pos % B;
        }
    t->n_tokens += n_new;
    return KV_OK;
}

int kv_block_table_push(kv_block_table *t, int block, int n_tokens_in_block, kv_err *err)
{
    if (t->n_tokens != (int64_t)t->n_blocks * t->block_size)
        return kv_fail(err, KV_ERR_ARG, "push: the last block of the table is not full");
    if (n_tokens_in_block < 1 || n_tokens_in_block > t->block_size)
        return kv_fail(err, KV_ERR_ARG, "push: %d tokens in a block of %d", n_tokens_in_block,
                       t->block_size);
    if (reserve(t, t->n_blocks + 1, err)) return KV_ERR_NOMEM;
    t->blocks[t->n_blocks++] = block;
    t->n_tokens += n_tokens_in_block;
    return KV_OK;
}

int64_t kv_block_table_slot(const kv_block_table *t, int64_t pos)
{
    if (pos < 0 || pos >= t->n_tokens) return -1;
    const int B = t->block_size;
    return (int64_t)t->blocks[pos / B] * B + pos % B;
}
