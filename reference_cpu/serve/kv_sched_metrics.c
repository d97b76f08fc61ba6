/* The scheduler's measurements (kv_sched.h's metrics): the pool's occupancy after each step
 * (stored tokens, internal and reserved waste, sharing, peaks, the on_step callback), and the
 * latency percentiles of a finished run. Called by kv_sched.c; reads the scheduler's state and
 * calls nothing of it. */
#include "kv_request.h"

#include <stdlib.h>

/* Pool occupancy after a step: stored tokens, internal and reserved waste, sharing. */
void kv_sched_measure(sched *S)
{
    kv_paged *pg = S->env.b->mem->paged;
    kv_sched_metrics *m = S->env.m;
    const int B = S->env.B;
    int n_touched = 0, seqs = 0;
    const int64_t key = ++S->stamp_key;
    for (int j = 0; j < S->n_running; j++) {
        runner *r = &S->r[S->running[j]];
        const int64_t rkey = ++S->stamp_key;
        int64_t distinct = 0, entries = 0;
        for (int i = 0; i < r->n_seq; i++) {
            if (r->seq[i].slot < 0) continue;
            seqs++;
            const kv_block_table *t = &pg->tables[r->seq[i].slot];
            entries += t->n_blocks;
            for (int e = 0; e < t->n_blocks; e++) {
                const int blk = t->blocks[e];
                const int f = e + 1 < t->n_blocks ? B : (int)(t->n_tokens - (int64_t)e * B);
                if (S->stamp[blk] < key) { /* first sight this step */
                    S->touched[n_touched++] = blk;
                    S->fill[blk] = 0;
                }
                if (S->stamp[blk] != rkey) {
                    distinct++;
                    S->stamp[blk] = rkey;
                }
                if (f > S->fill[blk]) S->fill[blk] = f;
            }
        }
        if (r->n_seq > 1) {
            m->shared_blocks += distinct;
            m->unshared_blocks += entries;
        }
    }
    int64_t stored = 0;
    for (int i = 0; i < n_touched; i++) stored += S->fill[S->touched[i]];
    const int64_t phys = (int64_t)n_touched * B;
    const int64_t held = (S->reserved > n_touched ? S->reserved : n_touched) * (int64_t)B;
    S->sum_util += (double)stored / ((double)S->env.N * B);
    S->sum_internal += (double)(phys - stored);
    S->sum_reserved += (double)(held - phys);
    S->sum_held += (double)held;
    if (seqs > m->peak_seqs) m->peak_seqs = seqs;
    if (S->n_running > m->peak_reqs) m->peak_reqs = S->n_running;
    if (S->pool->n_used > m->peak_used_blocks) m->peak_used_blocks = S->pool->n_used;
    if (S->sw.pool.n_used > m->peak_host_blocks) m->peak_host_blocks = S->sw.pool.n_used;
    if (S->env.o->on_step) {
        kv_sched_step_info info = {0};
        info.step = S->step;
        info.clock_s = S->now;
        info.used_blocks = S->pool->n_used;
        info.cached_blocks = S->pool->n_cached;
        info.reserved_blocks = S->reserved;
        info.running_seqs = seqs;
        info.running_reqs = S->n_running;
        for (int i = 0; i < S->n_queue; i++) info.waiting += S->r[S->queue[i]].arrival <= S->now;
        info.done = S->n_finished;
        info.total = S->n;
        info.batch_tokens = S->batch_tokens;
        S->env.o->on_step(S->env.o->user, &info);
    }
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest rank: the smallest value with at least p % of the values at or below it. */
static double percentile(const double *sorted, int n, double p)
{
    int k = (int)(p / 100.0 * n + 0.999999);
    return n ? sorted[(k < 1 ? 1 : k > n ? n : k) - 1] : 0.0;
}

/* p50 and p99 of first-token and end-to-end latency, per priority, over finished requests. */
void kv_sched_latency_percentiles(kv_sched_out *out)
{
    kv_sched_metrics *m = &out->m;
    double *v = malloc((size_t)out->n * 2 * sizeof(double));
    if (!v) return;
    for (int c = 0; c < 2; c++) {
        double *ttft = v, *e2e = v + out->n;
        int k = 0;
        for (int i = 0; i < out->n; i++) {
            const kv_sched_result *r = &out->results[i];
            if (r->status != KV_OK || r->priority != c || r->first_token_s < 0) continue;
            ttft[k] = r->first_token_s - r->arrival_s;
            e2e[k++] = r->finish_s - r->arrival_s;
        }
        qsort(ttft, (size_t)k, sizeof(double), cmp_double);
        qsort(e2e, (size_t)k, sizeof(double), cmp_double);
        m->n_class[c] = k;
        m->ttft_p50[c] = percentile(ttft, k, 50);
        m->ttft_p99[c] = percentile(ttft, k, 99);
        m->e2e_p50[c] = percentile(e2e, k, 50);
        m->e2e_p99[c] = percentile(e2e, k, 99);
    }
    free(v);
}
