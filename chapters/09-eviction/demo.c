/*
 * Chapter 09 demo: who forgets the needle? (kv_retain.h, kv_needle.h)
 *
 * Both recall models, a 512-token haystack prefilled in steps of 64 with needles at depths
 * 0, 50 and 100 %, then each question in a step of its own, so every method has chosen
 * before the question arrives. Per model and method: which needles come back (with the logit
 * margin) and what the cache keeps: rows per (layer, KV head) and the bytes a compacted cache
 * would hold (kv_retain_bytes(); an exact cache of the same tokens for comparison).
 *
 * What to look for: l2-large keeps the facts (their keys have the largest norms in the
 * retrieval layer, by construction) and l2-small throws them out; h2o keeps the first
 * positions and the window, because nothing attends to a fact before its question; snapkv
 * keeps what the last filler rows voted for; quest and topk evict nothing and read few
 * positions, and quest on the induction model needs its first layers dense (the previous-token
 * head reads t-1, which a page-start row does not have).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_needle.h"
#include "kv_retain.h"

#define CH09_LEN 512
#define CH09_CHUNK 64
#define CH09_DEPTHS 3

int kv_demo_ch09(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    static const char *const variants[] = {"fp32",         "l2-large/b32/w8", "l2-small/b32/w8",
                                           "h2o/b32/w8",   "snapkv/b32/w8",   "quest/b32",
                                           "quest/b32/d2", "topk/b16"};
    const int n_var = (int)(sizeof variants / sizeof variants[0]);
    const int depths[CH09_DEPTHS] = {0, 50, 100};
    if (ctx->csv)
        fprintf(f, "model,cache,depth_pct,pass,margin,rows_kept,bytes_kept,bytes_exact\n");
    else
        fprintf(f, "haystack %d tokens in steps of %d, needles at 0/50/100 %%, each question a "
                   "step of its own\n%-9s %-16s %-27s %10s %12s\n", CH09_LEN, CH09_CHUNK,
                "model", "cache", "needle at 0% / 50% / 100%", "rows kept", "bytes kept");
    int rc = KV_OK;
    for (int k = 0; k < 2 && !rc; k++) {
        const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind);
        kv_model m;
        if ((rc = kv_recall_build(&m, &o, err))) break;
        int tokens[CH09_LEN];
        kv_needle_item items[CH09_DEPTHS];
        rc = kv_needle_build(kind, CH09_LEN, depths, CH09_DEPTHS, 9, tokens, items, err);
        for (int v = 0; v < n_var && !rc; v++) {
            kv_cache_spec cs;
            kv_backend *b = NULL;
            kv_needle_result res[CH09_DEPTHS];
            const int cap = CH09_LEN + 2 * CH09_DEPTHS;
            rc = kv_needle_cache_spec(variants[v], 1, cap, &cs, err);
            if (!rc) rc = kv_cli_backend(&b, ctx->device, &m, &cs, err);
            if (!rc)
                rc = kv_needle_run(b, 0, kind, tokens, CH09_LEN, items, CH09_DEPTHS, CH09_CHUNK,
                                   res, NULL, NULL, 0, 0, err);
            /* bytes: what the retention state keeps (CPU cache; "-" elsewhere), and the
             * exact cache's rows of the same tokens (kv_select_bytes_kept of every row) */
            const kv_cache *c = b && !rc ? kv_backend_cpu_cache(b) : NULL;
            kv_select_bytes kept = {0}, exact = {0};
            long long rows = -1, bytes = -1;
            if (!rc) rc = kv_select_bytes_kept(cs.dtype, kv_config_head_dim(&m.config), cap, &exact,
                                               err);
            if (!rc && c && c->retain && !(rc = kv_retain_bytes(c->retain, &cs, 0, &kept, err))) {
                rows = kept.rows / m.config.n_layers;
                bytes = kept.total;
            } else if (!rc && c) { /* no retention: every row, no index */
                rows = cap;
                bytes = (exact.total - exact.index_bytes) * m.config.n_layers;
            }
            for (int i = 0; i < CH09_DEPTHS && !rc; i++) {
                if (ctx->csv)
                    fprintf(f, "%s,%s,%d,%d,%.3f,%lld,%lld,%lld\n", kv_recall_kind_name(kind),
                            variants[v], depths[i], res[i].pass, res[i].margin, rows, bytes,
                            (long long)((exact.total - exact.index_bytes) * m.config.n_layers));
            }
            if (!rc && !ctx->csv) {
                char marks[64];
                int w = 0;
                for (int i = 0; i < CH09_DEPTHS; i++)
                    w += snprintf(marks + w, sizeof marks - (size_t)w, "%s%s %+5.1f",
                                  i ? " " : "", res[i].pass ? "yes" : " no", res[i].margin);
                fprintf(f, "%-9s %-16s %-27s %10lld %12lld\n", kv_recall_kind_name(kind),
                        variants[v], marks, rows, bytes);
            }
            kv_backend_destroy(b);
        }
        kv_model_free(&m);
    }
    if (!rc && !ctx->csv)
        fprintf(f, "rows kept: per layer and KV head; quest/topk keep every row and read few.\n"
                   "The grid with every method at two or three budgets: kvlab needle --spec "
                   "datasets/needle/ch09.txt\n");
    return rc;
}
