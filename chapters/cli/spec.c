/*
 * kvlab spec: speculative decoding (chapter 10) on an embedded model, for k = 1..K.
 *
 * The draft is the target's first --draft-layers layers (kv_model_layer_prefix: the same
 * weights, no second model). For each k the command runs kv_spec_generate() and prints what
 * the cache saw: how many target steps the tokens took (a plain run takes one per token), the
 * acceptance rate, and the K/V bytes each model wrote and then rolled back because the target
 * rejected them. Greedy runs are also checked token for token against plain greedy decoding
 * on the same device (--device cuda: both models on the GPU).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_prompts.h"
#include "cli.h"
#include "model_load.h"
#include "kv_generate.h"
#include "kv_quant.h"
#include "kv_spec.h"

static const char *const spec_layouts[] = {"contiguous", "paged", NULL};

/* Bytes the CPU cache of @p b has copied into its undo logs (window / KIVI), or -1 when the
 * backend is not the CPU's or keeps no log. */
static double undo_copied(kv_backend *b)
{
    const kv_cache *c = kv_backend_cpu_cache(b);
    return c && c->undo ? c->undo[0].copied : -1.0;
}

/* The alternative to a log: before each round, copy everything a round may overwrite in one
 * slot, every layer, K and V, every KV head: a window's whole ring (S+W rows, codes and
 * metadata), or KIVI's fp32 window (R rows) plus the one group a round's spill writes. */
static double snapshot_bytes(kv_backend *b)
{
    const kv_cache *c = kv_backend_cpu_cache(b);
    if (!c || !kv_cache_needs_undo(&c->spec, c->fmt, c->n_layers)) return -1.0;
    double total = 0.0;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < c->n_planes; i++) {
            const kv_cache_plane *p = kv_cache_plane_of(c->planes, c->n_layers, i, l);
            const int role = p->role;
            size_t off[4];
            if (kvq_is_kivi(c->fmt[l])) {
                kv_cache_span(p, c->fmt[l], role, 0, 0, 0, KV_KIVI_GROUP, c->head_dim, off);
                total += (double)c->window * c->head_dim * sizeof(float) + off[1] + off[3];
            } else {
                kv_cache_span(p, c->fmt[l], role, 0, 0, 0, 1, c->head_dim, off);
                total += (double)kv_window_keep(c->spec.window.size, c->spec.window.n_sinks) *
                         (off[1] + off[3]);
            }
        }
    return total * c->n_kv_heads;
}

/* Both backends for one run on @p device: the same cache spec, target and draft models. */
static int make_pair(kv_backend **t, kv_backend **d, const char *device, const kv_model *m,
                     const kv_model *dm, const kv_cache_spec *spec, kv_err *err)
{
    *t = *d = NULL;
    int rc = kv_cli_backend(t, device, m, spec, err);
    if (!rc) rc = kv_cli_backend(d, device, dm, spec, err);
    return rc;
}

/* One prompt of @p n random ids from @p seed (the embedded models' way). */
static int prompts_random(kv_cli_prompts *p, int n, int vocab, uint64_t seed, kv_err *err)
{
    int *ids = kv_cli_prompts_add(p, n, err);
    if (!ids) return KV_ERR_NOMEM;
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) ids[i] = (int)(kv_rng_u32(&rng) % (uint32_t)vocab);
    p->longest = n;
    return KV_OK;
}

/* One k over every prompt: the stats summed, *same 1 when every greedy run matched want. */
static int spec_k(kv_backend *t, kv_backend *d, const kv_cli_prompts *p, int **want, int *got,
                  const kv_spec_opts *o, kv_spec_stats *sum, int *same, kv_err *err)
{
    memset(sum, 0, sizeof *sum);
    *same = 1;
    for (int i = 0; i < p->n; i++) {
        kv_spec_stats st;
        int rc = kv_spec_generate(t, d, p->ids[i], p->len[i], o, got, &st, err);
        if (rc) return rc;
        if (want && memcmp(got, want[i], sizeof(int) * o->n_tokens)) *same = 0;
        sum->emitted += st.emitted, sum->target_steps += st.target_steps;
        sum->draft_steps += st.draft_steps, sum->drafted += st.drafted;
        sum->accepted += st.accepted;
        sum->target_kv_written += st.target_kv_written;
        sum->target_kv_rolled_back += st.target_kv_rolled_back;
        sum->draft_kv_written += st.draft_kv_written;
        sum->draft_kv_rolled_back += st.draft_kv_rolled_back;
    }
    return KV_OK;
}

static int spec_table(const kv_model *m, const char *name, const char *device, int draft_layers,
                      const kv_cache_spec *spec, const kv_cli_prompts *p, const char *what,
                      int n_tokens, int max_k, double temperature, uint64_t seed, int csv,
                      kv_err *err)
{
    kv_model dm;
    int rc = kv_model_layer_prefix(&dm, m, draft_layers, err);
    if (rc) return rc;
    /* the view aliases m's one weight block, which is what the CUDA backend uploads */
    dm.data = m->data;
    dm.n_floats = m->n_floats;
    const int greedy = temperature == 0.0;
    int **want = greedy ? calloc((size_t)p->n, sizeof *want) : NULL;
    int *got = malloc(sizeof(int) * n_tokens);
    kv_backend *t = NULL, *d = NULL;
    if (!got || (greedy && !want)) {
        rc = kv_fail(err, KV_ERR_NOMEM, "spec: out of memory");
        goto done;
    }
    rc = make_pair(&t, &d, device, m, &dm, spec, err);
    if (rc) goto done;
    for (int i = 0; greedy && i < p->n && !rc; i++) { /* the tokens every k must reproduce */
        const kv_gen_opts go = {KV_MODE_CACHED, 0, n_tokens, NULL, NULL, NULL, NULL};
        if (!(want[i] = malloc(sizeof(int) * n_tokens)))
            rc = kv_fail(err, KV_ERR_NOMEM, "spec: out of memory");
        else rc = kv_generate(t, p->ids[i], p->len[i], &go, want[i], NULL, err);
    }
    if (rc) goto done;
    const int total = n_tokens * p->n; /* the tokens of every prompt: a plain run's steps */
    char lay[64];
    const int logged = snapshot_bytes(t) >= 0.0; /* a window or KIVI on the CPU: undo columns */
    if (csv) {
        kv_csv_printf(stdout, "k,target_steps,plain_steps,steps_saved,tokens_per_step,"
                              "acceptance,target_kv_written,target_kv_rolled_back,draft_kv_written,"
                              "draft_kv_rolled_back,matches_greedy,draft_layers,temperature,prompts");
        kv_csv_printf(stdout, logged ? ",undo_log_bytes,ring_copy_bytes\n" : "\n");
    } else {
        printf("speculative decoding: target %s (%d layers), draft = its first %d layer%s\n"
               "device %s, cache %s, %s, %d tokens emitted after each, %s\n\n", name,
               m->config.n_layers, draft_layers, draft_layers == 1 ? "" : "s", t->name,
               kv_cli_layout_name(spec, lay, sizeof lay), what, n_tokens,
               greedy ? "greedy" : "sampling");
        printf("%2s  %6s %6s %6s %9s %7s  %11s %11s  %11s %11s  %8s", "k", "target", "plain",
               "saved", "tok/step", "accept", "target KV", "rolled back", "draft KV",
               "rolled back", greedy ? "= greedy" : "");
        if (logged) printf("  %11s %11s", "undo log", "ring copy");
        printf("\n");
    }
    for (int k = 1; k <= max_k && !rc; k++) {
        const kv_spec_opts o = {k, n_tokens, 0, (float)temperature, seed + (uint64_t)k};
        kv_spec_stats st;
        int same;
        const double u0 = undo_copied(t) + undo_copied(d);
        rc = spec_k(t, d, p, want, got, &o, &st, &same, err);
        if (rc) break;
        /* undo log: bytes both caches copied; ring copy: a snapshot per round of each */
        const double undo = undo_copied(t) + undo_copied(d) - u0;
        const double snap = (double)st.target_steps * (snapshot_bytes(t) + snapshot_bytes(d));
        same = greedy && same;
        const double tps = (double)st.emitted / (double)st.target_steps;
        if (csv) {
            kv_csv_printf(stdout, "%d,%lld,%d,%lld,%.3f,%.4f,%.0f,%.0f,%.0f,%.0f,%s,%d,%g,%d", k,
                          (long long)st.target_steps, total, (long long)(total - st.target_steps),
                          tps, kv_spec_acceptance(&st), st.target_kv_written,
                          st.target_kv_rolled_back, st.draft_kv_written, st.draft_kv_rolled_back,
                          greedy ? (same ? "yes" : "no") : "n/a", draft_layers, temperature,
                          p->n);
            if (logged) kv_csv_printf(stdout, ",%.0f,%.0f", undo, snap);
            kv_csv_printf(stdout, "\n");
        } else {
            char b[6][32];
            printf("%2d  %6lld %6d %6lld %9.2f %6.1f%%  %11s %11s  %11s %11s  %8s", k,
                   (long long)st.target_steps, total, (long long)(total - st.target_steps),
                   tps, 100.0 * kv_spec_acceptance(&st),
                   kv_fmt_bytes(st.target_kv_written, b[0], sizeof b[0]),
                   kv_fmt_bytes(st.target_kv_rolled_back, b[1], sizeof b[1]),
                   kv_fmt_bytes(st.draft_kv_written, b[2], sizeof b[2]),
                   kv_fmt_bytes(st.draft_kv_rolled_back, b[3], sizeof b[3]),
                   greedy ? (same ? "yes" : "NO") : "");
            if (logged)
                printf("  %11s %11s", kv_fmt_bytes(undo, b[4], sizeof b[4]),
                       kv_fmt_bytes(snap, b[5], sizeof b[5]));
            printf("\n");
            fflush(stdout);
        }
        if (greedy && !same)
            rc = kv_fail(err, KV_ERR_ARG, "spec: k=%d emitted other tokens than greedy", k);
    }
    if (!rc && !csv)
        printf("\ntarget steps: verification calls (the first also prefills the prompt); a plain "
               "run takes one per token.\nrolled back: K/V of drafted tokens the target "
               "rejected, written and then dropped from the cache.\n");
    if (!rc && !csv && logged)
        printf("undo log: bytes both caches copied before overwriting them (ring rows, KIVI "
               "window rows and spilled groups),\nso a rejected tail could be copied back; ring "
               "copy: the same protection by copying each cache's whole\nring (KIVI: fp32 window "
               "+ one group) before every round.\n");
done:
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    for (int i = 0; want && i < p->n; i++) free(want[i]);
    free(want);
    free(got);
    return rc;
}

int cmd_spec(int argc, char **argv)
{
    const char *cmd = "kvlab spec";
    const char *def = NULL, *cache = "fp32", *layout = "contiguous", *device = "cpu";
    const char *model_path = NULL, *script = NULL;
    int turns = 0;
    int draft_layers = 1, prompt = 0, tokens = 64, max_k = 8, block = 0, csv = 0;
    int window = 0, sinks = 0, kivi_window = 0;
    const char *scheme = "original";
    int64_t seed = 1;
    double temperature = 0.0;
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where both models run (default cpu)", 0},
        {"--default", KV_OPT_CHOICE, &def, 0, 0, kv_cli_defaults, "NAME", "embedded target model (default small)", 0},
        {"--model", KV_OPT_STRING, &model_path, 0, 0, NULL, "FILE", "or a model file as the target: a llama2.c / kvlab checkpoint, `trained`, a GGUF file or smollm2 (KIVI needs 32 | head dim)", 0},
        {"--draft-layers", KV_OPT_INT, &draft_layers, 1, 1 << 10, NULL, "N", "layers of the target the draft keeps (default 1)", 0},
        {"--prompt", KV_OPT_INT, &prompt, 1, 1 << 16, NULL, "P", "random prompt tokens (default 16)", 0},
        {"--script", KV_OPT_STRING, &script, 0, 0, NULL, "FILE", "a chat model: the prompts are real text, each a one-turn conversation in the model's template: a chat script's user turns (datasets/chat-dialogues/*.chat), or a text's 8-line slices asked for a summary (files separated by ','); the table sums them", 0},
        {"--turns", KV_OPT_INT, &turns, 1, 1 << 16, NULL, "N", "with --script: the first N prompts (default all)", 0},
        {"--tokens", KV_OPT_INT, &tokens, 1, 1 << 16, NULL, "N", "tokens to emit per run (default 64)", 0},
        {"--max-k", KV_OPT_INT, &max_k, 1, 64, NULL, "K", "runs for k = 1..K draft tokens (default 8)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "FORMAT", "storage: fp32 (default), fp16, bf16, int8, int8-g32/64/128, fp8-e4m3, fp8-e5m2, int4-kivi, int2-kivi", 0},
        {"--layout", KV_OPT_CHOICE, &layout, 0, 0, spec_layouts, "L", "contiguous (default) or paged", 0},
        {"--block-size", KV_OPT_INT, &block, 1, 4096, NULL, "B", "paged: tokens per block (default 16; 32 for KIVI)", 0},
        {"--window", KV_OPT_INT, &window, 0, 1 << 24, NULL, "W", "sliding window of W recent tokens (default 0: keep all)", 0},
        {"--sinks", KV_OPT_INT, &sinks, 0, 1 << 20, NULL, "S", "with --window: first tokens kept forever (default 0)", 0},
        {"--scheme", KV_OPT_STRING, &scheme, 0, 0, NULL, "P", "with --window: RoPE by original position (default) or cache index", 0},
        {"--kivi-window", KV_OPT_INT, &kivi_window, 0, 1 << 20, NULL, "R", "int4-kivi / int2-kivi: fp32 window, a multiple of 32 (default 128)", 0},
        {"--temperature", KV_OPT_FLOAT, &temperature, 0, 100, NULL, "T", "0 = greedy (default), else sampling with the acceptance rule", 0},
        {"--seed", KV_OPT_I64, &seed, 0, 1e15, NULL, "S", "prompt and sampling seed (default 1)", 0},
        {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE", "the rows as CSV, to FILE in place of the table (- : standard output)", 0},
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Speculative decoding (chapter 10): a draft (the target's first layers)\n"
                          "proposes k tokens, the target verifies them in one step, and the K/V of\n"
                          "rejected tokens is rolled back. For k = 1..K prints target steps saved,\n"
                          "acceptance rate, and KV bytes written and rolled back.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    const int dev = kv_cli_check_device(cmd, device);
    if (dev != KV_EXIT_OK) return dev;
    const int fmt = kv_quant_parse(cache);
    if (fmt < 0)
        return kv_args_bad(cmd, "--cache", "unknown format '%s' (fp32, fp16, bf16, int8, "
                           "int8-g32, int8-g64, int8-g128, fp8-e4m3, fp8-e5m2)", cache);
    const int pos_scheme = kv_window_scheme_parse(scheme);
    if (pos_scheme < 0)
        return kv_args_bad(cmd, "--scheme", "unknown '%s' (original, cache)", scheme);
    /* combinations the cache would refuse later, refused here by the option that is wrong */
    const int kivi = kvq_is_kivi(fmt), paged = !strcmp(layout, "paged");
    if (sinks && !window) return kv_args_bad(cmd, "--sinks", "needs --window (window 0 keeps every token)");
    if (pos_scheme != KV_POS_ORIGINAL && !window)
        return kv_args_bad(cmd, "--scheme", "'%s' needs --window", scheme);
    if (kivi_window && !kivi)
        return kv_args_bad(cmd, "--kivi-window", "needs --cache int4-kivi or int2-kivi (not %s)", cache);
    if (kivi_window % KV_KIVI_GROUP)
        return kv_args_bad(cmd, "--kivi-window", "%d is not a multiple of %d", kivi_window, KV_KIVI_GROUP);
    if (block && !paged) return kv_args_bad(cmd, "--block-size", "needs --layout paged");
    if (!block) block = kivi ? KV_KIVI_GROUP : 16;
    if (paged && kivi && block % KV_KIVI_GROUP)
        return kv_args_bad(cmd, "--block-size", "%d: a paged %s cache needs a multiple of %d", block,
                           cache, KV_KIVI_GROUP);
    if (turns && !script) return kv_args_bad(cmd, "--turns", "needs --script");
    if (script && prompt) return kv_args_bad(cmd, "--prompt", "random prompts, or --script: not both");
    if (!prompt) prompt = 16;
    const kv_cli_model_args ma = {model_path, def, "small", NULL,
                                  script ? KV_CLI_TEXT_NEED : KV_CLI_TEXT_NONE, 0};
    kv_cli_model mdl;
    int st = kv_cli_model_load(cmd, &ma, &mdl);
    if (st) return st;
    kv_err err = {{0}};
    const kv_model *const mp = &mdl.m;
    def = mdl.name;
    const int n_layers = mp->config.n_layers;
    /* the row a KIVI group spans: a head's, or an MLA model's latent row (chapter 11) */
    const int mla = mp->config.attn == KV_ATTN_MLA;
    const int row = mla ? kv_mla_row(&mp->config.mla) : kv_config_head_dim(&mp->config);
    if (draft_layers > n_layers)
        st = kv_args_bad(cmd, "--draft-layers", "%d, but %s has %d layers", draft_layers, def,
                         n_layers);
    else if (kivi && row % KV_KIVI_GROUP)
        st = kv_args_bad(cmd, "--cache", "%s needs the %s to be a multiple of %d; %s has "
                         "%d (give --model with such a checkpoint)", cache,
                         mla ? "latent row (d_c + d_R)" : "head dim", KV_KIVI_GROUP, def, row);
    if (st) {
        kv_cli_model_close(&mdl);
        return st;
    }
    kv_cli_prompts ps = {0};
    char what[KV_CLI_PATH_MAX + 64];
    if (script) {
        st = kv_cli_prompts_files(script, 8, turns, mp->config.seq_len - tokens - max_k, &mdl,
                                  &ps, &err);
        snprintf(what, sizeof what, "%d prompts from %s (%d tokens at most)", ps.n, script,
                 ps.longest);
    } else {
        st = prompts_random(&ps, prompt, mp->config.vocab_size, (uint64_t)seed, &err);
        snprintf(what, sizeof what, "a prompt of %d random tokens", prompt);
    }
    kv_cache_spec spec = kv_cache_spec_default(1, ps.longest + tokens);
    spec.quant.dtype = fmt;
    spec.window.size = window; /* a window or KIVI rolls back through the undo log (kv_cache.h) */
    spec.window.n_sinks = sinks;
    spec.window.pos_scheme = pos_scheme;
    spec.quant.kivi_window = kivi_window;
    if (!strcmp(layout, "paged")) {
        spec.layout.kind = KV_LAYOUT_PAGED;
        spec.layout.block_size = block;
        spec.layout.n_blocks = (ps.longest + tokens + block - 1) / block;
    }
    const char *at = "--script"; /* what a failure names: the prompts, or the run */
    if (!st) {
        at = "spec";
        st = spec_table(mp, def, device, draft_layers, &spec, &ps, what, tokens, max_k,
                        temperature, (uint64_t)seed, csv, &err);
    }
    kv_cli_prompts_free(&ps);
    kv_cli_model_close(&mdl);
    return st ? kv_cli_fail(cmd, at, st, &err) : KV_EXIT_OK;
}
