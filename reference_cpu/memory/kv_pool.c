/* Block pool (chapter 05): ids, refcounts, a FREE stack and an LRU list of CACHED blocks.
 * Every operation is O(1); kv_pool_validate() is the O(N) audit the tests run. */
#include "kv_pool.h"

#include <stdlib.h>
#include <string.h>

size_t kv_token_bytes_fp32(const kv_config *cfg, const void *ctx)
{
    (void)ctx;
    /* K and V, every layer, every KV head, d floats each */
    return (size_t)cfg->n_layers * 2 * (size_t)kv_config_kv_dim(cfg) * sizeof(float);
}

size_t kv_pool_block_bytes(const kv_config *cfg, int block_size, kv_token_bytes_fn token_bytes,
                           const void *ctx)
{
    if (!token_bytes || block_size < 1) return 0;
    return (size_t)block_size * token_bytes(cfg, ctx);
}

int kv_pool_init(kv_pool *p, int n_blocks, int block_size, size_t block_bytes, kv_err *err)
{
    memset(p, 0, sizeof(*p));
    if (n_blocks < 1 || block_size < 1)
        return kv_fail(err, KV_ERR_ARG, "pool: n_blocks (%d) and block_size (%d) must be >= 1",
                       n_blocks, block_size);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->block_bytes = block_bytes;
    size_t n = (size_t)n_blocks;
    p->refcount = calloc(n, sizeof(int));
    p->state = calloc(n, 1);
    p->hashed = calloc(n, 1);
    p->gen = calloc(n, sizeof(uint32_t));
    p->free_stack = malloc(n * sizeof(int));
    p->lru_prev = malloc(n * sizeof(int));
    p->lru_next = malloc(n * sizeof(int));
    if (!p->refcount || !p->state || !p->hashed || !p->gen || !p->free_stack || !p->lru_prev ||
        !p->lru_next) {
        kv_pool_free(p);
        return kv_fail(err, KV_ERR_NOMEM, "pool: no memory for %d blocks", n_blocks);
    }
    /* pushed in reverse so block 0 is handed out first: tables read 0, 1, 2, ... in a demo */
    for (int i = 0; i < n_blocks; i++) {
        p->free_stack[i] = n_blocks - 1 - i;
        p->lru_prev[i] = p->lru_next[i] = -1;
    }
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
    return KV_OK;
}

void kv_pool_free(kv_pool *p)
{
    free(p->refcount);
    free(p->state);
    free(p->hashed);
    free(p->gen);
    free(p->free_stack);
    free(p->lru_prev);
    free(p->lru_next);
    memset(p, 0, sizeof(*p));
}

void kv_pool_set_evict_hook(kv_pool *p, kv_pool_evict_fn fn, void *ctx)
{
    p->on_evict = fn;
    p->evict_ctx = ctx;
}

static int check_id(const kv_pool *p, int block, const char *what, kv_err *err)
{
    if (block < 0 || block >= p->n_blocks)
        return kv_fail(err, KV_ERR_ARG, "pool: %s of block %d, outside 0..%d", what, block,
                       p->n_blocks - 1);
    return KV_OK;
}

/* LRU list: append at the tail when a cached block is freed, unlink from anywhere on a hit */
static void lru_push_tail(kv_pool *p, int b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static void lru_unlink(kv_pool *p, int b)
{
    int pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_cached--;
}

/* a block leaving the LRU list for good: the prefix cache forgets its content */
static int evict_head(kv_pool *p)
{
    int b = p->lru_head;
    lru_unlink(p, b);
    p->hashed[b] = 0;
    p->n_evictions++;
    if (p->on_evict) p->on_evict(p->evict_ctx, b);
    return b;
}

int kv_pool_alloc(kv_pool *p, int *block, kv_err *err)
{
    int b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->n_cached > 0) {
        b = evict_head(p);
    } else {
        return kv_fail(err, KV_ERR_CAPACITY, "pool: all %d blocks are in use", p->n_blocks);
    }
    p->state[b] = KV_BLOCK_USED;
    p->refcount[b] = 1;
    p->gen[b]++;
    p->n_used++;
    p->total_refs++;
    *block = b;
    return KV_OK;
}

int kv_pool_ref(kv_pool *p, int block, kv_err *err)
{
    if (check_id(p, block, "ref", err)) return KV_ERR_ARG;
    if (p->refcount[block] == 0)
        return kv_fail(err, KV_ERR_ARG, "pool: ref of block %d at refcount 0 (use after free)",
                       block);
    p->refcount[block]++;
    p->total_refs++;
    return KV_OK;
}

int kv_pool_unref(kv_pool *p, int block, kv_err *err)
{
    if (check_id(p, block, "unref", err)) return KV_ERR_ARG;
    if (p->refcount[block] == 0)
        return kv_fail(err, KV_ERR_ARG, "pool: double free of block %d (refcount already 0)",
                       block);
    p->total_refs--;
    if (--p->refcount[block] > 0) return KV_OK;
    p->n_used--;
    if (p->hashed[block]) {
        p->state[block] = KV_BLOCK_CACHED;
        lru_push_tail(p, block);
    } else {
        p->state[block] = KV_BLOCK_FREE;
        p->free_stack[p->n_free++] = block;
    }
    return KV_OK;
}

int kv_pool_touch(const kv_pool *p, int block, kv_err *err)
{
    if (check_id(p, block, "touch", err)) return KV_ERR_ARG;
    if (p->refcount[block] == 0)
        return kv_fail(err, KV_ERR_ARG, "pool: block %d touched at refcount 0 (use after free)",
                       block);
    return KV_OK;
}

int kv_pool_revive(kv_pool *p, int block, kv_err *err)
{
    if (check_id(p, block, "revive", err)) return KV_ERR_ARG;
    if (p->state[block] == KV_BLOCK_USED) return kv_pool_ref(p, block, err);
    if (p->state[block] != KV_BLOCK_CACHED)
        return kv_fail(err, KV_ERR_ARG, "pool: revive of block %d, which is free (not cached)",
                       block);
    lru_unlink(p, block);
    p->state[block] = KV_BLOCK_USED;
    p->refcount[block] = 1;
    p->n_used++;
    p->total_refs++;
    return KV_OK;
}

int kv_pool_set_hashed(kv_pool *p, int block, int hashed, kv_err *err)
{
    if (check_id(p, block, "set_hashed", err)) return KV_ERR_ARG;
    if (hashed) {
        if (p->state[block] == KV_BLOCK_FREE)
            return kv_fail(err, KV_ERR_ARG, "pool: cannot cache free block %d", block);
        p->hashed[block] = 1;
        return KV_OK;
    }
    p->hashed[block] = 0;
    if (p->state[block] == KV_BLOCK_CACHED) { /* nobody will revive it: plain free */
        lru_unlink(p, block);
        p->state[block] = KV_BLOCK_FREE;
        p->free_stack[p->n_free++] = block;
    }
    return KV_OK;
}

int kv_pool_evict_one(kv_pool *p, kv_err *err)
{
    if (p->n_cached == 0) return kv_fail(err, KV_ERR_CAPACITY, "pool: no cached block to evict");
    int b = evict_head(p);
    p->state[b] = KV_BLOCK_FREE;
    p->free_stack[p->n_free++] = b;
    return KV_OK;
}

int kv_pool_check_leaks(const kv_pool *p, int *out, int max)
{
    int n = 0;
    for (int b = 0; b < p->n_blocks; b++)
        if (p->refcount[b] > 0) {
            if (out && n < max) out[n] = b;
            n++;
        }
    return n;
}

int kv_pool_validate(const kv_pool *p, kv_err *err)
{
    int n_used = 0, n_free = 0, n_cached = 0;
    int64_t refs = 0;
    for (int b = 0; b < p->n_blocks; b++) {
        int rc = p->refcount[b], st = p->state[b];
        if (rc < 0) return kv_fail(err, KV_ERR_ARG, "pool: block %d refcount %d < 0", b, rc);
        if ((rc > 0) != (st == KV_BLOCK_USED))
            return kv_fail(err, KV_ERR_ARG, "pool: block %d refcount %d but state %d", b, rc, st);
        if (st == KV_BLOCK_CACHED && !p->hashed[b])
            return kv_fail(err, KV_ERR_ARG, "pool: block %d cached but not hashed", b);
        if (st == KV_BLOCK_FREE && p->hashed[b])
            return kv_fail(err, KV_ERR_ARG, "pool: block %d free but still hashed", b);
        refs += rc;
        n_used += st == KV_BLOCK_USED;
        n_free += st == KV_BLOCK_FREE;
        n_cached += st == KV_BLOCK_CACHED;
    }
    if (n_used != p->n_used || n_free != p->n_free || n_cached != p->n_cached ||
        refs != p->total_refs)
        return kv_fail(err, KV_ERR_ARG,
                       "pool: counters used/free/cached/refs %d/%d/%d/%lld, recount %d/%d/%d/%lld",
                       p->n_used, p->n_free, p->n_cached, (long long)p->total_refs, n_used,
                       n_free, n_cached, (long long)refs);
    /* the free stack: FREE blocks only, each once (the state count above makes it exact) */
    unsigned char *seen = calloc((size_t)p->n_blocks, 1);
    if (!seen) return kv_fail(err, KV_ERR_NOMEM, "pool: validate out of memory");
    int st = KV_OK;
    for (int i = 0; i < p->n_free && !st; i++) {
        int b = p->free_stack[i];
        if (b < 0 || b >= p->n_blocks || p->state[b] != KV_BLOCK_FREE || seen[b])
            st = kv_fail(err, KV_ERR_ARG, "pool: free stack entry %d (block %d) is wrong", i, b);
        else seen[b] = 1;
    }
    /* the LRU list: walk head to tail, links mirror each other, CACHED blocks only */
    int count = 0, prev = -1;
    for (int b = p->lru_head; b >= 0 && !st; prev = b, b = p->lru_next[b]) {
        if (b >= p->n_blocks || p->state[b] != KV_BLOCK_CACHED || seen[b] ||
            p->lru_prev[b] != prev || ++count > p->n_cached)
            st = kv_fail(err, KV_ERR_ARG, "pool: LRU list broken at block %d", b);
        else seen[b] = 1;
    }
    if (!st && (count != p->n_cached || p->lru_tail != prev))
        st = kv_fail(err, KV_ERR_ARG, "pool: LRU list holds %d blocks, counter %d", count,
                     p->n_cached);
    free(seen);
    return st;
}
