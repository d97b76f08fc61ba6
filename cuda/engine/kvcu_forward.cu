/*
 * The transformer step on the GPU, the twin of reference_cpu/engine/kv_forward.c: the same batch
 * (sequences flattened into T rows, each row knowing its slot and position), the same checks,
 * the same order of operations, each one a kvcu_ kernel from kvcu_ops.cu, kvcu_cache.cu and
 * kvcu_attention.cu. What stays on the host is bookkeeping: the batch checks, the slot lengths,
 * the work counters (kv_counters_add_step from reference_cpu, one formula for both devices).
 *
 * Per step the host uploads one small array (token ids, slots, positions, query positions,
 * last rows, the wave list) and downloads the logits; weights, cache and activations never
 * leave the device.
 *
 * Chapter 06 (a sliding-window cache, kv_window.h), exactly as kv_forward: the query is
 * rotated at its q_pos (its position, or under KV_POS_CACHE its index in the cache), keys
 * under KV_POS_CACHE are cached before RoPE, and a step is written and attended in waves:
 * each wave writes, per sequence, only the rows kv_window_chunk() allows before any of them
 * attends (the rows up to S+W at once, then one token per sequence per wave), so no ring row
 * is overwritten before the queries that read it ran. Without a window, or when every
 * sequence fits one wave (decode, a prefill inside S+W), a step is one wave: one write launch
 * and one attention launch per layer, as before. The waves depend only on the batch, so the
 * host lists them once per step, not per layer.
 *
 * Chapter 10 (tensor-parallel heads, kv_shard): kvcu_forward_shard() is the same step over a
 * rank's rows of Wq, Wk, Wv, W1, W3 and columns of Wo, W2 (kvcu_matmul_strided), with the
 * shard's all_reduce hook called on the device partial sums after the Wo and W2 products, as
 * kv_forward_shard() does on the CPU; kvcu_forward() is the shard-less call.
 *
 * Also here: the device queries and C wrappers of cudaMalloc/cudaMemcpy for C callers. The
 * kv_backend that runs kvcu_forward() is kvcu_backend.cu.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_ops.h"
#include "kv_retain.h"
#include "kvcu_flash.cuh"

/* A scores scratch larger than this many floats (256 MiB) is not allocated: a long prefill
 * runs its attention in chunks of rows instead (kvcu_attention_scratch() floats each: rows·H
 * scores of capacity positions and v3's partition results). */
#ifndef KVCU_SCORES_MAX
#define KVCU_SCORES_MAX ((size_t)1 << 26)
#endif
#define KVCU_ATTN_MAX_ROWS 65535 /* rows of one attention launch: its grid's y */

/* ---- structs ----------------------------------------------------------------------------- */

struct kvcu_model {
    kv_config config;
    kv_weights w; /* device pointers into data, at the host copy's offsets */
    float *data;  /* device, every weight in llama2.c order */
    uint16_t *data16; /* device, the same weights as bf16 or fp16 at the same offsets, or NULL
                       * (kvcu_model_set_weights): the projections then run on tensor cores */
    int w16_bf16;     /* data16 holds bf16 (1) or fp16 (0) */
    size_t n_floats;
};

/* A device buffer that only grows (its contents are not kept when it does). */
typedef struct {
    void *p;
    size_t bytes;
} kvcu_buf;

struct kvcu_state {
    kvcu_buf x;      /* [T][dim]     residual stream */
    kvcu_buf xb;     /* [T][dim]     normed input / attention output */
    kvcu_buf xb2;    /* [T][dim]     projection output */
    kvcu_buf q;      /* [T][H*d] */
    kvcu_buf k;      /* [T][H_kv*d] */
    kvcu_buf v;      /* [T][H_kv*d] */
    kvcu_buf hb;     /* [T][hidden]  gate, then SwiGLU */
    kvcu_buf hb2;    /* [T][hidden]  up */
    kvcu_buf x16;    /* [T][in]      a projection's input as 16 bits (stage16()) */
    kvcu_buf xlast;  /* [n_seqs][dim] last token of each sequence, final-normed */
    kvcu_buf logits; /* [max(n_seqs, n_tokens of any all_logits sequence)][vocab] */
    kvcu_buf scores; /* [rows][H][capacity] attention scores of a chunk of rows, then v3's
                      * partition results (kvcu_attention_scratch()) */
    kvcu_buf ints;   /* [5T + n_seqs] tokens | slots | positions | query positions | last
                      * rows | the rows of the step listed wave by wave */
    int *host_ints;  /* host staging of ints, then host-only wave bookkeeping:
                      * [11T + 2 n_seqs + 2] (kvcu_forward) */
    size_t host_ints_n;
    int prefill;     /* attention of a sequence's rows in a step with n_tokens > 1:
                      * 0 the per-row kernels, 5 chapter 08's v5, 6 its v6 where v6 fits
                      * (kvcu_state_set_prefill, kvcu_flash_prefill_version()) */
};

/* ---- the device --------------------------------------------------------------------------- */

/** 1 when this library is the CPU emulation build. */
int kvcu_is_emulation(void)
{
#ifdef KV_CUDA_EMULATION
    return 1;
#else
    return 0;
#endif
}

/* ---- device memory for C callers ----------------------------------------------------------- */

int kvcu_malloc(void **dptr, size_t bytes, kv_err *err)
{
    return kvcu_device_alloc(dptr, bytes, err);
}

void kvcu_free(void *dptr) { cudaFree(dptr); }

int kvcu_host_alloc(void **p, size_t bytes, kv_err *err)
{
    *p = NULL;
    KV_CUDA_TRY(cudaHostAlloc(p, bytes, cudaHostAllocDefault), err);
    memset(*p, 0, bytes);
    return KV_OK;
}

void kvcu_host_free(void *p)
{
    if (p) cudaFreeHost(p);
}

int kvcu_upload(void *dst, const void *src, size_t bytes, kv_err *err)
{
    KV_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), err);
    return KV_OK;
}

int kvcu_download(void *dst, const void *src, size_t bytes, kv_err *err)
{
    KV_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), err);
    return KV_OK;
}

int kvcu_synchronize(kv_err *err)
{
    KV_CUDA_TRY(cudaDeviceSynchronize(), err);
    return KV_OK;
}

/* ---- weights --------------------------------------------------------------------------- */

/** Copy a model's weights to the device; the host model may be freed afterwards. */
int kvcu_model_upload(kvcu_model **out, const kv_model *m, kv_err *err)
{
    *out = NULL;
    if (!m || !m->data || m->n_floats <= 0)
        return kv_fail(err, KV_ERR_ARG, "kvcu_model_upload: model has no weights");
    /* the CUDA engine has the MHA/GQA block only: an MLA model (chapter 11) is refused here */
    if (m->config.attn != KV_ATTN_GQA) return kv_config_require_gqa(&m->config, "kvcu_model_upload", err);
    kvcu_model *g = (kvcu_model *)calloc(1, sizeof *g);
    if (!g) return kv_fail(err, KV_ERR_NOMEM, "kvcu_model_upload: host memory");
    g->config = m->config;
    g->n_floats = (size_t)m->n_floats;
    const size_t bytes = (size_t)m->n_floats * sizeof(float);
    cudaError_t e = cudaMalloc(&g->data, bytes);
    if (e == cudaSuccess) e = cudaMemcpy(g->data, m->data, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        kvcu_model_free(g);
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        return kv_fail(err, e == cudaErrorMemoryAllocation ? KV_ERR_NOMEM : KV_ERR_DEVICE,
                       "kvcu_model_upload: %zu bytes of weights: %s", bytes,
                       cudaGetErrorString(e));
    }
    /* the weights are one block, so each tensor sits at the same offset on both sides
     * (a tied classifier keeps pointing at the embedding) */
#define KVCU_REBASE(f) g->w.f = g->data + (m->w.f - m->data)
    KVCU_REBASE(token_embedding);
    KVCU_REBASE(rms_att);
    KVCU_REBASE(wq);
    KVCU_REBASE(wk);
    KVCU_REBASE(wv);
    KVCU_REBASE(wo);
    KVCU_REBASE(rms_ffn);
    KVCU_REBASE(w1);
    KVCU_REBASE(w2);
    KVCU_REBASE(w3);
    KVCU_REBASE(rms_final);
    KVCU_REBASE(wcls);
#undef KVCU_REBASE
    *out = g;
    return KV_OK;
}

int kvcu_model_set_weights(kvcu_model *m, int dtype, kv_err *err)
{
    if (!m || (dtype != KV_QF_F32 && dtype != KV_QF_F16 && dtype != KV_QF_BF16))
        return kv_fail(err, KV_ERR_ARG, "kvcu_model_set_weights: dtype %d (fp32, fp16 or "
                       "bf16)", dtype);
    cudaFree(m->data16);
    m->data16 = NULL;
    if (dtype == KV_QF_F32) return KV_OK;
    const int st = kvcu_device_alloc((void **)&m->data16, m->n_floats * sizeof(uint16_t), err);
    if (st) return st;
    m->w16_bf16 = dtype == KV_QF_BF16;
    return kvcu_to16(m->data16, m->data, (int64_t)m->n_floats, m->w16_bf16, err);
}

/* y = x · Wᵀ for a weight W of the model (a device pointer into its data): fp32 as the
 * reference does (kvcu_matmul_strided), or from the 16-bit copy, where a row's kind is its
 * sequence's: the rows of a one-token sequence or of an all_logits chunk (each row equal to a
 * one-token step's, chapter 10) by the GEMV (kvcu_matmul_w16_gemv: bandwidth-bound, 16-byte
 * loads), the rows of a prefill on tensor cores (kvcu_matmul_x16) from x16, x rounded to 16
 * bits (stage16(); NULL below sm_80, where those rows take the GEMV too). Neither depends on
 * the other rows of the batch, so a sequence's bits do not either. x's rows follow seqs (T
 * rows in all); seqs NULL: every row by the GEMV (the classifier: one row per sequence, or an
 * all_logits chunk's rows). */
static int proj(const kvcu_model *m, const kv_seq *seqs, int n_seqs, float *y, const float *x,
                const uint16_t *x16, const float *W, int T, int in, int out, int ldw, kv_err *err)
{
    if (!m->data16) return kvcu_matmul_strided(y, x, W, T, in, out, ldw, err);
    const uint16_t *W16 = m->data16 + (W - m->data);
    const int bf = m->w16_bf16;
    if (!seqs) return kvcu_matmul_w16_gemv(y, x, W16, bf, T, in, out, ldw, err);
    for (int i = 0, t = 0; i < n_seqs;) { /* runs of sequences of one kind */
        const int gemv = seqs[i].n_tokens == 1 || seqs[i].all_logits;
        int n = 0;
        for (; i < n_seqs && (seqs[i].n_tokens == 1 || seqs[i].all_logits) == gemv; i++)
            n += seqs[i].n_tokens;
        const float *xr = x + (size_t)t * in;
        float *yr = y + (size_t)t * out;
        const int rc = gemv || !x16
                           ? kvcu_matmul_w16_gemv(yr, xr, W16, bf, n, in, out, ldw, err)
                           : kvcu_matmul_x16(yr, x16 + (size_t)t * in, W16, bf, n, in, out, ldw,
                                             err);
        if (rc) return rc;
        t += n;
    }
    return KV_OK;
}

void kvcu_model_free(kvcu_model *m)
{
    if (!m) return;
    cudaFree(m->data16);
    cudaFree(m->data);
    free(m);
}

/* ---- scratch ------------------------------------------------------------------------- */

int kvcu_state_create(kvcu_state **out, kv_err *err)
{
    *out = (kvcu_state *)calloc(1, sizeof(kvcu_state));
    return *out ? KV_OK : kv_fail(err, KV_ERR_NOMEM, "kvcu_state_create: host memory");
}

int kvcu_state_set_prefill(kvcu_state *s, int version, kv_err *err)
{
    if (!s || (version != 0 && version != 5 && version != 6))
        return kv_fail(err, KV_ERR_ARG, "kvcu_state_set_prefill: version %d (0: the per-row "
                       "kernels, 5: v5 on tensor cores, 6: v6 where it fits, else v5)", version);
    s->prefill = version;
    return KV_OK;
}

void kvcu_state_free(kvcu_state *s)
{
    if (!s) return;
    kvcu_buf *bufs[] = {&s->x,   &s->xb,  &s->xb2,   &s->q,      &s->k,      &s->v,   &s->hb,
                        &s->hb2, &s->x16, &s->xlast, &s->logits, &s->scores, &s->ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]->p);
    free(s->host_ints);
    free(s);
}

/* Make b hold at least @p bytes. */
static int grow(kvcu_buf *b, size_t bytes, kv_err *err)
{
    if (bytes <= b->bytes) return KV_OK;
    cudaFree(b->p);
    b->p = NULL;
    b->bytes = 0;
    const int rc = kvcu_device_alloc(&b->p, bytes, err);
    if (rc) return rc;
    b->bytes = bytes;
    return KV_OK;
}

/* Make room for a step of T rows, n_seqs sequences, score chunks of @p rows rows and
 * @p logit_rows rows of logits (n_seqs, or more when a sequence asks for all_logits). */
static int state_reserve(kvcu_state *s, const kv_config *c, int T, int n_seqs, int rows,
                         int capacity, int logit_rows, kv_err *err)
{
    const size_t f = sizeof(float), t = (size_t)T;
    const size_t dim = (size_t)c->dim, qdim = (size_t)c->n_heads * kv_config_head_dim(c);
    const size_t kvdim = (size_t)kv_config_kv_dim(c), hidden = (size_t)c->hidden_dim;
    int rc = 0;
    if ((rc = grow(&s->x, t * dim * f, err)) || (rc = grow(&s->xb, t * dim * f, err)) ||
        (rc = grow(&s->xb2, t * dim * f, err)) || (rc = grow(&s->q, t * qdim * f, err)) ||
        (rc = grow(&s->k, t * kvdim * f, err)) || (rc = grow(&s->v, t * kvdim * f, err)) ||
        (rc = grow(&s->hb, t * hidden * f, err)) || (rc = grow(&s->hb2, t * hidden * f, err)) ||
        (rc = grow(&s->xlast, (size_t)n_seqs * dim * f, err)) ||
        (rc = grow(&s->logits, (size_t)logit_rows * c->vocab_size * f, err)) ||
        (rc = grow(&s->scores,
                   kvcu_attention_scratch(rows, c->n_heads, kv_config_head_dim(c), capacity) * f,
                   err)))
        return rc;
    const size_t n_ints = 5 * t + (size_t)n_seqs, n_host = 11 * t + 2 * (size_t)n_seqs + 2;
    if ((rc = grow(&s->ints, n_ints * sizeof(int), err))) return rc;
    if (n_host > s->host_ints_n) {
        free(s->host_ints);
        s->host_ints = (int *)malloc(n_host * sizeof(int));
        s->host_ints_n = s->host_ints ? n_host : 0;
        if (!s->host_ints) return kv_fail(err, KV_ERR_NOMEM, "kvcu_forward: host memory");
    }
    return KV_OK;
}

/* ---- the step ------------------------------------------------------------------------ */

#define KVCU_TRY(call)              \
    do {                            \
        int kv_rc_ = (call);        \
        if (kv_rc_) return kv_rc_;  \
    } while (0)

/* The 16-bit copy of a projection input x [T][in] (s->x16) that the tensor-core rows of
 * proj() read, made once for every product of that input (Q, K and V; gate and up), in
 * place of a rounding in every block of each product. *x16 NULL when no row reads it: fp32
 * weights, a device below sm_80, a step of one-token and all_logits sequences only. */
static int stage16(const kvcu_model *m, kvcu_state *s, const kv_seq *seqs, int n_seqs,
                   const float *x, int T, int in, const uint16_t **x16, kv_err *err)
{
    int mma = 0;
    for (int i = 0; i < n_seqs; i++) mma |= !(seqs[i].n_tokens == 1 || seqs[i].all_logits);
    *x16 = NULL;
    if (!m->data16 || !mma || !kvcu_has_mma()) return KV_OK;
    KVCU_TRY(grow(&s->x16, (size_t)T * in * sizeof(uint16_t), err));
    *x16 = (const uint16_t *)s->x16.p;
    return kvcu_to16((uint16_t *)s->x16.p, x, (int64_t)T * in, m->w16_bf16, err);
}

/** The transformer step on the GPU; same contract as kv_forward(). logits: host memory. */
/* Attention of rows [a, b) of a step by the per-row kernels (kvcu_attention()), in launches
 * of at most @p rows rows (the scores scratch). q, out [T][qs] device. */
static int rows_attention(kvcu_cache *c, int l, kvcu_state *s, const int *d_slot,
                          const int *d_pos, const float *q, float *out, int a, int b, int rows,
                          int Hs, int qs, int max_len, kv_err *err)
{
    for (int r0 = a; r0 < b; r0 += rows) {
        const int nr = b - r0 < rows ? b - r0 : rows;
        KVCU_TRY(kvcu_attention(c, l, d_slot + r0, d_pos + r0, NULL, q + (size_t)r0 * qs,
                                out + (size_t)r0 * qs, (float *)s->scores.p, nr, Hs, max_len,
                                err));
    }
    return KV_OK;
}

/* Attention of a one-wave step over layer l (its K/V rows written). With the state's prefill
 * version 5 or 6 (and a device with tensor cores, sm_80+, a cache without window, W = 0, or
 * retention), each sequence of more than one token runs as a causal chapter 08 job on tensor
 * cores, v6 or v5 as kvcu_flash_prefill_version() chooses for the layer's shape: its n
 * queries at positions pos .. pos + n - 1 over keys 0 .. pos + n - 1 (kvcu_flash_v6.cu,
 * kvcu_flash_mma.cu); the rows of one-token sequences and of all_logits sequences (whose rows
 * must equal one-token steps, chapter 10's verification) take the per-row kernels, as every
 * row does otherwise. */
static int step_attention(kvcu_cache *c, int l, kvcu_state *s, const kv_seq *seqs, int n_seqs,
                          const int *d_slot, const int *d_pos, const float *q, float *out,
                          int T, int rows, int Hs, int d, int W, int max_len, kv_err *err)
{
    const int qs = Hs * d;
    const int version = W > 0 || c->retain || !kvcu_has_mma()
                            ? 0 : kvcu_flash_prefill_version(s->prefill, Hs, c->n_kv_heads, d);
    if (!version)
        return rows_attention(c, l, s, d_slot, d_pos, q, out, 0, T, rows, Hs, qs, max_len, err);
    int run = 0; /* first row not yet attended */
    for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
        const int n = seqs[i].n_tokens;
        if (n < 2 || seqs[i].all_logits) continue; /* all_logits: rows equal one-token steps */
        KVCU_TRY(rows_attention(c, l, s, d_slot, d_pos, q, out, run, t, rows, Hs, qs, max_len,
                                err));
        const kvcu_flash_job j = {c, l, seqs[i].slot, Hs, q + (size_t)t * qs, n,
                                  seqs[i].pos, 0, (int64_t)seqs[i].pos + n, 1,
                                  out + (size_t)t * qs};
        KVCU_TRY(kvcu_flash_attention(version, &j, NULL, err));
        run = t + n;
    }
    return rows_attention(c, l, s, d_slot, d_pos, q, out, run, T, rows, Hs, qs, max_len, err);
}

int kvcu_forward(const kvcu_model *m, kvcu_cache *c, kvcu_state *s, const kv_seq *seqs,
                 int n_seqs, float *logits, kv_counters *cnt, kv_err *err)
{
    return kvcu_forward_shard(m, c, s, NULL, seqs, n_seqs, logits, cnt, err);
}

/** kvcu_forward() as a tensor-parallel rank (kvcu.h); sh->all_reduce gets device pointers. */
int kvcu_forward_shard(const kvcu_model *m, kvcu_cache *c, kvcu_state *s, const kv_shard *sh,
                       const kv_seq *seqs, int n_seqs, float *logits, kv_counters *cnt,
                       kv_err *err)
{
    if (!m || !c || !s)
        return kv_fail(err, KV_ERR_ARG, "kvcu_forward: NULL model, cache or state");
    const kv_config *p = &m->config;
    const kv_weights *w = &m->w; /* device pointers */
    int T = 0;
    KVCU_TRY(kv_batch_check("kvcu_forward", p, sh, c, seqs, n_seqs, &T, err));
    if (c->tables) /* paged: every row written must fall in the slot's mapped blocks */
        KVCU_TRY(kv_cache_check_rows("kvcu_forward", c, seqs, n_seqs, err));
    if (c->spec.retain.select && sh) /* chapter 09's state is sized by the whole model's heads */
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_forward: %s retention on a "
                       "tensor-parallel shard is not supported",
                       kv_select_method_name(c->spec.retain.select));
    if (c->spec.retain.select && !c->retain) /* the engine composes the two */
        return kv_fail(err, KV_ERR_ARG, "kvcu_forward: the cache's spec selects with %s but it "
                       "has no retention state (build it with kvcu_retain_cache_create())",
                       kv_select_method_name(c->spec.retain.select));
    int logit_rows = n_seqs; /* rows of device logits: the last rows, or an all_logits chunk */
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].all_logits && seqs[i].n_tokens > logit_rows) logit_rows = seqs[i].n_tokens;

    const int dim = p->dim, H = p->n_heads, d = kv_config_head_dim(p), span = c->span;
    const int qdim = H * d, kvdim = kv_config_kv_dim(p), hidden = p->hidden_dim;
    const float eps = p->norm_eps;
    /* chapter 10: the rank's query heads q0.., KV heads kv0.. and hidden units f0.. (the
     * whole model without a shard); qs, kvs: widths of its q and k/v rows */
    const int Hs = sh ? sh->n_q_heads : H, KVs = c->n_kv_heads; /* the cache's: checked above */
    const int q0 = sh ? sh->q_head0 : 0, kv0 = sh ? sh->kv_head0 : 0;
    const int f0 = sh ? sh->hidden0 : 0, fs = sh ? sh->n_hidden : hidden;
    const int qs = Hs * d, kvs = KVs * d;
    const int W = c->spec.window.size, S = c->spec.window.n_sinks;
    const int keys_at_cache_pos = W > 0 && c->spec.window.pos_scheme == KV_POS_CACHE;
    /* attention rows per launch: all of them, unless their scores would pass KVCU_SCORES_MAX
     * (or the rows would pass the grid's 65535 limit in y) */
    const size_t per_row = kvcu_attention_scratch(1, H, d, span);
    size_t rows_fit = KVCU_SCORES_MAX / per_row;
    if (rows_fit < 1) rows_fit = 1;
    if (rows_fit > KVCU_ATTN_MAX_ROWS) rows_fit = KVCU_ATTN_MAX_ROWS;
    const int rows = (size_t)T <= rows_fit ? T : (int)rows_fit;
    KVCU_TRY(state_reserve(s, p, T, n_seqs, rows, span, logit_rows, err));
    float *x = (float *)s->x.p, *xb = (float *)s->xb.p, *xb2 = (float *)s->xb2.p;
    float *q = (float *)s->q.p, *k = (float *)s->k.p, *v = (float *)s->v.p;
    float *hb = (float *)s->hb.p, *hb2 = (float *)s->hb2.p, *xlast = (float *)s->xlast.p;
    const uint16_t *x16 = NULL; /* the 16-bit copy of the layer input a product reads */

    /* flatten on the host: row t is token j of sequence i, at position pos + j of its slot,
     * its query rotated at q_pos; last[i] is the row of sequence i's last token. */
    int *tok = s->host_ints, *slot = tok + T, *pos = slot + T, *q_pos = pos + T;
    int *last = q_pos + T, *wave_rows = last + n_seqs;      /* uploaded: [5T + n_seqs] */
    int *wave_start = wave_rows + T, *chunk_start = wave_start + T + 1; /* [n_waves + 1] */
    int *chunks = chunk_start + T + 1, *done = chunks + 4 * (size_t)T;
    int max_len = 0; /* the most positions a row attends: picks the attention kernel */
    for (int i = 0, t = 0; i < n_seqs; i++) {
        const int span_i = (int)kv_window_count(W, S, seqs[i].pos + seqs[i].n_tokens - 1);
        if (span_i > max_len) max_len = span_i;
        for (int j = 0; j < seqs[i].n_tokens; j++, t++) {
            tok[t] = seqs[i].tokens[j];
            slot[t] = seqs[i].slot;
            pos[t] = seqs[i].pos + j;
            q_pos[t] = (int)kv_window_query_pos(W, S, c->spec.window.pos_scheme, seqs[i].pos + j);
        }
        last[i] = t - 1;
    }
    /* the waves (kv_forward.c): wave w lists its rows wave_rows[wave_start[w] ..] and its
     * per-sequence chunks chunks[4 c ..] = {slot, first position, tokens, first row} for
     * c in chunk_start[w] .. chunk_start[w+1]-1 */
    int n_waves = 0, n_chunks = 0, n_listed = 0;
    for (int i = 0; i < n_seqs; i++) done[i] = 0;
    for (;;) {
        wave_start[n_waves] = n_listed;
        chunk_start[n_waves] = n_chunks;
        for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
            const int left = seqs[i].n_tokens - done[i], p0 = seqs[i].pos + done[i];
            if (left == 0) continue;
            const int n = kv_window_chunk(W, S, p0, left), t0 = t + done[i];
            int *ch = chunks + 4 * (size_t)n_chunks++;
            ch[0] = seqs[i].slot;
            ch[1] = p0;
            ch[2] = n;
            ch[3] = t0;
            for (int j = 0; j < n; j++) wave_rows[n_listed++] = t0 + j;
            done[i] += n;
        }
        if (n_listed == wave_start[n_waves]) break;
        n_waves++;
    }
    KV_CUDA_TRY(cudaMemcpy(s->ints.p, tok, (5 * (size_t)T + n_seqs) * sizeof(int),
                           cudaMemcpyHostToDevice), err);
    const int *d_tok = (const int *)s->ints.p, *d_slot = d_tok + T, *d_pos = d_slot + T;
    const int *d_qpos = d_pos + T, *d_last = d_qpos + T, *d_wave = d_last + n_seqs;
    double rope_freq[KV_ROPE_MAX_PAIRS]; /* [rotary_dim/2] the CPU's table (kv_rope_freqs()) */
    kv_rope_freqs(p, rope_freq);

    KVCU_TRY(kvcu_embed(x, w->token_embedding, d_tok, T, dim, err));
    for (int l = 0; l < p->n_layers; l++) {
        /* attention block: x += Wo · attention(RoPE(Wq·xb), cache(RoPE(Wk·xb), Wv·xb)) */
        KVCU_TRY(kvcu_rmsnorm(xb, x, w->rms_att + (size_t)l * dim, T, dim, eps, err));
        KVCU_TRY(stage16(m, s, seqs, n_seqs, xb, T, dim, &x16, err));
        KVCU_TRY(proj(m, seqs, n_seqs, q, xb, x16,
                      w->wq + ((size_t)l * qdim + (size_t)q0 * d) * dim, T, dim, qs, dim, err));
        KVCU_TRY(proj(m, seqs, n_seqs, k, xb, x16,
                      w->wk + ((size_t)l * kvdim + (size_t)kv0 * d) * dim, T, dim, kvs, dim,
                      err));
        KVCU_TRY(proj(m, seqs, n_seqs, v, xb, x16,
                      w->wv + ((size_t)l * kvdim + (size_t)kv0 * d) * dim, T, dim, kvs, dim,
                      err));
        KVCU_TRY(kvcu_rope(q, d_qpos, T, Hs, d, p->rotary_dim, rope_freq, err));
        if (!keys_at_cache_pos) /* KV_POS_CACHE: attention rotates keys by cache index */
            KVCU_TRY(kvcu_rope(k, d_pos, T, KVs, d, p->rotary_dim, rope_freq, err));
        /* every row's K/V of a wave first, so a prefill row can attend to the rows before it */
        if (n_waves == 1) { /* the whole step: one write, rows in order */
            KVCU_TRY(kvcu_cache_write(c, l, seqs, n_seqs, d_slot, d_pos, k, v, T, err));
            /* chapter 09: each KV head reads only what its method keeps or picks, per
             * sequence (kv_retain.h; no window, so the step is this one wave) */
            for (int i = 0, t = 0; c->retain && i < n_seqs; t += seqs[i].n_tokens, i++)
                KVCU_TRY(kvcu_retain_attend(c, l, seqs[i].slot, seqs[i].pos, seqs[i].n_tokens,
                                            q + (size_t)t * qs, xb + (size_t)t * qs, err));
            if (!c->retain)
                KVCU_TRY(step_attention(c, l, s, seqs, n_seqs, d_slot, d_pos, q, xb, T, rows,
                                        Hs, d, W, max_len, err));
        } else {
            for (int wv = 0; wv < n_waves; wv++) {
                for (int ci = chunk_start[wv]; ci < chunk_start[wv + 1]; ci++) {
                    const int *ch = chunks + 4 * (size_t)ci, t0 = ch[3];
                    const kv_seq one = {ch[0], ch[1], ch[2], NULL};
                    KVCU_TRY(kvcu_cache_write(c, l, &one, 1, d_slot + t0, d_pos + t0,
                                              k + (size_t)t0 * kvs, v + (size_t)t0 * kvs,
                                              ch[2], err));
                }
                const int w0 = wave_start[wv], nw = wave_start[wv + 1] - w0;
                for (int r0 = 0; r0 < nw; r0 += rows) {
                    const int nr = nw - r0 < rows ? nw - r0 : rows;
                    KVCU_TRY(kvcu_attention(c, l, d_slot, d_pos, d_wave + w0 + r0, q, xb,
                                            (float *)s->scores.p, nr, Hs, max_len, err));
                }
            }
        }
        /* a rank multiplies its heads' columns of Wo: a partial sum, completed by the
         * all-reduce over the ranks (chapter 10), on the device buffer xb2 */
        KVCU_TRY(stage16(m, s, seqs, n_seqs, xb, T, qs, &x16, err));
        KVCU_TRY(proj(m, seqs, n_seqs, xb2, xb, x16,
                      w->wo + (size_t)l * dim * qdim + (size_t)q0 * d, T, qs, dim, qdim, err));
        if (sh) sh->all_reduce(sh, xb2, (int64_t)T * dim);
        KVCU_TRY(kvcu_add(x, xb2, (int64_t)T * dim, err));

        /* MLP block: x += W2 · (silu(W1·xb) * W3·xb) */
        KVCU_TRY(kvcu_rmsnorm(xb, x, w->rms_ffn + (size_t)l * dim, T, dim, eps, err));
        KVCU_TRY(stage16(m, s, seqs, n_seqs, xb, T, dim, &x16, err));
        KVCU_TRY(proj(m, seqs, n_seqs, hb, xb, x16, w->w1 + ((size_t)l * hidden + f0) * dim, T,
                      dim, fs, dim, err));
        KVCU_TRY(proj(m, seqs, n_seqs, hb2, xb, x16, w->w3 + ((size_t)l * hidden + f0) * dim, T,
                      dim, fs, dim, err));
        KVCU_TRY(kvcu_swiglu(hb, hb2, (int64_t)T * fs, err));
        KVCU_TRY(stage16(m, s, seqs, n_seqs, hb, T, fs, &x16, err));
        KVCU_TRY(proj(m, seqs, n_seqs, xb2, hb, x16, w->w2 + (size_t)l * dim * hidden + f0, T,
                      fs, dim, hidden, err));
        if (sh) sh->all_reduce(sh, xb2, (int64_t)T * dim);
        KVCU_TRY(kvcu_add(x, xb2, (int64_t)T * dim, err));
    }

    /* chapter 10: a sequence that asks for all_logits gets the classifier over each of its
     * rows (consecutive in x), as kv_forward does. Each row is computed alone in both kernels:
     * RMSNorm is one block per row, and matmul v2 (several rows) sums a row in v1's order
     * (one row), so row j equals the logits of a one-token step at pos + j bit for bit. The
     * layers are done with xb: it holds the normed rows. */
    float *dlogits = (float *)s->logits.p;
    for (int i = 0, t = 0; i < n_seqs; t += seqs[i].n_tokens, i++) {
        if (!seqs[i].all_logits) continue;
        const int n = seqs[i].n_tokens;
        KVCU_TRY(kvcu_rmsnorm(xb, x + (size_t)t * dim, w->rms_final, n, dim, eps, err));
        KVCU_TRY(proj(m, NULL, 0, dlogits, xb, NULL, w->wcls, n, dim, p->vocab_size, dim, err));
        KV_CUDA_TRY(cudaMemcpy(seqs[i].all_logits, dlogits,
                               (size_t)n * p->vocab_size * sizeof(float),
                               cudaMemcpyDeviceToHost), err);
    }
    /* only the last token of each sequence needs logits: the next token is chosen from it.
     * Gathering those rows is an embedding lookup with x as the table. */
    if (logits) {
        KVCU_TRY(kvcu_embed(xlast, x, d_last, n_seqs, dim, err));
        KVCU_TRY(kvcu_rmsnorm(xlast, xlast, w->rms_final, n_seqs, dim, eps, err));
        KVCU_TRY(proj(m, NULL, 0, dlogits, xlast, NULL, w->wcls, n_seqs, dim, p->vocab_size,
                      dim, err));
        KV_CUDA_TRY(cudaMemcpy(logits, dlogits, (size_t)n_seqs * p->vocab_size * sizeof(float),
                               cudaMemcpyDeviceToHost), err);
    } else {
        KV_CUDA_TRY(cudaDeviceSynchronize(), err); /* report a failed kernel before it counts */
    }

    for (int i = 0; i < n_seqs; i++) c->len[seqs[i].slot] = seqs[i].pos + seqs[i].n_tokens;
    if (cnt) {
        kv_counters_add_step(cnt, p, &c->spec, seqs, n_seqs);
        /* the formula counts one classifier per sequence, or one per row with all_logits */
        for (int i = 0; i < n_seqs; i++) {
            if (!logits && !seqs[i].all_logits) /* no classifier was run */
                cnt->flops_proj -= 2.0 * (double)dim * p->vocab_size;
            if (logits && seqs[i].all_logits) /* both: the last row's ran twice */
                cnt->flops_proj += 2.0 * (double)dim * p->vocab_size;
        }
    }
    return KV_OK;
}
