/* The GPU engine vs the CPU engine (chapters 01-02): kvcu_forward() against kv_forward().
 *
 *  - logits within the fp32 tolerances of kv_test.h over a prefill and 20 decode steps, for
 *    MHA, GQA and MQA models with head_dim 32 and 64 (one with partial rotary dims, one with
 *    per-pair RoPE frequency factors as a Llama 3.x GGUF has them);
 *  - a batch of 3 sequences (prefills beside decodes) matches the CPU, and each sequence's
 *    GPU logits are bit-identical to its solo GPU run;
 *  - naive recompute and the KV cache on the GPU choose identical greedy tokens, with
 *    bit-identical final logits;
 *  - bad batches are refused like the CPU refuses them, leaving the cache as it was; an
 *    unsupported spec is KV_ERR_UNSUPPORTED, an impossible one KV_ERR_NOMEM;
 *  - the work counters equal the CPU's;
 *  - with the prefill on tensor cores (kvcu_state_set_prefill 5: v5; 6: v6, the CLI's
 *    default): a chunked prefill and a prefill in a batch give the one-shot prefill's logits
 *    bit for bit, near the CPU's;
 *  - with bf16 or fp16 weights (kvcu_model_set_weights): the same, for the projections.
 * Exits 77 (skipped) without a usable device. */
#include "kv_backend.h"
#include "kv_generate.h"
#include "kv_model.h"
#include "kv_sampler.h"
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_gpu.h"
#include "kvcu.h"

#include <math.h>
#include <string.h>

typedef struct {
    const char *name;
    int dim, n_heads, n_kv_heads, rotary_dim; /* rotary_dim 0: the whole head */
    int factors; /* 1: RoPE frequency factors 1, 2, .. per pair (kv_config.rope_factors) */
} engine_case;

/* Small widths: the emulation build runs this test under three schedules. */
static const engine_case cases[] = {
    {"MHA d32", 64, 2, 2, 0},
    {"GQA d32 (G 2), partial rotary", 128, 4, 2, 16},
    {"MQA d32 (G 3)", 96, 3, 1, 0},
    {"MHA d64", 64, 1, 1, 0},
    {"MQA d64 (G 2)", 128, 2, 1, 0},
    /* within 48 positions pair i turns i+1 times slower than theta^(-2i/d): whole radians
     * apart from the plain angles, so a GPU RoPE that ignored the factors would miss */
    {"GQA d32 (G 2), RoPE factors", 128, 4, 2, 0, 1},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

enum { VOCAB = 97, CAPACITY = 48 };

static int make_model(kv_model *m, const engine_case *ec, uint64_t seed)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = ec->dim;
    c.hidden_dim = 72; /* not a multiple of any tile */
    c.n_layers = 2;
    c.n_heads = ec->n_heads;
    c.n_kv_heads = ec->n_kv_heads;
    c.vocab_size = VOCAB;
    c.seq_len = CAPACITY;
    kv_config_set_defaults(&c);
    if (ec->rotary_dim) c.rotary_dim = ec->rotary_dim;
    c.n_rope_factors = ec->factors ? c.rotary_dim / 2 : 0;
    for (int i = 0; i < c.n_rope_factors; i++) c.rope_factors[i] = (float)(i + 1);
    return kv_test_model_random(m, &c, seed);
}

/* The CPU and GPU engines side by side on one model. */
typedef struct {
    const kv_model *m;
    kv_cache c;
    kv_state s;
    kvcu_model *gm;
    kvcu_cache *gc;
    kvcu_state *gs;
} pair;

static int pair_open(pair *p, const kv_model *m, int n_slots)
{
    memset(p, 0, sizeof *p);
    p->m = m;
    kv_cache_spec spec = kv_cache_spec_default(n_slots, CAPACITY);
    kv_err e;
    int rc = kv_cache_create(&p->c, &m->config, &spec, &e);
    kv_state_init(&p->s);
    if (!rc) rc = kvcu_model_upload(&p->gm, m, &e);
    if (!rc) rc = kvcu_cache_create(&p->gc, &m->config, &spec, &e);
    if (!rc) rc = kvcu_state_create(&p->gs, &e);
    KV_CHECK(rc == KV_OK, "engines: %s", e.msg);
    return rc;
}

static void pair_close(pair *p)
{
    kv_cache_free(&p->c);
    kv_state_free(&p->s);
    kvcu_model_free(p->gm);
    kvcu_cache_free(p->gc);
    kvcu_state_free(p->gs);
}

/* One step on both engines; logits compared. Returns the CPU's status (both must agree). */
static int pair_step(pair *p, const kv_seq *seqs, int n, float *cpu, float *gpu,
                     kv_counters *cc, kv_counters *gc, const char *what)
{
    kv_err e1, e2;
    int r1 = kv_forward(p->m, &p->c, &p->s, seqs, n, cpu, cc, &e1);
    int r2 = kvcu_forward(p->gm, p->gc, p->gs, seqs, n, gpu, gc, &e2);
    KV_CHECK(r1 == r2, "%s: CPU status %d (%s), GPU status %d (%s)", what, r1, r1 ? e1.msg : "",
             r2, r2 ? e2.msg : "");
    if (r1 == KV_OK && r2 == KV_OK && cpu)
        KV_CHECK(kv_test_compare(what, gpu, cpu, (long)n * VOCAB, KV_TOL_F32_ATOL,
                                 KV_TOL_F32_RTOL) == 0, "%s: GPU logits differ from CPU", what);
    for (int i = 0; i < n; i++)
        if (seqs[i].slot >= 0 && seqs[i].slot < p->c.spec.n_slots)
            KV_CHECK(kvcu_cache_length(p->gc, seqs[i].slot) == p->c.len[seqs[i].slot],
                     "%s: slot %d holds %d tokens on the GPU, %d on the CPU", what, seqs[i].slot,
                     kvcu_cache_length(p->gc, seqs[i].slot), p->c.len[seqs[i].slot]);
    return r1;
}

/* ---- prefill + 20 decode steps over the grid of models ------------------------------- */

static void test_decode(const engine_case *ec, uint64_t seed)
{
    kv_model m;
    pair p;
    if (make_model(&m, ec, seed)) return;
    if (pair_open(&p, &m, 1)) {
        pair_close(&p);
        kv_model_free(&m);
        return;
    }
    float cpu[VOCAB], gpu[VOCAB];
    kv_counters cc = {0}, gc = {0};
    int prompt[9], tok = 0;
    for (int i = 0; i < 9; i++) prompt[i] = (13 * i + 5) % VOCAB;
    char what[96];
    kv_seq q = {0, 0, 9, prompt};
    snprintf(what, sizeof what, "%s prefill 9", ec->name);
    int rc = pair_step(&p, &q, 1, cpu, gpu, &cc, &gc, what);
    for (int step = 0; step < 20 && rc == KV_OK; step++) {
        tok = kv_argmax(cpu, VOCAB); /* both engines follow the CPU's choice */
        q = (kv_seq){0, 9 + step, 1, &tok};
        snprintf(what, sizeof what, "%s decode %d", ec->name, step);
        rc = pair_step(&p, &q, 1, cpu, gpu, &cc, &gc, what);
    }
    /* a step without logits skips the classifier on both, and in both counters */
    q = (kv_seq){0, 29, 1, &tok};
    snprintf(what, sizeof what, "%s step without logits", ec->name);
    pair_step(&p, &q, 1, NULL, NULL, &cc, &gc, what);
    KV_CHECK(memcmp(&cc, &gc, sizeof cc) == 0,
             "%s: counters differ: flops_proj %g vs %g, flops_attn %g vs %g, tokens %lld vs %lld",
             ec->name, cc.flops_proj, gc.flops_proj, cc.flops_attn, gc.flops_attn,
             (long long)cc.tokens, (long long)gc.tokens);
    pair_close(&p);
    kv_model_free(&m);
}

/* ---- a batch of 3 sequences ----------------------------------------------------------- */

enum { NSEQ = 3, STEPS = 7 };
static const int plen[NSEQ] = {5, 1, 11};

/* Sequence i in slot (i + 1) % 3; C joins at step 1 with its prompt beside A and B's decodes.
 * Records every sequence's token stream and GPU logits [NSEQ][STEPS][VOCAB]. */
static void test_batch(const engine_case *ec, uint64_t seed)
{
    kv_model m;
    pair p;
    if (make_model(&m, ec, seed)) return;
    if (pair_open(&p, &m, NSEQ)) {
        pair_close(&p);
        kv_model_free(&m);
        return;
    }
    int prompts[NSEQ][11], stream[NSEQ][11 + STEPS], done[NSEQ] = {0};
    static float batched[NSEQ][STEPS][VOCAB];
    float cpu[NSEQ * VOCAB], gpu[NSEQ * VOCAB];
    for (int i = 0; i < NSEQ; i++)
        for (int t = 0; t < plen[i]; t++) stream[i][t] = prompts[i][t] = (29 * i + 7 * t + 1) % VOCAB;
    for (int step = 0; step < STEPS + 1; step++) {
        kv_seq b[NSEQ];
        int who[NSEQ], n = 0;
        for (int i = 0; i < NSEQ; i++) {
            if ((i == 2 && step == 0) || done[i] == STEPS) continue;
            const int len = plen[i] + done[i]; /* tokens known so far */
            if (done[i] == 0)
                b[n] = (kv_seq){(i + 1) % NSEQ, 0, plen[i], prompts[i]};
            else
                b[n] = (kv_seq){(i + 1) % NSEQ, len - 1, 1, &stream[i][len - 1]};
            who[n++] = i;
        }
        if (n == 0) break;
        char what[96];
        snprintf(what, sizeof what, "%s batch step %d (%d sequences)", ec->name, step, n);
        if (pair_step(&p, b, n, cpu, gpu, NULL, NULL, what)) break;
        for (int j = 0; j < n; j++) {
            const int i = who[j];
            memcpy(batched[i][done[i]], gpu + j * VOCAB, sizeof(float) * VOCAB);
            stream[i][plen[i] + done[i]] = kv_argmax(cpu + j * VOCAB, VOCAB);
            done[i]++;
        }
    }
    pair_close(&p);

    /* each sequence alone on the GPU, fed the same tokens: the same bits */
    kvcu_model *gm = NULL;
    kvcu_cache *c1 = NULL;
    kvcu_state *s1 = NULL;
    kv_cache_spec spec = kv_cache_spec_default(1, CAPACITY);
    kv_err e;
    int rc = kvcu_model_upload(&gm, &m, &e);
    if (!rc) rc = kvcu_cache_create(&c1, &m.config, &spec, &e);
    if (!rc) rc = kvcu_state_create(&s1, &e);
    KV_CHECK(rc == KV_OK, "solo engine: %s", e.msg);
    for (int i = 0; i < NSEQ && rc == KV_OK; i++) {
        kvcu_cache_reset(c1, 0);
        int same = 1;
        for (int k = 0; k < STEPS && rc == KV_OK; k++) {
            const int len = plen[i] + k;
            kv_seq q = k == 0 ? (kv_seq){0, 0, plen[i], prompts[i]}
                              : (kv_seq){0, len - 1, 1, &stream[i][len - 1]};
            rc = kvcu_forward(gm, c1, s1, &q, 1, gpu, NULL, &e);
            KV_CHECK(rc == KV_OK, "solo forward: %s", e.msg);
            same &= memcmp(gpu, batched[i][k], sizeof(float) * VOCAB) == 0;
        }
        KV_CHECK(same, "%s: sequence %d: batched GPU logits are not bit-identical to solo",
                 ec->name, i);
    }
    kvcu_state_free(s1);
    kvcu_cache_free(c1);
    kvcu_model_free(gm);
    kv_model_free(&m);
}

/* ---- naive recompute vs KV cache on the GPU -------------------------------------------- */

static void test_naive_vs_cached(const engine_case *ec, uint64_t seed)
{
    kv_model m;
    if (make_model(&m, ec, seed)) return;
    enum { N = 12 };
    const int prompt[4] = {3, 1, 4, 1};
    int tok[2][N];
    float last[2][VOCAB];
    kv_cache_spec spec = kv_cache_spec_default(1, CAPACITY);
    for (int mode = 0; mode < 2; mode++) {
        kv_backend *b = NULL;
        kv_err e;
        int rc = kvcu_backend_create(&b, &m, &spec, &e);
        KV_CHECK(rc == KV_OK, "kvcu_backend_create: %s", e.msg);
        if (rc) break;
        KV_CHECK(strncmp(b->name, "cuda", 4) == 0 && b->config->n_heads == m.config.n_heads,
                 "backend name '%s' and config", b->name);
        kv_gen_opts o;
        memset(&o, 0, sizeof o);
        o.mode = mode == 0 ? KV_MODE_NAIVE : KV_MODE_CACHED;
        o.n_steps = N;
        o.last_logits = last[mode];
        rc = kv_generate(b, prompt, 4, &o, tok[mode], NULL, &e);
        KV_CHECK(rc == KV_OK, "kv_generate on the GPU: %s", e.msg);
        KV_CHECK(b->length(b, 0) == 4 + N - 1, "%s: slot holds %d tokens after generation",
                 ec->name, b->length(b, 0));
        kv_backend_destroy(b);
    }
    KV_CHECK(memcmp(tok[0], tok[1], sizeof tok[0]) == 0,
             "%s: naive and cached GPU runs chose different tokens", ec->name);
    KV_CHECK(memcmp(last[0], last[1], sizeof last[0]) == 0,
             "%s: naive and cached GPU final logits are not bit-identical", ec->name);
    kv_model_free(&m);
}

/* ---- refusals ------------------------------------------------------------------------- */

static void test_refusals(void)
{
    kv_model m;
    if (make_model(&m, &cases[1], 5)) return;
    pair p;
    if (pair_open(&p, &m, 2)) {
        pair_close(&p);
        kv_model_free(&m);
        return;
    }
    float cpu[2 * VOCAB], gpu[2 * VOCAB];
    int toks[CAPACITY] = {0}, bad = VOCAB;
    kv_seq q = {0, 0, 3, toks};
    pair_step(&p, &q, 1, cpu, gpu, NULL, NULL, "refusals: prefill");
    const struct {
        const char *what;
        kv_seq seqs[2];
        int n, want;
    } t[] = {
        {"pos is not the cached length", {{0, 2, 1, toks}}, 1, KV_ERR_ARG},
        {"slot out of range", {{2, 0, 1, toks}}, 1, KV_ERR_ARG},
        {"two sequences in one slot", {{1, 0, 1, toks}, {1, 0, 1, toks}}, 2, KV_ERR_ARG},
        {"token id out of range", {{0, 3, 1, &bad}}, 1, KV_ERR_ARG},
        {"no tokens", {{0, 3, 0, toks}}, 1, KV_ERR_ARG},
        {"capacity exceeded", {{0, 3, CAPACITY - 2, toks}}, 1, KV_ERR_CAPACITY},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kv_err e;
        int rc = kvcu_forward(p.gm, p.gc, p.gs, t[i].seqs, t[i].n, gpu, NULL, &e);
        KV_CHECK(rc == t[i].want, "%s: status %d, want %d", t[i].what, rc, t[i].want);
        if (rc) printf("  refused as expected: %s\n", e.msg);
        KV_CHECK(kvcu_cache_length(p.gc, 0) == 3 && kvcu_cache_length(p.gc, 1) == 0,
                 "%s: a refused step changed the cache", t[i].what);
    }
    /* the refused steps left nothing behind: the next step still matches the CPU */
    q = (kv_seq){0, 3, 2, toks};
    pair_step(&p, &q, 1, cpu, gpu, NULL, NULL, "refusals: step after");
    KV_CHECK(kvcu_cache_length(p.gc, 7) == -1, "length of a slot out of range is -1");
    pair_close(&p);

    kvcu_cache *c = NULL;
    kv_err e;
    kv_cache_spec spec = kv_cache_spec_default(1, 16);
    spec.quant.dtype = 99; /* no such dtype */
    KV_CHECK(kvcu_cache_create(&c, &m.config, &spec, &e) == KV_ERR_UNSUPPORTED && !c,
             "an unknown dtype is KV_ERR_UNSUPPORTED");
    spec = kv_cache_spec_default(65536, 1 << 24); /* 2 x 256 TiB of K/V */
    KV_CHECK(kvcu_cache_create(&c, &m.config, &spec, &e) == KV_ERR_NOMEM && !c,
             "a cache larger than the device is KV_ERR_NOMEM");
    kv_model_free(&m);
}

/* ---- prefill on tensor cores (kvcu_state_set_prefill 5 and 6) --------------------------- */

/* A 40-token prompt's every-row logits with the prefill on tensor cores, v5 or v6: one shot
 * in slot 0; in chunks of 16, 16 and 8 in slot 1; and beside a decode row of slot 0 in slot
 * 2. Each row of v5 or v6 is computed alone (its tiles walk the keys from 0 in the same steps,
 * masked keys add exact zeros), so the chunked and batched rows equal the one-shot rows bit
 * for bit. The whole step against the CPU: v5 and v6 hold each attention output to the bound
 * of test_gpu_flash.c, which two layers carry into the logits; asserted here within 0.5 % of
 * the largest logit, the measured distance printed. With 6 the engine runs v6 on these shapes
 * (kvcu_flash_prefill_version() says so, checked), so a prefill through v6 is what is held. */
enum { PP = 40 };

/* Prefill the PP tokens of prompt in slot 0 of both engines, every row's logits (gpu, cpu
 * [PP][VOCAB]); *worst the largest |gpu - cpu|, *top the largest |cpu|. */
static int prompt_vs_cpu(pair *p, const int *prompt, float *gpu, float *cpu, double *worst,
                         double *top)
{
    static float last[VOCAB];
    kv_err e;
    kv_seq q = {0, 0, PP, prompt, gpu};
    int rc = kvcu_forward(p->gm, p->gc, p->gs, &q, 1, last, NULL, &e);
    q.all_logits = cpu;
    if (!rc) rc = kv_forward(p->m, &p->c, &p->s, &q, 1, last, NULL, &e);
    if (rc) printf("  prefill: %s\n", e.msg);
    *worst = *top = 0.0;
    for (int i = 0; !rc && i < PP * VOCAB; i++) {
        if (fabs(cpu[i]) > *top) *top = fabs(cpu[i]);
        if (fabs(gpu[i] - cpu[i]) > *worst) *worst = fabs(gpu[i] - cpu[i]);
    }
    return rc;
}
static void test_prefill_mma(const engine_case *ec, uint64_t seed, int version)
{
    kv_model m;
    pair p;
    if (make_model(&m, ec, seed)) return;
    kv_err e;
    if (pair_open(&p, &m, 3) || kvcu_state_set_prefill(p.gs, version, &e)) {
        KV_CHECK(0, "%s: prefill %d engines", ec->name, version);
        pair_close(&p);
        kv_model_free(&m);
        return;
    }
    KV_CHECK(kvcu_state_set_prefill(p.gs, 4, &e) == KV_ERR_ARG, "prefill version 4 refused");
    KV_CHECK(kvcu_state_set_prefill(p.gs, version, &e) == KV_OK, "prefill %d again", version);
    const int Hkv = ec->n_kv_heads, d = ec->dim / ec->n_heads;
    KV_CHECK(kvcu_flash_prefill_version(version, ec->n_heads, Hkv, d) == version,
             "%s: the engine's prefill %d runs v%d (it runs v%d)", ec->name, version, version,
             kvcu_flash_prefill_version(version, ec->n_heads, Hkv, d));
    static float one[PP * VOCAB], cpu[PP * VOCAB], part[PP * VOCAB], last[2 * VOCAB];
    int prompt[PP];
    for (int i = 0; i < PP; i++) prompt[i] = (7 * i + 3) % VOCAB;
    double worst, top;
    int rc = prompt_vs_cpu(&p, prompt, one, cpu, &worst, &top);
    KV_CHECK(rc == KV_OK, "%s: prefill on tensor cores (v%d)", ec->name, version);
    printf("%s: prefill on tensor cores (v%d) vs CPU: max |diff| %.3g, %.3g%% of the largest "
           "logit\n", ec->name, version, worst, 100.0 * worst / top);
    KV_CHECK(!rc && worst <= 0.005 * top, "%s: v%d logits %.3g from the CPU's (largest %.3g)",
             ec->name, version, worst, top);
    for (int t0 = 0; t0 < PP && !rc; t0 += 16) { /* chunks 16, 16, 8 */
        const int n = PP - t0 < 16 ? PP - t0 : 16;
        kv_seq c = {1, t0, n, prompt + t0, part + (size_t)t0 * VOCAB};
        rc = kvcu_forward(p.gm, p.gc, p.gs, &c, 1, last, NULL, &e);
    }
    KV_CHECK(!rc && !memcmp(part, one, sizeof one), "%s: chunked prefill on tensor cores "
             "(v%d) differs from the one-shot prefill", ec->name, version);
    int tok = 1;
    kv_seq b[2] = {{0, PP, 1, &tok, NULL}, {2, 0, PP, prompt, part}};
    memset(part, 0, sizeof part);
    if (!rc) rc = kvcu_forward(p.gm, p.gc, p.gs, b, 2, last, NULL, &e);
    KV_CHECK(!rc && !memcmp(part, one, sizeof one), "%s: a prefill beside a decode row "
             "(v%d) differs from the prefill alone", ec->name, version);
    pair_close(&p);
    kv_model_free(&m);
}

/* ---- 16-bit weights on tensor cores (kvcu_model_set_weights) --------------------------- */

/* A 40-token prompt's every-row logits with bf16 (or fp16) weights: alone in slot 0, then in
 * slot 1 beside a decode row of slot 0: bit-identical (no split-K, the same chain of mma
 * steps for an output in any batch). Against the CPU's fp32 weights: weights and activations
 * rounded to 16 bits at every projection; asserted within 5 % (bf16) or 1 % (fp16) of the
 * largest logit, the measured distance printed. */
static void test_weights16(const engine_case *ec, uint64_t seed, int dtype)
{
    kv_model m;
    pair p;
    if (make_model(&m, ec, seed)) return;
    kv_err e;
    if (pair_open(&p, &m, 2) || kvcu_model_set_weights(p.gm, dtype, &e)) {
        KV_CHECK(0, "%s: 16-bit weights", ec->name);
        pair_close(&p);
        kv_model_free(&m);
        return;
    }
    KV_CHECK(kvcu_model_set_weights(p.gm, KV_QF_INT8, &e) == KV_ERR_ARG, "int8 weights refused");
    static float one[PP * VOCAB], cpu[PP * VOCAB], part[PP * VOCAB], last[2 * VOCAB];
    int prompt[PP], tok = 2;
    for (int i = 0; i < PP; i++) prompt[i] = (11 * i + 1) % VOCAB;
    double worst, top;
    int rc = prompt_vs_cpu(&p, prompt, one, cpu, &worst, &top);
    KV_CHECK(rc == KV_OK, "%s: 16-bit weights", ec->name);
    const char *ty = dtype == KV_QF_BF16 ? "bf16" : "fp16";
    printf("%s: %s weights vs CPU: max |diff| %.3g, %.3g%% of the largest logit\n", ec->name,
           ty, worst, 100.0 * worst / top);
    KV_CHECK(!rc && worst <= (dtype == KV_QF_BF16 ? 0.05 : 0.01) * top,
             "%s: %s weights: logits %.3g from the CPU's (largest %.3g)", ec->name, ty, worst,
             top);
    kv_seq b[2] = {{0, PP, 1, &tok, NULL}, {1, 0, PP, prompt, part}};
    if (!rc) rc = kvcu_forward(p.gm, p.gc, p.gs, b, 2, last, NULL, &e);
    KV_CHECK(!rc && !memcmp(part, one, sizeof one), "%s: %s weights: a prefill beside a "
             "decode row differs from the prefill alone", ec->name, ty);
    pair_close(&p);
    kv_model_free(&m);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    for (int i = 0; i < N_CASES; i++) test_decode(&cases[i], 100 + i);
    test_batch(&cases[1], 7);
    test_naive_vs_cached(&cases[2], 11);
    test_refusals();
    for (int v = 5; v <= 6; v++) {
        test_prefill_mma(&cases[1], 5, v);
        test_prefill_mma(&cases[4], 6, v);
    }
    test_weights16(&cases[1], 9, KV_QF_BF16);
    test_weights16(&cases[3], 10, KV_QF_F16);
    return kv_test_finish();
}
