/* The engine's decode kernel (version 4, cuda/attention/kvcu_decode.cu) held to the CPU
 * reference attention (kv_attention_ref(), reference_cpu/attention/kv_attention_ref.c).
 *
 * Predicted before measured:
 *  - version 4 reads every per-token format (fp32, fp16, bf16, int8 per row and per 32
 *    channels, fp8 E4M3 and E5M2) on both layouts (paged: a scrambled table of 16-token
 *    blocks), for MHA (G 1, d 128: 32 lanes a row in fp32), GQA (G 4, d 64) and MQA (G 8,
 *    d 64), and a window with sinks: kvcu_cache_decode_reads() says so; KIVI (int4, int2) and
 *    keys rotated at attention (KV_POS_CACHE, a window of 300 behind 4 sinks) through its
 *    staged fp32 tiles, held to the same bound;
 *  - every output is within the forward-error bound below of the reference, at query
 *    positions inside the first tile, past several tiles, and past several split ranges
 *    (int8 per-row keys: the reference fed the 16-bit query, kv_attn_query_rounded(), whose
 *    codes the kernel multiplies into the key codes as integers, as the CPU does);
 *  - the engine's choice (version 0) is version 4, bit for bit, and paged equals contiguous
 *    bit for bit (one row locator, the same arithmetic).
 *
 * The bound: test_attn_fast.c's, with what this kernel adds. u = 2^-24, N retained rows,
 * S = max_i Σ_j |q_j||k_ij| / √d, V = max |v_ij|.
 *  (a) a score: a lane's chunk by at most 16 fused multiply-adds, 5 shuffle adds, a scale and
 *      the factor (fp8's head scale over √d, itself 3 roundings): under (⌊d/16⌋ + 28)·u·S as
 *      in test_attn_fast.c;
 *  (b) the weights: test_attn_fast.c's Δ, plus the online softmax's rescalings: a row's weight
 *      meets at most R = (tiles of its range) + (ranges) factors exp(m_old - m_new), each off by
 *      the rounding of the difference (2u·S) and expf's 2 ulp: Δ' = Δ + R·(2S + 5)·u; with a
 *      tile of at least 8 rows and at most P = max(min(⌈N/64⌉, 64), ⌈N/256⌉) ranges
 *      (attn_split_keys(): 256 keys or more, down to 64 for short rows), R <= ⌈N/8⌉ + P + 2;
 *  (c) the sums: the (2N + 5)·u·V of test_attn_fast.c, plus a multiply by the factor per
 *      tile on the running output and sum (2R·u·V) and fp8's value scale applied once (3u·V).
 * So |ô - o| <= 1.01·(expm1(2Δ') + (2N + 8 + 2R)·u)·V. The test prints max |err| / bound.
 *
 * The tensor-core kernel (kvcu_decode_mma.cu; kvcu_cache_decode_mma() says where version 4
 * runs it: sm_80 and newer, G >= 4 with int8 per token or fp8, MQA with fp16 / bf16 too; on
 * sm_75, KVEMU_SM=75 in emulation, the CUDA-core kernel instead) rounds two things to
 * 16 bits, with unit roundoff h = 2^-11 (fp16) or 2^-8 (bf16): the query, which moves a score
 * by at most h·Σ_j |q_j||k_ij| / √d <= h·S (keys and values enter exactly: fp16 holds int8
 * codes and fp8 values), and each weight P (times an int8 row's scale) that multiplies V,
 * which moves the output by at most h·V (the exp-sum stays fp32). Its scores add d products
 * in fp32 in the tensor core's order, (d + 30)·u·S in place of (a); so
 *   |ô - o| <= 1.01·(expm1(2Δ_h) + h + (2N + 8 + 2R)·u)·V,
 *   Δ_h = h·S + u·((d + 30)·S + 4 + R·(2S + 5)),
 * against the reference fed the query as it is (no 16-bit integer query there). Predicted:
 * every shape and format above that the rule sends to tensor cores meets it, paged ==
 * contiguous bit for bit, the engine's choice is this kernel; and G 16 int8 (one head block,
 * four warps over a tile's keys) and MQA with 32 heads (two head blocks) too.
 * Exits 77 (skipped) without a usable device. */
#include "kv_attention.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "common/kv_test_attn_bound.h"
#include "common/kv_test_backend.h"
#include "kvcu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N_MAX = 700, B = 16 };

static kv_rng rng;
static double worst_ratio, worst_mma; /* max |err| / bound: CUDA cores, tensor cores */
static int pos_cache; /* the next cache keeps its keys before RoPE (KV_POS_CACHE) */

typedef struct {
    const char *name;
    int H, Hkv, d;
} shape;

/* The bound of the top of the file for head h of the query (reference query qh) at pos;
 * h16: the tensor-core kernel's 16-bit unit roundoff, 0 for the CUDA-core kernel. */
static double bound_of(const kv_cache *c, int pos, int h, int H, const float *qh, double h16)
{
    const int64_t n = kv_window_count(c->spec.window.size, c->spec.window.n_sinks, pos);
    double smax, vmax;
    kv_test_attn_sv(c, pos, h, H, qh, &smax, &vmax);
    return kvcu_decode_bound(c->head_dim, n, smax, vmax, h16);
}

static float *dev_floats(const float *h, size_t n)
{
    void *p = NULL;
    kv_err e;
    if (kvcu_malloc(&p, n * 4, &e) || (h && kvcu_upload(p, h, n * 4, &e))) {
        KV_CHECK(0, "device buffer of %zu floats: %s", n, e.msg);
        kvcu_free(p);
        return NULL;
    }
    return (float *)p;
}

/* One cache (format fmt, paged or not, window W with S sinks): the same rows on both devices,
 * version 4 against the reference at a few positions; out_bits: the outputs at the last
 * position, for the paged == contiguous check. */
static void check_cache(const shape *sh, int fmt, int paged, int W, int S, int n,
                        float *out_bits)
{
    const int H = sh->H, Hkv = sh->Hkv, d = sh->d;
    kv_config cfg = kv_test_config(1, H, Hkv, d, 4096);
    kv_cache_spec s = kv_cache_spec_default(1, n);
    s.quant.dtype = fmt;
    s.window.size = W;
    s.window.n_sinks = S;
    if (pos_cache) s.window.pos_scheme = KV_POS_CACHE;
    const int rows = W ? (S + W < n ? S + W : n) : n;
    if (paged) {
        s.layout.kind = KV_LAYOUT_PAGED;
        s.layout.block_size = B;
        s.layout.n_blocks = (rows + B - 1) / B + 2;
    }
    char what[160];
    snprintf(what, sizeof what, "%s %s %s%s%s", sh->name, kv_quant_name(fmt),
             paged ? "paged" : "contiguous", W ? " window" : "", pos_cache ? " KV_POS_CACHE" : "");
    kv_cache c;
    kvcu_cache *g = NULL;
    kv_err e;
    if (kv_cache_create(&c, &cfg, &s, &e) || kvcu_cache_create(&g, &cfg, &s, &e)) {
        KV_CHECK(0, "%s: create: %s", what, e.msg);
        return;
    }
    int ok = 1;
    if (paged) {
        int blocks[64];
        for (int i = 0; i < c.max_blocks; i++) blocks[i] = s.layout.n_blocks - 1 - i;
        ok = kv_cache_set_blocks(&c, 0, blocks, c.max_blocks, &e) == KV_OK &&
             kvcu_cache_set_blocks(g, 0, blocks, c.max_blocks, &e) == KV_OK;
    }
    KV_CHECK(kvcu_cache_decode_reads(g, 0, H) == 1, "%s: version 4 reads it", what);
    const int G = H / Hkv, one_byte = fmt == KV_QF_INT8 || fmt == KV_QF_FP8_E4M3 ||
                                      fmt == KV_QF_FP8_E5M2;
    const int mma = kvcu_cache_decode_mma(g, 0, H);
    const double h16 = mma ? kvcu_decode_mma_roundoff(fmt) : 0.0;
    const int two_byte = fmt == KV_QF_F16 || fmt == KV_QF_BF16;
    KV_CHECK(mma == (kvcu_device_sm() >= 80 && !pos_cache && d % 16 == 0 && d <= 128 && G >= 4 && G <= 64 &&
                     (one_byte || (Hkv == 1 && two_byte))),
             "%s: tensor cores %s, as the rule says", what, mma ? "on" : "off");
    const size_t kvs = (size_t)Hkv * d;
    float *k = malloc(sizeof(float) * n * kvs), *v = malloc(sizeof(float) * n * kvs);
    for (size_t i = 0; i < n * kvs; i++) {
        k[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
        v[i] = kv_rng_uniform(&rng, -2.0f, 2.0f);
    }
    float *dk = dev_floats(k, n * kvs), *dv = dev_floats(v, n * kvs);
    /* in chunks of at most W past the first S+W (kvcu_cache_write_seq()'s rule) */
    const int chunk = W ? W : n;
    for (int p0 = 0; ok && dk && dv && p0 < n; p0 += chunk) {
        const int m = n - p0 < chunk ? n - p0 : chunk;
        ok = kv_cache_write_seq(&c, 0, 0, p0, m, k + p0 * kvs, v + p0 * kvs, &e) == KV_OK &&
             kvcu_cache_write_seq(g, 0, 0, p0, m, dk + p0 * kvs, dv + p0 * kvs, &e) == KV_OK;
    }
    c.len[0] = n;
    KV_CHECK(ok, "%s: writes: %s", what, e.msg);
    float *q = malloc(sizeof(float) * H * d), *qr = malloc(sizeof(float) * H * d);
    float *ref = malloc(sizeof(float) * H * d), *got = malloc(sizeof(float) * H * d);
    float *eng = malloc(sizeof(float) * H * d);
    float *dq = dev_floats(NULL, (size_t)H * d), *dout = dev_floats(NULL, (size_t)H * d);
    const int pos[3] = {5, 300, n - 1}; /* inside the first tile, past tiles, past ranges */
    long outside = 0;
    for (int pi = 0; ok && dq && dout && pi < 3; pi++) {
        for (int i = 0; i < H * d; i++) q[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
        const kv_head_view kh = kv_cache_view(&c, 0, 0, 0, KV_QROLE_KEY);
        for (int h = 0; h < H; h++)
            if (kv_attn_int_keys(&kh) && !mma) kv_attn_query_rounded(q + h * d, d, qr + h * d);
            else memcpy(qr + h * d, q + h * d, sizeof(float) * d);
        ok = kvcu_upload(dq, q, sizeof(float) * H * d, &e) == KV_OK &&
             kv_attention_ref(&c, 0, 0, pos[pi], qr, ref, H) == KV_OK &&
             kvcu_cache_attention_version(4, g, 0, 0, pos[pi], dq, dout, NULL, H, &e) == KV_OK &&
             kvcu_download(got, dout, sizeof(float) * H * d, &e) == KV_OK &&
             kvcu_cache_attention_version(0, g, 0, 0, pos[pi], dq, dout, NULL, H, &e) == KV_OK &&
             kvcu_download(eng, dout, sizeof(float) * H * d, &e) == KV_OK;
        if (!ok) break;
        KV_CHECK(!memcmp(got, eng, sizeof(float) * H * d), "%s pos %d: the engine's choice is "
                 "version 4, bit for bit", what, pos[pi]);
        for (int h = 0; h < H; h++) {
            const double b = bound_of(&c, pos[pi], h, H, qr + (size_t)h * d, h16);
            double err = 0.0;
            int at = 0;
            for (int j = 0; j < d; j++) {
                const double x = fabs((double)got[h * d + j] - ref[h * d + j]);
                if (!(x <= err)) err = x, at = j;
            }
            if (mma) worst_mma = fmax(worst_mma, err / b);
            else worst_ratio = fmax(worst_ratio, err / b);
            if (!(err <= b) && outside++ < 3)
                printf("  %s pos %d head %d: |err| %.3g at [%d] (got %.9g, ref %.9g) > %.3g\n",
                       what, pos[pi], h, err, at, got[h * d + at], ref[h * d + at], b);
        }
        if (pi == 2 && out_bits) memcpy(out_bits, got, sizeof(float) * H * d);
    }
    KV_CHECK(ok, "%s: attention ran: %s", what, e.msg);
    KV_CHECK(outside == 0, "%s: %ld heads outside the bound of the reference", what, outside);
    kvcu_free(dq); kvcu_free(dout); kvcu_free(dk); kvcu_free(dv);
    free(q); free(qr); free(ref); free(got); free(eng); free(k); free(v);
    kvcu_cache_free(g);
    kv_cache_free(&c);
}

/* What version 4 does not read: a head dim past 32 chunks of 16 bytes even as fp32 staged
 * rows (fp32 d 256); the engine keeps v2/v3 there. */
static void check_refusals(void)
{
    kv_config cfg = kv_test_config(1, 8, 2, 256, 4096);
    kv_cache_spec s = kv_cache_spec_default(1, 64);
    kvcu_cache *g = NULL;
    kv_err e;
    KV_CHECK(kvcu_cache_create(&g, &cfg, &s, &e) == KV_OK && kvcu_cache_decode_reads(g, 0, 8) == 0,
             "fp32 d 256: version 4 does not read it");
    kvcu_cache_free(g);
}

int main(void)
{
    kv_err e;
    if (kvcu_device_available(&e) != KV_OK) {
        printf("skipped: %s\n", e.msg);
        return KV_TEST_SKIP;
    }
    const shape shapes[] = {{"GQA G4 d64", 8, 2, 64}, {"MHA d128", 4, 4, 128}, {"MQA G8 d64", 8, 1, 64}};
    const int fmts[] = {KV_QF_F32, KV_QF_F16, KV_QF_BF16, KV_QF_INT8, KV_QF_INT8_G32,
                        KV_QF_FP8_E4M3, KV_QF_FP8_E5M2, KV_QF_INT4_G32};
    const int n_fmts = (int)(sizeof fmts / sizeof fmts[0]);
    static float bits[2][32 * 128];
    for (int si = 0; si < 3; si++)
        for (int fi = 0; fi < n_fmts; fi++) {
            /* MHA d128 in the 16-bit formats only: fp32 and int8 take the other shapes */
            if (si == 1 && fmts[fi] != KV_QF_F32 && fmts[fi] != KV_QF_F16) continue;
            for (int paged = 0; paged < 2; paged++) { /* the same rows and queries on both */
                kv_rng_seed(&rng, 31 + 16 * (uint64_t)si + (uint64_t)fi);
                check_cache(&shapes[si], fmts[fi], paged, 0, 0, N_MAX, bits[paged]);
            }
            const size_t nb = sizeof(float) * shapes[si].H * shapes[si].d;
            KV_CHECK(!memcmp(bits[0], bits[1], nb), "%s %s: paged == contiguous, bit for bit",
                     shapes[si].name, kv_quant_name(fmts[fi]));
        }
    for (int paged = 0; paged < 2; paged++) /* a window of 300 behind 4 sinks, 700 positions */
        check_cache(&shapes[0], KV_QF_F16, paged, 300, 4, N_MAX, NULL);
    check_cache(&shapes[2], KV_QF_INT8, 1, 300, 4, N_MAX, NULL);
    /* tensor cores: G 16 (one head block, four warps over a tile's keys), MQA of 32 heads (two
     * blocks, two warps each), fp16 MQA at d 128 (on a GPU of 99 KiB a block, KVEMU_SM=89, two
     * stages where three do not fit), bf16 MQA */
    const shape big[] = {{"GQA G16 d128", 32, 2, 128}, {"MQA G32 d64", 32, 1, 64},
                         {"MQA G8 d128", 8, 1, 128}};
    const int bigf[3] = {KV_QF_INT8, KV_QF_F16, KV_QF_F16};
    for (int si = 0; si < 3; si++) {
        for (int paged = 0; paged < 2; paged++) {
            kv_rng_seed(&rng, 501 + (uint64_t)si);
            check_cache(&big[si], bigf[si], paged, 0, 0, N_MAX, bits[paged]);
        }
        KV_CHECK(!memcmp(bits[0], bits[1], sizeof(float) * big[si].H * big[si].d),
                 "%s: paged == contiguous, bit for bit", big[si].name);
    }
    check_cache(&shapes[2], KV_QF_BF16, 1, 0, 0, N_MAX, NULL);
    /* the staged fp32 tiles: KIVI, and keys rotated at attention (paged == contiguous there) */
    check_cache(&shapes[0], KV_QF_INT4_KIVI, 0, 0, 0, N_MAX, NULL);
    check_cache(&shapes[2], KV_QF_INT2_KIVI, 0, 0, 0, N_MAX, NULL);
    pos_cache = 1;
    for (int paged = 0; paged < 2; paged++) {
        kv_rng_seed(&rng, 977);
        check_cache(&shapes[0], KV_QF_F16, paged, 300, 4, N_MAX, bits[paged]);
    }
    KV_CHECK(!memcmp(bits[0], bits[1], sizeof(float) * 8 * 64),
             "KV_POS_CACHE: paged == contiguous, bit for bit");
    check_cache(&shapes[2], KV_QF_INT8, 0, 300, 4, N_MAX, NULL);
    pos_cache = 0;
    check_refusals();
    printf("max |err| / bound %.3g (CUDA cores), %.3g (tensor cores)\n", worst_ratio, worst_mma);
    printf("%d passed, %d failed\n", kv_test_passed, kv_test_failed);
    return kv_test_failed ? 1 : 0;
}
