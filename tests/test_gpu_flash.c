/* Chapter 08 on the GPU: every version of kvcu_flash_attention() (cuda/attention/kvcu_flash.cu) against the
 * CPU reference kv_flash_naive() (reference_cpu/attention/kv_flash.h) on the same cache contents.
 *
 * The grid: head dim d in {64, 128}, group G in {1, 4, 8} (H_kv 2, H = 2G); cache formats
 * fp32, fp16, bf16 and int8 (int8 exercises the fused dequantization with per-row scales),
 * contiguous and paged (block size 16, a scrambled block table, so a wrong row lookup shows);
 * key counts 1, 17 and 4097, and a decode over 32768 keys; then fp8-e4m3 (both layouts) and
 * int4-KIVI (its fp32 window of 32 newest rows beside quantized older rows) at 77 keys. Per
 * cache, the masks of kv_flash.h: a causal prefill (T = n, q_pos0 0; n <= 64), a causal chunk
 * at the end (q_pos0 = n - T), a decode step, a non-causal block, and a causal block with
 * k_begin > 0 whose first rows see no key at all (they must be exact zeros, never NaN; rows
 * with n_keys 0 as well). Outputs start as NaN, so an element never written fails. A
 * 4097 x 4097 causal prefill runs once per d (fp32, contiguous), so v2's causal tile skipping
 * and v4's ranges meet a long square. The tested cache is layer 1, slot 1 of a 2-layer,
 * 2-slot cache, so a wrong layer or slot offset reads other rows.
 *
 * Tolerance: the CPU and the GPU read identical stored values (kvcu_cache_write_seq writes
 * the CPU's bytes, chapter 04) and compute in fp32; only the order of the sums differs, and
 * the online softmax rescales by exp(m_old - m_new) a few times per row. kv_test.h's fp32
 * bound (atol 1e-5, rtol 1e-4) covers that at these lengths (q, k, v uniform in [-1, 1]:
 * softmax weights sum to 1, each output a convex mix of values) and is not loosened for the
 * narrow formats, whose rounding happened once, identically, when the cache was written.
 * Measured (emulation, fp32 arithmetic as on the GPU): the worst |diff| is about 1% of the
 * bound for a 32768-key decode (d 128, G 8) and for the 4097-token causal prefill.
 *
 * The emulation build runs kernels on CPU fibers, three times (one per schedule mode): there
 * the grid shrinks to what runs in seconds (d 64 with G 1 and 4, G 8 in fp32, d 128 with
 * G 4; lengths 1 and 17 and one 600-key case for v4's two ranges) and the test says so. Also
 * checked: the refusals (windowed cache, bad version, keys past the slot, v1 past its score
 * limit), the scratch sizes, the byte counts (v1's equal kv_flash_naive's; at decode v2 reads
 * G times v3's K/V bytes), a caller's scratch, and (emulation) KV_ERR_NOMEM when the device
 * is full.
 * `test_gpu_flash slow` (label slow, real GPUs only): 32768-token causal prefills, held
 * against kv_flash_tiled, since the naive reference's score matrix would not fit.
 * v5 (tensor cores: q, K, V and P rounded to 16 bits) is held to the same reference by the
 * bound derived at mma_compare() instead of the fp32 tolerance; d 64 and 128 fit it. v6 (v5
 * with 32 rows a warp, the longest query tiles first, int8 and fp8 tiles converted exactly)
 * is held to the same bound, which covers it: it rounds q and P (times an int8 value row's
 * scale) as v5 does and the K and V tiles of the 16-bit and dequantized paths as v5 does; its
 * int8 and fp8 tiles hold the codes exactly, so those terms only loosen the bound there. The
 * extra caches at the end (per-token int8 at d 128 across several 32-key tiles, fp8 E4M3 and
 * E5M2, int8 with one group per row) take v6's converting path, and their causal prefills
 * span several of its query tiles, so the reversed tile order is exercised.
 * Exits 77 (skipped) without a usable device. */
#include "kv_flash.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "kvcu.h"
#ifdef KV_CUDA_EMULATION
#include "kvemu.h"
#endif

#include <stdlib.h>
#include <string.h>

enum { HKV = 2, N_LAYERS = 2, N_SLOTS = 2, LAYER = 1, SLOT = 1, BLOCK = 16 };

static kv_rng rng;
static int emu;
static double mma_worst_frac[2]; /* v5, v6: the largest |diff| seen, as a fraction of the bound */
static int first_ver = 1; /* the first version check_job() runs (5: the tensor-core ones) */
static int tiled_ref; /* 1: the reference is kv_flash_tiled (the slow 32k prefill, whose naive
                       * score matrix would take T·n·4 = 4 GiB per CPU thread) */

/* A CPU cache and a device cache holding the same n rows in layer LAYER, slot SLOT. */
typedef struct {
    kv_config cfg;
    kv_cache c;
    kvcu_cache *g;
    int fmt, paged, d, G, H, n;
    char name[96];
} twin;

static kv_config shape(int d, int G, int capacity)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.n_heads = HKV * G;
    c.n_kv_heads = HKV;
    c.dim = c.n_heads * d;
    c.hidden_dim = 2 * c.dim;
    c.n_layers = N_LAYERS;
    c.vocab_size = 64;
    c.seq_len = capacity;
    c.rope_theta = 10000.0f;
    c.rotary_dim = d;
    c.norm_eps = 1e-5f;
    return c;
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
}

static void *dev_copy(const void *h, size_t bytes, kv_err *e)
{
    void *d = NULL;
    if (kvcu_malloc(&d, bytes, e) || kvcu_upload(d, h, bytes, e)) {
        kvcu_free(d);
        return NULL;
    }
    return d;
}

static void twin_free(twin *w)
{
    kv_cache_free(&w->c);
    kvcu_cache_free(w->g);
    w->g = NULL;
}

/* Build both caches and write n random rows into each. 0 on success (else freed). */
static int twin_make(twin *w, int fmt, int paged, int d, int G, int n)
{
    memset(w, 0, sizeof *w);
    w->fmt = fmt;
    w->paged = paged;
    w->d = d;
    w->G = G;
    w->H = HKV * G;
    w->n = n;
    snprintf(w->name, sizeof w->name, "%s %s d %d G %d n %d", kv_quant_name(fmt),
             paged ? "paged" : "contiguous", d, G, n);
    const int nb = (n + BLOCK - 1) / BLOCK + 1; /* blocks of the slot, and one spare */
    const int cap = paged ? nb * BLOCK : n + 3;
    w->cfg = shape(d, G, cap);
    kv_cache_spec s = kv_cache_spec_default(N_SLOTS, cap);
    s.quant.dtype = fmt;
    s.quant.kivi_window = 32; /* KIVI: rows past the newest 32 are quantized, older ones spill */
    if (paged) {
        s.layout.kind = KV_LAYOUT_PAGED;
        s.layout.block_size = BLOCK;
        s.layout.n_blocks = nb;
    }
    kv_err e = {{0}};
    if (kv_cache_create(&w->c, &w->cfg, &s, &e) || kvcu_cache_create(&w->g, &w->cfg, &s, &e)) {
        KV_CHECK(0, "%s: create: %s", w->name, e.msg);
        twin_free(w);
        return -1;
    }
    int st = KV_OK;
    if (paged) { /* a scrambled table: logical block i -> physical (i * 7 + 3) mod nb */
        int *tab = (int *)malloc((size_t)nb * sizeof(int));
        int m = 0;
        for (int i = 0; i < nb; i++) {
            int b = (int)(((long)i * 7 + 3) % nb);
            if (nb % 7 == 0) b = nb - 1 - i; /* 7 | nb would repeat blocks */
            tab[m++] = b;
        }
        st = kv_cache_set_blocks(&w->c, SLOT, tab, nb, &e);
        if (!st) st = kvcu_cache_set_blocks(w->g, SLOT, tab, nb, &e);
        free(tab);
    }
    const size_t nr = (size_t)n * HKV * d; /* k, v [n][H_kv][d] */
    float *k = (float *)malloc(nr * 4), *v = (float *)malloc(nr * 4);
    float *dk = NULL, *dv = NULL;
    fill(k, nr);
    fill(v, nr);
    if (!st) st = (dk = (float *)dev_copy(k, nr * 4, &e)) ? KV_OK : KV_ERR_NOMEM;
    if (!st) st = (dv = (float *)dev_copy(v, nr * 4, &e)) ? KV_OK : KV_ERR_NOMEM;
    if (!st) st = kv_cache_write_seq(&w->c, LAYER, SLOT, 0, n, k, v, &e);
    if (!st) st = kvcu_cache_write_seq(w->g, LAYER, SLOT, 0, n, dk, dv, &e);
    if (!st) st = kvcu_synchronize(&e);
    free(k);
    free(v);
    kvcu_free(dk);
    kvcu_free(dv);
    KV_CHECK(st == KV_OK, "%s: fill: %s", w->name, e.msg);
    if (st) twin_free(w);
    return st ? -1 : 0;
}


/* v5 and v6 (tensor cores) against the reference: mismatches of got [T][H][d] outside the bound of
 * each row (query t, head h). v5 rounds q, the K and V tiles and P = exp(s - m) to 16 bits
 * (unit roundoff u: 2^-11 for fp16, 2^-8 for the bf16 tiles of a bf16 cache) and keeps the
 * scores, the sums and O in fp32. With every stored value in [-1, 1] (the fill, and every
 * format's dequantization of it), a score s = scale·q·k moves by at most
 *   eps = scale·Σ|q_i|·((2u + u²) + d·2^-23)     (q and k rounded; fp32 dots, both sides),
 * so each softmax weight by a factor within e^(±2 eps) (numerator and sum), the output, a
 * weighted mean of values, by (e^(2 eps) - 1)·max|v|; rounding P (its sum l stays fp32) and
 * V adds u·max|v| each. Bound = (e^(2 eps) - 1)(1 + u) + 2u + u², plus the fp32 tolerance
 * of the online softmax's rescaling (KV_TOL_F32_ATOL). Rows that see no key stay exact 0. */
static long mma_compare(const char *what, const float *got, const float *ref, const float *q,
                        int T, int H, int d, int fmt, int ver)
{
    const double u = fmt == KV_QF_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
    const double scale = 1.0 / sqrt((double)d);
    long bad = 0;
    double worst = 0.0, worst_frac = 0.0;
    for (int r = 0; r < T * H; r++) {
        double qs = 0.0;
        for (int i = 0; i < d; i++) qs += fabs(q[(size_t)r * d + i]);
        const double eps = scale * qs * (2.0 * u + u * u + d * ldexp(1.0, -23));
        const double bound = expm1(2.0 * eps) * (1.0 + u) + 2.0 * u + u * u + KV_TOL_F32_ATOL;
        for (int i = 0; i < d; i++) {
            const size_t e = (size_t)r * d + i;
            const double diff = fabs((double)got[e] - ref[e]);
            if (!(diff <= bound)) {
                if (bad < 5)
                    printf("  %s: row %d dim %d: got %.9g, ref %.9g (|diff| %.3g > %.3g)\n",
                           what, r, i, got[e], ref[e], diff, bound);
                bad++;
            }
            if (diff > worst) worst = diff;
            if (diff / bound > worst_frac) worst_frac = diff / bound;
        }
    }
    if (bad) printf("  %s: %ld mismatched, max |diff| %.3g\n", what, bad, worst);
    if (worst_frac > mma_worst_frac[ver - 5]) mma_worst_frac[ver - 5] = worst_frac;
    return bad;
}

/* One mask on a twin: q random [T][H][d]; every version against kv_flash_naive(). */
static void check_job(twin *w, const char *mask, int T, int64_t q_pos0, int64_t k_begin,
                      int64_t n_keys, int causal)
{
    const size_t nq = (size_t)T * w->H * w->d;
    float *q = (float *)malloc(nq * 4 + 4), *ref = (float *)malloc(nq * 4 + 4);
    float *got = (float *)malloc(nq * 4 + 4);
    float *dq = NULL, *dout = NULL;
    kv_err e = {{0}};
    fill(q, nq);
    kv_flash_job cj = {&w->c, LAYER, SLOT, w->H, q, T, q_pos0, k_begin, n_keys, causal, ref};
    int st = tiled_ref ? kv_flash_tiled(&cj, 64, 64, NULL, &e) : kv_flash_naive(&cj, NULL, &e);
    KV_CHECK(st == KV_OK, "%s %s: CPU reference: %s", w->name, mask, e.msg);
    if (!st) st = (dq = (float *)dev_copy(q, nq * 4, &e)) ? KV_OK : KV_ERR_NOMEM;
    if (!st) st = kvcu_malloc((void **)&dout, nq * 4, &e);
    KV_CHECK(st == KV_OK, "%s %s: device buffers: %s", w->name, mask, e.msg);
    kvcu_flash_job gj = {w->g, LAYER, SLOT, w->H, dq, T, q_pos0, k_begin, n_keys, causal, dout};
    for (int ver = first_ver; ver <= 6 && !st; ver++) {
        char what[192];
        snprintf(what, sizeof what, "%s %s (T %d, q_pos0 %lld, keys %lld..%lld, %s) v%d",
                 w->name, mask, T, (long long)q_pos0, (long long)k_begin, (long long)n_keys,
                 causal ? "causal" : "full", ver);
        if (ver == 1 && (int64_t)w->H * T * n_keys > KVCU_FLASH_V1_MAX_SCORES) continue;
        if (ver >= 5 && kvcu_device_sm() < 80) { /* no tensor cores: refused, naming the GPU */
            const int rc = kvcu_flash_attention(ver, &gj, NULL, &e);
            KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "sm_80"),
                     "%s: refused below sm_80 (%d: %s)", what, rc, e.msg);
            continue;
        }
        /* poison the output: every element must be written */
        for (size_t i = 0; i < nq; i++) got[i] = NAN;
        int rc = kvcu_upload(dout, got, nq * 4, &e);
        if (!rc) rc = kvcu_flash_attention(ver, &gj, NULL, &e);
        if (!rc) rc = kvcu_download(got, dout, nq * 4, &e);
        KV_CHECK(rc == KV_OK, "%s: %s", what, e.msg);
        if (rc) continue;
        if (ver >= 5)
            KV_CHECK(mma_compare(what, got, ref, q, T, w->H, w->d, w->fmt, ver) == 0,
                     "%s: tensor cores vs kv_flash_naive, outside the bound", what);
        else
            KV_CHECK(kv_test_compare(what, got, ref, (long)nq, KV_TOL_F32_ATOL,
                                     KV_TOL_F32_RTOL) == 0, "%s: GPU vs kv_flash_naive", what);
        /* rows that see no key: exact zeros on both sides */
        long masked = 0, nonzero = 0;
        for (int t = 0; t < T; t++) {
            int64_t end = causal && q_pos0 + t + 1 < n_keys ? q_pos0 + t + 1 : n_keys;
            if (end > k_begin) continue;
            masked++;
            for (size_t i = (size_t)t * w->H * w->d; i < (size_t)(t + 1) * w->H * w->d; i++)
                nonzero += got[i] != 0.0f || ref[i] != 0.0f;
        }
        KV_CHECK(nonzero == 0, "%s: %ld of the %ld fully masked rows' outputs are not 0", what,
                 nonzero, masked);
    }
    kvcu_free(dq);
    kvcu_free(dout);
    free(q);
    free(ref);
    free(got);
}

/* The masks of one cache of n keys (the whole causal prefill only while it is short). */
static void check_masks(twin *w)
{
    const int n = w->n;
    const int T = n < 17 ? n : 17;
    if (n <= 64) check_job(w, "causal prefill", n, 0, 0, n, 1);
    check_job(w, "causal chunk at the end", T, n - T, 0, n, 1);
    check_job(w, "decode", 1, n - 1, 0, n, 1);
    check_job(w, "not causal", T, 3, 0, n, 0);
    /* k_begin 5: queries at positions 0..4 see nothing (causal), the rest keys 5..p */
    if (n > 5) check_job(w, "k_begin, masked rows", 9 < n ? 9 : n, 0, 5, n, 1);
    check_job(w, "n_keys 0", 3, 0, 0, 0, 1);
}

/* Refusals, scratch sizes, a caller's scratch, and running out of device memory. */
static void check_contract(void)
{
    twin w;
    if (twin_make(&w, KV_QF_F32, 0, 64, 4, 40)) return;
    kv_err e = {{0}};
    float *dq = NULL, *dout = NULL, *sc = NULL;
    const int T = 8;
    const size_t nq = (size_t)T * w.H * w.d;
    float *q = (float *)malloc(nq * 4), *a = (float *)malloc(nq * 4), *b = (float *)malloc(nq * 4);
    fill(q, nq);
    int st = (dq = (float *)dev_copy(q, nq * 4, &e)) ? KV_OK : KV_ERR_NOMEM;
    if (!st) st = kvcu_malloc((void **)&dout, nq * 4, &e);
    KV_CHECK(st == KV_OK, "contract: buffers: %s", e.msg);
    kvcu_flash_job j = {w.g, LAYER, SLOT, w.H, dq, T, 32, 0, 40, 1, dout};

    KV_CHECK(kvcu_flash_attention(0, &j, NULL, &e) == KV_ERR_ARG, "version 0 refused");
    KV_CHECK(kvcu_flash_attention(7, &j, NULL, &e) == KV_ERR_ARG, "version 7 refused");
    kvcu_flash_job bad = j;
    bad.n_heads = HKV * 65; /* a group of 65 heads: more than v5's 64 rows per block */
    KV_CHECK(kvcu_flash_attention(5, &bad, NULL, &e) == KV_ERR_UNSUPPORTED,
             "v5 refuses a group of 65 heads");
    KV_CHECK(kvcu_flash_attention(6, &bad, NULL, &e) == KV_ERR_UNSUPPORTED,
             "v6 refuses a group of 65 heads");
    KV_CHECK(kvcu_flash_scratch(5, &j) == 0 && kvcu_flash_scratch(6, &j) == 0,
             "v5, v6 need no scratch");
    bad = j;
    bad.n_keys = w.c.spec.capacity + 1;
    KV_CHECK(kvcu_flash_attention(2, &bad, NULL, &e) == KV_ERR_ARG, "keys past the slot refused");
    bad = j;
    bad.n_heads = w.H + 1;
    KV_CHECK(kvcu_flash_attention(3, &bad, NULL, &e) == KV_ERR_ARG, "H not a multiple of H_kv");
    bad = j;
    bad.layer = N_LAYERS;
    KV_CHECK(kvcu_flash_attention(4, &bad, NULL, &e) == KV_ERR_ARG, "layer out of range");
    bad = j;
    bad.T = 1 << 22; /* H 8 x T 2^22 x 40 keys > 2^28 scores: refused before any use of q */
    KV_CHECK(kvcu_flash_attention(1, &bad, NULL, &e) == KV_ERR_UNSUPPORTED,
             "v1 past its score limit refused");
    KV_CHECK(kvcu_flash_scratch(1, &j) == (size_t)w.H * T * 41, "v1 scratch H*T*(n_keys+1)");
    KV_CHECK(kvcu_flash_scratch(2, &j) == 0 && kvcu_flash_scratch(3, &j) == 0,
             "v2, v3 need no scratch");
    KV_CHECK(kvcu_flash_scratch(4, &j) == (size_t)T * w.H * 1 * (w.d + 2),
             "v4 scratch T*H*n_splits*(d+2)");
    bad = j;
    bad.T = 0;
    KV_CHECK(kvcu_flash_attention(2, &bad, NULL, &e) == KV_OK, "T 0 is a no-op");

    /* bytes: v1's scores, Q and output count as kv_flash_naive's; its K/V do not. v1 runs a
     * block per (query, head) that reads the K, then the V, rows its query sees: query t of
     * this job (q_pos0 32, 40 keys, causal) sees 33 + t keys, so the 8 queries read
     * 33 + ... + 40 = 292 rows of K and of V per head, where kv_flash_naive's key-outer loop
     * reads each of the 40 once per head. At decode v3 reads G times fewer K/V bytes than v2
     * (one read per KV head, not per query head), and v4 the same as v3 */
    kv_flash_stats sg[5], sn;
    kv_flash_job cj = {&w.c, LAYER, SLOT, w.H, q, T, 32, 0, 40, 1, a};
    memset(&sn, 0, sizeof sn); /* the CPU adds its counts into *st */
    int bst = kv_flash_naive(&cj, &sn, &e);
    for (int ver = 1; ver <= 4 && !bst; ver++) bst = kvcu_flash_bytes(ver, &j, &sg[ver], &e);
    KV_CHECK(bst == KV_OK, "bytes: %s", e.msg);
    if (!bst) {
        KV_CHECK(sg[1].score_bytes == sn.score_bytes && sg[1].q_bytes == sn.q_bytes &&
                     sg[1].out_bytes == sn.out_bytes,
                 "v1 score, Q, output bytes == kv_flash_naive's: scores %lld/%lld",
                 (long long)sg[1].score_bytes, (long long)sn.score_bytes);
        KV_CHECK(sg[1].kv_bytes == (int64_t)w.H * 2 * 292 * w.d * 4 &&
                     sn.kv_bytes == (int64_t)w.H * 2 * 40 * w.d * 4,
                 "K/V bytes: v1 %lld = H x 2 x 292 rows, kv_flash_naive %lld = H x 2 x 40 rows",
                 (long long)sg[1].kv_bytes, (long long)sn.kv_bytes);
        kvcu_flash_job dj = j;
        dj.T = 1;
        dj.q_pos0 = 39;
        bst = kvcu_flash_bytes(2, &dj, &sg[2], &e) || kvcu_flash_bytes(3, &dj, &sg[3], &e) ||
              kvcu_flash_bytes(4, &dj, &sg[4], &e);
        KV_CHECK(!bst && sg[2].kv_bytes == (int64_t)w.G * sg[3].kv_bytes &&
                     sg[2].kv_bytes == (int64_t)w.H * 2 * 40 * w.d * 4 &&
                     sg[4].kv_bytes == sg[3].kv_bytes,
                 "decode K/V bytes: v2 %lld = G x v3 %lld = v4 %lld", (long long)sg[2].kv_bytes,
                 (long long)sg[3].kv_bytes, (long long)sg[4].kv_bytes);
    }

    /* the caller's scratch gives the bits of an allocated one */
    for (int ver = 1; ver <= 4 && !st; ver += 3) {
        st = kvcu_flash_attention(ver, &j, NULL, &e);
        if (!st) st = kvcu_download(a, dout, nq * 4, &e);
        if (!st) st = kvcu_malloc((void **)&sc, kvcu_flash_scratch(ver, &j) * 4, &e);
        if (!st) st = kvcu_flash_attention(ver, &j, sc, &e);
        if (!st) st = kvcu_download(b, dout, nq * 4, &e);
        KV_CHECK(st == KV_OK && memcmp(a, b, nq * 4) == 0, "v%d: caller's scratch == own (%s)",
                 ver, st ? e.msg : "ok");
        kvcu_free(sc);
        sc = NULL;
    }
#ifdef KV_CUDA_EMULATION
    /* a full device: the scratch allocation fails with KV_ERR_NOMEM, nothing launched */
    kvemu_set_mem_limit(kvemu_mem_in_use() + 64);
    KV_CHECK(kvcu_flash_attention(1, &j, NULL, &e) == KV_ERR_NOMEM, "v1, device full: NOMEM");
    KV_CHECK(kvcu_flash_attention(4, &j, NULL, &e) == KV_ERR_NOMEM, "v4, device full: NOMEM");
    kvemu_set_mem_limit(0);
    KV_CHECK(kvcu_flash_attention(4, &j, NULL, &e) == KV_OK, "v4 after the device is freed: %s",
             e.msg);
#endif
    twin_free(&w);

    /* a windowed cache is refused */
    kv_config cfg = shape(64, 1, 64);
    kv_cache_spec s = kv_cache_spec_default(1, 64);
    s.window.size = 16;
    kvcu_cache *g = NULL;
    st = kvcu_cache_create(&g, &cfg, &s, &e);
    KV_CHECK(st == KV_OK, "windowed cache: %s", e.msg);
    if (!st) {
        kvcu_flash_job wj = {g, 0, 0, HKV, dq, 1, 0, 0, 1, 1, dout};
        KV_CHECK(kvcu_flash_attention(2, &wj, NULL, &e) == KV_ERR_UNSUPPORTED,
                 "windowed cache refused");
    }
    kvcu_cache_free(g);
    kvcu_free(dq);
    kvcu_free(dout);
    free(q);
    free(a);
    free(b);
}

/* `slow`: causal prefills of 32768 tokens against kv_flash_tiled (which test_flash holds
 * against kv_flash_naive); v1 refuses them (H·T·n scores past its limit). */
static int run_slow(void)
{
    if (emu) {
        printf("the 32k-token prefill runs on a real GPU only (emulated fibers are too slow "
               "for it): skipped\n");
        return KV_TEST_SKIP;
    }
    tiled_ref = 1;
    const int cases[][4] = {{128, 4, KV_QF_F32, 0}, {64, 8, KV_QF_BF16, 1}}; /* d, G, fmt, paged */
    for (int i = 0; i < 2; i++) {
        twin w;
        if (twin_make(&w, cases[i][2], cases[i][3], cases[i][0], cases[i][1], 32768)) continue;
        check_job(&w, "causal prefill", 32768, 0, 0, 32768, 1);
        twin_free(&w);
    }
    return kv_test_finish();
}

int main(int argc, char **argv)
{
    kv_err e = {{0}};
    if (kvcu_device_available(&e) != KV_OK) {
        printf("no usable CUDA device (%s): skipped\n", e.msg);
        return KV_TEST_SKIP;
    }
    kv_rng_seed(&rng, 8);
    emu = kvcu_is_emulation();
    if (argc > 1 && !strcmp(argv[1], "slow")) return run_slow();
    const int formats[] = {KV_QF_F32, KV_QF_F16, KV_QF_BF16, KV_QF_INT8};
    const int Gs[] = {1, 4, 8};
    const int ds[] = {64, 128};
    if (emu)
        printf("emulation build: a reduced grid (d 64 with G 1 and 4, and 8 in fp32; d 128 with "
               "G 4; lengths 1, 17 and 600; no 4097 or 32768 keys); a real GPU runs the full "
               "one\n");

    check_contract();
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 3; gi++)
            for (int fi = 0; fi < 4; fi++)
                for (int paged = 0; paged <= 1; paged++) {
                    const int d = ds[di], G = Gs[gi], fmt = formats[fi];
                    if (emu && ((G == 8 && (fmt != KV_QF_F32 || d == 128)) ||
                                (d == 128 && G != 4)))
                        continue;
                    const int lens[] = {1, 17, 4097};
                    for (int li = 0; li < 3; li++) {
                        if (emu && li == 2) continue;
                        twin w;
                        if (twin_make(&w, fmt, paged, d, G, lens[li])) continue;
                        check_masks(&w);
                        twin_free(&w);
                    }
                }
    /* the other storage families through the same views: fp8 with its per-sequence scale
     * (both layouts), KIVI int4 (contiguous; paged KIVI needs 32 | B), whose newest rows
     * sit in an fp32 window while the older ones are quantized, and int4-g32 (two codes a
     * byte, a scale per 32 channels: v5 and v6 dequantize its tiles element by element) */
    const int more[][2] = {{KV_QF_FP8_E4M3, 0}, {KV_QF_FP8_E4M3, 1}, {KV_QF_INT4_KIVI, 0},
                           {KV_QF_INT4_G32, 1}};
    for (int i = 0; i < 4; i++) {
        twin w;
        if (twin_make(&w, more[i][0], more[i][1], 64, 4, 77)) continue;
        check_masks(&w);
        twin_free(&w);
    }
    /* v6's converting tiles (fmt, paged, d, n): several key tiles, several query tiles; v5
     * and v6 only (the formats' other paths are v1-v4's above) */
    first_ver = 5;
    const int conv[][4] = {{KV_QF_INT8, 1, 128, 77}, {KV_QF_INT8, 0, 64, 100},
                           {KV_QF_FP8_E4M3, 0, 128, 70}, {KV_QF_FP8_E5M2, 1, 64, 77},
                           {KV_QF_INT8_G64, 0, 64, 70}};
    for (int i = 0; i < 5; i++) {
        twin w;
        if (twin_make(&w, conv[i][0], conv[i][1], conv[i][2], 4, conv[i][3])) continue;
        check_job(&w, "causal prefill", w.n, 0, 0, w.n, 1);
        check_job(&w, "k_begin, masked rows", 40, 0, 5, w.n, 1);
        twin_free(&w);
    }
    first_ver = 1;
    if (emu) { /* two ranges of v4, and tiles across a paged table, in emulation too */
        twin w;
        if (!twin_make(&w, KV_QF_F16, 1, 64, 4, 600)) {
            check_job(&w, "decode", 1, 599, 0, 600, 1);
            check_job(&w, "k_begin decode", 2, 598, 37, 600, 1);
            twin_free(&w);
        }
    } else {
        for (int di = 0; di < 2; di++) { /* the long square, and a long decode per d */
            twin w;
            if (!twin_make(&w, KV_QF_F32, 0, ds[di], 4, 4097)) {
                check_job(&w, "causal prefill", 4097, 0, 0, 4097, 1);
                twin_free(&w);
            }
            const int fmts[] = {KV_QF_F32, KV_QF_BF16};
            for (int p = 0; p <= 1; p++)
                if (!twin_make(&w, fmts[p], p, ds[di], 8, 32768)) {
                    check_job(&w, "decode", 1, 32767, 0, 32768, 1);
                    check_job(&w, "k_begin decode", 2, 32766, 1000, 32768, 1);
                    twin_free(&w);
                }
        }
    }
    printf("v5, v6 (tensor cores): the worst |diff| was %.1f%%, %.1f%% of the bound\n",
           100.0 * mma_worst_frac[0], 100.0 * mma_worst_frac[1]);
    return kv_test_finish();
}
