/* Chapter 08: naive, tiled and split-KV attention on the CPU (kv_flash.h).
 *
 * Three ways to compute the same softmax(q·K^T/√d) V, differing only in what memory they
 * touch. The math they share is written once:
 *
 *   online_update()   fold one tile of scores (and its value rows) into a running
 *                     (m, l, acc): FlashAttention's recurrence. tiled and split both use it.
 *   kv_flash_merge()  the same algebra for two finished partial results (split's reduction).
 *   kv_flash_finish() the one division, acc / l.
 *
 * Rows of K and V come from the cache through a kv_head_view, one tile at a time: fp32 rows
 * are read where they lie, every other format is dequantized as it is read (kv_attn_row(),
 * the row decoder of chapter 04's attention), so the cache's format never reaches the math.
 * The naive path reads its rows as kv_attention() does (kv_attn_row_factored(): a per-token
 * int8 row's scale applied once per score and per weight) and scores them as it does
 * (kv_attn_score(): int8 keys against the query's 16-bit codes, in integers), so a decode
 * query gets kv_attention()'s bits; the tiled and split paths round differently anyway
 * (their online softmax) and read dequantized rows, int8 keys against the same rounded query
 * in floats (kv_attn_query_rounded()): all three agree within fp32 tolerance.
 *
 * Bytes (kv_flash_stats) are counted where they move, in these units:
 *   row bytes  r  = d · b, b = kv_dtype_bytes_d(fmt, d): codes plus metadata as stored
 *                   (a KIVI row still in its fp32 window: 4 d)
 *   naive   kv    = H · 2 · n_vis · r           K and V once per query head
 *                                               (G times per KV head)
 *           score = H · 5 · T · n_vis · 4       S written; read for the max; read and
 *                                               rewritten as exp; read for P V
 *   tiled   kv    = Σ over (query tile, head) of 2 · (keys in its computed key tiles) · r
 *                   (K/V read once per query tile: ceil(T / tile_q) times, fewer when
 *                   causal tiles are skipped)
 *   split   kv    = Σ over (head, split) of 2 · (keys in its computed key tiles) · r
 *           out   = H · T · (2 · n_splits · (d + 2) + d) · 4   partials written, read back
 *                   by the merge, and the output
 *   q     = (times a query block is read) · d · 4, out = H · T · d · 4 (tiled, naive)
 * n_vis = n_keys - k_begin, the keys any query may see.
 */
#include "kv_flash.h"
#include "kv_attention.h"
#include "kv_ops.h"

#include <math.h>
#include <string.h>

/* ---- shared pieces ------------------------------------------------------------------------ */

/* Where a job's keys and values are, and what one stored row costs to read. */
typedef struct {
    const kv_flash_job *j;
    int d, H, Hkv;
    int fmt;
    float scale;       /* 1 / √d */
    int64_t lo;        /* k_begin: no query sees a key below it */
} flash_ctx;

/* Bytes of stored row t of a view: @p rb (codes and metadata, d · b), or 4 d for a row
 * still in the fp32 KIVI window. */
static inline double row_bytes(const kv_head_view *h, int64_t t, double rb)
{
    return t >= h->q ? 4.0 * h->d : rb;
}

/* Row t of a view as floats: an fp32 row where it lies in the cache (no copy), any other
 * row dequantized into @p buf [d]. */
static inline const float *row_at(const kv_head_view *h, int64_t t, float *buf)
{
    if (h->fmt == KV_QF_F32 && t < h->q)
        return (const float *)(const void *)h->codes + kv_view_row(h, t) * h->d;
    kv_attn_row(h, t, buf);
    return buf;
}

/* The same row as kv_attention() reads it, and its factor (kv_attn_row_factored()): what
 * the naive path attends over, so that its decode query has kv_attention()'s bits. */
static inline const float *row_factored(const kv_head_view *h, int64_t t, float *buf,
                                        float *factor)
{
    *factor = 1.0f;
    if (h->fmt == KV_QF_F32 && t < h->q)
        return (const float *)(const void *)h->codes + kv_view_row(h, t) * h->d;
    *factor = kv_attn_row_factored(h, t, buf);
    return buf;
}

/* The last key query t may see, plus one: keys k_begin <= k < end(t). */
static inline int64_t key_end(const kv_flash_job *j, int t)
{
    if (!j->causal) return j->n_keys;
    const int64_t p = j->q_pos0 + t + 1;
    return p < j->n_keys ? p : j->n_keys;
}

/* Argument checks every algorithm shares; fills the context. */
static int flash_check(const char *who, const kv_flash_job *j, flash_ctx *x, kv_err *err)
{
    if (!j || !j->c) return kv_fail(err, KV_ERR_ARG, "%s: no job or no cache", who);
    const kv_cache *c = j->c;
    if (c->spec.window.size > 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a sliding-window cache (chapter 06) keeps "
                       "only some rows; attend it with kv_attention()", who);
    if (j->layer < 0 || j->layer >= c->n_layers || j->slot < 0 || j->slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "%s: layer %d / slot %d outside the cache", who,
                       j->layer, j->slot);
    if (j->n_heads < 1 || j->n_heads % c->n_kv_heads)
        return kv_fail(err, KV_ERR_ARG, "%s: %d query heads is not a multiple of H_kv %d", who,
                       j->n_heads, c->n_kv_heads);
    if (j->T < 0 || (j->T > 0 && (!j->q || !j->out)))
        return kv_fail(err, KV_ERR_ARG, "%s: T %d, or no q / out", who, j->T);
    int64_t rows = c->spec.capacity;
    if (c->tables) rows = (int64_t)c->n_mapped[j->slot] * c->spec.layout.block_size;
    if (j->n_keys < 0 || j->n_keys > rows || j->k_begin < 0)
        return kv_fail(err, KV_ERR_ARG, "%s: keys %lld .. %lld outside the slot's %lld rows",
                       who, (long long)j->k_begin, (long long)j->n_keys, (long long)rows);
    x->j = j;
    x->d = c->head_dim;
    x->H = j->n_heads;
    x->Hkv = c->n_kv_heads;
    x->fmt = c->fmt[j->layer];
    x->scale = 1.0f / sqrtf((float)c->head_dim);
    x->lo = j->k_begin;
    return KV_OK;
}

static void stats_add(kv_flash_stats *st, const kv_flash_stats *a)
{
    if (!st) return;
    #pragma omp atomic
    st->kv_bytes += a->kv_bytes;
    #pragma omp atomic
    st->q_bytes += a->q_bytes;
    #pragma omp atomic
    st->out_bytes += a->out_bytes;
    #pragma omp atomic
    st->score_bytes += a->score_bytes;
    #pragma omp atomic
    st->tiles_done += a->tiles_done;
    #pragma omp atomic
    st->tiles_skipped += a->tiles_skipped;
}

/* ---- naive: S materialized -------------------------------------------------------------- */

/* One head: S = Q K^T / √d into s [T][n] (masked entries -inf), softmax row by row, O = P V.
 * K and V rows are read once each (key outer, queries inner); S is what moves instead. */
static void naive_head(const flash_ctx *x, int h, float *s, float *sum, float *row,
                       int16_t *q16, float *step, kv_flash_stats *a)
{
    const kv_flash_job *j = x->j;
    const int d = x->d, H = x->H, T = j->T;
    const int64_t lo = x->lo, n = j->n_keys > lo ? j->n_keys - lo : 0;
    const int kvh = kv_attn_kv_head(h, H, x->Hkv);
    const kv_head_view kh = kv_cache_view(j->c, j->layer, j->slot, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(j->c, j->layer, j->slot, kvh, KV_QROLE_VALUE);
    const double rb = kv_dtype_bytes_d(x->fmt, d) * d;
    double kvb = 0.0;

    /* pass 1: every score, written to S; int8 keys against the queries' 16-bit codes q16
     * [T][d] and steps [T], as kv_attention() scores them (kv_attn_int_keys()) */
    const int qint = kv_attn_int_keys(&kh);
    for (int t = 0; t < T && qint; t++)
        step[t] = kv_attn_query_q16(j->q + ((size_t)t * H + h) * d, d, q16 + (size_t)t * d);
    for (int64_t i = 0; i < n; i++) {
        float f;
        const float *kr = row_factored(&kh, lo + i, row, &f);
        kvb += row_bytes(&kh, lo + i, rb);
        for (int t = 0; t < T; t++)
            s[(size_t)t * n + i] = lo + i < key_end(j, t)
                ? kv_attn_score(j->q + ((size_t)t * H + h) * d, qint ? q16 + (size_t)t * d : NULL,
                                qint ? step[t] : 0.0f, kr, f, d)
                : -INFINITY;
    }
    /* pass 2: per row, the max, then exp(s - max) in place, and their sum */
    for (int t = 0; t < T; t++) {
        float *st = s + (size_t)t * n, max = -INFINITY;
        for (int64_t i = 0; i < n; i++) if (st[i] > max) max = st[i];
        sum[t] = kv_attn_exp_sum(st, n, max); /* a fully masked row: every weight 0 */
    }
    /* pass 3: O = P V, value rows read once, each added to every query's output as
     * kv_attention() adds it (kv_attn_add_row()) */
    for (int t = 0; t < T; t++) memset(j->out + ((size_t)t * H + h) * d, 0, (size_t)d * 4);
    for (int64_t i = 0; i < n; i++) {
        float f;
        const float *vr = row_factored(&vh, lo + i, row, &f);
        kvb += row_bytes(&vh, lo + i, rb);
        for (int t = 0; t < T; t++) {
            const float w = s[(size_t)t * n + i] * f;
            float *o = j->out + ((size_t)t * H + h) * d;
            if (w != 0.0f) kv_attn_add_row(&vh, o, w, vr, d);
        }
    }
    /* the one division per output (none visible: zeros, not 0/0) */
    for (int t = 0; t < T; t++) {
        float *o = j->out + ((size_t)t * H + h) * d;
        const float inv = sum[t] > 0.0f ? 1.0f / sum[t] : 0.0f;
        for (int k = 0; k < d; k++) o[k] *= inv;
    }
    a->kv_bytes += (int64_t)llround(kvb);
    a->q_bytes += (int64_t)T * d * 4;
    a->out_bytes += (int64_t)T * d * 4;
    a->score_bytes += 5 * (int64_t)T * n * 4;
}

int kv_flash_naive(const kv_flash_job *j, kv_flash_stats *st, kv_err *err)
{
    flash_ctx x;
    int e = flash_check("kv_flash_naive", j, &x, err);
    if (e) return e;
    if (j->T == 0) return KV_OK;
    const int64_t n = j->n_keys > x.lo ? j->n_keys - x.lo : 0;
    int failed = 0;
    #pragma omp parallel
    {
        /* one score matrix per thread, reused head after head */
        float *s = kv_calloc(((size_t)j->T * (n ? n : 1)) * sizeof(float)); /* [T][n] */
        float *sum = kv_calloc((size_t)j->T * sizeof(float));              /* [T] */
        float *row = kv_calloc((size_t)x.d * sizeof(float));               /* [d] */
        int16_t *q16 = kv_calloc((size_t)j->T * x.d * sizeof(int16_t));    /* [T][d] */
        float *step = kv_calloc((size_t)j->T * sizeof(float));             /* [T] */
        kv_flash_stats a = {0};
        if (!s || !sum || !row || !q16 || !step) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for schedule(dynamic, 1)
            for (int h = 0; h < x.H; h++) naive_head(&x, h, s, sum, row, q16, step, &a);
        }
        stats_add(st, &a);
        kv_free(s);
        kv_free(sum);
        kv_free(row);
        kv_free(q16);
        kv_free(step);
    }
    if (failed)
        return kv_fail(err, KV_ERR_NOMEM, "kv_flash_naive: %.1f MiB of scores per thread",
                       (double)j->T * n * 4 / 1048576.0);
    return KV_OK;
}

/* ---- the online softmax ------------------------------------------------------------------- */

/*
 * Fold one tile of scores s [n] (masked keys: -inf) and their value rows v [n][d] into the
 * running state p of one query. If the tile raises the max from m to m', everything summed
 * so far was weighted exp(s - m) and must be exp(s - m'): multiply l and acc by e^(m - m')
 * once, then add the tile's own exp(s - m') and exp(s - m') v. A tile with no visible key
 * changes nothing. This is the only place the recurrence is written.
 */
static void online_update(kv_flash_part *p, const float *s, const float *const *v, int n,
                          int d)
{
    float mt = -INFINITY;
    for (int i = 0; i < n; i++) if (s[i] > mt) mt = s[i];
    if (mt == -INFINITY) return;
    const float m = p->m > mt ? p->m : mt;
    const float c = expf(p->m - m); /* 0 when p was empty (m = -inf) */
    p->l *= c;
    for (int k = 0; k < d; k++) p->acc[k] *= c;
    for (int i = 0; i < n; i++) {
        const float w = expf(s[i] - m);
        if (w == 0.0f) continue;
        p->l += w;
        for (int k = 0; k < d; k++) p->acc[k] += w * v[i][k];
    }
    p->m = m;
}

void kv_flash_merge(kv_flash_part *a, const kv_flash_part *b, int d)
{
    if (b->m == -INFINITY) return; /* b saw no key */
    if (a->m == -INFINITY) {
        a->m = b->m;
        a->l = b->l;
        memcpy(a->acc, b->acc, (size_t)d * sizeof(float));
        return;
    }
    const float m = a->m > b->m ? a->m : b->m;
    const float ca = expf(a->m - m), cb = expf(b->m - m);
    a->l = a->l * ca + b->l * cb;
    for (int k = 0; k < d; k++) a->acc[k] = a->acc[k] * ca + b->acc[k] * cb;
    a->m = m;
}

void kv_flash_finish(const kv_flash_part *p, int d, float *out)
{
    const float inv = p->l > 0.0f ? 1.0f / p->l : 0.0f;
    for (int k = 0; k < d; k++) out[k] = p->acc[k] * inv;
}

static void part_empty(kv_flash_part *p, int d)
{
    p->m = -INFINITY;
    p->l = 0.0f;
    memset(p->acc, 0, (size_t)d * sizeof(float));
}

/* Per-thread scratch of the tiled loop: a key tile and a value tile as row pointers (into
 * the cache for fp32, into the copies for other formats), and one query's scores. */
typedef struct {
    float *kbuf, *vbuf;       /* [tile_k][d] dequantized rows */
    const float **kr, **vr;   /* [tile_k] row pointers */
    float *s;                 /* [tile_k] */
    float *qr;                /* [rows][d] the queries rounded for int8 keys
                               * (kv_attn_query_rounded()), once per attend_range() call */
} tile_scratch;

static int scratch_alloc(tile_scratch *w, int tile_k, int rows, int d)
{
    w->kbuf = kv_calloc((size_t)tile_k * d * sizeof(float));
    w->vbuf = kv_calloc((size_t)tile_k * d * sizeof(float));
    w->kr = kv_calloc((size_t)tile_k * sizeof(float *));
    w->vr = kv_calloc((size_t)tile_k * sizeof(float *));
    w->s = kv_calloc((size_t)tile_k * sizeof(float));
    w->qr = kv_calloc((size_t)rows * d * sizeof(float));
    return w->kbuf && w->vbuf && w->kr && w->vr && w->s && w->qr;
}

static void scratch_free(tile_scratch *w)
{
    kv_free(w->kbuf); kv_free(w->vbuf); kv_free((void *)w->kr); kv_free((void *)w->vr);
    kv_free(w->s);
    kv_free(w->qr);
}

/*
 * The tiled loop for queries t0 .. t1-1 of head h over keys [k0, k1), tile_k keys at a time
 * (tiles start at k0), folding into parts [t1 - t0] (which the caller emptied). A key tile
 * whose first key is beyond the last query's position is in the causal future of every
 * query here: skipped, its rows never read. K and V rows of a tile are read once and used by
 * every query of the block.
 */
static void attend_range(const flash_ctx *x, int h, int t0, int t1, int64_t k0, int64_t k1,
                         int tile_k, kv_flash_part *parts, tile_scratch *w, kv_flash_stats *a)
{
    const kv_flash_job *j = x->j;
    const int d = x->d, H = x->H, kvh = kv_attn_kv_head(h, H, x->Hkv);
    const kv_head_view kh = kv_cache_view(j->c, j->layer, j->slot, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(j->c, j->layer, j->slot, kvh, KV_QROLE_VALUE);
    const int64_t last = key_end(j, t1 - 1); /* the block's furthest visible key, plus one */
    const int qint = kv_attn_int_keys(&kh);
    const double rb = kv_dtype_bytes_d(x->fmt, d) * d;
    double kvb = 0.0;
    for (int t = t0; t < t1 && qint; t++) /* int8 keys meet the queries rounded, once each */
        kv_attn_query_rounded(j->q + ((size_t)t * H + h) * d, d, w->qr + (size_t)(t - t0) * d);
    a->q_bytes += (int64_t)(t1 - t0) * d * 4;
    for (int64_t kt = k0; kt < k1; kt += tile_k) {
        const int n = (int)(k1 - kt < tile_k ? k1 - kt : tile_k);
        if (kt >= last) { a->tiles_skipped++; continue; }
        a->tiles_done++;
        for (int i = 0; i < n; i++) { /* the tile's K and V rows, read once */
            w->kr[i] = row_at(&kh, kt + i, w->kbuf + (size_t)i * d);
            w->vr[i] = row_at(&vh, kt + i, w->vbuf + (size_t)i * d);
            kvb += row_bytes(&kh, kt + i, rb) + row_bytes(&vh, kt + i, rb);
        }
        for (int t = t0; t < t1; t++) {
            const float *qt = qint ? w->qr + (size_t)(t - t0) * d : j->q + ((size_t)t * H + h) * d;
            const int64_t end = key_end(j, t);
            for (int i = 0; i < n; i++)
                w->s[i] = kt + i < end ? kv_dot(qt, w->kr[i], d) * x->scale : -INFINITY;
            online_update(&parts[t - t0], w->s, w->vr, n, d);
        }
    }
    a->kv_bytes += (int64_t)llround(kvb);
}

/* ---- tiled: FlashAttention's loop ------------------------------------------------------- */

int kv_flash_tiled(const kv_flash_job *j, int tile_q, int tile_k, kv_flash_stats *st,
                   kv_err *err)
{
    flash_ctx x;
    int e = flash_check("kv_flash_tiled", j, &x, err);
    if (e) return e;
    if (tile_q < 1 || tile_k < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_flash_tiled: tiles %d x %d", tile_q, tile_k);
    if (j->T == 0) return KV_OK;
    const int d = x.d, H = x.H, nqt = (j->T + tile_q - 1) / tile_q;
    int failed = 0;
    #pragma omp parallel
    {
        tile_scratch w;
        kv_flash_part *parts = kv_calloc((size_t)tile_q * sizeof(kv_flash_part)); /* [tile_q] */
        float *acc = kv_calloc((size_t)tile_q * d * sizeof(float));             /* [tile_q][d] */
        kv_flash_stats a = {0};
        if (!scratch_alloc(&w, tile_k, tile_q, d) || !parts || !acc) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            #pragma omp for collapse(2) schedule(dynamic, 1)
            for (int qt = 0; qt < nqt; qt++)
                for (int h = 0; h < H; h++) {
                    const int t0 = qt * tile_q, t1 = t0 + tile_q < j->T ? t0 + tile_q : j->T;
                    for (int t = 0; t < t1 - t0; t++) {
                        parts[t].acc = acc + (size_t)t * d;
                        part_empty(&parts[t], d);
                    }
                    attend_range(&x, h, t0, t1, x.lo, j->n_keys, tile_k, parts, &w, &a);
                    for (int t = t0; t < t1; t++) /* the one division per output */
                        kv_flash_finish(&parts[t - t0], d, j->out + ((size_t)t * H + h) * d);
                    a.out_bytes += (int64_t)(t1 - t0) * d * 4;
                }
        }
        stats_add(st, &a);
        scratch_free(&w);
        kv_free(parts);
        kv_free(acc);
    }
    if (failed) return kv_fail(err, KV_ERR_NOMEM, "kv_flash_tiled: tile scratch");
    return KV_OK;
}

/* ---- split-KV: flash-decoding ----------------------------------------------------------- */

int kv_flash_split(const kv_flash_job *j, int n_splits, int tile_k, kv_flash_stats *st,
                   kv_err *err)
{
    flash_ctx x;
    int e = flash_check("kv_flash_split", j, &x, err);
    if (e) return e;
    if (n_splits < 1 || tile_k < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_flash_split: %d splits, tile %d", n_splits, tile_k);
    if (j->T == 0) return KV_OK;
    const int d = x.d, H = x.H, T = j->T, S = n_splits;
    const int64_t n = j->n_keys > x.lo ? j->n_keys - x.lo : 0;
    /* partials of every (head, split, query): parts [H][S][T], acc [H][S][T][d] */
    kv_flash_part *parts = kv_calloc((size_t)H * S * T * sizeof(kv_flash_part));
    float *acc = kv_calloc((size_t)H * S * T * d * sizeof(float));
    if (!parts || !acc) {
        kv_free(parts);
        kv_free(acc);
        return kv_fail(err, KV_ERR_NOMEM, "kv_flash_split: %d x %d x %d partials", H, S, T);
    }
    for (size_t i = 0; i < (size_t)H * S * T; i++) {
        parts[i].acc = acc + i * d;
        part_empty(&parts[i], d);
    }
    int failed = 0;
    #pragma omp parallel
    {
        tile_scratch w;
        kv_flash_stats a = {0};
        if (!scratch_alloc(&w, tile_k, T, d)) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) {
            /* split s covers keys lo + [s·n/S, (s+1)·n/S): near-equal, possibly empty */
            #pragma omp for collapse(2) schedule(dynamic, 1)
            for (int h = 0; h < H; h++)
                for (int s = 0; s < S; s++) {
                    const int64_t k0 = x.lo + n * s / S, k1 = x.lo + n * (s + 1) / S;
                    attend_range(&x, h, 0, T, k0, k1, tile_k,
                                 parts + ((size_t)h * S + s) * T, &w, &a);
                }
        }
        stats_add(st, &a);
        scratch_free(&w);
    }
    if (failed) {
        kv_free(parts);
        kv_free(acc);
        return kv_fail(err, KV_ERR_NOMEM, "kv_flash_split: tile scratch");
    }
    /* the reduction: merge each query's partials in range order, divide once */
    #pragma omp parallel for collapse(2)
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            kv_flash_part *p0 = parts + (size_t)h * S * T + t; /* split 0 */
            for (int s = 1; s < S; s++) kv_flash_merge(p0, p0 + (size_t)s * T, d);
            kv_flash_finish(p0, d, j->out + ((size_t)t * H + h) * d);
        }
    if (st) st->out_bytes += (int64_t)H * T * (2 * (int64_t)S * (d + 2) + d) * 4;
    kv_free(parts);
    kv_free(acc);
    return KV_OK;
}
