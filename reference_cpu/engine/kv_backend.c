/* The CPU backend (kv_backend.h): kv_forward() over a borrowed model and an owned cache, and
 * a background thread for the asynchronous block I/O of a host tier (chapter 07). */
#include "kv_backend.h"

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
    cpu_io io;
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

/* Rollback after speculative verification: the cache's length first, then the table
 * (kv_paged_truncate_check / kv_paged_truncate, shared with the CUDA backend). */
static int cpu_truncate(kv_backend *b, int slot, int len, kv_err *err)
{
    int rc = b->paged ? kv_paged_truncate_check(b, slot, len, err) : KV_OK;
    if (!rc) rc = kv_cache_truncate(&((cpu_impl *)b->impl)->cache, slot, len, err);
    if (rc || !b->paged) return rc;
    return kv_paged_truncate(b, slot, len, err);
}

static int cpu_speculate(kv_backend *b, int slot, int max_tokens, kv_err *err)
{
    return kv_cache_speculate(&((cpu_impl *)b->impl)->cache, slot, max_tokens, err);
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
    kv_backend *b = arg;
    cpu_impl *p = b->impl;
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
static int io_submit(kv_backend *b, int to_host, const kv_block_copy *pairs, int n,
                     uint8_t *host, size_t block_bytes, int64_t *ticket, kv_err *err)
{
    cpu_impl *p = b->impl;
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
        if (dev < 0 || dev >= p->cache.spec.n_blocks || hb < 0)
            return kv_fail(err, KV_ERR_ARG, "block I/O: pair %d (%d -> %d) outside the pool "
                           "[0, %d) or a negative host block", i, pairs[i].src, pairs[i].dst,
                           p->cache.spec.n_blocks);
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
        if (pthread_create(&io->thread, NULL, io_main, b) != 0) {
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

static int cpu_read_blocks_async(kv_backend *b, const kv_block_copy *pairs, int n,
                                 uint8_t *host, size_t block_bytes, int64_t *ticket,
                                 kv_err *err)
{
    return io_submit(b, 1, pairs, n, host, block_bytes, ticket, err);
}

static int cpu_write_blocks_async(kv_backend *b, const kv_block_copy *pairs, int n,
                                  const uint8_t *host, size_t block_bytes, int64_t *ticket,
                                  kv_err *err)
{
    /* the thread only reads host: the cast drops a const the job struct does not carry */
    return io_submit(b, 0, pairs, n, (uint8_t *)host, block_bytes, ticket, err);
}

/* Wait until ticket (and every earlier one) is done; report a copy that failed meanwhile. */
static int cpu_io_wait(kv_backend *b, int64_t ticket, kv_err *err)
{
    cpu_io *io = &((cpu_impl *)b->impl)->io;
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
        if (b->io_wait) io_shutdown(&p->io); /* before the cache it copies into goes */
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
    b->truncate = cpu_truncate;
    b->speculate = cpu_speculate;
    if (spec->layout == KV_LAYOUT_PAGED) {
        b->set_blocks = cpu_set_blocks;
        b->copy_blocks = cpu_copy_blocks;
        b->fork_slot = cpu_fork_slot;
        b->set_length = cpu_set_length;
        b->block_bytes = cpu_block_bytes;
        b->read_blocks = cpu_read_blocks;
        b->write_blocks = cpu_write_blocks; /* host tier memory: kv_calloc (hooks NULL) */
        pthread_mutex_init(&p->io.mu, NULL);
        pthread_cond_init(&p->io.work, NULL);
        pthread_cond_init(&p->io.done, NULL);
        b->read_blocks_async = cpu_read_blocks_async;
        b->write_blocks_async = cpu_write_blocks_async;
        b->io_wait = cpu_io_wait;
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
