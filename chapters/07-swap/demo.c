/*
 * Chapter 07 demo: swap and recompute on the embedded tiny model.
 *
 *  1. one sequence swapped out to a host tier and back (kv_swap_out / kv_swap_in): blocks and
 *     bytes moved, the modelled link time, the device pool before and after; while it is out
 *     another sequence overwrites the blocks it left. Checked: the logits of every token
 *     decoded after the swap equal, bit for bit, those of the same sequence left in place.
 *  2. the crossover (kvlab bench swap, shorter; kv_swap_bench_run()): swap out + in against
 *     recomputing the cache by a prefill, measured on this CPU for the tiny model, modelled
 *     on an accelerator for the tiny model and for Llama-2-7B's shape.
 *  3. the chapter's bursty trace (bursts of normal requests, some high-priority ones) through a
 *     small pool (kv_sched_run) under each preemption mode: recompute, whole swap with
 *     prefetch, lru with prefetch (pause on the device, evict blocks only as needed):
 *     preemptions, bytes over
 *     the link, stalls, tokens computed again, the high-priority first-token latency.
 *     Checked: every request's tokens are the same under every mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_sampler.h"
#include "kv_sched.h"
#include "kv_swap.h"
#include "kv_trace.h"

#define CH07_PROMPT 200 /* part 1: tokens cached when the sequence is swapped */
#define CH07_DECODE 8   /* part 1: tokens decoded after it comes back */
#define CH07_B 16

/* ---- 1. a sequence out and back ----------------------------------------------------------- */

static int part_roundtrip(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err)
{
    FILE *f = ctx->out;
    const int V = m->config.vocab_size, cap = CH07_PROMPT + CH07_DECODE;
    const int per_seq = (cap + CH07_B - 1) / CH07_B;
    kv_cache_spec spec = kv_cache_spec_default(3, cap);
    spec.layout.kind = KV_LAYOUT_PAGED;
    spec.layout.block_size = CH07_B;
    spec.layout.n_blocks = 2 * per_seq; /* room for two sequences of the three slots */
    kv_backend *b = NULL;
    kv_swap sw = {0};
    kv_swapped s = {0};
    const char *dev = ctx->device;
    int tok[3][CH07_PROMPT + CH07_DECODE];
    float *lg = malloc(sizeof(float) * 2 * (size_t)V); /* [2][V]: slot 0 swapped, slot 1 not */
    int st = lg ? kv_demo_backend(ctx, m, &spec, &b, &dev, err)
                : kv_fail(err, KV_ERR_NOMEM, "demo: logits");
    if (!st) st = kv_swap_init(&sw, b->mem, per_seq, NULL, err);
    if (st) goto done;
    kv_demo_prompt(tok[0], CH07_PROMPT, V);
    memcpy(tok[1], tok[0], sizeof(int) * CH07_PROMPT);
    kv_seq q[2] = {{0, 0, CH07_PROMPT, tok[0]}, {1, 0, CH07_PROMPT, tok[1]}};
    st = b->forward(b, q, 2, lg, NULL, err);
    if (st) goto done;
    const int used0 = b->mem->paged->pool.n_used;
    st = kv_swap_out(&sw, b->mem, 0, &s, err);
    if (st) goto done;
    const int used_out = b->mem->paged->pool.n_used;
    const kv_link_stats out = sw.stats;
    /* while it is out, a third sequence takes the freed blocks and writes its own rows there,
     * then finishes: what comes back can only be what the swap copied */
    for (int i = 0; i < CH07_PROMPT; i++) tok[2][i] = 1 + (tok[0][i] * 7 + i) % (V - 1);
    kv_seq other = {2, 0, CH07_PROMPT, tok[2]};
    st = b->forward(b, &other, 1, NULL, NULL, err);
    if (st) goto done;
    const int used_other = b->mem->paged->pool.n_used;
    b->reset(b, 2);
    st = kv_swap_in(&sw, b->mem, 0, &s, err);
    if (st) goto done;
    const int used_in = b->mem->paged->pool.n_used;
    /* decode greedily in both slots; the swapped one must match the one left in place */
    int identical = 1;
    for (int i = 0; i < CH07_DECODE && !st; i++) {
        const int pos = CH07_PROMPT + i;
        tok[0][pos] = kv_argmax(lg, V);
        tok[1][pos] = kv_argmax(lg + V, V);
        identical &= tok[0][pos] == tok[1][pos];
        kv_seq d[2] = {{0, pos, 1, &tok[0][pos]}, {1, pos, 1, &tok[1][pos]}};
        st = b->forward(b, d, 2, lg, NULL, err);
        if (!st) identical &= memcmp(lg, lg + V, sizeof(float) * (size_t)V) == 0;
    }
    if (st) goto done;
    const double bytes = (double)out.bytes[KV_LINK_OUT];
    char u[32];
    if (ctx->csv) {
        kv_csv_printf(f, "part,tokens,blocks,block_bytes,bytes_out,bytes_in,link_s_out,link_s_in,"
                         "pool_used_before,pool_used_out,pool_used_other,pool_used_in,identical\n");
        kv_csv_printf(f, "roundtrip,%d,%lld,%zu,%lld,%lld,%.6e,%.6e,%d,%d,%d,%d,%d\n", CH07_PROMPT,
                      (long long)out.blocks[KV_LINK_OUT], sw.pool.block_bytes,
                      (long long)out.bytes[KV_LINK_OUT], (long long)sw.stats.bytes[KV_LINK_IN],
                      out.seconds[KV_LINK_OUT], sw.stats.seconds[KV_LINK_IN], used0, used_out,
                      used_other, used_in, identical);
    } else {
        fprintf(f, "1. One sequence out to the host tier and back (tiny model, fp32, B = %d, "
                "device %s)\n", CH07_B, dev);
        fprintf(f, "   %d cached tokens = %lld blocks of %zu bytes (every layer, K and V) -> "
                "%s each way\n", CH07_PROMPT, (long long)out.blocks[KV_LINK_OUT],
                sw.pool.block_bytes, kv_fmt_bytes(bytes, u, sizeof u));
        fprintf(f, "   modelled link (%.3g GB/s, %.3g us a copy): out %.3g us, in %.3g us, one "
                "batched copy each way\n", sw.link.bandwidth * 1e-9, sw.link.latency * 1e6,
                out.seconds[KV_LINK_OUT] * 1e6, sw.stats.seconds[KV_LINK_IN] * 1e6);
        fprintf(f, "   device pool blocks used (of %d): %d with two sequences, %d while one is "
                "on the host,\n   %d while a third %d-token sequence writes into the freed "
                "blocks (then finishes), %d after\n   the first returns\n", spec.layout.n_blocks, used0,
                used_out, used_other, CH07_PROMPT, used_in);
        fprintf(f, "   %d tokens decoded after the swap: logits %s the sequence that stayed "
                "(bit for bit)\n", CH07_DECODE, identical ? "identical to" : "DIFFER from");
    }
    if (!identical) st = -kv_fail(err, KV_ERR_ARG, "chapter 07: a swapped sequence's logits "
                                  "differ from the one left in place");
done:
    kv_swapped_drop(&sw, b->mem, &s);
    kv_swap_free(&sw);
    kv_backend_destroy(b);
    free(lg);
    return st;
}

/* ---- 2. the crossover ---------------------------------------------------------------------- */

static int part_crossover(const kv_demo_ctx *ctx, kv_err *err)
{
    static const int tiny_lens[] = {16, 64, 256, 1024};
    /* quick: shorter measured prefills, one repeat; the modelled Llama rows cost nothing */
    static const int quick_lens[] = {16, 32, 64, 128};
    static const int big_lens[] = {64, 512, 4096, 32768};
    kv_swap_bench sb;
    if (!ctx->csv)
        fprintf(ctx->out, "\n2. Swap or recompute? (kvlab bench swap, shorter; ratio > 1: "
                "recompute is dearer)\n\n");
    int st = kv_swap_bench_init(&sb, "tiny", NULL, CH07_B, KV_LINK_DEFAULT_BANDWIDTH * 1e-9,
                                KV_LINK_DEFAULT_LATENCY * 1e6, KV_SWAP_DEFAULT_TFLOPS, err);
    if (!st) st = kv_swap_bench_run(ctx->out, ctx->csv, &sb, ctx->quick ? quick_lens : tiny_lens,
                                    4, 1024, ctx->quick ? 1 : 3, err);
    if (!ctx->csv) fprintf(ctx->out, "\n");
    if (!st) st = kv_swap_bench_init(&sb, "llama-2-7b", NULL, CH07_B,
                                     KV_LINK_DEFAULT_BANDWIDTH * 1e-9,
                                     KV_LINK_DEFAULT_LATENCY * 1e6, KV_SWAP_DEFAULT_TFLOPS, err);
    if (!st) st = kv_swap_bench_run(ctx->out, ctx->csv, &sb, big_lens, 4, 0, 1, err);
    return st;
}

/* ---- 3. a burst through a small pool ------------------------------------------------------ */

#define CH07_REQUESTS 32
#define CH07_QUICK_REQUESTS 12 /* quick: still enough for the pool to preempt in every mode */
#define CH07_MAX_PROMPT 96
#define CH07_MAX_OUTPUT 48
#define CH07_BLOCKS 24
#define CH07_TOKEN_S 1e-4 /* clock seconds per prefill token: recomputing costs time too */

/* The chapter's bursty trace (bursts of normal requests, a share of high-priority ones) when
 * the generator has it, else Alpaca-like arrivals all at time 0; its first @p n_req
 * requests, lengths capped so the demo takes seconds. */
static int demo_trace(kv_trace *t, int n_req, int *burst, const char **name, kv_err *err)
{
    kv_trace_spec ts;
    const char *what, *found = NULL;
    int st = KV_OK;
    for (int i = 0; i < kv_trace_builtin_count() && !st; i++) {
        const char *n;
        kv_trace_spec s;
        st = kv_trace_builtin(i, &n, &what, &s, err);
        if (!st && (!strcmp(n, "bursty") || (!found && !strcmp(n, "alpaca")))) {
            found = n;
            ts = s;
        }
    }
    if (!st && !found) st = kv_fail(err, KV_ERR_ARG, "no builtin trace 'bursty' or 'alpaca'");
    if (st) return st;
    *name = found;
    *burst = strcmp(found, "bursty") != 0;
    st = kv_trace_generate(&ts, t, err);
    if (!st && t->n > n_req) t->n = n_req;
    for (int i = 0; i < t->n && !st; i++) {
        kv_request *r = &t->req[i];
        if (r->prompt_len > CH07_MAX_PROMPT) r->prompt_len = CH07_MAX_PROMPT;
        if (r->output_len > CH07_MAX_OUTPUT) r->output_len = CH07_MAX_OUTPUT;
        if (r->prefix_id >= 0 && r->prompt_len <= t->prefix_len[r->prefix_id]) r->prefix_id = -1;
    }
    return st;
}

/* The result of trace request @p i in @p o, or NULL. */
static const kv_sched_result *result_of(const kv_sched_out *o, int i)
{
    for (int j = 0; j < o->n; j++)
        if (o->index[j] == i) return &o->results[j];
    return NULL;
}

static int part_serve(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err)
{
    static const char *const modes[] = {"recompute", "swap", "lru"};
    FILE *f = ctx->out;
    kv_trace t = {0};
    int burst = 0, n_high = 0;
    const char *trace_name = "";
    kv_sched_out outs[3] = {{0}};
    int ran[3] = {0, 0, 0};
    int st = demo_trace(&t, ctx->quick ? CH07_QUICK_REQUESTS : CH07_REQUESTS, &burst,
                        &trace_name, err);
    for (int i = 0; i < t.n; i++) n_high += t.req[i].priority > 0;
    kv_cache_spec spec = kv_cache_spec_default(8, CH07_MAX_PROMPT + CH07_MAX_OUTPUT);
    spec.layout.kind = KV_LAYOUT_PAGED;
    spec.layout.block_size = CH07_B;
    spec.layout.n_blocks = CH07_BLOCKS;
    for (int k = 0; k < 3 && !st; k++) {
        const int mode = kv_preempt_by_name(modes[k]);
        if (mode < 0) continue; /* a mode this scheduler does not have */
        kv_backend *b = NULL;
        const char *dev;
        st = kv_demo_backend(ctx, m, &spec, &b, &dev, err);
        kv_sched_opts o = kv_sched_opts_default();
        o.burst = burst;
        o.preempt = mode;
        o.max_len = spec.capacity;
        o.token_s = CH07_TOKEN_S;
        o.prefetch = mode != KV_PREEMPT_RECOMPUTE;
        if (!st) st = kv_sched_run(b, &t, t.n, &o, &outs[k], err);
        kv_backend_destroy(b);
        ran[k] = !st;
    }
    if (st) goto done;
    /* every mode must produce the same tokens for every request */
    int same = 1;
    for (int k = 1; k < 3; k++) {
        if (!ran[k]) continue;
        for (int i = 0; i < t.n; i++) {
            const kv_sched_result *a = result_of(&outs[0], i), *c = result_of(&outs[k], i);
            same &= a && c && a->status == c->status && a->n_out == c->n_out &&
                    a->output_len == c->output_len &&
                    (a->status || !memcmp(a->tokens, c->tokens,
                                          sizeof(int) * (size_t)a->n_out * a->output_len));
        }
    }
    if (ctx->csv)
        kv_csv_printf(f,
                      "mode,requests,high,preemptions,by_swap,lru_pauses,evicted_blocks,"
                      "prefetch_blocks,bytes_out,bytes_in,link_s,stall_s,tokens_recomputed,"
                      "tokens_processed,steps,clock_s,high_ttft_p50,high_ttft_p99,normal_ttft_p50,"
                      "normal_e2e_p99,failed,same_tokens\n");
    else
        fprintf(f, "\n3. Serving %d requests of the '%s' trace (%d high priority%s; prompts <= "
                "%d, outputs <= %d\n   tokens) through %d blocks of %d tokens, 8 slots, budget "
                "%d tokens a step; swap and lru prefetch.\n   Clock: %g s a step + %g s a prefill token (recompute "
                "included) + stalls for transfers\n   the step waits for.\n\n"
                "   %-9s %7s %10s %10s %8s %8s %6s %7s %15s %8s\n", t.n, trace_name,
                n_high, burst ? ", all arriving at 0" : "", CH07_MAX_PROMPT, CH07_MAX_OUTPUT,
                CH07_BLOCKS, CH07_B, kv_sched_opts_default().token_budget,
                kv_sched_opts_default().step_s, CH07_TOKEN_S, "mode", "preempt", "bytes out",
                "bytes in", "link ms", "stall ms", "recomp", "clock s", "hi TTFT p50/p99",
                "e2e p99");
    for (int k = 0; k < 3; k++) {
        if (!ran[k]) continue;
        const kv_sched_metrics *x = &outs[k].m;
        char u[32], v[32];
        if (ctx->csv)
            kv_csv_printf(f,
                          "%s,%d,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%.6e,%.6e,%lld,%lld,%lld,"
                          "%.4f,%.4f,%.4f,%.4f,%.4f,%d,%d\n",
                          modes[k], t.n, n_high, (long long)x->preemptions,
                          (long long)x->swap_preemptions, (long long)x->lru_pauses,
                          (long long)x->evicted_blocks, (long long)x->prefetch_blocks,
                          (long long)x->swap_bytes_out, (long long)x->swap_bytes_in,
                          x->swap_seconds_out + x->swap_seconds_in, x->stall_s,
                          (long long)x->tokens_recomputed, (long long)x->tokens_processed,
                          (long long)x->steps, x->clock_s, x->ttft_p50[1], x->ttft_p99[1],
                          x->ttft_p50[0], x->e2e_p99[0], x->n_failed, same);
        else
            fprintf(f, "   %-9s %7lld %10s %10s %8.3f %8.3f %6lld %7.2f %7.3f / %5.3f %8.3f\n",
                    modes[k], (long long)x->preemptions,
                    kv_fmt_bytes((double)x->swap_bytes_out, u, sizeof u),
                    kv_fmt_bytes((double)x->swap_bytes_in, v, sizeof v),
                    1e3 * (x->swap_seconds_out + x->swap_seconds_in), 1e3 * x->stall_s,
                    (long long)x->tokens_recomputed, x->clock_s, x->ttft_p50[1],
                    x->ttft_p99[1], x->e2e_p99[0]);
    }
    if (!ctx->csv)
        fprintf(f, "\n   preempt: preemptions (swap: whole swaps; lru: pauses on the device, "
                "blocks evicted only as\n   needed); bytes to and from the host; link: modelled "
                "time of those copies; stall: clock time\n   steps waited for them; recomp: "
                "tokens computed again; hi TTFT: first-token latency of the\n   high-priority "
                "requests (s); e2e p99: end-to-end latency of the others. Every request's\n   "
                "tokens %s under every mode.\n",
                same ? "are the same" : "DIFFER");
    if (!same) st = -kv_fail(err, KV_ERR_ARG, "chapter 07: preemption modes gave different "
                             "tokens");
done:
    for (int k = 0; k < 3; k++) kv_sched_out_free(&outs[k]);
    kv_trace_free(&t);
    return st;
}

int kv_demo_ch07(const kv_demo_ctx *ctx, kv_err *err)
{
    kv_model m = {0};
    int st = kv_cli_default_model(&m, "tiny", err);
    if (!st) st = part_roundtrip(ctx, &m, err);
    if (!st) st = part_crossover(ctx, err);
    if (!st) st = part_serve(ctx, &m, err);
    kv_model_free(&m);
    return st;
}
