/* NCCL all-reduce between GPU ranks, and the group of rank threads that runs a model over
 * them (kvcu_tp.h).
 *
 * One process drives every GPU: ncclCommInitAll makes the p communicators at once, and an
 * all-reduce is p ncclAllReduce calls, one per rank on its own stream, inside
 * ncclGroupStart/End so NCCL launches them together (one thread issuing them one by one
 * outside a group would wait forever for the ranks it has not reached yet). */
#include "kvcu_tp.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tp.h"
#include "kvcu_internal.cuh" /* the cache struct: a step is checked once, before the ranks */

#define KV_TP_GPU_MAX 64

struct kvcu_tp_comm {
    int p;
    ncclComm_t comm[KV_TP_GPU_MAX];
    cudaStream_t stream[KV_TP_GPU_MAX];
    int n_streams;        /* streams made so far (for destroy) */
    int comms_ok;         /* ncclCommInitAll succeeded */
    int64_t all_reduces;
    double bytes;         /* per rank, ring formula */
};

#define CUDA_OR_FAIL(call)                                                                  \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            rc = kv_fail(err, e_ == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE, \
                         "%s: %s", #call, cudaGetErrorString(e_));                          \
            goto fail;                                                                      \
        }                                                                                   \
    } while (0)

#define NCCL_OR_FAIL(call)                                                                  \
    do {                                                                                    \
        ncclResult_t e_ = (call);                                                           \
        if (e_ != ncclSuccess) {                                                            \
            rc = kv_fail(err, KV_ERR_DEVICE, "%s: %s", #call, ncclGetErrorString(e_));      \
            goto fail;                                                                      \
        }                                                                                   \
    } while (0)

extern "C" int kvcu_tp_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear it: no driver or no device is an answer, not an error */
        return 0;
    }
    return n;
}

extern "C" void kvcu_tp_comm_destroy(kvcu_tp_comm *c)
{
    if (!c) return;
    for (int r = 0; r < c->p && c->comms_ok; r++) ncclCommDestroy(c->comm[r]);
    for (int r = 0; r < c->n_streams; r++) {
        cudaSetDevice(r);
        cudaStreamDestroy(c->stream[r]);
    }
    free(c);
}

extern "C" int kvcu_tp_comm_create(kvcu_tp_comm **out, int p, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_comm_create: NULL argument");
    *out = NULL;
    if (p < 1 || p > KV_TP_GPU_MAX)
        return kv_fail(err, KV_ERR_ARG, "kvcu_tp_comm_create: %d ranks (need 1 .. %d)", p,
                       KV_TP_GPU_MAX);
    const int have = kvcu_tp_device_count();
    if (have < p)
        return kv_fail(err, KV_ERR_DEVICE, "kvcu_tp_comm_create: %d ranks need %d GPUs, this "
                       "machine has %d", p, p, have);
    int rc = KV_OK;
    int devs[KV_TP_GPU_MAX];
    kvcu_tp_comm *c = (kvcu_tp_comm *)calloc(1, sizeof *c);
    if (!c) return kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_comm_create: out of memory");
    c->p = p;
    for (int r = 0; r < p; r++) {
        devs[r] = r;
        CUDA_OR_FAIL(cudaSetDevice(r));
        CUDA_OR_FAIL(cudaStreamCreateWithFlags(&c->stream[r], cudaStreamNonBlocking));
        c->n_streams++;
    }
    NCCL_OR_FAIL(ncclCommInitAll(c->comm, p, devs));
    c->comms_ok = 1;
    *out = c;
    return KV_OK;
fail:
    kvcu_tp_comm_destroy(c);
    return rc;
}

extern "C" int kvcu_tp_allreduce(kvcu_tp_comm *c, float *const *x, int64_t n, kv_err *err)
{
    if (!c || !x || n < 0) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_allreduce: bad argument");
    if (n == 0) return KV_OK;
    int rc = KV_OK;
    NCCL_OR_FAIL(ncclGroupStart());
    for (int r = 0; r < c->p; r++) {
        ncclResult_t e = ncclAllReduce(x[r], x[r], (size_t)n, ncclFloat, ncclSum, c->comm[r],
                                       c->stream[r]);
        if (e != ncclSuccess) {
            ncclGroupEnd();
            return kv_fail(err, KV_ERR_DEVICE, "ncclAllReduce (rank %d): %s", r,
                           ncclGetErrorString(e));
        }
    }
    NCCL_OR_FAIL(ncclGroupEnd());
    for (int r = 0; r < c->p; r++) {
        CUDA_OR_FAIL(cudaSetDevice(r));
        CUDA_OR_FAIL(cudaStreamSynchronize(c->stream[r]));
    }
    c->all_reduces++;
    c->bytes += 2.0 * (c->p - 1) / c->p * (double)n * sizeof(float);
    return KV_OK;
fail:
    return rc;
}

extern "C" int64_t kvcu_tp_allreduces(const kvcu_tp_comm *c) { return c->all_reduces; }
extern "C" double kvcu_tp_bytes_per_rank(const kvcu_tp_comm *c) { return c->bytes; }

/* ---- the group: p rank threads, one per GPU (kvcu_tp.h) -------------------------------------
 * The CPU group's shape (reference_cpu/engine/kv_tp.c) with a device per rank: rank r's thread sets
 * GPU r once and waits for steps; a step runs kvcu_forward_shard() on every rank at once, and
 * the ranks meet only inside the all_reduce hook, where NCCL itself is the barrier. One thread
 * per GPU is what lets each rank call ncclAllReduce on its own communicator without a group
 * call: NCCL waits inside the collective until every rank has entered it. */

struct kvcu_tp {
    const kv_model *host_model; /* config and checks; must outlive the group */
    int p;
    kvcu_tp_comm *comm;
    kvcu_model *model[KV_TP_GPU_MAX];  /* rank r's copy of the weights, on GPU r */
    kvcu_cache *cache[KV_TP_GPU_MAX];  /* rank r's KV heads only */
    kvcu_state *state[KV_TP_GPU_MAX];
    kv_shard shard[KV_TP_GPU_MAX];
    float *spare[KV_TP_GPU_MAX];       /* GPU r [max_floats] zeros: a failed rank's share */
    int64_t max_floats;
    pthread_t thread[KV_TP_GPU_MAX];
    int n_threads;                     /* rank threads started; -1 before the locks exist */
    pthread_mutex_t mu;                /* guards gen, running, quit */
    pthread_cond_t go, idle;
    int64_t gen;
    int running;
    int quit;
    /* the step being run */
    const kv_seq *seqs;
    kv_seq *quiet;                     /* [n_seqs] the other ranks' view: no all_logits */
    int n_seqs, max_seqs;
    float *logits;
    kv_counters *cnt;
    int64_t n_floats;                  /* T·dim: what every all-reduce sums */
    int rc[KV_TP_GPU_MAX];
    kv_err err[KV_TP_GPU_MAX];
    int reduces[KV_TP_GPU_MAX];        /* all-reduces rank r joined this step */
    int hook_rc[KV_TP_GPU_MAX];        /* the first CUDA or NCCL failure inside the hook */
    kv_err hook_err[KV_TP_GPU_MAX];
};

/* sh->all_reduce on GPU r: x [n] is device memory written by this thread's kernels on the
 * default stream; the rank's NCCL stream does not wait for that stream by itself (it is
 * non-blocking), so the default stream is drained first, and the sum is complete before the
 * next kernel reads it. x NULL: a rank whose step failed, joining with zeros so the others
 * are not left waiting inside NCCL. */
static void nccl_all_reduce(const kv_shard *sh, float *x, int64_t n)
{
    kvcu_tp *g = (kvcu_tp *)sh->ctx;
    const int r = sh->rank;
    kvcu_tp_comm *c = g->comm;
    float *buf = x ? x : g->spare[r];
    cudaError_t ce = cudaStreamSynchronize(0);
    ncclResult_t ne = ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, c->comm[r],
                                    c->stream[r]);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(c->stream[r]);
    if (!g->hook_rc[r] && (ce != cudaSuccess || ne != ncclSuccess))
        g->hook_rc[r] = kv_fail(&g->hook_err[r], KV_ERR_DEVICE, "rank %d all-reduce: %s", r,
                                ne != ncclSuccess ? ncclGetErrorString(ne)
                                                  : cudaGetErrorString(ce));
    if (r == 0) {
        c->all_reduces++;
        c->bytes += 2.0 * (c->p - 1) / c->p * (double)n * sizeof(float);
    }
    g->reduces[r]++;
}

static void run_rank(kvcu_tp *g, int r)
{
    const int lead = r == 0; /* rank 0 returns the logits and counts the work */
    g->reduces[r] = 0;
    g->hook_rc[r] = KV_OK;
    g->rc[r] = kvcu_forward_shard(g->model[r], g->cache[r], g->state[r], &g->shard[r],
                                  lead ? g->seqs : g->quiet, g->n_seqs,
                                  lead ? g->logits : NULL, lead ? g->cnt : NULL, &g->err[r]);
    while (g->reduces[r] < 2 * g->host_model->config.n_layers)
        nccl_all_reduce(&g->shard[r], NULL, g->n_floats);
}

typedef struct {
    kvcu_tp *g;
    int rank;
} rank_arg;

static void *rank_main(void *arg)
{
    rank_arg a = *(rank_arg *)arg;
    free(arg);
    kvcu_tp *g = a.g;
    cudaSetDevice(a.rank); /* this thread's device for good: kernels, scratch, NCCL */
    int64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen && !g->quit) pthread_cond_wait(&g->go, &g->mu);
        seen = g->gen;
        const int quit = g->quit;
        pthread_mutex_unlock(&g->mu);
        if (quit) break;
        run_rank(g, a.rank);
        pthread_mutex_lock(&g->mu);
        if (--g->running == 0) pthread_cond_signal(&g->idle);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

extern "C" void kvcu_tp_destroy(kvcu_tp *g)
{
    if (!g) return;
    if (g->n_threads >= 0) {
        pthread_mutex_lock(&g->mu);
        g->quit = 1;
        pthread_cond_broadcast(&g->go);
        pthread_mutex_unlock(&g->mu);
        for (int r = 0; r < g->n_threads; r++) pthread_join(g->thread[r], NULL);
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->go);
        pthread_cond_destroy(&g->idle);
    }
    int dev = 0;
    cudaGetDevice(&dev);
    for (int r = 0; r < g->p; r++) {
        cudaSetDevice(r);
        kvcu_state_free(g->state[r]);
        kvcu_cache_free(g->cache[r]);
        kvcu_model_free(g->model[r]);
        cudaFree(g->spare[r]);
    }
    cudaSetDevice(dev);
    kvcu_tp_comm_destroy(g->comm);
    free(g->quiet);
    free(g);
}

extern "C" int kvcu_tp_create(kvcu_tp **out, const kv_model *m, int p, const kv_cache_spec *spec,
                              kv_err *err)
{
    if (!out || !m || !spec) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_create: NULL argument");
    *out = NULL;
    int rc = kv_tp_check(&m->config, p, err);
    if (rc) return rc;
    if (p > KV_TP_GPU_MAX)
        return kv_fail(err, KV_ERR_ARG, "kvcu_tp_create: %d ranks (at most %d)", p, KV_TP_GPU_MAX);
    if (spec->layout.kind == KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_tp_create: a paged cache is not supported "
                       "(every rank's block tables would have to move in step); use contiguous");
    if (spec->retain.select != 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_tp_create: selected-set retention "
                       "(chapter 09) is not supported with tensor-parallel ranks");
    kvcu_tp *g = (kvcu_tp *)calloc(1, sizeof *g);
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_create: out of memory");
    g->host_model = m;
    g->n_threads = -1;
    rc = kvcu_tp_comm_create(&g->comm, p, err); /* KV_ERR_DEVICE with fewer than p GPUs */
    if (rc) {
        free(g);
        return rc;
    }
    int dev = 0;
    cudaGetDevice(&dev);
    for (int r = 0; r < p && !rc; r++) {
        g->p = r + 1; /* destroy frees what rank r got so far */
        kv_tp_shard_of(&m->config, p, r, &g->shard[r]);
        g->shard[r].all_reduce = nccl_all_reduce;
        g->shard[r].ctx = g;
        kv_config shape = m->config; /* the rank's cache: its KV heads only */
        shape.n_kv_heads = g->shard[r].n_kv_heads;
        if (cudaSetDevice(r) != cudaSuccess)
            rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_tp_create: cudaSetDevice(%d) failed", r);
        if (!rc) rc = kvcu_model_upload(&g->model[r], m, err);
        if (!rc) rc = kvcu_cache_create(&g->cache[r], &shape, spec, err);
        if (!rc) rc = kvcu_state_create(&g->state[r], err);
    }
    cudaSetDevice(dev);
    if (rc) {
        kvcu_tp_destroy(g);
        return rc;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->idle, NULL);
    g->n_threads = 0; /* thread[r] runs rank r */
    for (int r = 0; r < p; r++) {
        rank_arg *a = (rank_arg *)malloc(sizeof *a);
        if (a) *a = (rank_arg){g, r};
        if (!a || pthread_create(&g->thread[r], NULL, rank_main, a) != 0) {
            free(a);
            kvcu_tp_destroy(g);
            return kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_create: could not start rank thread %d "
                           "of %d", r, p);
        }
        g->n_threads++;
    }
    *out = g;
    return KV_OK;
}

extern "C" int kvcu_tp_forward(kvcu_tp *g, const kv_seq *seqs, int n_seqs, float *logits,
                               kv_counters *cnt, kv_err *err)
{
    if (!g) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_forward: NULL group");
    /* refuse a bad step here, once, before any rank touches its cache: a rank refused inside
     * kvcu_forward_shard would still owe its all-reduces (it joins them with zeros) */
    kv_config shape = g->host_model->config;
    shape.n_kv_heads = g->shard[0].n_kv_heads;
    const kvcu_cache *c0 = g->cache[0];
    int T = 0;
    int rc = kv_batch_check("kvcu_tp_forward", &shape, &c0->spec, c0->n_layers, c0->n_kv_heads,
                            c0->head_dim, c0->len, seqs, n_seqs, &T, err);
    if (rc) return rc;
    const int64_t n = (int64_t)T * g->host_model->config.dim;
    if (n > g->max_floats) { /* every rank's zeros for a failed step, sized for this one */
        int dev = 0;
        cudaGetDevice(&dev);
        for (int r = 0; r < g->p && !rc; r++) {
            cudaSetDevice(r);
            cudaFree(g->spare[r]);
            g->spare[r] = NULL;
            if (cudaMalloc((void **)&g->spare[r], (size_t)n * sizeof(float)) != cudaSuccess ||
                cudaMemset(g->spare[r], 0, (size_t)n * sizeof(float)) != cudaSuccess) {
                cudaGetLastError();
                rc = kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_forward: %lld floats on GPU %d",
                             (long long)n, r);
            }
        }
        cudaSetDevice(dev);
        if (rc) {
            g->max_floats = 0;
            return rc;
        }
        g->max_floats = n;
    }
    if (n_seqs > g->max_seqs) {
        kv_seq *q = (kv_seq *)realloc(g->quiet, sizeof(kv_seq) * (size_t)n_seqs);
        if (!q) return kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_forward: out of memory");
        g->quiet = q;
        g->max_seqs = n_seqs;
    }
    for (int i = 0; i < n_seqs; i++) { /* ranks other than 0 compute no logits */
        g->quiet[i] = seqs[i];
        g->quiet[i].all_logits = NULL;
    }
    g->seqs = seqs;
    g->n_seqs = n_seqs;
    g->logits = logits;
    g->cnt = cnt;
    g->n_floats = n;
    pthread_mutex_lock(&g->mu);
    g->running = g->p;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    while (g->running > 0) pthread_cond_wait(&g->idle, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < g->p; r++) {
        if (g->rc[r]) {
            if (err) *err = g->err[r];
            return g->rc[r];
        }
        if (g->hook_rc[r]) {
            if (err) *err = g->hook_err[r];
            return g->hook_rc[r];
        }
    }
    return KV_OK;
}

extern "C" void kvcu_tp_reset(kvcu_tp *g, int slot)
{
    int dev = 0;
    cudaGetDevice(&dev);
    for (int r = 0; r < g->p; r++) { /* host lengths, and KIVI counts on GPU r */
        cudaSetDevice(r);
        kvcu_cache_reset(g->cache[r], slot);
    }
    cudaSetDevice(dev);
}

extern "C" const kvcu_tp_comm *kvcu_tp_comm_of(const kvcu_tp *g) { return g->comm; }

/* ---- as a backend ---------------------------------------------------------------------------- */

static int tp_forward(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                      kv_counters *cnt, kv_err *err)
{
    return kvcu_tp_forward((kvcu_tp *)b->impl, seqs, n_seqs, logits, cnt, err);
}

static void tp_reset(kv_backend *b, int slot) { kvcu_tp_reset((kvcu_tp *)b->impl, slot); }

static int tp_length(kv_backend *b, int slot)
{
    return kvcu_cache_length(((kvcu_tp *)b->impl)->cache[0], slot);
}

static void tp_destroy(kv_backend *b)
{
    kvcu_tp_destroy((kvcu_tp *)b->impl);
    free(b);
}

extern "C" int kvcu_tp_backend(kv_backend **out, const kv_model *m, int p,
                               const kv_cache_spec *spec, kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_backend: NULL argument");
    *out = NULL;
    kv_backend *b = (kv_backend *)calloc(1, sizeof *b);
    if (!b) return kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_backend: out of memory");
    kvcu_tp *g = NULL;
    int rc = kvcu_tp_create(&g, m, p, spec, err);
    if (rc) {
        free(b);
        return rc;
    }
    b->name = "cuda-tp";
    b->config = &m->config;
    b->spec = *spec;
    b->impl = g;
    b->forward = tp_forward;
    b->reset = tp_reset;
    b->length = tp_length;
    b->destroy = tp_destroy;
    *out = b;
    return KV_OK;
}
