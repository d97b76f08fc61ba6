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
    pthread_t thread[KV_TP_MAX_RANKS];
    int n_threads;           /* rank threads started; -1 before the locks exist */
    pthread_mutex_t mu;      /* guards gen, running, quit */
    pthread_cond_t go, idle; /* a new step (or quit) for the ranks; the last rank finished */
    int64_t gen;             /* steps handed out */
    int running;             /* ranks still in the current step */
    int quit;
    pthread_barrier_t reduce; /* the p ranks, inside all_reduce() */
    /* the step being run, set by the caller before it wakes the ranks */
    const kv_seq *seqs;      /* [n_seqs] rank 0's view */
    kv_seq *quiet;           /* [n_seqs] the other ranks' view: no all_logits */
    int n_seqs, max_seqs;
    float *logits;
    kv_counters *cnt;
    int rc[KV_TP_MAX_RANKS];
    kv_err err[KV_TP_MAX_RANKS];
    int reduces_done[KV_TP_MAX_RANKS]; /* all-reduces rank r joined this step */
    /* all-reduce buffers */
    float *part[KV_TP_MAX_RANKS]; /* rank r's partial sums [n], NULL: contributes nothing */
    float *sum;              /* [max_floats] the reduced result, chunk r written by rank r */
    int64_t max_floats;
    int64_t n_floats;        /* T·dim of the step being run: what every all-reduce sums */
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

typedef struct {
    kv_tp *g;
    int rank;
} rank_arg;

static void run_rank(kv_tp *g, int r)
{
    g->reduces_done[r] = 0;
    const int lead = r == 0; /* rank 0 returns the logits and counts the work */
    g->rc[r] = kv_forward_shard(g->m, &g->cache[r], &g->state[r], &g->shard[r],
                                lead ? g->seqs : g->quiet, g->n_seqs, lead ? g->logits : NULL,
                                lead ? g->cnt : NULL, &g->err[r]);
    /* a failed rank keeps joining the all-reduces it owes, or the others would wait forever */
    while (g->reduces_done[r] < 2 * g->m->config.n_layers)
        all_reduce(&g->shard[r], NULL, g->n_floats);
}

/* A rank thread: wait for a new step (gen moves on), run it, report it done. */
static void *rank_main(void *arg)
{
    rank_arg a = *(rank_arg *)arg;
    free(arg);
    kv_tp *g = a.g;
    omp_set_num_threads(g->threads_per_rank); /* this thread's own ops */
    int64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen && !g->quit) pthread_cond_wait(&g->go, &g->mu);
        seen = g->gen;
        const int quit = g->quit;
        pthread_mutex_unlock(&g->mu);
        if (quit) break;
        run_rank(g, a.rank);
        pthread_mutex_lock(&g->mu);
        if (--g->running == 0) pthread_cond_signal(&g->idle);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

/* Run the step set up in g on every rank and wait for all of them. Rank 0 runs on the
 * calling thread (one wake-up fewer per step; none at all for p = 1), with its OpenMP
 * thread count set to the rank's share for the step and restored after. */
static void run_step(kv_tp *g)
{
    pthread_mutex_lock(&g->mu);
    g->running = g->p - 1;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    const int caller_threads = omp_get_max_threads();
    omp_set_num_threads(g->threads_per_rank);
    run_rank(g, 0);
    omp_set_num_threads(caller_threads);
    pthread_mutex_lock(&g->mu);
    while (g->running > 0) pthread_cond_wait(&g->idle, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the group -------------------------------------------------------------------------- */

void kv_tp_destroy(kv_tp *g)
{
    if (!g) return;
    if (g->n_threads >= 0) {
        pthread_mutex_lock(&g->mu);
        g->quit = 1;
        pthread_cond_broadcast(&g->go);
        pthread_mutex_unlock(&g->mu);
        for (int r = 0; r < g->n_threads; r++) pthread_join(g->thread[r], NULL);
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->go);
        pthread_cond_destroy(&g->idle);
        pthread_barrier_destroy(&g->reduce);
    }
    for (int r = 0; r < g->p; r++) {
        kv_cache_free(&g->cache[r]);
        kv_state_free(&g->state[r]);
    }
    kv_free(g->sum);
    free(g->quiet);
    free(g);
}

int kv_tp_create(kv_tp **out, const kv_model *m, int p, const kv_cache_spec *spec, kv_err *err)
{
    if (!out || !m || !spec) return kv_fail(err, KV_ERR_ARG, "kv_tp_create: NULL argument");
    *out = NULL;
    int rc = kv_tp_check(&m->config, p, err);
    if (rc) return rc;
    if (spec->layout.kind == KV_LAYOUT_PAGED)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_tp_create: a paged cache is not supported "
                       "(every rank's block tables would have to move in step); use contiguous");
    if (spec->retain.select != 0)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kv_tp_create: selected-set retention "
                       "(chapter 09) is not supported with tensor-parallel ranks");
    kv_tp *g = calloc(1, sizeof *g);
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "kv_tp_create: out of memory");
    g->m = m;
    g->p = p;
    g->spec = *spec;
    g->n_threads = -1;
    /* the ranks are the parallelism: each rank's own ops get its share of the cores, so p
     * ranks on c cores run c threads in all (one OpenMP team per rank would run p·c) */
    const int cores = omp_get_max_threads();
    g->threads_per_rank = cores / p > 1 ? cores / p : 1;
    for (int r = 0; r < p; r++) {
        kv_tp_shard_of(&m->config, p, r, &g->shard[r]);
        g->shard[r].all_reduce = all_reduce;
        g->shard[r].ctx = g;
        kv_state_init(&g->state[r]);
        kv_config shape = m->config; /* the rank's cache: its KV heads only */
        shape.n_kv_heads = g->shard[r].n_kv_heads;
        rc = kv_cache_create(&g->cache[r], &shape, spec, err);
        if (rc) {
            g->p = r; /* free the caches made so far */
            kv_tp_destroy(g);
            return rc;
        }
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->idle, NULL);
    pthread_barrier_init(&g->reduce, NULL, (unsigned)p);
    g->n_threads = 0; /* thread[i] runs rank i + 1 */
    for (int r = 1; r < p; r++) {
        rank_arg *a = malloc(sizeof *a);
        if (a) *a = (rank_arg){g, r};
        if (!a || pthread_create(&g->thread[r - 1], NULL, rank_main, a) != 0) {
            free(a);
            kv_tp_destroy(g); /* the started ranks are waiting for a step: quit reaches them */
            return kv_fail(err, KV_ERR_NOMEM, "kv_tp_create: could not start rank thread %d "
                           "of %d", r, p);
        }
        g->n_threads++;
    }
    *out = g;
    return KV_OK;
}

int kv_tp_forward(kv_tp *g, const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                  kv_err *err)
{
    if (!g) return kv_fail(err, KV_ERR_ARG, "kv_tp_forward: NULL group");
    /* refuse a bad step here, once, before any rank touches its cache */
    kv_config shape = g->m->config;
    shape.n_kv_heads = g->shard[0].n_kv_heads;
    const kv_cache *c0 = &g->cache[0];
    int T = 0;
    int rc = kv_batch_check("kv_tp_forward", &shape, &c0->spec, c0->n_layers, c0->n_kv_heads,
                            c0->head_dim, c0->len, seqs, n_seqs, &T, err);
    if (rc) return rc;
    const int64_t n = (int64_t)T * g->m->config.dim; /* floats each all-reduce sums */
    if (n > g->max_floats) {
        float *sum = kv_calloc((size_t)n * sizeof(float));
        if (!sum)
            return kv_fail(err, KV_ERR_NOMEM, "kv_tp_forward: all-reduce buffer of %lld floats",
                           (long long)n);
        kv_free(g->sum);
        g->sum = sum;
        g->max_floats = n;
    }
    if (n_seqs > g->max_seqs) {
        kv_seq *q = realloc(g->quiet, sizeof(kv_seq) * (size_t)n_seqs);
        if (!q) return kv_fail(err, KV_ERR_NOMEM, "kv_tp_forward: out of memory");
        g->quiet = q;
        g->max_seqs = n_seqs;
    }
    /* ranks other than 0 compute no logits: they would write the same rows again */
    for (int i = 0; i < n_seqs; i++) {
        g->quiet[i] = seqs[i];
        g->quiet[i].all_logits = NULL;
    }
    g->seqs = seqs;
    g->n_seqs = n_seqs;
    g->logits = logits;
    g->cnt = cnt;
    g->n_floats = n;
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
    kv_backend *b = calloc(1, sizeof *b);
    if (!b) return kv_fail(err, KV_ERR_NOMEM, "kv_tp_backend: out of memory");
    kv_tp *g = NULL;
    int rc = kv_tp_create(&g, m, p, spec, err);
    if (rc) {
        free(b);
        return rc;
    }
    b->name = "cpu-tp";
    b->config = &m->config;
    b->spec = *spec;
    b->impl = g;
    b->forward = tp_forward;
    b->reset = tp_reset;
    b->length = tp_length;
    b->destroy = tp_destroy;
    b->rollback = &tp_rollback;
    *out = b;
    return KV_OK;
}

kv_tp *kv_tp_of_backend(kv_backend *b)
{
    return b && b->forward == tp_forward ? b->impl : NULL;
}
