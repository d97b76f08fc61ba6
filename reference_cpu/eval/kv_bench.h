/**
 * @file kv_bench.h
 * What the benchmarks measure the machine with (docs/design.md §12): its last-level cache and
 * its sustained read bandwidth, and the bytes a decode step must read, so every benchmark can
 * state its time as a fraction of the memory roofline measured in the same run.
 */
#ifndef KV_BENCH_H
#define KV_BENCH_H

#include "kv_cache.h"
#include "kv_common.h"
#include "kv_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Size in bytes of the CPU's last-level cache, read from
 * /sys/devices/system/cpu/cpu0/cache (the highest-level data or unified cache), else from
 * sysconf(_SC_LEVEL3_CACHE_SIZE / _SC_LEVEL2_CACHE_SIZE); 0 when neither says.
 * @p level (may be NULL) receives its level (3 for an L3), @p source (may be NULL) "sysfs",
 * "sysconf" or "unknown".
 */
int64_t kv_llc_bytes(int *level, const char **source);

/** A read-bandwidth measurement (kv_read_bandwidth()). */
typedef struct {
    double bytes_per_s;  /**< median over the repeats of buffer bytes / time */
    double min, max;     /**< slowest and fastest repeat, bytes/s */
    double buffer_bytes; /**< bytes summed per repeat */
    int threads;         /**< OpenMP threads that summed */
    int repeats;         /**< timed passes (after one untimed warm-up pass) */
} kv_bandwidth;

/**
 * Sustained read bandwidth: every OpenMP thread sums its own contiguous part of a buffer of
 * @p buffer_bytes (0: 8 x the LLC, at least 256 MiB, at most 1 GiB), @p repeats times (0: 7);
 * the median of buffer bytes / wall time, and the fastest pass (max: the best the machine
 * reached, the ceiling `kvlab bench engine` divides by). The buffer is written by the threads
 * that later read it (first touch), and summed as 64-bit integers in eight lanes with the
 * widest loads the CPU has (AVX2 where present, chosen at load time): an integer sum may be
 * vectorized and reordered freely, so the loop is bound by memory, not by its adds.
 * Returns KV_OK, or KV_ERR_NOMEM.
 */
int kv_read_bandwidth(kv_bandwidth *out, size_t buffer_bytes, int repeats, kv_err *err);

/**
 * The same sum over runs of @p chunk_bytes (a multiple of 8) read in a random order: the
 * buffer cut into chunks, the chunks shuffled once (a fixed seed), each thread summing its
 * share of the shuffled list, asking for the next chunk's lines while it sums one. What a
 * reader of scattered blocks can expect from the memory: each chunk starts where the
 * hardware prefetchers have no history (a paged KV cache whose blocks were handed out over a
 * long run). chunk_bytes 0 is kv_read_bandwidth(). Returns
 * KV_OK, KV_ERR_ARG (a chunk not a multiple of 8, or larger than the buffer), or
 * KV_ERR_NOMEM.
 */
int kv_read_bandwidth_chunks(kv_bandwidth *out, size_t buffer_bytes, size_t chunk_bytes,
                             int repeats, kv_err *err);

/**
 * Bytes of weights one decode token reads (the weight side of the roofline), fp32:
 *   4 · (P + dim·V + dim + (2L + 1)·dim)
 * P the matmul weights of every layer (Wq, Wk, Wv, Wo, W1, W2, W3; kv_forward.c), dim·V the
 * classifier, dim one embedding row, (2L + 1)·dim the RMSNorm gains.
 */
double kv_decode_weight_bytes(const kv_config *c);

#ifdef __cplusplus
}
#endif
#endif
