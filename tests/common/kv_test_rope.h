/* kv_test_rope.h: RoPE's per-pair frequencies for a bare theta and rotary width, as a model
 * without frequency factors has them (kv_rope_freqs() of a config holding only these two),
 * for the tests that rotate vectors outside a model. */
#ifndef KV_TEST_ROPE_H
#define KV_TEST_ROPE_H

#include "kv_ops.h"

/* freq [KV_ROPE_MAX_PAIRS]: the first rotary_dim / 2 entries are set */
static inline void kv_test_rope_freqs(float theta, int rotary_dim, double *freq)
{
    kv_config c = {0};
    c.rope_theta = theta;
    c.rotary_dim = rotary_dim;
    kv_rope_freqs(&c, freq);
}

#endif
