/*
 * kvlab stream: an endless stream through a sliding-window cache (chapter 06).
 *
 * A windowed cache keeps S sink tokens and the W most recent ones in S+W rows reused as a
 * ring (reference_cpu/cache/kv_window.h), so its memory and its time per token stop growing once
 * it is full. This command decodes a long stream greedily on a micro model and prints, every
 * so many tokens, what the cache holds and how fast it goes; a full cache beside it (every
 * token kept) shows the growth the window removes.
 *
 * Memory is printed two ways: the KV bytes the cache's rows hold (rows · L · 2 · H_kv · d · b,
 * the formula of chapter 02 with N = min(tokens, S+W)), and the growth of the process's
 * resident memory since the run began, the cache's allocation included (measured:
 * /proc/self/statm). A contiguous full cache reserves its capacity up front; the rows it
 * holds, and the time per token, grow with the stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kv_quant.h"
#include "kv_sampler.h"
#include "kv_window.h"

static const char *const schemes[] = {"cache", "original", NULL};
static const char *const stream_layouts[] = {"contiguous", "paged", NULL};

/* What one run measured at its reports. */
typedef struct {
    double kv_first, kv_last;   /* KV bytes held at the first and last report */
    double tps_first, tps_last; /* tokens/s over the first and last report interval */
    double rss_first, rss_last; /* resident bytes gained since before the cache, at the first
                                 * and the last report (-1: not measurable here) */
    long tokens;
} stream_summary;

/* Resident bytes of this process, or -1 where /proc is not there. */
static double rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1, resident = -1;
    if (!f) return -1.0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    fclose(f);
    return resident < 0 ? -1.0 : (double)resident * (double)sysconf(_SC_PAGESIZE);
}

/* Decode @p tokens greedily through a cache built from @p spec, one report row every
 * @p every tokens. */
static int stream_one(FILE *f, int csv, const char *label, const kv_model *m,
                      const kv_cache_spec *spec, long tokens, long every, stream_summary *sum,
                      kv_err *err)
{
    const kv_config *c = &m->config;
    const int V = c->vocab_size, d = kv_config_head_dim(c);
    /* bytes one cached token takes over all layers, metadata included (chapter 04's b) */
    const double per_token = (double)c->n_layers * 2.0 * c->n_kv_heads * d *
                             kv_cache_spec_bytes_per_element(spec, c->n_layers, d);
    kv_backend *b = NULL;
    const double rss0 = rss_bytes(); /* before the cache: its allocation counts as growth */
    int rc = kv_backend_cpu(&b, m, spec, err);
    if (rc) return rc;
    float *logits = malloc(sizeof(float) * (size_t)V); /* [V] */
    if (!logits) {
        kv_backend_destroy(b);
        return kv_fail(err, KV_ERR_NOMEM, "stream: out of memory");
    }
    memset(sum, 0, sizeof *sum);
    kv_progress prog;
    kv_progress_start(&prog, label);
    double t_last = kv_now();
    long at_last = 0;
    int tok = 1, reports = 0;
    for (long p = 0; p < tokens && !rc; p++) {
        kv_seq s = {0, (int)p, 1, &tok};
        rc = b->forward(b, &s, 1, logits, NULL, err);
        if (rc) break;
        if ((rc = kv_logits_check(logits, V, err))) break; /* NaN: no token to feed */
        tok = kv_argmax(logits, V); /* the stream feeds itself */
        if ((p + 1) % every && p + 1 != tokens) continue;
        const double now = kv_now(), rss = rss_bytes();
        const double tps = (double)(p + 1 - at_last) / (now - t_last);
        const int64_t rows = kv_window_rows(spec->window.size, spec->window.n_sinks, p + 1);
        const double kv = (double)rows * per_token;
        const double grown = rss >= 0 && rss0 >= 0 ? rss - rss0 : -1.0;
        if (reports == 0) {
            sum->kv_first = kv;
            sum->tps_first = tps;
            sum->rss_first = grown;
        }
        sum->kv_last = kv;
        sum->tps_last = tps;
        sum->rss_last = grown;
        sum->tokens = p + 1;
        reports++;
        char u1[32], u2[32];
        if (csv)
            kv_csv_printf(f, "%s,%ld,%lld,%.0f,%.0f,%.1f\n", label, p + 1, (long long)rows, kv,
                          grown, tps);
        else
            fprintf(f, "%-10s %10ld %8lld %12s %14s %12.0f\n", label, p + 1, (long long)rows,
                    kv_fmt_bytes(kv, u1, sizeof u1),
                    grown >= 0 ? kv_fmt_bytes(grown, u2, sizeof u2) : "n/a", tps);
        fflush(f);
        t_last = now;
        at_last = p + 1;
        kv_progress_update(&prog, p + 1, tokens);
    }
    kv_progress_end(&prog);
    free(logits);
    kv_backend_destroy(b);
    return rc;
}

/* Header, the windowed run, the full run, and the comparison. The shared part of the
 * command and of chapter 06's demo. */
int kv_stream_study(FILE *f, int csv, const kv_model *m, const kv_cache_spec *win,
                    long tokens, long full_tokens, long every, kv_err *err)
{
    char u1[32], u2[32], u3[32], u4[32];
    const int W = win->window.size, S = win->window.n_sinks;
    if (csv) kv_csv_printf(f, "run,tokens,rows,kv_bytes,rss_growth_bytes,tokens_per_s\n");
    else
        fprintf(f, "stream on a %d-layer model (dim %d, H %d, H_kv %d, vocab %d), greedy, one token "
                "per step, cache %s%s\nwindow: W = %d recent + S = %d sink tokens, positions by %s "
                "(%s)%s\n\n%-10s %10s %8s %12s %14s %12s\n",
                m->config.n_layers, m->config.dim, m->config.n_heads, m->config.n_kv_heads,
                m->config.vocab_size, kv_dtype_name(win->quant.dtype),
                win->layout.kind == KV_LAYOUT_PAGED ? ", paged" : "", W, S,
                win->window.pos_scheme == KV_POS_CACHE ? "cache index" : "original position",
                win->window.pos_scheme == KV_POS_CACHE ? "StreamingLLM" : "Mistral",
                full_tokens > 0 ? "; full: every token kept" : "", "run", "tokens",
                "rows", "KV held", "RSS growth", "tokens/s");
    stream_summary sw, sf;
    memset(&sf, 0, sizeof sf);
    int rc = stream_one(f, csv, "window", m, win, tokens, every, &sw, err);
    if (!rc && full_tokens > 0) {
        kv_cache_spec full = *win;
        full.window.size = full.window.n_sinks = full.window.pos_scheme = 0;
        full.capacity = (int)full_tokens;
        if (full.layout.kind == KV_LAYOUT_PAGED)
            full.layout.n_blocks =
                (int)((full_tokens + full.layout.block_size - 1) / full.layout.block_size);
        /* at least 8 reports over the (shorter) full run, to show its slope */
        const long full_every = every < full_tokens / 8 || full_tokens < 8 ? every : full_tokens / 8;
        rc = stream_one(f, csv, "full", m, &full, full_tokens, full_every, &sf, err);
    }
    if (rc || csv) return rc;
    /* the verdicts come from the measurement: the bytes are counted, the rate is timed (and
     * called flat only within 20 %: a shared machine moves it that much) */
    const double tps_ratio = sw.tps_first > 0 ? sw.tps_last / sw.tps_first : 0;
    const char *tps_verdict = tps_ratio >= 0.8 && tps_ratio <= 1.25 ? "flat within 20 %"
                              : tps_ratio < 0.8                     ? "fell"
                                                                    : "rose";
    fprintf(f, "\nwindow: KV held %s at the first report and %s at the last (%ld tokens)%s; "
            "resident memory\n  +%s -> +%s; tokens/s %.0f -> %.0f (x%.2f: %s).\n",
            kv_fmt_bytes(sw.kv_first, u1, sizeof u1), kv_fmt_bytes(sw.kv_last, u2, sizeof u2),
            sw.tokens, sw.kv_first == sw.kv_last ? ", flat: the S+W rows are full" : ", growing",
            sw.rss_first >= 0 ? kv_fmt_bytes(sw.rss_first, u3, sizeof u3) : "n/a",
            sw.rss_last >= 0 ? kv_fmt_bytes(sw.rss_last, u4, sizeof u4) : "n/a", sw.tps_first,
            sw.tps_last, tps_ratio, tps_verdict);
    if (full_tokens > 0)
        fprintf(f, "full:   KV held %s -> %s over %ld tokens (rows = tokens; the contiguous "
                "cache reserves\n  its %ld-token capacity up front: resident +%s -> +%s); "
                "tokens/s %.0f -> %.0f: each token\n  attends to every earlier one.\n",
                kv_fmt_bytes(sf.kv_first, u1, sizeof u1), kv_fmt_bytes(sf.kv_last, u2, sizeof u2),
                sf.tokens, full_tokens,
                sf.rss_first >= 0 ? kv_fmt_bytes(sf.rss_first, u3, sizeof u3) : "n/a",
                sf.rss_last >= 0 ? kv_fmt_bytes(sf.rss_last, u4, sizeof u4) : "n/a",
                sf.tps_first, sf.tps_last);
    return KV_OK;
}

int cmd_stream(int argc, char **argv)
{
    const char *cmd = "kvlab stream";
    const char *def = "tiny", *cache = "fp16", *scheme = "cache", *layout = "contiguous";
    int64_t tokens = 1 << 20, full_tokens = 32768, every = 0;
    int window = 256, sinks = -1, block = 16, csv = 0;
    int threads = 0; /* --threads: 0 keeps OpenMP's team */
    kv_opt opts[] = {
        {"--default", KV_OPT_CHOICE, &def, 0, 0, kv_cli_defaults, "NAME", "embedded model (default tiny)", 0},
        {"--tokens", KV_OPT_I64, &tokens, 1, (1 << 24) - 1, NULL, "N", "tokens to stream (default 1048576)", 0},
        {"--window", KV_OPT_INT, &window, 1, 1 << 20, NULL, "W", "recent tokens kept (default 256)", 0},
        {"--sinks", KV_OPT_INT, &sinks, 0, 1 << 20, NULL, "S", "first tokens kept forever (default 4 with --scheme cache, 0 with original)", 0},
        {"--scheme", KV_OPT_CHOICE, &scheme, 0, 0, schemes, "P", "RoPE positions: cache (StreamingLLM: index in the cache, default) or original (Mistral)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "FORMAT", "storage: fp32, fp16 (default), bf16, int8, int8-g32/64/128, fp8-e4m3, fp8-e5m2", 0},
        {"--layout", KV_OPT_CHOICE, &layout, 0, 0, stream_layouts, "L", "contiguous (default) or paged", 0},
        {"--block-size", KV_OPT_INT, &block, 1, 4096, NULL, "B", "paged: tokens per block (default 16)", 0},
        {"--full-tokens", KV_OPT_I64, &full_tokens, 0, (1 << 24) - 1, NULL, "M", "tokens of the full-cache run beside it (default 32768; 0 = none)", 0},
        {"--every", KV_OPT_I64, &every, 1, 1 << 24, NULL, "K", "report every K tokens (default: 16 reports)", 0},
        {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE", "the rows as CSV, to FILE in place of the table (- : standard output)", 0},
        KV_CLI_THREADS_OPT(threads),
    };
    int r = kv_args_parse(cmd,
                          "Decode an endless stream through a sliding-window cache (chapter 06):\n"
                          "S sink tokens + the W most recent in S+W rows reused as a ring. Prints\n"
                          "the KV bytes held, resident memory growth and tokens/s as it goes, then a\n"
                          "full cache (every token kept) over --full-tokens for comparison.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (kv_cli_threads(cmd, threads)) return KV_EXIT_USAGE;
    if (opts[7].seen && strcmp(layout, "paged")) /* refused rather than ignored */
        return kv_args_bad(cmd, "--block-size", "needs --layout paged");
    const int fmt = kv_quant_parse(cache);
    if (fmt < 0)
        return kv_args_bad(cmd, "--cache", "unknown format '%s' (fp32, fp16, bf16, int8, "
                           "int8-g32, int8-g64, int8-g128, fp8-e4m3, fp8-e5m2)", cache);
    if (kvq_is_kivi(fmt))
        return kv_args_bad(cmd, "--cache", "%s keeps 32-token groups that a ring of reused rows "
                           "breaks; use a per-token format", cache);
    kv_model m;
    kv_err err = {{0}};
    int st = kv_cli_default_model(&m, def, &err);
    if (st) return kv_cli_fail(cmd, def, st, &err);
    kv_cache_spec spec = kv_cache_spec_default(1, (int)tokens);
    spec.quant.dtype = fmt;
    spec.window.size = window;
    spec.window.pos_scheme = kv_window_scheme_parse(scheme);
    spec.window.n_sinks = sinks >= 0                                ? sinks
                          : spec.window.pos_scheme == KV_POS_CACHE ? KV_WINDOW_DEFAULT_SINKS
                                                                   : 0;
    if (!strcmp(layout, "paged")) {
        spec.layout.kind = KV_LAYOUT_PAGED;
        spec.layout.block_size = block;
        spec.layout.n_blocks = (int)((kv_window_keep(window, spec.window.n_sinks) + block - 1) / block);
    }
    if (every <= 0) every = tokens / 16 > 0 ? tokens / 16 : 1;
    st = kv_stream_study(stdout, csv, &m, &spec, tokens, full_tokens, every, &err);
    kv_model_free(&m);
    return st ? kv_cli_fail(cmd, "stream", st, &err) : KV_EXIT_OK;
}
