/**
 * @file kv_ops_fast.h
 * The forward pass's matrix products, arranged for speed: kv_matmul() and kv_matmul_strided()
 * of kv_ops.h (the reference), the same bits on every machine and thread count
 * (tests/test_ops_fast.c), computed on x86-64 CPUs with AVX2 (asked at run time) by the twin
 * in kv_ops_avx2.c.
 */
#ifndef KV_OPS_FAST_H
#define KV_OPS_FAST_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** kv_matmul(), bit for bit:  y[t][i] = sum_j W[i][j] x[t][j];  x [T][in], W [out][in], y [T][out]. */
void kv_matmul_fast(float *y, const float *x, const float *W, int T, int in, int out);

/** kv_matmul_strided(), bit for bit: W's rows @p ldw >= in floats apart. */
void kv_matmul_strided_fast(float *y, const float *x, const float *W, int T, int in, int out,
                            int ldw);

/** Which arrangement kv_matmul_fast() runs: "avx2" or "portable". */
const char *kv_matmul_fast_isa(void);

/** @p use = 0: the portable loop (kv_dot16() a row) even where the CPU has AVX2 (tests compare the two);
 * 1: back to the default, AVX2 where the CPU has it. */
void kv_matmul_fast_use_avx2(int use);

/* ---- the x86 twins (kv_ops_avx2.c), private to the two files ---------------------------- */

/** 1 when the CPU and the OS run AVX2 code (CPUID and XCR0). */
int kv_ops_cpu_avx2(void);

/** Rows [i0, i1) of y[t] = W x[t]: kv_dot16()'s lanes and fold in AVX2. */
void kv_matmul_rows_avx2(float *yt, const float *xt, const float *W, int i0, int i1, int in,
                         int ldw);

#ifdef __cplusplus
}
#endif
#endif
