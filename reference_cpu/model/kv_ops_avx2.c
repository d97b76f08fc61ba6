/* The x86 twin of kv_ops_fast.c's row loop: a row of a matrix-vector product at a time,
 * kv_dot16()'s sixteen lanes as two 256-bit vectors, and its tree fold as vector adds
 * (lane l + 8 into l: the two vectors; + 4: their 128-bit halves; + 2 and + 1: within one).
 * The products and adds are separate instructions (no fused multiply-add), in kv_dot16()'s
 * order, so every output has the reference's bits (tests/test_ops_fast.c). The function
 * carries its instruction set as a target attribute (the library is built for any x86-64)
 * and runs only where kv_ops_cpu_avx2() says the CPU has it. */
#include "kv_ops_fast.h"
#include "kv_ops.h"

#if !(defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
int kv_ops_cpu_avx2(void) { return 0; }

void kv_matmul_rows_avx2(float *yt, const float *xt, const float *W, int i0, int i1, int in,
                         int ldw)
{
    (void)yt, (void)xt, (void)W, (void)i0, (void)i1, (void)in, (void)ldw; /* never called */
}
#else
#include <cpuid.h>
#include <immintrin.h>

/* CPUID leaf 1: AVX (ECX bit 28) and OSXSAVE (bit 27), then XCR0 bits 1-2 (the OS saves the
 * YMM registers), then AVX2 (leaf 7, EBX bit 5). */
int kv_ops_cpu_avx2(void)
{
    unsigned a, b, c, d, lo, hi;
    const unsigned need = (1u << 27) | (1u << 28);
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & need) != need) return 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 6u) != 6u) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 5) & 1u;
}

#define KV_AVX2 __attribute__((target("avx2")))

/* kv_dot16()'s fold of one row's two vectors (lanes 0-7, 8-15), then its tail in order. */
KV_AVX2 static inline float fold(__m256 lo, __m256 hi, const float *w, const float *x, int j,
                                 int in)
{
    const __m256 s8 = _mm256_add_ps(lo, hi);                           /* l += l + 8 */
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));           /* l += l + 2 */
    float s = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1))); /* acc0 + acc1 */
    for (; j < in; j++) s += w[j] * x[j];
    return s;
}

KV_AVX2 void kv_matmul_rows_avx2(float *yt, const float *xt, const float *W, int i0, int i1,
                                 int in, int ldw)
{
    const int in16 = in / KV_DOT_LANES * KV_DOT_LANES;
    for (int i = i0; i < i1; i++) {
        const float *w = W + (size_t)i * ldw;
        __m256 a = _mm256_setzero_ps(), b = a; /* lanes 0-7 and 8-15 */
        for (int j = 0; j < in16; j += KV_DOT_LANES) {
            a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(xt + j)));
            b = _mm256_add_ps(b, _mm256_mul_ps(_mm256_loadu_ps(w + j + 8),
                                               _mm256_loadu_ps(xt + j + 8)));
        }
        yt[i] = fold(a, b, w, xt, in16, in);
    }
}
#endif
