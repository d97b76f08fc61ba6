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
 * (kv_swap_block_bytes()). The bytes move through a ::kv_swap_io: two batched copies, device
 * to host and host to device, over lists of (src, dst) block pairs. On the CPU build they are
 * memcpy from and to a kv_cache (kv_swap_io_cache()), throttled and timed by the link model.
 *
 * A swapped-out sequence keeps, besides its blocks' bytes, the state that is not in the
 * blocks: its length and the tokens it has written (the paging layer's record). fp8 scales
 * and KIVI windows are also per sequence; this first version refuses those formats, and
 * sliding windows and prefix caching, with KV_ERR_UNSUPPORTED. Blocks shared with another
 * sequence (refcount > 1) are copied for this sequence alone, and come back as its own
 * blocks: sharing is not preserved across a swap.
 *
 * The backend's vtable has no way yet to read or write a block's bytes, so
 * kv_swap_backend_cpu() builds a CPU backend (kv_backend_cpu()) together with the
 * ::kv_swap_io of its cache (kv_backend_cpu_cache()). The next step moves the two copies
 * into kv_backend.h as
 * b->read_blocks / b->write_blocks (on CUDA: cudaMemcpyAsync from and to pinned host
 * memory, one batch per swap).
 */
#ifndef KV_SWAP_H
#define KV_SWAP_H

#include "kv_backend.h"

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

/**
 * Moving block bytes between a device cache and host memory. Each call is one batched copy
 * over @p n pairs; block ids of the host side index @p host (block i at host + i·block_bytes).
 */
typedef struct {
    void *ctx;
    size_t block_bytes; /**< bytes of one block, every layer, K and V */
    /** Device block pairs[i].src -> host block pairs[i].dst. */
    int (*copy_out)(void *ctx, const kv_block_copy *pairs, int n, uint8_t *host, kv_err *err);
    /** Host block pairs[i].src -> device block pairs[i].dst. */
    int (*copy_in)(void *ctx, const kv_block_copy *pairs, int n, const uint8_t *host,
                   kv_err *err);
} kv_swap_io;

/** Bytes of one block of paged cache @p c: every layer, K and V, codes and metadata. */
size_t kv_swap_block_bytes(const kv_cache *c);
/** The ::kv_swap_io of a paged CPU cache (@p c borrowed). KV_ERR_ARG when it is not paged. */
int kv_swap_io_cache(kv_swap_io *io, kv_cache *c, kv_err *err);

/**
 * A CPU backend over @p model and a paged @p spec, as kv_backend_cpu() builds, together with
 * the ::kv_swap_io of its cache in @p io (valid until the backend is destroyed).
 */
int kv_swap_backend_cpu(kv_backend **out, kv_swap_io *io, const kv_model *model,
                        const kv_cache_spec *spec, kv_err *err);

/** The host tier: a pool of host blocks, their memory, the link and what crossed it. */
typedef struct {
    kv_pool pool;       /* host block bookkeeping; pool.block_bytes = io block bytes */
    uint8_t *mem;       /* [n_blocks][block_bytes] */
    kv_link link;
    kv_link_stats stats;
} kv_swap;

/** A sequence living in the host tier (filled by kv_swap_out()). */
typedef struct {
    int n_blocks;      /**< host blocks holding its rows, in logical order */
    int *host_blocks;  /* [n_blocks] */
    int64_t n_tokens;  /**< tokens its table held (= its length) */
    int *tokens;       /* [n_tokens] the tokens it had written */
    int resident;      /**< 1 while it holds host blocks */
} kv_swapped;

/**
 * A host tier of @p n_blocks blocks of @p block_size tokens and @p block_bytes bytes each
 * (memory from kv_calloc), over link @p link (NULL: kv_link_default()). KV_ERR_ARG, NOMEM.
 */
int kv_swap_init(kv_swap *sw, int n_blocks, int block_size, size_t block_bytes,
                 const kv_link *link, kv_err *err);
/** Free the host tier (a zeroed struct is fine). */
void kv_swap_free(kv_swap *sw);

/**
 * Swap @p slot of paged backend @p b out: take host blocks for all its blocks (all or
 * nothing), copy their bytes in one batched copy, record its length and tokens in @p out,
 * then release the slot (b->reset). KV_ERR_CAPACITY when the host tier lacks blocks: the
 * slot is untouched. KV_ERR_UNSUPPORTED for fp8, KIVI, windows, prefix caching.
 */
int kv_swap_out(kv_swap *sw, kv_backend *b, const kv_swap_io *io, int slot, kv_swapped *out,
                kv_err *err);

/**
 * Swap @p s back into the empty @p slot of @p b: take device blocks (all or nothing), copy the
 * bytes back in one batched copy, rebuild the slot's table, token record and length, and
 * release the host blocks. KV_ERR_CAPACITY when the device pool lacks blocks: @p s stays in
 * the host tier, unchanged.
 */
int kv_swap_in(kv_swap *sw, kv_backend *b, const kv_swap_io *io, int slot, kv_swapped *s,
               kv_err *err);

/** Forget a swapped-out sequence: release its host blocks (a zeroed one is fine). */
void kv_swapped_drop(kv_swap *sw, kv_swapped *s);

#ifdef __cplusplus
}
#endif
#endif
