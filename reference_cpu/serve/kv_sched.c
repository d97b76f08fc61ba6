/* The scheduler of kv_sched.h: which requests run each step, on what memory, and what that
 * costs the pool (chapter 05). Continuous batching with chunked prefill, priorities, admission
 * with a watermark, preemption by recompute or (chapter 07) by whole or lru swap to a host
 * tier, the contiguous baselines' reservations, the clock, and the metrics.
 *
 * Read kv_request.h and kv_request.c first: a runner is one request's state machine, and
 * this file only decides when it runs. Then this file: the parts of a step in the order they
 * run (a runner leaving: finish, fail, preempt; plan; admission, priority preemption, resume;
 * execute); run_list ties them into the loop with the clock, and the public entry points
 * close the file. Beside it, each called from here and never calling back: the policies'
 * names and the defaults (kv_sched_opts.c), the queue and running order (kv_sched_queue.c),
 * what swap and lru do with a preempted runner's blocks and the link model
 * (kv_sched_tier.c), and the measurements after each step (kv_sched_metrics.c). */
#include "kv_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Give back a runner's slots (emptied) and its reservation. */
static void runner_release(sched *S, runner *r)
{
    kv_runner_drop_slots(&S->env, r);
    for (int i = 0; i < r->n_seq; i++) S->free_slots[S->n_free++] = r->slots[i];
    S->reserved -= r->res_blocks;
    kv_sched_list_remove(S->running, &S->n_running, (int)(r - S->r));
}

/* A runner entered R_DONE (its result is filled): its memory goes back at once. */
static void finish(sched *S, runner *r)
{
    runner_release(S, r);
    r->res->status = KV_OK;
    r->res->finish_step = S->step;
    r->res->finish_s = S->t; /* execute() set t to the end of the step */
    S->env.m->n_done++;
    S->n_finished++;
}

static void fail_running(sched *S, runner *r, int status, const char *why)
{
    runner_release(S, r);
    kv_runner_set_error(r, status, "request %d: %s", r->idx, why);
    r->state = R_FAILED;
    r->res->finish_step = S->step;
    r->res->finish_s = S->t;
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

/* Preemption: swap the runner out or pause it (swap, lru: kv_sched_tier.c, when it can) or
 * drop its rows for recompute; give its slots back, keep the tokens chosen so far, requeue it
 * first among its priority. */
static int preempt(sched *S, runner *r, kv_err *err)
{
    const int64_t held = rows_held(r);
    int rc = S->env.o->preempt != KV_PREEMPT_RECOMPUTE ? kv_tier_pause(S, r, err) : KV_OK;
    if (rc) return rc;
    if (!r->swapped) S->env.m->tokens_recomputed += held;
    runner_release(S, r);
    r->state = R_WAITING;
    r->res->preemptions++;
    S->env.m->preemptions++;
    kv_sched_queue_push(S, (int)(r - S->r), 1);
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
    if (r->state == R_PROMPT || n_tok > 1) S->prefill_tokens += n_tok; /* else a decode */
    *need += kv_paged_blocks_needed(S->env.b->mem, s->slot, n_tok);
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
    S->prefill_tokens = 0;
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
    if (r->swapped) return kv_tier_blocks_back(S, r); /* swap, lru: kv_sched_tier.c */
    const int P = r->rq.prompt_len, B = S->env.B;
    int64_t need = cdiv(P, B);
    int used_hits = 0;
    if (r->seq[0].n_gen > 0 || r->kind == K_SAMPLES) {
        need = P / B;
        for (int i = 0; i < r->n_seq; i++)
            if (is_live(r, i)) need += cdiv(P + r->seq[i].n_gen, B) - P / B;
    }
    kv_paged *pg = S->env.b->mem->paged;
    if (pg->prefix_caching) kv_prefix_probe(&pg->prefix, r->prompt, P, &used_hits);
    return (int)(need - used_hits);
}

/* A runner preempted by swap or lru comes back (kv_sched_tier.c copies its sequences into
 * its slots with their lengths); it resumes the state it left, and what its sequences had
 * pending joins this step's batch. */
static int resume(sched *S, int ri, int *budget, int64_t *need, kv_err *err)
{
    runner *r = &S->r[ri];
    S->reserved += r->res_blocks;
    kv_sched_running_add(S, ri);
    int rc = kv_tier_resume(S, r, err);
    if (rc) return rc;
    plan_runner(S, ri, need, budget);
    return KV_OK;
}

/* Hand the runner its slots, start it (root slot, prefix hit), and put its first prompt chunk
 * into this step's batch; a runner swapped out is swapped back in instead. */
static int admit(sched *S, int ri, int *budget, int64_t *need, kv_err *err)
{
    runner *r = &S->r[ri];
    for (int i = 0; i < r->n_seq; i++) r->slots[i] = S->free_slots[--S->n_free];
    if (r->swapped) return resume(S, ri, budget, need, err);
    int hit;
    int rc = kv_runner_start(&S->env, r, &hit, err);
    if (rc) return rc;
    S->env.m->prompt_tokens += r->rq.prompt_len;
    S->env.m->prefix_hit_tokens += hit;
    S->reserved += r->res_blocks;
    if (r->res->admit_step < 0) r->res->admit_step = S->step;
    kv_sched_running_add(S, ri);
    const int64_t pending = seq_pending(r, &r->seq[r->root]);
    const int n_tok = (int)(pending < *budget ? pending : *budget);
    batch_add(S, ri, r->root, n_tok, need);
    *budget -= n_tok;
    return KV_OK;
}

/* Blocks runner @p r lacks to be admitted now, after the plan's @p need, with the watermark
 * (<= 0: they are there). Slots and the baselines' reservations are checked apart. */
static int64_t admit_short(sched *S, const runner *r, int64_t need)
{
    const int wm = S->env.o->policy == KV_POLICY_PAGED && S->n_running ? kv_sched_watermark_blocks(S) : 0;
    /* a prompt admitted into the last free blocks would be preempted by the next step's
     * growth of the others: keep a watermark free */
    return (int64_t)prompt_blocks(S, r) + wm - ((int64_t)kv_paged_available(S->env.b->mem) - need);
}

static int lru_on(const sched *S) { return S->env.o->preempt == KV_PREEMPT_LRU && S->tier; }

/* Admit in queue order (priority, preempted, arrival; arrived ones only) while the first
 * fits: first come, first served within a priority. In lru mode the blocks of other paused
 * requests may go to the host to make the room (a synchronous eviction: the step waits). */
static int admit_waiting(sched *S, int *budget, int64_t *need, kv_err *err)
{
    const kv_sched_opts *o = S->env.o;
    const int N = S->env.N;
    while (*budget > 0) {
        const int ri = kv_sched_head_waiting(S);
        if (ri < 0) break;
        runner *r = &S->r[ri];
        if (r->res->status != KV_OK) { /* can never run: reported, not retried */
            r->state = R_FAILED;
            r->res->finish_step = S->step;
            r->res->finish_s = S->t;
            S->env.m->n_failed++;
            S->n_finished++;
            kv_sched_list_remove(S->queue, &S->n_queue, ri);
            continue;
        }
        if (S->n_free < r->n_seq) break;
        if (o->policy != KV_POLICY_PAGED && S->reserved + r->res_blocks > N) break;
        int64_t lack = admit_short(S, r, *need);
        if (lack > 0 && lru_on(S) && kv_tier_evictable(S, ri) >= lack) {
            int freed;
            int rc = kv_tier_make_room(S, (int)lack, ri, 1, &freed, err);
            if (rc) return rc;
            lack = admit_short(S, r, *need);
        }
        if (lack > 0) break;
        kv_sched_list_remove(S->queue, &S->n_queue, ri);
        int rc = admit(S, ri, budget, need, err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* A waiting high-priority request that has arrived preempts running lower-priority ones,
 * youngest first, until it would fit (slots, blocks; in lru mode counting the blocks paused
 * requests could give up); never one of its own priority or higher. *did = 1 when it did. */
static int preempt_for_priority(sched *S, int64_t *need, int *budget, int *did, kv_err *err)
{
    const kv_sched_opts *o = S->env.o;
    for (;;) {
        const int ri = kv_sched_head_waiting(S);
        if (ri < 0 || S->n_running == 0) return KV_OK;
        runner *r = &S->r[ri];
        runner *v = &S->r[S->running[S->n_running - 1]]; /* lowest priority, youngest */
        if (r->res->status != KV_OK || v->prio >= r->prio) return KV_OK;
        int64_t lack = admit_short(S, r, *need);
        if (lru_on(S)) lack -= kv_tier_evictable(S, ri);
        const int fits = lack <= 0 && S->n_free >= r->n_seq &&
                         (o->policy == KV_POLICY_PAGED || S->reserved + r->res_blocks <= S->env.N);
        if (fits) return KV_OK;
        int rc = preempt(S, v, err);
        if (rc) return rc;
        *did = 1;
        plan(S, need, budget);
    }
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
        if ((rc = kv_runner_take_logits(e, r, s, row, err))) return rc;
        if (r->res->first_token_s < 0 && has_token(r)) r->res->first_token_s = S->t;
        if (r->state == R_DONE) finish(S, r); /* a fresh beam request of one token */
    }
    for (int j = 0; j < S->n_running; j++) {
        runner *r = &S->r[S->running[j]];
        if (r->state != R_DECODE) continue;
        if ((rc = kv_runner_advance(e, r, err))) return rc;
        if (r->res->first_token_s < 0 && has_token(r)) r->res->first_token_s = S->t;
        if (r->state == R_DONE) {
            finish(S, r);
            j--; /* finish() removed it from the list */
        }
    }
    return KV_OK;
}

/* Serve the requests @p list [n] of the trace: kv_sched.h's step (plan, preempt, admit,
 * execute, measure) until every one is done or failed, then the run's averages. */
static int run_list(kv_backend *b, const kv_trace *t, const int *list, int n,
                    const kv_sched_opts *o, kv_sched_out *out, kv_err *err)
{
    memset(out, 0, sizeof *out);
    if (!b || !t || !o || n < 1 || !b->mem)
        return kv_fail(err, KV_ERR_ARG, "scheduler: needs a paged backend, a trace and >= 1 "
                       "request");
    if (o->policy < 0 || o->policy > KV_POLICY_ORACLE || o->token_budget < 1 || o->max_len < 1 ||
        !(o->step_s >= 0) || !(o->sample_temperature > 0) || !(o->temperature >= 0) ||
        !(o->top_p > 0 && o->top_p <= 1) || !kv_preempt_name(o->preempt) || o->host_blocks < 0 ||
        !(o->watermark >= 0 && o->watermark < 1) || !(o->token_s >= 0) ||
        (o->prefetch != 0 && o->prefetch != 1))
        return kv_fail(err, KV_ERR_ARG, "scheduler: bad options (policy %d, budget %d, "
                       "max_len %d, sample temperature %g, preempt %d, host blocks %d, "
                       "watermark %g, token_s %g, prefetch %d)",
                       o->policy, o->token_budget, o->max_len, (double)o->sample_temperature,
                       o->preempt, o->host_blocks, o->watermark, o->token_s, o->prefetch);
    for (int s = 0; s < b->spec.n_slots; s++)
        if (b->mem->paged->tables[s].n_blocks)
            return kv_fail(err, KV_ERR_ARG, "scheduler: slot %d is not empty", s);
    sched S;
    memset(&S, 0, sizeof S);
    S.budget = o->token_budget;
    runner_env *e = &S.env;
    e->b = b;
    e->o = o;
    S.pool = &b->mem->paged->pool;
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
        rc = kv_runner_init(&S.env, &S.r[i], t, list[i], &out->results[i], err);
        S.r[i].prio = t->req[list[i]].priority > 0;
        out->results[i].priority = S.r[i].prio;
        out->results[i].arrival_s = S.r[i].arrival;
        out->results[i].first_token_s = out->results[i].finish_s = -1;
        if (!rc) kv_sched_queue_push(&S, i, 0);
    }
    if (rc || (rc = kv_tier_open(&S, err))) goto done;
    const int64_t cow0 = b->mem->paged->n_cow;
    const double t0 = kv_now();
    while (S.n_finished < n) {
        int64_t need;
        int budget;
        S.t = S.now; /* synchronous transfers below push t; the step's compute starts there */
        plan(&S, &need, &budget);
        /* not enough blocks: lru first moves paused requests' blocks to the host (least
         * recently paused first, as many as needed); then preempt the youngest of the lowest
         * priority; alone and still short, a paused request holding device blocks (shared by
         * its forks, or prefetched) recomputes; else the one running cannot run */
        int preempted = 0;
        while (need > kv_paged_available(b->mem)) {
            if (lru_on(&S)) {
                int freed = 0;
                rc = kv_tier_make_room(&S, (int)(need - kv_paged_available(b->mem)), -1, 1, &freed,
                                       err);
                if (rc) goto done;
                if (freed > 0) continue;
            }
            runner *victim = &S.r[S.running[S.n_running - 1]];
            if (S.n_running == 1 && kv_tier_drop_lru(&S, -1)) continue;
            if (S.n_running == 1) {
                char why[160];
                snprintf(why, sizeof why, "needs %lld blocks in one step but the pool has only "
                         "%d of %d blocks free while it runs alone", (long long)need,
                         kv_paged_available(b->mem), e->N);
                fail_running(&S, victim, KV_ERR_CAPACITY, why);
            } else {
                if ((rc = preempt(&S, victim, err))) goto done;
                preempted = 1;
            }
            plan(&S, &need, &budget);
        }
        /* a step that had to preempt admits nobody: memory is short right now. Otherwise a
         * high-priority arrival may preempt lower ones, then the queue is admitted */
        if (!preempted) {
            int by_priority = 0;
            if ((rc = preempt_for_priority(&S, &need, &budget, &by_priority, err)) ||
                (rc = admit_waiting(&S, &budget, &need, err)))
                goto done;
        }
        /* background transfers, overlapping the step: prefetch the queue head, keep the
         * watermark free (lru) */
        if (S.tier && ((rc = kv_tier_prefetch(&S, need, err)) || (rc = kv_tier_watermark(&S, need, err))))
            goto done;
        if (S.n_batch == 0) {
            if (S.n_finished == n) break;
            if (S.n_running == 0) {
                const int h = kv_sched_head_waiting(&S);
                if (h < 0) { /* idle until the next arrival */
                    double next = -1;
                    for (int i = 0; i < S.n_queue; i++)
                        if (next < 0 || S.r[S.queue[i]].arrival < next)
                            next = S.r[S.queue[i]].arrival;
                    if (next > S.now) {
                        S.now = next;
                        continue;
                    }
                } else if (preempted) {
                    continue; /* the last one running just failed: admission comes next step */
                } else if (S.r[h].res->status == KV_OK) {
                    /* paused requests hold the blocks it needs: one of them recomputes */
                    if (kv_tier_drop_lru(&S, h)) continue;
                    /* an empty backend refused it: it cannot run (never expected) */
                    runner *r = &S.r[h];
                    kv_sched_list_remove(S.queue, &S.n_queue, h);
                    kv_tier_forget(&S, r);
                    kv_runner_set_error(r, KV_ERR_CAPACITY, "request %d: cannot be admitted into "
                                     "an empty backend", r->idx);
                    r->state = R_FAILED;
                    r->res->finish_s = S.t;
                    e->m->n_failed++;
                    S.n_finished++;
                    continue;
                } else {
                    continue; /* failures were just collected */
                }
            }
            rc = kv_fail(err, KV_ERR_ARG, "scheduler: no progress at step %lld",
                         (long long)S.step);
            goto done;
        }
        /* the clock model: the step's compute starts once its synchronous transfers are done
         * and lasts step_s plus token_s per prefill token; execute() stamps first tokens and
         * finishes with its end */
        const double start = S.t;
        S.t = start + o->step_s + o->token_s * S.prefill_tokens;
        rc = execute(&S, err);
        if (rc == KV_ERR_NOMEM && S.n_running > 0) {
            /* Device or host memory ran out inside the step (its scratch grows with the
             * tokens of a step). The backend rolled the step back; retry it smaller: halve
             * the tokens per step, then preempt the youngest request; a request alone in a
             * one-token step that still cannot run fails with the reason. */
            runner *victim = &S.r[S.running[S.n_running - 1]];
            e->m->stall_s += start - S.now;
            S.now = S.t = start;
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
        e->m->stall_s += start - S.now;
        e->m->prefill_s += o->token_s * S.prefill_tokens;
        S.now = S.t;
        S.step++;
        kv_sched_measure(&S);
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
    m->cow_copies = b->mem->paged->n_cow - cow0;
    m->swap_blocks_out = S.sw.stats.blocks[KV_LINK_OUT];
    m->swap_blocks_in = S.sw.stats.blocks[KV_LINK_IN];
    m->swap_bytes_out = S.sw.stats.bytes[KV_LINK_OUT];
    m->swap_bytes_in = S.sw.stats.bytes[KV_LINK_IN];
    m->swap_seconds_out = S.sw.stats.seconds[KV_LINK_OUT];
    m->swap_seconds_in = S.sw.stats.seconds[KV_LINK_IN];
    kv_sched_latency_percentiles(out);
    if (S.sw.pool.n_blocks) { /* all finished: the host tier must be empty and consistent */
        m->host_leaked = kv_pool_check_leaks(&S.sw.pool, NULL, 0);
        if (!m->host_leaked && kv_pool_validate(&S.sw.pool, NULL) != KV_OK) m->host_leaked = -1;
    }
done:
    if (rc) /* leave the backend empty even after an error */
        for (int j = S.n_running - 1; j >= 0; j--) runner_release(&S, &S.r[S.running[j]]);
    for (int i = 0; S.r && i < n; i++) kv_tier_forget(&S, &S.r[i]);
    kv_swap_free(&S.sw);
    for (int i = 0; S.r && i < n; i++) kv_runner_free(&S.r[i]);
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
