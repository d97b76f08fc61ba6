/* NCCL all-reduce between GPU ranks, and the group of rank threads that runs a model over
 * them (kvcu_tp.h).
 *
 * One process drives every GPU: ncclCommInitAll makes the p communicators at once, and an
 * all-reduce is p ncclAllReduce calls, one per rank on its own stream, inside
 * ncclGroupStart/End so NCCL launches them together (one thread issuing them one by one
 * outside a group would wait forever for the ranks it has not reached yet).
 *
 * Ordering: a rank's NCCL stream is non-blocking, so it does not wait for the device's default
 * stream by itself; the buffer's writers (kernels, copies, a pageable cudaMemcpy whose DMA may
 * still be in flight when it returns) are on that default stream. Each all-reduce therefore
 * records an event on the default stream and makes the NCCL stream wait for it (no host
 * wait), and the host waits for the NCCL stream before anything reads the sum.
 *
 * Failure: NCCL's collective waits on the device for every rank, so a rank that can no longer
 * take part (a sticky CUDA error, a failed ncclAllReduce) would leave the others spinning in
 * it forever. The host never blocks in cudaStreamSynchronize on an NCCL stream: it polls
 * (wait_nccl()) the stream, ncclCommGetAsyncError() and the group's abort flag, and on any
 * failure sets the flag and calls ncclCommAbort(), which makes the NCCL kernels of that
 * communicator return. The communicators are then gone: every later call is refused with
 * KV_ERR_DEVICE until the group is destroyed and made again. */
#include "kvcu_tp.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tp.h"
#include "kvcu_internal.cuh" /* the cache struct: a step is checked once, before the ranks */

#define KV_TP_GPU_MAX 64

struct kvcu_tp_comm {
    int p;
    ncclComm_t comm[KV_TP_GPU_MAX];
    cudaStream_t stream[KV_TP_GPU_MAX];
    cudaEvent_t written[KV_TP_GPU_MAX]; /* rank r's default stream, up to the all-reduce */
    int n_streams;        /* streams (and events) made so far (for destroy) */
    int comms_ok;         /* ncclCommInitAll succeeded */
    int aborted[KV_TP_GPU_MAX]; /* ncclCommAbort() freed comm[r] */
    volatile int abort;   /* a rank failed: every rank aborts its communicator */
    int64_t all_reduces;
    double bytes;         /* per rank, ring formula */
};

#define CUDA_OR_FAIL(call)                                                                  \
    do {                                                                                    \
        cudaError_t e_ = kvcu_clear_error(call);                                            \
        if (e_ != cudaSuccess) {                                                            \
            rc = kv_fail(err, KVCU_STATUS(e_), "%s: %s", #call, cudaGetErrorString(e_));   \
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
    for (int r = 0; r < c->p && c->comms_ok; r++)
        if (!c->aborted[r]) ncclCommDestroy(c->comm[r]);
    for (int r = 0; r < c->n_streams; r++) {
        cudaSetDevice(r);
        cudaEventDestroy(c->written[r]);
        cudaStreamDestroy(c->stream[r]);
    }
    free(c);
}

/* Abort rank r's communicator (once): its NCCL kernels return, and every rank still waiting
 * for it sees the flag. Call from the thread that drives rank r, outside any NCCL call. */
static void abort_rank(kvcu_tp_comm *c, int r)
{
    __atomic_store_n(&c->abort, 1, __ATOMIC_SEQ_CST);
    if (!c->comms_ok || c->aborted[r]) return;
    ncclCommAbort(c->comm[r]);
    c->aborted[r] = 1;
}

static int comm_broken(const kvcu_tp_comm *c, const char *who, kv_err *err)
{
    if (!__atomic_load_n(&c->abort, __ATOMIC_SEQ_CST)) return KV_OK;
    return kv_fail(err, KV_ERR_DEVICE, "%s: an earlier failure aborted the ranks' NCCL "
                   "communicators; destroy the group and make a new one", who);
}

/* Rank r's NCCL stream, ordered after everything issued so far on GPU r's default stream
 * (the current device must be r). */
static cudaError_t order_after_default(kvcu_tp_comm *c, int r)
{
    cudaError_t e = cudaEventRecord(c->written[r], 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->stream[r], c->written[r], 0);
    return kvcu_clear_error(e);
}

/* Wait for rank r's NCCL stream without blocking in it: poll the stream, the communicator's
 * asynchronous error and the group's abort flag. 0 when the stream's work completed; else
 * fills err, aborts rank r's communicator and returns KV_ERR_DEVICE. */
static int wait_nccl(kvcu_tp_comm *c, int r, kv_err *err)
{
    for (;;) {
        const cudaError_t q = cudaStreamQuery(c->stream[r]);
        if (q == cudaSuccess) return KV_OK;
        ncclResult_t ae = ncclSuccess;
        if (q != cudaErrorNotReady) {
            kv_fail(err, KV_ERR_DEVICE, "rank %d: its NCCL stream: %s", r,
                    cudaGetErrorString(kvcu_clear_error(q)));
        } else if (ncclCommGetAsyncError(c->comm[r], &ae) != ncclSuccess || ae != ncclSuccess) {
            kv_fail(err, KV_ERR_DEVICE, "rank %d: NCCL: %s", r, ncclGetErrorString(ae));
        } else if (__atomic_load_n(&c->abort, __ATOMIC_SEQ_CST)) {
            kv_fail(err, KV_ERR_DEVICE, "rank %d: another rank failed inside the all-reduce", r);
        } else {
            sched_yield();
            continue;
        }
        abort_rank(c, r);
        return KV_ERR_DEVICE;
    }
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
        if (cudaEventCreateWithFlags(&c->written[r], cudaEventDisableTiming) != cudaSuccess) {
            cudaStreamDestroy(c->stream[r]);
            CUDA_OR_FAIL(cudaGetLastError());
        }
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
    int rc = comm_broken(c, "kvcu_tp_allreduce", err);
    if (rc || n == 0) return rc;
    int dev = 0;
    cudaGetDevice(&dev);
    for (int r = 0; r < c->p; r++) { /* what wrote x[r] on GPU r's default stream comes first */
        CUDA_OR_FAIL(cudaSetDevice(r));
        CUDA_OR_FAIL(order_after_default(c, r));
    }
    NCCL_OR_FAIL(ncclGroupStart());
    for (int r = 0; r < c->p; r++) {
        ncclResult_t e = ncclAllReduce(x[r], x[r], (size_t)n, ncclFloat, ncclSum, c->comm[r],
                                       c->stream[r]);
        if (e != ncclSuccess) {
            ncclGroupEnd();
            rc = kv_fail(err, KV_ERR_DEVICE, "ncclAllReduce (rank %d): %s", r,
                         ncclGetErrorString(e));
            goto fail;
        }
    }
    NCCL_OR_FAIL(ncclGroupEnd());
    for (int r = 0; r < c->p && !rc; r++) {
        CUDA_OR_FAIL(cudaSetDevice(r));
        rc = wait_nccl(c, r, err);
    }
    if (rc) goto fail;
    cudaSetDevice(dev);
    c->all_reduces++;
    c->bytes += 2.0 * (c->p - 1) / c->p * (double)n * sizeof(float);
    return KV_OK;
fail: /* one thread drives every rank here: abort them all, none is left waiting */
    for (int r = 0; r < c->p; r++) {
        cudaSetDevice(r);
        abort_rank(c, r);
    }
    cudaSetDevice(dev);
    return rc;
}

extern "C" int64_t kvcu_tp_allreduces(const kvcu_tp_comm *c) { return c->all_reduces; }
extern "C" double kvcu_tp_bytes_per_rank(const kvcu_tp_comm *c) { return c->bytes; }

/* ---- the group: p rank threads, one per GPU (kvcu_tp.h) -------------------------------------
 * The CPU group (reference_cpu/engine/kv_tp.c) with a device per rank, set up by its functions:
 * the checks (kv_tp_check_group()), each rank's shard and cache shape (kv_tp_rank_setup()), the
 * step's check and views (kv_tp_step_begin()) and the rank threads (kv_tp_threads_*()). Rank
 * r's thread sets GPU r once and waits for steps; a step runs kvcu_forward_shard() on every
 * rank at once, and the ranks meet only inside the all_reduce hook, where NCCL itself is the
 * barrier. One thread per GPU is what lets each rank call ncclAllReduce on its own
 * communicator without a group call: NCCL waits inside the collective until every rank has
 * entered it. */

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
    kv_tp_threads threads;             /* one per rank, 0 .. p-1 (kv_tp.h) */
    kv_tp_step step;                   /* the step being run, set before the ranks wake */
    int rc[KV_TP_GPU_MAX];
    kv_err err[KV_TP_GPU_MAX];
    int reduces[KV_TP_GPU_MAX];        /* all-reduces rank r joined this step */
    int hook_rc[KV_TP_GPU_MAX];        /* the first CUDA or NCCL failure inside the hook */
    kv_err hook_err[KV_TP_GPU_MAX];
};

/* sh->all_reduce on GPU r: x [n] is device memory written by this thread's kernels on the
 * default stream; the rank's NCCL stream is ordered after them by an event, and the host
 * waits (polling, wait_nccl()) for the sum before the next kernel reads it. x NULL: a rank
 * whose step failed, joining with zeros so the others are not left waiting inside NCCL. A
 * rank that cannot join (a CUDA or NCCL failure) aborts its communicator and raises the
 * group's flag, so the ranks waiting for it abort theirs and return too; once aborted, the
 * hook does nothing (the step fails with the first failure's message). */
static void nccl_all_reduce(const kv_shard *sh, float *x, int64_t n)
{
    kvcu_tp *g = (kvcu_tp *)sh->ctx;
    const int r = sh->rank;
    kvcu_tp_comm *c = g->comm;
    float *buf = x ? x : g->spare[r];
    kv_err e;
    cudaError_t ce = cudaSuccess;
    int rc = comm_broken(c, "all-reduce", &e);
    if (rc) {
        abort_rank(c, r);
    } else if ((ce = order_after_default(c, r)) != cudaSuccess) {
        rc = kv_fail(&e, KV_ERR_DEVICE, "rank %d: ordering its NCCL stream: %s", r,
                     cudaGetErrorString(ce));
        abort_rank(c, r);
    } else {
        const ncclResult_t ne = ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum,
                                              c->comm[r], c->stream[r]);
        if (ne != ncclSuccess) {
            rc = kv_fail(&e, KV_ERR_DEVICE, "rank %d: ncclAllReduce: %s", r,
                         ncclGetErrorString(ne));
            abort_rank(c, r);
        } else {
            rc = wait_nccl(c, r, &e);
        }
    }
    if (rc && !g->hook_rc[r]) {
        g->hook_rc[r] = rc;
        g->hook_err[r] = e;
    }
    if (r == 0) {
        c->all_reduces++;
        c->bytes += 2.0 * (c->p - 1) / c->p * (double)n * sizeof(float);
    }
    g->reduces[r]++;
}

static void run_rank(void *ctx, int r)
{
    kvcu_tp *g = (kvcu_tp *)ctx;
    const kv_tp_step *s = &g->step;
    const int lead = r == 0; /* rank 0 returns the logits and counts the work */
    g->reduces[r] = 0;
    g->hook_rc[r] = KV_OK;
    g->rc[r] = kvcu_forward_shard(g->model[r], g->cache[r], g->state[r], &g->shard[r],
                                  lead ? s->seqs : s->quiet, s->n_seqs, lead ? s->logits : NULL,
                                  lead ? s->cnt : NULL, &g->err[r]);
    while (g->reduces[r] < 2 * g->host_model->config.n_layers)
        nccl_all_reduce(&g->shard[r], NULL, s->n_floats);
}

/* This thread's device for good: kernels, scratch, NCCL. */
static void enter_rank(void *ctx, int r)
{
    (void)ctx;
    cudaSetDevice(r);
}

extern "C" void kvcu_tp_destroy(kvcu_tp *g)
{
    if (!g) return;
    kv_tp_threads_stop(&g->threads);
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
    free(g->step.quiet);
    free(g);
}

extern "C" int kvcu_tp_create(kvcu_tp **out, const kv_model *m, int p, const kv_cache_spec *spec,
                              kv_err *err)
{
    if (!out || !m || !spec) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_create: NULL argument");
    *out = NULL;
    int rc = kv_tp_check_group("kvcu_tp_create", &m->config, p, spec, err);
    if (rc) return rc;
    if (p > KV_TP_GPU_MAX)
        return kv_fail(err, KV_ERR_ARG, "kvcu_tp_create: %d ranks (at most %d)", p, KV_TP_GPU_MAX);
    kvcu_tp *g = (kvcu_tp *)calloc(1, sizeof *g);
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "kvcu_tp_create: out of memory");
    g->host_model = m;
    rc = kvcu_tp_comm_create(&g->comm, p, err); /* KV_ERR_DEVICE with fewer than p GPUs */
    if (rc) {
        free(g);
        return rc;
    }
    int dev = 0;
    cudaGetDevice(&dev);
    for (int r = 0; r < p && !rc; r++) {
        g->p = r + 1; /* destroy frees what rank r got so far */
        kv_config shape; /* the rank's cache: its KV heads only */
        kv_tp_rank_setup(&m->config, p, r, nccl_all_reduce, g, &g->shard[r], &shape);
        if (cudaSetDevice(r) != cudaSuccess)
            rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_tp_create: cudaSetDevice(%d) failed", r);
        if (!rc) rc = kvcu_model_upload(&g->model[r], m, err);
        if (!rc) rc = kvcu_cache_create(&g->cache[r], &shape, spec, err);
        if (!rc) rc = kvcu_state_create(&g->state[r], err);
    }
    cudaSetDevice(dev);
    if (!rc) rc = kv_tp_threads_start(&g->threads, 0, p, run_rank, enter_rank, g,
                                      "kvcu_tp_create", err);
    if (rc) {
        kvcu_tp_destroy(g);
        return rc;
    }
    *out = g;
    return KV_OK;
}

extern "C" int kvcu_tp_forward(kvcu_tp *g, const kv_seq *seqs, int n_seqs, float *logits,
                               kv_counters *cnt, kv_err *err)
{
    if (!g) return kv_fail(err, KV_ERR_ARG, "kvcu_tp_forward: NULL group");
    int rc = comm_broken(g->comm, "kvcu_tp_forward", err);
    if (rc) return rc;
    /* a bad step is refused here, once, before any rank touches its cache */
    rc = kv_tp_step_begin(&g->step, "kvcu_tp_forward", &g->host_model->config, &g->shard[0],
                          g->cache[0], seqs, n_seqs, logits, cnt, err);
    if (rc) return rc;
    const int64_t n = g->step.n_floats;
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
    kv_tp_threads_go(&g->threads);
    kv_tp_threads_wait(&g->threads);
    if (__atomic_load_n(&g->comm->abort, __ATOMIC_SEQ_CST)) { /* the rank threads are idle */
        int dev = 0;
        cudaGetDevice(&dev);
        for (int r = 0; r < g->p; r++) {
            cudaSetDevice(r);
            abort_rank(g->comm, r);
        }
        cudaSetDevice(dev);
    }
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
    kvcu_tp *g = NULL;
    int rc = kvcu_tp_create(&g, m, p, spec, err);
    if (!rc)
        rc = kv_backend_new(out, "cuda-tp", &m->config, spec, g, tp_forward, tp_reset, tp_length,
                            tp_destroy, err);
    if (rc) kvcu_tp_destroy(g); /* NULL is fine */
    return rc;
}
