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

#include "kv_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/** out[t] = x[t] / rms(x[t]) * w;  x, out [T][n], w [n]. out may alias x. */
void kv_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps);

/**
 * a · b over n elements in one fixed order: sixteen partial sums (element j goes to sum
 * j mod 16), folded as a tree (sum l + 8 into l, then + 4, + 2, + 1), then the tail n mod 16
 * in order. Every dot product of kv_matmul and of attention.
 */
float kv_dot(const float *a, const float *b, int n);

/** The lanes of kv_dot(): sixteen partial sums fill four 128-bit vectors (two 256-bit, one
 * 512-bit), so the compiler vectorizes them whatever the width, without reordering. */
#define KV_DOT_LANES 16

/**
 * kv_dot(), inline: the same operations in the same order (so the same bits), for loops that
 * call it per cached row (attention), where a call per row would cost as much as the row.
 */
static inline float kv_dot16(const float *a, const float *b, int n)
{
    float acc[KV_DOT_LANES] = {0};
    int j = 0;
    for (; j + KV_DOT_LANES <= n; j += KV_DOT_LANES)
        for (int l = 0; l < KV_DOT_LANES; l++) acc[l] += a[j + l] * b[j + l];
    /* tree fold 16 -> 8 -> 4 -> 2 -> 1, each step with constant bounds so it stays vector */
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    for (int l = 0; l < 2; l++) acc[l] += acc[l + 2];
    float s = acc[0] + acc[1];
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}

/**
 * 1 when an op of @p work multiply-adds is worth an OpenMP parallel region: work >= 2^18,
 * more than one thread, and not more runnable tasks than cores on the machine (kv_ops.c: on
 * a busy machine a region waits for scheduler slices). A speed choice only: every op here
 * gives the same bits on any number of threads.
 */
int kv_parallel_worth(int64_t work);

/** @p yes = 1: kv_parallel_worth() and the ops ignore the machine's load (tests that compare
 * thread counts need the team to run even on a busy machine); 0: back to the default. */
void kv_parallel_ignore_load(int yes);

/** y[t][i] = sum_j W[i][j] x[t][j];  x [T][in], W [out][in], y [T][out]. */
void kv_matmul(float *y, const float *x, const float *W, int T, int in, int out);

/**
 * kv_matmul() over a column slice of a wider matrix: W's rows are @p ldw floats apart
 * (ldw >= in), so W may point at column c0 of a [out][ldw] matrix and the product uses its
 * columns c0 .. c0+in-1 (chapter 10: a tensor-parallel rank's slice of Wo and W2). With
 * ldw == in it is kv_matmul(), bit for bit.  x [T][in], y [T][out].
 */
void kv_matmul_strided(float *y, const float *x, const float *W, int T, int in, int out,
                       int ldw);

/**
 * RoPE's per-pair inverse frequencies of config @p c, in double:
 *   freq[i] = theta^(-2i/rotary_dim) / rope_factors[i]     (factor 1 when the model has none)
 * freq [rotary_dim/2] (at most KV_ROPE_MAX_PAIRS). Computed once per step (or per cache) and
 * read by every rotation: kv_rope(), a window's table (kv_cache_rope_table()), the GPU's.
 */
void kv_rope_freqs(const kv_config *c, double *freq);

/**
 * Rotate adjacent pairs (2i, 2i+1) of the first rotary_dim dims of every head by angle
 * pos · freq[i]   (llama2.c's convention with freq[i] = theta^(-2i/rotary_dim)).
 * x [T][n_heads][head_dim], pos [T], freq [rotary_dim/2] (kv_rope_freqs()).
 */
void kv_rope(float *x, const int *pos, int T, int n_heads, int head_dim, int rotary_dim,
             const double *freq);

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
