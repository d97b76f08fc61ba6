/* Status codes, error messages, aligned allocation and the clock (kv_common.h). */
#define _POSIX_C_SOURCE 200809L
#include "kv_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

void *kv_calloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    /* round up so aligned_alloc's size-multiple-of-alignment rule holds */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL; /* overflow */
    void *p = aligned_alloc(64, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

void kv_free(void *p) { free(p); }

double kv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
