/**
 * @file kv_paged.h
 * Paging on behalf of a ::kv_backend (chapter 05): the block pool, one block table per slot,
 * copy-on-write and the prefix cache, driven from the host for a cache on any device; and
 * ::kv_cache_mem, the cache-memory services a paged backend provides (chapters 05 and 07).
 *
 * A backend built with spec.layout.kind = KV_LAYOUT_PAGED owns a kv_paged inside its kv_cache_mem
 * (kv_backend.mem; a contiguous backend has none: mem is NULL). Its forward() calls
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
#include "kv_seq.h"
#include "kv_pool.h"
#include "kv_prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * The cache-memory services of a paged device cache: what paging (this file) and a host tier
 * (kv_swap.h) need from the device that holds the blocks, beside the host bookkeeping. A
 * backend over a paged cache provides one (kv_backend.mem); a contiguous cache has none, so a
 * caller asks one question (mem NULL or not), never which hooks happen to be set: every hook
 * here is set. The device operations are twins of kv_cache.h's (kvcu_cache_* on CUDA).
 */
typedef struct kv_cache_mem kv_cache_mem;
struct kv_cache_mem {
    void *dev;               /* the device cache the hooks act on (the backend's) */
    const kv_config *config; /* the model's config */
    kv_cache_spec spec;      /* the paged spec the device cache was built with */
    kv_paged *paged;         /* pool, tables, token record, prefix cache (host) */

    /* ---- chapter 05: the device side of the block tables --------------------------------- */
    /** Tokens the device cache holds for @p slot (-1 outside [0, n_slots)). */
    int (*length)(const kv_cache_mem *m, int slot);
    /** Empty the device slot (kv_cache_reset()); the table is kv_paged_release()'s. */
    void (*reset)(kv_cache_mem *m, int slot);
    /** kv_cache_set_blocks(): the slot's table, in logical order. */
    int (*set_blocks)(kv_cache_mem *m, int slot, const int *blocks, int n, kv_err *err);
    /** kv_cache_copy_blocks(): the step's copy-on-write list, batched. */
    int (*copy_blocks)(kv_cache_mem *m, const kv_block_copy *pairs, int n, kv_err *err);
    /** kv_cache_fork_slot(): per-sequence state of @p src into @p dst. */
    int (*fork_slot)(kv_cache_mem *m, int dst, int src, kv_err *err);
    /** kv_cache_set_length(): adopt rows already in the table (prefix hit, swap-in). */
    int (*set_length)(kv_cache_mem *m, int slot, int len, kv_err *err);

    /* ---- chapter 07: block I/O for a host tier (kv_swap.h) -------------------------------
     * One batched copy per call; host blocks in kv_cache_block_bytes()'s order on every
     * device, so a host tier written through one backend is readable through another. */
    /** Bytes of one block, every layer, K and V, codes and metadata. */
    size_t (*block_bytes)(const kv_cache_mem *m);
    /** Device block pairs[i].src -> host block pairs[i].dst at host + dst * block_bytes. */
    int (*read_blocks)(kv_cache_mem *m, const kv_block_copy *pairs, int n, uint8_t *host,
                       size_t block_bytes, kv_err *err);
    /** Host block pairs[i].src (at host + src * block_bytes) -> device block pairs[i].dst. */
    int (*write_blocks)(kv_cache_mem *m, const kv_block_copy *pairs, int n, const uint8_t *host,
                        size_t block_bytes, kv_err *err);
    /** Host memory for a tier, zeroed (pinned on CUDA, so copies run at full link speed;
     * kv_calloc on the CPU); NULL when out of memory. host_free accepts NULL. */
    void *(*host_alloc)(kv_cache_mem *m, size_t bytes);
    void (*host_free)(kv_cache_mem *m, void *p);
    /** Asynchronous block I/O (chapter 07, prefetch): start the copy read_blocks /
     * write_blocks would make and return at once with a ticket (> 0) in *ticket; io_wait()
     * returns when that copy and every one started before it are done. Until then the caller
     * must not touch the listed device blocks or host bytes; forward() may run on other
     * blocks meanwhile (CUDA: a copy stream and an event; CPU: a background thread). */
    int (*read_blocks_async)(kv_cache_mem *m, const kv_block_copy *pairs, int n, uint8_t *host,
                             size_t block_bytes, int64_t *ticket, kv_err *err);
    int (*write_blocks_async)(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                              const uint8_t *host, size_t block_bytes, int64_t *ticket,
                              kv_err *err);
    int (*io_wait)(kv_cache_mem *m, int64_t ticket, kv_err *err);
};

/**
 * Pool and tables for a paged @p spec (spec->layout.n_blocks blocks of spec->layout.block_size tokens,
 * spec->n_slots tables); @p prefix_caching 1 turns the prefix cache on. KV_ERR_ARG for a
 * contiguous spec, KV_ERR_NOMEM.
 */
int kv_paged_create(kv_paged **out, const kv_cache_spec *spec, int prefix_caching, kv_err *err);
/** Free everything (NULL is fine); the device cache is the backend's. */
void kv_paged_destroy(kv_paged *pg);

/**
 * Before a step: for every sequence, check pos equals what its table holds, reserve slots for
 * its new tokens (allocating blocks, copying shared last blocks on write), perform the
 * step's copies on the device (m->copy_blocks) and hand each changed table to the device
 * (m->set_blocks). All or nothing over the batch: KV_ERR_CAPACITY, with no table changed,
 * when the pool cannot supply the blocks the whole step needs.
 */
int kv_paged_prepare(kv_cache_mem *m, const kv_seq *seqs, int n_seqs, kv_err *err);

/**
 * After a failed step (the device ran out of memory, or a copy failed): give back what
 * kv_paged_prepare() reserved for @p seqs, so every table again holds exactly what its slot
 * caches and the step can be retried, smaller. Safe on a partly prepared batch.
 */
int kv_paged_rollback(kv_cache_mem *m, const kv_seq *seqs, int n_seqs, kv_err *err);

/**
 * Chapter 10, a backend's truncate() on a paged cache, in two halves around the device cache's
 * own truncate (whose length must drop first: set_blocks refuses a table that no longer covers
 * the cached tokens). kv_paged_truncate_check(): KV_ERR_UNSUPPORTED when @p len cuts into a
 * block the prefix cache registered (nothing changed). kv_paged_truncate(): give the blocks
 * past @p len back to the pool and hand the shorter table to the device (m->set_blocks).
 */
int kv_paged_truncate_check(const kv_cache_mem *m, int slot, int len, kv_err *err);
int kv_paged_truncate(kv_cache_mem *m, int slot, int len, kv_err *err);

/** After a successful step: register the blocks that became full in the prefix cache. */
int kv_paged_commit(kv_cache_mem *m, const kv_seq *seqs, int n_seqs, kv_err *err);

/** Blocks a step that appends @p n_new tokens to @p slot would take from the pool. */
int kv_paged_blocks_needed(const kv_cache_mem *m, int slot, int64_t n_new);
/** Blocks the pool can still hand out (FREE plus evictable CACHED). */
int kv_paged_available(const kv_cache_mem *m);

/**
 * Fork: the empty slot @p dst shares every block of @p src (no K/V bytes move) and takes its
 * per-sequence state (m->fork_slot). Cannot run out of pool space.
 */
int kv_paged_fork(kv_cache_mem *m, int dst, int src, kv_err *err);

/** Release @p slot's blocks and empty the device slot (m->reset): the backend's reset() on a
 * paged cache, and a swap's release of the slot it paused. */
int kv_paged_release(kv_cache_mem *m, int slot, kv_err *err);

/**
 * Admission of a prompt into the empty @p slot: adopt the longest verified cached prefix of
 * @p tokens [n] (kv_prefix_match) and set the slot's length to the tokens it covers, so the
 * caller prefills only the rest. *n_hit = 0 when prefix caching is off. KV_ERR_UNSUPPORTED
 * from a format whose rows cannot be adopted (fp8, KIVI: kv_cache_set_length()).
 */
int kv_paged_match_prefix(kv_cache_mem *m, int slot, const int *tokens, int n, int *n_hit,
                          kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
