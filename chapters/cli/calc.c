/*
 * kvlab calc: the KV cache's memory, from the formula.
 *
 * Every layer keeps, for every cached token, one key and one value vector per KV head:
 *   bytes = L · 2 · N · H_kv · d · b       (· B for B sequences)
 * It depends on the KV heads (not the query heads) and not on the vocabulary at all.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kv_config.h"
#include "kv_heads.h"
#include "kv_mla.h"
#include "kv_quant.h"

static const char *const about =
    "KV-cache memory = L * 2 * N * H_kv * d * b bytes (* B sequences), printed step by step\n"
    "for one model (--preset or --config), or as a table for every preset when neither is\n"
    "given. Units are binary (1 KiB = 1024 bytes, 1 MiB = 1024 KiB, 1 GiB = 1024 MiB).\n"
    "Element bytes b include the formats' metadata (chapter 04, reference_cpu/cache/kv_quant.h):\n"
    "fp32 4, fp16/bf16 2, int8 1 + 4/d (one fp32 scale per token and head), int8-gG 1 + 4/G,\n"
    "fp8 1 (+ one 4-byte scale per layer, head and K/V), int4 0.5 + 4/32, int2 0.25 + 4/32\n"
    "(KIVI: fp16 scale and zero per 32 elements, + a 128-token fp32 window per head).\n"
    "A sliding window (chapter 06; --window W, --sinks S, or the preset's own, e.g. mistral-7b)\n"
    "caps N at S + W: the cache keeps S sink tokens and the W most recent.\n"
    "--tp P (chapter 10) adds the cache of one of P tensor-parallel ranks: H/P query heads\n"
    "each, H_kv/P KV heads each, or one KV head replicated on P/H_kv ranks when P > H_kv.\n"
    "MLA presets (chapter 11: deepseek-v2, deepseek-v2-lite, deepseek-v3) cache one latent row\n"
    "per token and layer: L * N * (d_c + d_R) * b.";

static const char *const dtypes[] = {"fp32", "fp16", "bf16", "int8", "int8-g32", "int8-g64",
                                     "int8-g128", "fp8", "fp8-e4m3", "fp8-e5m2", "int4",
                                     "int4-kivi", "int2", "int2-kivi", NULL};

/* b of a format at head dim d, metadata included (kv_quant_bytes_per_element()). */
static double dtype_bytes(const char *dt, int d)
{
    return kv_quant_bytes_per_element(kv_quant_parse(dt), d);
}

/* Bytes a format adds per sequence whatever N: L · 2 · H_kv · kv_quant_fixed_bytes()
 * (KIVI's fp32 window of KV_KIVI_WINDOW tokens, fp8's scale per head). */
static double dtype_fixed(const char *dt, const kv_config *c)
{
    return (double)c->n_layers * 2 * c->n_kv_heads *
           (double)kv_quant_fixed_bytes(kv_quant_parse(dt), kv_config_head_dim(c), KV_KIVI_WINDOW);
}

/* "dim,hidden,L,H,Hkv,vocab,seq" -> a validated config; exit code on failure. */
static int parse_config(const char *cmd, const char *s, kv_config *c)
{
    int v[7], n = 0, more = 0; /* more: text follows the last field read */
    char part[64];
    const char *p = s;
    while (n < 7) {
        const char *comma = strchr(p, ',');
        more = comma != NULL;
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len >= sizeof part) /* not cut short: "000...0005abc" must not read as 5 */
            return kv_args_bad(cmd, "--config", "field %d is %zu characters long (too long for "
                               "an integer)", n + 1, len);
        memcpy(part, p, len);
        part[len] = '\0';
        int64_t x;
        const char *why;
        if (kv_parse_i64(part, 1, 1 << 30, &x, &why))
            return kv_args_bad(cmd, "--config", "field %d '%s' %s (expected 7 positive integers "
                               "dim,hidden,L,H,Hkv,vocab,seq)", n + 1, part, why);
        v[n++] = (int)x;
        if (!comma) break;
        p = comma + 1;
    }
    if (n != 7 || more)
        return kv_args_bad(cmd, "--config", "'%s' needs exactly 7 comma-separated integers "
                           "dim,hidden,L,H,Hkv,vocab,seq", s);
    memset(c, 0, sizeof *c);
    c->dim = v[0]; c->hidden_dim = v[1]; c->n_layers = v[2]; c->n_heads = v[3];
    c->n_kv_heads = v[4]; c->vocab_size = v[5]; c->seq_len = v[6];
    kv_config_set_defaults(c);
    kv_err err = {{0}};
    if (kv_config_validate(c, &err) != KV_OK)
        return kv_args_bad(cmd, "--config", "%s", err.msg);
    return KV_EXIT_OK;
}

/* One model, every step of the formula with its numbers. */
/* A byte count as the steps print it: whole numbers as such, fractions of a byte (sub-byte
 * formats at small head dims: 2.5 bytes per layer) exactly, never rounded to "8 = 7.5 B". */
static const char *exact(double v, char *buf, size_t n)
{
    if (v == floor(v) && fabs(v) < 1e18) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%.6g", v);
    return buf;
}

static void explain(const char *name, const kv_config *c, int window, int sinks, const char *dt,
                    int64_t n_req, int64_t batch)
{
    const int L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads, d = kv_config_head_dim(c);
    const double b = dtype_bytes(dt, d);
    /* a sliding window (chapter 06) keeps S sinks + the W most recent tokens: N <= S + W */
    const int64_t keep = window > 0 ? (int64_t)window + sinks : 0;
    const int64_t n = (keep > 0 && n_req > keep) ? keep : n_req;
    const double per_layer = 2.0 * Hkv * d * b;  /* one token, one layer */
    const double per_token = L * per_layer;
    const double at_n = per_token * (double)n;
    const double at_b = at_n * (double)batch;
    char u1[32], u2[32], u3[32], u4[32], g[32];

    printf("KV-cache memory of %s: L %d, H %d, H_kv %d (G = H/H_kv = %d), d %d; dtype %s, b = %g bytes\n\n",
           name, L, H, Hkv, kv_heads_group(H, Hkv), d, dt, b);
    printf("  bytes = L * 2 * N * H_kv * d * b   (2: one K and one V vector per KV head; * B sequences)\n");
    printf("  binary units: 1 KiB = 1024 bytes, 1 MiB = 1024 KiB, 1 GiB = 1024 MiB\n\n");
    char e1[64], e2[64], e3[64], e4[64], v[4][40];
    snprintf(e1, sizeof e1, "2 * %d * %d * %g", Hkv, d, b);
    snprintf(e2, sizeof e2, "%d * %s", L, exact(per_layer, v[0], sizeof v[0]));
    snprintf(e3, sizeof e3, "%lld * %s", (long long)n, exact(per_token, v[1], sizeof v[1]));
    snprintf(e4, sizeof e4, "%lld * %s", (long long)batch, exact(at_n, v[2], sizeof v[2]));
    char l3[48], l4[48];
    snprintf(l3, sizeof l3, "at N = %lld tokens", (long long)n);
    snprintf(l4, sizeof l4, "at batch B = %lld", (long long)batch);
    const char *rows[4][3] = {{"per token per layer", "2 * H_kv * d * b", e1},
                              {"per token", "L * (per layer)", e2},
                              {l3, "N * (per token)", e3},
                              {l4, "B * (at N)", e4}};
    const double val[4] = {per_layer, per_token, at_n, at_b};
    char *unit[4] = {u1, u2, u3, u4};
    for (int i = 0; i < 4; i++) {
        kv_fmt_bytes(val[i], unit[i], sizeof u1);
        printf("  %-20s %-17s = %-22s = %14s bytes = %s", rows[i][0], rows[i][1], rows[i][2],
               exact(val[i], v[3], sizeof v[3]), unit[i]);
        /* GiB too when the natural unit is smaller, so "512 MiB" reads as "0.5 GiB" as well */
        if (i >= 2 && val[i] < 1024.0 * 1024 * 1024 && val[i] >= 1024.0 * 1024)
            printf(" = %.4g GiB", val[i] / (1024.0 * 1024 * 1024));
        printf("\n");
    }
    if (window > 0 && sinks == 0)
        printf("\n  %s attends over a sliding window of %d tokens: its cache never holds more than\n"
               "  %d tokens per sequence, so N = min(%lld requested, %d) = %lld.\n",
               name, window, window, (long long)n_req, window, (long long)n);
    if (window > 0 && sinks > 0)
        printf("\n  %s keeps %d sink tokens + a sliding window of the %d most recent (chapter 06):\n"
               "  its cache never holds more than S + W = %lld tokens per sequence, so\n"
               "  N = min(%lld requested, %lld) = %lld.\n", name, sinks, window, (long long)keep,
               (long long)n_req, (long long)keep, (long long)n);
    if (window > 0 && n_req > keep)
        printf("  without the window: %lld tokens, %.4g times the bytes.\n", (long long)n_req,
               (double)n_req / (double)n);
    if (b < 2.0) {
        const double fixed = dtype_fixed(dt, c);
        char uf[32];
        printf("\n  b = %g includes %s's metadata (chapter 04, kv_quant.h): scales (and zero points)\n"
               "  per token, head or group of its codes.", b, dt);
        if (fixed > 0)
            printf(" Plus, per sequence and independent of N,\n  L * 2 * H_kv * %zu = %s (%s).",
                   kv_quant_fixed_bytes(kv_quant_parse(dt), d, KV_KIVI_WINDOW),
                   kv_fmt_bytes(fixed, uf, sizeof uf),
                   kvq_is_kivi(kv_quant_parse(dt)) ? "the fp32 window of the newest 128 tokens"
                                                   : "one fp32 scale per head");
        printf("\n");
    }
    const double weights = (double)kv_config_param_count(c) * b;
    printf("\n  for scale: the weights at %s are %.3g params * %g = %s; one sequence's cache\n"
           "  reaches that size at N = %.0f tokens%s.\n", dt, (double)kv_config_param_count(c), b,
           kv_fmt_bytes(weights, g, sizeof g), weights / per_token,
           keep > 0 && weights / per_token > keep ? " (never, with the window)" : "");
}

/*
 * Tensor parallelism over p ranks (chapter 10): each rank holds H / p query heads and the KV
 * heads they read. With p <= H_kv the KV heads split evenly (H_kv / p each); with p > H_kv
 * there are fewer KV heads than ranks, so each rank keeps the one KV head its query heads
 * read, and every KV head is stored on p / H_kv ranks (replicated, as serving engines do).
 */
static int tp_check(const char *cmd, const kv_config *c, int p)
{
    const int H = c->n_heads, Hkv = c->n_kv_heads;
    if (H % p)
        return kv_args_bad(cmd, "--tp", "%d ranks do not divide the %d query heads", p, H);
    if (p <= Hkv ? Hkv % p : p % Hkv)
        return kv_args_bad(cmd, "--tp", "%d ranks and %d KV heads: one must divide the other "
                           "(each rank needs whole KV heads, or whole copies of one)", p, Hkv);
    return KV_EXIT_OK;
}

static void explain_tp(const kv_config *c, const char *dt, int64_t n, int64_t batch, int p)
{
    const int H = c->n_heads, Hkv = c->n_kv_heads, L = c->n_layers, d = kv_config_head_dim(c);
    const int kv_rank = p <= Hkv ? Hkv / p : 1;      /* KV heads stored per rank */
    const int copies = p <= Hkv ? 1 : p / Hkv;       /* ranks storing each KV head */
    const double b = dtype_bytes(dt, d);
    const double per_rank = (double)L * 2 * (double)n * kv_rank * d * b * (double)batch;
    const double one = (double)L * 2 * (double)n * Hkv * d * b * (double)batch;
    char u1[32], u2[32], u3[32];
    printf("\n  tensor parallel over p = %d ranks (chapter 10): each rank computes %d of the %d "
           "query heads\n", p, H / p, H);
    if (copies == 1)
        printf("  and stores %d of the %d KV heads (H_kv / p): its cache is\n", kv_rank, Hkv);
    else
        printf("  and stores the one KV head its query heads read: p > H_kv, so each of the %d KV "
               "heads\n  is replicated on %d ranks. Its cache is\n", Hkv, copies);
    printf("    L * 2 * N * %d * d * b * B = %d * 2 * %lld * %d * %d * %g * %lld = %s per rank\n",
           kv_rank, L, (long long)n, kv_rank, d, b, (long long)batch,
           kv_fmt_bytes(per_rank, u1, sizeof u1));
    printf("  against %s on one device: %s over all ranks (%s)\n",
           kv_fmt_bytes(one, u2, sizeof u2), kv_fmt_bytes(per_rank * p, u3, sizeof u3),
           copies == 1 ? "nothing stored twice"
                       : copies == 2 ? "every KV head stored twice" : "KV heads replicated");
    printf("  Each layer all-reduces twice (after the attention output projection and after\n"
           "  the MLP): %d all-reduces of a [tokens][%d] activation per step.\n", 2 * L, c->dim);
}

/* --csv: one row per model and length, the numbers explain() and explain_tp() derive (the
 * window caps the tokens cached; tp 1: one device). */
static void csv_header(void)
{
    kv_csv_printf(stdout, "model,layers,heads,kv_heads,head_dim,dtype,bytes_per_element,"
                  "tokens_requested,window,sinks,tokens_cached,batch,tp,kv_heads_per_rank,"
                  "bytes_per_token,cache_bytes,cache_bytes_per_rank,fixed_bytes_per_sequence,"
                  "weights_bytes\n");
}

static void csv_row(const char *name, const kv_config *c, int window, int sinks, const char *dt,
                    int64_t n_req, int64_t batch, int p)
{
    const int d = kv_config_head_dim(c), Hkv = c->n_kv_heads;
    const double b = dtype_bytes(dt, d);
    const int64_t keep = window > 0 ? (int64_t)window + sinks : 0;
    const int64_t n = (keep > 0 && n_req > keep) ? keep : n_req;
    const int kv_rank = p <= Hkv ? Hkv / p : 1;
    const double per_token = (double)c->n_layers * 2 * Hkv * d * b;
    const double all = per_token * (double)n * (double)batch;
    kv_csv_printf(stdout, "%s,%d,%d,%d,%d,%s,%g,%lld,%d,%d,%lld,%lld,%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f\n",
                  name, c->n_layers, c->n_heads, Hkv, d, dt, b, (long long)n_req, window, sinks,
                  (long long)n, (long long)batch, p, kv_rank, per_token, all,
                  all / Hkv * kv_rank, dtype_fixed(dt, c), (double)kv_config_param_count(c) * b);
}

/* Every preset at a few lengths. */
void kv_calc_table(FILE *f, const char *dt, int64_t seq, int64_t batch)
{
    static const int64_t lens[] = {2048, 8192, 32768, 131072};
    int np = 0;
    const kv_preset *p = kv_presets(&np);
    const double b = dtype_bytes(dt, 128);
    int capped = 0;
    fprintf(f, "KV-cache memory of the presets, dtype %s (b = %g at d = 128, metadata included), "
           "batch B = %lld:\n"
           "bytes = L * 2 * N * H_kv * d * b * B; binary units (1 GiB = 2^30 bytes)\n\n",
           dt, b, (long long)batch);
    fprintf(f, "%-14s %3s %3s %4s %4s %12s", "model", "L", "H", "H_kv", "d", "per token");
    if (seq > 0) fprintf(f, " %14s=%-8lld", "N", (long long)seq);
    else
        for (int j = 0; j < 4; j++) fprintf(f, " %11s%-6lld", "N=", (long long)lens[j]);
    fprintf(f, " %12s\n", "weights");
    for (int i = 0; i < np; i++) {
        const kv_config *c = &p[i].config;
        double per_token = (double)c->n_layers * 2 * c->n_kv_heads * kv_config_head_dim(c) *
                           dtype_bytes(dt, kv_config_head_dim(c));
        char u[32];
        fprintf(f, "%-14s %3d %3d %4d %4d %12s", p[i].name, c->n_layers, c->n_heads, c->n_kv_heads,
               kv_config_head_dim(c), kv_fmt_bytes(per_token, u, sizeof u));
        int64_t one[1] = {seq};
        const int64_t *ls = seq > 0 ? one : lens;
        for (int j = 0; j < (seq > 0 ? 1 : 4); j++) {
            int64_t n = ls[j];
            int cap = p[i].sliding_window > 0 && n > p[i].sliding_window;
            if (cap) n = p[i].sliding_window, capped = 1;
            fprintf(f, " %16s%c", kv_fmt_bytes(per_token * (double)n * (double)batch, u, sizeof u),
                   cap ? '*' : ' ');
        }
        fprintf(f, " %12s\n", kv_fmt_bytes((double)kv_config_param_count(c) * dtype_bytes(dt, kv_config_head_dim(c)), u, sizeof u));
    }
    if (capped)
        fprintf(f, "\n* sliding window: the cache holds at most the window (Mistral-7B v0.1: 4096 tokens; v0.2 on has none).\n");
    fprintf(f, "\nweights = parameter count * b, for scale. 'kvlab calc --preset NAME' explains one row.\n");
}

/* MHA / GQA / MQA: the same preset with H_kv = H, H/8, 1 (and its own H_kv). Only H_kv moves:
 * per token L * 2 * H_kv * d * b, so each column is the MHA column divided by G. */
void kv_calc_heads_table(FILE *f, const char *dt, int64_t seq, int64_t batch)
{
    int np = 0;
    const kv_preset *p = kv_presets(&np);
    const double b = dtype_bytes(dt, 128);
    const int64_t n = seq > 0 ? seq : 32768;
    char u[5][32];
    fprintf(f, "MHA vs GQA vs MQA, dtype %s (b = %g): cache bytes per token = L * 2 * H_kv * d * b;\n"
            "each column is the MHA column divided by G = H / H_kv. Last columns: the preset's own\n"
            "H_kv at N = %lld tokens, batch B = %lld (sliding windows ignored here).\n\n",
            dt, b, (long long)n, (long long)batch);
    fprintf(f, "%-14s %3s %3s %4s %12s %12s %12s %5s %12s %12s\n", "model", "L", "H", "d",
            "MHA H_kv=H", "GQA H_kv=H/8", "MQA H_kv=1", "own", "own/token", "own at N");
    for (int i = 0; i < np; i++) {
        const kv_config *c = &p[i].config;
        const int H = c->n_heads, d = kv_config_head_dim(c);
        const double unit = (double)c->n_layers * 2.0 * d * dtype_bytes(dt, d); /* per token per KV head */
        kv_fmt_bytes(unit * H, u[0], sizeof u[0]);
        if (H % 8 == 0) kv_fmt_bytes(unit * (H / 8), u[1], sizeof u[1]);
        else snprintf(u[1], sizeof u[1], "-");
        kv_fmt_bytes(unit, u[2], sizeof u[2]);
        kv_fmt_bytes(unit * c->n_kv_heads, u[3], sizeof u[3]);
        kv_fmt_bytes(unit * c->n_kv_heads * (double)n * (double)batch, u[4], sizeof u[4]);
        fprintf(f, "%-14s %3d %3d %4d %12s %12s %12s %5d %12s %12s\n", p[i].name, c->n_layers, H,
                d, u[0], u[1], u[2], c->n_kv_heads, u[3], u[4]);
    }
    fprintf(f, "\nwith g KV heads the cache is L * 2 * N * g * d elements (not L * 2 * (N + g - 1) * d).\n");
}

static void list(void)
{
    int np = 0;
    const kv_preset *p = kv_presets(&np);
    printf("%-14s %6s %6s %3s %3s %4s %7s %7s %7s\n", "preset", "dim", "hidden", "L", "H",
           "H_kv", "vocab", "seq", "window");
    for (int i = 0; i < np; i++) {
        const kv_config *c = &p[i].config;
        printf("%-14s %6d %6d %3d %3d %4d %7d %7d %7d\n", p[i].name, c->dim, c->hidden_dim,
               c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
               p[i].sliding_window);
    }
}

int cmd_calc(int argc, char **argv)
{
    const char *cmd = "kvlab calc";
    const char *preset = NULL, *config = NULL, *dt = "fp16";
    int64_t seq = 0, batch = 1;
    int do_list = 0, heads = 0, window_opt = 0, sinks = 0, tp = 1, csv = 0;
    kv_opt opts[] = {
        {"--preset", KV_OPT_STRING, &preset, 0, 0, NULL, "NAME", "a published model (see --list)", 0},
        {"--config", KV_OPT_STRING, &config, 0, 0, NULL, "D,F,L,H,K,V,S",
         "dim,hidden,L,H,Hkv,vocab,seq of any model", 0},
        {"--dtype", KV_OPT_CHOICE, &dt, 0, 0, dtypes, "T", "stored element type (default fp16)", 0},
        {"--seq", KV_OPT_I64, &seq, 1, 1e12, NULL, "N", "tokens in the cache (default: the model's seq_len)", 0},
        {"--batch", KV_OPT_I64, &batch, 1, 1e9, NULL, "B", "sequences cached at once (default 1)", 0},
        {"--list", KV_OPT_FLAG, &do_list, 0, 0, NULL, NULL, "list the presets and their dims", 0},
        {"--compare-heads", KV_OPT_FLAG, &heads, 0, 0, NULL, NULL,
         "MHA / GQA / MQA per-token bytes of every preset (chapter 03)", 0},
        {"--tp", KV_OPT_INT, &tp, 1, 1 << 16, NULL, "P",
         "tensor parallel: the cache of one rank of P (chapter 10; default 1)", 0},
        {"--window", KV_OPT_INT, &window_opt, 0, 1 << 30, NULL, "W",
         "sliding window: the cache keeps the W most recent tokens (chapter 06; default: the "
         "preset's own, e.g. mistral-7b 4096; 0 = none)", 0},
        {"--sinks", KV_OPT_INT, &sinks, 0, 1 << 30, NULL, "S",
         "with --window: S first tokens kept as well (StreamingLLM attention sinks; default 0)", 0},
        {"--csv", KV_OPT_CSV, &csv, 0, 0, NULL, "FILE",
         "the rows as CSV, to FILE in place of the explanation (- : standard output)", 0},
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    int r = kv_args_parse(cmd, about, argc - 1, argv + 1, opts, n_opts);
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    const int window_seen = opts[n_opts - 3].seen, sinks_seen = opts[n_opts - 2].seen;
    if (csv && (do_list || heads))
        return kv_args_bad(cmd, "--csv", "writes the memory rows of a preset, a config or the "
                           "presets' table: not with %s", do_list ? "--list" : "--compare-heads");
    if (do_list) {
        list();
        kv_calc_mla_list(stdout);
        return KV_EXIT_OK;
    }
    if (preset && config)
        return kv_args_bad(cmd, "--preset", "give either --preset or --config, not both");
    if (tp > 1 && !preset && !config)
        return kv_args_bad(cmd, "--tp", "needs one model: give --preset or --config");
    if (heads) {
        if (preset || config)
            return kv_args_bad(cmd, "--compare-heads", "covers every preset; drop --preset/--config");
        kv_calc_heads_table(stdout, dt, seq, batch);
        kv_calc_mla_heads_table(stdout, dt, seq, batch);
        return KV_EXIT_OK;
    }

    kv_config c;
    const char *name;
    int window = 0;
    const kv_mla_preset *mla = preset ? kv_mla_preset_find(preset) : NULL;
    if (mla) { /* chapter 11: a latent cache, no KV heads to split or window */
        if (csv)
            return kv_args_bad(cmd, "--csv", "not for an MLA preset yet (%s: its explanation "
                               "alone)", mla->name);
        if (tp > 1 || window_seen || sinks_seen)
            return kv_args_bad(cmd, tp > 1 ? "--tp" : "--window", "not for an MLA preset (%s "
                               "caches one latent row per token, shared by every head)", mla->name);
        kv_calc_mla_explain(mla, dt, seq > 0 ? seq : mla->seq_len, batch);
        return KV_EXIT_OK;
    }
    if (preset) {
        const kv_preset *p = kv_preset_find(preset);
        if (!p) {
            fprintf(stderr, "%s: --preset: unknown preset '%s'; the presets are:", cmd, preset);
            int np = 0;
            const kv_preset *all = kv_presets(&np);
            for (int i = 0; i < np; i++) fprintf(stderr, " %s", all[i].name);
            const kv_mla_preset *ml = kv_mla_presets(&np);
            for (int i = 0; i < np; i++) fprintf(stderr, " %s", ml[i].name);
            fprintf(stderr, "\n");
            return KV_EXIT_USAGE;
        }
        c = p->config;
        name = p->name;
        window = p->sliding_window;
    } else if (config) {
        int e = parse_config(cmd, config, &c);
        if (e) return e;
        name = "the given config";
    } else if (csv) { /* every preset at the table's lengths (or --seq) */
        static const int64_t lens[] = {2048, 8192, 32768, 131072};
        int np = 0;
        const kv_preset *all = kv_presets(&np);
        csv_header();
        for (int i = 0; i < np; i++)
            for (int j = 0; j < (seq > 0 ? 1 : 4); j++)
                csv_row(all[i].name, &all[i].config, all[i].sliding_window, 0, dt,
                        seq > 0 ? seq : lens[j], batch, 1);
        return KV_EXIT_OK;
    } else {
        kv_calc_table(stdout, dt, seq, batch);
        return KV_EXIT_OK;
    }
    if (window_seen) window = window_opt;
    if (sinks_seen && window == 0)
        return kv_args_bad(cmd, "--sinks", "sinks are kept beside a sliding window: give "
                           "--window W > 0 (or a preset that has one)");
    if (tp > 1) {
        int e = tp_check(cmd, &c, tp);
        if (e) return e;
    }
    if (csv) {
        csv_header();
        csv_row(name, &c, window, sinks, dt, seq > 0 ? seq : c.seq_len, batch, tp);
        return KV_EXIT_OK;
    }
    explain(name, &c, window, sinks, dt, seq > 0 ? seq : c.seq_len, batch);
    if (tp > 1) {
        const int64_t n_req = seq > 0 ? seq : c.seq_len;
        const int64_t keep = window > 0 ? (int64_t)window + sinks : 0;
        explain_tp(&c, dt, keep > 0 && n_req > keep ? keep : n_req, batch, tp);
    }
    return KV_EXIT_OK;
}
