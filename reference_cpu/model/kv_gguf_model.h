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

/** Read the config alone (no weights): what kv_gguf_model_load() allocates for. */
int kv_gguf_model_config(const kv_gguf *g, kv_config *c, kv_err *err);

/** 1 when @p path starts with the GGUF magic ("GGUF"), else 0 (also when it cannot be read). */
int kv_model_path_is_gguf(const char *path);

#ifdef __cplusplus
}
#endif
#endif
