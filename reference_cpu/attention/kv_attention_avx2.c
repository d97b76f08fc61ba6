/* The CPU fast path, x86 part: kv_attention_fast.c's scores and values passes and its
 * exponentials as AVX2, F16C and FMA intrinsics, the prefetches that feed them, and the
 * run-time check of what the CPU has (the library is built for any x86-64: these functions
 * carry their instruction sets as target attributes and run only where the CPU has them).
 *
 * The compiler vectorizes the loops, but a dot product per head per row leaves most of the
 * work in dependent adds and horizontal folds, and a quantized row makes a round trip through
 * the scratch. The twins below do the same operations on the same values in the same order
 * (so the same bits: tests/test_attn_fast.c compares them on every format), arranged for the
 * machine:
 *  - rows in blocks of KV_ATTN_ROWS; fp16, bf16, per-token int8 and fp8 rows read as stored,
 *    each eight elements decoded in a register where the dot product or the value sum needs
 *    them (binary16 and bfloat16 -> binary32 are exact, fp8 goes by way of binary16, exact
 *    too, then times its scale, one rounding, as kv_quant_math.h; an int8 element is its
 *    code, the row's scale its factor, see kv_attn_row_at()); other formats (KIVI, int8 with
 *    group scales) decoded into the scratch first. fp32 rows need no decode, and the loops
 *    stream them faster than this arrangement does: they stay with the loops;
 *  - prefetches (prefetch_rows()) only where they pay: a paged view's blocks lie anywhere, a
 *    pattern the hardware prefetchers cannot guess, so each block of rows asks for the next
 *    one's bytes; a contiguous view is read in address order, which they follow, and only
 *    the value pass of a binary16 or bfloat16 cache asks as well, four blocks ahead (measured
 *    at 32k tokens, H 32: fp16 30.7 -> 35 GB/s; the same cost int8, bound by its arithmetic,
 *    7-11 %; docs/performance.md §7);
 *  - per row only its address is computed, the row's size a constant of the pass: these loops
 *    are bound by instructions issued (a format switch and a prefetch loop per row had cost
 *    15 % of the time with the cache in the LLC, int8, H 32, one thread);
 *  - scores: four heads per K row (8 independent vector sums instead of 2), or, for the heads
 *    left over, four rows per head; kv_dot16's 16 lanes as two 8-float vectors and its tree
 *    fold as three vector adds;
 *  - values: each output run of 32 columns of two heads kept in registers across the block's
 *    rows (one load and one store per block instead of per row);
 *  - int8 keys' scores, when the 16-bit query is on (kv_attn_q16()): integer dot products,
 *    exact, so any order of the adds gives the loops' bits; with it off, the codes as floats;
 *  - int8 value rows: one fused multiply-add per element, as the loops' fmaf().
 * Every other multiply and add stays two roundings (the library is compiled with
 * -ffp-contract=off). One difference: an fp16 NaN keeps its payload in hardware and not
 * through the table, so a NaN in the cache makes a NaN output either way, but not
 * necessarily the same NaN. */
#include "kv_attention_fast.h"

#include <math.h>

#if !KV_ATTN_X86
void kv_attn_cpu_detect(int *f16c, int *fma, int *avx2) { *f16c = *fma = *avx2 = 0; }
#else
#include <cpuid.h>
#include <immintrin.h>

/* CPUID leaf 1: F16C (ECX bit 29) and AVX (bit 28), and the OS saving the YMM registers
 * (OSXSAVE, bit 27, then XCR0 bits 1-2): asked directly, as not every compiler's
 * __builtin_cpu_supports() knows "f16c". The twins need all of F16C, FMA and AVX2. */
void kv_attn_cpu_detect(int *f16c, int *fma, int *avx2)
{
    unsigned a, b, c, d, lo = 0, hi;
    const unsigned need = (1u << 27) | (1u << 28) | (1u << 29);
    *f16c = *fma = *avx2 = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & need) != need) return;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 6u) != 6u) return;
    __builtin_cpu_init();
    *f16c = 1;
    *fma = __builtin_cpu_supports("fma") != 0;
    *avx2 = *fma && __builtin_cpu_supports("avx2");
}

/* An fp16 row eight elements per instruction (x86 F16C). binary16 -> binary32 is exact, so
 * every finite value and infinity is the table's float; only NaN payloads could differ, so a
 * group of eight holding an all-ones exponent (Inf or NaN) takes the table instead, and the
 * row stays the table's bit for bit. */
__attribute__((target("avx,f16c"))) void kv_attn_f16_row_f16c(const uint8_t *row, float *out,
                                                                int d)
{
    const __m128i exp_mask = _mm_set1_epi16(0x7c00);
    int j = 0;
    for (; j + 8 <= d; j += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(row + (size_t)j * 2));
        const __m128i special = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask);
        if (_mm_movemask_epi8(special))
            kv_attn_f16_row_table(row + (size_t)j * 2, out + j, 8);
        else
            _mm256_storeu_ps(out + j, _mm256_cvtph_ps(h));
    }
    kv_attn_f16_row_table(row + (size_t)j * 2, out + j, d - j);
}

/* The int8 value rows' fused loop (kv_attention_fast.c, add_row()) compiled for CPUs with FMA:
 * fmaf() becomes the instruction, vectorized, not a library call per element (ten times
 * slower); the same bits, both round once. */
__attribute__((target("fma"))) void kv_attn_add_row_fma(float *o, float w, const float *row,
                                                         int n)
{
    for (int j = 0; j < n; j++) o[j] = fmaf(w, row[j], o[j]);
}

/* this file's short names for the fast path's group and integer query (kv_attention_fast.h) */
typedef kv_attn_group group;
typedef kv_attn_qint qint;

#define KV_AVX2 __attribute__((target("avx2,f16c")))
#define KV_INLINE __attribute__((always_inline)) KV_AVX2 static inline
/* the value pass, which fuses the multiply-adds of int8 rows and nothing else: the compiler
 * may use FMA instructions only where the code asks (-ffp-contract=off), but GCC's vectorizer
 * has been seen to fuse a rotation's a·c - b·s all the same, so no other pass may use FMA */
#define KV_AVX2_FMA __attribute__((target("avx2,f16c,fma")))
#define KV_INLINE_FMA __attribute__((always_inline)) KV_AVX2_FMA static inline

/* How a block's rows are read: floats (fp32 rows, or any row decoded into the scratch),
 * binary16 or bfloat16 codes, int8 codes with one scale per row, fp8 codes (either kind) with
 * the head's scale. */
enum { ROW_F32, ROW_F16, ROW_BF16, ROW_I8, ROW_E4M3, ROW_E5M2 };

typedef struct {
    const void *p; /* the row's first element */
    float s;       /* fp8: the head's scale, applied per element */
    float f;       /* the row's factor (kv_attn_row_at()): ROW_I8 its scale, ROW_F32 as read */
} rowref;

/* Eight fp8 codes as floats, kvq_fp8_to_f32()'s values, by way of binary16 (a table lookup
 * per element would be a gather, slow on many x86 cores). e5m2 is the upper byte of a
 * binary16; e4m3 (bias 7) becomes a binary16 (bias 15) with its exponent and mantissa moved
 * into place, worth 2^-8 of it, for normal and subnormal codes alike, so it is multiplied by
 * 2^8 (exact); its NaN codes (S1111111) would read 480 and are replaced by NaN. */
KV_INLINE __m256 fp8x8(int e5m2, const uint8_t *p)
{
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p));
    if (e5m2) return _mm256_cvtph_ps(_mm_slli_epi16(w, 8));
    const __m128i low7 = _mm_and_si128(w, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                   _mm_slli_epi16(low7, 7));
    const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(low7, _mm_set1_epi16(0x7f)));
    return _mm256_blendv_ps(v, _mm256_set1_ps(NAN), _mm256_castsi256_ps(nan));
}

/* Elements j .. j+7 of a row as floats (f a constant where inlined). */
KV_INLINE __m256 load8(int f, rowref r, int j)
{
    if (f == ROW_F16)
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)r.p + j)));
    if (f == ROW_BF16) /* the 16 bits are a float's upper half */
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)r.p + j))), 16));
    if (f == ROW_I8) /* the codes: the row's scale is its factor */
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)(const void *)((const int8_t *)r.p + j))));
    if (f == ROW_E4M3 || f == ROW_E5M2)
        return _mm256_mul_ps(fp8x8(f == ROW_E5M2, (const uint8_t *)r.p + j), _mm256_set1_ps(r.s));
    return _mm256_loadu_ps((const float *)r.p + j);
}

/* Element j alone: the same value as load8() gives it. */
KV_INLINE float load1(int f, rowref r, int j)
{
    if (f == ROW_F16) return kv_attn_f16_table[((const uint16_t *)r.p)[j]];
    if (f == ROW_BF16) return kvq_bf16_to_f32(((const uint16_t *)r.p)[j]);
    if (f == ROW_I8) return (float)((const int8_t *)r.p)[j];
    if (f == ROW_E4M3 || f == ROW_E5M2)
        return kv_attn_fp8_table[f == ROW_E5M2][((const uint8_t *)r.p)[j]] * r.s;
    return ((const float *)r.p)[j];
}

/* kv_dot16()'s fold of its 16 lanes (a0 = lanes 0-7, a1 = lanes 8-15): l + (l+8), then
 * + (l+4), then + (l+2), then lane 0 + lane 1. */
KV_INLINE float fold16(__m256 a0, __m256 a1)
{
    const __m256 s8 = _mm256_add_ps(a0, a1);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps(s2, s2, 1));
}

/* A score: kv_dot16's lanes a, b, then its tail, times the row's factor and the scale;
 * stored, the max raised. */
KV_INLINE void score_out(const group *g, int h, int64_t i, __m256 a, __m256 b, int f, rowref k,
                         const float *q, int d16, float scale, float *mx)
{
    float x = fold16(a, b);
    for (int j = d16; j < g->d; j++) x += q[j] * load1(f, k, j); /* the tail, in order */
    x *= k.f;
    x *= scale;
    g->att[(size_t)h * g->len + i] = x;
    if (x > mx[h]) mx[h] = x;
}

/* kv_dot16(q_h, k, d) · scale for the NH heads h0 .. h0+NH-1 (NH = 4 or 1) against row i. */
KV_INLINE void dots(const group *g, int h0, int nh, int f, rowref k, int64_t i, float scale,
                    float *mx)
{
    const int d = g->d, d16 = d / KV_DOT_LANES * KV_DOT_LANES;
    const float *q[4];
    __m256 a[4], b[4];
    for (int t = 0; t < nh; t++) {
        q[t] = g->q + (size_t)(h0 + t) * d;
        a[t] = b[t] = _mm256_setzero_ps();
    }
    for (int j = 0; j < d16; j += 16) {
        const __m256 k0 = load8(f, k, j), k1 = load8(f, k, j + 8);
        for (int t = 0; t < nh; t++) {
            a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(_mm256_loadu_ps(q[t] + j), k0));
            b[t] = _mm256_add_ps(b[t], _mm256_mul_ps(_mm256_loadu_ps(q[t] + j + 8), k1));
        }
    }
    for (int t = 0; t < nh; t++) score_out(g, h0 + t, i, a[t], b[t], f, k, q[t], d16, scale, mx);
}

/* The same for one head h against four rows i .. i+3: four rows give the 8 vector sums. */
KV_INLINE void dots_rows(const group *g, int h, int f, const rowref *k, int64_t i, float scale,
                         float *mx)
{
    const int d = g->d, d16 = d / KV_DOT_LANES * KV_DOT_LANES;
    const float *q = g->q + (size_t)h * d;
    __m256 a[4], b[4];
    for (int c = 0; c < 4; c++) a[c] = b[c] = _mm256_setzero_ps();
    for (int j = 0; j < d16; j += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + j), q1 = _mm256_loadu_ps(q + j + 8);
        for (int c = 0; c < 4; c++) {
            a[c] = _mm256_add_ps(a[c], _mm256_mul_ps(q0, load8(f, k[c], j)));
            b[c] = _mm256_add_ps(b[c], _mm256_mul_ps(q1, load8(f, k[c], j + 8)));
        }
    }
    for (int c = 0; c < 4; c++) score_out(g, h, i + c, a[c], b[c], f, k[c], q, d16, scale, mx);
}

/* Integer scores of int8 rows (kv_attention_fast.c, kv_attn_int_keys()): the dot products Q · c of
 * nq heads' queries (1 to 3, a constant where inlined; q [nq][d]) against rows 0 .. n-1 (n a
 * multiple of 4), four rows at a time, 16 columns a step: each row's codes widened to 16 bits
 * once for the nq heads, one vpmaddwd per head (16 products of 16-bit integers, added in pairs)
 * and one add of 32-bit integers, where a float dot product takes two conversions, two
 * multiplies and two adds. Each row's eight lanes folded to one (exact in any order). */
KV_INLINE void dots_q16(const int16_t *q, int nq, const rowref *k, int n, int d,
                        int32_t (*dot)[KV_ATTN_ROWS])
{
    for (int c = 0; c < n; c += 4) {
        __m256i a[3][4];
        for (int t = 0; t < nq; t++)
            for (int u = 0; u < 4; u++) a[t][u] = _mm256_setzero_si256();
        for (int j = 0; j < d; j += 16)
            for (int u = 0; u < 4; u++) {
                const __m256i cu = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                    (const __m128i *)(const void *)((const int8_t *)k[c + u].p + j)));
                for (int t = 0; t < nq; t++)
                    a[t][u] = _mm256_add_epi32(a[t][u], _mm256_madd_epi16(cu, _mm256_loadu_si256(
                        (const __m256i *)(const void *)(q + (size_t)t * d + j))));
            }
        for (int t = 0; t < nq; t++) {
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[t][0], a[t][1]),
                                                _mm256_hadd_epi32(a[t][2], a[t][3]));
            _mm_storeu_si128((__m128i *)(void *)(dot[t] + c),
                             _mm_add_epi32(_mm256_castsi256_si128(h),
                                           _mm256_extracti128_si256(h, 1)));
        }
    }
}

/* Pass 1 over a block of n int8 rows b .. b+n-1: the heads three at a time against four rows
 * at a time (the rows are in L1 after the first three), the rows left over one by one; each
 * head's scores and max in row order. */
KV_INLINE void scores_block_q16(const group *g, const qint *qi, const rowref *k, int n,
                                int64_t b, float *mx)
{
    const int d = g->d, n4 = n / 4 * 4;
    for (int h0 = 0; h0 < g->G; h0 += 3) {
        const int nq = g->G - h0 < 3 ? g->G - h0 : 3;
        const int16_t *q = qi->q16 + (size_t)h0 * d;
        int32_t dot[3][KV_ATTN_ROWS];
        if (nq == 3) dots_q16(q, 3, k, n4, d, dot); /* the count a constant of each call */
        else if (nq == 2) dots_q16(q, 2, k, n4, d, dot);
        else dots_q16(q, 1, k, n4, d, dot);
        for (int t = 0; t < nq; t++) {
            const int h = h0 + t;
            float *att = g->att + (size_t)h * g->len + b;
            for (int c = n4; c < n; c++) dot[t][c] = kv_attn_dot_q16(q + (size_t)t * d, k[c].p, d);
            for (int c = 0; c < n; c++) {
                att[c] = kv_attn_int_score(dot[t][c], k[c].f, qi->step[h]);
                if (att[c] > mx[h]) mx[h] = att[c];
            }
        }
    }
}

/* Pass 1 over a block of n rows b .. b+n-1 read as f: four heads per row, then the heads
 * left over four rows at a time. */
KV_INLINE void scores_block(const group *g, int f, const rowref *k, int n, int64_t b,
                            float scale, float *mx)
{
    int h = 0;
    for (; h + 4 <= g->G; h += 4)
        for (int c = 0; c < n; c++) dots(g, h, 4, f, k[c], b + c, scale, mx);
    for (; h < g->G; h++) {
        int c = 0;
        for (; c + 4 <= n; c += 4) dots_rows(g, h, f, k + c, b + c, scale, mx);
        for (; c < n; c++) dots(g, h, 1, f, k[c], b + c, scale, mx);
    }
}

/* kv_attn_row_at() with the formats the twins decode in registers left where they are: how a view's
 * rows are read (ROW_F16 / ROW_I8 for fp16 and per-token int8 rows of whole 16-element runs
 * outside a KIVI window, else ROW_F32 through the scratch). */
KV_AVX2 static int row_kind(const kv_head_view *h)
{
    if (h->d % 16 || h->q < INT64_MAX / 2) return ROW_F32;
    if (h->fmt == KV_QF_F16) return ROW_F16;
    if (h->fmt == KV_QF_BF16) return ROW_BF16;
    if (kv_attn_int8_per_row(h)) return ROW_I8;
    if (h->fmt == KV_QF_FP8_E4M3) return ROW_E4M3;
    if (h->fmt == KV_QF_FP8_E5M2) return ROW_E5M2;
    return ROW_F32;
}

/* Bytes of one stored row of a kind read in registers: 2 per element for binary16 and
 * bfloat16, 1 for int8 and fp8 (kvq_row_bytes(), without its switch in the per-row path). */
KV_AVX2 static int64_t kind_row_bytes(int f, int d)
{
    return (int64_t)d * (f == ROW_F16 || f == ROW_BF16 ? 2 : 1);
}

/* Row t of a view as the kind f reads it (rows of @p rb bytes): the stored codes (and
 * scale), or columns [j0, j1) decoded into @p scratch (or the KIVI window's fp32 row where it
 * lies). */
KV_INLINE rowref row_ref(const kv_head_view *h, int f, int64_t rb, int64_t t, int j0, int j1,
                        float *scratch)
{
    rowref r = {NULL, 0.0f, 1.0f};
    if (f != ROW_F32) {
        const int64_t row = kv_view_row(h, t);
        r.p = h->codes + row * rb;
        if (f == ROW_I8) /* one scale per row (row_kind()): kvq_meta_index() is the row */
            r.f = ((const float *)h->meta)[row];
        if (f == ROW_E4M3 || f == ROW_E5M2) r.s = h->scale;
        return r;
    }
    r.p = kv_attn_row_at(h, t, j0, j1, scratch, &r.f);
    return r;
}

/* Ask for the stored bytes of columns [j0, j1) of positions i .. i+n-1 (clipped to the
 * group's len) while earlier blocks are computed (see above for which): a paged view's rows
 * one by one into L1, a contiguous view's as one run of bytes into L2. Only where a position
 * is its row (no window) and the format has whole bytes per element. The prefetches are asm
 * statements: GCC takes _mm_prefetch() for a call without effects and, this function having
 * no other, drops every call to it. */
KV_AVX2 static void prefetch_rows(const group *g, const kv_head_view *h, int64_t i, int n,
                                  int j0, int j1)
{
    if (g->w.window || kvq_code_bits(h->fmt) < 8) return; /* KIVI, int4-g32: sub-byte codes */
    const int eb = kvq_code_bits(h->fmt) / 8;
    const int64_t rb = (int64_t)h->d * eb, last = g->len < h->q ? g->len : h->q;
    const int64_t end = i + n < last ? i + n : last;
    if (!h->blocks) {
        const uint8_t *p = h->codes + i * rb;
        for (int64_t o = 0; o < (end - i) * rb; o += 64)
            __asm__ __volatile__("prefetcht2 %0" : : "m"(p[o]));
        return;
    }
    for (int64_t t = i; t < end; t++) {
        const uint8_t *p = h->codes + kv_view_row(h, t) * rb;
        for (int64_t o = (int64_t)j0 * eb; o < (int64_t)j1 * eb; o += 64)
            __asm__ __volatile__("prefetcht0 %0" : : "m"(p[o]));
    }
}

/* The rows of the walk's next n steps into t[n], the walk moved past them. Positions below
 * ns (the sinks, or every position without a window) are their own rows, so a block of
 * them is a run and needs no step-by-step walk. */
KV_INLINE void walk_rows(kv_window_walk *k, int n, int64_t *t)
{
    if (k->pos + n < k->ns) {
        for (int c = 0; c < n; c++) t[c] = k->pos + c;
        k->pos += n;
        k->row = k->pos;
        return;
    }
    for (int c = 0; c < n; c++, kv_window_walk_next(k)) t[c] = k->row;
}

/* kv_attn_group_scores() over rows [i0, i1) read as f, in blocks of KV_ATTN_ROWS rows (f a constant
 * where inlined: each row's reference is then an address and a scale, no format switch). */
KV_INLINE void scores_rows(const group *g, int f, int64_t i0, int64_t i1, float *mx,
                           float *rows, const qint *qi)
{
    const int d = g->d;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t rb = kind_row_bytes(f, d);
    kv_window_walk k;
    kv_attn_walk_at(&k, &g->w, i0);
    for (int64_t b = i0; b < i1; b += KV_ATTN_ROWS) {
        const int n = i1 - b < KV_ATTN_ROWS ? (int)(i1 - b) : KV_ATTN_ROWS;
        rowref kp[KV_ATTN_ROWS];
        int64_t t[KV_ATTN_ROWS];
        if (g->kh.blocks && b + n < i1) prefetch_rows(g, &g->kh, b + n, KV_ATTN_ROWS, 0, d);
        walk_rows(&k, n, t);
        for (int c = 0; c < n; c++) {
            float *row = rows + (size_t)c * d;
            if (f == ROW_F32 && g->w.rope_cs) {
                rowref r = {NULL, 0.0f, 1.0f};
                r.p = kv_attn_key_row(g, t[c], b + c, row, &r.f);
                kp[c] = r;
            } else {
                kp[c] = row_ref(&g->kh, f, rb, t[c], 0, d, row);
            }
        }
        if (f == ROW_I8 && qi)
            scores_block_q16(g, qi, kp, n, b, mx);
        else
            scores_block(g, f, kp, n, b, scale, mx);
    }
}

/* kv_attn_group_scores() read as the key view's kind; @p qi for integer-scored int8 keys, whose
 * rows are ROW_I8 unless d is not a multiple of 16: those go to the loops. */
KV_AVX2 void kv_attn_group_scores_avx2(const group *g, int64_t i0, int64_t i1, float *mx,
                                      float *rows, const qint *qi)
{
    const int kind = g->w.rope_cs ? ROW_F32 : row_kind(&g->kh);
    if (qi && kind != ROW_I8) {
        kv_attn_group_scores(g, i0, i1, mx, rows, qi);
        return;
    }
    switch (kind) { /* the kind a constant of each call */
    case ROW_F16: scores_rows(g, ROW_F16, i0, i1, mx, rows, NULL); break;
    case ROW_BF16: scores_rows(g, ROW_BF16, i0, i1, mx, rows, NULL); break;
    case ROW_I8: scores_rows(g, ROW_I8, i0, i1, mx, rows, qi); break;
    case ROW_E4M3: scores_rows(g, ROW_E4M3, i0, i1, mx, rows, NULL); break;
    case ROW_E5M2: scores_rows(g, ROW_E5M2, i0, i1, mx, rows, NULL); break;
    default: scores_rows(g, ROW_F32, i0, i1, mx, rows, NULL);
    }
}

/* x + w·v as add_row() does it: fused for int8 codes, else a multiply then an add. */
KV_INLINE_FMA __m256 madd(int f, __m256 w, __m256 v, __m256 x)
{
    return f == ROW_I8 ? _mm256_fmadd_ps(w, v, x) : _mm256_add_ps(x, _mm256_mul_ps(w, v));
}

/* out[h][j .. j+8U) of NHH heads (1 to 3) += w_h[c] · v_c[j .. j+8U) over the block's rows c
 * in order, the outputs held in registers across the rows; nhh and U constants where inlined:
 * U = 4 for one or two heads, 2 for three (a group of 3 query heads, SmolLM2's 9 over 3, in
 * one pass over the rows, each row's codes converted once for the three where a pair and then
 * a single head would convert them twice), 1 for what is left of a row. */
KV_INLINE_FMA void values_run(float *const *o, const float *const *w, int nhh, int U, int f,
                              const rowref *vp, int n, int j)
{
    __m256 x[3][4];
    for (int t = 0; t < nhh; t++)
        for (int u = 0; u < U; u++) x[t][u] = _mm256_loadu_ps(o[t] + j + 8 * u);
    for (int c = 0; c < n; c++) {
        __m256 v[4];
        for (int u = 0; u < U; u++) v[u] = load8(f, vp[c], j + 8 * u);
        for (int t = 0; t < nhh; t++) {
            const __m256 wt = _mm256_set1_ps(w[t][c]);
            for (int u = 0; u < U; u++) x[t][u] = madd(f, wt, v[u], x[t][u]);
        }
    }
    for (int t = 0; t < nhh; t++)
        for (int u = 0; u < U; u++) _mm256_storeu_ps(o[t] + j + 8 * u, x[t][u]);
}

/* Pass 3 over a block of n rows read as f, columns [j0, j1): heads in pairs (an odd count's
 * first three together), runs of 32 columns in registers (16 for three heads), then runs of 8,
 * the last columns one at a time, rows in order; each weight times its row's factor first, as
 * kv_attn_group_values() does. */
KV_INLINE_FMA void values_block(const group *g, int f, const rowref *vp, const float *fac, int n,
                            int64_t i0, int j0, int j1)
{
    const int G = g->G, d = g->d;
    for (int h = 0; h < G;) {
        const int left = G - h, nhh = left >= 3 && left % 2 ? 3 : left >= 2 ? 2 : 1;
        float *o[3], wf[3][KV_ATTN_ROWS];
        const float *w[3];
        for (int t = 0; t < nhh; t++) {
            o[t] = g->out + (size_t)(h + t) * d;
            w[t] = g->att + (size_t)(h + t) * g->len + i0;
            if (f == ROW_I8 || f == ROW_F32) { /* the kinds whose rows have factors */
                for (int c = 0; c < n; c++) wf[t][c] = w[t][c] * fac[c];
                w[t] = wf[t];
            }
        }
        int j = j0;
        if (nhh == 3) { /* the head count a constant of each call: registers, not arrays */
            for (; j + 16 <= j1; j += 16) values_run(o, w, 3, 2, f, vp, n, j);
            for (; j + 8 <= j1; j += 8) values_run(o, w, 3, 1, f, vp, n, j);
        } else if (nhh == 2) {
            for (; j + 32 <= j1; j += 32) values_run(o, w, 2, 4, f, vp, n, j);
            for (; j + 8 <= j1; j += 8) values_run(o, w, 2, 1, f, vp, n, j);
        } else {
            for (; j + 32 <= j1; j += 32) values_run(o, w, 1, 4, f, vp, n, j);
            for (; j + 8 <= j1; j += 8) values_run(o, w, 1, 1, f, vp, n, j);
        }
        for (; j < j1; j++)
            for (int t = 0; t < nhh; t++)
                for (int c = 0; c < n; c++)
                    o[t][j] = f == ROW_I8 ? fmaf(w[t][c], load1(f, vp[c], j), o[t][j])
                                          : o[t][j] + w[t][c] * load1(f, vp[c], j);
        h += nhh;
    }
}

/* kv_attn_group_values() read as f, in blocks of KV_ATTN_ROWS rows (f a constant where inlined, as
 * in scores_rows()). rows [KV_ATTN_ROWS][d] scratch. */
KV_INLINE_FMA void values_rows(const group *g, int f, int j0, int j1, float *sum, float *rows)
{
    const int G = g->G, d = g->d;
    const int64_t rb = kind_row_bytes(f, d);
    /* blocks ahead to ask for (above): paged 1, contiguous binary16 / bfloat16 4, else none */
    const int ahead = g->vh.blocks ? 1 : f == ROW_F16 || f == ROW_BF16 ? 4 : 0;
    for (int h = 0; h < G; h++) {
        sum[h] = 0.0f;
        for (int j = j0; j < j1; j++) g->out[(size_t)h * d + j] = 0.0f;
    }
    kv_window_walk k;
    kv_attn_walk_at(&k, &g->w, 0);
    for (int64_t i0 = 0; i0 < g->len; i0 += KV_ATTN_ROWS) {
        const int n = g->len - i0 < KV_ATTN_ROWS ? (int)(g->len - i0) : KV_ATTN_ROWS;
        rowref vp[KV_ATTN_ROWS];
        float fac[KV_ATTN_ROWS]; /* the rows' factors, beside each other for the weights */
        if (ahead)
            prefetch_rows(g, &g->vh, i0 + n + (ahead - 1) * KV_ATTN_ROWS, KV_ATTN_ROWS, j0, j1);
        int64_t t[KV_ATTN_ROWS];
        walk_rows(&k, n, t);
        for (int c = 0; c < n; c++) {
            vp[c] = row_ref(&g->vh, f, rb, t[c], j0, j1, rows + (size_t)c * d);
            fac[c] = vp[c].f;
        }
        for (int h = 0; h < G; h++) {
            const float *wh = g->att + (size_t)h * g->len + i0;
            for (int c = 0; c < n; c++) sum[h] += wh[c]; /* in position order */
        }
        values_block(g, f, vp, fac, n, i0, j0, j1);
    }
    for (int h = 0; h < G; h++) {
        const float inv = 1.0f / sum[h];
        for (int j = j0; j < j1; j++) g->out[(size_t)h * d + j] *= inv;
    }
}

/* kv_attn_group_values() read as the value view's kind; int8 rows the kind does not read as codes
 * (d not a multiple of 16) go to the loops, which fuse their multiply-adds (add_row()). */
KV_AVX2_FMA void kv_attn_group_values_avx2(const group *g, int j0, int j1, float *sum,
                                           float *rows)
{
    const int kind = row_kind(&g->vh);
    if (kv_attn_int8_per_row(&g->vh) && kind != ROW_I8) {
        kv_attn_group_values(g, j0, j1, sum, rows);
        return;
    }
    switch (kind) { /* the kind a constant of each call */
    case ROW_F16: values_rows(g, ROW_F16, j0, j1, sum, rows); break;
    case ROW_BF16: values_rows(g, ROW_BF16, j0, j1, sum, rows); break;
    case ROW_I8: values_rows(g, ROW_I8, j0, j1, sum, rows); break;
    case ROW_E4M3: values_rows(g, ROW_E4M3, j0, j1, sum, rows); break;
    case ROW_E5M2: values_rows(g, ROW_E5M2, j0, j1, sum, rows); break;
    default: values_rows(g, ROW_F32, j0, j1, sum, rows);
    }
}

/* exp_rows(): kv_attn_exp_le0() eight at a time, the same operations in the same order (its selects
 * as compares and blends, which the compiler will not make of a branch on floats). */
KV_AVX2 void kv_attn_exp_rows_avx2(float *x, int64_t n, float max)
{
    const __m256 vmax = _mm256_set1_ps(max), floor = _mm256_set1_ps(-87.0f);
    const __m256 big = _mm256_set1_ps(12582912.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    const __m256 c5 = _mm256_set1_ps(1.9875691500e-4f), c4 = _mm256_set1_ps(1.3981999507e-3f);
    const __m256 c3 = _mm256_set1_ps(8.3334519073e-3f), c2 = _mm256_set1_ps(4.1665795894e-2f);
    const __m256 c1 = _mm256_set1_ps(1.6666665459e-1f), c0 = _mm256_set1_ps(5.0000001201e-1f);
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_sub_ps(_mm256_loadu_ps(x + i), vmax);
        const __m256 xc = _mm256_max_ps(xv, floor); /* NaN -> -87, as x > -87 ? x : -87 */
        const __m256 kf = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, log2e), big), big);
        const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(kf, ln2_hi)),
                                       _mm256_mul_ps(kf, ln2_lo));
        __m256 p = c5;
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c4);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c3);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c2);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c1);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), c0);
        p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), one);
        const __m256i bits = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvttps_epi32(kf), _mm256_set1_epi32(127)), 23);
        const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
        const __m256 in_range = _mm256_cmp_ps(xv, floor, _CMP_GE_OQ);
        const __m256 nan = _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q);
        const __m256 below = _mm256_blendv_ps(_mm256_setzero_ps(), xv, nan);
        _mm256_storeu_ps(x + i, _mm256_blendv_ps(below, e, in_range));
    }
    for (; i < n; i++) x[i] = kv_attn_exp_le0(x[i] - max);
}

#endif
