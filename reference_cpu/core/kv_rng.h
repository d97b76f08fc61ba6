/**
 * @file kv_rng.h
 * Deterministic, seedable random numbers (xorshift64*), identical on every machine, so an
 * embedded model created from a seed has the same bytes everywhere.
 */
#ifndef KV_RNG_H
#define KV_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t state;
} kv_rng;

/** Seed (any value, 0 included: the seed is mixed before use). */
void kv_rng_seed(kv_rng *r, uint64_t seed);
/** Next 32 random bits. */
uint32_t kv_rng_u32(kv_rng *r);
/** Uniform float in [0, 1), 24 random bits. */
float kv_rng_float(kv_rng *r);
/** Uniform float in [lo, hi). */
float kv_rng_uniform(kv_rng *r, float lo, float hi);
/** Standard normal (Box-Muller), computed in double then rounded. */
float kv_rng_normal(kv_rng *r);

#ifdef __cplusplus
}
#endif
#endif
