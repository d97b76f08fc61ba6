/**
 * @file kv_select.h
 * Chapter 09: eviction and sparse attention — which cached tokens a head keeps or reads.
 *
 * Every method here answers one question per (layer, KV head): which positions of the cache
 * matter. The answer is a ::kv_select_set, the kept positions in ascending order. A cache
 * that stores only those rows ("selected set" retention, the attention family's third
 * retention after full and window + sinks) costs kv_select_bytes() per head; an attention
 * that reads only those rows is kv_select_attend(). The methods (symbols: n keys at
 * positions 0 .. n-1, d head dim, G query heads per KV head, B the budget in tokens):
 *
 *  - L2 norm (kv_select_l2()): score = ||k_p||^2. Keep the largest norms (the source
 *    article's suggestion) or the smallest (Devoto et al. 2024: low-norm keys draw attention).
 *  - heavy hitters, H2O (Zhang et al. 2023; ::kv_select_h2o): per position the attention mass
 *    it has received so far, summed over the G query heads of the group; when the kept set
 *    outgrows B, the lowest mass outside the recent window is evicted, for good.
 *  - prefill selection, SnapKV (Li et al. 2024; kv_select_snapkv()): the last w prompt queries
 *    vote with their attention on the earlier keys; votes are summed over the observation
 *    window and the group, max-pooled along positions (odd kernel), the top B - w positions
 *    kept with the window itself.
 *  - query-aware pages, Quest (Tang et al. 2024; ::kv_select_pages): per page of P tokens the
 *    per-channel min and max of the keys bound q·k from above; each query head reads its k
 *    pages of highest bound, a KV head the union over its group, plus the page of the
 *    current token. Nothing is evicted: the cache keeps every row, attention reads few.
 *  - exact top-k keys (kv_select_topk_keys()): the k largest q·k, the reference an
 *    approximate retrieval (such as Quest) is judged by.
 *
 * Always-kept positions: the sinks 0 .. S-1 and the recent window n-W .. n-1 (chapter 06's
 * S and W) are kept by L2 and H2O whatever their scores; the budget counts them, and when
 * they alone exceed it they are still all kept (a kept set is then larger than B).
 *
 * Ties. Scores are doubles and every ranking is a total order: equal scores are ordered by
 * position, earlier first ("keep the top k" keeps the earlier of two equal positions, "evict
 * the lowest" evicts the earlier). The one exception is the smallest-norm direction of L2,
 * which ranks by the same order as the largest-norm one read from the other end (smaller
 * norm first, equal norms later position first), so that with no always-kept positions and
 * B = n/2 the two directions keep complementary sets.
 *
 * Keys are read through a ::kv_head_view with kv_attn_row(), so every format (fp32 .. KIVI)
 * and both layouts work; the view must show positions as rows (a cache without a window).
 */
#ifndef KV_SELECT_H
#define KV_SELECT_H

#include <stdint.h>

#include "kv_cache.h"
#include "kv_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Tokens per page of the Quest-style selection (Tang et al. 2024 use 16). */
#define KV_SELECT_PAGE 16

/* ---- kept sets and their bytes ------------------------------------------------------------ */

/** A budget: @c tokens when > 0, else @c ratio of the positions there are. */
typedef struct {
    int64_t tokens; /**< B in tokens, or 0 to use the ratio */
    double ratio;   /**< B = ceil(ratio · n) when tokens is 0 (0 < ratio <= 1) */
} kv_select_budget;

/** Positions one (layer, KV head) keeps. */
typedef struct {
    int *pos; /* [cap] kept positions, ascending */
    int n;    /**< positions kept */
    int cap;  /**< room in pos */
} kv_select_set;

/** What a cache holding only a kept set stores for one (layer, KV head), K and V together. */
typedef struct {
    int64_t rows;        /**< kept rows (positions) */
    int64_t code_bytes;  /**< rows · 2 · row bytes of the format (K and V codes) */
    int64_t meta_bytes;  /**< per-row scales of K and V (int8), fp8's two per-head scales */
    int64_t index_bytes; /**< rows · 4: the position each row holds (RoPE, masking, eviction) */
    int64_t total;       /**< the sum */
} kv_select_bytes;

/** B for @p n positions: b->tokens, or ceil(ratio · n), clamped to [0, n]. */
int64_t kv_select_budget_tokens(const kv_select_budget *b, int64_t n);

/** Make room for @p cap positions (keeps what is there). KV_OK or KV_ERR_NOMEM. */
int kv_select_set_reserve(kv_select_set *s, int cap, kv_err *err);
/** Free a set's memory (safe on a zeroed set). */
void kv_select_set_free(kv_select_set *s);
/** 1 when @p pos is in the set (binary search). */
int kv_select_set_has(const kv_select_set *s, int pos);

/**
 * The budget accounting: bytes a cache of format @p fmt at head dim @p d stores for one
 * (layer, KV head) that keeps @p rows rows, K and V: codes (kvq_row_bytes() per row), per-row
 * metadata (int8: one fp32 scale per G channels), fp8's per-head scale for K and for V, and
 * a 4-byte position index per row. KIVI groups 32 rows that never move, which a kept set
 * does not have: KV_ERR_UNSUPPORTED. KV_ERR_ARG for an unknown format or d < 1.
 */
int kv_select_bytes_kept(int fmt, int d, int64_t rows, kv_select_bytes *out, kv_err *err);

/** The kept sets of a whole model, one per (layer, KV head): what a cache with "selected set"
 * retention holds, and what its bytes are counted over. */
typedef struct {
    int n_layers, n_kv_heads;
    kv_select_set *sets; /* [L][H_kv] */
} kv_select_plan;

/** @p n_layers x @p n_kv_heads empty sets. KV_OK, KV_ERR_ARG, KV_ERR_NOMEM. */
int kv_select_plan_init(kv_select_plan *pl, int n_layers, int n_kv_heads, kv_err *err);
/** Free every set and the plan (safe on a zeroed plan). */
void kv_select_plan_free(kv_select_plan *pl);
/** The set of (layer, kvh). */
static inline kv_select_set *kv_select_plan_set(const kv_select_plan *pl, int layer, int kvh)
{
    return pl->sets + (size_t)layer * pl->n_kv_heads + kvh;
}
/**
 * kv_select_bytes_kept() summed over every (layer, KV head) of a plan, each layer in the
 * format a cache built from @p spec stores it (kv_cache_spec_layer_dtype(): selective layers
 * mix formats), head dim @p d, into @p total. For a plan keeping every position of every
 * head, total - index_bytes is what a one-slot contiguous cache of that many tokens holds
 * (kv_cache_bytes()). Errors as kv_select_bytes_kept().
 */
int kv_select_plan_bytes(const kv_select_plan *pl, const kv_cache_spec *spec, int d,
                         kv_select_bytes *total, kv_err *err);

/* ---- the ranking every selector shares ---------------------------------------------------- */

/**
 * The @p k best of @p n scores, by the documented total order: larger score first, equal
 * scores earlier index first (@p largest = 1); or smaller score first, equal scores later
 * index first (@p largest = 0, the same order read from the other end). Writes the chosen
 * indices in ascending order to idx [min(k, n)] and returns how many (0 for k <= 0).
 * O(n log k): a heap of the best k so far, held in idx itself.
 */
int kv_select_topk(const double *score, int n, int k, int largest, int *idx);

/* ---- L2 norm -------------------------------------------------------------------------------- */

/**
 * ||k_p||^2 = sum_j k_pj^2 of keys 0 .. n-1, accumulated in double in channel order (the
 * products of floats are exact in double). norms [n].
 */
void kv_select_key_norms(const kv_head_view *k, int n, double *norms);

/**
 * L2-norm selection over keys 0 .. n-1 of a head: the sinks 0 .. S-1 and the window
 * n-W .. n-1 always, then the budget's remaining B - (S + W) positions of largest norm
 * (@p largest = 1) or smallest norm (0), ties as the file comment says. @p out gets the kept
 * positions, ascending. KV_ERR_ARG (n < 0, W or S < 0), KV_ERR_NOMEM.
 */
int kv_select_l2(const kv_head_view *k, int n, int64_t budget, int largest, int window,
                 int n_sinks, kv_select_set *out, kv_err *err);

/* ---- heavy hitters (H2O) ------------------------------------------------------------------ */

/**
 * H2O state of one (layer, KV head): the kept positions and the attention mass each has
 * received. Positions arrive in order (kv_select_h2o_append()); each step's attention
 * probabilities over the kept positions are added (kv_select_h2o_observe()); when more than
 * B are kept, the lowest mass outside the recent W positions goes (kv_select_h2o_evict()),
 * its entry removed: the state holds at most B entries between steps, and an evicted
 * position never returns. A decode step is: append(1), attention over the kept set,
 * observe(probs), evict.
 */
typedef struct {
    int budget; /**< B: positions kept after an eviction (W included) */
    int window; /**< W: the most recent positions, never evicted */
    int next;   /**< positions seen so far: the next one to arrive */
    int n;      /**< positions kept now */
    int cap;    /**< room in pos / mass */
    int *pos;      /* [cap] kept positions, ascending */
    double *mass;  /* [cap] accumulated attention mass of each kept position */
} kv_select_h2o;

/** An empty state with budget @p budget and window @p window (0 <= W <= B, B >= 1), or
 * KV_ERR_ARG. */
int kv_select_h2o_init(kv_select_h2o *s, int budget, int window, kv_err *err);
/** Free the state (safe on a zeroed one). */
void kv_select_h2o_free(kv_select_h2o *s);
/** Positions next .. next+n_new-1 arrive with mass 0. KV_OK, KV_ERR_ARG, KV_ERR_NOMEM. */
int kv_select_h2o_append(kv_select_h2o *s, int n_new, kv_err *err);
/**
 * Add one step's attention: probs [G][s->n], row g the probabilities query head g of the
 * group gave the kept positions, in the state's order. The group is combined by sum: the
 * position's step mass is sum_g probs[g][i] (float sums in g order), added to its double
 * accumulator. For a prefill, call it once per query (zeros where the query is causally
 * masked) before evicting.
 */
void kv_select_h2o_observe(kv_select_h2o *s, const float *probs, int G);
/**
 * Evict down to the budget: the n - B positions of lowest mass among those older than the
 * window (pos < next - W), equal masses earlier position first. Their positions go to
 * @p evicted [n - B] in ascending order when not NULL. Returns how many were evicted, or -1
 * when the scratch cannot be allocated (nothing evicted).
 */
int kv_select_h2o_evict(kv_select_h2o *s, int *evicted);
/** The state's kept positions as a set (copied). KV_OK or KV_ERR_NOMEM. */
int kv_select_h2o_kept(const kv_select_h2o *s, kv_select_set *out, kv_err *err);

/* ---- SnapKV-style prefill selection ------------------------------------------------------ */

/**
 * The votes of the observation window: the last @p w prompt queries, at positions
 * n-w .. n-1, of the G query heads of one KV head, attend causally (query at t sees keys
 * 0 .. t) with scores q·k/sqrt(d) and softmax computed as kv_attention() does (kv_dot(),
 * max, expf, one division per probability); the probability each gives key p < n - w is
 * summed, query by query and head by head in that order, into votes[p] (double).
 * q [w][G][d] (RoPE applied), votes [n - w]. KV_ERR_ARG (w < 1, w > n), KV_ERR_NOMEM.
 */
int kv_select_snapkv_votes(const kv_head_view *k, int n, const float *q, int w, int G,
                           double *votes, kv_err *err);
/**
 * From votes [n_prefix] (n_prefix = n - w): pool[p] = max of votes over positions
 * p - kernel/2 .. p + kernel/2 inside the prefix (stride 1, the edges see fewer), keep the
 * B - w prefix positions of largest pool (ties earlier first), plus the window
 * n_prefix .. n_prefix + w - 1. KV_ERR_ARG for an even or < 1 kernel, KV_ERR_NOMEM.
 */
int kv_select_snapkv_pick(const double *votes, int n_prefix, int w, int kernel, int64_t budget,
                          kv_select_set *out, kv_err *err);
/** kv_select_snapkv_votes() then kv_select_snapkv_pick(): the kept set of one KV head. */
int kv_select_snapkv(const kv_head_view *k, int n, const float *q, int w, int G, int kernel,
                     int64_t budget, kv_select_set *out, kv_err *err);

/* ---- Quest-style query-aware pages -------------------------------------------------------- */

/** Per page of P tokens, the per-channel min and max of a head's keys. Grows with the cache:
 * kv_select_pages_update() folds in new rows, so a decode step touches one page. */
typedef struct {
    int page;    /**< P, tokens per page */
    int d;
    int n;       /**< keys summarized: pages cover positions 0 .. n-1 */
    int n_pages; /**< ceil(n / P) */
    int cap;     /**< pages of room */
    float *kmin, *kmax; /* [cap][d] per-channel min / max of each page's keys */
} kv_select_pages;

/** An empty summary of pages of @p page tokens at head dim @p d, or KV_ERR_ARG. */
int kv_select_pages_init(kv_select_pages *pg, int page, int d, kv_err *err);
/** Free the summary (safe on a zeroed one). */
void kv_select_pages_free(kv_select_pages *pg);
/** Fold keys pg->n .. n-1 of the view into the summary (n >= pg->n). KV_OK, KV_ERR_NOMEM. */
int kv_select_pages_update(kv_select_pages *pg, const kv_head_view *k, int n, kv_err *err);
/**
 * The upper bound of q·k over page @p i: sum_j max(q_j·min_ij, q_j·max_ij) in double, in
 * channel order. Every key t of the page has q·k_t <= bound, the dot taken in double in the
 * same order (each product of floats is exact in double and rounding is monotone), so the
 * inequality holds in computed arithmetic too, not only in exact arithmetic.
 */
double kv_select_page_bound(const kv_select_pages *pg, int i, const float *q);
/**
 * Quest's page choice for one KV head at decode: each of the G query heads q [G][d] takes
 * its @p k_pages pages of highest bound (ties earlier page first); the union over the group,
 * plus the last page (it holds the current token, position n-1), ascending, to
 * pages [<= G·k_pages + 1]; returns the count, or -1 on NOMEM.
 */
int kv_select_quest_pages(const kv_select_pages *pg, const float *q, int G, int k_pages,
                          int *pages);
/** kv_select_quest_pages() as the positions the chosen pages cover (the last page up to
 * n-1), ascending, into @p out. KV_OK, KV_ERR_NOMEM. */
int kv_select_quest(const kv_select_pages *pg, const float *q, int G, int k_pages,
                    kv_select_set *out, kv_err *err);

/* ---- exact top-k keys and attention over a kept set -------------------------------------- */

/**
 * The @p k_keys keys 0 .. n-1 of largest q·k (double, channel order; ties earlier first) of
 * one query q [d], ascending, into pos [min(k_keys, n)]; returns the count, or -1 on NOMEM.
 * Per query head: a KV head's reference set is the union over its group.
 */
int kv_select_topk_keys(const kv_head_view *k, int n, const float *q, int k_keys, int *pos);

/**
 * Attention of one query head restricted to a kept set: softmax over the kept positions
 * only, out = sum_p softmax(q·k_p/sqrt(d)) v_p in kv_attention()'s passes and order
 * (positions ascending, rows read as it reads them: kv_attn_row_factored()), so the full set
 * 0 .. t gives kv_attention()'s bits. What measures a
 * selection's output error against full attention. qh [d], oh [d], row [d] scratch;
 * att [set->n] returns the probabilities, exp(s_i - max) · (1 / sum), in the set's order:
 * what kv_select_h2o_observe() takes from each query head of the group. An empty set gives
 * zeros.
 */
void kv_select_attend(const kv_head_view *kh, const kv_head_view *vh, const kv_select_set *set,
                      const float *qh, float *oh, float *att, float *row);

#ifdef __cplusplus
}
#endif
#endif
