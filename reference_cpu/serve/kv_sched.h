/**
 * @file kv_sched.h
 * Serving many requests on one paged backend (chapter 05): continuous batching, chunked
 * prefill, parallel sampling and beam search by forking block tables, preemption by
 * recompute, by whole swap or by lru partial swap with prefetch to a host tier (chapter 07,
 * kv_swap.h), priorities, a simulated clock with a link model and per-request latency, and
 * the contiguous-allocation baselines of the PagedAttention paper (Kwon et al., SOSP 2023,
 * arXiv:2309.06180) measured on the same pool.
 *
 * Runners. Each request of a ::kv_trace is a small state machine over cache slots:
 *
 *   WAITING -> (admitted) PROMPT: one root slot prefills the prompt, in chunks
 *           -> DECODE: one slot per sequence, one token per step
 *           -> DONE, or FAILED with a message; a preempted runner goes back to WAITING.
 *
 *  - plain: the prompt, then output_len tokens, greedy (temperature 0) or sampled;
 *  - parallel sampling, n: the prompt is prefilled once; its slot is then forked
 *    (kv_paged_fork) into n - 1 more, which share every prompt block. Sample s draws with
 *    its own generator, seeded from (seed, request, s), so its tokens do not depend on what
 *    else runs;
 *  - beam search, width k: after each step the k best (beam, token) continuations by
 *    cumulative log-prob survive (kv_beam.h); a beam kept by several children is forked, a
 *    dropped one released. Fixed output_len, no end token; the result is the best beam.
 *
 * Prompt tokens are kv_trace_tokens(). A runner produces the same tokens whatever else is
 * in the batch and however its prompt is chunked, because every row of the forward pass is
 * computed alone, in a fixed order (kv_ops.c): the scheduled run of a request equals its
 * solo run (kv_sched_solo), token for token.
 *
 * One step (kv_sched_run):
 *  1. plan: every running sequence with tokens to feed gets them, in running order (priority,
 *     then oldest admission), up to the token budget (a decode is one token; a prefill takes
 *     what is left of the budget: chunked prefill). If the blocks this plan needs exceed what
 *     the pool can hand out, lru mode first evicts paused requests' blocks (below); then the
 *     youngest request of the lowest priority is preempted (by default by recompute): its
 *     slots are released and it goes back to the front of its priority in the queue;
 *     readmitted, it prefills its prompt again, forks, and each sequence re-feeds the tokens
 *     it had generated, so it continues exactly where it stopped (by swap or lru: see below).
 *     The first running request is never preempted by a later one, so each step makes
 *     progress. A request that cannot run even alone fails with a message; nothing loops
 *     forever and no request is lost.
 *  2. priority: a waiting high-priority request that has arrived and does not fit preempts
 *     running lower-priority requests, youngest first, until it would fit; a request is
 *     never preempted for one of its own or a lower priority.
 *  3. admit (not in a step that had to preempt for memory): waiting requests in queue order
 *     (priority first, then preempted ones, then by arrival; only those that have arrived by
 *     the clock) while the first fits: free slots, budget, and blocks for the whole prompt (a
 *     preempted request: for everything it had grown to; a paused one: what it has on the
 *     host) after the plan's blocks, minus prefix-cache hits on blocks in use, with
 *     opts.watermark of the pool (default 1 %) kept free; for the baselines, room for the
 *     reservation.
 *  4. background transfers (swap, lru): the queue head's prefetch, lru's watermark eviction.
 *  5. one b->forward() over the batch; logits pick tokens; finished sequences free blocks.
 *     If the device (or host) memory runs out inside the step (KV_ERR_NOMEM: its scratch grows
 *     with the tokens of a step), the backend rolls the step back (kv_paged_rollback()) and
 *     the step is retried smaller: the token budget is halved for the rest of the run, and at
 *     one token the youngest request is preempted; a request alone that still cannot run
 *     fails with the device's message. Counted in nomem_retries.
 *
 * Priorities (chapter 07). A request's priority comes from its trace row (0 normal, 1 high;
 * kv_trace.h). It orders the queue and the running list, and so admission, the token budget
 * and the choice of victims. Without priorities every rule above is chapter 05's.
 *
 * Preemption by swap (opts.preempt = KV_PREEMPT_SWAP, chapter 07). The victim's live
 * sequences are copied whole to a host tier of opts.host_blocks blocks (kv_swap.h) instead of
 * dropped; readmitted (it needs blocks for all it had swapped out), they are copied back into
 * its slots with their lengths and the request continues as if never stopped: no prompt
 * is prefilled again, no token re-fed. Blocks shared by forks are copied once per sequence
 * (kv_swap's rule), so a request comes back unshared and may need more blocks than it held;
 * it is swapped only when its sequences, unshared at their final length, fit the pool (else
 * it could never be readmitted). A preemption that cannot swap falls back to recompute and
 * is counted: the host tier is full, the request would not fit unshared, or kv_swap refuses
 * the cache (fp8 and KIVI keep per-sequence state it does not save, sliding windows, the
 * prefix cache). Both copies are synchronous: the step waits for them (clock, below).
 *
 * Preemption by lru (KV_PREEMPT_LRU): partial swap. The victim is paused in place
 * (kv_swap_detach): its blocks stay on the device, shared ones still shared, and no byte
 * moves. When a step or an admission needs blocks the pool lacks, blocks of paused requests
 * move to the host (kv_swap_evict), least recently paused request first, its last logical
 * blocks first, only as many as needed: a synchronous eviction, the step waits. After each
 * step's admission, lru also keeps opts.watermark of the pool free by evicting ahead of need
 * in the background. Readmitted, a paused request takes device blocks only for what went to
 * the host (kv_swap_in). Falls back to recompute, counted, when a paused request's blocks
 * meet a full host tier, or when the last request running needs blocks that paused ones hold
 * and cannot evict (shared by their forks, or prefetched): the least recently paused of those
 * drops its blocks and recomputes.
 *
 * Prefetch (opts.prefetch; swap and lru). The first waiting request in queue order, if it is
 * paused with blocks on the host and predicted to fit the next step (slots free, its blocks
 * back within this step's free blocks), gets kv_swap_prefetch: device blocks now and a copy
 * in the background. When it is readmitted the copy has landed (a hit, prefetch_hits) or the
 * step waits for the rest of it.
 *
 * The clock. Arrivals (arrival_s) are compared with a simulated clock, not the CPU's, so a
 * run is deterministic and measures the policies, not this machine. It starts at 0; when
 * nothing runs it jumps to the next arrival; a step takes
 *
 *   step_s + token_s * (prefill tokens of the step, re-fed ones included) + stalls
 *
 * opts.step_s models a decode step (the same for every batch size: decode is memory bound),
 * opts.token_s the compute of a prefill token, so recompute's re-feeding costs time. The link
 * (opts.link, kv_link) has two directions, each a FIFO: a transfer issued at clock t starts at
 * max(t, when the direction frees) and lasts latency + bytes / bandwidth per batched copy. A
 * synchronous transfer (a whole swap out or in, an eviction needed now, the rest of a
 * prefetch not yet done) stalls the step until it ends (stall_s); a background one
 * (watermark eviction, prefetch) overlaps the steps and only delays later transfers in its
 * direction. With token_s 0, recompute, and no priorities this is chapter 05's clock: step_s
 * a step.
 *
 * Latency. Each result carries its arrival, the clock at the end of the step that chose its
 * first token, and at the end of the step that finished it; the metrics give p50 and p99
 * (nearest rank) of first-token latency (first token - arrival) and end-to-end latency
 * (finish - arrival) for normal and high-priority requests, stall seconds, bytes each way,
 * evictions, prefetches and their hits.
 *
 * Policies. paged allocates blocks on demand. The baselines are accounting on the same pool:
 * at admission a request reserves ceil(len / B) blocks per sequence (sequences do not share
 * in a contiguous cache), with len = max_len (max), prompt + the output length rounded up to
 * a power of two (pow2, the PagedAttention paper's baseline) or prompt + output itself
 * (oracle); it is admitted only when the
 * reservation fits the N blocks, and its real blocks stay within it.
 */
#ifndef KV_SCHED_H
#define KV_SCHED_H

#include "kv_backend.h"
#include "kv_swap.h"
#include "kv_trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How memory is granted. */
typedef enum {
    KV_POLICY_PAGED = 0,  /**< blocks on demand */
    KV_POLICY_MAX = 1,    /**< reserve max_len per sequence */
    KV_POLICY_POW2 = 2,   /**< reserve the next power of two of the final length */
    KV_POLICY_ORACLE = 3  /**< reserve exactly the final length */
} kv_policy;

/** Name of a policy ("paged", "max", "pow2", "oracle"), NULL out of range. */
const char *kv_policy_name(int policy);
/** Policy by name; -1 when unknown. */
int kv_policy_by_name(const char *name);

/** How a preempted request gives its memory back. */
typedef enum {
    KV_PREEMPT_RECOMPUTE = 0, /**< drop its blocks; prefill and re-feed on readmission */
    KV_PREEMPT_SWAP = 1,      /**< copy its sequences to the host tier and back (kv_swap.h) */
    KV_PREEMPT_LRU = 2        /**< pause it on the device; evict its blocks only when needed */
} kv_preempt;

/** Name of a preemption mode ("recompute", "swap", "lru"), NULL out of range. */
const char *kv_preempt_name(int preempt);
/** Preemption mode by name; -1 when unknown. */
int kv_preempt_by_name(const char *name);

/** What one step looked like, for a timeline (pool over time) and progress. */
typedef struct {
    int64_t step;
    double clock_s;     /**< the simulated clock after the step */
    int used_blocks;    /**< blocks USED */
    int cached_blocks;  /**< blocks CACHED (prefix cache, evictable) */
    int reserved_blocks; /**< baselines: blocks reserved by running requests */
    int running_seqs;   /**< sequences holding a slot */
    int running_reqs;
    int waiting;        /**< requests arrived (or preempted) and not admitted */
    int done;           /**< requests finished or failed so far */
    int total;          /**< requests in the run */
    int batch_tokens;   /**< tokens the step processed */
} kv_sched_step_info;

/** Called after every step (may be NULL). */
typedef void (*kv_sched_step_fn)(void *user, const kv_sched_step_info *s);

typedef struct {
    int policy;          /**< ::kv_policy */
    int token_budget;    /**< tokens per step, decodes and prefill chunks together (e.g. 256) */
    int max_len;         /**< max policy: tokens reserved per sequence (the model's longest) */
    double step_s;       /**< seconds the step clock advances per step (e.g. 0.02) */
    int burst;           /**< 1: every request arrives at time 0 */
    float temperature;   /**< plain requests: 0 = greedy */
    float sample_temperature; /**< parallel samples (n > 1); must be > 0 */
    float top_p;         /**< sampling nucleus, (0, 1] */
    uint64_t seed;
    int preempt;         /**< ::kv_preempt (default KV_PREEMPT_RECOMPUTE) */
    int host_blocks;     /**< swap, lru: blocks of the host tier; 0 = as many as the device pool */
    double watermark;    /**< fraction of the pool kept free (admission; lru: background
                              eviction), in [0, 1); default 0.01 */
    int prefetch;        /**< swap, lru: 1 = bring the queue head's host blocks back early */
    double token_s;      /**< clock seconds per prefill token (recompute included); default 0 */
    kv_link link;        /**< the link model of the host tier (default kv_link_default()) */
    kv_sched_step_fn on_step;
    void *user;
} kv_sched_opts;

/** Defaults: paged, budget 256, max_len 2048, step 0.02 s, greedy plain, samples at T = 1,
 * preemption by recompute, watermark 1 %, no prefetch, token_s 0, the default link. */
kv_sched_opts kv_sched_opts_default(void);

/** Outcome of one request. */
typedef struct {
    int status;          /**< KV_OK, or why it could not be served */
    char error[200];     /**< the message when status != KV_OK */
    int n_out;           /**< sequences returned: n_samples (sampling), else 1 */
    int output_len;
    int *tokens;         /* [n_out][output_len] */
    double *logprob;     /* [n_out] cumulative log-prob of each returned sequence */
    int preemptions;     /**< times this request was preempted */
    int64_t admit_step, finish_step;
    int priority;        /**< the trace's priority (0 normal, 1 high) */
    double arrival_s;    /**< on the step clock (0 with opts.burst) */
    double first_token_s; /**< clock at the end of the step that chose its first token, -1 none */
    double finish_s;     /**< clock at the end of the step that finished it (or failed it) */
} kv_sched_result;

/** What a run measured. Waste and utilization are averages over steps. */
typedef struct {
    int64_t steps;
    double clock_s;         /**< simulated seconds at the end */
    double wall_s;          /**< measured seconds of the run */
    int64_t tokens_generated, tokens_processed;
    double tokens_per_s;    /**< generated tokens per measured second */
    double utilization;     /**< tokens stored / (N * B), mean over steps */
    double waste;           /**< (internal + reserved) / held, summed over steps */
    double waste_internal;  /**< unused tail slots of allocated blocks / held */
    double waste_reserved;  /**< reserved but not (yet) allocated / held */
    int peak_seqs, peak_reqs; /**< most sequences / requests running at once */
    int peak_used_blocks;
    int64_t preemptions;
    int64_t prompt_tokens, prefix_hit_tokens; /**< at admissions (readmissions included) */
    double prefix_hit_rate; /**< hit tokens / prompt tokens */
    /* n > 1 and beam requests: blocks they hold vs blocks unshared copies would hold,
     * summed over steps */
    int64_t shared_blocks, unshared_blocks;
    double sharing_saving;  /**< 1 - shared / unshared (0 without such requests) */
    int64_t cow_copies;
    int64_t nomem_retries;  /**< steps retried smaller after device or host memory ran out */
    /* preemption cost (chapter 07): what swap moved over the link, what recompute fed again */
    int64_t swap_preemptions;   /**< preemptions served by swapping the request out */
    int64_t recompute_fallbacks; /**< swap, lru: preemptions that recomputed instead, and (lru)
                                      paused requests that gave their blocks up later */
    int64_t tokens_recomputed;  /**< rows dropped by recompute preemptions (each fed again on
                                     readmission; prefix-cache hits may spare some) */
    int64_t seqs_swapped_out, seqs_swapped_in; /**< sequences swapped (lru: paused) and back */
    int64_t swap_blocks_out, swap_blocks_in;
    int64_t swap_bytes_out, swap_bytes_in;
    double swap_seconds_out, swap_seconds_in; /**< modelled link time each way (kv_link):
                                      the link busy, synchronous or in the background */
    int host_blocks;            /**< swap, lru: blocks of the host tier (0: no tier) */
    int peak_host_blocks;       /**< most host blocks held at once */
    int host_leaked;            /**< host blocks still held after the run (0 unless a bug) */
    char swap_refused[160];     /**< why kv_swap refused the cache, "" when it did not */
    /* lru (chapter 07): blocks moved ahead of need or only when needed */
    int64_t lru_pauses;         /**< preemptions that paused the request on the device */
    int64_t evictions, evicted_blocks; /**< batched evictions to the host, blocks they moved */
    int64_t evictions_sync;     /**< of those, made while a step waited (the rest: watermark) */
    int64_t prefetches, prefetch_blocks; /**< prefetches started, blocks they brought back */
    int64_t prefetch_hits;      /**< prefetches finished on the clock before their request ran */
    /* the clock model: stalls and latency (index 0: normal requests, 1: high priority) */
    double stall_s;             /**< clock seconds steps waited for synchronous transfers */
    double prefill_s;           /**< clock seconds of prefill (token_s x prefill tokens) */
    int n_class[2];             /**< finished requests of each priority */
    double ttft_p50[2], ttft_p99[2]; /**< first-token latency (first token - arrival), seconds */
    double e2e_p50[2], e2e_p99[2];   /**< end-to-end latency (finish - arrival), seconds */
    int n_done, n_failed;
} kv_sched_metrics;

/** A run's results [n] and metrics. */
typedef struct {
    int n;
    int *index;               /* [n] trace index of each result */
    kv_sched_result *results; /* [n] */
    kv_sched_metrics m;
} kv_sched_out;

/**
 * Serve requests 0 .. @p n_requests - 1 of @p t on the paged backend @p b (every slot
 * empty; its spec's n_slots bounds the sequences running at once, its capacity the longest
 * sequence). Per-request failures are in the results; the return value is an error of the
 * run itself (bad arguments, KV_ERR_NOMEM, a backend failure). Leaves every slot empty.
 */
int kv_sched_run(kv_backend *b, const kv_trace *t, int n_requests, const kv_sched_opts *o,
                 kv_sched_out *out, kv_err *err);

/**
 * The reference: request @p i of @p t alone in the backend (same seeds as in a full run).
 * @p out holds one result.
 */
int kv_sched_solo(kv_backend *b, const kv_trace *t, int i, const kv_sched_opts *o,
                  kv_sched_out *out, kv_err *err);

/** Free an out (safe on a zeroed one). */
void kv_sched_out_free(kv_sched_out *out);

#ifdef __cplusplus
}
#endif
#endif
