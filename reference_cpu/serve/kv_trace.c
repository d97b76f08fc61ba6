/* Request traces (chapter 05): seeded generator, CSV writer and parser.
 *
 * Sources for the length means (see kv_trace.h): Kwon et al., "Efficient Memory Management
 * for Large Language Model Serving with PagedAttention", SOSP 2023, arXiv:2309.06180, §6.1
 * and Fig. 11 (ShareGPT 161.31 / 337.99, Alpaca 19.31 / 58.45 mean input / output tokens;
 * the text: ShareGPT inputs 8.4x and outputs 5.8x longer than Alpaca, higher variance).
 * Sigmas and caps below are kvlab's choices, not published figures. */
#include "kv_trace.h"
#include "kv_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_rng.h"

static const char *HEADER = "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id";
static const char *PRIO_COL = ",priority"; /* the optional seventh column (chapter 07) */

int kv_trace_length_model(int dist, int output, kv_len_model *m, kv_err *err)
{
    /* mean: published; sigma: ShareGPT's conversations spread wider than Alpaca's one-line
     * instructions; max: ShareGPT capped at 1024 like the paper's chatbot run (§6.5) */
    static const kv_len_model table[2][2] = {
        {{161.31, 1.0, 1024}, {337.99, 1.0, 1024}}, /* ShareGPT: prompt, output */
        {{19.31, 0.6, 256}, {58.45, 0.8, 512}},     /* Alpaca */
    };
    if (dist != KV_TRACE_SHAREGPT && dist != KV_TRACE_ALPACA)
        return kv_fail(err, KV_ERR_ARG, "trace: unknown length distribution %d", dist);
    *m = table[dist][output ? 1 : 0];
    return KV_OK;
}

static double phi(double z) { return 0.5 * erfc(-z / sqrt(2.0)); }

static double clamped_mean(double mu, double s, double c)
{
    double lc = log(c);
    return exp(mu + 0.5 * s * s) * phi((lc - mu - s * s) / s) + c * (1.0 - phi((lc - mu) / s));
}

double kv_trace_lognormal_mu(const kv_len_model *m)
{
    /* the clamped mean grows with mu: bisect */
    double lo = log(m->mean) - 10.0, hi = log((double)m->max) + 10.0;
    for (int it = 0; it < 200; it++) {
        double mid = 0.5 * (lo + hi);
        if (clamped_mean(mid, m->sigma, m->max) < m->mean) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

static int draw_len(kv_rng *r, const kv_len_model *m, double mu)
{
    double x = exp(mu + m->sigma * (double)kv_rng_normal(r));
    if (x > m->max) x = m->max;
    long n = lround(x);
    return n < 1 ? 1 : (int)n;
}

void kv_trace_free(kv_trace *t)
{
    for (int i = 0; t->ids && i < t->n; i++) free(t->ids[i]);
    free(t->ids);
    free(t->req);
    memset(t, 0, sizeof(*t));
}

/* Stable order by arrival (insertion sort: the streams are each sorted, merging is cheap). */
static void sort_by_arrival(kv_request *q, int n)
{
    for (int i = 1; i < n; i++) {
        kv_request x = q[i];
        int j = i - 1;
        while (j >= 0 && q[j].arrival_s > x.arrival_s) {
            q[j + 1] = q[j];
            j--;
        }
        q[j + 1] = x;
    }
}

int kv_trace_generate(const kv_trace_spec *s, kv_trace *t, kv_err *err)
{
    memset(t, 0, sizeof(*t));
    kv_len_model pm, om, hpm, hom;
    if (kv_trace_length_model(s->dist, 0, &pm, err) || kv_trace_length_model(s->dist, 1, &om, err))
        return KV_ERR_ARG;
    const int mixed = s->high_share > 0 || s->burst_size > 1; /* chapter 07's generator */
    if (mixed && (kv_trace_length_model(s->high_dist, 0, &hpm, err) ||
                  kv_trace_length_model(s->high_dist, 1, &hom, err)))
        return KV_ERR_ARG;
    if (s->n_requests < 1 || !(s->rate > 0) || s->n_samples < 1 || s->beam_width < 1 ||
        s->n_samples > KV_TRACE_MAX_FANOUT || s->beam_width > KV_TRACE_MAX_FANOUT ||
        (s->n_samples > 1 && s->beam_width > 1) || s->n_prefixes < 0 || s->n_prefixes > 4 ||
        !(s->high_share >= 0 && s->high_share < 1) || s->burst_size < 0 ||
        s->burst_size > s->n_requests)
        return kv_fail(err, KV_ERR_ARG, "trace: bad spec (n %d, rate %g, n_samples %d, beam %d, "
                       "prefixes %d, high share %g, burst %d)", s->n_requests, s->rate,
                       s->n_samples, s->beam_width, s->n_prefixes, s->high_share, s->burst_size);
    for (int p = 0; p < s->n_prefixes; p++)
        if (s->prefix_len[p] < 1 || s->prefix_len[p] > KV_TRACE_MAX_LEN / 2)
            return kv_fail(err, KV_ERR_ARG, "trace: prefix %d length %d", p, s->prefix_len[p]);
    t->req = calloc((size_t)s->n_requests, sizeof(kv_request));
    if (!t->req) return kv_fail(err, KV_ERR_NOMEM, "trace: no memory for %d requests",
                                s->n_requests);
    t->n = s->n_requests;
    t->n_prefixes = s->n_prefixes;
    for (int p = 0; p < s->n_prefixes; p++) t->prefix_len[p] = s->prefix_len[p];
    const double pmu = kv_trace_lognormal_mu(&pm), omu = kv_trace_lognormal_mu(&om);
    kv_rng r;
    kv_rng_seed(&r, s->seed);
    if (mixed) {
        /* two streams: high-priority requests, Poisson at rate * share; normal ones in bursts
         * of burst_size, the bursts Poisson at rate * (1 - share) / burst_size; then merged */
        const double hpmu = kv_trace_lognormal_mu(&hpm), homu = kv_trace_lognormal_mu(&hom);
        const int burst = s->burst_size > 1 ? s->burst_size : 1;
        const double normal_rate = s->rate * (1.0 - s->high_share) / burst;
        double clock_n = 0.0, clock_h = 0.0;
        int left = 0; /* normal requests still to come in the current burst */
        for (int i = 0; i < t->n; i++) {
            kv_request *q = &t->req[i];
            q->priority = (double)kv_rng_float(&r) < s->high_share;
            if (q->priority) {
                clock_h += -log(1.0 - (double)kv_rng_float(&r)) / (s->rate * s->high_share);
                q->arrival_s = clock_h;
            } else {
                if (left == 0) {
                    clock_n += -log(1.0 - (double)kv_rng_float(&r)) / normal_rate;
                    left = burst;
                }
                q->arrival_s = clock_n;
                left--;
            }
            q->prefix_id = s->n_prefixes ? (int)(kv_rng_u32(&r) % (uint32_t)s->n_prefixes) : -1;
            q->prompt_len = draw_len(&r, q->priority ? &hpm : &pm, q->priority ? hpmu : pmu) +
                            (q->prefix_id >= 0 ? t->prefix_len[q->prefix_id] : 0);
            q->output_len = draw_len(&r, q->priority ? &hom : &om, q->priority ? homu : omu);
            q->n_samples = s->n_samples;
            q->beam_width = s->beam_width;
        }
        sort_by_arrival(t->req, t->n);
        return KV_OK;
    }
    double clock = 0.0;
    for (int i = 0; i < t->n; i++) {
        kv_request *q = &t->req[i];
        /* Poisson process: exponential gaps of mean 1/rate; 1-u is in (0, 1] */
        clock += -log(1.0 - (double)kv_rng_float(&r)) / s->rate;
        q->arrival_s = clock;
        q->prefix_id = s->n_prefixes ? (int)(kv_rng_u32(&r) % (uint32_t)s->n_prefixes) : -1;
        q->prompt_len = draw_len(&r, &pm, pmu) + (q->prefix_id >= 0 ? t->prefix_len[q->prefix_id] : 0);
        q->output_len = draw_len(&r, &om, omu);
        q->n_samples = s->n_samples;
        q->beam_width = s->beam_width;
    }
    return KV_OK;
}

int kv_trace_format(const kv_trace *t, const char *comment, char **text, kv_err *err)
{
    size_t cap = 256 + (comment ? 2 * strlen(comment) : 0) + (size_t)t->n * 64 +
                 (size_t)t->n_prefixes * 32, n = 0;
    char *buf = malloc(cap);
    if (!buf) return kv_fail(err, KV_ERR_NOMEM, "trace: no memory to format");
    for (const char *c = comment; c && *c;) { /* "# " before each comment line */
        const char *e = strchr(c, '\n');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        n += (size_t)snprintf(buf + n, cap - n, "# %.*s\n", (int)len, c);
        c += len + (e ? 1 : 0);
    }
    for (int p = 0; p < t->n_prefixes; p++) /* ids may skip: write only the declared ones */
        if (t->prefix_len[p] > 0)
            n += (size_t)snprintf(buf + n, cap - n, "#prefix,%d,%d\n", p, t->prefix_len[p]);
    int prio = 0; /* the priority column only when some request is high */
    for (int i = 0; i < t->n; i++) prio |= t->req[i].priority != 0;
    n += (size_t)snprintf(buf + n, cap - n, "%s%s\n", HEADER, prio ? PRIO_COL : "");
    for (int i = 0; i < t->n; i++) {
        const kv_request *q = &t->req[i];
        n += (size_t)snprintf(buf + n, cap - n, "%.3f,%d,%d,%d,%d,%d", q->arrival_s,
                              q->prompt_len, q->output_len, q->n_samples, q->beam_width,
                              q->prefix_id);
        if (prio) n += (size_t)snprintf(buf + n, cap - n, ",%d", q->priority);
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    *text = buf;
    return KV_OK;
}

/* ---- parser ------------------------------------------------------------------------------ */

/* one integer field, the whole of it; lo..hi inclusive */
static int field_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int split(char *line, char **f, int max)
{
    int n = 0;
    for (char *p = line;; p++) {
        if (n < max) f[n] = p;
        n++;
        p = strchr(p, ',');
        if (!p) break;
        *p = 0;
    }
    return n;
}

/* *cols: -1 before the header, then the columns it named (6, or 7 with priority) */
static int parse_line(char *line, int lineno, kv_trace *t, int *cap, int *cols, kv_err *err)
{
    char *f[7];
    if (strncmp(line, "#prefix,", 8) == 0) {
        int id, len;
        if (*cols >= 0) /* a request row may already have used the prefix id */
            return kv_fail(err, KV_ERR_FORMAT, "trace line %d: #prefix lines come before the "
                           "header", lineno);
        if (split(line + 8, f, 2) != 2 || field_int(f[0], 0, KV_TRACE_MAX_PREFIXES - 1, &id) ||
            field_int(f[1], 1, KV_TRACE_MAX_LEN - 1, &len))
            return kv_fail(err, KV_ERR_FORMAT, "trace line %d: expected #prefix,<id 0..%d>,"
                           "<tokens 1..%d>", lineno, KV_TRACE_MAX_PREFIXES - 1,
                           KV_TRACE_MAX_LEN - 1);
        if (t->prefix_len[id])
            return kv_fail(err, KV_ERR_FORMAT, "trace line %d: prefix %d declared twice",
                           lineno, id);
        t->prefix_len[id] = len;
        if (id >= t->n_prefixes) t->n_prefixes = id + 1;
        return KV_OK;
    }
    if (line[0] == '#' || line[0] == 0) return KV_OK;
    const size_t hl = strlen(HEADER);
    if (*cols < 0) { /* the header comes first, with or without the priority column */
        if (strncmp(line, HEADER, hl) || (line[hl] && strcmp(line + hl, PRIO_COL)))
            return kv_fail(err, KV_ERR_FORMAT, "trace line %d: expected the header \"%s\" "
                           "(optionally followed by \"%s\")", lineno, HEADER, PRIO_COL);
        *cols = line[hl] ? 7 : 6;
        return KV_OK;
    }
    int nf = split(line, f, 7);
    if (nf != *cols)
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: %d fields, expected %d (%s%s)", lineno,
                       nf, *cols, HEADER, *cols == 7 ? PRIO_COL : "");
    kv_request q;
    q.priority = 0;
    if (nf == 7 && field_int(f[6], 0, KV_TRACE_MAX_PRIORITY, &q.priority))
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: priority \"%s\" is not 0 (normal) "
                       "or 1 (high)", lineno, f[6]);
    char *end;
    errno = 0;
    q.arrival_s = strtod(f[0], &end);
    /* bounded, so kv_trace_format's "%.3f" fits its row budget (1e300 would print 300 digits) */
    /* and decimal: strtod also reads "0x1p3", which no trace writer produces */
    if (end == f[0] || *end || errno || f[0][strspn(f[0], "0123456789.eE+-")] ||
        !isfinite(q.arrival_s) || q.arrival_s < 0 ||
        q.arrival_s > KV_TRACE_MAX_ARRIVAL)
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: arrival_s \"%s\" is not a number in "
                       "[0, %g]", lineno, f[0], KV_TRACE_MAX_ARRIVAL);
    if (t->n > 0 && q.arrival_s < t->req[t->n - 1].arrival_s)
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: arrival %.3f before the previous "
                       "request's %.3f (rows must be sorted)", lineno, q.arrival_s,
                       t->req[t->n - 1].arrival_s);
    const char *names[5] = {"prompt_len", "output_len", "n_samples", "beam_width", "prefix_id"};
    const int lo[5] = {1, 1, 1, 1, -1};
    const int hi[5] = {KV_TRACE_MAX_LEN, KV_TRACE_MAX_LEN, KV_TRACE_MAX_FANOUT,
                       KV_TRACE_MAX_FANOUT, KV_TRACE_MAX_PREFIXES - 1};
    int *dst[5] = {&q.prompt_len, &q.output_len, &q.n_samples, &q.beam_width, &q.prefix_id};
    for (int k = 0; k < 5; k++)
        if (field_int(f[k + 1], lo[k], hi[k], dst[k]))
            return kv_fail(err, KV_ERR_FORMAT, "trace line %d: %s \"%s\" is not an integer in "
                           "%d..%d", lineno, names[k], f[k + 1], lo[k], hi[k]);
    if (q.n_samples > 1 && q.beam_width > 1)
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: n_samples %d and beam_width %d: "
                       "a request samples or beams, not both", lineno, q.n_samples, q.beam_width);
    if (q.prefix_id >= 0 && !t->prefix_len[q.prefix_id])
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: prefix_id %d is not declared "
                       "(#prefix,%d,<tokens> before the header)", lineno, q.prefix_id,
                       q.prefix_id);
    if (q.prefix_id >= 0 && q.prompt_len <= t->prefix_len[q.prefix_id])
        return kv_fail(err, KV_ERR_FORMAT, "trace line %d: prompt_len %d not longer than its "
                       "prefix %d (%d tokens)", lineno, q.prompt_len, q.prefix_id,
                       t->prefix_len[q.prefix_id]);
    if (t->n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        kv_request *nr = realloc(t->req, (size_t)nc * sizeof(*nr));
        if (!nr) return kv_fail(err, KV_ERR_NOMEM, "trace: no memory for %d requests", nc);
        t->req = nr;
        *cap = nc;
    }
    t->req[t->n++] = q;
    return KV_OK;
}

int kv_trace_parse(const char *text, kv_trace *t, kv_err *err)
{
    memset(t, 0, sizeof(*t));
    int cap = 0, cols = -1, lineno = 0;
    kv_err e2;
    int st = kv_text_check_lines(text, &e2); /* CR-only endings: one long line */
    if (st) return kv_fail(err, st, "trace: %s", e2.msg);
    char line[512];
    for (const char *p = text; *p && !st;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        lineno++;
        if (len >= sizeof(line)) {
            st = kv_fail(err, KV_ERR_FORMAT, "trace line %d: longer than %zu characters", lineno,
                         sizeof(line) - 1);
            break;
        }
        memcpy(line, p, len);
        line[len] = 0;
        if (len && line[len - 1] == '\r') line[len - 1] = 0; /* files edited on Windows */
        st = parse_line(line, lineno, t, &cap, &cols, err);
        p += len + (e ? 1 : 0);
    }
    if (!st && cols < 0)
        st = kv_fail(err, KV_ERR_FORMAT, "trace: no header line \"%s\"", HEADER);
    if (!st && t->n == 0) st = kv_fail(err, KV_ERR_FORMAT, "trace: no requests");
    if (st) kv_trace_free(t);
    return st;
}

int kv_trace_load(const char *path, kv_trace *t, kv_err *err)
{
    memset(t, 0, sizeof(*t));
    char *buf;
    kv_err e2;
    int st = kv_file_read_text(path, KV_TRACE_MAX_BYTES, &buf, NULL, &e2);
    if (st) return kv_fail(err, st, "trace: %s", e2.msg);
    st = kv_trace_parse(buf, t, err);
    free(buf);
    return st;
}

/* splitmix64: a token id from (stream, position) */
static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int kv_trace_set_prompts(kv_trace *t, const int *const *ids, const int *len, int n, kv_err *err)
{
    if (n < 1) return kv_fail(err, KV_ERR_ARG, "trace: %d real prompts", n);
    for (int j = 0; j < n; j++)
        if (len[j] < 1 || len[j] > KV_TRACE_MAX_LEN)
            return kv_fail(err, KV_ERR_ARG, "trace: real prompt %d has %d tokens (1..%d)", j,
                           len[j], KV_TRACE_MAX_LEN);
    int **own = calloc((size_t)t->n, sizeof *own);
    for (int i = 0; own && i < t->n; i++) {
        const int j = i % n;
        if (!(own[i] = malloc(sizeof(int) * (size_t)len[j]))) {
            for (int k = 0; k < i; k++) free(own[k]);
            free(own);
            own = NULL;
            break;
        }
        memcpy(own[i], ids[j], sizeof(int) * (size_t)len[j]);
    }
    if (!own) return kv_fail(err, KV_ERR_NOMEM, "trace: out of memory for the real prompts");
    for (int i = 0; t->ids && i < t->n; i++) free(t->ids[i]);
    free(t->ids);
    t->ids = own;
    for (int i = 0; i < t->n; i++) {
        t->req[i].prompt_len = len[i % n];
        t->req[i].prefix_id = -1;
    }
    return KV_OK;
}

void kv_trace_tokens(const kv_trace *t, int i, int vocab, int *out)
{
    const kv_request *q = &t->req[i];
    if (t->ids) {
        memcpy(out, t->ids[i], sizeof(int) * (size_t)q->prompt_len);
        return;
    }
    int np = q->prefix_id >= 0 ? t->prefix_len[q->prefix_id] : 0;
    for (int k = 0; k < q->prompt_len; k++) {
        uint64_t stream = k < np ? (1ull << 40) + (uint64_t)q->prefix_id : (uint64_t)i;
        /* a one-token vocabulary has only token 0 to offer */
        out[k] = vocab < 2 ? 0 : 1 + (int)(mix(mix(stream) + (uint64_t)k) % (uint64_t)(vocab - 1));
    }
}

/* ---- the shipped traces: datasets/traces/<name>.csv -------------------------------------- */

static const struct {
    const char *name, *what;
    kv_trace_spec spec;
} BUILTIN[] = {
    {"sharegpt", "ShareGPT-like lengths, Poisson 1 req/s",
     {KV_TRACE_SHAREGPT, 300, 1.0, 1, 1, 0, {0}, 501, 0, 0, 0}},
    {"alpaca", "Alpaca-like lengths, Poisson 4 req/s",
     {KV_TRACE_ALPACA, 300, 4.0, 1, 1, 0, {0}, 502, 0, 0, 0}},
    {"alpaca_n4", "Alpaca-like, parallel sampling n = 4",
     {KV_TRACE_ALPACA, 300, 4.0, 4, 1, 0, {0}, 503, 0, 0, 0}},
    {"alpaca_beam4", "Alpaca-like, beam search width 4",
     {KV_TRACE_ALPACA, 300, 4.0, 1, 4, 0, {0}, 504, 0, 0, 0}},
    {"sysprompt", "Alpaca-like user turns after one of two shared system prompts (80, 341 tokens)",
     {KV_TRACE_ALPACA, 300, 4.0, 1, 1, 2, {80, 341}, 505, 0, 0, 0}},
    {"bursty", "bursts of 24 ShareGPT-like normal requests, Alpaca-like high-priority ones (25 %)",
     {KV_TRACE_SHAREGPT, 200, 2.0, 1, 1, 0, {0}, 506, 0.25, KV_TRACE_ALPACA, 24}},
};

int kv_trace_builtin_count(void) { return (int)(sizeof(BUILTIN) / sizeof(BUILTIN[0])); }

int kv_trace_builtin(int i, const char **name, const char **what, kv_trace_spec *spec,
                     kv_err *err)
{
    if (i < 0 || i >= kv_trace_builtin_count())
        return kv_fail(err, KV_ERR_ARG, "trace: no shipped trace %d", i);
    if (name) *name = BUILTIN[i].name;
    if (what) *what = BUILTIN[i].what;
    if (spec) *spec = BUILTIN[i].spec;
    return KV_OK;
}
