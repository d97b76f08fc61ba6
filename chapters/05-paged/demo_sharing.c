/*
 * Chapter 05 demo, parts 3 and 4 (demo.c runs them after parts 1 and 2): blocks shared
 * between sequences.
 *
 *  3. sharing: one prompt forked into 4 sampled continuations; refcounts, copy-on-write, blocks
 *     used vs 4 unshared copies. Checked: every sample equals its solo run on a contiguous cache.
 *  4. prefix caching: two requests after one 80-token system prompt; blocks hit, prefill saved.
 *     Checked: the second request's logits equal a run without the prefix cache.
 */
#include "demo.h"
#include "kv_sampler.h"

/* ---- 3. sharing: parallel samples of one prompt ---------------------------------------- */

int kv_demo_ch05_sharing(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err)
{
    enum { B = 16, P = 37, NS = CH05_SAMPLES, T = CH05_SAMPLE_LEN, CAP = 128 };
    FILE *f = ctx->out;
    const int V = m->config.vocab_size;
    kv_cache_spec ps = paged_spec(NS, CAP, B, 32);
    kv_backend *b = NULL;
    const char *dev;
    int prompt[P], tok[NS][T + 1];
    kv_sampler smp[NS];
    memset(smp, 0, sizeof smp);
    float *l0 = malloc(sizeof(float) * V), *lg = malloc(sizeof(float) * NS * V);
    float *hist = malloc(sizeof(float) * NS * T * V), *tmp = malloc(sizeof(float) * V);
    int st = (!l0 || !lg || !hist || !tmp) ? kv_fail(err, KV_ERR_NOMEM, "demo: memory") : KV_OK;
    seeded_tokens(prompt, P, V, 53);
    for (int s = 0; s < NS && !st; s++) st = kv_sampler_init(&smp[s], V, 1.0f, 1.0f, 100 + s, err);
    if (!st) st = paged_backend(ctx, m, &ps, 0, &b, &dev, err);
    kv_seq q[NS];
    q[0] = (kv_seq){0, 0, P, prompt};
    if (!st) st = b->forward(b, q, 1, l0, NULL, err); /* the prompt, once */
    for (int s = 1; s < NS && !st; s++) st = kv_paged_fork(b->mem, s, 0, err);
    if (st) goto done;
    const kv_paged *pg = b->mem->paged;
    const kv_block_table *t0 = &pg->tables[0];
    if (!ctx->csv) {
        fprintf(f, "3. Sharing: a %d-token prompt, prefilled once, forked into %d samples "
                "(B = %d, temperature 1, seeds 100..%d, device %s)\n", P, NS, B, 99 + NS, dev);
        fprintf(f, "   after the forks: every table is ");
        print_table(f, t0, ' ');
        fprintf(f, ", refcounts");
        for (int i = 0; i < t0->n_blocks; i++) fprintf(f, " %d", pg->pool.refcount[t0->blocks[i]]);
        fprintf(f, "; blocks used %d for %lld table entries\n", pg->pool.n_used,
                (long long)pg->pool.total_refs);
    } else {
        kv_csv_printf(f, "part,metric,value\n");
        fprintf(f, "3,refcount_after_fork,%d\n", pg->pool.refcount[t0->blocks[0]]);
    }
    for (int s = 0; s < NS; s++) {
        memcpy(tmp, l0, sizeof(float) * V);
        tok[s][0] = kv_sample(&smp[s], tmp);
    }
    for (int t = 0; t < T && !st; t++) {
        for (int s = 0; s < NS; s++) q[s] = (kv_seq){s, P + t, 1, &tok[s][t]};
        st = b->forward(b, q, NS, lg, NULL, err);
        for (int s = 0; s < NS && !st; s++) {
            memcpy(hist + ((size_t)s * T + t) * V, lg + (size_t)s * V, sizeof(float) * V);
            memcpy(tmp, lg + (size_t)s * V, sizeof(float) * V);
            tok[s][t + 1] = kv_sample(&smp[s], tmp);
        }
        if (!st && t == 0 && !ctx->csv) {
            fprintf(f, "   first decode step: the shared last block (%d of %d slots filled) is "
                    "copied on write by %lld samples;\n   the last writer finds refcount 1 and "
                    "writes in place. Tables now:", P % B, B, (long long)pg->n_cow);
            for (int s = 0; s < NS; s++) {
                fputc(' ', f);
                print_table(f, &pg->tables[s], ' ');
            }
            fputc('\n', f);
        }
    }
    if (st) goto done;
    const int used = pg->pool.n_used;
    const long long entries = pg->pool.total_refs, cow = pg->n_cow;
    /* the check: each sample alone, on a contiguous cache, with the same seed */
    int identical = 1;
    for (int s = 0; s < NS && !st; s++) {
        kv_backend *cb = NULL;
        kv_cache_spec cs = kv_cache_spec_default(1, CAP);
        kv_sampler one;
        memset(&one, 0, sizeof one);
        int x = 0;
        st = kv_cli_backend(&cb, dev, m, &cs, err);
        if (!st) st = kv_sampler_init(&one, V, 1.0f, 1.0f, 100 + s, err);
        kv_seq c = {0, 0, P, prompt};
        if (!st) st = cb->forward(cb, &c, 1, tmp, NULL, err);
        if (!st) {
            identical &= memcmp(tmp, l0, sizeof(float) * V) == 0;
            x = kv_sample(&one, tmp);
            identical &= x == tok[s][0];
        }
        for (int t = 0; t < T && !st; t++) {
            c = (kv_seq){0, P + t, 1, &x};
            st = cb->forward(cb, &c, 1, tmp, NULL, err);
            if (st) break;
            identical &= memcmp(tmp, hist + ((size_t)s * T + t) * V, sizeof(float) * V) == 0;
            x = kv_sample(&one, tmp);
            identical &= x == tok[s][t + 1];
        }
        kv_sampler_free(&one);
        kv_backend_destroy(cb);
    }
    if (st) goto done;
    if (ctx->csv) {
        kv_csv_printf(f,
                      "3,copy_on_write,%lld\n3,blocks_used,%d\n3,blocks_unshared,%lld\n"
                      "3,identical,%d\n",
                      cow, used, entries, identical);
    } else {
        fprintf(f, "   after %d tokens each (%d-token sequences): blocks used %d vs %lld for %d "
                "unshared copies (%.0f %% saved);\n   copy-on-write copies %lld. Each sample vs "
                "its solo run on a contiguous cache (logits, tokens): identical: %s\n\n", T,
                P + T, used, entries, NS, 100.0 * (1.0 - (double)used / entries), cow,
                identical ? "yes" : "no");
    }
    if (!identical) st = kv_fail(err, -1, "a forked sample differs from its solo run (part 3)");
done:
    for (int s = 0; s < NS; s++) kv_sampler_free(&smp[s]);
    kv_backend_destroy(b);
    free(l0);
    free(lg);
    free(hist);
    free(tmp);
    return st;
}

/* ---- 4. prefix caching ----------------------------------------------------------------- */

/* Admit @p prompt [n] into @p slot (prefix match when the cache is on), prefill what is not
 * cached, then CH05_GEN greedy steps; logits of the last prompt token and of every step go to
 * @p out [CH05_GEN + 1][V]. */
static int run_request(kv_backend *b, int slot, const int *prompt, int n, float *out, int *hit,
                       kv_err *err)
{
    const int V = b->config->vocab_size;
    int toks[CH05_GEN + 1];
    *hit = 0;
    int st = b->mem ? kv_paged_match_prefix(b->mem, slot, prompt, n, hit, err) : KV_OK;
    kv_seq q = {slot, *hit, n - *hit, prompt + *hit};
    if (!st) st = b->forward(b, &q, 1, out, NULL, err);
    for (int t = 0; t < CH05_GEN && !st; t++) {
        toks[t] = kv_argmax(out + (size_t)t * V, V);
        q = (kv_seq){slot, n + t, 1, &toks[t]};
        st = b->forward(b, &q, 1, out + (size_t)(t + 1) * V, NULL, err);
    }
    return st;
}

int kv_demo_ch05_prefix(const kv_demo_ctx *ctx, const kv_model *m, kv_err *err)
{
    enum { B = 16, UA = 23, UB = 31, CAP = 160 };
    FILE *f = ctx->out;
    const int V = m->config.vocab_size, NA = CH05_SYSTEM + UA, NB = CH05_SYSTEM + UB;
    kv_cache_spec ps = paged_spec(1, CAP, B, 32), cs = kv_cache_spec_default(1, CAP);
    kv_backend *b = NULL, *ref = NULL;
    const char *dev;
    int a[NA], bq[NB], hit_a = 0, hit_b = 0, hit_r = 0;
    const size_t nl = (size_t)(CH05_GEN + 1) * V;
    float *la = malloc(sizeof(float) * nl), *lb = malloc(sizeof(float) * nl);
    float *lr = malloc(sizeof(float) * nl);
    int st = (!la || !lb || !lr) ? kv_fail(err, KV_ERR_NOMEM, "demo: logits") : KV_OK;
    seeded_tokens(a, CH05_SYSTEM, V, 54); /* the system prompt, shared */
    memcpy(bq, a, sizeof(int) * CH05_SYSTEM);
    seeded_tokens(a + CH05_SYSTEM, UA, V, 55); /* two different user turns */
    seeded_tokens(bq + CH05_SYSTEM, UB, V, 56);
    if (!st) st = paged_backend(ctx, m, &ps, 1, &b, &dev, err);
    if (!st) st = kv_cli_backend(&ref, dev, m, &cs, err);
    if (!st) st = run_request(b, 0, a, NA, la, &hit_a, err);
    if (st) goto done;
    const kv_paged *pg = b->mem->paged;
    const int full_a = pg->tables[0].n_tokens / B;
    b->reset(b, 0); /* request A finishes: its full blocks stay, CACHED, on the LRU list */
    const int cached = pg->pool.n_cached;
    st = run_request(b, 0, bq, NB, lb, &hit_b, err);
    const long long lookups = pg->prefix.lookups, hits = pg->prefix.hits;
    if (!st) st = run_request(ref, 0, bq, NB, lr, &hit_r, err); /* no prefix cache */
    if (st) goto done;
    const int identical = memcmp(lb, lr, sizeof(float) * nl) == 0;
    if (ctx->csv) {
        kv_csv_printf(f,
                      "part,metric,value\n4,request_a_hit_tokens,%d\n4,cached_blocks_after_a,%d\n"
                      "4,request_b_hit_tokens,%d\n4,request_b_prefilled,%d\n4,identical,%d\n",
                      hit_a, cached, hit_b, NB - hit_b, identical);
    } else {
        fprintf(f, "4. Prefix caching: an %d-token system prompt, then different user turns "
                "(B = %d, greedy %d tokens, device %s)\n", CH05_SYSTEM, B, CH05_GEN, dev);
        fprintf(f, "   request A: %d prompt tokens, %d hit, %d prefilled; with its %d generated "
                "tokens it fills %d blocks,\n   each registered under its chain hash.\n", NA,
                hit_a, NA - hit_a, CH05_GEN, full_a);
        fprintf(f, "   A finishes: %d blocks stay CACHED (refcount 0, on the LRU list, "
                "reusable until evicted).\n", cached);
        fprintf(f, "   request B: %d prompt tokens, %d blocks hit = %d tokens, %d prefilled: "
                "%.0f %% of its prefill saved\n", NB, hit_b / B, hit_b, NB - hit_b,
                100.0 * hit_b / NB);
        if (CH05_SYSTEM % B == 0) /* the prompt ends on a block boundary */
            fprintf(f, "   (the system prompt is %d tokens = %d full blocks; block %d holds only user "
                    "tokens, and A's and B's differ, so its hash differs).\n", CH05_SYSTEM,
                    CH05_SYSTEM / B, CH05_SYSTEM / B);
        else
            fprintf(f, "   (the system prompt is %d tokens = %d full blocks + %d; block %d mixes "
                    "system and user tokens, so its hash differs).\n", CH05_SYSTEM,
                    CH05_SYSTEM / B, CH05_SYSTEM % B, CH05_SYSTEM / B);
        fprintf(f, "   prefix cache: %lld blocks looked up, %lld hit (every hit verified token "
                "by token and by parent).\n", lookups, hits);
        fprintf(f, "   B's logits (last prompt token + %d steps) vs B alone on a contiguous "
                "cache: identical: %s\n", CH05_GEN, identical ? "yes" : "no");
    }
    if (!identical) st = kv_fail(err, -1, "a prefix-cache hit changed the logits (part 4)");
    else if (hit_b != (CH05_SYSTEM / B) * B)
        st = kv_fail(err, -1, "request B hit %d tokens, expected %d", hit_b, (CH05_SYSTEM / B) * B);
done:
    kv_backend_destroy(b);
    kv_backend_destroy(ref);
    free(la);
    free(lb);
    free(lr);
    return st;
}
