/*
 * The device KV cache (chapters 02 and 04): the CPU kv_cache's spec and layout in device
 * memory. The planes are laid out by the same kv_cache_layout() as on the CPU, so an fp32
 * cache is chapter 02's k, v [L][n_slots][H_kv][capacity][d] and a quantized one holds the
 * same bytes at the same offsets as its CPU twin (tests/test_gpu_quant_cache.c compares
 * them). Slot lengths and KIVI's quantized counts stay on the host (struct kvcu_cache in
 * kvcu_internal.cuh); the counts are mirrored to the device for the kernels that read them.
 *
 * cache_write_kernel: one block per (new token, kv head, K or V). fp32 copies; fp16, bf16
 *   and fp8 convert each element with the device's native types (cuda_fp16.h, cuda_bf16.h,
 *   cuda_fp8.h: round to nearest even, fp8 saturating, the bits kv_quant_math.h's software
 *   conversions give); int8 gives each group of G channels a warp: a shuffle max gives the
 *   amax, lane 0 writes s = amax / 127, every lane its codes (kvq_int8_encode(), the CPU's
 *   line). KIVI rows go to the fp32 ring instead, at t % R: a launch's last R tokens of a
 *   slot, spilled or not, so the ring holds each row's latest token whatever the chunking
 *   (as kv_cache.c), which a rollback that un-spills a group relies on.
 * fp8_calibrate_kernel: one block per prefilled sequence: each head's amax over the chunk
 *   (non-finite values skipped), then amax / max per head or the max over heads.
 * kivi_stage_kernel: gathers the rows a KIVI spill encodes (ring rows of older tokens, input
 *   rows of new ones) into one [rows][d] run per head; kvcu_quant_encode() then writes codes
 *   and metadata exactly as kv_quant_encode() does on the CPU.
 *
 * Chapter 05, the paged layout: the same kv_cache_layout() places head-major pools
 * (codes [H_kv][N·B][row_bytes], meta [H_kv][...]) and the kernels find a token's row through
 * the slot's block table, tables[slot][pos / B]·B + pos % B, read from a device copy of the
 * tables. The host keeps its own copy (kvcu_cache_set_blocks() writes both): the batch check
 * (kv_paged_batch_check()) and KIVI's spills, which place each 32-token group at its physical
 * row, are decided there. A spill encodes one run per block it touches (32 | B, so a group
 * never straddles two blocks), exactly the groups kv_cache_write_seq() encodes.
 * The table operations (set_blocks, fork, copy-on-write copies) are in kvcu_cache_paged.cu.
 *
 * Chapter 10, rollback of a speculative step: kvcu_cache_speculate() arms a slot's undo log
 * (kv_cache.h's kv_undo, entries in device memory); kvcu_cache_write() then copies, device to
 * device, each ring row a window overwrites, each KIVI window row as a one-token run would
 * find it and each group a spill is about to encode, and kvcu_cache_truncate() copies them
 * back newest first, so the bytes equal the CPU's after every round.
 *
 * Chapter 06, retention (spec.window W > 0, kv_window.h): a slot owns S+W rows (contiguous)
 * or ceil((S+W)/B) blocks (paged), and position p is written to its logical row
 * kv_window_row(p) (a sink's own row, or the ring), which the layout then maps as above. The
 * write kernel is otherwise unchanged: a per-token row carries its own scales, so overwriting
 * a ring row overwrites everything that belonged to it. Under KV_POS_CACHE the keys arrive
 * before RoPE (kvcu_forward skips their rotation, as kv_forward does) and attention rotates
 * them by cache index with d_rope_cs, the CPU cache's table built by the same host lines.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_quant.h"
#include "kv_retain.h"
#include "kvcu_internal.cuh"

#define CACHE_THREADS 128

/* Limits of kv_cache_create(), so a spec one device refuses the other refuses too. */
#define KVCU_CACHE_MAX_SLOTS 65536
#define KVCU_CACHE_MAX_CAPACITY (1 << 24)

/* The KV_POS_CACHE rotation table, [S+W][rotary_dim/2][2] cos, sin of every cache index:
 * kv_cache_create()'s lines (kv_rope()'s expression, in double, rounded once to float), run
 * on the host with the same libm, so a key the GPU rotates at attention time has the CPU's
 * bits. *out is malloc'ed; returns 1 when the host is out of memory. */
static int rope_table(const kv_config *cfg, const kv_cache_spec *spec, float **out,
                      size_t *bytes)
{
    const int64_t keep = kv_window_keep(spec->window, spec->n_sinks), P = cfg->rotary_dim / 2;
    *bytes = (size_t)(keep * P * 2 > 0 ? keep * P * 2 : 1) * sizeof(float);
    float *cs = (float *)malloc(*bytes);
    if (!cs) return 1;
    for (int64_t p = 0; p < keep; p++)
        for (int64_t i = 0; i < P; i++) {
            const double freq = pow((double)cfg->rope_theta,
                                    -(double)(2 * i) / (double)cfg->rotary_dim);
            const double angle = (double)p * freq;
            cs[(p * P + i) * 2] = (float)cos(angle);
            cs[(p * P + i) * 2 + 1] = (float)sin(angle);
        }
    *out = cs;
    return 0;
}

/**
 * Allocate a device cache for a model config; the twin of kv_cache_create().
 * Unsupported spec -> KV_ERR_UNSUPPORTED; device out of memory -> KV_ERR_NOMEM.
 */
int kvcu_cache_create(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                      kv_err *err)
{
    *out = NULL;
    int st = kv_cache_spec_check_caps("kvcu_cache_create", cfg, spec, KV_CACHE_CAN_WINDOW, err);
    if (st) return st;
    const int paged = spec->layout == KV_LAYOUT_PAGED;
    const int L = cfg->n_layers, d = kv_config_head_dim(cfg);
    /* a window keeps S+W rows per slot however many positions the capacity allows */
    const int span = (int)kv_window_rows(spec->window, spec->n_sinks, spec->capacity);
    const int rows = paged ? spec->n_blocks * spec->block_size : span;
    /* elements of K (and of V) as fp32, checked for overflow; a paged pool's rows belong to
     * no slot, so its heads are the H_kv of one pool */
    const size_t factors[5] = {(size_t)L, paged ? (size_t)1 : (size_t)spec->n_slots,
                               (size_t)cfg->n_kv_heads, (size_t)rows, (size_t)d};
    size_t n = 1;
    for (int i = 0; i < 5; i++) {
        if (n > SIZE_MAX / sizeof(float) / factors[i])
            return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: cache size overflows size_t");
        n *= factors[i];
    }
    kvcu_cache *c = (kvcu_cache *)calloc(1, sizeof *c);
    if (c) {
        c->len = (int *)calloc((size_t)spec->n_slots, sizeof(int));
        c->fmt = (int *)calloc((size_t)L, sizeof(int));
        c->kp = (kv_cache_plane *)calloc((size_t)L, sizeof(kv_cache_plane));
        c->vp = (kv_cache_plane *)calloc((size_t)L, sizeof(kv_cache_plane));
        c->qlen = (int *)calloc((size_t)L * spec->n_slots, sizeof(int));
        c->rows = rows;
        c->span = span;
        if (paged) {
            c->max_blocks = (span + spec->block_size - 1) / spec->block_size;
            c->tables = (int *)calloc((size_t)spec->n_slots * c->max_blocks, sizeof(int));
            c->n_mapped = (int *)calloc((size_t)spec->n_slots, sizeof(int));
            c->seg_mark = (int *)calloc(2 * (size_t)spec->n_blocks, sizeof(int));
        }
    }
    if (!c || !c->len || !c->fmt || !c->kp || !c->vp || !c->qlen ||
        (paged && (!c->tables || !c->n_mapped || !c->seg_mark))) {
        kvcu_cache_free(c);
        return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: host memory");
    }
    c->spec = *spec;
    c->n_layers = L;
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = d;
    int all_f32 = 1;
    for (int l = 0; l < L; l++) {
        c->fmt[l] = kv_cache_spec_layer_dtype(spec, l);
        all_f32 &= c->fmt[l] == KV_QF_F32;
        if (kvq_is_kivi(c->fmt[l]))
            c->window = spec->kivi_window ? spec->kivi_window : KV_KIVI_WINDOW;
    }
    const size_t total = kv_cache_layout(spec, L, c->n_kv_heads, d, NULL, c->kp, c->vp);
    const size_t n_table = (size_t)spec->n_slots * c->max_blocks;
    cudaError_t e = cudaMalloc(&c->mem, total);
    /* zeroed like the CPU's calloc, so the two buffers agree byte for byte everywhere */
    if (e == cudaSuccess) e = cudaMemset(c->mem, 0, total);
    if (e == cudaSuccess) e = cudaMalloc(&c->d_qlen, (size_t)L * spec->n_slots * sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(c->d_qlen, 0, (size_t)L * spec->n_slots * sizeof(int));
    if (paged && e == cudaSuccess) e = cudaMalloc(&c->d_tables, n_table * sizeof(int));
    if (paged && e == cudaSuccess) e = cudaMemset(c->d_tables, 0, n_table * sizeof(int));
    if (paged && e == cudaSuccess) e = cudaMalloc(&c->d_planes, 2 * (size_t)L * sizeof(kv_cache_plane));
    if (paged && e == cudaSuccess) e = cudaMalloc(&c->d_fmt, (size_t)L * sizeof(int));
    if (e != cudaSuccess) {
        kvcu_cache_free(c);
        cudaGetLastError(); /* a failed allocation is not sticky: clear it */
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_create: could not allocate %zu bytes of K/V storage on "
                       "the device: %s", total, cudaGetErrorString(e));
    }
    c->mem_bytes = total;
    kv_cache_layout(spec, L, c->n_kv_heads, d, c->mem, c->kp, c->vp);
    /* fp8 scales start at 1, as on the CPU (calibration overwrites them at position 0) */
    const size_t heads = (size_t)spec->n_slots * c->n_kv_heads;
    float *ones = NULL;
    for (int l = 0; l < L && e == cudaSuccess; l++)
        for (int r = 0; r < 2 && e == cudaSuccess; r++) {
            const kv_cache_plane *p = r ? &c->vp[l] : &c->kp[l];
            if (!p->scale) continue;
            if (!ones) {
                ones = (float *)malloc(heads * sizeof(float));
                if (!ones) break;
                for (size_t i = 0; i < heads; i++) ones[i] = 1.0f;
            }
            e = cudaMemcpy(p->scale, ones, heads * sizeof(float), cudaMemcpyHostToDevice);
        }
    free(ones);
    if (paged && e == cudaSuccess) /* the planes and formats the block-copy kernel walks */
        e = cudaMemcpy(c->d_planes, c->kp, (size_t)L * sizeof(kv_cache_plane), cudaMemcpyHostToDevice);
    if (paged && e == cudaSuccess)
        e = cudaMemcpy(c->d_planes + L, c->vp, (size_t)L * sizeof(kv_cache_plane), cudaMemcpyHostToDevice);
    if (paged && e == cudaSuccess)
        e = cudaMemcpy(c->d_fmt, c->fmt, (size_t)L * sizeof(int), cudaMemcpyHostToDevice);
    c->rotary_dim = cfg->rotary_dim;
    if (e == cudaSuccess && spec->window > 0 && spec->pos_scheme == KV_POS_CACHE) {
        float *cs = NULL;
        size_t cs_bytes = 0;
        if (rope_table(cfg, spec, &cs, &cs_bytes)) {
            kvcu_cache_free(c);
            return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_create: RoPE table of %d positions",
                           spec->n_sinks + spec->window);
        }
        e = cudaMalloc(&c->d_rope_cs, cs_bytes);
        if (e == cudaSuccess) e = cudaMemcpy(c->d_rope_cs, cs, cs_bytes, cudaMemcpyHostToDevice);
        free(cs);
    }
    if (e != cudaSuccess) {
        kvcu_cache_free(c);
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_create: %s", cudaGetErrorString(e));
    }
    if (spec->select) { /* chapter 09: the host-side selection state, the CPU cache's own */
        st = kv_retain_create(&c->retain, spec, L, cfg->n_heads, cfg->n_kv_heads, d, err);
        if (st) {
            kvcu_cache_free(c);
            return st;
        }
    }
    if (all_f32 && !paged && spec->window == 0) { /* chapter 02's arrays: contiguous, no ring */
        c->k = (float *)(void *)c->kp[0].codes;
        c->v = (float *)(void *)c->vp[0].codes;
    }
    *out = c;
    return KV_OK;
}

/** Free a device cache (NULL is fine). */
void kvcu_cache_free(kvcu_cache *c)
{
    if (!c) return;
    cudaFree(c->mem);
    cudaFree(c->d_qlen);
    cudaFree(c->stage);
    cudaFree(c->d_tables);
    cudaFree(c->d_planes);
    cudaFree(c->d_fmt);
    cudaFree(c->d_pairs);
    cudaFree(c->d_rope_cs);
    for (int i = 0; c->undo && i < c->spec.n_slots; i++) { /* chapter 10 */
        cudaFree(c->undo[i].rows);
        free(c->undo[i].qlen0);
    }
    free(c->undo);
    free(c->tables);
    free(c->n_mapped);
    free(c->seg_mark);
    free(c->len);
    free(c->fmt);
    free(c->kp);
    free(c->vp);
    free(c->qlen);
    kv_retain_free(c->retain);
    kvcu_retain_scratch_free(c->rscratch);
    free(c);
}

/** Forget a slot's tokens; the device memory is kept (and not cleared: nothing reads it). */
void kvcu_cache_reset(kvcu_cache *c, int slot)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots) return;
    c->len[slot] = 0;
    if (c->n_mapped) c->n_mapped[slot] = 0; /* paged: the blocks go back with the table */
    kv_retain_reset_slot(c->retain, slot);
    if (c->undo) c->undo[slot].armed = 0;  /* chapter 10 */
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) {
        any |= c->qlen[(size_t)l * c->spec.n_slots + slot] != 0;
        c->qlen[(size_t)l * c->spec.n_slots + slot] = 0;
    }
    if (any) /* the device mirror too; a failure here resurfaces at the next checked call */
        cudaMemcpy(c->d_qlen, c->qlen, (size_t)c->n_layers * c->spec.n_slots * sizeof(int),
                   cudaMemcpyHostToDevice);
}

/** Tokens cached in a slot; -1 for a slot out of range (as the CPU backend's length()). */
int kvcu_cache_length(const kvcu_cache *c, int slot)
{
    return (c && slot >= 0 && slot < c->spec.n_slots) ? c->len[slot] : -1;
}

/* ---- chapter 10: the undo log of a speculative step (kv_cache.h, kv_undo) ----------------
 * The CPU's bookkeeping (kv_undo_plan(), kv_undo_check()) with the entries in device memory:
 * each write that overwrites a ring row, a KIVI window row or a spilled group first copies
 * it device to device into its entry, and kvcu_cache_truncate() copies the entries back,
 * newest first. Position p's entry is p mod M, as on the CPU. */

static kv_undo *armed_log(const kvcu_cache *c, int slot)
{
    return c->undo && c->undo[slot].armed ? &c->undo[slot] : NULL;
}

/* kv_cache.c's undo_from(): the first position of a write worth logging (a rollback keeps
 * at least pos + n - max_tokens and the armed length), and Q(len), what len tokens quantize. */
static int undo_from(const kv_undo *u, int pos, int n)
{
    const int f = pos + n - u->max_tokens;
    return f > u->len0 ? (f > pos ? f : pos) : (u->len0 > pos ? u->len0 : pos);
}
static int kivi_q(int len, int R)
{
    return len > R ? (len - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
}

static uint8_t *undo_row(const kvcu_cache *c, const kv_undo *u, int layer, int kv, int h,
                         int64_t p)
{
    const size_t head = ((size_t)layer * 2 + kv) * c->n_kv_heads + h;
    return u->rows + (head * u->max_tokens + (size_t)(p % u->max_tokens)) * u->row_stride;
}

static uint8_t *undo_group(const kvcu_cache *c, const kv_undo *u, int layer, int kv, int h,
                           int64_t g)
{
    const size_t head = ((size_t)layer * 2 + kv) * c->n_kv_heads + h;
    return u->groups + (head * u->n_groups + (size_t)(g / KV_KIVI_GROUP % u->n_groups)) *
                           u->group_stride;
}

/* Rows prow .. prow+n-1 of one head: codes then metadata into buf (save 1) or back (0). */
static cudaError_t span_copy(const kvcu_cache *c, int layer, const kv_cache_plane *p, int role,
                             int64_t rhead, int64_t prow, int n, uint8_t *buf, int save)
{
    size_t off[4];
    kv_cache_span(p, c->fmt[layer], role, rhead, c->rows, prow, n, c->head_dim, off);
    uint8_t *codes = p->codes + off[0], *meta = off[3] ? (uint8_t *)p->meta + off[2] : NULL;
    cudaError_t e = save ? cudaMemcpy(buf, codes, off[1], cudaMemcpyDeviceToDevice)
                         : cudaMemcpy(codes, buf, off[1], cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess && meta)
        e = save ? cudaMemcpy(buf + off[1], meta, off[3], cudaMemcpyDeviceToDevice)
                 : cudaMemcpy(meta, buf + off[1], off[3], cudaMemcpyDeviceToDevice);
    return e;
}

static int64_t phys_row(const kvcu_cache *c, int slot, int64_t r)
{
    if (!c->tables) return r;
    const int B = c->spec.block_size;
    return (int64_t)c->tables[(size_t)slot * c->max_blocks + r / B] * B + r % B;
}

/** GPU twin of kv_cache_speculate(): the same arguments, checks and log; entries on the
 * device. */
int kvcu_cache_speculate(kvcu_cache *c, int slot, int max_tokens, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_speculate: slot %d outside the cache", slot);
    if (max_tokens < 0 || max_tokens > KVCU_CACHE_MAX_CAPACITY)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_speculate: %d tokens outside [0, %d]",
                       max_tokens, KVCU_CACHE_MAX_CAPACITY);
    if (!kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) return KV_OK;
    if (!c->undo) {
        c->undo = (kv_undo *)calloc((size_t)c->spec.n_slots, sizeof(kv_undo));
        if (!c->undo) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_speculate: undo logs");
    }
    kv_undo *u = &c->undo[slot];
    u->armed = 0;
    if (max_tokens == 0) return KV_OK;
    if (!u->qlen0) u->qlen0 = (int *)calloc((size_t)c->n_layers, sizeof(int));
    if (!u->qlen0) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_speculate: host memory");
    const size_t bytes = kv_undo_plan(u, c->kp, c->vp, c->fmt, c->n_layers, c->n_kv_heads,
                                      c->head_dim, c->spec.window, max_tokens);
    if (bytes > u->alloc_bytes) {
        cudaFree(u->rows);
        u->rows = NULL;
        u->alloc_bytes = 0;
        KV_CUDA_TRY(cudaMalloc(&u->rows, bytes), err);
        u->alloc_bytes = bytes;
    }
    u->groups = u->rows + (size_t)c->n_layers * 2 * c->n_kv_heads * max_tokens * u->row_stride;
    u->len0 = u->end = c->len[slot];
    for (int l = 0; l < c->n_layers; l++) u->qlen0[l] = c->qlen[(size_t)l * c->spec.n_slots + slot];
    u->armed = 1;
    return KV_OK;
}

/* Before layer's write of seq (its rows at t0 of the step's k, v): the ring rows a window
 * overwrites, or KIVI's window rows as a one-token run would find them (the step's own row
 * t-R when it is in the step, else the ring). The spill's groups are saved by the caller. */
static int undo_save_rows(kvcu_cache *c, int layer, const kv_seq *s, int t0, const float *k,
                          const float *v, kv_err *err)
{
    kv_undo *u = armed_log(c, s->slot);
    if (!u) return KV_OK;
    const int fmt = c->fmt[layer], Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    const int kivi = kvq_is_kivi(fmt);
    if (!kivi && c->spec.window <= 0) return KV_OK;
    for (int t = undo_from(u, s->pos, s->n_tokens); t < s->pos + s->n_tokens; t++) {
        const int64_t prow = phys_row(c, s->slot, kv_window_row(c->spec.window, c->spec.n_sinks, t));
        for (int kv = 0; kv < 2; kv++) {
            const kv_cache_plane *p = kv ? &c->vp[layer] : &c->kp[layer];
            for (int h = 0; h < Hkv; h++) {
                const int64_t head = (int64_t)s->slot * Hkv + h;
                cudaError_t e;
                if (kivi) {
                    const float *src = t - R >= s->pos
                        ? (kv ? v : k) + ((size_t)(t0 + t - R - s->pos) * Hkv + h) * d
                        : p->ring + (head * R + t % R) * d;
                    e = cudaMemcpy(undo_row(c, u, layer, kv, h, t), src, (size_t)d * sizeof(float),
                                   cudaMemcpyDeviceToDevice);
                    u->copied += (double)d * sizeof(float);
                } else {
                    const int role = kv ? KV_QROLE_VALUE : KV_QROLE_KEY;
                    size_t off[4];
                    kv_cache_span(p, fmt, role, 0, 0, 0, 1, d, off);
                    e = span_copy(c, layer, p, role, c->tables ? h : head, prow, 1,
                                  undo_row(c, u, layer, kv, h, t), 1);
                    u->copied += (double)(off[1] + off[3]);
                }
                if (e != cudaSuccess)
                    return kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write: undo log: %s",
                                   cudaGetErrorString(e));
            }
        }
    }
    if (s->pos + s->n_tokens > u->end) u->end = s->pos + s->n_tokens;
    return KV_OK;
}

/* Copy back, newest first, what the writes of positions len .. end-1 overwrote, then the
 * quantized counts (kv_cache.c's undo_restore()). */
static cudaError_t undo_restore(kvcu_cache *c, kv_undo *u, int slot, int len)
{
    const int Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    cudaError_t e = cudaSuccess;
    for (int l = 0; l < c->n_layers && e == cudaSuccess; l++) {
        int *q = &c->qlen[(size_t)l * c->spec.n_slots + slot];
        const int kivi = kvq_is_kivi(c->fmt[l]);
        int qn = kivi && len > R ? (len - R + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP : 0;
        if (kivi && qn < u->qlen0[l]) qn = u->qlen0[l];
        for (int kv = 0; kv < 2; kv++) {
            const kv_cache_plane *p = kv ? &c->vp[l] : &c->kp[l];
            const int role = kv ? KV_QROLE_VALUE : KV_QROLE_KEY;
            for (int h = 0; h < Hkv && e == cudaSuccess; h++) {
                const int64_t head = (int64_t)slot * Hkv + h, rhead = c->tables ? h : head;
                if (kivi) {
                    for (int g = qn; g < *q && e == cudaSuccess; g += KV_KIVI_GROUP)
                        e = span_copy(c, l, p, role, rhead, phys_row(c, slot, g), KV_KIVI_GROUP,
                                      undo_group(c, u, l, kv, h, g), 0);
                    for (int64_t t = u->end - 1; t >= len && e == cudaSuccess; t--)
                        e = cudaMemcpy(p->ring + (head * R + t % R) * d, undo_row(c, u, l, kv, h, t),
                                       (size_t)d * sizeof(float), cudaMemcpyDeviceToDevice);
                } else if (c->spec.window > 0) {
                    for (int64_t t = u->end - 1; t >= len && e == cudaSuccess; t--) {
                        const int64_t lr = kv_window_row(c->spec.window, c->spec.n_sinks, t);
                        e = span_copy(c, l, p, role, rhead, phys_row(c, slot, lr), 1,
                                      undo_row(c, u, l, kv, h, t), 0);
                    }
                }
            }
        }
        if (kivi) *q = qn;
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(c->d_qlen, c->qlen, (size_t)c->n_layers * c->spec.n_slots * sizeof(int),
                       cudaMemcpyHostToDevice);
    return e;
}

/** GPU twin of kv_cache_truncate() (chapter 10): only the host's length changes; the rows
 * past it stay on the device, invisible, until the next step overwrites them. A window's
 * ring and KIVI's spills are copied back from the undo log, with the same refusals. */
int kvcu_cache_truncate(kvcu_cache *c, int slot, int len, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_truncate: slot %d outside the cache", slot);
    if (len < 0 || len > c->len[slot])
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_truncate: %d tokens but slot %d holds %d",
                       len, slot, c->len[slot]);
    if (c->retain) /* chapter 09: kv_cache_truncate()'s refusal, in its words */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_cache_truncate: %s retention already "
                       "observed and evicted with the rejected tokens; its kept sets cannot "
                       "be rolled back", kv_select_method_name(c->spec.select));
    if (len < c->len[slot] && kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) {
        kv_undo *u = c->undo ? &c->undo[slot] : NULL;
        int rc = kv_undo_check("kvcu_cache_truncate", u, slot, len, c->len[slot], err);
        if (rc) return rc;
        if (c->len[slot] > u->end) u->end = c->len[slot];
        KV_CUDA_TRY(undo_restore(c, u, slot, len), err);
    }
    if (c->undo) c->undo[slot].armed = 0;
    c->len[slot] = len;
    return KV_OK;
}

int kvcu_cache_commit_length(kvcu_cache *c, int slot, int len, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots || len < 0 || len > c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_commit_length: slot %d, %d tokens", slot, len);
    c->len[slot] = len;
    return KV_OK;
}

size_t kvcu_cache_mem_bytes(const kvcu_cache *c) { return c ? c->mem_bytes : 0; }

int kvcu_cache_download(const kvcu_cache *c, void *host, size_t bytes, kv_err *err)
{
    if (!c || !host || bytes > c->mem_bytes)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_download: %zu bytes of %zu", bytes,
                       c ? c->mem_bytes : (size_t)0);
    KV_CUDA_TRY(cudaMemcpy(host, c->mem, bytes, cudaMemcpyDeviceToHost), err);
    return KV_OK;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* The whole block writes row x [d] into pool or slot row prow of head rhead of plane p, in
 * format fmt (not KIVI): int8 groups one warp each, the other formats one element a thread.
 * Shared by the position writes below and the slot-mapping writes. */
static __device__ void write_row(int fmt, const kv_cache_plane *p, int64_t rhead, int rows,
                          int64_t prow, const float *x, float scale, int d)
{
    uint8_t *row = p->codes + (rhead * rows + prow) * p->row_bytes;
    if (kvq_is_int8(fmt)) {
        const int g = kvq_row_group(fmt, KV_QROLE_VALUE, d), ng = d / g;
        const int lane = threadIdx.x % KV_WARP, warp = threadIdx.x / KV_WARP;
        float *meta = (float *)p->meta + rhead * p->meta_entries + prow * ng;
        for (int gi = warp; gi < ng; gi += blockDim.x / KV_WARP) {
            const float *xg = x + gi * g;
            float amax = 0.0f, bad = 0.0f;
            for (int i = lane; i < g; i += KV_WARP) {
                bad = fmaxf(bad, kvq_nonfinite(xg[i]) ? 1.0f : 0.0f);
                amax = fmaxf(amax, fabsf(xg[i]));
            }
            bad = kv_warp_max(bad);
            amax = kv_warp_max(amax);
            const float s = bad > 0.0f ? kvq_bits_f32(KVQ_F32_NAN) : kvq_int8_scale(amax);
            if (lane == 0) meta[gi] = s;
            for (int i = lane; i < g; i += KV_WARP)
                row[gi * g + i] = bad > 0.0f ? 0 : (uint8_t)kvq_int8_encode(xg[i], s);
        }
        return;
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float xv = x[j];
        switch (fmt) {
        case KV_QF_F32: ((float *)row)[j] = xv; break;
        case KV_QF_F16: ((unsigned short *)row)[j] = __half_as_ushort(__float2half_rn(xv)); break;
        case KV_QF_BF16:
            ((unsigned short *)row)[j] = __bfloat16_as_ushort(__float2bfloat16_rn(xv));
            break;
        case KV_QF_FP8_E4M3: row[j] = __nv_fp8_e4m3(__fdiv_rn(xv, scale)).__x; break;
        case KV_QF_FP8_E5M2: row[j] = __nv_fp8_e5m2(__fdiv_rn(xv, scale)).__x; break;
        }
    }
}

/* Block (t, h, r): row h of token t's keys (r = 0) or values (r = 1) into its plane. */
/* Paged caches: tables [n_slots][max_blocks] (device) place the token, codes and metadata
 * are head h of the pool; contiguous: tables NULL, head (slot, h) of rows = capacity rows. */
/* Retention (chapter 06): position pos goes to logical row kv_window_row(keep_w, keep_s,
 * pos), the identity without a window (keep_w 0). */
__global__ void cache_write_kernel(int fmt, kv_cache_plane kp, kv_cache_plane vp,
                                   const float *k, const float *v, const int *tok_slot,
                                   const int *tok_pos, const int *qlen, int n_kv_heads, int d,
                                   int rows, int window, const int *tables, int max_blocks,
                                   int block_size, int keep_w, int keep_s)
{
    const int t = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int slot = tok_slot[t], pos = tok_pos[t];
    const kv_cache_plane *p = r ? &vp : &kp;
    const float *x = (r ? v : k) + ((size_t)t * n_kv_heads + h) * d; /* [d] */
    const int64_t head = (int64_t)slot * n_kv_heads + h;      /* scales and windows */
    const int64_t rhead = tables ? h : head;                  /* codes and metadata */
    const int64_t lrow = kv_window_row(keep_w, keep_s, pos);  /* retention: the ring row */
    const int64_t prow = kvcu_slot_row(tables, max_blocks, block_size, slot, lrow);
    if (kvq_is_kivi(fmt)) {
        /* the step's last R tokens of the slot enter the ring, spilled or not (kv_cache.c):
         * a token whose ring row a later one of the launch takes is skipped */
        (void)qlen;
        if (t + window < (int)gridDim.x && tok_slot[t + window] == slot &&
            tok_pos[t + window] == pos + window)
            return;
        float *ring = p->ring + (head * window + pos % window) * d;
        for (int j = threadIdx.x; j < d; j += blockDim.x) ring[j] = x[j];
        return;
    }
    write_row(fmt, p, rhead, rows, prow, x, p->scale ? p->scale[head] : 1.0f, d);
}

/* Block (t, h, r) of a slot-mapping write: token t's row of head h into pool row slots[t]
 * (negative: padding, nothing written). Per-token formats without per-sequence scales. */
__global__ void cache_write_slots_kernel(int fmt, kv_cache_plane kp, kv_cache_plane vp,
                                         const float *k, const float *v, const int64_t *slots,
                                         int n_kv_heads, int d, int rows)
{
    const int t = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    if (slots[t] < 0) return;
    const kv_cache_plane *p = r ? &vp : &kp;
    const float *x = (r ? v : k) + ((size_t)t * n_kv_heads + h) * d; /* [d] */
    write_row(fmt, p, h, rows, slots[t], x, 1.0f, d);
}

/* One block: the fp8 scales of one slot from its prefill chunk x [n][H_kv][d]. */
__global__ void fp8_calibrate_kernel(int fmt, const float *x, int n, int n_kv_heads, int d,
                                     int per_head, float *scales)
{
    KV_DYNAMIC_SMEM(float, smem);
    float *red = smem, *amax = smem + KV_WARP; /* [32] reduction, [H_kv] amax per head */
    for (int h = 0; h < n_kv_heads; h++) {
        float m = 0.0f;
        for (int64_t i = threadIdx.x; i < (int64_t)n * d; i += blockDim.x) {
            const float xv = x[((i / d) * n_kv_heads + h) * d + i % d];
            if (!kvq_nonfinite(xv)) m = fmaxf(m, fabsf(xv));
        }
        m = kv_block_max(m, red);
        if (threadIdx.x == 0) amax[h] = m;
    }
    if (threadIdx.x == 0) {
        float all = 0.0f;
        for (int h = 0; h < n_kv_heads; h++) all = fmaxf(all, amax[h]);
        for (int h = 0; h < n_kv_heads; h++) {
            const float a = per_head ? amax[h] : all; /* kv_quant_fp8_scale() */
            scales[h] = (a > 0.0f && !kvq_nonfinite(a)) ? KVQ_DIV(a, kvq_fp8_max(fmt)) : 1.0f;
        }
    }
}

/* Block (i, h, r): row q0 + i of head h's keys (r = 0) or values into stage [2][H_kv][rows][d]:
 * from the ring when the token is older than the chunk, else from the chunk's input. */
__global__ void kivi_stage_kernel(float *stage, kv_cache_plane kp, kv_cache_plane vp,
                                  const float *k, const float *v, int slot, int pos, int q0,
                                  int rows, int n_kv_heads, int d, int window)
{
    const int i = blockIdx.x, h = blockIdx.y, r = blockIdx.z, t = q0 + i;
    const kv_cache_plane *p = r ? &vp : &kp;
    const int64_t head = (int64_t)slot * n_kv_heads + h;
    const float *src = t < pos ? p->ring + (head * window + t % window) * d
                               : (r ? v : k) + ((size_t)(t - pos) * n_kv_heads + h) * d;
    float *dst = stage + (((size_t)r * n_kv_heads + h) * rows + i) * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
}

int kvcu_cache_write(kvcu_cache *c, int layer, const kv_seq *seqs, int n_seqs,
                     const int *tok_slot, const int *tok_pos, const float *k, const float *v,
                     int T, kv_err *err)
{
    if (layer < 0 || layer >= c->n_layers)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write: layer %d of %d", layer, c->n_layers);
    if (T == 0) return KV_OK;
    const int fmt = c->fmt[layer], Hkv = c->n_kv_heads, d = c->head_dim, R = c->window;
    const size_t kvdim = (size_t)Hkv * d;
    kv_cache_plane *kp = &c->kp[layer], *vp = &c->vp[layer];
    if (kvq_is_fp8(fmt)) /* calibrate each sequence that starts at position 0 on its chunk */
        for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
            if (seqs[i].pos != 0) continue;
            const size_t smem = (KV_WARP + (size_t)Hkv) * sizeof(float);
            float *sk = kp->scale + (size_t)seqs[i].slot * Hkv, *sv = vp->scale + (size_t)seqs[i].slot * Hkv;
            KV_LAUNCH(fp8_calibrate_kernel, 1, CACHE_THREADS, smem, 0, fmt, k + t * kvdim,
                      seqs[i].n_tokens, Hkv, d, c->spec.fp8_per_head, sk);
            KV_LAUNCH(fp8_calibrate_kernel, 1, CACHE_THREADS, smem, 0, fmt, v + t * kvdim,
                      seqs[i].n_tokens, Hkv, d, c->spec.fp8_per_head, sv);
            KV_CUDA_TRY_LAUNCH(err);
        }
    if (c->undo) /* chapter 10: what this write overwrites, into armed slots' undo logs */
        for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
            int rc = undo_save_rows(c, layer, &seqs[i], t, k, v, err);
            if (rc) return rc;
        }
    if (kvq_is_kivi(fmt)) { /* spill what no longer fits the window (kv_cache_write_seq()) */
        int changed = 0;
        for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
            const int slot = seqs[i].slot, pos = seqs[i].pos, n = seqs[i].n_tokens;
            int *qlen = &c->qlen[(size_t)layer * c->spec.n_slots + slot];
            const int q0 = *qlen, over = pos + n - R;
            if (over <= q0) continue;
            const int q1 = (over + KV_KIVI_GROUP - 1) / KV_KIVI_GROUP * KV_KIVI_GROUP;
            const int rows = q1 - q0;
            const size_t need = (size_t)2 * Hkv * rows * d * sizeof(float);
            if (need > c->stage_bytes) {
                cudaFree(c->stage);
                c->stage = NULL;
                c->stage_bytes = 0;
                KV_CUDA_TRY(cudaMalloc(&c->stage, need), err);
                c->stage_bytes = need;
            }
            dim3 grid(rows, Hkv, 2);
            KV_LAUNCH(kivi_stage_kernel, grid, CACHE_THREADS, 0, 0, c->stage, *kp, *vp,
                      k + t * kvdim, v + t * kvdim, slot, pos, q0, rows, Hkv, d, R);
            KV_CUDA_TRY_LAUNCH(err);
            /* contiguous: one run q0 .. q1-1; paged: one run per block it touches, each at
             * its physical rows (32 | B: a group never straddles two blocks) */
            const int B = c->tables ? c->spec.block_size : q1;
            const int *table = c->tables ? c->tables + (size_t)slot * c->max_blocks : NULL;
            for (int g = q0; g < q1;) {
                const int end = (g / B + 1) * B < q1 ? (g / B + 1) * B : q1;
                const int64_t prow = table ? (int64_t)table[g / B] * B + g % B : g;
                for (int r = 0; r < 2; r++)
                    for (int h = 0; h < Hkv; h++) {
                        const kv_cache_plane *p = r ? vp : kp;
                        const int role = r ? KV_QROLE_VALUE : KV_QROLE_KEY;
                        const int64_t rhead = table ? h : (int64_t)slot * Hkv + h;
                        uint8_t *codes = p->codes + (rhead * c->rows + prow) * p->row_bytes;
                        uint8_t *meta = (uint8_t *)p->meta +
                                        (rhead * p->meta_entries + kvq_meta_index(fmt, role, prow, 0, d)) * 4;
                        const float *x = c->stage + (((size_t)r * Hkv + h) * rows + (g - q0)) * d;
                        kv_undo *u = armed_log(c, slot);
                        const int gmin = u ? kivi_q(undo_from(u, pos, n), R) : 0;
                        for (int gg = g; u && gg < end; gg += KV_KIVI_GROUP) { /* chapter 10 */
                            if (gg < gmin) continue; /* no rollback reaches it */
                            KV_CUDA_TRY(span_copy(c, layer, p, role, rhead, prow + (gg - g),
                                                  KV_KIVI_GROUP, undo_group(c, u, layer, r, h, gg), 1),
                                        err);
                            size_t off[4];
                            kv_cache_span(p, fmt, role, 0, 0, 0, KV_KIVI_GROUP, d, off);
                            u->copied += (double)(off[1] + off[3]);
                        }
                        int rc = kvcu_quant_encode(fmt, role, x, end - g, d, 0.0f, codes, meta, err);
                        if (rc) return rc;
                    }
                g = end;
            }
            *qlen = q1;
            changed = 1;
        }
        if (changed)
            KV_CUDA_TRY(cudaMemcpy(c->d_qlen, c->qlen,
                                   (size_t)c->n_layers * c->spec.n_slots * sizeof(int),
                                   cudaMemcpyHostToDevice), err);
    }
    dim3 grid(T, Hkv, 2);
    KV_LAUNCH(cache_write_kernel, grid, CACHE_THREADS, 0, 0, fmt, *kp, *vp, k, v, tok_slot,
              tok_pos, c->d_qlen + (size_t)layer * c->spec.n_slots, Hkv, d, c->rows,
              R > 0 ? R : 1, c->d_tables, c->max_blocks, c->spec.block_size, c->spec.window,
              c->spec.n_sinks);
    KV_CUDA_TRY_LAUNCH(err);
    return KV_OK;
}

int kvcu_cache_write_seq(kvcu_cache *c, int layer, int slot, int pos, int n, const float *k,
                         const float *v, kv_err *err)
{
    if (!c || slot < 0 || slot >= c->spec.n_slots || n < 1 || pos < 0 ||
        (int64_t)pos + n > c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write_seq: slot %d, pos %d, n %d", slot, pos, n);
    kv_seq s = {slot, pos, n, NULL};
    if (c->tables) { /* a paged slot writes only into the blocks its table maps */
        int rc = kvcu_paged_rows_check("kvcu_cache_write_seq", c, &s, 1, err);
        if (rc) return rc;
    }
    int *h = (int *)malloc(2 * (size_t)n * sizeof(int)), *dv = NULL;
    if (!h) return kv_fail(err, KV_ERR_NOMEM, "kvcu_cache_write_seq: host memory");
    for (int i = 0; i < n; i++) {
        h[i] = slot;
        h[n + i] = pos + i;
    }
    cudaError_t e = cudaMalloc(&dv, 2 * (size_t)n * sizeof(int));
    if (e == cudaSuccess) e = cudaMemcpy(dv, h, 2 * (size_t)n * sizeof(int), cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) {
        cudaFree(dv);
        return kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write_seq: %s", cudaGetErrorString(e));
    }
    int rc = kvcu_cache_write(c, layer, &s, 1, dv, dv + n, k, v, n, err);
    e = cudaFree(dv); /* waits for the kernels */
    if (!rc && e != cudaSuccess)
        rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write_seq: %s", cudaGetErrorString(e));
    return rc;
}

int kvcu_cache_write_slots(kvcu_cache *c, int layer, const int64_t *slots, int n, const float *k,
                           const float *v, kv_err *err)
{
    if (!c || !c->tables)
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write_slots: the cache is not paged");
    if (layer < 0 || layer >= c->n_layers || n < 0 || (n > 0 && (!slots || !k || !v)))
        return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write_slots: layer %d, %d tokens", layer, n);
    const int fmt = c->fmt[layer];
    if (kvq_is_fp8(fmt) || kvq_is_kivi(fmt)) /* the CPU's refusal, in its words */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_cache_write_slots: layer %d stores %s, "
                       "whose scales or window belong to a sequence, not to a slot",
                       layer, kv_quant_name(fmt));
    for (int i = 0; i < n; i++)
        if (slots[i] >= c->rows)
            return kv_fail(err, KV_ERR_ARG, "kvcu_cache_write_slots: token %d goes to slot %lld, "
                           "outside the pool's %d rows", i, (long long)slots[i], c->rows);
    if (n == 0) return KV_OK;
    int64_t *ds = NULL; /* [n] the mapping, on the device */
    cudaError_t e = cudaMalloc(&ds, (size_t)n * sizeof(int64_t));
    if (e == cudaSuccess) e = cudaMemcpy(ds, slots, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(ds);
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_cache_write_slots: %s", cudaGetErrorString(e));
    }
    dim3 grid(n, c->n_kv_heads, 2);
    KV_LAUNCH(cache_write_slots_kernel, grid, CACHE_THREADS, 0, 0, fmt, c->kp[layer],
              c->vp[layer], k, v, ds, c->n_kv_heads, c->head_dim, c->rows);
    e = cudaGetLastError();
    const cudaError_t f = cudaFree(ds); /* waits for the kernel */
    if (e == cudaSuccess) e = f;
    return e == cudaSuccess ? KV_OK
                            : kv_fail(err, KV_ERR_DEVICE, "kvcu_cache_write_slots: %s",
                                      cudaGetErrorString(e));
}
