/* The CPU fast path's inside (not installed): what kv_attention.c (the entry points),
 * kv_attention_fast.c (the portable loops) and kv_attention_avx2.c (their AVX2 twins) share.
 *
 * The unit of work is a group: the G query heads that read one KV head (chapter 03), over
 * the len rows one query row retains, computed together so each cached row is read (and
 * decoded) once per KV head, not once per query head. Every head still sees its own scores,
 * exponentials and sums in the order it would alone, so a head computed alone gives the bits
 * of the same head inside its group. */
#ifndef KV_ATTENTION_FAST_H
#define KV_ATTENTION_FAST_H

#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_window.h"

#include <pthread.h>
#include <string.h>

/* x86-64 with GCC or Clang: the AVX2 twins may be compiled (kv_attention_avx2.c); whether they
 * run is asked of the CPU at run time (the library is built for any x86-64) */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_ATTN_X86 1
#else
#define KV_ATTN_X86 0
#endif

/* Rows per block of the AVX2 passes: their decoded rows sit in the scratch, 8·d floats per
 * thread (4 KiB at d = 128, in L1). Measured on the 2-core VM (fp16 and int8 caches, 32k
 * tokens, H 32, `kvlab bench attention --only engine`, three runs each): 8 rows 15.6 / 14.3 ms,
 * 4 rows 15.9 / 14.4 ms, 16 rows 21-23 / 15-17 ms. */
#define KV_ATTN_ROWS 8

/* What the CPU has, and which choices the fast path makes: set once (kv_attn_fast_init()),
 * the last two switched by kv_attn_simd() and kv_attn_q16(). */
typedef struct {
    int f16c, fma, avx2; /* x86: F16C (with the OS saving YMM), FMA, AVX2 (kv_attn_cpu_detect) */
    int use_avx2;        /* the twins run (default: when the CPU has all three) */
    int q16;             /* int8 keys meet the 16-bit query (default 1) */
} kv_attn_cpu;
extern kv_attn_cpu kv_attn_machine;
extern pthread_once_t kv_attn_init_once;
void kv_attn_init(void);

/* The decode tables and kv_attn_machine, filled once, by whichever thread first needs them
 * (attention decodes rows from inside an OpenMP loop). Inline: it is asked once per row. */
static inline void kv_attn_fast_init(void) { pthread_once(&kv_attn_init_once, kv_attn_init); }

/* fp16 and fp8 codes decoded once each (kv_attention_fast.c): [code] kvq_f16_to_f32(code),
 * [e5m2][code] kvq_fp8_to_f32(code, e5m2) */
extern float kv_attn_f16_table[65536];
extern float kv_attn_fp8_table[2][256];

/* What a query sees of a cache (chapter 06): the retention window of its slot, and where
 * keys still need their rotation. W = 0 is the chapter 02-05 cache: position i, row i. */
typedef struct {
    int window, n_sinks;  /* W, S of the spec */
    int64_t t;            /* the query's position */
    const float *rope_cs; /* KV_POS_CACHE: cos/sin per cache index, else NULL */
    int rotary_dim;
} kv_attn_retained;

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
    kv_attn_retained w;          /* which rows, and key rotation */
} kv_attn_group;

/* The group's queries as integer-scored keys meet them (kv_attn_query_q16()): q16 [G][d],
 * step [G] each head's step times 1/√d. */
typedef struct {
    const int16_t *q16;
    const float *step;
} kv_attn_qint;

/* A walk over the retained rows started at the i-th (kv_window_walk_start() is i = 0). */
static inline void kv_attn_walk_at(kv_window_walk *k, const kv_attn_retained *w, int64_t i)
{
    kv_window_walk_start(k, w->window, w->n_sinks, w->t);
    if (i == 0) return;
    k->pos = kv_window_pos(w->window, w->n_sinks, w->t, i);
    k->row = kv_window_row(w->window, w->n_sinks, k->pos);
}

/* Whether a view's rows are int8 codes with one scale per row (KV_QF_INT8, per token). */
static inline int kv_attn_int8_per_row(const kv_head_view *h)
{
    return h->fmt == KV_QF_INT8 && kvq_row_group(h->fmt, h->role, h->d) == h->d;
}

/* A per-token int8 row t: its codes where they lie, its scale into @p scale. */
static inline const int8_t *kv_attn_int8_row(const kv_head_view *h, int64_t t, float *scale)
{
    const int64_t r = kv_view_row(h, t);
    *scale = ((const float *)h->meta)[kvq_meta_index(h->fmt, h->role, r, 0, h->d)];
    return (const int8_t *)(const void *)(h->codes + r * kvq_row_bytes(h->fmt, h->d));
}

/* Q · c, d elements: a sum of integer products, exact in any order (|Q| <= kvq_q16_max(d)
 * keeps it inside an int32). */
static inline int32_t kv_attn_dot_q16(const int16_t *q16, const int8_t *c, int d)
{
    int32_t s = 0;
    for (int j = 0; j < d; j++) s += (int32_t)q16[j] * c[j];
    return s;
}

/* An integer score from the exact dot product: the roundings every path makes, in this order. */
static inline float kv_attn_int_score(int32_t dot, float factor, float step_scaled)
{
    return ((float)dot * factor) * step_scaled;
}

/*
 * exp(x) for x <= 0 (a score minus its row's max: the largest becomes exp(0) = 1 exactly).
 * x = k·ln2 + r with k an integer and |r| <= ln2/2, so exp(x) = 2^k · e^r:
 *   k  = x·log2(e) rounded to nearest, by adding and subtracting 1.5·2^23 (a float that big
 *        has no fraction bits left), which vectorizes on any x86-64, unlike rintf();
 *   r  = x - k·ln2 in two steps, ln2 = hi + lo with hi short enough that k·hi is exact;
 *   e^r by its degree-7 series with minimax-adjusted coefficients (Cephes' expf), ~1 ulp;
 *   2^k written straight into a float's exponent bits.
 * Below -87, e^x < 2^-125, under every weight that could matter next to the max's 1: 0. NaN
 * stays NaN, so a poisoned score still shows in the output. No branches: the compiler runs
 * eight at a time (and kv_attention_avx2.c does the same operations with intrinsics). The
 * reference calls libm's exp() in double instead; this one is a speed choice.
 */
static inline float kv_attn_exp_le0(float x)
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

/* ---- kv_attention_fast.c: the portable loops ---------------------------------------------- */

/* An fp16 row [d] through the table: one lookup per element (the portable path). */
void kv_attn_f16_row_table(const uint8_t *row, float *out, int d);
/* Columns [j0, j1) of row t decoded into out[j0 .. j1) (kv_cache_elem()'s values). */
void kv_attn_row_part(const kv_head_view *h, int64_t t, int j0, int j1, float *out);
/* Key i of the walk (stored row r) and its factor, rotated under KV_POS_CACHE. */
const float *kv_attn_key_row(const kv_attn_group *g, int64_t r, int64_t i, float *row,
                             float *factor);
/* The loops' pass 1 over retained rows [i0, i1) and pass 3 over columns [j0, j1). */
void kv_attn_group_scores(const kv_attn_group *g, int64_t i0, int64_t i1, float *mx, float *row,
                          const kv_attn_qint *qi);
void kv_attn_group_values(const kv_attn_group *g, int j0, int j1, float *sum, float *row);
/* The three passes on the calling thread (mx [G], row scratch), or split over the team
 * (thread i's mx and row scratch at scratch + i·stride). */
void kv_attn_group_run(kv_attn_group *g, float *mx, float *row);
void kv_attn_group_run_team(kv_attn_group *g, float *scratch, size_t stride);
/* Floats of the row scratch of one group's passes: rows [KV_ATTN_ROWS][d], then for
 * integer-scored keys the queries' codes [G][d] int16 and steps [G]. */
size_t kv_attn_row_floats(int G, int d);

/* Columns [j0, j1) of row t for reading, and the factor the caller applies to the row
 * (kv_attn_row_factored()): fp32 rows where they lie (a paged fp32 cache reads its rows in
 * their blocks at the speed of the contiguous one; the KIVI fp32 window in its ring); a
 * per-token int8 row as its codes converted to floats, factor its scale; any other row
 * decoded into @p scratch. Indexed by column: p[j], j0 <= j < j1. Inline: a call per row
 * would cost the loops a tenth of an fp32 cache's time.
 * Why the int8 scale stays outside: q · (c·s) element by element costs a multiply per
 * element, (q · c)·s one per row, and int8 attention is bound by its arithmetic, not by the
 * memory (docs/performance.md §7). The same math, rounded differently (the reference reads
 * c·s rounded to a float; the fast path multiplies by s once, later). */
static inline const float *kv_attn_row_at(const kv_head_view *h, int64_t t, int j0, int j1,
                                          float *scratch, float *factor)
{
    *factor = 1.0f;
    if (t >= h->q) return h->ring + (t % h->window) * h->d;
    if (h->fmt == KV_QF_F32)
        return (const float *)(const void *)h->codes + kv_view_row(h, t) * h->d;
    if (kv_attn_int8_per_row(h)) {
        const int8_t *c = kv_attn_int8_row(h, t, factor);
        for (int j = j0; j < j1; j++) scratch[j] = (float)c[j];
        return scratch;
    }
    kv_attn_row_part(h, t, j0, j1, scratch);
    return scratch;
}

/* ---- kv_attention_avx2.c: the twins (x86-64 only) ----------------------------------------- */

/* What the CPU has: F16C (and the OS saving YMM registers), FMA, AVX2. All 0 elsewhere. */
void kv_attn_cpu_detect(int *f16c, int *fma, int *avx2);
#if KV_ATTN_X86
void kv_attn_f16_row_f16c(const uint8_t *row, float *out, int d);
void kv_attn_add_row_fma(float *o, float w, const float *row, int n);
void kv_attn_group_scores_avx2(const kv_attn_group *g, int64_t i0, int64_t i1, float *mx,
                               float *rows, const kv_attn_qint *qi);
void kv_attn_group_values_avx2(const kv_attn_group *g, int j0, int j1, float *sum, float *rows);
void kv_attn_exp_rows_avx2(float *x, int64_t n, float max);
#endif

#endif
