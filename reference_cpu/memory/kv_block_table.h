/**
 * @file kv_block_table.h
 * Per-sequence block tables (chapter 05): logical block i of a sequence lives in physical
 * block blocks[i] of the pool, so token position pos is stored at
 *
 *     slot = blocks[pos / B] * B + pos % B          (B = tokens per block)
 *
 * A batch's writes can go through a flat slot mapping, one slot per new token, as vLLM's do;
 * a negative slot is padding and kv_cache_write_slots() skips it (kv_forward() computes the
 * same slots from each sequence's table in kv_cache_write_seq()). Blocks are allocated on demand as a sequence
 * grows, so at most B - 1 slots of a sequence are ever unused (its last block).
 *
 * Sharing: a fork copies the table and adds one reference per block (no K/V bytes move).
 * Appending to a shared, partly filled last block would change what the other sharers read,
 * so the append first copies it: copy-on-write. The append does not move bytes either; it
 * records a (src, dst) pair in a kv_copy_list that the caller performs, for every sequence of
 * a step at once, on whichever device holds the cache, before the step's writes.
 */
#ifndef KV_BLOCK_TABLE_H
#define KV_BLOCK_TABLE_H

#include "kv_cache.h"
#include "kv_common.h"
#include "kv_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kv_block_copy, one copy the cache performs, is the cache's type (kv_cache.h). */
/**
 * A batch of block copies. Perform them in list order, after the appends of a step and
 * before its writes and before any release of that step (a released src could be handed
 * out again as a later dst).
 */
typedef struct {
    kv_block_copy *pairs; /* [cap] */
    int n, cap;
} kv_copy_list;

typedef struct {
    int *blocks;      /* [cap] physical block ids in logical order; n_blocks are valid */
    int n_blocks, cap;
    int64_t n_tokens; /**< tokens the sequence holds; ceil(n_tokens / B) == n_blocks */
    int block_size;   /**< B, equal to the pool's */
    /* owned by the prefix cache (kv_prefix.h): how many leading blocks are hashed, the
     * chain hash of the last one, and the cached block (id, generation) holding its content */
    int n_hashed;
    uint64_t last_hash;
    int hash_parent;
    uint32_t hash_parent_gen;
} kv_block_table;

/** Block of a slot (slot >= 0). */
static inline int64_t kv_slot_block(int64_t slot, int block_size) { return slot / block_size; }
/** Offset inside its block of a slot (slot >= 0). */
static inline int kv_slot_offset(int64_t slot, int block_size) { return (int)(slot % block_size); }

/** Empty copy list. */
void kv_copy_list_init(kv_copy_list *l);
/** Append one pair; KV_ERR_NOMEM when it cannot grow. */
int kv_copy_list_push(kv_copy_list *l, int src, int dst, kv_err *err);
/** Forget the pairs (after the caller has performed them); keeps the memory. */
static inline void kv_copy_list_clear(kv_copy_list *l) { l->n = 0; }
/** Release the list's memory. */
void kv_copy_list_free(kv_copy_list *l);

/** Empty table for blocks of @p block_size tokens. */
void kv_block_table_init(kv_block_table *t, int block_size);

/**
 * Free on finish: drop this table's reference to each block, last block first (a freed,
 * cached block goes to the LRU tail, so a sequence's longest prefix is evicted first and its
 * first block, the most shareable, last). The table ends empty and reusable; its memory is
 * freed. On a pool error (double free) the message says which entry.
 */
int kv_block_table_release(kv_block_table *t, kv_pool *p, kv_err *err);

/**
 * Undo an append: keep the first @p n_tokens tokens (<= n_tokens held), dropping the table's
 * reference to every block past ceil(n_tokens / B). A step whose device work failed after its
 * slots were reserved rolls back with this (kv_paged_rollback()). A block copied on write
 * stays the table's own copy: its rows equal the shared original's.
 */
int kv_block_table_truncate(kv_block_table *t, kv_pool *p, int64_t n_tokens, kv_err *err);

/**
 * Fork: @p dst (empty, initialized) becomes a copy of @p src sharing every block
 * (refcount + 1 each). Allocates no block, so it cannot run out of pool space.
 */
int kv_block_table_fork(kv_block_table *dst, const kv_block_table *src, kv_pool *p,
                        kv_err *err);

/**
 * Pool blocks an append of @p n_new tokens would take: the new blocks, plus one for a
 * copy-on-write of a shared, partly filled last block. The scheduler asks this before it
 * admits or grows a sequence.
 */
int kv_block_table_blocks_needed(const kv_block_table *t, const kv_pool *p, int64_t n_new);

/**
 * Reserve slots for the next @p n_new tokens (positions n_tokens ... n_tokens + n_new - 1),
 * writing them to @p slots [n_new] (may be NULL). Copies-on-write the shared last block when
 * it is partly filled (pair appended to @p copies, which must then be non-NULL), then
 * allocates new blocks as needed.
 * All or nothing: KV_ERR_CAPACITY, with the table and pool untouched, when the pool has
 * fewer than kv_block_table_blocks_needed() available blocks.
 */
int kv_block_table_append(kv_block_table *t, kv_pool *p, int64_t n_new, int64_t *slots,
                          kv_copy_list *copies, kv_err *err);

/**
 * Put an already referenced block at the end of the table holding @p n_tokens_in_block
 * tokens (the prefix cache uses it for hits; the caller's reference moves to the table).
 * KV_ERR_ARG when the current last block is not full.
 */
int kv_block_table_push(kv_block_table *t, int block, int n_tokens_in_block, kv_err *err);

/**
 * Slots reserved but not holding a token: the unused tail of the last block, at most B - 1.
 * Summed over sequences this is paging's internal waste (chapter 05's waste figure).
 */
static inline int64_t kv_block_table_unused_slots(const kv_block_table *t)
{
    return (int64_t)t->n_blocks * t->block_size - t->n_tokens;
}

/** Slot of position @p pos (0 <= pos < n_tokens), or -1 when out of range. */
int64_t kv_block_table_slot(const kv_block_table *t, int64_t pos);

#ifdef __cplusplus
}
#endif
#endif
