/**
 * @file kvcu.h
 * kvlab's GPU library: the CPU library's operations as CUDA kernels, behind a C API.
 *
 * Naming mirrors reference_cpu/: kv_x(...) on the CPU, kvcu_x(...) here with the same
 * argument order (pointers are device pointers), so a test reads kv_x, then kvcu_x, then
 * compares. Every function returns a ::kv_status and fills a ::kv_err; device OOM is
 * KV_ERR_NOMEM, any other CUDA failure KV_ERR_DEVICE with the call and its message.
 */
#ifndef KVCU_H
#define KVCU_H

#include <math.h>

#include "kv_backend.h"
#include "kv_flash.h"
#include "kv_forward.h"
#include "kv_mla.h"

#ifdef __cplusplus
extern "C" {
#endif

/** KV_OK when a CUDA device can run kvlab's kernels: sm_75 (Turing) or newer, and this build
 * holds an image of its kernels for it; else KV_ERR_DEVICE with a sentence that names the GPU
 * and what is missing (always KV_OK in the emulation build, unless KVEMU_SM says older). */
int kvcu_device_available(kv_err *err);
/** The current device's compute capability as 10·major + minor (75 Turing, 80 A100, 86/89
 * RTX 30/40, 90 H100); 0 when none answers. Below 80 (KVCU_SM_MMA) every tensor-core kernel
 * is replaced by a CUDA-core one. The emulation build reports KVEMU_SM (90 when unset). */
int kvcu_device_sm(void);
/** "NVIDIA H200, sm_90, 139 GiB" or "emulated (CPU fibers)"; KV_ERR_DEVICE if none. */
int kvcu_device_describe(char *buf, size_t n, kv_err *err);
/** 1 when this library is the CPU emulation build. */
int kvcu_is_emulation(void);

/* ---- device memory for C callers (tests, demos): cudaMalloc / cudaMemcpy as kv_status -- */
/** Allocate @p bytes of device memory in *dptr; KV_ERR_NOMEM when the device is full. */
int kvcu_malloc(void **dptr, size_t bytes, kv_err *err);
/** Free device memory from kvcu_malloc (NULL is fine). */
void kvcu_free(void *dptr);
/** Copy @p bytes host -> device. */
int kvcu_upload(void *dst, const void *src, size_t bytes, kv_err *err);
/** Copy @p bytes device -> host (waits for the kernels before it; reports their errors). */
int kvcu_download(void *dst, const void *src, size_t bytes, kv_err *err);
/** Wait for every launched kernel; reports the first error one of them hit. */
int kvcu_synchronize(kv_err *err);
/** Allocate @p bytes of pinned (page-locked) host memory in *p, zeroed: DMA reads and
 * writes it directly, so host-tier copies run at the link's speed (chapter 07). */
int kvcu_host_alloc(void **p, size_t bytes, kv_err *err);
/** Free memory from kvcu_host_alloc (NULL is fine). */
void kvcu_host_free(void *p);

/* ---- building blocks, twins of kv_ops.h / kv_attention.h (device pointers) ---------- */
/** kv_rmsnorm() on the GPU: one block per row. */
int kvcu_rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps, kv_err *err);
/** kv_matmul() on the GPU: v1 (a warp per output) for T = 1, v2 (shared-memory tiles) for T > 1,
 * both summing a row in the same order, so a row's bits do not depend on T. */
int kvcu_matmul(float *y, const float *x, const float *W, int T, int in, int out, kv_err *err);
/** kv_matmul_strided() on the GPU: W's rows are @p ldw >= in floats apart, so W may point at
 * a column slice of a wider matrix (chapter 10: a tensor-parallel rank's Wo and W2). ldw == in
 * is kvcu_matmul(), bit for bit. */
int kvcu_matmul_strided(float *y, const float *x, const float *W, int T, int in, int out,
                        int ldw, kv_err *err);
/** kvcu_matmul_strided() on tensor cores, x [T][in] and W [out][ldw] both 16-bit (bf16 when
 * @p bf16, else fp16; device; x rounded once by kvcu_to16(), as the engine does per layer
 * input): mma.sync tiles of 128 (or 16 for T < 128) tokens x 128 outputs x 32 columns, fed by a
 * ring of cp.async copies, no split-K, so a row's result depends on nothing else in the batch
 * (cuda/model/kvcu_ops_fast.cu says why, and the bound it keeps to kv_matmul()). Needs sm_80:
 * below it KV_ERR_UNSUPPORTED naming the GPU (use kvcu_matmul_w16_gemv() there). */
int kvcu_matmul_x16(float *y, const uint16_t *x, const uint16_t *W, int bf16, int T, int in,
                    int out, int ldw, kv_err *err);
/** kvcu_matmul_x16() from an fp32 x, rounded first by kvcu_to16() into @p x16 [T][in], a
 * device scratch the caller owns; the same bits. Below sm_80 it is kvcu_matmul_w16_gemv() (CUDA
 * cores, x unrounded: within the same bound; @p x16 unused). It exists for the test of the
 * 16-bit path: the engine rounds each layer input once and calls kvcu_matmul_x16() itself. */
int kvcu_matmul_w16(float *y, const float *x, uint16_t *x16, const uint16_t *W, int bf16, int T,
                    int in, int out, int ldw, kv_err *err);
/** kvcu_matmul_w16()'s product for rows that are one token each (decode): a GEMV, a warp per
 * output streaming W by 16-byte loads (2-byte loads where W's rows are not 16-byte aligned, the
 * same sums), x kept fp32; every row sums in the same order whatever T, so a row's bits are
 * the same alone or batched (not those of kvcu_matmul_w16(): another order and rounding).
 * T at most 262 140. */
int kvcu_matmul_w16_gemv(float *y, const float *x, const uint16_t *W, int bf16, int T, int in,
                         int out, int ldw, kv_err *err);
/** dst[i] = src[i] rounded to bf16 (@p bf16) or fp16, as bits; device arrays of n. */
int kvcu_to16(uint16_t *dst, const float *src, int64_t n, int bf16, kv_err *err);
/** kv_rope() on the GPU: angles formed in double exactly as the CPU forms them, from the
 * same host table freq [rotary_dim/2] (kv_rope_freqs()). */
int kvcu_rope(float *x, const int *pos, int T, int n_heads, int head_dim, int rotary_dim,
              const double *freq, kv_err *err);
/** kv_swiglu() on the GPU. */
int kvcu_swiglu(float *g, const float *u, int64_t n, kv_err *err);
/** kv_add() on the GPU. */
int kvcu_add(float *x, const float *y, int64_t n, kv_err *err);
/** kv_embed() on the GPU (token ids in device memory). */
int kvcu_embed(float *out, const float *table, const int *tokens, int T, int dim, kv_err *err);
/**
 * Twin of kv_attn_decode(): q, out [H][d]; k, v [H_kv][max_seq][d] (device). Runs the newest
 * kernel, v2 (one block per KV head, the group's G query heads packed together).
 */
int kvcu_attn_decode(const float *q, const float *k, const float *v, float *out, int n_heads,
                     int n_kv_heads, int head_dim, int max_seq, int len, kv_err *err);
/**
 * kvcu_attn_decode() with the kernel version chosen (cuda/attention/kvcu_attention.cu describes them):
 * 1 = one block per query head, reads H·N·d·2·b bytes of cache; 2 = one block per KV head,
 * reads H_kv·N·d·2·b (groups of up to 8 heads; v2 falls back to v1 when a group's queries
 * would not fit in 48 KiB of shared memory); 3 = v2 split over partitions of 512 positions
 * (flash-decoding: one block per (KV head, partition), then a small kernel combines the
 * partitions), so a long context keeps many blocks busy. v3 sums in a different order than
 * the CPU (not bit-identical to it); with one partition (len <= 512) it is bit-identical to
 * v2. 4 = the engine's decode kernel (cuda/attention/kvcu_decode.cu: 16-byte rows through a
 * cp.async pipeline, the group in one block, online softmax per range, ranges sized from the
 * SM count, then v3's merge); where it does not read the rows (kvcu_cache_decode_reads()) it
 * runs v2/v3. Other versions: KV_ERR_ARG.
 * scores: device scratch of kvcu_attn_decode_scratch(version, ...) floats, or NULL to
 * allocate one for this call (a timing loop passes its own, so cudaMalloc is not what it
 * measures). With NULL the call waits for the kernel (cudaFree does); with a scratch it
 * returns at once (kvcu_synchronize() waits).
 */
int kvcu_attn_decode_version(int version, const float *q, const float *k, const float *v,
                             float *out, float *scores, int n_heads, int n_kv_heads, int head_dim,
                             int max_seq, int len, kv_err *err);
/** Floats of scratch kvcu_attn_decode_version() needs: H·max_seq scores for v1 and v2, plus
 * v3's partition results H·ceil(max_seq / 512)·(d + 2); v4: the larger of v3's and its own
 * partial states H·ceil(max_seq / 256)·(d + 2). */
size_t kvcu_attn_decode_scratch(int version, int n_heads, int head_dim, int max_seq);

/* ---- the engine: weights, cache and scratch on the device --------------------------- */
typedef struct kvcu_model kvcu_model; /* device copy of a kv_model's weights */
typedef struct kvcu_cache kvcu_cache; /* device KV cache, same spec and layout as kv_cache */
typedef struct kvcu_state kvcu_state; /* device scratch buffers of the forward pass */

/** Copy a host model's weights to the device; KV_ERR_NOMEM when they do not fit. */
int kvcu_model_upload(kvcu_model **out, const kv_model *m, kv_err *err);
/** Free a device model (NULL is fine). */
void kvcu_model_free(kvcu_model *m);
/** kv_cache_create() on the device: same spec, same layout and byte offsets; sliding windows
 * and sinks (chapter 06, both position schemes) on both layouts, refused as the CPU refuses. */
int kvcu_cache_create(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                      kv_err *err);
/** Free a device cache (NULL is fine). */
void kvcu_cache_free(kvcu_cache *c);
/** Forget a slot's tokens (kv_cache_reset()). */
void kvcu_cache_reset(kvcu_cache *c, int slot);
/** Tokens cached in a slot; -1 for a slot out of range. */
int kvcu_cache_length(const kvcu_cache *c, int slot);
/** kv_cache_truncate() (chapter 10): keep the first @p len tokens of @p slot; the same
 * refusals (KV_ERR_UNSUPPORTED with a window or a KIVI layer, KV_ERR_ARG for a bad slot or
 * len outside [0, cached length]). A paged cache keeps its table (the backend's truncate
 * gives the blocks back). */
int kvcu_cache_truncate(kvcu_cache *c, int slot, int len, kv_err *err);
/** kv_cache_speculate() (chapter 10): arm @p slot's undo log before a speculative step, so
 * kvcu_cache_truncate() can drop up to @p max_tokens positions of a windowed or KIVI cache
 * (device-to-device copies of the rows each write overwrites); the others copy nothing. The
 * same arguments, checks and memory bound as the CPU. */
int kvcu_cache_speculate(kvcu_cache *c, int slot, int max_tokens, kv_err *err);
/** For callers that write rows with kvcu_cache_write_seq(), which leaves the length to the
 * caller as kv_cache_write_seq() does: set @p slot's length to @p len, what kvcu_forward()
 * does after a step and a CPU caller does by assigning c->len[slot]. KV_ERR_ARG for a slot
 * out of range or len outside [0, capacity]. */
int kvcu_cache_commit_length(kvcu_cache *c, int slot, int len, kv_err *err);
/** Chapter 09: the host-side selection state of a cache built by kvcu_retain_cache_create()
 * with spec.retain.select != 0 (kv_retain.h), or NULL. Written by kvcu_forward() exactly as
 * kv_forward() writes the CPU cache's c->retain. */
struct kv_retain *kvcu_cache_retain(const kvcu_cache *c);
/** kv_retain_cache_create() on the device: kvcu_cache_create(), and when the spec selects the
 * host-side retention state beside it (the engine composes the two; the cache knows nothing
 * of eviction). Nothing left allocated on an error. */
int kvcu_retain_cache_create(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                             kv_err *err);
/** Free a cache from kvcu_retain_cache_create(): its retention state and scratch, then the
 * cache (NULL is fine). */
void kvcu_retain_cache_free(kvcu_cache *c);
/**
 * kv_retain_attend() on the device (chapter 09): steps 1-5 of kv_retain.h for one sequence of
 * a step, every KV head of @p layer, after its rows were written to @p c. q [n][H][d] and
 * out [n][H][d] are device memory. The new keys come back dequantized for append, each row's
 * position list goes to the device, one kernel attends over the lists and, for H2O and SnapKV,
 * accumulates the attention mass per listed position in kv_retain.h's order; the mass comes
 * back for observe and the host evicts. Same state changes as the CPU (within the float
 * tolerance of the attention). KV_OK, KV_ERR_ARG (no retention, bad layer / slot /
 * positions), KV_ERR_NOMEM, KV_ERR_DEVICE, KV_ERR_UNSUPPORTED (a group whose queries pass
 * 48 KiB of shared memory).
 */
int kvcu_retain_attend(kvcu_cache *c, int layer, int slot, int pos0, int n, const float *q,
                       float *out, kv_err *err);
/** Device scratch of the forward pass; buffers grow with the largest step seen. */
int kvcu_state_create(kvcu_state **out, kv_err *err);
/** Free the device scratch (NULL is fine). */
void kvcu_state_free(kvcu_state *s);
/**
 * The weights the projections read: KV_QF_F32 (the default, the reference's arithmetic) or a
 * 16-bit copy, KV_QF_BF16 or KV_QF_F16, made on the device beside the fp32 weights (which
 * stay: embedding and norms read them). With a copy the matmuls of kvcu_forward() read it:
 * a prefill's rows on tensor cores (kvcu_matmul_x16, each layer input rounded to 16 bits
 * once), the rows of one-token sequences, of all_logits chunks and the classifier by the
 * GEMV (kvcu_matmul_w16_gemv); a row's path is
 * its sequence's, so a sequence's rows stay bit-identical alone and in any batch; the logits
 * move from the CPU's by the rounding of weights (and, on tensor cores, activations).
 * KV_ERR_ARG for other dtypes.
 */
int kvcu_model_set_weights(kvcu_model *m, int dtype, kv_err *err);
/**
 * The attention kvcu_forward() runs for a sequence of more than one token in a step (prefill,
 * chunked prefill): 0 (the default) the per-row kernels every row takes, so a row's result is
 * that of a one-token step at its position, bit for bit; 5 chapter 08's v5 on tensor cores
 * (kvcu_flash_attention(5, ...): q, K, V and P rounded to 16 bits, held to the reference by
 * the bound of tests/test_gpu_flash.c), where the device has tensor cores (sm_80+), the cache
 * has no window or retention and the head dim fits v5 (else the per-row kernels); 6 the same
 * with v6 (kvcu_flash_attention(6, ...), the same roundings and bound, int8 and fp8 tiles
 * converted once) wherever v6 fits the layer, v5 where only v5 does (the choice:
 * kvcu_flash_prefill_version(), kvcu_flash_v6.cu). A sequence asking for all_logits (a
 * speculative verification chunk, chapter 10) takes the per-row kernels under every
 * setting: its row j equals the one-token step at that position, bit for bit, which greedy
 * verification relies on. KV_ERR_ARG for other versions.
 */
int kvcu_state_set_prefill(kvcu_state *s, int version, kv_err *err);

/** The transformer step on the GPU; same contract as kv_forward(). logits: host memory.
 * A sequence asking for every row's logits (kv_seq.all_logits, chapter 10, host memory
 * [n_tokens][vocab]) gets the final RMSNorm and classifier over each of its rows, computed
 * row by row as a one-token step computes its row, so each equals that step's logits. */
int kvcu_forward(const kvcu_model *m, kvcu_cache *c, kvcu_state *s, const kv_seq *seqs,
                 int n_seqs, float *logits, kv_counters *cnt, kv_err *err);
/**
 * kvcu_forward() as rank @p sh of a tensor-parallel group (chapter 10), the twin of
 * kv_forward_shard() with the same ::kv_shard: the rank's rows of Wq, Wk, Wv, W1 and W3, its
 * columns of Wo and W2 (kvcu_matmul_strided()), and sh->all_reduce() after the Wo product and
 * after the W2 product of every layer. Here the x it is given is DEVICE memory: the partial
 * sums [T][dim] in this rank's scratch, which the hook replaces by the sum over the ranks
 * (e.g. an ncclAllReduce on the device, or a download, a host sum and an upload) before it
 * returns, the kernels launched so far being complete or ordered before its own work.
 * @p c holds the shard's KV heads only (a cache created with n_kv_heads = sh->n_kv_heads).
 * Retention (chapter 09) on a shard is refused (KV_ERR_UNSUPPORTED) as on the CPU. NULL
 * @p sh is kvcu_forward() itself, bit for bit.
 */
int kvcu_forward_shard(const kvcu_model *m, kvcu_cache *c, kvcu_state *s, const kv_shard *sh,
                       const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                       kv_err *err);

/** A ::kv_backend running kvcu_forward(); uploads @p model (the host copy may then go).
 * Its truncate (chapter 10) is kvcu_cache_truncate(), paged through kv_paged_truncate().
 * The engine is the reference's: fp32 weights, multi-token steps on the per-row kernels. */
int kvcu_backend_create(kv_backend **out, const kv_model *model, const kv_cache_spec *spec,
                        kv_err *err);
/** The tensor-core choices of a CUDA backend (all zeros: kvcu_backend_create()'s engine). */
typedef struct {
    int weights; /**< KV_QF_F32 (0), KV_QF_BF16 or KV_QF_F16: kvcu_model_set_weights() */
    int prefill; /**< 0 the per-row kernels, 5 v5 on tensor cores, 6 v6 where it fits (else
                  *   v5): kvcu_state_set_prefill() */
} kvcu_engine_opts;
/** kvcu_backend_create() with the engine @p o chooses (NULL: the default); KV_ERR_ARG for a
 * weights type or prefill version those two setters refuse. */
int kvcu_backend_create_opts(kv_backend **out, const kv_model *model, const kv_cache_spec *spec,
                             const kvcu_engine_opts *o, kv_err *err);

/* ---- chapter 11: multi-head latent attention (MLA), twins of kv_attention_mla.h ---------- */
/** kv_cache_create_planes() on the device: @p n_planes planes per layer, KV_CACHE_KV_PLANES
 * (kvcu_cache_create()) or 1, a latent cache (chapter 11: one KV head of d_c + d_R elements,
 * written with kvcu_cache_write_seq(c, l, slot, pos, n, rows, NULL, err), plane 0 read with
 * role KV_QROLE_KEY), with the CPU cache's bytes at the CPU cache's offsets. */
int kvcu_cache_create_planes(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                             int n_planes, kv_err *err);
/**
 * The latent attention of kv_mla_attention_absorbed() on tensor cores
 * (cuda/attention/kvcu_attention_mla.cu): one token's H heads, q_lat [H][d_c] (q̃ = W_UKᵀ
 * q_nope) and q_rope [H][d_R], over rows 0 .. n-1 of @p slot of a latent cache (one plane,
 * rows of d_c + d_R; d_c = the cache's row - d_rope), o_lat [H][d_c] = Σ_t softmax_t(scale ·
 * (q_lat·c_t + q_rope·kR_t)) c_t; device pointers. Shapes: d_c a multiple of 64 up to 512,
 * d_R a multiple of 16, d_c + d_R <= 576; every per-token format (fp16 and bf16 rows copied
 * as they are, the others dequantized to fp16), contiguous or paged. @p n_parts: split-KV
 * ranges (0: from the device's SM count; ranges are multiples of 64 rows, so fewer may run).
 * Below sm_80 the same ranges run on CUDA cores in fp32 (no 16-bit rounding).
 * @p scratch: kvcu_mla_attention_scratch() floats, or NULL to allocate one and wait. Refused:
 * a cache of two planes (KV_ERR_ARG), KIVI or a window (KV_ERR_UNSUPPORTED), bad shapes.
 */
int kvcu_mla_attention_latent(const kvcu_cache *c, int layer, int slot, int n,
                              const float *q_lat, const float *q_rope, float *o_lat,
                              float *scratch, int n_heads, int d_rope, float scale, int n_parts,
                              kv_err *err);
/** Twin of kv_mla_attention_absorbed(): q̃ = W_UKᵀ q_nope (a plain fp32 kernel), the latent
 * attention above with scale 1/√(d_nope + d_R), then out = W_UV o (fp32). w_uk [H][d_nope][d_c],
 * w_uv [H][d_v][d_c], q_nope [H][d_nope], q_rope [H][d_R], out [H][d_v]: device. */
int kvcu_mla_attention_absorbed(const float *w_uk, const float *w_uv, const kv_mla_dims *m,
                                int n_heads, const float *q_nope, const float *q_rope,
                                const kvcu_cache *c, int layer, int slot, int n, float *out,
                                float *scratch, int n_parts, kv_err *err);
/** Floats of scratch either call needs for @p n rows: H·ceil(n / 64)·(d_c + 2) range states
 * and 2·H·d_c (q̃ and the latent output of the absorbed call). */
size_t kvcu_mla_attention_scratch(int n_heads, int d_c, int n);

/* ---- chapter 04: KV-cache quantization, twins of kv_quant.h (device pointers) -------- */
/**
 * GPU twin of kv_quant_encode(): x [n][d] device fp32 rows, codes / meta device outputs in
 * the layouts of kv_quant.h, bit-identical to the CPU's. KIVI keys need d <= 288 (their
 * 32-token tile sits in 48 KiB of shared memory): KV_ERR_UNSUPPORTED beyond.
 */
int kvcu_quant_encode(int fmt, int role, const float *x, int64_t n, int d, float scale,
                      void *codes, void *meta, kv_err *err);
/**
 * GPU twin of kv_cache_write_seq(): n tokens' k, v [n][H_kv][d] (device) at positions
 * pos .. pos+n-1 of @p slot in @p layer, quantized into the layer's format with the CPU's
 * bytes. The slot's length is the caller's, as on the CPU. A windowed cache puts position p
 * in its ring row (kv_window_row()); the rows of one call are written at once, so a chunk
 * past the first S+W positions must not exceed W tokens (kv_window_chunk() chunks do not).
 */
int kvcu_cache_write_seq(kvcu_cache *c, int layer, int slot, int pos, int n, const float *k,
                         const float *v, kv_err *err);
/** GPU twin of kv_attention(): q, out [H][d] device; positions 0..pos of @p slot, or with a
 * window the ones the query at pos retains (sinks, then the window; keys rotated by cache
 * index under KV_POS_CACHE). */
int kvcu_cache_attention(const kvcu_cache *c, int layer, int slot, int pos, const float *q,
                         float *out, int n_heads, kv_err *err);
/**
 * kvcu_cache_attention() with the kernel chosen: 1 to 4 as in kvcu_attn_decode_version(), or
 * 0 for the engine's choice (v4 where it reads the layer, kvcu_cache_decode_reads(); else v2
 * up to 512 positions, v3 beyond). @p scratch: device scratch of
 * kvcu_attn_decode_scratch(version or 4, n_heads, head_dim, capacity) floats, or NULL to
 * allocate one and wait for the kernel; with a scratch the call returns at once. Contiguous
 * and paged caches, every format.
 */
int kvcu_cache_attention_version(int version, const kvcu_cache *c, int layer, int slot, int pos,
                                 const float *q, float *out, float *scratch, int n_heads,
                                 kv_err *err);
/** 1 when the engine's decode kernel (version 4) reads @p layer of @p c with @p n_heads query
 * heads: every format, KIVI and keys rotated at attention (KV_POS_CACHE) included, when a row
 * is at most 32 chunks of 16 bytes (a power of two) in its format or as fp32 (d = 4, 8, .. 128),
 * and the group's shared memory is within 160 KiB; else 0 (the engine then runs v2/v3). */
int kvcu_cache_decode_reads(const kvcu_cache *c, int layer, int n_heads);
/** 1 when version 4 runs that layer's group on tensor cores (cuda/attention/kvcu_decode_mma.cu:
 * G >= 4 with per-token int8 or fp8, MQA with those or fp16 / bf16; d a multiple of 16 up to
 * 128, G <= 64), else 0. */
int kvcu_cache_decode_mma(const kvcu_cache *c, int layer, int n_heads);
/** The 16-bit unit roundoff h of the tensor-core decode for format @p fmt: its query and
 * weights are bf16 (2^-8) for a bf16 cache, fp16 (2^-11) otherwise. */
static inline double kvcu_decode_mma_roundoff(int fmt)
{
    return fmt == KV_QF_BF16 ? 0x1p-8 : 0x1p-11;
}
/** The forward-error bound version 4 keeps against kv_attention_ref() (test_gpu_decode.c
 * derives it) for one query head over @p n retained rows of head dim @p d, with
 * S = max_i Σ_j |q_j|·|k_ij| / √d, V = max |v_ij| and @p h the tensor-core roundoff
 * (kvcu_decode_mma_roundoff()), 0 for the CUDA-core kernel:
 *   |ô - o| <= 1.01·(expm1(2Δ) + h + (2n + 8 + 2R)·u)·V,
 *   Δ = h·S + u·(c·S + 4 + R·(2S + 5)),  c = d + 30 on tensor cores, ⌊d/16⌋ + 30 else,
 *   R = ⌈n/8⌉ + P + 2, u = 2^-24, P the most split ranges of n keys: max(min(⌈n/64⌉, 64),
 *   ⌈n/256⌉) (ranges shrink to 64 keys for short rows, attn_split_keys()). */
static inline double kvcu_decode_bound(int d, int64_t n, double S, double V, double h)
{
    const double P = fmax(fmin(ceil(n / 64.0), 64), ceil(n / 256.0));
    const double u = 0x1p-24, R = ceil(n / 8.0) + P + 2;
    const double dots = h > 0 ? d + 30 : d / 16 + 30;
    const double delta = h * S + u * (dots * S + 4 + R * (2 * S + 5));
    return 1.01 * (expm1(2 * delta) + h + (2.0 * (double)n + 8 + 2 * R) * u) * V;
}
/** GPU twin of kv_cache_write_slots(): k, v [n][H_kv][d] device rows into pool rows
 * @p slots [n] (host memory; negative = padding, skipped), the CPU's bytes; fp8 and KIVI
 * refused with the CPU's words. */
int kvcu_cache_write_slots(kvcu_cache *c, int layer, const int64_t *slots, int n, const float *k,
                           const float *v, kv_err *err);
/** Bytes of the device cache's one buffer (the CPU kv_cache's mem_bytes for the same spec). */
size_t kvcu_cache_mem_bytes(const kvcu_cache *c);
/** Copy the first @p bytes of the device cache's buffer to @p host (same layout as kv_cache.mem). */
int kvcu_cache_download(const kvcu_cache *c, void *host, size_t bytes, kv_err *err);
/** GPU twin of kv_quant_decode(): x [n][d] device out. */
int kvcu_quant_decode(int fmt, int role, const void *codes, const void *meta, int64_t n, int d,
                      float scale, float *x, kv_err *err);

/* ---- chapter 05: the paged layout, twins of kv_cache.h's (host arrays in, device cache) - */
/** kv_cache_set_blocks(): map logical blocks 0 .. n-1 of @p slot to @p blocks [n] (host);
 * the same checks and messages. The table is copied to the device at once. */
int kvcu_cache_set_blocks(kvcu_cache *c, int slot, const int *blocks, int n, kv_err *err);
/** kv_cache_fork_slot(): @p dst takes @p src's length, KIVI count and window, fp8 scales. */
int kvcu_cache_fork_slot(kvcu_cache *c, int dst, int src, kv_err *err);
/** kv_cache_set_length(): a prefix-cache hit (refuses fp8 and KIVI layers, as the CPU). */
int kvcu_cache_set_length(kvcu_cache *c, int slot, int len, kv_err *err);
/**
 * kv_cache_copy_blocks(): for each pair (host array) in order, every layer's K and V rows,
 * codes and metadata, of block src into block dst. One kernel launch covers the list (a list
 * in which a pair reads or overwrites a block an earlier pair wrote runs as several launches,
 * so the result is the in-order one); the bytes equal the CPU's.
 */
int kvcu_cache_copy_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n, kv_err *err);

/* ---- chapter 07: block I/O for a host tier, twins of kv_cache.h's ------------------------ */
/** kv_cache_block_bytes(): one block's bytes in the host tier's order (0 if not paged). */
size_t kvcu_cache_block_bytes(const kvcu_cache *c);
/**
 * kv_cache_read_blocks(): pool block pairs[i].src -> host block pairs[i].dst (at host +
 * dst * block_bytes), the CPU's bytes in the CPU's order. One gather kernel packs the blocks
 * into a device staging buffer, then one cudaMemcpyAsync per run of consecutive host blocks
 * (one for a swap's list) brings them over; returns when the bytes are on the host.
 */
int kvcu_cache_read_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n, uint8_t *host,
                           size_t block_bytes, kv_err *err);
/** kv_cache_write_blocks(): host block pairs[i].src -> pool block pairs[i].dst, copied to the
 * staging buffer, then one scatter kernel. A pool block named twice: KV_ERR_ARG. */
int kvcu_cache_write_blocks(kvcu_cache *c, const kv_block_copy *pairs, int n,
                            const uint8_t *host, size_t block_bytes, kv_err *err);

/* ---- chapter 08: fused FlashAttention-style kernels, twins of kv_flash.h ---------------- */
/** One attention job on the device: kv_flash_job's fields over a ::kvcu_cache, T queries of
 * one slot over its keys; query t sits at q_pos0 + t and sees keys k_begin <= k < n_keys (and
 * k <= q_pos0 + t when causal); a query that sees no key outputs zeros. */
typedef struct {
    const kvcu_cache *c; /**< the device cache holding K and V */
    int layer, slot;
    int n_heads;         /**< H; the cache has H_kv, G = H / H_kv */
    const float *q;      /* [T][H][d] device, RoPE applied */
    int T;
    int64_t q_pos0;      /**< position of query 0 */
    int64_t k_begin;     /**< first key a query may see */
    int64_t n_keys;      /**< keys 0 .. n_keys - 1 of the slot are valid */
    int causal;          /**< 1: query at p sees keys <= p */
    float *out;          /* [T][H][d] device */
} kvcu_flash_job;

/** Most score floats (H·T·(n_keys - k_begin)) kvcu_flash_attention() version 1
 * materializes: 2^28 (1 GiB); larger jobs are refused (KV_ERR_UNSUPPORTED). */
#define KVCU_FLASH_V1_MAX_SCORES ((int64_t)1 << 28)
/** Keys per range of the GPU's one split-KV decode: version 4 here and the engine's v3
 * partitions (kvcu_attention.cu); a range is one block per (query, KV head). */
#define KVCU_FLASH_SPLIT_KEYS 512

/**
 * Attention of a job with kernel version @p version (cuda/attention/kvcu_flash.cu describes them):
 * 1 naive (scores [H][T][n_vis] in global memory, a softmax kernel, a P·V kernel; at most
 * KVCU_FLASH_V1_MAX_SCORES scores), 2 fused tiled prefill (one block per (query tile, head),
 * online softmax, causal key tiles skipped), 3 decode (one block per (query, KV head): the G
 * heads of a group share each K/V tile), 4 split-KV (v3 over ranges of KVCU_FLASH_SPLIT_KEYS
 * keys, partial (m, l, acc) merged by log-sum-exp in a second kernel), 5 v2's tiles on tensor
 * cores (kvcu_flash_mma.cu; sm_80 and newer, else KV_ERR_UNSUPPORTED naming the GPU), 6 v5
 * with 32 rows per warp, the longest query tiles first and per-token int8 / fp8 tiles
 * converted once to fp16 (kvcu_flash_v6.cu; v5's shapes and devices). Every version reads
 * contiguous and paged caches of every format through the cache views (dequantization
 * fused). A windowed cache: KV_ERR_UNSUPPORTED; bad shapes or ranges: KV_ERR_ARG.
 * @p scratch: device scratch of kvcu_flash_scratch() floats, or NULL to allocate one here (the
 * call then waits for the kernels); with a scratch (or none needed) it returns at once.
 */
int kvcu_flash_attention(int version, const kvcu_flash_job *j, float *scratch, kv_err *err);
/**
 * The memory traffic of version @p version on job @p j, by kv_flash.c's formulas (kv_flash.h's
 * units: a stored row costs d·b bytes, codes and metadata) applied to the kernel's own work
 * split: v1 as kv_flash_naive (K and V once per head, 5·4·H·T·n_vis score bytes), v2 as
 * kv_flash_tiled with the kernel's tiles (K/V once per (query tile, head), up to the tile's
 * last visible key), v3 once per (query, KV head) over each query's visible keys, v4 the same
 * K/V plus its partials (2·n_splits·(d + 2) floats per (query, head)), v5 and v6 as v2 per
 * (query tile, KV head) with their own tiles. Host arithmetic only;
 * *st is overwritten (kv_flash_naive() and friends add into theirs). The checks of
 * kvcu_flash_attention(): a job it refuses is refused here with the same status.
 */
int kvcu_flash_bytes(int version, const kvcu_flash_job *j, kv_flash_stats *st, kv_err *err);
/** Floats of device scratch kvcu_flash_attention(@p version, @p j) needs: H·T·(n_vis + 1) for
 * v1 (scores and row sums; n_vis = n_keys - k_begin), T·H·n_splits·(d + 2) for v4 (n_splits =
 * ceil(n_vis / KVCU_FLASH_SPLIT_KEYS), at least 1), 0 for v2, v3, v5 and v6. */
size_t kvcu_flash_scratch(int version, const kvcu_flash_job *j);
/**
 * Time version @p version on job @p j with CUDA events: one warm-up call, then @p repeats
 * timed calls; *seconds gets their median. @p scratch as in kvcu_flash_attention().
 */
int kvcu_flash_time(int version, const kvcu_flash_job *j, float *scratch, int repeats,
                    double *seconds, kv_err *err);
/**
 * The tensor-core version the engine's causal prefill of a layer runs (kvcu_state_set_prefill()
 * @p want 5 or 6), chosen here and nowhere else: 6 where @p want is 6 and v6 takes the shape
 * (v5's shapes: head dims a multiple of 16 up to 128, groups of up to 64 heads; and its shared
 * memory within what this device lets a block opt in to), else 5 where v5 takes it, else 0
 * (the per-row kernels). Both read every format and both layouts (v6 converts per-token int8
 * and fp8 tiles, dequantizes the others as v5 does), so the shape alone decides; the engine
 * itself keeps windows, retention and devices below sm_80 on the per-row kernels.
 */
int kvcu_flash_prefill_version(int want, int n_heads, int n_kv_heads, int head_dim);
/**
 * The device's read bandwidth, the roofline of a decode step: a kernel sums a buffer of
 * @p bytes (rounded to 16-byte vectors; 0 = 1 GiB), timed with CUDA events, median of
 * @p repeats after a warm-up, in *bytes_per_s.
 */
int kvcu_read_bandwidth(size_t bytes, int repeats, double *bytes_per_s, kv_err *err);
/**
 * The device's copy bandwidth: a kernel copies a buffer of @p bytes (16-byte vectors; 0 =
 * 1 GiB) to another, device to device, timed as kvcu_read_bandwidth(); *bytes_per_s counts
 * the bytes read and the bytes written (2 · bytes per copy).
 */
int kvcu_copy_bandwidth(size_t bytes, int repeats, double *bytes_per_s, kv_err *err);
/**
 * The device's tensor-core throughput in the same run (cuda/eval/kvcu_bench_mma.cu): warps
 * issuing independent mma.sync.m16n8k16 (fp16, or bf16 when @p bf16) on register fragments,
 * @p iters rounds of 8 per warp, 8 blocks of 4 warps per SM; median of @p repeats timed
 * launches after a warm-up, in *flop_per_s (4 096 FLOPs per mma). KV_ERR_UNSUPPORTED below
 * sm_80, naming the GPU.
 */
int kvcu_mma_throughput(int bf16, int iters, int repeats, double *flop_per_s, kv_err *err);
/** Median of @p repeats CUDA-event-timed calls of fn(arg) (work issued to the default
 * stream) after one warm-up call, in *seconds; fn's failure status is returned as is. */
int kvcu_time_calls(int (*fn)(void *arg, kv_err *err), void *arg, int repeats, double *seconds,
                    kv_err *err);
/**
 * The engine's decode attention of a batch, as kvcu_forward() runs it (one launch: v2 while
 * every row reads one 512-position partition, v3 beyond): row b is the query q[b] [H][d] of
 * slot slots[b] at position pos[b] (slots, pos: device [B]), out [B][H][d] device. @p scratch:
 * kvcu_decode_batch_scratch() floats of device memory; @p max_len: the most positions a row
 * reads. Returns once the launch is issued.
 */
int kvcu_decode_batch(const kvcu_cache *c, int layer, const int *slots, const int *pos,
                      const float *q, float *out, float *scratch, int B, int n_heads,
                      int max_len, kv_err *err);
/** Floats of scratch kvcu_decode_batch() needs for @p B rows of @p n_heads heads. */
size_t kvcu_decode_batch_scratch(const kvcu_cache *c, int B, int n_heads);

#ifdef __cplusplus
}
#endif
#endif
