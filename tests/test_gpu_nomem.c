/*
 * Device memory running out under a trace (issue: reliability, chapter 05's scheduler).
 *
 * The emulation build can cap what cudaMalloc hands out (kvemu_set_mem_limit), so this test
 * runs only there. A CUDA paged backend serves a small trace of long prompts with the cap set
 * just above what the weights and the cache took: the forward pass's scratch, which grows with
 * the tokens of a step, no longer fits a 256-token step. Expected:
 *  - with room for small steps: every request completes with exactly the tokens of an
 *    unconstrained CPU run of the same trace, steps were retried smaller (nomem_retries > 0),
 *    and the pool ends empty and consistent;
 *  - with no room for any step: every request fails with the device's out-of-memory message;
 *    none is lost, the run returns, nothing crashes.
 */
#include <stdlib.h>
#include <string.h>

#include "common/kv_test.h"
#include "common/test_sched_common.h"
#include "kv_sched.h"
#include "kvcu.h"
#include "kvemu.h"

#define N_REQ 5

static const kv_request REQS[N_REQ] = {
    {0.00, 180, 6, 1, 1, -1, 0}, {0.00, 150, 5, 2, 1, -1, 0}, {0.01, 200, 4, 1, 2, -1, 0},
    {0.02, 120, 6, 1, 1, -1, 0}, {0.02, 90, 5, 1, 1, -1, 0},
};

static kv_cache_spec paged_spec(void)
{
    kv_cache_spec s = kv_cache_spec_default(8, 256);
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = 16;
    s.layout.n_blocks = 96;
    return s;
}

int main(void)
{
    kv_err e;
    if (kvcu_device_available(&e) != KV_OK || !kvcu_is_emulation()) {
        printf("skipped: needs the emulation build's memory cap\n");
        return KV_TEST_SKIP;
    }
    kv_model m;
    kv_trace t; /* no shared prefixes */
    if (sched_setup(&m, &t, REQS, N_REQ, 1)) return 1;
    const kv_cache_spec spec = paged_spec();
    const kv_sched_opts o = kv_sched_opts_default(); /* 256 tokens per step */

    /* the reference: the CPU, no cap */
    kv_backend *cpu = NULL;
    kv_sched_out ref = {0};
    int rc = kv_backend_cpu(&cpu, &m, &spec, &e);
    if (!rc) rc = kv_sched_run(cpu, &t, N_REQ, &o, &ref, &e);
    KV_CHECK(rc == KV_OK && ref.m.n_done == N_REQ, "reference run: %s", rc ? e.msg : "failures");
    kv_backend_destroy(cpu);

    /* room for small steps only */
    for (int pass = 0; pass < 2; pass++) {
        kv_backend *g = NULL;
        rc = kvcu_backend_create(&g, &m, &spec, &e);
        KV_CHECK(rc == KV_OK, "cuda backend: %s", rc ? e.msg : "");
        if (rc) break;
        /* pass 0: 512 KiB over what the weights and cache took: the scratch of a step of a
         * few dozen tokens fits, a 256-token step's does not (measured: with 2 MiB no step is
         * retried, so if the scratch layout shrinks, this cap must shrink with it);
         * pass 1: nothing over it (no step at all fits) */
        kvemu_set_mem_limit(kvemu_mem_in_use() + (pass == 0 ? (size_t)512 << 10 : 0));
        kv_sched_out out = {0};
        rc = kv_sched_run(g, &t, N_REQ, &o, &out, &e);
        kvemu_set_mem_limit(0);
        KV_CHECK(rc == KV_OK, "pass %d: the run returns normally (%s)", pass, rc ? e.msg : "");
        if (!rc) {
            KV_CHECK(out.m.n_done + out.m.n_failed == N_REQ, "pass %d: no request lost (%d done, "
                     "%d failed)", pass, out.m.n_done, out.m.n_failed);
            KV_CHECK(out.m.nomem_retries > 0, "pass %d: steps were retried smaller", pass);
            if (pass == 0) {
                KV_CHECK(out.m.n_done == N_REQ, "pass 0: every request completes (%d failed: %s)",
                         out.m.n_failed, out.m.n_failed ? out.results[0].error : "");
                for (int i = 0; i < N_REQ; i++)
                    KV_CHECK(same_result(&out.results[i], &ref.results[i]),
                             "pass 0: request %d's tokens equal the unconstrained run's", i);
            } else {
                KV_CHECK(out.m.n_failed == N_REQ, "pass 1: every request fails (%d done)",
                         out.m.n_done);
                for (int i = 0; i < N_REQ; i++)
                    KV_CHECK(out.results[i].status == KV_ERR_NOMEM &&
                                 strstr(out.results[i].error, "request"),
                             "pass 1: request %d fails with a memory message: '%s'", i,
                             out.results[i].error);
            }
            KV_CHECK(kv_pool_check_leaks(&g->mem->paged->pool, NULL, 0) == 0 &&
                         kv_pool_validate(&g->mem->paged->pool, &e) == KV_OK,
                     "pass %d: the pool ends empty and consistent", pass);
        }
        kv_sched_out_free(&out);
        kv_backend_destroy(g);
    }
    kv_sched_out_free(&ref);
    kv_trace_free(&t);
    kv_model_free(&m);
    return kv_test_finish();
}
