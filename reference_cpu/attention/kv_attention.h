/**
 * @file kv_attention.h
 * The one attention family on the CPU (docs/design.md §5): a reference and a fast path.
 *
 * kv_attention_ref() is the math as written (kv_attention_ref.c: three passes over
 * kv_cache_elem(), in double): the oracle. kv_attention() and kv_attention_rows() are the
 * fast path the engine runs (kv_attention_fast.c, with AVX2 twins in kv_attention_avx2.c):
 * the same math in float, arranged for speed, held to the reference by a stated error bound
 * (tests/test_attn_fast.c). Both read a ::kv_cache through its spec: fp32 rows directly, any
 * chapter 04 storage format dequantized row by row (kv_attn_row()), paged or contiguous,
 * windowed or not. Later chapters add layouts, dtypes and retention to this family, never a
 * private copy. kv_attn_decode() is the fast path on plain arrays.
 */
#ifndef KV_ATTENTION_H
#define KV_ATTENTION_H

#include "kv_cache.h"
#include "kv_heads.h" /* kv_attn_kv_head(), kv_heads_group(): the G rule */

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Attention of one query token over a contiguous cache.
 *
 * q    [n_heads][head_dim]               this token's queries, RoPE applied
 * k, v [n_kv_heads][max_seq][head_dim]   the cache; positions 0..len-1 are valid
 * out  [n_heads][head_dim]
 *
 * Query head h reads KV head h / G, G = n_heads / n_kv_heads (G = 1 MHA, G = n_heads MQA).
 * Softmax is computed in three passes (max, exp-sum, weighted values) in fp32, in the order
 * of positions, so the result does not depend on thread count.
 *
 * The scores need len floats per head of scratch, allocated here. Returns KV_OK; KV_ERR_ARG
 * when the shapes are inconsistent (H_kv must divide H, 1 <= len <= max_seq); KV_ERR_NOMEM
 * when the scratch cannot be allocated (out untouched in both cases).
 */
int kv_attn_decode(const float *q, const float *k, const float *v, float *out,
                   int n_heads, int n_kv_heads, int head_dim, int max_seq, int len);

/**
 * The reference: attention of one query token at position @p pos of @p slot, exactly what
 * kv_attention() computes, written as the math (scores and their max, exponentials and their
 * sum, weighted values), every element read with kv_cache_elem(), in double, one query head
 * at a time. Slow; for tests, and for any path that needs the oracle. q [H][d] as for
 * kv_attention(), which also gives the positions attended; out [H][d]. KV_OK, or
 * KV_ERR_NOMEM (out untouched).
 */
int kv_attention_ref(const kv_cache *c, int layer, int slot, int pos, const float *q,
                     float *out, int n_heads);

/**
 * The fast path: attention of one query token at position @p pos of @p slot over cache
 * positions 0..pos of @p layer (causal: the token sees itself and everything before it), or,
 * with a window (chapter 06), over the positions the cache retains: the sinks and the last W
 * positions, in position order (kv_window.h). q [H][d] (rotated by RoPE at the position the
 * spec's scheme gives it: kv_window_query_pos()), out [H][d].
 * Allocates its scratch (kv_attention_scratch()): KV_OK, or KV_ERR_NOMEM.
 */
int kv_attention(const kv_cache *c, int layer, int slot, int pos, const float *q, float *out,
                 int n_heads);

/**
 * kv_attention() for @p n query rows at once, the way kv_forward() calls it: row k is
 * t = rows[k] (rows NULL: t = k), at slot[t], pos[t], queries q + t·stride [H][d], output
 * out + t·stride [H][d]. The unit of work is a group: one row and one KV head, whose G = H /
 * H_kv query heads are computed together so each cached row is read once per KV head. Groups
 * are spread over the threads; when there are fewer groups than threads (decode at batch 1
 * with few KV heads), each group's passes are split over the team instead: scores over runs
 * of positions, values over runs of columns. Either way every output is made in one fixed
 * order: the same bits on any number of threads, and the bits of kv_attention_head() for
 * each head. @p max_len >= every row's kv_window_count(); @p scratch holds
 * kv_attention_scratch(c, n_heads, max_len) floats.
 */
void kv_attention_rows(const kv_cache *c, int layer, int n, const int *rows, const int *slot,
                       const int *pos, const float *q, float *out, size_t stride, int n_heads,
                       int64_t max_len, float *scratch);

/** Floats of scratch kv_attention_rows() needs for rows attending at most @p max_len
 * positions: per thread, the scores of one group and a dequantized row. */
size_t kv_attention_scratch(const kv_cache *c, int n_heads, int64_t max_len);

/**
 * One query head @p h of kv_attention(), alone, with the caller's scratch: a group of one
 * head (the same bits as computed with its group). Reads the cache through its spec: layout,
 * format and retention (a windowed cache: its retained positions in position order, each
 * from its ring row; KV_POS_CACHE keys rotated by their cache index as they are read).
 * qh [d], oh [d], att [kv_window_count(W, S, pos)] scratch for the scores.
 */
void kv_attention_head(const kv_cache *c, int layer, int slot, int pos, int h, int n_heads,
                       const float *qh, float *oh, float *att);

/**
 * Pass 2 of the fast path's softmax over cached rows: x[i] = exp(x[i] - max) for i < n, and
 * their sum. exp by the fast path's own vectorizable routine (kv_attn_exp_le0(): ~1 ulp of
 * expf, 0 below e^-87), the sum in position order (a masked position's exact 0 changes
 * nothing), so every caller
 * (kv_attention(), chapter 08's naive kv_flash, chapter 09's kv_select_attend) gets the same
 * bits for the same scores. max = -inf (nothing visible): every x[i] = 0, sum 0.
 */
float kv_attn_exp_sum(float *x, int64_t n, float max);

/**
 * Which code runs the fast path's passes: the portable loops (kv_attention_fast.c), or their
 * AVX2 twins (kv_attention_avx2.c: x86-64 CPUs that have AVX2, F16C and FMA, found at run
 * time; the default there). Both give the same bits (tests/test_attn_fast.c); the switch
 * exists so a test or a benchmark can run both.
 * @p mode 0: the loops, 1: the twin where the CPU has it, -1: only ask. Returns 1 when the
 * twin is in use. Not to be flipped while another thread is attending.
 */
int kv_attn_simd(int mode);

/**
 * A CPU technique of the fast path, on by default: per-token int8 keys met by the query
 * rounded to 16-bit integers (kv_attn_int_keys()), so a score is an integer dot product the
 * CPU computes exactly with a third of the instructions of a float one. Off, int8 keys are
 * scored in floats like every other format. The reference never rounds the query; a GPU
 * kernel need not either. @p mode 0: off, 1: on, -1: only ask. Returns the setting. Not to
 * be flipped while another thread is attending.
 */
int kv_attn_q16(int mode);

/**
 * Row @p t of a cache head view dequantized into out [d] (chapter 04): equal, bit for bit,
 * to kv_cache_elem() for every j, with the format's switch hoisted out of the loop. What the
 * CPU attention reads a quantized K or V row with (by way of kv_attn_row_factored()).
 */
void kv_attn_row(const kv_head_view *h, int64_t t, float *out);

/**
 * Row @p t as the attention passes read it: out [d] times the returned factor is
 * kv_attn_row()'s row. A per-token int8 row (KV_QF_INT8, one scale per row) comes as its
 * codes converted to floats, its scale the factor, so a score is (q · c)·s and a weight w·s
 * multiplies the codes: one multiply per row instead of one per element (int8 attention is
 * bound by its arithmetic). Every other row is kv_attn_row()'s, factor 1. Every CPU path that
 * attends over a cache (kv_attention(), kv_flash_naive(), kv_select_attend()) reads rows
 * this way, so they agree bit for bit.
 */
float kv_attn_row_factored(const kv_head_view *h, int64_t t, float *out);

/**
 * Adds a value row of view @p vh, read by kv_attn_row_factored(), to an output as
 * kv_attention() does: o[j] += w·row[j] for j < n, w the row's weight times its factor. A
 * per-token int8 view's rows (whole-number codes) take one fused multiply-add per element,
 * fmaf(): one rounding instead of two and one instruction instead of two, exactly rounded on
 * every machine, so every path that uses it agrees bit for bit. Every other row: a multiply,
 * then an add. For the paths that promise kv_attention()'s bits (kv_flash_naive(),
 * kv_select_attend(), tests).
 */
void kv_attn_add_row(const kv_head_view *vh, float *o, float w, const float *row, int n);

/**
 * Whether the fast path rounds the query to 16-bit integers before it meets this view's keys:
 * per-token int8 rows (KV_QF_INT8, one scale per row), while kv_attn_q16() is on (the
 * default). The view cannot tell whether its keys are stored before RoPE: under KV_POS_CACHE
 * (the cache's rope_cs set) kv_attention() rotates each key in floats and meets it with the
 * query as it is, so a caller checks that too.
 * Against a key c·s (codes c, scale s) the score s·(q · c) then becomes s·step·(Q · c), Q =
 * the query's 16-bit codes (kv_quant_math.h: kvq_q16_encode()), an integer dot product the
 * CPU computes exactly with a third of the instructions of a float one (int8 attention is
 * bound by its arithmetic; docs/performance.md §7). The rounding, up to 2^-16 of the query's
 * largest element, is some 250 times finer than the keys' own (2^-8 of the row's). The
 * paths that promise kv_attention()'s numbers (kv_flash, kv_select, a GPU kernel compared
 * with kv_attention()) round the query the same way (kv_attn_query_rounded()), and chapter 04
 * measures the int8 cache with it; the reference (kv_attention_ref()) does not round.
 */
int kv_attn_int_keys(const kv_head_view *kh);

/**
 * The query's 16-bit codes q16 [d] (kvq_q16_encode()) and their step, returned: q ≈
 * q16·step, step = max_j |q[j]| / kvq_q16_max(d). A zero query gives step 0 and zero codes;
 * one with an inf or a NaN step NaN (every score NaN) and zero codes.
 */
float kv_attn_query_q16(const float *q, int d, int16_t *q16);

/** The rounded query as floats: out[j] = q16[j]·step (kv_attn_query_q16()), for paths that
 * score int8 keys in floats (kv_flash's tiled and split, the GPU kernels, tests). */
void kv_attn_query_rounded(const float *q, int d, float *out);

/**
 * The score kv_attention() gives query q [d] against a key row read by
 * kv_attn_row_factored() (row [d], factor f): with @p q16 NULL, kv_dot(q, row, d)·f/√d;
 * with the query's codes and step (keys of a view kv_attn_int_keys() says yes to),
 * ((float)(q16 · row)·f)·(step·(1/√d)), the dot product in integers. For the paths that
 * promise kv_attention()'s bits (kv_flash_naive(), kv_select_attend(), tests).
 */
float kv_attn_score(const float *q, const int16_t *q16, float step, const float *row, float f,
                    int d);

#ifdef __cplusplus
}
#endif
#endif
