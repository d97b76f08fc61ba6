/*
 * memops.cpp: the memory operations of kvemu_memops.h: the alignment fault of a vector load,
 * and cp.async as deferred copies with checked commit/wait order.
 *
 * Each CUDA thread of a worker's running block has its own list of copies in flight, indexed
 * like the worker's fibers; a copy is open (batch 0) until the thread commits, then carries
 * the number of its batch (1, 2, ...). A wait for all but N batches lands every copy whose
 * batch is at most committed - N. kvemu_cp_block_start() (block.cpp) drops what the previous
 * block left in flight: a thread that exits without waiting leaves its destinations poisoned.
 */
#include "kvemu_internal.h"
#include "kvemu_memops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

namespace {

struct copy {
    void *dst;
    unsigned char bytes[16];
    size_t size;
    int batch; /* 0: not yet committed */
};

struct thread_pipe {
    std::vector<copy> inflight;
    int committed = 0; /* batches committed so far */
};

thread_local std::vector<thread_pipe> pipes; /* [1024] by fiber index, per worker */
thread_local bool used; /* some thread of the running block called a __pipeline_* */

void where(char *buf, size_t n)
{
    kvemu_worker *w = kvemu_cur_worker;
    if (!w || !w->cur || !w->job) {
        snprintf(buf, n, "outside a kernel");
        return;
    }
    const kvemu_fiber *f = w->cur;
    snprintf(buf, n, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", w->job->name,
             w->block_idx.x, w->block_idx.y, w->block_idx.z, f->tid.x, f->tid.y, f->tid.z);
}

[[noreturn]] void die(const char *fmt, const void *p, size_t a)
{
    char at[256];
    where(at, sizeof at);
    fprintf(stderr, "kvemu: ");
    fprintf(stderr, fmt, p, a);
    fprintf(stderr, " in %s (on a GPU: cudaErrorMisalignedAddress, the context is lost)\n", at);
    fflush(stderr);
    abort();
}

thread_pipe &mine()
{
    kvemu_worker *w = kvemu_cur_worker;
    if (!w || !w->cur) {
        fprintf(stderr, "kvemu: a __pipeline_* call outside a kernel\n");
        abort();
    }
    if (pipes.size() < 1024) pipes.resize(1024);
    used = true;
    return pipes[(size_t)(w->cur - w->fibers)];
}

} // namespace

void kvemu_misaligned(const void *p, int bytes, const char *what)
{
    char fmt[128];
    snprintf(fmt, sizeof fmt, "misaligned %s (%d bytes) at address %%p (%%zu bytes past a "
             "%d-byte boundary)", what, bytes, bytes);
    die(fmt, p, (size_t)((uintptr_t)p % (uintptr_t)bytes));
}

void kvemu_cp_async(void *dst, const void *src, size_t size, size_t zfill)
{
    if (size != 4 && size != 8 && size != 16) {
        fprintf(stderr, "kvemu: __pipeline_memcpy_async of %zu bytes (cp.async copies 4, 8 or "
                "16)\n", size);
        abort();
    }
    if (zfill > size) {
        fprintf(stderr, "kvemu: __pipeline_memcpy_async: zfill %zu > size %zu\n", zfill, size);
        abort();
    }
    kvemu_check_align(dst, (int)size, "cp.async destination");
    kvemu_check_align(src, (int)size, "cp.async source");
    thread_pipe &t = mine();
    copy c;
    c.dst = dst;
    c.size = size;
    c.batch = 0;
    memset(c.bytes, 0, sizeof c.bytes);
    memcpy(c.bytes, src, size - zfill); /* the source as it is now; the rest are zeros */
    memset(dst, 0xff, size);            /* poison until the wait that lands it */
    t.inflight.push_back(c);
}

void kvemu_cp_commit(void)
{
    thread_pipe &t = mine();
    t.committed++;
    for (copy &c : t.inflight)
        if (c.batch == 0) c.batch = t.committed;
}

void kvemu_cp_wait_prior(size_t prior)
{
    thread_pipe &t = mine();
    const long done = (long)t.committed - (long)prior; /* batches 1 .. done have landed */
    size_t keep = 0;
    for (size_t i = 0; i < t.inflight.size(); i++) {
        copy &c = t.inflight[i];
        if (c.batch != 0 && c.batch <= done) memcpy(c.dst, c.bytes, c.size);
        else t.inflight[keep++] = c;
    }
    t.inflight.resize(keep);
}

int kvemu_cp_pending(void) { return (int)mine().inflight.size(); }

void kvemu_cp_block_start(void)
{
    if (!used) return;
    for (thread_pipe &t : pipes) {
        t.inflight.clear();
        t.committed = 0;
    }
    used = false;
}
