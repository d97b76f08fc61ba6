/* Tensor-parallel heads on the CPU (kv_tp.h): p rank threads, one forward pass.
 *
 * Every rank runs kv_forward_shard() over its own shard and cache; the only place ranks meet
 * is all_reduce() below, twice per layer. Rank 0 runs on the caller's thread, ranks 1..p-1
 * on threads of their own that wait for a step (a condition variable) and report it done; the
 * all-reduce uses a barrier of the p ranks.
 *
 * Threads, not an OpenMP team per rank: a rank stands for a device, and its own ops may still
 * use OpenMP, with the cores shared out (threads_per_rank) so p ranks do not run p teams on
 * the same cores. */
#define _POSIX_C_SOURCE 200809L
#include "kv_tp.h"
#include "kv_heads.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct kv_tp {
    const kv_model *m;
    int p;                   /* ranks */
    int threads_per_rank;    /* OpenMP threads each rank's own ops may use */
    kv_cache_spec spec;
    kv_cache cache[KV_TP_MAX_RANKS];  /* rank r's KV heads only */
    kv_state state[KV_TP_MAX_RANKS];
    kv_shard shard[KV_TP_MAX_RANKS];
    kv_tp_threads threads;   /* ranks 1 .. p-1 (rank 0 runs on the caller's thread) */
    int barrier_live;        /* reduce exists */
    pthread_barrier_t reduce; /* the p ranks, inside all_reduce() */
    kv_tp_step step;         /* the step being run, set before the ranks wake */
    int rc[KV_TP_MAX_RANKS];
    kv_err err[KV_TP_MAX_RANKS];
    int reduces_done[KV_TP_MAX_RANKS]; /* all-reduces rank r joined this step */
    /* all-reduce buffers */
    float *part[KV_TP_MAX_RANKS]; /* rank r's partial sums [n], NULL: contributes nothing */
    float *sum;              /* [max_floats] the reduced result, chunk r written by rank r */
    int64_t max_floats;
    kv_tp_stats stats;
};

/* ---- shards ----------------------------------------------------------------------------- */

int kv_tp_check(const kv_config *cfg, int p, kv_err *err)
{
    const int H = cfg->n_heads, Hkv = cfg->n_kv_heads;
    if (cfg->attn != KV_ATTN_GQA) return kv_config_require_gqa(cfg, "kv_tp", err); /* ch. 11 */
    if (p < 1 || p > KV_TP_MAX_RANKS)
        return kv_fail(err, KV_ERR_ARG, "kv_tp: %d ranks (need 1 .. %d)", p, KV_TP_MAX_RANKS);
    if (H % p)
        return kv_fail(err, KV_ERR_ARG, "kv_tp: %d ranks do not divide the %d query heads", p, H);
    if (p <= Hkv ? Hkv % p : p % Hkv)
        return kv_fail(err, KV_ERR_ARG, "kv_tp: %d ranks and %d KV heads: one must divide the "
                       "other (each rank needs whole KV heads, or whole copies of one)", p, Hkv);
    if (cfg->hidden_dim < p)
        return kv_fail(err, KV_ERR_ARG, "kv_tp: %d ranks but only %d MLP hidden units", p,
                       cfg->hidden_dim);
    return KV_OK;
}

void kv_tp_shard_of(const kv_config *cfg, int p, int rank, kv_shard *sh)
{
    const int H = cfg->n_heads, Hkv = cfg->n_kv_heads, G = kv_heads_group(H, Hkv);
    memset(sh, 0, sizeof *sh);
    sh->rank = rank;
    sh->n_q_heads = H / p;
    sh->q_head0 = rank * sh->n_q_heads;
    if (p <= Hkv) { /* whole KV heads: the ones rank r's query heads read */
        sh->n_kv_heads = Hkv / p;
        sh->kv_head0 = rank * sh->n_kv_heads;
    } else {        /* H/p divides G: all of r's query heads read KV head q_head0 / G */
        sh->n_kv_heads = 1;
        sh->kv_head0 = sh->q_head0 / G;
    }
    /* hidden units in p near-equal runs (hidden need not be a multiple of p) */
    const int64_t F = cfg->hidden_dim;
    sh->hidden0 = (int)(F * rank / p);
    sh->n_hidden = (int)(F * (rank + 1) / p) - sh->hidden0;
}

double kv_tp_ring_bytes(int p, double n) { return 2.0 * (p - 1) / p * n * 4.0; }

int kv_tp_check_group(const char *who, const kv_config *cfg, int p, const kv_cache_spec *spec,
                      kv_err *err)
{
    int rc = kv_tp_check(cfg, p, err);
    if (rc) return rc;
    if (spec->layout.kind == KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: a paged cache is not supported (every "
                       "rank's block tables would have to move in step); use contiguous", who);
    if (spec->retain.select != 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "%s: selected-set retention (chapter 09) is not "
                       "supported with tensor-parallel ranks", who);
    return KV_OK;
}

void kv_tp_rank_setup(const kv_config *cfg, int p, int rank,
                      void (*all_reduce)(const kv_shard *sh, float *x, int64_t n), void *ctx,
                      kv_shard *sh, kv_config *cache_cfg)
{
    kv_tp_shard_of(cfg, p, rank, sh);
    sh->all_reduce = all_reduce;
    sh->ctx = ctx;
    *cache_cfg = *cfg;
    cache_cfg->n_kv_heads = sh->n_kv_heads;
}

/* ---- a step, and the rank threads ------------------------------------------------------- */

int kv_tp_step_begin(kv_tp_step *s, const char *who, const kv_config *cfg, const kv_shard *sh0,
                     const kv_cache *c0, const kv_seq *seqs, int n_seqs, float *logits,
                     kv_counters *cnt, kv_err *err)
{
    int T = 0;
    int rc = kv_batch_check(who, cfg, sh0, c0, seqs, n_seqs, &T, err);
    if (rc) return rc;
    if (n_seqs > s->max_seqs) {
        kv_seq *q = realloc(s->quiet, sizeof(kv_seq) * (size_t)n_seqs);
        if (!q) return kv_fail(err, KV_ERR_NOMEM, "%s: out of memory", who);
        s->quiet = q;
        s->max_seqs = n_seqs;
    }
    for (int i = 0; i < n_seqs; i++) { /* ranks other than 0 would write the same rows again */
        s->quiet[i] = seqs[i];
        s->quiet[i].all_logits = NULL;
    }
    s->seqs = seqs;
    s->n_seqs = n_seqs;
    s->logits = logits;
    s->cnt = cnt;
    s->n_floats = (int64_t)T * cfg->dim;
    return KV_OK;
}

/* A rank thread: wait for a new step (gen moves on), run it, report it done. */
static void *rank_main(void *arg)
{
    const kv_tp_thread_arg *a = arg;
    kv_tp_threads *t = a->t;
    if (t->enter) t->enter(t->ctx, a->rank);
    int64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (t->gen == seen && !t->quit) pthread_cond_wait(&t->go, &t->mu);
        seen = t->gen;
        const int quit = t->quit;
        pthread_mutex_unlock(&t->mu);
        if (quit) break;
        t->run(t->ctx, a->rank);
        pthread_mutex_lock(&t->mu);
        if (--t->running == 0) pthread_cond_signal(&t->idle);
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

int kv_tp_threads_start(kv_tp_threads *t, int first, int last, void (*run)(void *ctx, int rank),
                        void (*enter)(void *ctx, int rank), void *ctx, const char *who,
                        kv_err *err)
{
    t->run = run;
    t->enter = enter;
    t->ctx = ctx;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->idle, NULL);
    t->live = 1;
    for (int r = first; r < last; r++) {
        kv_tp_thread_arg *a = &t->arg[t->n_threads];
        *a = (kv_tp_thread_arg){t, r};
        if (pthread_create(&t->thread[t->n_threads], NULL, rank_main, a) != 0) {
            kv_tp_threads_stop(t); /* the started ranks are waiting for a step: quit reaches them */
            return kv_fail(err, KV_ERR_NOMEM, "%s: could not start rank thread %d of %d", who,
                           r, last);
        }
        t->n_threads++;
    }
    return KV_OK;
}

void kv_tp_threads_go(kv_tp_threads *t)
{
    pthread_mutex_lock(&t->mu);
    t->running = t->n_threads;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
}

void kv_tp_threads_wait(kv_tp_threads *t)
{
    pthread_mutex_lock(&t->mu);
    while (t->running > 0) pthread_cond_wait(&t->idle, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void kv_tp_threads_stop(kv_tp_threads *t)
{
    if (!t->live) return;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n_threads; i++) pthread_join(t->thread[i], NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->idle);
    t->live = 0;
    t->n_threads = 0;
}

/* ---- the all-reduce --------------------------------------------------------------------- */

/* Every rank calls this at the same point with its partial sums x [n] (NULL: a rank whose
 * step failed, still joining so the others are not left waiting; it adds nothing).
 *   1. publish x, barrier;
 *   2. reduce-scatter: rank r adds chunk r = [r·n/p, (r+1)·n/p) of every rank's x in rank
 *      order 0..p-1 into sum (each element's additions in one fixed order: every rank gets
 *      the same bits, and p = 1 gives x itself), barrier;
 *   3. all-gather: every rank copies sum into its x.
 * No third barrier: sum and the published pointers are next written after the next call's
 * first barrier, which no rank passes before every rank has finished copying. */
static void all_reduce(const kv_shard *sh, float *x, int64_t n)
{
    kv_tp *g = sh->ctx;
    const int p = g->p, r = sh->rank;
    g->part[r] = x;
    pthread_barrier_wait(&g->reduce);
    const int64_t lo = n * r / p, hi = n * (r + 1) / p;
    int first = 1;
    for (int q = 0; q < p; q++) {
        const float *src = g->part[q];
        if (!src) continue;
        if (first)
            for (int64_t i = lo; i < hi; i++) g->sum[i] = src[i];
        else
            for (int64_t i = lo; i < hi; i++) g->sum[i] += src[i];
        first = 0;
    }
    if (first) memset(g->sum + lo, 0, (size_t)(hi - lo) * sizeof(float));
    pthread_barrier_wait(&g->reduce);
    if (x) memcpy(x, g->sum, (size_t)n * sizeof(float));
    /* bytes read from the other ranks: their p-1 partials of my chunk, then the n - chunk
     * sums they wrote; 2·(p-1)/p·n·4 when p divides n */
    g->stats.rank_bytes[r] += (double)((p - 1) * (hi - lo) + (n - (hi - lo))) * sizeof(float);
    if (r == 0) {
        g->stats.all_reduces++;
        g->stats.reduced_floats += (double)n;
    }
    g->reduces_done[r]++;
}

/* ---- the ranks -------------------------------------------------------------------------- */

static void run_rank(void *ctx, int r)
{
    kv_tp *g = ctx;
    const kv_tp_step *s = &g->step;
    g->reduces_done[r] = 0;
    const int lead = r == 0; /* rank 0 returns the logits and counts the work */
    g->rc[r] = kv_forward_shard(g->m, &g->cache[r], &g->state[r], &g->shard[r],
                                lead ? s->seqs : s->quiet, s->n_seqs, lead ? s->logits : NULL,
                                lead ? s->cnt : NULL, &g->err[r]);
    /* a failed rank keeps joining the all-reduces it owes, or the others would wait forever */
    while (g->reduces_done[r] < 2 * g->m->config.n_layers)
        all_reduce(&g->shard[r], NULL, s->n_floats);
}

/* A rank thread's own ops get the rank's share of the cores. */
static void enter_rank(void *ctx, int r)
{
    (void)r;
    omp_set_num_threads(((kv_tp *)ctx)->threads_per_rank);
}

/* Run the step set up in g on every rank and wait for all of them. Rank 0 runs on the
 * calling thread (one wake-up fewer per step; none at all for p = 1), with its OpenMP
 * thread count set to the rank's share for the step and restored after. */
static void run_step(kv_tp *g)
{
    kv_tp_threads_go(&g->threads);
    const int caller_threads = omp_get_max_threads();
    omp_set_num_threads(g->threads_per_rank);
    run_rank(g, 0);
    omp_set_num_threads(caller_threads);
    kv_tp_threads_wait(&g->threads);
}

/* ---- the group -------------------------------------------------------------------------- */

void kv_tp_destroy(kv_tp *g)
{
    if (!g) return;
    kv_tp_threads_stop(&g->threads);
    if (g->barrier_live) pthread_barrier_destroy(&g->reduce);
    for (int r = 0; r < g->p; r++) {
        kv_cache_free(&g->cache[r]);
        kv_state_free(&g->state[r]);
    }
    kv_free(g->sum);
    free(g->step.quiet);
    free(g);
}

int kv_tp_create(kv_tp **out, const kv_model *m, int p, const kv_cache_spec *spec, kv_err *err)
{
    if (!out || !m || !spec) return kv_fail(err, KV_ERR_ARG, "kv_tp_create: NULL argument");
    *out = NULL;
    int rc = kv_tp_check_group("kv_tp_create", &m->config, p, spec, err);
    if (rc) return rc;
    kv_tp *g = calloc(1, sizeof *g);
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "kv_tp_create: out of memory");
    g->m = m;
    g->p = p;
    g->spec = *spec;
    /* the ranks are the parallelism: each rank's own ops get its share of the cores, so p
     * ranks on c cores run c threads in all (one OpenMP team per rank would run p·c) */
    const int cores = omp_get_max_threads();
    g->threads_per_rank = cores / p > 1 ? cores / p : 1;
    for (int r = 0; r < p; r++) {
        kv_config shape; /* the rank's cache: its KV heads only */
        kv_tp_rank_setup(&m->config, p, r, all_reduce, g, &g->shard[r], &shape);
        kv_state_init(&g->state[r]);
        rc = kv_cache_create(&g->cache[r], &shape, spec, err);
        if (rc) {
            g->p = r; /* free the caches made so far */
            kv_tp_destroy(g);
            return rc;
        }
    }
    pthread_barrier_init(&g->reduce, NULL, (unsigned)p);
    g->barrier_live = 1;
    rc = kv_tp_threads_start(&g->threads, 1, p, run_rank, enter_rank, g, "kv_tp_create", err);
    if (rc) {
        kv_tp_destroy(g);
        return rc;
    }
    *out = g;
    return KV_OK;
}

int kv_tp_forward(kv_tp *g, const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                  kv_err *err)
{
    if (!g) return kv_fail(err, KV_ERR_ARG, "kv_tp_forward: NULL group");
    /* a bad step is refused here, once, before any rank touches its cache */
    int rc = kv_tp_step_begin(&g->step, "kv_tp_forward", &g->m->config, &g->shard[0],
                              &g->cache[0], seqs, n_seqs, logits, cnt, err);
    if (rc) return rc;
    const int64_t n = g->step.n_floats; /* floats each all-reduce sums */
    if (n > g->max_floats) {
        float *sum = kv_calloc((size_t)n * sizeof(float));
        if (!sum)
            return kv_fail(err, KV_ERR_NOMEM, "kv_tp_forward: all-reduce buffer of %lld floats",
                           (long long)n);
        kv_free(g->sum);
        g->sum = sum;
        g->max_floats = n;
    }
    run_step(g);
    for (int r = 0; r < g->p; r++)
        if (g->rc[r]) {
            if (err) *err = g->err[r];
            return g->rc[r];
        }
    g->stats.steps++;
    return KV_OK;
}

void kv_tp_reset(kv_tp *g, int slot)
{
    for (int r = 0; r < g->p; r++) kv_cache_reset(&g->cache[r], slot);
}

int kv_tp_ranks(const kv_tp *g) { return g->p; }
const kv_cache *kv_tp_cache(const kv_tp *g, int r) { return &g->cache[r]; }
const kv_shard *kv_tp_shard(const kv_tp *g, int r) { return &g->shard[r]; }
const kv_tp_stats *kv_tp_get_stats(const kv_tp *g) { return &g->stats; }

/* ---- as a backend ------------------------------------------------------------------------- */

static int tp_forward(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                      kv_counters *cnt, kv_err *err)
{
    return kv_tp_forward(b->impl, seqs, n_seqs, logits, cnt, err);
}

static void tp_reset(kv_backend *b, int slot) { kv_tp_reset(b->impl, slot); }

static int tp_length(kv_backend *b, int slot)
{
    const kv_cache *c = &((kv_tp *)b->impl)->cache[0];
    return (slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

static int tp_truncate(kv_backend *b, int slot, int len, kv_err *err)
{
    kv_tp *g = b->impl;
    for (int r = 0; r < g->p; r++) {
        int rc = kv_cache_truncate(&g->cache[r], slot, len, err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* Every rank arms its own shard's undo log: a windowed or KIVI cache rolls back on each. */
static int tp_speculate(kv_backend *b, int slot, int max_tokens, kv_err *err)
{
    kv_tp *g = b->impl;
    for (int r = 0; r < g->p; r++) {
        int rc = kv_cache_speculate(&g->cache[r], slot, max_tokens, err);
        if (rc) return rc;
    }
    return KV_OK;
}

static const kv_rollback tp_rollback = {tp_truncate, tp_speculate};

static void tp_destroy(kv_backend *b)
{
    kv_tp_destroy(b->impl);
    free(b);
}

int kv_tp_backend(kv_backend **out, const kv_model *m, int p, const kv_cache_spec *spec,
                  kv_err *err)
{
    if (!out) return kv_fail(err, KV_ERR_ARG, "kv_tp_backend: NULL argument");
    *out = NULL;
    kv_tp *g = NULL;
    int rc = kv_tp_create(&g, m, p, spec, err);
    if (!rc)
        rc = kv_backend_new(out, "cpu-tp", &m->config, spec, g, tp_forward, tp_reset, tp_length,
                            tp_destroy, err);
    if (rc) kv_tp_destroy(g); /* NULL is fine */
    else (*out)->rollback = &tp_rollback;
    return rc;
}

kv_tp *kv_tp_of_backend(kv_backend *b)
{
    return b && b->forward == tp_forward ? b->impl : NULL;
}
