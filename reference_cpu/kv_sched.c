/* Continuous batching over a paged backend (kv_sched.h): runners, the step plan, admission,
 * preemption by recompute, beams by fork, and the allocator metrics of chapter 05. */
#include "kv_sched.h"
#include "kv_beam.h"
#include "kv_sampler.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- runners ------------------------------------------------------------------------------ */

enum { R_WAITING = 0, R_PROMPT = 1, R_DECODE = 2, R_DONE = 3, R_FAILED = 4 };
enum { K_PLAIN = 0, K_SAMPLES = 1, K_BEAM = 2 };

/* One sequence of a request: a sample, a beam, or the plain request itself. Its context is
 * prompt ++ gen[0 .. n_gen-1]; its slot holds the first len tokens of that context, so it
 * has P + n_gen - len tokens to feed before its next choice. */
typedef struct {
    int slot;          /* cache slot, -1 = none */
    int64_t len;       /* tokens the slot holds */
    int *gen;          /* [output_len] tokens chosen so far */
    int n_gen;
    double logprob;    /* cumulative log-prob of gen */
    int done;          /* all output_len tokens chosen; slot released */
    float *logits;     /* beams: [vocab] logits after the full context, held for selection */
    kv_sampler sampler;
    int has_sampler;
} seq_t;

typedef struct {
    int idx;           /* trace index: seeds and prompt tokens */
    kv_request rq;
    int kind;          /* K_PLAIN / K_SAMPLES / K_BEAM */
    int n_seq;         /* 1, n_samples or beam_width */
    int n_live;        /* beams alive (seq[0 .. n_live)); samples: n_seq */
    int state;
    int *prompt;       /* [P] */
    seq_t *seq;        /* [n_seq] */
    int **gen2;        /* beams: [n_seq][output_len] next generation's tokens */
    int *slots;        /* [n_seq] cache slots owned while admitted */
    int root;          /* the sequence that prefills the prompt */
    int res_blocks;    /* baselines: blocks reserved while admitted */
    int min_blocks;    /* fewest blocks it can run in (alone, all sharing used) */
    double arrival;
    kv_sched_result *res;
} runner;

typedef struct {
    kv_backend *b;
    const kv_sched_opts *o;
    kv_pool *pool;
    int B, N, vocab, n_slots;
    runner *r;
    int n;
    int *queue, n_queue;     /* [n] waiting runners: preempted first, then by arrival */
    int *running, n_running; /* [n] admitted runners, oldest admission first */
    int *free_slots, n_free; /* [n_slots] */
    int reserved;            /* baselines: blocks reserved by running requests */
    double now;              /* the step clock */
    int64_t step;
    /* the step's batch */
    kv_seq *batch;           /* [n_slots] */
    int *b_runner, *b_seq;   /* [n_slots] which runner and sequence each entry feeds */
    int n_batch, batch_tokens;
    float *logits;           /* [n_slots][vocab] */
    float *lcopy;            /* [vocab] logits the sampler may overwrite */
    double *scratch;         /* [vocab] */
    kv_beam_cand *cand;      /* [max beam width] */
    const float **lp;        /* [max beam width] parents' logits */
    double *cum;             /* [max beam width] */
    /* metrics: per-block fill of the step and a stamp to count each block once */
    int *fill;               /* [N] */
    int64_t *stamp;          /* [N] */
    int64_t stamp_key;
    int *touched;            /* [N] */
    kv_sched_metrics *m;
    double sum_util, sum_internal, sum_reserved, sum_held;
    int n_finished;
} sched;

static void set_error(runner *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->res->error, sizeof r->res->error, fmt, ap);
    va_end(ap);
    r->res->status = status;
}

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
    return o;
}

/* splitmix64: a seed per (run seed, request, sample) that does not depend on what runs */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t next_pow2(int64_t x)
{
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
}

/* Tokens a sequence's slot holds when all its context is fed (the last chosen token is
 * never fed: nothing reads its logits). */
static int64_t ctx_len(const runner *r, const seq_t *s) { return r->rq.prompt_len + s->n_gen; }

static int is_live(const runner *r, int i)
{
    return r->kind == K_BEAM ? i < r->n_live : !r->seq[i].done;
}

/* ---- setup --------------------------------------------------------------------------------- */

static int runner_init(sched *S, runner *r, const kv_trace *t, int idx, kv_sched_result *res,
                       kv_err *err)
{
    const kv_sched_opts *o = S->o;
    r->idx = idx;
    r->rq = t->req[idx];
    r->res = res;
    r->kind = r->rq.beam_width > 1 ? K_BEAM : r->rq.n_samples > 1 ? K_SAMPLES : K_PLAIN;
    r->n_seq = r->kind == K_BEAM ? r->rq.beam_width : r->rq.n_samples;
    r->n_live = r->kind == K_BEAM ? 1 : r->n_seq;
    r->arrival = o->burst ? 0.0 : r->rq.arrival_s;
    const int P = r->rq.prompt_len, O = r->rq.output_len;
    res->output_len = O;
    res->n_out = r->kind == K_SAMPLES ? r->n_seq : 1;
    res->admit_step = res->finish_step = -1;
    r->prompt = malloc((size_t)P * sizeof(int));
    r->seq = calloc((size_t)r->n_seq, sizeof(seq_t));
    r->slots = malloc((size_t)r->n_seq * sizeof(int));
    res->tokens = calloc((size_t)res->n_out * O, sizeof(int));
    res->logprob = calloc((size_t)res->n_out, sizeof(double));
    if (!r->prompt || !r->seq || !r->slots || !res->tokens || !res->logprob)
        return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory for request %d", idx);
    kv_trace_tokens(t, idx, S->vocab, r->prompt);
    const float temp = r->kind == K_SAMPLES ? o->sample_temperature : o->temperature;
    for (int i = 0; i < r->n_seq; i++) {
        seq_t *s = &r->seq[i];
        s->slot = -1;
        s->gen = malloc((size_t)O * sizeof(int));
        if (!s->gen) return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        if (r->kind == K_BEAM) {
            s->logits = malloc((size_t)S->vocab * sizeof(float));
            if (!s->logits) return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        } else if (temp > 0.0f) {
            uint64_t seed = mix(mix(o->seed ^ mix((uint64_t)idx)) + (uint64_t)i);
            int rc = kv_sampler_init(&s->sampler, S->vocab, temp, o->top_p, seed, err);
            if (rc) return rc;
            s->has_sampler = 1;
        }
    }
    if (r->kind == K_BEAM) {
        r->gen2 = calloc((size_t)r->n_seq, sizeof(int *));
        if (!r->gen2) return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        for (int i = 0; i < r->n_seq; i++)
            if (!(r->gen2[i] = malloc((size_t)O * sizeof(int))))
                return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
    }
    /* The fewest blocks it runs in: full prompt blocks shared, the rest once per sequence. */
    const int64_t full = P / S->B, per_seq = cdiv(P + O - 1, S->B) - full;
    const int64_t min_blocks = full + (int64_t)r->n_seq * per_seq;
    r->min_blocks = (int)(min_blocks < INT32_MAX ? min_blocks : INT32_MAX);
    if (o->policy != KV_POLICY_PAGED) {
        int64_t len = o->policy == KV_POLICY_MAX    ? o->max_len
                      : o->policy == KV_POLICY_POW2 ? P + next_pow2(O) /* the paper's: outputs */
                                                    : P + O;
        int64_t rb = (int64_t)r->n_seq * cdiv(len, S->B);
        r->res_blocks = (int)(rb < INT32_MAX ? rb : INT32_MAX);
    }
    /* requests that can never run fail now, with the reason */
    if ((int64_t)P + O - 1 > S->b->spec.capacity)
        set_error(r, KV_ERR_CAPACITY, "request %d: %d prompt + %d output tokens exceed the "
                  "cache's %d tokens per sequence", idx, P, O, S->b->spec.capacity);
    else if (r->n_seq > S->n_slots)
        set_error(r, KV_ERR_CAPACITY, "request %d: %d sequences, but the backend runs at most "
                  "%d at once", idx, r->n_seq, S->n_slots);
    else if (r->min_blocks > S->N)
        set_error(r, KV_ERR_CAPACITY, "request %d: needs at least %d blocks of %d tokens, the "
                  "pool has %d", idx, r->min_blocks, S->B, S->N);
    else if (o->policy == KV_POLICY_MAX && (int64_t)P + O > o->max_len)
        set_error(r, KV_ERR_CAPACITY, "request %d: %d tokens exceed the max policy's %d per "
                  "sequence", idx, P + O, o->max_len);
    else if (r->res_blocks > S->N)
        set_error(r, KV_ERR_CAPACITY, "request %d: the %s policy reserves %d blocks, the pool "
                  "has %d", idx, kv_policy_name(o->policy), r->res_blocks, S->N);
    return KV_OK;
}

static void runner_free(runner *r)
{
    for (int i = 0; r->seq && i < r->n_seq; i++) {
        free(r->seq[i].gen);
        free(r->seq[i].logits);
        if (r->seq[i].has_sampler) kv_sampler_free(&r->seq[i].sampler);
    }
    for (int i = 0; r->gen2 && i < r->n_seq; i++) free(r->gen2[i]);
    free(r->gen2);
    free(r->prompt);
    free(r->seq);
    free(r->slots);
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
    for (int i = 0; i < r->n_seq; i++) {
        seq_t *s = &r->seq[i];
        if (s->slot >= 0) S->b->reset(S->b, s->slot);
        s->slot = -1;
        s->len = 0;
    }
    for (int i = 0; i < r->n_seq; i++) S->free_slots[S->n_free++] = r->slots[i];
    S->reserved -= r->res_blocks;
    list_remove(S->running, &S->n_running, (int)(r - S->r));
}

static void finish(sched *S, runner *r)
{
    kv_sched_result *res = r->res;
    const int O = r->rq.output_len;
    if (r->kind == K_BEAM) { /* beams are kept sorted: beam 0 is the best */
        memcpy(res->tokens, r->seq[0].gen, (size_t)O * sizeof(int));
        res->logprob[0] = r->seq[0].logprob;
    } else {
        for (int i = 0; i < res->n_out; i++) {
            memcpy(res->tokens + (size_t)i * O, r->seq[i].gen, (size_t)O * sizeof(int));
            res->logprob[i] = r->seq[i].logprob;
        }
    }
    runner_release(S, r);
    r->state = R_DONE;
    res->status = KV_OK;
    res->finish_step = S->step;
    S->m->n_done++;
    S->n_finished++;
}

static void fail_running(sched *S, runner *r, int status, const char *why)
{
    runner_release(S, r);
    set_error(r, status, "request %d: %s", r->idx, why);
    r->state = R_FAILED;
    r->res->finish_step = S->step;
    S->m->n_failed++;
    S->n_finished++;
}

/* Preemption by recompute: drop every slot; keep the tokens chosen so far; requeue first. */
static void preempt(sched *S, runner *r)
{
    runner_release(S, r);
    r->state = R_WAITING;
    r->res->preemptions++;
    S->m->preemptions++;
    memmove(S->queue + 1, S->queue, (size_t)S->n_queue * sizeof(int));
    S->queue[0] = (int)(r - S->r);
    S->n_queue++;
}

/* ---- choosing tokens ------------------------------------------------------------------------ */

/* A plain request or a sample picks its next token from @p logits [vocab]. */
static void choose(sched *S, runner *r, seq_t *s, const float *logits)
{
    int tok;
    if (s->has_sampler) {
        memcpy(S->lcopy, logits, (size_t)S->vocab * sizeof(float));
        tok = kv_sample(&s->sampler, S->lcopy);
    } else {
        tok = kv_argmax(logits, S->vocab);
    }
    s->logprob += kv_log_prob(logits, S->vocab, tok);
    s->gen[s->n_gen++] = tok;
    S->m->tokens_generated++;
    if (s->n_gen == r->rq.output_len) { /* finished: its blocks go back now */
        S->b->reset(S->b, s->slot);
        s->slot = -1;
        s->len = 0;
        s->done = 1;
    }
}

/* A free slot among the runner's own. */
static int spare_slot(const runner *r)
{
    for (int j = 0; j < r->n_seq; j++) {
        int used = 0;
        for (int i = 0; i < r->n_seq && !used; i++) used = r->seq[i].slot == r->slots[j];
        if (!used) return r->slots[j];
    }
    return -1;
}

/* Fork @p src's slot into a fresh slot of the runner for @p dst. */
static int fork_into(sched *S, runner *r, seq_t *dst, const seq_t *src, kv_err *err)
{
    int slot = spare_slot(r);
    if (slot < 0) return kv_fail(err, KV_ERR_ARG, "scheduler: request %d has no spare slot", r->idx);
    int rc = kv_paged_fork(S->b, slot, src->slot, err);
    if (rc) return rc;
    dst->slot = slot;
    dst->len = src->len;
    return KV_OK;
}

/* Every live beam holds its logits: keep the k best continuations. A parent kept by c > 0
 * children lends its slot to the first and is forked for the others; a parent with no
 * child is released first, so its slot can take a sibling's fork. */
static int beam_step(sched *S, runner *r, kv_err *err)
{
    const int k = r->n_seq, O = r->rq.output_len;
    for (int p = 0; p < r->n_live; p++) {
        S->lp[p] = r->seq[p].logits;
        S->cum[p] = r->seq[p].logprob;
    }
    const int nc = kv_beam_select(S->lp, S->cum, r->n_live, S->vocab, k, S->cand, S->scratch);
    if (nc < 1) return kv_fail(err, KV_ERR_ARG, "scheduler: request %d: no finite logits", r->idx);
    int kids[KV_TRACE_MAX_FANOUT] = {0}, slot_of[KV_TRACE_MAX_FANOUT];
    int spare[KV_TRACE_MAX_FANOUT], n_spare = 0;
    int64_t len_of[KV_TRACE_MAX_FANOUT];
    for (int c = 0; c < nc; c++) kids[S->cand[c].parent]++;
    for (int p = 0; p < r->n_live; p++)
        if (!kids[p]) {
            S->b->reset(S->b, r->seq[p].slot);
            r->seq[p].slot = -1;
        }
    /* the runner's slots no kept parent holds */
    for (int j = 0; j < k; j++) {
        int held = 0;
        for (int p = 0; p < r->n_live && !held; p++) held = r->seq[p].slot == r->slots[j];
        if (!held) spare[n_spare++] = r->slots[j];
    }
    for (int c = 0; c < nc; c++) { /* new beam c: slot and tokens from its parent */
        const int p = S->cand[c].parent;
        seq_t *par = &r->seq[p];
        memcpy(r->gen2[c], par->gen, (size_t)par->n_gen * sizeof(int));
        r->gen2[c][par->n_gen] = S->cand[c].token;
        len_of[c] = par->len;
        if (kids[p] > 0) { /* the first child keeps the parent's slot */
            slot_of[c] = par->slot;
            kids[p] = -kids[p];
        } else {
            slot_of[c] = spare[--n_spare];
            int rc = kv_paged_fork(S->b, slot_of[c], par->slot, err);
            if (rc) return rc;
        }
    }
    const int n_gen = r->seq[0].n_gen + 1;
    for (int c = 0; c < k; c++) { /* swap the new generation in */
        seq_t *s = &r->seq[c];
        int *g = s->gen;
        s->gen = r->gen2[c];
        r->gen2[c] = g;
        s->n_gen = n_gen;
        s->logprob = c < nc ? S->cand[c].score : 0.0;
        s->slot = c < nc ? slot_of[c] : -1;
        s->len = c < nc ? len_of[c] : 0;
    }
    r->n_live = nc;
    S->m->tokens_generated += nc;
    if (n_gen == O) finish(S, r);
    return KV_OK;
}

/* The root has fed the whole prompt (row @p logits of the step). */
static int prompt_done(sched *S, runner *r, const float *logits, kv_err *err)
{
    seq_t *root = &r->seq[r->root];
    const int fresh = root->n_gen == 0;
    r->state = R_DECODE;
    if (r->kind == K_BEAM && fresh) {
        memcpy(root->logits, logits, (size_t)S->vocab * sizeof(float));
        return beam_step(S, r, err); /* one parent: the prompt */
    }
    /* the other sequences share the prompt's blocks */
    for (int i = 0; i < r->n_seq; i++) {
        if (i == r->root || !is_live(r, i)) continue;
        int rc = fork_into(S, r, &r->seq[i], root, err);
        if (rc) return rc;
    }
    if (fresh) /* each sample draws its first token from the same logits */
        for (int i = 0; i < r->n_seq; i++)
            if (is_live(r, i)) choose(S, r, &r->seq[i], logits);
    /* resumed: every sequence now re-feeds the tokens it had chosen */
    return KV_OK;
}

/* ---- one step ------------------------------------------------------------------------------- */

static void batch_add(sched *S, int ri, int si, int n_tok, int64_t *need)
{
    runner *r = &S->r[ri];
    seq_t *s = &r->seq[si];
    const int P = r->rq.prompt_len;
    kv_seq *q = &S->batch[S->n_batch];
    q->slot = s->slot;
    q->pos = (int)s->len;
    q->n_tokens = n_tok;
    q->tokens = s->len < P ? r->prompt + s->len : s->gen + (s->len - P);
    S->b_runner[S->n_batch] = ri;
    S->b_seq[S->n_batch] = si;
    S->n_batch++;
    S->batch_tokens += n_tok;
    *need += kv_paged_blocks_needed(S->b, s->slot, n_tok);
}

/* Feed what running sequences have pending, oldest request first, within the budget. */
static void plan(sched *S, int64_t *need, int *budget)
{
    S->n_batch = 0;
    S->batch_tokens = 0;
    *need = 0;
    *budget = S->o->token_budget;
    for (int j = 0; j < S->n_running && *budget > 0; j++) {
        const int ri = S->running[j];
        runner *r = &S->r[ri];
        for (int i = 0; i < r->n_seq && *budget > 0; i++) {
            seq_t *s = &r->seq[i];
            if (s->slot < 0) continue;
            const int64_t end = r->state == R_PROMPT ? r->rq.prompt_len : ctx_len(r, s);
            const int64_t pending = end - s->len;
            if (pending <= 0) continue;
            const int n_tok = (int)(pending < *budget ? pending : *budget);
            batch_add(S, ri, i, n_tok, need);
            *budget -= n_tok;
        }
    }
}

/* Blocks a runner needs at admission, after prefix-cache hits on blocks in use: its whole
 * prompt, and for a preempted one also what its sequences had grown to (it re-feeds those
 * tokens at once; admitting it into less would only preempt it again). */
static int prompt_blocks(sched *S, const runner *r)
{
    const int P = r->rq.prompt_len;
    int64_t need = cdiv(P, S->B);
    int used_hits = 0;
    if (r->seq[0].n_gen > 0 || r->kind == K_SAMPLES) {
        need = P / S->B;
        for (int i = 0; i < r->n_seq; i++)
            if (is_live(r, i)) need += cdiv(P + r->seq[i].n_gen, S->B) - P / S->B;
    }
    kv_paged *pg = S->b->paged;
    if (pg->prefix_caching) kv_prefix_probe(&pg->prefix, r->prompt, P, &used_hits);
    return (int)(need - used_hits);
}

static int admit(sched *S, int ri, int *budget, int64_t *need, kv_err *err)
{
    runner *r = &S->r[ri];
    for (int i = 0; i < r->n_seq; i++) r->slots[i] = S->free_slots[--S->n_free];
    /* the first live sequence prefills the prompt; the others wait for the fork */
    r->root = -1;
    for (int i = 0, j = 0; i < r->n_seq; i++) {
        r->seq[i].slot = -1;
        r->seq[i].len = 0;
        if (!is_live(r, i)) continue;
        if (r->root < 0) {
            r->root = i;
            r->seq[i].slot = r->slots[j++];
        }
    }
    seq_t *root = &r->seq[r->root];
    int hit = 0;
    int rc = kv_paged_match_prefix(S->b, root->slot, r->prompt, r->rq.prompt_len, &hit, err);
    if (rc) return rc;
    root->len = hit;
    S->m->prompt_tokens += r->rq.prompt_len;
    S->m->prefix_hit_tokens += hit;
    S->reserved += r->res_blocks;
    r->state = R_PROMPT;
    if (r->res->admit_step < 0) r->res->admit_step = S->step;
    S->running[S->n_running++] = ri;
    const int64_t pending = r->rq.prompt_len - hit;
    const int n_tok = (int)(pending < *budget ? pending : *budget);
    batch_add(S, ri, r->root, n_tok, need);
    *budget -= n_tok;
    return KV_OK;
}

/* Admit from the queue front while the front fits (first come, first served). */
static int admit_waiting(sched *S, int *budget, int64_t *need, kv_err *err)
{
    while (S->n_queue > 0 && *budget > 0) {
        const int ri = S->queue[0];
        runner *r = &S->r[ri];
        if (r->res->status != KV_OK) { /* can never run: reported, not retried */
            r->state = R_FAILED;
            r->res->finish_step = S->step;
            S->m->n_failed++;
            S->n_finished++;
            list_remove(S->queue, &S->n_queue, ri);
            continue;
        }
        if (r->arrival > S->now) break;
        if (S->n_free < r->n_seq) break;
        if (S->o->policy != KV_POLICY_PAGED && S->reserved + r->res_blocks > S->N) break;
        /* keep a watermark of 1 % of the pool free: a prompt admitted into the last free
         * blocks would be preempted by the next step's growth of the others */
        const int watermark =
            S->o->policy == KV_POLICY_PAGED && S->n_running ? (S->N + 99) / 100 : 0;
        if ((int64_t)kv_paged_available(S->b) - *need < prompt_blocks(S, r) + watermark) break;
        list_remove(S->queue, &S->n_queue, ri);
        int rc = admit(S, ri, budget, need, err);
        if (rc) return rc;
    }
    return KV_OK;
}

/* Pool occupancy after a step: stored tokens, internal and reserved waste, sharing. */
static void measure(sched *S)
{
    kv_paged *pg = S->b->paged;
    kv_sched_metrics *m = S->m;
    const int B = S->B;
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
    S->sum_util += (double)stored / ((double)S->N * B);
    S->sum_internal += (double)(phys - stored);
    S->sum_reserved += (double)(held - phys);
    S->sum_held += (double)held;
    if (seqs > m->peak_seqs) m->peak_seqs = seqs;
    if (S->n_running > m->peak_reqs) m->peak_reqs = S->n_running;
    if (S->pool->n_used > m->peak_used_blocks) m->peak_used_blocks = S->pool->n_used;
    if (S->o->on_step) {
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
        S->o->on_step(S->o->user, &info);
    }
}

/* Run the batch and hand each finished row of logits to its sequence. */
static int execute(sched *S, kv_err *err)
{
    int rc = S->b->forward(S->b, S->batch, S->n_batch, S->logits, NULL, err);
    if (rc) return rc;
    S->m->tokens_processed += S->batch_tokens;
    for (int j = 0; j < S->n_batch; j++) {
        runner *r = &S->r[S->b_runner[j]];
        seq_t *s = &r->seq[S->b_seq[j]];
        s->len += S->batch[j].n_tokens;
        const float *row = S->logits + (size_t)j * S->vocab;
        if (r->state == R_PROMPT) {
            if (s->len == r->rq.prompt_len && (rc = prompt_done(S, r, row, err))) return rc;
        } else if (s->len == ctx_len(r, s)) {
            if (r->kind == K_BEAM) memcpy(s->logits, row, (size_t)S->vocab * sizeof(float));
            else choose(S, r, s, row);
        }
    }
    /* beams choose together, once all of them hold their logits; samples finish alone */
    for (int j = 0; j < S->n_running; j++) {
        runner *r = &S->r[S->running[j]];
        if (r->state != R_DECODE) continue;
        if (r->kind == K_BEAM) {
            int ready = 1;
            for (int i = 0; i < r->n_live; i++) ready &= r->seq[i].len == ctx_len(r, &r->seq[i]);
            if (ready) {
                if ((rc = beam_step(S, r, err))) return rc;
                if (r->state == R_DONE) j--; /* finish() removed it from the list */
            }
        } else {
            int all = 1;
            for (int i = 0; i < r->n_seq; i++) all &= r->seq[i].done;
            if (all) {
                finish(S, r);
                j--;
            }
        }
    }
    return KV_OK;
}

static int run_list(kv_backend *b, const kv_trace *t, const int *list, int n,
                    const kv_sched_opts *o, kv_sched_out *out, kv_err *err)
{
    memset(out, 0, sizeof *out);
    if (!b || !t || !o || n < 1 || !b->paged)
        return kv_fail(err, KV_ERR_ARG, "scheduler: needs a paged backend, a trace and >= 1 "
                       "request");
    if (o->policy < 0 || o->policy > KV_POLICY_ORACLE || o->token_budget < 1 || o->max_len < 1 ||
        !(o->step_s >= 0) || !(o->sample_temperature > 0) || !(o->temperature >= 0) ||
        !(o->top_p > 0 && o->top_p <= 1))
        return kv_fail(err, KV_ERR_ARG, "scheduler: bad options (policy %d, budget %d, "
                       "max_len %d, sample temperature %g)", o->policy, o->token_budget,
                       o->max_len, (double)o->sample_temperature);
    for (int s = 0; s < b->spec.n_slots; s++)
        if (b->paged->tables[s].n_blocks)
            return kv_fail(err, KV_ERR_ARG, "scheduler: slot %d is not empty", s);
    sched S;
    memset(&S, 0, sizeof S);
    S.b = b;
    S.o = o;
    S.pool = &b->paged->pool;
    S.B = S.pool->block_size;
    S.N = S.pool->n_blocks;
    S.vocab = b->config->vocab_size;
    S.n_slots = b->spec.n_slots;
    S.n = n;
    S.m = &out->m;
    int kmax = 1;
    for (int i = 0; i < n; i++)
        if (t->req[list[i]].beam_width > kmax) kmax = t->req[list[i]].beam_width;
    S.r = calloc((size_t)n, sizeof(runner));
    S.queue = malloc((size_t)n * sizeof(int));
    S.running = malloc((size_t)n * sizeof(int));
    S.free_slots = malloc((size_t)S.n_slots * sizeof(int));
    S.batch = calloc((size_t)S.n_slots, sizeof(kv_seq));
    S.b_runner = malloc((size_t)S.n_slots * sizeof(int));
    S.b_seq = malloc((size_t)S.n_slots * sizeof(int));
    S.logits = malloc((size_t)S.n_slots * S.vocab * sizeof(float));
    S.lcopy = malloc((size_t)S.vocab * sizeof(float));
    S.scratch = malloc((size_t)S.vocab * sizeof(double));
    S.cand = malloc((size_t)kmax * sizeof(kv_beam_cand));
    S.lp = malloc((size_t)kmax * sizeof(float *));
    S.cum = malloc((size_t)kmax * sizeof(double));
    S.fill = malloc((size_t)S.N * sizeof(int));
    S.stamp = calloc((size_t)S.N, sizeof(int64_t));
    S.touched = malloc((size_t)S.N * sizeof(int));
    out->n = n;
    out->index = malloc((size_t)n * sizeof(int));
    out->results = calloc((size_t)n, sizeof(kv_sched_result));
    int rc = KV_OK;
    if (!S.r || !S.queue || !S.running || !S.free_slots || !S.batch || !S.b_runner || !S.b_seq ||
        !S.logits || !S.lcopy || !S.scratch || !S.cand || !S.lp || !S.cum || !S.fill ||
        !S.stamp || !S.touched || !out->index || !out->results) {
        rc = kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        goto done;
    }
    for (int i = 0; i < S.n_slots; i++) S.free_slots[i] = S.n_slots - 1 - i;
    S.n_free = S.n_slots;
    for (int i = 0; i < n && !rc; i++) {
        out->index[i] = list[i];
        rc = runner_init(&S, &S.r[i], t, list[i], &out->results[i], err);
        S.queue[S.n_queue++] = i;
    }
    if (rc) goto done;
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
                         kv_paged_available(b), S.N);
                fail_running(&S, victim, KV_ERR_CAPACITY, why);
            } else {
                preempt(&S, victim);
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
                set_error(r, KV_ERR_CAPACITY, "request %d: cannot be admitted into an empty "
                          "backend", r->idx);
                r->state = R_FAILED;
                S.m->n_failed++;
                S.n_finished++;
                continue;
            }
            if (S.n_running == 0) continue; /* failures were just collected */
            rc = kv_fail(err, KV_ERR_ARG, "scheduler: no progress at step %lld",
                         (long long)S.step);
            goto done;
        }
        if ((rc = execute(&S, err))) goto done;
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
done:
    if (rc) /* leave the backend empty even after an error */
        for (int j = S.n_running - 1; j >= 0; j--) runner_release(&S, &S.r[S.running[j]]);
    for (int i = 0; S.r && i < n; i++) runner_free(&S.r[i]);
    free(S.r);
    free(S.queue);
    free(S.running);
    free(S.free_slots);
    free(S.batch);
    free(S.b_runner);
    free(S.b_seq);
    free(S.logits);
    free(S.lcopy);
    free(S.scratch);
    free(S.cand);
    free(S.lp);
    free(S.cum);
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
