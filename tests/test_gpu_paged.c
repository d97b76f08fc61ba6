/* Chapter 05 on the GPU: the paged device cache against the paged CPU cache.
 *
 * For every cache format and block size B in {8, 16, 32} (KIVI only at 32, its groups need
 * 32 | B), with GQA (H 4, H_kv 2):
 *  - a poison sequence first writes NaN into every row of the pool, then sequence 0 writes a
 *    prefill and single tokens through a random block table, sequence 1 forks it mid-block
 *    (its table aliases sequence 0's full blocks, the partial last block is copied on write,
 *    kv_cache_fork_slot takes the fp8 scales and the KIVI window), and both continue with
 *    different tokens; lengths are not multiples of B;
 *  - the device buffer then equals the CPU's byte for byte (codes, metadata, scales, windows,
 *    the poison left in unused rows and in the unused tail of each last block);
 *  - attention of both sequences, every kernel version: within the fp32 tolerance of the CPU
 *    (identical stored values, another summation order), finite (no poison leaks), and bit
 *    for bit equal to the same kernel over a contiguous device cache holding the same tokens;
 *    v3 with one partition equals v2 bit for bit.
 * Then: v3 over contexts of several 512-position partitions, paged and contiguous, every
 * format; kvcu_cache_copy_blocks on lists with chains and repeats == kv_cache_copy_blocks;
 * bad calls refused like the CPU refuses them; the CUDA backend on a paged spec (fork and
 * copy-on-write inside) against the CPU paged backend, greedy tokens and logits (fp32
 * cache; int8 tokens only, see check_backend()), and bit for bit against the CUDA backend on
 * a contiguous spec; a prefix-cache hit on the CUDA backend;
 * the engine past one 512-position partition (v3 inside) against the CPU, and a short
 * sequence batched beside a long one bit for bit equal to its solo run.
 *
 * Tolerance: the GPU kernels sum the same fp32 products as the CPU in another order (v3 adds
 * one rescaling by e^(m_j - M) per partition, a few roundings more). A reordered fp32 sum of
 * n terms moves by at most about n·2^-24 of the sum of their magnitudes; with softmax weights
 * summing to 1 and values in [-1, 1] that is ~6e-5 absolute at n = 1000 in the worst case and
 * ~sqrt(n)·2^-24 ~ 2e-6 typically. kv_test.h's fp32 bound (atol 1e-5, rtol 1e-4), which every
 * GPU-vs-CPU fp32 test uses, covers it and is not loosened.
 * Exits 77 (skipped) without a usable device. */
#include "kv_attention.h"
#include "kv_backend.h"
#include "kv_model.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"

#include <stdlib.h>
#include <string.h>

enum { H = 4, HKV = 2, N_LAYERS = 2, WINDOW = 32 };

static kv_rng rng;

static const int formats[] = {KV_QF_F32,      KV_QF_F16,      KV_QF_BF16,      KV_QF_INT8,
                              KV_QF_INT8_G32, KV_QF_INT8_G64, KV_QF_INT8_G128, KV_QF_FP8_E4M3,
                              KV_QF_FP8_E5M2, KV_QF_INT4_KIVI, KV_QF_INT2_KIVI};
#define N_FORMATS (int)(sizeof formats / sizeof formats[0])

static kv_config shape(int d, int L) { return kv_test_config(L, H, HKV, d, 4096); }

/* The smallest head dim a format's groups allow (int8-g64 / g128 need 64 / 128). */
static int head_dim_for(int fmt)
{
    return fmt == KV_QF_INT8_G128 ? 128 : fmt == KV_QF_INT8_G64 ? 64 : 32;
}

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    kv_err e;
    if (kvcu_malloc(&d, bytes, &e) || kvcu_upload(d, h, bytes, &e)) {
        KV_CHECK(0, "upload of %zu bytes: %s", bytes, e.msg);
        kvcu_free(d);
        return NULL;
    }
    return d;
}

static void fill(float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_uniform(&rng, -amp, amp);
}

/* Index of the first differing byte, or -1. */
static long first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long)i;
    return -1;
}

/* One writer of the same rows into a CPU cache, a paged device cache and a contiguous device
 * cache; rows x [n][H_kv][d] in host and device memory. Slot s of the contiguous twin is the
 * paged slot s (the poison slot has no twin). */
typedef struct {
    kv_cache c;          /* CPU, paged */
    kvcu_cache *g;       /* device, paged */
    kvcu_cache *gc;      /* device, contiguous: the reference for the bit-identity checks */
    int L, d, kvdim;
    int ok;
    kv_err e;
} trio;

static void trio_write(trio *t, int slot, int pos, int n, const float *k, const float *v,
                       const float *dk, const float *dv, int twin)
{
    for (int l = 0; l < t->L && t->ok; l++) {
        t->ok = kv_cache_write_seq(&t->c, l, slot, pos, n, k, v, &t->e) == KV_OK &&
                kvcu_cache_write_seq(t->g, l, slot, pos, n, dk, dv, &t->e) == KV_OK;
        if (t->ok && twin)
            t->ok = kvcu_cache_write_seq(t->gc, l, slot, pos, n, dk, dv, &t->e) == KV_OK;
    }
}

/* Rows pos .. pos+n-1 of x [len][H_kv][d], as a prefill chunk (chunk 1) or one by one. */
static void trio_write_rows(trio *t, int slot, int pos, int n, int chunk, const float *k,
                            const float *v, const float *dk, const float *dv, int twin)
{
    const size_t o = (size_t)pos * t->kvdim;
    if (chunk) {
        trio_write(t, slot, pos, n, k + o, v + o, dk + o, dv + o, twin);
        return;
    }
    for (int i = 0; i < n; i++) {
        const size_t oi = o + (size_t)i * t->kvdim;
        trio_write(t, slot, pos + i, 1, k + oi, v + oi, dk + oi, dv + oi, twin);
    }
}

/* Attention of slot s at position pos, layer l: CPU vs each GPU version, paged vs contiguous. */
static void check_attention(trio *t, const char *name, int slot, int pos, int layer,
                            const float *dq, const float *q)
{
    const size_t nq = (size_t)H * t->d;
    float o_cpu[H * 128], o_p[3][H * 128], o_c[H * 128];
    float *dout = NULL;
    kv_err e;
    int rc = kv_attention(&t->c, layer, slot, pos, q, o_cpu, H);
    rc |= kvcu_malloc((void **)&dout, nq * 4, &e);
    for (int ver = 1; ver <= 3 && !rc; ver++) {
        char what[96];
        rc = kvcu_cache_attention_version(ver, t->g, layer, slot, pos, dq, dout, NULL, H, &e);
        if (!rc) rc = kvcu_download(o_p[ver - 1], dout, nq * 4, &e);
        if (!rc) rc = kvcu_cache_attention_version(ver, t->gc, layer, slot, pos, dq, dout, NULL,
                                                   H, &e);
        if (!rc) rc = kvcu_download(o_c, dout, nq * 4, &e);
        if (rc) break;
        snprintf(what, sizeof what, "%s slot %d pos %d layer %d v%d", name, slot, pos, layer, ver);
        int finite = 1;
        for (size_t i = 0; i < nq; i++) finite &= isfinite(o_p[ver - 1][i]) && isfinite(o_cpu[i]);
        KV_CHECK(finite, "%s: outputs finite (no poison leaked)", what);
        KV_CHECK(kv_test_compare(what, o_p[ver - 1], o_cpu, (long)nq, KV_TOL_F32_ATOL,
                                 KV_TOL_F32_RTOL) == 0, "%s: paged GPU vs paged CPU", what);
        KV_CHECK(memcmp(o_p[ver - 1], o_c, nq * 4) == 0,
                 "%s: paged GPU == contiguous GPU bit for bit", what);
    }
    KV_CHECK(rc == KV_OK, "%s attention: %s", name, e.msg);
    if (!rc && pos < 512)
        KV_CHECK(memcmp(o_p[1], o_p[2], nq * 4) == 0,
                 "%s slot %d pos %d: v3 with one partition == v2 bit for bit", name, slot, pos);
    kvcu_free(dout);
}

static void check_cache(int fmt, int B)
{
    const int d = head_dim_for(fmt), kivi = kvq_is_kivi(fmt);
    const kv_config cfg = shape(d, N_LAYERS);
    /* lengths: prefill P, single tokens to the fork point A (mid-block), then sequence 0 to
     * L0 and sequence 1 to L1; KIVI's spill past its 32-token window at P and after A */
    const int P = kivi ? 45 : 29, A = kivi ? 51 : 35, L0 = kivi ? 75 : 41, L1 = kivi ? 77 : 44;
    const int n0 = (L0 + B - 1) / B, shared = A / B, n1 = (L1 + B - 1) / B;
    const int N = n0 + (n1 - shared) + 3; /* 3 blocks nobody maps: they keep the poison */
    char name[64];
    snprintf(name, sizeof name, "%s B %d", kv_quant_name(fmt), B);

    kv_cache_spec s = kv_cache_spec_default(3, N * B); /* slot 2: the poison writer */
    s.layout.kind = KV_LAYOUT_PAGED;
    s.quant.dtype = fmt;
    s.layout.block_size = B;
    s.layout.n_blocks = N;
    s.quant.kivi_window = WINDOW;
    kv_cache_spec sc = kv_cache_spec_default(2, L1);
    sc.quant.dtype = fmt;
    sc.quant.kivi_window = WINDOW;
    trio t;
    memset(&t, 0, sizeof t);
    t.L = N_LAYERS;
    t.d = d;
    t.kvdim = HKV * d;
    t.ok = 1;
    if (kv_cache_create(&t.c, &cfg, &s, &t.e) || kvcu_cache_create(&t.g, &cfg, &s, &t.e) ||
        kvcu_cache_create(&t.gc, &cfg, &sc, &t.e)) {
        KV_CHECK(0, "%s: create: %s", name, t.e.msg);
        kv_cache_free(&t.c);
        kvcu_cache_free(t.g);
        return;
    }
    KV_CHECK(kvcu_cache_mem_bytes(t.g) == t.c.mem_bytes, "%s: same buffer size", name);

    /* rows: poison [N·B], sequence 0 [L0], sequence 1 [L1] (its first A rows are 0's) */
    const size_t kvdim = (size_t)t.kvdim;
    float *pk = malloc(sizeof(float) * N * B * kvdim);
    float *k0 = malloc(sizeof(float) * L0 * kvdim), *v0 = malloc(sizeof(float) * L0 * kvdim);
    float *k1 = malloc(sizeof(float) * L1 * kvdim), *v1 = malloc(sizeof(float) * L1 * kvdim);
    for (size_t i = 0; i < (size_t)N * B * kvdim; i++) pk[i] = NAN;
    fill(k0, L0 * kvdim, 1.0f);
    fill(v0, L0 * kvdim, 0.7f);
    memcpy(k1, k0, sizeof(float) * A * kvdim);
    memcpy(v1, v0, sizeof(float) * A * kvdim);
    fill(k1 + A * kvdim, (L1 - A) * kvdim, 1.0f);
    fill(v1 + A * kvdim, (L1 - A) * kvdim, 0.7f);
    float *dpk = dev_copy(pk, sizeof(float) * N * B * kvdim);
    float *dk0 = dev_copy(k0, sizeof(float) * L0 * kvdim), *dv0 = dev_copy(v0, sizeof(float) * L0 * kvdim);
    float *dk1 = dev_copy(k1, sizeof(float) * L1 * kvdim), *dv1 = dev_copy(v1, sizeof(float) * L1 * kvdim);

    /* poison: slot 2 maps the whole pool and fills it with NaN rows, then lets go */
    int *all = malloc(sizeof(int) * N), *perm = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) all[i] = perm[i] = i;
    t.ok = kv_cache_set_blocks(&t.c, 2, all, N, &t.e) == KV_OK &&
           kvcu_cache_set_blocks(t.g, 2, all, N, &t.e) == KV_OK;
    if (t.ok) trio_write(&t, 2, 0, N * B, pk, pk, dpk, dpk, 0);
    kv_cache_reset(&t.c, 2);
    kvcu_cache_reset(t.g, 2);

    /* sequence 0 through a random table */
    for (int i = N - 1; i > 0; i--) {
        const int j = (int)(kv_rng_u32(&rng) % (uint32_t)(i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    const int *t0 = perm; /* [n0] */
    if (t.ok)
        t.ok = kv_cache_set_blocks(&t.c, 0, t0, n0, &t.e) == KV_OK &&
               kvcu_cache_set_blocks(t.g, 0, t0, n0, &t.e) == KV_OK;
    if (t.ok) trio_write_rows(&t, 0, 0, P, 1, k0, v0, dk0, dv0, 1);
    if (t.ok) trio_write_rows(&t, 0, P, A - P, 0, k0, v0, dk0, dv0, 1);
    /* the contiguous twin of sequence 1 writes the shared prefix the same way */
    for (int l = 0; l < N_LAYERS && t.ok; l++)
        t.ok = kvcu_cache_write_seq(t.gc, l, 1, 0, P, dk1, dv1, &t.e) == KV_OK;
    for (int p = P; p < A && t.ok; p++)
        for (int l = 0; l < N_LAYERS && t.ok; l++)
            t.ok = kvcu_cache_write_seq(t.gc, l, 1, p, 1, dk1 + p * kvdim, dv1 + p * kvdim, &t.e) == KV_OK;

    /* fork at A: slot 1 aliases the full blocks, copies the partial one, owns the rest */
    int t1[64];
    for (int i = 0; i < shared; i++) t1[i] = t0[i];
    for (int i = shared; i < n1; i++) t1[i] = perm[n0 + i - shared];
    const kv_block_copy cow = {t0[shared], t1[shared]};
    if (t.ok)
        t.ok = kv_cache_set_blocks(&t.c, 1, t1, n1, &t.e) == KV_OK &&
               kvcu_cache_set_blocks(t.g, 1, t1, n1, &t.e) == KV_OK &&
               kv_cache_copy_blocks(&t.c, &cow, 1, &t.e) == KV_OK &&
               kvcu_cache_copy_blocks(t.g, &cow, 1, &t.e) == KV_OK &&
               kv_cache_fork_slot(&t.c, 1, 0, &t.e) == KV_OK &&
               kvcu_cache_fork_slot(t.g, 1, 0, &t.e) == KV_OK;
    /* both continue, each with its own tokens */
    if (t.ok) trio_write_rows(&t, 0, A, L0 - A, 0, k0, v0, dk0, dv0, 1);
    if (t.ok) trio_write_rows(&t, 1, A, L1 - A, 0, k1, v1, dk1, dv1, 1);
    KV_CHECK(t.ok, "%s: writes, fork, copy: %s", name, t.e.msg);

    /* the buffers, byte for byte */
    uint8_t *gm = malloc(t.c.mem_bytes);
    if (t.ok && kvcu_cache_download(t.g, gm, t.c.mem_bytes, &t.e) == KV_OK) {
        const long at = first_diff(gm, t.c.mem, t.c.mem_bytes);
        KV_CHECK(at < 0, "%s: device buffer == CPU buffer (%zu bytes; first difference at %ld)",
                 name, t.c.mem_bytes, at);
    } else {
        KV_CHECK(0, "%s: download: %s", name, t.e.msg);
    }
    if (fmt == KV_QF_F32) { /* the poison is there to leak: an unmapped block holds NaN */
        const float *pool = (const float *)(const void *)kv_cache_plane_of(t.c.planes, t.c.n_layers, 0, 0)->codes;
        const float unused = pool[(size_t)perm[N - 1] * B * d];          /* unmapped block */
        const float tail = pool[((size_t)t0[n0 - 1] * B + B - 1) * d];   /* past L0 (L0 % B != 0) */
        KV_CHECK(isnan(unused) && isnan(tail),
                 "%s: unused pool rows and the unused tail of a last block hold NaN", name);
    }

    /* attention: last position of both sequences, and one before the fork point */
    float q[H * 128];
    fill(q, (size_t)H * d, 1.0f);
    float *dq = dev_copy(q, sizeof(float) * H * d);
    if (t.ok && dq) {
        check_attention(&t, name, 0, L0 - 1, 1, dq, q);
        check_attention(&t, name, 1, L1 - 1, 0, dq, q);
        check_attention(&t, name, 1, A - 2, 1, dq, q);
    }
    kvcu_free(dq);
    kvcu_free(dpk); kvcu_free(dk0); kvcu_free(dv0); kvcu_free(dk1); kvcu_free(dv1);
    free(pk); free(k0); free(v0); free(k1); free(v1); free(all); free(perm); free(gm);
    kv_cache_free(&t.c);
    kvcu_cache_free(t.g);
    kvcu_cache_free(t.gc);
}

/* v3 over several partitions: n = 1100 positions (three partitions, the last partial),
 * prefilled into a paged cache and a contiguous one; v3 and v2 against the CPU, and paged v3
 * == contiguous v3 bit for bit. One layer, one sequence. */
static void check_long(int fmt)
{
    const int d = head_dim_for(fmt), B = kvq_is_kivi(fmt) ? 32 : 16, n = 1100;
    const int nb = (n + B - 1) / B;
    const kv_config cfg = shape(d, 1);
    kv_cache_spec s = kv_cache_spec_default(1, n);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.quant.dtype = fmt;
    s.layout.block_size = B;
    s.layout.n_blocks = nb + 5;
    s.quant.kivi_window = WINDOW;
    kv_cache_spec sc = kv_cache_spec_default(1, n);
    sc.quant.dtype = fmt;
    sc.quant.kivi_window = WINDOW;
    char name[64];
    snprintf(name, sizeof name, "%s long (%d positions, B %d)", kv_quant_name(fmt), n, B);
    trio t;
    memset(&t, 0, sizeof t);
    t.L = 1;
    t.d = d;
    t.kvdim = HKV * d;
    t.ok = 1;
    if (kv_cache_create(&t.c, &cfg, &s, &t.e) || kvcu_cache_create(&t.g, &cfg, &s, &t.e) ||
        kvcu_cache_create(&t.gc, &cfg, &sc, &t.e)) {
        KV_CHECK(0, "%s: create: %s", name, t.e.msg);
        kv_cache_free(&t.c);
        kvcu_cache_free(t.g);
        return;
    }
    int *table = malloc(sizeof(int) * nb);
    /* scattered: i -> (7i + 3) mod (nb + 5) is one-to-one (7 and nb + 5 = 74 or 40 coprime) */
    for (int i = 0; i < nb; i++) table[i] = (i * 7 + 3) % (nb + 5);
    const size_t kvdim = (size_t)t.kvdim;
    float *k = malloc(sizeof(float) * n * kvdim), *v = malloc(sizeof(float) * n * kvdim);
    /* larger keys make the softmax peaked, so partitions' maxima differ and the rescaling
     * by e^(m_j - M) is exercised, not just a sum of equal weights */
    fill(k, n * kvdim, 2.0f);
    fill(v, n * kvdim, 1.0f);
    float *dk = dev_copy(k, sizeof(float) * n * kvdim), *dv = dev_copy(v, sizeof(float) * n * kvdim);
    t.ok = dk && dv && kv_cache_set_blocks(&t.c, 0, table, nb, &t.e) == KV_OK &&
           kvcu_cache_set_blocks(t.g, 0, table, nb, &t.e) == KV_OK;
    if (t.ok) trio_write_rows(&t, 0, 0, n - 3, 1, k, v, dk, dv, 1);
    if (t.ok) trio_write_rows(&t, 0, n - 3, 3, 0, k, v, dk, dv, 1);
    KV_CHECK(t.ok, "%s: writes: %s", name, t.e.msg);
    float q[H * 128];
    fill(q, (size_t)H * d, 1.0f);
    float *dq = dev_copy(q, sizeof(float) * H * d);
    if (t.ok && dq) {
        check_attention(&t, name, 0, n - 1, 0, dq, q);
        check_attention(&t, name, 0, 700, 0, dq, q); /* two partitions, the second short */
    }
    kvcu_free(dq); kvcu_free(dk); kvcu_free(dv);
    free(k); free(v); free(table);
    kv_cache_free(&t.c);
    kvcu_cache_free(t.g);
    kvcu_cache_free(t.gc);
}

/* v3 on plain arrays (the entry point the bench times) against the CPU's kv_attn_decode, and
 * v3 == v2 bit for bit when len fits one partition. */
static void check_plain_v3(void)
{
    const int d = 64, max_seq = 1300;
    const size_t nkv = (size_t)HKV * max_seq * d, nq = (size_t)H * d;
    float *k = malloc(nkv * 4), *v = malloc(nkv * 4), q[H * 64], o_cpu[H * 64], o3[H * 64], o2[H * 64];
    fill(k, nkv, 2.0f);
    fill(v, nkv, 1.0f);
    fill(q, nq, 1.0f);
    float *dk = dev_copy(k, nkv * 4), *dv = dev_copy(v, nkv * 4), *dq = dev_copy(q, nq * 4), *dout = NULL;
    kv_err e;
    const int lens[] = {1, 300, 512, 513, 1300};
    int rc = kvcu_malloc((void **)&dout, nq * 4, &e);
    for (int i = 0; i < 5 && !rc; i++) {
        const int len = lens[i];
        char what[64];
        snprintf(what, sizeof what, "plain v3 len %d", len);
        rc = kv_attn_decode(q, k, v, o_cpu, H, HKV, d, max_seq, len);
        if (!rc) rc = kvcu_attn_decode_version(3, dq, dk, dv, dout, NULL, H, HKV, d, max_seq, len, &e);
        if (!rc) rc = kvcu_download(o3, dout, nq * 4, &e);
        if (!rc) rc = kvcu_attn_decode_version(2, dq, dk, dv, dout, NULL, H, HKV, d, max_seq, len, &e);
        if (!rc) rc = kvcu_download(o2, dout, nq * 4, &e);
        if (rc) break;
        KV_CHECK(kv_test_compare(what, o3, o_cpu, (long)nq, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
                 "%s vs the CPU", what);
        if (len <= 512) KV_CHECK(memcmp(o3, o2, nq * 4) == 0, "%s == v2 bit for bit", what);
    }
    KV_CHECK(rc == KV_OK, "plain v3: %s", e.msg);
    KV_CHECK(kvcu_attn_decode_scratch(3, H, d, max_seq) >= kvcu_attn_decode_scratch(2, H, d, max_seq) +
                 (size_t)H * 3 * (d + 2), "v3 scratch holds the partition results");
    kvcu_free(dk); kvcu_free(dv); kvcu_free(dq); kvcu_free(dout);
    free(k); free(v);
}

/* copy lists that are not copy-on-write lists: chains (a pair reads a block an earlier pair
 * wrote), a repeated destination, a self-copy; and refusals. */
static void check_copy_lists(int fmt)
{
    const int d = head_dim_for(fmt), B = 32, N = 10;
    const kv_config cfg = shape(d, N_LAYERS);
    kv_cache_spec s = kv_cache_spec_default(1, N * B);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.quant.dtype = fmt;
    s.layout.block_size = B;
    s.layout.n_blocks = N;
    s.quant.kivi_window = WINDOW;
    kv_cache c;
    kvcu_cache *g = NULL;
    kv_err e;
    if (kv_cache_create(&c, &cfg, &s, &e) || kvcu_cache_create(&g, &cfg, &s, &e)) {
        KV_CHECK(0, "copy lists %s: create: %s", kv_quant_name(fmt), e.msg);
        kv_cache_free(&c);
        return;
    }
    const size_t n = (size_t)N * B, kvdim = (size_t)HKV * d;
    float *k = malloc(sizeof(float) * n * kvdim), *v = malloc(sizeof(float) * n * kvdim);
    fill(k, n * kvdim, 1.0f);
    fill(v, n * kvdim, 1.0f);
    float *dk = dev_copy(k, sizeof(float) * n * kvdim), *dv = dev_copy(v, sizeof(float) * n * kvdim);
    int table[10];
    for (int i = 0; i < N; i++) table[i] = (i * 3 + 1) % N;
    int ok = kv_cache_set_blocks(&c, 0, table, N, &e) == KV_OK &&
             kvcu_cache_set_blocks(g, 0, table, N, &e) == KV_OK;
    for (int l = 0; l < N_LAYERS && ok; l++)
        ok = kv_cache_write_seq(&c, l, 0, 0, (int)n, k, v, &e) == KV_OK &&
             kvcu_cache_write_seq(g, l, 0, 0, (int)n, dk, dv, &e) == KV_OK;
    const kv_block_copy pairs[] = {{0, 5}, {5, 6}, {2, 7}, {7, 2}, {3, 3}, {1, 8}, {4, 8}, {9, 1}};
    const int np = (int)(sizeof pairs / sizeof pairs[0]);
    if (ok)
        ok = kv_cache_copy_blocks(&c, pairs, np, &e) == KV_OK &&
             kvcu_cache_copy_blocks(g, pairs, np, &e) == KV_OK;
    KV_CHECK(ok, "copy lists %s: %s", kv_quant_name(fmt), e.msg);
    uint8_t *gm = malloc(c.mem_bytes);
    if (ok && kvcu_cache_download(g, gm, c.mem_bytes, &e) == KV_OK) {
        const long at = first_diff(gm, c.mem, c.mem_bytes);
        KV_CHECK(at < 0, "copy lists %s: chained / repeated / self copies == the CPU's in-order "
                 "result (first difference at %ld)", kv_quant_name(fmt), at);
    }
    const kv_block_copy bad = {1, N};
    KV_CHECK(kv_cache_copy_blocks(&c, &bad, 1, &e) == KV_ERR_ARG &&
             kvcu_cache_copy_blocks(g, &bad, 1, &e) == KV_ERR_ARG,
             "a pair outside the pool is refused on both devices");
    const int out_of_pool[1] = {N};
    KV_CHECK(kvcu_cache_set_blocks(g, 0, out_of_pool, 1, &e) == KV_ERR_ARG,
             "set_blocks refuses a block outside the pool");
    kv_cache_spec cs = kv_cache_spec_default(1, 8);
    kvcu_cache *cont = NULL;
    if (kvcu_cache_create(&cont, &cfg, &cs, &e) == KV_OK) {
        KV_CHECK(kvcu_cache_copy_blocks(cont, pairs, 1, &e) == KV_ERR_ARG &&
                 kvcu_cache_set_blocks(cont, 0, table, 1, &e) == KV_ERR_ARG &&
                 kvcu_cache_fork_slot(cont, 0, 0, &e) == KV_ERR_ARG,
                 "paged calls on a contiguous device cache are refused");
        kvcu_cache_free(cont);
    }
    /* a write past the mapped blocks has nowhere to go */
    kvcu_cache_reset(g, 0);
    ok = kvcu_cache_set_blocks(g, 0, table, 1, &e) == KV_OK;
    KV_CHECK(ok && kvcu_cache_write_seq(g, 0, 0, 0, B + 1, dk, dv, &e) == KV_ERR_CAPACITY,
             "a write past the mapped blocks is KV_ERR_CAPACITY");
    int rc = kvcu_cache_set_length(g, 0, 5, &e);
    KV_CHECK(rc == (kvq_is_fp8(fmt) || kvq_is_kivi(fmt) ? KV_ERR_UNSUPPORTED : KV_OK),
             "set_length: adopted rows refused exactly for fp8 and KIVI (%s)", kv_quant_name(fmt));
    free(gm); free(k); free(v);
    kvcu_free(dk); kvcu_free(dv);
    kv_cache_free(&c);
    kvcu_cache_free(g);
}

/* vLLM's flat slot mapping: tokens with their pool rows, -1 entries padding. The GPU writes
 * the CPU's bytes, and both equal writing the same tokens by position through the table. */
static void check_write_slots(int fmt)
{
    const int d = head_dim_for(fmt), B = 8, N = 6, n = 2 * (N * B) / 3; /* 32 tokens */
    const kv_config cfg = shape(d, N_LAYERS);
    kv_cache_spec s = kv_cache_spec_default(1, N * B);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.quant.dtype = fmt;
    s.layout.block_size = B;
    s.layout.n_blocks = N;
    kv_cache c, ref;
    kvcu_cache *g = NULL;
    kv_err e;
    if (kv_cache_create(&c, &cfg, &s, &e) || kv_cache_create(&ref, &cfg, &s, &e) ||
        kvcu_cache_create(&g, &cfg, &s, &e)) {
        KV_CHECK(0, "write slots %s: create: %s", kv_quant_name(fmt), e.msg);
        return;
    }
    const size_t kvdim = (size_t)HKV * d, m = (size_t)n + n / 4; /* with padding */
    float *k = malloc(sizeof(float) * m * kvdim), *v = malloc(sizeof(float) * m * kvdim);
    float *kp = malloc(sizeof(float) * n * kvdim), *vp = malloc(sizeof(float) * n * kvdim);
    int64_t *slots = malloc(sizeof(int64_t) * m);
    fill(k, m * kvdim, 1.0f);
    fill(v, m * kvdim, 1.0f);
    const int table[6] = {4, 1, 5, 0, 3, 2};
    /* every 5th entry is padding (its row of k, v is garbage that must not land anywhere) */
    for (size_t i = 0, t = 0; i < m; i++) {
        if (i % 5 == 4 || t == (size_t)n) {
            slots[i] = -1;
            continue;
        }
        slots[i] = (int64_t)table[t / B] * B + (int64_t)(t % B);
        memcpy(kp + t * kvdim, k + i * kvdim, sizeof(float) * kvdim);
        memcpy(vp + t * kvdim, v + i * kvdim, sizeof(float) * kvdim);
        t++;
    }
    float *dk = dev_copy(k, sizeof(float) * m * kvdim), *dv = dev_copy(v, sizeof(float) * m * kvdim);
    int ok = kv_cache_set_blocks(&ref, 0, table, N, &e) == KV_OK;
    for (int l = 0; l < N_LAYERS && ok; l++) {
        const int a = kv_cache_write_slots(&c, l, slots, (int)m, k, v, &e);
        const int b = a ? a : kvcu_cache_write_slots(g, l, slots, (int)m, dk, dv, &e);
        const int r = b ? b : kv_cache_write_seq(&ref, l, 0, 0, n, kp, vp, &e);
        ok = r == KV_OK;
    }
    KV_CHECK(ok, "write slots %s: %s", kv_quant_name(fmt), e.msg);
    uint8_t *gm = malloc(c.mem_bytes);
    if (ok && kvcu_cache_download(g, gm, c.mem_bytes, &e) == KV_OK) {
        long at = first_diff(gm, c.mem, c.mem_bytes);
        KV_CHECK(at < 0, "write slots %s: GPU bytes == CPU bytes (first difference at %ld)",
                 kv_quant_name(fmt), at);
        at = first_diff(c.mem, ref.mem, c.mem_bytes);
        KV_CHECK(at < 0, "write slots %s: == writing by position through the table (first "
                 "difference at %ld)", kv_quant_name(fmt), at);
    }
    free(gm); free(k); free(v); free(kp); free(vp); free(slots);
    kvcu_free(dk); kvcu_free(dv);
    kv_cache_free(&c);
    kv_cache_free(&ref);
    kvcu_cache_free(g);
}

/* The tiny-gqa shape with random weights from seed (a failure is a failed check). */
static int tiny_gqa(kv_config *cfg, kv_model *m, uint64_t seed)
{
    kv_err e;
    if (kv_config_default_by_name("tiny-gqa", cfg, NULL, &e) == KV_OK)
        return kv_test_model_random(m, cfg, seed);
    KV_CHECK(0, "model: %s", e.msg);
    return -1;
}

/* The CUDA backend on a paged spec against the CPU's paged backend and the CUDA contiguous
 * backend: two sequences, a prompt, a fork (shared blocks, copy-on-write on the next step),
 * greedy decoding of both in one batch. */
static void check_backend(int fmt, int B)
{
    kv_config cfg;
    kv_model m;
    kv_err e;
    if (tiny_gqa(&cfg, &m, 505)) return;
    enum { PROMPT = 21, STEPS = 10, CAP = 40 };
    kv_cache_spec sp = kv_cache_spec_default(2, CAP);
    sp.quant.dtype = fmt;
    sp.layout.kind = KV_LAYOUT_PAGED;
    sp.layout.block_size = B;
    sp.layout.n_blocks = 2 * ((CAP + B - 1) / B);
    kv_cache_spec sc = kv_cache_spec_default(2, CAP);
    sc.quant.dtype = fmt;
    kv_backend *bc = NULL, *bg = NULL, *bgc = NULL;
    if (kv_backend_cpu(&bc, &m, &sp, &e) || kvcu_backend_create(&bg, &m, &sp, &e) ||
        kvcu_backend_create(&bgc, &m, &sc, &e)) {
        KV_CHECK(0, "backends: %s", e.msg);
        kv_backend_destroy(bc);
        kv_backend_destroy(bg);
        kv_model_free(&m);
        return;
    }
    KV_CHECK(bg->mem && bg->mem->paged && bg->mem->set_blocks && bg->mem->copy_blocks &&
                 bg->mem->fork_slot && bg->mem->set_length,
             "the CUDA backend pages a paged spec");
    const int V = cfg.vocab_size;
    float *lc = malloc(sizeof(float) * 2 * V), *lg = malloc(sizeof(float) * 2 * V),
          *lgc = malloc(sizeof(float) * 2 * V);
    int prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int)(kv_rng_u32(&rng) % (uint32_t)V);
    kv_backend *bs[3] = {bc, bg, bgc};
    float *ls[3] = {lc, lg, lgc};
    /* CPU vs GPU logits within the fp32 tolerance, except with per-token int8 keys: those
     * meet the query rounded to 16 bits (kv_attn_int_keys()), and a query element that the
     * two devices computed one float rounding apart lands on the neighbouring code about once
     * in a few hundred, which moves a logit by a step of the query (measured here: up to
     * 5.6e-5), far past that tolerance (test_gpu_window.c holds quantized caches the same
     * way). The int8 run keeps the greedy tokens, the copy on write and paged == contiguous
     * bit for bit; its attention is held to the CPU's within tolerance above. */
    const int vs_cpu = fmt != KV_QF_INT8;
    int rc = KV_OK, same_tokens = 1, bits = 1, close = 1;
    kv_seq q = {0, 0, PROMPT, prompt};
    for (int i = 0; i < 3 && !rc; i++) rc = bs[i]->forward(bs[i], &q, 1, ls[i], NULL, &e);
    /* fork sequence 0 into slot 1: paged backends share blocks; the contiguous one re-runs
     * the prompt in slot 1 (same tokens, same cache contents) */
    if (!rc) rc = kv_paged_fork(bc->mem, 1, 0, &e);
    if (!rc) rc = kv_paged_fork(bg->mem, 1, 0, &e);
    kv_seq q1 = {1, 0, PROMPT, prompt};
    if (!rc) rc = bgc->forward(bgc, &q1, 1, lgc + V, NULL, &e);
    int tok[3][2];
    for (int i = 0; i < 3; i++) {
        tok[i][0] = tok[i][1] = 0;
        for (int j = 1; j < V; j++)
            if (ls[i][j] > ls[i][tok[i][0]]) tok[i][0] = j;
        tok[i][1] = (tok[i][0] + 1) % V; /* the fork continues with another token */
    }
    const int64_t cow0 = bg->mem ? bg->mem->paged->n_cow : 0;
    for (int step = 0; step < STEPS && !rc; step++) {
        for (int i = 0; i < 3 && !rc; i++) {
            kv_seq b2[2] = {{0, PROMPT + step, 1, &tok[i][0]}, {1, PROMPT + step, 1, &tok[i][1]}};
            rc = bs[i]->forward(bs[i], b2, 2, ls[i], NULL, &e);
        }
        if (rc) break;
        if (vs_cpu)
            close &= kv_test_compare("paged CUDA vs paged CPU logits", lg, lc, 2L * V,
                                     KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0;
        bits &= memcmp(lg, lgc, sizeof(float) * 2 * V) == 0;
        for (int i = 0; i < 3; i++)
            for (int s = 0; s < 2; s++) {
                int best = 0;
                for (int j = 1; j < V; j++)
                    if (ls[i][s * V + j] > ls[i][s * V + best]) best = j;
                tok[i][s] = best;
            }
        same_tokens &= tok[1][0] == tok[0][0] && tok[1][1] == tok[0][1];
    }
    char what[64];
    snprintf(what, sizeof what, "backend %s B %d", kv_quant_name(fmt), B);
    KV_CHECK(rc == KV_OK, "%s: runs: %s", what, e.msg);
    KV_CHECK(!rc && bg->mem->paged->n_cow > cow0 && bg->mem->paged->n_cow == bc->mem->paged->n_cow,
             "%s: the fork's shared last block was copied on write (%lld copies)", what,
             (long long)(bg->mem ? bg->mem->paged->n_cow : 0));
    if (vs_cpu)
        KV_CHECK(!rc && close, "%s: paged CUDA logits within the fp32 tolerance of the CPU's",
                 what);
    KV_CHECK(!rc && same_tokens, "%s: paged CUDA backend generates the CPU's greedy tokens", what);
    KV_CHECK(!rc && bits, "%s: paged CUDA logits == contiguous CUDA logits bit for bit", what);
    /* reset gives the blocks back: a new prompt in slot 0 runs again */
    bg->reset(bg, 0);
    bg->reset(bg, 1);
    KV_CHECK(kv_paged_available(bg->mem) == sp.layout.n_blocks, "%s: reset returns every block", what);
    free(lc); free(lg); free(lgc);
    kv_backend_destroy(bc);
    kv_backend_destroy(bg);
    kv_backend_destroy(bgc);
    kv_model_free(&m);
}

/* Prefix caching on the CUDA backend (kvcu_cache_set_length underneath): a second sequence
 * with the same prompt adopts the first one's full blocks and prefills only the rest; its
 * logits equal the first sequence's bit for bit (same rows, same per-row arithmetic) and the
 * CPU's within the fp32 tolerance. */
static void check_prefix(void)
{
    kv_config cfg;
    kv_model m;
    kv_err e;
    if (tiny_gqa(&cfg, &m, 707)) return;
    enum { PROMPT = 21, B = 8 };
    kv_cache_spec sp = kv_cache_spec_default(2, 32);
    sp.layout.kind = KV_LAYOUT_PAGED;
    sp.layout.block_size = B;
    sp.layout.n_blocks = 10;
    kv_backend *b[2] = {NULL, NULL}; /* CPU, CUDA */
    int rc = kv_backend_cpu(&b[0], &m, &sp, &e);
    if (!rc) rc = kvcu_backend_create(&b[1], &m, &sp, &e);
    for (int i = 0; i < 2 && !rc; i++) rc = kv_backend_enable_prefix_cache(b[i], &e);
    const int V = cfg.vocab_size;
    int prompt[PROMPT], hit[2] = {0, 0};
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int)(kv_rng_u32(&rng) % (uint32_t)V);
    float *l0 = malloc(sizeof(float) * 2 * V), *l1 = malloc(sizeof(float) * 2 * V);
    for (int i = 0; i < 2 && !rc; i++) {
        const kv_seq first = {0, 0, PROMPT, prompt};
        rc = b[i]->forward(b[i], &first, 1, l0 + i * V, NULL, &e);
        if (!rc) rc = kv_paged_match_prefix(b[i]->mem, 1, prompt, PROMPT, &hit[i], &e);
        const kv_seq rest = {1, hit[i], PROMPT - hit[i], prompt + hit[i]};
        if (!rc) rc = b[i]->forward(b[i], &rest, 1, l1 + i * V, NULL, &e);
    }
    KV_CHECK(rc == KV_OK, "prefix: runs: %s", e.msg);
    KV_CHECK(!rc && hit[0] == PROMPT / B * B && hit[1] == hit[0],
             "prefix: both devices adopt the %d tokens of the full blocks (CPU %d, CUDA %d)",
             PROMPT / B * B, hit[0], hit[1]);
    KV_CHECK(!rc && b[1]->length(b[1], 1) == PROMPT, "prefix: the CUDA slot holds the prompt");
    KV_CHECK(!rc && memcmp(l1 + V, l0 + V, sizeof(float) * V) == 0,
             "prefix: CUDA logits after a prefix hit == the full prefill's, bit for bit");
    KV_CHECK(!rc && kv_test_compare("prefix: CUDA vs CPU after a hit", l1 + V, l1, V,
                                    KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "prefix: CUDA logits after a hit within the fp32 tolerance of the CPU's");
    free(l0); free(l1);
    kv_backend_destroy(b[0]);
    kv_backend_destroy(b[1]);
    kv_model_free(&m);
}

/* The engine past one 512-position partition (kvcu_attention() then runs v3): a paged CUDA
 * backend against the CPU's paged backend over a 600-token prompt, and the batch-independence
 * v3 keeps: a short sequence decoded beside a long one gets the bits of its solo run. */
static void check_engine_long(void)
{
    kv_config cfg;
    kv_model m;
    kv_err e;
    if (tiny_gqa(&cfg, &m, 606)) return;
    enum { LONG = 600, SHORT = 30, CAP = 640 };
    kv_cache_spec sp = kv_cache_spec_default(2, CAP);
    sp.layout.kind = KV_LAYOUT_PAGED;
    sp.layout.block_size = 16;
    sp.layout.n_blocks = 2 * CAP / 16;
    kv_cache_spec sc = kv_cache_spec_default(2, CAP);
    kv_backend *bc = NULL, *bg = NULL, *solo = NULL;
    if (kv_backend_cpu(&bc, &m, &sp, &e) || kvcu_backend_create(&bg, &m, &sp, &e) ||
        kvcu_backend_create(&solo, &m, &sc, &e)) {
        KV_CHECK(0, "engine long: backends: %s", e.msg);
        kv_backend_destroy(bc);
        kv_backend_destroy(bg);
        kv_model_free(&m);
        return;
    }
    const int V = cfg.vocab_size;
    int *prompt = malloc(sizeof(int) * LONG);
    for (int i = 0; i < LONG; i++) prompt[i] = (int)(kv_rng_u32(&rng) % (uint32_t)V);
    float *lc = malloc(sizeof(float) * 2 * V), *lg = malloc(sizeof(float) * 2 * V),
          *ls = malloc(sizeof(float) * V);
    int rc = KV_OK;
    /* the long prompt in two chunks (rows of 300 .. 599 span two partitions), the short one */
    const kv_seq parts[3] = {{0, 0, 300, prompt}, {0, 300, LONG - 300, prompt + 300},
                             {1, 0, SHORT, prompt + 7}};
    for (int i = 0; i < 3 && !rc; i++) {
        rc = bc->forward(bc, &parts[i], 1, lc, NULL, &e);
        if (!rc) rc = bg->forward(bg, &parts[i], 1, lg, NULL, &e);
    }
    if (!rc) rc = solo->forward(solo, &parts[2], 1, ls, NULL, &e);
    const int t0 = prompt[3], t1 = prompt[5];
    const kv_seq both[2] = {{0, LONG, 1, &t0}, {1, SHORT, 1, &t1}};
    const kv_seq one = {1, SHORT, 1, &t1};
    if (!rc) rc = bc->forward(bc, both, 2, lc, NULL, &e);
    if (!rc) rc = bg->forward(bg, both, 2, lg, NULL, &e);
    if (!rc) rc = solo->forward(solo, &one, 1, ls, NULL, &e);
    KV_CHECK(rc == KV_OK, "engine long: runs: %s", e.msg);
    KV_CHECK(!rc && kv_test_compare("engine long: paged CUDA (v3) vs paged CPU", lg, lc, 2L * V,
                                    KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "engine past one partition: paged CUDA logits within the fp32 tolerance of the CPU");
    KV_CHECK(!rc && memcmp(lg + V, ls, sizeof(float) * V) == 0,
             "a short sequence batched with a 600-token one (a v3 launch) == its solo run, bit "
             "for bit");
    free(prompt); free(lc); free(lg); free(ls);
    kv_backend_destroy(bc);
    kv_backend_destroy(bg);
    kv_backend_destroy(solo);
    kv_model_free(&m);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_rng_seed(&rng, 5050);
    const int blocks[] = {8, 16, 32};
    for (int fi = 0; fi < N_FORMATS; fi++)
        for (int bi = 0; bi < 3; bi++) {
            if (kvq_is_kivi(formats[fi]) && blocks[bi] % 32) continue;
            check_cache(formats[fi], blocks[bi]);
        }
    for (int fi = 0; fi < N_FORMATS; fi++) check_long(formats[fi]);
    check_plain_v3();
    check_copy_lists(KV_QF_F32);
    check_copy_lists(KV_QF_INT8_G32);
    check_copy_lists(KV_QF_INT4_KIVI);
    const int slot_formats[] = {KV_QF_F32,  KV_QF_F16,      KV_QF_BF16,
                                KV_QF_INT8, KV_QF_INT8_G32, KV_QF_INT4_G32};
    for (int i = 0; i < 6; i++) check_write_slots(slot_formats[i]);
    check_backend(KV_QF_F32, 8);
    check_backend(KV_QF_INT8, 16);
    check_prefix();
    check_engine_long();
    return kv_test_finish();
}
