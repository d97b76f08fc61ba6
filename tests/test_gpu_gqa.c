/* Chapter 03 on the GPU: decode attention v1 (one block per query head) and v2 (one block per
 * KV head, the group packed) against the CPU's kv_attn_decode().
 *
 *  - G in {1, 2, 4, 8, H} (H = 16) x d in {64, 128} x lengths 1, 129, 300 (129 and 300 are
 *    not multiples of the 128-thread tile; 1 leaves most threads idle): both versions within
 *    the fp32 tolerances of kv_test.h;
 *  - GQA on the GPU equals the GPU's own duplicated-MHA run (v2 with G > 1 vs v1 on copies);
 *  - an MQA group too large for v2's shared memory (H 128, d 128) falls back to v1 and is
 *    still right; version 4 is refused;
 *  - the engine (kvcu_forward, v2 inside) matches kv_forward() on an H = 8 model pooled to
 *    G = 4 and G = 8, over a prefill of 150 tokens and 4 decode steps;
 *  - (emulation) a device too full for a version's scratch: KV_ERR_NOMEM, and once memory is
 *    free again the same call succeeds with the bits of a run that never failed (a failed
 *    cudaMalloc must not stay behind as the runtime's last error for the next launch check).
 * Exits 77 (skipped) without a usable device. */
#include "kv_attention.h"
#include "kv_convert.h"
#include "kv_rng.h"
#include "common/kv_test.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"
#ifdef KV_CUDA_EMULATION
#include "kvemu.h"
#endif

#include <string.h>

static void fill(float *x, size_t n, kv_rng *r)
{
    for (size_t i = 0; i < n; i++) x[i] = kv_rng_uniform(r, -1.0f, 1.0f);
}

/* device copies of q [H][d], k, v [H_kv][max_seq][d]; out [H][d] */
typedef struct {
    float *q, *k, *v, *out;
} dev_bufs;

static int upload(dev_bufs *g, const float *q, const float *k, const float *v, int H, int Hkv,
                  int d, int max_seq, kv_err *e)
{
    const size_t nq = (size_t)H * d * 4, nk = (size_t)Hkv * max_seq * d * 4;
    memset(g, 0, sizeof *g);
    int rc = kvcu_malloc((void **)&g->q, nq, e);
    if (!rc) rc = kvcu_malloc((void **)&g->k, nk, e);
    if (!rc) rc = kvcu_malloc((void **)&g->v, nk, e);
    if (!rc) rc = kvcu_malloc((void **)&g->out, nq, e);
    if (!rc) rc = kvcu_upload(g->q, q, nq, e);
    if (!rc) rc = kvcu_upload(g->k, k, nk, e);
    if (!rc) rc = kvcu_upload(g->v, v, nk, e);
    return rc;
}

static void release(dev_bufs *g)
{
    kvcu_free(g->q); kvcu_free(g->k); kvcu_free(g->v); kvcu_free(g->out);
}

/* One (H, G, d) case over several lengths: CPU vs v1 vs v2. */
static void attention_case(int H, int G, int d, const int *lens, int n_lens, kv_rng *r)
{
    const int Hkv = H / G;
    int max_seq = 1;
    for (int i = 0; i < n_lens; i++) if (lens[i] > max_seq) max_seq = lens[i];
    float *q = kv_calloc((size_t)H * d * 4);                 /* [H][d] */
    float *k = kv_calloc((size_t)Hkv * max_seq * d * 4);     /* [H_kv][max_seq][d] */
    float *v = kv_calloc((size_t)Hkv * max_seq * d * 4);
    float *ref = kv_calloc((size_t)H * d * 4), *got = kv_calloc((size_t)H * d * 4);
    fill(q, (size_t)H * d, r);
    fill(k, (size_t)Hkv * max_seq * d, r);
    fill(v, (size_t)Hkv * max_seq * d, r);
    kv_err e;
    dev_bufs g;
    int rc = upload(&g, q, k, v, H, Hkv, d, max_seq, &e);
    KV_CHECK(rc == KV_OK, "upload: %s", e.msg);
    for (int li = 0; li < n_lens && !rc; li++) {
        const int len = lens[li];
        KV_CHECK(kv_attn_decode(q, k, v, ref, H, Hkv, d, max_seq, len) == KV_OK, "cpu");
        for (int ver = 1; ver <= 2; ver++) {
            char what[96];
            snprintf(what, sizeof what, "v%d H %d G %d d %d len %d", ver, H, G, d, len);
            memset(got, 0xff, (size_t)H * d * 4); /* NaN: a head left unwritten fails */
            rc = kvcu_attn_decode_version(ver, g.q, g.k, g.v, g.out, NULL, H, Hkv, d, max_seq, len, &e);
            if (!rc) rc = kvcu_download(got, g.out, (size_t)H * d * 4, &e);
            KV_CHECK(rc == KV_OK, "%s: %s", what, e.msg);
            KV_CHECK(!rc && kv_test_compare(what, got, ref, (long)H * d, KV_TOL_F32_ATOL,
                                            KV_TOL_F32_RTOL) == 0, "%s matches the CPU", what);
        }
    }
    release(&g);
    kv_free(q); kv_free(k); kv_free(v); kv_free(ref); kv_free(got);
}

static void test_attention_grid(void)
{
    kv_rng r;
    kv_rng_seed(&r, 11);
    const int Gs[] = {1, 2, 4, 8, 16}, ds[] = {64, 128}, lens[] = {1, 129, 300};
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 5; gi++) attention_case(16, Gs[gi], ds[di], lens, 3, &r);
    /* H 128 MQA, d 128: the group's queries (64 KiB) exceed v2's shared memory: v1 runs */
    const int short_len[] = {7};
    attention_case(128, 128, 128, short_len, 1, &r);
}

/* GQA on the GPU (v2) == duplicated MHA on the GPU (v1 on copies), G 4, d 64, len 200 */
static void test_gpu_gqa_equals_duplicated(void)
{
    const int H = 8, G = 4, Hkv = 2, d = 64, n = 200;
    kv_rng r;
    kv_rng_seed(&r, 12);
    float *q = kv_calloc((size_t)H * d * 4), *k = kv_calloc((size_t)Hkv * n * d * 4);
    float *v = kv_calloc((size_t)Hkv * n * d * 4);
    float *k2 = kv_calloc((size_t)H * n * d * 4), *v2 = kv_calloc((size_t)H * n * d * 4);
    float *o1 = kv_calloc((size_t)H * d * 4), *o2 = kv_calloc((size_t)H * d * 4);
    fill(q, (size_t)H * d, &r);
    fill(k, (size_t)Hkv * n * d, &r);
    fill(v, (size_t)Hkv * n * d, &r);
    for (int h = 0; h < H; h++) {
        memcpy(k2 + (size_t)h * n * d, k + (size_t)(h / G) * n * d, (size_t)n * d * 4);
        memcpy(v2 + (size_t)h * n * d, v + (size_t)(h / G) * n * d, (size_t)n * d * 4);
    }
    kv_err e;
    dev_bufs a, b;
    int rc = upload(&a, q, k, v, H, Hkv, d, n, &e);
    if (!rc) rc = upload(&b, q, k2, v2, H, H, d, n, &e);
    if (!rc) rc = kvcu_attn_decode_version(2, a.q, a.k, a.v, a.out, NULL, H, Hkv, d, n, n, &e);
    if (!rc) rc = kvcu_attn_decode_version(1, b.q, b.k, b.v, b.out, NULL, H, H, d, n, n, &e);
    if (!rc) rc = kvcu_download(o1, a.out, (size_t)H * d * 4, &e);
    if (!rc) rc = kvcu_download(o2, b.out, (size_t)H * d * 4, &e);
    KV_CHECK(rc == KV_OK, "run: %s", e.msg);
    KV_CHECK(!rc && kv_test_compare("GQA v2 vs duplicated MHA v1", o1, o2, (long)H * d,
                                    KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "GPU GQA equals GPU duplicated MHA");
    KV_CHECK(kvcu_attn_decode_version(5, a.q, a.k, a.v, a.out, NULL, H, Hkv, d, n, n, &e) == KV_ERR_ARG,
             "version 5 refused (there are v1 to v4)");
    rc = kvcu_attn_decode_version(4, a.q, a.k, a.v, a.out, NULL, H, Hkv, d, n, n, &e);
    if (!rc) rc = kvcu_download(o1, a.out, (size_t)H * d * 4, &e);
    KV_CHECK(!rc && kv_test_compare("GQA v4 vs duplicated MHA v1", o1, o2, (long)H * d,
                                    KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
             "GPU GQA v4 equals GPU duplicated MHA: %s", rc ? e.msg : "");
    release(&a);
    release(&b);
    kv_free(q); kv_free(k); kv_free(v); kv_free(k2); kv_free(v2); kv_free(o1); kv_free(o2);
}

/* The engine with v2 inside, on pooled models: kvcu_forward vs kv_forward. */
static void test_engine_pooled(void)
{
    kv_err e;
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = 512; c.hidden_dim = 72; c.n_layers = 1; c.n_heads = 8; c.n_kv_heads = 8;
    c.vocab_size = 97; c.seq_len = 160;
    kv_config_set_defaults(&c);
    kv_model mha = {0};
    KV_CHECK(kv_model_alloc(&mha, &c, &e) == KV_OK, "alloc: %s", e.msg);
    kv_model_randomize(&mha, 5);
    const int Gs[] = {4, 8};
    int tok[154];
    for (int i = 0; i < 154; i++) tok[i] = (i * 31 + 7) % 97;
    for (int gi = 0; gi < 2; gi++) {
        kv_model m = {0};
        kv_backend *cpu = NULL, *gpu = NULL;
        kv_cache_spec spec = kv_cache_spec_default(1, 160);
        int rc = kv_convert_pool_kv_heads(&m, &mha, 8 / Gs[gi], &e);
        if (!rc) rc = kv_backend_cpu(&cpu, &m, &spec, &e);
        if (!rc) rc = kvcu_backend_create(&gpu, &m, &spec, &e);
        KV_CHECK(rc == KV_OK, "G %d setup: %s", Gs[gi], e.msg);
        float lc[97], lg[97];
        for (int step = 0; step < 5 && !rc; step++) {
            const int pos = step ? 149 + step : 0, n = step ? 1 : 150;
            kv_seq s = {0, pos, n, tok + pos};
            rc = cpu->forward(cpu, &s, 1, lc, NULL, &e);
            if (!rc) rc = gpu->forward(gpu, &s, 1, lg, NULL, &e);
            KV_CHECK(rc == KV_OK, "G %d step %d: %s", Gs[gi], step, e.msg);
            char what[64];
            snprintf(what, sizeof what, "engine G %d step %d", Gs[gi], step);
            KV_CHECK(!rc && kv_test_compare(what, lg, lc, 97, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL) == 0,
                     "%s: GPU logits match the CPU", what);
        }
        if (cpu) kv_backend_destroy(cpu);
        if (gpu) kv_backend_destroy(gpu);
        kv_model_free(&m);
    }
    kv_model_free(&mha);
}

#ifdef KV_CUDA_EMULATION
/* Each version on a full device, then again after the memory is freed: NOMEM, then the bits
 * of a run that never failed. */
static void test_nomem_then_retry(void)
{
    const int H = 8, Hkv = 2, d = 64, n = 600; /* 600 > 512: v3 has two partitions */
    kv_rng r;
    kv_rng_seed(&r, 31);
    float *q = kv_calloc((size_t)H * d * 4), *k = kv_calloc((size_t)Hkv * n * d * 4);
    float *v = kv_calloc((size_t)Hkv * n * d * 4);
    float *o1 = kv_calloc((size_t)H * d * 4), *o2 = kv_calloc((size_t)H * d * 4);
    fill(q, (size_t)H * d, &r);
    fill(k, (size_t)Hkv * n * d, &r);
    fill(v, (size_t)Hkv * n * d, &r);
    kv_err e;
    dev_bufs a;
    int rc = upload(&a, q, k, v, H, Hkv, d, n, &e);
    KV_CHECK(rc == KV_OK, "nomem: upload: %s", e.msg);
    for (int ver = 1; ver <= 3 && !rc; ver++) {
        rc = kvcu_attn_decode_version(ver, a.q, a.k, a.v, a.out, NULL, H, Hkv, d, n, n, &e);
        if (!rc) rc = kvcu_download(o1, a.out, (size_t)H * d * 4, &e);
        KV_CHECK(rc == KV_OK, "v%d: %s", ver, e.msg);
        if (rc) break;
        kvemu_set_mem_limit(kvemu_mem_in_use() + 64); /* no room for the scores scratch */
        const int full = kvcu_attn_decode_version(ver, a.q, a.k, a.v, a.out, NULL, H, Hkv, d, n,
                                                  n, &e);
        kvemu_set_mem_limit(0);
        KV_CHECK(full == KV_ERR_NOMEM, "v%d, device full: KV_ERR_NOMEM (got %d)", ver, full);
        rc = kvcu_attn_decode_version(ver, a.q, a.k, a.v, a.out, NULL, H, Hkv, d, n, n, &e);
        if (!rc) rc = kvcu_download(o2, a.out, (size_t)H * d * 4, &e);
        KV_CHECK(rc == KV_OK, "v%d after the device is freed: %s", ver, e.msg);
        KV_CHECK(!rc && memcmp(o1, o2, (size_t)H * d * 4) == 0,
                 "v%d after a failed allocation == before, bit for bit", ver);
    }
    release(&a);
    kv_free(q); kv_free(k); kv_free(v); kv_free(o1); kv_free(o2);
}
#endif

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    test_attention_grid();
    test_gpu_gqa_equals_duplicated();
    test_engine_pooled();
#ifdef KV_CUDA_EMULATION
    test_nomem_then_retry();
#endif
    return kv_test_finish();
}
