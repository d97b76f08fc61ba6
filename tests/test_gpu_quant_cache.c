/* Chapter 04, phase 2, on the GPU: the device cache against the CPU cache.
 *
 *  - every format: the same K/V rows (a prefill chunk, then single tokens) written by
 *    kv_cache_write_seq() and kvcu_cache_write_seq() leave the same bytes: codes and
 *    metadata of every written row, fp8 scales, the KIVI window rows in use, and every
 *    dequantized element bit for bit (quantization rounding matches exactly, docs/design.md §8);
 *  - attention over the two caches (fused dequantization in both) within the fp32
 *    tolerance: they read identical values and differ only in summation order;
 *  - the engine end to end with each format on both devices (finite logits; top-1 agreement
 *    of the two printed).
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

static kv_rng rng;

static const int formats[] = {KV_QF_F32,      KV_QF_F16,      KV_QF_BF16,
                              KV_QF_INT8,     KV_QF_INT8_G32, KV_QF_INT4_G32,
                              KV_QF_FP8_E4M3, KV_QF_FP8_E5M2, KV_QF_INT4_KIVI,
                              KV_QF_INT2_KIVI};
#define N_FORMATS (int)(sizeof formats / sizeof formats[0])

static kv_config small_config(int L, int H, int Hkv, int d) { return kv_test_config(L, H, Hkv, d, 512); }

static void *upload(const void *h, size_t bytes)
{
    void *d = NULL;
    kv_err e;
    if (kvcu_malloc(&d, bytes, &e) || kvcu_upload(d, h, bytes, &e)) {
        KV_CHECK(0, "upload: %s", e.msg);
        kvcu_free(d);
        return NULL;
    }
    return d;
}

static int same_f32_bits(float a, float b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, 4); }

static void check_format(int fmt, int per_head, int d, int H, int Hkv, int n, int prefill)
{
    const kv_config cfg = small_config(2, H, Hkv, d);
    kv_cache_spec s = kv_cache_spec_default(2, n);
    s.quant.dtype = fmt;
    s.quant.fp8_per_head = per_head;
    s.quant.kivi_window = 64;
    const char *name = kv_quant_name(fmt);
    kv_cache c, g; /* g: the device cache's bytes, viewed through a CPU cache of the same spec */
    kvcu_cache *dc = NULL;
    kv_err e;
    if (kv_cache_create(&c, &cfg, &s, &e) || kv_cache_create(&g, &cfg, &s, &e) ||
        kvcu_cache_create(&dc, &cfg, &s, &e)) {
        KV_CHECK(0, "%s: create: %s", name, e.msg);
        return;
    }
    KV_CHECK(kvcu_cache_mem_bytes(dc) == c.mem_bytes, "%s: same buffer size", name);
    const int kvdim = Hkv * d, slot = 1, layer = 1;
    float *k = malloc(sizeof(float) * n * kvdim), *v = malloc(sizeof(float) * n * kvdim);
    for (int i = 0; i < n * kvdim; i++) {
        k[i] = kv_rng_uniform(&rng, -1.0f, 1.0f) * ((i % d) % 13 == 5 ? 9.0f : 1.0f);
        v[i] = kv_rng_uniform(&rng, -0.7f, 0.7f);
    }
    k[3] = 1e-30f;  /* specials the formats document: a subnormal-range value, ties, a NaN */
    v[kvdim + 5] = 0.0f;
    k[(size_t)(n - 1) * kvdim + 2] = NAN; /* poisons one group of the last token */
    float *dk = upload(k, sizeof(float) * n * kvdim), *dv = upload(v, sizeof(float) * n * kvdim);
    int ok = kv_cache_write_seq(&c, layer, slot, 0, prefill, k, v, &e) == KV_OK &&
             kvcu_cache_write_seq(dc, layer, slot, 0, prefill, dk, dv, &e) == KV_OK;
    for (int t = prefill; t < n && ok; t++)
        ok = kv_cache_write_seq(&c, layer, slot, t, 1, k + (size_t)t * kvdim, v + (size_t)t * kvdim, &e) == KV_OK &&
             kvcu_cache_write_seq(dc, layer, slot, t, 1, dk + (size_t)t * kvdim, dv + (size_t)t * kvdim, &e) == KV_OK;
    KV_CHECK(ok, "%s: writes: %s", name, e.msg);
    KV_CHECK(kvcu_cache_download(dc, g.mem, g.mem_bytes, &e) == KV_OK, "download: %s", e.msg);
    memcpy(g.qlen, c.qlen, sizeof(int) * cfg.n_layers * s.n_slots); /* host counts: same rule */

    long bad_bytes = 0, bad_elems = 0;
    for (int h = 0; h < Hkv; h++)
        for (int role = 0; role < 2; role++) {
            const kv_head_view a = kv_cache_view(&c, layer, slot, h, role), b = kv_cache_view(&g, layer, slot, h, role);
            const int64_t rows = kvq_is_kivi(fmt) ? a.q : n;
            bad_bytes += memcmp(a.codes, b.codes, kv_quant_code_bytes(fmt, rows, d)) != 0;
            if (a.meta) bad_bytes += memcmp(a.meta, b.meta, kv_quant_meta_bytes(fmt, role, rows, d)) != 0;
            bad_bytes += !same_f32_bits(a.scale, b.scale);
            for (int t = 0; t < n; t++)
                for (int j = 0; j < d; j++) {
                    const float x = kv_cache_elem(&a, t, j), y = kv_cache_elem(&b, t, j);
                    if (!same_f32_bits(x, y) && bad_elems++ < 3)
                        printf("  %s %s h %d t %d j %d: cpu %.9g gpu %.9g\n", name, role ? "K" : "V",
                               h, t, j, x, y);
                }
        }
    KV_CHECK(bad_bytes == 0 && bad_elems == 0, "%s%s d %d: CPU and GPU caches hold the same bytes "
             "(%ld planes, %ld elements differ)", name, per_head ? "/head" : "", d, bad_bytes, bad_elems);

    /* attention at the second-to-last position (the last holds the NaN) on both devices */
    float *q = malloc(sizeof(float) * H * d), *o = malloc(sizeof(float) * H * d),
          *og = malloc(sizeof(float) * H * d), *dout = NULL;
    for (int i = 0; i < H * d; i++) q[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
    float *dq = upload(q, sizeof(float) * H * d);
    kvcu_malloc((void **)&dout, sizeof(float) * H * d, &e);
    int rc = kv_attention(&c, layer, slot, n - 2, q, o, H);
    rc |= kvcu_cache_attention(dc, layer, slot, n - 2, dq, dout, H, &e);
    rc |= kvcu_download(og, dout, sizeof(float) * H * d, &e);
    char what[64];
    snprintf(what, sizeof what, "%s%s attention d %d", name, per_head ? "/head" : "", d);
    KV_CHECK(rc == KV_OK && kv_test_compare(what, og, o, (long)H * d, KV_TOL_F32_ATOL,
                                            KV_TOL_F32_RTOL) == 0, "%s: GPU vs CPU", what);
    kvcu_free(dq); kvcu_free(dout); kvcu_free(dk); kvcu_free(dv);
    free(q); free(o); free(og); free(k); free(v);
    kvcu_cache_free(dc);
    kv_cache_free(&c);
    kv_cache_free(&g);
}

/* Greedy generation on both devices with the same cache format. */
static void check_engine(void)
{
    kv_config cfg = small_config(2, 4, 2, 32);
    cfg.vocab_size = 96;
    kv_model m;
    kv_err e;
    if (kv_test_model_random(&m, &cfg, 11)) return;
    enum { PROMPT = 90, STEPS = 12 };
    int prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int)(kv_rng_u32(&rng) % 96);
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const int fmt = formats[fi];
        kv_cache_spec s = kv_cache_spec_default(1, PROMPT + STEPS);
        s.quant.dtype = fmt;
        s.quant.kivi_window = 32; /* the prompt spills, and so do some decode steps */
        kv_backend *bc = NULL, *bg = NULL;
        if (kv_backend_cpu(&bc, &m, &s, &e) || kvcu_backend_create(&bg, &m, &s, &e)) {
            KV_CHECK(0, "%s: backends: %s", kv_quant_name(fmt), e.msg);
            kv_backend_destroy(bc);
            continue;
        }
        float lc[96], lg[96];
        int agree = 0, finite = 1, rc = 0, tok = 0;
        kv_seq q = {0, 0, PROMPT, prompt};
        for (int t = 0; t < STEPS && !rc; t++) {
            rc = bc->forward(bc, &q, 1, lc, NULL, &e);
            if (!rc) rc = bg->forward(bg, &q, 1, lg, NULL, &e);
            int ac = 0, ag = 0;
            for (int i = 0; i < 96; i++) {
                finite &= isfinite(lc[i]) && isfinite(lg[i]);
                if (lc[i] > lc[ac]) ac = i;
                if (lg[i] > lg[ag]) ag = i;
            }
            agree += ac == ag;
            tok = ac; /* both continue with the CPU's token: one text */
            q = (kv_seq){0, PROMPT + t, 1, &tok};
        }
        KV_CHECK(rc == KV_OK && finite, "%s: engine runs on CPU and GPU, finite logits: %s",
                 kv_quant_name(fmt), rc ? e.msg : "");
        printf("  engine %-9s: GPU top-1 = CPU top-1 on %d/%d steps\n", kv_quant_name(fmt),
               agree, STEPS);
        kv_backend_destroy(bc);
        kv_backend_destroy(bg);
    }
    kv_model_free(&m);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_rng_seed(&rng, 4040);
    for (int i = 0; i < N_FORMATS; i++) {
        check_format(formats[i], 0, 64, 4, 2, 150, 100);
        if (kvq_is_fp8(formats[i])) check_format(formats[i], 1, 64, 4, 2, 70, 40);
    }
    check_format(KV_QF_INT8_G64, 0, 128, 4, 1, 40, 33);
    check_format(KV_QF_INT4_KIVI, 0, 128, 4, 1, 140, 70);
    check_format(KV_QF_INT4_G32, 0, 128, 4, 1, 40, 33); /* four groups a row, four warps */
    check_engine();
    return kv_test_finish();
}
