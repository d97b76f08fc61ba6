/*
 * Chapter 07 scheduler on the CUDA backend (reference_cpu/serve/kv_sched.h, kv_sched_tier.c over
 * cuda/engine/kvcu_backend.cu's block I/O hooks: gather / scatter kernels, pinned host tier, and the copy
 * stream + events of cuda/cache/kvcu_cache_paged.cu's kvcu_io behind read/write_blocks_async and io_wait).
 *
 * A trace with priorities (the one of test_sched_swap.c) runs on a CUDA paged backend whose
 * pool is small enough to force preemptions, under recompute, swap, swap + prefetch, lru and
 * lru + prefetch. Expected, mode by mode:
 *  - every request's tokens equal its solo run on the CPU paged backend (greedy decoding; the
 *    tiny model's margins are wide enough that CPU and GPU fp32 agree token for token, as
 *    test_gpu_nomem also relies on);
 *  - the device pool ends empty and consistent, the host tier empty;
 *  - the scheduler decides as on a CPU backend with the same pool (preemptions, blocks each
 *    way, evictions, prefetches and hits, fallbacks, steps, clock and stalls): the backend
 *    only moves bytes;
 *  - the link counted bytes = blocks x block_bytes each way;
 *  - swap and lru moved blocks (lru evicted some), and the prefetch modes started prefetches,
 *    so the copy stream really carried blocks a later step read.
 * Exits 77 (skipped) without a usable device.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_backend.h"
#include "kv_sched.h"
#include "kv_swap.h"
#include "common/kv_test.h"
#include "common/test_sched_common.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"

/* the trace: PRIO_REQS (test_sched_common.h) */

/* One mode on a fresh CUDA backend of 20 blocks: solo tokens, no leaks, the CPU's decisions,
 * byte counts. burst 1 has every request waiting at the start; burst 0 lets them arrive on
 * the clock (as test_sched_swap.c runs swap + prefetch), so priority preemption on arrival
 * is covered too. */
static void check_mode(const kv_model *m, const kv_trace *t, const kv_sched_out *solo,
                       const char *name, int preempt, int prefetch, int burst)
{
    kv_err err;
    const kv_cache_spec spec = sched_spec(20, 4);
    kv_backend *g = NULL;
    int rc = kvcu_backend_create(&g, m, &spec, &err);
    KV_CHECK(rc == KV_OK, "%s: cuda backend: %s", name, rc ? err.msg : "");
    if (rc) return;
    KV_CHECK(g->mem && g->mem->read_blocks_async && g->mem->write_blocks_async && g->mem->io_wait,
             "%s: the CUDA backend has asynchronous block I/O", name);
    kv_sched_opts o = kv_sched_opts_default();
    o.max_len = 64;
    o.burst = burst;
    o.preempt = preempt;
    o.prefetch = prefetch;
    o.step_s = 0.01;
    o.token_s = 1e-4;
    const int64_t bb = (int64_t)g->mem->block_bytes(g->mem);
    o.link.bandwidth = (double)bb / 1e-3; /* a block a millisecond */
    kv_sched_out out; /* the CPU solo runs' tokens, both tiers empty */
    rc = sched_run_check(name, g, t, &o, solo, &out);
    if (rc) {
        kv_backend_destroy(g);
        return;
    }
    const kv_sched_metrics *x = &out.m;
    /* the scheduler's decisions depend only on the pool, the trace and the clock: the CPU
     * backend with the same pool makes the same ones, so the GPU's counts must equal them */
    kv_backend *cpu = NULL;
    kv_sched_out ref;
    memset(&ref, 0, sizeof ref);
    rc = kv_backend_cpu(&cpu, m, &spec, &err);
    KV_CHECK(rc == KV_OK, "%s: CPU backend: %s", name, rc ? err.msg : "");
    if (!rc) {
        KV_CHECK((int64_t)cpu->mem->block_bytes(cpu->mem) == bb,
                 "%s: CPU and GPU blocks are %lld bytes", name, (long long)bb);
        char what[64];
        snprintf(what, sizeof what, "%s on the CPU", name);
        rc = sched_run_check(what, cpu, t, &o, solo, &ref);
    }
    if (!rc) {
        const kv_sched_metrics *y = &ref.m;
        KV_CHECK(x->preemptions == y->preemptions && x->swap_blocks_out == y->swap_blocks_out &&
                     x->swap_blocks_in == y->swap_blocks_in &&
                     x->evicted_blocks == y->evicted_blocks && x->prefetches == y->prefetches &&
                     x->prefetch_blocks == y->prefetch_blocks &&
                     x->prefetch_hits == y->prefetch_hits &&
                     x->recompute_fallbacks == y->recompute_fallbacks &&
                     x->tokens_recomputed == y->tokens_recomputed && x->steps == y->steps &&
                     x->clock_s == y->clock_s && x->stall_s == y->stall_s,
                 "%s: the same decisions as on the CPU (%lld preemptions, %lld steps)", name,
                 (long long)y->preemptions, (long long)y->steps);
    }
    kv_sched_out_free(&ref);
    kv_backend_destroy(cpu);
    KV_CHECK(x->preemptions > 0, "%s: the pool forced preemptions (%lld)", name,
             (long long)x->preemptions);
    KV_CHECK(x->swap_bytes_out == x->swap_blocks_out * bb &&
                 x->swap_bytes_in == x->swap_blocks_in * bb,
             "%s: bytes = blocks x %lld each way (%lld / %lld blocks)", name, (long long)bb,
             (long long)x->swap_blocks_out, (long long)x->swap_blocks_in);
    if (preempt == KV_PREEMPT_RECOMPUTE)
        KV_CHECK(x->tokens_recomputed > 0 && x->swap_blocks_out == 0,
                 "recompute: re-feeds, moves nothing");
    else
        KV_CHECK(x->swap_blocks_out > 0 && x->swap_blocks_in > 0,
                 "%s: blocks crossed the link both ways", name);
    if (preempt == KV_PREEMPT_LRU)
        KV_CHECK(x->lru_pauses > 0 && x->evicted_blocks > 0, "%s: %lld pauses, %lld evicted",
                 name, (long long)x->lru_pauses, (long long)x->evicted_blocks);
    if (prefetch)
        KV_CHECK(x->prefetches > 0 && x->prefetch_blocks > 0,
                 "%s: %lld prefetches brought %lld blocks back", name,
                 (long long)x->prefetches, (long long)x->prefetch_blocks);
    printf("  %-14s preempt %3lld, out/in %3lld/%3lld blocks, evicted %3lld, prefetch %lld "
           "(%lld blocks, %lld hits), fallbacks %lld\n", name, (long long)x->preemptions,
           (long long)x->swap_blocks_out, (long long)x->swap_blocks_in,
           (long long)x->evicted_blocks, (long long)x->prefetches,
           (long long)x->prefetch_blocks, (long long)x->prefetch_hits,
           (long long)x->recompute_fallbacks);
    kv_sched_out_free(&out);
    kv_backend_destroy(g);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_err err;
    kv_model m;
    kv_trace t;
    if (sched_setup(&m, &t, PRIO_REQS, N_PRIO_REQS, 0)) return 1;

    /* the reference: each request alone on the CPU, a pool that never preempts */
    kv_sched_out solo[N_PRIO_REQS];
    memset(solo, 0, sizeof solo);
    const kv_cache_spec big = sched_spec(256, 4);
    kv_backend *cpu = NULL;
    int rc = kv_backend_cpu(&cpu, &m, &big, &err);
    KV_CHECK(rc == KV_OK, "cpu backend: %s", rc ? err.msg : "");
    if (!rc) rc = sched_solo_all(cpu, &t, solo);
    kv_backend_destroy(cpu);

    if (!rc) {
        check_mode(&m, &t, solo, "recompute", KV_PREEMPT_RECOMPUTE, 0, 1);
        check_mode(&m, &t, solo, "swap", KV_PREEMPT_SWAP, 0, 1);
        check_mode(&m, &t, solo, "swap+prefetch", KV_PREEMPT_SWAP, 1, 0);
        check_mode(&m, &t, solo, "lru", KV_PREEMPT_LRU, 0, 1);
        check_mode(&m, &t, solo, "lru+prefetch", KV_PREEMPT_LRU, 1, 1);
    }
    for (int i = 0; i < N_PRIO_REQS; i++) kv_sched_out_free(&solo[i]);
    kv_trace_free(&t);
    kv_model_free(&m);
    return kv_test_finish();
}
