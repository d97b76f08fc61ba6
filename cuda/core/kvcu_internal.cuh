/**
 * @file kvcu_internal.cuh
 * What the CUDA engine's files share and callers of kvcu.h never see: the device cache
 * struct, the engine-only launchers (cache write, attention over the cache), and the
 * warp/block reductions every kernel that sums uses.
 */
#ifndef KVCU_INTERNAL_CUH
#define KVCU_INTERNAL_CUH

#include <math.h>
#include <string.h>

#include "kv_cuda.cuh"
#include "kvcu.h"
#include "kv_heads.h"

/* The device cache: a kv_cache (reference_cpu/cache/kv_cache.h) whose planes, k, v and mem
 * point to device memory, laid out by the same kv_cache_layout(), so a chapter's figure of the
 * memory holds for both. Its host state (spec, formats, slot lengths, KIVI counts, block
 * tables, undo bookkeeping) is the CPU's struct, made, checked and freed by the same
 * functions (cache/kv_cache_state.c): the batch checks, the spill decisions and the launch
 * sizes read it on the host. What only the device needs follows: mirrors of the host arrays
 * the kernels read, and scratch. */
struct kvcu_cache : kv_cache {
    int *d_qlen;         /* device mirror of qlen [L][n_slots] */
    float *stage;        /* device scratch of a KIVI spill: [2][H_kv][rows][d] */
    size_t stage_bytes;
    int span;            /* rows one slot ever holds, the most positions a query attends:
                          * capacity, or min(capacity, S+W) with a window (chapter 06) */
    int *d_tables;       /* device mirror of tables [n_slots][max_blocks] (chapter 05) */
    kv_cache_plane *d_planes; /* device copy of planes [n_planes][L]: the block-copy kernel's */
    int *d_fmt;          /* device [L] copy of fmt */
    kv_block_copy *d_pairs;   /* device scratch of a copy list */
    int pairs_cap;
    int *seg_mark;       /* host [2][n_blocks] scratch of kvcu_cache_copy_blocks() */
    float *d_rope_cs;    /* chapter 06, KV_POS_CACHE: device copy of rope_cs, else NULL */
    struct kvcu_retain_scratch *rscratch; /* chapter 09: kvcu_retain_attend()'s device
                                           * buffers and host staging, or NULL */
};

/* Where logical row t of @p slot is stored: t itself in a contiguous cache (tables NULL), else
 * the physical row tables[slot][t / B]·B + t % B of the pool (kv_view_row()'s rule). A
 * windowed cache first maps a position to its logical row (kv_window_row()). */
__device__ inline int64_t kvcu_slot_row(const int *tables, int max_blocks, int block_size,
                                        int slot, int64_t t)
{
    if (!tables) return t;
    return (int64_t)tables[(size_t)slot * max_blocks + t / block_size] * block_size +
           t % block_size;
}

/**
 * Store the K and V rows of T tokens of one layer: token t goes to position tok_pos[t] of
 * slot tok_slot[t] (twin of kv_cache_write_seq() once per sequence), quantizing into the
 * layer's format; @p seqs (host) are the step's sequences, whose rows are consecutive in
 * k / v, for the per-sequence work (fp8 calibration at position 0, KIVI spills). A windowed
 * cache stores position p in its ring row kv_window_row(p); under KV_POS_CACHE k is the key
 * before RoPE (the caller skips it), as on the CPU.
 * k, v [T][H_kv][d] device; tok_slot, tok_pos [T] device.
 */
int kvcu_cache_write(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                     const int *tok_slot, const int *tok_pos, const float *k, const float *v,
                     int T, kv_err *err);

/**
 * Attention of T query tokens over one layer of the cache (twin of calling kv_attention()
 * once per token): token row r = row_of[t] (or t when row_of is NULL) reads the positions
 * its query at tok_pos[r] retains of slot tok_slot[r] (0 .. tok_pos[r] without a window;
 * the sinks and the window in position order with one, kv_window_walk), dequantizing K and
 * V inside the loops (kv_cache_elem()) and, under KV_POS_CACHE, rotating each key by its
 * index in that list. q, out are indexed by r: a prefill wave (kv_forward.c) attends only
 * the rows it lists.
 * q, out [rows][H][d] device; tok_slot, tok_pos [rows] device; row_of [T] device or NULL;
 * scores: device scratch of kvcu_attention_scratch(T, ...) floats. max_len: the most
 * positions a row of the launch attends (host), which picks the kernel: v2 when it fits one
 * 512-position partition, else v3 (cuda/attention/kvcu_attention.cu says why).
 */
int kvcu_attention(const kvcu_cache *c, int layer, const int *tok_slot, const int *tok_pos,
                   const int *row_of, const float *q, float *out, float *scores, int T,
                   int n_heads, int max_len, kv_err *err);

/** Floats of the scores scratch kvcu_attention() needs for T rows over a cache whose queries
 * attend at most @p capacity positions (the cache's span): the scores [T][H][capacity] and
 * v3's partition results [T][H][ceil(capacity / 512)][d + 2]. */
size_t kvcu_attention_scratch(int T, int n_heads, int head_dim, int capacity);

/* ---- reading a layer of the cache in kernels (cuda/attention/kvcu_attention.cu, kvcu_flash.cu)
 * The one attention family reads K and V through these: a layer's planes and tables passed
 * by value, a kv_head_view per (slot, KV head), and an element loader with the fused
 * dequantization of every format. */

/* What the kernels read of one layer of a cache (or of plain fp32 arrays): passed by value. */
typedef struct {
    kv_cache_plane kp, vp; /* K and V planes, device pointers */
    int n_kv_heads;        /* H_kv: the heads of a slot in a plane (the cache's, read here
                            * by every kernel and launcher rather than passed beside it) */
    int fmt;               /* the layer's format */
    const int *qlen;       /* device [n_slots] KIVI quantized counts, NULL when not KIVI */
    int window;            /* KIVI window (>= 1) */
    int rows;              /* rows per head of a plane: capacity, or N·B pool rows */
    const int *tables;     /* paged: device [n_slots][max_blocks]; NULL: contiguous */
    int max_blocks, block_size;
    int keep_w, keep_s;    /* chapter 06: retention W and S; 0, 0 keeps every position */
    const float *rope_cs;  /* KV_POS_CACHE: device [S+W][rotary_dim/2][2] cos, sin, else NULL */
    int rotary_dim;
} attn_src;

/* The view of (slot, kvh) of the K (role KV_QROLE_KEY) or V plane. */
__device__ inline kv_head_view attn_view(const attn_src &s, int role, int d, int slot, int kvh)
{
    const kv_cache_plane *p = role == KV_QROLE_KEY ? &s.kp : &s.vp;
    const int64_t q = s.qlen ? s.qlen[slot] : 0;
    if (s.tables)
        return kv_cache_plane_view_paged(p, s.fmt, role, s.n_kv_heads, s.rows, d, s.window, slot,
                                         kvh, q, s.tables + (size_t)slot * s.max_blocks,
                                         s.block_size);
    return kv_cache_plane_view(p, s.fmt, role, s.n_kv_heads, s.rows, d, s.window, slot, kvh, q);
}

/* Element i of logical row p, stored at row r = kv_view_row(p): kv_cache_elem() with the
 * block-table lookup hoisted out of the loop over i. f32: the plain floats of an fp32 layer. */
__device__ inline float kv_ld(const kv_head_view &hv, const float *f32, int64_t p, int64_t r, int i)
{
    if (f32) return f32[r * hv.d + i];
    if (p >= hv.q) return hv.ring[(p % hv.window) * hv.d + i];
    return kvq_decode_element(hv.fmt, hv.role, hv.codes, hv.meta, r, i, hv.d, hv.scale);
}

/* The cos/sin entry [rotary_dim/2][2] of cache index i under KV_POS_CACHE, else NULL. */
__device__ inline const float *attn_rope(const attn_src &s, int64_t i)
{
    return s.rope_cs ? s.rope_cs + i * (s.rotary_dim / 2) * 2 : NULL;
}

/* Element i of a key, rotated by its cache index when @p cs is that index's cos/sin
 * (KV_POS_CACHE: keys are stored before RoPE). The pair (2j, 2j+1) is rotated with
 * kv_attention.c's rotate_row() arithmetic, every product and sum rounded on its own (no
 * fused multiply-add, which would round once), so the rotated key has the CPU's bits. */
__device__ inline float key_ld(const kv_head_view &kh, const float *kf, int64_t p, int64_t r,
                               int i, const float *cs, int rotary_dim)
{
    if (!cs || i >= rotary_dim) return kv_ld(kh, kf, p, r, i);
    const int j = i & ~1;
    const float a = kv_ld(kh, kf, p, r, j), b = kv_ld(kh, kf, p, r, j + 1);
    const float c = cs[j], s = cs[j + 1];
    return (i & 1) ? __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c))
                   : __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}

/* ---- the rows of a launch, and the split-KV decode's ranges (kvcu_attention.cu, kvcu_flash.cu)
 * Launch row t computes token row tr = row_of[t] (a prefill wave lists its rows), or t. Its
 * query sits at position tok_pos[tr] of slot tok_slot[tr] (a batch of sequences), or, with
 * tok_slot NULL, at pos0 + t·step of slot slot0 (one decode token: step 0; chapter 08's job
 * of consecutive queries: step 1). It attends the indices [k_begin, min(n, n_keys)) of the
 * positions it retains, n = kv_window_count(): the engine's rows take them all (k_begin 0,
 * n_keys unbounded); a chapter 08 job starts at its k_begin and stops at its n_keys. */
typedef struct {
    const int *tok_slot, *tok_pos; /* device [rows], or NULL */
    const int *row_of;             /* device [T], or NULL */
    int slot0, step;
    int64_t pos0, k_begin, n_keys;
    int split_target;              /* split-KV: 0, ranges of KVCU_FLASH_SPLIT_KEYS keys; else
                                    * about this many ranges per row (attn_split_keys()) */
    /* chapter 09's selected sets (kvcu_attn_list_launch()), else sel NULL: launch row t is step
     * row tr = sel_r0 + t, and its KV head kvh reads the sel_cnt[kvh][tr - sel_j0] cache
     * positions at sel + sel_off[kvh][tr - sel_j0] (off, cnt [H_kv][sel_n]); sel_att
     * [T][H][sel_stride] receives each listed position's score, then its exp(s - max), and
     * sel_sums [T][H] the exp-sum it is divided by (the mass kernel of kvcu_retain.cu). */
    const int *sel, *sel_off, *sel_cnt;
    int sel_r0, sel_j0, sel_n, sel_group, sel_stride;
    float *sel_att, *sel_sums;
} attn_rows;

/* What launch row t computes: token row tr of slot `slot`, query position tpos, retained
 * indices p0 .. p1 - 1 (p1 == p0: no key; its output is zeros). */
typedef struct {
    int tr, slot;
    int64_t tpos, p0, p1;
    int64_t keys; /* keys per split-KV range of this row */
} attn_span;

/* Split-KV ranges of the engine's decode kernel (kvcu_decode.cu): a row of n keys is cut into
 * about `target` ranges of at least KVCU_DECODE_MIN_KEYS keys (shorter ones cost more in partial
 * states than they save, once the GPU is full). A row too short for that many such ranges
 * would leave SMs idle (B = 1 at a short context, MQA's one KV head), so its floor drops to
 * what cuts it into at most KVCU_DECODE_SHORT_PARTS ranges, none under KVCU_DECODE_SHORT_KEYS
 * (a tile or more each). Each range is a multiple of 64 keys (whole tiles). The length of the
 * row and the target (a device constant) decide it: never the batch. */
#define KVCU_DECODE_MIN_KEYS 256
#define KVCU_DECODE_SHORT_KEYS 64
#define KVCU_DECODE_SHORT_PARTS 64
static inline KV_HD int64_t attn_split_keys(int64_t n, int target)
{
    int64_t floor_keys = (n + KVCU_DECODE_SHORT_PARTS - 1) / KVCU_DECODE_SHORT_PARTS;
    if (floor_keys < KVCU_DECODE_SHORT_KEYS) floor_keys = KVCU_DECODE_SHORT_KEYS;
    if (floor_keys > KVCU_DECODE_MIN_KEYS) floor_keys = KVCU_DECODE_MIN_KEYS;
    int64_t k = target > 0 ? (n + target - 1) / target : n;
    if (k < floor_keys) k = floor_keys;
    return (k + 63) / 64 * 64;
}

/* The most ranges attn_split_keys() makes of a row of at most n keys: at most 64 below
 * 64 · 256 keys, else n / 256 (rounded up); never more than the target. */
static inline KV_HD int64_t attn_split_parts_max(int64_t n, int target)
{
    const int64_t shrt = (n + KVCU_DECODE_SHORT_KEYS - 1) / KVCU_DECODE_SHORT_KEYS;
    const int64_t lng = (n + KVCU_DECODE_MIN_KEYS - 1) / KVCU_DECODE_MIN_KEYS;
    int64_t m = shrt < KVCU_DECODE_SHORT_PARTS ? shrt : KVCU_DECODE_SHORT_PARTS;
    if (m < lng) m = lng;
    return target > 0 && m > target ? target : m;
}

__device__ inline attn_span attn_span_of(const attn_src &src, const attn_rows &rs, int t)
{
    attn_span r;
    r.tr = rs.row_of ? rs.row_of[t] : t;
    r.slot = rs.tok_slot ? rs.tok_slot[r.tr] : rs.slot0;
    r.tpos = rs.tok_slot ? (int64_t)rs.tok_pos[r.tr] : rs.pos0 + (int64_t)t * rs.step;
    const int64_t n = kv_window_count(src.keep_w, src.keep_s, r.tpos);
    r.p0 = rs.k_begin;
    r.p1 = n < rs.n_keys ? n : rs.n_keys;
    if (r.p1 < r.p0) r.p1 = r.p0;
    r.keys = rs.split_target > 0 ? attn_split_keys(r.p1 - r.p0, rs.split_target)
                                 : KVCU_FLASH_SPLIT_KEYS;
    return r;
}

/* attn_span_of() for KV head kvh of launch row t: a selected set's row reads its own list
 * (attn_rows.sel), whose length may differ per KV head. */
__device__ inline attn_span attn_span_kv(const attn_src &src, const attn_rows &rs, int t, int kvh)
{
    if (!rs.sel) return attn_span_of(src, rs, t);
    attn_span r;
    r.tr = rs.sel_r0 + t;
    r.slot = rs.slot0;
    r.tpos = r.tr;
    r.p0 = 0;
    r.p1 = rs.sel_cnt[(size_t)kvh * rs.sel_n + (r.tr - rs.sel_j0)];
    r.keys = attn_split_keys(r.p1, rs.split_target);
    return r;
}

/* Split-KV (flash-decoding): a row's indices are cut into ranges of r.keys (KVCU_FLASH_SPLIT_KEYS
 * for v3 and chapter 08's v4, attn_split_keys() for the engine's decode kernel), one block per
 * (row, KV head, range), each leaving its heads' partial state (max m, exp-sum
 * l, unnormalized output o) in an attn_parts; attn_merge_kernel (kvcu_attention.cu) then
 * combines each head's ranges. The engine's v3 and chapter 08's v4 both end there. */
static inline KV_HD int attn_n_splits(int64_t n)
{
    return n > 0 ? (int)((n + KVCU_FLASH_SPLIT_KEYS - 1) / KVCU_FLASH_SPLIT_KEYS) : 0;
}

/* Range @p part of row r: [*lo, *hi); 0 when the row has no such range. */
__device__ inline int attn_split_span(const attn_span &r, int part, int64_t *lo, int64_t *hi)
{
    *lo = r.p0 + (int64_t)part * r.keys;
    *hi = r.p1 - *lo < r.keys ? r.p1 : *lo + r.keys;
    return *lo < r.p1;
}

/* The partial states of a split launch of T rows: pm, pl [T][H][n_parts] each range's max
 * and exp-sum, po [T][H][n_parts][d] its unnormalized output, at @p base. */
typedef struct {
    float *pm, *pl, *po;
    int n_parts;
} attn_parts;

static inline KV_HD attn_parts attn_parts_at(float *base, int T, int n_heads, int n_parts)
{
    const size_t n = (size_t)T * n_heads * n_parts;
    attn_parts p = {base, base + n, base + 2 * n, n_parts};
    return p;
}

/* The merge, on grid (T, H): out [rows][H][d] of each launch row from its ranges' partial
 * states (attn_merge_kernel). */
void kvcu_attn_merge_launch(float *out, const attn_src &src, const attn_rows &rows,
                            const attn_parts &parts, int T, int n_heads, int head_dim);

/* The engine's decode kernel, version 4 (cuda/attention/kvcu_decode.cu): whether it reads this
 * layer with H query heads; its launch over T rows whose longest attends max_len keys (0 when
 * the layer is not one it reads: nothing launched), partial states in @p scratch, at least
 * kvcu_decode_scratch() floats, then attn_merge_kernel into out. */
int kvcu_decode_supported(const attn_src &src, int n_heads, int head_dim);
int kvcu_decode_launch(float *out, const float *q, const attn_src &src, attn_rows rows,
                       float *scratch, int max_len, int T, int n_heads, int head_dim);
size_t kvcu_decode_scratch(int T, int n_heads, int head_dim, int capacity);

/* Chapter 09 (cuda/engine/kvcu_retain.cu): the engine's decode kernel over selected sets, rows
 * r0 .. r0 + rows - 1 of a step (attn_rows.sel says what the arguments mean), stride >= every
 * list's length; partial states in @p parts, kvcu_decode_scratch(rows, H, d, stride) floats.
 * 0 (nothing launched) where kvcu_decode_supported() says no. */
int kvcu_attn_list_launch(int rows, float *out, const float *q,
                          const attn_src &src, float *att, float *sums, float *parts,
                          const int *off, const int *cnt, const int *lists, int slot, int r0,
                          int j0, int n, int n_heads, int head_dim, int stride);

/* Blocks of @p kernel (threads, dynamic smem bytes) resident on the device at once: its SM
 * count times its occupancy per SM, at least 1; what a split-KV launch sizes its ranges from. A
 * refused query counts 1 and is not left as the next launch's error. */
static inline int kvcu_resident_blocks(const void *kernel, int threads, size_t smem)
{
    int dev = 0, sms = 1, per_sm = 1;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) !=
            cudaSuccess || per_sm < 1)
        per_sm = 1;
    (void)cudaGetLastError();
    return sms * per_sm;
}

/* Layer @p layer of a device cache. */
static inline attn_src cache_src(const kvcu_cache *c, int layer)
{
    attn_src s;
    memset(&s, 0, sizeof s);
    s.kp = *kv_cache_plane_of(c->planes, c->n_layers, kv_cache_role_plane(KV_QROLE_KEY), layer);
    s.vp = *kv_cache_plane_of(c->planes, c->n_layers, kv_cache_role_plane(KV_QROLE_VALUE), layer);
    s.n_kv_heads = c->n_kv_heads;
    s.fmt = c->fmt[layer];
    s.qlen = kvq_is_kivi(s.fmt) ? c->d_qlen + (size_t)layer * c->spec.n_slots : NULL;
    s.window = c->window > 0 ? c->window : 1;
    s.rows = c->rows;
    s.tables = c->d_tables;
    s.max_blocks = c->max_blocks;
    s.block_size = c->spec.layout.block_size;
    s.keep_w = c->spec.window.size;
    s.keep_s = c->spec.window.n_sinks;
    s.rope_cs = c->d_rope_cs;
    s.rotary_dim = c->rotary_dim;
    return s;
}

/** Free kvcu_retain_attend()'s scratch (NULL is fine); kvcu_retain_cache_free() calls it. */
void kvcu_retain_scratch_free(struct kvcu_retain_scratch *s);

/* ---- reductions ------------------------------------------------------------------------
 * Warp sums use the xor butterfly: after 5 steps every lane holds the total. The order of the
 * additions is fixed by the lane pattern, so a result never depends on scheduling. */

#define KV_WARP 32

/* Loop unrolling hint; the emulation build's host compiler spells it differently. */
#ifdef KV_CUDA_EMULATION
#define KV_UNROLL _Pragma("GCC unroll 32")
#else
#define KV_UNROLL _Pragma("unroll")
#endif

__device__ inline float kv_warp_sum(float v)
{
    for (int off = KV_WARP / 2; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ inline float kv_warp_max(float v)
{
    for (int off = KV_WARP / 2; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Block-wide sum (blockDim.x a multiple of 32); every thread gets the total.
 * red: shared scratch of 32 floats. The leading barrier lets a block call it twice in a row
 * without a reader of the previous total racing the next writer. */
__device__ inline float kv_block_sum(float v, float *red)
{
    const int lane = threadIdx.x % KV_WARP, warp = threadIdx.x / KV_WARP;
    const int n_warps = blockDim.x / KV_WARP;
    v = kv_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return kv_warp_sum(lane < n_warps ? red[lane] : 0.0f);
}

/* Block-wide max, same shape as kv_block_sum. */
__device__ inline float kv_block_max(float v, float *red)
{
    const int lane = threadIdx.x % KV_WARP, warp = threadIdx.x / KV_WARP;
    const int n_warps = blockDim.x / KV_WARP;
    v = kv_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return kv_warp_max(lane < n_warps ? red[lane] : -INFINITY);
}

/* Whether attention meets these keys with its query rounded to 16 bits (kv_attn_int_keys():
 * per-token int8 rows, unless they are rotated on the fly, KV_POS_CACHE). The kernels then
 * multiply the rounded query (kvq_q16_round_query()) into the dequantized keys in floats,
 * where the CPU takes the exact integer dot product: the same score within a float dot
 * product's rounding. */
__device__ inline int kv_int_keys(const kv_head_view &kh, const float *rope_cs)
{
    return !rope_cs && kh.fmt == KV_QF_INT8 && kvq_row_group(kh.fmt, kh.role, kh.d) == kh.d;
}

/* ---- chapter 07: asynchronous block I/O (kvcu_cache_paged.cu) --------------------------------
 * A copy stream with up to KVCU_IO_JOBS jobs in flight, each ended by an event; the backend
 * (kvcu_backend.cu) exposes them as read_blocks_async / write_blocks_async / io_wait. Tickets
 * increase from 1; an empty list gets ticket 0 (nothing to wait for). */
#define KVCU_IO_JOBS 8
typedef struct kvcu_io kvcu_io;
int kvcu_io_create(kvcu_io **out, kv_err *err);
/** Waits for every job in flight, then frees (NULL is fine). */
void kvcu_io_free(kvcu_io *io);
int kvcu_cache_read_blocks_async(kvcu_cache *c, kvcu_io *io, const kv_block_copy *pairs, int n,
                                 uint8_t *host, size_t block_bytes, int64_t *ticket,
                                 kv_err *err);
int kvcu_cache_write_blocks_async(kvcu_cache *c, kvcu_io *io, const kv_block_copy *pairs,
                                  int n, const uint8_t *host, size_t block_bytes,
                                  int64_t *ticket, kv_err *err);
/** Returns when job @p ticket and every earlier one are done. */
int kvcu_io_wait(kvcu_io *io, int64_t ticket, kv_err *err);

#endif
