/**
 * @file kv_paged.h
 * Paging on behalf of a ::kv_backend (chapter 05): the block pool, one block table per slot,
 * copy-on-write and the prefix cache, driven from the host for a cache on any device.
 *
 * A backend built with spec.layout = KV_LAYOUT_PAGED owns a kv_paged. Its forward() calls
 * kv_paged_prepare() before the step runs, so every generation loop written for a contiguous
 * cache (the tour, the needle and dialogue suites, kvlab generate) runs unchanged on a paged
 * one: each sequence's table grows by the blocks its new tokens need, shared last blocks are
 * copied first (one batched copy for the whole step, on the device that holds the cache), and
 * the device cache is told each slot's table. reset() releases the slot's blocks. On top of
 * that, the scheduler (kv_sched.h) uses the calls below directly: how many blocks a step
 * needs, fork for parallel samples and beams, a prefix-cache lookup at admission.
 *
 * The host keeps the tokens each slot has written, because the prefix cache keys full blocks
 * by their tokens (kv_prefix.h).
 */
#ifndef KV_PAGED_H
#define KV_PAGED_H

#include "kv_block_table.h"
#include "kv_forward.h"
#include "kv_pool.h"
#include "kv_prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_backend kv_backend;

typedef struct {
    kv_pool pool;
    kv_prefix prefix;        /* used when prefix_caching is 1 */
    int prefix_caching;
    int n_slots;
    kv_block_table *tables;  /* [n_slots] */
    int **tokens;            /* [n_slots][tok_cap[slot]] tokens each slot has written */
    int64_t *tok_cap;        /* [n_slots] */
    kv_copy_list copies;     /* the current step's copy-on-write pairs */
    int64_t n_cow;           /**< blocks copied on write so far */
    int64_t peak_used;       /**< most blocks USED at once */
} kv_paged;

/**
 * Pool and tables for a paged @p spec (spec->n_blocks blocks of spec->block_size tokens,
 * spec->n_slots tables); @p prefix_caching 1 turns the prefix cache on. KV_ERR_ARG for a
 * contiguous spec, KV_ERR_NOMEM.
 */
int kv_paged_create(kv_paged **out, const kv_cache_spec *spec, int prefix_caching, kv_err *err);
/** Free everything (NULL is fine); the device cache is the backend's. */
void kv_paged_destroy(kv_paged *pg);

/**
 * Before a step: for every sequence, check pos equals what its table holds, reserve slots for
 * its new tokens (allocating blocks, copying shared last blocks on write), perform the
 * step's copies on the device (b->copy_blocks) and hand each changed table to the device
 * (b->set_blocks). All or nothing over the batch: KV_ERR_CAPACITY, with no table changed,
 * when the pool cannot supply the blocks the whole step needs.
 */
int kv_paged_prepare(kv_backend *b, const kv_seq *seqs, int n_seqs, kv_err *err);

/**
 * After a failed step (the device ran out of memory, or a copy failed): give back what
 * kv_paged_prepare() reserved for @p seqs, so every table again holds exactly what its slot
 * caches and the step can be retried, smaller. Safe on a partly prepared batch.
 */
int kv_paged_rollback(kv_backend *b, const kv_seq *seqs, int n_seqs, kv_err *err);

/**
 * Chapter 10, a backend's truncate() on a paged cache, in two halves around the device cache's
 * own truncate (whose length must drop first: set_blocks refuses a table that no longer covers
 * the cached tokens). kv_paged_truncate_check(): KV_ERR_UNSUPPORTED when @p len cuts into a
 * block the prefix cache registered (nothing changed). kv_paged_truncate(): give the blocks
 * past @p len back to the pool and hand the shorter table to the device (b->set_blocks).
 */
int kv_paged_truncate_check(const kv_backend *b, int slot, int len, kv_err *err);
int kv_paged_truncate(kv_backend *b, int slot, int len, kv_err *err);

/** After a successful step: register the blocks that became full in the prefix cache. */
int kv_paged_commit(kv_backend *b, const kv_seq *seqs, int n_seqs, kv_err *err);

/** Blocks a step that appends @p n_new tokens to @p slot would take from the pool. */
int kv_paged_blocks_needed(const kv_backend *b, int slot, int64_t n_new);
/** Blocks the pool can still hand out (FREE plus evictable CACHED). */
int kv_paged_available(const kv_backend *b);

/**
 * Fork: the empty slot @p dst shares every block of @p src (no K/V bytes move) and takes its
 * per-sequence state (b->fork_slot). Cannot run out of pool space.
 */
int kv_paged_fork(kv_backend *b, int dst, int src, kv_err *err);

/** Release @p slot's blocks (the backend's reset() calls this). */
int kv_paged_release(kv_backend *b, int slot, kv_err *err);

/**
 * Admission of a prompt into the empty @p slot: adopt the longest verified cached prefix of
 * @p tokens [n] (kv_prefix_match) and set the slot's length to the tokens it covers, so the
 * caller prefills only the rest. *n_hit = 0 when prefix caching is off. KV_ERR_UNSUPPORTED
 * from a format whose rows cannot be adopted (fp8, KIVI: kv_cache_set_length()).
 */
int kv_paged_match_prefix(kv_backend *b, int slot, const int *tokens, int n, int *n_hit,
                          kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
