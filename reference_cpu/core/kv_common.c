/* Status codes, error messages, aligned allocation and the clock (kv_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

int kv_fail(kv_err *err, int status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

const char *kv_status_name(int status)
{
    switch (status) {
    case KV_OK: return "KV_OK";
    case KV_ERR_ARG: return "KV_ERR_ARG";
    case KV_ERR_IO: return "KV_ERR_IO";
    case KV_ERR_FORMAT: return "KV_ERR_FORMAT";
    case KV_ERR_NOMEM: return "KV_ERR_NOMEM";
    case KV_ERR_CAPACITY: return "KV_ERR_CAPACITY";
    case KV_ERR_DEVICE: return "KV_ERR_DEVICE";
    case KV_ERR_UNSUPPORTED: return "KV_ERR_UNSUPPORTED";
    default: return "KV_ERR_UNKNOWN";
    }
}

/* From this size on, kv_calloc() asks for 2 MiB pages (see below). */
#define KV_HUGE_MIN ((size_t)8 << 20)
#define KV_HUGE_PAGE ((size_t)2 << 20)

void *kv_calloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    /* Large buffers (a cache's planes, a model's weights) are read from end to end, or, paged,
     * block by block in any order; with 4 KiB pages every few blocks is a TLB miss, and on a
     * virtual machine each miss walks two levels of page tables. So they are aligned to 2 MiB
     * and offered to the kernel's transparent huge pages (Linux, where THP is "madvise" or
     * "always"; elsewhere, or when refused, plain pages: the same memory, only slower). */
    const size_t align = bytes >= KV_HUGE_MIN ? KV_HUGE_PAGE : 64;
    /* round up so aligned_alloc's size-multiple-of-alignment rule holds */
    size_t rounded = (bytes + align - 1) & ~(align - 1);
    if (rounded < bytes) return NULL; /* overflow */
    void *p = aligned_alloc(align, rounded);
    if (!p) return NULL;
#ifdef MADV_HUGEPAGE
    if (align == KV_HUGE_PAGE) (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice only */
#endif
    memset(p, 0, rounded);
    return p;
}

void kv_free(void *p) { free(p); }

double kv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
