/* Chapter 10 on the GPU: all_logits, cache rollback and speculative decoding on CUDA.
 *
 * Predicted before measured:
 *  - all_logits: a chunk's row j goes through the final RMSNorm (one block per row) and the
 *    classifier (matmul v2 sums a row in v1's order) alone, so it equals the logits of a
 *    one-token CUDA step at that position bit for bit, as the last row equals the step's
 *    logits; against the CPU's all_logits only summation order differs (kv_test.h fp32
 *    tolerance), and the work counters equal the CPU's;
 *  - kvcu_cache_truncate and the CUDA backend's truncate (paged: blocks past len back to the
 *    pool through kv_paged_truncate, shared with the CPU backend) leave a cache that, after
 *    the run continues, holds the rows of a plain run: same lengths, same pool use, same bytes
 *    in every kept row (images downloaded into host caches and read through kv_cache_view);
 *  - greedy speculation on the CUDA backend (target and draft both CUDA) emits exactly the
 *    CUDA backend's own plain greedy tokens for k = 1..4: a draft token is kept only when it is
 *    the target's argmax, and the target's all_logits rows are bit-identical to the plain
 *    run's one-token logits. Asserted against CUDA's own run, not the CPU's: CPU and GPU sum
 *    in different orders, so a near-tie may break differently and an exact match is not a
 *    property of the code. What is asserted against the CPU instead: fed the CUDA tokens, the
 *    CPU scores each one within fp32 tolerance of its own best (agreement is printed);
 *  - refusals as on the CPU: an unarmed KIVI truncate, len outside [0, length], a slot out of
 *    range, cutting into a block the prefix cache registered (length unchanged);
 *  - the prefill on tensor cores (chapter 08's v6, the CLI's default on CUDA): an all_logits
 *    chunk still equals one-token steps bit for bit after it, its logits stay within 0.5 % of
 *    the CPU's largest, and greedy tokens equal the per-row prefill's and the CPU's on the
 *    tiny models (the bound is stated; the identity is measured on these models).
 * Exits 77 (skipped) without a usable device. */
#include "common/kv_test.h"
#include "common/test_spec_common.h"

#include "kv_generate.h"
#include "kv_sampler.h"
#include "kv_spec.h"
#include "kvcu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define P 7   /* prompt tokens */
#define N 16  /* tokens to emit */
#define CAP 48
#define C 5   /* all_logits: a decode chunk after the prompt */
#define B 8   /* block size of the paged specs */

static const int PROMPT[P] = {17, 301, 5, 88, 240, 17, 9};

static kv_cache_spec make_spec(int paged, int dtype)
{
    return spec_cache_spec(paged, dtype, CAP, B);
}

/* ---- all_logits rows == one-token CUDA steps bit for bit, == CPU rows within fp32 ------- */

static void test_all_logits(const kv_model *m, const kv_cache_spec *spec, const char *what)
{
    kv_err e;
    kv_backend *a = NULL, *b = NULL, *c = NULL; /* CUDA chunks, CUDA one at a time, CPU */
    const int V = m->config.vocab_size;
    float *rows = malloc(sizeof(float) * (size_t)P * V);  /* [P][V] CUDA all_logits */
    float *crows = malloc(sizeof(float) * (size_t)P * V); /* [P][V] CPU all_logits */
    float *one = malloc(sizeof(float) * V), *last = malloc(sizeof(float) * V);
    int ok = kvcu_backend_create(&a, m, spec, &e) == KV_OK &&
             kvcu_backend_create(&b, m, spec, &e) == KV_OK &&
             kv_backend_cpu(&c, m, spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: backends: %s", what, e.msg);
    if (!ok) goto done;
    int tok[P + C];
    memcpy(tok, PROMPT, sizeof PROMPT);
    for (int j = 0; j < C; j++) tok[P + j] = (31 * j + 7) % V;
    long bad = 0, bad_last = 0, bad_cpu = 0;
    kv_counters ga = {0}, ca = {0};
    for (int chunk = 0; chunk < 2; chunk++) {
        const int pos = chunk ? P : 0, n = chunk ? C : P;
        const kv_seq s = {0, pos, n, tok + pos, rows}, sc = {0, pos, n, tok + pos, crows};
        /* the prompt chunk without logits: the classifier runs for all_logits alone */
        ok = a->forward(a, &s, 1, chunk ? last : NULL, &ga, &e) == KV_OK &&
             c->forward(c, &sc, 1, chunk ? one : NULL, &ca, &e) == KV_OK;
        KV_CHECK(ok, "%s: chunk forward: %s", what, e.msg);
        if (!ok) goto done;
        if (chunk) bad_last += memcmp(last, rows + (size_t)(n - 1) * V, sizeof(float) * V) != 0;
        bad_cpu += kv_test_compare(what, rows, crows, (long)n * V, KV_TOL_F32_ATOL,
                                   KV_TOL_F32_RTOL);
        for (int j = 0; j < n; j++) {
            const kv_seq t = {0, pos + j, 1, tok + pos + j};
            ok = b->forward(b, &t, 1, one, NULL, &e) == KV_OK;
            KV_CHECK(ok, "%s: one-token forward: %s", what, e.msg);
            if (!ok) goto done;
            bad += memcmp(one, rows + (size_t)j * V, sizeof(float) * V) != 0;
        }
    }
    KV_CHECK(bad == 0, "%s: %ld CUDA all_logits rows differ from one-token CUDA steps", what, bad);
    KV_CHECK(bad_last == 0, "%s: the last all_logits row differs from logits", what);
    KV_CHECK(bad_cpu == 0, "%s: %ld CUDA all_logits values outside fp32 tolerance of the CPU's",
             what, bad_cpu);
    KV_CHECK(memcmp(&ga, &ca, sizeof ga) == 0, "%s: counters differ: proj %.0f vs %.0f", what,
             ga.flops_proj, ca.flops_proj);
done:
    kv_backend_destroy(a);
    kv_backend_destroy(b);
    kv_backend_destroy(c);
    free(rows);
    free(crows);
    free(one);
    free(last);
}

/* ---- the prefill on tensor cores (kvcu_engine_opts.prefill 6) --------------------------- */

/* A prompt's rows through v6, then: an all_logits chunk still takes the per-row kernels, so
 * its rows equal one-token steps after the same prefill bit for bit (what greedy verification
 * needs); the prompt's last logits are within 0.5 % of the largest CPU logit (the bound of
 * test_gpu_engine.c's prefill on tensor cores); greedy decoding after a PL-token prompt
 * chooses the tokens of the per-row prefill and of the CPU, on this test's model. */
enum { PL = 32 }; /* the longer prompt: PL + N - 1 positions fit CAP */

static void test_prefill_mma(const kv_model *m, const kv_cache_spec *spec, const char *what)
{
    kv_err e;
    const kvcu_engine_opts mma = {KV_QF_F32, 6};
    kv_backend *a = NULL, *b = NULL, *s = NULL, *c = NULL; /* v6 x2, per-row, CPU */
    const int V = m->config.vocab_size;
    float *rows = malloc(sizeof(float) * (size_t)C * V); /* [C][V] all_logits after v6 */
    float *one = malloc(sizeof(float) * V), *cpu = malloc(sizeof(float) * V);
    int ok = rows && one && cpu && kvcu_backend_create_opts(&a, m, spec, &mma, &e) == KV_OK &&
             kvcu_backend_create_opts(&b, m, spec, &mma, &e) == KV_OK &&
             kvcu_backend_create(&s, m, spec, &e) == KV_OK &&
             kv_backend_cpu(&c, m, spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: v6 backends: %s", what, e.msg);
    if (!ok) goto done;
    int tok[PL + C];
    for (int j = 0; j < PL + C; j++) tok[j] = (37 * j + 11) % V;
    const kv_seq pa = {0, 0, PL, tok}, ca = {0, PL, C, tok + PL, rows};
    ok = a->forward(a, &pa, 1, NULL, NULL, &e) == KV_OK &&
         a->forward(a, &ca, 1, NULL, NULL, &e) == KV_OK &&
         b->forward(b, &pa, 1, one, NULL, &e) == KV_OK &&
         c->forward(c, &pa, 1, cpu, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: v6 prefill: %s", what, e.msg);
    if (!ok) goto done;
    double worst = 0.0, top = 0.0;
    for (int i = 0; i < V; i++) {
        if (fabs(cpu[i]) > top) top = fabs(cpu[i]);
        if (fabs(one[i] - cpu[i]) > worst) worst = fabs(one[i] - cpu[i]);
    }
    printf("%s: v6 prefill of %d tokens vs CPU: max |diff| %.3g (%.3g%% of the largest logit)\n",
           what, PL, worst, 100.0 * worst / top);
    KV_CHECK(worst <= 0.005 * top, "%s: v6 prefill logits %.3g from the CPU's (largest %.3g)",
             what, worst, top);
    long bad = 0;
    for (int j = 0; j < C && ok; j++) {
        const kv_seq t = {0, PL + j, 1, tok + PL + j};
        ok = b->forward(b, &t, 1, one, NULL, &e) == KV_OK;
        bad += ok && memcmp(one, rows + (size_t)j * V, sizeof(float) * V) != 0;
    }
    KV_CHECK(ok && bad == 0, "%s: after a v6 prefill, %ld all_logits rows differ from one-token "
             "steps (%s)", what, bad, ok ? "" : e.msg);
    int got[N], want[N], ref[N];
    const kv_gen_opts go = {KV_MODE_CACHED, 0, N, NULL, NULL, NULL, NULL};
    a->reset(a, 0);
    ok = kv_generate(a, tok, PL, &go, got, NULL, &e) == KV_OK &&
         kv_generate(s, tok, PL, &go, want, NULL, &e) == KV_OK &&
         kv_generate(c, tok, PL, &go, ref, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: greedy runs: %s", what, e.msg);
    KV_CHECK(ok && !memcmp(got, want, sizeof got), "%s: greedy tokens after the v6 prefill "
             "differ from those after the per-row prefill", what);
    KV_CHECK(ok && !memcmp(got, ref, sizeof got), "%s: greedy tokens after the v6 prefill "
             "differ from the CPU's", what);
done:
    kv_backend_destroy(a);
    kv_backend_destroy(b);
    kv_backend_destroy(s);
    kv_backend_destroy(c);
    free(rows);
    free(one);
    free(cpu);
}

/* ---- host images of device caches ------------------------------------------------------- */

/* A paged CUDA backend's slot 0 as a host cache h (created by the caller for the same spec):
 * its table's blocks read back (read_blocks) into the same pool blocks of h, the same table,
 * the same length. */
static int paged_image(kv_backend *b, kv_cache *h, kv_err *e)
{
    const kv_block_table *t = &b->mem->paged->tables[0];
    const size_t bb = b->mem->block_bytes(b->mem);
    kv_block_copy *up = malloc(sizeof *up * (size_t)(t->n_blocks + 1));
    kv_block_copy *down = malloc(sizeof *down * (size_t)(t->n_blocks + 1));
    uint8_t *host = malloc(bb * (size_t)(t->n_blocks + 1));
    int rc = up && down && host ? KV_OK : kv_fail(e, KV_ERR_NOMEM, "paged image: host memory");
    for (int i = 0; i < t->n_blocks && !rc; i++) {
        up[i] = (kv_block_copy){t->blocks[i], i};
        down[i] = (kv_block_copy){i, t->blocks[i]};
    }
    if (!rc) rc = b->mem->read_blocks(b->mem, up, t->n_blocks, host, bb, e);
    if (!rc) rc = kv_cache_write_blocks(h, down, t->n_blocks, host, bb, e);
    if (!rc) rc = kv_cache_set_blocks(h, 0, t->blocks, t->n_blocks, e);
    if (!rc) h->len[0] = b->length(b, 0);
    free(up);
    free(down);
    free(host);
    return rc;
}

/* ---- truncate: the cache a plain run leaves ---------------------------------------------- */

/* The device cache itself (contiguous): a verification chunk of C tokens, truncate to keep 2,
 * then 3 other tokens; the plain cache takes the 2 kept tokens and the 3 others. */
static void test_cache_truncate(const kv_model *m, int dtype)
{
    kv_err e;
    char what[64];
    snprintf(what, sizeof what, "kvcu_cache_truncate %s", kv_dtype_name(dtype));
    const kv_cache_spec spec = make_spec(0, dtype);
    kvcu_model *gm = NULL;
    kvcu_cache *x = NULL, *y = NULL;
    kvcu_state *s = NULL;
    kv_cache hx = {0}, hy = {0};
    int ok = kvcu_model_upload(&gm, m, &e) == KV_OK &&
             kvcu_cache_create(&x, &m->config, &spec, &e) == KV_OK &&
             kvcu_cache_create(&y, &m->config, &spec, &e) == KV_OK &&
             kvcu_state_create(&s, &e) == KV_OK &&
             kv_cache_create(&hx, &m->config, &spec, &e) == KV_OK &&
             kv_cache_create(&hy, &m->config, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: setup: %s", what, e.msg);
    if (!ok) goto done;
    const int rejected[C] = {3, 4, 200, 201, 202}, rest[3] = {77, 78, 79};
    const int kept[5] = {3, 4, 77, 78, 79};
    const kv_seq px = {0, 0, P, PROMPT}, cx = {0, P, C, rejected};
    const kv_seq rx = {0, P + 2, 3, rest}, py = {0, P, 5, kept};
    ok = kvcu_forward(gm, x, s, &px, 1, NULL, NULL, &e) == KV_OK &&
         kvcu_forward(gm, x, s, &cx, 1, NULL, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: spec steps: %s", what, e.msg);
    if (!ok) goto done;
    KV_CHECK(kvcu_cache_truncate(x, 0, P + C + 1, &e) == KV_ERR_ARG, "%s: len past the length "
             "accepted", what);
    KV_CHECK(kvcu_cache_truncate(x, 0, -1, &e) == KV_ERR_ARG, "%s: negative len accepted", what);
    KV_CHECK(kvcu_cache_truncate(x, 1, 0, &e) == KV_ERR_ARG, "%s: slot 1 of 1 accepted", what);
    KV_CHECK(kvcu_cache_length(x, 0) == P + C, "%s: a refused truncate changed the length", what);
    ok = kvcu_cache_truncate(x, 0, P + 2, &e) == KV_OK;
    KV_CHECK(ok, "%s: truncate: %s", what, e.msg);
    KV_CHECK(kvcu_cache_length(x, 0) == P + 2, "%s: length %d after truncate, want %d", what,
             kvcu_cache_length(x, 0), P + 2);
    ok = ok && kvcu_forward(gm, x, s, &rx, 1, NULL, NULL, &e) == KV_OK &&
         kvcu_forward(gm, y, s, &px, 1, NULL, NULL, &e) == KV_OK &&
         kvcu_forward(gm, y, s, &py, 1, NULL, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: continued steps: %s", what, e.msg);
    if (!ok) goto done;
    const int L = P + 5;
    KV_CHECK(kvcu_cache_length(x, 0) == L && kvcu_cache_length(y, 0) == L,
             "%s: lengths %d and %d, want %d", what, kvcu_cache_length(x, 0),
             kvcu_cache_length(y, 0), L);
    ok = hx.mem_bytes == kvcu_cache_mem_bytes(x) &&
         kvcu_cache_download(x, hx.mem, hx.mem_bytes, &e) == KV_OK &&
         kvcu_cache_download(y, hy.mem, hy.mem_bytes, &e) == KV_OK;
    KV_CHECK(ok, "%s: download: %s", what, e.msg);
    if (!ok) goto done;
    hx.len[0] = hy.len[0] = L;
    const long bad = rows_differ(&hx, &hy, L);
    KV_CHECK(bad == 0, "%s: %ld kept rows/elements differ from the plain run", what, bad);
done:
    kv_cache_free(&hx);
    kv_cache_free(&hy);
    kvcu_state_free(s);
    kvcu_cache_free(x);
    kvcu_cache_free(y);
    kvcu_model_free(gm);
}

/* ---- greedy speculation on CUDA: CUDA's own greedy tokens and cache ---------------------- */

/* Fed the CUDA tokens, the CPU scores each within fp32 tolerance of its own best. Returns the
 * number of steps where it does not; *exact counts the steps where its argmax is the token. */
static long cpu_agrees(const kv_model *m, const int *want, int *exact, kv_err *e)
{
    kv_backend *c = NULL;
    const kv_cache_spec spec = make_spec(0, KV_DTYPE_F32);
    const int V = m->config.vocab_size;
    float *l = malloc(sizeof(float) * V);
    long bad = 0;
    *exact = 0;
    int rc = l ? kv_backend_cpu(&c, m, &spec, e) : kv_fail(e, KV_ERR_NOMEM, "logits");
    for (int i = 0; i < N && !rc; i++) {
        const kv_seq s = i ? (kv_seq){0, P + i - 1, 1, &want[i - 1]} : (kv_seq){0, 0, P, PROMPT};
        rc = c->forward(c, &s, 1, l, NULL, e);
        if (rc) break;
        const int best = kv_argmax(l, V);
        *exact += best == want[i];
        bad += !(l[best] - l[want[i]] <= KV_TOL_F32_ATOL + KV_TOL_F32_RTOL * fabs(l[best]));
    }
    kv_backend_destroy(c);
    free(l);
    return rc ? -1 : bad;
}

static void test_greedy(const kv_model *m, const kv_model *dm, int paged, int dtype)
{
    kv_err e;
    char what[64];
    snprintf(what, sizeof what, "greedy %s %s", paged ? "paged" : "contiguous",
             kv_dtype_name(dtype));
    const kv_cache_spec spec = make_spec(paged, dtype);
    kv_backend *plain = NULL, *t = NULL, *d = NULL;
    kv_cache hx = {0}, hy = {0};
    int ok = kvcu_backend_create(&plain, m, &spec, &e) == KV_OK &&
             kvcu_backend_create(&t, m, &spec, &e) == KV_OK &&
             kvcu_backend_create(&d, dm, &spec, &e) == KV_OK &&
             (!paged || (kv_cache_create(&hx, &m->config, &spec, &e) == KV_OK &&
                         kv_cache_create(&hy, &m->config, &spec, &e) == KV_OK));
    KV_CHECK(ok, "%s: backends: %s", what, e.msg);
    if (!ok) goto done;
    int want[N], got[N];
    const kv_gen_opts go = {KV_MODE_CACHED, 0, N, NULL, NULL, NULL, NULL};
    ok = kv_generate(plain, PROMPT, P, &go, want, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: plain run: %s", what, e.msg);
    if (!ok) goto done;
    const int L = plain->length(plain, 0);
    KV_CHECK(L == P + N - 1, "%s: plain run caches %d tokens, expected %d", what, L, P + N - 1);
    if (!paged && dtype == KV_DTYPE_F32) {
        int exact = 0;
        const long off = cpu_agrees(m, want, &exact, &e);
        KV_CHECK(off == 0, "%s: the CPU fed the CUDA tokens scores %ld of them below its best "
                 "beyond fp32 tolerance (%s)", what, off, off < 0 ? e.msg : "");
        printf("%s: the CPU's own argmax is the CUDA token at %d of %d steps\n", what, exact, N);
    }
    if (paged) ok = paged_image(plain, &hy, &e) == KV_OK;
    KV_CHECK(ok, "%s: plain image: %s", what, e.msg);
    int64_t accepted = 0;
    for (int k = 1; k <= 4 && ok; k++) {
        const kv_spec_opts o = {k, N, 0, 0.0f, 1};
        kv_spec_stats st;
        ok = kv_spec_generate(t, d, PROMPT, P, &o, got, &st, &e) == KV_OK;
        KV_CHECK(ok, "%s k=%d: %s", what, k, e.msg);
        if (!ok) break;
        KV_CHECK(memcmp(got, want, sizeof want) == 0, "%s k=%d: tokens differ from CUDA greedy",
                 what, k);
        KV_CHECK(t->length(t, 0) == L, "%s k=%d: target caches %d tokens, plain %d", what, k,
                 t->length(t, 0), L);
        KV_CHECK(d->length(d, 0) <= L, "%s k=%d: draft caches %d > %d", what, k,
                 d->length(d, 0), L);
        KV_CHECK(st.emitted == N && st.accepted <= st.drafted && st.target_steps + st.accepted == N,
                 "%s k=%d: emitted %lld, accepted %lld of %lld, %lld target steps", what, k,
                 (long long)st.emitted, (long long)st.accepted, (long long)st.drafted,
                 (long long)st.target_steps);
        if (k > 1) KV_CHECK(st.target_kv_rolled_back > 0 || st.accepted == st.drafted,
                            "%s k=%d: rejections but nothing rolled back", what, k);
        accepted += st.accepted;
        if (paged) { /* exactly the blocks the cached rows need, and a plain run's rows */
            const int need = (L + B - 1) / B, dneed = (d->length(d, 0) + B - 1) / B;
            KV_CHECK(t->mem->paged->pool.n_used == need && d->mem->paged->pool.n_used == dneed,
                     "%s k=%d: pools hold %d and %d blocks, the rows need %d and %d", what, k,
                     t->mem->paged->pool.n_used, d->mem->paged->pool.n_used, need, dneed);
            kv_cache_reset(&hx, 0);
            ok = paged_image(t, &hx, &e) == KV_OK;
            KV_CHECK(ok, "%s k=%d: image: %s", what, k, e.msg);
            if (ok) {
                const long bad = rows_differ(&hx, &hy, L);
                KV_CHECK(bad == 0, "%s k=%d: %ld kept rows/elements differ from the plain run",
                         what, k, bad);
            }
        }
    }
    KV_CHECK(accepted > 0, "%s: the draft never agreed: the rollback path alone was tested", what);
    if (paged) {
        t->reset(t, 0);
        d->reset(d, 0);
        KV_CHECK(t->mem->paged->pool.n_used == 0 && d->mem->paged->pool.n_used == 0,
                 "%s: blocks leaked after reset (%d, %d)", what, t->mem->paged->pool.n_used,
                 d->mem->paged->pool.n_used);
    }
done:
    kv_cache_free(&hx);
    kv_cache_free(&hy);
    kv_backend_destroy(plain);
    kv_backend_destroy(t);
    kv_backend_destroy(d);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void test_refusals(const kv_model *m, const kv_model *dm)
{
    kv_err e;
    /* a window: the undo log rolls the ring back (test_gpu_spec_window checks the bytes) */
    kv_cache_spec w = kv_cache_spec_default(1, CAP);
    w.window.size = 16;
    kv_backend *t = NULL, *d = NULL;
    if (kvcu_backend_create(&t, m, &w, &e) == KV_OK &&
        kvcu_backend_create(&d, dm, &w, &e) == KV_OK) {
        int out[4];
        const kv_spec_opts o = {3, 4, 0, 0.0f, 1};
        const int rc = kv_spec_generate(t, d, PROMPT, P, &o, out, NULL, &e);
        KV_CHECK(rc == KV_OK, "window: kv_spec_generate returned %d: %s", rc, e.msg);
    } else {
        KV_CHECK(0, "window backends: %s", e.msg);
    }
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    /* KIVI (needs 32 | d): a spill is rolled back only through an armed undo log */
    kv_config c = m->config;
    c.n_heads = c.n_kv_heads = 2;
    c.rotary_dim = 32;
    kv_cache_spec kivi = kv_cache_spec_default(1, CAP);
    kivi.quant.dtype = KV_QF_INT4_KIVI;
    kivi.quant.kivi_window = 32;
    kvcu_cache *kc = NULL;
    if (kvcu_cache_create(&kc, &c, &kivi, &e) == KV_OK)
        KV_CHECK(kvcu_cache_commit_length(kc, 0, 5, &e) == KV_OK &&
                     kvcu_cache_truncate(kc, 0, 2, &e) == KV_ERR_UNSUPPORTED,
                 "kivi: an unarmed kvcu_cache_truncate accepted");
    else
        KV_CHECK(0, "kivi cache: %s", e.msg);
    kvcu_cache_free(kc);
    /* bad lengths through the hook */
    const kv_cache_spec s = kv_cache_spec_default(1, CAP);
    t = NULL;
    if (kvcu_backend_create(&t, m, &s, &e) == KV_OK) {
        KV_CHECK(t->rollback && t->rollback->truncate && t->rollback->speculate,
                 "the CUDA backend has no truncate hook");
        if (t->rollback) {
            KV_CHECK(t->rollback->truncate(t, 0, 1, &e) == KV_ERR_ARG,
                     "truncate past the length accepted");
            KV_CHECK(t->rollback->truncate(t, 3, 0, &e) == KV_ERR_ARG,
                     "truncate of slot 3 accepted");
        }
    } else {
        KV_CHECK(0, "backend: %s", e.msg);
    }
    kv_backend_destroy(t);
    /* a block the prefix cache registered holds exactly its tokens: no cutting into it */
    kv_cache_spec ps = make_spec(1, KV_DTYPE_F32);
    t = NULL;
    if (kvcu_backend_create(&t, m, &ps, &e) == KV_OK &&
        kv_backend_enable_prefix_cache(t, &e) == KV_OK) {
        const kv_seq s1 = {0, 0, P, PROMPT};  /* P = 7 < B: no full block yet */
        const kv_seq s2 = {0, P, 2, PROMPT};  /* 9 tokens: block 0 is full and registered */
        KV_CHECK(t->forward(t, &s1, 1, NULL, NULL, &e) == KV_OK &&
                 t->forward(t, &s2, 1, NULL, NULL, &e) == KV_OK, "prefix: %s", e.msg);
        KV_CHECK(t->rollback->truncate(t, 0, 8, &e) == KV_OK,
                 "prefix: truncating after the registered block refused: %s", e.msg);
        KV_CHECK(t->rollback->truncate(t, 0, 5, &e) == KV_ERR_UNSUPPORTED,
                 "prefix: cutting into a registered block accepted");
        KV_CHECK(t->length(t, 0) == 8, "prefix: a refused truncate changed the length to %d",
                 t->length(t, 0));
        KV_CHECK(t->mem->paged->pool.n_used == 1,
                 "prefix: %d blocks in use after truncating to one full block",
                 t->mem->paged->pool.n_used);
    } else {
        KV_CHECK(0, "prefix backend: %s", e.msg);
    }
    kv_backend_destroy(t);
}

int main(void)
{
    kv_err e;
    if (kvcu_device_available(&e) != KV_OK) {
        printf("skipped: %s\n", e.msg);
        return KV_TEST_SKIP;
    }
    kv_model m = {0}, dm;
    if (kv_model_default(&m, KV_DEFAULT_TINY, &e) || kv_model_layer_prefix(&dm, &m, 1, &e)) {
        fprintf(stderr, "model: %s\n", e.msg);
        return 1;
    }
    /* the draft view aliases m's one weight block; kvcu_model_upload() copies a model as that
     * block, so the view names it (never freed through the view) */
    dm.data = m.data;
    dm.n_floats = m.n_floats;
    for (int paged = 0; paged < 2; paged++)
        for (int q = 0; q < 2; q++) {
            const int dtype = q ? KV_QF_INT8 : KV_DTYPE_F32;
            const kv_cache_spec s = make_spec(paged, dtype);
            char what[64];
            snprintf(what, sizeof what, "%s %s", paged ? "paged" : "contiguous",
                     kv_dtype_name(dtype));
            test_all_logits(&m, &s, what);
            if (!paged) test_cache_truncate(&m, dtype);
            if (paged || !q) /* contiguous int8's truncate: test_cache_truncate */
                test_greedy(&m, &dm, paged, dtype);
        }
    test_refusals(&m, &dm);
    const kvcu_engine_opts bad = {KV_QF_INT8, 0}, bad5 = {KV_QF_F32, 4};
    kv_backend *x = NULL;
    const kv_cache_spec s0 = make_spec(0, KV_DTYPE_F32);
    KV_CHECK(kvcu_backend_create_opts(&x, &m, &s0, &bad, &e) == KV_ERR_ARG && !x &&
             kvcu_backend_create_opts(&x, &m, &s0, &bad5, &e) == KV_ERR_ARG && !x,
             "int8 weights or prefill version 4 accepted");
    test_prefill_mma(&m, &s0, "v6 contiguous fp32");
    const kv_cache_spec s1 = make_spec(1, KV_QF_INT8);
    test_prefill_mma(&m, &s1, "v6 paged int8");
    kv_model gqa = {0};
    if (kv_model_default(&gqa, KV_DEFAULT_TINY_GQA, &e) == KV_OK)
        test_prefill_mma(&gqa, &s0, "v6 tiny-gqa contiguous fp32");
    else
        KV_CHECK(0, "tiny-gqa: %s", e.msg);
    kv_model_free(&gqa);
    kv_model_free(&m);
    return kv_test_finish();
}
