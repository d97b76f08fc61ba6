/*
 * kv_request.h — internal to the scheduler (kv_request.c, kv_sched.c); not part of the API.
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
 * owns; kv_sched.c owns the queue, the running list, the free slots, reservations and every
 * count except tokens_generated. A runner that has chosen its last token says so by entering
 * R_DONE; the scheduler then gives its slots back (kv_sched.c, finish()). Swapping a
 * preempted runner's sequences out and in is the scheduler's too (it owns the host tier):
 * a runner only carries, per sequence, where its rows wait (seq_t.host).
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
    kv_swapped host;   /* swap mode: its rows in the host tier while preempted (host.resident) */
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
    int swapped;       /* preempted by swap: its live sequences are in the host tier */
    int swap_state;    /* the state it left (R_PROMPT or R_DECODE), resumed on swap in */
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

/* kv_request.c, in the order a request meets them */
void runner_set_error(runner *r, int status, const char *fmt, ...);
int runner_init(const runner_env *e, runner *r, const kv_trace *t, int idx,
                kv_sched_result *res, kv_err *err);
int runner_start(const runner_env *e, runner *r, int *hit, kv_err *err);
int runner_take_logits(const runner_env *e, runner *r, seq_t *s, const float *logits,
                       kv_err *err);
int runner_advance(const runner_env *e, runner *r, kv_err *err);
void runner_drop_slots(const runner_env *e, runner *r);
void runner_free(runner *r);

#endif
