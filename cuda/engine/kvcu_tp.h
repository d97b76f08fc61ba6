/**
 * @file kvcu_tp.h
 * Tensor-parallel ranks on GPUs (chapter 10): the all-reduce the CPU group (kv_tp.h) does
 * with threads and a barrier, done by NCCL between p GPUs of one process. Built only when
 * NCCL is found (cmake/KvNccl.cmake).
 *
 * Rank r is GPU r. kvcu_tp_allreduce() sums every rank's buffer in place with ncclAllReduce
 * (ncclSum): NCCL picks the algorithm (ring or tree) and so the order of the additions, so the
 * sum matches the CPU group's rank-order sum within fp32 reduction-order tolerance, not bit for
 * bit; every rank ends with the same bits. Bytes are counted by the ring formula
 * 2·(p-1)/p·n·4 per rank (kv_tp_ring_bytes()); NCCL does not report its own traffic.
 *
 * kvcu_tp is the group that runs a model on those ranks: one host thread per GPU running
 * kvcu_forward_shard() (cuda/kvcu.h) with an all_reduce hook that calls ncclAllReduce.
 */
#ifndef KVCU_TP_H
#define KVCU_TP_H

#include <stdint.h>

#include "kv_backend.h"
#include "kv_common.h"
#include "kv_forward.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvcu_tp_comm kvcu_tp_comm;

/** GPUs this process can see (0 when none or no driver). */
int kvcu_tp_device_count(void);

/**
 * Communicators for ranks 0..p-1 on GPUs 0..p-1 (ncclCommInitAll) and a stream per rank.
 * KV_ERR_ARG for p < 1; KV_ERR_DEVICE naming how many GPUs there are when fewer than p.
 */
int kvcu_tp_comm_create(kvcu_tp_comm **out, int p, kv_err *err);
/** Release the communicators and streams (NULL is fine). */
void kvcu_tp_comm_destroy(kvcu_tp_comm *c);

/**
 * x[r] [n]: device memory of GPU r, for r = 0..p-1. Replaces every x[r] by the sum over the
 * ranks, and returns when every rank's result is complete. What wrote x[r] on GPU r's default
 * stream (kernels, cudaMemcpy, a pageable copy still in flight) is complete before NCCL reads
 * it (an event orders the rank's NCCL stream after it). On a failure (a CUDA or NCCL error on
 * any rank, seen without blocking: ncclCommGetAsyncError() while polling) every communicator
 * is aborted (ncclCommAbort) so no rank is left waiting, KV_ERR_DEVICE is returned, and every
 * later call is refused: destroy and create again.
 */
int kvcu_tp_allreduce(kvcu_tp_comm *c, float *const *x, int64_t n, kv_err *err);

/** All-reduces run so far. */
int64_t kvcu_tp_allreduces(const kvcu_tp_comm *c);
/** Bytes one rank moved in them, by the ring formula 2·(p-1)/p·n·4 each. */
double kvcu_tp_bytes_per_rank(const kvcu_tp_comm *c);

/* ---- the group: one model on p GPUs -------------------------------------------------------- */

typedef struct kvcu_tp kvcu_tp;

/**
 * p ranks of @p m on GPUs 0..p-1 (kv_tp_check()'s rules; p <= the GPUs present, else
 * KV_ERR_DEVICE naming both counts): rank r holds the whole model's weights on GPU r (a rank
 * reads only its shard's rows and columns of them), a cache of its KV heads shaped by
 * @p spec (contiguous; paged and chapter 09 retention refused as kv_tp_create() refuses
 * them), and a thread of its own that sets GPU r once and runs kvcu_forward_shard() there.
 * The shard's all_reduce hook is an ncclAllReduce (ncclSum, in place) on the rank's stream,
 * after the rank's default-stream kernels that wrote the partial sums have finished.
 */
int kvcu_tp_create(kvcu_tp **out, const kv_model *m, int p, const kv_cache_spec *spec,
                   kv_err *err);
/** Stop the rank threads and free everything (NULL is fine). */
void kvcu_tp_destroy(kvcu_tp *tp);
/**
 * One step on every rank: kvcu_forward()'s contract (its checks and refusals, made once
 * before any rank starts; logits and all_logits, host memory, from rank 0; @p cnt the whole
 * model's work). After a failure inside a step reset the slots it touched. A rank that cannot
 * take part in an all-reduce (a sticky CUDA error, an NCCL failure) aborts the group's
 * communicators instead of leaving the others waiting: the step returns KV_ERR_DEVICE with the
 * first failure's message, and the group refuses every later step (destroy it, make a new one).
 */
int kvcu_tp_forward(kvcu_tp *tp, const kv_seq *seqs, int n_seqs, float *logits,
                    kv_counters *cnt, kv_err *err);
/** Forget a slot's tokens on every rank. */
void kvcu_tp_reset(kvcu_tp *tp, int slot);
/** The group's communicator (its all-reduce counters). */
const kvcu_tp_comm *kvcu_tp_comm_of(const kvcu_tp *tp);
/** A ::kv_backend over a new group (name "cuda-tp"); kv_backend_destroy() frees the group. */
int kvcu_tp_backend(kv_backend **out, const kv_model *m, int p, const kv_cache_spec *spec,
                    kv_err *err);

#ifdef __cplusplus
}
#endif
#endif
