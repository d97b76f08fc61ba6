/**
 * @file kv_swap.h
 * Swap (chapter 07, first piece): a host tier for the blocks of a paged backend, a model of
 * the link between device and host, and swapping a whole sequence out to the host and back.
 *
 * When the device pool runs dry a scheduler can preempt a sequence in two ways: drop its
 * blocks and recompute them later (a prefill of everything it held), or copy them to host
 * memory and copy them back (a transfer of everything it held). Which is cheaper depends on
 * the link, so the link is part of the model:
 *
 *   time of one batched copy = latency + bytes / bandwidth
 *
 * Default link: PCIe 4.0 x16. Each lane signals 16 GT/s with 128b/130b coding, so 16 lanes
 * carry 16 * 16 * 128/130 / 8 ≈ 31.5 GB/s per direction raw; packet headers and DMA overheads
 * leave about 25 GB/s for large pinned copies (KV_LINK_DEFAULT_BANDWIDTH). A copy also pays a
 * fixed cost to launch and complete, of the order of 10 µs (KV_LINK_DEFAULT_LATENCY), which
 * is why a swap copies a sequence's block list in one batch, not block by block.
 *
 * The host tier is a second kv_pool of host blocks whose bytes are one device block each:
 * every layer, K and V, codes and metadata of the block's B rows, in the order
 *   [L][K, V][H_kv] ( codes [B][row_bytes], meta [entries of B rows] )
 * (kv_cache_block_bytes()). The bytes move through the cache-memory services of a paged
 * backend (::kv_cache_mem, kv_paged.h; kv_backend.mem): m->read_blocks and m->write_blocks,
 * one batched copy each over a list of (src, dst) block pairs: memcpy on the CPU; on CUDA a
 * gather or scatter kernel plus one cudaMemcpyAsync per run of consecutive host blocks (one,
 * for a swap's list). The tier's memory comes from m->host_alloc (pinned host memory on
 * CUDA, kv_calloc on the CPU). Every
 * device lays a host block out the same way, so a tier filled through one backend can be
 * swapped into another built with the same spec.
 *
 * A swapped-out sequence keeps, besides its blocks' bytes, the state that is not in the
 * blocks: its length and the tokens it has written (the paging layer's record). fp8 scales
 * and KIVI windows are also per sequence; this first version refuses those formats, and
 * sliding windows and prefix caching, with KV_ERR_UNSUPPORTED. Blocks shared with another
 * sequence (refcount > 1) are copied for this sequence alone, and come back as its own
 * blocks: sharing is not preserved across a swap.
 */
#ifndef KV_SWAP_H
#define KV_SWAP_H

#include "kv_paged.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_LINK_DEFAULT_BANDWIDTH 25e9 /**< bytes/s: PCIe 4.0 x16, achievable (31.5 raw) */
#define KV_LINK_DEFAULT_LATENCY 10e-6  /**< s per batched copy */

/** Directions of the link. */
enum { KV_LINK_OUT = 0 /**< device -> host */, KV_LINK_IN = 1 /**< host -> device */ };

/** The link between device and host memory, as a model. */
typedef struct {
    double bandwidth; /**< bytes per second, each direction */
    double latency;   /**< seconds per batched copy */
    int throttle;     /**< 1: really sleep for the modelled time of each copy (0 default) */
} kv_link;

/** What crossed the link, per direction (index KV_LINK_OUT / KV_LINK_IN). */
typedef struct {
    int64_t copies[2];  /**< batched copies */
    int64_t blocks[2];  /**< blocks moved */
    int64_t bytes[2];   /**< bytes moved */
    double seconds[2];  /**< modelled time: sum of latency + bytes / bandwidth */
} kv_link_stats;

/** The default link (PCIe 4.0 x16-like, no throttling). */
kv_link kv_link_default(void);
/** Modelled seconds of one batched copy of @p bytes (0 bytes: no copy, 0 s). */
double kv_link_seconds(const kv_link *l, int64_t bytes);

/** The host tier: a pool of host blocks, their memory, the link and what crossed it. */
typedef struct {
    kv_pool pool;       /* host block bookkeeping; pool.block_bytes = the backend's */
    uint8_t *mem;       /* [n_blocks][block_bytes] */
    kv_link link;
    kv_link_stats stats;
    kv_cache_mem *owner; /* the services whose host_alloc made mem (their host_free frees it) */
} kv_swap;

/**
 * A sequence taken out of its slot (a paused, preempted sequence). Each logical block i is
 * in exactly one place: still on the device (dev_blocks[i] >= 0: the sequence keeps a
 * reference, so the block and its bytes stay put) or on the host (host_blocks[i] >= 0).
 * kv_swap_out() leaves every block on the host (whole-sequence swap); kv_swap_detach() leaves
 * every block on the device and kv_swap_evict() moves some of them to the host (LRU partial
 * swap). kv_swap_prefetch() starts copying the host blocks back ahead of kv_swap_in().
 */
typedef struct {
    int n_blocks;      /**< logical blocks, in order */
    int *host_blocks;  /* [n_blocks] host block holding logical block i, or -1 */
    int *dev_blocks;   /* [n_blocks] device block still held for logical block i, or -1 */
    int n_on_host;     /**< logical blocks whose bytes are in the host tier */
    int64_t n_tokens;  /**< tokens its table held (= its length) */
    int *tokens;       /* [n_tokens] the tokens it had written */
    int resident;      /**< 1 while it holds blocks in either tier */
    int *pre_blocks;   /* [n_blocks] device block a prefetch is filling for block i, or -1 */
    int64_t ticket;    /**< the prefetch's asynchronous copy (0: none in flight) */
} kv_swapped;

/**
 * A host tier of @p n_host_blocks blocks shaped as the blocks of the paged cache behind @p m
 * (a paged backend's kv_backend.mem: its block size, m->block_bytes() bytes each), memory from
 * m->host_alloc, over link @p link (NULL: kv_link_default()). KV_ERR_ARG for m NULL (a
 * contiguous backend has no block I/O) or a bad link, KV_ERR_NOMEM.
 */
int kv_swap_init(kv_swap *sw, kv_cache_mem *m, int n_host_blocks, const kv_link *link,
                 kv_err *err);
/** Free the host tier (a zeroed struct is fine); before the backend that made it goes, after
 * its paused sequences are dropped or swapped in (a prefetch in flight reads its memory). */
void kv_swap_free(kv_swap *sw);

/**
 * Swap @p slot of the paged cache behind @p m out, whole: take host blocks for all its
 * blocks (all or nothing), copy their bytes in one batched copy, record its length and tokens
 * in @p out, then release the slot (kv_paged_release()). Shared blocks are copied too: the
 * sequence comes back unshared. KV_ERR_CAPACITY when the host tier lacks blocks: the slot is
 * untouched. KV_ERR_UNSUPPORTED for fp8, KIVI, windows, prefix caching.
 */
int kv_swap_out(kv_swap *sw, kv_cache_mem *m, int slot, kv_swapped *out, kv_err *err);

/**
 * Pause @p slot without moving a byte: record its blocks (a reference kept on each, so they
 * stay on the device with their bytes, shared ones still shared), length and tokens in
 * @p out, then release the slot. Same refusals as kv_swap_out().
 */
int kv_swap_detach(kv_swap *sw, kv_cache_mem *m, int slot, kv_swapped *out, kv_err *err);

/**
 * Move up to @p max_blocks of @p s's device blocks to the host tier in one batched copy
 * (partial swap), last logical block first, skipping blocks shared with another holder
 * (moving those frees no device memory). Device blocks whose last reference this drops
 * return to the pool. *moved = blocks moved (0 when none can be: not an error; always 0 for
 * a sequence with a prefetch started, which is on its way back). At most as many as the host
 * tier has free; KV_ERR_CAPACITY only when it has no free block at all.
 */
int kv_swap_evict(kv_swap *sw, kv_cache_mem *m, kv_swapped *s, int max_blocks, int *moved,
                  kv_err *err);

/**
 * Start bringing @p s's host blocks back: take device blocks for them (all or nothing) and
 * start one batched asynchronous copy (m->write_blocks_async: the CPU's I/O thread, CUDA's
 * copy stream). kv_swap_in() finishes it. KV_ERR_CAPACITY when the device pool lacks
 * blocks: nothing changes. A sequence with no host blocks, or one already prefetching:
 * KV_OK, nothing to do.
 */
int kv_swap_prefetch(kv_swap *sw, kv_cache_mem *m, kv_swapped *s, kv_err *err);

/**
 * Put @p s back into the empty @p slot of the cache behind @p m: wait for its prefetch (if
 * any), copy what is still on the host in one batched copy (taking device blocks for it, all
 * or nothing), rebuild the slot's table from its blocks in logical order, token record and
 * length, and release its host blocks. KV_ERR_CAPACITY when the device pool lacks blocks: @p s is
 * unchanged. @p m may be another backend's than the one @p s left, built with the same spec
 * (a tier filled on the CPU swaps into CUDA), for a sequence with every block on the host.
 */
int kv_swap_in(kv_swap *sw, kv_cache_mem *m, int slot, kv_swapped *s, kv_err *err);

/** Forget a paused sequence: wait for a prefetch in flight, release its blocks in both
 * tiers (a zeroed one is fine). @p m: the services of the cache whose device blocks it holds
 * (may be NULL when every block is on the host). */
void kv_swapped_drop(kv_swap *sw, kv_cache_mem *m, kv_swapped *s);

#ifdef __cplusplus
}
#endif
#endif
