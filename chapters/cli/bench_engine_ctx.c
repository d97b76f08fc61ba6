/*
 * kvlab bench engine --model FILE --context N (bench_cmds.h): a real model's decode speed with
 * the cache already holding N tokens, its prefill speed, and what a decoded token must read
 * against the read bandwidth measured in the same run.
 *
 * An empty cache; a prompt of N tokens in one step (the prefill, timed, once); then, --repeats
 * times from that context, --tokens steps of one token each (decode, timed), greedy, the cache
 * cut back to N between repeats. The decode's median over the repeats is printed. A decoded token at position p reads
 *   the weights, as the model holds them: its matrices (kv_model_matrix_bytes(): 4-bit blocks
 *   for --weights native on a Q4_1 file, fp32 for f32), one embedding row and the norms, and
 *   the cache's K and V of positions 0..p: L · 2 · H_kv · d · b · (p + 1) (kv_forward.c),
 * so the fastest it can be is (weights + KV bytes) / bandwidth, the bandwidth being the best
 * pass of kv_bench_ceiling() before and after the runs (kvlab bench bandwidth's passes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "bench_cmds.h"
#include "cli.h"
#include "kv_forward.h"
#include "kv_gguf_quant.h"
#include "kv_linear.h"
#include "kv_needle.h"
#include "measure.h"

double kv_bench_model_weight_bytes(const kv_model *m)
{
    const kv_config *c = &m->config;
    const kv_mat e = kv_model_mat(m, KV_MAT_EMBED, 0);
    return kv_model_matrix_bytes(m) + (double)e.row_bytes +
           4.0 * (2.0 * c->n_layers + 1.0) * c->dim;
}

/* One prefill of @p n tokens (its time in *t_pre), then @p repeats decodes of @p steps tokens
 * each from that same context (times in dec[repeats]): after a decode the cache is cut back to
 * n positions (kv_cache_truncate()) and the next starts again from the prefill's logits, as
 * llama-bench -d reuses its depth across repetitions. A decode's cost does not depend on what
 * an earlier one wrote and then dropped. */
static int run_context(const kv_model *m, const kv_cache_spec *spec, int n, int steps,
                       int repeats, double *t_pre, double *dec, double *kv_read, kv_err *err)
{
    kv_cache c;
    kv_state s;
    kv_state_init(&s);
    int st = kv_forward_cache_create(&c, &m->config, spec, err);
    if (st) return st;
    const int V = m->config.vocab_size;
    int *ids = malloc(sizeof(int) * (size_t)n);          /* [n] the prompt */
    float *first = malloc(sizeof(float) * (size_t)V);    /* [vocab] the prefill's logits */
    float *logits = malloc(sizeof(float) * (size_t)V);   /* [vocab] */
    if (!ids || !first || !logits) st = kv_fail(err, KV_ERR_NOMEM, "out of memory for %d tokens", n);
    for (int i = 0; !st && i < n; i++) ids[i] = (int)((7919u * (unsigned)i + 17u) % (unsigned)V);
    double t0 = kv_now();
    kv_seq q = {0, 0, n, ids, NULL};
    if (!st) st = kv_forward(m, &c, &s, &q, 1, first, NULL, err);
    *t_pre = kv_now() - t0;
    for (int r = 0; r < repeats && !st; r++) {
        kv_counters cnt = {0};
        memcpy(logits, first, sizeof(float) * (size_t)V);
        if (r > 0) st = kv_cache_truncate(&c, 0, n, err);
        t0 = kv_now();
        for (int k = 0; k < steps && !st; k++) {
            int best = 0;
            for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
            kv_seq d = {0, n + k, 1, &best, NULL};
            st = kv_forward(m, &c, &s, &d, 1, logits, &cnt, err);
        }
        dec[r] = kv_now() - t0;
        *kv_read = cnt.kv_bytes_read;
    }
    free(ids), free(first), free(logits);
    kv_state_free(&s);
    kv_cache_free(&c);
    return st;
}

int kv_bench_engine_context(const kv_model *m, const char *name, const char *cache, int context,
                            int steps, int repeats, kv_err *err)
{
    kv_cache_spec spec;
    int st = kv_needle_cache_spec(cache, 1, context + steps, &spec, err);
    if (!st) st = kv_cache_spec_check("cache", &m->config, &spec, err);
    if (st) return st;
    const double wbytes = kv_bench_model_weight_bytes(m);
    const kv_config *c = &m->config;
    /* a decoded token's bytes at the run's middle position, for the token-sized pass */
    const double b = kv_cache_spec_bytes_per_element(&spec, c->n_layers, kv_config_head_dim(c));
    const double kv_mid = (double)c->n_layers * 2 * c->n_kv_heads * kv_config_head_dim(c) * b *
                          (context + steps / 2.0 + 1);
    double bw[4] = {0, 0, 0, 0};
    st = kv_bench_ceiling((double)((size_t)256 << 20), &bw[0], err);
    if (!st) st = kv_bench_ceiling(wbytes + kv_mid, &bw[1], err);
    double *dec = calloc((size_t)repeats, sizeof(double)), tp = 0, kv_read = 0;
    if (!dec) st = kv_fail(err, KV_ERR_NOMEM, "out of memory");
    if (!st) st = run_context(m, &spec, context, steps, repeats, &tp, dec, &kv_read, err);
    if (!st) st = kv_bench_ceiling((double)((size_t)256 << 20), &bw[2], err);
    if (!st) st = kv_bench_ceiling(wbytes + kv_mid, &bw[3], err);
    if (!st) {
        double best = 0;
        for (int i = 0; i < 4; i++) best = bw[i] > best ? bw[i] : best;
        const double td = kv_median(dec, repeats);
        const double per_tok = wbytes + kv_read / steps;
        char store[64], w1[32], w2[32], w3[32];
        printf("bench engine: %s, weights %s, cache %s, %d OpenMP threads, one prefill, decode "
               "median of %d\n", name, kv_model_storage(m, store, sizeof store), cache,
               omp_get_max_threads(), repeats);
        printf("  prefill: %d tokens in %.3f s, %.1f tokens/s\n", context, tp, context / tp);
        printf("  decode at context %d: %d tokens in %.3f s, %.2f tokens/s (%.2f ms/token)\n",
               context, steps, td, steps / td, td / steps * 1e3);
        printf("  bytes per decoded token: weights %s + KV %s (cache %s, positions %d..%d) = %s\n",
               kv_fmt_bytes(wbytes, w1, sizeof w1), kv_fmt_bytes(kv_read / steps, w2, sizeof w2),
               cache, context, context + steps - 1, kv_fmt_bytes(per_tok, w3, sizeof w3));
        printf("  read bandwidth ceiling (best pass before/after, 256 MiB and token-sized "
               "buffers): %.2f GB/s; roofline %.2f tokens/s; decode at %.3f of it\n",
               best * 1e-9, best / per_tok, per_tok * steps / td / best);
    }
    free(dec);
    return st;
}
