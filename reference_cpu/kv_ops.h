/**
 * @file kv_ops.h
 * The building blocks of the forward pass on the CPU, each a plain loop over rows.
 * cuda/kvcu.h has a kvcu_ twin of each with the same arguments (device pointers).
 *
 * Every row is computed in a fixed order (no reduction split across threads), so a token's
 * result does not depend on how many tokens share the step or how many threads run.
 */
#ifndef KV_OPS_H
#define KV_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** out[t] = x[t] / rms(x[t]) * w;  x, out [T][n], w [n]. out may alias x. */
void kv_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps);

/**
 * a · b over n elements in one fixed order: eight partial sums (element j goes to sum j mod 8),
 * folded 0..7, then the tail n mod 8 in order. Every dot product of kv_matmul and of attention.
 */
float kv_dot(const float *a, const float *b, int n);

/** y[t][i] = sum_j W[i][j] x[t][j];  x [T][in], W [out][in], y [T][out]. */
void kv_matmul(float *y, const float *x, const float *W, int T, int in, int out);

/**
 * Rotate adjacent pairs (2i, 2i+1) of the first rotary_dim dims of every head by angle
 * pos · theta^(-2i/rotary_dim)   (llama2.c's convention).
 * x [T][n_heads][head_dim], pos [T].
 */
void kv_rope(float *x, const int *pos, int T, int n_heads, int head_dim, int rotary_dim,
             float theta);

/** g[i] = silu(g[i]) * u[i] over n elements (SwiGLU's gate);  g, u [n]. */
void kv_swiglu(float *g, const float *u, int64_t n);

/** x[i] += y[i] over n elements. */
void kv_add(float *x, const float *y, int64_t n);

/**
 * In-place softmax of x[0..n-1] (max-subtracted, fp32). -inf entries get weight 0; a row of
 * only -inf (fully masked) becomes all 0 rather than NaN; n <= 0 does nothing.
 */
void kv_softmax(float *x, int n);

/** out[t] = table[tokens[t]];  table [vocab][dim], out [T][dim]. */
void kv_embed(float *out, const float *table, const int *tokens, int T, int dim);

#ifdef __cplusplus
}
#endif
#endif
