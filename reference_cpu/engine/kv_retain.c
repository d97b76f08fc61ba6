/* Chapter 09: "selected set" retention inside the forward pass, CPU reference (kv_retain.h).
 *
 * The state of one (slot, layer, KV head) is a kept list (ascending positions) with one
 * double per entry: the key's squared norm (L2), the mass received (H2O) or the votes of the
 * step (SnapKV). Quest and top-k keep everything and read few: they hold a copy of the keys
 * (fp32, as attention reads them) so that kv_retain_reads() needs no cache, and the CUDA
 * forward can run the same host code over keys it copied back. Every ranking is
 * kv_select.c's, so the tie rules are the ones test_select holds against brute force. */
#include "kv_retain.h"

#include "kv_attention.h"
#include "kv_ops.h"
#include "kv_quant.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Rows of one step attended together before their probabilities are summed, in order. */
#define RETAIN_CHUNK 32

/* ---- the state ---------------------------------------------------------------------------- */

static int keeps_keys(int method) { return method == KV_SELECT_QUEST || method == KV_SELECT_TOPK; }

int kv_retain_create(kv_retain **out, const kv_cache_spec *spec, int n_layers, int n_heads,
                     int n_kv_heads, int d, kv_err *err)
{
    *out = NULL;
    if (n_layers < 1 || n_kv_heads < 1 || n_heads < n_kv_heads || n_heads % n_kv_heads || d < 1)
        return kv_fail(err, KV_ERR_ARG, "kv_retain_create: L %d, H %d, H_kv %d, d %d",
                       n_layers, n_heads, n_kv_heads, d);
    int rc = kv_retain_spec_check("kv_retain_create", spec, n_layers, err);
    if (rc) return rc;
    if (spec->retain.select == KV_SELECT_NONE)
        return kv_fail(err, KV_ERR_ARG, "kv_retain_create: no selection method");
    kv_retain *r = calloc(1, sizeof *r);
    const size_t n_heads_all = (size_t)spec->n_slots * n_layers * n_kv_heads;
    if (r) r->heads = calloc(n_heads_all, sizeof(kv_retain_head));
    if (r && r->heads) r->stats = calloc((size_t)spec->n_slots, sizeof(kv_retain_stats));
    if (!r || !r->heads || !r->stats) {
        kv_retain_free(r);
        return kv_fail(err, KV_ERR_NOMEM, "kv_retain_create: no memory for %zu heads",
                       n_heads_all);
    }
    r->method = spec->retain.select;
    r->n_slots = spec->n_slots;
    r->n_layers = n_layers;
    r->n_kv_heads = n_kv_heads;
    r->head_dim = d;
    r->group = kv_heads_group(n_heads, n_kv_heads);
    r->budget = spec->retain.budget;
    r->ratio = spec->retain.ratio;
    r->window = spec->retain.window;
    r->sinks = spec->retain.sinks;
    r->dense_layers = spec->retain.dense_layers;
    for (size_t i = 0; i < n_heads_all && r->method == KV_SELECT_QUEST; i++)
        kv_select_pages_init(&r->heads[i].pages, KV_SELECT_PAGE, d, NULL);
    *out = r;
    return KV_OK;
}

void kv_retain_free(kv_retain *r)
{
    if (!r) return;
    const size_t n = (size_t)r->n_slots * r->n_layers * r->n_kv_heads;
    for (size_t i = 0; r->heads && i < n; i++) {
        kv_select_set_free(&r->heads[i].kept);
        free(r->heads[i].score);
        kv_select_pages_free(&r->heads[i].pages);
        free(r->heads[i].keys);
    }
    free(r->heads);
    free(r->stats);
    free(r);
}

void kv_retain_reset_slot(kv_retain *r, int slot)
{
    if (!r || slot < 0 || slot >= r->n_slots) return;
    for (int l = 0; l < r->n_layers; l++)
        for (int h = 0; h < r->n_kv_heads; h++) {
            kv_retain_head *hd = kv_retain_at(r, slot, l, h);
            hd->next = 0;
            hd->kept.n = 0;
            hd->pages.n = hd->pages.n_pages = 0; /* the memory stays; pages reopen at 0 */
            hd->step_pos0 = hd->step_n = 0;
        }
    memset(&r->stats[slot], 0, sizeof r->stats[slot]);
}

int kv_retain_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                           kv_err *err)
{
    int rc = kv_cache_create(c, cfg, spec, err);
    if (rc || spec->retain.select == KV_SELECT_NONE) return rc;
    rc = kv_retain_create(&c->retain, spec, c->n_layers, cfg->n_heads, c->n_kv_heads,
                          c->head_dim, err);
    if (rc) kv_cache_free(c);
    return rc;
}

void kv_retain_cache_free(kv_cache *c)
{
    if (!c) return;
    kv_retain_free(c->retain);
    c->retain = NULL;
    kv_cache_free(c);
}

int kv_retain_budget(const kv_retain *r, int n)
{
    return r->budget > 0 ? r->budget : (int)ceil(r->ratio * (double)n);
}

/* A view of fp32 rows [rows][d] in plain memory, so kv_select.c's functions read a key
 * copy as they read a cache (kv_attn_row's fp32 case is a copy of the row). */
static kv_head_view f32_view(const float *rows, int d)
{
    kv_head_view v;
    memset(&v, 0, sizeof v);
    v.fmt = KV_QF_F32;
    v.role = KV_QROLE_KEY;
    v.d = d;
    v.window = 1;
    v.q = INT64_MAX;
    v.codes = (const uint8_t *)(const void *)rows;
    v.scale = 1.0f;
    v.block_shift = -1;
    return v;
}

/* ---- step 1: append ----------------------------------------------------------------------- */

int kv_retain_append(kv_retain *r, int slot, int layer, int kvh, int pos0, int n,
                     const float *krows, kv_err *err)
{
    kv_retain_head *h = kv_retain_at(r, slot, layer, kvh);
    const int d = r->head_dim;
    if (pos0 != h->next || n < 0)
        return kv_fail(err, KV_ERR_ARG, "kv_retain_append: positions %d.. (%d) but (slot %d, "
                       "layer %d, head %d) has seen %d", pos0, n, slot, layer, kvh, h->next);
    const int need = h->kept.n + n;
    if (need > h->kept.cap) { /* kept list and its scores grow together */
        const int cap = need > 2 * h->kept.cap ? need : 2 * h->kept.cap;
        double *s = realloc(h->score, (size_t)cap * sizeof(double));
        if (!s) return kv_fail(err, KV_ERR_NOMEM, "kv_retain_append: %d scores", cap);
        h->score = s;
        int rc = kv_select_set_reserve(&h->kept, cap, err);
        if (rc) return rc;
    }
    if (keeps_keys(r->method) && pos0 + n > h->cap_keys) {
        const int cap = pos0 + n > 2 * h->cap_keys ? pos0 + n : 2 * h->cap_keys;
        float *k = realloc(h->keys, (size_t)cap * d * sizeof(float));
        if (!k) return kv_fail(err, KV_ERR_NOMEM, "kv_retain_append: %d keys", cap);
        h->keys = k;
        h->cap_keys = cap;
    }
    for (int j = 0; j < n; j++) {
        const float *kr = krows + (size_t)j * d; /* [d] */
        double s = 0.0;
        if (r->method == KV_SELECT_L2_LARGE || r->method == KV_SELECT_L2_SMALL)
            for (int i = 0; i < d; i++) s += (double)kr[i] * kr[i]; /* kv_select_key_norms' sum */
        h->kept.pos[h->kept.n] = pos0 + j;
        h->score[h->kept.n++] = s;
    }
    if (keeps_keys(r->method))
        memcpy(h->keys + (size_t)pos0 * d, krows, (size_t)n * d * sizeof(float));
    h->next = pos0 + n;
    h->step_pos0 = pos0;
    h->step_n = n;
    if (r->method == KV_SELECT_QUEST) {
        const kv_head_view kv = f32_view(h->keys, d);
        return kv_select_pages_update(&h->pages, &kv, h->next, err);
    }
    return KV_OK;
}

/* ---- step 2: what a row reads ------------------------------------------------------------- */

/* Union of two ascending lists a [na] and b [nb] into out (room na + nb); returns the count. */
static int merge_union(const int *a, int na, const int *b, int nb, int *out)
{
    int i = 0, j = 0, o = 0;
    while (i < na || j < nb) {
        if (j >= nb || (i < na && a[i] < b[j])) out[o++] = a[i++];
        else if (i >= na || b[j] < a[i]) out[o++] = b[j++];
        else { out[o++] = a[i++]; j++; }
    }
    return o;
}

int kv_retain_reads(kv_retain *r, int slot, int layer, int kvh, int p, const float *q,
                    kv_select_set *out, kv_err *err)
{
    const kv_retain_head *h = kv_retain_at(r, slot, layer, kvh);
    const int d = r->head_dim, G = r->group, B = kv_retain_budget(r, p + 1);
    int rc = kv_select_set_reserve(out, p + 1, err);
    if (rc) return rc;
    if (kv_select_method_evicts(r->method)) { /* the kept positions <= p: a prefix */
        int n = 0;
        while (n < h->kept.n && h->kept.pos[n] <= p) n++;
        memcpy(out->pos, h->kept.pos, (size_t)n * sizeof(int));
        out->n = n;
        return KV_OK;
    }
    if (layer < r->dense_layers) { /* a dense layer reads everything */
        for (int t = 0; t <= p; t++) out->pos[t] = t;
        out->n = p + 1;
        return KV_OK;
    }
    if (r->method == KV_SELECT_QUEST) {
        kv_select_pages pg = h->pages; /* the pages up to p's: a shallow, shortened copy */
        pg.n_pages = p / pg.page + 1;
        int *pages = malloc((size_t)pg.n_pages * sizeof(int)); /* [n_pages] */
        const int np = pages ? kv_select_quest_pages(&pg, q, G, B / KV_SELECT_PAGE, pages) : -1;
        if (np < 0) {
            free(pages);
            return kv_fail(err, KV_ERR_NOMEM, "kv_retain_reads: Quest pages");
        }
        int o = 0;
        for (int i = 0; i < np; i++)
            for (int t = pages[i] * pg.page; t < (pages[i] + 1) * pg.page && t <= p; t++)
                out->pos[o++] = t;
        out->n = o;
        free(pages);
        return KV_OK;
    }
    /* top-k: each head's B best keys among 0 .. p, the union over the group */
    const kv_head_view kv = f32_view(h->keys, d);
    int *one = malloc((size_t)(p + 1) * sizeof(int)); /* [p+1] one head's pick */
    int *tmp = malloc((size_t)(p + 1) * sizeof(int)); /* [p+1] the union so far */
    int n = 0;
    for (int g = 0; one && tmp && g < G; g++) {
        const int m = kv_select_topk_keys(&kv, p + 1, q + (size_t)g * d, B, one);
        if (m < 0) {
            n = -1;
            break;
        }
        n = merge_union(out->pos, n, one, m, tmp);
        memcpy(out->pos, tmp, (size_t)n * sizeof(int));
    }
    free(one);
    free(tmp);
    if (!one || !tmp || n < 0) return kv_fail(err, KV_ERR_NOMEM, "kv_retain_reads: top-k");
    out->n = n;
    return KV_OK;
}

/* ---- step 4: observe ---------------------------------------------------------------------- */

int kv_retain_observe_from(const kv_retain *r, int slot, int layer, int kvh)
{
    const kv_retain_head *h = kv_retain_at(r, slot, layer, kvh);
    if (r->method == KV_SELECT_H2O) return 0;
    if (r->method == KV_SELECT_SNAPKV && h->step_n > r->window) return h->step_n - r->window;
    return h->step_n;
}

void kv_retain_observe(kv_retain *r, int slot, int layer, int kvh, const double *mass)
{
    if (r->method != KV_SELECT_H2O && r->method != KV_SELECT_SNAPKV) return;
    kv_retain_head *h = kv_retain_at(r, slot, layer, kvh);
    for (int i = 0; i < h->kept.n; i++) h->score[i] += mass[i];
}

/* ---- step 5: evict ------------------------------------------------------------------------ */

/* Keep the kept entries marked in keep [kept.n], in order; returns how many went. */
static int compact(kv_retain_head *h, const char *keep)
{
    int o = 0;
    for (int i = 0; i < h->kept.n; i++)
        if (keep[i]) {
            h->kept.pos[o] = h->kept.pos[i];
            h->score[o++] = h->score[i];
        }
    const int gone = h->kept.n - o;
    h->kept.n = o;
    return gone;
}

/* L2: the sinks and the window, then the best B - (their count) norms of the others, ranked by
 * kv_select_topk() over the candidates in position order (kv_select_l2()'s ranking). */
static int evict_l2(const kv_retain *r, kv_retain_head *h)
{
    const int n = h->kept.n, B = kv_retain_budget(r, h->next);
    double *cs = malloc((size_t)(n ? n : 1) * sizeof(double)); /* [n] candidates' norms */
    int *ci = malloc((size_t)(n ? n : 1) * sizeof(int));       /* [n] their kept index */
    int *pick = malloc((size_t)(n ? n : 1) * sizeof(int));     /* [n] chosen candidates */
    char *keep = malloc((size_t)(n ? n : 1));                   /* [n] */
    int gone = -1;
    if (cs && ci && pick && keep) {
        int c = 0, forced = 0;
        for (int i = 0; i < n; i++) {
            const int p = h->kept.pos[i];
            keep[i] = p < r->sinks || p >= h->next - r->window;
            forced += keep[i];
            if (!keep[i]) {
                cs[c] = h->score[i];
                ci[c++] = i;
            }
        }
        const int rest = B - forced > 0 ? B - forced : 0;
        const int m = kv_select_topk(cs, c, rest, r->method == KV_SELECT_L2_LARGE, pick);
        for (int i = 0; i < m; i++) keep[ci[pick[i]]] = 1;
        gone = compact(h, keep);
    }
    free(cs);
    free(ci);
    free(pick);
    free(keep);
    return gone;
}

/* H2O: kv_select_h2o_evict() on the kept list after the sinks (a prefix the state never
 * evicts), seen as an H2O state of budget B - sinks: the lowest mass outside the window
 * goes, equal masses earlier first. */
static int evict_h2o(const kv_retain *r, kv_retain_head *h)
{
    int s0 = 0;
    while (s0 < h->kept.n && h->kept.pos[s0] < r->sinks) s0++;
    kv_select_h2o v;
    memset(&v, 0, sizeof v);
    v.budget = kv_retain_budget(r, h->next) - s0;
    v.window = r->window;
    v.next = h->next;
    v.n = h->kept.n - s0;
    v.cap = h->kept.cap - s0;
    v.pos = h->kept.pos + s0;
    v.mass = h->score + s0;
    const int gone = kv_select_h2o_evict(&v, NULL);
    if (gone > 0) h->kept.n = s0 + v.n;
    return gone;
}

/* SnapKV after a prompt step: the votes of the kept entries before the window (after the
 * sinks), max-pooled along the kept list and ranked by kv_select_snapkv_pick(); then the
 * votes start again from zero for the next prompt step. */
static int evict_snapkv(const kv_retain *r, kv_retain_head *h, kv_err *err)
{
    if (h->step_n <= r->window) return 0; /* a decode step (or a short one) evicts nothing */
    const int n = h->kept.n, W = r->window;
    int s0 = 0;
    while (s0 < n && h->kept.pos[s0] < r->sinks) s0++;
    const int n_prefix = n - W; /* the window is the step's last W positions: kept's last W */
    if (s0 > n_prefix) s0 = n_prefix; /* sinks inside the window: kept as the window */
    kv_select_set sel = {0};
    char *keep = calloc((size_t)(n ? n : 1), 1); /* [n] */
    int gone = -1;
    if (keep &&
        kv_select_snapkv_pick(h->score + s0, n_prefix - s0, W, KV_RETAIN_SNAPKV_KERNEL,
                              kv_retain_budget(r, h->next) - s0, &sel, err) == KV_OK) {
        for (int i = 0; i < s0; i++) keep[i] = 1;
        for (int i = 0; i < sel.n; i++) keep[s0 + sel.pos[i]] = 1;
        gone = compact(h, keep);
        for (int i = 0; i < h->kept.n; i++) h->score[i] = 0.0;
    }
    kv_select_set_free(&sel);
    free(keep);
    return gone;
}

int kv_retain_step_end(kv_retain *r, int slot, int layer, int kvh)
{
    kv_retain_head *h = kv_retain_at(r, slot, layer, kvh);
    int gone = 0;
    switch (r->method) {
    case KV_SELECT_L2_LARGE: case KV_SELECT_L2_SMALL: gone = evict_l2(r, h); break;
    case KV_SELECT_H2O: gone = evict_h2o(r, h); break;
    case KV_SELECT_SNAPKV: gone = evict_snapkv(r, h, NULL); break;
    default: break; /* Quest, top-k: nothing leaves */
    }
    h->step_n = 0;
    return gone;
}

/* ---- steps 1-5 in the forward pass -------------------------------------------------------- */

/* Scratch of one thread: a row's read list, its probabilities, a dequantized row. */
typedef struct {
    kv_select_set set;
    float *att; /* [cap] */
    float *row; /* [d] */
    int cap;
} worker;

/* One KV head of one step: append, then rows in chunks of RETAIN_CHUNK attended in parallel
 * (each row alone: the bits do not depend on the thread count), each chunk's probabilities
 * then added to the mass in row order, heads g = 0 .. G-1 within a row, then observe and
 * evict. q, out [n][H][d]. Adds to *st. */
static int attend_head(kv_cache *c, int layer, int slot, int kvh, int pos0, int n,
                       const float *q, float *out, kv_retain_stats *st, kv_err *err)
{
    kv_retain *r = c->retain;
    const int d = c->head_dim, G = r->group, H = G * c->n_kv_heads;
    const kv_head_view kh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(c, layer, slot, kvh, KV_QROLE_VALUE);
    float *krows = malloc((size_t)(n ? n : 1) * d * sizeof(float)); /* [n][d] new keys */
    if (!krows) return kv_fail(err, KV_ERR_NOMEM, "kv_retain_attend: %d key rows", n);
    for (int j = 0; j < n; j++) kv_attn_row(&kh, (int64_t)pos0 + j, krows + (size_t)j * d);
    int rc = kv_retain_append(r, slot, layer, kvh, pos0, n, krows, err);
    free(krows);
    if (rc) return rc;

    kv_retain_head *h = kv_retain_at(r, slot, layer, kvh);
    const int from = kv_retain_observe_from(r, slot, layer, kvh), cap = h->next;
    double *mass = calloc((size_t)(h->kept.n ? h->kept.n : 1), sizeof(double)); /* [kept] */
    float *probs = malloc((size_t)RETAIN_CHUNK * G * cap * sizeof(float)); /* [chunk][G][cap] */
    int *counts = malloc((size_t)RETAIN_CHUNK * sizeof(int)); /* [chunk] list length per row */
    const int nt = omp_get_max_threads();
    worker *wk = calloc((size_t)nt, sizeof(worker)); /* [threads] */
    int fail = !mass || !probs || !counts || !wk;
    for (int t = 0; !fail && t < nt; t++) {
        wk[t].att = malloc((size_t)cap * sizeof(float));
        wk[t].row = malloc((size_t)d * sizeof(float));
        wk[t].cap = cap;
        fail = !wk[t].att || !wk[t].row;
    }
    if (fail) rc = kv_fail(err, KV_ERR_NOMEM, "kv_retain_attend: scratch for %d positions", cap);
    int64_t read = 0, full = 0;
    for (int j0 = 0; !rc && j0 < n; j0 += RETAIN_CHUNK) {
        const int jn = n - j0 < RETAIN_CHUNK ? n - j0 : RETAIN_CHUNK;
        int bad = 0;
        const int64_t work = (int64_t)jn * G * cap * d;
        #pragma omp parallel for schedule(dynamic) reduction(| : bad) if (kv_parallel_worth(work))
        for (int jj = 0; jj < jn; jj++) {
            worker *w = &wk[omp_get_thread_num()];
            const int j = j0 + jj, p = pos0 + j;
            const float *qg = q + ((size_t)j * H + (size_t)kvh * G) * d; /* [G][d] */
            if (kv_retain_reads(r, slot, layer, kvh, p, qg, &w->set, NULL)) {
                bad = 1;
                continue;
            }
            counts[jj] = w->set.n;
            for (int g = 0; g < G; g++) {
                float *att = j >= from ? probs + ((size_t)jj * G + g) * cap : w->att;
                kv_select_attend(&kh, &vh, &w->set, qg + (size_t)g * d,
                                 out + ((size_t)j * H + (size_t)kvh * G + g) * d, att, w->row);
            }
        }
        if (bad) {
            rc = kv_fail(err, KV_ERR_NOMEM, "kv_retain_attend: read lists");
            break;
        }
        /* the documented order: rows in order, heads in order, each probability into a
         * double; an evicting method's list is a prefix of the kept list, index for index */
        for (int jj = 0; jj < jn; jj++) {
            const int p = pos0 + j0 + jj;
            read += counts[jj];
            full += p + 1;
            if (j0 + jj < from)
                continue;
            for (int g = 0; g < G; g++) {
                const float *pr = probs + ((size_t)jj * G + g) * cap;
                for (int i = 0; i < counts[jj]; i++) mass[i] += pr[i];
            }
        }
    }
    if (!rc) {
        kv_retain_observe(r, slot, layer, kvh, mass);
        const int gone = kv_retain_step_end(r, slot, layer, kvh);
        if (gone < 0) rc = kv_fail(err, KV_ERR_NOMEM, "kv_retain_attend: eviction scratch");
        else st->evicted += gone;
        st->rows_read += read;
        st->rows_full += full;
    }
    for (int t = 0; wk && t < nt; t++) {
        kv_select_set_free(&wk[t].set);
        free(wk[t].att);
        free(wk[t].row);
    }
    free(wk);
    free(mass);
    free(probs);
    free(counts);
    return rc;
}

int kv_retain_attend(kv_cache *c, int layer, int slot, int pos0, int n, const float *q,
                     float *out, kv_err *err)
{
    if (!c || !c->retain)
        return kv_fail(err, KV_ERR_ARG, "kv_retain_attend: the cache has no selection state");
    /* heads one after another, each one's rows over the threads: a KV head's rows share its
     * kept list, and recall models have a single KV head */
    for (int kvh = 0; kvh < c->n_kv_heads; kvh++) {
        const int rc = attend_head(c, layer, slot, kvh, pos0, n, q, out,
                                   &c->retain->stats[slot], err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* ---- bytes -------------------------------------------------------------------------------- */

int kv_retain_bytes(const kv_retain *r, const kv_cache_spec *spec, int slot,
                    kv_select_bytes *out, kv_err *err)
{
    memset(out, 0, sizeof *out);
    if (!r || slot < 0 || slot >= r->n_slots)
        return kv_fail(err, KV_ERR_ARG, "kv_retain_bytes: slot %d", slot);
    for (int l = 0; l < r->n_layers; l++)
        for (int h = 0; h < r->n_kv_heads; h++) {
            kv_select_bytes b;
            const int rc = kv_select_bytes_kept(kv_cache_spec_layer_dtype(spec, l), r->head_dim,
                                                kv_retain_at(r, slot, l, h)->kept.n, &b, err);
            if (rc) return rc;
            out->rows += b.rows;
            out->code_bytes += b.code_bytes;
            out->meta_bytes += b.meta_bytes;
            out->index_bytes += b.index_bytes;
            out->total += b.total;
        }
    return KV_OK;
}
