/* One request being served (kv_request.h): how a runner is set up from its trace row, starts
 * on the slots the scheduler hands it, turns each row of logits into its next tokens (plain
 * and sampled requests one sequence at a time, beams all together), forks the prompt's slot
 * into its other sequences, and, after a preemption, re-prefills and re-feeds what it had
 * generated so it continues where it stopped.
 *
 * Read kv_request.h first, then this file top to bottom (the order a request lives), then
 * kv_sched.c, which decides when each of these runs. Nothing here touches the queue, the
 * free slots or the pool's accounting: those are the scheduler's. */
#include "kv_request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kv_runner_set_error(runner *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->res->error, sizeof r->res->error, fmt, ap);
    va_end(ap);
    r->res->status = status;
}

/* splitmix64: a seed per (run seed, request, sample) that does not depend on what runs */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int64_t next_pow2(int64_t x)
{
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
}

/* ---- setup --------------------------------------------------------------------------------- */

/* Buffers, prompt tokens and per-sample generators of request @p idx; what a baseline policy
 * reserves for it; and, for a request that can never run, the reason (in its result: the
 * scheduler reports it instead of admitting it). */
int kv_runner_init(const runner_env *e, runner *r, const kv_trace *t, int idx,
                kv_sched_result *res, kv_err *err)
{
    const kv_sched_opts *o = e->o;
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
    kv_trace_tokens(t, idx, e->vocab, r->prompt);
    const float temp = r->kind == K_SAMPLES ? o->sample_temperature : o->temperature;
    for (int i = 0; i < r->n_seq; i++) {
        seq_t *s = &r->seq[i];
        s->slot = -1;
        s->gen = malloc((size_t)O * sizeof(int));
        if (!s->gen) return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        if (r->kind == K_BEAM) {
            s->logits = malloc((size_t)e->vocab * sizeof(float));
            if (!s->logits) return kv_fail(err, KV_ERR_NOMEM, "scheduler: out of memory");
        } else if (temp > 0.0f) {
            uint64_t seed = mix(mix(o->seed ^ mix((uint64_t)idx)) + (uint64_t)i);
            int rc = kv_sampler_init(&s->sampler, e->vocab, temp, o->top_p, seed, err);
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
    const int64_t full = P / e->B, per_seq = cdiv(P + O - 1, e->B) - full;
    const int64_t min_blocks = full + (int64_t)r->n_seq * per_seq;
    r->min_blocks = (int)(min_blocks < INT32_MAX ? min_blocks : INT32_MAX);
    if (o->policy != KV_POLICY_PAGED) {
        int64_t len = o->policy == KV_POLICY_MAX    ? o->max_len
                      : o->policy == KV_POLICY_POW2 ? P + next_pow2(O) /* the paper's: outputs */
                                                    : P + O;
        int64_t rb = (int64_t)r->n_seq * cdiv(len, e->B);
        r->res_blocks = (int)(rb < INT32_MAX ? rb : INT32_MAX);
    }
    /* requests that can never run fail now, with the reason */
    if ((int64_t)P + O - 1 > e->b->spec.capacity)
        kv_runner_set_error(r, KV_ERR_CAPACITY, "request %d: %d prompt + %d output tokens exceed "
                         "the cache's %d tokens per sequence", idx, P, O, e->b->spec.capacity);
    else if (r->n_seq > e->n_slots)
        kv_runner_set_error(r, KV_ERR_CAPACITY, "request %d: %d sequences, but the backend runs "
                         "at most %d at once", idx, r->n_seq, e->n_slots);
    else if (r->min_blocks > e->N)
        kv_runner_set_error(r, KV_ERR_CAPACITY, "request %d: needs at least %d blocks of %d "
                         "tokens, the pool has %d", idx, r->min_blocks, e->B, e->N);
    else if (o->policy == KV_POLICY_MAX && (int64_t)P + O > o->max_len)
        kv_runner_set_error(r, KV_ERR_CAPACITY, "request %d: %d tokens exceed the max policy's "
                         "%d per sequence", idx, P + O, o->max_len);
    else if (r->res_blocks > e->N)
        kv_runner_set_error(r, KV_ERR_CAPACITY, "request %d: the %s policy reserves %d blocks, "
                         "the pool has %d", idx, kv_policy_name(o->policy), r->res_blocks, e->N);
    return KV_OK;
}

/* ---- admitted: the prompt ------------------------------------------------------------------ */

/* Admitted onto r->slots (filled by the scheduler). The first live sequence is the root: it
 * alone prefills the prompt, starting after the prompt-cache hit (@p hit tokens); the others
 * wait for the fork. A preempted runner starts the same way: its tokens chosen so far are
 * kept, and are re-fed once the prompt is back. */
int kv_runner_start(const runner_env *e, runner *r, int *hit, kv_err *err)
{
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
    *hit = 0;
    int rc = kv_paged_match_prefix(e->b->mem, root->slot, r->prompt, r->rq.prompt_len, hit, err);
    if (rc) return rc;
    root->len = *hit;
    r->state = R_PROMPT;
    return KV_OK;
}

/* ---- choosing tokens ------------------------------------------------------------------------ */

/* A plain request or a sample picks its next token from @p logits [vocab]; NaN or inf
 * logits are refused, as beam_step refuses them. */
static int choose(const runner_env *e, runner *r, seq_t *s, const float *logits, kv_err *err)
{
    kv_err e2;
    if (kv_logits_check(logits, e->vocab, &e2))
        return kv_fail(err, KV_ERR_ARG, "scheduler: request %d: %s", r->idx, e2.msg);
    int tok;
    if (s->has_sampler) {
        memcpy(e->lcopy, logits, (size_t)e->vocab * sizeof(float));
        tok = kv_sample(&s->sampler, e->lcopy);
    } else {
        tok = kv_argmax(logits, e->vocab);
    }
    s->logprob += kv_log_prob(logits, e->vocab, tok);
    s->gen[s->n_gen++] = tok;
    e->m->tokens_generated++;
    if (s->n_gen == r->rq.output_len) { /* finished: its blocks go back now */
        e->b->reset(e->b, s->slot);
        s->slot = -1;
        s->len = 0;
        s->done = 1;
    }
    return KV_OK;
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
static int fork_into(const runner_env *e, runner *r, seq_t *dst, const seq_t *src, kv_err *err)
{
    int slot = spare_slot(r);
    if (slot < 0)
        return kv_fail(err, KV_ERR_ARG, "scheduler: request %d has no spare slot", r->idx);
    int rc = kv_paged_fork(e->b->mem, slot, src->slot, err);
    if (rc) return rc;
    dst->slot = slot;
    dst->len = src->len;
    return KV_OK;
}

/* Every token chosen: copy the outcome into the result and enter R_DONE, which tells the
 * scheduler to take the runner's slots back. */
static void collect(runner *r)
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
    r->state = R_DONE;
}

/* Every live beam holds its logits: keep the k best continuations. A parent kept by c > 0
 * children lends its slot to the first and is forked for the others; a parent with no
 * child is released first, so its slot can take a sibling's fork. */
static int beam_step(const runner_env *e, runner *r, kv_err *err)
{
    const int k = r->n_seq, O = r->rq.output_len;
    for (int p = 0; p < r->n_live; p++) {
        e->lp[p] = r->seq[p].logits;
        e->cum[p] = r->seq[p].logprob;
    }
    const int nc = kv_beam_select(e->lp, e->cum, r->n_live, e->vocab, k, e->cand, e->scratch);
    if (nc < 1) return kv_fail(err, KV_ERR_ARG, "scheduler: request %d: no finite logits", r->idx);
    int kids[KV_TRACE_MAX_FANOUT] = {0}, slot_of[KV_TRACE_MAX_FANOUT];
    int spare[KV_TRACE_MAX_FANOUT], n_spare = 0;
    int64_t len_of[KV_TRACE_MAX_FANOUT];
    for (int c = 0; c < nc; c++) kids[e->cand[c].parent]++;
    for (int p = 0; p < r->n_live; p++)
        if (!kids[p]) {
            e->b->reset(e->b, r->seq[p].slot);
            r->seq[p].slot = -1;
        }
    /* the runner's slots no kept parent holds */
    for (int j = 0; j < k; j++) {
        int held = 0;
        for (int p = 0; p < r->n_live && !held; p++) held = r->seq[p].slot == r->slots[j];
        if (!held) spare[n_spare++] = r->slots[j];
    }
    for (int c = 0; c < nc; c++) { /* new beam c: slot and tokens from its parent */
        const int p = e->cand[c].parent;
        seq_t *par = &r->seq[p];
        memcpy(r->gen2[c], par->gen, (size_t)par->n_gen * sizeof(int));
        r->gen2[c][par->n_gen] = e->cand[c].token;
        len_of[c] = par->len;
        if (kids[p] > 0) { /* the first child keeps the parent's slot */
            slot_of[c] = par->slot;
            kids[p] = -kids[p];
        } else {
            slot_of[c] = spare[--n_spare];
            int rc = kv_paged_fork(e->b->mem, slot_of[c], par->slot, err);
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
        s->logprob = c < nc ? e->cand[c].score : 0.0;
        s->slot = c < nc ? slot_of[c] : -1;
        s->len = c < nc ? len_of[c] : 0;
    }
    r->n_live = nc;
    e->m->tokens_generated += nc;
    if (n_gen == O) collect(r);
    return KV_OK;
}

/* The root has fed the whole prompt (@p logits: its last row). */
static int prompt_done(const runner_env *e, runner *r, const float *logits, kv_err *err)
{
    seq_t *root = &r->seq[r->root];
    const int fresh = root->n_gen == 0;
    r->state = R_DECODE;
    if (r->kind == K_BEAM && fresh) {
        memcpy(root->logits, logits, (size_t)e->vocab * sizeof(float));
        return beam_step(e, r, err); /* one parent: the prompt */
    }
    /* the other sequences share the prompt's blocks */
    for (int i = 0; i < r->n_seq; i++) {
        if (i == r->root || !is_live(r, i)) continue;
        int rc = fork_into(e, r, &r->seq[i], root, err);
        if (rc) return rc;
    }
    if (fresh) /* each sample draws its first token from the same logits */
        for (int i = 0; i < r->n_seq; i++) {
            int rc = is_live(r, i) ? choose(e, r, &r->seq[i], logits, err) : KV_OK;
            if (rc) return rc;
        }
    /* resumed: every sequence now re-feeds the tokens it had chosen */
    return KV_OK;
}

/* ---- each step ------------------------------------------------------------------------------ */

/* Sequence @p s has just fed its tokens of the step; @p logits [vocab] is the row after the
 * last one. Only a row after the whole context means anything: the prompt's end, or a
 * sequence caught up with what it chose. A beam only keeps its row: beams choose together
 * (kv_runner_advance). A fresh beam request can enter R_DONE here (output_len 1). */
int kv_runner_take_logits(const runner_env *e, runner *r, seq_t *s, const float *logits,
                       kv_err *err)
{
    if (r->state == R_PROMPT) {
        if (s->len == r->rq.prompt_len) return prompt_done(e, r, logits, err);
    } else if (s->len == ctx_len(r, s)) {
        if (r->kind == K_BEAM) memcpy(s->logits, logits, (size_t)e->vocab * sizeof(float));
        else return choose(e, r, s, logits, err);
    }
    return KV_OK;
}

/* After every row of the step was taken: beams choose once all of them hold their logits;
 * samples finish when the last one has. Either may enter R_DONE. */
int kv_runner_advance(const runner_env *e, runner *r, kv_err *err)
{
    if (r->kind == K_BEAM) {
        int ready = 1;
        for (int i = 0; i < r->n_live; i++) ready &= r->seq[i].len == ctx_len(r, &r->seq[i]);
        return ready ? beam_step(e, r, err) : KV_OK;
    }
    int all = 1;
    for (int i = 0; i < r->n_seq; i++) all &= r->seq[i].done;
    if (all) collect(r);
    return KV_OK;
}

/* ---- leaving ------------------------------------------------------------------------------- */

/* Empty every slot the runner's sequences hold (finished, failed or preempted); the tokens
 * chosen so far stay, for a preempted runner to resume from. */
void kv_runner_drop_slots(const runner_env *e, runner *r)
{
    for (int i = 0; i < r->n_seq; i++) {
        seq_t *s = &r->seq[i];
        if (s->slot >= 0) e->b->reset(e->b, s->slot);
        s->slot = -1;
        s->len = 0;
    }
}

void kv_runner_free(runner *r)
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
