/* Prefix cache (chapter 05): chain-hashed full blocks in a bucketed hash table, every hit
 * verified by tokens and by parent identity. The pool keeps the LRU order; we keep content. */
#include "kv_prefix.h"

#include <stdlib.h>
#include <string.h>

uint64_t kv_prefix_hash(uint64_t parent, const int *tokens, int n)
{
    const uint64_t prime = 0x100000001b3ull; /* FNV-1a 64 */
    uint64_t h = KV_PREFIX_ROOT;
    for (int i = 0; i < 8; i++) h = (h ^ ((parent >> (8 * i)) & 0xff)) * prime;
    for (int t = 0; t < n; t++) {
        uint32_t u = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) h = (h ^ ((u >> (8 * i)) & 0xff)) * prime;
    }
    return h;
}

/* FNV's low bits are weak; a splitmix64 finalizer spreads the key before it picks a bucket */
static int bucket_of(const kv_prefix *pc, uint64_t key)
{
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (int)(key & (uint64_t)(pc->n_buckets - 1));
}

static void unlink_entry(kv_prefix *pc, int b)
{
    int *link = &pc->bucket[bucket_of(pc, pc->key[b])];
    while (*link >= 0 && *link != b) link = &pc->next[*link];
    if (*link == b) {
        *link = pc->next[b];
        pc->next[b] = -1;
        pc->n_entries--;
    }
}

/* the pool evicts a CACHED block to reuse it: forget its content */
static void on_evict(void *ctx, int block) { unlink_entry((kv_prefix *)ctx, block); }

int kv_prefix_init(kv_prefix *pc, kv_pool *pool, kv_err *err)
{
    memset(pc, 0, sizeof(*pc));
    const size_t n = (size_t)pool->n_blocks, B = (size_t)pool->block_size;
    pc->pool = pool;
    pc->block_size = pool->block_size;
    pc->hash_mask = ~0ull;
    pc->n_buckets = 1;
    while (pc->n_buckets < pool->n_blocks) pc->n_buckets *= 2;
    pc->key = calloc(n, sizeof(uint64_t));
    pc->parent = calloc(n, sizeof(int));
    pc->parent_gen = calloc(n, sizeof(uint32_t));
    pc->tokens = calloc(n * B, sizeof(int32_t));
    pc->next = malloc(n * sizeof(int));
    pc->bucket = malloc((size_t)pc->n_buckets * sizeof(int));
    if (!pc->key || !pc->parent || !pc->parent_gen || !pc->tokens || !pc->next || !pc->bucket) {
        kv_prefix_free(pc);
        return kv_fail(err, KV_ERR_NOMEM, "prefix cache: no memory for %zu blocks", n);
    }
    for (size_t i = 0; i < n; i++) pc->next[i] = -1;
    for (int i = 0; i < pc->n_buckets; i++) pc->bucket[i] = -1;
    kv_pool_set_evict_hook(pool, on_evict, pc);
    return KV_OK;
}

void kv_prefix_free(kv_prefix *pc)
{
    if (pc->pool && pc->bucket) {
        kv_pool_set_evict_hook(pc->pool, NULL, NULL);
        for (int i = 0; i < pc->n_buckets; i++)
            for (int b = pc->bucket[i]; b >= 0; b = pc->next[b])
                kv_pool_set_hashed(pc->pool, b, 0, NULL);
    }
    free(pc->key);
    free(pc->parent);
    free(pc->parent_gen);
    free(pc->tokens);
    free(pc->next);
    free(pc->bucket);
    memset(pc, 0, sizeof(*pc));
}

/* The verified lookup: same key, same tokens, and the parent is exactly the block (and the
 * life of that block) matched one step earlier. Equal keys that fail are counted. */
static int find(const kv_prefix *pc, uint64_t key, const int *tokens, int parent,
                uint32_t parent_gen, int64_t *collisions)
{
    const int B = pc->block_size;
    for (int b = pc->bucket[bucket_of(pc, key)]; b >= 0; b = pc->next[b]) {
        if (pc->key[b] != key) continue;
        int same = pc->parent[b] == parent &&
                   (parent < 0 || pc->parent_gen[b] == parent_gen) &&
                   memcmp(pc->tokens + (size_t)b * B, tokens, (size_t)B * sizeof(int)) == 0;
        if (same) return b;
        if (collisions) (*collisions)++;
    }
    return -1;
}

int kv_prefix_match(kv_prefix *pc, const int *tokens, int64_t n_tokens, kv_block_table *t,
                    int64_t *n_hit_tokens, kv_err *err)
{
    const int B = pc->block_size;
    if (t->n_blocks != 0 || t->block_size != B)
        return kv_fail(err, KV_ERR_ARG, "prefix match: table must be empty with block size %d",
                       B);
    int64_t max_blocks = n_tokens > 0 ? (n_tokens - 1) / B : 0;
    uint64_t h = KV_PREFIX_ROOT;
    int prev = -1;
    uint32_t prev_gen = 0;
    int64_t i = 0;
    for (; i < max_blocks; i++) {
        const int *blk = tokens + i * B;
        uint64_t hh = kv_prefix_hash(h, blk, B);
        pc->lookups++;
        int b = find(pc, hh & pc->hash_mask, blk, prev, prev_gen, &pc->collisions);
        if (b < 0) break;
        /* no allocation happens during a match, so no hit can be evicted under our feet */
        if (kv_pool_revive(pc->pool, b, err) || kv_block_table_push(t, b, B, err)) {
            kv_block_table_release(t, pc->pool, NULL);
            return KV_ERR_ARG;
        }
        pc->hits++;
        h = hh;
        prev = b;
        prev_gen = pc->pool->gen[b];
    }
    t->n_hashed = (int)i;
    t->last_hash = h;
    t->hash_parent = prev;
    t->hash_parent_gen = prev_gen;
    if (n_hit_tokens) *n_hit_tokens = i * B;
    return KV_OK;
}

int kv_prefix_register(kv_prefix *pc, kv_block_table *t, const int *tokens, kv_err *err)
{
    const int B = pc->block_size;
    int full = (int)(t->n_tokens / B);
    uint64_t h = t->n_hashed ? t->last_hash : KV_PREFIX_ROOT;
    int prev = t->n_hashed ? t->hash_parent : -1;
    uint32_t prev_gen = t->n_hashed ? t->hash_parent_gen : 0;
    int i = t->n_hashed;
    for (; i < full; i++) {
        const int *blk = tokens + (size_t)i * B;
        uint64_t hh = kv_prefix_hash(h, blk, B), key = hh & pc->hash_mask;
        int b = t->blocks[i];
        int canon = find(pc, key, blk, prev, prev_gen, NULL);
        if (canon < 0) {
            if (i > 0 && prev < 0) break; /* the chain's previous block is not cached */
            if (kv_pool_touch(pc->pool, b, err)) return KV_ERR_ARG;
            if (pc->pool->hashed[b]) break; /* cached under another chain: leave it */
            pc->key[b] = key;
            pc->parent[b] = prev;
            pc->parent_gen[b] = prev_gen;
            memcpy(pc->tokens + (size_t)b * B, blk, (size_t)B * sizeof(int));
            int *head = &pc->bucket[bucket_of(pc, key)];
            pc->next[b] = *head;
            *head = b;
            pc->n_entries++;
            kv_pool_set_hashed(pc->pool, b, 1, NULL);
            canon = b;
        }
        h = hh;
        prev = canon;
        prev_gen = pc->pool->gen[canon];
    }
    t->n_hashed = i;
    t->last_hash = h;
    t->hash_parent = prev;
    t->hash_parent_gen = prev_gen;
    return KV_OK;
}

int kv_prefix_probe(const kv_prefix *pc, const int *tokens, int64_t n_tokens, int *n_used_hits)
{
    const int B = pc->block_size;
    int64_t max_blocks = n_tokens > 0 ? (n_tokens - 1) / B : 0;
    uint64_t h = KV_PREFIX_ROOT;
    int prev = -1, used = 0;
    uint32_t prev_gen = 0;
    int64_t i = 0;
    for (; i < max_blocks; i++) {
        uint64_t hh = kv_prefix_hash(h, tokens + i * B, B);
        int b = find(pc, hh & pc->hash_mask, tokens + i * B, prev, prev_gen, NULL);
        if (b < 0) break;
        used += pc->pool->state[b] == KV_BLOCK_USED;
        h = hh;
        prev = b;
        prev_gen = pc->pool->gen[b];
    }
    if (n_used_hits) *n_used_hits = used;
    return (int)i;
}
