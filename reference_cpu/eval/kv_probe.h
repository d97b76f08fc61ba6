/**
 * @file kv_probe.h
 * What a trained model's cache holds, measured on a stretch of text (chapters 04 and 06 on
 * the shipped model, `kvlab eval keys`, `kvlab eval mass`, `kvlab eval ppl --kivi-keys`):
 *
 *   key channels   mean |K| of every channel of every (layer, KV head) over n tokens, after
 *                  RoPE (what the cache stores) and before it (the same rows rotated back by
 *                  their position). Outlier channels show as a few channels far above the
 *                  median (KIVI, KVQuant); RoPE mixes each pair (2i, 2i+1), so a pair's two
 *                  channels tend to equal magnitude after it.
 *   attention mass for every position p, the attention probability it receives, summed over
 *                  every query row t >= p and every query head, over n · H: a distribution
 *                  over positions (sums to 1 per layer). A sink is a position far above the
 *                  uniform share. Measured with chapter 09's H2O state at a budget of n (it
 *                  sums exactly these probabilities and evicts nothing).
 *   KIVI emulation keys quantized per channel (KIVI: groups of 32 tokens of one channel) or per
 *                  token (groups of 32 channels of one row), values per token, with an fp32
 *                  window of the newest R tokens, on an fp32 cache: before each step of 32
 *                  tokens, the oldest 32 rows that no longer fit in the window are replaced
 *                  by their round trip through kv_quant_encode()/_decode(). Per channel this
 *                  is the int2-kivi/int4-kivi cache's arithmetic (the cache's spill rule),
 *                  so the two ablation arms differ only in the key grouping.
 */
#ifndef KV_PROBE_H
#define KV_PROBE_H

#include "kv_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Mean |K| per channel over tokens [n] from position 0 on the CPU with an fp32 cache:
 * pre, post [L][H_kv][d] (before / after RoPE). n >= 1 and within seq_len is the caller's
 * choice (the model runs any n the cache holds). KV_OK, KV_ERR_ARG, KV_ERR_NOMEM;
 * KV_ERR_UNSUPPORTED for an MLA model, whose cache holds latent rows, no per-head keys (so for
 * the other probes here too).
 */
int kv_probe_key_channels(const kv_model *m, const int *tokens, int n, double *pre,
                          double *post, kv_err *err);

/**
 * Attention mass per position: mass [L][n], each layer's row summing to 1 (file comment).
 * KV_OK, KV_ERR_ARG, KV_ERR_NOMEM, KV_ERR_UNSUPPORTED (an MLA model).
 */
int kv_probe_attention_mass(const kv_model *m, const int *tokens, int n, double *mass,
                            kv_err *err);

/**
 * The same per KV head: mass [L][H_kv][n], row (l, h) the mass the G query heads of KV head
 * h's group give each position, over n · G (each row sums to 1). Where a sink lives: some
 * heads put most of their attention on position 0, others almost none.
 */
int kv_probe_attention_mass_heads(const kv_model *m, const int *tokens, int n, double *mass,
                                  kv_err *err);

/** KIVI emulation state: a ::kv_ppl_opts before_step hook over an fp32 contiguous CPU cache. */
typedef struct {
    int fmt;           /**< KV_QF_INT2_KIVI or KV_QF_INT4_KIVI */
    int key_role;      /**< KV_QROLE_KEY: per channel (KIVI); KV_QROLE_VALUE: per token */
    int window;        /**< R: newest tokens kept fp32, a multiple of 32 */
    int quantized;     /**< rows 0 .. quantized-1 of the current window are round-tripped */
    int64_t rows_round_tripped; /**< rows replaced, over layers, heads, K and V */
} kv_probe_kivi;

/** A state for @p fmt, per-channel (@p keys_per_token 0) or per-token keys, window R.
 * KV_ERR_ARG for another format or an R that is not a positive multiple of 32. */
int kv_probe_kivi_init(kv_probe_kivi *k, int fmt, int keys_per_token, int window, kv_err *err);

/** The hook (kv_ppl_opts.before_step, hook = a ::kv_probe_kivi): steps of at most 32 tokens
 * starting at multiples of 32 (kv_ppl_opts.chunk = 32), or inside one group of 32 positions (a
 * decode step: kv_passkey_run_hooked()), on an all-fp32 contiguous CPU cache. */
int kv_probe_kivi_step(void *hook, kv_backend *b, int pos, int n, kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
