/* The building blocks of the forward pass (kv_ops.h), in the order a layer uses them.
 *
 * Determinism rule for every function here: a row's result is computed by one thread, in one
 * fixed order, so it is the same whether the row is alone in its step or one of hundreds, and
 * whatever the thread count. Threads split rows (and output elements), never a sum. */
#include "kv_ops.h"

#include <math.h>
#include <string.h>

/* Below this many multiply-adds (or elements) an op runs on one thread: starting a parallel
 * region and meeting at its barrier costs microseconds on an idle machine and whole scheduler
 * slices on a busy one, more than a 300x300 matrix-vector product takes alone. (Threads change
 * which core computes a row, never how, so this is a speed choice only.) */
#define KV_PARALLEL_MIN (1 << 18)

void kv_embed(float *out, const float *table, const int *tokens, int T, int dim)
{
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * dim, table + (size_t)tokens[t] * dim, (size_t)dim * sizeof(float));
}

void kv_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps)
{
    #pragma omp parallel for if ((int64_t)T * n >= KV_PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * n;
        float *ot = out + (size_t)t * n;
        float ss = 0.0f;
        for (int i = 0; i < n; i++) ss += xt[i] * xt[i];
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) ot[i] = xt[i] * inv * w[i];
    }
}

/* One dot product in a fixed order: eight running partial sums (lane l takes j = l mod 8),
 * folded left to right, then the tail. The eight independent sums let the compiler use SIMD
 * without reordering anything, so the result is identical on every call with the same data. */
float kv_dot(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[j + l] * b[j + l];
    float s = acc[0];
    for (int l = 1; l < 8; l++) s += acc[l];
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}

void kv_matmul(float *y, const float *x, const float *W, int T, int in, int out)
{
    const int64_t work = (int64_t)T * in * out;
    #pragma omp parallel for collapse(2) if (work >= KV_PARALLEL_MIN)
    for (int t = 0; t < T; t++)
        for (int i = 0; i < out; i++)
            y[(size_t)t * out + i] = kv_dot(W + (size_t)i * in, x + (size_t)t * in, in);
}

/* The angle pos · theta^(-2i/rotary_dim) is formed in double: in fp32 a position of 32k times
 * a frequency near 1 would already be off by ~2e-3 radians. The rotation itself is fp32. */
void kv_rope(float *x, const int *pos, int T, int n_heads, int head_dim, int rotary_dim,
             float theta)
{
    /* a pow, a cos and a sin per pair: worth threads sixteen times sooner than a multiply-add */
    #pragma omp parallel for collapse(2) \
        if ((int64_t)T * n_heads * rotary_dim * 16 >= KV_PARALLEL_MIN)
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < rotary_dim; i += 2) {
                const double freq = pow((double)theta, -(double)i / (double)rotary_dim);
                const double angle = (double)pos[t] * freq;
                const float c = (float)cos(angle), s = (float)sin(angle);
                const float a = xh[i], b = xh[i + 1];
                xh[i] = a * c - b * s;
                xh[i + 1] = a * s + b * c;
            }
        }
}

void kv_swiglu(float *g, const float *u, int64_t n)
{
    #pragma omp parallel for if (n >= KV_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float a = g[i];
        g[i] = a / (1.0f + expf(-a)) * u[i]; /* silu(a) = a·sigmoid(a) */
    }
}

void kv_add(float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void kv_softmax(float *x, int n)
{
    if (n <= 0) return; /* an empty row: nothing to normalize (x may be NULL) */
    /* subtract the max so the largest exponent is exp(0) = 1: no overflow for any input */
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    if (max == -INFINITY) {
        /* fully masked: no entry may receive weight. exp(-inf - -inf) would be NaN; all
         * weights 0 is what a masked row means (and what fused kernels produce for it) */
        for (int i = 0; i < n; i++) x[i] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}
