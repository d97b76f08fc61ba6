/**
 * @file kv_model.h
 * Weights of a Llama-style model, in the llama2.c order and layout.
 *
 * Every matrix is row-major [out][in], so y = W x is y[i] = sum_j W[i][j] x[j].
 * An MLA model (config.attn KV_ATTN_MLA, chapter 11) holds its attention weights where an
 * MHA/GQA model holds wq, wk, wv, wo (those stay NULL): kv_mla.h's tensors, each for every
 * layer in turn, and kv_model.mla points each layer's kv_mla_layer into them.
 */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include "kv_config.h"
#include "kv_mla.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float *token_embedding; /* [vocab][dim] */
    float *rms_att;         /* [L][dim] */
    float *wq;              /* [L][H*d][dim]      (MHA/GQA; NULL for MLA) */
    float *wk;              /* [L][H_kv*d][dim]   (MHA/GQA) */
    float *wv;              /* [L][H_kv*d][dim]   (MHA/GQA) */
    float *wo;              /* [L][dim][H*d]      (MHA/GQA) */
    float *rms_ffn;         /* [L][dim] */
    float *w1;              /* [L][hidden][dim]  gate */
    float *w2;              /* [L][dim][hidden]  down */
    float *w3;              /* [L][hidden][dim]  up   */
    float *rms_final;       /* [dim] */
    float *wcls;            /* [vocab][dim]; == token_embedding when tied */
} kv_weights;

/**
 * A weight matrix as it is stored: @p rows rows of @p cols weights, each row @p row_bytes
 * bytes of ggml type @p type (kv_gguf_quant.h: 0 fp32, 1 binary16, 8 Q8_0, 3 Q4_1, ...).
 * kv_linear.h multiplies one into activations, whatever its type.
 */
typedef struct {
    int type;           /**< ggml type code */
    int rows, cols;     /**< [rows][cols] weights */
    uint64_t row_bytes; /**< bytes of one row */
    const void *data;   /**< [rows][row_bytes] */
} kv_mat;

/** A layer's matrices, in kv_model.mats order; then the classifier and the embedding. */
enum { KV_MAT_Q, KV_MAT_K, KV_MAT_V, KV_MAT_O, KV_MAT_GATE, KV_MAT_DOWN, KV_MAT_UP,
       KV_MAT_PER_LAYER, KV_MAT_CLS = KV_MAT_PER_LAYER, KV_MAT_EMBED };

typedef struct {
    kv_config config;
    kv_weights w;   /* pointers into data */
    float *data;    /* one allocation holding every weight, llama2.c order */
    int64_t n_floats;
    kv_mla_layer *mla; /* [L] MLA: each layer's attention weights, pointing into data; else NULL */
    /* Matrices kept in a storage type of their own (a GGUF file's blocks, Q8_0, binary16:
     * kv_gguf_model_load_as()): [L][KV_MAT_PER_LAYER] then the classifier and the embedding,
     * pointing into blocks; data then holds the RMSNorm gains only and the matrix fields of w
     * are NULL. NULL: every weight is fp32 in data (kv_model_mat() describes them). */
    kv_mat *mats;
    void *blocks;   /* the bytes mats point into */
    int64_t n_block_bytes;
} kv_model;

/**
 * Allocate zeroed weights for a config (validated here) and set the pointers. At most 2^34
 * parameters (64 GiB of fp32): more -> KV_ERR_NOMEM. On failure @p m is left zeroed.
 */
int kv_model_alloc(kv_model *m, const kv_config *c, kv_err *err);
/** Free the weights (safe on a zeroed struct). */
void kv_model_free(kv_model *m);

/**
 * Fill with deterministic random weights (seeded): matrices uniform in ±1/sqrt(fan_in)·scale
 * with scale sqrt(3) (unit-variance outputs), embedding (and an untied wcls) normal with
 * std 2/sqrt(dim) (logits of spread ~2), RMSNorm gains 1. Same seed and config -> identical
 * bytes on every machine. kv_model.c explains the choice.
 */
void kv_model_randomize(kv_model *m, uint64_t seed);

/** Allocate and randomize an embedded default model (kv_config_default + kv_model_randomize). */
int kv_model_default(kv_model *m, kv_default_model which, kv_err *err);

/** KV_OK if every weight is finite, else KV_ERR_FORMAT naming the tensor and index. */
int kv_model_check_finite(const kv_model *m, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
