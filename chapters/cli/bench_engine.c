/*
 * kvlab bench engine: whole-model greedy decoding against the memory roofline (design.md §12).
 *
 * Decode at batch 1 must read every weight once per token, and the K and V of every earlier
 * position; nothing else it does comes close in bytes. So the fastest a token can be is
 *   roofline time per token = (weight bytes + KV bytes read) / read bandwidth
 * and a run's ratio is roofline time / measured time (1.0 = memory-bound at full speed):
 *   weight bytes per token = kv_decode_weight_bytes()  = 4 (P + dim V + dim + (2L+1) dim)
 *   KV bytes read at position p = L · 2 · H_kv · d · b · (p + 1)      (kv_forward.c's counter)
 * summed over the run, divided by the median wall time of the run, divided by the best read
 * bandwidth reached in the same process just before and just after (kv_bench_ceiling(): the
 * fastest pass, all threads or one), over a buffer far larger than the LLC and over one the
 * size of a token's bytes (weights + its average KV read), where the LLC helps as it helps the
 * run. The largest of these is the ceiling: a run above it (ratio > 1) means the ceiling is
 * wrong, and is reported so, never as a target met.
 *
 * Models are random llama2.c-format weights (kv_model_randomize), built here for each config;
 * the prompt is BOS alone and every step is one token, so the run is pure decode.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_cmds.h"
#include "cli.h"
#include "model_load.h"
#include "kv_generate.h"
#include "kv_needle.h"
#include "kv_linear.h"
#include "kv_ops.h"
#include "measure.h"

/* A model shape, a run length and the roofline ratio it is held to (docs/performance.md). */
typedef struct {
    const char *name;
    int dim, hidden, layers, heads, vocab, tokens, seq_len;
    double target; /* roofline ratio the engine is held to (fp32 cache) */
    const char *why;
} engine_cfg;

static const engine_cfg configs[] = {
    {"small", 288, 768, 6, 6, 32000, 256, 256, 0.85,
     "llama2.c-15M shape, ~61 MB of fp32 weights: just over a 32 MiB LLC"},
    {"long", 288, 768, 6, 6, 32000, 8000, 8192, 0.80,
     "the same model, 8000 tokens: the KV cache outgrows the weights"},
    {"large", 768, 2048, 12, 12, 32000, 256, 256, 0.85,
     "~440 MB of weights: far beyond any LLC, pure weight streaming"},
};
#define N_CONFIGS ((int)(sizeof configs / sizeof configs[0]))
static const char *const config_names[] = {"small", "long", "large", "all", NULL};

/* The ceiling: the best read bandwidth over a large buffer (bw[0]) and over one of a token's
 * bytes (bw[1]), each the fastest pass of all threads or one (kv_bench_ceiling()). */
static int measure_bandwidth(double bw[2], double token_bytes, kv_err *err)
{
    int st = kv_bench_ceiling((double)((size_t)256 << 20), &bw[0], err);
    if (!st) st = kv_bench_ceiling(token_bytes, &bw[1], err);
    return st;
}

/* The model config and cache spec of one run: @p e's shape (or @p given's own), checked
 * together (kv_config_validate, kv_cache_spec_check), so a bad combination is refused before
 * any run measures anything. */
static int run_shape(const engine_cfg *e, const kv_model *given, const char *cache,
                     kv_config *c, kv_cache_spec *spec, kv_err *err)
{
    memset(c, 0, sizeof *c);
    if (given) *c = given->config; /* --model: its own weights, shape and classifier */
    else {
        c->dim = e->dim;
        c->hidden_dim = e->hidden;
        c->n_layers = e->layers;
        c->n_heads = e->heads;
        c->n_kv_heads = e->heads;
        c->vocab_size = e->vocab;
        c->seq_len = e->seq_len;
        kv_config_set_defaults(c);
        c->tied_classifier = 0; /* llama2.c checkpoints of this size carry their own classifier */
    }
    int st = kv_config_validate(c, err);
    if (!st) st = kv_needle_cache_spec(cache, 1, e->seq_len, spec, err);
    if (!st) st = kv_cache_spec_check("cache", c, spec, err);
    return st;
}

static int engine_csv; /* --csv: one row per config in place of the text */

/* The lines above the results: the team, and a warning where OMP_WAIT_POLICY hurts. */
static void header(int ignore_load, const char *cache, const char *weights)
{
    if (engine_csv) {
        kv_csv_printf(stdout, "config,dim,layers,heads,kv_heads,vocab,cache,threads,tokens,repeats,"
                      "weight_bytes_per_token,kv_bytes_per_token,ms_per_token,tokens_per_s,"
                      "read_gbps,ceiling_gbps,ratio,target\n");
        return;
    }
    printf("bench engine: %d OpenMP threads%s, %s weights, cache %s\n", omp_get_max_threads(),
           ignore_load ? " (even on a busy machine)" : " (one thread while the machine is busy)",
           weights, cache);
    /* a decode step opens ~50 parallel regions; sleeping threads pay a wake-up at each one
     * (measured here: 0.29 of the roofline passive against 1.0 active on the small config) */
    const char *wait = getenv("OMP_WAIT_POLICY");
    if (wait && (strcmp(wait, "passive") == 0 || strcmp(wait, "PASSIVE") == 0))
        printf("  note: OMP_WAIT_POLICY=passive: each of a step's parallel regions waits for its "
               "threads to wake;\n  expect a far lower ratio than with the default policy\n");
}

/* One config: build the model, decode `repeats` times, print one result row. *missed counts
 * configs under target. */
static int run_config(const engine_cfg *e, const kv_model *given, const char *cache, int repeats,
                      int custom, int *missed, kv_err *err)
{
    kv_config c;
    kv_cache_spec spec;
    int st = run_shape(e, given, cache, &c, &spec, err);
    if (st) return st;
    kv_model m = {0};
    kv_backend *b = NULL;
    kv_run_log run = {0};
    if (!given) {
        st = kv_model_alloc(&m, &c, err);
        if (!st) kv_model_randomize(&m, 1234);
    }
    if (!st) st = kv_backend_cpu(&b, given ? given : &m, &spec, err);
    if (!st) st = kv_run_log_init(&run, KV_MODE_CACHED, e->tokens, repeats, err);
    /* a token's bytes: the weights (as the model holds them) and the KV it reads on average
     * over the run */
    const double wtok = kv_bench_model_weight_bytes(given ? given : &m);
    const double token_bytes = wtok + (double)c.n_layers * 2 *
        c.n_kv_heads * kv_config_head_dim(&c) * 4.0 * (e->tokens + 1) / 2.0;
    double bw[4] = {0, 0, 0, 0}; /* before: large buffer, token-sized; after: the same (bytes/s) */
    if (!st) st = measure_bandwidth(bw, token_bytes, err);
    const int team0 = kv_parallel_worth(INT64_MAX); /* 0: the ops run on one thread now */
    const int prompt[1] = {1}; /* BOS: every step is one decoded token */
    kv_progress prog;
    kv_progress_start(&prog, "bench engine");
    for (int r = 0; r < repeats && !st; r++)
        st = kv_run_once(&run, b, prompt, 1, &prog, (long)r * e->tokens, (long)repeats * e->tokens, err);
    kv_progress_end(&prog);
    const int team1 = kv_parallel_worth(INT64_MAX);
    if (!st) st = measure_bandwidth(bw + 2, token_bytes, err);
    if (!st) {
        double best = 0;
        for (int i = 0; i < 4; i++) best = bw[i] > best ? bw[i] : best;
        const double t = kv_run_total_median(&run);
        const double wbytes = wtok * e->tokens;
        const double kvbytes = run.sum.kv_bytes_read;
        const double ratio = (wbytes + kvbytes) / t / best;
        const int64_t llc = kv_llc_bytes(NULL, NULL);
        const int has_target = !(custom || strcmp(cache, "fp32") != 0);
        if (engine_csv) {
            kv_csv_printf(stdout, "%s,%d,%d,%d,%d,%d,%s,%d,%d,%d,%.0f,%.0f,%.4f,%.3f,%.4f,%.4f,%.4f,",
                          custom && !given ? "custom" : e->name, c.dim, c.n_layers, c.n_heads,
                          c.n_kv_heads, c.vocab_size, cache, omp_get_max_threads(), e->tokens,
                          repeats, wbytes / e->tokens, kvbytes / e->tokens,
                          t / e->tokens * 1e3, e->tokens / t, (wbytes + kvbytes) / t * 1e-9,
                          best * 1e-9, ratio);
            if (has_target) kv_csv_printf(stdout, "%.2f\n", e->target);
            else kv_csv_printf(stdout, "\n");
            if (has_target && ratio < e->target) ++*missed;
            goto out;
        }
        char desc[256], wb[32], kb[32];
        kv_config_describe(&c, desc, sizeof desc);
        printf("\n[%s] %s; %s\n", custom && !given ? "custom" : e->name, desc, e->why);
        printf("  weights %s per token (%.1fx the LLC); KV read %s per token on average "
               "(cache %s); %d tokens, %d repeats, median\n",
               kv_fmt_bytes(wbytes / e->tokens, wb, sizeof wb),
               llc > 0 ? wbytes / e->tokens / (double)llc : 0.0,
               kv_fmt_bytes(kvbytes / e->tokens, kb, sizeof kb), cache, e->tokens, repeats);
        printf("  best read bandwidth GB/s (fastest pass, all threads or one): before %.2f (%s "
               "buffer %.2f), after %.2f (%.2f); the ceiling is the largest, %.2f\n",
               bw[0] * 1e-9, kv_fmt_bytes(token_bytes, wb, sizeof wb), bw[1] * 1e-9, bw[2] * 1e-9,
               bw[3] * 1e-9, best * 1e-9);
        printf("  %.2f ms/token, %.1f tokens/s, %.2f GB/s read; roofline %.2f ms/token; "
               "ratio %.3f", t / e->tokens * 1e3, e->tokens / t, (wbytes + kvbytes) / t * 1e-9,
               (wbytes + kvbytes) / best / e->tokens * 1e3, ratio);
        if (ratio > 1.0) /* faster than the best bandwidth measured: the ceiling is not one */
            printf("  above 1: the ceiling is wrong (the run read faster than any pass of the "
                   "bandwidth measurement)\n");
        else if (!has_target) printf(" (no target for this shape/cache)\n");
        else if (ratio >= e->target) printf("  target >= %.2f: met\n", e->target);
        else {
            printf("  target >= %.2f: MISSED\n", e->target);
            ++*missed;
        }
        printf("  matmuls on %s at the start, %s at the end\n",
               team0 ? "the whole team" : "one thread (machine busy, or 1 thread)",
               team1 ? "the whole team" : "one thread (machine busy, or 1 thread)");
        if (run.repeats_differ) printf("  warning: repeats chose different tokens\n");
    }
out:
    kv_run_log_free(&run);
    if (b) kv_backend_destroy(b);
    kv_model_free(&m);
    return st;
}

int cmd_bench_engine(int argc, char **argv)
{
    const char *cmd = "kvlab bench engine";
#ifdef KV_HAVE_CUDA /* the model on the GPU: its own options (bench_cuda.c) */
    if (!strcmp(kv_cli_device_arg(argc, argv), "cuda")) return cmd_bench_engine_cuda(argc, argv);
#endif
    const char *which = "small", *cache = "fp32", *device = "cpu", *model = NULL;
    int ignore_load = 0;
    int repeats = 0, tokens = 0, dim = 0, layers = 0, heads = 0, hidden = 0, vocab = 0, seq = 0;
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    int context = 0; /* --context: the cache pre-filled to N tokens (with --model) */
    kv_cli_engine en = {NULL, NULL}; /* --weights (and --prefill: cuda's) */
    kv_opt opts[] = {
        {"--config", KV_OPT_CHOICE, &which, 0, 0, config_names, "NAME", "small (dim 288, L 6, vocab 32000, 256 tokens), long (the same, 8000 tokens, seq_len 8192), large (dim 768, L 12), or all (default small)", 0},
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "M", "a model's own weights instead of a random config: a llama2.c / kvlab checkpoint, `trained`, a GGUF file or smollm2 (256 tokens unless --tokens; no target)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "FORMAT", "cache storage, as kvlab generate --cache (default fp32; the targets are for fp32)", 0},
        {"--ignore-load", KV_OPT_FLAG, &ignore_load, 0, 0, NULL, NULL, "run the OpenMP team even when the machine has no idle core (kv_parallel_ignore_load; default: ops fall back to one thread then)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "runs per config, median (default 5; long: 1)", 0},
        {"--tokens", KV_OPT_INT, &tokens, 1, 1 << 20, NULL, "N", "tokens to decode (overrides the config's; no target then)", 0},
        {"--dim", KV_OPT_INT, &dim, 2, 65536, NULL, "D", "model width (override)", 0},
        {"--layers", KV_OPT_INT, &layers, 1, 1024, NULL, "L", "layers (override)", 0},
        {"--heads", KV_OPT_INT, &heads, 1, 1024, NULL, "H", "heads (override)", 0},
        {"--hidden", KV_OPT_INT, &hidden, 1, 1 << 20, NULL, "F", "SwiGLU width (override)", 0},
        {"--vocab", KV_OPT_INT, &vocab, 2, 1 << 24, NULL, "V", "vocabulary (override)", 0},
        {"--seq-len", KV_OPT_INT, &seq, 1, 1 << 24, NULL, "S", "cache capacity (override; >= tokens)", 0},
        {"--context", KV_OPT_INT, &context, 1, 1 << 20, NULL, "N", "with --model: prefill N tokens (timed), then decode --tokens steps (default 32) at that context, --repeats times (default 3) from the one prefill; prints both speeds (decode: the median), the bytes a decoded token reads and the run's bandwidth ceiling", 0},
        KV_CLI_WEIGHTS_OPT(en),
        KV_CLI_THREADS_OPT(threads),
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cpu (default), or cuda: the model on the GPU (kvlab bench engine --device cuda --help)", 0},
        KV_CLI_CSV_OPTS(engine_csv),
    };
    int r = kv_args_parse(cmd,
                          "Greedy decoding of random-weight llama2.c-format models, one token per step,\n"
                          "timed against the memory roofline measured in the same run:\n"
                          "  ratio = (weight bytes + KV bytes read) / run time / read bandwidth\n"
                          "(kvlab bench bandwidth). A ratio below the target docs/performance.md states is\n"
                          "printed as MISSED; the exit code stays 0 (a benchmark, not a test).",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    if (strcmp(device, "cpu")) return kv_cli_check_device(cmd, device); /* no CUDA build */
    if (kv_cli_engine_check(cmd, device, &en)) return KV_EXIT_USAGE;
    const int storage = kv_cli_engine_storage(device, &en);
    if (engine_csv && context)
        return kv_args_bad(cmd, "--csv", "not with --context (its prefill and decode speeds print "
                           "as text)");
    if (!model && (context || storage != KV_WEIGHTS_F32))
        return kv_args_bad(cmd, context ? "--context" : "--weights", "needs --model (a GGUF file "
                           "or smollm2 for --weights)");
    const int custom = tokens || dim || layers || heads || hidden || vocab || seq;
    int st = KV_OK, missed = 0, ran = 0;
    kv_err err = {{0}};
    kv_cache_spec probe;
    if ((st = kv_needle_cache_spec(cache, 1, 1 << 12, &probe, &err)))
        return kv_cli_fail(cmd, "--cache", st, &err);
    kv_cli_model mdl = {0};
    if (model) { /* the model first: a refusal before any output */
        if (opts[0].seen || dim || layers || heads || hidden || vocab || seq)
            return kv_args_bad(cmd, "--model", "takes the model's own shape: no --config, --dim, "
                               "--layers, --heads, --hidden, --vocab or --seq-len");
        const kv_cli_model_args ma = {model, NULL, NULL, NULL, KV_CLI_TEXT_NONE, 0, storage};
        if ((st = kv_cli_model_load(cmd, &ma, &mdl))) return st;
        const engine_cfg e = {mdl.name, 0, 0, 0, 0, 0, 0, (tokens ? tokens : 256) + 1, 0, ""};
        kv_config c;
        kv_cache_spec spec;
        if ((st = run_shape(&e, &mdl.m, cache, &c, &spec, &err))) {
            kv_cli_model_close(&mdl);
            return kv_cli_fail(cmd, "--cache", st, &err);
        }
    }
    kv_parallel_ignore_load(ignore_load);
    if (model && context) { /* prefill N, then decode at context N */
        st = kv_bench_engine_context(&mdl.m, mdl.name, cache, context, tokens ? tokens : 32,
                                     repeats ? repeats : 3, &err);
        kv_cli_model_close(&mdl);
        if (st) return kv_cli_fail(cmd, "run", st, &err);
        return KV_EXIT_OK;
    }
    if (model) { /* one run on the model's weights */
        char store[64];
        header(ignore_load, cache, kv_model_storage(&mdl.m, store, sizeof store));
        engine_cfg e = {mdl.name, 0, 0, 0, 0, 0, tokens ? tokens : 256, 0, 0, "its own weights"};
        e.seq_len = e.tokens + 1;
        st = run_config(&e, &mdl.m, cache, repeats ? repeats : 3, 1, &missed, &err);
        kv_cli_model_close(&mdl);
        ran = 1;
    }
    /* every run's shape first (pass 0), then the runs (pass 1): nothing is refused after a
     * measurement */
    for (int pass = 0; pass < 2 && !st && !model; pass++) {
        if (pass == 1) header(ignore_load, cache, "fp32");
        for (int i = 0; i < N_CONFIGS && !st; i++) {
            if (strcmp(which, "all") && strcmp(which, configs[i].name)) continue;
            engine_cfg e = configs[i];
            if (tokens) e.tokens = tokens;
            if (dim) e.dim = dim;
            if (layers) e.layers = layers;
            if (heads) e.heads = heads;
            if (hidden) e.hidden = hidden;
            if (vocab) e.vocab = vocab;
            /* kv_generate() holds room for the prompt (BOS) and every chosen token */
            if (seq) e.seq_len = seq;
            else if (e.seq_len < e.tokens + 1) e.seq_len = e.tokens + 1;
            if (e.tokens + 1 > e.seq_len)
                return kv_args_bad(cmd, "--tokens", "BOS + %d tokens exceed the cache capacity %d",
                                   e.tokens, e.seq_len);
            if (pass == 0) {
                kv_config c;
                kv_cache_spec spec;
                if ((st = run_shape(&e, NULL, cache, &c, &spec, &err)))
                    return kv_cli_fail(cmd, e.name, st, &err);
                continue;
            }
            const int reps = repeats ? repeats : (e.tokens > 2048 ? 1 : 5);
            st = run_config(&e, NULL, cache, reps, custom, &missed, &err);
            ran++;
        }
    }
    if (st) return kv_cli_fail(cmd, "run", st, &err);
    if (engine_csv) return KV_EXIT_OK;
    printf("\n%d config%s run; %d below target\n", ran, ran == 1 ? "" : "s", missed);
    printf("formulas: weight bytes/token = 4 (P + dim V + dim + (2L+1) dim), P = L (dim H d + 2 dim H_kv d\n"
           "  + H d dim + 3 dim hidden); KV bytes read at position p = L 2 H_kv d b (p+1);\n"
           "  ratio = (weight + KV bytes) / median run time / bandwidth; GB = 1e9 bytes\n");
    return KV_EXIT_OK;
}
