/**
 * @file kv_config.h
 * Model configuration: the llama2.c checkpoint header fields plus what kvlab adds.
 *
 * Symbols (docs/design.md §2): L = n_layers, H = n_heads, H_kv = n_kv_heads, G = H / H_kv,
 * d = head_dim = dim / H.
 */
#ifndef KV_CONFIG_H
#define KV_CONFIG_H

#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a model's weights are: random (timing) or constructed to recall planted facts. */
typedef enum {
    KV_MODEL_GENERIC = 0,       /**< loaded from a file or random weights */
    KV_MODEL_RECALL_DIRECT = 1, /**< constructed direct-lookup recall model (needle suite) */
    KV_MODEL_RECALL_INDUCTION = 2 /**< constructed previous-token + induction recall model */
} kv_model_kind;

/** A model's attention block: what it caches per token and how it attends. The forward pass
 * runs the block the kind names (engine/kv_attn_block.h) without a branch on it. */
typedef enum {
    KV_ATTN_GQA = 0, /**< MHA, GQA or MQA: H query heads over H_kv cached K/V heads (01-10) */
    KV_ATTN_MLA = 1, /**< multi-head latent attention: one cached latent row per token (11) */
    KV_ATTN_COUNT
} kv_attn_kind;

/** The dims MLA adds to a model's config (names as in DeepSeek's config.json; kv_mla.h). */
typedef struct {
    int d_c;    /**< kv_lora_rank: the cached latent c_KV */
    int d_rope; /**< qk_rope_head_dim: d_R, the shared RoPE key k_R (and each q_R) */
    int d_nope; /**< qk_nope_head_dim: the part of each head's q·k that comes from c_KV */
    int d_v;    /**< v_head_dim */
    int q_rank; /**< q_lora_rank: the query bottleneck; 0 = queries from x directly */
} kv_mla_dims;

/** Most pairs RoPE rotates per head (rotary_dim <= 512; published models rotate <= 128 dims):
 * the size of the per-pair tables (kv_rope_freqs()). */
#define KV_ROPE_MAX_PAIRS 256

typedef struct {
    /* the seven llama2.c header fields */
    int dim;        /**< residual stream width (= H * d) */
    int hidden_dim; /**< SwiGLU hidden width */
    int n_layers;   /**< L */
    int n_heads;    /**< H, query heads */
    int n_kv_heads; /**< H_kv, key/value heads; divides H */
    int vocab_size; /**< tokens in the vocabulary */
    int seq_len;    /**< longest context the model is meant for (cache capacity default) */
    /* fields the llama2.c header lacks (kvlab header v1) */
    float rope_theta; /**< RoPE base, 10000 in llama2.c */
    int rotary_dim;   /**< leading dims of each head that RoPE rotates (even, <= d); d = full, 0 = none */
    float norm_eps;   /**< RMSNorm epsilon, 1e-5 in llama2.c */
    int tied_classifier; /**< 1: the classifier reuses the token embedding */
    int kind;         /**< ::kv_model_kind */
    /* fields of kvlab header v2 (zero in v1 files and llama2.c's) */
    int attn;         /**< ::kv_attn_kind */
    kv_mla_dims mla;  /**< KV_ATTN_MLA: its dims (then n_kv_heads is 1: one latent row per
                       *   token, and rotary_dim is d_R: only q_R and k_R rotate); else zero */
    /* RoPE frequency factors, from a GGUF file only (no kvlab header field holds them):
     * pair i turns at theta^(-2i/rotary_dim) / rope_factors[i] (Llama 3.x's rope_freqs, a
     * linear position scaling's factor in every pair, or both multiplied; kv_rope_freqs()) */
    int n_rope_factors; /**< 0: none (every factor 1), else rotary_dim / 2 */
    float rope_factors[KV_ROPE_MAX_PAIRS]; /**< [n_rope_factors] each > 0 */
} kv_config;

/** Head dimension d = dim / n_heads. */
static inline int kv_config_head_dim(const kv_config *c) { return c->dim / c->n_heads; }
/** Width of K (and of V) for one token: H_kv * d. */
static inline int kv_config_kv_dim(const kv_config *c) { return c->n_kv_heads * (c->dim / c->n_heads); }

/**
 * Fill the kvlab defaults for the fields llama2.c lacks (theta 10000, full rotary, eps 1e-5),
 * plus tied classifier, generic kind and MHA/GQA attention (no MLA dims). Set dim and n_heads
 * first: rotary_dim = dim / n_heads.
 */
void kv_config_set_defaults(kv_config *c);

/**
 * Check a configuration: positive sizes within sane limits (dim <= 65536, hidden <= 2^20,
 * L <= 1024, vocab and seq_len <= 2^24, at most 2^40 parameters), H divides dim, H_kv divides
 * H, d even, even rotary_dim <= d and <= 2 KV_ROPE_MAX_PAIRS, positive finite theta/eps, RoPE
 * factors none or one positive finite factor per rotated pair. Returns KV_OK or KV_ERR_ARG with
 * the field and its value named, e.g. "n_kv_heads (3) must divide n_heads (8)".
 * An MLA model (attn KV_ATTN_MLA) has no head dim d = dim / H: instead H <= 1024, n_kv_heads
 * 1, the dims of kv_mla_dims_check(), rotary_dim = d_R, and the generic kind (the recall
 * models are constructions over K/V heads).
 */
int kv_config_validate(const kv_config *c, kv_err *err);

/**
 * KV_OK for an MHA/GQA model; KV_ERR_UNSUPPORTED, naming @p who, for a model whose attention
 * block only the CPU forward pass has (MLA): what the CUDA engine, tensor-parallel ranks and
 * the K/V-head conversions say before they touch the weights.
 */
int kv_config_require_gqa(const kv_config *c, const char *who, kv_err *err);

/** Number of fp32 parameters the model holds (embedding counted once when tied). */
int64_t kv_config_param_count(const kv_config *c);

/** One-line description, e.g. "dim 288, L 6, H 6, H_kv 6, d 48, hidden 768, vocab 32000, seq 256". */
void kv_config_describe(const kv_config *c, char *buf, size_t n);

/** The embedded default models, created by the program (no download). */
typedef enum {
    KV_DEFAULT_TINY = 0,  /**< tiny MHA model: fast tests and the tour */
    KV_DEFAULT_TINY_GQA,  /**< tiny GQA model (H_kv = H / 2)  */
    KV_DEFAULT_SMALL,     /**< llama2.c-15M-sized model for timing */
    KV_DEFAULT_TINY_MLA,  /**< tiny with multi-head latent attention (chapter 11) */
    KV_DEFAULT_COUNT
} kv_default_model;

/** Config of an embedded default model; an unknown @p which -> KV_ERR_ARG. */
int kv_config_default(kv_default_model which, kv_config *out, kv_err *err);
/** Name of an embedded default ("tiny", ...), or NULL when @p which is out of range. */
const char *kv_config_default_name(kv_default_model which);
/**
 * Look up an embedded default by name ("tiny", "tiny-gqa", "small", "tiny-mla"); @p seed (may be NULL)
 * receives the fixed seed its weights are drawn from. Unknown or NULL name -> KV_ERR_ARG.
 */
int kv_config_default_by_name(const char *name, kv_config *out, uint64_t *seed, kv_err *err);

/** A published model's shape, for memory arithmetic (kvlab calc); no weights. */
typedef struct {
    const char *name;      /**< "llama-2-7b" */
    kv_config config;      /**< dims of the published model */
    int sliding_window;    /**< 0 = none; Mistral-7B: 4096 */
} kv_preset;

/** Table of presets (Llama-2-7B/13B/70B, Llama-3-8B/70B, Mistral-7B); count in @p n. */
const kv_preset *kv_presets(int *n);
/** Preset by name (case-insensitive), or NULL. */
const kv_preset *kv_preset_find(const char *name);

#ifdef __cplusplus
}
#endif
#endif
