/* The attention family on the CPU (kv_attention.h).
 *
 * The math is written once, as the passes of one group (group_scores(), exp_rows(),
 * group_values() below): the G query heads that read one KV head, over its len retained rows.
 * kv_attn_decode() feeds them plain arrays; kv_attention(), kv_attention_rows() and
 * kv_attention_head() feed them the rows of a kv_cache, found through the cache's spec:
 * chapter 02's fp32 rows read where they lie, chapter 04's storage formats dequantized a row
 * at a time as they are read (kv_attn_row(): the per-element decode the CUDA kernels share;
 * a per-token int8 row is read as its codes, its one scale applied once per dot product and
 * per weight, kv_attn_row_factored(), and its keys met by the query rounded to 16-bit
 * integers, kv_attn_int_keys()), chapter 06's windows walked in position order. Later
 * layouts are new cases of the row lookup, not new copies of the math.
 *
 * Grouped-query attention (chapter 03) is which K/V rows a query head is handed: query head h
 * reads KV head kv_attn_kv_head(h) = h / G. The G heads of a group are computed together, so
 * each cached row is read from memory (and dequantized) once per KV head, not once per query
 * head, as the GPU's v2 kernel does by packing a group into one block (cuda/attention/kvcu_attention.cu).
 * Every head still sees its own scores, exponentials and sums in the same order as if it were
 * alone, so "GQA" and "MHA whose K/V heads are duplicated across each group" give bit-identical
 * outputs (tests/test_gqa.c), and a head computed alone (kv_attention_head()) gives the bits
 * of the same head computed with its group.
 *
 * Speed: decode is memory-bound, so the passes must keep up with DRAM. The loops below are
 * written so the compiler can vectorize them without reordering anything (kv_dot16()'s lanes,
 * exp_le0() without branches), and on x86-64 CPUs with AVX2 (asked at run time) each pass has
 * a twin written with intrinsics that does the same operations in the same order, arranged
 * for the machine (the AVX2 section explains how). Multiplies and adds are fused only where
 * the code says so (the library is compiled with -ffp-contract=off): a fused multiply-add
 * rounds once where a multiply then an add rounds twice, so the loops and the twins must
 * make the same choice at the same place. The one place is the value rows of an int8 cache
 * (kv_attn_add_row()): fmaf() in the loops, exactly rounded on every machine, and the FMA
 * instruction in the twins. The test that holds the twins to the loops compares bits
 * (tests/test_attn_simd.c). */
#include "kv_attention.h"
#include "kv_ops.h"

/* x86-64 with GCC or Clang: fp16 rows may use the F16C instructions (kv_attn_row) */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_F16C 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define KV_F16C 0
#endif

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

/* Rows per block of the AVX2 passes: their decoded rows sit in the scratch, 8·d floats per
 * thread (4 KiB at d = 128, in L1). Measured on the 2-core VM (fp16 and int8 caches, 32k
 * tokens, H 32, `kvlab bench attention --only engine`, three runs each): 8 rows 15.6 / 14.3 ms,
 * 4 rows 15.9 / 14.4 ms, 16 rows 21-23 / 15-17 ms. */
#define KV_ATTN_ROWS 8


/* ---- decode tables -------------------------------------------------------------------------
 * fp16 and fp8 codes have few enough patterns to decode each one once: f16_table[h] is
 * kvq_f16_to_f32(h) for all 65536 codes, fp8_table[e5m2][b] is kvq_fp8_to_f32(b, e5m2) for all
 * 256. A lookup returns the very float the function returns (the table is filled by calling
 * it), so the rows below are kv_cache_elem()'s bit for bit, only without a branchy conversion
 * per element (test_quant_cache checks every code). bf16 needs no table: its decode is a
 * shift. The tables are filled once, by whichever thread first decodes a row, under
 * pthread_once: attention calls kv_attn_row() from inside an OpenMP loop. */
static float f16_table[65536];    /* [code] kvq_f16_to_f32(code) */
static float fp8_table[2][256];   /* [e5m2][code] kvq_fp8_to_f32(code, e5m2) */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
static int have_f16c;             /* the CPU converts fp16 in hardware (x86 F16C), see below */
static int have_fma;              /* ... and FMA (int8 value rows, add_row()) */
static int have_avx2;             /* ... and AVX2 too (the passes' twins, below) */
static int use_avx2;              /* the twins run (kv_attn_simd(); default: have_avx2) */

#if KV_F16C
/* CPUID leaf 1: F16C (ECX bit 29) and AVX (bit 28), and the OS saving the YMM registers
 * (OSXSAVE, bit 27, then XCR0 bits 1-2): asked directly, as not every compiler's
 * __builtin_cpu_supports() knows "f16c". */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned need = (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & need) != need) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 6u) == 6u;
}
#endif

static void tables_build(void)
{
    for (uint32_t h = 0; h < 65536u; h++) f16_table[h] = kvq_f16_to_f32((uint16_t)h);
    for (int e5 = 0; e5 < 2; e5++)
        for (uint32_t b = 0; b < 256u; b++) fp8_table[e5][b] = kvq_fp8_to_f32((uint8_t)b, e5);
#if KV_F16C
    have_f16c = cpu_has_f16c();
    __builtin_cpu_init();
    have_fma = have_f16c && __builtin_cpu_supports("fma");
    /* the twins also fuse the int8 value rows' multiply-adds (add_row()) */
    have_avx2 = have_fma && __builtin_cpu_supports("avx2");
#endif
    use_avx2 = have_avx2;
}

/* An fp16 row through the table: one lookup per element (the portable path). */
static void f16_row_table(const uint8_t *row, float *out, int d)
{
    for (int j = 0; j < d; j++) {
        uint16_t b;
        memcpy(&b, row + (size_t)j * 2, 2);
        out[j] = f16_table[b];
    }
}

#if KV_F16C
/* The same row eight elements per instruction (x86 F16C, chosen at run time: the library is
 * built for any x86-64). binary16 -> binary32 is exact, so every finite value and infinity is
 * the table's float; only NaN payloads could differ, so a group of eight holding an all-ones
 * exponent (Inf or NaN) takes the table instead, and the row stays the table's bit for bit. */
__attribute__((target("avx,f16c"))) static void f16_row_f16c(const uint8_t *row, float *out,
                                                               int d)
{
    const __m128i exp_mask = _mm_set1_epi16(0x7c00);
    int j = 0;
    for (; j + 8 <= d; j += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(row + (size_t)j * 2));
        const __m128i special = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask);
        if (_mm_movemask_epi8(special))
            f16_row_table(row + (size_t)j * 2, out + j, 8);
        else
            _mm256_storeu_ps(out + j, _mm256_cvtph_ps(h));
    }
    f16_row_table(row + (size_t)j * 2, out + j, d - j);
}
#endif

/* Columns [j0, j1) of row t of a head view into out[j0 .. j1): kv_cache_elem() for every j,
 * with the format's switch and the row's metadata lookups hoisted out of the loop and the
 * fp16 / fp8 conversions read from the tables above (the rest of the per-element arithmetic is
 * kv_quant_math.h's, so the values are kv_cache_elem()'s bit for bit; test_quant_cache checks
 * it). This is the CPU's share of "dequantize inside attention": one row at a time, in a
 * d-float scratch, never the whole cache. Part of a row, because the value pass may be split
 * over threads by columns (group_values()): each thread then reads only its columns. */
static void row_part(const kv_head_view *h, int64_t t, int j0, int j1, float *out)
{
    const int d = h->d, n = j1 - j0;
    if (t >= h->q) {
        memcpy(out + j0, h->ring + (t % h->window) * d + j0, (size_t)n * sizeof(float));
        return;
    }
    pthread_once(&tables_once, tables_build);
    const int64_t r = kv_view_row(h, t); /* the stored row: codes and metadata live there */
    const uint8_t *row = h->codes + r * kvq_row_bytes(h->fmt, d);
    switch (h->fmt) {
    case KV_QF_F32: /* a paged fp32 row: plain floats, wherever its block is */
        memcpy(out + j0, row + (size_t)j0 * 4, (size_t)n * sizeof(float));
        return;
    case KV_QF_F16: /* in hardware where the CPU has it, else through the table */
#if KV_F16C
        if (have_f16c) {
            f16_row_f16c(row + (size_t)j0 * 2, out + j0, n);
            return;
        }
#endif
        f16_row_table(row + (size_t)j0 * 2, out + j0, n);
        return;
    case KV_QF_BF16: /* kvq_bf16_to_f32() is a shift: no table needed */
        for (int j = j0; j < j1; j++) {
            uint16_t b;
            memcpy(&b, row + (size_t)j * 2, 2);
            out[j] = kvq_bf16_to_f32(b);
        }
        return;
    case KV_QF_FP8_E4M3: case KV_QF_FP8_E5M2: {
        const float *tab = fp8_table[h->fmt == KV_QF_FP8_E5M2], s = h->scale;
        for (int j = j0; j < j1; j++) out[j] = tab[row[j]] * s;
        return;
    }
    case KV_QF_INT8: case KV_QF_INT8_G32: case KV_QF_INT8_G64: case KV_QF_INT8_G128: {
        const int g = kvq_row_group(h->fmt, h->role, d);
        const float *s = (const float *)h->meta + kvq_meta_index(h->fmt, h->role, r, 0, d);
        for (int j = j0; j < j1;) { /* group by group: no division per element */
            const int end = (j / g + 1) * g < j1 ? (j / g + 1) * g : j1;
            const float sg = s[j / g];
            for (; j < end; j++) out[j] = kvq_int8_decode((int8_t)row[j], sg);
        }
        return;
    }
    case KV_QF_INT4_KIVI: case KV_QF_INT2_KIVI: {
        const kv_qsz *m = (const kv_qsz *)h->meta + kvq_meta_index(h->fmt, h->role, r, 0, d);
        const int per_channel = h->role == KV_QROLE_KEY; /* keys: one entry per channel */
        /* kvq_unpack() with the bit width a constant of each branch; the binary16 scale and
         * zero through the table */
        if (h->fmt == KV_QF_INT4_KIVI)
            for (int j = j0; j < j1; j++) {
                const kv_qsz p = m[per_channel ? j : j / KV_KIVI_GROUP];
                out[j] = kvq_asym_decode(kvq_unpack(row, j, 4), f16_table[p.scale],
                                         f16_table[p.zero]);
            }
        else
            for (int j = j0; j < j1; j++) {
                const kv_qsz p = m[per_channel ? j : j / KV_KIVI_GROUP];
                out[j] = kvq_asym_decode(kvq_unpack(row, j, 2), f16_table[p.scale],
                                         f16_table[p.zero]);
            }
        return;
    }
    default:
        for (int j = j0; j < j1; j++) out[j] = kv_cache_elem(h, t, j);
    }
}

void kv_attn_row(const kv_head_view *h, int64_t t, float *out) { row_part(h, t, 0, h->d, out); }

/* Rotate a key row [d] by cache index i (chapter 06, KV_POS_CACHE): the pairs (2j, 2j+1)
 * of its first rotary_dim dims, with the cos/sin kv_rope() would use at position i (the
 * cache's table), in kv_rope()'s arithmetic, so the bits are kv_rope()'s. */
static void rotate_row(float *row, const float *cs, int64_t i, int rotary_dim)
{
    const int P = rotary_dim / 2;
    const float *ci = cs + (size_t)i * P * 2; /* [P][2] */
    for (int j = 0; j < P; j++) {
        const float c = ci[2 * j], s = ci[2 * j + 1];
        const float a = row[2 * j], b = row[2 * j + 1];
        row[2 * j] = a * c - b * s;
        row[2 * j + 1] = a * s + b * c;
    }
}


/* ---- pass 2: the exponentials ---------------------------------------------------------------
 * exp(x) for x <= 0 (a score minus its row's max: the largest becomes exp(0) = 1 exactly).
 * x = k·ln2 + r with k an integer and |r| <= ln2/2, so exp(x) = 2^k · e^r:
 *   k  = x·log2(e) rounded to nearest, by adding and subtracting 1.5·2^23 (a float that big
 *        has no fraction bits left), which vectorizes on any x86-64, unlike rintf();
 *   r  = x - k·ln2 in two steps, ln2 = hi + lo with hi short enough that k·hi is exact;
 *   e^r by its degree-7 series with minimax-adjusted coefficients (Cephes' expf), ~1 ulp;
 *   2^k written straight into a float's exponent bits.
 * Below -87, e^x < 2^-125, under every weight that could matter next to the max's 1: 0. NaN
 * stays NaN, so a poisoned score still shows in the output. No branches: the compiler runs
 * eight at a time. */
static inline float exp_le0(float x)
{
    const float big = 12582912.0f; /* 1.5 · 2^23 */
    const float xc = x > -87.0f ? x : -87.0f;
    const float kf = (xc * 1.44269504088896341f + big) - big;
    const float r = (xc - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)kf + 127) * (1 << 23); /* 2^k, k in [-126, 0] */
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    const float e = p * two_k;
    return x >= -87.0f ? e : (x != x ? x : 0.0f);
}

/* x[i] = exp(x[i] - max), element by element: vectorized, and the same bits whatever the
 * vector width (each element alone). */
#if KV_F16C
static void exp_rows_avx2(float *x, int64_t n, float max);
#endif
static int simd_on(void);

static void exp_rows(float *x, int64_t n, float max)
{
#if KV_F16C
    if (simd_on()) {
        exp_rows_avx2(x, n, max);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) x[i] = exp_le0(x[i] - max);
}

float kv_attn_exp_sum(float *x, int64_t n, float max)
{
    if (max == -INFINITY) { /* nothing visible: every weight 0, and no exp(-inf + inf) */
        for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
        return 0.0f;
    }
    exp_rows(x, n, max);
    /* the sum in position order: a masked position adds an exact 0 and changes nothing, so
     * a window's attention has the bits of full attention under the equivalent mask */
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

/* ---- one group: the G query heads of one KV head, one query row -------------------------- */

/* What a query sees of a cache (chapter 06): the retention window of its slot, and where
 * keys still need their rotation. W = 0 is the chapter 02-05 cache: position i, row i. */
typedef struct {
    int window, n_sinks; /* W, S of the spec */
    int64_t t;           /* the query's position */
    const float *rope_cs; /* KV_POS_CACHE: cos/sin per cache index, else NULL */
    int rotary_dim;
} retained;

/* The G heads' work over len retained rows, in position order (kv_window_walk: the sinks, then
 * the window, each read from its logical row, so a windowed cache gives the bits full
 * attention with the equivalent mask gives: masked positions would only add exp(-inf) = 0 to
 * the sum and 0·v to the output). Rows come from plain arrays (k, v: kv_attn_decode) or from
 * the cache's views. */
typedef struct {
    int G, d;
    int64_t len;
    const float *q;              /* [G][d] the group's queries */
    float *out;                  /* [G][d] */
    float *att;                  /* [G][len] scores, then exponentials */
    float *sum;                  /* [G] */
    const float *k, *v;          /* plain rows [len][d], or NULL for: */
    kv_head_view kh, vh;         /* the cache's K and V rows of this KV head */
    retained w;                  /* which rows, and key rotation */
} group;

/* The group's queries as integer-scored keys meet them (kv_attn_query_q16()): q16 [G][d],
 * step [G] each head's step times 1/√d. */
typedef struct {
    const int16_t *q16;
    const float *step;
} qint;

/* A walk over the retained rows started at the i-th (kv_window_walk_start() is i = 0). */
static void walk_at(kv_window_walk *k, const retained *w, int64_t i)
{
    kv_window_walk_start(k, w->window, w->n_sinks, w->t);
    if (i == 0) return;
    k->pos = kv_window_pos(w->window, w->n_sinks, w->t, i);
    k->row = kv_window_row(w->window, w->n_sinks, k->pos);
}

/* Whether a view's rows are int8 codes with one scale per row (KV_QF_INT8, per token). */
static inline int int8_per_row(const kv_head_view *h)
{
    return h->fmt == KV_QF_INT8 && kvq_row_group(h->fmt, h->role, h->d) == h->d;
}

/* A per-token int8 row t: its codes where they lie, its scale into @p scale. */
static inline const int8_t *int8_row(const kv_head_view *h, int64_t t, float *scale)
{
    const int64_t r = kv_view_row(h, t);
    *scale = ((const float *)h->meta)[kvq_meta_index(h->fmt, h->role, r, 0, h->d)];
    return (const int8_t *)(const void *)(h->codes + r * kvq_row_bytes(h->fmt, h->d));
}

/* Columns [j0, j1) of row t for reading, and the factor the caller applies to the row
 * (kv_attn_row_factored()): fp32 rows where they lie (a paged fp32 cache reads its rows in
 * their blocks at the speed of the contiguous one; the KIVI fp32 window in its ring); a
 * per-token int8 row as its codes converted to floats, factor its scale; any other row
 * dequantized into @p scratch. Indexed by column: p[j], j0 <= j < j1.
 * Why the int8 scale stays outside: q · (c·s) element by element costs a multiply per
 * element, (q · c)·s one per row, and int8 attention is bound by its arithmetic, not by
 * the memory (docs/performance.md §7). The same math, rounded differently. */
static inline const float *row_at(const kv_head_view *h, int64_t t, int j0, int j1,
                                  float *scratch, float *factor)
{
    *factor = 1.0f;
    if (t >= h->q) return h->ring + (t % h->window) * h->d;
    if (h->fmt == KV_QF_F32) return (const float *)(const void *)h->codes + kv_view_row(h, t) * h->d;
    if (int8_per_row(h)) {
        const int8_t *c = int8_row(h, t, factor);
        for (int j = j0; j < j1; j++) scratch[j] = (float)c[j];
        return scratch;
    }
    row_part(h, t, j0, j1, scratch);
    return scratch;
}

float kv_attn_row_factored(const kv_head_view *h, int64_t t, float *out)
{
    float f;
    const float *r = row_at(h, t, 0, h->d, out, &f);
    if (r != out) memcpy(out, r, (size_t)h->d * sizeof(float));
    return f;
}

/* ---- integer scores of int8 keys (kv_attn_int_keys()) ---------------------------------------
 * A per-token int8 key is c·s (codes c, one scale s); its score against q is s·(q · c). With
 * the query rounded to 16-bit integers, q ≈ Q·step (kv_quant_math.h: kvq_q16_encode()), q · c
 * is step·(Q · c), and Q · c a sum of integer products: exact in any order (|Q| <=
 * kvq_q16_max(d) keeps it inside an int32), so the portable loop and the AVX2 twin agree bit
 * for bit however each adds up, and the twin needs one multiply-add of 16-bit integers per
 * two elements where a float dot product converts, multiplies and adds each. The score is
 * then ((float)(Q · c)·s)·(step/√d). */

int kv_attn_int_keys(const kv_head_view *kh) { return int8_per_row(kh); }

float kv_attn_query_q16(const float *q, int d, int16_t *q16)
{
    const float step = kvq_q16_query_step(q, d);
    for (int j = 0; j < d; j++) q16[j] = kvq_q16_encode(q[j], step, d);
    return step;
}

void kv_attn_query_rounded(const float *q, int d, float *out)
{
    if (out != q) memcpy(out, q, (size_t)d * sizeof(float));
    kvq_q16_round_query(out, d);
}

/* Q · c, d elements: exact (see above). */
static inline int32_t dot_q16(const int16_t *q16, const int8_t *c, int d)
{
    int32_t s = 0;
    for (int j = 0; j < d; j++) s += (int32_t)q16[j] * c[j];
    return s;
}

/* The score from the exact dot product: the roundings every path makes, in this order. */
static inline float int_score(int32_t dot, float factor, float step_scaled)
{
    return ((float)dot * factor) * step_scaled;
}

float kv_attn_score(const float *q, const int16_t *q16, float step, const float *row, float f,
                    int d)
{
    const float scale = 1.0f / sqrtf((float)d);
    if (!q16) return kv_dot(q, row, d) * f * scale;
    int32_t s = 0; /* the row holds the codes as floats (kv_attn_row_factored()) */
    for (int j = 0; j < d; j++) s += (int32_t)q16[j] * (int32_t)row[j];
    return int_score(s, f, step * scale);
}

/* ---- value rows of int8 codes (kv_attn_add_row()) -------------------------------------------
 * A per-token int8 value row adds w·s times its codes c (row_at()) to the output. Fused,
 * o + (w·s)·c rounds once instead of twice and is one instruction per element instead of
 * two: a fifth fewer in the value pass of an int8 cache, which is bound by its arithmetic
 * (docs/performance.md §7). fmaf() is exactly rounded by definition (the FMA instruction, or
 * libm in software where there is none), so every machine gets the same bits. Every other
 * row keeps a multiply, then an add. */
#if KV_F16C
/* The fused loop compiled for CPUs with FMA: fmaf() becomes the instruction, vectorized, not
 * a library call per element (ten times slower); the same bits, both round once. */
__attribute__((target("fma"))) static void add_row_fma(float *o, float w, const float *row,
                                                        int n)
{
    for (int j = 0; j < n; j++) o[j] = fmaf(w, row[j], o[j]);
}
#endif

/* have_fma is known once tables_build() has run: values_pass() asks for it first (simd_on()),
 * kv_attn_add_row() too; were it still 0, the last loop gives the same bits, only slower. */
static inline void add_row(float *o, float w, const float *row, int n, int fused)
{
    if (!fused) {
        for (int j = 0; j < n; j++) o[j] += w * row[j];
        return;
    }
#if KV_F16C
    if (have_fma) {
        add_row_fma(o, w, row, n);
        return;
    }
#endif
    for (int j = 0; j < n; j++) o[j] = fmaf(w, row[j], o[j]);
}

void kv_attn_add_row(const kv_head_view *vh, float *o, float w, const float *row, int n)
{
    pthread_once(&tables_once, tables_build);
    add_row(o, w, row, n, int8_per_row(vh));
}

/* Key i of the walk (stored row r) and its factor (row_at()): under KV_POS_CACHE rotated by
 * its index i (always a copy, dequantized whole: the rotation mixes elements, factor 1). */
static inline const float *key_row(const group *g, int64_t r, int64_t i, float *row,
                                   float *factor)
{
    *factor = 1.0f;
    if (g->k) return g->k + (size_t)i * g->d;
    if (g->w.rope_cs) {
        row_part(&g->kh, r, 0, g->d, row);
        rotate_row(row, g->w.rope_cs, i, g->w.rotary_dim);
        return row;
    }
    return row_at(&g->kh, r, 0, g->d, row, factor);
}

/* Pass 1 over retained rows [i0, i1): att[h][i] = q_h · k_i / √d for the G heads, each K row
 * read (and dequantized) once for all of them; mx[h] raised to each head's largest score.
 * row [d] scratch. */
static void group_scores(const group *g, int64_t i0, int64_t i1, float *mx, float *row,
                         const qint *qi)
{
    const int G = g->G, d = g->d;
    const float scale = 1.0f / sqrtf((float)d);
    kv_window_walk k;
    walk_at(&k, &g->w, i0);
    for (int64_t i = i0; i < i1; i++, kv_window_walk_next(&k)) {
        float f;
        if (qi) { /* int8 keys: integer dot products (above) */
            const int8_t *c = int8_row(&g->kh, k.row, &f);
            for (int h = 0; h < G; h++) {
                const float s = int_score(dot_q16(qi->q16 + (size_t)h * d, c, d), f, qi->step[h]);
                g->att[(size_t)h * g->len + i] = s;
                if (s > mx[h]) mx[h] = s;
            }
            continue;
        }
        const float *kr = key_row(g, k.row, i, row, &f);
        for (int h = 0; h < G; h++) {
            const float s = kv_dot16(g->q + (size_t)h * d, kr, d) * f * scale;
            g->att[(size_t)h * g->len + i] = s;
            if (s > mx[h]) mx[h] = s;
        }
    }
}

/* Pass 3 over output columns [j0, j1): out[h][j] = (sum over i of att[h][i] · v_i[j]) / sum_h,
 * positions in order, each V row (its columns j0..j1) read once for the G heads. The sum of
 * the weights, sum_h = att[h][0] + att[h][1] + ... in position order (kv_attn_exp_sum()'s
 * order), is added up here, beside the values: one add per position that would otherwise be
 * a chain of dependent adds of its own. sum [G], row [d] scratch. */
static void group_values(const group *g, int j0, int j1, float *sum, float *row)
{
    const int G = g->G, d = g->d;
    const int fused = !g->v && int8_per_row(&g->vh); /* int8 codes (add_row()) */
    for (int h = 0; h < G; h++) {
        sum[h] = 0.0f;
        for (int j = j0; j < j1; j++) g->out[(size_t)h * d + j] = 0.0f;
    }
    kv_window_walk k;
    walk_at(&k, &g->w, 0);
    for (int64_t i = 0; i < g->len; i++, kv_window_walk_next(&k)) {
        float f = 1.0f;
        const float *vr = g->v ? g->v + (size_t)i * d : row_at(&g->vh, k.row, j0, j1, row, &f);
        for (int h = 0; h < G; h++) {
            const float wt = g->att[(size_t)h * g->len + i], wf = wt * f;
            float *o = g->out + (size_t)h * d;
            sum[h] += wt;
            add_row(o + j0, wf, vr + j0, j1 - j0, fused);
        }
    }
    for (int h = 0; h < G; h++) { /* the one division per output */
        const float inv = 1.0f / sum[h];
        for (int j = j0; j < j1; j++) g->out[(size_t)h * d + j] *= inv;
    }
}

/* ---- the same two passes with AVX2 intrinsics -----------------------------------------------
 * group_scores() and group_values() as written above are what the compiler is handed; it
 * vectorizes each loop, but a dot product per head per row leaves most of the work in
 * dependent adds and horizontal folds, and a quantized row makes a round trip through the
 * scratch. The twins below do the same operations on the same values in the same order (so
 * the same bits: tests/test_attn_simd.c compares them on every format), arranged for the
 * machine:
 *  - rows in blocks of KV_ATTN_ROWS; fp16, bf16, per-token int8 and fp8 rows read as stored,
 *    each eight elements decoded in a register right where the dot product or the value sum
 *    needs them (binary16 and bfloat16 -> binary32 are exact, fp8 goes by way of binary16,
 *    exact too; an fp8 element is value · scale, one rounding, as kv_quant_math.h and the
 *    tables above; an int8 element is its code, the row's scale its factor, see row_at());
 *    other formats (KIVI, int8 with group scales) decoded into the scratch first. A paged
 *    view's blocks lie anywhere, a pattern the hardware prefetchers cannot guess, so each
 *    block of rows asks for the next one's bytes.
 *    A contiguous view is read in address order, which they follow; only the value pass of
 *    a binary16 or bfloat16 cache, whose arithmetic outruns the memory, asks as well, four
 *    blocks ahead (its runs of 32 columns visit a block's rows in a stride the prefetchers
 *    follow less well). Measured at 32k tokens, H 32: fp16 30.7 -> 35 GB/s; the same
 *    prefetch cost an int8 cache, whose arithmetic is the limit, 7-11 %. Per row only the
 *    address is computed, the row's size a constant of the pass: these loops are bound by
 *    instructions issued, and a format switch and a prefetch loop per row had cost 15 % of the
 *    time with the cache in the LLC (int8, H 32, one thread). fp32 rows need no decode, and
 *    the loops stream them faster than this arrangement does: they stay with the loops;
 *  - scores: four heads per K row (8 independent vector sums instead of 2), or, for the heads
 *    left over, four rows per head; kv_dot16's 16 lanes as two 8-float vectors and its tree
 *    fold as three vector adds;
 *  - values: each output run of 32 columns of two heads kept in registers across the block's
 *    rows (one load and one store per block instead of per row);
 *  - int8 keys' scores: integer dot products with the 16-bit query (the section above
 *    group_scores()), exact, so any order of the adds gives the loops' bits;
 *  - int8 value rows: one fused multiply-add per element, as the loops' fmaf() (add_row()).
 * Every other multiply and add stays two roundings (see the top of the file); the twins need
 * AVX2, F16C and FMA (tables_build()). One difference: an fp16 NaN
 * keeps its payload in hardware and not through the table, so a NaN in the cache makes a
 * NaN output either way, but not necessarily the same NaN. */
#if KV_F16C
#define KV_AVX2 __attribute__((target("avx2,f16c")))
#define KV_INLINE __attribute__((always_inline)) KV_AVX2 static inline
/* the value pass, which fuses the multiply-adds of int8 rows (add_row()) and nothing else:
 * the compiler may use FMA instructions only where the code asks (-ffp-contract=off), but
 * GCC's vectorizer has been seen to fuse a rotation's a·c - b·s (rotate_row()) all the same,
 * so the other passes are compiled without FMA */
#define KV_AVX2_FMA __attribute__((target("avx2,f16c,fma")))
#define KV_INLINE_FMA __attribute__((always_inline)) KV_AVX2_FMA static inline

/* How a block's rows are read: floats (fp32 rows, or any row decoded into the scratch),
 * binary16 or bfloat16 codes, int8 codes with one scale per row, fp8 codes (either kind) with
 * the head's scale. */
enum { ROW_F32, ROW_F16, ROW_BF16, ROW_I8, ROW_E4M3, ROW_E5M2 };

typedef struct {
    const void *p; /* the row's first element */
    float s;       /* fp8: the head's scale, applied per element */
    float f;       /* the row's factor (row_at()): ROW_I8 its scale, ROW_F32 row_at()'s, else 1 */
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
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)r.p + j)));
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
    if (f == ROW_F16) return f16_table[((const uint16_t *)r.p)[j]];
    if (f == ROW_BF16) return kvq_bf16_to_f32(((const uint16_t *)r.p)[j]);
    if (f == ROW_I8) return (float)((const int8_t *)r.p)[j];
    if (f == ROW_E4M3 || f == ROW_E5M2)
        return fp8_table[f == ROW_E5M2][((const uint8_t *)r.p)[j]] * r.s;
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

/* Integer scores of int8 rows (the section above group_scores()): the dot products Q · c of
 * one head's query against rows 0 .. n-1 (n a multiple of 4), four rows at a time, 16
 * columns a step: the codes widened to 16 bits, one vpmaddwd (16 products of 16-bit
 * integers, added in pairs) and one add of 32-bit integers, where a float dot product takes
 * two conversions, two multiplies and two adds. Each row's eight lanes folded to one. */
KV_INLINE void dots_q16(const int16_t *q, const rowref *k, int n, int d, int32_t *dot)
{
    for (int c = 0; c < n; c += 4) {
        __m256i a[4];
        for (int u = 0; u < 4; u++) a[u] = _mm256_setzero_si256();
        for (int j = 0; j < d; j += 16) {
            const __m256i qj = _mm256_loadu_si256((const __m256i *)(const void *)(q + j));
            for (int u = 0; u < 4; u++) {
                const __m256i cu = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                    (const __m128i *)(const void *)((const int8_t *)k[c + u].p + j)));
                a[u] = _mm256_add_epi32(a[u], _mm256_madd_epi16(cu, qj));
            }
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]),
                                            _mm256_hadd_epi32(a[2], a[3]));
        _mm_storeu_si128((__m128i *)(void *)(dot + c),
                         _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    }
}

/* Pass 1 over a block of n int8 rows b .. b+n-1: each head against four rows at a time (the
 * rows are in L1 after the first head), the rows left over one by one. */
KV_INLINE void scores_block_q16(const group *g, const qint *qi, const rowref *k, int n,
                                int64_t b, float *mx)
{
    const int d = g->d, n4 = n / 4 * 4;
    for (int h = 0; h < g->G; h++) {
        const int16_t *q = qi->q16 + (size_t)h * d;
        float *att = g->att + (size_t)h * g->len + b;
        int32_t dot[KV_ATTN_ROWS];
        dots_q16(q, k, n4, d, dot);
        for (int c = n4; c < n; c++) dot[c] = dot_q16(q, k[c].p, d);
        for (int c = 0; c < n; c++) {
            att[c] = int_score(dot[c], k[c].f, qi->step[h]);
            if (att[c] > mx[h]) mx[h] = att[c];
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

/* row_at() with the formats the twins decode in registers left where they are: how a view's
 * rows are read (ROW_F16 / ROW_I8 for fp16 and per-token int8 rows of whole 16-element runs
 * outside a KIVI window, else ROW_F32 through the scratch). */
KV_AVX2 static int row_kind(const kv_head_view *h)
{
    if (h->d % 16 || h->q < INT64_MAX / 2) return ROW_F32;
    if (h->fmt == KV_QF_F16) return ROW_F16;
    if (h->fmt == KV_QF_BF16) return ROW_BF16;
    if (int8_per_row(h)) return ROW_I8;
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
    r.p = row_at(h, t, j0, j1, scratch, &r.f);
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
    if (g->w.window || h->fmt == KV_QF_INT4_KIVI || h->fmt == KV_QF_INT2_KIVI) return;
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

/* group_scores() over rows [i0, i1) read as f, in blocks of KV_ATTN_ROWS rows (f a constant
 * where inlined: each row's reference is then an address and a scale, no format switch). */
KV_INLINE void scores_rows(const group *g, int f, int64_t i0, int64_t i1, float *mx,
                           float *rows, const qint *qi)
{
    const int d = g->d;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t rb = kind_row_bytes(f, d);
    kv_window_walk k;
    walk_at(&k, &g->w, i0);
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
                r.p = key_row(g, t[c], b + c, row, &r.f);
                kp[c] = r;
            } else {
                kp[c] = row_ref(&g->kh, f, rb, t[c], 0, d, row);
            }
        }
        if (f == ROW_I8)
            scores_block_q16(g, qi, kp, n, b, mx);
        else
            scores_block(g, f, kp, n, b, scale, mx);
    }
}

/* group_scores() read as the key view's kind; @p qi for integer-scored int8 keys, whose rows
 * are ROW_I8 unless d is not a multiple of 16: those go to the loops. */
KV_AVX2 static void group_scores_avx2(const group *g, int64_t i0, int64_t i1, float *mx,
                                      float *rows, const qint *qi)
{
    const int kind = g->w.rope_cs ? ROW_F32 : row_kind(&g->kh);
    if (qi && kind != ROW_I8) {
        group_scores(g, i0, i1, mx, rows, qi);
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

/* out[h][j .. j+32) of NHH heads (1 or 2) += w_h[c] · v_c[j .. j+32) over the block's rows c in
 * order, the outputs held in registers across the rows. */
KV_INLINE_FMA void values_run(float *const *o, const float *const *w, int nhh, int f,
                          const rowref *vp, int n, int j)
{
    __m256 x[2][4];
    for (int t = 0; t < nhh; t++)
        for (int u = 0; u < 4; u++) x[t][u] = _mm256_loadu_ps(o[t] + j + 8 * u);
    for (int c = 0; c < n; c++) {
        const __m256 v0 = load8(f, vp[c], j), v1 = load8(f, vp[c], j + 8);
        const __m256 v2 = load8(f, vp[c], j + 16), v3 = load8(f, vp[c], j + 24);
        for (int t = 0; t < nhh; t++) {
            const __m256 wt = _mm256_set1_ps(w[t][c]);
            x[t][0] = madd(f, wt, v0, x[t][0]);
            x[t][1] = madd(f, wt, v1, x[t][1]);
            x[t][2] = madd(f, wt, v2, x[t][2]);
            x[t][3] = madd(f, wt, v3, x[t][3]);
        }
    }
    for (int t = 0; t < nhh; t++)
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(o[t] + j + 8 * u, x[t][u]);
}

/* values_run() for a run of 8 columns: what is left of a row after its runs of 32. */
KV_INLINE_FMA void values_run8(float *const *o, const float *const *w, int nhh, int f,
                           const rowref *vp, int n, int j)
{
    __m256 x[2];
    for (int t = 0; t < nhh; t++) x[t] = _mm256_loadu_ps(o[t] + j);
    for (int c = 0; c < n; c++) {
        const __m256 v = load8(f, vp[c], j);
        for (int t = 0; t < nhh; t++)
            x[t] = madd(f, _mm256_set1_ps(w[t][c]), v, x[t]);
    }
    for (int t = 0; t < nhh; t++) _mm256_storeu_ps(o[t] + j, x[t]);
}

/* Pass 3 over a block of n rows read as f, columns [j0, j1): heads in pairs, runs of 32
 * columns in registers, then runs of 8, the last columns one at a time, rows in order; each
 * weight times its row's factor first, as group_values() does. */
KV_INLINE_FMA void values_block(const group *g, int f, const rowref *vp, const float *fac, int n,
                            int64_t i0, int j0, int j1)
{
    const int G = g->G, d = g->d;
    for (int h = 0; h < G;) {
        const int nhh = G - h >= 2 ? 2 : 1;
        float *o[2], wf[2][KV_ATTN_ROWS];
        const float *w[2];
        for (int t = 0; t < nhh; t++) {
            o[t] = g->out + (size_t)(h + t) * d;
            w[t] = g->att + (size_t)(h + t) * g->len + i0;
            if (f == ROW_I8 || f == ROW_F32) { /* the kinds whose rows have factors */
                for (int c = 0; c < n; c++) wf[t][c] = w[t][c] * fac[c];
                w[t] = wf[t];
            }
        }
        int j = j0;
        if (nhh == 2) { /* the head count a constant of each call: registers, not arrays */
            for (; j + 32 <= j1; j += 32) values_run(o, w, 2, f, vp, n, j);
            for (; j + 8 <= j1; j += 8) values_run8(o, w, 2, f, vp, n, j);
        } else {
            for (; j + 32 <= j1; j += 32) values_run(o, w, 1, f, vp, n, j);
            for (; j + 8 <= j1; j += 8) values_run8(o, w, 1, f, vp, n, j);
        }
        for (; j < j1; j++)
            for (int t = 0; t < nhh; t++)
                for (int c = 0; c < n; c++)
                    o[t][j] = f == ROW_I8 ? fmaf(w[t][c], load1(f, vp[c], j), o[t][j])
                                          : o[t][j] + w[t][c] * load1(f, vp[c], j);
        h += nhh;
    }
}

/* group_values() read as f, in blocks of KV_ATTN_ROWS rows (f a constant where inlined, as
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
    walk_at(&k, &g->w, 0);
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

/* group_values() read as the value view's kind; int8 rows the kind does not read as codes
 * (d not a multiple of 16) go to the loops, which fuse their multiply-adds (add_row()). */
KV_AVX2_FMA static void group_values_avx2(const group *g, int j0, int j1, float *sum, float *rows)
{
    const int kind = row_kind(&g->vh);
    if (int8_per_row(&g->vh) && kind != ROW_I8) {
        group_values(g, j0, j1, sum, rows);
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

/* exp_rows(): exp_le0() eight at a time, the same operations in the same order (its selects
 * as compares and blends, which the compiler will not make of a branch on floats). */
KV_AVX2 static void exp_rows_avx2(float *x, int64_t n, float max)
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
    for (; i < n; i++) x[i] = exp_le0(x[i] - max);
}

#endif

static int simd_on(void)
{
    pthread_once(&tables_once, tables_build);
    return use_avx2;
}

int kv_attn_simd(int mode)
{
    pthread_once(&tables_once, tables_build);
    if (mode >= 0) use_avx2 = mode && have_avx2;
    return use_avx2;
}

/* The twins for rows that must be decoded; fp32 rows are read where they lie by the loops,
 * which stream them in order (measured: 0.96 of the read bandwidth against the twins' 0.57
 * for an fp32 cache of 32k tokens, H 32, `kvlab bench attention --only engine [--loops]`). */
static int twin_for(const kv_head_view *h, const float *plain)
{
    return simd_on() && !plain && h->fmt != KV_QF_F32;
}

/* Pass 1. Integer-scored keys first get the group's queries as 16-bit integers, made by each
 * thread for itself (G·d roundings, nothing beside the len·d of the pass) in its scratch after
 * the rows (row_floats()). */
static void scores_pass(const group *g, int64_t i0, int64_t i1, float *mx, float *row)
{
    const int G = g->G, d = g->d;
    qint qs, *qi = NULL;
    if (!g->k && !g->w.rope_cs && kv_attn_int_keys(&g->kh)) {
        int16_t *q16 = (int16_t *)(void *)(row + (size_t)KV_ATTN_ROWS * d); /* [G][d] */
        float *step = row + (size_t)KV_ATTN_ROWS * d + ((size_t)G * d + 1) / 2; /* [G] */
        const float scale = 1.0f / sqrtf((float)d);
        for (int h = 0; h < G; h++)
            step[h] = kv_attn_query_q16(g->q + (size_t)h * d, d, q16 + (size_t)h * d) * scale;
        qs.q16 = q16;
        qs.step = step;
        qi = &qs;
    }
#if KV_F16C
    if (twin_for(&g->kh, g->k)) {
        group_scores_avx2(g, i0, i1, mx, row, qi);
        return;
    }
#endif
    group_scores(g, i0, i1, mx, row, qi);
}

static void values_pass(const group *g, int j0, int j1, float *sum, float *rows)
{
#if KV_F16C
    if (twin_for(&g->vh, g->v)) {
        group_values_avx2(g, j0, j1, sum, rows);
        return;
    }
#endif
    group_values(g, j0, j1, sum, rows);
}

/* The three passes on the calling thread. mx [G], row [d] scratch. */
static void group_run(group *g, float *mx, float *row)
{
    for (int h = 0; h < g->G; h++) mx[h] = -INFINITY;
    scores_pass(g, 0, g->len, mx, row);
    for (int h = 0; h < g->G; h++) exp_rows(g->att + (size_t)h * g->len, g->len, mx[h]);
    values_pass(g, 0, g->d, g->sum, row);
}

/* The same passes spread over the team: the scores over runs of positions (the KV split),
 * the exponentials over heads, the values over runs of output columns. Each number is still
 * made by one thread in group_run()'s order (a score alone, a head's sum alone, a column summed
 * over the positions in order; a max is exact in any order), so the output is group_run()'s
 * bit for bit on any number of threads. This keeps every core busy when a step has fewer
 * groups than threads: decode at batch 1 with few KV heads (MQA has one).
 * Thread i's mx [G] and row [d] at scratch + i·stride. */
static void group_run_team(group *g, float *scratch, size_t stride)
{
    const int G = g->G, d = g->d;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), me = omp_get_thread_num();
        float *mx = scratch + (size_t)me * stride, *row = mx + G;
        for (int h = 0; h < G; h++) mx[h] = -INFINITY;
        scores_pass(g, g->len * me / nt, g->len * (me + 1) / nt, mx, row);
        #pragma omp barrier
        #pragma omp for
        for (int h = 0; h < G; h++) {
            float m = -INFINITY;
            for (int t = 0; t < nt; t++) {
                const float x = scratch[(size_t)t * stride + h];
                if (x > m) m = x;
            }
            exp_rows(g->att + (size_t)h * g->len, g->len, m);
        }
        /* columns in runs of eight (one AVX vector, an F16C conversion) */
        const int runs = (d + 7) / 8;
        const int j0 = runs * me / nt * 8, j1 = runs * (me + 1) / nt * 8;
        if (j0 < j1) values_pass(g, j0, j1 < d ? j1 : d, mx, row); /* each its own sums */
    }
}

/* ---- the entry points -------------------------------------------------------------------- */

/* The row scratch of scores_pass() and values_pass(): rows [KV_ATTN_ROWS][d] floats, then
 * for integer-scored keys the queries' codes [G][d] int16 and steps [G]. */
static size_t row_floats(int G, int d)
{
    return (size_t)KV_ATTN_ROWS * d + ((size_t)G * d + 1) / 2 + (size_t)G;
}

/* Scratch of one thread: att [G][max_len], sum [G], mx [G], the row scratch (row_floats()),
 * rounded up to 16 floats (64 bytes) so threads never share a cache line. */
static size_t thread_floats(int G, int d, int64_t max_len)
{
    const size_t n = (size_t)G * (size_t)max_len + 2u * (size_t)G + row_floats(G, d);
    return (n + 15) / 16 * 16;
}

size_t kv_attention_scratch(const kv_cache *c, int n_heads, int64_t max_len)
{
    const int G = kv_heads_group(n_heads, c->n_kv_heads);
    return (size_t)omp_get_max_threads() * thread_floats(G, c->head_dim, max_len);
}

/* Group (row k, KV head kvh) of kv_attention_rows() with att and sum in @p blk. */
static void group_of_cache(group *g, const kv_cache *c, int layer, int slot, int pos, int kvh,
                           int G, const float *q, float *out, float *blk, int64_t max_len)
{
    const int d = c->head_dim;
    memset(g, 0, sizeof *g);
    g->G = G;
    g->d = d;
    g->len = kv_window_count(c->spec.window, c->spec.n_sinks, pos);
    g->q = q + (size_t)kvh * G * d;
    g->out = out + (size_t)kvh * G * d;
    g->att = blk;
    g->sum = blk + (size_t)G * max_len;
    g->kh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_KEY);
    g->vh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_VALUE);
    const retained w = {c->spec.window, c->spec.n_sinks, pos, c->rope_cs, c->rotary_dim};
    g->w = w;
}

void kv_attention_rows(const kv_cache *c, int layer, int n, const int *rows, const int *slot,
                       const int *pos, const float *q, float *out, size_t stride, int n_heads,
                       int64_t max_len, float *scratch)
{
    const int Hkv = c->n_kv_heads, G = kv_heads_group(n_heads, Hkv), d = c->head_dim;
    const size_t per = thread_floats(G, d, max_len);
    const int64_t groups = (int64_t)n * Hkv;
    const int par = kv_parallel_worth(groups * G * max_len * d);
    if (par && groups < omp_get_max_threads()) { /* fewer groups than threads: split each */
        for (int k = 0; k < n; k++) {
            const int t = rows ? rows[k] : k;
            for (int kvh = 0; kvh < Hkv; kvh++) {
                group g;
                group_of_cache(&g, c, layer, slot[t], pos[t], kvh, G, q + (size_t)t * stride,
                               out + (size_t)t * stride, scratch, max_len);
                group_run_team(&g, scratch + (size_t)G * max_len + G, per);
            }
        }
        return;
    }
    /* dynamic: in a prefill later rows attend over more positions than earlier ones */
    #pragma omp parallel for collapse(2) schedule(dynamic) if (par)
    for (int k = 0; k < n; k++)
        for (int kvh = 0; kvh < Hkv; kvh++) {
            const int t = rows ? rows[k] : k;
            float *blk = scratch + (size_t)omp_get_thread_num() * per;
            group g;
            group_of_cache(&g, c, layer, slot[t], pos[t], kvh, G, q + (size_t)t * stride,
                           out + (size_t)t * stride, blk, max_len);
            group_run(&g, blk + (size_t)G * max_len + G, blk + (size_t)G * max_len + 2 * G);
        }
}

int kv_attention(const kv_cache *c, int layer, int slot, int pos, const float *q, float *out,
                 int n_heads)
{
    const int64_t len = kv_window_count(c->spec.window, c->spec.n_sinks, pos);
    float *scratch = kv_calloc(kv_attention_scratch(c, n_heads, len) * sizeof(float));
    if (!scratch) return KV_ERR_NOMEM;
    kv_attention_rows(c, layer, 1, NULL, &slot, &pos, q, out, 0, n_heads, len, scratch);
    kv_free(scratch);
    return KV_OK;
}

void kv_attention_head(const kv_cache *c, int layer, int slot, int pos, int h, int n_heads,
                       const float *qh, float *oh, float *att)
{
    const int kvh = kv_attn_kv_head(h, n_heads, c->n_kv_heads), d = c->head_dim;
    float *row = kv_calloc(row_floats(1, d) * sizeof(float)); /* the row scratch */
    if (!row) { /* no memory: make the failure visible rather than silently wrong */
        for (int i = 0; i < d; i++) oh[i] = NAN;
        return;
    }
    group g;
    float sum, mx;
    const int64_t len = kv_window_count(c->spec.window, c->spec.n_sinks, pos);
    group_of_cache(&g, c, layer, slot, pos, kvh, 1, qh, oh, att, len);
    /* a group of one: head h alone, its query, output and sum where the caller put them */
    g.q = qh;
    g.out = oh;
    g.sum = &sum;
    group_run(&g, &mx, row);
    kv_free(row);
}

int kv_attn_decode(const float *q, const float *k, const float *v, float *out,
                   int n_heads, int n_kv_heads, int head_dim, int max_seq, int len)
{
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || head_dim < 1 || len < 1 ||
        len > max_seq)
        return KV_ERR_ARG;
    const int G = kv_heads_group(n_heads, n_kv_heads), d = head_dim;
    const size_t per = thread_floats(G, d, len);
    float *scratch = kv_calloc((size_t)omp_get_max_threads() * per * sizeof(float));
    if (!scratch) return KV_ERR_NOMEM;
    #pragma omp parallel for
    for (int kvh = 0; kvh < n_kv_heads; kvh++) {
        float *blk = scratch + (size_t)omp_get_thread_num() * per;
        group g;
        memset(&g, 0, sizeof g);
        g.G = G;
        g.d = d;
        g.len = len;
        g.q = q + (size_t)kvh * G * d;
        g.out = out + (size_t)kvh * G * d;
        g.att = blk;
        g.sum = blk + (size_t)G * len;
        g.k = k + (size_t)kvh * max_seq * d; /* [max_seq][d] */
        g.v = v + (size_t)kvh * max_seq * d;
        g.w.t = len - 1; /* no window: the walk visits rows 0..len-1 */
        group_run(&g, blk + (size_t)G * len + G, blk + (size_t)G * len + 2 * G);
    }
    kv_free(scratch);
    return KV_OK;
}
