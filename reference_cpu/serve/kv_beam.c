/* Beam search's selection step (kv_beam.h). */
#include "kv_beam.h"

#include <math.h>

void kv_log_softmax(const float *x, int n, double *out)
{
    double mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) sum += exp((double)x[i] - mx);
    const double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = isnan(x[i]) ? NAN : (double)x[i] - lse;
}

double kv_log_prob(const float *x, int n, int token)
{
    double mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) sum += exp((double)x[i] - mx);
    return (double)x[token] - (mx + log(sum));
}

/* a before b: higher score, then lower parent, then lower token */
static int better(const kv_beam_cand *a, const kv_beam_cand *b)
{
    if (a->score != b->score) return a->score > b->score;
    if (a->parent != b->parent) return a->parent < b->parent;
    return a->token < b->token;
}

int kv_beam_select(const float *const *logits, const double *cum, int n_parents, int vocab,
                   int k, kv_beam_cand *out, double *scratch)
{
    int n = 0; /* out[0..n) is sorted, best first */
    for (int p = 0; p < n_parents; p++) {
        kv_log_softmax(logits[p], vocab, scratch);
        for (int v = 0; v < vocab; v++) {
            if (isnan(scratch[v])) continue;
            kv_beam_cand c = {cum[p] + scratch[v], p, v};
            if (n == k && !better(&c, &out[k - 1])) continue;
            int i = n < k ? n++ : k - 1; /* insertion sort into the k kept */
            while (i > 0 && better(&c, &out[i - 1])) {
                out[i] = out[i - 1];
                i--;
            }
            out[i] = c;
        }
    }
    return n;
}
