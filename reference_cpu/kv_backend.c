/* The CPU backend (kv_backend.h): kv_forward() over a borrowed model and an owned cache. */
#include "kv_backend.h"

#include <stdlib.h>

typedef struct {
    const kv_model *model; /* borrowed */
    kv_cache cache;
    kv_state state;
} cpu_impl;

static int cpu_forward(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                       kv_counters *cnt, kv_err *err)
{
    cpu_impl *p = b->impl;
    int rc = b->paged ? kv_paged_prepare(b, seqs, n_seqs, err) : KV_OK;
    if (rc) return rc;
    rc = kv_forward(p->model, &p->cache, &p->state, seqs, n_seqs, logits, cnt, err);
    if (rc && b->paged) kv_paged_rollback(b, seqs, n_seqs, NULL); /* retryable, smaller */
    else if (b->paged) rc = kv_paged_commit(b, seqs, n_seqs, err);
    return rc;
}

static void cpu_reset(kv_backend *b, int slot)
{
    if (b->paged) kv_paged_release(b, slot, NULL);
    kv_cache_reset(&((cpu_impl *)b->impl)->cache, slot);
}

static int cpu_set_blocks(kv_backend *b, int slot, const int *blocks, int n, kv_err *err)
{
    return kv_cache_set_blocks(&((cpu_impl *)b->impl)->cache, slot, blocks, n, err);
}

static int cpu_copy_blocks(kv_backend *b, const kv_block_copy *pairs, int n, kv_err *err)
{
    return kv_cache_copy_blocks(&((cpu_impl *)b->impl)->cache, pairs, n, err);
}

static int cpu_fork_slot(kv_backend *b, int dst, int src, kv_err *err)
{
    return kv_cache_fork_slot(&((cpu_impl *)b->impl)->cache, dst, src, err);
}

static int cpu_set_length(kv_backend *b, int slot, int len, kv_err *err)
{
    return kv_cache_set_length(&((cpu_impl *)b->impl)->cache, slot, len, err);
}

static size_t cpu_block_bytes(kv_backend *b)
{
    return kv_cache_block_bytes(&((cpu_impl *)b->impl)->cache);
}

static int cpu_read_blocks(kv_backend *b, const kv_block_copy *pairs, int n, uint8_t *host,
                           size_t block_bytes, kv_err *err)
{
    return kv_cache_read_blocks(&((cpu_impl *)b->impl)->cache, pairs, n, host, block_bytes, err);
}

static int cpu_write_blocks(kv_backend *b, const kv_block_copy *pairs, int n,
                            const uint8_t *host, size_t block_bytes, kv_err *err)
{
    return kv_cache_write_blocks(&((cpu_impl *)b->impl)->cache, pairs, n, host, block_bytes,
                                 err);
}

static int cpu_length(kv_backend *b, int slot)
{
    const kv_cache *c = &((cpu_impl *)b->impl)->cache;
    return (slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

static void cpu_destroy(kv_backend *b)
{
    cpu_impl *p = b->impl;
    kv_paged_destroy(b->paged);
    if (p) {
        kv_cache_free(&p->cache);
        kv_state_free(&p->state);
        free(p);
    }
    free(b);
}

int kv_backend_cpu(kv_backend **out, const kv_model *model, const kv_cache_spec *spec,
                   kv_err *err)
{
    if (!out || !model || !spec) return kv_fail(err, KV_ERR_ARG, "kv_backend_cpu: NULL argument");
    *out = NULL;
    kv_backend *b = calloc(1, sizeof *b);
    cpu_impl *p = calloc(1, sizeof *p);
    if (!b || !p) {
        free(b);
        free(p);
        return kv_fail(err, KV_ERR_NOMEM, "kv_backend_cpu: out of memory");
    }
    int rc = kv_cache_create(&p->cache, &model->config, spec, err);
    if (rc) {
        free(b);
        free(p);
        return rc;
    }
    kv_state_init(&p->state);
    p->model = model;
    b->name = "cpu";
    b->config = &model->config;
    b->spec = *spec;
    b->impl = p;
    b->forward = cpu_forward;
    b->reset = cpu_reset;
    b->length = cpu_length;
    b->destroy = cpu_destroy;
    if (spec->layout == KV_LAYOUT_PAGED) {
        b->set_blocks = cpu_set_blocks;
        b->copy_blocks = cpu_copy_blocks;
        b->fork_slot = cpu_fork_slot;
        b->set_length = cpu_set_length;
        b->block_bytes = cpu_block_bytes;
        b->read_blocks = cpu_read_blocks;
        b->write_blocks = cpu_write_blocks; /* host tier memory: kv_calloc (hooks NULL) */
        rc = kv_paged_create(&b->paged, spec, 0, err);
        if (rc) {
            cpu_destroy(b);
            return rc;
        }
    }
    *out = b;
    return KV_OK;
}

kv_cache *kv_backend_cpu_cache(kv_backend *b)
{
    return b && b->forward == cpu_forward ? &((cpu_impl *)b->impl)->cache : NULL;
}

int kv_backend_enable_prefix_cache(kv_backend *b, kv_err *err)
{
    if (!b || !b->paged)
        return kv_fail(err, KV_ERR_ARG, "prefix caching needs a paged cache (--layout paged)");
    if (b->paged->prefix_caching) return KV_OK;
    int rc = kv_prefix_init(&b->paged->prefix, &b->paged->pool, err);
    if (!rc) b->paged->prefix_caching = 1;
    return rc;
}

void kv_backend_destroy(kv_backend *b)
{
    if (b && b->destroy) b->destroy(b);
}
