/* The CPU backend (kv_backend.h): kv_forward() over a borrowed model and an owned cache; for
 * a paged cache, its cache-memory services (kv_paged.h's kv_cache_mem), with a background
 * thread for the asynchronous block I/O of a host tier (chapter 07). */
#include "kv_backend.h"
#include "kv_retain.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One copy between the cache and a host tier, waiting for the I/O thread. */
typedef struct io_job {
    int to_host;          /* 1: read_blocks (device -> host), 0: write_blocks */
    kv_block_copy *pairs; /* [n] owned copy of the caller's list */
    int n;
    uint8_t *host;        /* the tier's memory, [*][block_bytes] */
    size_t block_bytes;
    int64_t ticket;
    struct io_job *next;
} io_job;

/* The I/O thread: a FIFO of jobs done in order, so "ticket t is done" means every job up to t
 * is. Started with the first asynchronous copy, joined in destroy. */
typedef struct {
    pthread_t thread;
    int started, stop;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* a job was queued, or stop */
    pthread_cond_t done;  /* a job finished */
    io_job *head, *tail;  /* FIFO of jobs not started yet */
    int64_t issued;       /* last ticket handed out */
    int64_t finished;     /* every ticket <= finished is done */
    int failed;           /* first failure since the last io_wait (KV_OK: none) */
    kv_err fail_err;
} cpu_io;

typedef struct {
    const kv_model *model; /* borrowed */
    kv_cache cache;
    kv_state state;
    kv_cache_mem mem;      /* paged: the services below (b->mem points here) */
    cpu_io io;
} cpu_impl;

/* ---- the engine ------------------------------------------------------------------------------ */

static int cpu_forward(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                       kv_counters *cnt, kv_err *err)
{
    cpu_impl *p = b->impl;
    int rc = b->mem ? kv_paged_prepare(b->mem, seqs, n_seqs, err) : KV_OK;
    if (rc) return rc;
    rc = kv_forward(p->model, &p->cache, &p->state, seqs, n_seqs, logits, cnt, err);
    if (rc && b->mem) kv_paged_rollback(b->mem, seqs, n_seqs, NULL); /* retryable, smaller */
    else if (b->mem) rc = kv_paged_commit(b->mem, seqs, n_seqs, err);
    return rc;
}

static void cpu_reset(kv_backend *b, int slot)
{
    kv_cache *c = &((cpu_impl *)b->impl)->cache;
    if (b->mem) kv_paged_release(b->mem, slot, NULL); /* the table, then the cache's slot */
    else kv_cache_reset(c, slot);
    kv_retain_reset_slot(c->retain, slot); /* chapter 09's state, composed with the cache */
}

static int cache_length(const kv_cache *c, int slot)
{
    return (slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

static int cpu_length(kv_backend *b, int slot)
{
    return cache_length(&((cpu_impl *)b->impl)->cache, slot);
}

/* Rollback after speculative verification: the cache's length first, then the table
 * (kv_paged_truncate_check / kv_paged_truncate, shared with the CUDA backend). */
static int cpu_truncate(kv_backend *b, int slot, int len, kv_err *err)
{
    int rc = b->mem ? kv_paged_truncate_check(b->mem, slot, len, err) : KV_OK;
    if (!rc) rc = kv_cache_truncate(&((cpu_impl *)b->impl)->cache, slot, len, err);
    if (rc || !b->mem) return rc;
    return kv_paged_truncate(b->mem, slot, len, err);
}

static int cpu_speculate(kv_backend *b, int slot, int max_tokens, kv_err *err)
{
    return kv_cache_speculate(&((cpu_impl *)b->impl)->cache, slot, max_tokens, err);
}

static const kv_rollback cpu_rollback = {cpu_truncate, cpu_speculate};

/* ---- the cache-memory services of a paged cache (kv_cache_mem) ------------------------------ */

static kv_cache *mem_cache(const kv_cache_mem *m) { return &((cpu_impl *)m->dev)->cache; }

static int mem_length(const kv_cache_mem *m, int slot) { return cache_length(mem_cache(m), slot); }

static void mem_reset(kv_cache_mem *m, int slot) { kv_cache_reset(mem_cache(m), slot); }

static int mem_set_blocks(kv_cache_mem *m, int slot, const int *blocks, int n, kv_err *err)
{
    return kv_cache_set_blocks(mem_cache(m), slot, blocks, n, err);
}

static int mem_copy_blocks(kv_cache_mem *m, const kv_block_copy *pairs, int n, kv_err *err)
{
    return kv_cache_copy_blocks(mem_cache(m), pairs, n, err);
}

static int mem_fork_slot(kv_cache_mem *m, int dst, int src, kv_err *err)
{
    return kv_cache_fork_slot(mem_cache(m), dst, src, err);
}

static int mem_set_length(kv_cache_mem *m, int slot, int len, kv_err *err)
{
    return kv_cache_set_length(mem_cache(m), slot, len, err);
}

static size_t mem_block_bytes(const kv_cache_mem *m) { return kv_cache_block_bytes(mem_cache(m)); }

static int mem_read_blocks(kv_cache_mem *m, const kv_block_copy *pairs, int n, uint8_t *host,
                           size_t block_bytes, kv_err *err)
{
    return kv_cache_read_blocks(mem_cache(m), pairs, n, host, block_bytes, err);
}

static int mem_write_blocks(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                            const uint8_t *host, size_t block_bytes, kv_err *err)
{
    return kv_cache_write_blocks(mem_cache(m), pairs, n, host, block_bytes, err);
}

/* A host tier on the CPU is plain memory: there is no link to pin it for. */
static void *mem_host_alloc(kv_cache_mem *m, size_t bytes)
{
    (void)m;
    return kv_calloc(bytes);
}

static void mem_host_free(kv_cache_mem *m, void *p)
{
    (void)m;
    kv_free(p);
}

/* ---- asynchronous block I/O ------------------------------------------------------------------
 * Why the thread may copy while forward() runs: a prefetch writes only into pool blocks that
 * are in no block table (kv_swap_prefetch() takes them fresh from the pool, and kv_swap_in()
 * waits for the ticket before it puts them in a table), and an eviction reads blocks of a
 * paused sequence, which is in no table either. forward() reads and writes only blocks its
 * tables map, and the cache fields the copy reads (plane pointers, row bytes, formats) never
 * change after creation, so the two touch disjoint bytes. The pool and tables are bookkeeping
 * of the calling thread only: the I/O thread never sees them. */

static void *io_main(void *arg)
{
    cpu_impl *p = arg;
    cpu_io *io = &p->io;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        while (!io->head && !io->stop) pthread_cond_wait(&io->work, &io->mu);
        if (!io->head) break; /* stop, and nothing left to do */
        io_job *j = io->head;
        io->head = j->next;
        if (!io->head) io->tail = NULL;
        pthread_mutex_unlock(&io->mu);
        kv_err e;
        const int rc = j->to_host
            ? kv_cache_read_blocks(&p->cache, j->pairs, j->n, j->host, j->block_bytes, &e)
            : kv_cache_write_blocks(&p->cache, j->pairs, j->n, j->host, j->block_bytes, &e);
        pthread_mutex_lock(&io->mu);
        if (rc && !io->failed) {
            io->failed = rc;
            io->fail_err = e;
        }
        io->finished = j->ticket;
        pthread_cond_broadcast(&io->done);
        free(j->pairs);
        free(j);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* Queue one copy for the I/O thread (started on first use); *ticket = its ticket. */
static int io_submit(cpu_impl *p, int to_host, const kv_block_copy *pairs, int n,
                     uint8_t *host, size_t block_bytes, int64_t *ticket, kv_err *err)
{
    cpu_io *io = &p->io;
    /* the checks now, so a bad list fails the call, not a later io_wait */
    int rc = to_host ? kv_cache_read_blocks(&p->cache, pairs, 0, host, block_bytes, err)
                     : kv_cache_write_blocks(&p->cache, pairs, 0, host, block_bytes, err);
    if (rc) return rc;
    if (n < 0 || (n > 0 && (!pairs || !host)))
        return kv_fail(err, KV_ERR_ARG, "block I/O: %d pairs", n);
    for (int i = 0; i < n; i++) {
        const int dev = to_host ? pairs[i].src : pairs[i].dst;
        const int hb = to_host ? pairs[i].dst : pairs[i].src;
        if (dev < 0 || dev >= p->cache.spec.layout.n_blocks || hb < 0)
            return kv_fail(err, KV_ERR_ARG, "block I/O: pair %d (%d -> %d) outside the pool "
                           "[0, %d) or a negative host block", i, pairs[i].src, pairs[i].dst,
                           p->cache.spec.layout.n_blocks);
    }
    io_job *j = calloc(1, sizeof *j);
    kv_block_copy *copy = malloc((size_t)(n > 0 ? n : 1) * sizeof *copy); /* [n] */
    if (!j || !copy) {
        free(j);
        free(copy);
        return kv_fail(err, KV_ERR_NOMEM, "block I/O: out of memory");
    }
    if (n) memcpy(copy, pairs, (size_t)n * sizeof *copy);
    *j = (io_job){to_host, copy, n, host, block_bytes, 0, NULL};
    pthread_mutex_lock(&io->mu);
    if (!io->started) {
        if (pthread_create(&io->thread, NULL, io_main, p) != 0) {
            pthread_mutex_unlock(&io->mu);
            free(copy);
            free(j);
            return kv_fail(err, KV_ERR_NOMEM, "block I/O: cannot start the I/O thread");
        }
        io->started = 1;
    }
    j->ticket = *ticket = ++io->issued;
    if (io->tail) io->tail->next = j;
    else io->head = j;
    io->tail = j;
    pthread_cond_signal(&io->work);
    pthread_mutex_unlock(&io->mu);
    return KV_OK;
}

static int mem_read_blocks_async(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                                 uint8_t *host, size_t block_bytes, int64_t *ticket,
                                 kv_err *err)
{
    return io_submit(m->dev, 1, pairs, n, host, block_bytes, ticket, err);
}

static int mem_write_blocks_async(kv_cache_mem *m, const kv_block_copy *pairs, int n,
                                  const uint8_t *host, size_t block_bytes, int64_t *ticket,
                                  kv_err *err)
{
    /* the thread only reads host: the cast drops a const the job struct does not carry */
    return io_submit(m->dev, 0, pairs, n, (uint8_t *)host, block_bytes, ticket, err);
}

/* Wait until ticket (and every earlier one) is done; report a copy that failed meanwhile. */
static int mem_io_wait(kv_cache_mem *m, int64_t ticket, kv_err *err)
{
    cpu_io *io = &((cpu_impl *)m->dev)->io;
    pthread_mutex_lock(&io->mu);
    if (ticket > io->issued) {
        pthread_mutex_unlock(&io->mu);
        return kv_fail(err, KV_ERR_ARG, "io_wait: ticket %lld was never issued (last %lld)",
                       (long long)ticket, (long long)io->issued);
    }
    while (io->finished < ticket) pthread_cond_wait(&io->done, &io->mu);
    const int rc = io->failed;
    if (rc && err) *err = io->fail_err;
    io->failed = KV_OK;
    pthread_mutex_unlock(&io->mu);
    return rc;
}

/* Finish the queued copies and join the thread. */
static void io_shutdown(cpu_io *io)
{
    pthread_mutex_lock(&io->mu);
    io->stop = 1;
    pthread_cond_signal(&io->work);
    const int started = io->started;
    pthread_mutex_unlock(&io->mu);
    if (started) pthread_join(io->thread, NULL);
    pthread_cond_destroy(&io->work);
    pthread_cond_destroy(&io->done);
    pthread_mutex_destroy(&io->mu);
}

/* ---- creation -------------------------------------------------------------------------------- */

int kv_backend_new(kv_backend **out, const char *name, const kv_config *config,
                   const kv_cache_spec *spec, void *impl,
                   int (*forward)(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                                  kv_counters *cnt, kv_err *err),
                   void (*reset)(kv_backend *b, int slot), int (*length)(kv_backend *b, int slot),
                   void (*destroy)(kv_backend *b), kv_err *err)
{
    kv_backend *b = calloc(1, sizeof *b);
    *out = b;
    if (!b) return kv_fail(err, KV_ERR_NOMEM, "%s backend: out of memory", name);
    *b = (kv_backend){.name = name, .config = config, .spec = *spec, .impl = impl,
                      .forward = forward, .reset = reset, .length = length, .destroy = destroy};
    return KV_OK;
}

static void cpu_destroy(kv_backend *b)
{
    cpu_impl *p = b->impl;
    if (p) {
        kv_paged_destroy(p->mem.paged);
        if (b->mem) io_shutdown(&p->io); /* before the cache it copies into goes */
        kv_retain_cache_free(&p->cache);
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
    cpu_impl *p = calloc(1, sizeof *p);
    if (!p) return kv_fail(err, KV_ERR_NOMEM, "kv_backend_cpu: out of memory");
    /* the cache the model's attention block reads (with chapter 09's retention state, when
     * the spec asks) */
    int rc = kv_forward_cache_create(&p->cache, &model->config, spec, err);
    if (rc) {
        free(p);
        return rc;
    }
    kv_state_init(&p->state);
    p->model = model;
    kv_backend *b = NULL;
    rc = kv_backend_new(&b, "cpu", &model->config, spec, p, cpu_forward, cpu_reset, cpu_length,
                        cpu_destroy, err);
    if (rc) {
        kv_retain_cache_free(&p->cache);
        free(p);
        return rc;
    }
    b->rollback = &cpu_rollback;
    if (spec->layout.kind == KV_LAYOUT_PAGED) {
        p->mem = (kv_cache_mem){
            .dev = p, .config = &model->config, .spec = *spec,
            .length = mem_length, .reset = mem_reset, .set_blocks = mem_set_blocks,
            .copy_blocks = mem_copy_blocks, .fork_slot = mem_fork_slot,
            .set_length = mem_set_length, .block_bytes = mem_block_bytes,
            .read_blocks = mem_read_blocks, .write_blocks = mem_write_blocks,
            .host_alloc = mem_host_alloc, .host_free = mem_host_free,
            .read_blocks_async = mem_read_blocks_async,
            .write_blocks_async = mem_write_blocks_async, .io_wait = mem_io_wait};
        pthread_mutex_init(&p->io.mu, NULL);
        pthread_cond_init(&p->io.work, NULL);
        pthread_cond_init(&p->io.done, NULL);
        b->mem = &p->mem;
        rc = kv_paged_create(&p->mem.paged, spec, 0, err);
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
    if (!b || !b->mem)
        return kv_fail(err, KV_ERR_ARG, "prefix caching needs a paged cache (--layout paged)");
    kv_paged *pg = b->mem->paged;
    if (pg->prefix_caching) return KV_OK;
    int rc = kv_prefix_init(&pg->prefix, &pg->pool, err);
    if (!rc) pg->prefix_caching = 1;
    return rc;
}

void kv_backend_destroy(kv_backend *b)
{
    if (b && b->destroy) b->destroy(b);
}
