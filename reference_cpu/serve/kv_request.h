/*
 * kv_request.h — internal to the scheduler (kv_request.c, kv_sched_queue.c, kv_sched_tier.c,
 * kv_sched_metrics.c, kv_sched.c); not part of the API.
 *
 * A runner is one request of a trace (a ::kv_request row, kv_trace.h) being served: the
 * state machine of kv_sched.h's opening comment,
 *
 *   R_WAITING -> R_PROMPT (the root sequence prefills) -> R_DECODE -> R_DONE or R_FAILED,
 *
 * over one to KV_TRACE_MAX_FANOUT sequences. Read this header, then kv_request.c (how a
 * runner turns logits into tokens, forks and releases slots), then kv_sched.c (which
 * runners run, when, and what that costs the pool).
 *
 * The split of work: kv_request.c touches only its runner and the backend's slots the runner
 * owns; the scheduler owns the queue and the running list (kv_sched_queue.c), the free
 * slots, reservations and every count except tokens_generated (kv_sched.c,
 * kv_sched_metrics.c). A runner that has chosen its last token says so by entering
 * R_DONE; the scheduler then gives its slots back (kv_sched.c, finish()). Swapping a
 * preempted runner's sequences out and in is the scheduler's too (it owns the host tier,
 * kv_sched_tier.c): a runner only carries, per sequence, where its rows wait (seq_t.host).
 * The scheduler's own state (struct sched) closes this header, for its files.
 *
 * Calls go one way, bottom up: kv_sched_opts.c <- kv_request.c <- kv_sched_queue.c <-
 * kv_sched_tier.c <- kv_sched.c (and kv_sched_metrics.c, which only kv_sched.c calls). A
 * runner never calls the scheduler; the host tier never calls the step.
 */
#ifndef KV_REQUEST_H
#define KV_REQUEST_H

#include "kv_beam.h"
#include "kv_sampler.h"
#include "kv_sched.h"
#include "kv_swap.h"

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
    kv_swapped host;   /* swap, lru: where its rows wait while preempted (host.resident) */
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
    int prio;          /* 0 normal, 1 high (the trace's priority) */
    int swapped;       /* preempted by swap or lru: its live sequences wait in seq[].host */
    int swap_state;    /* the state it left (R_PROMPT or R_DECODE), resumed on swap in */
    int64_t paused_at; /* lru: the pause counter when it was preempted (least recent first) */
    int prefetching;   /* a prefetch brought (or is bringing) its host blocks back */
    double prefetch_end; /* the clock when that transfer ends on the link model */
    kv_sched_result *res;
} runner;

/* What every runner borrows from the scheduler: the backend, the run's options, the pool's
 * shape, scratch for choosing tokens (one runner chooses at a time), and the metrics. */
typedef struct {
    kv_backend *b;
    const kv_sched_opts *o;
    int B, N, vocab, n_slots;  /* block size, blocks in the pool, vocabulary, cache slots */
    float *lcopy;              /* [vocab] logits the sampler may overwrite */
    double *scratch;           /* [vocab] */
    kv_beam_cand *cand;        /* [max beam width] */
    const float **lp;          /* [max beam width] parents' logits */
    double *cum;               /* [max beam width] */
    kv_sched_metrics *m;
} runner_env;

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Tokens a sequence's slot holds when all its context is fed (the last chosen token is
 * never fed: nothing reads its logits). */
static inline int64_t ctx_len(const runner *r, const seq_t *s)
{
    return r->rq.prompt_len + s->n_gen;
}

static inline int is_live(const runner *r, int i)
{
    return r->kind == K_BEAM ? i < r->n_live : !r->seq[i].done;
}

/* Tokens sequence s still has to feed before its next choice (the root's prompt while
 * R_PROMPT), and where they start: in the prompt, or in what it generated. */
static inline int64_t seq_pending(const runner *r, const seq_t *s)
{
    return (r->state == R_PROMPT ? r->rq.prompt_len : ctx_len(r, s)) - s->len;
}
static inline const int *seq_next_tokens(const runner *r, const seq_t *s)
{
    const int P = r->rq.prompt_len;
    return s->len < P ? r->prompt + s->len : s->gen + (s->len - P);
}

/* Tokens the runner has chosen (any sequence): its first token is out. */
static inline int has_token(const runner *r)
{
    for (int i = 0; i < r->n_seq; i++)
        if (r->seq[i].n_gen > 0) return 1;
    return 0;
}

/* kv_request.c, in the order a request meets them */
void kv_runner_set_error(runner *r, int status, const char *fmt, ...);
int kv_runner_init(const runner_env *e, runner *r, const kv_trace *t, int idx,
                kv_sched_result *res, kv_err *err);
int kv_runner_start(const runner_env *e, runner *r, int *hit, kv_err *err);
int kv_runner_take_logits(const runner_env *e, runner *r, seq_t *s, const float *logits,
                       kv_err *err);
int kv_runner_advance(const runner_env *e, runner *r, kv_err *err);
void kv_runner_drop_slots(const runner_env *e, runner *r);
void kv_runner_free(runner *r);

/* ---- the scheduler's state (kv_sched*.c; the host tier's part in kv_sched_tier.c) --------- */

typedef struct {
    runner_env env;          /* backend, options, pool shape, choosing scratch, metrics */
    kv_pool *pool;
    runner *r;
    int n;
    int *queue, n_queue;     /* [n] waiting runners: priority, then preempted, then arrival */
    int *running, n_running; /* [n] admitted runners: priority, then oldest admission first */
    int *free_slots, n_free; /* [n_slots] */
    int reserved;            /* baselines: blocks reserved by running requests */
    double now;              /* the step clock at the start of the step */
    double t;                /* the step's clock so far: now + stalls (synchronous transfers) */
    double busy[2];          /* the link model: when each direction's FIFO is free again */
    int64_t step;
    int budget;              /* tokens per step: the option, halved each time memory ran out */
    /* the step's batch */
    kv_seq *batch;           /* [n_slots] */
    int *b_runner, *b_seq;   /* [n_slots] which runner and sequence each entry feeds */
    int n_batch, batch_tokens;
    int prefill_tokens;      /* tokens of the batch that are not one-token decodes */
    float *logits;           /* [n_slots][vocab] */
    /* metrics: per-block fill of the step and a stamp to count each block once */
    int *fill;               /* [N] */
    int64_t *stamp;          /* [N] */
    int64_t stamp_key;
    int *touched;            /* [N] */
    double sum_util, sum_internal, sum_reserved, sum_held;
    int n_finished;
    /* swap and lru modes: the host tier (kv_swap.h) */
    kv_swap sw;
    int tier;                /* 1: swapping is possible; 0: every preemption recomputes */
    int64_t pause_clock;     /* lru: counts pauses, for least-recently-paused order */
} sched;

/* The scheduler's files, bottom up: each calls only into the ones before it (and
 * kv_request.c, kv_sched_opts.c), never back.
 * kv_sched_queue.c: the queue and running order, the watermark */
void kv_sched_list_remove(int *list, int *n, int v);
void kv_sched_queue_push(sched *S, int ri, int preempted);
int kv_sched_head_waiting(const sched *S);
void kv_sched_running_add(sched *S, int ri);
int kv_sched_watermark_blocks(const sched *S);

/* kv_sched_tier.c: the host tier, the link model, and what swap and lru do with them */
int kv_tier_open(sched *S, kv_err *err);
void kv_tier_forget(sched *S, runner *r);
int kv_tier_pause(sched *S, runner *r, kv_err *err);
int kv_tier_blocks_back(const sched *S, const runner *r);
int kv_tier_evictable(const sched *S, int exclude);
int kv_tier_make_room(sched *S, int want, int exclude, int sync, int *freed, kv_err *err);
int kv_tier_drop_lru(sched *S, int exclude);
int kv_tier_resume(sched *S, runner *r, kv_err *err);
int kv_tier_prefetch(sched *S, int64_t need, kv_err *err);
int kv_tier_watermark(sched *S, int64_t need, kv_err *err);

/* kv_sched_metrics.c: the pool's occupancy after a step; a finished run's percentiles */
void kv_sched_measure(sched *S);
void kv_sched_latency_percentiles(kv_sched_out *out);

#endif
