/**
 * @file kv_prefix.h
 * Prefix caching (chapter 05): a full block whose K/V were computed once for some token
 * prefix is found again by a later sequence with the same prefix, and shared instead of
 * recomputed.
 *
 * Key. Block i of a sequence is keyed by the chain hash
 *
 *     h_i = kv_prefix_hash(h_{i-1}, tokens[i*B .. i*B+B-1]),   h_{-1} = KV_PREFIX_ROOT
 *
 * so the key of a block depends on every token before it, as its K/V do. Only full blocks
 * are cached: a partly filled block is still being written.
 *
 * Verification. A 64-bit hash can collide, and a wrong hit would silently attend to another
 * prompt's K/V. A hit is therefore accepted only when (1) the stored tokens equal the block's
 * tokens and (2) the stored parent is the very block matched one step earlier (its id and
 * its generation, kv_pool.gen, which changes whenever the id is reused). By induction the
 * whole prefix is verified, token by token, whatever the hash quality.
 *
 * Lifetime. A cached block whose last sequence finishes stays in the pool as CACHED
 * (kv_pool.h), reusable by a hit, until an allocation finds no FREE block and evicts the
 * least recently freed one (LRU). Tables release their blocks last-first, so a sequence's
 * deepest block is evicted before its first one.
 */
#ifndef KV_PREFIX_H
#define KV_PREFIX_H

#include "kv_block_table.h"
#include "kv_common.h"
#include "kv_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Chain hash of "no parent": the FNV-1a 64-bit offset basis. */
#define KV_PREFIX_ROOT 0xcbf29ce484222325ull

typedef struct {
    kv_pool *pool;
    int block_size;   /* B */
    uint64_t hash_mask; /**< test hook: keys are hash & mask; 0 makes every block collide */
    uint64_t *key;    /* [N] masked chain hash of each cached block */
    int *parent;      /* [N] cached block holding the previous block's content, -1 = first */
    uint32_t *parent_gen; /* [N] that parent's kv_pool.gen when this block was registered */
    int32_t *tokens;  /* [N][B] the block's tokens, compared on every hit */
    int *next;        /* [N] next block in the same bucket, -1 ends */
    int *bucket;      /* [n_buckets] first block of each bucket, -1 = empty */
    int n_buckets;    /* power of two >= N */
    int n_entries;    /**< blocks currently registered */
    int64_t lookups, hits, collisions; /**< blocks looked up, hit, and rejected by verification */
} kv_prefix;

/**
 * The documented 64-bit block hash: FNV-1a 64 over the 8 bytes of @p parent (little endian)
 * followed by each token as 4 bytes little endian. Plain FNV-1a keeps it reproducible in any
 * language; it is not collision resistant, which is why hits are verified (see above).
 */
uint64_t kv_prefix_hash(uint64_t parent, const int *tokens, int n);

/**
 * Create an empty prefix cache over @p pool (and register its eviction hook there).
 * KV_ERR_NOMEM.
 */
int kv_prefix_init(kv_prefix *pc, kv_pool *pool, kv_err *err);
/** Release the cache's arrays and unhook it from the pool (cached blocks become FREE). */
void kv_prefix_free(kv_prefix *pc);

/**
 * Admission of a prompt: fill the empty table @p t with the longest verified chain of cached
 * blocks for @p tokens [n_tokens], taking a reference to each (reviving CACHED ones), and
 * return in @p n_hit_tokens how many prompt tokens need no prefill. At most
 * (n_tokens - 1) / B blocks match: the last prompt token is always computed, since its
 * logits pick the first output token. KV_ERR_ARG when @p t is not empty.
 */
int kv_prefix_match(kv_prefix *pc, const int *tokens, int64_t n_tokens, kv_block_table *t,
                    int64_t *n_hit_tokens, kv_err *err);

/**
 * After a step wrote K/V: register every block of @p t that became full since the last call
 * (@p tokens [t->n_tokens] are the sequence's tokens). A block whose verified content is
 * already cached elsewhere is not registered twice; the chain continues through the cached
 * copy, so later lookups still find the blocks after it.
 */
int kv_prefix_register(kv_prefix *pc, kv_block_table *t, const int *tokens, kv_err *err);

/**
 * Blocks a prompt would hit without taking them (for the scheduler's admission check:
 * a hit on a CACHED block still consumes an available block, a hit on a USED one does not).
 * @p n_used_hits (may be NULL) receives the hits on USED blocks.
 */
int kv_prefix_probe(const kv_prefix *pc, const int *tokens, int64_t n_tokens, int *n_used_hits);

#ifdef __cplusplus
}
#endif
#endif
