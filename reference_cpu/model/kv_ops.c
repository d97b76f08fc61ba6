/* The building blocks of the forward pass (kv_ops.h), in the order a layer uses them.
 *
 * Determinism rule for every function here: a row's result is computed by one thread, in one
 * fixed order, so it is the same whether the row is alone in its step or one of hundreds, and
 * whatever the thread count. Threads split rows (and output elements), never a sum. */
#include "kv_ops.h"
#include "kv_common.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

/* Below this many multiply-adds (or elements) an op runs on one thread: starting a parallel
 * region and meeting at its barrier costs microseconds on an idle machine and whole scheduler
 * slices on a busy one, more than a 300x300 matrix-vector product takes alone. (Threads change
 * which core computes a row, never how, so this is a speed choice only.) */
#define KV_PARALLEL_MIN (1 << 18)

/* ---- is a parallel region worth it right now? ----------------------------------------------
 * A parallel region needs every thread of the team to run before it can end. On an idle
 * machine that is a microsecond; when other processes keep every core busy, a team thread
 * waits for a scheduler slice (milliseconds) and a decode step with forty regions runs several
 * times slower than on one thread (docs/performance.md has the numbers). So the ops look at
 * the kernel's count of runnable tasks (/proc/loadavg, field 4, sampled at most every 50 ms):
 * while it exceeds the cores, they run on the calling thread. Results do not change (rows are
 * computed alike on any thread); only where they are computed. Without /proc: never busy. */
static atomic_int busy_flag;          /* 1: more runnable tasks than cores at the last look */
static _Atomic long long busy_checked; /* kv_now() of the last look, in microseconds */

static int machine_busy(void)
{
    const long long now = (long long)(kv_now() * 1e6);
    const long long last = atomic_load_explicit(&busy_checked, memory_order_relaxed);
    if (now - last < 50000) return atomic_load_explicit(&busy_flag, memory_order_relaxed);
    atomic_store_explicit(&busy_checked, now, memory_order_relaxed);
    int busy = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        double l1, l5, l15;
        int running = 0, total = 0;
        /* the count is machine-wide, so compare with the machine's cores (a container
         * limited to 2 of 64 cores must not read the host's 20 runnable tasks as "busy") */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores < omp_get_num_procs()) cores = omp_get_num_procs();
        if (fscanf(f, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) == 5)
            busy = running > cores; /* ourselves included */
        fclose(f);
    }
    atomic_store_explicit(&busy_flag, busy, memory_order_relaxed);
    return busy;
}

static atomic_int ignore_load; /* kv_parallel_ignore_load() */

void kv_parallel_ignore_load(int yes) { atomic_store(&ignore_load, yes != 0); }

/* Run an op of @p work on the team: big enough, more than one thread, and cores to spare. */
static int go_parallel(int64_t work, int64_t min)
{
    return work >= min && omp_get_max_threads() > 1 &&
           (atomic_load_explicit(&ignore_load, memory_order_relaxed) || !machine_busy());
}

int kv_parallel_worth(int64_t work) { return go_parallel(work, KV_PARALLEL_MIN); }

void kv_embed(float *out, const float *table, const int *tokens, int T, int dim)
{
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * dim, table + (size_t)tokens[t] * dim, (size_t)dim * sizeof(float));
}

/* One row of RMSNorm whose sum of squares overflowed: the sum is taken over x / max|x|, as
 * robust BLAS norms do, so the row still comes out with unit RMS instead of all zeros (inv 0)
 * or NaN. Only the overflow takes this path: every other row keeps the plain sum's bits. */
static void rmsnorm_scaled(float *ot, const float *xt, const float *w, int n, float eps)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(xt[i]));
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += (xt[i] / amax) * (xt[i] / amax);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps / amax / amax);
    for (int i = 0; i < n; i++) ot[i] = (xt[i] / amax) * inv * w[i];
}

void kv_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps)
{
    #pragma omp parallel for if (go_parallel((int64_t)T * n, KV_PARALLEL_MIN))
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * n;
        float *ot = out + (size_t)t * n;
        float ss = 0.0f;
        for (int i = 0; i < n; i++) ss += xt[i] * xt[i];
        if (isinf(ss)) { /* squares past FLT_MAX (|x| > ~1e19): */
            rmsnorm_scaled(ot, xt, w, n, eps);
            continue;
        }
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int i = 0; i < n; i++) ot[i] = xt[i] * inv * w[i];
    }
}

/* One dot product in a fixed order: sixteen running partial sums (lane l takes j = l mod 16),
 * folded as a tree (lane l + 8 into l, then + 4, + 2, + 1), then the tail n mod 16 in order.
 * Why sixteen: decode streams every weight once per token, so a matrix-vector product must
 * keep up with memory. One running sum is a chain of dependent adds (one per ~3 cycles);
 * sixteen independent ones fill four 128-bit vectors (two 256-bit, one 512-bit), enough adds
 * in flight to outrun DRAM on any x86-64 or ARM core, with no intrinsics. The lanes and the
 * fold are written out, so the compiler may vectorize but not reorder: the same data give the
 * same bits on every call, whatever the vector width. */
float kv_dot(const float *a, const float *b, int n) { return kv_dot16(a, b, n); }

/* Below this many multiply-adds a matmul runs on one thread. A matrix-vector product at batch
 * 1 streams its weights from memory, and one core alone cannot pull the machine's whole
 * bandwidth, so even a 288x288 layer (83k multiply-adds, 330 KB) is worth splitting; under
 * that the fork and barrier (microseconds) cost more than half the rows save. */
#ifndef KV_MATMUL_PARALLEL_MIN /* a build may set it (-D) to compare */
#define KV_MATMUL_PARALLEL_MIN (1 << 15)
#endif

/* Rows of W one thread keeps hot while every token of the step passes over them: with T tokens
 * (a prefill, or chapter 01's recompute) W is then read from memory once per step, not T
 * times. 16 rows of a 288-wide layer are 18 KB (L1); of a 4096-wide one 256 KB (L2). */
#define KV_MATMUL_ROWS 16

void kv_matmul(float *y, const float *x, const float *W, int T, int in, int out)
{
    kv_matmul_strided(y, x, W, T, in, out, in);
}

void kv_matmul_strided(float *y, const float *x, const float *W, int T, int in, int out,
                       int ldw)
{
    const int64_t work = (int64_t)T * in * out;
    const int n_blocks = (out + KV_MATMUL_ROWS - 1) / KV_MATMUL_ROWS;
    /* static schedule over row blocks: each thread takes one contiguous run of W's rows, so
     * at T = 1 the two cores stream disjoint halves of W; every y[t][i] is still one kv_dot16 */
    #pragma omp parallel for schedule(static) if (go_parallel(work, KV_MATMUL_PARALLEL_MIN))
    for (int blk = 0; blk < n_blocks; blk++) {
        const int i0 = blk * KV_MATMUL_ROWS;
        const int i1 = i0 + KV_MATMUL_ROWS < out ? i0 + KV_MATMUL_ROWS : out;
        for (int t = 0; t < T; t++)
            for (int i = i0; i < i1; i++)
                y[(size_t)t * out + i] = kv_dot16(W + (size_t)i * ldw, x + (size_t)t * in, in);
    }
}

/* Llama 3.x divides each pair's frequency by its factor (llama.cpp's freq_factors: the
 * angle pos · theta^(-2i/d) / f_i); a linear position scaling s is the same factor s in every
 * pair (pos / s). Without factors the division is skipped, so freq[i] is the bits
 * theta^(-2i/rotary_dim) always had. */
void kv_rope_freqs(const kv_config *c, double *freq)
{
    for (int i = 0; i < c->rotary_dim / 2; i++) {
        freq[i] = pow((double)c->rope_theta, -(double)(2 * i) / (double)c->rotary_dim);
        if (i < c->n_rope_factors) freq[i] /= (double)c->rope_factors[i];
    }
}

/* The angle pos · freq[i] is formed in double: in fp32 a position of 32k times a frequency
 * near 1 would already be off by ~2e-3 radians. The rotation itself is fp32. */
void kv_rope(float *x, const int *pos, int T, int n_heads, int head_dim, int rotary_dim,
             const double *freq)
{
    /* a cos and a sin per pair: worth threads sixteen times sooner than a multiply-add */
    #pragma omp parallel for collapse(2) \
        if (go_parallel((int64_t)T * n_heads * rotary_dim * 16, KV_PARALLEL_MIN))
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < rotary_dim; i += 2) {
                const double angle = (double)pos[t] * freq[i / 2];
                const float c = (float)cos(angle), s = (float)sin(angle);
                const float a = xh[i], b = xh[i + 1];
                xh[i] = a * c - b * s;
                xh[i + 1] = a * s + b * c;
            }
        }
}

void kv_swiglu(float *g, const float *u, int64_t n)
{
    #pragma omp parallel for if (go_parallel(n, KV_PARALLEL_MIN))
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
