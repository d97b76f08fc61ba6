/**
 * @file kv_pool.h
 * The block pool of a paged KV cache (chapter 05): N physical blocks of B tokens each.
 *
 * The pool is bookkeeping only. It hands out block ids, counts references and keeps the free
 * lists; it never touches K/V bytes. The cache that owns the memory (CPU or CUDA) sizes it
 * with kv_pool_block_bytes() and addresses block b at b * block_bytes, so the same pool works
 * for every layer count, KV head count and cache dtype.
 *
 * A block is in exactly one of three states:
 *
 *   FREE    refcount 0, on the free stack, content meaningless
 *   USED    refcount > 0, referenced by that many block-table entries
 *   CACHED  refcount 0, but its content is registered in the prefix cache (kv_prefix.h): it
 *           waits on the LRU list and can be revived by a prefix hit until it is evicted
 *
 * Allocation prefers FREE blocks and only then evicts the least recently freed CACHED block
 * (an eviction hook tells the prefix cache to forget it). Every misuse is an error return,
 * never an abort: a double free (unref at refcount 0), a use after free (ref or touch at
 * refcount 0), an id out of range; kv_pool_check_leaks() lists blocks still referenced.
 */
#ifndef KV_POOL_H
#define KV_POOL_H

#include "kv_common.h"
#include "kv_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Block states (see the file comment). */
enum { KV_BLOCK_FREE = 0, KV_BLOCK_USED = 1, KV_BLOCK_CACHED = 2 };

/** Called when a CACHED block is evicted to be reused; @p ctx is the registered context. */
typedef void (*kv_pool_evict_fn)(void *ctx, int block);

typedef struct {
    int n_blocks;       /**< N */
    int block_size;     /**< B, tokens per block */
    size_t block_bytes; /**< bytes one block holds over all layers, K and V (0: not sized) */
    int *refcount;      /* [N] table entries referencing each block */
    unsigned char *state; /* [N] KV_BLOCK_FREE / USED / CACHED */
    unsigned char *hashed; /* [N] 1 while the prefix cache holds the block's content */
    uint32_t *gen;      /* [N] bumped at every allocation: tells a block's lives apart */
    int *free_stack;    /* [N] FREE block ids; the top is reused first (LIFO, cache-warm) */
    int n_free;
    int *lru_prev, *lru_next; /* [N] CACHED blocks, head = least recently freed, -1 ends */
    int lru_head, lru_tail, n_cached;
    int n_used;         /* blocks in state USED */
    int64_t total_refs; /* sum of refcount[]: equals the entries of all block tables */
    int64_t n_evictions;
    kv_pool_evict_fn on_evict;
    void *evict_ctx;
} kv_pool;

/**
 * Bytes one token occupies in the cache over all layers, K and V together, for one cache
 * format; @p ctx is whatever the format needs (a dtype, a quantization spec).
 */
typedef size_t (*kv_token_bytes_fn)(const kv_config *cfg, const void *ctx);

/** Plain fp32 cache: L · 2 · H_kv · d · 4 bytes per token (@p ctx unused). */
size_t kv_token_bytes_fp32(const kv_config *cfg, const void *ctx);

/**
 * Bytes of one block: B · token_bytes(cfg, ctx). The cache allocates N times this.
 * Returns 0 when @p token_bytes is NULL or B < 1.
 */
size_t kv_pool_block_bytes(const kv_config *cfg, int block_size, kv_token_bytes_fn token_bytes,
                           const void *ctx);

/**
 * Create a pool of @p n_blocks FREE blocks of @p block_size tokens. @p block_bytes is recorded
 * for the cache (0 allowed). KV_ERR_ARG for n_blocks < 1 or block_size < 1, KV_ERR_NOMEM.
 */
int kv_pool_init(kv_pool *p, int n_blocks, int block_size, size_t block_bytes, kv_err *err);
/** Release the pool's arrays (the leak check is the caller's choice, before this). */
void kv_pool_free(kv_pool *p);
/**
 * Register the hook run when a CACHED block is evicted (the prefix cache does this). The
 * pool has already cleared the block's mark; the hook must not call back into the pool.
 */
void kv_pool_set_evict_hook(kv_pool *p, kv_pool_evict_fn fn, void *ctx);

/** Blocks an allocation can still get: FREE plus CACHED (evictable). */
static inline int kv_pool_available(const kv_pool *p) { return p->n_free + p->n_cached; }

/**
 * Take one block, refcount 1: the top FREE block, else the least recently freed CACHED block
 * (evicted through the hook). KV_ERR_CAPACITY when every block is USED.
 */
int kv_pool_alloc(kv_pool *p, int *block, kv_err *err);

/** One more reference to a USED block (fork). KV_ERR_ARG on a block at refcount 0. */
int kv_pool_ref(kv_pool *p, int block, kv_err *err);

/**
 * Drop one reference. At 0 the block becomes CACHED (to the LRU tail) when the prefix cache
 * holds it, FREE otherwise. KV_ERR_ARG on refcount 0 (double free).
 */
int kv_pool_unref(kv_pool *p, int block, kv_err *err);

/**
 * Assert a block is USED before reading or writing it: KV_ERR_ARG "use after free" when its
 * refcount is 0, or when the id is out of range.
 */
int kv_pool_touch(const kv_pool *p, int block, kv_err *err);

/**
 * Prefix hit on a CACHED block: take it off the LRU list, refcount 1 (USED). A USED block
 * gets one more reference instead. KV_ERR_ARG on a FREE block.
 */
int kv_pool_revive(kv_pool *p, int block, kv_err *err);

/**
 * Mark a USED or CACHED block as held (1) or no longer held (0) by the prefix cache. Clearing
 * the mark of a CACHED block moves it to FREE. KV_ERR_ARG on a FREE block when marking.
 * Only the prefix cache calls this: it must drop its own entry for the block at the same time.
 */
int kv_pool_set_hashed(kv_pool *p, int block, int hashed, kv_err *err);

/** Evict the least recently freed CACHED block now (it becomes FREE); KV_ERR_CAPACITY if none. */
int kv_pool_evict_one(kv_pool *p, kv_err *err);

/**
 * Blocks still referenced: returns how many blocks are USED and writes up to @p max of their
 * ids to @p out (may be NULL). After every sequence is released this must be 0.
 */
int kv_pool_check_leaks(const kv_pool *p, int *out, int max);

/**
 * Full O(N) consistency check: states agree with refcounts and marks, the free stack holds
 * exactly the FREE blocks once each, the LRU list is a well-linked list of exactly the CACHED
 * blocks, and the counters (n_free, n_cached, n_used, total_refs) match. KV_ERR_ARG naming
 * the first violation.
 */
int kv_pool_validate(const kv_pool *p, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
