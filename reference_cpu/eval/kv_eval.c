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

/* running sums of one evaluation (one per backend) */
typedef struct {
    double nll, kl, ref_nll;
    long done, agree;
} ppl_sums;

/* what one run shares: the backends, the reference, their logits, the totals */
typedef struct {
    kv_backend *const *bs; /* [nb] */
    int nb;
    const kv_ppl_opts *o;
    float *logits;     /* [nb][rows][vocab] */
    float *ref_logits; /* [rows][vocab], with o->ref */
    ppl_sums *a;       /* [nb] */
    long total;        /* predictions expected, for progress */
} ppl_run;

/* the sums and the per-token hook for target t of backend v, from its row and the reference's */
static void score(ppl_run *p, int v, long t, const float *row, const float *ref_row, int target)
{
    const int vocab = p->bs[v]->config->vocab_size;
    ppl_sums *a = &p->a[v];
    const double nll = token_nll(row, vocab, target);
    double kl = 0.0;
    int agree = 0;
    a->nll += nll;
    a->done++;
    if (ref_row) {
        kl = token_kl(ref_row, row, vocab);
        a->ref_nll += token_nll(ref_row, vocab, target);
        agree = argmax(ref_row, vocab) == argmax(row, vocab);
        a->kl += kl;
        a->agree += agree;
    }
    if (p->o->on_token) p->o->on_token(p->o->token_ctx, v, t, nll, kl, agree);
}

/* One window w [len] from position 0, token base of the stream: the NLL of w[1..len) (and KL,
 * agreement) of every backend, for the targets whose stream index is a multiple of o->every. */
static int run_window(ppl_run *p, const int *w, int len, long base, kv_err *err)
{
    const kv_ppl_opts *o = p->o;
    kv_backend *b = p->bs[0];
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
            if ((st = b->forward(b, &s, 1, p->logits, NULL, err))) return st;
            score(p, 0, base + t, p->logits, NULL, w[t]);
            if (o->progress) o->progress(o->ctx, p->a[0].done, p->total);
        }
        return KV_OK;
    }
    for (int v = 0; v < p->nb; v++) p->bs[v]->reset(p->bs[v], 0);
    if (o->ref) o->ref->reset(o->ref, 0);
    for (int pos = 0; pos < len - 1; pos += chunk) {
        /* rows pos .. pos+k-1 predict w[pos+1 .. pos+k]; the last token of the window is
         * only ever a target, so it is never fed */
        int k = len - 1 - pos < chunk ? len - 1 - pos : chunk;
        if (o->ref) {
            kv_seq r = {0, pos, k, w + pos, p->ref_logits};
            if ((st = o->ref->forward(o->ref, &r, 1, NULL, NULL, err))) return st;
        }
        for (int v = 0; v < p->nb; v++) {
            float *logits = p->logits + (size_t)v * chunk * vocab;
            if (o->before_step && (st = o->before_step(o->hook, p->bs[v], pos, k, err)))
                return st;
            kv_seq s = {0, pos, k, w + pos, logits};
            if ((st = p->bs[v]->forward(p->bs[v], &s, 1, NULL, NULL, err))) return st;
            for (int j = 0; j < k; j++) {
                if ((base + pos + j + 1) % every) continue;
                score(p, v, base + pos + j + 1, logits + (size_t)j * vocab,
                      o->ref ? p->ref_logits + (size_t)j * vocab : NULL, w[pos + j + 1]);
            }
        }
        if (o->progress) o->progress(o->ctx, p->a[0].done, p->total);
    }
    return KV_OK;
}

/* Recompute mode: token t predicted by a fresh prefill of tokens[max(0, t-T+1) .. t). */
static int run_recompute(ppl_run *p, const int *tokens, long n, int *preds, kv_err *err)
{
    kv_backend *b = p->bs[0];
    const kv_ppl_opts *o = p->o;
    const long every = o->every > 0 ? o->every : 1, T = o->window;
    const long total = (n - 1) / every;
    for (long t = every; t < n; t += every) {
        const long start = t - (T - 1) > 0 ? t - (T - 1) : 0;
        b->reset(b, 0);
        kv_seq s = {0, 0, (int)(t - start), tokens + start, NULL};
        int st = b->forward(b, &s, 1, p->logits, NULL, err);
        if (st) return st;
        score(p, 0, t, p->logits, NULL, tokens[t]);
        (*preds)++;
        if (o->progress) o->progress(o->ctx, p->a[0].done, total);
    }
    return KV_OK;
}

int kv_eval_ppl(kv_backend *b, const int *tokens, long n, const kv_ppl_opts *o,
                kv_ppl_result *r, kv_err *err)
{
    if (r) memset(r, 0, sizeof *r);
    if (!b) return kv_fail(err, KV_ERR_ARG, "kv_eval_ppl: NULL argument");
    return kv_eval_ppl_many(&b, 1, tokens, n, o, r, err);
}

int kv_eval_ppl_many(kv_backend *const *bs, int nb, const int *tokens, long n,
                     const kv_ppl_opts *o, kv_ppl_result *r, kv_err *err)
{
    if (!bs || nb < 1 || !tokens || !o || !r)
        return kv_fail(err, KV_ERR_ARG, "kv_eval_ppl: NULL argument");
    memset(r, 0, sizeof *r * (size_t)nb);
    for (int v = 0; v < nb; v++)
        if (!bs[v]) return kv_fail(err, KV_ERR_ARG, "kv_eval_ppl: backend %d is NULL", v);
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
    if (nb > 1 && (o->naive || o->slide || o->before_step))
        return kv_fail(err, KV_ERR_ARG, "%d backends in lockstep: cached mode only, no "
                       "before_step hook", nb);
    const int vocab = bs[0]->config->vocab_size;
    for (int v = 0; v < nb; v++)
        if (bs[v]->config->vocab_size != vocab)
            return kv_fail(err, KV_ERR_ARG, "backend %d has vocabulary %d, backend 0 has %d", v,
                           bs[v]->config->vocab_size, vocab);
    if (o->ref && o->ref->config->vocab_size != vocab)
        return kv_fail(err, KV_ERR_ARG, "the reference has vocabulary %d, the backends %d",
                       o->ref->config->vocab_size, vocab);
    const long T = o->window ? o->window : n;
    const int chunk = o->chunk > 0 ? o->chunk : 64;
    const int rows = o->naive ? 1 : chunk;
    ppl_run p = {bs, nb, o, NULL, NULL, NULL, (n - 1) / (o->every > 0 ? o->every : 1)};
    p.logits = malloc(sizeof(float) * (size_t)nb * (size_t)rows * (size_t)vocab);
    p.ref_logits = o->ref ? malloc(sizeof(float) * (size_t)rows * (size_t)vocab) : NULL;
    p.a = calloc((size_t)nb, sizeof *p.a);
    if (!p.logits || (o->ref && !p.ref_logits) || !p.a) {
        free(p.logits);
        free(p.ref_logits);
        free(p.a);
        return kv_fail(err, KV_ERR_NOMEM, "cannot allocate %d rows of logits for %d backends",
                       rows, nb);
    }

    int st = KV_OK, windows = 0;
    if (o->slide) {
        st = run_recompute(&p, tokens, n, &windows, err);
    } else {
        /* windows start at 0, T-1, 2(T-1), ...: each predicts up to T - 1 new tokens */
        for (long s = 0; s < n - 1 && !st; s += T - 1) {
            int len = (int)(n - s < T ? n - s : T);
            st = run_window(&p, tokens + s, len, s, err);
            windows++;
        }
    }
    for (int v = 0; v < nb && !st; v++) {
        const ppl_sums *a = &p.a[v];
        if (a->done == 0) {
            st = kv_fail(err, KV_ERR_ARG, "no token predicted (every %d > n)", o->every);
            break;
        }
        r[v].n_predicted = a->done;
        r[v].n_windows = windows;
        r[v].nll = a->nll / (double)a->done;
        r[v].ppl = exp(r[v].nll);
        r[v].kl = a->kl / (double)a->done;
        r[v].top1 = (double)a->agree / (double)a->done;
        r[v].ref_nll = a->ref_nll / (double)a->done;
    }
    free(p.logits);
    free(p.ref_logits);
    free(p.a);
    if (st) memset(r, 0, sizeof *r * (size_t)nb);
    return st;
}
