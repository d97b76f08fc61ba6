/*
 * The device benches: `kvlab bench attention --device cuda` (every decode kernel over the
 * sizes a GPU serves) and `kvlab bench engine --device cuda` (whole-model decoding on the GPU).
 * Both measure the device's bandwidth in the same run and report each result as a fraction
 * of it; a fraction above 1 means the ceiling, not the kernel, is wrong (the bytes came from
 * L2, or the bandwidth kernels under-measure), and is printed as such, never as a target met.
 *
 * Bandwidth: kvcu_read_bandwidth() (a kernel summing a buffer) and kvcu_copy_bandwidth() (a
 * device-to-device copy kernel, read + written bytes), 1 GiB each (--quick: 16 MiB); the
 * roofline is the larger. The attention rows are measured against the figure taken before
 * the first row; the figures after the last are printed, with a note when they are more than
 * 10 % higher. An engine run is between the two, and uses the largest of the four, so a
 * device that got faster during the run cannot flatter it.
 *
 * bench attention --device cuda: one layer, H query heads over H_kv KV heads of d, for each
 * layout (contiguous, paged with blocks of 16 interleaved across the batch), cache format,
 * batch B and context length N: B slots of N cached tokens, one query each (decode). The
 * first kernel of the table `kernels` below, attn v2, is the reference: kv_attention_ref()'s
 * three passes in its order, one element per load. Every other kernel is checked against its
 * output by the kernel's own stated tolerance (max |diff|, dkernel.tol) and then timed (median
 * of R CUDA-event-timed calls after a warm-up):
 *   KV bytes = B · 2 · H_kv · N · d · b     (b: the format's bytes per element, scales
 *                                           included: the least any decode must read)
 *   GB/s = KV bytes / time; "of BW" = GB/s / the roofline.
 * A kernel that runs per sequence is timed as B launches in a row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_generate.h"
#include "kv_quant.h"
#include "kv_rng.h"
#include "measure.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"

/* ---- the device's bandwidth ------------------------------------------------------------- */

typedef struct {
    double read, copy; /* bytes/s */
} dev_bw;

static int measure_dev_bw(dev_bw *b, size_t bytes, kv_err *err)
{
    int st = kvcu_read_bandwidth(bytes, 5, &b->read, err);
    if (!st) st = kvcu_copy_bandwidth(bytes, 5, &b->copy, err);
    return st;
}

static double roofline(const dev_bw *a, const dev_bw *b)
{
    double m = a->read > a->copy ? a->read : a->copy;
    if (b && b->read > m) m = b->read;
    if (b && b->copy > m) m = b->copy;
    return m;
}

/* "72.3%", or a ratio above 1 said for what it is */
static const char *ratio_note(double ratio)
{
    return ratio > 1.0 ? "  above the measured bandwidth: the ceiling is wrong (L2? see the "
                         "bandwidth lines)" : "";
}

/* ---- bench attention --device cuda ---------------------------------------------------------- */

/* One measured case: B slots of N tokens on the device, their queries and outputs. */
typedef struct {
    kvcu_cache *c;
    int H, Hkv, d, B, N, fmt, paged;
    float *q, *out, *ref;    /* device [B][H][d]; ref host: the first kernel's output */
    float *got;              /* host [B][H][d] */
    int *slots, *pos;        /* device [B]: slot b, position N - 1 */
    float *scratch;          /* device: the largest scratch a kernel of the table asks */
    float tc_tol;            /* a tensor-core row's tolerance (tc_tolerance()); 0: none */
} dcase;

/* A decode kernel of the table: one decode of every slot of the case. */
typedef struct {
    const char *name;
    int (*run)(const dcase *k, int version, kv_err *err);
    int version;
    const char *what; /* how it runs, for the header */
    float tol;        /* max |kernel - attn v2| before it is timed */
    int tc;           /* version 4's kernel: on tensor cores where kvcu_cache_decode_mma() says,
                       * and then held to dcase.tc_tol instead */
} dkernel;

static int run_engine(const dcase *k, int version, kv_err *err)
{
    (void)version;
    return kvcu_decode_batch(k->c, 0, k->slots, k->pos, k->q, k->out, k->scratch, k->B, k->H,
                             k->N, err);
}

static int run_attn(const dcase *k, int version, kv_err *err)
{
    const size_t row = (size_t)k->H * k->d;
    for (int b = 0; b < k->B; b++) {
        const int st = kvcu_cache_attention_version(version, k->c, 0, b, k->N - 1,
                                                    k->q + b * row, k->out + b * row,
                                                    k->scratch, k->H, err);
        if (st) return st;
    }
    return KV_OK;
}

static int run_flash(const dcase *k, int version, kv_err *err)
{
    const size_t row = (size_t)k->H * k->d;
    for (int b = 0; b < k->B; b++) {
        const kvcu_flash_job j = {k->c, 0, b, k->H, k->q + b * row, 1, k->N - 1, 0, k->N, 1,
                                  k->out + b * row};
        const int st = kvcu_flash_attention(version, &j, k->scratch, err);
        if (st) return st;
    }
    return KV_OK;
}

/* The kernels, in order; the first is every other's reference. A new decode kernel is one
 * line here: its name, a run() over a dcase (or one of those above with its version), its
 * tolerance. Outputs average values in [-1, 1] with weights that sum to 1, so a kernel that
 * only adds in another order (v1, v3, chapter 08's) stays within 1e-4 of v2. Version 4,
 * what the engine runs, also rescales its running sums once per tile and per range, R
 * rescalings of one rounding each (test_gpu_decode.c's bound): twice the tolerance, 2e-4.
 * Where version 4 runs the group on tensor cores, the query and the weights are rounded to
 * 16 bits, which 2e-4 does not account for: those rows take tc_tolerance() instead. */
static const dkernel kernels[] = {
    {"attn v2", run_attn, 2, "one block per KV head, the group together, per sequence: the "
                             "reference", 0.0f, 0},
    {"engine", run_engine, 0, "kvcu_decode_batch(): what kvcu_forward runs (v4), one launch",
     2e-4f, 1},
    {"attn v4", run_attn, 4, "v4 alone (kvcu_decode.cu), per sequence", 2e-4f, 1},
    {"attn v1", run_attn, 1, "one block per query head, per sequence", 1e-4f, 0},
    {"attn v3", run_attn, 3, "v2 split over 512-position partitions + merge, per sequence",
     1e-4f, 0},
    {"flash v3", run_flash, 3, "chapter 08 decode: a block per (query, KV head), per sequence",
     1e-4f, 0},
    {"flash v4", run_flash, 4, "chapter 08 split-KV + log-sum-exp merge, per sequence", 1e-4f, 0},
};
#define N_KERNELS ((int)(sizeof kernels / sizeof kernels[0]))

/* The tolerance of a row version 4 runs on tensor cores: that kernel's bound
 * (kvcu_decode_bound() with its 16-bit roundoff), plus attn v2's own 1e-4. Every key and
 * value the case writes is in [-1, 1] and every format here decodes it to at most 1 in
 * magnitude (a symmetric int8 or fp8 scale maps the row's largest to the largest code), so
 * V <= 1 and S <= max over the queries of Σ|q_j| / √d (q: host [rows][d]). */
static float tc_tolerance(const float *q, size_t rows, int d, int fmt, int N)
{
    double l1 = 0.0;
    for (size_t r = 0; r < rows; r++) {
        double a = 0.0;
        for (int j = 0; j < d; j++) a += fabs(q[r * d + j]);
        if (a > l1) l1 = a;
    }
    const double S = l1 / sqrt(d);
    return (float)(kvcu_decode_bound(d, N, S, 1.0, kvcu_decode_mma_roundoff(fmt)) + 1e-4);
}

static size_t case_scratch(const dcase *k)
{
    size_t s = kvcu_decode_batch_scratch(k->c, k->B, k->H);
    for (int v = 1; v <= 4; v++) {
        const size_t a = kvcu_attn_decode_scratch(v, k->H, k->d, k->N);
        if (a > s) s = a;
    }
    const kvcu_flash_job j = {k->c, 0, 0, k->H, k->q, 1, k->N - 1, 0, k->N, 1, k->out};
    const size_t f = kvcu_flash_scratch(4, &j);
    return f > s ? f : s;
}

static void dcase_close(dcase *k)
{
    kvcu_cache_free(k->c);
    kvcu_free(k->q);
    kvcu_free(k->out);
    kvcu_free(k->slots);
    kvcu_free(k->pos);
    kvcu_free(k->scratch);
    free(k->ref);
    free(k->got);
    memset(k, 0, sizeof *k);
}

/* B slots of N random tokens (one chunk of random K/V, written again at every chunk of every
 * slot: the values do not change the bytes read); paged: block i of slot b is block i·B + b,
 * so the sequences' blocks interleave in the pool. */
/* The one-layer config and cache spec of a case (blocks of 16 tokens when paged); KV_OK when
 * they go together, so the command refuses a format before it measures anything. */
static int dcase_shape(int H, int Hkv, int d, int fmt, int paged, int B, int N, kv_config *g,
                       kv_cache_spec *s, kv_err *err)
{
    kv_bench_layer_config(g, H, Hkv, d, N);
    *s = kv_cache_spec_default(B, N);
    s->quant.dtype = fmt;
    if (paged) {
        s->layout.kind = KV_LAYOUT_PAGED;
        s->layout.block_size = 16;
        s->layout.n_blocks = (N + 15) / 16 * B;
    }
    return kv_cache_spec_check("cache", g, s, err);
}

static int dcase_open(dcase *k, int H, int Hkv, int d, int fmt, int paged, int B, int N,
                      kv_err *err)
{
    memset(k, 0, sizeof *k);
    k->H = H, k->Hkv = Hkv, k->d = d, k->B = B, k->N = N, k->fmt = fmt, k->paged = paged;
    kv_config g;
    kv_cache_spec s;
    int st = dcase_shape(H, Hkv, d, fmt, paged, B, N, &g, &s, err);
    if (st) return st;
    const int nb = (N + 15) / 16; /* blocks per slot */
    const int chunk = N < 4096 ? N : 4096;
    const size_t cn = (size_t)chunk * Hkv * d, qn = (size_t)B * H * d;
    float *h = malloc((cn > qn ? cn : qn) * sizeof(float)), *kk = NULL, *vv = NULL;
    int *blocks = malloc((size_t)nb * sizeof(int)), *hi = malloc(2 * (size_t)B * sizeof(int));
    st = h && blocks && hi ? kvcu_cache_create(&k->c, &g, &s, err)
                           : kv_fail(err, KV_ERR_NOMEM, "bench: host buffers");
    kv_rng r;
    kv_rng_seed(&r, 4242 + (uint64_t)N);
    if (!st) st = kvcu_malloc((void **)&kk, cn * sizeof(float), err);
    if (!st) st = kvcu_malloc((void **)&vv, cn * sizeof(float), err);
    for (int t = 0; t < 2 && !st; t++) {
        for (size_t i = 0; i < cn; i++) h[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
        st = kvcu_upload(t ? vv : kk, h, cn * sizeof(float), err);
    }
    for (int b = 0; b < B && !st; b++) {
        for (int i = 0; paged && i < nb; i++) blocks[i] = i * B + b;
        if (paged) st = kvcu_cache_set_blocks(k->c, b, blocks, nb, err);
        for (int p = 0; p < N && !st; p += chunk) {
            const int m = N - p < chunk ? N - p : chunk;
            st = kvcu_cache_write_seq(k->c, 0, b, p, m, kk, vv, err);
        }
    }
    if (!st) { /* the queries, the rows' slots and positions */
        for (size_t i = 0; i < qn; i++) h[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
        for (int b = 0; b < B; b++) hi[b] = b, hi[B + b] = N - 1;
        if (kvcu_cache_decode_mma(k->c, 0, H)) /* version 4 runs the group on tensor cores */
            k->tc_tol = tc_tolerance(h, (size_t)B * H, d, fmt, N);
        st = kvcu_malloc((void **)&k->q, qn * sizeof(float), err);
    }
    if (!st) st = kvcu_malloc((void **)&k->out, qn * sizeof(float), err);
    if (!st) st = kvcu_upload(k->q, h, qn * sizeof(float), err);
    if (!st) st = kvcu_malloc((void **)&k->slots, (size_t)B * sizeof(int), err);
    if (!st) st = kvcu_malloc((void **)&k->pos, (size_t)B * sizeof(int), err);
    if (!st) st = kvcu_upload(k->slots, hi, (size_t)B * sizeof(int), err);
    if (!st) st = kvcu_upload(k->pos, hi + B, (size_t)B * sizeof(int), err);
    if (!st) st = kvcu_malloc((void **)&k->scratch, case_scratch(k) * sizeof(float), err);
    if (!st) st = kvcu_synchronize(err);
    k->ref = malloc(qn * sizeof(float));
    k->got = malloc(qn * sizeof(float));
    if (!st && (!k->ref || !k->got)) st = kv_fail(err, KV_ERR_NOMEM, "bench: host outputs");
    kvcu_free(kk);
    kvcu_free(vv);
    free(h);
    free(blocks);
    free(hi);
    if (st) dcase_close(k);
    return st;
}

typedef struct {
    const dcase *k;
    const dkernel *kn;
} dcall;

static int dcall_fn(void *arg, kv_err *err)
{
    const dcall *c = (const dcall *)arg;
    return c->kn->run(c->k, c->kn->version, err);
}

/* Run kernel i once and compare with the reference (kernel 0's output, kept). 1 when the
 * kernel refuses the case (KV_ERR_UNSUPPORTED: not a row), else a status. */
static int dcheck(dcase *k, int i, float *worst, kv_err *err)
{
    const size_t n = (size_t)k->B * k->H * k->d;
    int st = kernels[i].run(k, kernels[i].version, err);
    if (st == KV_ERR_UNSUPPORTED) return 1;
    if (!st) st = kvcu_synchronize(err);
    if (!st) st = kvcu_download(i ? k->got : k->ref, k->out, n * sizeof(float), err);
    if (st) return st;
    *worst = 0.0f;
    for (size_t j = 0; i && j < n; j++) {
        const float dd = fabsf(k->got[j] - k->ref[j]);
        if (!(dd <= *worst)) *worst = dd; /* NaN too */
    }
    const float tol = kernels[i].tc && k->tc_tol > 0.0f ? k->tc_tol : kernels[i].tol;
    if (!(*worst <= tol))
        return kv_fail(err, KV_ERR_DEVICE, "%s: max |diff| %.3g from %s (its tolerance %.2g%s): "
                       "not timed", kernels[i].name, *worst, kernels[0].name, tol,
                       tol == kernels[i].tol ? "" : ", on tensor cores");
    return KV_OK;
}

static int dcheck_alone(dcase *k, kv_err *err) /* --lean, B > 1: batched == alone, bits */
{
    const size_t n = (size_t)k->H * k->d * sizeof(float);
    dcase one = *k;
    one.B = 1; /* sequence 0 alone: a row's split count never depends on the batch */
    int st = run_engine(&one, 0, err);
    if (!st) st = kvcu_download(k->ref, k->out, n, err);
    if (!st) st = run_engine(k, 0, err);
    if (!st) st = kvcu_download(k->got, k->out, n, err);
    return st || !memcmp(k->ref, k->got, n) ? st : kv_fail(err, KV_ERR_DEVICE, "engine: "
           "sequence 0 of %d differs from it alone", k->B);
}

int cmd_bench_attention_cuda(int argc, char **argv)
{
    const char *cmd = "kvlab bench attention --device cuda";
    const char *device = "cuda", *lens_s = "4096,32768,131072", *batch_s = "1,32";
    const char *dtypes_s = "fp16,int8,fp8", *layouts_s = "contiguous,paged";
    int H = 32, Hkv = 8, d = 128, repeats = 5, quick = 0, csv = 0, compare = 0, lean = 0;
    kv_opt opts[] = {
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cuda: this sweep (cpu: the chapter 08 rows)", 0},
        {"--heads", KV_OPT_INT, &H, 1, 256, NULL, "H", "query heads (default 32)", 0},
        {"--kv-heads", KV_OPT_INT, &Hkv, 1, 256, NULL, "H_kv", "KV heads, dividing H (default 8)", 0},
        {"--head-dim", KV_OPT_INT, &d, 1, 512, NULL, "d", "head dim (default 128)", 0},
        {"--lengths", KV_OPT_STRING, &lens_s, 0, 0, NULL, "N,N,...", "context lengths (default 4096,32768,131072)", 0},
        {"--batch", KV_OPT_STRING, &batch_s, 0, 0, NULL, "B,B,...", "sequences per decode (default 1,32)", 0},
        {"--dtypes", KV_OPT_STRING, &dtypes_s, 0, 0, NULL, "FMT,...", "per-token cache formats (default fp16,int8,fp8)", 0},
        {"--layouts", KV_OPT_STRING, &layouts_s, 0, 0, NULL, "L,...", "contiguous, paged or both (default both)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "timed calls per row after a warm-up (default 5)", 0},
        {"--quick", KV_OPT_FLAG, &quick, 0, 0, NULL, NULL, "tiny sizes (H 4, H_kv 2, d 32, N 64,600, B 1,3 unless given; 16 MiB bandwidth buffers, 1 repeat): the emulation's and the tests' run", 0},
        {"--compare", KV_OPT_FLAG, &compare, 0, 0, NULL, NULL, "(not here: the chapter 08 comparison, CPU rows and kernel versions v1..v4)", 0},
        KV_CLI_CSV_OPTS(csv),
        {"--lean", KV_OPT_FLAG, &lean, 0, 0, NULL, NULL, "B > 1: the engine's row alone, held bit for bit to sequence 0 alone (no reference); N > 32768: attn v2 and the engine only (gpu-report.sh)", 0},
    };
    int r = kv_args_parse(cmd,
                          "Every decode-attention kernel of the device over B sequences of N cached\n"
                          "tokens (one query each), per layout and cache format, against the device's\n"
                          "bandwidth measured in the same run (a read kernel and a device-to-device\n"
                          "copy kernel; the larger, before and after). KV bytes = B 2 H_kv N d b, the\n"
                          "least any decode reads; a ratio above 1 means the ceiling is wrong. Each\n"
                          "kernel is checked against the first, attn v2, by its stated tolerance\n"
                          "(1e-4; v4, the engine's, 2e-4; on tensor cores the bound of its 16-bit\n"
                          "queries and weights) before it is timed.\n"
                          "With --compare: the chapter 08 rows instead (kvlab bench attention --help).",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (quick) { /* the shape too, unless given (--heads 8 --kv-heads 1: the tensor-core rows) */
        if (!opts[1].seen) H = 4;
        if (!opts[2].seen) Hkv = 2;
        if (!opts[3].seen) d = 32;
        repeats = 1;
        if (!opts[4].seen) lens_s = "64,600"; /* 600: two of v3's partitions */
        if (!opts[5].seen) batch_s = "1,3";
    }
    int lens[8], batch[8], fmts[8], lays[2], n_lens, n_batch, n_fmts = 0, n_lays = 0, e;
    char words[8][KV_ARGS_WORD];
    if ((e = kv_args_int_list(cmd, "--lengths", lens_s, lens, 8, &n_lens, 1, 1 << 24)) ||
        (e = kv_args_int_list(cmd, "--batch", batch_s, batch, 8, &n_batch, 1, 4096)) ||
        (e = kv_args_word_list(cmd, "--dtypes", dtypes_s, words, 8, &n_fmts)))
        return e;
    for (int i = 0; i < n_fmts; i++) {
        fmts[i] = kv_quant_parse(words[i]);
        if (fmts[i] < 0 || kvq_is_kivi(fmts[i]))
            return kv_args_bad(cmd, "--dtypes", "'%s': a per-token format (fp32, fp16, bf16, "
                               "int8, int8-gG, fp8)", words[i]);
        for (int j = 0; j < i; j++) /* two names of one format (fp8, fp8-e4m3) */
            if (fmts[j] == fmts[i])
                return kv_args_bad(cmd, "--dtypes", "'%s' and '%s' are one format", words[j],
                                   words[i]);
    }
    if ((e = kv_args_word_list(cmd, "--layouts", layouts_s, words, 2, &n_lays))) return e;
    for (int i = 0; i < n_lays; i++) {
        lays[i] = !strcmp(words[i], "paged");
        if (!lays[i] && strcmp(words[i], "contiguous"))
            return kv_args_bad(cmd, "--layouts", "'%s': contiguous or paged", words[i]);
    }
    if (H % Hkv) return kv_args_bad(cmd, "--kv-heads", "%d does not divide H = %d", Hkv, H);
    if ((e = kv_cli_check_device(cmd, "cuda"))) return e;

    kv_err err = {{0}};
    for (int li = 0; li < n_lays; li++) /* every case's cache, before any measurement */
        for (int fi = 0; fi < n_fmts; fi++)
            for (int bi = 0; bi < n_batch; bi++)
                for (int ni = 0; ni < n_lens; ni++) {
                    kv_config g;
                    kv_cache_spec s;
                    if ((e = dcase_shape(H, Hkv, d, fmts[fi], lays[li], batch[bi], lens[ni], &g,
                                         &s, &err)))
                        return kv_cli_fail(cmd, "--dtypes", e, &err);
                }
    char dev[256] = "";
    kvcu_device_describe(dev, sizeof dev, &err);
    const size_t bw_bytes = quick ? (size_t)16 << 20 : (size_t)1 << 30;
    dev_bw bw0 = {0, 0}, bw1 = {0, 0};
    int st = measure_dev_bw(&bw0, bw_bytes, &err);
    if (st) return kv_cli_fail(cmd, "bandwidth", st, &err);
    const double roof = roofline(&bw0, NULL);
    if (csv)
        kv_csv_printf(
            stdout,
            "layout,dtype,B,N,H,H_kv,d,kernel,seconds,kv_bytes,GBps,ratio_to_bw,max_diff\n");
    else {
        printf("bench attention --device cuda: %s%s\n", dev,
               kvcu_is_emulation() ? "; emulated timings say nothing about a GPU" : "");
        printf("decode, one query per sequence: H %d, H_kv %d, d %d; median of %d calls\n", H,
               Hkv, d, repeats);
        printf("device bandwidth (this run, before): read %.2f GB/s, copy %.2f GB/s (read + "
               "written); roofline %.2f GB/s\n", bw0.read * 1e-9, bw0.copy * 1e-9, roof * 1e-9);
        printf("KV bytes = B 2 H_kv N d b (b: the format's bytes per element, scales included)"
               "\nkernels:\n");
        for (int i = 0; i < N_KERNELS; i++)
            printf("  %-9s %s\n", kernels[i].name, kernels[i].what);
        printf("\n%-10s %-9s %3s %7s %-9s %11s %10s %9s %7s\n", "layout", "dtype", "B", "N",
               "kernel", "time (s)", "KV bytes", "GB/s", "of BW");
    }
    int rows = 0, above = 0;
    for (int li = 0; li < n_lays && !st; li++)
        for (int fi = 0; fi < n_fmts && !st; fi++)
            for (int bi = 0; bi < n_batch && !st; bi++)
                for (int ni = 0; ni < n_lens && !st; ni++) {
                    dcase k;
                    st = dcase_open(&k, H, Hkv, d, fmts[fi], lays[li], batch[bi], lens[ni], &err);
                    if (st) break;
                    const double kvb = (double)k.B * 2.0 * Hkv * (double)k.N *
                                       kv_dtype_bytes_d(k.fmt, d) * d;
                    for (int i = 0; i < N_KERNELS && !st; i++) {
                        float worst = 0.0f;
                        double sec = 0.0;
                        if (lean && (k.B > 1 ? i != 1 : k.N > 32768 && i > 1)) continue;
                        st = lean && k.B > 1 ? dcheck_alone(&k, &err) : dcheck(&k, i, &worst, &err);
                        if (st == 1) { /* refused the case: no row */
                            st = KV_OK;
                            continue;
                        }
                        const dcall c = {&k, &kernels[i]};
                        if (!st) st = kvcu_time_calls(dcall_fn, (void *)&c, repeats, &sec, &err);
                        if (st) break;
                        const double rate = sec > 0 ? kvb / sec : 0.0, ratio = rate / roof;
                        char b[32];
                        rows++;
                        above += ratio > 1.0;
                        if (csv)
                            kv_csv_printf(
                                stdout, "%s,%s,%d,%d,%d,%d,%d,%s,%.6e,%.0f,%.3f,%.4f,%.3g\n",
                                k.paged ? "paged" : "contiguous", kv_dtype_name(k.fmt), k.B, k.N, H,
                                Hkv, d, kernels[i].name, sec, kvb, rate * 1e-9, ratio, worst);
                        else
                            printf("%-10s %-9s %3d %7d %-9s %11.4e %10s %9.2f %6.1f%%%s\n",
                                   k.paged ? "paged" : "contiguous", kv_dtype_name(k.fmt), k.B,
                                   k.N, kernels[i].name, sec, kv_fmt_bytes(kvb, b, sizeof b),
                                   rate * 1e-9, 100.0 * ratio, ratio_note(ratio));
                        fflush(stdout); /* a run stopped by a time budget keeps its rows */
                    }
                    dcase_close(&k);
                }
    if (st) return kv_cli_fail(cmd, "run", st, &err);
    st = measure_dev_bw(&bw1, bw_bytes, &err);
    if (st) return kv_cli_fail(cmd, "bandwidth", st, &err);
    const double roof1 = roofline(&bw0, &bw1);
    if (!csv) {
        printf("\ndevice bandwidth (after): read %.2f GB/s, copy %.2f GB/s; %d rows", bw1.read * 1e-9,
               bw1.copy * 1e-9, rows);
        if (roof1 > roof * 1.1)
            printf("; the device read %.0f%% faster after the rows than before: their ratios "
                   "are against the smaller figure", 100.0 * (roof1 / roof - 1.0));
        printf("\n%d row%s above the measured bandwidth (a ratio above 1 is a wrong ceiling, "
               "not a kernel beating memory)\n", above, above == 1 ? "" : "s");
    }
    return KV_EXIT_OK;
}

/* ---- bench engine --device cuda --------------------------------------------------------------
 * Greedy decoding of a random-weight model on the GPU (kvcu_backend_create), BOS then one
 * token per step, as the CPU bench engine: ratio = (weight bytes + KV bytes read) / median
 * run time / the device's roofline (bandwidth above, before and after the runs). */

typedef struct {
    const char *name;
    int dim, hidden, layers, heads, kv_heads, vocab, tokens;
    const char *why;
} gpu_engine_cfg;

static const gpu_engine_cfg gpu_configs[] = {
    {"small", 288, 768, 6, 6, 6, 32000, 256, "the CPU bench's small shape (~61 MB): launch-bound on a GPU"},
    {"7b-4l", 4096, 11008, 4, 32, 8, 32000, 256, "Llama-2-7B layers with GQA (H_kv 8), 4 of them (~3.9 GB of fp32 weights)"},
    {"quick", 64, 128, 2, 4, 2, 256, 16, "tiny: the emulation's and the tests' run"},
};
#define N_GPU_CONFIGS ((int)(sizeof gpu_configs / sizeof gpu_configs[0]))
static const char *const gpu_config_names[] = {"small", "7b-4l", "quick", "all", NULL};

static int gpu_engine_row(const gpu_engine_cfg *e, const char *cache, int repeats,
                          size_t bw_bytes, int csv, kv_err *err)
{
    kv_config c = {0};
    c.dim = e->dim, c.hidden_dim = e->hidden, c.n_layers = e->layers, c.n_heads = e->heads;
    c.n_kv_heads = e->kv_heads, c.vocab_size = e->vocab, c.seq_len = e->tokens + 1;
    kv_config_set_defaults(&c);
    c.tied_classifier = 0;
    int st = kv_config_validate(&c, err);
    kv_model m = {0};
    kv_backend *b = NULL;
    kv_run_log run = {0};
    kv_cache_spec spec = kv_cache_spec_default(1, c.seq_len);
    const int fmt = kv_quant_parse(cache);
    if (!st && fmt < 0) st = kv_fail(err, KV_ERR_ARG, "--cache '%s': not a format", cache);
    spec.quant.dtype = fmt;
    if (!st) st = kv_model_alloc(&m, &c, err);
    if (!st) {
        kv_model_randomize(&m, 1234);
        st = kvcu_backend_create(&b, &m, &spec, err);
    }
    if (!st) st = kv_run_log_init(&run, KV_MODE_CACHED, e->tokens, repeats, err);
    dev_bw bw0 = {0, 0}, bw1 = {0, 0};
    if (!st) st = measure_dev_bw(&bw0, bw_bytes, err);
    const int prompt[1] = {1};
    for (int r = 0; r < repeats && !st; r++)
        st = kv_run_once(&run, b, prompt, 1, NULL, 0, 0, err);
    if (!st) st = measure_dev_bw(&bw1, bw_bytes, err);
    if (!st) {
        const double roof = roofline(&bw0, &bw1), t = kv_run_total_median(&run);
        const double wbytes = kv_decode_weight_bytes(&c) * e->tokens;
        const double kvbytes = run.sum.kv_bytes_read; /* one run's */
        const double ratio = t > 0 && roof > 0 ? (wbytes + kvbytes) / t / roof : 0.0;
        char desc[256], wb[32], kb[32];
        kv_config_describe(&c, desc, sizeof desc);
        if (csv)
            kv_csv_printf(stdout, "%s,%s,%d,%d,%.6e,%.1f,%.0f,%.0f,%.3f,%.3f,%.4f\n", e->name,
                          cache, e->tokens, repeats, t, e->tokens / t, wbytes, kvbytes, roof * 1e-9,
                          (wbytes + kvbytes) / t * 1e-9, ratio);
        else {
            printf("\n[%s] %s; %s\n", e->name, desc, e->why);
            printf("  weights %s per token, KV read %s per token on average (cache %s); %d "
                   "tokens, %d repeats, median\n", kv_fmt_bytes(wbytes / e->tokens, wb, sizeof wb),
                   kv_fmt_bytes(kvbytes / e->tokens, kb, sizeof kb), cache, e->tokens, repeats);
            printf("  device bandwidth GB/s: before read %.2f copy %.2f, after read %.2f copy "
                   "%.2f; roofline %.2f\n", bw0.read * 1e-9, bw0.copy * 1e-9, bw1.read * 1e-9,
                   bw1.copy * 1e-9, roof * 1e-9);
            printf("  %.3f ms/token, %.1f tokens/s, %.2f GB/s; roofline %.3f ms/token; ratio "
                   "%.3f%s\n", t / e->tokens * 1e3, e->tokens / t, (wbytes + kvbytes) / t * 1e-9,
                   (wbytes + kvbytes) / roof / e->tokens * 1e3, ratio, ratio_note(ratio));
        }
    }
    kv_run_log_free(&run);
    if (b) kv_backend_destroy(b);
    kv_model_free(&m);
    return st;
}

int cmd_bench_engine_cuda(int argc, char **argv)
{
    const char *cmd = "kvlab bench engine --device cuda";
    const char *device = "cuda", *which = "all", *cache = "fp32";
    int repeats = 3, quick = 0, csv = 0;
    kv_opt opts[] = {
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "cuda: the model on the GPU", 0},
        {"--config", KV_OPT_CHOICE, &which, 0, 0, gpu_config_names, "NAME", "small, 7b-4l, quick or all (default all but quick)", 0},
        {"--cache", KV_OPT_STRING, &cache, 0, 0, NULL, "FORMAT", "cache storage (default fp32)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "runs per config, median (default 3)", 0},
        {"--quick", KV_OPT_FLAG, &quick, 0, 0, NULL, NULL, "the quick config only, 16 MiB bandwidth buffers, 1 repeat", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Greedy decoding of random-weight models on the GPU, one token per step, against\n"
                          "the device's bandwidth measured in the same run (read and copy kernels, before\n"
                          "and after; the largest): ratio = (weight bytes + KV bytes read) / median run\n"
                          "time / that roofline. A ratio above 1 means the ceiling is wrong.",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (quick) which = "quick", repeats = opts[3].seen ? repeats : 1;
    int e = kv_cli_check_device(cmd, "cuda");
    if (e) return e;
    kv_err err = {{0}};
    char dev[256] = "";
    kvcu_device_describe(dev, sizeof dev, &err);
    if (csv)
        kv_csv_printf(stdout,
                      "config,cache,tokens,repeats,seconds,tokens_per_s,weight_bytes,kv_bytes,"
                      "roofline_GBps,GBps,ratio\n");
    else
        printf("bench engine --device cuda: %s%s; fp32 weights, cache %s\n", dev,
               kvcu_is_emulation() ? "; emulated timings say nothing about a GPU" : "", cache);
    int st = KV_OK, ran = 0;
    for (int i = 0; i < N_GPU_CONFIGS && !st; i++) {
        const int quick_cfg = !strcmp(gpu_configs[i].name, "quick");
        if (strcmp(which, "all") ? strcmp(which, gpu_configs[i].name) != 0 : quick_cfg) continue;
        st = gpu_engine_row(&gpu_configs[i], cache, repeats,
                            quick_cfg ? (size_t)16 << 20 : (size_t)1 << 30, csv, &err);
        ran++;
    }
    if (st) return kv_cli_fail(cmd, "run", st, &err);
    if (!csv)
        printf("\n%d config%s run\nformulas: weight bytes/token = kv_decode_weight_bytes() (as "
               "the CPU bench engine); KV bytes read\n  = L 2 H_kv d b (p+1) at position p; ratio "
               "= (weight + KV bytes) / median run time / roofline\n", ran, ran == 1 ? "" : "s");
    return KV_EXIT_OK;
}

#endif /* KV_HAVE_CUDA */
