/*
 * Perplexity over a token stream (kv_eval.h): windows in stride or stream mode, each run
 * cached (chunks with every row's logits) or naive (every prefix recomputed).
 */
#include "kv_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* -log softmax(logits)[target], in double: logsumexp around the maximum */
static double token_nll(const float *logits, int vocab, int target)
{
    double mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum) - (double)logits[target];
}

/* One window w [len] from position 0: sum of the NLL of w[1..len) into *nll. */
static int run_window(kv_backend *b, const int *w, int len, const kv_ppl_opts *o, float *logits,
                      double *nll, long *done, long total, kv_err *err)
{
    const int vocab = b->config->vocab_size;
    const int chunk = o->chunk > 0 ? o->chunk : 64;
    int st;
    if (o->naive) {
        /* chapter 01: the prefix w[0..t) recomputed from scratch predicts w[t] */
        for (int t = 1; t < len; t++) {
            b->reset(b, 0);
            kv_seq s = {0, 0, t, w, NULL};
            if ((st = b->forward(b, &s, 1, logits, NULL, err))) return st;
            *nll += token_nll(logits, vocab, w[t]);
            (*done)++;
            if (o->progress) o->progress(o->ctx, *done, total);
        }
        return KV_OK;
    }
    b->reset(b, 0);
    for (int pos = 0; pos < len - 1; pos += chunk) {
        /* rows pos .. pos+k-1 predict w[pos+1 .. pos+k]; the last token of the window is
         * only ever a target, so it is never fed */
        int k = len - 1 - pos < chunk ? len - 1 - pos : chunk;
        kv_seq s = {0, pos, k, w + pos, logits};
        if ((st = b->forward(b, &s, 1, NULL, NULL, err))) return st;
        for (int j = 0; j < k; j++) *nll += token_nll(logits + (size_t)j * vocab, vocab, w[pos + j + 1]);
        *done += k;
        if (o->progress) o->progress(o->ctx, *done, total);
    }
    return KV_OK;
}

int kv_eval_ppl(kv_backend *b, const int *tokens, long n, const kv_ppl_opts *o,
                kv_ppl_result *r, kv_err *err)
{
    if (r) memset(r, 0, sizeof *r);
    if (!b || !tokens || !o || !r) return kv_fail(err, KV_ERR_ARG, "kv_eval_ppl: NULL argument");
    if (o->limit > 0 && o->limit < n) n = o->limit;
    if (n < 2) return kv_fail(err, KV_ERR_ARG, "perplexity needs at least 2 tokens, got %ld", n);
    if (o->window == 1 || o->window < 0)
        return kv_fail(err, KV_ERR_ARG, "window %d: a window needs at least 2 tokens (0 = stream)",
                       o->window);
    if (o->chunk < 0) return kv_fail(err, KV_ERR_ARG, "chunk %d must be >= 1", o->chunk);
    if (n > (1L << 30)) return kv_fail(err, KV_ERR_ARG, "%ld tokens: at most 2^30", n);
    const long T = o->window ? o->window : n;
    const int chunk = o->chunk > 0 ? o->chunk : 64;
    const int vocab = b->config->vocab_size;
    const int rows = o->naive ? 1 : chunk;
    float *logits = malloc(sizeof(float) * (size_t)rows * (size_t)vocab); /* [rows][vocab] */
    if (!logits) return kv_fail(err, KV_ERR_NOMEM, "cannot allocate %d rows of logits", rows);

    /* windows start at 0, T-1, 2(T-1), ...: each predicts up to T - 1 new tokens */
    const long total = n - 1;
    double nll = 0.0;
    long done = 0;
    int st = KV_OK, windows = 0;
    for (long s = 0; s < n - 1 && !st; s += T - 1) {
        int len = (int)(n - s < T ? n - s : T);
        st = run_window(b, tokens + s, len, o, logits, &nll, &done, total, err);
        windows++;
    }
    free(logits);
    if (st) return st;
    r->n_predicted = done;
    r->n_windows = windows;
    r->nll = nll / (double)done;
    r->ppl = exp(r->nll);
    return KV_OK;
}
