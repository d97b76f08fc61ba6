/*
 * Chapter 05 demo: a paged KV cache on the embedded tiny model.
 *
 *  1. a block table grows: two sequences decode side by side in a pool of B = 4 blocks; one
 *     finishes and its blocks go back to the pool; the other's table, and the slot
 *     block*B + offset of every position, printed as they happen. Checked: the logits equal
 *     those of a contiguous cache, bit for bit.
 *  2. memory: the first requests of the Alpaca-like trace decoded together; KV bytes reserved
 *     at every step by three contiguous policies (Max, Pow2, Oracle) and by paging at
 *     B = 8 / 16 / 32, from the pool's counters and kv_cache_bytes(). Checked: a paged
 *     sequence never holds more than B - 1 unused slots.
 *  3. sharing: one prompt forked into 4 sampled continuations; refcounts, copy-on-write, blocks
 *     used vs 4 unshared copies. Checked: every sample equals its solo run on a contiguous cache.
 *  4. prefix caching: two requests after one 80-token system prompt; blocks hit, prefill saved.
 *     Checked: the second request's logits equal a run without the prefix cache.
 * Parts 3 and 4 are in demo_sharing.c; demo.h holds what the two files share.
 * The numbers of 2-4 depend on lengths and token ids only, not on what the weights compute;
 * the checks hold for any model.
 */
#include "demo.h"
#include "kv_sampler.h"
#include "kv_trace.h"

/* ---- 1. a block table grows ------------------------------------------------------------ */

static int part_walk(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err)
{
    enum { B = 4, NB = 8, CAP = 64, P0 = 6, P1 = 5, LEN0 = 20, GEN1 = 4 };
    FILE *f = ctx->out;
    const int V = m->config.vocab_size;
    kv_cache_spec ps = paged_spec(2, CAP, B, NB), cs = kv_cache_spec_default(2, CAP);
    kv_backend *pb = NULL, *cb = NULL;
    const char *dev;
    int tok[2][CAP];
    float *lp = malloc(sizeof(float) * 2 * V), *lc = malloc(sizeof(float) * 2 * V);
    int st = (!lp || !lc) ? kv_fail(err, KV_ERR_NOMEM, "demo: logits") : KV_OK;
    if (!st) st = paged_backend(ctx, m, &ps, 0, &pb, &dev, err);
    if (!st) st = kv_cli_backend(&cb, dev, m, &cs, err);
    if (st) goto done;
    seeded_tokens(tok[0], P0, V, 51);
    seeded_tokens(tok[1], P1, V, 52);
    if (!ctx->csv) {
        fprintf(f, "1. A block table grows (tiny model, B = %d tokens per block, a pool of %d "
                "blocks, device %s)\n", B, NB, dev);
        fprintf(f, "   sequence 0: %d-token prompt, decoded to %d tokens; sequence 1: %d-token "
                "prompt, %d tokens, then it finishes.\n", P0, LEN0, P1, GEN1);
        fprintf(f, "   Each row is one position of sequence 0: its logical block pos/B, offset "
                "pos%%B, the physical block\n   its table maps that to, and the slot written = "
                "block*B + offset.\n\n");
        fprintf(f, "   step  pos  logical  offset  physical  slot   table of seq 0   pool used/free  event\n");
    } else {
        kv_csv_printf(f,
                      "part,step,pos,logical_block,offset,physical_block,slot,table,used,free\n");
    }
    const kv_paged *pg = pb->mem->paged;
    int len[2] = {0, 0}, n_in[2] = {P0, P1}, live1 = 1, identical = 1;
    for (int step = 0; len[0] < LEN0 && !st; step++) {
        kv_seq q[2];
        int n = 0;
        q[n++] = (kv_seq){0, len[0], n_in[0], tok[0] + len[0]};
        if (live1) q[n++] = (kv_seq){1, len[1], n_in[1], tok[1] + len[1]};
        st = pb->forward(pb, q, n, lp, NULL, err);
        if (!st) st = cb->forward(cb, q, n, lc, NULL, err);
        if (st) break;
        identical &= memcmp(lp, lc, sizeof(float) * n * V) == 0;
        char event[96] = "";
        for (int i = 0; i < n; i++) { /* greedy: the next input is the argmax */
            const int s = q[i].slot;
            len[s] += q[i].n_tokens;
            tok[s][len[s]] = kv_argmax(lp + (size_t)i * V, V);
            n_in[s] = 1;
        }
        if (live1 && len[1] >= P1 + GEN1) { /* sequence 1 is done: its blocks go back */
            const kv_block_table *t1 = &pg->tables[1];
            int w = snprintf(event, sizeof event, "seq 1 done, frees ");
            for (int i = 0; i < t1->n_blocks && w < (int)sizeof event; i++)
                w += snprintf(event + w, sizeof event - w, i ? ",%d" : "%d", t1->blocks[i]);
            pb->reset(pb, 1);
            cb->reset(cb, 1);
            live1 = 0;
        }
        const kv_block_table *t0 = &pg->tables[0];
        for (int pos = q[0].pos; pos < len[0]; pos++) {
            const int64_t slot = kv_block_table_slot(t0, pos);
            const int blk = t0->blocks[pos / B];
            if (slot != (int64_t)blk * B + pos % B) { /* the mapping the cache rows use */
                st = kv_fail(err, -1, "slot of position %d is %lld, not block %d * %d + %d", pos,
                             (long long)slot, blk, B, pos % B);
                break;
            }
            char ev[128];
            snprintf(ev, sizeof ev, "%s%s%s", pos % B == 0 ? "new block" : "",
                     pos % B == 0 && pos == len[0] - 1 && event[0] ? "; " : "",
                     pos == len[0] - 1 ? event : "");
            if (ctx->csv) {
                kv_csv_printf(f, "1,%d,%d,%d,%d,%d,%lld,", step, pos, pos / B, pos % B, blk,
                              (long long)slot);
                print_table(f, t0, ' ');
                kv_csv_printf(f, ",%d,%d\n", pg->pool.n_used, kv_pool_available(&pg->pool));
            } else {
                char tb[64];
                int w = snprintf(tb, sizeof tb, "[");
                for (int i = 0; i < t0->n_blocks && w < (int)sizeof tb; i++)
                    w += snprintf(tb + w, sizeof tb - w, i ? " %d" : "%d", t0->blocks[i]);
                snprintf(tb + w, sizeof tb - w, "]");
                char line[320];
                snprintf(line, sizeof line, "   %4d %4d %8d %7d %9d %5lld   %-16s %6d/%-7d  %s",
                         step, pos, pos / B, pos % B, blk, (long long)slot, tb, pg->pool.n_used,
                         kv_pool_available(&pg->pool), ev);
                for (size_t e = strlen(line); e > 0 && line[e - 1] == ' '; e--) /* no trailing blanks */
                    line[e - 1] = 0;
                fprintf(f, "%s\n", line);
            }
        }
    }
    if (!st && !ctx->csv)
        fprintf(f, "\n   Blocks come off a free stack (last freed, first reused), so sequence 0's "
                "table is not in order:\n   its next block after sequence 1 finished is one "
                "sequence 1 just gave back. Logits of every step\n   vs the same steps on a "
                "contiguous cache: identical: %s\n\n", identical ? "yes" : "no");
    if (!st && !identical)
        st = kv_fail(err, -1, "paged and contiguous caches gave different logits (part 1)");
done:
    kv_backend_destroy(pb);
    kv_backend_destroy(cb);
    free(lp);
    free(lc);
    return st;
}

/* ---- 2. memory: contiguous reservations vs paging -------------------------------------- */

enum { POL_MAX, POL_POW2, POL_ORACLE, N_POL };
static const char *const pol_name[N_POL] = {"contiguous Max", "contiguous Pow2", "contiguous Oracle"};
static const char *const pol_csv[N_POL] = {"max", "pow2", "oracle"};

static int next_pow2(int x)
{
    int p = 1;
    while (p < x) p *= 2;
    return p;
}

/* Bytes a contiguous cache of @p capacity tokens holds for one sequence (kv_cache_bytes). */
static int contiguous_bytes(const kv_config *cfg, int capacity, double *out, kv_err *err)
{
    kv_cache c;
    kv_cache_spec s = kv_cache_spec_default(1, capacity);
    int st = kv_cache_create(&c, cfg, &s, err);
    if (st) return st;
    *out = (double)kv_cache_bytes(&c);
    kv_cache_free(&c);
    return KV_OK;
}

#define CH05_MAX_STEPS 1024 /* steps of part 2 kept for the CSV timeline (a request's output + 1) */

typedef struct {
    double peak_reserved, peak_held; /* bytes, at the step the reservation peaks */
    double sum_reserved, sum_held;   /* bytes summed over steps: time-averaged waste */
    double reserved[CH05_MAX_STEPS], held[CH05_MAX_STEPS]; /* [n] bytes at each step */
    int n;
} mem_row;

static void mem_add(mem_row *r, double reserved, double held)
{
    if (r->n < CH05_MAX_STEPS) {
        r->reserved[r->n] = reserved;
        r->held[r->n] = held;
        r->n++;
    }
    if (reserved > r->peak_reserved) {
        r->peak_reserved = reserved;
        r->peak_held = held;
    }
    r->sum_reserved += reserved;
    r->sum_held += held;
}

/* Decode the requests together on a paged backend of blocks of B tokens; fill row (paged) and,
 * when @p contig is not NULL, the contiguous policies' rows over the same steps. */
static int mem_run(const kv_demo_ctx *ctx, const kv_model *m, const kv_request *rq, int nr,
                   const int *const *prompts, int B, mem_row *paged, mem_row *contig,
                   const double (*res_bytes)[N_POL], double token_bytes, const char **dev,
                   kv_err *err)
{
    const kv_config *cfg = &m->config;
    const int V = cfg->vocab_size;
    int n_blocks = 1, total[CH05_REQUESTS], len[CH05_REQUESTS] = {0}, live[CH05_REQUESTS];
    int *tok[CH05_REQUESTS] = {0};
    for (int i = 0; i < nr; i++) {
        total[i] = rq[i].prompt_len + rq[i].output_len;
        n_blocks += (total[i] + B - 1) / B; /* room for every request at once */
        live[i] = 1;
    }
    kv_cache_spec spec = paged_spec(nr, cfg->seq_len, B, n_blocks);
    kv_backend *b = NULL;
    kv_cache probe;
    memset(&probe, 0, sizeof probe);
    float *lg = malloc(sizeof(float) * nr * V);
    kv_seq *q = malloc(sizeof(kv_seq) * nr);
    int st = (!lg || !q) ? kv_fail(err, KV_ERR_NOMEM, "demo: memory") : KV_OK;
    for (int i = 0; i < nr && !st; i++) {
        tok[i] = malloc(sizeof(int) * (total[i] + 1));
        if (!tok[i]) st = kv_fail(err, KV_ERR_NOMEM, "demo: tokens");
        else memcpy(tok[i], prompts[i], sizeof(int) * rq[i].prompt_len);
    }
    /* bytes of one block: the paged cache's own kv_cache_bytes() over its N blocks */
    if (!st) st = kv_cache_create(&probe, cfg, &spec, err);
    const double block_bytes = st ? 0 : (double)kv_cache_bytes(&probe) / n_blocks;
    if (!st && block_bytes != (double)kv_pool_block_bytes(cfg, B, kv_token_bytes_fp32, NULL))
        st = kv_fail(err, -1, "block bytes %.0f from kv_cache_bytes differ from "
                     "kv_pool_block_bytes %zu", block_bytes,
                     kv_pool_block_bytes(cfg, B, kv_token_bytes_fp32, NULL));
    kv_cache_free(&probe);
    if (!st) st = paged_backend(ctx, m, &spec, 0, &b, dev, err);
    for (int n_live = nr; n_live > 0 && !st;) {
        int n = 0;
        for (int i = 0; i < nr; i++)
            if (live[i]) /* prefill the whole prompt, then one token per step */
                q[n++] = (kv_seq){i, len[i], len[i] ? 1 : rq[i].prompt_len, tok[i] + len[i]};
        st = b->forward(b, q, n, lg, NULL, err);
        if (st) break;
        double held = 0, reserved[N_POL] = {0};
        int64_t blocks_needed = 0;
        for (int k = 0; k < n; k++) {
            const int i = q[k].slot;
            len[i] += q[k].n_tokens;
            tok[i][len[i]] = kv_argmax(lg + (size_t)k * V, V);
            held += len[i] * token_bytes;
            for (int p = 0; p < N_POL; p++) reserved[p] += res_bytes[i][p];
            blocks_needed += (len[i] + B - 1) / B;
            /* internal waste of a paged sequence: at most B - 1 slots, all in its last block */
            if (kv_block_table_unused_slots(&b->mem->paged->tables[i]) > B - 1)
                st = kv_fail(err, -1, "request %d holds %lld unused slots with B = %d", i,
                             (long long)kv_block_table_unused_slots(&b->mem->paged->tables[i]), B);
        }
        const kv_pool *pool = &b->mem->paged->pool;
        if (!st && pool->n_used != blocks_needed) /* nothing shared: used = sum of ceil(len/B) */
            st = kv_fail(err, -1, "pool holds %d blocks, the tables need %lld", pool->n_used,
                         (long long)blocks_needed);
        mem_add(paged, pool->n_used * block_bytes, held);
        for (int p = 0; p < N_POL && contig; p++) mem_add(&contig[p], reserved[p], held);
        for (int k = 0; k < n; k++)
            if (len[q[k].slot] >= total[q[k].slot]) { /* finished: release its memory */
                b->reset(b, q[k].slot);
                live[q[k].slot] = 0;
                n_live--;
            }
    }
    if (!st && b->mem->paged->pool.n_used != 0)
        st = kv_fail(err, -1, "%d blocks still used after every request finished",
                     b->mem->paged->pool.n_used);
    kv_backend_destroy(b);
    for (int i = 0; i < nr; i++) free(tok[i]);
    free(lg);
    free(q);
    return st;
}

static int part_memory(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err)
{
    FILE *f = ctx->out;
    const kv_config *cfg = &m->config;
    kv_trace tr;
    memset(&tr, 0, sizeof tr);
    kv_trace_spec ts;
    const char *name = NULL, *what = NULL;
    int st = KV_ERR_ARG;
    for (int i = 0; i < kv_trace_builtin_count(); i++) {
        st = kv_trace_builtin(i, &name, &what, &ts, err);
        if (st || !strcmp(name, "alpaca")) break;
    }
    if (!st && strcmp(name, "alpaca")) st = kv_fail(err, KV_ERR_ARG, "no builtin trace 'alpaca'");
    if (!st) st = kv_trace_generate(&ts, &tr, err);
    if (!st && tr.n < CH05_REQUESTS) st = kv_fail(err, KV_ERR_ARG, "trace too short");
    if (st) {
        kv_trace_free(&tr);
        return st;
    }
    const int nr = CH05_REQUESTS, S = cfg->seq_len;
    kv_request rq[CH05_REQUESTS];
    int *prompts[CH05_REQUESTS] = {0};
    double res[CH05_REQUESTS][N_POL], token_bytes = 0;
    for (int i = 0; i < nr; i++) { /* the model's context caps a request (rarely: Alpaca is short) */
        rq[i] = tr.req[i];
        if (rq[i].prompt_len > S / 2) rq[i].prompt_len = S / 2;
        if (rq[i].prompt_len + rq[i].output_len > S) rq[i].output_len = S - rq[i].prompt_len;
    }
    st = contiguous_bytes(cfg, 1, &token_bytes, err);
    for (int i = 0; i < nr && !st; i++) {
        const int P = rq[i].prompt_len, O = rq[i].output_len;
        int cap = P + next_pow2(O); /* Pow2: output room rounded up to a power of two, <= 2x */
        if (cap > S) cap = S;
        st = contiguous_bytes(cfg, S, &res[i][POL_MAX], err); /* Max: the model's whole context */
        if (!st) st = contiguous_bytes(cfg, cap, &res[i][POL_POW2], err);
        if (!st) st = contiguous_bytes(cfg, P + O, &res[i][POL_ORACLE], err); /* knows O */
        /* kv_trace_tokens() writes the trace's own prompt length; a capped prompt keeps its head */
        prompts[i] = malloc(sizeof(int) * (tr.req[i].prompt_len > P ? tr.req[i].prompt_len : P));
        if (!st && !prompts[i]) st = kv_fail(err, KV_ERR_NOMEM, "demo: prompts");
        if (!st) kv_trace_tokens(&tr, i, cfg->vocab_size, prompts[i]);
    }
    const int Bs[3] = {8, 16, 32};
    mem_row *rows = calloc(N_POL + 3, sizeof(mem_row)); /* the contiguous policies, then paged */
    mem_row *contig = rows, *paged = rows + N_POL;
    if (!st && !rows) st = kv_fail(err, KV_ERR_NOMEM, "demo: memory");
    const char *dev = ctx->device;
    for (int k = 0; k < 3 && !st; k++)
        st = mem_run(ctx, m, rq, nr, (const int *const *)prompts, Bs[k], &paged[k],
                     k == 0 ? contig : NULL, (const double(*)[N_POL])res, token_bytes, &dev, err);
    if (!st && !ctx->csv) {
        int tot = 0;
        fprintf(f, "2. Memory: the first %d requests of the Alpaca-like trace (datasets/traces/"
                "alpaca.csv), decoded together\n   (prompt+output tokens:", nr);
        for (int i = 0; i < nr; i++) {
            fprintf(f, " %d+%d", rq[i].prompt_len, rq[i].output_len);
            tot += rq[i].prompt_len + rq[i].output_len;
        }
        fprintf(f, "; %d in all), device %s.\n", tot, dev);
        fprintf(f, "   One token of the tiny model's fp32 cache = %.0f bytes (kv_cache_bytes of a "
                "1-token cache).\n", token_bytes);
        fprintf(f, "   Reserved per request: Max = the model's %d-token context; Pow2 = prompt + "
                "the output length rounded up\n   to a power of two (at most 2x the output); "
                "Oracle = prompt + output exactly (it knows the output length).\n   Paged = "
                "blocks USED in the pool x bytes per block.\n", S);
        fprintf(f, "   Waste = 1 - held/reserved: at the step of peak reservation, and "
                "averaged over all steps (sum held / sum reserved).\n\n");
        fprintf(f, "   %-18s %3s %14s %12s %12s %11s\n", "policy", "B", "peak reserved",
                "held then", "waste@peak", "waste avg");
    } else if (!st) {
        kv_csv_printf(f, "part,policy,block_size,peak_reserved_bytes,peak_held_bytes,waste_at_peak,"
                         "waste_avg\n");
    }
    for (int r = 0; r < N_POL + 3 && !st; r++) {
        const mem_row *x = &rows[r];
        const char *pn = r < N_POL ? (ctx->csv ? pol_csv[r] : pol_name[r]) : "paged";
        const int B = r < N_POL ? 0 : Bs[r - N_POL];
        const double wp = 1.0 - x->peak_held / x->peak_reserved, wa = 1.0 - x->sum_held / x->sum_reserved;
        if (ctx->csv) {
            kv_csv_printf(f, "2,%s,%d,%.0f,%.0f,%.4f,%.4f\n", pn, B, x->peak_reserved, x->peak_held,
                          wp, wa);
        } else {
            char a[32], c[32], bs[8] = "-";
            if (B) snprintf(bs, sizeof bs, "%d", B);
            fprintf(f, "   %-18s %3s %14s %12s %11.1f%% %10.1f%%\n", pn, bs,
                    kv_fmt_bytes(x->peak_reserved, a, sizeof a),
                    kv_fmt_bytes(x->peak_held, c, sizeof c), 100 * wp, 100 * wa);
        }
    }
    if (!st && ctx->csv) { /* the timeline behind the table, for docs/figures.cmake */
        kv_csv_printf(f, "part,step,held_bytes,max_bytes,pow2_bytes,oracle_bytes,paged8_bytes,"
                         "paged16_bytes,paged32_bytes\n");
        for (int t = 0; t < rows[0].n; t++) {
            kv_csv_printf(f, "2t,%d,%.0f", t, rows[0].held[t]);
            for (int r = 0; r < N_POL + 3; r++) kv_csv_printf(f, ",%.0f", rows[r].reserved[t]);
            fputc('\n', f);
        }
    }
    if (!st && !ctx->csv)
        fprintf(f, "\n   Checked at every step: pool blocks USED = sum of ceil(len/B) over the "
                "requests, and no request holds\n   more than B - 1 unused slots. The paged "
                "rows are the pool's counters, not a formula.\n\n");
    for (int i = 0; i < nr; i++) free(prompts[i]);
    free(rows);
    kv_trace_free(&tr);
    return st;
}

int kv_demo_ch05(const kv_demo_ctx *ctx, kv_err *err)
{
    kv_model m;
    memset(&m, 0, sizeof m);
    int st = kv_cli_default_model(&m, "tiny", err);
    if (st) return st;
    if (!ctx->csv) {
        const kv_config *c = &m.config;
        fprintf(ctx->out, "Paged KV cache on the tiny model (L %d, H_kv %d, d %d, fp32: %d bytes "
                "per token; context %d).\n\n", c->n_layers, c->n_kv_heads,
                kv_config_head_dim(c), c->n_layers * 2 * c->n_kv_heads * kv_config_head_dim(c) * 4,
                c->seq_len);
    }
    fprintf(stderr, "  [ch05] block table walk ...\n");
    st = part_walk(ctx, &m, err);
    if (!st) fprintf(stderr, "  [ch05] memory: contiguous vs paged ...\n");
    if (!st) st = part_memory(ctx, &m, err);
    if (!st) fprintf(stderr, "  [ch05] sharing ...\n");
    if (!st) st = kv_demo_ch05_sharing(ctx, &m, err);
    if (!st) fprintf(stderr, "  [ch05] prefix caching ...\n");
    if (!st) st = kv_demo_ch05_prefix(ctx, &m, err);
    kv_model_free(&m);
    return st;
}
