/*
 * kvlab serve: replay a request trace through the continuous-batching scheduler
 * (reference_cpu/serve/kv_sched.h) on a paged CPU cache, under one allocation policy, and print
 * what chapter 05 measures: KV utilization, waste (internal and reserved), peak concurrency,
 * preemptions, prefix-cache hits, sharing by forks, tokens/s. --timeline writes the pool
 * occupancy of every step for the chapter's pool-over-time figure. Chapter 07: --preempt swap
 * (whole sequences to a host tier) or lru (pause on the device, evict blocks only when needed,
 * --prefetch them back early), priorities from the trace, and a clock that charges prefill
 * tokens (--token-us) and waits for synchronous transfers over a modelled link (--link-gbps,
 * --link-us): it prints what crossed the link, the stalls, and p50/p99 latency per priority;
 * --csv writes each request's latencies for a latency-CDF figure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_prompts.h"
#include "cli.h"
#include "model_load.h"
#include "kv_file.h"
#include "kv_sched.h"
#include "kv_trace.h"

static const char *const policies[] = {"paged", "max", "pow2", "oracle", NULL};
static const char *const preempts[] = {"recompute", "swap", "lru", NULL};

typedef struct {
    FILE *timeline; /* NULL: no timeline */
    kv_progress progress;
} serve_ctx;

static void on_step(void *user, const kv_sched_step_info *s)
{
    serve_ctx *c = user;
    if (c->timeline)
        kv_csv_printf(c->timeline, "%lld,%.4f,%d,%d,%d,%d,%d,%d,%d\n", (long long)s->step,
                      s->clock_s, s->used_blocks, s->cached_blocks, s->reserved_blocks,
                      s->running_seqs, s->running_reqs, s->waiting, s->batch_tokens);
    kv_progress_update(&c->progress, s->done, s->total);
}

static int min_len(const int *len, int n)
{
    int m = len[0];
    for (int i = 1; i < n; i++) m = len[i] < m ? len[i] : m;
    return m;
}

static void pct_row(const char *what, double v) { printf("  %-34s %8.2f %%\n", what, 100.0 * v); }

/* Per-request latencies on the simulated clock, one row per request of the run, into @p f
 * (opened before the run, so that a bad path fails before any work). */
static void write_latency_csv(FILE *f, const kv_sched_out *out, const kv_trace *t)
{
    kv_csv_printf(f, "request,priority,prompt_len,output_len,status,preemptions,arrival_s,"
                     "first_token_s,finish_s,ttft_s,e2e_s\n");
    for (int i = 0; i < out->n; i++) {
        const kv_sched_result *r = &out->results[i];
        const kv_request *q = &t->req[out->index[i]];
        const int ok = r->status == KV_OK && r->first_token_s >= 0;
        kv_csv_printf(f, "%d,%d,%d,%d,%s,%d,%.6f,%.6f,%.6f,", out->index[i], r->priority,
                      q->prompt_len, q->output_len, r->status == KV_OK ? "ok" : "failed",
                      r->preemptions, r->arrival_s, r->first_token_s, r->finish_s);
        if (ok)
            kv_csv_printf(f, "%.6f,%.6f\n", r->first_token_s - r->arrival_s,
                          r->finish_s - r->arrival_s);
        else kv_csv_printf(f, ",\n");
    }
}

int cmd_serve(int argc, char **argv)
{
    const char *cmd = "kvlab serve";
    const char *trace_path = NULL, *policy = "paged", *model_arg = "tiny", *timeline = NULL;
    const char *device = "cpu", *preempt = "recompute", *csv = NULL, *prompts = NULL;
    int prompt_lines = 0; /* 0: 8 */
    int host_blocks = 0, prefetch = 0;
    double watermark = 0.01, link_gbps = KV_LINK_DEFAULT_BANDWIDTH / 1e9,
           link_us = KV_LINK_DEFAULT_LATENCY * 1e6, token_us = 0.0;
    int n_blocks = 1024, block_size = 16, prefix = 0, max_requests = 100, budget = 256;
    int max_seqs = 256, max_len = 0, burst = 0;
    double step_ms = 20.0, temperature = 0.0;
    int64_t seed = 42;
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_cli_engine en = {NULL, NULL};
    kv_opt opts[] = {
        {"--trace", KV_OPT_STRING, &trace_path, 0, 0, NULL, "FILE", "request trace (datasets/traces/*.csv); required", 0},
        {"--prompts", KV_OPT_STRING, &prompts, 0, 0, NULL, "LIST", "a chat model (smollm2): the prompts are real text in place of the trace's lengths, request i taking prompt i mod n, each a one-turn conversation in the model's template: a chat script's user turns (datasets/chat-dialogues/*.chat) or a text's slices asked for a summary; files separated by ','. Arrivals and outputs stay the trace's", 0},
        {"--prompt-lines", KV_OPT_INT, &prompt_lines, 1, 1 << 20, NULL, "N", "with --prompts: lines of text per slice (default 8)", 0},
        {"--policy", KV_OPT_CHOICE, &policy, 0, 0, policies, "P", "paged (blocks on demand) or a contiguous baseline: max, pow2, oracle (default paged)", 0},
        {"--blocks", KV_OPT_INT, &n_blocks, 1, 1 << 22, NULL, "N", "blocks in the pool: the memory budget (default 1024)", 0},
        {"--block-size", KV_OPT_INT, &block_size, 1, 4096, NULL, "B", "tokens per block (default 16)", 0},
        {"--model", KV_OPT_STRING, &model_arg, 0, 0, NULL, "M", "tiny, tiny-gqa, small (embedded), a checkpoint FILE, `trained`, a GGUF file or smollm2 (default tiny)", 0},
        {"--prefix-cache", KV_OPT_FLAG, &prefix, 0, 0, NULL, NULL, "share cached prompt blocks between requests", 0},
        {"--max-requests", KV_OPT_INT, &max_requests, 1, 1 << 24, NULL, "K", "serve the first K requests of the trace (default 100)", 0},
        {"--timeline", KV_OPT_STRING, &timeline, 0, 0, NULL, "CSV", "write per-step pool occupancy to this file", 0},
        {"--budget", KV_OPT_INT, &budget, 1, 1 << 20, NULL, "T", "tokens per step, decodes and prefill chunks (default 256)", 0},
        {"--max-seqs", KV_OPT_INT, &max_seqs, 1, 4096, NULL, "S", "sequences running at once at most (cache slots; default 256)", 0},
        {"--max-len", KV_OPT_INT, &max_len, 1, 1 << 20, NULL, "L", "tokens the max policy reserves per sequence (default: the model's seq_len, raised to the trace's longest request)", 0},
        {"--step-ms", KV_OPT_FLOAT, &step_ms, 0, 1e6, NULL, "MS", "simulated milliseconds per step for the arrival clock (default 20)", 0},
        {"--burst", KV_OPT_FLAG, &burst, 0, 0, NULL, NULL, "every request arrives at time 0 (offline batch)", 0},
        {"--temperature", KV_OPT_FLOAT, &temperature, 0, 100, NULL, "T", "plain requests: 0 = greedy (default 0); parallel samples use 1", 0},
        {"--seed", KV_OPT_I64, &seed, 0, 9.0e15, NULL, "S", "sampling seed (default 42)", 0},
        {"--preempt", KV_OPT_CHOICE, &preempt, 0, 0, preempts, "M", "how a preempted request gives memory back: recompute (drop, prefill again), swap (copy it whole to a host tier and back; the step waits) or lru (pause it on the device; move its blocks to the host only when the pool needs them, least recently paused first; default recompute)", 0},
        {"--host-blocks", KV_OPT_INT, &host_blocks, 0, 1 << 22, NULL, "N", "swap, lru: blocks of the host tier (default 0: as many as --blocks)", 0},
        {"--prefetch", KV_OPT_FLAG, &prefetch, 0, 0, NULL, NULL, "swap, lru: start copying the queue head's host blocks back, in the background, once it is predicted to fit the next step", 0},
        {"--watermark", KV_OPT_FLOAT, &watermark, 0, 0.99, NULL, "F", "fraction of the pool kept free: admission leaves it; lru also evicts paused blocks in the background to keep it (default 0.01)", 0},
        {"--link-gbps", KV_OPT_FLOAT, &link_gbps, 1e-6, 1e4, NULL, "X", "host link bandwidth in GB/s (10^9 bytes per second) each direction (default 25: PCIe 4.0 x16)", 0},
        {"--link-us", KV_OPT_FLOAT, &link_us, 0, 1e7, NULL, "X", "host link latency per batched copy in microseconds (default 10)", 0},
        {"--token-us", KV_OPT_FLOAT, &token_us, 0, 1e7, NULL, "X", "simulated microseconds per prefill token (prompts and recompute), added to --step-ms (default 0)", 0},
        {"--csv", KV_OPT_STRING, &csv, 0, 0, NULL, "FILE", "write each request's arrival, first-token and finish times and latencies to FILE (- : standard output, the tables then on standard error)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where the model and its paged cache run (default cpu)", 0},
        KV_CLI_ENGINE_OPTS(en),
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Serve a request trace with continuous batching on a paged KV cache\n"
                          "(chunked prefill, parallel sampling and beam search by fork, preemption\n"
                          "by recompute, by whole swap or by lru partial swap to a host tier, with\n"
                          "priorities from the trace) and print the allocator's metrics and the\n"
                          "latency per priority. Arrivals follow a simulated clock: a step takes\n"
                          "--step-ms, plus --token-us per prefill token, plus the time it waits\n"
                          "for synchronous transfers over the modelled link; so runs are\n"
                          "repeatable.\n"
                          "The baselines max/pow2/oracle reserve contiguous space per sequence at\n"
                          "admission, counted in blocks of the same pool.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    if (!trace_path) return kv_args_bad(cmd, "--trace", "a trace file is required");
    if (prompt_lines && !prompts) return kv_args_bad(cmd, "--prompt-lines", "needs --prompts");
    if (!prompt_lines) prompt_lines = 8;
    /* options that only the host tier reads: refused rather than ignored under recompute */
    if (strcmp(preempt, "recompute") == 0 && prefetch)
        return kv_args_bad(cmd, "--prefetch", "needs --preempt swap or lru (recompute keeps no "
                           "host copy to fetch)");
    if (strcmp(preempt, "recompute") == 0 && host_blocks)
        return kv_args_bad(cmd, "--host-blocks", "needs --preempt swap or lru (recompute has "
                           "no host tier)");
    int e = kv_cli_check_device(cmd, device);
    if (!e) e = kv_cli_engine_check(cmd, device, &en);
    if (!e) e = kv_cli_outputs_check(cmd, (const kv_cli_output[]){{"--timeline", timeline},
                                                                 {"--csv", csv}}, 2);
    if (e) return e;

    kv_err err = {{0}};
    kv_trace t = {0};
    kv_cli_model mdl = {0};
    kv_model *const mp = &mdl.m;
    kv_backend *b = NULL;
    kv_sched_out out = {0};
    serve_ctx ctx = {0};
    /* the timeline and the latency CSV, open from before the run: each is written to a
     * temporary file beside its path and renamed over it only when the run succeeds, so a
     * failure leaves whatever was there before (kv_file.h) */
    kv_file_out outs[2] = {{0}};
    const char *out_paths[2] = {timeline, csv};
    int rc = KV_EXIT_OK, st;
    if ((st = kv_trace_load(trace_path, &t, &err))) {
        rc = kv_cli_fail(cmd, trace_path, st, &err);
        goto done;
    }
    const kv_cli_model_args ma = {model_arg, NULL, NULL, NULL,
                                  prompts ? KV_CLI_TEXT_NEED : KV_CLI_TEXT_NONE, 0,
                                  kv_cli_engine_storage(device, &en)};
    if ((rc = kv_cli_model_load(cmd, &ma, &mdl))) goto done;
    if (prompts) { /* real text: each request's prompt ids, and its length, from the tokenizer */
        kv_cli_prompts ps;
        st = kv_cli_prompts_files(prompts, prompt_lines, 0, mp->config.seq_len, &mdl, &ps, &err);
        if (!st) {
            st = kv_trace_set_prompts(&t, (const int *const *)ps.ids, ps.len, ps.n, &err);
            fprintf(stderr, "%s: %d prompts of real text, %d to %d tokens\n", cmd, ps.n,
                    min_len(ps.len, ps.n), ps.longest);
            kv_cli_prompts_free(&ps);
        }
        if (st) {
            rc = kv_cli_fail(cmd, "--prompts", st, &err);
            goto done;
        }
    }
    const int n_req = max_requests < t.n ? max_requests : t.n;
    /* The longest request of the whole trace sets the sequence length the model must serve:
     * RoPE has no hard limit, so a shorter seq_len is raised (and said so). */
    int64_t longest = 0;
    for (int i = 0; i < t.n; i++)
        if ((int64_t)t.req[i].prompt_len + t.req[i].output_len > longest)
            longest = (int64_t)t.req[i].prompt_len + t.req[i].output_len;
    if (longest > 1 << 20) {
        rc = kv_args_bad(cmd, "--trace", "a request of %lld tokens is longer than kvlab serves",
                         (long long)longest);
        goto done;
    }
    if (mp->config.seq_len < longest) {
        fprintf(stderr, "%s: note: the model's seq_len %d is raised to %lld, the trace's longest "
                "request (RoPE positions have no hard limit)\n", cmd, mp->config.seq_len,
                (long long)longest);
        mp->config.seq_len = (int)longest;
    }
    if (!max_len) max_len = mp->config.seq_len;

    kv_cache_spec spec = kv_cache_spec_default(max_seqs, mp->config.seq_len > max_len ? mp->config.seq_len : max_len);
    spec.layout.kind = KV_LAYOUT_PAGED;
    spec.layout.block_size = block_size;
    spec.layout.n_blocks = n_blocks;
    if ((st = kv_cli_backend_engine(&b, device, mp, &spec, &en, &err)) ||
        (prefix && (st = kv_backend_enable_prefix_cache(b, &err)))) {
        rc = kv_cli_fail(cmd, "backend", st, &err);
        goto done;
    }
    /* both output files are opened before the run: a path that cannot be written (or is
     * not a regular file) fails now, before any work */
    for (int i = 0; i < 2; i++) {
        if (i == 1 && kv_cli_csv_stdout()) continue; /* --csv -: the real stdout */
        if (out_paths[i] && (st = kv_file_create(out_paths[i], &outs[i], &err))) {
            rc = kv_cli_fail(cmd, out_paths[i], st, &err);
            goto done;
        }
    }
    ctx.timeline = outs[0].f;
    if (ctx.timeline)
        kv_csv_printf(ctx.timeline, "step,clock_s,used_blocks,cached_blocks,reserved_blocks,"
                                    "running_seqs,running_reqs,waiting,batch_tokens\n");
    kv_sched_opts o = kv_sched_opts_default();
    o.policy = kv_policy_by_name(policy);
    o.token_budget = budget;
    o.max_len = max_len;
    o.step_s = step_ms / 1000.0;
    o.burst = burst;
    o.temperature = (float)temperature;
    o.seed = (uint64_t)seed;
    o.preempt = kv_preempt_by_name(preempt);
    o.host_blocks = host_blocks;
    o.prefetch = prefetch;
    o.watermark = watermark;
    o.token_s = token_us * 1e-6;
    o.link.bandwidth = link_gbps * 1e9;
    o.link.latency = link_us * 1e-6;
    o.on_step = on_step;
    o.user = &ctx;
    kv_progress_start(&ctx.progress, "serve: requests");
    st = kv_sched_run(b, &t, n_req, &o, &out, &err);
    kv_progress_end(&ctx.progress);
    if (st) {
        rc = kv_cli_fail(cmd, "scheduler", st, &err);
        goto done;
    }
    for (int i = 0, shown = 0; i < out.n; i++)
        if (out.results[i].status != KV_OK && shown++ < 10)
            fprintf(stderr, "%s: %s\n", cmd, out.results[i].error);
    if (out.m.n_failed)
        fprintf(stderr, "%s: %d of %d requests failed\n", cmd, out.m.n_failed, n_req);

    const kv_sched_metrics *x = &out.m;
    char desc[160];
    kv_config_describe(&mp->config, desc, sizeof desc);
    printf("kvlab serve: %s, %d requests, policy %s, %d blocks x %d tokens, prefix cache %s\n",
           trace_path, n_req, policy, n_blocks, block_size, prefix ? "on" : "off");
    if (prompts) printf("prompts: real text, %s (%d-line slices of text)\n", prompts, prompt_lines);
    printf("model %s (%s); budget %d tokens/step, %d slots, max_len %d; clock %.1f ms/step%s\n",
           model_arg, desc, budget, max_seqs, max_len, step_ms, burst ? ", burst arrivals" : "");
    printf("clock model: %.1f us per prefill token; link %.4g GB/s, %.1f us per copy; "
           "block %zu bytes; watermark %.3g\n\n", token_us, link_gbps, link_us,
           b->mem ? b->mem->block_bytes(b->mem) : (size_t)0, watermark);
    printf("  %-34s %8d / %d\n", "requests done / failed", x->n_done, x->n_failed);
    printf("  %-34s %8lld   (%.1f s simulated)\n", "steps", (long long)x->steps, x->clock_s);
    pct_row("KV utilization (mean over steps)", x->utilization);
    pct_row("waste, total", x->waste);
    pct_row("  internal (unused block tails)", x->waste_internal);
    pct_row("  reserved (held, not yet used)", x->waste_reserved);
    printf("  %-34s %8d   (requests %d)\n", "peak running sequences", x->peak_seqs, x->peak_reqs);
    printf("  %-34s %8d   of %d\n", "peak blocks used", x->peak_used_blocks, n_blocks);
    printf("  %-34s %8lld   (%s)\n", "preemptions", (long long)x->preemptions, preempt);
    if (o.preempt != KV_PREEMPT_RECOMPUTE) {
        printf("  %-34s %8lld   (%lld sequences out, %lld in)\n",
               o.preempt == KV_PREEMPT_LRU ? "  paused on the device (lru)" : "  by swap",
               (long long)(o.preempt == KV_PREEMPT_LRU ? x->lru_pauses : x->swap_preemptions),
               (long long)x->seqs_swapped_out, (long long)x->seqs_swapped_in);
        if (o.preempt == KV_PREEMPT_LRU)
            printf("  %-34s %8lld   (%lld blocks; %lld while a step waited)\n", "  evictions",
                   (long long)x->evictions, (long long)x->evicted_blocks,
                   (long long)x->evictions_sync);
        if (prefetch)
            printf("  %-34s %8lld   (%lld blocks; %lld done before their request ran)\n",
                   "  prefetches", (long long)x->prefetches, (long long)x->prefetch_blocks,
                   (long long)x->prefetch_hits);
        printf("  %-34s %8lld\n", "  fell back to recompute", (long long)x->recompute_fallbacks);
        if (x->swap_refused[0]) printf("  %-34s %s\n", "  (swap refused)", x->swap_refused);
        printf("  %-34s %8d   (peak %d held)\n", "host tier blocks", x->host_blocks,
               x->peak_host_blocks);
        printf("  %-34s %8.2f MiB / %.2f MiB  (%lld / %lld blocks)\n", "bytes swapped out / in",
               x->swap_bytes_out / 1048576.0, x->swap_bytes_in / 1048576.0,
               (long long)x->swap_blocks_out, (long long)x->swap_blocks_in);
        printf("  %-34s %8.3f ms / %.3f ms  (kv_link model)\n", "link time out / in",
               1e3 * x->swap_seconds_out, 1e3 * x->swap_seconds_in);
    }
    printf("  %-34s %8lld\n", "tokens recomputed (re-fed)", (long long)x->tokens_recomputed);
    if (x->nomem_retries)
        printf("  %-34s %8lld\n", "steps retried smaller (out of memory)",
               (long long)x->nomem_retries);
    if (prefix)
        printf("  %-34s %8.2f %%  (%lld of %lld prompt tokens)\n", "prefix-cache hit rate",
               100.0 * x->prefix_hit_rate, (long long)x->prefix_hit_tokens,
               (long long)x->prompt_tokens);
    if (x->unshared_blocks)
        printf("  %-34s %8.2f %%  (blocks held %lld vs %lld unshared, summed over steps)\n",
               "sharing saving (n > 1, beams)", 100.0 * x->sharing_saving,
               (long long)x->shared_blocks, (long long)x->unshared_blocks);
    printf("  %-34s %8lld\n", "copy-on-write block copies", (long long)x->cow_copies);
    printf("  %-34s %8lld / %lld\n", "tokens generated / processed",
           (long long)x->tokens_generated, (long long)x->tokens_processed);
    printf("  %-34s %8.0f   (%.2f s measured)\n", "tokens/s generated", x->tokens_per_s, x->wall_s);
    printf("  %-34s %8.3f s  (prefill %.3f s, steps and idle %.3f s)\n", "clock: stalls on the link",
           x->stall_s, x->prefill_s, x->clock_s - x->stall_s - x->prefill_s);
    printf("\n  latency (s, simulated)   requests   first token p50 / p99    end to end p50 / p99\n");
    const char *cls[2] = {"normal", "high"};
    for (int c = 1; c >= 0; c--)
        if (x->n_class[c])
            printf("  %-24s %8d   %10.3f / %-10.3f   %10.3f / %-10.3f\n", cls[c], x->n_class[c],
                   x->ttft_p50[c], x->ttft_p99[c], x->e2e_p50[c], x->e2e_p99[c]);
    if (outs[1].f || (csv && kv_cli_csv_stdout()))
        write_latency_csv(outs[1].f ? outs[1].f : kv_cli_csv_stdout(), &out, &t);
    int leaked = kv_pool_check_leaks(&b->mem->paged->pool, NULL, 0);
    if (leaked) kv_fail(&err, KV_ERR_CAPACITY, "%d blocks still in use", leaked);
    if (!leaked && x->host_leaked) {
        leaked = 1;
        kv_fail(&err, KV_ERR_CAPACITY, "the host tier still holds blocks (%d)", x->host_leaked);
    }
    if (leaked || kv_pool_validate(&b->mem->paged->pool, &err) != KV_OK) {
        rc = kv_cli_fail(cmd, "pool check after the run", KV_ERR_CAPACITY, &err);
        goto done;
    }
    if (n_req && x->n_failed == n_req) { /* nothing was served: the run failed */
        fprintf(stderr, "%s: every request failed (%d of %d)\n", cmd, x->n_failed, n_req);
        rc = KV_EXIT_FAIL;
        goto done;
    }
    for (int i = 0; i < 2; i++) /* the run succeeded: the files replace their paths now */
        if (outs[i].f && kv_file_commit(&outs[i], &err)) {
            rc = kv_cli_write_fail(cmd, i ? "--csv" : "--timeline", &err);
            goto done;
        }
done:
    for (int i = 0; i < 2; i++) kv_file_abort(&outs[i]); /* a failure: the old files stay */
    kv_sched_out_free(&out);
    kv_backend_destroy(b);
    kv_cli_model_close(&mdl);
    kv_trace_free(&t);
    return rc;
}
