/* Chapter 09: eviction and sparse attention, CPU reference (kv_select.h).
 *
 * Every selector is two steps: a score per position (or per page), then the one ranking of
 * kv_select_topk(). Keeping the ranking in one place is what makes the tie rule the same
 * everywhere, and what a test can hold against "sort everything, take the first k". */
#include "kv_select.h"

#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- kept sets and their bytes ------------------------------------------------------------ */

int64_t kv_select_budget_tokens(const kv_select_budget *b, int64_t n)
{
    int64_t t = b->tokens > 0 ? b->tokens : (int64_t)ceil(b->ratio * (double)n);
    if (t < 0) t = 0;
    return t > n ? n : t;
}

int kv_select_set_reserve(kv_select_set *s, int cap, kv_err *err)
{
    if (cap <= s->cap) return KV_OK;
    int *p = realloc(s->pos, (size_t)cap * sizeof(int));
    if (!p) return kv_fail(err, KV_ERR_NOMEM, "kv_select: no memory for %d positions", cap);
    s->pos = p;
    s->cap = cap;
    return KV_OK;
}

void kv_select_set_free(kv_select_set *s)
{
    free(s->pos);
    memset(s, 0, sizeof *s);
}

int kv_select_set_has(const kv_select_set *s, int pos)
{
    int lo = 0, hi = s->n; /* the set is ascending: search [lo, hi) */
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (s->pos[mid] == pos) return 1;
        if (s->pos[mid] < pos) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

int kv_select_bytes_kept(int fmt, int d, int64_t rows, kv_select_bytes *out, kv_err *err)
{
    if (d < 1 || rows < 0 || kvq_code_bits(fmt) == 0)
        return kv_fail(err, KV_ERR_ARG, "kv_select_bytes_kept: format %d, d %d, rows %lld", fmt,
                       d, (long long)rows);
    if (kvq_is_kivi(fmt))
        return kv_fail(err, KV_ERR_UNSUPPORTED,
                       "kv_select_bytes_kept: %s groups 32 rows that never move; a kept set "
                       "evicts rows from the middle", kv_quant_name(fmt));
    const int g = kvq_row_group(fmt, KV_QROLE_KEY, d); /* int8: channels per fp32 scale */
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->code_bytes = rows * 2 * kvq_row_bytes(fmt, d);
    out->meta_bytes = (g ? rows * 2 * (d / g) * 4 : 0) + (kvq_is_fp8(fmt) ? 2 * 4 : 0);
    out->index_bytes = rows * (int64_t)sizeof(int32_t);
    out->total = out->code_bytes + out->meta_bytes + out->index_bytes;
    return KV_OK;
}

int kv_select_plan_init(kv_select_plan *pl, int n_layers, int n_kv_heads, kv_err *err)
{
    memset(pl, 0, sizeof *pl);
    if (n_layers < 1 || n_kv_heads < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_select_plan: %d layers, %d kv heads", n_layers,
                       n_kv_heads);
    pl->sets = calloc((size_t)n_layers * n_kv_heads, sizeof(kv_select_set));
    if (!pl->sets) return kv_fail(err, KV_ERR_NOMEM, "kv_select_plan: no memory");
    pl->n_layers = n_layers;
    pl->n_kv_heads = n_kv_heads;
    return KV_OK;
}

void kv_select_plan_free(kv_select_plan *pl)
{
    for (int i = 0; pl->sets && i < pl->n_layers * pl->n_kv_heads; i++)
        kv_select_set_free(&pl->sets[i]);
    free(pl->sets);
    memset(pl, 0, sizeof *pl);
}

int kv_select_plan_bytes(const kv_select_plan *pl, const kv_cache_spec *spec, int d,
                         kv_select_bytes *total, kv_err *err)
{
    memset(total, 0, sizeof *total);
    for (int l = 0; l < pl->n_layers; l++)
        for (int h = 0; h < pl->n_kv_heads; h++) {
            kv_select_bytes b;
            const int rc = kv_select_bytes_kept(kv_cache_spec_layer_dtype(spec, l), d,
                                                kv_select_plan_set(pl, l, h)->n, &b, err);
            if (rc) return rc;
            total->rows += b.rows;
            total->code_bytes += b.code_bytes;
            total->meta_bytes += b.meta_bytes;
            total->index_bytes += b.index_bytes;
            total->total += b.total;
        }
    return KV_OK;
}

/* ---- the ranking -------------------------------------------------------------------------- */

/* The order of one ranking: larger or smaller scores first, equal scores earlier or later
 * index first. */
typedef struct {
    const double *s;
    int larger, earlier;
} order;

/* 1 when index a ranks before index b. */
static inline int ranks_before(const order *o, int a, int b)
{
    if (o->s[a] != o->s[b]) return o->larger ? o->s[a] > o->s[b] : o->s[a] < o->s[b];
    return o->earlier ? a < b : a > b;
}

static int cmp_int(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Restore the heap below node i: the root is the kept index every other kept one beats. */
static void sift_down(int *heap, int n, int i, const order *o)
{
    for (;;) {
        int weakest = i;
        const int l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(o, heap[weakest], heap[l])) weakest = l;
        if (r < n && ranks_before(o, heap[weakest], heap[r])) weakest = r;
        if (weakest == i) return;
        const int t = heap[i];
        heap[i] = heap[weakest];
        heap[weakest] = t;
        i = weakest;
    }
}

/* The k first of n indices in order @p o, ascending into idx [min(k, n)]: a heap of the best
 * k so far whose root is the weakest of them, so each index costs one comparison unless it
 * displaces the root (O(n log k)). */
static int select_k(const order *o, int n, int k, int *idx)
{
    if (k > n) k = n;
    if (k <= 0) return 0;
    int *heap = idx; /* [k] */
    for (int i = 0; i < k; i++) heap[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i, o);
    for (int i = k; i < n; i++)
        if (ranks_before(o, i, heap[0])) { /* i beats the weakest kept */
            heap[0] = i;
            sift_down(heap, k, 0, o);
        }
    qsort(idx, (size_t)k, sizeof(int), cmp_int);
    return k;
}

int kv_select_topk(const double *score, int n, int k, int largest, int *idx)
{
    /* the smallest-first direction is the largest-first order read backwards: ties later */
    const order o = {score, largest, largest};
    return select_k(&o, n, k, idx);
}

/* Positions a selector keeps whatever the scores: sinks 0 .. S-1, window n-W .. n-1. */
static inline int always_kept(int p, int n, int window, int n_sinks)
{
    return p < n_sinks || p >= n - window;
}

/* Keep the always-kept positions and the best (budget - their count) of the others by
 * score [n] (indexed by position): the shape shared by L2 and SnapKV. */
static int keep_forced_and_best(const double *score, int n, int64_t budget, int largest,
                                int window, int n_sinks, kv_select_set *out, kv_err *err)
{
    int n_forced = 0;
    for (int p = 0; p < n; p++) n_forced += always_kept(p, n, window, n_sinks);
    const int n_cand = n - n_forced;
    int64_t rest = budget - n_forced;
    if (rest < 0) rest = 0;
    if (rest > n_cand) rest = n_cand;
    double *cs = malloc((size_t)(n_cand ? n_cand : 1) * sizeof(double)); /* [n_cand] scores */
    int *cp = malloc((size_t)(n_cand ? n_cand : 1) * sizeof(int));       /* [n_cand] positions */
    int rc = kv_select_set_reserve(out, n_forced + (int)rest > 0 ? n_forced + (int)rest : 1, err);
    if (!cs || !cp || rc) {
        free(cs);
        free(cp);
        return rc ? rc : kv_fail(err, KV_ERR_NOMEM, "kv_select: no memory for %d scores", n);
    }
    int c = 0;
    for (int p = 0; p < n; p++)
        if (!always_kept(p, n, window, n_sinks)) {
            cs[c] = score[p];
            cp[c++] = p;
        }
    /* candidates are in position order, so index order is position order: ties agree */
    int *pick = out->pos; /* the chosen candidate indices land first, then the forced */
    const int m = kv_select_topk(cs, n_cand, (int)rest, largest, pick);
    for (int i = 0; i < m; i++) pick[i] = cp[pick[i]];
    int o = m;
    for (int p = 0; p < n; p++)
        if (always_kept(p, n, window, n_sinks)) out->pos[o++] = p;
    qsort(out->pos, (size_t)o, sizeof(int), cmp_int);
    out->n = o;
    free(cs);
    free(cp);
    return KV_OK;
}

/* ---- L2 norm -------------------------------------------------------------------------------- */

void kv_select_key_norms(const kv_head_view *k, int n, double *norms)
{
    /* one thread for a few keys or on a busy machine: a team per call costs more than it saves */
    #pragma omp parallel if (kv_parallel_worth((int64_t)n * k->d))
    {
        float stack[256], *row = k->d <= 256 ? stack : malloc((size_t)k->d * sizeof(float));
        #pragma omp for
        for (int p = 0; p < n; p++) {
            double s = 0.0;
            if (row) {
                kv_attn_row(k, p, row);
                for (int j = 0; j < k->d; j++) s += (double)row[j] * row[j];
            } else {
                s = NAN; /* no scratch: visible, never silently wrong */
            }
            norms[p] = s;
        }
        if (row != stack) free(row);
    }
}

int kv_select_l2(const kv_head_view *k, int n, int64_t budget, int largest, int window,
                 int n_sinks, kv_select_set *out, kv_err *err)
{
    if (n < 0 || window < 0 || n_sinks < 0)
        return kv_fail(err, KV_ERR_ARG, "kv_select_l2: n %d, window %d, sinks %d", n, window,
                       n_sinks);
    double *norms = malloc((size_t)(n ? n : 1) * sizeof(double)); /* [n] */
    if (!norms) return kv_fail(err, KV_ERR_NOMEM, "kv_select_l2: no memory for %d norms", n);
    kv_select_key_norms(k, n, norms);
    const int rc = keep_forced_and_best(norms, n, budget, largest, window, n_sinks, out, err);
    free(norms);
    return rc;
}

/* ---- heavy hitters (H2O) ------------------------------------------------------------------ */

int kv_select_h2o_init(kv_select_h2o *s, int budget, int window, kv_err *err)
{
    memset(s, 0, sizeof *s);
    if (budget < 1 || window < 0 || window > budget)
        return kv_fail(err, KV_ERR_ARG, "kv_select_h2o: budget %d, window %d (0 <= W <= B)",
                       budget, window);
    s->budget = budget;
    s->window = window;
    return KV_OK;
}

void kv_select_h2o_free(kv_select_h2o *s)
{
    free(s->pos);
    free(s->mass);
    memset(s, 0, sizeof *s);
}

int kv_select_h2o_append(kv_select_h2o *s, int n_new, kv_err *err)
{
    if (n_new < 0) return kv_fail(err, KV_ERR_ARG, "kv_select_h2o_append: %d tokens", n_new);
    if (s->n + n_new > s->cap) {
        const int cap = s->n + n_new > 2 * s->cap ? s->n + n_new : 2 * s->cap;
        int *p = realloc(s->pos, (size_t)cap * sizeof(int));
        if (p) s->pos = p;
        double *m = p ? realloc(s->mass, (size_t)cap * sizeof(double)) : NULL;
        if (!m) return kv_fail(err, KV_ERR_NOMEM, "kv_select_h2o: no memory for %d", cap);
        s->mass = m;
        s->cap = cap;
    }
    for (int i = 0; i < n_new; i++) {
        s->pos[s->n] = s->next++;
        s->mass[s->n++] = 0.0;
    }
    return KV_OK;
}

void kv_select_h2o_observe(kv_select_h2o *s, const float *probs, int G)
{
    for (int i = 0; i < s->n; i++) {
        float step = 0.0f; /* the group's heads combined by sum, in head order */
        for (int g = 0; g < G; g++) step += probs[(size_t)g * s->n + i];
        s->mass[i] += step;
    }
}

int kv_select_h2o_evict(kv_select_h2o *s, int *evicted)
{
    const int over = s->n - s->budget;
    if (over <= 0) return 0;
    /* candidates: kept entries older than the window, a prefix of the state (W <= B and
     * the window is never evicted, so there are at least `over` of them) */
    int n_cand = 0;
    while (n_cand < s->n && s->pos[n_cand] < s->next - s->window) n_cand++;
    int *idx = malloc((size_t)over * sizeof(int)); /* [over] entries to evict, ascending */
    if (!idx) return -1;
    const order o = {s->mass, 0, 1}; /* lowest mass first, equal masses earliest first */
    const int m = select_k(&o, n_cand, over, idx);
    int out = 0, e = 0;
    for (int i = 0; i < s->n; i++) {
        if (e < m && idx[e] == i) { /* idx is ascending: one merge pass */
            if (evicted) evicted[e] = s->pos[i];
            e++;
            continue;
        }
        s->pos[out] = s->pos[i];
        s->mass[out++] = s->mass[i];
    }
    s->n = out;
    free(idx);
    return e;
}

int kv_select_h2o_kept(const kv_select_h2o *s, kv_select_set *out, kv_err *err)
{
    const int rc = kv_select_set_reserve(out, s->n > 0 ? s->n : 1, err);
    if (rc) return rc;
    memcpy(out->pos, s->pos, (size_t)s->n * sizeof(int));
    out->n = s->n;
    return KV_OK;
}

/* ---- SnapKV-style prefill selection ------------------------------------------------------ */

int kv_select_snapkv_votes(const kv_head_view *k, int n, const float *q, int w, int G,
                           double *votes, kv_err *err)
{
    if (w < 1 || w > n || G < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_select_snapkv: window %d of %d keys, G %d", w, n, G);
    const int d = k->d, rows = w * G;
    const float scale = 1.0f / sqrtf((float)d);
    float *keys = malloc((size_t)n * d * sizeof(float));    /* [n][d] dequantized once */
    float *probs = malloc((size_t)rows * n * sizeof(float)); /* [w][G][n] */
    if (!keys || !probs) {
        free(keys);
        free(probs);
        return kv_fail(err, KV_ERR_NOMEM, "kv_select_snapkv: no memory for %d keys", n);
    }
    const int par = kv_parallel_worth((int64_t)n * d * (rows + 1));
    #pragma omp parallel for if (par)
    for (int p = 0; p < n; p++) kv_attn_row(k, p, keys + (size_t)p * d);
    /* each observation query's causal softmax, in kv_attention()'s passes */
    #pragma omp parallel for if (par)
    for (int r = 0; r < rows; r++) {
        const int t = n - w + r / G; /* query r = (i, g) sits at position n - w + i */
        const float *qr = q + (size_t)r * d;
        float *pr = probs + (size_t)r * n;
        float max = -INFINITY, sum;
        for (int p = 0; p <= t; p++) {
            pr[p] = kv_dot(qr, keys + (size_t)p * d, d) * scale;
            if (pr[p] > max) max = pr[p];
        }
        sum = kv_attn_exp_sum(pr, t + 1, max);
        for (int p = 0; p <= t; p++) pr[p] /= sum;
    }
    /* the votes: every observation query of every head of the group, in that order */
    #pragma omp parallel for if (par)
    for (int p = 0; p < n - w; p++) {
        double v = 0.0;
        for (int r = 0; r < rows; r++) v += probs[(size_t)r * n + p];
        votes[p] = v;
    }
    free(keys);
    free(probs);
    return KV_OK;
}

int kv_select_snapkv_pick(const double *votes, int n_prefix, int w, int kernel, int64_t budget,
                          kv_select_set *out, kv_err *err)
{
    if (kernel < 1 || kernel % 2 == 0 || n_prefix < 0 || w < 0)
        return kv_fail(err, KV_ERR_ARG, "kv_select_snapkv: kernel %d (odd, >= 1), prefix %d, "
                       "window %d", kernel, n_prefix, w);
    const int n = n_prefix + w, h = kernel / 2;
    double *pool = malloc((size_t)(n ? n : 1) * sizeof(double)); /* [n]; the window's unused */
    if (!pool) return kv_fail(err, KV_ERR_NOMEM, "kv_select_snapkv: no memory for %d", n);
    /* max pooling: a key next to a strongly voted one is kept with it, so a fact survives
     * with its neighbours (the tokens that give it meaning), not as an isolated token */
    for (int p = 0; p < n_prefix; p++) {
        double m = votes[p];
        for (int j = p - h < 0 ? 0 : p - h; j <= p + h && j < n_prefix; j++)
            if (votes[j] > m) m = votes[j];
        pool[p] = m;
    }
    for (int p = n_prefix; p < n; p++) pool[p] = 0.0;
    const int rc = keep_forced_and_best(pool, n, budget, 1, w, 0, out, err);
    free(pool);
    return rc;
}

int kv_select_snapkv(const kv_head_view *k, int n, const float *q, int w, int G, int kernel,
                     int64_t budget, kv_select_set *out, kv_err *err)
{
    if (w < 1 || w > n)
        return kv_fail(err, KV_ERR_ARG, "kv_select_snapkv: window %d of %d keys", w, n);
    double *votes = malloc((size_t)(n - w ? n - w : 1) * sizeof(double)); /* [n - w] */
    if (!votes) return kv_fail(err, KV_ERR_NOMEM, "kv_select_snapkv: no memory for %d", n);
    int rc = kv_select_snapkv_votes(k, n, q, w, G, votes, err);
    if (!rc) rc = kv_select_snapkv_pick(votes, n - w, w, kernel, budget, out, err);
    free(votes);
    return rc;
}

/* ---- Quest-style query-aware pages -------------------------------------------------------- */

int kv_select_pages_init(kv_select_pages *pg, int page, int d, kv_err *err)
{
    memset(pg, 0, sizeof *pg);
    if (page < 1 || d < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_select_pages: page %d, d %d", page, d);
    pg->page = page;
    pg->d = d;
    return KV_OK;
}

void kv_select_pages_free(kv_select_pages *pg)
{
    free(pg->kmin);
    free(pg->kmax);
    memset(pg, 0, sizeof *pg);
}

int kv_select_pages_update(kv_select_pages *pg, const kv_head_view *k, int n, kv_err *err)
{
    if (n < pg->n || k->d != pg->d)
        return kv_fail(err, KV_ERR_ARG, "kv_select_pages_update: %d keys after %d, d %d vs %d",
                       n, pg->n, k->d, pg->d);
    const int d = pg->d, need = (n + pg->page - 1) / pg->page;
    if (need > pg->cap) {
        const int cap = need > 2 * pg->cap ? need : 2 * pg->cap;
        float *a = realloc(pg->kmin, (size_t)cap * d * sizeof(float));
        if (a) pg->kmin = a;
        float *b = a ? realloc(pg->kmax, (size_t)cap * d * sizeof(float)) : NULL;
        if (!b) return kv_fail(err, KV_ERR_NOMEM, "kv_select_pages: no memory for %d pages", cap);
        pg->kmax = b;
        pg->cap = cap;
    }
    float stack[256], *row = d <= 256 ? stack : malloc((size_t)d * sizeof(float)); /* [d] */
    if (!row) return kv_fail(err, KV_ERR_NOMEM, "kv_select_pages: no row scratch");
    for (int t = pg->n; t < n; t++) {
        float *mn = pg->kmin + (size_t)(t / pg->page) * d, *mx = pg->kmax + (size_t)(t / pg->page) * d;
        kv_attn_row(k, t, row);
        if (t % pg->page == 0) { /* a page's first key opens it */
            memcpy(mn, row, (size_t)d * sizeof(float));
            memcpy(mx, row, (size_t)d * sizeof(float));
            continue;
        }
        for (int j = 0; j < d; j++) {
            if (row[j] < mn[j]) mn[j] = row[j];
            if (row[j] > mx[j]) mx[j] = row[j];
        }
    }
    if (row != stack) free(row);
    pg->n = n;
    pg->n_pages = need;
    return KV_OK;
}

double kv_select_page_bound(const kv_select_pages *pg, int i, const float *q)
{
    const float *mn = pg->kmin + (size_t)i * pg->d, *mx = pg->kmax + (size_t)i * pg->d;
    double b = 0.0;
    for (int j = 0; j < pg->d; j++) {
        /* q_j k_j is linear in k_j, so over [min_j, max_j] its largest value is at an end */
        const double lo = (double)q[j] * mn[j], hi = (double)q[j] * mx[j];
        b += lo > hi ? lo : hi;
    }
    return b;
}

int kv_select_quest_pages(const kv_select_pages *pg, const float *q, int G, int k_pages,
                          int *pages)
{
    const int np = pg->n_pages;
    if (np == 0) return 0;
    double *bound = malloc((size_t)np * sizeof(double)); /* [n_pages] of one query head */
    int *top = malloc((size_t)np * sizeof(int));         /* [k_pages] */
    char *take = calloc((size_t)np, 1);                  /* [n_pages] in the union? */
    if (!bound || !top || !take) {
        free(bound);
        free(top);
        free(take);
        return -1;
    }
    for (int g = 0; g < G; g++) {
        for (int i = 0; i < np; i++) bound[i] = kv_select_page_bound(pg, i, q + (size_t)g * pg->d);
        const int m = kv_select_topk(bound, np, k_pages, 1, top);
        for (int i = 0; i < m; i++) take[top[i]] = 1;
    }
    take[np - 1] = 1; /* the current token's page: its own key is always read */
    int c = 0;
    for (int i = 0; i < np; i++)
        if (take[i]) pages[c++] = i;
    free(bound);
    free(top);
    free(take);
    return c;
}

int kv_select_quest(const kv_select_pages *pg, const float *q, int G, int k_pages,
                    kv_select_set *out, kv_err *err)
{
    int *pages = malloc((size_t)(pg->n_pages ? pg->n_pages : 1) * sizeof(int)); /* [n_pages] */
    if (!pages) return kv_fail(err, KV_ERR_NOMEM, "kv_select_quest: no memory");
    const int np = kv_select_quest_pages(pg, q, G, k_pages, pages);
    int rc = np < 0 ? kv_fail(err, KV_ERR_NOMEM, "kv_select_quest: no memory") : KV_OK;
    if (!rc) rc = kv_select_set_reserve(out, np * pg->page > 0 ? np * pg->page : 1, err);
    if (!rc) {
        int o = 0;
        for (int i = 0; i < np; i++)
            for (int t = pages[i] * pg->page; t < (pages[i] + 1) * pg->page && t < pg->n; t++)
                out->pos[o++] = t;
        out->n = o;
    }
    free(pages);
    return rc;
}

/* ---- exact top-k keys and attention over a kept set -------------------------------------- */

int kv_select_topk_keys(const kv_head_view *k, int n, const float *q, int k_keys, int *pos)
{
    const int d = k->d;
    double *score = malloc((size_t)(n ? n : 1) * sizeof(double)); /* [n] q·k in double */
    if (!score) return -1;
    int fail = 0;
    /* called once per query row by kv_retain: a team per call only where the keys are many */
    #pragma omp parallel reduction(| : fail) if (kv_parallel_worth((int64_t)n * d))
    {
        float stack[256], *row = d <= 256 ? stack : malloc((size_t)d * sizeof(float));
        if (!row) fail = 1;
        #pragma omp for
        for (int p = 0; p < n; p++) {
            double s = 0.0;
            if (row) {
                kv_attn_row(k, p, row);
                for (int j = 0; j < d; j++) s += (double)q[j] * row[j];
            }
            score[p] = s;
        }
        if (row && row != stack) free(row);
    }
    const int m = fail ? -1 : kv_select_topk(score, n, k_keys, 1, pos);
    free(score);
    return m;
}

void kv_select_attend(const kv_head_view *kh, const kv_head_view *vh, const kv_select_set *set,
                      const float *qh, float *oh, float *att, float *row)
{
    const int d = kh->d, n = set->n;
    for (int j = 0; j < d; j++) oh[j] = 0.0f;
    if (n == 0) return; /* nothing kept: nothing to attend to, zeros rather than 0/0 */
    float max = -INFINITY;
    /* int8 keys: the query's 16-bit codes, as kv_attention() scores them (kv_attn_int_keys()) */
    int16_t stack[256], *q16 = NULL; /* [d] */
    if (kv_attn_int_keys(kh)) {
        q16 = d <= 256 ? stack : malloc((size_t)d * sizeof(int16_t));
        if (!q16) { /* no memory: make the failure visible rather than silently wrong */
            for (int j = 0; j < d; j++) oh[j] = NAN;
            return;
        }
    }
    const float step = q16 ? kv_attn_query_q16(qh, d, q16) : 0.0f;
    for (int i = 0; i < n; i++) { /* rows as kv_attention() reads them: the same bits */
        const float f = kv_attn_row_factored(kh, set->pos[i], row);
        att[i] = kv_attn_score(qh, q16, step, row, f, d);
        if (att[i] > max) max = att[i];
    }
    if (q16 != stack) free(q16);
    const float sum = kv_attn_exp_sum(att, n, max);
    for (int i = 0; i < n; i++) {
        const float f = kv_attn_row_factored(vh, set->pos[i], row);
        kv_attn_add_row(vh, oh, att[i] * f, row, d);
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < d; j++) oh[j] *= inv;
    for (int i = 0; i < n; i++) att[i] *= inv; /* the probabilities, for H2O's accounting */
}
