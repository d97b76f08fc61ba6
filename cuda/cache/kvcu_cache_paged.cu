/*
 * The paged device cache's own operations (chapter 05), twins of kv_cache.h's: map a slot's
 * logical blocks to physical ones, fork a slot's per-sequence state, adopt a cached prefix,
 * and copy blocks on write. The layout itself and the writes through the tables are in
 * kvcu_cache.cu, the reads in kvcu_attention.cu.
 *
 * A slot's table lives on the host (the batch checks and KIVI's spill placement read it
 * there) and on the device (the kernels read it); kvcu_cache_set_blocks() writes both, so
 * they never disagree. fork and set_length touch only per-sequence state: lengths and KIVI
 * counts on the host, fp8 scales and KIVI windows copied device to device. A sliding-window
 * slot (chapter 06) maps only its S+W rows and rewrites them in place, so it can neither be
 * forked nor adopt a prefix: both are refused with the CPU's words.
 *
 * copy_blocks_kernel: one block per (pair, layer and K/V, kv head) copies the B rows of codes
 *   and the block's metadata entries, 16 bytes per thread when the addresses allow. A step's
 *   whole copy-on-write list is one launch, every layer, K and V.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_quant.h"
#include "kvcu_cache_internal.cuh"

#define COPY_THREADS 128

int kvcu_cache_set_blocks(kvcu_cache *c, int slot, const int *blocks, int n, kv_err *err)
{
    /* the checks and the host's table (kv_cache_state.c), then its device mirror */
    int rc = kv_cache_state_set_blocks(c, "kvcu_cache_set_blocks", slot, blocks, n, err);
    if (rc) return rc;
    if (n > 0) /* entries past n are never read: the batch check keeps positions below n·B */
        KV_CUDA_TRY(cudaMemcpy(c->d_tables + (size_t)slot * c->max_blocks,
                               c->tables + (size_t)slot * c->max_blocks, (size_t)n * sizeof(int),
                               cudaMemcpyHostToDevice), err);
    return KV_OK;
}

int kvcu_cache_fork_slot(kvcu_cache *c, int dst, int src, kv_err *err)
{
    int rc = kv_cache_state_fork(c, "kvcu_cache_fork_slot", dst, src, err);
    return rc || dst == src ? rc : kvcu_cache_sync_qlen(c, err);
}

int kvcu_cache_set_length(kvcu_cache *c, int slot, int len, kv_err *err)
{
    return kv_cache_state_set_length(c, "kvcu_cache_set_length", slot, len, err);
}

/* n bytes from src to dst by the block's threads, in 16-, 4- or 1-byte words as the
 * addresses and the length allow. */
__device__ inline void block_copy_bytes(uint8_t *dst, const uint8_t *src, int64_t n)
{
    const uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)n;
    if (a % 16 == 0) {
        for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
            ((uint4 *)(void *)dst)[i] = ((const uint4 *)(const void *)src)[i];
    } else if (a % 4 == 0) {
        for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x)
            ((uint32_t *)(void *)dst)[i] = ((const uint32_t *)(const void *)src)[i];
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    }
}

/* Block (i, plane, h): pair i's rows of kv head h in plane `plane` (planes [n_planes][L]: K of
 * every layer, then V), codes and metadata. The metadata of a block is one contiguous run of
 * entries, as kv_cache_copy_blocks() relies on (kv_quant.h: linear in the row, or in the
 * 32-row group for KIVI keys, with 32 | B). */
__global__ void copy_blocks_kernel(const kv_block_copy *pairs, const kv_cache_plane *planes,
                                   const int *fmt, int n_layers, int rows, int block_size, int d)
{
    const int i = blockIdx.x, pl = blockIdx.y, h = blockIdx.z;
    const kv_cache_plane p = planes[pl];
    const int l = pl % n_layers, f = fmt[l], role = p.role;
    const int64_t s0 = (int64_t)pairs[i].src * block_size, d0 = (int64_t)pairs[i].dst * block_size;
    uint8_t *codes = p.codes + (int64_t)h * rows * p.row_bytes; /* [rows][row_bytes] */
    block_copy_bytes(codes + d0 * p.row_bytes, codes + s0 * p.row_bytes, block_size * p.row_bytes);
    if (!p.meta) return;
    const int64_t m0 = kvq_meta_index(f, role, s0, 0, d), m1 = kvq_meta_index(f, role, d0, 0, d);
    const int64_t mn = kvq_meta_index(f, role, s0 + block_size, 0, d) - m0;
    uint8_t *meta = (uint8_t *)p.meta + (int64_t)h * p.meta_entries * 4;
    block_copy_bytes(meta + m1 * 4, meta + m0 * 4, mn * 4);
}

int kvcu_cache_copy_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n, kv_err *err)
{
    int rc = kv_cache_check_pairs("kvcu_cache_copy_blocks", c, pairs, n, err);
    if (rc) return rc;
    const int N = c->spec.layout.n_blocks;
    if (n == 0) return KV_OK;
    if (n > c->pairs_cap) {
        cudaFree(c->d_pairs);
        c->d_pairs = NULL;
        c->pairs_cap = 0;
        KVCU_ALLOC_TRY(&c->d_pairs, (size_t)n * sizeof(kv_block_copy), err);
        c->pairs_cap = n;
    }
    KV_CUDA_TRY(cudaMemcpy(c->d_pairs, pairs, (size_t)n * sizeof(kv_block_copy),
                           cudaMemcpyHostToDevice), err);
    /* The blocks of one launch copy at the same time, which equals the list order only if no
     * pair reads or overwrites a block an earlier pair of the launch writes, or overwrites one
     * it reads. A step's copy-on-write list always qualifies (each dst is a fresh block), so
     * it is one launch; any other list is cut where that rule would break. */
    int *wrote = c->seg_mark, *read = c->seg_mark + N; /* [N] each, all 0 between calls */
    for (int start = 0, i = 0; i <= n; i++) {
        const int cut = i == n || wrote[pairs[i].src] || wrote[pairs[i].dst] || read[pairs[i].dst];
        if (cut && i > start) {
            dim3 grid(i - start, c->n_planes * c->n_layers, c->n_kv_heads);
            KV_LAUNCH(copy_blocks_kernel, grid, COPY_THREADS, 0, 0, c->d_pairs + start,
                      c->d_planes, c->d_fmt, c->n_layers, c->rows, c->spec.layout.block_size,
                      c->head_dim);
            for (int j = start; j < i; j++) wrote[pairs[j].dst] = read[pairs[j].src] = 0;
            start = i;
        }
        if (i < n) {
            read[pairs[i].src] = 1;
            wrote[pairs[i].dst] = 1;
        }
    }
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

/* ---- chapter 07: block I/O for the host tier ---------------------------------------------------
 * A host block holds one pool block, every layer, K and V, every KV head, codes then metadata:
 *   [L][K, V][H_kv] ( codes [B][row_bytes], meta [entries of B rows] )
 * exactly kv_cache_block_bytes()'s order, so a host tier is readable by either device. A
 * read gathers the listed blocks with one kernel into a device staging buffer [n][block bytes]
 * (pair order), then copies it to the host; a write copies the host blocks into the staging
 * buffer, then scatters them with one kernel. The host side of each copy is one
 * cudaMemcpyAsync per run of consecutive host blocks (a tier hands out consecutive blocks,
 * so a swap is normally one copy), and the call waits once, at its end. */

/* Bytes of one head's B rows of a plane in a host block: codes then metadata. */
static __host__ __device__ inline int64_t head_block_bytes(const kv_cache_plane *p, int fmt,
                                                           int block_size, int d)
{
    const int64_t meta = p->meta ? kvq_meta_index(fmt, p->role, block_size, 0, d) -
                                       kvq_meta_index(fmt, p->role, 0, 0, d)
                                 : 0;
    return (int64_t)block_size * p->row_bytes + meta * 4;
}

size_t kvcu_cache_block_bytes(const kvcu_cache *c) { return c ? kv_cache_block_bytes(c) : 0; }

/* Block (i, part, h): pair i, part = n_planes·layer + plane (0 K, 1 V) in the host block's
 * order, kv head h. to_stage: pool block pairs[i].src -> staged block i; else staged block i -> pool block
 * pairs[i].dst. stage [n][block_bytes]. */
__global__ void block_io_kernel(const kv_block_copy *pairs, const kv_cache_plane *planes,
                                int n_planes, const int *fmt, int n_layers, int n_kv_heads, int rows,
                                int block_size, int d, uint8_t *stage, int64_t block_bytes,
                                int to_stage)
{
    const int i = blockIdx.x, part = blockIdx.y, h = blockIdx.z;
    int64_t at = 0; /* where (part, h) starts inside a host block */
    for (int q = 0; q < part; q++)
        at += n_kv_heads * head_block_bytes(&planes[(q % n_planes) * n_layers + q / n_planes],
                                            fmt[q / n_planes], block_size, d);
    const int l = part / n_planes, f = fmt[l];
    const kv_cache_plane p = planes[(part % n_planes) * n_layers + l];
    const int role = p.role;
    const int64_t code_bytes = (int64_t)block_size * p.row_bytes;
    at += h * head_block_bytes(&p, f, block_size, d);
    uint8_t *s = stage + i * block_bytes + at;
    const int64_t r0 = (int64_t)(to_stage ? pairs[i].src : pairs[i].dst) * block_size;
    uint8_t *codes = p.codes + ((int64_t)h * rows + r0) * p.row_bytes; /* [B][row_bytes] */
    if (to_stage) block_copy_bytes(s, codes, code_bytes);
    else block_copy_bytes(codes, s, code_bytes);
    if (!p.meta) return;
    const int64_t m0 = kvq_meta_index(f, role, r0, 0, d);
    const int64_t mn = kvq_meta_index(f, role, r0 + block_size, 0, d) - m0;
    uint8_t *meta = (uint8_t *)p.meta + ((int64_t)h * p.meta_entries + m0) * 4;
    if (to_stage) block_copy_bytes(s + code_bytes, meta, mn * 4);
    else block_copy_bytes(meta, s + code_bytes, mn * 4);
}

/* The checks of both directions. dev_is_src: the pool block is pairs[i].src. A write list
 * naming a pool block twice is refused: its blocks are scattered at the same time, so the
 * last pair would not surely win. */
static int block_io_check(kvcu_cache *c, const kv_block_copy *pairs, int n, const void *host,
                          size_t block_bytes, int dev_is_src, const char *who, kv_err *err)
{
    int rc = kv_cache_check_block_io(who, c, pairs, n, host, block_bytes, dev_is_src, err);
    if (rc || dev_is_src) return rc;
    for (int i = 0; i < n && !rc; i++) /* the device's own rule (above) */
        if (c->seg_mark[pairs[i].dst]++)
            rc = kv_fail(err, KV_ERR_ARG, "%s: pool block %d is written twice", who, pairs[i].dst);
    for (int i = 0; i < n; i++) c->seg_mark[pairs[i].dst] = 0; /* all 0 between calls */
    return rc;
}

/* block_io_check(), then the pairs on the device (c->d_pairs). */
static int block_io_prepare(kvcu_cache *c, const kv_block_copy *pairs, int n, const void *host,
                            size_t block_bytes, int dev_is_src, const char *who, kv_err *err)
{
    int rc = block_io_check(c, pairs, n, host, block_bytes, dev_is_src, who, err);
    if (rc || n == 0) return rc;
    if (n > c->pairs_cap) {
        cudaFree(c->d_pairs);
        c->d_pairs = NULL;
        c->pairs_cap = 0;
        KVCU_ALLOC_TRY(&c->d_pairs, (size_t)n * sizeof(kv_block_copy), err);
        c->pairs_cap = n;
    }
    KV_CUDA_TRY(cudaMemcpy(c->d_pairs, pairs, (size_t)n * sizeof(kv_block_copy),
                           cudaMemcpyHostToDevice), err);
    return KV_OK;
}

/* One cudaMemcpyAsync per run of pairs whose host blocks are consecutive: staged blocks
 * i .. j-1 and host blocks hb(i) .. hb(i)+j-i-1 (hb: the pair's host side). */
static cudaError_t copy_runs(uint8_t *stage, uint8_t *host, const kv_block_copy *pairs, int n,
                             size_t bb, int host_is_dst, cudaStream_t stream)
{
    for (int i = 0, j; i < n; i = j) {
        const int h0 = host_is_dst ? pairs[i].dst : pairs[i].src;
        for (j = i + 1; j < n && (host_is_dst ? pairs[j].dst : pairs[j].src) == h0 + (j - i); j++)
            ;
        uint8_t *hp = host + (size_t)h0 * bb, *sp = stage + (size_t)i * bb;
        const size_t bytes = (size_t)(j - i) * bb;
        cudaError_t e = host_is_dst
                            ? cudaMemcpyAsync(hp, sp, bytes, cudaMemcpyDeviceToHost, stream)
                            : cudaMemcpyAsync(sp, hp, bytes, cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

int kvcu_cache_read_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n, uint8_t *host,
                           size_t block_bytes, kv_err *err)
{
    int rc = block_io_prepare(c, pairs, n, host, block_bytes, 1, "kvcu_cache_read_blocks", err);
    if (rc || n == 0) return rc;
    uint8_t *stage = NULL; /* [n][block_bytes] */
    KVCU_ALLOC_TRY(&stage, (size_t)n * block_bytes, err);
    dim3 grid(n, c->n_planes * c->n_layers, c->n_kv_heads);
    KV_LAUNCH(block_io_kernel, grid, COPY_THREADS, 0, 0, c->d_pairs, c->d_planes, c->n_planes, c->d_fmt,
              c->n_layers, c->n_kv_heads, c->rows, c->spec.layout.block_size, c->head_dim, stage,
              (int64_t)block_bytes, 1);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = copy_runs(stage, host, pairs, n, block_bytes, 1, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaFree(stage);
    KV_CUDA_TRY(e, err);
    return KV_OK;
}

int kvcu_cache_write_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n,
                            const uint8_t *host, size_t block_bytes, kv_err *err)
{
    int rc = block_io_prepare(c, pairs, n, host, block_bytes, 0, "kvcu_cache_write_blocks", err);
    if (rc || n == 0) return rc;
    uint8_t *stage = NULL; /* [n][block_bytes] */
    KVCU_ALLOC_TRY(&stage, (size_t)n * block_bytes, err);
    cudaError_t e = copy_runs(stage, (uint8_t *)host, pairs, n, block_bytes, 0, 0);
    if (e == cudaSuccess) {
        dim3 grid(n, c->n_planes * c->n_layers, c->n_kv_heads);
        KV_LAUNCH(block_io_kernel, grid, COPY_THREADS, 0, 0, c->d_pairs, c->d_planes, c->n_planes, c->d_fmt,
                  c->n_layers, c->n_kv_heads, c->rows, c->spec.layout.block_size, c->head_dim, stage,
                  (int64_t)block_bytes, 0);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaFree(stage);
    KV_CUDA_TRY(e, err);
    return KV_OK;
}

/* ---- chapter 07: asynchronous block I/O on a copy stream -------------------------------------
 * The same gather / scatter and host copies, issued on a stream of their own and finished by
 * an event, so a prefetch overlaps the steps the default stream runs. The stream is created
 * non-blocking: the legacy default stream would otherwise wait for it (and it for the
 * default stream) at every launch, and nothing would overlap. Ordering is then explicit:
 *  - a job waits (cudaStreamWaitEvent) for everything the default stream was given before
 *    it, so a gather sees the rows the last step wrote and a scatter cannot overtake a kernel
 *    still reading the block's previous owner;
 *  - the default stream never waits for a job: it must not read the job's blocks before
 *    io_wait(ticket). kv_swap_prefetch() writes only blocks in no table, and kv_swap_in()
 *    calls io_wait before the slot's table (device copy included) points at them, so no
 *    kernel of a step can reach them earlier. Reads (evictions) are of a paused sequence's
 *    blocks, in no table either.
 * Each job has its own staging buffer, device pair list and pinned host pair list, reused
 * only after its event has completed, so up to KVCU_IO_JOBS copies are in flight at once. */

typedef struct {
    int64_t ticket;          /* the ticket this job last carried (0: never used) */
    cudaEvent_t ready;       /* on the default stream: the work before the job */
    cudaEvent_t done;        /* on the copy stream: the job itself */
    uint8_t *stage;          /* device [n][block_bytes] */
    size_t stage_cap;
    kv_block_copy *d_pairs;  /* device [n] */
    kv_block_copy *h_pairs;  /* pinned host [n]: the source of an asynchronous upload */
    int pairs_cap;
} kvcu_io_job;

struct kvcu_io {
    cudaStream_t stream;     /* the copy stream, non-blocking */
    kvcu_io_job job[KVCU_IO_JOBS];
    int64_t issued;          /* last ticket handed out */
    int64_t finished;        /* every ticket <= finished is done */
};

int kvcu_io_create(kvcu_io **out, kv_err *err)
{
    *out = NULL;
    kvcu_io *io = (kvcu_io *)calloc(1, sizeof *io);
    if (!io) return kv_fail(err, KV_ERR_NOMEM, "kvcu_io_create: out of memory");
    cudaError_t e = cudaStreamCreateWithFlags(&io->stream, cudaStreamNonBlocking);
    for (int j = 0; j < KVCU_IO_JOBS && e == cudaSuccess; j++) {
        kvcu_io_job *b = &io->job[j];
        e = cudaEventCreateWithFlags(&b->ready, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        kvcu_io_free(io);
        KV_CUDA_TRY(e, err);
    }
    *out = io;
    return KV_OK;
}

void kvcu_io_free(kvcu_io *io)
{
    if (!io) return;
    if (io->stream) cudaStreamSynchronize(io->stream); /* no copy may outlive its buffers */
    for (int j = 0; j < KVCU_IO_JOBS; j++) {
        kvcu_io_job *b = &io->job[j];
        if (b->ready) cudaEventDestroy(b->ready);
        if (b->done) cudaEventDestroy(b->done);
        cudaFree(b->stage);
        cudaFree(b->d_pairs);
        if (b->h_pairs) cudaFreeHost(b->h_pairs);
    }
    if (io->stream) cudaStreamDestroy(io->stream);
    free(io);
}

int kvcu_io_wait(kvcu_io *io, int64_t ticket, kv_err *err)
{
    if (!io || ticket > io->issued)
        return kv_fail(err, KV_ERR_ARG, "kvcu_io_wait: ticket %lld was never issued",
                       (long long)ticket);
    if (ticket <= io->finished) return KV_OK;
    /* a job's slot is reused only after its ticket finished, so the slot still holds it; the
     * stream runs jobs in order, so every earlier ticket is done too */
    KV_CUDA_TRY(cudaEventSynchronize(io->job[ticket % KVCU_IO_JOBS].done), err);
    io->finished = ticket;
    return KV_OK;
}

/* The job slot of the next ticket, free (its last copy done) and big enough for n blocks. */
static int io_job_take(kvcu_io *io, int n, size_t block_bytes, kvcu_io_job **out, kv_err *err)
{
    kvcu_io_job *j = &io->job[(io->issued + 1) % KVCU_IO_JOBS];
    if (j->ticket > io->finished) {
        int rc = kvcu_io_wait(io, j->ticket, err);
        if (rc) return rc;
    }
    const size_t bytes = (size_t)n * block_bytes;
    if (bytes > j->stage_cap) {
        cudaFree(j->stage);
        j->stage = NULL;
        j->stage_cap = 0;
        KVCU_ALLOC_TRY(&j->stage, bytes, err);
        j->stage_cap = bytes;
    }
    if (n > j->pairs_cap) {
        cudaFree(j->d_pairs);
        if (j->h_pairs) cudaFreeHost(j->h_pairs);
        j->d_pairs = NULL;
        j->h_pairs = NULL;
        j->pairs_cap = 0;
        KVCU_ALLOC_TRY(&j->d_pairs, (size_t)n * sizeof(kv_block_copy), err);
        KV_CUDA_TRY(cudaHostAlloc(&j->h_pairs, (size_t)n * sizeof(kv_block_copy),
                                  cudaHostAllocDefault), err);
        j->pairs_cap = n;
    }
    *out = j;
    return KV_OK;
}

/* Issue one job: to_host gathers pool blocks to the host, else scatters host blocks into the
 * pool; *ticket = its ticket (0 for an empty list: nothing to wait for). */
static int io_issue(kvcu_cache *c, kvcu_io *io, const kv_block_copy *pairs, int n,
                    uint8_t *host, size_t block_bytes, int to_host, int64_t *ticket,
                    const char *who, kv_err *err)
{
    *ticket = 0;
    if (!io) return kv_fail(err, KV_ERR_ARG, "%s: no copy stream", who);
    int rc = block_io_check(c, pairs, n, host, block_bytes, to_host, who, err);
    if (rc || n == 0) return rc;
    kvcu_io_job *j = NULL;
    rc = io_job_take(io, n, block_bytes, &j, err);
    if (rc) return rc;
    memcpy(j->h_pairs, pairs, (size_t)n * sizeof *pairs);
    cudaStream_t s = io->stream;
    KV_CUDA_TRY(cudaEventRecord(j->ready, 0), err); /* the default stream's work so far */
    KV_CUDA_TRY(cudaStreamWaitEvent(s, j->ready, 0), err);
    KV_CUDA_TRY(cudaMemcpyAsync(j->d_pairs, j->h_pairs, (size_t)n * sizeof(kv_block_copy),
                                cudaMemcpyHostToDevice, s), err);
    dim3 grid(n, c->n_planes * c->n_layers, c->n_kv_heads);
    cudaError_t e = cudaSuccess;
    if (!to_host) e = copy_runs(j->stage, host, pairs, n, block_bytes, 0, s);
    if (e == cudaSuccess) {
        KV_LAUNCH(block_io_kernel, grid, COPY_THREADS, 0, s, j->d_pairs, c->d_planes, c->n_planes, c->d_fmt,
                  c->n_layers, c->n_kv_heads, c->rows, c->spec.layout.block_size, c->head_dim,
                  j->stage, (int64_t)block_bytes, to_host);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess && to_host) e = copy_runs(j->stage, host, pairs, n, block_bytes, 1, s);
    if (e == cudaSuccess) e = cudaEventRecord(j->done, s);
    KV_CUDA_TRY(e, err);
    j->ticket = *ticket = ++io->issued;
    return KV_OK;
}

int kvcu_cache_read_blocks_async(kvcu_cache *c, kvcu_io *io, const kv_block_copy *pairs, int n,
                                 uint8_t *host, size_t block_bytes, int64_t *ticket,
                                 kv_err *err)
{
    return io_issue(c, io, pairs, n, host, block_bytes, 1, ticket,
                    "kvcu_cache_read_blocks_async", err);
}

int kvcu_cache_write_blocks_async(kvcu_cache *c, kvcu_io *io, const kv_block_copy *pairs,
                                  int n, const uint8_t *host, size_t block_bytes,
                                  int64_t *ticket, kv_err *err)
{
    return io_issue(c, io, pairs, n, (uint8_t *)host, block_bytes, 0, ticket,
                    "kvcu_cache_write_blocks_async", err);
}

int kvcu_cache_write_slots(kvcu_cache *c, int layer, const int64_t *slots, int n, const float *k,
                           const float *v, kv_err *err)
{
    int rc = kv_cache_check_slots("kvcu_cache_write_slots", c, layer, slots, n, k, v, err);
    if (rc) return rc;
    if (n == 0) return KV_OK;
    int64_t *ds = NULL; /* [n] the mapping, on the device */
    KVCU_ALLOC_TRY(&ds, (size_t)n * sizeof(int64_t), err);
    cudaError_t e = cudaMemcpy(ds, slots, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(ds);
        return kv_fail(err, KVCU_STATUS(kvcu_clear_error(e)), "kvcu_cache_write_slots: %s",
                       cudaGetErrorString(e));
    }
    rc = kvcu_cache_encode_slots(c, layer, ds, n, k, v, err);
    e = kvcu_clear_error(cudaFree(ds)); /* waits for the kernel */
    if (rc) return rc;
    return e == cudaSuccess ? KV_OK
                            : kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write_slots: %s",
                                      cudaGetErrorString(e));
}
