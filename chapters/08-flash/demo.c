/*
 * Chapter 08 demo: one attention, three algorithms (kv_flash.h).
 *
 * For a few sizes (decode over 4k and 32k cached tokens, causal prefill of 256 and 1024),
 * naive (the score matrix written out), tiled (online softmax, causal tiles skipped) and
 * split-KV (key ranges merged by log-sum-exp) run on the same fp16 cache. Printed per row:
 * the largest |difference| from naive (checked: below 1e-4, the outputs being averages of
 * values in [-1, 1]: the algorithms differ only in the order fp32 sums are taken), the bytes
 * each moved as kv_flash_stats counted them, and the median time of five calls.
 *
 * What to look for: at prefill, naive's bytes are dominated by the [T][n] scores and tiled's
 * by re-reading K/V once per query tile; at decode all three read the same K/V bytes (no
 * algorithm reads less than the whole cache), and split only changes how the work is cut.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_flash.h"
#include "kv_rng.h"
#include "measure.h"

#define CH08_REPEATS 5
#define CH08_TOL 1e-4f

typedef struct {
    const char *mode;
    int n, T;
} ch08_size;

/* n random fp16 tokens, H_kv = 2, d = 64, one layer and one slot. */
static int ch08_cache(kv_cache *c, kv_config *g, int n, int H, kv_err *err)
{
    memset(g, 0, sizeof *g);
    g->dim = H * 64;
    g->hidden_dim = g->dim;
    g->n_layers = 1;
    g->n_heads = H;
    g->n_kv_heads = 2;
    g->vocab_size = 2;
    g->seq_len = n;
    kv_config_set_defaults(g);
    kv_cache_spec s = kv_cache_spec_default(1, n);
    s.quant.dtype = KV_QF_F16;
    int e = kv_cache_create(c, g, &s, err);
    if (e) return e;
    const size_t m = (size_t)n * 2 * 64;
    float *k = kv_calloc(m * 4), *v = kv_calloc(m * 4);
    if (!k || !v) e = kv_fail(err, KV_ERR_NOMEM, "chapter 08 demo: %d tokens", n);
    kv_rng r;
    kv_rng_seed(&r, 8);
    for (size_t i = 0; !e && i < m; i++) k[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    for (size_t i = 0; !e && i < m; i++) v[i] = kv_rng_uniform(&r, -1.0f, 1.0f);
    if (!e) e = kv_cache_write_seq(c, 0, 0, 0, n, k, v, err);
    c->len[0] = n;
    kv_free(k);
    kv_free(v);
    if (e) kv_cache_free(c);
    return e;
}

static int ch08_run(int alg, const kv_flash_job *j, kv_flash_stats *st, kv_err *err)
{
    if (alg == 0) return kv_flash_naive(j, st, err);
    if (alg == 1) return kv_flash_tiled(j, 64, 64, st, err);
    return kv_flash_split(j, 8, 64, st, err);
}

int kv_demo_ch08(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    const ch08_size full[] = {{"decode", 4096, 1}, {"decode", 32768, 1},
                              {"prefill", 256, 256}, {"prefill", 1024, 1024}};
    /* quick: the same two modes at sizes still cut into several 64-key tiles and 8 splits
     * (and, at prefill, several 64-query tiles with causal ones skipped); the bound on
     * |diff| does not depend on n: the outputs stay averages of values in [-1, 1] */
    const ch08_size small[] = {{"decode", 512, 1}, {"decode", 2048, 1},
                               {"prefill", 128, 128}, {"prefill", 256, 256}};
    const ch08_size *sizes = ctx->quick ? small : full;
    const int repeats = ctx->quick ? 1 : CH08_REPEATS;
    const char *names[3] = {"naive", "tiled 64x64", "split 8"};
    const int H = 8, d = 64;
    if (ctx->csv)
        kv_csv_printf(f, "mode,n_keys,T,algorithm,max_abs_diff,kv_bytes,score_bytes,total_bytes,"
                         "seconds\n");
    else {
        fprintf(f, "attention of H %d heads (H_kv 2, d %d) over an fp16 cache, causal; median of "
                "%d calls on the CPU\n", H, d, repeats);
        fprintf(f, "bytes as kv_flash_stats counts them: K/V rows read x row bytes (fp16: 2 d),"
                " scores written and read back (naive)\n\n");
        fprintf(f, "%-8s %6s %5s %-12s %10s %11s %11s %11s %10s\n", "mode", "n", "T",
                "algorithm", "max |diff|", "K/V bytes", "score bytes", "all bytes", "time (s)");
    }
    int st = KV_OK;
    for (int si = 0; si < 4 && !st; si++) {
        const int n = sizes[si].n, T = sizes[si].T;
        kv_config g;
        kv_cache c;
        st = ch08_cache(&c, &g, n, H, err);
        if (st) break;
        const size_t qn = (size_t)T * H * d;
        float *q = kv_calloc(qn * 4), *ref = kv_calloc(qn * 4), *out = kv_calloc(qn * 4);
        if (!q || !ref || !out) st = kv_fail(err, KV_ERR_NOMEM, "chapter 08 demo: queries");
        kv_rng r;
        kv_rng_seed(&r, 80 + si);
        for (size_t i = 0; !st && i < qn; i++) q[i] = kv_rng_uniform(&r, -2.0f, 2.0f);
        kv_flash_job j = {&c, 0, 0, H, q, T, n - T, 0, n, 1, ref};
        for (int a = 0; a < 3 && !st; a++) {
            j.out = a ? out : ref;
            kv_flash_stats bytes = {0};
            st = ch08_run(a, &j, &bytes, err);
            double t[CH08_REPEATS];
            for (int rep = 0; rep < repeats && !st; rep++) {
                const double t0 = kv_now();
                st = ch08_run(a, &j, NULL, err);
                t[rep] = kv_now() - t0;
            }
            if (st) break;
            float diff = 0.0f;
            for (size_t i = 0; a && i < qn; i++) {
                const float e = fabsf(out[i] - ref[i]);
                if (!(e <= diff)) diff = e; /* NaN counts as the largest */
            }
            const double all = (double)(bytes.kv_bytes + bytes.q_bytes + bytes.out_bytes +
                                        bytes.score_bytes);
            const double sec = kv_median(t, repeats);
            if (ctx->csv)
                kv_csv_printf(f, "%s,%d,%d,%s,%.3g,%lld,%lld,%.0f,%.6e\n", sizes[si].mode, n, T,
                              names[a], diff, (long long)bytes.kv_bytes,
                              (long long)bytes.score_bytes, all, sec);
            else {
                char b1[32], b2[32], b3[32];
                fprintf(f, "%-8s %6d %5d %-12s %10.2e %11s %11s %11s %10.4f\n", sizes[si].mode,
                        n, T, names[a], diff, kv_fmt_bytes((double)bytes.kv_bytes, b1, sizeof b1),
                        kv_fmt_bytes((double)bytes.score_bytes, b2, sizeof b2),
                        kv_fmt_bytes(all, b3, sizeof b3), sec);
            }
            if (!(diff < CH08_TOL))
                st = kv_fail(err, -1, "%s at n %d: max |diff| %.3g from naive (bound %.0e)",
                             names[a], n, diff, CH08_TOL);
        }
        kv_free(q);
        kv_free(ref);
        kv_free(out);
        kv_cache_free(&c);
    }
    if (!st && !ctx->csv) {
        fprintf(f, "\nPrefill: tiled never writes the [T][n] scores; its K/V bytes grow as T / 64\n"
                "(one pass over the keys per query tile, half of them skipped by causality).\n"
                "Decode: every algorithm reads the whole cache; flash changes how the work is cut,\n"
                "not how many K/V bytes a step must read. `kvlab bench attention` times longer\n"
                "contexts against the machine's read bandwidth");
        fputs(strcmp(ctx->device, "cpu") ? ", and the GPU versions with --device cuda.\n" : ".\n",
              f);
    }
    return st;
}
