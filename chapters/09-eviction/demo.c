/*
 * Chapter 09 demo: who forgets the needle? (kv_retain.h, kv_needle.h)
 *
 * Both recall models, a 512-token haystack prefilled in steps of 64 with needles at depths
 * 0, 50 and 100 %, then each question in a step of its own, so every method has chosen
 * before the question arrives. Per model and method: which needles come back (with the logit
 * margin) and what the cache keeps: rows per (layer, KV head) and the bytes a compacted cache
 * would hold (kv_retain_bytes(); an exact cache of the same tokens for comparison), and the
 * share of rows attention read over the whole run (kv_retain_stats: rows_read / rows_full).
 * With --csv a second table follows: the positions each method keeps (or, for quest and topk,
 * the positions each question's query reads) in the direct model's retrieval layer, the data
 * of the figure ch09-kept-positions.svg (docs/figures.md).
 *
 * What to look for: l2-large keeps the facts (their keys have the largest norms in the
 * retrieval layer, by construction) and l2-small throws them out; h2o keeps the first
 * positions and the window, because nothing attends to a fact before its question; snapkv
 * keeps what the last filler rows voted for; quest and topk evict nothing and read few
 * positions, and quest on the induction model needs its first layers dense (the previous-token
 * head reads t-1, which a page-start row does not have). The read column is what quest and
 * topk save: they keep every row, yet each query reads about its budget.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_forward.h"
#include "kv_needle.h"
#include "kv_recall.h"
#include "kv_retain.h"

#define CH09_LEN 512
/* quick: 192 tokens, still three prefill steps of 64 and still several times every budget
 * (b32 + w8, topk 16), so every method still has to choose what to keep or read */
#define CH09_QUICK_LEN 192
#define CH09_CHUNK 64
#define CH09_DEPTHS 3

static const char *const ch09_variants[] = {"fp32",         "l2-large/b32/w8", "l2-small/b32/w8",
                                            "h2o/b32/w8",   "snapkv/b32/w8",   "quest/b32",
                                            "quest/b32/d2", "topk/b16"};

/* One row per position a method keeps (evicting methods: after the haystack, what every
 * question can read) or a question reads (quest, topk: kv_retain_reads() with the question's
 * own query), in the retrieval layer of the direct model, same haystack as the table. The
 * model is cut after its retrieval layer: the layers below are the same weights, so its
 * caches, kept sets and queries there are the full model's, and after the forward the state's
 * q buffer holds that layer's queries (RoPE applied). Answers are the planted values (the cut
 * model has no classifier worth reading). On the CPU whatever --device says: the positions are
 * the same on both (test_gpu_retain). CSV: kept,model,cache,layer,reader,position,needle */
static int ch09_kept_csv(FILE *f, int len, kv_err *err)
{
    const int kind = KV_MODEL_RECALL_DIRECT, depths[CH09_DEPTHS] = {0, 50, 100};
    kv_recall_opts o;
    kv_recall_opts_default(&o, kind);
    kv_model m;
    int rc = kv_recall_build(&m, &o, err);
    if (rc) return rc;
    int prev_layer, layer;
    kv_recall_layers(kind, m.config.n_layers, &prev_layer, &layer);
    kv_model cut = m; /* shallow: the same weights, fewer layers */
    cut.config.n_layers = layer + 1;
    kv_recall_vocab voc;
    kv_recall_vocab_get(&voc);
    int tokens[CH09_LEN];
    kv_needle_item items[CH09_DEPTHS];
    rc = kv_needle_build(kind, len, depths, CH09_DEPTHS, 9, tokens, items, err);
    int is_needle[CH09_LEN] = {0};
    for (int i = 0; i < CH09_DEPTHS && !rc; i++) {
        is_needle[items[i].pos] = 1;
        kv_csv_printf(f, "kept,%s,needles,%d,fact %d%%,%d,1\n", kv_recall_kind_name(kind), layer,
                      items[i].depth, items[i].pos);
    }
    const int n_var = (int)(sizeof ch09_variants / sizeof ch09_variants[0]);
    for (int v = 1; v < n_var && !rc; v++) {
        const char *name = ch09_variants[v];
        if (strstr(name, "/d")) continue; /* dense layers below: same retrieval layer as quest */
        kv_cache_spec cs;
        kv_cache c;
        kv_state s;
        kv_select_set reads = {0};
        const int cap = len + 2 * CH09_DEPTHS;
        if ((rc = kv_needle_cache_spec(name, 1, cap, &cs, err))) break;
        if ((rc = kv_retain_cache_create(&c, &cut.config, &cs, err))) break;
        kv_state_init(&s);
        for (int done = 0; done < len && !rc; done += CH09_CHUNK) {
            kv_seq q = {0, done, CH09_CHUNK, tokens + done};
            rc = kv_forward(&cut, &c, &s, &q, 1, NULL, NULL, err);
        }
        const kv_retain_head *h = rc ? NULL : kv_retain_at(c.retain, 0, layer, 0);
        const int evicts = kv_select_method_evicts(c.retain->method);
        for (int j = 0; h && evicts && j < h->kept.n; j++)
            kv_csv_printf(f, "kept,%s,%s,%d,kept,%d,%d\n", kv_recall_kind_name(kind), name, layer,
                          h->kept.pos[j], h->kept.pos[j] < len && is_needle[h->kept.pos[j]]);
        int pos = len;
        for (int i = 0; i < CH09_DEPTHS && !rc && !evicts; i++) {
            int qt[2];
            const int nq = kv_recall_question_tokens(&voc, kind, items[i].key, qt);
            kv_seq q = {0, pos, nq, qt};
            if ((rc = kv_forward(&cut, &c, &s, &q, 1, NULL, NULL, err))) break;
            /* the last question row's queries [G][d] of KV head 0 (H_kv = 1) */
            const float *qrow = s.q + (size_t)(nq - 1) * cut.config.n_heads * c.retain->head_dim;
            if ((rc = kv_retain_reads(c.retain, 0, layer, 0, pos + nq - 1, qrow, &reads, err)))
                break;
            for (int j = 0; j < reads.n; j++)
                fprintf(f, "kept,%s,%s,%d,question %d%%,%d,%d\n", kv_recall_kind_name(kind), name,
                        layer, items[i].depth, reads.pos[j],
                        reads.pos[j] < len && is_needle[reads.pos[j]]);
            pos += nq;
            int ans = voc.value0 + items[i].value;
            kv_seq a = {0, pos, 1, &ans};
            rc = kv_forward(&cut, &c, &s, &a, 1, NULL, NULL, err);
            pos += 1;
        }
        kv_select_set_free(&reads);
        kv_state_free(&s);
        kv_retain_cache_free(&c);
    }
    kv_model_free(&m);
    return rc;
}

int kv_demo_ch09(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    const char *const *variants = ch09_variants;
    const int n_var = (int)(sizeof ch09_variants / sizeof ch09_variants[0]);
    const int depths[CH09_DEPTHS] = {0, 50, 100};
    const int len = ctx->quick ? CH09_QUICK_LEN : CH09_LEN;
    if (ctx->csv)
        kv_csv_printf(f, "part,model,cache,depth_pct,pass,margin,rows_kept,bytes_kept,bytes_exact,"
                         "rows_read,rows_full\n");
    else
        fprintf(f, "haystack %d tokens in steps of %d, needles at 0/50/100 %%, each question a "
                   "step of its own\n%-9s %-16s %-27s %10s %12s %7s\n", len, CH09_CHUNK,
                "model", "cache", "needle at 0% / 50% / 100%", "rows kept", "bytes kept",
                "read");
    int rc = KV_OK;
    for (int k = 0; k < 2 && !rc; k++) {
        const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind);
        kv_model m;
        if ((rc = kv_recall_build(&m, &o, err))) break;
        int tokens[CH09_LEN];
        kv_needle_item items[CH09_DEPTHS];
        rc = kv_needle_build(kind, len, depths, CH09_DEPTHS, 9, tokens, items, err);
        for (int v = 0; v < n_var && !rc; v++) {
            kv_cache_spec cs;
            kv_backend *b = NULL;
            kv_needle_result res[CH09_DEPTHS];
            const int cap = len + 2 * CH09_DEPTHS;
            rc = kv_needle_cache_spec(variants[v], 1, cap, &cs, err);
            if (!rc) rc = kv_cli_backend(&b, ctx->device, &m, &cs, err);
            if (!rc)
                rc = kv_needle_run(b, 0, kind, tokens, len, items, CH09_DEPTHS, CH09_CHUNK,
                                   res, NULL, NULL, 0, 0, err);
            /* bytes: what the retention state keeps (CPU cache; "-" elsewhere), and the
             * exact cache's rows of the same tokens (kv_select_bytes_kept of every row) */
            const kv_cache *c = b && !rc ? kv_backend_cpu_cache(b) : NULL;
            kv_select_bytes kept = {0}, exact = {0};
            long long rows = -1, bytes = -1, rows_read = -1, rows_full = -1;
            if (!rc) rc = kv_select_bytes_kept(cs.quant.dtype, kv_config_head_dim(&m.config), cap, &exact,
                                               err);
            if (!rc && c && c->retain && !(rc = kv_retain_bytes(c->retain, &cs, 0, &kept, err))) {
                rows = kept.rows / m.config.n_layers;
                bytes = kept.total;
                rows_read = c->retain->stats[0].rows_read;
                rows_full = c->retain->stats[0].rows_full;
            } else if (!rc && c) { /* no retention: every row, no index */
                rows = cap;
                bytes = (exact.total - exact.index_bytes) * m.config.n_layers;
            }
            for (int i = 0; i < CH09_DEPTHS && !rc; i++) {
                if (ctx->csv)
                    kv_csv_printf(
                        f, "needle,%s,%s,%d,%d,%.3f,%lld,%lld,%lld,%lld,%lld\n",
                        kv_recall_kind_name(kind), variants[v], depths[i], res[i].pass,
                        res[i].margin, rows, bytes,
                        (long long)((exact.total - exact.index_bytes) * m.config.n_layers),
                        rows_read, rows_full);
            }
            if (!rc && !ctx->csv) {
                char marks[64];
                int w = 0;
                for (int i = 0; i < CH09_DEPTHS; i++)
                    w += snprintf(marks + w, sizeof marks - (size_t)w, "%s%s %+5.1f",
                                  i ? " " : "", res[i].pass ? "yes" : " no", res[i].margin);
                char read[16] = "100 %"; /* no retention: every row <= p */
                if (rows_full > 0)
                    snprintf(read, sizeof read, "%.1f %%",
                             100.0 * (double)rows_read / (double)rows_full);
                else if (!c)
                    snprintf(read, sizeof read, "-");
                fprintf(f, "%-9s %-16s %-27s %10lld %12lld %7s\n", kv_recall_kind_name(kind),
                        variants[v], marks, rows, bytes, read);
            }
            kv_backend_destroy(b);
        }
        kv_model_free(&m);
    }
    if (!rc && ctx->csv) {
        fprintf(f, "part,model,cache,layer,reader,position,needle\n");
        rc = ch09_kept_csv(f, len, err);
    }
    if (!rc && !ctx->csv)
        fprintf(f, "rows kept: per layer and KV head; read: rows attention read over the whole "
                   "run (prefill and questions) / rows a full cache would read.\n"
                   "quest/topk keep every row and read few.\n"
                   "The grid with every method at two or three budgets: kvlab needle --spec "
                   "datasets/needle/ch09.txt\n");
    return rc;
}
