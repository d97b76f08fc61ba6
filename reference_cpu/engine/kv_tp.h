/**
 * @file kv_tp.h
 * Tensor-parallel heads on the CPU (chapter 10): p ranks, each a thread of this process
 * standing in for one device, run one model together.
 *
 * Rank r of p holds H/p query heads (q_head0 = r·H/p), the KV heads they read and the cache
 * of those KV heads only, and hidden/p of the MLP's hidden units:
 *   - p <= H_kv: H_kv/p KV heads, kv_head0 = r·H_kv/p; nothing is stored twice.
 *   - p >  H_kv: a rank's H/p query heads all read one KV head, h/G = r / (p/H_kv), which
 *     it computes and caches itself: each KV head is replicated on p/H_kv ranks.
 * Wq, Wk, Wv, W1, W3 are split by output rows, Wo and W2 by input columns (kv_shard), and
 * every layer all-reduces twice: after the Wo product and after the W2 product. Embedding,
 * norms and classifier are replicated; rank 0 computes the logits.
 *
 * The all-reduce is explicit and deterministic: a reduce-scatter (rank r adds chunk r of the
 * p partial sums, in rank order 0, 1, ..., p-1) then an all-gather (every rank copies the
 * whole sum), the data movement of a ring all-reduce. Each rank reads
 *   2 · (p-1)/p · n · 4 bytes   (n = T·dim floats: T tokens of the step)
 * from the other ranks per all-reduce, (p-1)/p of the partials and (p-1)/p of the sums;
 * kv_tp_stats counts what was really read. With p = 1 the sum is the partial itself, so
 * p = 1 is kv_forward() bit for bit; with p > 1 only the order of the Wo and W2 additions
 * changes (p partial dot products added in rank order instead of one), hence logits within
 * fp32 reduction-order tolerance and, in practice, the same greedy tokens.
 */
#ifndef KV_TP_H
#define KV_TP_H

#include <pthread.h>

#include "kv_backend.h"
#include "kv_forward.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_TP_MAX_RANKS 64 /**< ranks a group may have */

/** What a group's all-reduces did, summed over its steps. */
typedef struct {
    int64_t steps;        /**< kv_tp_forward() calls that ran */
    int64_t all_reduces;  /**< all-reduces: 2 per layer per step */
    double reduced_floats;/**< sum of n over the all-reduces (floats per rank's buffer) */
    double rank_bytes[KV_TP_MAX_RANKS]; /**< bytes rank r read from other ranks' buffers */
} kv_tp_stats;

typedef struct kv_tp kv_tp;

/**
 * Can @p cfg run on @p p ranks? p must divide H (whole query heads per rank), and p and H_kv
 * must divide one another (whole KV heads per rank, or whole copies of one); hidden >= p.
 * KV_ERR_ARG with the reason otherwise.
 */
int kv_tp_check(const kv_config *cfg, int p, kv_err *err);

/** The heads and hidden units of rank @p rank of @p p (no all-reduce hook: kv_tp_create sets it). */
void kv_tp_shard_of(const kv_config *cfg, int p, int rank, kv_shard *sh);

/* ---- what both devices' groups share (this file's group; cuda/engine/kvcu_tp.cu's GPUs) ---- */

/**
 * kv_tp_check(), and a spec a group can run: contiguous (every rank's block tables would have
 * to move in step) and without chapter 09's selection. KV_ERR_ARG or KV_ERR_UNSUPPORTED with
 * the reason, the message starting with @p who.
 */
int kv_tp_check_group(const char *who, const kv_config *cfg, int p, const kv_cache_spec *spec,
                      kv_err *err);

/**
 * Rank @p rank of @p p: its shard (kv_tp_shard_of()) talking to the group through
 * @p all_reduce and @p ctx, and in @p cache_cfg the config its cache is made from: the
 * model's, with the shard's KV heads (the cache then holds the one H_kv every later step
 * reads).
 */
void kv_tp_rank_setup(const kv_config *cfg, int p, int rank,
                      void (*all_reduce)(const kv_shard *sh, float *x, int64_t n), void *ctx,
                      kv_shard *sh, kv_config *cache_cfg);

/** The step a group runs, as its ranks see it. */
typedef struct {
    const kv_seq *seqs;  /**< [n_seqs] rank 0's: the caller's */
    kv_seq *quiet;       /**< [n_seqs] the other ranks': the same without all_logits (rank 0
                          *   alone computes logits) */
    int n_seqs, max_seqs;
    float *logits;       /**< rank 0's */
    kv_counters *cnt;    /**< rank 0's: the whole model's work */
    int64_t n_floats;    /**< T·dim: what every all-reduce of the step sums */
} kv_tp_step;

/**
 * Check a step once, before any rank touches its cache (kv_batch_check() against rank 0's
 * shard @p sh0 and cache @p c0; a rank refused inside its forward pass would still owe its
 * all-reduces), and set @p s up for it. KV_OK, or the check's refusal, or KV_ERR_NOMEM.
 */
int kv_tp_step_begin(kv_tp_step *s, const char *who, const kv_config *cfg, const kv_shard *sh0,
                     const kv_cache *c0, const kv_seq *seqs, int n_seqs, float *logits,
                     kv_counters *cnt, kv_err *err);

/**
 * The rank threads of a group: each waits for a step, runs rank r's part of it with
 * @p run (ctx, r) and reports it done; @p enter (ctx, r), when not NULL, runs once on the
 * thread before its first step (the CPU ranks take their share of OpenMP threads there, a
 * GPU rank its device).
 */
typedef struct kv_tp_threads kv_tp_threads;
typedef struct {
    kv_tp_threads *t;
    int rank;
} kv_tp_thread_arg;
struct kv_tp_threads {
    void (*run)(void *ctx, int rank);
    void (*enter)(void *ctx, int rank);
    void *ctx;
    int live;                /* the locks exist (kv_tp_threads_start() made them) */
    int n_threads;           /* threads started */
    pthread_t thread[KV_TP_MAX_RANKS];
    kv_tp_thread_arg arg[KV_TP_MAX_RANKS];
    pthread_mutex_t mu;      /* guards gen, running, quit */
    pthread_cond_t go, idle; /* a new step (or quit) for the threads; the last one finished */
    int64_t gen;             /* steps handed out */
    int running;             /* threads still in the current step */
    int quit;
};

/**
 * Start a thread for each of ranks @p first .. @p last - 1 on a zeroed @p t. On a failure
 * the threads started so far are stopped (kv_tp_threads_stop()) and KV_ERR_NOMEM names
 * @p who and the rank.
 */
int kv_tp_threads_start(kv_tp_threads *t, int first, int last, void (*run)(void *ctx, int rank),
                        void (*enter)(void *ctx, int rank), void *ctx, const char *who,
                        kv_err *err);
/** Hand every thread the next step. */
void kv_tp_threads_go(kv_tp_threads *t);
/** Wait until every thread has finished the step handed out. */
void kv_tp_threads_wait(kv_tp_threads *t);
/** Stop and join the threads, free the locks (a zeroed or stopped @p t is fine). */
void kv_tp_threads_stop(kv_tp_threads *t);

/**
 * A group of @p p ranks over @p m (which must outlive it), each with a cache of its KV heads
 * shaped by @p spec (contiguous; any format, window allowed). Starts p - 1 threads (rank 0
 * runs on the thread that calls kv_tp_forward()); each rank's
 * own ops run on max(1, omp_get_max_threads() / p) OpenMP threads, so the ranks together
 * use the cores one process would, not p times as many.
 */
int kv_tp_create(kv_tp **out, const kv_model *m, int p, const kv_cache_spec *spec, kv_err *err);
/** Stop the threads and free everything (NULL is fine). */
void kv_tp_destroy(kv_tp *tp);

/**
 * One step on every rank: kv_forward()'s contract (same checks, same refusals, logits and
 * all_logits from rank 0, @p cnt the whole model's work as kv_forward counts it). A step
 * refused by the checks leaves every cache as it was; after a failure inside a step
 * (KV_ERR_NOMEM) reset the slots it touched.
 */
int kv_tp_forward(kv_tp *tp, const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                  kv_err *err);
/** Forget a slot's tokens on every rank. */
void kv_tp_reset(kv_tp *tp, int slot);

/** The group's rank count p. */
int kv_tp_ranks(const kv_tp *tp);
/** Rank @p r's cache: its KV heads only (n_kv_heads = H_kv/p, or 1 when p > H_kv). */
const kv_cache *kv_tp_cache(const kv_tp *tp, int r);
/** Rank @p r's heads and hidden units. */
const kv_shard *kv_tp_shard(const kv_tp *tp, int r);
/** The group's all-reduce counts so far. */
const kv_tp_stats *kv_tp_get_stats(const kv_tp *tp);

/** Bytes one rank moves in a ring all-reduce of @p n floats over @p p ranks: 2·(p-1)/p·n·4. */
double kv_tp_ring_bytes(int p, double n);

/**
 * A kv_backend over a new group (name "cpu-tp"), so kv_generate() and the tools run it as
 * they run any device. kv_backend_destroy() destroys the group too.
 */
int kv_tp_backend(kv_backend **out, const kv_model *m, int p, const kv_cache_spec *spec,
                  kv_err *err);
/** The group behind a backend made by kv_tp_backend() (NULL for any other backend). */
kv_tp *kv_tp_of_backend(kv_backend *b);

#ifdef __cplusplus
}
#endif
#endif
