/**
 * @file kv_common.h
 * Status codes, error messages and small helpers shared by every kvlab module.
 *
 * The libraries never exit: a function that can fail returns a ::kv_status and, when the
 * caller passed a ::kv_err, a message that names what was wrong. Only the CLI decides to exit.
 */
#ifndef KV_COMMON_H
#define KV_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KV_VERSION_STRING "0.1.0"

/** Status returned by every fallible kvlab function (0 is success). */
typedef enum {
    KV_OK = 0,
    KV_ERR_ARG = 1,        /**< an argument or config is invalid or unsupported */
    KV_ERR_IO = 2,         /**< a file could not be opened, read or written */
    KV_ERR_FORMAT = 3,     /**< a file's content is malformed (magic, sizes, values) */
    KV_ERR_NOMEM = 4,      /**< host or device memory could not be allocated */
    KV_ERR_CAPACITY = 5,   /**< a cache, pool or buffer is full */
    KV_ERR_DEVICE = 6,     /**< a CUDA call failed, or no usable device */
    KV_ERR_UNSUPPORTED = 7 /**< a combination of features kvlab does not implement */
} kv_status;

/** Error message buffer filled by failing functions. */
typedef struct {
    char msg[512];
} kv_err;

/** Fill @p err (may be NULL) with a printf-style message; returns @p status. */
int kv_fail(kv_err *err, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/** Short name of a status code ("KV_ERR_FORMAT", ...). */
const char *kv_status_name(int status);

/** Allocate @p bytes aligned to 64 bytes (from 8 MiB on: to 2 MiB, offered to transparent huge
 * pages), zero-filled; NULL on failure (or when bytes == 0). */
void *kv_calloc(size_t bytes);
/** Free memory from kv_calloc (NULL is fine). */
void kv_free(void *p);

/** Monotonic wall clock in seconds. */
double kv_now(void);

#ifdef __cplusplus
}
#endif
#endif
