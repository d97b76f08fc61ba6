/**
 * @file kv_sha256.h
 * SHA-256 (FIPS 180-4), to check that a shipped model file is the one its card describes.
 *
 * Streaming: kv_sha256_init, kv_sha256_update any number of times, kv_sha256_final. Plain C,
 * one byte order on every machine (the message is read as big-endian 32-bit words).
 */
#ifndef KV_SHA256_H
#define KV_SHA256_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t h[8];         /* the running hash state */
    uint64_t bytes;        /* message length so far */
    unsigned char buf[64]; /* [64] the block being filled */
    int fill;              /* bytes in buf */
} kv_sha256;

void kv_sha256_init(kv_sha256 *s);
void kv_sha256_update(kv_sha256 *s, const void *data, size_t n);
/** The 32-byte digest; @p hex (may be NULL) receives its 64 lowercase hex digits + NUL. */
void kv_sha256_final(kv_sha256 *s, unsigned char digest[32], char hex[65]);

/** SHA-256 of a whole file as 64 hex digits + NUL (KV_ERR_IO when it cannot be read). */
int kv_sha256_file(const char *path, char hex[65], kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
