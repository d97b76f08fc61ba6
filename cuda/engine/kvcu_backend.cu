/*
 * The CUDA backend (kv_backend.h), the twin of reference_cpu/engine/kv_backend.c:
 * kvcu_forward() over an uploaded model and a device cache. On a paged spec it pages exactly
 * as the CPU backend does (kv_paged.h on the host: prepare before the step, commit after,
 * release on reset) through its cache-memory services (kv_cache_mem): the device cache's
 * set_blocks / copy_blocks / fork_slot / set_length underneath, and (chapter 07) block I/O to
 * a host tier in pinned memory (kv_swap.h), asynchronous on a copy stream.
 */
#include <stdlib.h>

#include "kv_retain.h"
#include "kvcu_internal.cuh"

typedef struct {
    kvcu_model *model; /* owned: uploaded at creation */
    kv_config config;  /* the model's config: the host model may go after creation */
    kvcu_cache *cache;
    kvcu_state *state;
    kv_cache_mem mem;  /* paged: the services below (b->mem points here) */
    kvcu_io *io;       /* paged: the copy stream of asynchronous block I/O */
} cuda_impl;

/* ---- the engine --------------------------------------------------------------------------- */

/* A paged backend pages on the host (kv_paged.h) around the device step, as the CPU's does. */
static int cuda_forward(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                        kv_counters *cnt, kv_err *err)
{
    cuda_impl *p = (cuda_impl *)b->impl;
    int rc = b->mem ? kv_paged_prepare(b->mem, seqs, n_seqs, err) : KV_OK;
    if (rc) return rc;
    rc = kvcu_forward(p->model, p->cache, p->state, seqs, n_seqs, logits, cnt, err);
    if (rc && b->mem) kv_paged_rollback(b->mem, seqs, n_seqs, NULL); /* retryable, smaller */
    else if (b->mem) rc = kv_paged_commit(b->mem, seqs, n_seqs, err);
    return rc;
}

static void cuda_reset(kv_backend *b, int slot)
{
    kvcu_cache *c = ((cuda_impl *)b->impl)->cache;
    if (b->mem) kv_paged_release(b->mem, slot, NULL); /* the table, then the cache's slot */
    else kvcu_cache_reset(c, slot);
    kv_retain_reset_slot(kvcu_cache_retain(c), slot); /* chapter 09's state, beside the cache */
}

static int cuda_length(kv_backend *b, int slot)
{
    return kvcu_cache_length(((cuda_impl *)b->impl)->cache, slot);
}

/* Rollback after speculative verification, as the CPU backend's: the device cache's length
 * first, then (paged) the table, the blocks past len back to the pool (kv_paged.h). */
static int cuda_truncate(kv_backend *b, int slot, int len, kv_err *err)
{
    int rc = b->mem ? kv_paged_truncate_check(b->mem, slot, len, err) : KV_OK;
    if (!rc) rc = kvcu_cache_truncate(((cuda_impl *)b->impl)->cache, slot, len, err);
    if (rc || !b->mem) return rc;
    return kv_paged_truncate(b->mem, slot, len, err);
}

static int cuda_speculate(kv_backend *b, int slot, int max_tokens, kv_err *err)
{
    return kvcu_cache_speculate(((cuda_impl *)b->impl)->cache, slot, max_tokens, err);
}

static const kv_rollback cuda_rollback = {cuda_truncate, cuda_speculate};

/* ---- the cache-memory services of a paged cache (kv_cache_mem) ---------------------------- */

static cuda_impl *mem_impl(const kv_cache_mem *m) { return (cuda_impl *)m->dev; }

static int mem_length(const kv_cache_mem *m, int slot)
{
    return kvcu_cache_length(mem_impl(m)->cache, slot);
}

static void mem_reset(kv_cache_mem *m, int slot) { kvcu_cache_reset(mem_impl(m)->cache, slot); }

static int mem_set_blocks(kv_cache_mem *m, int slot, const int *blocks, int n, kv_err *err)
{
    return kvcu_cache_set_blocks(mem_impl(m)->cache, slot, blocks, n, err);
}

static int mem_copy_blocks(kv_cache_mem *m, const kv_block_copy *pairs, int n, kv_err *err)
{
    return kvcu_cache_copy_blocks(mem_impl(m)->cache, pairs, n, err);
}

static int mem_fork_slot(kv_cache_mem *m, int dst, int src, kv_err *err)
{
    return kvcu_cache_fork_slot(mem_impl(m)->cache, dst, src, err);
}

static int mem_set_length(kv_cache_mem *m, int slot, int len, kv_err *err)
{
    return kvcu_cache_set_length(mem_impl(m)->cache, slot, len, err);
}

static size_t mem_block_bytes(const kv_cache_mem *m)
{
    return kvcu_cache_block_bytes(mem_impl(m)->cache);
}

static int mem_read_blocks(kv_cache_mem *m, const kv_block_copy *pairs, int n, uint8_t *host,
                           size_t block_bytes, kv_err *err)
{
    return kvcu_cache_read_blocks(mem_impl(m)->cache, pairs, n, host, block_bytes, err);
}

static int mem_write_blocks(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                            const uint8_t *host, size_t block_bytes, kv_err *err)
{
    return kvcu_cache_write_blocks(mem_impl(m)->cache, pairs, n, host, block_bytes, err);
}

/* The host tier in pinned memory: the DMA engine reads it without a bounce buffer. */
static void *mem_host_alloc(kv_cache_mem *m, size_t bytes)
{
    (void)m;
    void *p = NULL;
    kv_err e;
    return kvcu_host_alloc(&p, bytes, &e) == KV_OK ? p : NULL;
}

static void mem_host_free(kv_cache_mem *m, void *p)
{
    (void)m;
    kvcu_host_free(p);
}

/* Asynchronous block I/O on the copy stream (kvcu_cache_paged.cu says why the default stream
 * never reads the blocks of a copy in flight: they are in no table until io_wait). */
static int mem_read_blocks_async(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                                 uint8_t *host, size_t block_bytes, int64_t *ticket,
                                 kv_err *err)
{
    cuda_impl *p = mem_impl(m);
    return kvcu_cache_read_blocks_async(p->cache, p->io, pairs, n, host, block_bytes, ticket,
                                        err);
}

static int mem_write_blocks_async(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                                  const uint8_t *host, size_t block_bytes, int64_t *ticket,
                                  kv_err *err)
{
    cuda_impl *p = mem_impl(m);
    return kvcu_cache_write_blocks_async(p->cache, p->io, pairs, n, host, block_bytes, ticket,
                                         err);
}

static int mem_io_wait(kv_cache_mem *m, int64_t ticket, kv_err *err)
{
    return kvcu_io_wait(mem_impl(m)->io, ticket, err);
}

/* ---- creation ----------------------------------------------------------------------------- */

static void cuda_destroy(kv_backend *b)
{
    cuda_impl *p = (cuda_impl *)b->impl;
    if (p) {
        kv_paged_destroy(p->mem.paged);
        kvcu_io_free(p->io); /* waits for copies in flight into the cache */
        kvcu_state_free(p->state);
        kvcu_retain_cache_free(p->cache);
        kvcu_model_free(p->model);
        free(p);
    }
    free(b);
}

/** A ::kv_backend running kvcu_forward(); uploads @p model (the host copy may then go). */
int kvcu_backend_create(kv_backend **out, const kv_model *model, const kv_cache_spec *spec,
                        kv_err *err)
{
    return kvcu_backend_create_opts(out, model, spec, NULL, err);
}

/** The same with the engine's weights and prefill chosen (kvcu.h). */
int kvcu_backend_create_opts(kv_backend **out, const kv_model *model, const kv_cache_spec *spec,
                             const kvcu_engine_opts *o, kv_err *err)
{
    if (!out || !model || !spec)
        return kv_fail(err, KV_ERR_ARG, "kvcu_backend_create: NULL argument");
    const kvcu_engine_opts none = {KV_QF_F32, 0};
    if (!o) o = &none;
    *out = NULL;
    int rc = kvcu_device_available(err);
    if (rc) return rc;
    cuda_impl *p = (cuda_impl *)calloc(1, sizeof *p);
    if (!p) return kv_fail(err, KV_ERR_NOMEM, "kvcu_backend_create: out of memory");
    p->config = model->config; /* the backend's config is this copy: the host model may go */
    kv_backend *b = NULL;
    rc = kv_backend_new(&b, kvcu_is_emulation() ? "cuda-emulation" : "cuda", &p->config, spec, p,
                        cuda_forward, cuda_reset, cuda_length, cuda_destroy, err);
    if (rc) {
        free(p);
        return rc;
    }
    if ((rc = kvcu_model_upload(&p->model, model, err)) ||
        (rc = kvcu_retain_cache_create(&p->cache, &model->config, spec, err)) ||
        (rc = kvcu_state_create(&p->state, err)) ||
        (rc = kvcu_model_set_weights(p->model, o->weights, err)) ||
        (rc = kvcu_state_set_prefill(p->state, o->prefill, err))) {
        cuda_destroy(b);
        return rc;
    }
    b->rollback = &cuda_rollback;
    if (spec->layout.kind == KV_LAYOUT_PAGED) { /* the host pages, the device moves the bytes */
        kv_cache_mem *m = &p->mem;
        m->dev = p;
        m->config = b->config;
        m->spec = *spec;
        m->length = mem_length;
        m->reset = mem_reset;
        m->set_blocks = mem_set_blocks;
        m->copy_blocks = mem_copy_blocks;
        m->fork_slot = mem_fork_slot;
        m->set_length = mem_set_length;
        m->block_bytes = mem_block_bytes;
        m->read_blocks = mem_read_blocks;
        m->write_blocks = mem_write_blocks;
        m->host_alloc = mem_host_alloc;
        m->host_free = mem_host_free;
        m->read_blocks_async = mem_read_blocks_async;
        m->write_blocks_async = mem_write_blocks_async;
        m->io_wait = mem_io_wait;
        b->mem = m;
        rc = kvcu_io_create(&p->io, err);
        if (!rc) rc = kv_paged_create(&m->paged, spec, 0, err);
        if (rc) {
            cuda_destroy(b);
            return rc;
        }
    }
    *out = b;
    return KV_OK;
}
