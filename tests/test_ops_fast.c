/* The matrix products arranged for speed (kv_ops_fast.h) against the reference kv_matmul() and
 * kv_matmul_strided() (kv_ops.h): the same bits, error bound 0, on both paths (the portable
 * loop and, where the CPU has AVX2, the twin in kv_ops_avx2.c), on shapes that leave elements
 * over from the sixteen lanes and rows over from the row blocks, with strided weights, several
 * tokens, one thread and the whole team, and on values whose sums round (magnitudes 2^-20 to
 * 2^20, and inf/NaN that must propagate alike). Takes about a second. */
#include "kv_ops.h"
#include "kv_ops_fast.h"
#include "kv_rng.h"
#include "common/kv_test.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* x [T][in] and W [out][ldw], products y of both paths compared byte for byte */
static void check(kv_rng *r, int T, int in, int out, int ldw, int special)
{
    float *x = calloc((size_t)T * in, sizeof(float));          /* [T][in] */
    float *W = calloc((size_t)out * ldw, sizeof(float));       /* [out][ldw] */
    float *ref = calloc((size_t)T * out, sizeof(float));       /* [T][out] */
    float *y = calloc((size_t)T * out, sizeof(float));         /* [T][out] */
    /* magnitudes 2^-20 .. 2^20: partial sums that round differently in any other order */
    for (size_t i = 0; i < (size_t)T * in; i++)
        x[i] = ldexpf(kv_rng_uniform(r, -1, 1), (int)(kv_rng_u32(r) % 41) - 20);
    for (size_t i = 0; i < (size_t)out * ldw; i++)
        W[i] = ldexpf(kv_rng_uniform(r, -1, 1), (int)(kv_rng_u32(r) % 41) - 20);
    if (special && out > 2 && in > 2) {
        W[(size_t)1 * ldw + in - 1] = INFINITY; /* a tail element of row 1 */
        W[(size_t)2 * ldw] = NAN;               /* a lane element of row 2 */
    }
    kv_matmul_strided(ref, x, W, T, in, out, ldw);
    const int threads[2] = {1, omp_get_num_procs() > 1 ? 2 : 1};
    for (int avx2 = 0; avx2 < 2; avx2++) {
        kv_matmul_fast_use_avx2(avx2);
        for (int k = 0; k < 2; k++) {
            omp_set_num_threads(threads[k]);
            memset(y, 0xff, (size_t)T * out * sizeof(float));
            if (ldw == in) kv_matmul_fast(y, x, W, T, in, out);
            else kv_matmul_strided_fast(y, x, W, T, in, out, ldw);
            KV_CHECK(memcmp(y, ref, (size_t)T * out * sizeof(float)) == 0,
                     "T %d in %d out %d ldw %d%s, %s, %d threads: not the reference's bits", T,
                     in, out, ldw, special ? " (inf/NaN)" : "", kv_matmul_fast_isa(), threads[k]);
        }
    }
    kv_matmul_fast_use_avx2(1);
    free(x), free(W), free(ref), free(y);
}

int main(void)
{
    kv_rng r;
    kv_rng_seed(&r, 30);
    kv_parallel_ignore_load(1); /* the team runs even on a busy machine: both splits checked */
    printf("matmul fast path: %s on this CPU\n", kv_matmul_fast_isa());
    /* T, in, out, ldw: in = 16k, 16k + tail, < 16; out = 4k, 4k + 1..3, one block, many */
    const int shapes[][4] = {
        {1, 288, 288, 288}, {1, 288, 768, 288}, {1, 768, 288, 768}, {1, 67, 33, 67},
        {1, 5, 7, 5},       {3, 16, 4, 16},     {7, 67, 33, 80},    {1, 288, 4099, 288},
        {5, 130, 301, 130}, {1, 48, 288, 288},  {2, 768, 96, 2048}, {1, 1, 3, 1},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int special = 0; special < 2; special++)
            check(&r, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], special);
    kv_parallel_ignore_load(0);
    return kv_test_finish();
}
