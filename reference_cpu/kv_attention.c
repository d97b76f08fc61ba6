/* The attention family on the CPU (kv_attention.h).
 *
 * attend_head() is the math, written once: one query head over len cached positions.
 * kv_attn_decode() feeds it plain arrays; kv_attention() and kv_attention_head() feed it the
 * rows of a kv_cache, found through the cache's spec. Chapter 04's storage formats are
 * attend_head_view(): the same passes, each K/V row dequantized as it is read (fused), by
 * the per-element decode the CUDA kernels share. Later layouts are new cases of the dispatch
 * in kv_attention_head(), not new copies of the math.
 *
 * Grouped-query attention (chapter 03) is not a separate routine: it is which K/V rows a query
 * head is handed. Query head h reads KV head kv_attn_kv_head(h) = h / G, so the G heads of a
 * group attend over the same cached rows with their own queries, and MHA (G = 1), GQA and MQA
 * (G = H) are the same code. That is also why "GQA" and "MHA whose K/V heads are duplicated
 * across each group" give bit-identical outputs: attend_head() sees identical inputs either way
 * (tests/test_gqa.c checks it). The CPU threads over query heads, so it reads a group's rows
 * G times, from cache after the first; the GPU's v2 kernel packs a group into one block so
 * device memory is read once per group (cuda/attn_decode.cu). */
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
#include <pthread.h>
#include <string.h>

/*
 * out = softmax(q·K^T / sqrt(d)) V for one head, positions 0..len-1 in order.
 * qh [d], kh, vh [>= len][d], oh [d], att [len] scratch.
 * Three passes so no exp() can overflow and only one division is made per output:
 *   1) scores and their max   2) exp(score - max) and their sum   3) weighted sum of values
 */
static void attend_head(const float *qh, const float *kh, const float *vh, float *oh, float *att,
                        int d, int len)
{
    const float scale = 1.0f / sqrtf((float)d);

    /* pass 1: scores q·k/√d, and their max */
    float max = -INFINITY;
    for (int p = 0; p < len; p++) {
        att[p] = kv_dot(qh, kh + (size_t)p * d, d) * scale;
        if (att[p] > max) max = att[p];
    }
    /* pass 2: exponentiate relative to the max (the largest becomes 1), and sum */
    float sum = 0.0f;
    for (int p = 0; p < len; p++) {
        att[p] = expf(att[p] - max);
        sum += att[p];
    }
    /* pass 3: weighted sum of values, divided once by the sum */
    for (int i = 0; i < d; i++) oh[i] = 0.0f;
    for (int p = 0; p < len; p++) {
        const float w = att[p];
        const float *vp = vh + (size_t)p * d;
        for (int i = 0; i < d; i++) oh[i] += w * vp[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < d; i++) oh[i] *= inv;
}

int kv_attn_decode(const float *q, const float *k, const float *v, float *out,
                   int n_heads, int n_kv_heads, int head_dim, int max_seq, int len)
{
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || head_dim < 1 || len < 1 ||
        len > max_seq)
        return KV_ERR_ARG;
    float *att = kv_calloc((size_t)n_heads * len * sizeof(float)); /* [H][len] */
    if (!att) return KV_ERR_NOMEM;
    #pragma omp parallel for
    for (int h = 0; h < n_heads; h++) {
        const int kvh = kv_attn_kv_head(h, n_heads, n_kv_heads); /* h / G */
        const float *kh = k + (size_t)kvh * max_seq * head_dim; /* [max_seq][d] */
        const float *vh = v + (size_t)kvh * max_seq * head_dim; /* [max_seq][d] */
        attend_head(q + (size_t)h * head_dim, kh, vh, out + (size_t)h * head_dim,
                    att + (size_t)h * len, head_dim, len);
    }
    kv_free(att);
    return KV_OK;
}

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
#endif
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

/* Row t of a head view into out [d]: kv_cache_elem() for every j, with the format's switch
 * and the row's metadata lookups hoisted out of the loop and the fp16 / fp8 conversions read
 * from the tables above (the rest of the per-element arithmetic is kv_quant_math.h's, so the
 * values are kv_cache_elem()'s bit for bit; test_quant_cache checks it). This is the CPU's
 * share of "dequantize inside attention": one row at a time, in a d-float scratch, never the
 * whole cache. */
void kv_attn_row(const kv_head_view *h, int64_t t, float *out)
{
    const int d = h->d;
    if (t >= h->q) {
        memcpy(out, h->ring + (t % h->window) * d, (size_t)d * sizeof(float));
        return;
    }
    pthread_once(&tables_once, tables_build);
    const int64_t r = kv_view_row(h, t); /* the stored row: codes and metadata live there */
    const uint8_t *row = h->codes + r * kvq_row_bytes(h->fmt, d);
    switch (h->fmt) {
    case KV_QF_F32: /* a paged fp32 row: plain floats, wherever its block is */
        memcpy(out, row, (size_t)d * sizeof(float));
        return;
    case KV_QF_F16: /* in hardware where the CPU has it, else through the table */
#if KV_F16C
        if (have_f16c) {
            f16_row_f16c(row, out, d);
            return;
        }
#endif
        f16_row_table(row, out, d);
        return;
    case KV_QF_BF16: /* kvq_bf16_to_f32() is a shift: no table needed */
        for (int j = 0; j < d; j++) {
            uint16_t b;
            memcpy(&b, row + (size_t)j * 2, 2);
            out[j] = kvq_bf16_to_f32(b);
        }
        return;
    case KV_QF_FP8_E4M3: case KV_QF_FP8_E5M2: {
        const float *tab = fp8_table[h->fmt == KV_QF_FP8_E5M2], s = h->scale;
        for (int j = 0; j < d; j++) out[j] = tab[row[j]] * s;
        return;
    }
    case KV_QF_INT8: case KV_QF_INT8_G32: case KV_QF_INT8_G64: case KV_QF_INT8_G128: {
        const int g = kvq_row_group(h->fmt, h->role, d);
        const float *s = (const float *)h->meta + kvq_meta_index(h->fmt, h->role, r, 0, d);
        for (int j0 = 0; j0 < d; j0 += g) { /* group by group: no division per element */
            const float sg = s[j0 / g];
            for (int j = j0; j < j0 + g; j++) out[j] = kvq_int8_decode((int8_t)row[j], sg);
        }
        return;
    }
    case KV_QF_INT4_KIVI: case KV_QF_INT2_KIVI: {
        const kv_qsz *m = (const kv_qsz *)h->meta + kvq_meta_index(h->fmt, h->role, r, 0, d);
        const int per_channel = h->role == KV_QROLE_KEY; /* keys: one entry per channel */
        /* kvq_unpack() with the bit width a constant of each branch; the binary16 scale and
         * zero through the table */
        if (h->fmt == KV_QF_INT4_KIVI)
            for (int j = 0; j < d; j++) {
                const kv_qsz p = m[per_channel ? j : j / KV_KIVI_GROUP];
                out[j] = kvq_asym_decode(kvq_unpack(row, j, 4), f16_table[p.scale],
                                         f16_table[p.zero]);
            }
        else
            for (int j = 0; j < d; j++) {
                const kv_qsz p = m[per_channel ? j : j / KV_KIVI_GROUP];
                out[j] = kvq_asym_decode(kvq_unpack(row, j, 2), f16_table[p.scale],
                                         f16_table[p.zero]);
            }
        return;
    }
    default:
        for (int j = 0; j < d; j++) out[j] = kv_cache_elem(h, t, j);
    }
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

/* What a query sees of a cache (chapter 06): the retention window of its slot, and where
 * keys still need their rotation. W = 0 is the chapter 02-05 cache: position i, row i. */
typedef struct {
    int window, n_sinks; /* W, S of the spec */
    int64_t t;           /* the query's position */
    const float *rope_cs; /* KV_POS_CACHE: cos/sin per cache index, else NULL */
    int rotary_dim;
} retained;

/* Row t of a view for reading: an fp32 row in the cache itself (no copy: a paged fp32 cache
 * reads its rows where their blocks are, at the speed of the contiguous one), any other row
 * dequantized into @p row. @p direct NULL forces the copy (the row is rotated in place after). */
static inline const float *row_ref(const kv_head_view *h, int64_t t, const float *direct,
                                   float *row)
{
    if (direct && h->fmt == KV_QF_F32 && t < h->q)
        return (const float *)(const void *)h->codes + kv_view_row(h, t) * h->d;
    kv_attn_row(h, t, row);
    return row;
}

/* attend_head() over any cache (chapters 04-06): the same three passes, with each K and V
 * row dequantized as it is read (kv_attn_row(): kv_quant_math.h's per-element decode, the
 * code the CUDA kernels inline, or the KIVI fp32 window for the newest rows). The query
 * visits the len retained positions in position order (kv_window_walk: sinks, then the
 * window), each read from its logical row (kv_window_row(): the ring), so a windowed cache
 * gives the bits full attention with the equivalent mask gives: masked positions would only
 * add exp(-inf) = 0 to the sum and 0·v to the output. Under KV_POS_CACHE a key is rotated
 * here by its index i in that order.
 * row [d] scratch. */
static void attend_head_view(const float *qh, const kv_head_view *kh, const kv_head_view *vh,
                             const retained *w, float *oh, float *att, float *row, int d,
                             int64_t len)
{
    const float scale = 1.0f / sqrtf((float)d);
    float max = -INFINITY;
    kv_window_walk k; /* position i of the list and its row, in order */
    kv_window_walk_start(&k, w->window, w->n_sinks, w->t);
    for (int64_t i = 0; i < len; i++, kv_window_walk_next(&k)) {
        const float *kr = row_ref(kh, k.row, w->rope_cs ? NULL : row, row);
        if (w->rope_cs) rotate_row(row, w->rope_cs, i, w->rotary_dim);
        att[i] = kv_dot(qh, kr, d) * scale;
        if (att[i] > max) max = att[i];
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < len; i++) {
        att[i] = expf(att[i] - max);
        sum += att[i];
    }
    for (int i = 0; i < d; i++) oh[i] = 0.0f;
    kv_window_walk_start(&k, w->window, w->n_sinks, w->t);
    for (int64_t i = 0; i < len; i++, kv_window_walk_next(&k)) {
        const float wt = att[i];
        const float *vr = row_ref(vh, k.row, row, row);
        for (int j = 0; j < d; j++) oh[j] += wt * vr[j];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < d; i++) oh[i] *= inv;
}

void kv_attention_head(const kv_cache *c, int layer, int slot, int pos, int h, int n_heads,
                       const float *qh, float *oh, float *att)
{
    const int kvh = kv_attn_kv_head(h, n_heads, c->n_kv_heads), d = c->head_dim;
    const kv_head_view kh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_VALUE);
    if (c->fmt[layer] == KV_QF_F32 && !kh.blocks && c->spec.window == 0) {
        /* chapter 02: the rows are plain floats, in position order */
        attend_head(qh, (const float *)(const void *)kh.codes,
                    (const float *)(const void *)vh.codes, oh, att, d, pos + 1);
        return;
    }
    const retained w = {c->spec.window, c->spec.n_sinks, pos, c->rope_cs, c->rotary_dim};
    /* a run of d floats for the dequantized row: on the stack up to d = 256, else heap */
    float stack[256], *row = d <= 256 ? stack : kv_calloc((size_t)d * sizeof(float));
    if (!row) { /* no memory: make the failure visible rather than silently wrong */
        for (int i = 0; i < d; i++) oh[i] = NAN;
        return;
    }
    attend_head_view(qh, &kh, &vh, &w, oh, att, row, d,
                     kv_window_count(c->spec.window, c->spec.n_sinks, pos));
    if (row != stack) kv_free(row);
}

int kv_attention(const kv_cache *c, int layer, int slot, int pos, const float *q, float *out,
                 int n_heads)
{
    const int d = c->head_dim;
    const size_t len = (size_t)kv_window_count(c->spec.window, c->spec.n_sinks, pos);
    float *att = kv_calloc((size_t)n_heads * len * sizeof(float)); /* [H][retained] */
    if (!att) return KV_ERR_NOMEM;
    #pragma omp parallel for
    for (int h = 0; h < n_heads; h++)
        kv_attention_head(c, layer, slot, pos, h, n_heads, q + (size_t)h * d,
                          out + (size_t)h * d, att + (size_t)h * len);
    kv_free(att);
    return KV_OK;
}
