/* The scheduler's host tier (kv_sched.h, chapter 07): what preemption by swap and by lru do
 * with kv_swap.h, and the link model that turns their bytes into clock time.
 *
 * Read kv_sched.c first: it decides when a request is preempted, readmitted or admitted; this
 * file decides what happens to the preempted request's blocks. In order: the link's two FIFOs;
 * opening the tier; a request leaving (pause: whole swap out, or lru detach) and its fallback
 * to recompute; the blocks it needs back; eviction of paused blocks (only as many as needed,
 * least recently paused first); resume (swap in, waiting for a prefetch still on the link);
 * prefetch of the queue head and the watermark, both in the background. */
#include "kv_request.h"

#include <stdio.h>
#include <string.h>

/* ---- the link: one FIFO per direction ------------------------------------------------------
 * A transfer issued at the step's clock S->t starts when its direction is free and lasts what
 * kv_swap accounted for it (latency + bytes / bandwidth per batched copy). A synchronous one
 * (@p sync) makes the step wait for its end; a background one only occupies the link, so later
 * transfers queue behind it. Returns its end. */
static double link_issue(sched *S, int dir, double secs, int sync)
{
    if (secs <= 0) return S->t;
    const double start = S->t > S->busy[dir] ? S->t : S->busy[dir];
    const double end = start + secs;
    S->busy[dir] = end;
    if (sync && end > S->t) S->t = end;
    return end;
}

static int lru_mode(const sched *S) { return S->env.o->preempt == KV_PREEMPT_LRU && S->tier; }

/* Swap and lru modes: a host tier of opts.host_blocks blocks (0: as many as the device pool)
 * over opts.link. A cache kv_swap refuses leaves the tier off, and the reason in the metrics:
 * every preemption then recomputes, counted as a fallback. */
int kv_tier_open(sched *S, kv_err *err)
{
    const kv_sched_opts *o = S->env.o;
    if (o->preempt == KV_PREEMPT_RECOMPUTE) return KV_OK;
    kv_backend *b = S->env.b;
    const int n = o->host_blocks > 0 ? o->host_blocks : S->env.N;
    kv_err e;
    int rc = !b->mem ? kv_fail(&e, KV_ERR_UNSUPPORTED, "swap: the backend has no block I/O")
             : kv_swap_init(&S->sw, b->mem, n, o->link.bandwidth > 0 ? &o->link : NULL, &e);
    if (rc == KV_ERR_UNSUPPORTED) {
        snprintf(S->env.m->swap_refused, sizeof S->env.m->swap_refused, "%.150s", e.msg);
        return KV_OK;
    }
    if (rc) return kv_fail(err, rc, "%s", e.msg);
    S->tier = 1;
    S->env.m->host_blocks = n;
    return KV_OK;
}

/* Release a runner's paused sequences in both tiers (a runner that will not come back, or
 * one that recomputes instead). */
void kv_tier_forget(sched *S, runner *r)
{
    for (int i = 0; i < r->n_seq; i++) kv_swapped_drop(&S->sw, S->env.b->mem, &r->seq[i].host);
    r->swapped = 0;
    r->prefetching = 0;
}

/* Rows its paused sequences hold: what recompute feeds again if they are dropped. */
static int64_t tier_rows(const runner *r)
{
    int64_t n = r->swap_state == R_PROMPT ? 0 : r->rq.prompt_len;
    for (int i = 0; i < r->n_seq; i++) {
        const kv_swapped *h = &r->seq[i].host;
        if (h->resident) n += r->swap_state == R_PROMPT ? h->n_tokens : h->n_tokens - r->rq.prompt_len;
    }
    return n;
}

/* A paused runner gives its blocks up after all: it recomputes when readmitted (counted). */
static void tier_recompute(sched *S, runner *r)
{
    S->env.m->tokens_recomputed += tier_rows(r);
    S->env.m->recompute_fallbacks++;
    kv_tier_forget(S, r);
}

/* ---- a request leaves ------------------------------------------------------------------------ */

/* Preemption by swap: every sequence holding a slot goes to the host tier whole, and the step
 * waits for the copy. By lru: every such sequence is detached, its blocks kept on the device
 * (no byte moves, no wait). When it cannot, r->swapped stays 0 and the caller recomputes (a
 * counted fallback): no tier (kv_swap refused the cache); swap only: too few host blocks, or
 * sequences that, unshared at their final length, would not fit the device pool (copied per
 * sequence, they could never come back). Returns only errors of the run. */
int kv_tier_pause(sched *S, runner *r, kv_err *err)
{
    kv_sched_metrics *m = S->env.m;
    kv_backend *b = S->env.b;
    const int lru = S->env.o->preempt == KV_PREEMPT_LRU;
    int fits = S->tier;
    if (fits && !lru) {
        const kv_paged *pg = b->mem->paged;
        int64_t host = 0; /* every sequence's table, shared blocks once per sequence */
        for (int i = 0; i < r->n_seq; i++)
            if (r->seq[i].slot >= 0) host += pg->tables[r->seq[i].slot].n_blocks;
        const int64_t unshared =
            (int64_t)r->n_seq * cdiv(r->rq.prompt_len + r->rq.output_len - 1, S->env.B);
        fits = unshared <= S->env.N && host <= kv_pool_available(&S->sw.pool);
    }
    if (!fits) {
        m->recompute_fallbacks++;
        return KV_OK;
    }
    kv_err e;
    int rc = KV_OK, n = 0;
    const double before = S->sw.stats.seconds[KV_LINK_OUT];
    for (int i = 0; i < r->n_seq && !rc; i++) {
        seq_t *s = &r->seq[i];
        if (s->slot < 0) continue;
        rc = lru ? kv_swap_detach(&S->sw, b->mem, s->slot, &s->host, &e)
                 : kv_swap_out(&S->sw, b->mem, s->slot, &s->host, &e);
        if (!rc) { /* the slot is empty now */
            s->slot = -1;
            n++;
        }
    }
    link_issue(S, KV_LINK_OUT, S->sw.stats.seconds[KV_LINK_OUT] - before, 1);
    r->swap_state = r->state;
    if (rc) { /* what went out is dropped: the runner recomputes everything */
        kv_tier_forget(S, r);
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
    r->paused_at = ++S->pause_clock;
    if (lru) m->lru_pauses++;
    else m->swap_preemptions++;
    m->seqs_swapped_out += n;
    return KV_OK;
}

/* Device blocks a paused runner takes when readmitted: its host blocks no prefetch has brought
 * back, the new blocks its pending tokens open (the rest of the prompt, or one token), and a
 * copy of a partial last block it still shares with a fork (copy on write). For a whole swap
 * this is ceil(target / B) per sequence, chapter 05's formula. */
int kv_tier_blocks_back(const sched *S, const runner *r)
{
    const int B = S->env.B;
    const kv_pool *dev = &S->env.b->mem->paged->pool;
    int64_t n = 0;
    for (int i = 0; i < r->n_seq; i++) {
        const kv_swapped *h = &r->seq[i].host;
        if (!h->resident) continue;
        for (int k = 0; k < h->n_blocks; k++) n += h->host_blocks[k] >= 0 && h->pre_blocks[k] < 0;
        const int64_t target = r->swap_state == R_PROMPT ? r->rq.prompt_len : ctx_len(r, &r->seq[i]);
        n += cdiv(target, B) - h->n_blocks;
        if (h->n_blocks && h->n_tokens % B && target > h->n_tokens) {
            const int last = h->dev_blocks[h->n_blocks - 1];
            n += last >= 0 && dev->refcount[last] > 1;
        }
    }
    return (int)n;
}

/* ---- eviction (lru) ------------------------------------------------------------------------- */

/* Blocks kv_swap_evict can move off runner @p r: device blocks only it holds. None while a
 * prefetch is bringing it back (kv_swap_evict would refuse). */
static int evictable(const sched *S, const runner *r)
{
    if (!r->swapped || r->state != R_WAITING || r->prefetching) return 0;
    const kv_pool *dev = &S->env.b->mem->paged->pool;
    int n = 0;
    for (int i = 0; i < r->n_seq; i++) {
        const kv_swapped *h = &r->seq[i].host;
        for (int k = 0; h->resident && k < h->n_blocks; k++)
            n += h->dev_blocks[k] >= 0 && dev->refcount[h->dev_blocks[k]] == 1;
    }
    return n;
}

/* Blocks eviction could free, over every paused runner but @p exclude. */
int kv_tier_evictable(const sched *S, int exclude)
{
    if (!lru_mode(S)) return 0;
    int n = 0;
    for (int i = 0; i < S->n; i++)
        if (i != exclude) n += evictable(S, &S->r[i]);
    return n;
}

/* Free @p want device blocks by moving paused runners' blocks to the host, least recently
 * paused first, last logical block first (kv_swap_evict), no more than asked. @p sync: the
 * step needs them now and waits for the copies; else they overlap the step (the watermark).
 * A runner whose blocks find the host tier full recomputes instead (its device blocks free
 * at once). *freed = blocks the pool gained. */
int kv_tier_make_room(sched *S, int want, int exclude, int sync, int *freed, kv_err *err)
{
    kv_backend *b = S->env.b;
    kv_sched_metrics *m = S->env.m;
    *freed = 0;
    while (lru_mode(S) && *freed < want) {
        runner *p = NULL;
        for (int i = 0; i < S->n; i++)
            if (i != exclude && evictable(S, &S->r[i]) > 0 &&
                (!p || S->r[i].paused_at < p->paused_at))
                p = &S->r[i];
        if (!p) break;
        const int avail0 = kv_paged_available(b->mem);
        const double before = S->sw.stats.seconds[KV_LINK_OUT];
        int full = 0;
        for (int i = p->n_seq - 1; i >= 0 && !full; i--) {
            const int left = want - *freed - (kv_paged_available(b->mem) - avail0);
            if (left <= 0) break;
            if (!p->seq[i].host.resident) continue;
            int moved = 0;
            kv_err e;
            int rc = kv_swap_evict(&S->sw, b->mem, &p->seq[i].host, left, &moved, &e);
            if (rc == KV_ERR_CAPACITY) full = 1;
            else if (rc) return kv_fail(err, rc, "request %d: evict: %s", p->idx, e.msg);
            if (moved) {
                m->evictions++;
                m->evicted_blocks += moved;
                m->evictions_sync += sync;
            }
        }
        link_issue(S, KV_LINK_OUT, S->sw.stats.seconds[KV_LINK_OUT] - before, sync);
        if (full) tier_recompute(S, p);
        *freed += kv_paged_available(b->mem) - avail0;
    }
    return KV_OK;
}

/* The least recently paused runner but @p exclude that holds device blocks (kept, or brought
 * back by a prefetch) recomputes instead: when eviction cannot free what a step needs (shared
 * blocks, a prefetch in flight). Returns 1 when one did. */
int kv_tier_drop_lru(sched *S, int exclude)
{
    runner *p = NULL;
    for (int i = 0; i < S->n; i++) {
        runner *r = &S->r[i];
        if (i == exclude || !r->swapped || r->state != R_WAITING) continue;
        int held = 0;
        for (int j = 0; j < r->n_seq && !held; j++) {
            const kv_swapped *h = &r->seq[j].host;
            for (int k = 0; h->resident && k < h->n_blocks && !held; k++)
                held = h->dev_blocks[k] >= 0 || h->pre_blocks[k] >= 0;
        }
        if (held && (!p || r->paused_at < p->paused_at)) p = r;
    }
    if (!p) return 0;
    tier_recompute(S, p);
    return 1;
}

/* ---- a request comes back ------------------------------------------------------------------- */

/* Each paused sequence goes into one of r->slots with its length: the step waits for a
 * prefetch still on the link (a hit when it is done already), then for the copy of what is
 * still on the host. Admission counted the device blocks, so a refusal is an error of the run. */
int kv_tier_resume(sched *S, runner *r, kv_err *err)
{
    kv_sched_metrics *m = S->env.m;
    if (r->prefetching) {
        if (r->prefetch_end <= S->t) m->prefetch_hits++;
        else S->t = r->prefetch_end;
    }
    const double before = S->sw.stats.seconds[KV_LINK_IN];
    kv_err e;
    for (int i = 0, j = 0; i < r->n_seq; i++) {
        seq_t *s = &r->seq[i];
        if (!s->host.resident) continue;
        const int64_t len = s->host.n_tokens;
        int rc = kv_swap_in(&S->sw, S->env.b->mem, r->slots[j], &s->host, &e);
        if (rc) return kv_fail(err, rc, "request %d: swap in: %s", r->idx, e.msg);
        s->slot = r->slots[j++];
        s->len = len;
        m->seqs_swapped_in++;
    }
    link_issue(S, KV_LINK_IN, S->sw.stats.seconds[KV_LINK_IN] - before, 1);
    r->swapped = 0;
    r->prefetching = 0;
    r->state = r->swap_state;
    return KV_OK;
}

/* opts.prefetch: the first waiting request in queue order, if paused with blocks on the host
 * and predicted to fit the next step, starts coming back now, in the background. Predicted:
 * slots are free and its blocks fit after this step's @p need, inside the watermark's
 * headroom (admission wants the watermark on top: the request is readmitted once the others
 * free a little more, or lru's background eviction restores the headroom). A stricter test
 * (the watermark kept, counting the blocks of requests finishing this step) prefetched too
 * rarely to matter on datasets/traces/bursty.csv. */
int kv_tier_prefetch(sched *S, int64_t need, kv_err *err)
{
    if (!S->env.o->prefetch) return KV_OK;
    const int h = kv_sched_head_waiting(S);
    if (h < 0) return KV_OK;
    runner *r = &S->r[h];
    if (!r->swapped || r->prefetching || S->n_free < r->n_seq) return KV_OK;
    int on_host = 0;
    for (int i = 0; i < r->n_seq; i++)
        on_host += r->seq[i].host.resident ? r->seq[i].host.n_on_host : 0;
    if (on_host == 0) return KV_OK;
    kv_backend *b = S->env.b;
    if ((int64_t)kv_paged_available(b->mem) - need < kv_tier_blocks_back(S, r)) return KV_OK;
    kv_sched_metrics *m = S->env.m;
    const double before = S->sw.stats.seconds[KV_LINK_IN];
    const int64_t blocks0 = S->sw.stats.blocks[KV_LINK_IN];
    kv_err e;
    int rc = KV_OK;
    for (int i = 0; i < r->n_seq && !rc; i++)
        if (r->seq[i].host.resident) rc = kv_swap_prefetch(&S->sw, b->mem, &r->seq[i].host, &e);
    if (rc && rc != KV_ERR_CAPACITY)
        return kv_fail(err, rc, "request %d: prefetch: %s", r->idx, e.msg);
    if (S->sw.stats.blocks[KV_LINK_IN] == blocks0) return KV_OK;
    r->prefetch_end = link_issue(S, KV_LINK_IN, S->sw.stats.seconds[KV_LINK_IN] - before, 0);
    r->prefetching = 1;
    m->prefetches++;
    m->prefetch_blocks += S->sw.stats.blocks[KV_LINK_IN] - blocks0;
    return KV_OK;
}

/* lru: keep opts.watermark of the pool free after this step's @p need by evicting paused
 * blocks ahead of need, in the background (a prefetched request's blocks stay: evictable()). */
int kv_tier_watermark(sched *S, int64_t need, kv_err *err)
{
    if (!lru_mode(S)) return KV_OK;
    const int64_t lack =
        kv_sched_watermark_blocks(S) - ((int64_t)kv_paged_available(S->env.b->mem) - need);
    if (lack <= 0) return KV_OK;
    int freed;
    return kv_tier_make_room(S, (int)lack, -1, 0, &freed, err);
}
