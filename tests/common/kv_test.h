/**
 * @file kv_test.h
 * What every kvlab test program shares: pass/fail counting, the closing line
 * "N passed, M failed", array comparison with per-dtype tolerances, and the GPU skip code.
 *
 * Compare rule (docs/design.md §8, §11): |got - ref| <= atol + rtol * |ref|, first mismatches
 * printed with their index. Tolerances live here, once; fp32 paths stay strict.
 */
#ifndef KV_TEST_H
#define KV_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/** Exit code CTest shows as "skipped" (SKIP_RETURN_CODE 77). */
#define KV_TEST_SKIP 77

/* Tolerances per compared quantity. fp32 CPU vs fp32 GPU: the only difference is summation
 * order inside dot products and reductions. */
#define KV_TOL_F32_ATOL 1e-5
#define KV_TOL_F32_RTOL 1e-4

static int kv_test_passed = 0, kv_test_failed = 0;

/** Record one check; prints a FAIL line with the location when it does not hold. */
#define KV_CHECK(cond, ...)                                                          \
    do {                                                                             \
        if (cond) {                                                                  \
            kv_test_passed++;                                                        \
        } else {                                                                     \
            kv_test_failed++;                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                              \
            printf(__VA_ARGS__);                                                     \
            printf("\n");                                                            \
        }                                                                            \
    } while (0)

/**
 * Compare n floats; returns the number of mismatches, prints the first few with index.
 * NaN anywhere is a mismatch.
 */
static inline long kv_test_compare(const char *what, const float *got, const float *ref, long n,
                                   double atol, double rtol)
{
    long bad = 0;
    double worst = 0.0;
    for (long i = 0; i < n; i++) {
        double g = got[i], r = ref[i], diff = fabs(g - r);
        int ok = !(isnan(g) || isnan(r)) && diff <= atol + rtol * fabs(r);
        if (!ok) {
            if (bad < 5)
                printf("  %s: mismatch at [%ld]: got %.9g, ref %.9g (|diff| %.3g > %.3g)\n",
                       what, i, g, r, diff, atol + rtol * fabs(r));
            bad++;
        }
        if (diff > worst) worst = diff;
    }
    if (bad) printf("  %s: %ld of %ld mismatched, max |diff| %.3g\n", what, bad, n, worst);
    return bad;
}

/** Print the closing line and return the process exit code. */
static inline int kv_test_finish(void)
{
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}

#endif
