/*
 * Chapter 06 demo: a sliding-window cache with attention sinks on the embedded models.
 *
 *  1. the ring: where each position of a stream is stored with W = 8 recent + S = 4 sink rows,
 *     and which position it overwrites (kv_window_row(), pure arithmetic; reference_cpu/cache/kv_window.h).
 *  2. the stream: 12,000 tokens decoded greedily on the tiny model through W = 128 + S = 4
 *     (fp16, StreamingLLM positions), then 3,000 tokens through a full cache beside it:
 *     KV bytes held, resident memory growth and tokens/s every 1,500 tokens (kv_stream_study(),
 *     shared with `kvlab stream`). The window's KV bytes stop at (S+W) rows; the full cache's
 *     grow with every token, and so does its time per token.
 *  3. needles through windows on the induction recall model (a constructed model): one needle
 *     in the sink region, one beyond the window, one inside it, under four caches; the
 *     prediction "kept iff the fact's value token is still visible to the question" printed
 *     beside the measurement. Checked: every needle comes out as predicted, or the tour fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_needle.h"
#include "kv_window.h"

/* Part 1: the ring of a W = 8, S = 4 cache over 24 positions. */
static void demo_ring(FILE *f, int csv)
{
    enum { W = 8, S = 4, N = 24 };
    if (csv) kv_csv_printf(f, "position,row,overwrites\n");
    else
        fprintf(f, "1. the ring: W = %d recent + S = %d sink rows; position p >= S goes to row "
                "S + (p - S) mod W,\n   overwriting p - W, which no later query can see. "
                "A slot never holds more than S + W = %d rows.\n\n   position:  ", W, S, S + W);
    for (int p = 0; p < N; p++) {
        const int64_t row = kv_window_row(W, S, p);
        const int over = p >= S + W ? p - W : -1;
        if (csv) kv_csv_printf(f, "%d,%lld,%d\n", p, (long long)row, over);
        else fprintf(f, "%3d", p);
    }
    if (csv) return;
    fprintf(f, "\n   row:       ");
    for (int p = 0; p < N; p++) fprintf(f, "%3lld", (long long)kv_window_row(W, S, p));
    fprintf(f, "\n   overwrites:");
    for (int p = 0; p < N; p++) {
        if (p >= S + W) fprintf(f, "%3d", p - W);
        else fprintf(f, "  -");
    }
    fprintf(f, "\n   the query at position %d sees %lld positions:", N - 1,
            (long long)kv_window_count(W, S, N - 1));
    for (int64_t i = 0; i < kv_window_count(W, S, N - 1); i++)
        fprintf(f, " %lld", (long long)kv_window_pos(W, S, N - 1, i));
    fprintf(f, "\n\n2. the stream (kvlab stream, shorter):\n");
}

/* Part 3: needles through windows on the induction recall model: one in the sink region, one
 * beyond the window, one inside it; the prediction (kept iff distance <= W - 1 or the value token
 * is a sink) printed beside what was measured. Returns -1 when a prediction fails. */
static int demo_needles(FILE *f, int csv, int quick, kv_err *err)
{
    /* quick: a 300-token haystack; the needle at 50 % is still ~150 > W tokens from its
     * question (lost without sinks), the one at 100 % still inside the window, the one at 0 %
     * still a sink: the same three cases, so the same predictions are checked */
    enum { MAX_LEN = 600, W = 128 };
    const int LEN = quick ? 300 : MAX_LEN;
    static const int depths[] = {0, 50, 100};
    static const struct { const char *name; int window, sinks, scheme; } vs[] = {
        {"full cache", 0, 0, KV_POS_ORIGINAL},
        {"window, original positions", W, 0, KV_POS_ORIGINAL},
        {"window + 4 sinks, original", W, 4, KV_POS_ORIGINAL},
        {"window + 4 sinks, cache pos", W, 4, KV_POS_CACHE},
    };
    kv_recall_opts o;
    kv_recall_opts_default(&o, KV_MODEL_RECALL_INDUCTION);
    kv_model m;
    int rc = kv_recall_build(&m, &o, err);
    if (rc) return rc;
    int tokens[MAX_LEN];
    kv_needle_item items[3];
    kv_needle_result res[3];
    rc = kv_needle_build(KV_MODEL_RECALL_INDUCTION, LEN, depths, 3, 61, tokens, items, err);
    if (csv) kv_csv_printf(f, "cache,needle_pos,distance,predicted,measured,margin\n");
    else
        fprintf(f, "\n3. needles on the induction recall model (a constructed model: kept iff the "
                "fact's value token\n   is still cached), %d-token haystack, W = %d, fp16:\n\n"
                "%-28s %6s %9s %10s %10s %8s\n", LEN, W, "cache", "needle", "distance",
                "predicted", "measured", "margin");
    int wrong = 0;
    for (int v = 0; v < 4 && !rc; v++) {
        kv_cache_spec sp = kv_cache_spec_default(1, LEN + 6);
        sp.quant.dtype = KV_QF_F16;
        sp.window.size = vs[v].window;
        sp.window.n_sinks = vs[v].sinks;
        sp.window.pos_scheme = vs[v].scheme;
        kv_backend *b = NULL;
        rc = kv_backend_cpu(&b, &m, &sp, err);
        if (!rc) rc = kv_needle_run(b, 0, KV_MODEL_RECALL_INDUCTION, tokens, LEN, items, 3, 0, res,
                                    NULL, NULL, 0, 0, err);
        for (int i = 0; i < 3 && !rc; i++) {
            /* the answer needs the fact's value token (one after the needle's position) */
            const int kept = vs[v].window == 0 ||
                             kv_window_visible(vs[v].window, vs[v].sinks,
                                               res[i].position + res[i].distance,
                                               res[i].position + 1);
            wrong += kept != res[i].pass;
            if (csv)
                kv_csv_printf(f, "%s,%d,%ld,%s,%s,%.3f\n", vs[v].name, res[i].position,
                              res[i].distance, kept ? "kept" : "lost",
                              res[i].pass ? "kept" : "lost", res[i].margin);
            else
                fprintf(f, "%-28s %6d %9ld %10s %10s %8.3f\n", vs[v].name, res[i].position,
                        res[i].distance, kept ? "kept" : "lost", res[i].pass ? "kept" : "lost",
                        res[i].margin);
        }
        kv_backend_destroy(b);
    }
    kv_model_free(&m);
    if (!rc && wrong)
        return kv_fail(err, -1, "%d needle(s) did not come out as predicted", wrong);
    return rc;
}

int kv_demo_ch06(const kv_demo_ctx *ctx, kv_err *err)
{
    if (strcmp(ctx->device, "cpu") && !ctx->csv)
        fprintf(ctx->out, "(this demo builds its caches on the CPU whatever --device says; "
                "the CUDA window kernels are\n checked against it by the GPU tests)\n\n");
    demo_ring(ctx->out, ctx->csv);
    kv_model m;
    int rc = kv_cli_default_model(&m, "tiny", err);
    if (rc) return rc;
    kv_cache_spec spec = kv_cache_spec_default(1, 1 << 20);
    spec.quant.dtype = KV_QF_F16;
    spec.window.size = 128;
    spec.window.n_sinks = KV_WINDOW_DEFAULT_SINKS;
    spec.window.pos_scheme = KV_POS_CACHE;
    /* quick: 1,200 tokens still pass the S + W = 132 rows many times over (the KV held stops
     * growing after the first report), and 300 tokens of the full cache still give 8 reports */
    if (ctx->quick) rc = kv_stream_study(ctx->out, ctx->csv, &m, &spec, 1200, 300, 150, err);
    else rc = kv_stream_study(ctx->out, ctx->csv, &m, &spec, 12000, 3000, 1500, err);
    kv_model_free(&m);
    if (!rc) rc = demo_needles(ctx->out, ctx->csv, ctx->quick, err);
    if (!rc && !ctx->csv)
        fprintf(ctx->out, "\nlonger: kvlab stream (1M tokens by default); kvlab calc --preset "
                "mistral-7b --window 4096\n(the window in the memory formula)\n");
    return rc;
}
