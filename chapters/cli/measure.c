/* Timed generation runs and their medians (measure.h). */
#include "measure.h"

#include <stdlib.h>
#include <string.h>

int kv_run_log_init(kv_run_log *r, int mode, int n_steps, int repeats, kv_err *err)
{
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->n_steps = n_steps;
    r->repeats = repeats;
    r->tokens = calloc((size_t)n_steps, sizeof *r->tokens);
    r->seconds = calloc((size_t)repeats * n_steps, sizeof *r->seconds);
    r->total = calloc((size_t)repeats, sizeof *r->total);
    r->work = calloc((size_t)n_steps, sizeof *r->work);
    if (!r->tokens || !r->seconds || !r->total || !r->work) {
        kv_run_log_free(r);
        return kv_fail(err, KV_ERR_NOMEM, "out of memory for %d steps x %d repeats", n_steps, repeats);
    }
    return KV_OK;
}

void kv_run_log_free(kv_run_log *r)
{
    free(r->tokens);
    free(r->seconds);
    free(r->total);
    free(r->work);
    memset(r, 0, sizeof *r);
}

typedef struct {
    kv_run_log *log;
    double *seconds; /* [n_steps] this repeat's row */
    kv_progress *progress;
    long base, total;
} step_sink;

static void on_step(void *user, int step, int token, const kv_counters *w, double s)
{
    (void)token;
    step_sink *k = user;
    k->seconds[step] = s;
    k->log->work[step] = *w;
    if (k->progress) kv_progress_update(k->progress, k->base + step + 1, k->total);
}

int kv_run_once(kv_run_log *r, kv_backend *b, const int *prompt, int n_prompt,
                kv_progress *progress, long progress_base, long progress_total, kv_err *err)
{
    if (r->done >= r->repeats) return kv_fail(err, KV_ERR_ARG, "all %d repeats already run", r->repeats);
    int *out = malloc((size_t)r->n_steps * sizeof *out); /* [n_steps] */
    if (!out) return kv_fail(err, KV_ERR_NOMEM, "out of memory");
    step_sink sink = {r, r->seconds + (size_t)r->done * r->n_steps, progress, progress_base,
                      progress_total};
    kv_gen_opts o = {0};
    o.mode = r->mode;
    o.n_steps = r->n_steps;
    o.on_step = on_step;
    o.user = &sink;
    kv_counters sum = {0};
    double t0 = kv_now();
    int st = kv_generate(b, prompt, n_prompt, &o, out, &sum, err);
    double t = kv_now() - t0;
    if (st == KV_OK) {
        if (r->done == 0) memcpy(r->tokens, out, (size_t)r->n_steps * sizeof *out);
        else if (memcmp(r->tokens, out, (size_t)r->n_steps * sizeof *out)) r->repeats_differ = 1;
        r->total[r->done++] = t;
        r->sum = sum;
    }
    free(out);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kv_median(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double kv_run_step_median(const kv_run_log *r, int step)
{
    double v[64];
    int n = r->done < 64 ? r->done : 64;
    for (int i = 0; i < n; i++) v[i] = r->seconds[(size_t)i * r->n_steps + step];
    return kv_median(v, n);
}

double kv_run_total_median(const kv_run_log *r)
{
    double v[64];
    int n = r->done < 64 ? r->done : 64;
    for (int i = 0; i < n; i++) v[i] = r->total[i];
    return kv_median(v, n);
}

void kv_demo_prompt(int *tokens, int n, int vocab)
{
    /* BOS, then a fixed walk over the vocabulary: no tokenizer needed, same on every machine */
    for (int i = 0; i < n; i++) tokens[i] = i == 0 ? 1 : (int)((7u * (unsigned)i + 3u) % (unsigned)vocab);
}
