/* The CPU fast path, portable part: the attention passes as loops the compiler vectorizes,
 * a group's passes split over the thread team, and the row decoders they read the cache with.
 *
 * The math is kv_attention_ref.c's (the three passes: scores and max, exponentials and sum,
 * weighted values); this file is the same math arranged for speed, held to the reference by
 * a stated error bound (tests/test_attn_fast.c), not bit for bit. What it changes:
 *  - float arithmetic, the dot products in kv_dot16()'s sixteen lanes, sums in position order;
 *  - a group (kv_attention_fast.h) as the unit of work: a KV head's G query heads together;
 *  - rows decoded a row at a time into a d-float scratch (kv_attn_row(): switch hoisted out of
 *    the loop, fp16 and fp8 through decode tables), never the whole cache; fp32 rows read
 *    where they lie;
 *  - a per-token int8 row read as its codes, its one scale applied once per dot product and
 *    per weight (kv_attn_row_factored()), its value rows added with one fused multiply-add
 *    per element (kv_attn_add_row());
 *  - an option, on by default (kv_attn_q16()): int8 keys met by the query rounded to 16-bit
 *    integers, an exact integer dot product (kv_attn_int_keys());
 *  - exp() by a branch-free polynomial (kv_attn_exp_le0(), kv_attention_fast.h).
 * On x86-64 CPUs with AVX2 (asked at run time) the scores and values passes hand rows that
 * need decoding to their twins in kv_attention_avx2.c, which do the same operations in the
 * same order: the same bits (tests/test_attn_fast.c checks that too). Multiplies and adds are
 * fused only where the code says so (the library is compiled with -ffp-contract=off): the one
 * place is the value rows of an int8 cache, fmaf() here and the FMA instruction in the twins.
 * Every output is made in one fixed order: the same bits on any number of threads. */
#include "kv_attention_fast.h"

#include <math.h>
#include <omp.h>

/* ---- decode tables ---------------------------------------------------------------------------
 * fp16 and fp8 codes have few enough patterns to decode each one once. A lookup returns the
 * very float the function returns (the table is filled by calling it), so the rows below are
 * kv_cache_elem()'s bit for bit, only without a branchy conversion per element
 * (test_quant_cache checks every code). bf16 needs no table: its decode is a shift. The tables
 * are filled once, by whichever thread first decodes a row, under pthread_once: attention
 * decodes rows from inside an OpenMP loop. */
float kv_attn_f16_table[65536];
float kv_attn_fp8_table[2][256];
kv_attn_cpu kv_attn_machine;
pthread_once_t kv_attn_init_once = PTHREAD_ONCE_INIT;

void kv_attn_init(void)
{
    for (uint32_t h = 0; h < 65536u; h++) kv_attn_f16_table[h] = kvq_f16_to_f32((uint16_t)h);
    for (int e5 = 0; e5 < 2; e5++)
        for (uint32_t b = 0; b < 256u; b++)
            kv_attn_fp8_table[e5][b] = kvq_fp8_to_f32((uint8_t)b, e5);
    kv_attn_cpu m = {0, 0, 0, 0, 1};
    kv_attn_cpu_detect(&m.f16c, &m.fma, &m.avx2);
    m.use_avx2 = m.avx2;
    kv_attn_machine = m;
}

/* An fp16 row through the table: one lookup per element (the portable path). */
void kv_attn_f16_row_table(const uint8_t *row, float *out, int d)
{
    for (int j = 0; j < d; j++) {
        uint16_t b;
        memcpy(&b, row + (size_t)j * 2, 2);
        out[j] = kv_attn_f16_table[b];
    }
}

/* Columns [j0, j1) of row t of a head view into out[j0 .. j1): kv_cache_elem() for every j,
 * with the format's switch and the row's metadata lookups hoisted out of the loop and the
 * fp16 / fp8 conversions read from the tables above (the rest of the per-element arithmetic is
 * kv_quant_math.h's, so the values are kv_cache_elem()'s bit for bit; test_quant_cache checks
 * it). Part of a row, because the value pass may be split over threads by columns
 * (kv_attn_group_run_team()): each thread then reads only its columns. */
void kv_attn_row_part(const kv_head_view *h, int64_t t, int j0, int j1, float *out)
{
    const int d = h->d, n = j1 - j0;
    if (t >= h->q) {
        memcpy(out + j0, h->ring + (t % h->window) * d + j0, (size_t)n * sizeof(float));
        return;
    }
    kv_attn_fast_init();
    const int64_t r = kv_view_row(h, t); /* the stored row: codes and metadata live there */
    const uint8_t *row = h->codes + r * kvq_row_bytes(h->fmt, d);
    switch (h->fmt) {
    case KV_QF_F32: /* a paged fp32 row: plain floats, wherever its block is */
        memcpy(out + j0, row + (size_t)j0 * 4, (size_t)n * sizeof(float));
        return;
    case KV_QF_F16: /* in hardware where the CPU has it (x86 F16C), else through the table */
#if KV_ATTN_X86
        if (kv_attn_machine.f16c) {
            kv_attn_f16_row_f16c(row + (size_t)j0 * 2, out + j0, n);
            return;
        }
#endif
        kv_attn_f16_row_table(row + (size_t)j0 * 2, out + j0, n);
        return;
    case KV_QF_BF16: /* kvq_bf16_to_f32() is a shift: no table needed */
        for (int j = j0; j < j1; j++) {
            uint16_t b;
            memcpy(&b, row + (size_t)j * 2, 2);
            out[j] = kvq_bf16_to_f32(b);
        }
        return;
    case KV_QF_FP8_E4M3: case KV_QF_FP8_E5M2: {
        const float *tab = kv_attn_fp8_table[h->fmt == KV_QF_FP8_E5M2], s = h->scale;
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
        const float *tab = kv_attn_f16_table;
        if (h->fmt == KV_QF_INT4_KIVI)
            for (int j = j0; j < j1; j++) {
                const kv_qsz p = m[per_channel ? j : j / KV_KIVI_GROUP];
                out[j] = kvq_asym_decode(kvq_unpack(row, j, 4), tab[p.scale], tab[p.zero]);
            }
        else
            for (int j = j0; j < j1; j++) {
                const kv_qsz p = m[per_channel ? j : j / KV_KIVI_GROUP];
                out[j] = kvq_asym_decode(kvq_unpack(row, j, 2), tab[p.scale], tab[p.zero]);
            }
        return;
    }
    default:
        for (int j = j0; j < j1; j++) out[j] = kv_cache_elem(h, t, j);
    }
}

void kv_attn_row(const kv_head_view *h, int64_t t, float *out)
{
    kv_attn_row_part(h, t, 0, h->d, out);
}

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

/* ---- pass 2: the exponentials ------------------------------------------------------------- */

/* x[i] = exp(x[i] - max), element by element: vectorized, and the same bits whatever the
 * vector width (each element alone). */
static void exp_rows(float *x, int64_t n, float max)
{
    kv_attn_fast_init();
#if KV_ATTN_X86
    if (kv_attn_machine.use_avx2) {
        kv_attn_exp_rows_avx2(x, n, max);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) x[i] = kv_attn_exp_le0(x[i] - max);
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

/* ---- reading rows (kv_attn_row_at(), kv_attention_fast.h) ---------------------------------- */
float kv_attn_row_factored(const kv_head_view *h, int64_t t, float *out)
{
    float f;
    const float *r = kv_attn_row_at(h, t, 0, h->d, out, &f);
    if (r != out) memcpy(out, r, (size_t)h->d * sizeof(float));
    return f;
}

/* ---- integer scores of int8 keys (kv_attn_int_keys(), kv_attn_q16()) ----------------------
 * A per-token int8 key is c·s (codes c, one scale s); its score against q is s·(q · c). With
 * the query rounded to 16-bit integers, q ≈ Q·step (kv_quant_math.h: kvq_q16_encode()), q · c
 * is step·(Q · c), and Q · c a sum of integer products: exact in any order, so the loops and
 * the AVX2 twin agree bit for bit however each adds up, and the twin needs one multiply-add of
 * 16-bit integers per two elements where a float dot product converts, multiplies and adds
 * each. The score is then ((float)(Q · c)·s)·(step/√d). The price is the query's rounding,
 * up to 2^-16 of its largest element: a CPU technique, not the definition of attention (the
 * reference scores the query as it is). */

int kv_attn_int_keys(const kv_head_view *kh)
{
    kv_attn_fast_init();
    return kv_attn_machine.q16 && kv_attn_int8_per_row(kh);
}

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

float kv_attn_score(const float *q, const int16_t *q16, float step, const float *row, float f,
                    int d)
{
    const float scale = 1.0f / sqrtf((float)d);
    if (!q16) return kv_dot(q, row, d) * f * scale;
    int32_t s = 0; /* the row holds the codes as floats (kv_attn_row_factored()) */
    for (int j = 0; j < d; j++) s += (int32_t)q16[j] * (int32_t)row[j];
    return kv_attn_int_score(s, f, step * scale);
}

/* ---- value rows of int8 codes (kv_attn_add_row()) -------------------------------------------
 * A per-token int8 value row adds w·s times its codes c to the output. Fused, o + (w·s)·c
 * rounds once instead of twice and is one instruction per element instead of two: a fifth
 * fewer in the value pass of an int8 cache, which is bound by its arithmetic
 * (docs/performance.md §7). fmaf() is exactly rounded by definition (the FMA instruction, or
 * libm in software where there is none), so every machine gets the same bits; where the CPU
 * has FMA, kv_attn_add_row_fma() is the same loop compiled for it (vectorized, not a library
 * call per element). Every other row keeps a multiply, then an add. */
static inline void add_row(float *o, float w, const float *row, int n, int fused)
{
    if (!fused) {
        for (int j = 0; j < n; j++) o[j] += w * row[j];
        return;
    }
#if KV_ATTN_X86
    if (kv_attn_machine.fma) {
        kv_attn_add_row_fma(o, w, row, n);
        return;
    }
#endif
    for (int j = 0; j < n; j++) o[j] = fmaf(w, row[j], o[j]);
}

void kv_attn_add_row(const kv_head_view *vh, float *o, float w, const float *row, int n)
{
    kv_attn_fast_init();
    add_row(o, w, row, n, kv_attn_int8_per_row(vh));
}

/* ---- one group's passes, as loops ------------------------------------------------------------ */

/* Under KV_POS_CACHE always a copy, dequantized whole and rotated (the rotation mixes
 * elements, factor 1). */
static inline const float *key_row(const kv_attn_group *g, int64_t r, int64_t i, float *row,
                                   float *factor)
{
    *factor = 1.0f;
    if (g->k) return g->k + (size_t)i * g->d;
    if (g->w.rope_cs) {
        kv_attn_row_part(&g->kh, r, 0, g->d, row);
        rotate_row(row, g->w.rope_cs, i, g->w.rotary_dim);
        return row;
    }
    return kv_attn_row_at(&g->kh, r, 0, g->d, row, factor);
}

const float *kv_attn_key_row(const kv_attn_group *g, int64_t r, int64_t i, float *row,
                             float *factor)
{
    return key_row(g, r, i, row, factor);
}

/* Pass 1 over retained rows [i0, i1): att[h][i] = q_h · k_i / √d for the G heads, each K row
 * read (and dequantized) once for all of them; mx[h] raised to each head's largest score.
 * row [d] scratch; @p qi: int8 keys scored in integers (above). */
void kv_attn_group_scores(const kv_attn_group *g, int64_t i0, int64_t i1, float *mx, float *row,
                          const kv_attn_qint *qi)
{
    const int G = g->G, d = g->d;
    const float scale = 1.0f / sqrtf((float)d);
    kv_window_walk k;
    kv_attn_walk_at(&k, &g->w, i0);
    for (int64_t i = i0; i < i1; i++, kv_window_walk_next(&k)) {
        float f;
        if (qi) {
            const int8_t *c = kv_attn_int8_row(&g->kh, k.row, &f);
            for (int h = 0; h < G; h++) {
                const float s = kv_attn_int_score(kv_attn_dot_q16(qi->q16 + (size_t)h * d, c, d),
                                                  f, qi->step[h]);
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
void kv_attn_group_values(const kv_attn_group *g, int j0, int j1, float *sum, float *row)
{
    const int G = g->G, d = g->d;
    const int fused = !g->v && kv_attn_int8_per_row(&g->vh); /* int8 codes (add_row()) */
    for (int h = 0; h < G; h++) {
        sum[h] = 0.0f;
        for (int j = j0; j < j1; j++) g->out[(size_t)h * d + j] = 0.0f;
    }
    kv_window_walk k;
    kv_attn_walk_at(&k, &g->w, 0);
    for (int64_t i = 0; i < g->len; i++, kv_window_walk_next(&k)) {
        float f = 1.0f;
        const float *vr =
            g->v ? g->v + (size_t)i * d : kv_attn_row_at(&g->vh, k.row, j0, j1, row, &f);
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

/* ---- the passes: the loops, or the twins ---------------------------------------------------- */

size_t kv_attn_row_floats(int G, int d)
{
    return (size_t)KV_ATTN_ROWS * d + ((size_t)G * d + 1) / 2 + (size_t)G;
}

/* The twins take rows that must be decoded; fp32 rows are read where they lie by the loops,
 * which stream them in order (measured: 0.96 of the read bandwidth against the twins' 0.57
 * for an fp32 cache of 32k tokens, H 32, `kvlab bench attention --only engine [--loops]`). */
static int twin_for(const kv_head_view *h, const float *plain)
{
    kv_attn_fast_init();
    return kv_attn_machine.use_avx2 && !plain && h->fmt != KV_QF_F32;
}

/* Pass 1. Integer-scored keys first get the group's queries as 16-bit integers, made by each
 * thread for itself (G·d roundings, nothing beside the len·d of the pass) in its scratch after
 * the rows (kv_attn_row_floats()). */
static void scores_pass(const kv_attn_group *g, int64_t i0, int64_t i1, float *mx, float *row)
{
    const int G = g->G, d = g->d;
    kv_attn_qint qs, *qi = NULL;
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
#if KV_ATTN_X86
    if (twin_for(&g->kh, g->k)) {
        kv_attn_group_scores_avx2(g, i0, i1, mx, row, qi);
        return;
    }
#endif
    kv_attn_group_scores(g, i0, i1, mx, row, qi);
}

static void values_pass(const kv_attn_group *g, int j0, int j1, float *sum, float *rows)
{
#if KV_ATTN_X86
    if (twin_for(&g->vh, g->v)) {
        kv_attn_group_values_avx2(g, j0, j1, sum, rows);
        return;
    }
#endif
    kv_attn_group_values(g, j0, j1, sum, rows);
}

void kv_attn_group_run(kv_attn_group *g, float *mx, float *row)
{
    for (int h = 0; h < g->G; h++) mx[h] = -INFINITY;
    scores_pass(g, 0, g->len, mx, row);
    for (int h = 0; h < g->G; h++) exp_rows(g->att + (size_t)h * g->len, g->len, mx[h]);
    values_pass(g, 0, g->d, g->sum, row);
}

/* The team split: the same passes spread over the team, the scores over runs of positions
 * (the KV split), the exponentials over heads, the values over runs of output columns. Each
 * number is still made by one thread in kv_attn_group_run()'s order (a score alone, a head's
 * sum alone, a column summed over the positions in order; a max is exact in any order), so the
 * output is kv_attn_group_run()'s bit for bit on any number of threads. This keeps every core
 * busy when a step has fewer groups than threads: decode at batch 1 with few KV heads (MQA
 * has one). */
void kv_attn_group_run_team(kv_attn_group *g, float *scratch, size_t stride)
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
