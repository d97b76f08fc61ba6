/*
 * Perplexity over a token stream (kv_eval.h): windows in stride or stream mode, each run
 * cached (chunks with every row's logits) or naive (every prefix recomputed).
 */
#include "kv_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* log-sum-exp of logits [vocab], in double */
static double log_norm(const float *logits, int vocab)
{
    double mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

/* -log softmax(logits)[target] */
static double token_nll(const float *logits, int vocab, int target)
{
    return log_norm(logits, vocab) - (double)logits[target];
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* KL(p || q) = sum_i p_i (log p_i - log q_i) of the softmaxes of p_logits, q_logits [vocab] */
static double token_kl(const float *p_logits, const float *q_logits, int vocab)
{
    const double zp = log_norm(p_logits, vocab), zq = log_norm(q_logits, vocab);
    double kl = 0.0;
    for (int i = 0; i < vocab; i++) {
        const double lp = (double)p_logits[i] - zp, lq = (double)q_logits[i] - zq;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0.0 ? kl : 0.0; /* rounding can leave -1e-17 for equal distributions */
}

/* running sums of one evaluation */
typedef struct {
    double nll, kl;
    long done, agree;
} ppl_sums;

/* One window w [len] from position 0, token base of the stream: the NLL of w[1..len) (and KL,
 * agreement) into *a, for the targets whose stream index is a multiple of o->every. */
static int run_window(kv_backend *b, const int *w, int len, long base, const kv_ppl_opts *o,
                      float *logits, float *ref_logits, ppl_sums *a, long total, kv_err *err)
{
    const int vocab = b->config->vocab_size;
    const int chunk = o->chunk > 0 ? o->chunk : 64;
    const long every = o->every > 0 ? o->every : 1;
    int st;
    if (o->naive) {
        /* chapter 01: the prefix w[0..t) recomputed from scratch predicts w[t] */
        for (int t = 1; t < len; t++) {
            if ((base + t) % every) continue;
            b->reset(b, 0);
            kv_seq s = {0, 0, t, w, NULL};
            if ((st = b->forward(b, &s, 1, logits, NULL, err))) return st;
            a->nll += token_nll(logits, vocab, w[t]);
            a->done++;
            if (o->progress) o->progress(o->ctx, a->done, total);
        }
        return KV_OK;
    }
    b->reset(b, 0);
    if (o->ref) o->ref->reset(o->ref, 0);
    for (int pos = 0; pos < len - 1; pos += chunk) {
        /* rows pos .. pos+k-1 predict w[pos+1 .. pos+k]; the last token of the window is
         * only ever a target, so it is never fed */
        int k = len - 1 - pos < chunk ? len - 1 - pos : chunk;
        if (o->before_step && (st = o->before_step(o->hook, b, pos, k, err))) return st;
        kv_seq s = {0, pos, k, w + pos, logits};
        if ((st = b->forward(b, &s, 1, NULL, NULL, err))) return st;
        if (o->ref) {
            kv_seq r = {0, pos, k, w + pos, ref_logits};
            if ((st = o->ref->forward(o->ref, &r, 1, NULL, NULL, err))) return st;
        }
        for (int j = 0; j < k; j++) {
            if ((base + pos + j + 1) % every) continue;
            const float *row = logits + (size_t)j * vocab;
            a->nll += token_nll(row, vocab, w[pos + j + 1]);
            a->done++;
            if (!o->ref) continue;
            const float *ref_row = ref_logits + (size_t)j * vocab;
            a->kl += token_kl(ref_row, row, vocab);
            a->agree += argmax(ref_row, vocab) == argmax(row, vocab);
        }
        if (o->progress) o->progress(o->ctx, a->done, total);
    }
    return KV_OK;
}

/* Recompute mode: token t predicted by a fresh prefill of tokens[max(0, t-T+1) .. t). */
static int run_recompute(kv_backend *b, const int *tokens, long n, const kv_ppl_opts *o,
                         float *logits, ppl_sums *a, int *preds, kv_err *err)
{
    const int vocab = b->config->vocab_size;
    const long every = o->every > 0 ? o->every : 1, T = o->window;
    const long total = (n - 1) / every;
    for (long t = every; t < n; t += every) {
        const long start = t - (T - 1) > 0 ? t - (T - 1) : 0;
        b->reset(b, 0);
        kv_seq s = {0, 0, (int)(t - start), tokens + start, NULL};
        int st = b->forward(b, &s, 1, logits, NULL, err);
        if (st) return st;
        a->nll += token_nll(logits, vocab, tokens[t]);
        a->done++;
        (*preds)++;
        if (o->progress) o->progress(o->ctx, a->done, total);
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
    if (o->slide && (o->window < 2 || o->naive || o->ref))
        return kv_fail(err, KV_ERR_ARG, "recompute mode needs a window T >= 2, cached mode, no "
                       "reference");
    if (o->ref && o->naive) return kv_fail(err, KV_ERR_ARG, "a reference backend needs cached mode");
    if (o->every < 0) return kv_fail(err, KV_ERR_ARG, "every %d must be >= 1", o->every);
    const long T = o->window ? o->window : n;
    const int chunk = o->chunk > 0 ? o->chunk : 64;
    const int vocab = b->config->vocab_size;
    const int rows = o->naive ? 1 : chunk;
    /* [rows][vocab] each; the second only with a reference */
    float *logits = malloc(sizeof(float) * (size_t)rows * (size_t)vocab);
    float *ref_logits = o->ref ? malloc(sizeof(float) * (size_t)rows * (size_t)vocab) : NULL;
    if (!logits || (o->ref && !ref_logits)) {
        free(logits);
        free(ref_logits);
        return kv_fail(err, KV_ERR_NOMEM, "cannot allocate %d rows of logits", rows);
    }

    ppl_sums a = {0.0, 0.0, 0, 0};
    int st = KV_OK, windows = 0;
    if (o->slide) {
        st = run_recompute(b, tokens, n, o, logits, &a, &windows, err);
    } else {
        /* windows start at 0, T-1, 2(T-1), ...: each predicts up to T - 1 new tokens */
        for (long s = 0; s < n - 1 && !st; s += T - 1) {
            int len = (int)(n - s < T ? n - s : T);
            st = run_window(b, tokens + s, len, s, o, logits, ref_logits, &a,
                            (n - 1) / (o->every > 0 ? o->every : 1), err);
            windows++;
        }
    }
    free(logits);
    free(ref_logits);
    if (st) return st;
    if (a.done == 0) return kv_fail(err, KV_ERR_ARG, "no token predicted (every %d > n)", o->every);
    r->n_predicted = a.done;
    r->n_windows = windows;
    r->nll = a.nll / (double)a.done;
    r->ppl = exp(r->nll);
    r->kl = a.kl / (double)a.done;
    r->top1 = (double)a.agree / (double)a.done;
    return KV_OK;
}
