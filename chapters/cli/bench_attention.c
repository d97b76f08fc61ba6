/*
 * kvlab bench attention (chapter 08): the attention family's algorithms side by side.
 *
 * One layer, one sequence: H query heads over a cache of H_kv KV heads, format --dtype.
 * Decode rows are one query token at the end of n cached tokens; prefill rows are n causal
 * queries over their own n keys. Each row is one algorithm of the table `algos` below:
 * the engine's decode (kv_attention(): what kv_forward() runs), the CPU reference's naive,
 * tiled and split-KV (kv_flash.h), and, in a CUDA build with --device cuda, the kernel
 * versions v1..v4 of cuda/attention/kvcu_flash.cu.
 *
 * Bytes are counted, not assumed: a CPU row's bytes are kv_flash_stats of one call, summed
 *   bytes = K/V read as stored (rows read x row bytes, codes + metadata)
 *         + Q read + output written (split: + its partials, written and read back)
 *         + scores written and read back (naive: 5 passes over [T][n] floats per head).
 * A GPU row's bytes are the same formulas applied to the version's own work split
 * (kvcu_flash_bytes(): v3/v4 read K/V once per KV head, v2 once per query tile and query
 * head, v1 once per query and query head, so T times at prefill, and adds its score passes),
 * since the kernels keep no counters.
 * GB/s = bytes / median time; "of BW" = that rate / the machine's read bandwidth,
 * measured in the same run by kv_read_bandwidth() (`kvlab bench bandwidth`'s measurement):
 * at the start, and again after each CPU engine row read from DRAM, whose ratio then uses the
 * larger of the figures before and after it (a machine whose memory changes speed during a
 * row must not make it look faster than it is; bench engine does the same).
 * An engine decode row larger than the LLC is followed by its "(resident)" row: the same
 * call over a cache that fits the LLC, the ceiling the cores set (resident_time()).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_attention.h"
#include "kv_flash.h"
#include "kv_ops.h"
#include "kv_quant.h"
#include "kv_rng.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#define ATTN_MAX_LENGTHS 16
#define ATTN_MAX_LEN (1 << 24) /* longest --decode / --prefill length */

/* One measured job: a cache of n tokens and T queries, on the host (and on the device for
 * the GPU rows). */
typedef struct {
    kv_config cfg;
    kv_cache c;
    float *q, *out;          /* [T][H][d] host */
    int H, Hkv, d, T, causal;
    int64_t n;               /* keys */
    int splits, tile_q, tile_k;
#ifdef KV_HAVE_CUDA
    kvcu_cache *g;           /* the same rows on the device */
    float *dq, *dout;        /* [T][H][d] device */
    float *ref, *got;        /* [T][H][d] host: kv_flash_naive's output (once), a GPU row's */
#endif
} attn_case;

/* An algorithm row: time @p repeats calls (after a warm-up) into *seconds (median) and say
 * how many bytes one call moves. */
typedef struct {
    const char *name;
    int gpu;     /* 1: needs --device cuda */
    int decode_only, prefill_only;
    int (*time)(attn_case *k, int version, int repeats, double *seconds, double *bytes,
                kv_err *err);
    int version; /* passed to time(): which CPU algorithm or kernel version */
} attn_algo;

static kv_flash_job job_of(attn_case *k)
{
    kv_flash_job j = {&k->c, 0, 0, k->H, k->q, k->T, k->n - k->T, 0, k->n, k->causal, k->out};
    return j;
}

/* ---- CPU rows: kv_flash.h -------------------------------------------------------------- */

static int cpu_call(attn_case *k, int alg, kv_flash_stats *st, kv_err *err)
{
    const kv_flash_job j = job_of(k);
    if (alg == 0) return kv_flash_naive(&j, st, err);
    if (alg == 1) return kv_flash_tiled(&j, k->tile_q, k->tile_k, st, err);
    return kv_flash_split(&j, k->splits, k->tile_k, st, err);
}

static int cpu_time(attn_case *k, int alg, int repeats, double *seconds, double *bytes,
                    kv_err *err)
{
    kv_flash_stats st = {0};
    int e = cpu_call(k, alg, &st, err); /* warm-up, and the one call whose bytes we count */
    if (e) return e;
    *bytes = (double)(st.kv_bytes + st.q_bytes + st.out_bytes + st.score_bytes);
    double *t = kv_calloc((size_t)repeats * sizeof(double));
    if (!t) return kv_fail(err, KV_ERR_NOMEM, "bench attention: timings");
    for (int r = 0; r < repeats && !e; r++) {
        const double t0 = kv_now();
        e = cpu_call(k, alg, NULL, err);
        t[r] = kv_now() - t0;
    }
    *seconds = kv_median(t, repeats);
    kv_free(t);
    return e;
}

/* ---- the engine's decode: kv_attention() ----------------------------------------------- */

/* What kv_forward() runs for a decode token (kv_attention_rows(): the G query heads of a KV
 * head together, or the team splitting one group's positions and columns), timed on its own.
 * Its bytes are the cache's once per KV head, as stored (codes + metadata), + Q + output: the
 * least any decode must read, so "of BW" here is how close the step is to the memory limit. */
static int engine_time(attn_case *k, int version, int repeats, double *seconds, double *bytes,
                       kv_err *err)
{
    (void)version;
    const int pos = (int)k->n - 1, slot = 0;
    const double row = kv_dtype_bytes_d(k->c.fmt[0], k->d) * k->d; /* bytes of one K or V row */
    *bytes = 2.0 * k->Hkv * (double)k->n * row + 2.0 * k->H * k->d * 4;
    const size_t nf = kv_attention_scratch(&k->c, k->H, k->n);
    float *scratch = kv_calloc(nf * sizeof(float));
    double *t = kv_calloc((size_t)repeats * sizeof(double));
    if (!scratch || !t) {
        kv_free(scratch);
        kv_free(t);
        return kv_fail(err, KV_ERR_NOMEM, "bench attention: %.1f MiB of scores",
                       (double)nf * 4 / 1048576.0);
    }
    for (int r = -1; r < repeats; r++) { /* r = -1: the warm-up */
        const double t0 = kv_now();
        kv_attention_rows(&k->c, 0, 1, NULL, &slot, &pos, k->q, k->out, 0, k->H, k->n, scratch);
        if (r >= 0) t[r] = kv_now() - t0;
    }
    *seconds = kv_median(t, repeats);
    kv_free(scratch);
    kv_free(t);
    return KV_OK;
}

/* ---- GPU rows: cuda/attention/kvcu_flash.cu ------------------------------------------------------------
 * (the CUDA twin's versions; their descriptions are at the top of cuda/attention/kvcu_flash.cu) */
#ifdef KV_HAVE_CUDA
#define ATTN_GPU_TOL 1e-4f /* |GPU - CPU reference|: outputs are averages of values in [-1, 1] */

/* A version is validated before it is timed (llm.c's rule): one call against the CPU
 * reference kv_flash_naive() (computed once per case), every output within ATTN_GPU_TOL. */
static int gpu_check(attn_case *k, const kvcu_flash_job *j, int version, kv_err *err)
{
    const size_t n = (size_t)k->T * k->H * k->d;
    if (!k->ref) {
        kv_flash_job cj = job_of(k);
        k->ref = kv_calloc(n * sizeof(float));
        k->got = kv_calloc(n * sizeof(float));
        if (!k->ref || !k->got) return kv_fail(err, KV_ERR_NOMEM, "bench attention: outputs");
        cj.out = k->ref;
        const int e = kv_flash_naive(&cj, NULL, err);
        if (e) return e;
    }
    int e = kvcu_flash_attention(version, j, NULL, err);
    if (!e) e = kvcu_download(k->got, k->dout, n * sizeof(float), err);
    if (e) return e;
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float d = fabsf(k->got[i] - k->ref[i]);
        if (!(d <= worst)) worst = d; /* NaN too */
    }
    if (!(worst <= ATTN_GPU_TOL))
        return kv_fail(err, KV_ERR_DEVICE, "gpu v%d at N %lld, T %d: max |diff| %.3g from "
                       "kv_flash_naive (bound %.0e): not timed", version, (long long)k->n, k->T,
                       worst, ATTN_GPU_TOL);
    return KV_OK;
}

static int gpu_time(attn_case *k, int version, int repeats, double *seconds, double *bytes,
                    kv_err *err)
{
    const kvcu_flash_job j = {k->g, 0, 0, k->H, k->dq, k->T, k->n - k->T, 0, k->n, k->causal,
                              k->dout};
    /* the version's own traffic, by the CPU rows' formulas applied to its work split
     * (kvcu_flash_bytes): the same accounting as the cpu rows, so the columns compare */
    kv_flash_stats s;
    memset(&s, 0, sizeof s);
    int e = kvcu_flash_bytes(version, &j, &s, err);
    if (e == KV_ERR_UNSUPPORTED) { /* e.g. too large for v1's score matrix: not run */
        *seconds = -1.0;
        return KV_OK;
    }
    if (e) return e;
    *bytes = (double)(s.kv_bytes + s.q_bytes + s.out_bytes + s.score_bytes);
    e = gpu_check(k, &j, version, err);
    if (e) return e;
    return kvcu_flash_time(version, &j, NULL, repeats, seconds, err);
}
#endif

/*
 * The rows, in order. A device adds its rows here: each is a name and a time() function
 * over an attn_case (whose setup, case_open() below, uploads the cache where the device
 * needs it).
 */
static const attn_algo algos[] = {
    {"cpu engine", 0, 1, 0, engine_time, 0},
    {"cpu naive", 0, 0, 0, cpu_time, 0},
    {"cpu tiled", 0, 0, 0, cpu_time, 1},
    {"cpu split", 0, 1, 0, cpu_time, 2},
#ifdef KV_HAVE_CUDA
    {"gpu v1 naive", 1, 0, 0, gpu_time, 1},
    {"gpu v2 tiled", 1, 0, 0, gpu_time, 2},
    {"gpu v3 decode", 1, 1, 0, gpu_time, 3},
    {"gpu v4 split", 1, 1, 0, gpu_time, 4},
#endif
};
static const int n_algos = (int)(sizeof algos / sizeof algos[0]);

static int only_valid(const char *only, const char **bad, size_t *bad_len)
{
    static const char *const words[] = {"engine", "naive", "tiled", "split",
                                        "v1", "v2", "v3", "v4"};
    for (const char *p = only;;) {
        const size_t n = strcspn(p, ",");
        int ok = 0;
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
            ok |= strlen(words[i]) == n && strncmp(words[i], p, n) == 0;
        if (!ok) {
            *bad = p, *bad_len = n;
            return 0;
        }
        p += n;
        if (!*p) return 1;
        p++;
    }
}

/* ---- cases ------------------------------------------------------------------------------ */

static void case_close(attn_case *k)
{
    kv_cache_free(&k->c);
    kv_free(k->q);
    kv_free(k->out);
#ifdef KV_HAVE_CUDA
    kvcu_cache_free(k->g);
    kvcu_free(k->dq);
    kvcu_free(k->dout);
    kv_free(k->ref);
    kv_free(k->got);
#endif
    memset(k, 0, sizeof *k);
}

/* The one-layer config and the contiguous cache spec of a case; KV_OK when the two go
 * together (kv_cache_spec_check), so the command can refuse a format before it measures. */
void kv_bench_layer_config(kv_config *g, int H, int Hkv, int d, int n)
{
    memset(g, 0, sizeof *g);
    g->dim = H * d;
    g->hidden_dim = g->dim;
    g->n_layers = 1;
    g->n_heads = H;
    g->n_kv_heads = Hkv;
    g->vocab_size = 2;
    g->seq_len = n;
    kv_config_set_defaults(g);
}

static int case_shape(int H, int Hkv, int d, int dtype, int64_t n, kv_config *g,
                      kv_cache_spec *s, kv_err *err)
{
    kv_bench_layer_config(g, H, Hkv, d, (int)n);
    *s = kv_cache_spec_default(1, (int)n);
    s->quant.dtype = dtype;
    return kv_cache_spec_check("cache", g, s, err);
}

/* n random tokens in a contiguous cache of @p dtype; T queries at the end, causal. */
static int case_open(attn_case *k, int H, int Hkv, int d, int dtype, int64_t n, int T, int gpu,
                     kv_err *err)
{
    memset(k, 0, sizeof *k);
    kv_config *g = &k->cfg;
    kv_cache_spec s;
    int e = case_shape(H, Hkv, d, dtype, n, g, &s, err);
    if (!e) e = kv_cache_create(&k->c, g, &s, err);
    if (e) return e;
    k->H = H, k->Hkv = Hkv, k->d = d, k->T = T, k->n = n, k->causal = 1;
    const size_t qn = (size_t)T * H * d, chunk = 4096, cn = chunk * Hkv * d;
    k->q = kv_calloc(qn * 4);
    k->out = kv_calloc(qn * 4);
    float *kk = kv_calloc(cn * 4), *vv = kv_calloc(cn * 4);
#ifdef KV_HAVE_CUDA
    float *dkk = NULL, *dvv = NULL; /* [chunk][H_kv][d] device staging */
#endif
    if (!k->q || !k->out || !kk || !vv) e = kv_fail(err, KV_ERR_NOMEM, "bench attention: buffers");
    kv_rng r;
    kv_rng_seed(&r, 808 + (uint64_t)n);
    for (size_t i = 0; !e && i < qn; i++) k->q[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    /* written a chunk at a time: the staging stays small at 64k tokens */
    for (int64_t p = 0; !e && p < n; p += chunk) {
        const int m = (int)(n - p < (int64_t)chunk ? n - p : (int64_t)chunk);
        for (size_t i = 0; i < (size_t)m * Hkv * d; i++) kk[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
        for (size_t i = 0; i < (size_t)m * Hkv * d; i++) vv[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
        e = kv_cache_write_seq(&k->c, 0, 0, (int)p, m, kk, vv, err);
#ifdef KV_HAVE_CUDA /* the device cache writes from device memory */
        if (!e && gpu && !k->g) e = kvcu_cache_create(&k->g, g, &s, err);
        if (!e && gpu && !dkk) e = kvcu_malloc((void **)&dkk, cn * 4, err);
        if (!e && gpu && !dvv) e = kvcu_malloc((void **)&dvv, cn * 4, err);
        if (!e && gpu) e = kvcu_upload(dkk, kk, (size_t)m * Hkv * d * 4, err);
        if (!e && gpu) e = kvcu_upload(dvv, vv, (size_t)m * Hkv * d * 4, err);
        if (!e && gpu) e = kvcu_cache_write_seq(k->g, 0, 0, (int)p, m, dkk, dvv, err);
#endif
    }
#ifdef KV_HAVE_CUDA
    kvcu_free(dkk);
    kvcu_free(dvv);
#endif
    k->c.len[0] = (int)n;
#ifdef KV_HAVE_CUDA
    if (!e && gpu) e = kvcu_malloc((void **)&k->dq, qn * 4, err);
    if (!e && gpu) e = kvcu_malloc((void **)&k->dout, qn * 4, err);
    if (!e && gpu) e = kvcu_upload(k->dq, k->q, qn * 4, err);
#else
    (void)gpu;
#endif
    kv_free(kk);
    kv_free(vv);
    if (e) case_close(k);
    return e;
}

/* The engine's rate when memory is not the limit: the same call (heads, format, threads) over
 * a cache small enough to stay in the last-level cache, its bytes counted the same way. A
 * decode whose K/V far exceeds the LLC cannot read faster than this however fast the memory
 * is: when it is below the bandwidth, the arithmetic (decode, dot products, exponentials),
 * not the memory, sets the time. Measured rather than derived from a clock and a count of
 * vector pipes: what a core achieves on this instruction mix is what counts.
 * Gives engine_time()'s median seconds and bytes of that call, and in @p n_res the tokens
 * used (a power of two, 256..4096, K/V at most a quarter of @p llc bytes). */
static int resident_time(const attn_case *big, int64_t llc, int repeats, double *sec,
                         double *bytes, int *n_res, kv_err *err)
{
    const double per_pos = 2.0 * big->Hkv * kv_dtype_bytes_d(big->c.fmt[0], big->d) * big->d;
    int n = 256;
    while (n < 4096 && 2.0 * n * per_pos <= llc / 4.0) n *= 2;
    attn_case r;
    int e = case_open(&r, big->H, big->Hkv, big->d, big->c.fmt[0], n, 1, 0, err);
    if (e) return e;
    /* short calls: more of them for a stable median */
    e = engine_time(&r, 0, repeats * 4 < 64 ? repeats * 4 : 64, sec, bytes, err);
    case_close(&r);
    *n_res = n;
    return e;
}

/* "N,N,..." or "none" into @p out; 0, or exit 2 with a message naming @p opt and the item. */
static int parse_lengths(const char *cmd, const char *opt, const char *s, int *out, int *n)
{
    *n = 0;
    if (strcmp(s, "none") == 0) return 0; /* no rows of that mode */
    return kv_args_int_list(cmd, opt, s, out, ATTN_MAX_LENGTHS, n, 1, ATTN_MAX_LEN);
}

/* 1 when one comma-separated word of @p only is a word of @p name ("cpu naive": "naive"). */
static int algo_chosen(const char *name, const char *only)
{
    for (const char *p = only; *p;) {
        const size_t n = strcspn(p, ",");
        for (const char *w = name; *w;) {
            const size_t m = strcspn(w, " ");
            if (m == n && strncmp(w, p, n) == 0) return 1;
            w += m;
            while (*w == ' ') w++;
        }
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

/* The words --only accepts: every row's name after its device. */
static int only_valid(const char *only, const char **bad, size_t *bad_len);

int cmd_bench_attention(int argc, char **argv)
{
    const char *cmd = "kvlab bench attention";
#ifdef KV_HAVE_CUDA /* the device's own sweep (bench_cuda.c), unless the comparison is asked */
    if (!strcmp(kv_cli_device_arg(argc, argv), "cuda") && !kv_cli_has_flag(argc, argv, "--compare"))
        return cmd_bench_attention_cuda(argc, argv);
#endif
    const char *device = "cpu", *dtype_s = "fp32";
    const char *decode_s = "1024,4096,16384,65536", *prefill_s = "1024,4096", *only = NULL;
    int H = 32, Hkv = 8, d = 128, pH = 8, pHkv = 2, repeats = 5, prepeats = 3;
    int splits = 16, tile_q = 64, tile_k = 64, csv = 0, loops = 0, compare = 0;
    kv_opt opts[] = {
        {"--heads", KV_OPT_INT, &H, 1, 256, NULL, "H", "decode: query heads (default 32)", 0},
        {"--kv-heads", KV_OPT_INT, &Hkv, 1, 256, NULL, "H_kv", "decode: KV heads, dividing H (default 8: G = 4)", 0},
        {"--prefill-heads", KV_OPT_INT, &pH, 1, 256, NULL, "H", "prefill: query heads (default 8: prefill is O(n^2))", 0},
        {"--prefill-kv-heads", KV_OPT_INT, &pHkv, 1, 256, NULL, "H_kv", "prefill: KV heads (default 2)", 0},
        {"--head-dim", KV_OPT_INT, &d, 1, 512, NULL, "d", "head dim (default 128)", 0},
        {"--decode", KV_OPT_STRING, &decode_s, 0, 0, NULL, "N,N,...", "decode context lengths (default 1024,4096,16384,65536; none: no decode rows)", 0},
        {"--prefill", KV_OPT_STRING, &prefill_s, 0, 0, NULL, "N,N,...", "causal prefill lengths (default 1024,4096; none: no prefill rows)", 0},
        {"--dtype", KV_OPT_STRING, &dtype_s, 0, 0, NULL, "FMT", "cache format: fp32 (default), fp16, bf16, int8, ...", 0},
        {"--splits", KV_OPT_INT, &splits, 1, 4096, NULL, "S", "split-KV: key ranges (default 16)", 0},
        {"--tile-q", KV_OPT_INT, &tile_q, 1, 4096, NULL, "Q", "tiled: queries per tile (default 64)", 0},
        {"--tile-k", KV_OPT_INT, &tile_k, 1, 4096, NULL, "K", "tiled and split: keys per tile (default 64)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "decode: timed calls per row after a warm-up (default 5)", 0},
        {"--prefill-repeats", KV_OPT_INT, &prepeats, 1, 64, NULL, "R", "prefill: timed calls per row (default 3)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cpu (default), or cuda: every decode kernel of the device (kvlab bench attention --device cuda --help)", 0},
        {"--compare", KV_OPT_FLAG, &compare, 0, 0, NULL, NULL, "with --device cuda: these rows and the kernel versions v1..v4 of chapter 08 instead", 0},
        {"--loops", KV_OPT_FLAG, &loops, 0, 0, NULL, NULL, "the engine row with the portable loops, not the AVX2 twins (kv_attn_simd(0); the same bits)", 0},
        {"--only", KV_OPT_STRING, &only, 0, 0, NULL, "NAMES", "rows to run, comma-separated words of their names: engine, naive, tiled, split, v1..v4 (default: all)", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Attention of one sequence by each algorithm of chapter 08: naive (scores\n"
                          "materialized), tiled (online softmax, causal tiles skipped) and split-KV\n"
                          "(key ranges merged by log-sum-exp); decode (one token over N keys) and causal\n"
                          "prefill (N tokens); and the engine's own decode (cpu engine: kv_attention(),\n"
                          "each KV head's rows read once for its G query heads). Per row: median time,\n"
                          "bytes moved, GB/s, and the ratio to the machine's read bandwidth measured in\n"
                          "the same run (the cpu engine is held to >= 85% at >= 32k tokens). An engine\n"
                          "decode row larger than the LLC is measured against the larger of the bandwidth\n"
                          "before it and after it (measured again), and followed by a (resident) row: the\n"
                          "same call over a cache that stays in the LLC, the most the engine reads however\n"
                          "fast the memory (in --csv: algorithm \"cpu engine resident\").\n"
                          "bytes (CPU, counted by kv_flash_stats) = K/V rows read x row bytes as stored\n"
                          "  + Q read + output written (split: + partials) + scores (naive: 5 x 4 x H x T\n"
                          "  x N: written, read for the max, rewritten as exp, read for P V).\n"
                          "GPU rows (--device cuda): the same formulas on each kernel version's work\n"
                          "  split (kvcu_flash_bytes): v2 reads K/V once per query head, v1 once per query\n"
                          "  and query head (T times at prefill), v3/v4 once per KV head; v1 adds its score\n"
                          "  passes. Each version is checked against kv_flash_naive (max |diff| <= 1e-4)\n"
                          "  before it is timed.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    int dec[ATTN_MAX_LENGTHS], pre[ATTN_MAX_LENGTHS], n_dec, n_pre, e;
    if ((e = parse_lengths(cmd, "--decode", decode_s, dec, &n_dec)) ||
        (e = parse_lengths(cmd, "--prefill", prefill_s, pre, &n_pre)))
        return e;
    if (!n_dec && !n_pre)
        return kv_args_bad(cmd, "--decode", "and --prefill are both none: nothing to measure");
    const int dtype = kv_quant_parse(dtype_s);
    if (dtype < 0 || kvq_is_kivi(dtype))
        return kv_args_bad(cmd, "--dtype", "'%s': a per-token format (fp32, fp16, bf16, int8, "
                           "int8-gG, fp8)", dtype_s);
    const char *bad;
    size_t bad_len;
    if (only && !only_valid(only, &bad, &bad_len))
        return kv_args_bad(cmd, "--only", "'%.*s' is not a row (engine, naive, tiled, split, "
                           "v1, v2, v3, v4)", (int)(bad_len < 40 ? bad_len : 40), bad);
    if (H % Hkv) return kv_args_bad(cmd, "--kv-heads", "%d does not divide H = %d", Hkv, H);
    if (pH % pHkv)
        return kv_args_bad(cmd, "--prefill-kv-heads", "%d does not divide %d", pHkv, pH);
    if ((e = kv_cli_check_device(cmd, device))) return e;
    const int gpu = strcmp(device, "cpu") != 0;
    kv_err err = {{0}};
    for (int mode = 0; mode < 2; mode++) /* every case's format and shape, before any timing */
        for (int li = 0; li < (mode ? n_pre : n_dec); li++) {
            kv_config g;
            kv_cache_spec s;
            const int st = case_shape(mode ? pH : H, mode ? pHkv : Hkv, d, dtype,
                                      mode ? pre[li] : dec[li], &g, &s, &err);
            if (st) return kv_cli_fail(cmd, "--dtype", st, &err);
        }

    /* the whole team on every row, like the chapter 08 algorithms: the engine's attention
     * otherwise falls back to one thread while another process runs (kv_parallel_worth) */
    kv_parallel_ignore_load(1);
    if (loops) kv_attn_simd(0);
    kv_bandwidth bw = {0};
    if (kv_read_bandwidth(&bw, (size_t)256 << 20, 5, &err))
        return kv_cli_fail(cmd, "bandwidth", KV_ERR_NOMEM, &err);
    double mbw = bw.bytes_per_s; /* the roofline the CPU rows are measured against: latest */
    int64_t llc = kv_llc_bytes(NULL, NULL);
    if (llc <= 0) llc = (int64_t)8 << 20; /* unknown: assume a small one (resident rows) */
#ifdef KV_HAVE_CUDA
    double gbw = 0.0;
    if (gpu && kvcu_read_bandwidth(0, 5, &gbw, &err)) return kv_cli_fail(cmd, "bandwidth", 1, &err);
#endif
    if (csv)
        kv_csv_printf(stdout,
                      "mode,device,algorithm,H,H_kv,d,dtype,T,n_keys,splits,seconds,bytes,GBps,"
                      "ratio_to_read_bw\n");
    else {
        printf("bench attention: d %d, %s cache, causal; decode H %d / H_kv %d, prefill H %d / "
               "H_kv %d; tiles %dx%d, %d splits; %d OpenMP threads\n", d, kv_dtype_name(dtype),
               H, Hkv, pH, pHkv, tile_q, tile_k, splits, omp_get_max_threads());
        kv_bench_print_bandwidth(stdout, &bw, "(this machine, this run)");
#ifdef KV_HAVE_CUDA
        if (gpu) printf("device read bandwidth: %.2f GB/s (GPU rows are measured against it)\n",
                        gbw * 1e-9);
#endif
        printf("bytes: counted by kv_flash_stats (CPU): K/V rows read x row bytes as stored + Q +\n"
               "output (+ split partials) + scores (naive: 5 passes over [T][N] floats per head).\n"
               "cpu engine (kv_attention(), what kv_forward runs): K/V once per KV head as stored\n"
               "+ Q + output, %s; the other CPU rows read each KV head's rows once per\n"
               "query head (G times).\n\n",
               kv_attn_simd(-1) ? "AVX2 twins" : "portable loops");
        printf("%-8s %7s %5s %-14s %11s %11s %9s %8s\n", "mode", "N", "T", "algorithm",
               "time (s)", "bytes", "GB/s", "of BW");
    }
    int st = KV_OK;
    for (int mode = 0; mode < 2 && !st; mode++) {
        const int nl = mode ? n_pre : n_dec;
        for (int li = 0; li < nl && !st; li++) {
            const int n = mode ? pre[li] : dec[li], T = mode ? n : 1;
            const int h = mode ? pH : H, hkv = mode ? pHkv : Hkv;
            attn_case k;
            st = case_open(&k, h, hkv, d, dtype, n, T, gpu, &err);
            if (st) break;
            k.splits = splits, k.tile_q = tile_q, k.tile_k = tile_k;
            for (int a = 0; a < n_algos && !st; a++) {
                const attn_algo *al = &algos[a];
                if (al->gpu && !gpu) continue;
                if (only && !algo_chosen(al->name, only)) continue;
                if ((al->decode_only && mode) || (al->prefill_only && !mode)) continue;
                double sec = 0, bytes = 0;
                st = al->time(&k, al->version, mode ? prepeats : repeats, &sec, &bytes, &err);
                if (st || sec < 0) continue; /* sec < 0: the version refused the size */
                const double rate = bytes / sec;
                const int dram = al->time == engine_time && !mode && bytes > (double)llc;
                double before = mbw;
                if (dram) { /* measured again after it: the larger of the two */
                    kv_bandwidth after = {0};
                    if (kv_read_bandwidth(&after, (size_t)256 << 20, 5, &err)) {
                        st = KV_ERR_NOMEM; /* the case is closed below, the error reported */
                        break;
                    }
                    mbw = after.bytes_per_s;
                }
                double roof = al->gpu ? 0.0 : mbw > before ? mbw : before;
#ifdef KV_HAVE_CUDA
                if (al->gpu) roof = gbw;
#endif
                if (csv)
                    kv_csv_printf(stdout, "%s,%s,%s,%d,%d,%d,%s,%d,%d,%d,%.6e,%.0f,%.3f,%.4f\n",
                                  mode ? "prefill" : "decode", al->gpu ? "cuda" : "cpu", al->name,
                                  h, hkv, d, kv_dtype_name(dtype), T, n, splits, sec, bytes,
                                  rate * 1e-9, roof > 0 ? rate / roof : 0.0);
                else {
                    char b[32];
                    printf("%-8s %7d %5d %-14s %11.4e %11s %9.2f %7.1f%%",
                           mode ? "prefill" : "decode", n, T, al->name, sec,
                           kv_fmt_bytes(bytes, b, sizeof b), rate * 1e-9,
                           roof > 0 ? 100.0 * rate / roof : 0.0);
                    /* the engine is held to 85 % for its decode of fp16 / int8 caches from 32k (design.md §12) */
                    if (al->time == engine_time && n >= 32768 &&
                        (dtype == KV_QF_F16 || dtype == KV_QF_INT8))
                        printf("  target >= 85%%: %s", rate >= 0.85 * roof ? "met" : "MISSED");
                    printf("\n");
                    if (dram && fabs(mbw - before) > 0.1 * roof)
                        printf("%-8s memory read bandwidth %.2f GB/s before this row, %.2f after: "
                               "its ratio uses the larger\n", "", before * 1e-9, mbw * 1e-9);
                }
                /* an engine row read from DRAM: how fast the same call runs from the LLC */
                if (dram) {
                    double rs = 0, rb = 0;
                    int nr = 0;
                    char rbs[32];
                    st = resident_time(&k, llc, repeats, &rs, &rb, &nr, &err);
                    if (st) break;
                    const double rr = rs > 0 ? rb / rs : 0.0;
                    if (csv)
                        kv_csv_printf(
                            stdout,
                            "decode,cpu,cpu engine resident,%d,%d,%d,%s,1,%d,%d,%.6e,%.0f,"
                            "%.3f,%.4f\n",
                            h, hkv, d, kv_dtype_name(dtype), nr, splits, rs, rb, rr * 1e-9,
                            rr / roof);
                    else
                        printf("%-8s %7d %5d %-14s %11.4e %11s %9.2f %7.1f%%  the same call, "
                               "K/V in the LLC: %s\n", "", nr, 1, "  (resident)", rs,
                               kv_fmt_bytes(rb, rbs, sizeof rbs), rr * 1e-9,
                               100.0 * rr / roof,
                               rr < 0.85 * roof ? "the cores stay below 85%"
                                                : "the cores allow 85%");
                }
            }
            case_close(&k);
        }
    }
    if (st) return kv_cli_fail(cmd, "run", st, &err);
    if (!csv)
        printf("\nGB/s above the read bandwidth means the bytes came from caches, not DRAM: a\n"
               "small K/V, or the naive score matrix re-read while it still fits.\n");
    return KV_EXIT_OK;
}
