/**
 * @file kv_gguf_model.h
 * A Llama model from a GGUF file: its config from the llama.* metadata, its weights
 * dequantized to fp32 into a kv_model (kv_model.h).
 *
 * Only architecture "llama" is read (general.architecture); others are refused by name.
 * Every tensor's shape is checked against the config before a byte of it is read.
 */
#ifndef KV_GGUF_MODEL_H
#define KV_GGUF_MODEL_H

#include "kv_gguf.h"
#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Fill @p m (fp32, every tensor dequantized) from the open file @p g, arch "llama".
 * KV_ERR_UNSUPPORTED for another architecture or a tensor type kvlab has no dequantizer for;
 * KV_ERR_FORMAT naming the key or tensor (and expected/found shape) for anything else.
 * On failure @p m is left zeroed.
 */
int kv_gguf_model_load(const kv_gguf *g, kv_model *m, kv_err *err);

/** Called after each tensor: @p done of @p total weights dequantized. */
typedef void (*kv_gguf_progress)(void *ctx, int64_t done, int64_t total);
/** kv_gguf_model_load() with a progress callback (may be NULL): the library prints nothing,
 * a caller that loads a large model says how far it is. */
int kv_gguf_model_load_progress(const kv_gguf *g, kv_model *m, kv_gguf_progress progress,
                                void *ctx, kv_err *err);

/** How a model's matrices are held (`--weights` on the CPU). The RMSNorm gains are fp32 in
 * every case. */
typedef enum {
    KV_WEIGHTS_F32 = 0, /**< dequantized to fp32 (kv_gguf_model_load()) */
    KV_WEIGHTS_NATIVE,  /**< the file's own blocks, copied as stored (Q4_1, Q8_0, Q4_K, ...) */
    KV_WEIGHTS_Q8_0,    /**< every row re-quantized to Q8_0 (ggml's quantize_row_q8_0) */
    KV_WEIGHTS_F16      /**< every row rounded to binary16 */
} kv_weights_storage;

/** "f32", "native", "q8_0", "f16"; NULL for another value. */
const char *kv_weights_storage_name(int storage);
/** The storage a name spells (the names above; "fp32" too), or -1. */
int kv_weights_storage_parse(const char *name);

/**
 * kv_gguf_model_load_progress() keeping the matrices in @p storage (kv_weights_storage):
 * kv_model.mats describes them (kv_linear.h multiplies them), kv_model.data holds the RMSNorm
 * gains alone, and the embedding row of a token is dequantized as it is read. KV_WEIGHTS_F32
 * is kv_gguf_model_load_progress(). Q8_0 needs rows that are multiples of 32 weights
 * (KV_ERR_UNSUPPORTED naming the tensor otherwise); a row already in the storage type is
 * copied. Every row is dequantized once at load and checked finite (KV_ERR_FORMAT naming the
 * tensor and row).
 */
int kv_gguf_model_load_as(const kv_gguf *g, kv_model *m, int storage,
                          kv_gguf_progress progress, void *ctx, kv_err *err);

/** Read the config alone (no weights): what kv_gguf_model_load() allocates for. */
int kv_gguf_model_config(const kv_gguf *g, kv_config *c, kv_err *err);

/** 1 when @p path starts with the GGUF magic ("GGUF"), else 0 (also when it cannot be read). */
int kv_model_path_is_gguf(const char *path);

#ifdef __cplusplus
}
#endif
#endif
