/**
 * @file kv_mla.h
 * Multi-head latent attention (MLA, DeepSeek-V2/V3; chapter 11): the shapes, the published
 * presets, and the weights and projections of one MLA attention layer.
 *
 * Per layer and token an MLA model caches one row of d_c + d_R elements, whatever H:
 *   c_KV = RMSNorm(W_DKV · x)          [d_c]  the compressed latent (kv_lora_rank)
 *   k_R  = RoPE(W_KR · x, pos)         [d_R]  one RoPE key shared by every head (qk_rope_head_dim)
 * Head h's key and value are up-projections of the latent, never stored:
 *   k_h = [ W_UK,h · c_KV  |  k_R ]    [d_nope + d_R]
 *   v_h =   W_UV,h · c_KV              [d_v]
 * and its query is [ q_nope,h | RoPE(q_R,h, pos) ], from x directly or through a rank-q_rank
 * bottleneck (query compression: W_DQ, RMSNorm, W_UQ).
 *
 * Cache bytes per token = L · (d_c + d_R) · b, against L · 2 · H_kv · d · b for GQA
 * (docs/design.md §2): with d_c = 4·d and d_R = d/2 (DeepSeek-V2's choice) that is the cache of
 * GQA with 2.25 KV heads, whatever the number of query heads.
 *
 * Why k_R is a separate, shared key (decoupled RoPE): attention can skip the up-projection
 * because q_nope,h · (W_UK,h c) = (W_UK,hᵀ q_nope,h) · c — W_UK,h moves onto the query once per
 * step (kv_attention_mla.h). Were RoPE applied to the up-projected key, the rotation R(p) of
 * cached position p would sit between W_UK,h and c: q · R(p) W_UK,h c, a different matrix for
 * every position, which no single query-side product absorbs. So the position lives in d_R
 * extra dims that are cached as they are, rotated once, and shared by the heads.
 */
#ifndef KV_MLA_H
#define KV_MLA_H

#include "kv_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The dims themselves (d_c, d_R, d_nope, d_v, q_rank) are ::kv_mla_dims in kv_config.h: a
 * model's config carries them (kv_config.mla). */

/** Elements cached per token and layer: d_c + d_R (one latent row, no V). */
static inline int kv_mla_row(const kv_mla_dims *m) { return m->d_c + m->d_rope; }

/** A published MLA model's shape, for memory arithmetic (kvlab calc); no weights. */
typedef struct {
    const char *name;  /**< "deepseek-v2" */
    int dim;           /**< hidden_size */
    int n_layers;      /**< L */
    int n_heads;       /**< H, query heads (also num_key_value_heads in config.json: each
                        *   head has its own up-projected K/V, none of which is cached) */
    int vocab_size, seq_len;
    kv_mla_dims mla;
} kv_mla_preset;

/** DeepSeek-V2, DeepSeek-V2-Lite, DeepSeek-V3 (kv_mla.c names the source); count in @p n. */
const kv_mla_preset *kv_mla_presets(int *n);
/** Preset by name (case-insensitive), or NULL. */
const kv_mla_preset *kv_mla_preset_find(const char *name);
/** The GQA model the DeepSeek-V2 paper measures its KV-cache reduction against (DeepSeek
 * 67B: L 95, H 64, H_kv 8, d 128). */
const kv_preset *kv_mla_baseline(void);

/**
 * The latent cache's shape as a config, for kv_cache_create_planes(c, out, spec, 1, err): L
 * layers, one KV head (and one "query head") of d = d_c + d_R elements, so a cache row is one
 * token's c_KV ‖ k_R. Only the shape fields matter to the cache; the rest are valid fillers.
 */
int kv_mla_cache_config(const kv_mla_dims *m, int n_layers, int seq_len, kv_config *out,
                        kv_err *err);

/** The weights of one MLA attention layer. Row-major [out][in], as kv_model.h. */
typedef struct {
    int dim, n_heads;
    kv_mla_dims m;
    float *wq;      /* [H*(d_nope+d_R)][dim]     q_rank 0: x -> q, head h's rows nope then rope */
    float *wq_a;    /* [q_rank][dim]             W_DQ (query compression), else NULL */
    float *q_norm;  /* [q_rank]                  RMSNorm gains of the query latent */
    float *wq_b;    /* [H*(d_nope+d_R)][q_rank]  W_UQ, else NULL */
    float *wkv_a;   /* [d_c + d_R][dim]          W_DKV (rows 0..d_c-1) then W_KR */
    float *kv_norm; /* [d_c]                     RMSNorm gains of c_KV */
    float *w_uk;    /* [H][d_nope][d_c]          W_UK: latent -> head h's no-RoPE key */
    float *w_uv;    /* [H][d_v][d_c]             W_UV: latent -> head h's value */
    float *wo;      /* [dim][H*d_v] */
    float *data;    /* one allocation holding all of the above (kv_mla_layer_init()); NULL in
                     * a model's layers, which point into the model's (kv_model.h) */
} kv_mla_layer;

/** Floats of one layer's MLA attention weights (every pointer of ::kv_mla_layer but data). */
int64_t kv_mla_layer_floats(const kv_mla_dims *m, int dim, int n_heads);
/** Point @p n_layers layers' weights into @p p, tensor by tensor (every layer's wq, then every
 * layer's wq_a, ... as llama2.c lays out a model's tensors): the layout of an MLA model's
 * attention weights in kv_model.h's one allocation. Returns the float after the last. */
float *kv_mla_layers_carve(kv_mla_layer *w, int n_layers, int dim, int n_heads,
                           const kv_mla_dims *m, float *p);

/** Check MLA dims: d_c, d_nope, d_v in 1..4096, d_R even in 2..512, q_rank 0..16384, and
 * d_c + d_R even (the latent row is cached as one head); KV_ERR_ARG naming the field or the
 * sum otherwise. */
int kv_mla_dims_check(const kv_mla_dims *m, kv_err *err);
/** Allocate one layer's weights for @p dim, @p n_heads and @p m, filled with seeded random
 * values (kv_model_randomize()'s scale: uniform ±sqrt(3/fan_in), norm gains 1). */
int kv_mla_layer_init(kv_mla_layer *w, int dim, int n_heads, const kv_mla_dims *m,
                      uint64_t seed, kv_err *err);
/** Free a layer's weights (safe on a zeroed struct). */
void kv_mla_layer_free(kv_mla_layer *w);

/**
 * The projections of T tokens at positions @p pos: each token's queries and its cache row.
 * x [T][dim] (already RMSNorm'ed), q_nope [T][H][d_nope], q_rope [T][H][d_R] (rotated),
 * row [T][d_c + d_R] = c_KV ‖ RoPE(k_R): what the latent cache stores.
 * rope_freq [d_R/2]: RoPE's per-pair frequencies (kv_rope_freqs() of the model's config).
 * @p scratch: kv_mla_project_scratch() floats.
 */
/** Floats of scratch kv_mla_project() needs for T tokens: T · (q_rank + H · (d_nope + d_R)). */
size_t kv_mla_project_scratch(const kv_mla_layer *w, int T);
void kv_mla_project(const kv_mla_layer *w, const float *x, const int *pos, int T,
                    const double *rope_freq, float eps, float *q_nope, float *q_rope, float *row,
                    float *scratch);

#ifdef __cplusplus
}
#endif
#endif
