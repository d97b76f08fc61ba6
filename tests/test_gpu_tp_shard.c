/* Chapter 10 on one device: kvcu_forward_shard(), the GPU twin of kv_forward_shard(), with p
 * ranks sharing one GPU (or the emulation), so it runs without a second device.
 *
 * Each rank has its own kvcu_cache holding its KV heads (kv_tp_shard_of(): H_kv/p heads, or
 * one head replicated on p/H_kv ranks when p > H_kv) and its own scratch, over one uploaded
 * model. The ranks are threads that take turns on the device (a mutex, the "baton", held
 * whenever a rank launches work); the all_reduce hook downloads the rank's device partial
 * sums, waits at a barrier for every rank, rank 0 adds them on the host in rank order (the CPU
 * group's order, kv_tp.c), and after a second barrier every rank uploads the sum.
 *
 * Predicted before measured:
 *  - p = 1: the hook uploads the partial it downloaded, so the shard is kvcu_forward() bit for
 *    bit (emulation and device alike): same logits every step, same cache bytes;
 *  - p > 1: the sum is the rank-order sum kv_tp.c forms, of partials that differ from the
 *    CPU's only in the order inside each dot product, so the logits match the CPU group of
 *    the same p (kv_tp) and the GPU's p = 1 within the fp32 reduction-order tolerance of
 *    kv_test.h, and the greedy tokens are the same (margins far above it);
 *  - layer 0's K/V rows depend on no all-reduce: each rank's cache holds exactly its KV heads'
 *    rows of the p = 1 GPU cache, bit for bit (a replicated head on each of its ranks);
 *  - 2 L all-reduces per step per rank; retention (chapter 09) on a shard is refused.
 * Exits 77 (skipped) without a usable device. */
#define _POSIX_C_SOURCE 200809L
#include "common/kv_test.h"
#include "common/test_tp_common.h"
#include "common/kv_test_gpu.h"

#include "kv_generate.h"
#include "kv_retain.h"
#include "kv_tp.h"
#include "kvcu.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CAP 48
#define NG 16  /* generated tokens */
#define MAXR 4 /* ranks at most: p = 4 is the largest case here */

/* ---- p ranks on one device ----------------------------------------------------------------- */

typedef struct {
    int p, n_layers, dim;
    kvcu_model *m;                /* one upload, read by every rank */
    kvcu_cache *cache[MAXR];      /* rank r's KV heads only */
    kvcu_state *state[MAXR];
    kv_shard shard[MAXR];
    pthread_mutex_t baton;        /* held by the rank that is using the device */
    pthread_barrier_t bar;
    float *part[MAXR];            /* host [max_n] partial sums of rank r */
    int has_part[MAXR];           /* 0: rank r's step failed, it adds nothing */
    float *sum;                   /* host [max_n] the rank-order sum */
    int64_t max_n;
    /* the step */
    const kv_seq *seqs;
    kv_seq quiet[4];              /* the other ranks' view: no all_logits */
    int n_seqs;
    float *logits;
    kv_counters *cnt;
    int rc[MAXR];
    kv_err err[MAXR];
    int reduces[MAXR];            /* all-reduces rank r joined this step */
    int hook_rc[MAXR];            /* a failed download or upload inside the hook */
    int64_t all_reduces;          /* over every step, counted by rank 0 */
} group;

/* sh->all_reduce: x [n] is DEVICE memory (NULL: a failed rank joining with nothing). Called
 * and returning with the baton held. */
static void all_reduce(const kv_shard *sh, float *x, int64_t n)
{
    group *g = sh->ctx;
    const int r = sh->rank;
    kv_err e;
    g->has_part[r] = x && kvcu_download(g->part[r], x, (size_t)n * sizeof(float), &e) == KV_OK;
    if (x && !g->has_part[r]) g->hook_rc[r] = KV_ERR_DEVICE;
    pthread_mutex_unlock(&g->baton);
    pthread_barrier_wait(&g->bar);
    if (r == 0) { /* rank order 0, 1, ..., p-1, each element's additions in one order */
        memset(g->sum, 0, (size_t)n * sizeof(float));
        int first = 1;
        for (int q = 0; q < g->p; q++) {
            if (!g->has_part[q]) continue;
            for (int64_t i = 0; i < n; i++) g->sum[i] = first ? g->part[q][i] : g->sum[i] + g->part[q][i];
            first = 0;
        }
        g->all_reduces++;
    }
    pthread_barrier_wait(&g->bar);
    pthread_mutex_lock(&g->baton);
    if (x && kvcu_upload(x, g->sum, (size_t)n * sizeof(float), &e) != KV_OK)
        g->hook_rc[r] = KV_ERR_DEVICE;
    g->reduces[r]++;
}

static void run_rank(group *g, int r)
{
    const int lead = r == 0;
    pthread_mutex_lock(&g->baton);
    g->reduces[r] = 0;
    g->rc[r] = kvcu_forward_shard(g->m, g->cache[r], g->state[r], &g->shard[r],
                                  lead ? g->seqs : g->quiet, g->n_seqs, lead ? g->logits : NULL,
                                  lead ? g->cnt : NULL, &g->err[r]);
    while (g->reduces[r] < 2 * g->n_layers) all_reduce(&g->shard[r], NULL, g->max_n);
    pthread_mutex_unlock(&g->baton);
}

/* MAXR rank threads for the whole test, thread r running rank r of each step's group. Kept,
 * not started per step: the emulation gives every OS thread that launches kernels its own
 * worker and fiber stacks, kept until exit. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, idle;
    int64_t gen;        /* steps handed out */
    int running;        /* threads still in the current step */
    group *g;           /* the step's group; NULL with a new gen: quit */
    pthread_t th[MAXR];
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};

static void *pool_main(void *arg)
{
    const int r = (int)(intptr_t)arg;
    int64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool.mu);
        while (pool.gen == seen) pthread_cond_wait(&pool.go, &pool.mu);
        seen = pool.gen;
        group *g = pool.g;
        pthread_mutex_unlock(&pool.mu);
        if (!g) return NULL;
        if (r < g->p) run_rank(g, r);
        pthread_mutex_lock(&pool.mu);
        if (--pool.running == 0) pthread_cond_signal(&pool.idle);
        pthread_mutex_unlock(&pool.mu);
    }
}

/* Hand @p g (NULL: quit) to every pool thread; wait until they are done with it. */
static void pool_run(group *g)
{
    pthread_mutex_lock(&pool.mu);
    pool.g = g;
    pool.running = MAXR;
    pool.gen++;
    pthread_cond_broadcast(&pool.go);
    while (g && pool.running > 0) pthread_cond_wait(&pool.idle, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
}

static int group_forward(kv_backend *b, const kv_seq *seqs, int n_seqs, float *logits,
                         kv_counters *cnt, kv_err *err)
{
    group *g = b->impl;
    int T = 0;
    for (int i = 0; i < n_seqs; i++) T += seqs[i].n_tokens;
    const int64_t n = (int64_t)T * g->dim;
    if (n > g->max_n || n_seqs > 4)
        return kv_fail(err, KV_ERR_ARG, "test group: step of %lld floats, %d sequences",
                       (long long)n, n_seqs);
    g->seqs = seqs;
    g->n_seqs = n_seqs;
    for (int i = 0; i < n_seqs; i++) {
        g->quiet[i] = seqs[i];
        g->quiet[i].all_logits = NULL;
    }
    g->logits = logits;
    g->cnt = cnt;
    pool_run(g);
    for (int r = 0; r < g->p; r++) {
        if (g->rc[r]) {
            if (err) *err = g->err[r];
            return g->rc[r];
        }
        if (g->hook_rc[r])
            return kv_fail(err, g->hook_rc[r], "test group: rank %d: all-reduce copy failed", r);
    }
    return KV_OK;
}

static void group_reset(kv_backend *b, int slot)
{
    group *g = b->impl;
    for (int r = 0; r < g->p; r++) kvcu_cache_reset(g->cache[r], slot);
}

static int group_length(kv_backend *b, int slot)
{
    return kvcu_cache_length(((group *)b->impl)->cache[0], slot);
}

static void group_destroy(kv_backend *b)
{
    group *g = b->impl;
    if (g) {
        for (int r = 0; r < g->p; r++) {
            kvcu_cache_free(g->cache[r]);
            kvcu_state_free(g->state[r]);
            free(g->part[r]);
        }
        kvcu_model_free(g->m);
        free(g->sum);
        pthread_mutex_destroy(&g->baton);
        pthread_barrier_destroy(&g->bar);
        free(g);
    }
    free(b);
}

/* p ranks of @p m on this device as a kv_backend, so kv_generate() runs them. */
static int group_create(kv_backend **out, const kv_model *m, int p, const kv_cache_spec *spec,
                        kv_err *err)
{
    *out = NULL;
    int rc = kv_tp_check(&m->config, p, err);
    if (rc) return rc;
    if (p > MAXR) return kv_fail(err, KV_ERR_ARG, "test group: %d ranks (at most %d)", p, MAXR);
    group *g = calloc(1, sizeof *g);
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "test group: out of memory");
    kv_backend *b = NULL;
    rc = kv_backend_new(&b, "cuda-shards", &m->config, spec, g, group_forward, group_reset,
                        group_length, group_destroy, err);
    if (rc) {
        free(g);
        return rc;
    }
    g->p = p;
    g->n_layers = m->config.n_layers;
    g->dim = m->config.dim;
    g->max_n = (int64_t)CAP * 2 * g->dim; /* a step of every slot's whole capacity */
    pthread_mutex_init(&g->baton, NULL);
    pthread_barrier_init(&g->bar, NULL, (unsigned)p);
    g->sum = malloc(sizeof(float) * (size_t)g->max_n);
    rc = g->sum ? kvcu_model_upload(&g->m, m, err) : kv_fail(err, KV_ERR_NOMEM, "test group");
    for (int r = 0; r < p && !rc; r++) {
        kv_config shape; /* the rank's cache: its KV heads only */
        kv_tp_rank_setup(&m->config, p, r, all_reduce, g, &g->shard[r], &shape);
        g->part[r] = malloc(sizeof(float) * (size_t)g->max_n);
        if (!g->part[r]) rc = kv_fail(err, KV_ERR_NOMEM, "test group");
        if (!rc) rc = kvcu_cache_create(&g->cache[r], &shape, spec, err);
        if (!rc) rc = kvcu_state_create(&g->state[r], err);
    }
    if (rc) {
        group_destroy(b);
        return rc;
    }
    *out = b;
    return KV_OK;
}

/* ---- models and caches ------------------------------------------------------------------- */


/* A host image of a device cache of @p n_kv_heads heads (same spec, same layout). */
static int download_cache(kv_cache *h, const kvcu_cache *g, const kv_config *cfg, int n_kv_heads,
                          const kv_cache_spec *spec, kv_err *e)
{
    kv_config shape = *cfg;
    shape.n_kv_heads = n_kv_heads;
    if (kv_cache_create(h, &shape, spec, e)) return 1;
    if (kvcu_cache_mem_bytes(g) != h->mem_bytes ||
        kvcu_cache_download(g, h->mem, h->mem_bytes, e) != KV_OK) {
        kv_cache_free(h);
        return 1;
    }
    return 0;
}


/* ---- p = 1 is kvcu_forward bit for bit --------------------------------------------------- */

static void test_p1_bits(const kv_model *m, const char *what)
{
    kv_err e;
    const int V = m->config.vocab_size;
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_backend *ref = NULL, *one = NULL;
    int ok = kvcu_backend_create(&ref, m, &spec, &e) == KV_OK &&
             group_create(&one, m, 1, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: create: %s", what, e.msg);
    if (ok) {
        float a[128], b[128];
        int tok[NP + 6], same = 1;
        memcpy(tok, PROMPT, sizeof PROMPT);
        for (int j = 0; j < 6; j++) tok[NP + j] = (13 * j + 2) % V;
        for (int step = 0; step < 7 && ok; step++) { /* a prefill, then one-token steps */
            const int pos = step ? NP + step - 1 : 0, n = step ? 1 : NP;
            const kv_seq s = {0, pos, n, tok + pos, NULL};
            ok = ref->forward(ref, &s, 1, a, NULL, &e) == KV_OK &&
                 one->forward(one, &s, 1, b, NULL, &e) == KV_OK;
            same &= !memcmp(a, b, sizeof(float) * V);
        }
        KV_CHECK(ok, "%s: steps: %s", what, e.msg);
        KV_CHECK(same, "%s: p = 1 shard logits differ from kvcu_forward's", what);
        /* the backend keeps its cache private: the same steps through kvcu_forward() on a
         * cache of our own, downloaded with the shard's */
        group *g = one->impl;
        kv_cache hr, hs;
        kvcu_model *dm = NULL;
        kvcu_cache *dc = NULL;
        kvcu_state *ds = NULL;
        ok = ok && kvcu_model_upload(&dm, m, &e) == KV_OK &&
             kvcu_cache_create(&dc, &m->config, &spec, &e) == KV_OK &&
             kvcu_state_create(&ds, &e) == KV_OK;
        for (int step = 0; step < 7 && ok; step++) {
            const int pos = step ? NP + step - 1 : 0, n = step ? 1 : NP;
            const kv_seq s = {0, pos, n, tok + pos, NULL};
            ok = kvcu_forward(dm, dc, ds, &s, 1, a, NULL, &e) == KV_OK;
        }
        KV_CHECK(ok, "%s: kvcu_forward run: %s", what, e.msg);
        if (ok && !download_cache(&hr, dc, &m->config, m->config.n_kv_heads, &spec, &e)) {
            if (!download_cache(&hs, g->cache[0], &m->config, m->config.n_kv_heads, &spec, &e)) {
                KV_CHECK(!memcmp(hr.mem, hs.mem, hr.mem_bytes),
                         "%s: p = 1 shard cache differs from kvcu_forward's", what);
                kv_cache_free(&hs);
            } else
                KV_CHECK(0, "%s: download: %s", what, e.msg);
            kv_cache_free(&hr);
        } else
            KV_CHECK(0, "%s: download: %s", what, e.msg);
        kvcu_state_free(ds);
        kvcu_cache_free(dc);
        kvcu_model_free(dm);
    }
    kv_backend_destroy(one);
    kv_backend_destroy(ref);
}

/* ---- p ranks against the CPU group and p = 1 ---------------------------------------------- */

static void test_ranks(const kv_model *m, int p, const char *what)
{
    kv_err e;
    const kv_config *cfg = &m->config;
    const int V = cfg->vocab_size, L = cfg->n_layers, Hkv = cfg->n_kv_heads;
    const int d = kv_config_head_dim(cfg);
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_backend *gpu1 = NULL, *cpu = NULL, *sh = NULL;
    int ok = kvcu_backend_create(&gpu1, m, &spec, &e) == KV_OK &&
             kv_tp_backend(&cpu, m, p, &spec, &e) == KV_OK &&
             group_create(&sh, m, p, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s p=%d: create: %s", what, p, e.msg);
    if (!ok) goto done;

    int want1[NG], wantc[NG], got[NG];
    float l1[128], lc[128], lg[128];
    kv_counters c1 = {0}, cg = {0};
    kv_gen_opts o = {KV_MODE_CACHED, 0, NG, NULL, NULL, NULL, l1};
    ok = kv_generate(gpu1, PROMPT, NP, &o, want1, &c1, &e) == KV_OK;
    o.last_logits = lc;
    ok = ok && kv_generate(cpu, PROMPT, NP, &o, wantc, NULL, &e) == KV_OK;
    group *g = sh->impl;
    const int64_t reduces0 = g->all_reduces;
    o.last_logits = lg;
    ok = ok && kv_generate(sh, PROMPT, NP, &o, got, &cg, &e) == KV_OK;
    KV_CHECK(ok, "%s p=%d: generate: %s", what, p, e.msg);
    if (!ok) goto done;
    KV_CHECK(!memcmp(got, want1, sizeof got), "%s p=%d: greedy tokens differ from GPU p = 1",
             what, p);
    KV_CHECK(!memcmp(got, wantc, sizeof got), "%s p=%d: greedy tokens differ from the CPU group",
             what, p);
    KV_CHECK(!kv_test_compare("last logits vs p = 1", lg, l1, V, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
             "%s p=%d: last logits outside the fp32 tolerance of GPU p = 1", what, p);
    KV_CHECK(!kv_test_compare("last logits vs CPU", lg, lc, V, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL),
             "%s p=%d: last logits outside the fp32 tolerance of the CPU group", what, p);
    double w1 = 0, wc = 0;
    for (int i = 0; i < V; i++) {
        w1 = fmax(w1, fabs((double)lg[i] - l1[i]));
        wc = fmax(wc, fabs((double)lg[i] - lc[i]));
    }
    printf("%s p=%d: max |logit diff| %.3g vs GPU p = 1, %.3g vs CPU p = %d\n", what, p, w1, wc, p);
    /* steps: the prompt, then NG - 1 tokens fed back */
    KV_CHECK(g->all_reduces - reduces0 == (int64_t)2 * L * NG, "%s p=%d: %lld all-reduces, "
             "want 2 L per step = %d", what, p, (long long)(g->all_reduces - reduces0), 2 * L * NG);
    KV_CHECK(c1.flops_proj == cg.flops_proj && c1.kv_bytes_written == cg.kv_bytes_written &&
             c1.tokens == cg.tokens, "%s p=%d: work counters differ from kvcu_forward's", what, p);

    /* each rank's cache: its KV heads' rows of the p = 1 GPU cache; layer 0 bit for bit */
    {
        kvcu_model *dm = NULL;
        kvcu_cache *dc = NULL;
        kvcu_state *ds = NULL;
        int tok[NP + NG];
        memcpy(tok, PROMPT, sizeof PROMPT);
        memcpy(tok + NP, want1, sizeof want1);
        const int n_rows = NP + NG - 1;
        const kv_seq s = {0, 0, n_rows, tok, NULL}; /* one prefill: the rows the run wrote */
        ok = kvcu_model_upload(&dm, m, &e) == KV_OK &&
             kvcu_cache_create(&dc, cfg, &spec, &e) == KV_OK && kvcu_state_create(&ds, &e) == KV_OK &&
             kvcu_forward(dm, dc, ds, &s, 1, NULL, NULL, &e) == KV_OK;
        kv_cache full;
        ok = ok && !download_cache(&full, dc, cfg, Hkv, &spec, &e);
        KV_CHECK(ok, "%s p=%d: p = 1 cache: %s", what, p, e.msg);
        long layer0_bad = 0, rows_bad = 0;
        int copies[64] = {0}, shape_bad = 0;
        for (int r = 0; r < p && ok; r++) {
            const kv_shard *shd = &g->shard[r];
            kv_cache c;
            if (download_cache(&c, g->cache[r], cfg, shd->n_kv_heads, &spec, &e)) {
                KV_CHECK(0, "%s p=%d rank %d: download: %s", what, p, r, e.msg);
                break;
            }
            shape_bad += shd->n_kv_heads != (p <= Hkv ? Hkv / p : 1) ||
                         kvcu_cache_length(g->cache[r], 0) != n_rows;
            for (int j = 0; j < shd->n_kv_heads; j++) {
                const int h = shd->kv_head0 + j;
                copies[h]++;
                for (int role = 0; role < 2; role++) {
                    const size_t n = (size_t)n_rows * d;
                    layer0_bad += memcmp(tp_layer_head(&c, role, 0, 0, j),
                                         tp_layer_head(&full, role, 0, 0, h), n * sizeof(float)) != 0;
                    for (int l = 1; l < L; l++)
                        rows_bad += kv_test_compare("cache rows", tp_layer_head(&c, role, l, 0, j),
                                                    tp_layer_head(&full, role, l, 0, h), (long)n,
                                                    KV_TOL_F32_ATOL, KV_TOL_F32_RTOL);
                }
            }
            kv_cache_free(&c);
        }
        int copies_bad = 0;
        for (int h = 0; h < Hkv; h++) copies_bad += copies[h] != (p <= Hkv ? 1 : p / Hkv);
        KV_CHECK(!shape_bad, "%s p=%d: a rank's KV head count or length is wrong", what, p);
        KV_CHECK(!copies_bad, "%s p=%d: a KV head is not held by exactly %d rank(s)", what, p,
                 p <= Hkv ? 1 : p / Hkv);
        KV_CHECK(!layer0_bad, "%s p=%d: layer-0 rows of a rank differ from the p = 1 cache",
                 what, p);
        KV_CHECK(!rows_bad, "%s p=%d: later layers' rows outside the tolerance", what, p);
        if (ok) kv_cache_free(&full);
        kvcu_state_free(ds);
        kvcu_cache_free(dc);
        kvcu_model_free(dm);
    }
done:
    kv_backend_destroy(sh);
    kv_backend_destroy(cpu);
    kv_backend_destroy(gpu1);
}

/* ---- a batch with all_logits and a window (the waves path) -------------------------------- */

static void test_batch(const kv_model *m, int p, int window, const char *what)
{
    kv_err e;
    const int V = m->config.vocab_size;
    kv_cache_spec spec = kv_cache_spec_default(2, CAP);
    spec.window.size = window;
    kv_backend *cpu = NULL, *sh = NULL;
    int ok = kv_tp_backend(&cpu, m, p, &spec, &e) == KV_OK &&
             group_create(&sh, m, p, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s p=%d: create: %s", what, p, e.msg);
    if (ok) {
        static float ra[20 * 128], ga[20 * 128], rl[2 * 128], gl[2 * 128];
        long bad = 0;
        int tok[2][40];
        for (int i = 0; i < 40; i++) tok[0][i] = (7 * i + 1) % V, tok[1][i] = (11 * i + 5) % V;
        /* prefills of 20 and 5 tokens (20 > S+W: several waves), all_logits on slot 1 */
        for (int step = 0; step < 8 && ok; step++) {
            kv_seq rs[2], gs[2];
            const int n0 = step ? 1 : 20, n1 = step ? 1 : 5;
            const int p0 = step ? 20 + step - 1 : 0, p1 = step ? 5 + step - 1 : 0;
            rs[0] = (kv_seq){0, p0, n0, tok[0] + p0, NULL};
            rs[1] = (kv_seq){1, p1, n1, tok[1] + p1, ra};
            gs[0] = rs[0];
            gs[1] = rs[1];
            gs[1].all_logits = ga;
            ok = cpu->forward(cpu, rs, 2, rl, NULL, &e) == KV_OK &&
                 sh->forward(sh, gs, 2, gl, NULL, &e) == KV_OK;
            bad += kv_test_compare("logits", gl, rl, 2L * V, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL);
            bad += kv_test_compare("all_logits", ga, ra, (long)n1 * V, KV_TOL_F32_ATOL,
                                   KV_TOL_F32_RTOL);
        }
        KV_CHECK(ok, "%s p=%d: steps: %s", what, p, e.msg);
        KV_CHECK(!bad, "%s p=%d: batch logits outside the tolerance of the CPU group", what, p);
    }
    kv_backend_destroy(sh);
    kv_backend_destroy(cpu);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void test_refusals(const kv_model *m)
{
    kv_err e;
    kv_shard sh;
    kv_tp_shard_of(&m->config, 2, 0, &sh);
    kvcu_model *dm = NULL;
    kvcu_cache *full = NULL, *ret = NULL;
    kvcu_state *ds = NULL;
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    int ok = kvcu_model_upload(&dm, m, &e) == KV_OK &&
             kvcu_cache_create(&full, &m->config, &spec, &e) == KV_OK &&
             kvcu_state_create(&ds, &e) == KV_OK;
    KV_CHECK(ok, "refusals: create: %s", e.msg);
    if (ok) {
        /* a whole-model cache is not a shard's: the shape check names it */
        const kv_seq s = {0, 0, 3, PROMPT, NULL};
        const int rc = kvcu_forward_shard(dm, full, ds, &sh, &s, 1, NULL, NULL, &e);
        KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "does not match"),
                 "a whole-model cache for a shard: status %d, '%s'", rc, e.msg);
        KV_CHECK(kvcu_cache_length(full, 0) == 0, "a refused shard step changed the cache");
        /* chapter 09 retention on a shard, as on the CPU */
        kv_config shape = m->config;
        shape.n_kv_heads = sh.n_kv_heads;
        kv_cache_spec rs = spec;
        rs.retain.select = KV_SELECT_L2_LARGE;
        rs.retain.budget = 16;
        if (kvcu_cache_create(&ret, &shape, &rs, &e) == KV_OK) {
            const int rc2 = kvcu_forward_shard(dm, ret, ds, &sh, &s, 1, NULL, NULL, &e);
            KV_CHECK(rc2 == KV_ERR_UNSUPPORTED && strstr(e.msg, "tensor-parallel"),
                     "retention on a shard: status %d, '%s'", rc2, e.msg);
        } else
            KV_CHECK(0, "retention cache: %s", e.msg);
    }
    kvcu_cache_free(ret);
    kvcu_state_free(ds);
    kvcu_cache_free(full);
    kvcu_model_free(dm);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    for (int r = 0; r < MAXR; r++)
        if (pthread_create(&pool.th[r], NULL, pool_main, (void *)(intptr_t)r) != 0) {
            printf("test_gpu_tp_shard: could not start rank thread %d\n", r);
            return 1;
        }
    kv_model mha, gqa;
    /* dim 64, H 8, d 8, L 3; hidden 100 is not a multiple of 8: uneven MLP shards */
    if (tp_make_model(&mha, 64, 96, 3, 8, 8, CAP, 11) ||
        tp_make_model(&gqa, 64, 100, 3, 8, 2, CAP, 12))
        return 1;
    test_p1_bits(&mha, "MHA");
    test_p1_bits(&gqa, "GQA");
    test_ranks(&mha, 2, "MHA H8/Hkv8");
    test_ranks(&mha, 4, "MHA H8/Hkv8");
    test_ranks(&gqa, 2, "GQA H8/Hkv2");
    test_ranks(&gqa, 4, "GQA H8/Hkv2"); /* each KV head on 2 ranks */
    test_batch(&gqa, 2, 9, "batch window 9");
    test_refusals(&gqa);
    kv_model_free(&mha);
    kv_model_free(&gqa);
    pool_run(NULL);
    for (int r = 0; r < MAXR; r++) pthread_join(pool.th[r], NULL);
    return kv_test_finish();
}
