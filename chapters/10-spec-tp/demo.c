/*
 * Chapter 10 demo: speculative decoding and what it does to the KV cache (kv_spec.h).
 *
 * Part 1: the embedded small model (6 layers) is the target, its first layer the draft
 * (kv_model_layer_prefix); plain greedy decoding runs first (row -, k = 0 in the CSV). For k = 1, 2, 4, 8 kv_spec_generate() emits the same 48 tokens as
 * plain greedy decoding (checked) in fewer target steps, and its counters say how many K/V
 * bytes each cache wrote and rolled back. The prediction, checked for every row: the target
 * writes one token's K/V (L · 2 · H_kv · d · 4 bytes) for every token it ever cached, that is
 * prompt + emitted − 1 kept plus one per rejected draft, and rolls back exactly the rejected.
 *
 * Part 2: one round traced on a paged target (blocks of 8 tokens): the verification step
 * appends the pending token and all k = 8 drafts to the cache, taking blocks from the pool;
 * the rollback gives back every block that held only rejected tokens.
 *
 * Part 3: tensor-parallel heads (kv_tp.h) on tiny-gqa (H 4, H_kv 2), p = 1, 2, 4 CPU ranks
 * (threads): each rank's cache holds H_kv / p KV heads (one, replicated, at p = 4 > H_kv), every
 * step all-reduces 2 · L times, rank 0 reads 2 (p - 1)/p · T · dim · 4 bytes per all-reduce
 * (checked against the counters), and the greedy tokens equal p = 1's (checked).
 *
 * On the CUDA emulation build (every GPU thread a fiber on the CPU) a step of the small model
 * takes about a second, so there the demo runs the tiny model (2 layers), same checks; so does
 * tour --quick.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_generate.h"
#include "kv_sampler.h"
#include "kv_spec.h"
#include "kv_tp.h"
#include "measure.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#define CH10_PROMPT 16
#define CH10_TOKENS 48
#define CH10_TRACE_PROMPT 20 /* part 2: prompt tokens; 19 cached before the round */
#define CH10_TRACE_K 8
#define CH10_BLOCK 8

/* Part 1: one row per k. */
static int ch10_rows(const kv_demo_ctx *ctx, const char *name, const kv_model *m,
                     const kv_model *dm, kv_err *err)
{
    FILE *f = ctx->out;
    const int ks[] = {1, 2, 4, 8};
    int prompt[CH10_PROMPT], want[CH10_TOKENS], got[CH10_TOKENS];
    kv_demo_prompt(prompt, CH10_PROMPT, m->config.vocab_size);
    kv_cache_spec spec = kv_cache_spec_default(1, CH10_PROMPT + CH10_TOKENS);
    kv_backend *t = NULL, *d = NULL;
    int st = kv_cli_backend(&t, ctx->device, m, &spec, err);
    if (!st) st = kv_cli_backend(&d, ctx->device, dm, &spec, err);
    const kv_gen_opts go = {KV_MODE_CACHED, 0, CH10_TOKENS, NULL, NULL, NULL, NULL};
    const double p0 = kv_now();
    if (!st) st = kv_generate(t, prompt, CH10_PROMPT, &go, want, NULL, err);
    const double plain_sec = kv_now() - p0; /* one target step per token */
    /* bytes of one cached token, fp32: L · 2 · H_kv · d · 4 */
    const kv_config *c = &m->config;
    const double tok = (double)c->n_layers * 2 * c->n_kv_heads * kv_config_head_dim(c) * 4;
    if (!st) {
        if (ctx->csv)
            kv_csv_printf(f,
                          "k,target_steps,plain_steps,tokens_per_step,acceptance,"
                          "target_kv_written,target_kv_rolled_back,draft_kv_written,"
                          "draft_kv_rolled_back,seconds\n0,%d,%d,1.000,,%.0f,0,,,%.4f\n",
                          CH10_TOKENS, CH10_TOKENS, (CH10_PROMPT + CH10_TOKENS - 1) * tok,
                          plain_sec);
        else {
            fprintf(f, "target: %s (%d layers, dim %d, vocab %d); draft: its first layer; "
                    "prompt %d, %d tokens, greedy\none cached target token = %d * 2 * %d * %d * "
                    "4 = %.0f bytes\n\n", name, c->n_layers, c->dim, c->vocab_size, CH10_PROMPT,
                    CH10_TOKENS, c->n_layers, c->n_kv_heads, kv_config_head_dim(c), tok);
            fprintf(f, "%2s %7s %6s %9s %7s %11s %11s %10s %11s %9s\n", "k", "target", "plain",
                    "tok/step", "accept", "target KV", "rolled back", "draft KV", "rolled back",
                    "time (s)");
            char b[32];
            fprintf(f, "%2s %7d %6d %9.2f %7s %11s %11s %10s %11s %9.3f\n", "-", CH10_TOKENS,
                    CH10_TOKENS, 1.0, "-", kv_fmt_bytes((CH10_PROMPT + CH10_TOKENS - 1) * tok, b,
                    sizeof b), "0 B", "-", "-", plain_sec);
        }
    }
    for (int i = 0; i < 4 && !st; i++) {
        const kv_spec_opts o = {ks[i], CH10_TOKENS, 0, 0.0f, 1};
        kv_spec_stats s;
        const double t0 = kv_now();
        st = kv_spec_generate(t, d, prompt, CH10_PROMPT, &o, got, &s, err);
        const double sec = kv_now() - t0;
        if (st) break;
        if (memcmp(got, want, sizeof want))
            st = kv_fail(err, -1, "k = %d: speculative tokens differ from greedy", ks[i]);
        const double rejected = (double)(s.drafted - s.accepted);
        if (!st && (s.target_kv_written != (CH10_PROMPT + CH10_TOKENS - 1 + rejected) * tok ||
                    s.target_kv_rolled_back != rejected * tok))
            st = kv_fail(err, -1, "k = %d: target wrote %.0f, rolled back %.0f bytes; predicted "
                         "%.0f and %.0f", ks[i], s.target_kv_written, s.target_kv_rolled_back,
                         (CH10_PROMPT + CH10_TOKENS - 1 + rejected) * tok, rejected * tok);
        if (st) break;
        const double tps = (double)s.emitted / (double)s.target_steps;
        if (ctx->csv) {
            kv_csv_printf(f, "%d,%lld,%d,%.3f,%.4f,%.0f,%.0f,%.0f,%.0f,%.4f\n", ks[i],
                          (long long)s.target_steps, CH10_TOKENS, tps, kv_spec_acceptance(&s),
                          s.target_kv_written, s.target_kv_rolled_back, s.draft_kv_written,
                          s.draft_kv_rolled_back, sec);
        } else {
            char b[4][32];
            fprintf(f, "%2d %7lld %6d %9.2f %6.1f%% %11s %11s %10s %11s %9.3f\n", ks[i],
                    (long long)s.target_steps, CH10_TOKENS, tps, 100.0 * kv_spec_acceptance(&s),
                    kv_fmt_bytes(s.target_kv_written, b[0], sizeof b[0]),
                    kv_fmt_bytes(s.target_kv_rolled_back, b[1], sizeof b[1]),
                    kv_fmt_bytes(s.draft_kv_written, b[2], sizeof b[2]),
                    kv_fmt_bytes(s.draft_kv_rolled_back, b[3], sizeof b[3]), sec);
        }
    }
    if (!st && !ctx->csv) {
        char b[32];
        fprintf(f, "\nEvery row emitted the tokens of plain greedy decoding (checked), which writes "
                "%s of target K/V\n(row -, timed once like the others).\nWritten = (prompt + emitted - 1 + rejected drafts) x %.0f "
                "bytes, rolled back = rejected x %.0f: checked.\n",
                kv_fmt_bytes((CH10_PROMPT + CH10_TOKENS - 1) * tok, b, sizeof b), tok, tok);
    }
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    return st;
}

/* Part 2: one row of the trace. */
static void ch10_trace_row(FILE *f, int csv, const char *stage, kv_backend *t)
{
    const kv_pool *p = &t->mem->paged->pool;
    const int len = t->length(t, 0);
    if (csv)
        kv_csv_printf(f, "%s,%d,%d,%d\n", stage, len, t->mem->paged->tables[0].n_blocks, p->n_free);
    else
        fprintf(f, "  %-34s %7d %12d %10d\n", stage, len, t->mem->paged->tables[0].n_blocks,
                p->n_free);
}

static int ch10_trace(const kv_demo_ctx *ctx, const kv_model *m, const kv_model *dm,
                      kv_err *err)
{
    FILE *f = ctx->out;
    const int V = m->config.vocab_size, n = CH10_TRACE_PROMPT, K = CH10_TRACE_K;
    int ctxt[CH10_TRACE_PROMPT + CH10_TRACE_K];   /* prompt, then the drafts */
    kv_demo_prompt(ctxt, n, V);
    kv_cache_spec ts = kv_cache_spec_default(1, 64), ds = ts;
    ts.layout.kind = KV_LAYOUT_PAGED;
    ts.layout.block_size = CH10_BLOCK;
    ts.layout.n_blocks = 64 / CH10_BLOCK;
    float *dl = malloc(sizeof(float) * V);               /* [V] draft logits */
    float *tl = malloc(sizeof(float) * (size_t)(K + 1) * V); /* [K+1][V] target, every row */
    kv_backend *t = NULL, *d = NULL;
    int st = !dl || !tl ? kv_fail(err, KV_ERR_NOMEM, "chapter 10 demo: logits") : KV_OK;
    if (!st) st = kv_cli_backend(&t, ctx->device, m, &ts, err);
    if (!st) st = kv_cli_backend(&d, ctx->device, dm, &ds, err);
    if (st) goto done;
    if (ctx->csv) kv_csv_printf(f, "\nstage,target_cached_tokens,blocks_held,pool_free_blocks\n");
    else
        fprintf(f, "\none round on a paged target (blocks of %d tokens, pool of %d), k = %d:\n"
                "  %-34s %7s %12s %10s\n", CH10_BLOCK, ts.layout.n_blocks, K, "stage", "cached",
                "blocks held", "pool free");
    /* the prompt minus its last token is cached; the last is processed by the round */
    const kv_seq pre = {0, 0, n - 1, ctxt};
    st = t->forward(t, &pre, 1, NULL, NULL, err);
    if (st) goto done;
    ch10_trace_row(f, ctx->csv, "prompt cached (last token pending)", t);
    for (int j = 0; j < K && !st; j++) { /* the draft proposes, greedily */
        const int dlen = d->length(d, 0);
        const kv_seq s = {0, dlen, n + j - dlen, ctxt + dlen};
        st = d->forward(d, &s, 1, dl, NULL, err);
        ctxt[n + j] = kv_argmax(dl, V);
    }
    const kv_seq ver = {0, n - 1, K + 1, ctxt + n - 1, tl};
    if (!st) st = t->forward(t, &ver, 1, NULL, NULL, err);
    if (st) goto done;
    ch10_trace_row(f, ctx->csv, "verification step wrote 1 + k", t);
    int acc = 0;
    while (acc < K && kv_argmax(tl + (size_t)acc * V, V) == ctxt[n + acc]) acc++;
    /* keep the context minus the target's own token */
    st = t->rollback->truncate(t, 0, n + acc, err);
    if (st) goto done;
    char stage[64];
    snprintf(stage, sizeof stage, "rolled back to %d accepted", acc);
    ch10_trace_row(f, ctx->csv, stage, t);
    /* the pool's books: what the table holds is exactly what the cached tokens need */
    const int need = (n + acc + CH10_BLOCK - 1) / CH10_BLOCK;
    if (t->mem->paged->tables[0].n_blocks != need ||
        t->mem->paged->pool.n_free != ts.layout.n_blocks - need)
        st = kv_fail(err, -1, "after rollback the table holds %d blocks, %d free; expected %d",
                     t->mem->paged->tables[0].n_blocks, t->mem->paged->pool.n_free, need);
    if (!st && !ctx->csv)
        fprintf(f, "\nThe verification step cached all %d drafts; the rollback (kv_paged_truncate) "
                "returned the blocks that held only rejected tokens.\n", K);
done:
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    free(dl);
    free(tl);
    return st;
}

/* Part 3: the same prompt and tokens on p = 1, 2, 4 ranks. */
static int ch10_tp(const kv_demo_ctx *ctx, kv_err *err)
{
    FILE *f = ctx->out;
    enum { PROMPT = 16, TOKENS = 16 };
    const int ps[] = {1, 2, 4};
    kv_model m;
    int st = kv_cli_default_model(&m, "tiny-gqa", err);
    if (st) return st;
    const kv_config *c = &m.config;
    const int L = c->n_layers, d = kv_config_head_dim(c);
    int prompt[PROMPT], want[TOKENS], got[TOKENS];
    kv_demo_prompt(prompt, PROMPT, c->vocab_size);
    const kv_cache_spec spec = kv_cache_spec_default(1, PROMPT + TOKENS);
    const kv_gen_opts go = {KV_MODE_CACHED, 0, TOKENS, NULL, NULL, NULL, NULL};
    if (ctx->csv)
        kv_csv_printf(f,
                      "\np,kv_heads_of_ranks,cache_bytes_per_rank,cache_bytes_all_ranks,"
                      "all_reduces_per_step,rank0_bytes_read,rank0_bytes_predicted,same_tokens\n");
    else
        fprintf(f, "\ntensor-parallel heads on CPU ranks (threads): tiny-gqa (L %d, H %d, H_kv %d, "
                "d %d, dim %d), fp32,\nprompt %d, %d tokens greedy; a cache of %d tokens per "
                "rank\n  %2s  %-12s %12s %12s %13s %14s %8s\n", L, c->n_heads, c->n_kv_heads,
                d, c->dim, PROMPT, TOKENS, PROMPT + TOKENS, "p", "KV heads", "cache/rank",
                "all ranks", "all-red./step", "rank 0 read", "= p 1");
    for (int i = 0; i < 3 && !st; i++) {
        const int p = ps[i];
        kv_backend *b = NULL;
        st = kv_tp_backend(&b, &m, p, &spec, err);
        if (!st) st = kv_generate(b, prompt, PROMPT, &go, i ? got : want, NULL, err);
        if (st) {
            kv_backend_destroy(b);
            break;
        }
        const kv_tp *tp = kv_tp_of_backend(b);
        const kv_tp_stats *ts = kv_tp_get_stats(tp);
        char heads[64] = "";
        size_t used = 0;
        double all = 0.0;
        for (int r = 0; r < p; r++) {
            const kv_shard *sh = kv_tp_shard(tp, r);
            used += (size_t)snprintf(heads + used, sizeof heads - used, "%s%d", r ? " " : "",
                                     sh->kv_head0);
            all += (double)kv_cache_bytes(kv_tp_cache(tp, r));
        }
        const double rank = (double)kv_cache_bytes(kv_tp_cache(tp, 0));
        const int kvr = p <= c->n_kv_heads ? c->n_kv_heads / p : 1;
        /* one prefill of PROMPT tokens, then TOKENS - 1 one-token steps; 2 L all-reduces each */
        const double pred = 2.0 * L * (kv_tp_ring_bytes(p, (double)PROMPT * c->dim) +
                                       (TOKENS - 1) * kv_tp_ring_bytes(p, c->dim));
        const int same = !i || !memcmp(got, want, sizeof want);
        if (ctx->csv) {
            kv_csv_printf(f, "%d,%s,%.0f,%.0f,%.2f,%.0f,%.0f,%s\n", p, heads, rank, all,
                          (double)ts->all_reduces / (double)ts->steps, ts->rank_bytes[0], pred,
                          same ? "yes" : "no");
        } else {
            char b1[32], b2[32], b3[32];
            fprintf(f, "  %2d  %-12s %12s %12s %13.0f %14s %8s\n", p, heads,
                    kv_fmt_bytes(rank, b1, sizeof b1), kv_fmt_bytes(all, b2, sizeof b2),
                    (double)ts->all_reduces / (double)ts->steps,
                    kv_fmt_bytes(ts->rank_bytes[0], b3, sizeof b3), same ? "yes" : "NO");
        }
        if (!same)
            st = kv_fail(err, -1, "tensor parallel p = %d: other greedy tokens than p = 1", p);
        else if (rank != (double)L * 2 * (PROMPT + TOKENS) * kvr * d * 4 ||
                 ts->all_reduces != 2LL * L * ts->steps || ts->rank_bytes[0] != pred)
            st = kv_fail(err, -1, "tensor parallel p = %d: cache %.0f B/rank, %lld all-reduces in "
                         "%lld steps, rank 0 read %.0f B (predicted %.0f)", p, rank,
                         (long long)ts->all_reduces, (long long)ts->steps, ts->rank_bytes[0],
                         pred);
        kv_backend_destroy(b);
    }
    if (!st && !ctx->csv)
        fprintf(f, "\nKV heads: the first KV head of each rank, rank 0 first. At p = 4 > H_kv = 2 "
                "each KV head is\ncached on two ranks. The all-reduces, 2 per layer (after "
                "attention, after the MLP), and rank 0's\nbytes equal the ring formula "
                "2 (p-1)/p * T * dim * 4 summed over the steps: checked.\n");
    kv_model_free(&m);
    return st;
}

int kv_demo_ch10(const kv_demo_ctx *ctx, kv_err *err)
{
    kv_model m, dm;
    int emulated = 0;
#ifdef KV_HAVE_CUDA
    emulated = strcmp(ctx->device, "cpu") != 0 && kvcu_is_emulation();
#endif
    /* quick: the tiny model too (the same code paths, a third of the layers) */
    const char *name = emulated || ctx->quick ? "tiny" : "small";
    int st = kv_cli_default_model(&m, name, err);
    if (st) return st;
    st = kv_model_layer_prefix(&dm, &m, 1, err);
    dm.data = m.data; /* the view aliases m's weight block, which a CUDA backend uploads */
    dm.n_floats = m.n_floats;
    if (!st) st = ch10_rows(ctx, name, &m, &dm, err);
    if (!st) st = ch10_trace(ctx, &m, &dm, err);
    if (!st) st = ch10_tp(ctx, err);
    kv_model_free(&m);
    return st;
}
