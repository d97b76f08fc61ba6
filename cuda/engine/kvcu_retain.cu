/*
 * Chapter 09 on the GPU: attention over the positions a selection method keeps or reads
 * (reference_cpu/engine/kv_retain.h), the twin of kv_retain_attend(). The method's state lives on
 * the host and is the CPU's own code (kv_retain.c, written once); the device does what costs:
 * reading the cache and attending.
 *
 * One step of one sequence (positions pos0 .. pos0+n-1), one layer, every KV head at once:
 *   1. retain_keys_kernel reads the n new keys back through the cache's head view (kv_ld():
 *      the decode attention runs on them), [H_kv][n][d], for kv_retain_append() on the host;
 *   2. the host lists what each row reads. For the evicting methods (L2, H2O, SnapKV) row j
 *      at p reads the kept positions <= p, a prefix of the head's kept list: the kept list
 *      goes up once and each row gets a count (a dense layer of Quest / top-k likewise, with
 *      the list 0 .. pos0+n-1). Otherwise (Quest, top-k) the step's queries come down and
 *      kv_retain_reads() gives each row its own list, built and uploaded one chunk of rows
 *      at a time, so a long prompt's lists never exist all at once;
 *   3. kvcu_attn_list_launch() (cuda/attention/kvcu_decode.cu) runs the engine's decode
 *      kernel, block (KV head, range, row), for the group's G query heads over the row's
 *      list: position list[i] in place of i, with the same split ranges and merge, so the
 *      list 0 .. p gives the plain decode's bits, and a cache whose budget never evicts gives
 *      the plain kvcu_forward's logits exactly. The merge leaves each listed position's
 *      exp(s - max) and each head's exp-sum for step 4;
 *   4. H2O and SnapKV: retain_mass_kernel, one thread per kept index, adds each listed
 *      position's probabilities in kv_retain.h's order, rows in order from
 *      kv_retain_observe_from(), heads g = 0 .. G-1 within a row, each into a double (the
 *      thread owns its position, so no atomics and no reordering). The mass comes down for
 *      kv_retain_observe(), then kv_retain_step_end() evicts on the host.
 * Rows are attended in chunks whose scores fit KVCU_RETAIN_SCORES_MAX floats; the mass
 * kernel runs after each chunk, in row order, so chunking does not change a bit.
 *
 * The scratch (device and host staging) hangs on the cache and only grows.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_retain.h"
#include "kvcu_internal.cuh"

#define RETAIN_THREADS 128
/* scores of one chunk of rows, [rows][H][stride] + [rows][H] sums: at most 64 MiB */
#ifndef KVCU_RETAIN_SCORES_MAX
#define KVCU_RETAIN_SCORES_MAX ((size_t)1 << 24)
#endif
#define KVCU_RETAIN_MAX_ROWS 65535 /* rows of one launch: its grid's y */

/* Scratch of kvcu_retain_attend(): device buffers and their host staging, grown on demand. */
struct kvcu_retain_scratch {
    float *keys;   size_t keys_n;  /* device [H_kv][n][d] the step's keys, dequantized */
    int *ints;     size_t ints_n;  /* device off [H_kv][n] | cnt [H_kv][n] | lists */
    float *att;    size_t att_n;   /* device [rows][H][stride] exps, [rows][H] sums, then
                                    * the decode's partial states */
    double *mass;  size_t mass_n;  /* device [H_kv][mstride] the step's mass per kept index */
    float *hkeys;  size_t hkeys_n; /* host copy of keys */
    float *hq;     size_t hq_n;    /* host [n][H][d] the step's queries (Quest, top-k) */
    int *hints;    size_t hints_n; /* host staging of ints */
    double *hmass; size_t hmass_n; /* host copy of mass */
    kv_select_set set;             /* host: one row's reads (Quest, top-k) */
};

void kvcu_retain_scratch_free(struct kvcu_retain_scratch *s)
{
    if (!s) return;
    cudaFree(s->keys);
    cudaFree(s->ints);
    cudaFree(s->att);
    cudaFree(s->mass);
    free(s->hkeys);
    free(s->hq);
    free(s->hints);
    free(s->hmass);
    kv_select_set_free(&s->set);
    free(s);
}

/* Make device buffer *p hold @p n elements of @p size bytes (contents not kept). */
static int dgrow(void **p, size_t *cap, size_t n, size_t size, kv_err *err)
{
    if (n <= *cap && *p) return KV_OK;
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    const int rc = kvcu_device_alloc(p, (n ? n : 1) * size, err);
    if (rc) return rc;
    *cap = n;
    return KV_OK;
}

/* The host twin of dgrow (contents kept: the lists grow while they are built). */
static int hgrow(void **p, size_t *cap, size_t n, size_t size, kv_err *err)
{
    if (n <= *cap && *p) return KV_OK;
    size_t m = *cap * 2 > n ? *cap * 2 : n;
    void *q = realloc(*p, (m ? m : 1) * size);
    if (!q) return kv_fail(err, KV_ERR_NOMEM, "kvcu_retain_attend: host memory");
    *p = q;
    *cap = m;
    return KV_OK;
}

/* ---- kernels -------------------------------------------------------------------------------- */

/* Block (j, kvh): key j of the step (position pos0 + j) as attention reads it, to
 * out [H_kv][n][d]. The keys are the grid's x (up to 2^31 - 1 blocks), the heads its y: a
 * prefill step of more than 65535 tokens would not fit in y. */
__global__ void retain_keys_kernel(float *out, attn_src src, int slot, int pos0, int n,
                                   int head_dim)
{
    const int j = blockIdx.x, kvh = blockIdx.y;
    const kv_head_view kh = attn_view(src, KV_QROLE_KEY, head_dim, slot, kvh);
    const float *kf = src.fmt == KV_QF_F32 ? (const float *)(const void *)kh.codes : NULL;
    const int64_t p = (int64_t)pos0 + j, r = kv_view_row(&kh, p);
    float *o = out + ((size_t)kvh * n + j) * head_dim; /* [d] */
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) o[i] = kv_ld(kh, kf, p, r, i);
}

/*
 * Thread i: kept index i of KV head kvh. For rows j0 .. j1-1 of the step (chunk rows from
 * r0) that list it (i < cnt[kvh][j]: a row's list is a prefix of the kept list), adds each
 * head's probability exp(s - max) · (1 / sum), the float kv_select_attend() returns, to
 * mass[kvh][i] in double: rows in order, heads g = 0 .. G-1 within a row.
 */
__global__ void retain_mass_kernel(double *mass, const float *att, const float *sums,
                                   const int *cnt, int kvh, int r0, int j0, int j1, int n,
                                   int n_heads, int G, int stride, int mstride)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= mstride) return;
    double acc = mass[(size_t)kvh * mstride + i];
    for (int j = j0; j < j1; j++) {
        if (i >= cnt[(size_t)kvh * n + j]) continue;
        const size_t h0 = (size_t)(j - r0) * n_heads + (size_t)kvh * G;
        for (int g = 0; g < G; g++) {
            const float inv = 1.0f / sums[h0 + g];
            acc += (double)__fmul_rn(att[(h0 + g) * stride + i], inv);
        }
    }
    mass[(size_t)kvh * mstride + i] = acc;
}

/* ---- the step ---------------------------------------------------------------------------- */

struct kv_retain *kvcu_cache_retain(const kvcu_cache *c) { return c ? c->retain : NULL; }

int kvcu_retain_cache_create(kvcu_cache **out, const kv_config *cfg, const kv_cache_spec *spec,
                             kv_err *err)
{
    int rc = kvcu_cache_create(out, cfg, spec, err);
    if (rc || spec->retain.select == KV_SELECT_NONE) return rc;
    kvcu_cache *c = *out;
    rc = kv_retain_create(&c->retain, spec, c->n_layers, cfg->n_heads, c->n_kv_heads,
                          c->head_dim, err);
    if (rc) {
        kvcu_cache_free(c);
        *out = NULL;
    }
    return rc;
}

void kvcu_retain_cache_free(kvcu_cache *c)
{
    if (!c) return;
    kv_retain_free(c->retain);
    c->retain = NULL;
    kvcu_retain_scratch_free(c->rscratch);
    c->rscratch = NULL;
    kvcu_cache_free(c);
}


/* Entries of the ascending @p pos [n] that are <= p. */
static int count_upto(const int *pos, int n, int p)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (pos[mid] <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Prefix mode (an evicting method, or a dense layer of Quest / top-k): row j at p reads the
 * first cnt entries of one list per head, its kept list (the kept positions <= p) or
 * 0 .. pos0+n-1 (every position <= p). Host s->hints = off [H_kv][n] | cnt [H_kv][n] | lists,
 * uploaded. Returns the longest row's count in *stride and the longest list in *mstride. */
static int lists_prefix(kvcu_cache *c, int layer, int slot, int pos0, int n, int evicts,
                        int *stride, int *mstride, int64_t *read, int64_t *full, kv_err *err)
{
    struct kvcu_retain_scratch *s = c->rscratch;
    const kv_retain *r = c->retain;
    const int Hkv = c->n_kv_heads, len = pos0 + n;
    const size_t hn = (size_t)Hkv * n;
    size_t n_ints = 2 * hn;
    int rc = hgrow((void **)&s->hints, &s->hints_n, n_ints, sizeof(int), err);
    for (int kvh = 0; kvh < Hkv && !rc; kvh++) {
        const kv_retain_head *hd = kv_retain_at(r, slot, layer, kvh);
        const int kn = evicts ? hd->kept.n : len;
        size_t base = 0; /* a dense layer's heads share one list 0 .. len-1 */
        if (evicts || kvh == 0) {
            base = n_ints - 2 * hn;
            if ((rc = hgrow((void **)&s->hints, &s->hints_n, n_ints + kn, sizeof(int), err)))
                break;
            int *l = s->hints + n_ints;
            if (evicts) memcpy(l, hd->kept.pos, (size_t)kn * sizeof(int));
            else for (int t = 0; t < kn; t++) l[t] = t;
            n_ints += kn;
        }
        if (kn > *mstride) *mstride = kn;
        for (int j = 0; j < n; j++) {
            const int p = pos0 + j, m = evicts ? count_upto(hd->kept.pos, kn, p) : p + 1;
            s->hints[(size_t)kvh * n + j] = (int)base;
            s->hints[hn + (size_t)kvh * n + j] = m;
            if (m > *stride) *stride = m;
            *read += m;
            *full += p + 1;
        }
    }
    if (!rc) rc = dgrow((void **)&s->ints, &s->ints_n, n_ints, sizeof(int), err);
    if (!rc && kvcu_clear_error(cudaMemcpy(s->ints, s->hints, n_ints * sizeof(int),
                                           cudaMemcpyHostToDevice)))
        rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: the lists did not go up");
    return rc;
}

/* Query-aware mode (Quest, top-k): rows r0 .. r0+nr-1 each get kv_retain_reads()'s list for
 * the group's queries s->hq; s->hints = off [H_kv][nr] | cnt [H_kv][nr] | lists, uploaded.
 * *stride: the chunk's longest list. */
static int lists_chunk(kvcu_cache *c, int layer, int slot, int pos0, int n, int r0, int nr,
                       int *stride, int64_t *read, int64_t *full, kv_err *err)
{
    struct kvcu_retain_scratch *s = c->rscratch;
    kv_retain *r = c->retain;
    const int Hkv = c->n_kv_heads, d = c->head_dim, G = r->group, H = G * Hkv;
    const size_t hn = (size_t)Hkv * nr;
    size_t n_ints = 2 * hn;
    (void)n;
    int rc = hgrow((void **)&s->hints, &s->hints_n, n_ints, sizeof(int), err);
    *stride = 1;
    for (int jj = 0; jj < nr && !rc; jj++)
        for (int kvh = 0; kvh < Hkv && !rc; kvh++) {
            const int j = r0 + jj, p = pos0 + j;
            const float *qg = s->hq + ((size_t)j * H + (size_t)kvh * G) * d; /* [G][d] */
            if ((rc = kv_retain_reads(r, slot, layer, kvh, p, qg, &s->set, err))) break;
            const int m = s->set.n;
            if ((rc = hgrow((void **)&s->hints, &s->hints_n, n_ints + m, sizeof(int), err)))
                break;
            memcpy(s->hints + n_ints, s->set.pos, (size_t)m * sizeof(int));
            s->hints[(size_t)kvh * nr + jj] = (int)(n_ints - 2 * hn);
            s->hints[hn + (size_t)kvh * nr + jj] = m;
            n_ints += m;
            if (m > *stride) *stride = m;
            *read += m;
            *full += p + 1;
        }
    if (!rc) rc = dgrow((void **)&s->ints, &s->ints_n, n_ints, sizeof(int), err);
    if (!rc && kvcu_clear_error(cudaMemcpy(s->ints, s->hints, n_ints * sizeof(int),
                                           cudaMemcpyHostToDevice)))
        rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: the lists did not go up");
    return rc;
}

int kvcu_retain_attend(kvcu_cache *c, int layer, int slot, int pos0, int n, const float *q,
                       float *out, kv_err *err)
{
    if (!c || !c->retain)
        return kv_fail(err, KV_ERR_ARG, "kvcu_retain_attend: the cache has no retention "
                       "(spec.retain.select is 0)");
    kv_retain *r = c->retain;
    if (layer < 0 || layer >= c->n_layers || slot < 0 || slot >= c->spec.n_slots || n < 0 ||
        pos0 < 0 || (int64_t)pos0 + n > c->spec.capacity)
        return kv_fail(err, KV_ERR_ARG, "kvcu_retain_attend: layer %d, slot %d, positions "
                       "%d + %d", layer, slot, pos0, n);
    if (n == 0) return KV_OK;
    if (!c->rscratch) {
        c->rscratch = (struct kvcu_retain_scratch *)calloc(1, sizeof *c->rscratch);
        if (!c->rscratch) return kv_fail(err, KV_ERR_NOMEM, "kvcu_retain_attend: host memory");
    }
    struct kvcu_retain_scratch *s = c->rscratch;
    const int Hkv = c->n_kv_heads, d = c->head_dim, G = r->group, H = G * Hkv, len = pos0 + n;
    const int evicts = kv_select_method_evicts(r->method);
    const int prefix = evicts || layer < r->dense_layers;
    const attn_src src = cache_src(c, layer);
    if (!kvcu_decode_supported(src, H, d))
        return kv_fail(err, KV_ERR_UNSUPPORTED, "kvcu_retain_attend: the decode kernel does "
                       "not read a group of %d heads of dim %d", G, d);
    int rc;

    /* 1. the new keys as attention reads them, appended on the host */
    const size_t nk = (size_t)Hkv * n * d;
    if ((rc = dgrow((void **)&s->keys, &s->keys_n, nk, sizeof(float), err)) ||
        (rc = hgrow((void **)&s->hkeys, &s->hkeys_n, nk, sizeof(float), err)))
        return rc;
    KV_LAUNCH(retain_keys_kernel, dim3(n, Hkv), RETAIN_THREADS, 0, 0, s->keys, src, slot, pos0,
              n, d);
    KV_CUDA_TRY_LAUNCH(err);
    KV_CUDA_TRY(cudaMemcpy(s->hkeys, s->keys, nk * sizeof(float), cudaMemcpyDeviceToHost), err);
    for (int kvh = 0; kvh < Hkv; kvh++)
        if ((rc = kv_retain_append(r, slot, layer, kvh, pos0, n, s->hkeys + (size_t)kvh * n * d,
                                   err)))
            return rc;

    /* 2. the lists: once for the step (prefix mode), or per chunk of rows after the queries
     * came down (Quest, top-k). stride: the longest list a chunk may hold, which sizes the
     * scores: exact in prefix mode, else G·B + one page (a Quest row: G heads' B / P pages and
     * the page of p; top-k: G heads' B keys), at most len. */
    int64_t rows_read = 0, rows_full = 0;
    int stride = 1, mstride = 1, any_obs = 0;
    int *from = (int *)malloc((size_t)Hkv * sizeof(int)); /* [H_kv] first observed row */
    if (!from) return kv_fail(err, KV_ERR_NOMEM, "kvcu_retain_attend: host memory");
    for (int kvh = 0; kvh < Hkv; kvh++) {
        from[kvh] = evicts ? kv_retain_observe_from(r, slot, layer, kvh) : n;
        any_obs |= from[kvh] < n;
    }
    if (prefix) {
        rc = lists_prefix(c, layer, slot, pos0, n, evicts, &stride, &mstride, &rows_read,
                          &rows_full, err);
    } else {
        const size_t nq = (size_t)n * H * d;
        rc = hgrow((void **)&s->hq, &s->hq_n, nq, sizeof(float), err);
        if (!rc && kvcu_clear_error(cudaMemcpy(s->hq, q, nq * sizeof(float),
                                               cudaMemcpyDeviceToHost)))
            rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: the queries did not come "
                         "down");
        const int64_t most = (int64_t)G * kv_retain_budget(r, len) + KV_SELECT_PAGE;
        stride = most < len ? (int)most : len;
    }

    /* 3, 4. attention in chunks of rows, the mass after each chunk in row order */
    const size_t per_row =
        (size_t)H * ((size_t)stride + 1) + kvcu_decode_scratch(1, H, d, stride);
    size_t fit = KVCU_RETAIN_SCORES_MAX / per_row;
    if (fit < 1) fit = 1;
    if (fit > KVCU_RETAIN_MAX_ROWS) fit = KVCU_RETAIN_MAX_ROWS;
    const int rows = (size_t)n <= fit ? n : (int)fit;
    if (!rc) rc = dgrow((void **)&s->att, &s->att_n, (size_t)rows * per_row, sizeof(float), err);
    if (!rc && any_obs)
        rc = dgrow((void **)&s->mass, &s->mass_n, (size_t)Hkv * mstride, sizeof(double), err);
    if (!rc && any_obs &&
        kvcu_clear_error(cudaMemset(s->mass, 0, (size_t)Hkv * mstride * sizeof(double))))
        rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: cudaMemset failed");
    float *sums = rc ? NULL : s->att + (size_t)rows * H * stride; /* [rows][H] */
    float *parts = rc ? NULL : sums + (size_t)rows * H;             /* the partial states */
    for (int r0 = 0; r0 < n && !rc; r0 += rows) {
        const int nr = n - r0 < rows ? n - r0 : rows;
        int cs = stride; /* this chunk's score stride */
        if (!prefix &&
            (rc = lists_chunk(c, layer, slot, pos0, n, r0, nr, &cs, &rows_read, &rows_full, err)))
            break;
        const int ni = prefix ? n : nr, j0 = prefix ? 0 : r0; /* rows off and cnt cover */
        const int *d_off = s->ints, *d_cnt = d_off + (size_t)Hkv * ni;
        const int *d_lists = d_cnt + (size_t)Hkv * ni;
        if (!kvcu_attn_list_launch(nr, out, q, src, s->att, sums, parts, d_off, d_cnt, d_lists,
                                   slot, r0, j0, ni, H, d, cs)) {
            rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: the decode kernel's shared "
                         "memory was refused on this device");
            break;
        }
        for (int kvh = 0; kvh < Hkv; kvh++) {
            const int a = from[kvh] > r0 ? from[kvh] : r0, b = r0 + nr;
            if (a >= b) continue;
            KV_LAUNCH(retain_mass_kernel, kv_ceil_div(mstride, RETAIN_THREADS), RETAIN_THREADS,
                      0, 0, s->mass, s->att, sums, d_cnt, kvh, r0, a, b, n, H, G, cs, mstride);
        }
        if (cudaGetLastError() != cudaSuccess)
            rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: a launch failed");
    }

    /* 5. observe and evict on the host */
    if (!rc && any_obs) {
        const size_t nm = (size_t)Hkv * mstride;
        rc = hgrow((void **)&s->hmass, &s->hmass_n, nm, sizeof(double), err);
        if (!rc && kvcu_clear_error(cudaMemcpy(s->hmass, s->mass, nm * sizeof(double),
                                               cudaMemcpyDeviceToHost)))
            rc = kv_fail(err, KV_ERR_DEVICE, "kvcu_retain_attend: the mass did not come back");
        for (int kvh = 0; kvh < Hkv && !rc; kvh++)
            if (from[kvh] < n)
                kv_retain_observe(r, slot, layer, kvh, s->hmass + (size_t)kvh * mstride);
    }
    free(from);
    if (rc) return rc;
    int64_t evicted = 0;
    for (int kvh = 0; kvh < Hkv; kvh++) {
        const int e = kv_retain_step_end(r, slot, layer, kvh);
        if (e < 0) return kv_fail(err, KV_ERR_NOMEM, "kvcu_retain_attend: eviction scratch");
        evicted += e;
    }
    kv_retain_stats *st = &r->stats[slot];
    st->rows_read += rows_read;
    st->rows_full += rows_full;
    st->evicted += evicted;
    return KV_OK;
}
