/* The scheduler of kv_sched.h: which requests run each step, on what memory, and what that
 * costs the pool (chapter 05). Continuous batching with chunked prefill, admission with a
 * watermark, preemption by recompute or by swap to a host tier (chapter 07), the contiguous
 * baselines' reservations, and the metrics.
 *
 * Read kv_request.h and kv_request.c first: a runner is one request's state machine, and
 * this file only decides when it runs. Then this file: after the policies' names and the
 * defaults, the host tier, the parts of a step in the order they run (a runner leaving:
 * finish, fail, preempt by recompute or swap; plan; admission, swap in; execute; measure);
 * run_list ties them into the loop, and the public entry points close the file. */
#include "kv_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    runner_env env;          /* backend, options, pool shape, choosing scratch, metrics */
    kv_pool *pool;
    runner *r;
    int n;
    int *queue, n_queue;     /* [n] waiting runners: preempted first, then by arrival */
    int *running, n_running; /* [n] admitted runners, oldest admission first */
    int *free_slots, n_free; /* [n_slots] */
    int reserved;            /* baselines: blocks reserved by running requests */
    double now;              /* the step clock */
    int64_t step;
    int budget;              /* tokens per step: the option, halved each time memory ran out */
    /* the step's batch */
    kv_seq *batch;           /* [n_slots] */
    int *b_runner, *b_seq;   /* [n_slots] which runner and sequence each entry feeds */
    int n_batch, batch_tokens;
    float *logits;           /* [n_slots][vocab] */
    /* metrics: per-block fill of the step and a stamp to count each block once */
    int *fill;               /* [N] */
    int64_t *stamp;          /* [N] */
    int64_t stamp_key;
    int *touched;            /* [N] */
    double sum_util, sum_internal, sum_reserved, sum_held;
    int n_finished;
    /* swap mode: the host tier (kv_swap.h) */
    kv_swap sw;
    int tier;                /* 1: swapping is possible; 0: every preemption recomputes */
} sched;

const char *kv_policy_name(int policy)
{
    static const char *const names[] = {"paged", "max", "pow2", "oracle"};
    return policy >= 0 && policy < 4 ? names[policy] : NULL;
}

int kv_policy_by_name(const char *name)
{
    for (int p = 0; p < 4; p++)
        if (name && strcmp(name, kv_policy_name(p)) == 0) return p;
    return -1;
}

const char *kv_preempt_name(int preempt)
{
    static const char *const names[] = {"recompute", "swap"};
    return preempt >= 0 && preempt < 2 ? names[preempt] : NULL;
}

int kv_preempt_by_name(const char *name)
{
    for (int p = 0; p < 2; p++)
        if (name && strcmp(name, kv_preempt_name(p)) == 0) return p;
    return -1;
}

kv_sched_opts kv_sched_opts_default(void)
{
    kv_sched_opts o;
    memset(&o, 0, sizeof o);
    o.policy = KV_POLICY_PAGED;
    o.token_budget = 256;
    o.max_len = 2048;
    o.step_s = 0.02;
    o.temperature = 0.0f;
    o.sample_temperature = 1.0f;
    o.top_p = 1.0f;
    o.seed = 42;
    o.preempt = KV_PREEMPT_RECOMPUTE;
    return o;
}

/* ---- the host tier (swap mode) ---------------------------------------------------------------
 * Every call into kv_swap goes through tier_call(), so a change of kv_swap's API touches only
 * these lines. TIER_INIT builds a tier of @p n host blocks; TIER_OUT / TIER_IN move sequence
 * @p s out of / into cache slot @p n. */
enum { TIER_INIT = 0, TIER_OUT = 1, TIER_IN = 2 };

static int tier_call(sched *S, int op, int n, kv_swapped *s, kv_err *err)
{
    kv_backend *b = S->env.b;
    if (op == TIER_OUT) return kv_swap_out(&S->sw, b, n, s, err);
    if (op == TIER_IN) return kv_swap_in(&S->sw, b, n, s, err);
    if (!b->read_blocks || !b->write_blocks || !b->block_bytes)
        return kv_fail(err, KV_ERR_UNSUPPORTED, "swap: the backend has no block I/O");
    return kv_swap_init(&S->sw, b, n, NULL, err);
}

/* Swap mode: a host tier of opts.host_blocks blocks (0: as many as the device pool). A cache
 * kv_swap refuses leaves the tier off, and the reason in the metrics: every preemption then
 * recomputes, counted as a fallback. */
static int tier_open(sched *S, kv_err *err)
{
    const kv_sched_opts *o = S->env.o;
    if (o->preempt != KV_PREEMPT_SWAP) return KV_OK;
    const int n = o->host_blocks > 0 ? o->host_blocks : S->env.N;
    kv_err e;
    int rc = tier_call(S, TIER_INIT, n, NULL, &e);
    if (rc == KV_ERR_UNSUPPORTED) {
        snprintf(S->env.m->swap_refused, sizeof S->env.m->swap_refused, "%.150s", e.msg);
        return KV_OK;
    }
    if (rc) return kv_fail(err, rc, "%s", e.msg);
    S->tier = 1;
    S->env.m->host_blocks = n;
    return KV_OK;
}

/* Release a runner's sequences waiting in the host tier (a runner that will not come back). */
static void tier_forget(sched *S, runner *r)
{
    for (int i = 0; i < r->n_seq; i++) kv_swapped_drop(&S->sw, &r->seq[i].host);
    r->swapped = 0;
}

/* ---- queue and running list ----------------------------------------------------------------- */

static void list_remove(int *list, int *n, int v)
{
    for (int i = 0; i < *n; i++)
        if (list[i] == v) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof(int));
            (*n)--;
            return;
        }
}

/* Give back a runner's slots (emptied) and its reservation. */
static void runner_release(sched *S, runner *r)
{
    runner_drop_slots(&S->env, r);
    for (int i = 0; i < r->n_seq; i++) S->free_slots[S->n_free++] = r->slots[i];
    S->reserved -= r->res_blocks;
    list_remove(S->running, &S->n_running, (int)(r - S->r));
}

/* A runner entered R_DONE (its result is filled): its memory goes back at once. */
static void finish(sched *S, runner *r)
{
    runner_release(S, r);
    r->res->status = KV_OK;
    r->res->finish_step = S->step;
    S->env.m->n_done++;
    S->n_finished++;
}

static void fail_running(sched *S, runner *r, int status, const char *why)
{
    runner_release(S, r);
    runner_set_error(r, status, "request %d: %s", r->idx, why);
    r->state = R_FAILED;
    r->res->finish_step = S->step;
    S->env.m->n_failed++;
    S->n_finished++;
}

/* Rows of KV the runner's slots hold: what a recompute preemption drops and readmission
 * feeds again (the prompt once: forks share it). */
static int64_t rows_held(const runner *r)
{
    if (r->state == R_PROMPT) return r->seq[r->root].len;
    int64_t n = r->rq.prompt_len;
    for (int i = 0; i < r->n_seq; i++)
        if (r->seq[i].slot >= 0) n += r->seq[i].len - r->rq.prompt_len;
    return n;
}

/* Preemption by swap: every sequence holding a slot goes to the host tier, with its length.
 * When it cannot, r->swapped stays 0 and the caller recomputes (a counted fallback): no tier
 * (kv_swap refused the cache), too few host blocks, or sequences that, unshared at their final
 * length, would not fit the device pool (copied per sequence, they could never come back).
 * Returns only errors of the run. */
static int swap_out(sched *S, runner *r, kv_err *err)
{
    kv_sched_metrics *m = S->env.m;
    const kv_paged *pg = S->env.b->paged;
    int64_t host = 0; /* host blocks: every sequence's table, shared blocks once per sequence */
    for (int i = 0; i < r->n_seq; i++)
        if (r->seq[i].slot >= 0) host += pg->tables[r->seq[i].slot].n_blocks;
    const int64_t unshared = (int64_t)r->n_seq * cdiv(r->rq.prompt_len + r->rq.output_len - 1,
                                                      S->env.B);
    if (!S->tier || unshared > S->env.N || host > kv_pool_available(&S->sw.pool)) {
        m->recompute_fallbacks++;
        return KV_OK;
    }
    kv_err e;
    int rc = KV_OK, n = 0;
    for (int i = 0; i < r->n_seq && !rc; i++) {
        seq_t *s = &r->seq[i];
        if (s->slot < 0) continue;
        rc = tier_call(S, TIER_OUT, s->slot, &s->host, &e);
        if (!rc) { /* kv_swap_out emptied the slot */
            s->slot = -1;
            n++;
        }
    }
    if (rc) { /* what went out is dropped: the runner recomputes everything */
        tier_forget(S, r);
        if (rc == KV_ERR_UNSUPPORTED) {
            S->tier = 0;
            snprintf(m->swap_refused, sizeof m->swap_refused, "%.150s", e.msg);
        }
        if (rc != KV_ERR_UNSUPPORTED && rc != KV_ERR_CAPACITY && rc != KV_ERR_NOMEM)
            return kv_fail(err, rc, "%s", e.msg);
        m->recompute_fallbacks++;
        return KV_OK;
    }
    r->swapped = 1;
    r->swap_state = r->state;
    m->swap_preemptions++;
    m->seqs_swapped_out += n;
    return KV_OK;
}

/* Preemption: swap the runner out (swap mode, when it can) or drop its rows for recompute;
 * give its slots back, keep the tokens chosen so far, requeue it first. */
static int preempt(sched *S, runner *r, kv_err *err)
{
    const int64_t held = rows_held(r);
    int rc = S->env.o->preempt == KV_PREEMPT_SWAP ? swap_out(S, r, err) : KV_OK;
    if (rc) return rc;
    if (!r->swapped) S->env.m->tokens_recomputed += held;
    runner_release(S, r);
    r->state = R_WAITING;
    r->res->preemptions++;
    S->env.m->preemptions++;
    memmove(S->queue + 1, S->queue, (size_t)S->n_queue * sizeof(int));
    S->queue[0] = (int)(r - S->r);
    S->n_queue++;
    return KV_OK;
}

/* ---- one step: plan ------------------------------------------------------------------------- */

static void batch_add(sched *S, int ri, int si, int n_tok, int64_t *need)
{
    runner *r = &S->r[ri];
    seq_t *s = &r->seq[si];
    kv_seq *q = &S->batch[S->n_batch];
    q->slot = s->slot;
    q->pos = (int)s->len;
    q->n_tokens = n_tok;
    q->tokens = seq_next_tokens(r, s);
    S->b_runner[S->n_batch] = ri;
    S->b_seq[S->n_batch] = si;
    S->n_batch++;
    S->batch_tokens += n_tok;
    *need += kv_paged_blocks_needed(S->env.b, s->slot, n_tok);
}

/* Feed what runner @p ri's sequences have pending, within the budget. */
static void plan_runner(sched *S, int ri, int64_t *need, int *budget)
{
    runner *r = &S->r[ri];
    for (int i = 0; i < r->n_seq && *budget > 0; i++) {
        seq_t *s = &r->seq[i];
        if (s->slot < 0) continue;
        const int64_t pending = seq_pending(r, s);
        if (pending <= 0) continue;
        const int n_tok = (int)(pending < *budget ? pending : *budget);
        batch_add(S, ri, i, n_tok, need);
        *budget -= n_tok;
    }
}

/* Feed what running sequences have pending, oldest request first, within the budget. */
static void plan(sched *S, int64_t *need, int *budget)
{
    S->n_batch = 0;
    S->batch_tokens = 0;
    *need = 0;
    *budget = S->budget;
    for (int j = 0; j < S->n_running && *budget > 0; j++)
        plan_runner(S, S->running[j], need, budget);
}

/* ---- one step: admission -------------------------------------------------------------------- */

/* Blocks a runner needs at admission, after prefix-cache hits on blocks in use: its whole
 * prompt, and for a preempted one also what its sequences had grown to (it re-feeds those
 * tokens at once; admitting it into less would only preempt it again). */
static int prompt_blocks(sched *S, const runner *r)
{
    if (r->swapped) { /* swapped out: the blocks it comes back into, unshared, and what its
                       * sequences then feed (the rest of the prompt, or their pending token) */
        int64_t n = 0;
        for (int i = 0; i < r->n_seq; i++)
            if (r->seq[i].host.resident)
                n += cdiv(r->swap_state == R_PROMPT ? r->rq.prompt_len : ctx_len(r, &r->seq[i]),
                          S->env.B);
        return (int)n;
    }
    const int P = r->rq.prompt_len, B = S->env.B;
    int64_t need = cdiv(P, B);
    int used_hits = 0;
    if (r->seq[0].n_gen > 0 || r->kind == K_SAMPLES) {
        need = P / B;
        for (int i = 0; i < r->n_seq; i++)
            if (is_live(r, i)) need += cdiv(P + r->seq[i].n_gen, B) - P / B;
    }
    kv_paged *pg = S->env.b->paged;
    if (pg->prefix_caching) kv_prefix_probe(&pg->prefix, r->prompt, P, &used_hits);
    return (int)(need - used_hits);
}

/* A runner preempted by swap comes back: each sequence's rows are copied into one of its
 * slots with their length, it resumes the state it left, and what its sequences had pending
 * joins this step's batch. Admission checked the device blocks, so a refusal here is an error
 * of the run. */
static int swap_in(sched *S, int ri, int *budget, int64_t *need, kv_err *err)
{
    runner *r = &S->r[ri];
    kv_sched_metrics *m = S->env.m;
    S->reserved += r->res_blocks;
    S->running[S->n_running++] = ri;
    kv_err e;
    for (int i = 0, j = 0; i < r->n_seq; i++) {
        seq_t *s = &r->seq[i];
        if (!s->host.resident) continue;
        const int64_t len = s->host.n_tokens;
        int rc = tier_call(S, TIER_IN, r->slots[j], &s->host, &e);
        if (rc) return kv_fail(err, rc, "request %d: swap in: %s", r->idx, e.msg);
        s->slot = r->slots[j++];
        s->len = len;
        m->seqs_swapped_in++;
    }
    r->swapped = 0;
    r->state = r->swap_state;
    plan_runner(S, ri, need, budget);
    return KV_OK;
}

/* Hand the runner its slots, start it (root slot, prefix hit), and put its first prompt chunk
 * into this step's batch; a runner swapped out is swapped back in instead. */
static int admit(sched *S, int ri, int *budget, int64_t *need, kv_err *err)
{
    runner *r = &S->r[ri];
    for (int i = 0; i < r->n_seq; i++) r->slots[i] = S->free_slots[--S->n_free];
    if (r->swapped) return swap_in(S, ri, budget, need, err);
    int hit;
    int rc = runner_start(&S->env, r, &hit, err);
    if (rc) return rc;
    S->env.m->prompt_tokens += r->rq.prompt_len;
    S->env.m->prefix_hit_tokens += hit;
    S->reserved += r->res_blocks;
    if (r->res->admit_step < 0) r->res->admit_step = S->step;
    S->running[S->n_running++] = ri;
    const int64_t pending = seq_pending(r, &r->seq[r->root]);
    const int n_tok = (int)(pending < *budget ? pending : *budget);
    batch_add(S, ri, r->root, n_tok, need);
    *budget -= n_tok;
    return KV_OK;
}

/* Admit from the queue front while the front fits (first come, first served). */
static int admit_waiting(sched *S, int *budget, int64_t *need, kv_err *err)
{
    const kv_sched_opts *o = S->env.o;
    const int N = S->env.N;
    while (S->n_queue > 0 && *budget > 0) {
        const int ri = S->queue[0];
        runner *r = &S->r[ri];
        if (r->res->status != KV_OK) { /* can never run: reported, not retried */
            r->state = R_FAILED;
            r->res->finish_step = S->step;
            S->env.m->n_failed++;
            S->n_finished++;
            list_remove(S->queue, &S->n_queue, ri);
            continue;
        }
        if (r->arrival > S->now) break;
        if (S->n_free < r->n_seq) break;
        if (o->policy != KV_POLICY_PAGED && S->reserved + r->res_blocks > N) break;
        /* keep a watermark of 1 % of the pool free: a prompt admitted into the last free
         * blocks would be preempted by the next step's growth of the others */
        const int watermark = o->policy == KV_POLICY_PAGED && S->n_running ? (N + 99) / 100 : 0;
        if ((int64_t)kv_paged_available(S->env.b) - *need < prompt_blocks(S, r) + watermark)
            break;
        list_remove(S->queue, &S->n_queue, ri);
        int rc = admit(S, ri, budget, need, err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* ---- one step: execute and measure ---------------------------------------------------------- */

/* Run the batch, hand each row of logits to its sequence, then let each runner advance; a
 * runner that entered R_DONE gives its memory back before the next row is taken, exactly
 * when it finished. */
static int execute(sched *S, kv_err *err)
{
    const runner_env *e = &S->env;
    int rc = e->b->forward(e->b, S->batch, S->n_batch, S->logits, NULL, err);
    if (rc) return rc;
    e->m->tokens_processed += S->batch_tokens;
    for (int j = 0; j < S->n_batch; j++) {
        runner *r = &S->r[S->b_runner[j]];
        seq_t *s = &r->seq[S->b_seq[j]];
        s->len += S->batch[j].n_tokens;
        const float *row = S->logits + (size_t)j * e->vocab;
        if ((rc = runner_take_logits(e, r, s, row, err))) return rc;
        if (r->state == R_DONE) finish(S, r); /* a fresh beam request of one token */
    }
    for (int j = 0; j < S->n_running; j++) {
        runner *r = &S->r[S->running[j]];
        if (r->state != R_DECODE) continue;
        if ((rc = runner_advance(e, r, err))) return rc;
        if (r->state == R_DONE) {
            finish(S, r);
            j--; /* finish() removed it from the list */
        }
    }
    return KV_OK;
}

/* Pool occupancy after a step: stored tokens, internal and reserved waste, sharing. */
static void measure(sched *S)
{
    kv_paged *pg = S->env.b->paged;
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

/* ---- the run -------------------------------------------------------------------------------- */

/* Serve the requests @p list [n] of the trace: kv_sched.h's step (plan, preempt, admit,
 * execute, measure) until every one is done or failed, then the run's averages. */
static int run_list(kv_backend *b, const kv_trace *t, const int *list, int n,
                    const kv_sched_opts *o, kv_sched_out *out, kv_err *err)
{
    memset(out, 0, sizeof *out);
    if (!b || !t || !o || n < 1 || !b->paged)
        return kv_fail(err, KV_ERR_ARG, "scheduler: needs a paged backend, a trace and >= 1 "
                       "request");
    if (o->policy < 0 || o->policy > KV_POLICY_ORACLE || o->token_budget < 1 || o->max_len < 1 ||
        !(o->step_s >= 0) || !(o->sample_temperature > 0) || !(o->temperature >= 0) ||
        !(o->top_p > 0 && o->top_p <= 1) || !kv_preempt_name(o->preempt) || o->host_blocks < 0)
        return kv_fail(err, KV_ERR_ARG, "scheduler: bad options (policy %d, budget %d, "
                       "max_len %d, sample temperature %g, preempt %d, host blocks %d)",
                       o->policy, o->token_budget, o->max_len, (double)o->sample_temperature,
                       o->preempt, o->host_blocks);
    for (int s = 0; s < b->spec.n_slots; s++)
        if (b->paged->tables[s].n_blocks)
            return kv_fail(err, KV_ERR_ARG, "scheduler: slot %d is not empty", s);
    sched S;
    memset(&S, 0, sizeof S);
    S.budget = o->token_budget;
    runner_env *e = &S.env;
    e->b = b;
    e->o = o;
    S.pool = &b->paged->pool;
    e->B = S.pool->block_size;
    e->N = S.pool->n_blocks;
    e->vocab = b->config->vocab_size;
    e->n_slots = b->spec.n_slots;
    S.n = n;
    e->m = &out->m;
    int kmax = 1;
    for (int i = 0; i < n; i++)
        if (t->req[list[i]].beam_width > kmax) kmax = t->req[list[i]].beam_width;
    S.r = calloc((size_t)n, sizeof(runner));
    S.queue = malloc((size_t)n * sizeof(int));
    S.running = malloc((size_t)n * sizeof(int));
    S.free_slots = malloc((size_t)e->n_slots * sizeof(int));
    S.batch = calloc((size_t)e->n_slots, sizeof(kv_seq));
    S.b_runner = malloc((size_t)e->n_slots * sizeof(int));
    S.b_seq = malloc((size_t)e->n_slots * sizeof(int));
    S.logits = malloc((size_t)e->n_slots * e->vocab * sizeof(float));
    e->lcopy = malloc((size_t)e->vocab * sizeof(float));
    e->scratch = malloc((size_t)e->vocab * sizeof(double));
    e->cand = malloc((size_t)kmax * sizeof(kv_beam_cand));
    e->lp = malloc((size_t)kmax * sizeof(float *));
    e->cum = malloc((size_t)kmax * sizeof(double));
    S.fill = malloc((size_t)e->N * sizeof(int));
    S.stamp = calloc((size_t)e->N, sizeof(int64_t));
    S.touched = malloc((size_t)e->N * sizeof(int));
    out->n = n;
    out->index = malloc((size_t)n * sizeof(int));
    out->results = calloc((size_t)n, sizeof(kv_sched_result));
    int rc = KV_OK;
    if (!S.r || !S.queue || !S.running || !S.free_slots || !S.batch || !S.b_runner || !S.b_seq ||
        !S.logits || !e->lcopy || !e->scratch || !e->cand || !e->lp || !e->cum ||
        !S.fill || !S.stamp || !S.touched || !out->index || !out->results) {
        rc = kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        goto done;
    }
    for (int i = 0; i < e->n_slots; i++) S.free_slots[i] = e->n_slots - 1 - i;
    S.n_free = e->n_slots;
    for (int i = 0; i < n && !rc; i++) {
        out->index[i] = list[i];
        rc = runner_init(&S.env, &S.r[i], t, list[i], &out->results[i], err);
        S.queue[S.n_queue++] = i;
    }
    if (rc || (rc = tier_open(&S, err))) goto done;
    const int64_t cow0 = b->paged->n_cow;
    const double t0 = kv_now();
    while (S.n_finished < n) {
        int64_t need;
        int budget;
        plan(&S, &need, &budget);
        /* not enough blocks: preempt the youngest; alone and still short: it cannot run */
        int preempted = 0;
        while (need > kv_paged_available(b)) {
            runner *victim = &S.r[S.running[S.n_running - 1]];
            if (S.n_running == 1) {
                char why[160];
                snprintf(why, sizeof why, "needs %lld blocks in one step but the pool has only "
                         "%d of %d blocks free while it runs alone", (long long)need,
                         kv_paged_available(b), e->N);
                fail_running(&S, victim, KV_ERR_CAPACITY, why);
            } else {
                if ((rc = preempt(&S, victim, err))) goto done;
                preempted = 1;
            }
            plan(&S, &need, &budget);
        }
        /* a step that had to preempt admits nobody: memory is short right now */
        if (!preempted && (rc = admit_waiting(&S, &budget, &need, err))) goto done;
        if (S.n_batch == 0) {
            if (S.n_finished == n) break;
            if (S.n_running == 0 && S.n_queue > 0 && S.r[S.queue[0]].arrival > S.now) {
                S.now = S.r[S.queue[0]].arrival; /* idle until the next arrival */
                continue;
            }
            if (S.n_running == 0 && S.n_queue > 0 && S.r[S.queue[0]].res->status == KV_OK) {
                /* an empty backend refused it: it cannot run (never expected) */
                runner *r = &S.r[S.queue[0]];
                list_remove(S.queue, &S.n_queue, S.queue[0]);
                tier_forget(&S, r);
                runner_set_error(r, KV_ERR_CAPACITY, "request %d: cannot be admitted into an "
                                 "empty backend", r->idx);
                r->state = R_FAILED;
                e->m->n_failed++;
                S.n_finished++;
                continue;
            }
            if (S.n_running == 0) continue; /* failures were just collected */
            rc = kv_fail(err, KV_ERR_ARG, "scheduler: no progress at step %lld",
                         (long long)S.step);
            goto done;
        }
        rc = execute(&S, err);
        if (rc == KV_ERR_NOMEM && S.n_running > 0) {
            /* Device or host memory ran out inside the step (its scratch grows with the
             * tokens of a step). The backend rolled the step back; retry it smaller: halve
             * the tokens per step, then preempt the youngest request; a request alone in a
             * one-token step that still cannot run fails with the reason. */
            runner *victim = &S.r[S.running[S.n_running - 1]];
            if (S.budget > 1)
                S.budget /= 2;
            else if (S.n_running > 1) {
                if ((rc = preempt(&S, victim, err))) goto done;
            } else
                fail_running(&S, victim, KV_ERR_NOMEM, err ? err->msg : "out of memory");
            e->m->nomem_retries++;
            rc = KV_OK;
            continue;
        }
        if (rc) goto done;
        S.now += o->step_s;
        S.step++;
        measure(&S);
    }
    kv_sched_metrics *m = &out->m;
    m->wall_s = kv_now() - t0;
    m->steps = S.step;
    m->clock_s = S.now;
    m->tokens_per_s = m->wall_s > 0 ? m->tokens_generated / m->wall_s : 0;
    m->utilization = S.step ? S.sum_util / S.step : 0;
    m->waste_internal = S.sum_held > 0 ? S.sum_internal / S.sum_held : 0;
    m->waste_reserved = S.sum_held > 0 ? S.sum_reserved / S.sum_held : 0;
    m->waste = m->waste_internal + m->waste_reserved;
    m->prefix_hit_rate = m->prompt_tokens ? (double)m->prefix_hit_tokens / m->prompt_tokens : 0;
    m->sharing_saving = m->unshared_blocks
                            ? 1.0 - (double)m->shared_blocks / (double)m->unshared_blocks
                            : 0;
    m->cow_copies = b->paged->n_cow - cow0;
    m->swap_blocks_out = S.sw.stats.blocks[KV_LINK_OUT];
    m->swap_blocks_in = S.sw.stats.blocks[KV_LINK_IN];
    m->swap_bytes_out = S.sw.stats.bytes[KV_LINK_OUT];
    m->swap_bytes_in = S.sw.stats.bytes[KV_LINK_IN];
    m->swap_seconds_out = S.sw.stats.seconds[KV_LINK_OUT];
    m->swap_seconds_in = S.sw.stats.seconds[KV_LINK_IN];
    if (S.sw.pool.n_blocks) { /* all finished: the host tier must be empty and consistent */
        m->host_leaked = kv_pool_check_leaks(&S.sw.pool, NULL, 0);
        if (!m->host_leaked && kv_pool_validate(&S.sw.pool, NULL) != KV_OK) m->host_leaked = -1;
    }
done:
    if (rc) /* leave the backend empty even after an error */
        for (int j = S.n_running - 1; j >= 0; j--) runner_release(&S, &S.r[S.running[j]]);
    for (int i = 0; S.r && i < n; i++) tier_forget(&S, &S.r[i]);
    kv_swap_free(&S.sw);
    for (int i = 0; S.r && i < n; i++) runner_free(&S.r[i]);
    free(S.r);
    free(S.queue);
    free(S.running);
    free(S.free_slots);
    free(S.batch);
    free(S.b_runner);
    free(S.b_seq);
    free(S.logits);
    free(e->lcopy);
    free(e->scratch);
    free(e->cand);
    free(e->lp);
    free(e->cum);
    free(S.fill);
    free(S.stamp);
    free(S.touched);
    if (rc) kv_sched_out_free(out);
    return rc;
}

int kv_sched_run(kv_backend *b, const kv_trace *t, int n_requests, const kv_sched_opts *o,
                 kv_sched_out *out, kv_err *err)
{
    if (!t || n_requests < 1 || n_requests > t->n)
        return kv_fail(err, KV_ERR_ARG, "scheduler: %d requests asked of a trace of %d",
                       n_requests, t ? t->n : 0);
    int *list = malloc((size_t)n_requests * sizeof(int));
    if (!list) return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
    for (int i = 0; i < n_requests; i++) list[i] = i;
    int rc = run_list(b, t, list, n_requests, o, out, err);
    free(list);
    return rc;
}

int kv_sched_solo(kv_backend *b, const kv_trace *t, int i, const kv_sched_opts *o,
                  kv_sched_out *out, kv_err *err)
{
    if (!t || i < 0 || i >= t->n)
        return kv_fail(err, KV_ERR_ARG, "scheduler: request %d of a trace of %d", i, t ? t->n : 0);
    return run_list(b, t, &i, 1, o, out, err);
}

void kv_sched_out_free(kv_sched_out *out)
{
    if (!out) return;
    for (int i = 0; out->results && i < out->n; i++) {
        free(out->results[i].tokens);
        free(out->results[i].logprob);
    }
    free(out->results);
    free(out->index);
    memset(out, 0, sizeof *out);
}
