/* Chapter 10 on GPUs: the NCCL all-reduce of the tensor-parallel ranks (cuda/engine/kvcu_tp.h)
 * against the CPU group's rank-order sum (kv_tp.h).
 *
 * Needs at least 2 GPUs: exits 77 (skipped) with fewer. For p = 2, 4, 8 (as many as there are
 * GPUs) and lengths that are and are not multiples of p (1, 7, 4096·p + 3): every rank ends
 * with the same bits; each element equals the rank-order fp32 sum within the fp32
 * reduction-order tolerance of kv_test.h (NCCL adds in its own order); the counters give
 * 2·L-style counts and ring bytes 2·(p-1)/p·n·4 (kv_tp_ring_bytes). Also: more ranks than
 * GPUs is refused with a message naming both counts. The buffers are filled by pageable
 * cudaMemcpy on each GPU's default stream, whose DMA may still be in flight when it returns:
 * kvcu_tp_allreduce() must order its NCCL streams after it (an event), or NCCL may sum stale
 * bytes.
 *
 * The group (kvcu_tp: a thread per GPU running kvcu_forward_shard, ncclAllReduce in the
 * hook): for p = 2, 4 GPUs, MHA and GQA (p = 4 > H_kv = 2: KV heads replicated), greedy
 * tokens equal the one-GPU kvcu_forward's and the CPU group's of the same p (only the order
 * of the Wo and W2 additions differs; margins far above it), last logits within the fp32
 * tolerance of both, 2 L all-reduces per step. */
#include "common/kv_test.h"
#include "common/test_tp_common.h"

#include "kv_generate.h"
#include "kv_rng.h"
#include "kv_tp.h"
#include "kvcu.h"
#include "kvcu_tp.h"

#include <cuda_runtime.h>
#include <string.h>

static void test_sum(int p, int64_t n)
{
    kv_err e;
    kvcu_tp_comm *c = NULL;
    int ok = kvcu_tp_comm_create(&c, p, &e) == KV_OK;
    KV_CHECK(ok, "p=%d: create: %s", p, e.msg);
    if (!ok) return;
    float *host = malloc(sizeof(float) * (size_t)(p * n)), *got = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)n), *first = malloc(sizeof(float) * (size_t)n);
    float *dev[64] = {0};
    kv_rng rng;
    kv_rng_seed(&rng, 100 + (uint64_t)p);
    for (int64_t i = 0; i < p * n; i++) host[i] = (float)(kv_rng_u32(&rng) % 20001) / 10000.0f - 1.0f;
    for (int64_t i = 0; i < n; i++) { /* the CPU group's order: rank 0, then 1, ... */
        ref[i] = host[i];
        for (int r = 1; r < p; r++) ref[i] += host[(int64_t)r * n + i];
    }
    for (int r = 0; r < p && ok; r++) {
        ok = cudaSetDevice(r) == cudaSuccess && cudaMalloc((void **)&dev[r], sizeof(float) * n) == cudaSuccess &&
             cudaMemcpy(dev[r], host + (int64_t)r * n, sizeof(float) * n, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    KV_CHECK(ok, "p=%d: device buffers", p);
    ok = ok && kvcu_tp_allreduce(c, dev, n, &e) == KV_OK;
    KV_CHECK(ok, "p=%d n=%lld: all-reduce: %s", p, (long long)n, e.msg);
    long bad = 0;
    int same = 1;
    for (int r = 0; r < p && ok; r++) {
        cudaSetDevice(r);
        ok = cudaMemcpy(got, dev[r], sizeof(float) * n, cudaMemcpyDeviceToHost) == cudaSuccess;
        if (r == 0) memcpy(first, got, sizeof(float) * n);
        else same &= !memcmp(first, got, sizeof(float) * n);
        bad += kv_test_compare("nccl sum", got, ref, (long)n, KV_TOL_F32_ATOL, KV_TOL_F32_RTOL);
    }
    KV_CHECK(ok && !bad, "p=%d n=%lld: NCCL sum outside the fp32 tolerance of the rank-order sum",
             p, (long long)n);
    KV_CHECK(same, "p=%d n=%lld: ranks hold different bits after the all-reduce", p, (long long)n);
    KV_CHECK(kvcu_tp_allreduces(c) == 1 && kvcu_tp_bytes_per_rank(c) == kv_tp_ring_bytes(p, (double)n),
             "p=%d: counters %lld all-reduces, %.0f bytes (ring formula %.0f)", p,
             (long long)kvcu_tp_allreduces(c), kvcu_tp_bytes_per_rank(c), kv_tp_ring_bytes(p, (double)n));
    for (int r = 0; r < p; r++) {
        cudaSetDevice(r);
        cudaFree(dev[r]);
    }
    kvcu_tp_comm_destroy(c);
    free(host);
    free(got);
    free(ref);
    free(first);
}

/* ---- the group: p GPUs against one ---------------------------------------------------------- */

#define CAP 48
#define NG 16

/* The model shape of this file: dim 64, 3 layers, 8 heads, H_kv and the MLP width given. */
static int make_model(kv_model *m, int hidden, int Hkv, uint64_t seed)
{
    return tp_make_model(m, 64, hidden, 3, 8, Hkv, CAP, seed);
}

static void test_group(const kv_model *m, int p, const char *what)
{
    kv_err e;
    const int V = m->config.vocab_size, L = m->config.n_layers;
    kv_cache_spec spec = kv_cache_spec_default(1, CAP);
    kv_backend *one = NULL, *cpu = NULL, *grp = NULL;
    int ok = kvcu_backend_create(&one, m, &spec, &e) == KV_OK &&
             kv_tp_backend(&cpu, m, p, &spec, &e) == KV_OK &&
             kvcu_tp_backend(&grp, m, p, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s p=%d: create: %s", what, p, e.msg);
    if (ok) {
        int want[NG], wantc[NG], got[NG];
        float l1[128], lc[128], lg[128];
        kv_gen_opts o = {KV_MODE_CACHED, 0, NG, NULL, NULL, NULL, l1};
        ok = kv_generate(one, PROMPT, NP, &o, want, NULL, &e) == KV_OK;
        o.last_logits = lc;
        ok = ok && kv_generate(cpu, PROMPT, NP, &o, wantc, NULL, &e) == KV_OK;
        o.last_logits = lg;
        ok = ok && kv_generate(grp, PROMPT, NP, &o, got, NULL, &e) == KV_OK;
        KV_CHECK(ok, "%s p=%d: generate: %s", what, p, e.msg);
        if (ok) {
            KV_CHECK(!memcmp(got, want, sizeof got), "%s p=%d: greedy tokens differ from one GPU",
                     what, p);
            KV_CHECK(!memcmp(got, wantc, sizeof got),
                     "%s p=%d: greedy tokens differ from the CPU group", what, p);
            KV_CHECK(!kv_test_compare("logits vs one GPU", lg, l1, V, KV_TOL_F32_ATOL,
                                      KV_TOL_F32_RTOL), "%s p=%d: logits vs one GPU", what, p);
            KV_CHECK(!kv_test_compare("logits vs CPU group", lg, lc, V, KV_TOL_F32_ATOL,
                                      KV_TOL_F32_RTOL), "%s p=%d: logits vs CPU group", what, p);
            const kvcu_tp_comm *c = kvcu_tp_comm_of((kvcu_tp *)grp->impl);
            KV_CHECK(kvcu_tp_allreduces(c) == (int64_t)2 * L * NG, "%s p=%d: %lld all-reduces, "
                     "want 2 L per step = %d", what, p, (long long)kvcu_tp_allreduces(c),
                     2 * L * NG);
        }
    }
    kv_backend_destroy(grp);
    kv_backend_destroy(cpu);
    kv_backend_destroy(one);
}

int main(void)
{
    const int gpus = kvcu_tp_device_count();
    if (gpus < 2) {
        printf("test_gpu_tp: needs at least 2 GPUs, found %d: skipped\n", gpus);
        return KV_TEST_SKIP;
    }
    for (int p = 2; p <= gpus && p <= 8; p *= 2) {
        const int64_t lens[] = {1, 7, 4096 * (int64_t)p + 3};
        for (int i = 0; i < 3; i++) test_sum(p, lens[i]);
    }
    kv_err e;
    kvcu_tp_comm *c = NULL;
    const int rc = kvcu_tp_comm_create(&c, gpus + 1, &e);
    char want[64];
    snprintf(want, sizeof want, "this machine has %d", gpus);
    KV_CHECK(rc == KV_ERR_DEVICE && c == NULL && strstr(e.msg, want),
             "p = GPUs + 1: status %d, message '%s'", rc, e.msg);
    KV_CHECK(kvcu_tp_comm_create(&c, 0, &e) == KV_ERR_ARG, "p = 0 not refused");

    kv_model mha, gqa;
    if (make_model(&mha, 96, 8, 11) || make_model(&gqa, 100, 2, 12)) return 1;
    for (int p = 2; p <= gpus && p <= 4; p *= 2) {
        test_group(&mha, p, "MHA H8/Hkv8");
        test_group(&gqa, p, "GQA H8/Hkv2");
    }
    kv_backend *b = NULL;
    const kv_cache_spec spec1 = kv_cache_spec_default(1, CAP);
    const int rc2 = kvcu_tp_backend(&b, &gqa, 2 * gpus, &spec1, &e);
    KV_CHECK(rc2 != KV_OK && b == NULL, "a group of more ranks than GPUs was made");
    kv_model_free(&mha);
    kv_model_free(&gqa);
    return kv_test_finish();
}
