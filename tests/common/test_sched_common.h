/*
 * Pieces the scheduler tests share (test_sched, test_sched_swap, test_gpu_sched_swap,
 * test_gpu_nomem): the tiny model and a trace from a table of requests, "the same tokens"
 * between a scheduled and a solo result, the solo references, and one scheduled run held to
 * them (sched_run_check(): the body the chapter-07 modes run on either backend).
 */
#ifndef TEST_SCHED_COMMON_H
#define TEST_SCHED_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_backend.h"
#include "kv_model.h"
#include "kv_sched.h"
#include "kv_test.h"

/* The chapter-07 trace (test_sched_swap, test_gpu_sched_swap), {arrival, prompt, output, n,
 * beam, prefix, priority}: plain, samples and beams, a third of them high priority, arriving
 * over 0.1 s. */
static const kv_request PRIO_REQS[] = {
    {0.00, 9, 12, 1, 1, -1, 0}, {0.00, 23, 9, 1, 1, 0, 0},  {0.01, 14, 10, 2, 1, -1, 1},
    {0.02, 6, 11, 1, 2, -1, 0}, {0.02, 20, 8, 1, 1, 0, 1},  {0.03, 11, 7, 3, 1, -1, 0},
    {0.04, 17, 9, 1, 3, 1, 0},  {0.05, 26, 6, 1, 1, 1, 1},  {0.05, 5, 13, 4, 1, -1, 0},
    {0.06, 8, 10, 1, 4, -1, 1}, {0.08, 21, 5, 1, 1, 0, 0},  {0.09, 13, 12, 1, 1, -1, 0},
};
#define N_PRIO_REQS ((int)(sizeof PRIO_REQS / sizeof PRIO_REQS[0]))

/* A trace of @p n requests copied from @p reqs, with two shared prefixes (16 tokens: four
 * whole blocks of 4; and 10). */
static inline void make_trace(kv_trace *t, const kv_request *reqs, int n)
{
    memset(t, 0, sizeof *t);
    t->req = malloc((size_t)n * sizeof(kv_request));
    memcpy(t->req, reqs, (size_t)n * sizeof(kv_request));
    t->n = n;
    t->n_prefixes = 2;
    t->prefix_len[0] = 16;
    t->prefix_len[1] = 10;
}

/* The tiny model and a trace of reqs [n] (make_trace(); without_prefixes: no shared prefix
 * declared). 1, with the message printed, when the model cannot be built. */
static inline int sched_setup(kv_model *m, kv_trace *t, const kv_request *reqs, int n,
                              int without_prefixes)
{
    kv_err err;
    if (kv_model_default(m, KV_DEFAULT_TINY, &err)) {
        printf("model: %s\n", err.msg);
        return 1;
    }
    make_trace(t, reqs, n);
    if (without_prefixes) t->n_prefixes = 0;
    return 0;
}

/* The scheduler tests' cache: 16 slots of 128 tokens in n_blocks blocks of B tokens. */
static inline kv_cache_spec sched_spec(int n_blocks, int B)
{
    kv_cache_spec s = kv_cache_spec_default(16, 128);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = B;
    s.layout.n_blocks = n_blocks;
    return s;
}

/* Both served, and every returned sequence has the same tokens. */
static inline int same_result(const kv_sched_result *a, const kv_sched_result *b)
{
    if (a->status || b->status || a->n_out != b->n_out || a->output_len != b->output_len) return 0;
    return memcmp(a->tokens, b->tokens, (size_t)a->n_out * a->output_len * sizeof(int)) == 0;
}

/* solo [t->n]: each request of t alone on b (max_len 64), every one checked served. Returns
 * the first failing status (the solo runs before it are filled). */
static inline int sched_solo_all(kv_backend *b, const kv_trace *t, kv_sched_out *solo)
{
    kv_sched_opts o = kv_sched_opts_default();
    o.max_len = 64;
    kv_err err;
    for (int i = 0; i < t->n; i++) {
        const int rc = kv_sched_solo(b, t, i, &o, &solo[i], &err);
        KV_CHECK(rc == KV_OK && solo[i].results[0].status == KV_OK, "solo %d: %s", i,
                 rc ? err.msg : solo[i].results[0].error);
        if (rc) return rc;
    }
    return KV_OK;
}

/* Run t on b and hold it to the solo runs: every request's tokens, the device pool empty and
 * consistent, the host tier empty. *out keeps the run (kv_sched_out_free()); returns its status. */
static inline int sched_run_check(const char *what, kv_backend *b, const kv_trace *t,
                                  const kv_sched_opts *o, const kv_sched_out *solo,
                                  kv_sched_out *out)
{
    kv_err err;
    memset(out, 0, sizeof *out);
    int rc = kv_sched_run(b, t, t->n, o, out, &err);
    KV_CHECK(rc == KV_OK, "%s: run: %s", what, rc ? err.msg : "");
    if (rc) return rc;
    int same = 0;
    for (int i = 0; i < t->n; i++) {
        int ok = same_result(&out->results[i], &solo[i].results[0]);
        if (!ok) printf("  %s: request %d differs from its solo run (%s)\n", what, i,
                        out->results[i].error);
        same += ok;
    }
    KV_CHECK(same == t->n, "%s: %d of %d requests equal their solo run", what, same, t->n);
    KV_CHECK(kv_pool_check_leaks(&b->mem->paged->pool, NULL, 0) == 0 &&
                 kv_pool_validate(&b->mem->paged->pool, &err) == KV_OK,
             "%s: device pool empty and consistent", what);
    KV_CHECK(out->m.host_leaked == 0, "%s: host tier empty (%d held)", what, out->m.host_leaked);
    return KV_OK;
}

#endif
