/*
 * kvlab bench paged (chapter 05): what a block table costs decode attention.
 *
 * One layer, one query token of H heads over N cached positions of H_kv KV heads, format
 * --dtype. The same K/V rows sit in a contiguous cache and in paged caches with blocks of
 * B = 8, 16, 32 tokens whose tables are a random permutation of the pool (a pool after many
 * requests came and went: no two logical neighbours are physical neighbours). Each repeat
 * times every layout back to back; the table reports medians and the median of the per-repeat
 * ratios paged / contiguous, so both sides of a ratio saw the same machine state.
 *
 * Bytes by formula: KV bytes = 2 · H_kv · N · d · b (b = bytes per element with metadata);
 * a paged read adds the table, 4 · ceil(N / B) bytes per (K/V, head) read, not counted.
 * GB/s = KV bytes / median time (GB = 1e9 bytes). On the CPU each layout's GB/s is also
 * given over the memory's rate for its access pattern, measured in the same run: the read
 * bandwidth in order for the contiguous cache, and over shuffled chunks of one block of one
 * head's rows for a paged one (kv_read_bandwidth_chunks()): scattered blocks are slower to
 * read for the memory itself, before attention does anything.
 *
 * --device cuda times kernel v2 (one block per KV head) on every layout, and v3 (flash-
 * decoding partitions of 512 positions, cuda/attention/kvcu_attention.cu) beside it: v3 / v2 in the same
 * run. Before timing, each paged output is compared with the contiguous one (bit for bit
 * expected: the same values in the same order) and v3 with v2 (a different summation order:
 * max |v3 - v2| / max |v2| is printed).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_attention.h"
#include "kv_quant.h"
#include "kv_rng.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#define PAGED_LAYOUTS 4 /* contiguous, B 8, B 16, B 32 */
#define PAGED_MAX_LENGTHS 16
static const int paged_blocks[PAGED_LAYOUTS] = {0, 8, 16, 32};

/* One measured configuration: the caches of every layout on one device. */
typedef struct {
    kv_cache c[PAGED_LAYOUTS];
#ifdef KV_HAVE_CUDA
    kvcu_cache *g[PAGED_LAYOUTS];
    float *dq, *dout, *dscratch; /* [H][d], [H][d], kvcu_attn_decode_scratch(3, ...) */
#endif
    int n_layouts;
    int H, d;
} paged_set;

/* KIVI's key groups span 32 tokens: its paged caches need 32 | B (kv_cache.h). */
static int layout_ok(int layout, int dtype)
{
    return !kvq_is_kivi(dtype) || paged_blocks[layout] % 32 == 0;
}

static kv_cache_spec layout_spec(int layout, int N, int dtype)
{
    kv_cache_spec s = kv_cache_spec_default(1, N);
    s.quant.dtype = dtype;
    if (paged_blocks[layout]) {
        s.layout.kind = KV_LAYOUT_PAGED;
        s.layout.block_size = paged_blocks[layout];
        s.layout.n_blocks = (N + s.layout.block_size - 1) / s.layout.block_size;
    }
    return s;
}

/* A shuffled table of every block of the pool: [n]. */
static void shuffled(int *t, int n, kv_rng *r)
{
    for (int i = 0; i < n; i++) t[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(kv_rng_u32(r) % (uint32_t)(i + 1)), x = t[i];
        t[i] = t[j];
        t[j] = x;
    }
}

static void set_free(paged_set *ps)
{
    for (int i = 0; i < PAGED_LAYOUTS; i++) {
        kv_cache_free(&ps->c[i]);
#ifdef KV_HAVE_CUDA
        kvcu_cache_free(ps->g[i]);
#endif
    }
#ifdef KV_HAVE_CUDA
    kvcu_free(ps->dq);
    kvcu_free(ps->dout);
    kvcu_free(ps->dscratch);
#endif
    memset(ps, 0, sizeof *ps);
}

/* Build every layout on @p gpu's device and write k, v [N][H_kv][d] into each. */
static int table_in_order; /* --table in-order: block i of the sequence is pool block i */

static int set_build(paged_set *ps, int gpu, const kv_config *cfg, int N, int dtype,
                     const float *k, const float *v, const float *q, kv_rng *r, kv_err *err)
{
    memset(ps, 0, sizeof *ps);
    ps->H = cfg->n_heads;
    ps->d = kv_config_head_dim(cfg);
    const size_t kvn = (size_t)N * cfg->n_kv_heads * kv_config_head_dim(cfg);
    (void)kvn; /* used by the device path only */
    int *table = kv_calloc(((size_t)N + 7) / 8 * sizeof(int));
    if (!table) return kv_fail(err, KV_ERR_NOMEM, "bench paged: table");
    int st = KV_OK;
#ifdef KV_HAVE_CUDA
    float *dk = NULL, *dv = NULL;
    if (gpu) {
        const int H = cfg->n_heads, d = kv_config_head_dim(cfg);
        st = kvcu_malloc((void **)&dk, kvn * 4, err);
        if (!st) st = kvcu_malloc((void **)&dv, kvn * 4, err);
        if (!st) st = kvcu_upload(dk, k, kvn * 4, err);
        if (!st) st = kvcu_upload(dv, v, kvn * 4, err);
        if (!st) st = kvcu_malloc((void **)&ps->dq, (size_t)H * d * 4, err);
        if (!st) st = kvcu_upload(ps->dq, q, (size_t)H * d * 4, err);
        if (!st) st = kvcu_malloc((void **)&ps->dout, (size_t)H * d * 4, err);
        if (!st) st = kvcu_malloc((void **)&ps->dscratch,
                                  kvcu_attn_decode_scratch(3, H, d, N) * sizeof(float), err);
    }
#else
    (void)q;
#endif
    for (int L = 0; L < PAGED_LAYOUTS && !st; L++) {
        if (!layout_ok(L, dtype)) continue;
        const kv_cache_spec s = layout_spec(L, N, dtype);
        if (s.layout.kind == KV_LAYOUT_PAGED) {
            shuffled(table, s.layout.n_blocks, r);
            if (table_in_order)
                for (int i = 0; i < s.layout.n_blocks; i++) table[i] = i;
        }
        if (!gpu) {
            st = kv_cache_create(&ps->c[L], cfg, &s, err);
            ps->n_layouts = L + 1;
            if (!st && s.layout.kind == KV_LAYOUT_PAGED)
                st = kv_cache_set_blocks(&ps->c[L], 0, table, s.layout.n_blocks, err);
            if (!st) st = kv_cache_write_seq(&ps->c[L], 0, 0, 0, N, k, v, err);
        }
#ifdef KV_HAVE_CUDA
        else {
            st = kvcu_cache_create(&ps->g[L], cfg, &s, err);
            ps->n_layouts = L + 1;
            if (!st && s.layout.kind == KV_LAYOUT_PAGED)
                st = kvcu_cache_set_blocks(ps->g[L], 0, table, s.layout.n_blocks, err);
            if (!st) st = kvcu_cache_write_seq(ps->g[L], 0, 0, 0, N, dk, dv, err);
        }
#endif
    }
#ifdef KV_HAVE_CUDA
    kvcu_free(dk);
    kvcu_free(dv);
#endif
    kv_free(table);
    return st;
}

/* One attention call on layout L (GPU: kernel @p version, returning once it finished);
 * out: host [H][d] copy of the output when non-NULL (downloaded outside any timing). */
static int attend(paged_set *ps, int gpu, int L, int version, int N, const float *q, float *out,
                  float *scratch, kv_err *err)
{
    const size_t bytes = (size_t)ps->H * ps->d * sizeof(float);
    if (!gpu) {
        int st = kv_attention(&ps->c[L], 0, 0, N - 1, q, scratch, ps->H);
        if (st) return kv_fail(err, st, "bench paged: kv_attention");
        if (out) memcpy(out, scratch, bytes);
        return KV_OK;
    }
#ifdef KV_HAVE_CUDA
    int st = kvcu_cache_attention_version(version, ps->g[L], 0, 0, N - 1, ps->dq, ps->dout,
                                          ps->dscratch, ps->H, err);
    if (!st) st = kvcu_synchronize(err);
    if (!st && out) st = kvcu_download(out, ps->dout, bytes, err);
    return st;
#else
    (void)version; (void)out;
    return kv_fail(err, KV_ERR_UNSUPPORTED, "bench paged: built without CUDA");
#endif
}

/* max |a - b| / max |b| over n values: the difference relative to the output's scale (an
 * element near zero would make an elementwise ratio meaningless). */
static double max_rel(const float *a, const float *b, size_t n)
{
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0.0 ? diff / scale : diff;
}

/* Parse "1024,4096,..." into at most PAGED_MAX_LENGTHS lengths in [2, 2^24]. */
static int parse_lengths(const char *s, int *out, int *n)
{
    *n = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int64_t v;
        const char *why;
        if (*n == PAGED_MAX_LENGTHS || kv_parse_i64(tok, 2, 1 << 24, &v, &why)) return -1;
        out[(*n)++] = (int)v;
    }
    return *n > 0 ? 0 : -1;
}

static const char *const table_orders[] = {"shuffled", "in-order", NULL};

int cmd_bench_paged(int argc, char **argv)
{
    const char *table_order = "shuffled";
    const char *cmd = "kvlab bench paged";
    const char *device = "cpu", *lengths_s = "1024,4096,16384", *dtype_s = "fp32";
    int H = 32, Hkv = 8, d = 128, repeats = 7, csv = 0;
    kv_opt opts[] = {
        {"--heads", KV_OPT_INT, &H, 1, 256, NULL, "H", "query heads (default 32)", 0},
        {"--kv-heads", KV_OPT_INT, &Hkv, 1, 256, NULL, "H_kv", "KV heads, dividing H (default 8: G = 4)", 0},
        {"--head-dim", KV_OPT_INT, &d, 1, 512, NULL, "d", "head dim (default 128)", 0},
        {"--lengths", KV_OPT_STRING, &lengths_s, 0, 0, NULL, "N,N,...", "cached positions, comma-separated (default 1024,4096,16384)", 0},
        {"--dtype", KV_OPT_STRING, &dtype_s, 0, 0, NULL, "FMT", "cache format: fp32 (default), fp16, bf16, int8, int8-g32, fp8-e4m3, int4-kivi, ...", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "timed rounds over every layout, after one warm-up (default 7)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cpu, or cuda: kernel v2 per layout, and v3 beside it (default cpu)", 0},
        KV_CLI_CSV_OPTS(csv),
        {"--table", KV_OPT_CHOICE, &table_order, 0, 0, table_orders, "T", "shuffled (default: blocks scattered over the pool, as after a long run) or in-order (block i at pool block i: the lookup alone, memory read in order)", 0},
    };
    int r = kv_args_parse(cmd,
                          "Decode attention of one token (H heads over N cached positions, one layer)\n"
                          "over a contiguous cache and over paged caches with blocks of B = 8, 16, 32\n"
                          "tokens whose tables are a random permutation of the pool. Reports the median\n"
                          "time of R rounds (each round runs every layout back to back), KV GB/s by\n"
                          "formula (2*H_kv*N*d*b bytes, b with metadata; the table's 4*N/B bytes per\n"
                          "head are not counted), and the median per-round ratio paged / contiguous.\n"
                          "On --device cuda the layouts run kernel v2, and v3 (flash-decoding: 512-\n"
                          "position partitions combined by max-rescaling) beside it, with v3 / v2.\n"
                          "Outputs are checked before timing: paged == contiguous bit for bit; v3 vs v2\n"
                          "differ only by summation order (max |v3 - v2| / max |v2| printed).",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    table_in_order = strcmp(table_order, "in-order") == 0;
    int lengths[PAGED_MAX_LENGTHS], n_lengths = 0;
    if (parse_lengths(lengths_s, lengths, &n_lengths))
        return kv_args_bad(cmd, "--lengths", "'%s': give 1 to %d comma-separated whole numbers "
                           "in [2, 16777216]", lengths_s, PAGED_MAX_LENGTHS);
    const int dtype = kv_quant_parse(dtype_s);
    if (dtype < 0) return kv_args_bad(cmd, "--dtype", "unknown format '%s'", dtype_s);
    if (H % Hkv) return kv_args_bad(cmd, "--kv-heads", "%d does not divide H = %d", Hkv, H);
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;
    const int gpu = strcmp(device, "cpu") != 0;

    kv_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dim = H * d;
    cfg.hidden_dim = cfg.dim;
    cfg.n_layers = 1;
    cfg.n_heads = H;
    cfg.n_kv_heads = Hkv;
    cfg.vocab_size = 2;
    cfg.seq_len = 1 << 24;
    cfg.rope_theta = 10000.0f;
    cfg.rotary_dim = d;
    cfg.norm_eps = 1e-5f;
    kv_err err = {{0}};
    for (int L = 0; L < PAGED_LAYOUTS; L++) /* every cache this run builds, before any timing */
        for (int li = 0; li < n_lengths && layout_ok(L, dtype); li++) {
            const kv_cache_spec s = layout_spec(L, lengths[li], dtype);
            const int st = kv_cache_spec_check("cache", &cfg, &s, &err);
            if (st) return kv_cli_fail(cmd, "--dtype", st, &err);
        }
    const double b = kv_dtype_bytes_d(dtype, d);
    const int versions = gpu ? 2 : 1; /* GPU: v2 and v3 */
    /* CPU: the memory's own rates for each layout, in this run: in order (contiguous), and in
     * shuffled chunks of one block of one head's rows (B rows of d·b bytes), the most a reader
     * of scattered blocks gets */
    double mem_bw[PAGED_LAYOUTS] = {0};
    size_t chunk[PAGED_LAYOUTS] = {0};
    for (int L = 0; L < PAGED_LAYOUTS && !gpu; L++) {
        kv_bandwidth bw;
        chunk[L] = (size_t)(paged_blocks[L] * d * b) / 8 * 8;
        if (kv_read_bandwidth_chunks(&bw, (size_t)256 << 20, chunk[L], 5, &err))
            return kv_cli_fail(cmd, "bandwidth", KV_ERR_NOMEM, &err);
        mem_bw[L] = bw.bytes_per_s;
    }
    if (csv)
        kv_csv_printf(
            stdout,
            "device,dtype,H,H_kv,d,N,layout,B,version,kv_bytes,seconds,GBps,ratio_vs_contiguous,"
            "ratio_v3_v2,read_bw_GBps,ratio_to_read_bw\n");
    else {
        printf("bench paged: one decode token, H %d, H_kv %d, d %d, %s (b = %.4g bytes/element); "
               "device %s; median of %d rounds\n", H, Hkv, d, kv_dtype_name(dtype), b, device,
               repeats);
        if (!gpu) printf("%d OpenMP threads\n", omp_get_max_threads());
        printf("paged tables: a random permutation of the pool; KV bytes = 2*H_kv*N*d*b\n");
        if (!gpu) {
            printf("read bandwidth (this run, 256 MiB, %d threads): in order %.2f GB/s; in "
                   "shuffled chunks of one head's block", omp_get_max_threads(), mem_bw[0] * 1e-9);
            for (int L = 1; L < PAGED_LAYOUTS; L++)
                printf("%s B%d (%zu B) %.2f GB/s", L > 1 ? "," : ":", paged_blocks[L], chunk[L],
                       mem_bw[L] * 1e-9);
            printf("\n\"of BW\": a layout's GB/s over the memory's rate for the same pattern\n");
        }
        printf("\n%8s %-11s %3s %12s %12s %9s %12s%s\n", "N", "layout", "ver", "KV bytes",
               "time (s)", "GB/s", "paged/contig", gpu ? "     v3/v2" : "   of BW");
    }
    kv_rng rng;
    kv_rng_seed(&rng, 505);
    int st = KV_OK;
    for (int li = 0; li < n_lengths && !st; li++) {
        const int N = lengths[li];
        const size_t kvn = (size_t)N * Hkv * d, qn = (size_t)H * d;
        float *k = kv_calloc(kvn * 4), *v = kv_calloc(kvn * 4), *q = kv_calloc(qn * 4);
        float *ref = kv_calloc(qn * 4), *out = kv_calloc(qn * 4), *scratch = kv_calloc(qn * 4);
        /* t [layout][version][rep] seconds */
        double *t = kv_calloc((size_t)PAGED_LAYOUTS * 2 * repeats * sizeof(double));
        double *ratio = kv_calloc((size_t)repeats * sizeof(double));
        paged_set ps;
        memset(&ps, 0, sizeof ps);
        if (!k || !v || !q || !ref || !out || !scratch || !t || !ratio)
            st = kv_fail(&err, KV_ERR_NOMEM, "bench paged: %.0f MiB of K/V at N = %d",
                         2.0 * kvn * 4 / 1048576, N);
        if (!st) {
            for (size_t i = 0; i < kvn; i++) k[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
            for (size_t i = 0; i < kvn; i++) v[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
            for (size_t i = 0; i < qn; i++) q[i] = kv_rng_uniform(&rng, -1.0f, 1.0f);
            st = set_build(&ps, gpu, &cfg, N, dtype, k, v, q, &rng, &err);
        }
        /* validate before timing: every layout against the contiguous v2 (CPU: the reference) */
        int identical = 1;
        double v3_rel = 0.0;
        if (!st) st = attend(&ps, gpu, 0, 2, N, q, ref, scratch, &err);
        for (int L = 0; L < PAGED_LAYOUTS && !st; L++)
            for (int ver = 0; ver < versions && !st && layout_ok(L, dtype); ver++) {
                st = attend(&ps, gpu, L, 2 + ver, N, q, out, scratch, &err);
                if (st) break;
                if (ver == 0) identical &= memcmp(out, ref, qn * 4) == 0;
                else if (max_rel(out, ref, qn) > v3_rel) v3_rel = max_rel(out, ref, qn);
            }
        /* rounds: every layout and version back to back */
        for (int rep = -1; rep < repeats && !st; rep++)
            for (int L = 0; L < PAGED_LAYOUTS && !st; L++)
                for (int ver = 0; ver < versions && !st && layout_ok(L, dtype); ver++) {
                    const double t0 = kv_now();
                    st = attend(&ps, gpu, L, 2 + ver, N, q, NULL, scratch, &err);
                    if (rep >= 0) t[((size_t)L * 2 + ver) * repeats + rep] = kv_now() - t0;
                }
        const double bytes = 2.0 * Hkv * (double)N * d * b;
        for (int L = 0; L < PAGED_LAYOUTS && !st; L++)
            for (int ver = 0; ver < versions && layout_ok(L, dtype); ver++) {
                const double *tl = t + ((size_t)L * 2 + ver) * repeats;
                const double *tc = t + (size_t)ver * repeats; /* contiguous, same version */
                for (int i = 0; i < repeats; i++) ratio[i] = tl[i] / tc[i];
                const double rc = kv_median(ratio, repeats);
                double r32 = 0.0;
                if (ver == 1) {
                    const double *t2 = t + (size_t)L * 2 * repeats; /* v2, same layout */
                    for (int i = 0; i < repeats; i++) ratio[i] = tl[i] / t2[i];
                    r32 = kv_median(ratio, repeats);
                }
                double tmp[64];
                memcpy(tmp, tl, (size_t)repeats * sizeof(double));
                const double med = kv_median(tmp, repeats);
                const char *what = gpu ? (ver ? "v3" : "v2") : "cpu";
                char name[32];
                if (paged_blocks[L]) snprintf(name, sizeof name, "paged B%d", paged_blocks[L]);
                else snprintf(name, sizeof name, "contiguous");
                const double of_bw = gpu ? 0.0 : bytes / med / mem_bw[L];
                if (csv)
                    kv_csv_printf(stdout,
                                  "%s,%s,%d,%d,%d,%d,%s,%d,%s,%.0f,%.6e,%.3f,%.4f,%.4f,%.3f,%.4f\n",
                                  device, kv_dtype_name(dtype), H, Hkv, d, N,
                                  paged_blocks[L] ? "paged" : "contiguous", paged_blocks[L], what,
                                  bytes, med, bytes / med * 1e-9, rc, r32, mem_bw[L] * 1e-9, of_bw);
                else {
                    char bb[32], r3[16] = "";
                    if (gpu && ver == 1) snprintf(r3, sizeof r3, "%9.3fx", r32);
                    if (!gpu) snprintf(r3, sizeof r3, "%7.1f%%", 100.0 * of_bw);
                    printf("%8d %-11s %3s %12s %12.3e %9.2f %11.3fx %s\n", N, name, what,
                           kv_fmt_bytes(bytes, bb, sizeof bb), med, bytes / med * 1e-9, rc, r3);
                }
            }
        if (!st && !csv) {
            printf("%8s check: paged == contiguous bit for bit: %s", "", identical ? "yes" : "NO");
            if (gpu) printf("; v3 vs v2: max |v3 - v2| / max |v2| = %.2e", v3_rel);
            printf("\n");
        }
        if (!st && !identical)
            st = kv_fail(&err, KV_ERR_DEVICE, "paged output differs from contiguous at N = %d", N);
        set_free(&ps);
        kv_free(k); kv_free(v); kv_free(q); kv_free(ref); kv_free(out); kv_free(scratch);
        kv_free(t); kv_free(ratio);
    }
    if (st) return kv_cli_fail(cmd, "run", st, &err);
    if (!csv) {
        printf("\nratios are medians over the rounds of (layout time / contiguous time) of the same "
               "round%s.\n", gpu ? "; v3/v2 likewise against v2 on the same layout" : "");
#ifdef KV_HAVE_CUDA
        if (gpu && kvcu_is_emulation())
            printf("emulation build: these times are of CPU fibers running the kernels, not of a "
                   "GPU; the bytes are what a GPU would read.\n");
#endif
    }
    return KV_EXIT_OK;
}
