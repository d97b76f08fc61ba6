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
    return kv_forward(p->model, &p->cache, &p->state, seqs, n_seqs, logits, cnt, err);
}

static void cpu_reset(kv_backend *b, int slot)
{
    kv_cache_reset(&((cpu_impl *)b->impl)->cache, slot);
}

static int cpu_length(kv_backend *b, int slot)
{
    const kv_cache *c = &((cpu_impl *)b->impl)->cache;
    return (slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

static void cpu_destroy(kv_backend *b)
{
    cpu_impl *p = b->impl;
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
    *out = b;
    return KV_OK;
}

void kv_backend_destroy(kv_backend *b)
{
    if (b && b->destroy) b->destroy(b);
}
