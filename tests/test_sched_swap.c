/*
 * Chapter 07 scheduler (reference_cpu/serve/kv_sched.h, kv_sched_tier.c): priorities, preemption
 * by recompute, whole swap and lru partial swap with prefetch, and the clock model.
 *
 *  - every request of a trace with priorities produces the tokens of its solo run under
 *    recompute, swap, lru and lru + prefetch, with a pool small enough to force preemptions,
 *    and with a host tier too small (fallbacks to recompute, counted); tokens processed minus
 *    tokens recomputed is the solo runs' sum; no block is left in either tier;
 *  - queue order: a high-priority request is admitted before older normal ones, preempts a
 *    running normal one, and is never preempted by an equal-priority younger one;
 *  - the clock: on a constructed case, whole swap stalls a high-priority arrival for the
 *    copy of the whole victim, lru + prefetch does not (the relation is derived below).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_backend.h"
#include "kv_sched.h"
#include "kv_swap.h"
#include "common/kv_test.h"
#include "common/test_sched_common.h"

/* the trace: PRIO_REQS (test_sched_common.h) */

static kv_backend *paged_backend(const kv_model *m, int n_blocks, int block_size)
{
    kv_cache_spec spec = sched_spec(n_blocks, block_size);
    kv_backend *b = NULL;
    kv_err err;
    if (kv_backend_cpu(&b, m, &spec, &err)) {
        printf("backend: %s\n", err.msg);
        exit(1);
    }
    return b;
}

/* Run the trace, compare each request with its solo run, check both tiers are empty
 * (sched_run_check()). */
static kv_sched_metrics run_check(const char *what, kv_backend *b, const kv_trace *t,
                                  const kv_sched_opts *o, const kv_sched_out *solo,
                                  kv_sched_out *keep)
{
    kv_sched_out out;
    kv_sched_metrics m;
    memset(&m, 0, sizeof m);
    if (sched_run_check(what, b, t, o, solo, &out)) return m;
    m = out.m;
    if (keep) *keep = out;
    else kv_sched_out_free(&out);
    return m;
}

/* ---- every mode gives the solo tokens ------------------------------------------------------- */

static void check_modes(const kv_model *m, const kv_trace *t, const kv_sched_out *solo)
{
    int64_t base = 0; /* tokens fed when nothing is fed twice */
    for (int i = 0; i < t->n; i++) base += solo[i].m.tokens_processed;
    KV_CHECK(kv_preempt_by_name("lru") == KV_PREEMPT_LRU &&
                 strcmp(kv_preempt_name(KV_PREEMPT_LRU), "lru") == 0 && !kv_preempt_name(3),
             "lru is a preemption mode");
    const struct {
        const char *name;
        int preempt, prefetch, host, burst;
        double watermark;
    } runs[] = {
        {"recompute", KV_PREEMPT_RECOMPUTE, 0, 0, 1, 0.01},
        {"swap", KV_PREEMPT_SWAP, 0, 0, 1, 0.01},
        {"swap+prefetch", KV_PREEMPT_SWAP, 1, 0, 0, 0.01},
        {"lru", KV_PREEMPT_LRU, 0, 0, 1, 0.01},
        {"lru+prefetch", KV_PREEMPT_LRU, 1, 0, 1, 0.01},
        {"lru+prefetch, arrivals, watermark 0.1", KV_PREEMPT_LRU, 1, 0, 0, 0.1},
        {"swap, 3 host blocks", KV_PREEMPT_SWAP, 0, 3, 1, 0.01},
        {"lru, 3 host blocks", KV_PREEMPT_LRU, 1, 3, 1, 0.01},
    };
    for (int k = 0; k < (int)(sizeof runs / sizeof runs[0]); k++) {
        kv_sched_opts o = kv_sched_opts_default();
        o.max_len = 64;
        o.burst = runs[k].burst;
        o.preempt = runs[k].preempt;
        o.prefetch = runs[k].prefetch;
        o.host_blocks = runs[k].host;
        o.watermark = runs[k].watermark;
        o.step_s = 0.01;
        o.token_s = 1e-4;
        kv_backend *b = paged_backend(m, 20, 4);
        const int64_t bb = (int64_t)b->mem->block_bytes(b->mem);
        o.link.bandwidth = (double)bb / 1e-3; /* a block a millisecond */
        kv_sched_metrics x = run_check(runs[k].name, b, t, &o, solo, NULL);
        KV_CHECK(x.preemptions > 0 && x.tokens_processed - x.tokens_recomputed == base,
                 "%s: %lld preemptions; %lld processed - %lld recomputed = %lld solo",
                 runs[k].name, (long long)x.preemptions, (long long)x.tokens_processed,
                 (long long)x.tokens_recomputed, (long long)base);
        KV_CHECK(x.swap_bytes_out == x.swap_blocks_out * bb && x.swap_bytes_in == x.swap_blocks_in * bb,
                 "%s: bytes = blocks x %lld each way", runs[k].name, (long long)bb);
        /* every block that went out came back or was dropped with a request that recomputed */
        KV_CHECK(x.swap_blocks_in <= x.swap_blocks_out &&
                     (x.recompute_fallbacks > 0 || x.swap_blocks_in == x.swap_blocks_out),
                 "%s: %lld blocks out, %lld in", runs[k].name, (long long)x.swap_blocks_out,
                 (long long)x.swap_blocks_in);
        if (runs[k].preempt == KV_PREEMPT_RECOMPUTE)
            KV_CHECK(x.tokens_recomputed > 0 && x.swap_blocks_out == 0 && x.stall_s == 0,
                     "recompute: re-feeds, moves nothing, never stalls");
        if (runs[k].host == 3)
            KV_CHECK(x.recompute_fallbacks > 0 && x.peak_host_blocks <= 3,
                     "%s: %lld fallbacks, peak %d of 3 host blocks", runs[k].name,
                     (long long)x.recompute_fallbacks, x.peak_host_blocks);
        else if (runs[k].preempt == KV_PREEMPT_SWAP)
            KV_CHECK(x.swap_preemptions > 0 && x.stall_s > 0, "%s: %lld swaps, stall %.4f s",
                     runs[k].name, (long long)x.swap_preemptions, x.stall_s);
        /* (with an ample host tier lru can still fall back: when the one request left running
         * needs blocks that paused ones hold shared by their forks or brought back by a
         * prefetch, the least recently paused of those recomputes) */
        if (runs[k].preempt == KV_PREEMPT_LRU && runs[k].host == 0)
            KV_CHECK(x.lru_pauses > 0 && x.evicted_blocks > 0 &&
                         x.lru_pauses + x.recompute_fallbacks >= x.preemptions,
                     "%s: %lld pauses, %lld blocks evicted, %lld fallbacks", runs[k].name,
                     (long long)x.lru_pauses, (long long)x.evicted_blocks,
                     (long long)x.recompute_fallbacks);
        if (runs[k].prefetch && runs[k].host == 0)
            KV_CHECK(x.prefetches > 0 && x.prefetch_hits <= x.prefetches,
                     "%s: %lld prefetches, %lld hits", runs[k].name, (long long)x.prefetches,
                     (long long)x.prefetch_hits);
        KV_CHECK(x.n_class[0] + x.n_class[1] == t->n && x.n_class[1] == 4 &&
                     x.ttft_p50[1] <= x.ttft_p99[1] && x.ttft_p99[1] <= x.e2e_p99[1] &&
                     x.ttft_p50[0] >= 0,
                 "%s: latency per class (%d normal, %d high)", runs[k].name, x.n_class[0],
                 x.n_class[1]);
        printf("  %-40s preempt %3lld, out/in %3lld/%3lld blocks, evicted %3lld, prefetch "
               "%lld (%lld hits), fallbacks %lld, stall %.4f s\n", runs[k].name,
               (long long)x.preemptions, (long long)x.swap_blocks_out,
               (long long)x.swap_blocks_in, (long long)x.evicted_blocks,
               (long long)x.prefetches, (long long)x.prefetch_hits,
               (long long)x.recompute_fallbacks, x.stall_s);
        kv_backend_destroy(b);
    }
}

/* ---- queue order ---------------------------------------------------------------------------- */

static void check_order(const kv_model *m)
{
    kv_err err;
    kv_sched_opts o = kv_sched_opts_default();
    o.max_len = 64;
    o.step_s = 0.01;
    /* A (high) fills a pool of 8 blocks of 4 alone; B (normal) arrives, then C (high): C
     * may not preempt A (same priority), and once A is done C goes before the older B */
    const kv_request rq[] = {{0.00, 20, 10, 1, 1, -1, 1}, {0.01, 20, 5, 1, 1, -1, 0},
                             {0.02, 20, 5, 1, 1, -1, 1}};
    kv_trace t;
    make_trace(&t, rq, 3);
    kv_backend *b = paged_backend(m, 8, 4);
    kv_sched_out out;
    int rc = kv_sched_run(b, &t, 3, &o, &out, &err);
    KV_CHECK(rc == KV_OK, "order run: %s", err.msg);
    if (!rc) {
        const kv_sched_result *A = &out.results[0], *B = &out.results[1], *C = &out.results[2];
        KV_CHECK(A->preemptions == 0 && C->admit_step > A->admit_step &&
                     C->admit_step < B->admit_step && C->first_token_s < B->first_token_s,
                 "high C (step %lld) admitted before older normal B (step %lld); A not preempted "
                 "(%d)", (long long)C->admit_step, (long long)B->admit_step, A->preemptions);
        kv_sched_out_free(&out);
    }
    /* now A is normal: the high C preempts it when it arrives, and runs first */
    t.req[0].priority = 0;
    for (int p = 0; p < 3; p++) {
        o.preempt = p;
        rc = kv_sched_run(b, &t, 3, &o, &out, &err);
        KV_CHECK(rc == KV_OK, "priority preemption run: %s", err.msg);
        if (rc) continue;
        const kv_sched_result *A = &out.results[0], *C = &out.results[2];
        KV_CHECK(A->preemptions == 1 && C->preemptions == 0 && C->finish_s < A->finish_s &&
                     C->first_token_s - C->arrival_s < 0.0301,
                 "%s: high C preempts normal A (%d) and gets its first token within 3 steps "
                 "(%.3f s)", kv_preempt_name(p), A->preemptions,
                 C->first_token_s - C->arrival_s);
        kv_sched_out_free(&out);
    }
    kv_backend_destroy(b);
    kv_trace_free(&t);
}

/* ---- the clock: whole swap stalls a high-priority arrival, lru + prefetch does not ---------- */

static void check_latency(const kv_model *m)
{
    /* L (normal): 60 + 40 tokens, grows to 25 blocks of 4, the whole pool. H (high): 8 + 3
     * tokens, arrives at 0.355 s when L holds 24 blocks and the pool has one free, not the
     * two H's prompt needs. Steps of 10 ms, no prefill cost, and a link moving one block a millisecond
     * with no latency (bandwidth = block bytes / 1 ms).
     *
     * H arrives; the first step starting at or after 0.355 s (t0) preempts L for it:
     *  - swap: L's k blocks are copied out before H's step can run, so
     *      TTFT(H) = (t0 - 0.355) + k * 1 ms + 10 ms;
     *    L comes back later by copying the k blocks in: the stalls add up to 2 k ms exactly
     *    (the link is otherwise idle, each copy waits for nothing else).
     *  - lru + prefetch: L is paused in place; of H's two blocks one is free, one is evicted
     *    from L (1 ms), and H runs at once:
     *      TTFT(H) <= (t0 - 0.355) + 1 ms + 10 ms,
     *    so TTFT_swap - TTFT_lru >= (k - 1) ms. L's evicted blocks are prefetched while H
     *    runs, so the stalls stay at a few blocks, far below 2 k ms.
     *  - recompute: TTFT(H) = (t0 - 0.355) + 10 ms, the lower bound (L pays by re-feeding). */
    const kv_request rq[] = {{0.0, 60, 40, 1, 1, -1, 0}, {0.355, 8, 3, 1, 1, -1, 1}};
    kv_trace t;
    make_trace(&t, rq, 2);
    kv_err err;
    kv_sched_opts o = kv_sched_opts_default();
    o.max_len = 128;
    o.step_s = 0.01;
    o.watermark = 0; /* exact arithmetic: nothing kept free ahead of need */
    kv_sched_out solo[2];
    kv_backend *big = paged_backend(m, 64, 4);
    for (int i = 0; i < 2; i++) kv_sched_solo(big, &t, i, &o, &solo[i], &err);
    kv_backend_destroy(big);
    kv_backend *b = paged_backend(m, 25, 4);
    const double blk = 1e-3;
    o.link.bandwidth = (double)b->mem->block_bytes(b->mem) / blk;
    o.link.latency = 0;
    double ttft[3] = {0, 0, 0};
    kv_sched_metrics x[3];
    const char *names[3] = {"recompute", "swap", "lru+prefetch"};
    for (int p = 0; p < 3; p++) {
        o.preempt = p;
        o.prefetch = p == KV_PREEMPT_LRU;
        kv_sched_out out;
        memset(&out, 0, sizeof out);
        x[p] = run_check(names[p], b, &t, &o, solo, &out);
        if (out.results) {
            ttft[p] = out.results[1].first_token_s - out.results[1].arrival_s;
            KV_CHECK(out.results[0].preemptions == 1, "%s: L preempted once (%d)", names[p],
                     out.results[0].preemptions);
        }
        kv_sched_out_free(&out);
    }
    const int64_t k = x[1].swap_blocks_out;
    printf("  H's first-token latency: recompute %.4f s, swap %.4f s (L out whole: %lld blocks), "
           "lru+prefetch %.4f s; stalls %.4f / %.4f / %.4f s\n", ttft[0], ttft[1], (long long)k,
           ttft[2], x[0].stall_s, x[1].stall_s, x[2].stall_s);
    KV_CHECK(k >= 20 && fabs(x[1].stall_s - 2.0 * (double)k * blk) < 1e-9,
             "swap: L's %lld blocks out and back in stall %.6f s = 2 k ms", (long long)k,
             x[1].stall_s);
    KV_CHECK(ttft[1] - ttft[0] > (double)k * blk - 1e-9,
             "swap delays H by the whole copy: %.4f s vs recompute %.4f s", ttft[1], ttft[0]);
    KV_CHECK(ttft[2] <= ttft[0] + blk + 1e-9 && ttft[1] - ttft[2] >= (double)(k - 1) * blk - 1e-9,
             "lru+prefetch: H within one block of recompute (%.4f s), (k - 1) ms ahead of swap",
             ttft[2]);
    KV_CHECK(x[2].stall_s < 0.25 * x[1].stall_s && x[2].evicted_blocks > 0 &&
                 x[2].tokens_recomputed == 0,
             "lru+prefetch stalls %.4f s, whole swap %.4f s", x[2].stall_s, x[1].stall_s);
    KV_CHECK(x[0].tokens_recomputed > 0 && x[0].stall_s == 0, "recompute re-feeds instead");
    for (int i = 0; i < 2; i++) kv_sched_out_free(&solo[i]);
    kv_backend_destroy(b);
    kv_trace_free(&t);
}

int main(void)
{
    kv_model m;
    kv_trace t;
    if (sched_setup(&m, &t, PRIO_REQS, N_PRIO_REQS, 0)) return 1;
    kv_sched_out solo[N_PRIO_REQS];
    memset(solo, 0, sizeof solo);
    kv_backend *b = paged_backend(&m, 256, 4);
    sched_solo_all(b, &t, solo);
    kv_backend_destroy(b);

    check_modes(&m, &t, solo);
    check_order(&m);
    check_latency(&m);

    for (int i = 0; i < N_PRIO_REQS; i++) kv_sched_out_free(&solo[i]);
    kv_trace_free(&t);
    kv_model_free(&m);
    return kv_test_finish();
}
