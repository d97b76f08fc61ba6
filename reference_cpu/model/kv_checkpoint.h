/**
 * @file kv_checkpoint.h
 * Model files: llama2.c's fp32 checkpoint ("legacy" version 0) and kvlab's versioned header.
 *
 * llama2.c layout: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len; negative vocab_size = untied classifier), then fp32 weights in kv_weights order,
 * with two legacy RoPE tables [seq_len][d/2] between rms_final and wcls that kvlab skips.
 *
 * kvlab layout: a 256-byte header (magic "KVLB", version, the seven fields, rope_theta,
 * rotary_dim, norm_eps, tied flag, model kind, zero padding), then the weights in the same
 * order without the RoPE tables. Version 1 holds MHA/GQA models; version 2 adds the attention
 * kind and MLA's dims (chapter 11), and an MLA model's weights carry its attention tensors in
 * place of wq, wk, wv, wo (kv_model.h). Byte offsets: kv_checkpoint.c. llama2.c's later export
 * versions (magic "ak42") are recognised and refused with a message saying so.
 */
#ifndef KV_CHECKPOINT_H
#define KV_CHECKPOINT_H

#include "kv_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The two checkpoint layouts kvlab reads and writes. */
typedef enum {
    KV_FILE_LLAMA2C = 0, /**< llama2.c fp32 checkpoint (legacy version 0) */
    KV_FILE_KVLAB = 1    /**< kvlab header (v1, or v2 for an MLA model) + the same weights */
} kv_file_format;

/**
 * Read a checkpoint of either format (detected by the magic). Validates the header
 * (kv_config_validate), the exact file size, and that every weight is finite; any failure
 * names the problem (KV_ERR_IO / KV_ERR_FORMAT) and leaves @p m zeroed.
 */
int kv_checkpoint_read(const char *path, kv_model *m, kv_err *err);

/**
 * Write @p m in @p format. llama2.c files cannot carry an MLA model, rope_theta != 10000,
 * partial rotary, norm_eps != 1e-5 or a model kind; neither format carries RoPE frequency
 * factors (a GGUF Llama 3.x): KV_ERR_UNSUPPORTED then. The file is written to a
 * temporary name and renamed, so a failure leaves no partial file.
 */
int kv_checkpoint_write(const char *path, const kv_model *m, int format, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
