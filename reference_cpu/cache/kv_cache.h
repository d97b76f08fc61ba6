/**
 * @file kv_cache.h
 * The KV cache as a pluggable strategy: where K/V live, in what format, which are kept.
 *
 * The forward pass (kv_forward.h) never indexes cache memory itself: it calls
 * kv_cache_write_seq() for new tokens and kv_attention_rows() (kv_attention.h) to read them,
 * and both dispatch on the ::kv_cache_spec. Chapters add layouts, dtypes and retention
 * policies here instead of copying the forward pass.
 *
 * Chapter 02 layout (contiguous, fp32), per layer and per sequence slot:
 *   k, v  [L][n_slots][H_kv][capacity][d]
 * Cache size = L · 2 · N · H_kv · d · b bytes (b = 4 for fp32).
 *
 * Chapter 04 (quantized storage, formats of kv_quant.h). Each layer l has a storage format
 * fmt[l] (spec.quant.dtype on the layers spec.quant.dtype_layers selects, fp16 on the others; every
 * layer when the mask is 0) and, for K and for V, one ::kv_cache_plane:
 *   codes  [n_slots][H_kv][capacity][row_bytes]    row t of a head = token t, packed codes
 *   meta   [n_slots][H_kv][meta_entries]           4-byte scales / kv_qsz (kv_quant.h)
 *   scale  [n_slots][H_kv]                         fp8 only: the calibrated scale of a head
 *   ring   [n_slots][H_kv][window][d]              KIVI only: the fp32 window of new tokens
 * An fp32 layer's codes plane is exactly chapter 02's [capacity][d] floats, so an all-fp32
 * cache keeps the old layout and k / v point at it.
 *
 * When quantization happens:
 *  - per-token formats (fp16, bf16, int8, int8-gG, fp8): each row as it is written;
 *  - fp8: a slot's scales are calibrated from the first chunk written at position 0 (the
 *    prefill): amax / max per kv head (spec.quant.fp8_per_head = 1) or over all kv heads of the
 *    layer's K (and its V) for that slot (per tensor, 0). Later tokens beyond that range
 *    saturate at +-max: a one-token "prefill" gives a poor scale, so prefill whole prompts;
 *  - KIVI (int4/int2): tokens enter the fp32 ring; a chunk that makes the slot hold more
 *    than `window` unquantized tokens spills the oldest whole 32-token blocks into the code
 *    and meta planes (the plan in kv_quant.h). Q(slot) tokens are quantized; rows t < Q are
 *    read from the planes, rows t >= Q from ring row t % window. All rows of a prefill chunk
 *    see the cache as it is after the whole chunk is written (the spill of a chunk happens
 *    before its attention), so a chunked prefill reads the same as the chunk boundaries
 *    decide, deterministically.
 *
 * Chapter 05 (paged layout, spec.layout.kind = KV_LAYOUT_PAGED). The rows of every sequence live
 * in one pool of N = spec.layout.n_blocks blocks of B = spec.layout.block_size tokens, per layer and per
 * KV head:
 *   codes  [H_kv][N·B][row_bytes]       physical row = block·B + offset (kv_block_table.h)
 *   meta   [H_kv][meta_entries(N·B)]    the format's metadata of those rows
 *   scale  [n_slots][H_kv]              fp8: still one calibration per sequence
 *   ring   [n_slots][H_kv][window][d]   KIVI: still one fp32 window per sequence
 *   tables [n_slots][max_blocks]        logical block i of a slot -> physical block
 * A slot is now only a handle on a sequence: it owns no rows, just its table (set by the
 * caller with kv_cache_set_blocks(), normally kv_paged.h on behalf of a kv_backend). Position
 * t of a slot is physical row tables[t / B]·B + t % B; attention finds it through the
 * kv_head_view, so the math of every format is unchanged. KIVI groups 32 tokens, so a KIVI
 * paged cache needs 32 | B. Head-major pools keep a head's rows of one block adjacent; a block
 * copy is one run of B rows per (layer, K/V, head).
 *
 * Chapter 06 (retention, spec.window.size W > 0; kv_window.h). A slot keeps its first S =
 * spec.window.n_sinks tokens and its W most recent ones: position p lives in logical row p (p < S)
 * or S + (p - S) mod W, a ring reused cyclically, so a slot holds at most S+W rows whatever
 * its length and spec.capacity becomes a bound on positions, not storage. Contiguous: each
 * (layer, slot, head) owns min(capacity, S+W) rows. Paged: the logical row goes through the
 * block table, which stops growing at ceil((S+W)/B) blocks. Per-token formats work unchanged
 * (a row is self-contained: overwriting it overwrites its scales too); KIVI, whose 32-token
 * groups and fp32 window assume rows that never move, is refused with a window. With
 * spec.window.pos_scheme = KV_POS_CACHE (StreamingLLM) keys are stored before RoPE: attention
 * rotates each by its index in the cache (c->rope_cs holds cos/sin of the S+W indices).
 */
#ifndef KV_CACHE_H
#define KV_CACHE_H

#include <stdint.h>

#include "kv_cache_spec.h"
#include "kv_seq.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One block copy of a paged cache: every layer, K and V, of block src into dst. The memory
 * layer records them (kv_block_table.h); the cache performs them (kv_cache_copy_blocks()). */
typedef struct {
    int src, dst;
} kv_block_copy;

/** One stored tensor of one layer, quantized layout (see the file comment): a layer's K or
 * its V. Pointers are host memory in a kv_cache and device memory in the CUDA twin. */
typedef struct {
    uint8_t *codes;       /* [n_slots][H_kv][capacity][row_bytes] */
    void *meta;           /* [n_slots][H_kv][meta_entries] 4-byte entries, or NULL */
    float *scale;         /* [n_slots][H_kv] fp8 scales, or NULL */
    float *ring;          /* [n_slots][H_kv][window][d] KIVI window, or NULL */
    int64_t row_bytes;    /* bytes of one token row of codes */
    int64_t meta_entries; /* metadata entries per (slot, kv head) */
    int role;             /* KV_QROLE_KEY or KV_QROLE_VALUE: how its format groups values */
} kv_cache_plane;

/** Planes per layer: K (plane 0) and V (plane 1). The cache's parts loop over planes and read
 * each one's role, so a cache with another list of planes changes this list only: a latent
 * cache (chapter 11, multi-head latent attention) has one plane, its rows read as keys and
 * values alike (kv_cache_create_planes()). */
#define KV_CACHE_KV_PLANES 2

/** The role of plane @p i of a layer: its K, then its V. */
static inline KV_HD int kv_cache_plane_role(int i)
{
    return i == 0 ? KV_QROLE_KEY : KV_QROLE_VALUE;
}
/** The plane that holds @p role's rows. */
static inline KV_HD int kv_cache_role_plane(int role)
{
    return role == KV_QROLE_KEY ? 0 : 1;
}
/** Plane @p i of @p layer in a cache's planes [n_planes][n_layers] (every layer's plane 0,
 * then every layer's plane 1, as kv_cache_layout() lays out their bytes). */
static inline KV_HD kv_cache_plane *kv_cache_plane_of(kv_cache_plane *planes, int n_layers,
                                                       int i, int layer)
{
    return planes + (size_t)i * n_layers + layer;
}

/**
 * Chapter 10: the undo log of one slot while a speculative step runs (kv_cache_speculate()).
 * A windowed cache overwrites ring rows and a KIVI cache spills fp32 rows into 2/4-bit groups,
 * so a rejected tail cannot be dropped by a length alone: each such write first copies what
 * it overwrites here, and kv_cache_truncate() copies it back, newest first. Position p's entry
 * is p mod M, so only the last M = max_tokens positions written can be undone; the memory is
 * bounded by M rows (and, for KIVI, ceil(M/32) + 1 groups of 32 rows) per (layer, K/V, head),
 * whatever the window or prompt. The same host bookkeeping serves the CUDA cache, whose rows
 * and groups point to device memory.
 */
typedef struct kv_undo {
    int armed;           /* 1 between kv_cache_speculate() and the truncate that uses it */
    int max_tokens;      /* M: positions whose writes can be undone */
    int n_groups;        /* KIVI: group entries, ceil(M/32) + 1; else 0 */
    int len0;            /* the slot's length when armed: truncation goes no lower */
    int end;             /* one past the last position written while armed */
    int *qlen0;          /* [L] KIVI quantized counts when armed */
    uint8_t *rows;       /* [L][2][H_kv][M][row_stride]: a row's codes then its metadata
                          * (per-token formats under a window), or its fp32 KIVI ring row */
    uint8_t *groups;     /* [L][2][H_kv][n_groups][group_stride]: a KIVI group's 32 rows of
                          * codes then their metadata, as before a spill wrote them */
    size_t row_stride, group_stride;
    size_t alloc_bytes;  /* bytes of rows + groups allocated (reused by the next arm) */
    double copied;       /* bytes copied into the log so far (a measurement) */
} kv_undo;

/**
 * Where a cache's bytes live, for the host state's few moves of them (fork, the undo log):
 * NULL in a kv_cache (host memory: kv_calloc, memcpy); the CUDA cache's functions allocate,
 * free and copy device memory. Each returns KV_OK or fails with a message naming @p who.
 */
typedef struct kv_cache_device {
    int (*alloc)(void **p, size_t bytes, const char *who, kv_err *err); /* zeroed */
    void (*release)(void *p);
    int (*copy)(void *dst, const void *src, size_t bytes, const char *who, kv_err *err);
} kv_cache_device;

typedef struct {
    kv_cache_spec spec;
    int n_layers, n_kv_heads, head_dim;
    int rows;          /* rows per head of a plane: capacity, or min(capacity, S+W) with a
                        * window (contiguous), or N·B (paged) */
    int max_blocks;    /* paged: ceil(capacity / B), or ceil(min(capacity, S+W) / B) with a
                        * window, table entries per slot, else 0 */
    int *tables;       /* paged: [n_slots][max_blocks] physical block ids, else NULL */
    int *n_mapped;     /* paged: [n_slots] table entries set, else NULL */
    int window;        /* KIVI window R (0 when no layer is KIVI) */
    float *k;          /* all-fp32 caches: [L][n_slots][H_kv][capacity][d] (layer l at
                        * kp[l].codes, a multiple of 128 bytes
                        * into mem; kv_cache_k()), else NULL */
    float *v;          /* all-fp32 caches: the same for V (vp[l].codes), else NULL */
    int *len;          /* [n_slots] tokens currently stored per slot */
    int *fmt;          /* [L] storage format of each layer */
    int n_planes;      /* planes per layer: KV_CACHE_KV_PLANES (K, V), or 1 (a latent
                        * cache: plane 0 only, read with role KV_QROLE_KEY) */
    kv_cache_plane *planes; /* [n_planes][L]: kv_cache_plane_of() */
    int *qlen;         /* [L][n_slots] KIVI: tokens already quantized (multiple of 32) */
    uint8_t *mem;      /* the one allocation every plane points into */
    size_t mem_bytes;
    int rotary_dim;    /* the model's rotary dims (KV_POS_CACHE rotates keys at attention) */
    float *rope_cs;    /* KV_POS_CACHE: [S+W][rotary_dim/2][2] cos, sin of each cache index,
                        * computed as kv_rope() does; else NULL */
    struct kv_retain *retain; /* chapter 09: what each (slot, layer, KV head) keeps and reads,
                               * owned by the engine (kv_retain_cache_create() in kv_retain.h
                               * sets it, kv_retain_cache_free() frees it); the cache never
                               * reads it; NULL otherwise */
    kv_undo *undo;     /* chapter 10: [n_slots] undo logs, allocated by the first
                        * kv_cache_speculate() of a windowed or KIVI cache, else NULL */
    const kv_cache_device *device; /* NULL: host memory; the CUDA cache: device memory */
} kv_cache;

/**
 * What attention needs to read one (layer, slot, kv head) of K or of V, in any format:
 * element j of row t is kv_cache_elem(). Host and device alike (KV_HD).
 */
typedef struct {
    int fmt, role, d, window;
    int64_t q;            /* rows < q are in codes/meta, rows >= q in the ring (KIVI) */
    const uint8_t *codes; /* [capacity][row_bytes] */
    const void *meta;     /* this head's metadata */
    const float *ring;    /* [window][d] or NULL */
    float scale;          /* fp8 scale of this head */
    const int *blocks;    /* paged: the slot's table [max_blocks]; NULL = contiguous */
    int block_size;       /* paged: B */
    int block_shift;      /* paged: log2 B when B is a power of two, else -1 */
} kv_head_view;

/** Where row t of a view is stored: t itself (contiguous), or its physical row (paged). */
static inline KV_HD int64_t kv_view_row(const kv_head_view *h, int64_t t)
{
    if (!h->blocks) return t;
    if (h->block_shift >= 0) /* a shift and a mask: a division per row costs as much as a dot */
        return ((int64_t)h->blocks[t >> h->block_shift] << h->block_shift) |
               (t & (h->block_size - 1));
    return (int64_t)h->blocks[t / h->block_size] * h->block_size + t % h->block_size;
}

/** Element j of row t of a head view: the fused dequantization attention calls inline. */
static inline KV_HD float kv_cache_elem(const kv_head_view *h, int64_t t, int j)
{
    if (t >= h->q) return h->ring[(t % h->window) * h->d + j];
    return kvq_decode_element(h->fmt, h->role, h->codes, h->meta, kv_view_row(h, t), j, h->d,
                              h->scale);
}

/** Build the view of (layer plane @p p of format @p fmt, slot, kvh). @p q: quantized rows
 * (KIVI), or a value >= capacity for the other formats (everything is in the planes). */
static inline KV_HD kv_head_view kv_cache_plane_view(const kv_cache_plane *p, int fmt, int role,
                                                    int n_kv_heads, int capacity, int d,
                                                    int window, int slot, int kvh, int64_t q)
{
    kv_head_view h;
    const int64_t head = (int64_t)slot * n_kv_heads + kvh;
    h.fmt = fmt;
    h.role = role;
    h.d = d;
    h.window = window > 0 ? window : 1;
    h.q = kvq_is_kivi(fmt) ? q : INT64_MAX;
    h.codes = p->codes + head * capacity * p->row_bytes;
    h.meta = p->meta ? (const uint8_t *)p->meta + head * p->meta_entries * 4 : NULL;
    h.ring = p->ring ? p->ring + head * window * d : NULL;
    h.scale = p->scale ? p->scale[head] : 1.0f;
    h.blocks = NULL;
    h.block_size = 0;
    h.block_shift = -1;
    return h;
}

/** The paged twin of kv_cache_plane_view(): codes and metadata from head @p kvh of the pool
 * (@p pool_rows = N·B rows), the fp8 scale and KIVI window from the slot, rows mapped through
 * @p blocks (the slot's table) of @p block_size tokens. */
static inline KV_HD kv_head_view kv_cache_plane_view_paged(const kv_cache_plane *p, int fmt,
                                                          int role, int n_kv_heads,
                                                          int pool_rows, int d, int window,
                                                          int slot, int kvh, int64_t q,
                                                          const int *blocks, int block_size)
{
    kv_head_view h = kv_cache_plane_view(p, fmt, role, n_kv_heads, pool_rows, d, window, 0, kvh, q);
    const int64_t head = (int64_t)slot * n_kv_heads + kvh;
    h.ring = p->ring ? p->ring + head * window * d : NULL;
    h.scale = p->scale ? p->scale[head] : 1.0f;
    h.blocks = blocks;
    h.block_size = block_size;
    h.block_shift = -1;
    for (int sh = 0; sh < 31; sh++)
        if (block_size == (1 << sh)) h.block_shift = sh;
    return h;
}


/* ---- the host state both devices share (cache/kv_cache_state.c) ---------------------------
 * A cache's spec, shapes, formats, lengths, KIVI counts, block tables and undo bookkeeping
 * live in host memory on either device: the CUDA cache is a kv_cache whose planes (and k, v,
 * mem) point to device memory (struct kvcu_cache derives from it, cuda/core/kvcu_internal.cuh).
 * These functions are that state's life and every check on it; each device calls them, then
 * moves its own bytes, so a refusal has one text on both devices (@p who names the entry
 * point that refuses). */

/** The spec's checks (kv_cache_spec_check_caps()), the host arrays (formats, lengths, KIVI
 * counts, block tables, the list of @p n_planes planes per layer) and the planes' sizes:
 * c->mem_bytes is what kv_cache_state_place() lays out. KV_ERR_UNSUPPORTED, KV_ERR_NOMEM, named. */
int kv_cache_state_create(kv_cache *c, const char *who, const kv_config *cfg,
                          const kv_cache_spec *spec, int n_planes, kv_err *err);
/** Point the planes into @p base (c->mem_bytes bytes, host or device memory), and k, v at
 * chapter 02's arrays when every layer is fp32, contiguous, without a window. */
void kv_cache_state_place(kv_cache *c, uint8_t *base);
/** Free the host arrays and zero the struct (not mem, not the undo logs' rows). */
void kv_cache_state_free(kv_cache *c);
/** Chapter 05: kv_cache_set_blocks()'s checks and table (a paged cache, a slot in range, at
 * most max_blocks entries holding the slot's cached rows, every id inside the pool). */
int kv_cache_state_set_blocks(kv_cache *c, const char *who, int slot, const int *blocks, int n,
                              kv_err *err);
/** kv_cache_set_length()'s checks and length. */
int kv_cache_state_set_length(kv_cache *c, const char *who, int slot, int len, kv_err *err);
/** kv_cache_fork_slot(): its checks, the length and KIVI counts, and the fp8 scales and KIVI
 * windows of every plane (copied in the cache's memory). */
int kv_cache_state_fork(kv_cache *c, const char *who, int dst, int src, kv_err *err);
/** kv_cache_speculate() and kv_cache_truncate() (chapter 10), their checks and their undo
 * log, whose entries live in the cache's memory (c->device). */
int kv_cache_state_speculate(kv_cache *c, const char *who, int slot, int max_tokens,
                             kv_err *err);
int kv_cache_state_truncate(kv_cache *c, const char *who, int slot, int len, kv_err *err);
/**
 * Chapter 05's rule on a step, for both devices' forward passes and writes: every row a
 * sequence of @p seqs writes must fall inside the blocks mapped to its slot. Without a window
 * those are its positions pos .. pos+n-1; with one (chapter 06) its rows, min(pos + n, S+W):
 * the table stops growing once the ring is mapped. KV_ERR_CAPACITY naming the sequence.
 */
int kv_cache_check_rows(const char *who, const kv_cache *c, const kv_seq *seqs, int n_seqs,
                        kv_err *err);
/** kv_cache_copy_blocks()'s checks: a paged cache, n >= 0, every pair inside the pool. */
int kv_cache_check_pairs(const char *who, const kv_cache *c, const kv_block_copy *pairs, int n,
                         kv_err *err);
/** kv_cache_read_blocks()'s and kv_cache_write_blocks()'s checks (@p dev_is_src: the pool
 * block is pairs[i].src, a read). */
int kv_cache_check_block_io(const char *who, const kv_cache *c, const kv_block_copy *pairs,
                            int n, const void *host, size_t block_bytes, int dev_is_src,
                            kv_err *err);
/** kv_cache_write_slots()'s checks. */
int kv_cache_check_slots(const char *who, const kv_cache *c, int layer, const int64_t *slots,
                         int n, const float *k, const float *v, kv_err *err);

/** Allocate a cache for a model config; unsupported spec -> KV_ERR_UNSUPPORTED, named. */
int kv_cache_create(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec, kv_err *err);
/**
 * kv_cache_create() with @p n_planes planes per layer: KV_CACHE_KV_PLANES (K and V: what
 * kv_cache_create() builds) or 1, a cache of one row per (token, KV head) of
 * kv_config_head_dim(cfg) elements, role KV_QROLE_KEY, written with kv_cache_write_seq(c, l,
 * slot, pos, n, rows, NULL, err) and read with kv_cache_view(.., KV_QROLE_KEY). Chapter 11's
 * latent cache is one: H_kv 1 and rows of d_c + d_R (kv_mla.h). Every format, layout and the
 * undo log loop over the planes, so they serve it unchanged. KV_ERR_ARG for another count.
 */
int kv_cache_create_planes(kv_cache *c, const kv_config *cfg, const kv_cache_spec *spec,
                           int n_planes, kv_err *err);
/** Free the cache's memory (safe on a zeroed struct). */
void kv_cache_free(kv_cache *c);
/** Forget a slot's tokens (length 0, and for KIVI nothing quantized); the memory is kept. */
void kv_cache_reset(kv_cache *c, int slot);
/**
 * Chapter 10 (speculative decoding): keep only the first @p len tokens of @p slot, dropping
 * the rejected tail a verification step wrote. The rows stay in memory, invisible past len;
 * the next step overwrites them. Per-token formats (fp32, fp16, bf16, int8, fp8) need nothing
 * else: a row holds its own scales, and fp8's per-sequence scale was set by the prefill.
 * A window (the ring overwrote the rows the tail evicted) or a KIVI layer (a spill quantized
 * rows that must be fp32 again) rolls back through the undo log kv_cache_speculate() armed:
 * every overwritten ring row, fp32 window row and spilled group is copied back and the
 * quantized counts reset, so the slot holds the bytes a run that never saw the tail holds;
 * the log is then disarmed. KV_ERR_UNSUPPORTED for such a cache when the log is not armed,
 * len lies below the length it was armed at, or more than its max_tokens positions are
 * dropped (nothing changes); len equal to the cached length always succeeds. KV_ERR_ARG for
 * a slot out of range or len outside [0, cached length]. A paged cache keeps its table: the
 * caller releases the blocks past len (kv_backend's truncate does).
 */
int kv_cache_truncate(kv_cache *c, int slot, int len, kv_err *err);
/**
 * Chapter 10: arm @p slot's undo log before a speculative step, so that kv_cache_truncate()
 * can drop up to @p max_tokens of the positions written from now on (at least the slot's
 * current length must stay). Only a windowed or KIVI cache logs anything; for the others
 * (a length is enough) this returns KV_OK and copies nothing. Re-arming starts a new log;
 * max_tokens 0 disarms. Memory: max_tokens rows per (layer, K/V, head), plus for KIVI
 * ceil(max_tokens/32) + 1 groups of 32 rows, allocated once and reused. KV_ERR_ARG for a slot
 * out of range or max_tokens negative or absurd; KV_ERR_NOMEM.
 */
int kv_cache_speculate(kv_cache *c, int slot, int max_tokens, kv_err *err);
/** 1 when a cache of @p spec with layer formats @p fmt [n_layers] needs the undo log to
 * truncate (a window, or a KIVI layer), else 0. */
int kv_cache_needs_undo(const kv_cache_spec *spec, const int *fmt, int n_layers);
/**
 * Where rows prow .. prow+n-1 of head @p rhead (of @p rows rows) of plane @p p keep their
 * bytes: off[0] codes offset and off[1] bytes (from p->codes), off[2] metadata offset and
 * off[3] bytes (from p->meta; 0 bytes when the format keeps none per row). KIVI groups: prow a
 * multiple of 32, n = 32.
 */
static inline KV_HD void kv_cache_span(const kv_cache_plane *p, int fmt, int role,
                                       int64_t rhead, int rows, int64_t prow, int n, int d,
                                       size_t off[4])
{
    const int64_t m0 = kvq_meta_index(fmt, role, prow, 0, d);
    const int64_t m1 = kvq_meta_index(fmt, role, prow + n, 0, d);
    off[0] = (size_t)((rhead * rows + prow) * p->row_bytes);
    off[1] = (size_t)(n * p->row_bytes);
    off[2] = (size_t)((rhead * p->meta_entries + m0) * 4);
    off[3] = p->meta ? (size_t)((m1 - m0) * 4) : 0;
}
/** Bytes of K and V storage the cache holds in total: codes, metadata, fp8 scales, KIVI
 * windows. */
size_t kv_cache_bytes(const kv_cache *c);

/**
 * Lay out the planes of a cache built from @p spec in one buffer of the returned size and
 * point @p planes [KV_CACHE_KV_PLANES][n_layers] into @p base (NULL: sizes only, pointers left
 * NULL), each with its role. Shared by kv_cache_create() and the CUDA cache, so both hold the
 * same bytes at the same offsets.
 */
size_t kv_cache_layout(const kv_cache_spec *spec, int n_layers, int n_kv_heads, int d,
                       uint8_t *base, kv_cache_plane *planes);
/** kv_cache_layout() of @p n_planes planes per layer (planes [n_planes][n_layers]). */
size_t kv_cache_layout_planes(const kv_cache_spec *spec, int n_planes, int n_layers,
                              int n_kv_heads, int d, uint8_t *base, kv_cache_plane *planes);

/** Chapter 06, KV_POS_CACHE: cos and sin of every cache index 0 .. S+W-1 of @p spec's window,
 * [S+W][rotary_dim/2][2] floats (kv_calloc()'ed, kv_free() it; *bytes its size), computed as
 * kv_rope() computes them. Shared with the CUDA cache, so both rotate keys with the same bits.
 * NULL when out of memory. */
float *kv_cache_rope_table(const kv_config *cfg, const kv_cache_spec *spec, size_t *bytes);

/** The view attention reads for (layer, slot, kv head), K (@p role KV_QROLE_KEY) or V. */
kv_head_view kv_cache_view(const kv_cache *c, int layer, int slot, int kvh, int role);

/**
 * Store @p n consecutive tokens' keys and values at positions pos .. pos+n-1 of @p slot in
 * @p layer, quantizing into the layer's format (file comment: fp8 calibrates at pos 0, KIVI
 * spills its window). The slot's length is the caller's (kv_forward() sets it after the
 * step); pos must continue what the layer holds.
 * k, v  [n][H_kv][d]   (k already rotated by RoPE; under a window's KV_POS_CACHE scheme, k
 *                       before RoPE: attention rotates it by its cache index)
 * A windowed cache stores position p in its ring row (kv_window_row()): the caller writes a
 * chunk only as far as kv_window_chunk() allows before its queries attend (kv_forward does).
 * Returns KV_OK, or KV_ERR_NOMEM (KIVI staging), with a message.
 */
int kv_cache_write_seq(kv_cache *c, int layer, int slot, int pos, int n, const float *k,
                       const float *v, kv_err *err);

/**
 * Paged caches: map logical blocks 0 .. n-1 of @p slot to physical blocks @p blocks [n]
 * (the slot's kv_block_table). KV_ERR_ARG on a contiguous cache, n > max_blocks, an id
 * outside the pool, or a map that no longer covers the slot's cached tokens.
 */
int kv_cache_set_blocks(kv_cache *c, int slot, const int *blocks, int n, kv_err *err);

/**
 * A fork's per-sequence state: @p dst takes @p src's length, KIVI quantized count and fp32
 * window, and fp8 scales (the rows themselves are shared through the block table the caller
 * sets). Paged caches only.
 */
int kv_cache_fork_slot(kv_cache *c, int dst, int src, kv_err *err);

/**
 * A prefix-cache hit: @p slot's mapped blocks already hold its first @p len tokens, written by
 * another sequence. KV_ERR_UNSUPPORTED when a layer is fp8 or KIVI (their scales and windows
 * belong to the sequence that wrote the rows, not to the rows), KV_ERR_ARG when len exceeds
 * the mapped blocks or the slot is not empty.
 */
int kv_cache_set_length(kv_cache *c, int slot, int len, kv_err *err);

/**
 * Copy every layer's K and V rows (codes and metadata) of block src into block dst, for each
 * pair in order: the copy-on-write list of a step (kv_block_table.h). Paged caches only.
 */
int kv_cache_copy_blocks(kv_cache *c, const kv_block_copy *pairs, int n, kv_err *err);

/**
 * Chapter 07: bytes of one block of a paged cache as the host tier stores it: every layer,
 * K and V, every KV head, the block's B rows of codes then their metadata, in the order
 *   [L][K, V][H_kv] ( codes [B][row_bytes], meta [entries of B rows] ).
 * Every device uses this order, so a host tier written by one is readable by another.
 * 0 for a contiguous cache.
 */
size_t kv_cache_block_bytes(const kv_cache *c);

/**
 * One batched copy device -> host: pool block pairs[i].src of @p c into host block
 * pairs[i].dst, at @p host + dst * @p block_bytes, in kv_cache_block_bytes()'s order.
 * KV_ERR_ARG on a contiguous cache, a pool block outside [0, N), a negative host block, or
 * @p block_bytes other than kv_cache_block_bytes().
 */
int kv_cache_read_blocks(const kv_cache *c, const kv_block_copy *pairs, int n, uint8_t *host,
                         size_t block_bytes, kv_err *err);

/** The reverse of kv_cache_read_blocks(): host block pairs[i].src into pool block
 * pairs[i].dst, the same checks. */
int kv_cache_write_blocks(kv_cache *c, const kv_block_copy *pairs, int n, const uint8_t *host,
                          size_t block_bytes, kv_err *err);

/**
 * vLLM-style write through a flat slot mapping (chapter 05): token i's keys and values
 * k, v [n][H_kv][d] go to pool row slots[i] = block·B + offset of @p layer, every KV head; a
 * negative slot is padding and is skipped. Nothing else changes (lengths are the caller's).
 * The rows are self-contained in the per-token formats (fp32, fp16, bf16, int8, int8-gG);
 * fp8 and KIVI keep per-sequence scales and windows that a flat slot list does not name, so
 * they are refused (KV_ERR_UNSUPPORTED) — use kv_cache_write_seq() for them. KV_ERR_ARG for
 * a contiguous cache or a slot outside the pool. The forward pass writes with
 * kv_cache_write_seq(), which computes the same rows from each slot's table.
 */
int kv_cache_write_slots(kv_cache *c, int layer, const int64_t *slots, int n, const float *k,
                         const float *v, kv_err *err);

/** One token: kv_cache_write_seq() with n = 1 (a KIVI spill's scratch failing is ignored
 * here; use kv_cache_write_seq() to see it). k, v [H_kv][d]. */
void kv_cache_write(kv_cache *c, int layer, int slot, int pos, const float *k, const float *v);

/** Row of keys for (layer, slot, kv head): [capacity][d]. Contiguous all-fp32 caches without
 * a window only (c->k is NULL otherwise). */
static inline float *kv_cache_k(const kv_cache *c, int layer, int slot, int kvh)
{
    size_t row = (size_t)slot * c->n_kv_heads + kvh; /* the layer's own plane: see kv_cache.c */
    return c->k ? (float *)(void *)kv_cache_plane_of(c->planes, c->n_layers, 0, layer)->codes +
                      row * (size_t)c->spec.capacity * c->head_dim
                : NULL;
}
/** Row of values for (layer, slot, kv head): [capacity][d]. All-fp32 caches only. */
static inline float *kv_cache_v(const kv_cache *c, int layer, int slot, int kvh)
{
    size_t row = (size_t)slot * c->n_kv_heads + kvh;
    return c->v ? (float *)(void *)kv_cache_plane_of(c->planes, c->n_layers, 1, layer)->codes +
                      row * (size_t)c->spec.capacity * c->head_dim
                : NULL;
}

#ifdef __cplusplus
}
#endif
#endif
