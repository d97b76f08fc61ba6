/* The forward pass's matrix products arranged for speed (kv_ops_fast.h), held to the
 * reference kv_matmul_strided() of kv_ops.c bit for bit.
 *
 * At batch 1 a matrix-vector product reads each weight once: it should run at the speed
 * memory delivers them. The reference's kv_dot16() keeps sixteen partial sums, which a
 * baseline x86-64 build (SSE2) holds in four 128-bit vectors: four loads, four multiplies and
 * four adds per sixteen weights. On x86-64 CPUs with AVX2 (asked once at run time) the rows go
 * to kv_matmul_rows_avx2() (kv_ops_avx2.c): the same sixteen lanes as two 256-bit vectors,
 * half the instructions, the same operations in the same order, so every output has the
 * reference's bits (multiplies and adds stay two roundings: the library is built with
 * -ffp-contract=off, and the twin uses no fused multiply-add). Elsewhere the rows run through
 * kv_dot16() itself.
 *
 * Measured (docs/performance.md §12.3): four rows at a time, sixteen independent sums sharing
 * each x load, ran 1.2-1.4x faster on a 288x288 matrix held in the L2 cache, but 1.35x slower
 * through a whole decode step, where the weights stream from the L3 cache and memory: four
 * interleaved streams fetch worse than one. So one row at a time.
 *
 * Threads split row blocks exactly as the reference does (KV_MATMUL_ROWS rows a block, a
 * static schedule), under the same policy: kv_parallel_worth() (kv_ops.c). */
#include "kv_ops_fast.h"
#include "kv_ops.h"

#include <pthread.h>
#include <stdatomic.h>

/* kv_ops.c's row blocks and parallel threshold: the same work split the same way */
#define KV_MATMUL_ROWS 16
#define KV_MATMUL_PARALLEL_MIN (1 << 15)

static atomic_int avx2_ok;       /* the CPU runs AVX2 (set once) */
static atomic_int avx2_off;      /* kv_matmul_fast_use_avx2(0) */
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

static void detect(void) { atomic_store(&avx2_ok, kv_ops_cpu_avx2()); }

static int use_avx2(void)
{
    pthread_once(&detect_once, detect);
    return atomic_load_explicit(&avx2_ok, memory_order_relaxed) &&
           !atomic_load_explicit(&avx2_off, memory_order_relaxed);
}

void kv_matmul_fast_use_avx2(int use) { atomic_store(&avx2_off, use == 0); }

const char *kv_matmul_fast_isa(void) { return use_avx2() ? "avx2" : "portable"; }

/* Rows [i0, i1) of yt = W xt: the reference's kv_dot16() a row (the portable path). */
static void rows_portable(float *yt, const float *xt, const float *W, int i0, int i1, int in,
                          int ldw)
{
    for (int i = i0; i < i1; i++) yt[i] = kv_dot16(W + (size_t)i * ldw, xt, in);
}

void kv_matmul_strided_fast(float *y, const float *x, const float *W, int T, int in, int out,
                            int ldw)
{
    const int64_t work = (int64_t)T * in * out;
    const int n_blocks = (out + KV_MATMUL_ROWS - 1) / KV_MATMUL_ROWS;
    const int avx2 = use_avx2();
    /* kv_parallel_worth(INT64_MAX): the team may run now (threads, and cores to spare) */
    #pragma omp parallel for schedule(static) \
        if (work >= KV_MATMUL_PARALLEL_MIN && kv_parallel_worth(INT64_MAX))
    for (int blk = 0; blk < n_blocks; blk++) {
        const int i0 = blk * KV_MATMUL_ROWS;
        const int i1 = i0 + KV_MATMUL_ROWS < out ? i0 + KV_MATMUL_ROWS : out;
        for (int t = 0; t < T; t++) {
            float *yt = y + (size_t)t * out;
            const float *xt = x + (size_t)t * in;
            if (avx2) kv_matmul_rows_avx2(yt, xt, W, i0, i1, in, ldw);
            else rows_portable(yt, xt, W, i0, i1, in, ldw);
        }
    }
}

void kv_matmul_fast(float *y, const float *x, const float *W, int T, int in, int out)
{
    kv_matmul_strided_fast(y, x, W, T, in, out, in);
}
