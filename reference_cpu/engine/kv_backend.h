/**
 * @file kv_backend.h
 * A device-neutral handle on "a model with a cache", so generation loops, the tour and the
 * benchmarks are written once and run on the CPU or the GPU.
 *
 * kv_backend_cpu() wraps kv_forward(); kvcu_backend_create() (cuda/kvcu.h) wraps kvcu_forward().
 */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include "kv_forward.h"
#include "kv_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_backend kv_backend;
struct kv_backend {
    const char *name;        /* "cpu", "cuda", "cuda-emulation" */
    const kv_config *config; /* the model's config */
    kv_cache_spec spec;      /* the cache it was built with (slots, capacity) */
    void *impl;
    /** One step; see kv_forward(). logits are host memory [n_seqs][vocab]. */
    int (*forward)(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                   kv_counters *cnt, kv_err *err);
    /** Forget a slot's cached tokens. */
    void (*reset)(kv_backend *b, int slot);
    /** Tokens cached in a slot. */
    int (*length)(kv_backend *b, int slot);
    /** Release everything the backend owns (not the model it was given). */
    void (*destroy)(kv_backend *b);

    /* ---- chapter 05: a paged cache (spec.layout KV_LAYOUT_PAGED), else all NULL ---------
     * forward() and reset() page through @c paged themselves (kv_paged.h); these are the
     * device operations kv_paged calls, twins of kv_cache.h's. */
    kv_paged *paged;
    /** kv_cache_set_blocks() on the backend's cache. */
    int (*set_blocks)(kv_backend *b, int slot, const int *blocks, int n, kv_err *err);
    /** kv_cache_copy_blocks(): the step's copy-on-write list, batched. */
    int (*copy_blocks)(kv_backend *b, const kv_block_copy *pairs, int n, kv_err *err);
    /** kv_cache_fork_slot(). */
    int (*fork_slot)(kv_backend *b, int dst, int src, kv_err *err);
    /** kv_cache_set_length(). */
    int (*set_length)(kv_backend *b, int slot, int len, kv_err *err);

    /* ---- chapter 07: block I/O for a host tier (kv_swap.h); paged backends, else NULL ----
     * One batched copy per call; host blocks in kv_cache_block_bytes()'s order on every
     * device, so a host tier written through one backend is readable through another. */
    /** Bytes of one block, every layer, K and V, codes and metadata. */
    size_t (*block_bytes)(kv_backend *b);
    /** Device block pairs[i].src -> host block pairs[i].dst at host + dst * block_bytes. */
    int (*read_blocks)(kv_backend *b, const kv_block_copy *pairs, int n, uint8_t *host,
                       size_t block_bytes, kv_err *err);
    /** Host block pairs[i].src (at host + src * block_bytes) -> device block pairs[i].dst. */
    int (*write_blocks)(kv_backend *b, const kv_block_copy *pairs, int n, const uint8_t *host,
                        size_t block_bytes, kv_err *err);
    /** Host memory for a tier, zeroed (pinned on CUDA, so copies run at full link speed);
     * NULL hooks: kv_calloc / kv_free. host_free must accept NULL. */
    void *(*host_alloc)(kv_backend *b, size_t bytes);
    void (*host_free)(kv_backend *b, void *p);
    /** Asynchronous block I/O (chapter 07, prefetch): start the copy read_blocks /
     * write_blocks would make and return at once with a ticket (> 0) in *ticket; io_wait()
     * returns when that copy and every one started before it are done. Until then the caller
     * must not touch the listed device blocks or host bytes; forward() may run on other
     * blocks meanwhile (CUDA: a copy stream and an event; CPU: a background thread). NULL:
     * no asynchronous copies; callers use the synchronous hooks. */
    int (*read_blocks_async)(kv_backend *b, const kv_block_copy *pairs, int n, uint8_t *host,
                             size_t block_bytes, int64_t *ticket, kv_err *err);
    int (*write_blocks_async)(kv_backend *b, const kv_block_copy *pairs, int n,
                              const uint8_t *host, size_t block_bytes, int64_t *ticket,
                              kv_err *err);
    int (*io_wait)(kv_backend *b, int64_t ticket, kv_err *err);

    /* ---- chapter 10: speculative decoding ------------------------------------------------ */
    /** Keep the first @p len tokens of @p slot (kv_cache_truncate()); a paged backend also
     * gives the blocks past len back to the pool (refcounts dropped). NULL: not supported. */
    int (*truncate)(kv_backend *b, int slot, int len, kv_err *err);
    /** Arm @p slot's undo log before a speculative step (kv_cache_speculate()), so truncate
     * can drop up to @p max_tokens of the positions written next on a windowed or KIVI
     * cache; the others copy nothing. NULL: nothing to arm (truncate alone rolls back). */
    int (*speculate)(kv_backend *b, int slot, int max_tokens, kv_err *err);
};

/**
 * A CPU backend over @p model (borrowed, must outlive the backend) with a cache built
 * from @p spec. *out is allocated; destroy with kv_backend_destroy(). A paged spec gets a
 * kv_paged (prefix caching off; kv_backend_enable_prefix_cache() turns it on).
 */
int kv_backend_cpu(kv_backend **out, const kv_model *model, const kv_cache_spec *spec,
                   kv_err *err);
/** The kv_cache of a backend made by kv_backend_cpu() (NULL for any other backend): for
 * host-side tools and tests that need the cache itself. */
kv_cache *kv_backend_cpu_cache(kv_backend *b);
/** Turn the prefix cache of a paged backend on (KV_ERR_ARG on a contiguous one). */
int kv_backend_enable_prefix_cache(kv_backend *b, kv_err *err);
/** Call b->destroy (NULL is fine). */
void kv_backend_destroy(kv_backend *b);

#ifdef __cplusplus
}
#endif
#endif
