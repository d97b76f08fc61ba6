/*
 * The one-screen forward pass (engine/kv_forward_min.c) against the engine (kv_forward() through
 * the CPU backend, fp32 contiguous cache): the same logits bit for bit at every position, for
 * MHA and GQA models, whether the engine runs the prompt one token a step or as one prefill,
 * and on one thread or two. Also its refusals.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "kv_backend.h"
#include "kv_forward_min.h"
#include "kv_model.h"

#define STEPS 48

/* Logits of the engine after each of tokens[0..n-1]: one token a step (prefill == 0), or the
 * first half as one prefill step asking for every row's logits, then one token a step. */
static int engine_logits(const kv_model *m, const int *tokens, int n, int prefill, float *out,
                         kv_err *err)
{
    const int V = m->config.vocab_size;
    kv_cache_spec spec = kv_cache_spec_default(1, m->config.seq_len);
    kv_backend *b = NULL;
    int rc = kv_backend_cpu(&b, m, &spec, err);
    if (rc) return rc;
    int t = 0;
    if (prefill) {
        const int half = n / 2;
        kv_seq seq = {0, 0, half, tokens, out};
        rc = b->forward(b, &seq, 1, NULL, NULL, err);
        t = half;
    }
    for (; !rc && t < n; t++) {
        kv_seq seq = {0, t, 1, tokens + t, NULL};
        rc = b->forward(b, &seq, 1, out + (size_t)t * V, NULL, err);
    }
    kv_backend_destroy(b);
    return rc;
}

static void check_model(const char *name, kv_default_model which)
{
    kv_err err = {{0}};
    kv_model m = {0};
    if (kv_model_default(&m, which, &err) != KV_OK) {
        KV_CHECK(0, "%s: %s", name, err.msg);
        return;
    }
    const int V = m.config.vocab_size;
    int tokens[STEPS];
    for (int t = 0; t < STEPS; t++) tokens[t] = (t * 7919 + 13) % V;
    float *mine = calloc((size_t)STEPS * V, sizeof(float));
    float *eng = calloc((size_t)STEPS * V, sizeof(float));
    kv_min_cache c;
    kv_min_state s;
    int rc = kv_min_create(&m, STEPS, &c, &s, &err);
    KV_CHECK(rc == KV_OK && mine && eng, "%s: kv_min_create: %s", name, err.msg);
    for (int t = 0; !rc && t < STEPS; t++) {
        rc = kv_forward_min(&m, &c, &s, tokens[t], t, &err);
        if (!rc) memcpy(mine + (size_t)t * V, s.logits, (size_t)V * sizeof(float));
    }
    KV_CHECK(rc == KV_OK, "%s: kv_forward_min: %s", name, err.msg);
    for (int threads = 1; !rc && threads <= 2; threads++) {
        omp_set_num_threads(threads);
        for (int prefill = 0; prefill <= 1; prefill++) {
            memset(eng, 0, (size_t)STEPS * V * sizeof(float));
            int e = engine_logits(&m, tokens, STEPS, prefill, eng, &err);
            KV_CHECK(e == KV_OK, "%s: engine: %s", name, err.msg);
            int first = -1;
            for (int t = 0; !e && t < STEPS && first < 0; t++)
                if (memcmp(mine + (size_t)t * V, eng + (size_t)t * V, (size_t)V * sizeof(float)))
                    first = t;
            KV_CHECK(!e && first < 0, "%s, %d thread(s), %s: logits equal the engine's bit for "
                     "bit at every position (first difference at %d)", name, threads,
                     prefill ? "prefill then decode" : "one token a step", first);
        }
    }
    omp_set_num_threads(omp_get_num_procs());

    /* refusals name what was wrong */
    rc = kv_forward_min(&m, &c, &s, V, 0, &err);
    KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "token"), "%s: token out of range: %s", name, err.msg);
    rc = kv_forward_min(&m, &c, &s, 0, STEPS, &err);
    KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "position"), "%s: position past the cache: %s",
             name, err.msg);
    kv_min_free(&c, &s);
    kv_min_cache c2;
    kv_min_state s2;
    rc = kv_min_create(&m, m.config.seq_len + 1, &c2, &s2, &err);
    KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "max_seq"), "%s: max_seq past seq_len: %s", name,
             err.msg);
    free(mine);
    free(eng);
    kv_model_free(&m);
}

int main(void)
{
    check_model("tiny (MHA)", KV_DEFAULT_TINY);
    check_model("tiny-gqa", KV_DEFAULT_TINY_GQA);
    /* an MLA model has no per-head K/V rows: the one-screen pass refuses it in words */
    kv_err err = {{0}};
    kv_model m = {0};
    if (kv_model_default(&m, KV_DEFAULT_TINY_MLA, &err) == KV_OK) {
        kv_min_cache c;
        kv_min_state s;
        int rc = kv_min_create(&m, 8, &c, &s, &err);
        KV_CHECK(rc == KV_ERR_UNSUPPORTED, "tiny-mla refused: %s", err.msg);
        kv_model_free(&m);
    }
    return kv_test_finish();
}
