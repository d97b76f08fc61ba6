/*
 * SmolLM2-135M-Instruct in kvlab against llama.cpp on the same GGUF file (label realmodel:
 * exits 77 with the fetch command when the file is absent).
 *
 * The expected values are llama.cpp's (tests/data/smollm2/, made by tools/peer/make-expected.sh
 * with llama.cpp commit 0c1e57098, one thread; its README says how). kvlab loads the file with
 * every weight dequantized to fp32 (kv_gguf_model_load()) and runs its fp32 forward pass, or,
 * with a second argument `native`, keeps the file's Q4_1 and Q8_0 blocks (--weights native,
 * kv_gguf_model_load_as()) and runs the integer kernels. llama.cpp's CPU matmuls quantize
 * each activation row to 8 bits per block of 32 before the product (Q8_1 against the Q4_1
 * matrices, Q8_0 against the tied Q8_0 classifier); kvlab's native kernels round them the same
 * way (kv_gguf_matmul_fast.h), but add the float terms in another order, and this model
 * carries a small difference far: a code that rounds the other way in one layer moves the
 * next. So neither is bit-equal, and the test holds kvlab to what that difference allows:
 *
 *  1. Greedy decoding, 3 prompts x 64 steps (greedy-{plain,chat,code}.txt). kvlab encodes each
 *     prompt to llama.cpp's ids, then is teacher-forced along llama.cpp's tokens: at every step
 *     it feeds llama.cpp's previous choice, and its argmax must be llama.cpp's choice except at
 *     a near-tie: where kvlab picks token a over llama.cpp's t, the pair's logit difference
 *     l[t] - l[a] has moved from llama.cpp's margin (>= 0) to minus kvlab's gap k[a] - k[t]
 *     (>= 0), and that move, margin + gap, must be at most MARGIN_BOUND; so llama.cpp's margin
 *     there is below MARGIN_BOUND. Until the first such step this is exactly "the same 64
 *     greedy tokens"; after it, every later step is still checked instead of none. The same
 *     bound holds the change of llama.cpp's top-2 margin at every step.
 *  2. The logits: at each step, kvlab's logit of llama.cpp's top-1 and top-2 tokens against
 *     llama.cpp's values; at 4 prompt positions (logits-plain.f32), all 49152 logits. Bounds:
 *     LOGIT_MAX on the largest |difference|, LOGIT_RMS on the root mean square.
 *  3. Perplexity on datasets/models/kjv-heldout.txt at context 512 (perplexity.txt): kvlab
 *     scores PPL_CHUNKS chunks of llama.cpp's own tokens (perplexity-tokens.txt) the way
 *     llama-perplexity does (each chunk from an empty cache, the last 255 predictions of its
 *     512 tokens) and must be within 1 % of llama-perplexity's running value after as many
 *     chunks. (fp32 only: the native run skips it to stay short; its values are below.)
 *
 * The bounds are measured, not derived: llama.cpp's own logits move by up to 1.06 (rms up to
 * 0.25) at these positions when only its KV cache is rounded to f16 (README), so this model
 * is far more sensitive than fp32 round-off suggests. They are set a little above what kvlab
 * showed (x86-64, gcc 12, Release), stated where defined, and hold both ways of running.
 * kvlab's fp32 perplexity comes out lower than llama.cpp's (22.2261 against 22.3027 over 2
 * chunks, -0.34 %), as an unquantized product should; native's was 22.2956 (-0.03 %) over 2
 * chunks, 20.1012 against 20.0552 (+0.23 %) over the first.
 *
 * Usage: test_realmodel_peer <tests/data/smollm2>
 */
#include "common/kv_test.h"
#include "common/kv_test_gguf.h"
#include "common/kv_test_model.h"

#include "kv_cache.h"
#include "kv_forward.h"
#include "kv_gguf_model.h"
#include "kv_vocab.h"

#include <string.h>

#define STEPS 64
#define N_CTX 512
#define PPL_CHUNKS 2
#define PPL_REL 0.01
/* Measured, fp32: a top-2 margin changed by at most 0.633 over the 192 steps (rms 0.161); the
 * 8 steps where kvlab chose otherwise had margin + gap at most 0.347 (llama.cpp's margins
 * 0.005-0.126). Logits: largest |difference| 0.892, rms 0.227 (the 4 full rows), 0.204 (the 384
 * top-2 values at the steps). Native: margins at most 0.574 (rms 0.157); 9 other choices,
 * margin + gap at most 0.462; logits largest 0.943, rms 0.235 (full rows), 0.200 (steps); the
 * first position's row, before any attention, within 0.20 (rms 0.058).
 * Bounds about 1.2-1.4 times the larger. */
#define MARGIN_BOUND 0.75
#define LOGIT_MAX 1.25
#define LOGIT_RMS 0.30

/* ---- llama.cpp's files ------------------------------------------------------------------- */

typedef struct {
    int n_prompt;
    int prompt[128];
    int id[STEPS], id2[STEPS]; /* llama.cpp's choice and runner-up at each step */
    double margin[STEPS], top1[STEPS], top2[STEPS];
} greedy_ref;

/* greedy-NAME.txt: "prompt_ids N ...", then "step I id X margin M top1 L1 top2 ID2 L2" */
static int read_greedy(const char *path, greedy_ref *r)
{
    size_t n;
    char *text = (char *)kv_test_slurp(path, &n);
    int steps = 0;
    r->n_prompt = -1;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        int s, id, id2, at;
        double m, l1, l2;
        if (sscanf(line, "prompt_ids %d%n", &r->n_prompt, &at) == 1) {
            if (r->n_prompt < 1 || r->n_prompt > 128) break;
            char *p = line + at;
            for (int i = 0; i < r->n_prompt; i++) r->prompt[i] = (int)strtol(p, &p, 10);
        } else if (sscanf(line, "step %d id %d margin %lf top1 %lf top2 %d %lf", &s, &id, &m,
                          &l1, &id2, &l2) == 6 && s == steps && s < STEPS) {
            r->id[s] = id, r->id2[s] = id2, r->margin[s] = m, r->top1[s] = l1, r->top2[s] = l2;
            steps++;
        }
    }
    free(text);
    KV_CHECK(r->n_prompt > 0 && steps == STEPS, "%s: prompt %d, %d of %d steps", path,
             r->n_prompt, steps, STEPS);
    return r->n_prompt > 0 && steps == STEPS ? 0 : -1;
}

/* ---- kvlab --------------------------------------------------------------------------------- */

typedef struct {
    const kv_model *m;
    kv_cache c;
    kv_state s;
    int len;
} runner;

static int runner_open(runner *r, const kv_model *m, int capacity)
{
    kv_err err;
    kv_cache_spec spec = kv_cache_spec_default(1, capacity);
    r->m = m;
    r->len = 0;
    kv_state_init(&r->s);
    const int rc = kv_forward_cache_create(&r->c, &m->config, &spec, &err);
    KV_CHECK(rc == KV_OK, "cache: %s", err.msg);
    return rc;
}

static void runner_close(runner *r)
{
    kv_state_free(&r->s);
    kv_cache_free(&r->c);
}

/* Feed @p n tokens; logits [vocab] after the last, and all [n][vocab] when non-NULL. */
static int runner_feed(runner *r, const int *ids, int n, float *logits, float *all)
{
    kv_err err;
    kv_seq q = {0, r->len, n, ids, all};
    const int rc = kv_forward(r->m, &r->c, &r->s, &q, 1, logits, NULL, &err);
    KV_CHECK(rc == KV_OK, "forward at %d (+%d): %s", r->len, n, err.msg);
    r->len += n;
    return rc;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++) best = x[i] > x[best] ? i : best;
    return best;
}

/* the largest |difference| and the sum of squares, accumulated over calls */
typedef struct {
    double max, ss;
    long n;
} diffstat;

static void diff_add(diffstat *d, double a, double b)
{
    const double e = fabs(a - b);
    d->max = e > d->max ? e : d->max;
    d->ss += e * e;
    d->n++;
}

static double diff_rms(const diffstat *d) { return d->n ? sqrt(d->ss / (double)d->n) : 0; }

/* ---- 1 and 2: greedy steps and logits ------------------------------------------------------ */

/* The prompt of greedy-NAME.txt through kvlab's tokenizer: llama.cpp's ids. */
static void check_prompt_ids(const kv_vocab *v, const char *dir, const char *name,
                             const greedy_ref *r)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/prompt-%s.txt", dir, name);
    size_t len;
    char *text = (char *)kv_test_slurp(path, &len);
    KV_CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    int ids[256], n = 0;
    kv_err err;
    const int rc = kv_vocab_encode(v, text, len, 1, 1, ids, 256, &n, &err);
    KV_CHECK(rc == KV_OK, "encode %s: %s", path, err.msg);
    int same = rc == KV_OK && n == r->n_prompt;
    for (int i = 0; same && i < n; i++) same = ids[i] == r->prompt[i];
    KV_CHECK(same, "prompt-%s.txt: kvlab's %d ids differ from llama.cpp's %d", name, n,
             r->n_prompt);
    free(text);
}

/* Teacher-forced greedy steps along llama.cpp's tokens; @p logits_at: the plain prompt's
 * positions whose full logits to hold to logits-plain.f32 (NULL for the other prompts). */
static void check_greedy(const kv_model *m, const kv_vocab *v, const char *dir, const char *name,
                         const float *ref_rows, const int *rows_at, int n_rows, diffstat *steps,
                         diffstat *margins, diffstat *full)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/greedy-%s.txt", dir, name);
    greedy_ref *r = malloc(sizeof *r);
    if (!r || read_greedy(path, r)) return free(r);
    check_prompt_ids(v, dir, name, r);
    const int V = m->config.vocab_size;
    runner run;
    float *logits = malloc(sizeof(float) * (size_t)V);                     /* [vocab] */
    float *all = n_rows ? malloc(sizeof(float) * (size_t)V * r->n_prompt) : NULL; /* [n][vocab] */
    if (!logits || (n_rows && !all) || runner_open(&run, m, r->n_prompt + STEPS)) {
        free(logits), free(all), free(r);
        return;
    }
    int flips = 0, rc = runner_feed(&run, r->prompt, r->n_prompt, logits, all);
    for (int k = 0; k < n_rows && !rc; k++) {
        const float *got = all + (size_t)rows_at[k] * V, *ref = ref_rows + (size_t)k * V;
        diffstat d = {0};
        double mean = 0;
        for (int i = 0; i < V; i++) {
            diff_add(&d, got[i], ref[i]);
            diff_add(full, got[i], ref[i]);
            mean += (double)got[i] - ref[i];
        }
        printf("%s: position %d: max |logit diff| %.4f, rms %.4f, mean %+.4f; argmax %d "
               "(llama.cpp %d)\n", name, rows_at[k], d.max, diff_rms(&d), mean / V,
               argmax(got, V), argmax(ref, V));
    }
    double worst_flip = 0;
    int s = 0;
    /* the change of llama.cpp's top-2 margin in kvlab, at every step */
    for (; s < STEPS && !rc; s++) {
        const int a = argmax(logits, V);
        diff_add(steps, logits[r->id[s]], r->top1[s]);
        diff_add(steps, logits[r->id2[s]], r->top2[s]);
        diff_add(margins, logits[r->id[s]] - logits[r->id2[s]], r->margin[s]);
        if (a != r->id[s]) {
            flips++;
            /* a near-tie: the pair's logit difference moved by llama.cpp's margin plus
             * kvlab's gap the other way, at most MARGIN_BOUND */
            const double gap = logits[a] - logits[r->id[s]];
            worst_flip = r->margin[s] + gap > worst_flip ? r->margin[s] + gap : worst_flip;
            KV_CHECK(r->margin[s] + gap <= MARGIN_BOUND, "%s step %d: kvlab chose %d, llama.cpp "
                     "%d (llama.cpp's margin %.4f + kvlab's %.4f > %.2f)", name, s, a, r->id[s],
                     r->margin[s], gap, MARGIN_BOUND);
        }
        if (s + 1 < STEPS) rc = runner_feed(&run, &r->id[s], 1, logits, NULL);
    }
    KV_CHECK(s == STEPS, "%s: %d of %d steps ran", name, s, STEPS);
    printf("%s: %d prompt tokens, %d steps: %d choice%s differ%s from llama.cpp's (largest "
           "margin + gap among them %.4f; bound %.2f)\n", name, r->n_prompt, STEPS, flips,
           flips == 1 ? "" : "s", flips == 1 ? "s" : "", worst_flip, MARGIN_BOUND);
    runner_close(&run);
    free(logits), free(all), free(r);
}

/* ---- 3: perplexity ------------------------------------------------------------------------- */

/* perplexity-tokens.txt: "tokens: N", then N ids; perplexity.txt: "chunk K PPL" lines */
static int *read_ppl_tokens(const char *dir, int *n)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/perplexity-tokens.txt", dir);
    FILE *f = fopen(path, "r");
    KV_CHECK(f != NULL, "cannot read %s", path);
    if (!f) return NULL;
    char line[256];
    int *ids = NULL, got = 0;
    *n = 0;
    while (!ids && fgets(line, sizeof line, f))
        if (sscanf(line, "tokens: %d", n) == 1 && *n > 0 && *n <= 1 << 20)
            ids = malloc(sizeof(int) * (size_t)*n);
    while (ids && got < *n && fscanf(f, "%d", &ids[got]) == 1) got++;
    fclose(f);
    KV_CHECK(ids && got == *n, "%s: %d of %d ids", path, got, *n);
    if (ids && got != *n) free(ids), ids = NULL;
    return ids;
}

static double ppl_reference(const char *dir, int chunks)
{
    char path[1200], line[256];
    snprintf(path, sizeof path, "%s/perplexity.txt", dir);
    FILE *f = fopen(path, "r");
    double ppl = NAN, v;
    int k;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "chunk %d %lf", &k, &v) == 2 && k == chunks) ppl = v;
    if (f) fclose(f);
    KV_CHECK(!isnan(ppl), "%s: no value after chunk %d", path, chunks);
    return ppl;
}

/* llama-perplexity's score: each chunk of N_CTX tokens from an empty cache, the negative
 * log-likelihood of tokens N_CTX/2 + 1 .. N_CTX - 1 given the logits before them. */
static void check_perplexity(const kv_model *m, const char *dir)
{
    int n = 0;
    int *ids = read_ppl_tokens(dir, &n);
    const double ref = ppl_reference(dir, PPL_CHUNKS);
    if (!ids || isnan(ref) || n < PPL_CHUNKS * N_CTX) return free(ids);
    const int V = m->config.vocab_size, first = N_CTX / 2;
    float *all = malloc(sizeof(float) * (size_t)V * N_CTX); /* [N_CTX][vocab] */
    double nll = 0;
    long count = 0;
    const double t0 = kv_now();
    for (int c = 0; c < PPL_CHUNKS && all; c++) {
        runner run;
        const int *chunk = ids + (size_t)c * N_CTX;
        if (runner_open(&run, m, N_CTX)) break;
        const int rc = runner_feed(&run, chunk, N_CTX, NULL, all);
        runner_close(&run);
        if (rc) break;
        for (int j = first; j < N_CTX - 1; j++) {
            const float *row = all + (size_t)j * V;
            const int best = argmax(row, V);
            double sum = 0;
            for (int i = 0; i < V; i++) sum += exp((double)row[i] - row[best]);
            nll += log(sum) - ((double)row[chunk[j + 1]] - row[best]);
            count++;
        }
    }
    const double ppl = count ? exp(nll / (double)count) : NAN;
    printf("perplexity: %d chunks of %d (%ld predictions) in %.1f s: kvlab %.4f, llama.cpp "
           "%.4f (%+.3f %%)\n", PPL_CHUNKS, N_CTX, count, kv_now() - t0, ppl, ref,
           100.0 * (ppl / ref - 1.0));
    KV_CHECK(count == (long)PPL_CHUNKS * (N_CTX - first - 1), "%ld predictions scored", count);
    KV_CHECK(fabs(ppl / ref - 1.0) <= PPL_REL, "perplexity %.4f, llama.cpp %.4f: more than %.0f "
             "%% apart", ppl, ref, 100 * PPL_REL);
    free(all);
    free(ids);
}

/* logits-plain.f32: 4 rows of vocab little-endian floats, at the positions logits-plain.txt
 * names ("positions: 4 P P P P") */
static float *read_ref_logits(const char *dir, int V, int *at, int *n_at)
{
    char path[1200], line[256];
    snprintf(path, sizeof path, "%s/logits-plain.txt", dir);
    FILE *f = fopen(path, "r");
    *n_at = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "positions: %d %d %d %d %d", n_at, &at[0], &at[1], &at[2], &at[3]) == 5)
            break;
    if (f) fclose(f);
    KV_CHECK(*n_at == 4, "%s: no 'positions: 4 ...' line", path);
    snprintf(path, sizeof path, "%s/logits-plain.f32", dir);
    size_t bytes = 0;
    float *rows = (float *)kv_test_slurp(path, &bytes);
    const int ok = rows && *n_at == 4 && bytes == sizeof(float) * 4 * (size_t)V;
    KV_CHECK(ok, "%s: %zu bytes, want %zu", path, bytes, sizeof(float) * 4 * (size_t)V);
    if (!ok) free(rows), rows = NULL, *n_at = 0;
    return rows; /* the file's bytes are little-endian floats, as this host's */
}

int main(int argc, char **argv)
{
    const int storage = argc == 3 ? kv_weights_storage_parse(argv[2]) : KV_WEIGHTS_F32;
    if (argc < 2 || argc > 3 || (storage != KV_WEIGHTS_F32 && storage != KV_WEIGHTS_NATIVE)) {
        fprintf(stderr, "usage: %s <tests/data/smollm2> [f32|native]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    char path[1200];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) return KV_TEST_SKIP;
    kv_gguf *g = NULL;
    kv_vocab *v = NULL;
    kv_model m;
    kv_err err;
    int rc = kv_gguf_open(path, &g, &err);
    KV_CHECK(rc == KV_OK, "%s", err.msg);
    if (!rc) {
        rc = kv_vocab_from_gguf(g, &v, &err);
        KV_CHECK(rc == KV_OK, "vocab: %s", err.msg);
    }
    const double t0 = kv_now();
    if (!rc) {
        rc = kv_gguf_model_load_as(g, &m, storage, NULL, NULL, &err);
        KV_CHECK(rc == KV_OK, "load: %s", err.msg);
    }
    if (rc) {
        kv_vocab_free(v);
        kv_gguf_close(g);
        return kv_test_finish();
    }
    printf("weights %s: loaded in %.1f s\n", kv_weights_storage_name(storage), kv_now() - t0);
    const int V = m.config.vocab_size;
    int at[4], n_at;
    float *ref_rows = read_ref_logits(dir, V, at, &n_at);
    diffstat steps = {0}, margins = {0}, full = {0};
    const double t1 = kv_now();
    check_greedy(&m, v, dir, "plain", ref_rows, at, n_at, &steps, &margins, &full);
    check_greedy(&m, v, dir, "chat", NULL, NULL, 0, &steps, &margins, &full);
    check_greedy(&m, v, dir, "code", NULL, NULL, 0, &steps, &margins, &full);
    printf("top-2 margins at %ld steps: changed by at most %.4f (rms %.4f; bound %.2f)\n",
           margins.n, margins.max, diff_rms(&margins), MARGIN_BOUND);
    KV_CHECK(margins.max <= MARGIN_BOUND, "a top-2 margin changed by %.4f > %.2f", margins.max,
             MARGIN_BOUND);
    printf("greedy: %.1f s; top-2 logits at %ld step values: max |diff| %.4f, rms %.4f; full "
           "rows: max %.4f, rms %.4f (bounds %.2f, %.2f)\n", kv_now() - t1, steps.n, steps.max,
           diff_rms(&steps), full.max, diff_rms(&full), LOGIT_MAX, LOGIT_RMS);
    KV_CHECK(full.n == 4L * V, "%ld of %ld reference logits compared", full.n, 4L * V);
    KV_CHECK(steps.max <= LOGIT_MAX && full.max <= LOGIT_MAX, "largest logit difference %.4f, "
             "%.4f > %.2f", steps.max, full.max, LOGIT_MAX);
    KV_CHECK(diff_rms(&steps) <= LOGIT_RMS && diff_rms(&full) <= LOGIT_RMS, "rms logit "
             "difference %.4f, %.4f > %.2f", diff_rms(&steps), diff_rms(&full), LOGIT_RMS);
    if (storage == KV_WEIGHTS_F32) check_perplexity(&m, dir);
    free(ref_rows);
    kv_model_free(&m);
    kv_vocab_free(v);
    kv_gguf_close(g);
    return kv_test_finish();
}
