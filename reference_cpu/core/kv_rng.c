/* xorshift64* (Vigna 2016): small state, good enough statistics for weights and sampling. */
#include "kv_rng.h"

#include <math.h>

void kv_rng_seed(kv_rng *r, uint64_t seed)
{
    /* splitmix64 of the seed: nearby seeds give unrelated streams, and state is never 0 */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->state = z ? z : 0x2545F4914F6CDD1Dull;
}

uint32_t kv_rng_u32(kv_rng *r)
{
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return (uint32_t)((r->state * 0x2545F4914F6CDD1Dull) >> 32);
}

float kv_rng_float(kv_rng *r) { return (float)(kv_rng_u32(r) >> 8) / 16777216.0f; }

float kv_rng_uniform(kv_rng *r, float lo, float hi) { return lo + (hi - lo) * kv_rng_float(r); }

float kv_rng_normal(kv_rng *r)
{
    /* u1 in (0, 1] so log() is finite */
    double u1 = ((double)kv_rng_u32(r) + 1.0) / 4294967296.0;
    double u2 = (double)kv_rng_u32(r) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
