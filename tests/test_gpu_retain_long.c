/*
 * Chapter 09 on the GPU: one prefill step longer than a grid's y dimension (label slow).
 *
 * kvcu_retain_attend() reads the step's new keys back with one block per (key, KV head). A
 * grid holds at most 65 535 blocks in y and z (2^31 - 1 in x): with the keys in y, a step of
 * more than 65 535 tokens failed its launch. Here one step of 65 600 tokens (Quest, so each
 * row reads a few pages and the attention stays linear in the length) on a one-layer,
 * one-KV-head cache of d = 8: the call succeeds, and the state it leaves (each head's page
 * bounds, built from the keys read back) and its outputs equal the CPU twin
 * kv_retain_attend()'s on the same rows, the outputs within the fp32 tolerances. Exits 77
 * without a device.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/kv_test_gpu.h"
#include "kv_retain.h"
#include "kv_rng.h"
#include "kvcu.h"

#define N 65600 /* one step, more than 65 535 */
#define D 8

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_err e;
    kv_config cfg = {0};
    cfg.dim = 2 * D;
    cfg.hidden_dim = cfg.dim;
    cfg.n_layers = 1;
    cfg.n_heads = 2; /* G = 2 */
    cfg.n_kv_heads = 1;
    cfg.vocab_size = 2;
    cfg.seq_len = N;
    kv_config_set_defaults(&cfg);
    kv_cache_spec s = kv_cache_spec_default(1, N);
    s.retain.select = KV_SELECT_QUEST;
    s.retain.budget = 32; /* two pages a head, and the row's own */
    const size_t nkv = (size_t)N * D, nq = (size_t)N * 2 * D;
    float *k = malloc(nkv * 4), *v = malloc(nkv * 4), *q = malloc(nq * 4);
    float *want = malloc(nq * 4), *got = malloc(nq * 4);
    kv_rng r;
    kv_rng_seed(&r, 9);
    for (size_t i = 0; i < nkv; i++) k[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < nkv; i++) v[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; i < nq; i++) q[i] = kv_rng_uniform(&r, -1.0f, 1.0f);

    kv_cache c;
    int rc = kv_retain_cache_create(&c, &cfg, &s, &e);
    if (!rc) rc = kv_cache_write_seq(&c, 0, 0, 0, N, k, v, &e);
    if (!rc) rc = kv_retain_attend(&c, 0, 0, 0, N, q, want, &e);
    KV_CHECK(rc == KV_OK, "CPU: %s", e.msg);

    kvcu_cache *g = NULL;
    float *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL;
    if (!rc) rc = kvcu_retain_cache_create(&g, &cfg, &s, &e);
    if (!rc) rc = kvcu_malloc((void **)&dk, nkv * 4, &e);
    if (!rc) rc = kvcu_malloc((void **)&dv, nkv * 4, &e);
    if (!rc) rc = kvcu_malloc((void **)&dq, nq * 4, &e);
    if (!rc) rc = kvcu_malloc((void **)&dout, nq * 4, &e);
    if (!rc) rc = kvcu_upload(dk, k, nkv * 4, &e);
    if (!rc) rc = kvcu_upload(dv, v, nkv * 4, &e);
    if (!rc) rc = kvcu_upload(dq, q, nq * 4, &e);
    if (!rc) rc = kvcu_cache_write_seq(g, 0, 0, 0, N, dk, dv, &e);
    KV_CHECK(rc == KV_OK, "device setup: %s", e.msg);
    if (!rc) {
        rc = kvcu_retain_attend(g, 0, 0, 0, N, dq, dout, &e);
        KV_CHECK(rc == KV_OK, "a %d-token step: %s", N, e.msg);
    }
    if (!rc) rc = kvcu_download(got, dout, nq * 4, &e);
    if (!rc) {
        KV_CHECK(kv_test_compare("outputs", got, want, (long)nq, KV_TOL_F32_ATOL,
                                 KV_TOL_F32_RTOL) == 0, "outputs differ from the CPU's");
        const kv_retain_head *hc = kv_retain_at(c.retain, 0, 0, 0);
        const kv_retain_head *hg = kv_retain_at(kvcu_cache_retain(g), 0, 0, 0);
        KV_CHECK(hc->kept.n == hg->kept.n && hc->kept.n == N &&
                     !memcmp(hc->kept.pos, hg->kept.pos, (size_t)N * sizeof(int)),
                 "kept positions differ (%d vs %d)", hc->kept.n, hg->kept.n);
        /* the keys the device read back for append (Quest keeps a copy of each) */
        KV_CHECK(hc->keys && hg->keys && !memcmp(hc->keys, hg->keys, nkv * sizeof(float)),
                 "the keys read back differ from the CPU's");
    }
    kvcu_free(dk);
    kvcu_free(dv);
    kvcu_free(dq);
    kvcu_free(dout);
    kvcu_retain_cache_free(g);
    kv_retain_cache_free(&c);
    free(k);
    free(v);
    free(q);
    free(want);
    free(got);
    return kv_test_finish();
}
