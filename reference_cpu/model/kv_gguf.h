/**
 * @file kv_gguf.h
 * GGUF files (versions 2 and 3): the metadata, the tensor table and the tensors' bytes.
 *
 * GGUF is llama.cpp's model file: a header, a list of typed key/value pairs (the model's
 * hyperparameters and its tokenizer), a table of tensors (name, shape, ggml type, offset) and
 * the tensors' data, each tensor aligned within the data section. kv_gguf_open() maps the file
 * read-only and checks every count, length and offset against it before anything is read, so
 * a hostile file is refused with KV_ERR_FORMAT naming the field, never read out of bounds.
 * The layout is drawn in kv_gguf.c.
 *
 * Strings in the file are bytes with a length, not NUL-terminated: a kv_gguf_str points into
 * the mapping and is valid until kv_gguf_close(). The getters take a NUL-terminated key.
 * The weights' element types (F32, F16, Q4_1, Q8_0, ...) are ggml's codes, kv_gguf_quant.h.
 */
#ifndef KV_GGUF_H
#define KV_GGUF_H

#include <stdint.h>

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A string in the file: @c n bytes at @c s, NOT NUL-terminated. */
typedef struct {
    const char *s;
    uint64_t n;
} kv_gguf_str;

/** The file's metadata value-type codes. */
enum {
    KV_GGUF_U8 = 0, KV_GGUF_I8, KV_GGUF_U16, KV_GGUF_I16, KV_GGUF_U32, KV_GGUF_I32,
    KV_GGUF_F32, KV_GGUF_BOOL, KV_GGUF_STRING, KV_GGUF_ARRAY, KV_GGUF_U64, KV_GGUF_I64,
    KV_GGUF_F64,
    KV_GGUF_TYPE_COUNT
};

/** Largest n_dims of a tensor (ggml's GGML_MAX_DIMS). */
#define KV_GGUF_MAX_DIMS 4

/** One tensor of the file's table. */
typedef struct {
    kv_gguf_str name;
    int n_dims;
    int64_t ne[4];       /* ne[0] = row length (fastest); ne[i] = 1 for i >= n_dims */
    int type;            /* ggml type code (kv_gguf_quant.h) */
    uint64_t offset;     /* from the start of the data section */
    uint64_t nbytes;     /* checked against the file at open */
    const void *data;    /* into the mapped file */
} kv_gguf_tensor;

/** An open GGUF file (opaque). */
typedef struct kv_gguf kv_gguf;

/**
 * Map and parse @p path. KV_ERR_IO when it cannot be opened or is not a regular file;
 * KV_ERR_FORMAT naming the field for anything malformed (magic, version 1 or unknown, a length
 * or count past the file, an unknown value or tensor type, a duplicate key or tensor name, a
 * misaligned or out-of-file tensor); KV_ERR_NOMEM. On failure *out is NULL.
 */
int kv_gguf_open(const char *path, kv_gguf **out, kv_err *err);
/** Unmap and free (NULL is fine). */
void kv_gguf_close(kv_gguf *g);

/** The file's GGUF version (2 or 3). */
int kv_gguf_version(const kv_gguf *g);
/** The data section's alignment (general.alignment, 32 by default). */
uint64_t kv_gguf_alignment(const kv_gguf *g);
/** File size in bytes and the data section's offset in the file. */
uint64_t kv_gguf_file_size(const kv_gguf *g);
uint64_t kv_gguf_data_offset(const kv_gguf *g);

/* KV_ERR_FORMAT naming the key when it is missing or of the wrong type */
int kv_gguf_get_int(const kv_gguf *g, const char *key, int64_t *out, kv_err *err);   /* any int or bool */
int kv_gguf_get_float(const kv_gguf *g, const char *key, double *out, kv_err *err);  /* f32/f64 (ints too) */
int kv_gguf_get_str(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_err *err);
int kv_gguf_has(const kv_gguf *g, const char *key);                                  /* 1/0 */
/* an array of strings: *strs owned by g, valid until close */
int kv_gguf_get_strings(const kv_gguf *g, const char *key, const kv_gguf_str **strs, uint64_t *n,
                        kv_err *err);
/* an array of numbers: raw little-endian elements in the file (may be unaligned) */
int kv_gguf_get_array(const kv_gguf *g, const char *key, int *elem_type, uint64_t *n,
                      const void **data, kv_err *err);
double kv_gguf_array_num(int elem_type, const void *data, uint64_t i);  /* element i, memcpy-read */

/** A metadata entry, for listing them all (kvlab info). */
typedef struct {
    kv_gguf_str key;
    int type;           /* KV_GGUF_* */
    /* type ARRAY: the elements' type and count; for an array of arrays, elem_type is ARRAY */
    int elem_type;
    uint64_t n;
    const void *value;  /* into the mapping: a number's bytes; for ARRAY its first element */
    kv_gguf_str str;    /* type STRING: the value */
} kv_gguf_kv;

/** Number of metadata entries, and entry @p i in file order (NULL when out of range). */
int64_t kv_gguf_n_kv(const kv_gguf *g);
const kv_gguf_kv *kv_gguf_kv_at(const kv_gguf *g, int64_t i);
/** Name of a value-type code ("u32", "string", "array", ...; "?" when unknown). */
const char *kv_gguf_type_name(int type);

int64_t kv_gguf_n_tensors(const kv_gguf *g);
const kv_gguf_tensor *kv_gguf_tensor_at(const kv_gguf *g, int64_t i);
const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name);  /* NULL if absent */

/** 1 when @p s holds exactly the NUL-terminated @p z. */
int kv_gguf_str_eq(kv_gguf_str s, const char *z);

#ifdef __cplusplus
}
#endif
#endif
