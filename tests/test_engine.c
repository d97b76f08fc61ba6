/* The engine (chapters 01-02): kv_forward, the contiguous cache, the generation loops.
 *
 *  - naive recompute and the KV cache choose the same tokens with the same logits;
 *  - a sequence in a mixed batch (others prefilling or decoding beside it) gets bit-identical
 *    logits to its solo run, with 1 or 2 threads;
 *  - bad batches and specs are refused with the problem named, and leave the cache as it was;
 *  - the work counters equal their closed forms: naive O(n^2) projections and O(n^3)
 *    attention, cached O(n) and O(n^2);
 *  - kv_gen_opts.prefill_step feeds the prompt in pieces, the before_step hook ahead of every
 *    forward call, with the same tokens. */
#include "kv_attention.h"
#include "kv_backend.h"
#include "kv_generate.h"
#include "kv_model.h"
#include "kv_ops.h"
#include "common/kv_test.h"
#include "common/kv_test_backend.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* L 2, seq 300; dim 64 (d 16 with H 4), hidden 2·dim. rotary_dim 0 = the whole head. */
static kv_config tiny_config(int dim, int H, int Hkv, int vocab, int rotary_dim)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = dim;
    c.hidden_dim = 2 * dim;
    c.n_layers = 2;
    c.n_heads = H;
    c.n_kv_heads = Hkv;
    c.vocab_size = vocab;
    c.seq_len = 300;
    kv_config_set_defaults(&c);
    if (rotary_dim) c.rotary_dim = rotary_dim;
    return c;
}

static int make_model(kv_model *m, kv_config c, uint64_t seed) { return kv_test_model_random(m, &c, seed); }

/* ---- naive recompute vs KV cache ------------------------------------------------------- */

/* One generation on a fresh backend; temperature > 0 samples with a fixed seed. */
static int generate(const kv_model *m, int mode, const int *prompt, int n_prompt, int n_steps,
                    int *out, float *last_logits, kv_counters *total, float temperature)
{
    kv_backend *b;
    kv_err e;
    kv_cache_spec spec = kv_cache_spec_default(1, 300);
    int rc = kv_backend_cpu(&b, m, &spec, &e);
    if (rc) {
        printf("kv_backend_cpu: %s\n", e.msg);
        return rc;
    }
    kv_sampler smp;
    kv_sampler_init(&smp, m->config.vocab_size, temperature, 1.0f, 2024, NULL);
    kv_gen_opts o = {0};
    o.mode = mode;
    o.n_steps = n_steps;
    o.last_logits = last_logits;
    o.sampler = &smp;
    rc = kv_generate(b, prompt, n_prompt, &o, out, total, &e);
    if (rc) printf("kv_generate: %s\n", e.msg);
    kv_sampler_free(&smp);
    kv_backend_destroy(b);
    return rc;
}

/* Greedy (temperature 0): random tiny models soon repeat one token, so the tokens are also
 * compared under seeded sampling (temperature > 0), where every step's draw depends on the
 * whole logits vector and any difference between the modes would show. */
static void test_naive_vs_cached(const char *name, kv_config c, uint64_t seed, float temperature,
                                 int steps)
{
    kv_model m;
    if (make_model(&m, c, seed)) {
        KV_CHECK(0, "%s: model", name);
        return;
    }
    const int prompt[5] = {1, 17, 42, 5, 99};
    int tn[256], tc[256];
    if (steps > 256) steps = 256;
    float *ln = malloc(sizeof(float) * c.vocab_size), *lc = malloc(sizeof(float) * c.vocab_size);
    KV_CHECK(generate(&m, KV_MODE_CACHED, prompt, 5, steps, tc, lc, NULL, temperature) == 0,
             "cached run");
    KV_CHECK(generate(&m, KV_MODE_NAIVE, prompt, 5, steps, tn, ln, NULL, temperature) == 0,
             "naive run");
    int first_diff = -1, changes = 0;
    for (int i = 0; i < steps && first_diff < 0; i++)
        if (tn[i] != tc[i]) first_diff = i;
    for (int i = 1; i < steps; i++) changes += tc[i] != tc[i - 1];
    KV_CHECK(first_diff < 0,
             "%s, T %g: naive and cached tokens agree over %d steps (first diff %d)",
             name, (double)temperature, steps, first_diff);
    /* greedy: the chosen seed's tokens change a few times before settling; sampled: often */
    KV_CHECK(changes >= (temperature > 0 ? steps / 2 : 3),
             "%s, T %g: the tokens change %d times (not one repeated token)", name,
             (double)temperature, changes);
    KV_CHECK(kv_test_compare("last logits", ln, lc, c.vocab_size, 0.0, 1e-5) == 0,
             "%s, T %g: logits at step %d within 1e-5 relative", name, (double)temperature, steps);
    /* logits at earlier steps: a generation stopped there ends on that step's logits */
    const int at[2] = {1, 60};
    for (int s = 0; s < 2 && temperature == 0; s++) {
        int on[60], oc[60];
        generate(&m, KV_MODE_NAIVE, prompt, 5, at[s], on, ln, NULL, 0.0f);
        generate(&m, KV_MODE_CACHED, prompt, 5, at[s], oc, lc, NULL, 0.0f);
        KV_CHECK(kv_test_compare("logits", ln, lc, c.vocab_size, 0.0, 1e-5) == 0 &&
                     memcmp(oc, tc, sizeof(int) * at[s]) == 0,
                 "%s: logits at step %d within 1e-5 relative, same tokens", name, at[s]);
    }
    free(ln);
    free(lc);
    kv_model_free(&m);
}

/* ---- batched vs solo -------------------------------------------------------------------- */

/* The 90-token prefill is large enough (T·dim·dim >= 2^18 multiply-adds) that the matmuls
 * and attention of its steps run on threads (kv_ops.c, kv_forward.c); decode-only steps are
 * small and run on one. */
enum { NSEQ = 4, GEN = 24, MAXP = 90, CAP = 128 };
static const int prompt_len[NSEQ] = {1, 6, 13, 90};
static const int start_step[NSEQ] = {0, 0, 3, 7}; /* when each sequence joins the batch */

static void make_prompt(int i, int *p, int vocab)
{
    for (int t = 0; t < prompt_len[i]; t++) p[t] = (37 * i + 11 * t + 3) % vocab;
}

/* Solo: each sequence alone in a one-slot cache. logits [NSEQ][GEN][vocab] */
static void run_solo(const kv_model *m, float *logits)
{
    const int V = m->config.vocab_size;
    for (int i = 0; i < NSEQ; i++) {
        kv_cache c;
        kv_state s;
        kv_cache_spec spec = kv_cache_spec_default(1, CAP);
        kv_cache_create(&c, &m->config, &spec, NULL);
        kv_state_init(&s);
        int p[MAXP], tok = 0;
        make_prompt(i, p, V);
        for (int k = 0; k < GEN; k++) {
            kv_seq q = {0, 0, prompt_len[i], p};
            if (k > 0) q = (kv_seq){0, prompt_len[i] + k - 1, 1, &tok};
            float *l = logits + ((size_t)i * GEN + k) * V;
            int rc = kv_forward(m, &c, &s, &q, 1, l, NULL, NULL);
            if (rc) KV_CHECK(0, "solo forward failed");
            tok = kv_argmax(l, V);
        }
        kv_cache_free(&c);
        kv_state_free(&s);
    }
}

/* Batched: sequence i lives in slot NSEQ-1-i, joins at start_step[i] with its whole prompt
 * (a prefill beside others' decodes), then decodes one token per step. The order of the
 * sequences in the batch flips every step. Returns mixed steps seen (prefill + decode). */
static int run_batched(const kv_model *m, float *logits)
{
    const int V = m->config.vocab_size;
    kv_cache c;
    kv_state s;
    kv_cache_spec spec = kv_cache_spec_default(NSEQ, CAP);
    kv_cache_create(&c, &m->config, &spec, NULL);
    kv_state_init(&s);
    int prompts[NSEQ][MAXP], tok[NSEQ], done[NSEQ] = {0}, mixed = 0;
    for (int i = 0; i < NSEQ; i++) make_prompt(i, prompts[i], V);
    float *step_logits = malloc(sizeof(float) * NSEQ * V);
    for (int step = 0;; step++) {
        kv_seq batch[NSEQ];
        int who[NSEQ], n = 0, prefills = 0;
        for (int j = 0; j < NSEQ; j++) {
            const int i = (step % 2) ? NSEQ - 1 - j : j;
            if (step < start_step[i] || done[i] == GEN) continue;
            if (done[i] == 0) {
                batch[n] = (kv_seq){NSEQ - 1 - i, 0, prompt_len[i], prompts[i]};
                prefills++;
            } else {
                batch[n] = (kv_seq){NSEQ - 1 - i, prompt_len[i] + done[i] - 1, 1, &tok[i]};
            }
            who[n++] = i;
        }
        if (n == 0) break;
        mixed += prefills > 0 && prefills < n;
        kv_err e;
        int rc = kv_forward(m, &c, &s, batch, n, step_logits, NULL, &e);
        if (rc) {
            KV_CHECK(0, "batched forward: %s", e.msg);
            break;
        }
        for (int j = 0; j < n; j++) {
            const int i = who[j];
            memcpy(logits + ((size_t)i * GEN + done[i]) * V, step_logits + (size_t)j * V,
                   sizeof(float) * V);
            tok[i] = kv_argmax(step_logits + (size_t)j * V, V);
            done[i]++;
        }
    }
    free(step_logits);
    kv_cache_free(&c);
    kv_state_free(&s);
    return mixed;
}

static void test_batched_vs_solo(void)
{
    kv_model m;
    if (make_model(&m, tiny_config(64, 4, 2, 512, 8), 77)) {
        KV_CHECK(0, "model");
        return;
    }
    const size_t n = (size_t)NSEQ * GEN * 512;
    float *solo = malloc(sizeof(float) * n), *b1 = malloc(sizeof(float) * n);
    float *b2 = malloc(sizeof(float) * n);
    const int threads = omp_get_max_threads();
    kv_parallel_ignore_load(1); /* the team must run even on a busy machine (kv_ops.h) */
    omp_set_num_threads(2);
    run_solo(&m, solo);
    const int mixed = run_batched(&m, b2);
    omp_set_num_threads(1);
    run_batched(&m, b1);
    omp_set_num_threads(threads);
    kv_parallel_ignore_load(0);
    KV_CHECK(mixed >= 2, "the schedule mixes prefills with decodes (%d mixed steps)", mixed);
    for (int i = 0; i < NSEQ; i++) {
        const size_t off = (size_t)i * GEN * 512, len = sizeof(float) * GEN * 512;
        KV_CHECK(memcmp(solo + off, b2 + off, len) == 0,
                 "sequence %d (prompt %d): batched logits bit-identical to solo (2 threads)", i,
                 prompt_len[i]);
        KV_CHECK(memcmp(b1 + off, b2 + off, len) == 0,
                 "sequence %d: batched logits bit-identical with 1 and 2 threads", i);
    }
    free(solo), free(b1), free(b2);
    kv_model_free(&m);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void expect(int rc, int want, const kv_err *e, const char *needle, const char *what)
{
    KV_CHECK(rc == want && strstr(e->msg, needle) != NULL, "%s: got %s \"%s\", want %s naming '%s'",
             what, kv_status_name(rc), rc ? e->msg : "", kv_status_name(want), needle);
}

static void test_refusals(void)
{
    kv_model m;
    if (make_model(&m, tiny_config(64, 4, 4, 256, 0), 5)) {
        KV_CHECK(0, "model");
        return;
    }
    kv_cache c;
    kv_state s;
    kv_err e;
    kv_cache_spec spec = kv_cache_spec_default(2, 16);
    KV_CHECK(kv_cache_create(&c, &m.config, &spec, &e) == 0, "cache");
    kv_state_init(&s);
    float logits[2 * 256];
    const int ok[3] = {1, 2, 3}, bad_hi[2] = {4, 256}, bad_lo[1] = {-1};
    int many[17] = {0};

    kv_seq q = {2, 0, 3, ok};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_ARG, &e, "slot 2",
           "slot 2 of 2");
    q = (kv_seq){-1, 0, 3, ok};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_ARG, &e, "slot -1", "slot -1");
    q = (kv_seq){0, 3, 3, ok};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_ARG, &e, "pos 3", "wrong pos");
    q = (kv_seq){0, 0, 2, bad_hi};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_ARG, &e, "256", "token 256");
    q = (kv_seq){0, 0, 1, bad_lo};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_ARG, &e, "-1", "token -1");
    q = (kv_seq){0, 0, 0, ok};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_ARG, &e, "n_tokens 0",
           "zero tokens");
    q = (kv_seq){0, 0, 17, many};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_CAPACITY, &e, "capacity 16",
           "17 tokens in 16");
    kv_seq two[2] = {{1, 0, 3, ok}, {1, 0, 3, ok}};
    expect(kv_forward(&m, &c, &s, two, 2, logits, NULL, &e), KV_ERR_ARG, &e, "slot 1",
           "duplicate slots");
    /* a good sequence beside a bad one: the whole step is refused before anything is written */
    two[1] = (kv_seq){0, 5, 1, ok};
    expect(kv_forward(&m, &c, &s, two, 2, logits, NULL, &e), KV_ERR_ARG, &e, "sequence 1",
           "second sequence wrong");
    KV_CHECK(c.len[0] == 0 && c.len[1] == 0, "refused steps leave the cache empty");

    /* the good step then works, and one more token at the capacity edge is refused */
    q = (kv_seq){0, 0, 16, many};
    KV_CHECK(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e) == 0 && c.len[0] == 16,
             "16 tokens fill a 16-token slot");
    q = (kv_seq){0, 16, 1, ok};
    expect(kv_forward(&m, &c, &s, &q, 1, logits, NULL, &e), KV_ERR_CAPACITY, &e, "sequence 0",
           "full slot");

    /* specs kv_cache_create cannot build */
    kv_cache bad;
    kv_cache_spec bs = kv_cache_spec_default(1, 16);
    bs.layout.kind = 9;
    expect(kv_cache_create(&bad, &m.config, &bs, &e), KV_ERR_UNSUPPORTED, &e, "layout", "layout 9");
    bs = kv_cache_spec_default(1, 16);
    bs.quant.dtype = 99;
    expect(kv_cache_create(&bad, &m.config, &bs, &e), KV_ERR_UNSUPPORTED, &e, "dtype", "dtype 99");
    bs = kv_cache_spec_default(0, 16);
    expect(kv_cache_create(&bad, &m.config, &bs, &e), KV_ERR_ARG, &e, "n_slots", "0 slots");
    bs = kv_cache_spec_default(1, 0);
    expect(kv_cache_create(&bad, &m.config, &bs, &e), KV_ERR_ARG, &e, "capacity", "capacity 0");
    kv_backend dummy, *b = &dummy; /* must be reset to NULL on failure */
    bs.capacity = -5;
    expect(kv_backend_cpu(&b, &m, &bs, &e), KV_ERR_ARG, &e, "capacity", "backend, capacity -5");
    KV_CHECK(b == NULL, "a failed kv_backend_cpu leaves *out NULL");
    KV_CHECK(kv_cache_bytes(&c) == (size_t)2 * 2 * 2 * 16 * 4 * 16 * 4,
             "cache bytes = L*2*slots*capacity*H_kv*d*4 (%zu)", kv_cache_bytes(&c));

    /* kv_generate refuses an over-long run before doing any work */
    spec = kv_cache_spec_default(1, 20);
    KV_CHECK(kv_backend_cpu(&b, &m, &spec, &e) == 0, "backend");
    kv_gen_opts o = {0};
    o.mode = KV_MODE_CACHED;
    o.n_steps = 18;
    int out[18];
    kv_counters total = {0};
    expect(kv_generate(b, ok, 3, &o, out, &total, &e), KV_ERR_CAPACITY, &e, "capacity 20",
           "3 + 18 tokens in 20");
    KV_CHECK(total.steps == 0 && b->length(b, 0) == 0, "nothing ran");
    o.n_steps = 17;
    KV_CHECK(kv_generate(b, ok, 3, &o, out, &total, &e) == 0 && total.steps == 17 &&
                 b->length(b, 0) == 19,
             "3 + 17 tokens fit in 20 (length %d)", b->length(b, 0));
    kv_backend_destroy(b);

    /* kv_attention on the cache equals kv_attn_decode on the same rows */
    float qv[64], o1[64], o2[64];
    for (int i = 0; i < 64; i++) qv[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
    KV_CHECK(kv_attention(&c, 1, 0, 15, qv, o1, 4) == 0, "kv_attention");
    KV_CHECK(kv_attn_decode(qv, kv_cache_k(&c, 1, 0, 0), kv_cache_v(&c, 1, 0, 0), o2, 4, 4, 16,
                            16, 16) == 0, "kv_attn_decode");
    KV_CHECK(memcmp(o1, o2, sizeof o1) == 0, "kv_attention == kv_attn_decode on the cache rows");

    kv_cache_free(&c);
    kv_state_free(&s);
    kv_model_free(&m);
}

/* ---- work counters ---------------------------------------------------------------------- */

typedef struct {
    kv_counters sum;
    int calls;
    int attn_growing; /* per-step attention FLOPs strictly increase */
    double last_attn;
} step_log;

static void on_step(void *user, int step, int token, const kv_counters *w, double seconds)
{
    step_log *g = user;
    (void)token, (void)seconds;
    g->sum.flops_proj += w->flops_proj;
    g->sum.flops_attn += w->flops_attn;
    g->sum.kv_bytes_read += w->kv_bytes_read;
    g->sum.kv_bytes_written += w->kv_bytes_written;
    g->sum.tokens += w->tokens;
    g->sum.steps += w->steps;
    if (step > 0 && !(w->flops_attn > g->last_attn)) g->attn_growing = 0;
    g->last_attn = w->flops_attn;
    g->calls++;
}

static void test_counters(void)
{
    kv_config cfg = tiny_config(64, 4, 2, 256, 0);
    kv_model m;
    if (make_model(&m, cfg, 9)) {
        KV_CHECK(0, "model");
        return;
    }
    /* per-token matmul parameters: everything but the embedding (tied classifier) and gains */
    const double L = 2, H = 4, Hkv = 2, d = 16, dim = 64, V = 256;
    const double P = (double)kv_config_param_count(&cfg) - V * dim - 2 * L * dim - dim;
    KV_CHECK(P == L * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128), "per-token parameters %g", P);
    const double A = L * 4 * H * d;       /* attention FLOPs per (query, key) pair */
    const double B = L * 2 * Hkv * d * 4; /* K+V bytes per cached token, fp32 */

    const int prompt[1] = {7};
    for (int n = 1; n <= 12; n += 11) {
        kv_counters tot[2];
        for (int mode = 0; mode < 2; mode++) {
            kv_backend *b;
            kv_cache_spec spec = kv_cache_spec_default(1, 32);
            kv_backend_cpu(&b, &m, &spec, NULL);
            step_log g;
            memset(&g, 0, sizeof g);
            g.attn_growing = 1;
            kv_gen_opts o = {0};
            o.mode = mode;
            o.n_steps = n;
            o.on_step = on_step;
            o.user = &g;
            int out[12];
            memset(&tot[mode], 0, sizeof tot[mode]);
            KV_CHECK(kv_generate(b, prompt, 1, &o, out, &tot[mode], NULL) == 0, "generate");
            KV_CHECK(g.calls == n && memcmp(&g.sum, &tot[mode], sizeof g.sum) == 0,
                     "mode %d: per-step work sums to the total (%d calls)", mode, g.calls);
            KV_CHECK(n == 1 || g.attn_growing, "mode %d: attention work grows every step", mode);
            kv_backend_destroy(b);
        }
        /* prompt of 1 token, n steps. naive step i runs m = i+1 tokens at positions 0..i:
         *   tokens sum m = n(n+1)/2, attention pairs sum m(m+1)/2 = n(n+1)(n+2)/6.
         * cached step i runs 1 token at position i: tokens n, pairs sum (i+1) = n(n+1)/2. */
        const double N = n, tri = N * (N + 1) / 2, tet = N * (N + 1) * (N + 2) / 6;
        const kv_counters *nv = &tot[KV_MODE_NAIVE], *ca = &tot[KV_MODE_CACHED];
        KV_CHECK(nv->tokens == (int64_t)tri && nv->steps == n, "naive tokens %lld",
                 (long long)nv->tokens);
        KV_CHECK(nv->flops_proj == 2 * P * tri + 2 * dim * V * N, "naive projection FLOPs %.0f",
                 nv->flops_proj);
        KV_CHECK(nv->flops_attn == A * tet, "naive attention FLOPs %.0f = %.0f", nv->flops_attn,
                 A * tet);
        KV_CHECK(nv->kv_bytes_read == B * tet && nv->kv_bytes_written == B * tri,
                 "naive KV bytes read %.0f written %.0f", nv->kv_bytes_read, nv->kv_bytes_written);
        KV_CHECK(ca->tokens == n && ca->steps == n, "cached tokens %lld", (long long)ca->tokens);
        KV_CHECK(ca->flops_proj == 2 * P * N + 2 * dim * V * N, "cached projection FLOPs %.0f",
                 ca->flops_proj);
        KV_CHECK(ca->flops_attn == A * tri, "cached attention FLOPs %.0f = %.0f", ca->flops_attn,
                 A * tri);
        KV_CHECK(ca->kv_bytes_read == B * tri && ca->kv_bytes_written == B * N,
                 "cached KV bytes read %.0f written %.0f", ca->kv_bytes_read, ca->kv_bytes_written);
    }

    /* a step without logits skips the classifier, and its FLOPs */
    kv_cache c;
    kv_state s;
    kv_cache_spec spec = kv_cache_spec_default(1, 8);
    kv_cache_create(&c, &cfg, &spec, NULL);
    kv_state_init(&s);
    kv_counters w = {0};
    const int toks[3] = {1, 2, 3};
    kv_seq q = {0, 0, 3, toks};
    KV_CHECK(kv_forward(&m, &c, &s, &q, 1, NULL, &w, NULL) == 0 && w.flops_proj == 2 * P * 3 &&
                 w.flops_attn == A * 6,
             "no logits: projection FLOPs %.0f, attention %.0f", w.flops_proj, w.flops_attn);
    kv_cache_free(&c);
    kv_state_free(&s);
    kv_model_free(&m);
}

/* ---- the prompt in pieces, a hook before each forward call ------------------------------ */

typedef struct {
    int n, pos[64], len[64]; /* the calls seen: first position and tokens */
    int fail_at;             /* the call that returns KV_ERR_IO (0: none) */
} hook_log;

static int log_step(void *hook, kv_backend *b, int pos, int n, kv_err *err)
{
    hook_log *h = hook;
    (void)b;
    if (h->n < 64) h->pos[h->n] = pos, h->len[h->n] = n;
    if (++h->n == h->fail_at) return kv_fail(err, KV_ERR_IO, "the hook's call %d", h->n);
    return KV_OK;
}

/* kv_gen_opts.prefill_step 4 on an 11-token prompt: the prompt goes as 4 + 4 + 3 tokens from
 * position 0, then one token a step at 11 .. 15 (cached), each call after the hook, and the
 * tokens and last logits are the bits of the whole-prompt run (a row's bits do not depend on
 * the rows fed beside it, design.md §8). Naive: every step's prefix in pieces of 4, ceil((11 +
 * i) / 4) calls at step i: 3 + 3 + 4 + 4 + 4 + 4 = 22. A hook's error stops the run with its
 * status; a negative step is refused. */
static void test_prefill_step(void)
{
    kv_model m;
    if (make_model(&m, tiny_config(32, 4, 2, 256, 0), 11)) {
        KV_CHECK(0, "prefill_step: model");
        return;
    }
    const int prompt[11] = {1, 9, 33, 7, 120, 5, 64, 2, 17, 250, 3}, NS = 6;
    int want[6], got[6];
    float lw[256], lg[256];
    kv_backend *b = NULL;
    kv_err e = {{0}};
    const kv_cache_spec spec = kv_cache_spec_default(1, 32);
    int rc = kv_backend_cpu(&b, &m, &spec, &e);
    kv_gen_opts o = {0};
    o.mode = KV_MODE_CACHED;
    o.n_steps = NS;
    o.last_logits = lw;
    if (!rc) rc = kv_generate(b, prompt, 11, &o, want, NULL, &e);
    KV_CHECK(rc == KV_OK, "prefill_step: the whole-prompt run: %s", e.msg);
    hook_log h = {0};
    o.last_logits = lg;
    o.before_step = log_step;
    o.hook = &h;
    o.prefill_step = 4;
    if (!rc) rc = kv_generate(b, prompt, 11, &o, got, NULL, &e);
    KV_CHECK(rc == KV_OK, "prefill_step 4: %s", e.msg);
    const int wpos[8] = {0, 4, 8, 11, 12, 13, 14, 15}, wlen[8] = {4, 4, 3, 1, 1, 1, 1, 1};
    KV_CHECK(!rc && h.n == 8 && !memcmp(h.pos, wpos, sizeof wpos) &&
                 !memcmp(h.len, wlen, sizeof wlen),
             "prefill_step 4, cached: %d hook calls, first at %d+%d (want 8: 0+4 4+4 8+3, then "
             "11 .. 15 one each)", h.n, h.pos[0], h.len[0]);
    KV_CHECK(!rc && !memcmp(got, want, sizeof want) && !memcmp(lg, lw, sizeof lw),
             "prefill_step 4: tokens or last logits differ from the whole-prompt run");
    memset(&h, 0, sizeof h);
    o.mode = KV_MODE_NAIVE;
    if (!rc) rc = kv_generate(b, prompt, 11, &o, got, NULL, &e);
    KV_CHECK(!rc && h.n == 22 && !memcmp(got, want, sizeof want),
             "prefill_step 4, naive: %d hook calls (want 22), %s", h.n, rc ? e.msg : "tokens");
    memset(&h, 0, sizeof h);
    h.fail_at = 3;
    o.mode = KV_MODE_CACHED;
    expect(kv_generate(b, prompt, 11, &o, got, NULL, &e), KV_ERR_IO, &e, "call 3",
           "a hook's error");
    KV_CHECK(h.n == 3, "after the hook's error: %d calls, want 3", h.n);
    o.prefill_step = -1;
    expect(kv_generate(b, prompt, 11, &o, got, NULL, &e), KV_ERR_ARG, &e, "prefill_step",
           "prefill_step -1");
    kv_backend_destroy(b);
    kv_model_free(&m);
}

int main(void)
{
    double t0 = kv_now();
    /* naive recompute over 256 steps runs ~33k token-rows: dim 32 keeps it fast in
     * sanitizer builds too */
    test_naive_vs_cached("MHA", tiny_config(32, 4, 4, 256, 0), 7, 0.0f, 256);
    test_naive_vs_cached("GQA G=2, rotary 4 of 8", tiny_config(32, 4, 2, 512, 4), 2, 0.0f, 256);
    test_naive_vs_cached("MHA", tiny_config(32, 4, 4, 256, 0), 7, 1.0f, 128);
    printf("naive vs cached: %.2f s\n", kv_now() - t0);
    test_batched_vs_solo();
    test_refusals();
    test_counters();
    test_prefill_step();
    printf("total: %.2f s\n", kv_now() - t0);
    return kv_test_finish();
}
