/**
 * @file kv_backend.h
 * A device-neutral handle on "a model with a cache", so generation loops, the tour and the
 * benchmarks are written once and run on the CPU or the GPU.
 *
 * kv_backend_cpu() wraps kv_forward(); kvcu_backend_create() (cuda/kvcu.h) wraps kvcu_forward();
 * kv_tp_backend() (kv_tp.h) wraps the tensor-parallel ranks. A backend is the engine
 * interface (struct kv_backend) plus, where it has them, the rollback of chapter 10
 * (::kv_rollback) and the cache-memory services of a paged cache (::kv_cache_mem, kv_paged.h).
 */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include "kv_forward.h"
#include "kv_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kv_backend kv_backend;

/**
 * Chapter 10: rolling a slot back after speculative verification (kv_spec.h). A backend
 * that can provides both hooks (kv_backend.rollback); one that cannot has none (NULL), and
 * kv_spec_generate() refuses it.
 */
typedef struct {
    /** Keep the first @p len tokens of @p slot (kv_cache_truncate()); a paged backend also
     * gives the blocks past len back to the pool (refcounts dropped). */
    int (*truncate)(kv_backend *b, int slot, int len, kv_err *err);
    /** Arm @p slot's undo log before a speculative step (kv_cache_speculate()), so truncate
     * can drop up to @p max_tokens of the positions written next on a windowed or KIVI
     * cache; the others copy nothing and return KV_OK. */
    int (*speculate)(kv_backend *b, int slot, int max_tokens, kv_err *err);
} kv_rollback;

/**
 * The engine: a model with a cache, stepped by forward(). Every backend has the four hooks;
 * what only some have is a separate struct behind a pointer, NULL when absent: rollback
 * (chapter 10) and mem, the cache-memory services of a paged cache (chapters 05 and 07:
 * block tables, block copies, host-tier I/O; kv_paged.h).
 */
struct kv_backend {
    const char *name;        /* "cpu", "cpu-tp", "cuda", "cuda-emulation" */
    const kv_config *config; /* the model's config */
    kv_cache_spec spec;      /* the cache it was built with (slots, capacity) */
    void *impl;
    /** One step; see kv_forward(). logits are host memory [n_seqs][vocab]. A paged backend
     * pages around the step itself (kv_paged_prepare / _commit / _rollback). */
    int (*forward)(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                   kv_counters *cnt, kv_err *err);
    /** Forget a slot's cached tokens (a paged backend also releases its blocks). */
    void (*reset)(kv_backend *b, int slot);
    /** Tokens cached in a slot (-1 outside [0, n_slots)). */
    int (*length)(kv_backend *b, int slot);
    /** Release everything the backend owns (not the model it was given). */
    void (*destroy)(kv_backend *b);

    /** Chapter 10: truncate and speculate; NULL: this backend cannot roll a slot back. */
    const kv_rollback *rollback;
    /** Chapters 05 and 07: the paged cache's memory, its pool and tables (mem->paged) and
     * its device services; NULL: a contiguous cache (nothing to page, no block I/O). */
    kv_cache_mem *mem;
};

/**
 * Every backend is made here: *out a zeroed kv_backend with its name, the model's config, the
 * spec it was built with, its own state @p impl and the four hooks of the engine interface,
 * so none is missing by construction; what only some backends have (rollback, mem) its maker
 * adds after. KV_OK, or KV_ERR_NOMEM naming @p name. @p destroy frees the backend too.
 */
int kv_backend_new(kv_backend **out, const char *name, const kv_config *config,
                   const kv_cache_spec *spec, void *impl,
                   int (*forward)(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                                  kv_counters *cnt, kv_err *err),
                   void (*reset)(kv_backend *b, int slot), int (*length)(kv_backend *b, int slot),
                   void (*destroy)(kv_backend *b), kv_err *err);

/**
 * A CPU backend over @p model (borrowed, must outlive the backend) with a cache built
 * from @p spec. *out is allocated; destroy with kv_backend_destroy(). A paged spec gets
 * cache-memory services (b->mem) with a kv_paged (prefix caching off;
 * kv_backend_enable_prefix_cache() turns it on).
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
