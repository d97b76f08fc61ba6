/**
 * @file kv_sampler.h
 * Choosing the next token from logits: greedy, temperature, top-p (nucleus).
 */
#ifndef KV_SAMPLER_H
#define KV_SAMPLER_H

#include "kv_common.h"
#include "kv_rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature; /**< 0 = greedy (argmax) */
    float top_p;       /**< in (0, 1]; 1 = no nucleus cut */
    kv_rng rng;
    int vocab_size;
    void *scratch;     /* [vocab] (prob, index) pairs for top-p, owned */
} kv_sampler;

/** temperature >= 0, top_p in (0, 1]; KV_ERR_ARG otherwise. */
int kv_sampler_init(kv_sampler *s, int vocab_size, float temperature, float top_p,
                    uint64_t seed, kv_err *err);
/** Free the sampler's scratch. */
void kv_sampler_free(kv_sampler *s);
/** Index of the largest logit (lowest index on ties). */
int kv_argmax(const float *logits, int n);
/** KV_ERR_ARG ("no finite logits ...") when @p logits [n] holds a NaN or +inf, or nothing
 * but -inf: no token can be chosen from them (a forward pass that overflowed). */
int kv_logits_check(const float *logits, int n, kv_err *err);
/** Sample a token; @p logits [vocab] is used as scratch (overwritten). -1 when
 * kv_logits_check() refuses them. */
int kv_sample(kv_sampler *s, float *logits);

#ifdef __cplusplus
}
#endif
#endif
