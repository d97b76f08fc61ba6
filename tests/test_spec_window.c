/* Chapter 10 on the CPU: rolling back windowed and KIVI caches through the undo log
 * (kv_cache_speculate(), kv_cache_truncate()).
 *
 * Predicted before measured:
 *  - a round (arm, one step of the pending token and k drafts, truncate to a random acceptance)
 *    leaves the cache holding exactly the bytes of a cache that ran only the kept tokens, one
 *    at a time: every byte of the contiguous cache's memory (ring rows, KIVI codes, metadata,
 *    fp32 windows), its length and its quantized counts. The undo log copies back, newest
 *    first, what each write overwrote; a step's K/V are bit-identical to one-token steps
 *    (test_spec checks all_logits), and KIVI's quantized count depends on the length alone;
 *  - so greedy speculative decoding emits the target's greedy tokens for k = 1..8 and ends
 *    with the plain run's cache bytes, on windows smaller than k+1 and larger, both position
 *    schemes, with sinks, in fp32, fp16 and int8, and on int4 / int2 KIVI with a 32-token
 *    window whose spills fall inside the speculative steps (a paged cache: same tokens, same
 *    kept rows);
 *  - truncating without an armed log, below the length it was armed at, or by more than its
 *    max_tokens is refused (KV_ERR_UNSUPPORTED) and changes nothing. */
#include "common/kv_test.h"
#include "common/test_spec_common.h"

#include "kv_generate.h"
#include "kv_spec.h"

#include <stdlib.h>
#include <string.h>

#define N 44    /* tokens to emit */
#define CAP 128

static const int PROMPT[45] = {17, 301, 5, 88, 240, 17, 9, 44, 3, 190, 71, 12, 250, 8, 33,
                               61, 2, 140, 99, 7, 205, 18, 55, 130, 6, 77, 210, 41, 16, 92,
                               160, 23, 4, 111, 58, 233, 30, 86, 14, 177, 65, 27, 198, 50, 1};

typedef struct {
    int dtype, window, sinks, scheme, kivi_window;
} wcase;

static kv_cache_spec case_spec(const wcase *w, int paged)
{
    kv_cache_spec s = spec_cache_spec(paged, w->dtype, CAP, 32);
    s.window.size = w->window;
    s.window.n_sinks = w->sinks;
    s.window.pos_scheme = w->scheme;
    s.quant.kivi_window = w->kivi_window;
    return s;
}

static void case_name(char *buf, size_t n, const wcase *w, int paged, int np)
{
    if (w->window)
        snprintf(buf, n, "%s %s W%d S%d %s P%d", paged ? "paged" : "contiguous",
                 kv_dtype_name(w->dtype), w->window, w->sinks,
                 kv_window_scheme_name(w->scheme), np);
    else
        snprintf(buf, n, "%s %s R%d P%d", paged ? "paged" : "contiguous",
                 kv_dtype_name(w->dtype), w->kivi_window, np);
}

/* The same cache state: length, quantized counts, and every byte of memory (contiguous) or
 * every kept row (paged: physical blocks differ between two runs' allocation orders). */
static long cache_differ(const kv_cache *x, const kv_cache *y)
{
    long bad = x->len[0] != y->len[0];
    for (int l = 0; l < x->n_layers; l++) bad += x->qlen[l * x->spec.n_slots] != y->qlen[l * y->spec.n_slots];
    if (!x->tables) return bad + (memcmp(x->mem, y->mem, x->mem_bytes) != 0);
    const int rows = (int)kv_window_rows(x->spec.window.size, x->spec.window.n_sinks, x->len[0]);
    bad += rows_differ(x, y, rows);
    for (int l = 0; l < x->n_layers; l++) /* KIVI: the whole fp32 window, dead rows too */
        for (int i = 0; i < x->n_planes; i++) {
            const kv_cache_plane *a = kv_cache_plane_of(x->planes, x->n_layers, i, l),
                                 *b = kv_cache_plane_of(y->planes, y->n_layers, i, l);
            if (a->ring)
                bad += memcmp(a->ring, b->ring, (size_t)x->n_kv_heads * x->window *
                                                    x->head_dim * sizeof(float)) != 0;
        }
    return bad;
}

/* KIVI: the quantized count a plain run's row t reads (the prompt's rows: the prompt's). */
static int seen(const kv_cache_spec *s, int np, int t)
{
    if (!kvq_is_kivi(s->quant.dtype)) return 0;
    const int e = t + 1 > np ? t + 1 : np;
    return e > s->quant.kivi_window ? (e - s->quant.kivi_window + 31) / 32 * 32 : 0;
}

/* ---- rounds with random drafts and acceptances vs one-token steps ---------------------- */

static void test_rounds(const kv_model *m, const wcase *w, int paged, int np)
{
    char what[96];
    case_name(what, sizeof what, w, paged, np);
    kv_err e;
    const kv_cache_spec spec = case_spec(w, paged);
    kv_backend *t = NULL, *p = NULL;
    int ok = kv_backend_cpu(&t, m, &spec, &e) == KV_OK && kv_backend_cpu(&p, m, &spec, &e) == KV_OK;
    KV_CHECK(ok, "%s: backends: %s", what, e.msg);
    if (!ok) goto done;
    const int V = m->config.vocab_size;
    int ctx[CAP + 16];
    memcpy(ctx, PROMPT, sizeof(int) * np);
    uint64_t r = 12345 + (uint64_t)np * 7 + (uint64_t)w->window * 131 + (uint64_t)w->dtype;
    int n = np, rounds = 0;
    long bad = 0;
    while (n + 9 < CAP && ok) {
        const int k = 1 + rounds % 8;
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int acc = (int)((r >> 33) % (uint64_t)(k + 1));
        for (int j = 0; j < k; j++) ctx[n + j] = (int)((r >> (j * 3 + 5)) % (uint64_t)V);
        const int tlen = t->length(t, 0);
        ok = t->rollback->speculate(t, 0, k, &e) == KV_OK;
        for (int a = tlen, b; a < n + k && ok; a = b) { /* kv_spec's cut of a KIVI step */
            for (b = a + 1; b < n + k && seen(&spec, np, b) == seen(&spec, np, a);) b++;
            const kv_seq s = {0, a, b - a, ctx + a};
            ok = t->forward(t, &s, 1, NULL, NULL, &e) == KV_OK;
        }
        KV_CHECK(ok, "%s round %d: step: %s", what, rounds, e.msg);
        if (!ok) break;
        if (rounds == 3) { /* the refusals, which must change nothing */
            const int have = t->length(t, 0);
            KV_CHECK(t->rollback->truncate(t, 0, tlen - 1, &e) == KV_ERR_UNSUPPORTED,
                     "%s: truncating below the armed length accepted", what);
            KV_CHECK(t->length(t, 0) == have, "%s: a refused truncate changed the length", what);
        }
        ok = t->rollback->truncate(t, 0, n + acc, &e) == KV_OK;
        KV_CHECK(ok, "%s round %d: truncate to %d: %s", what, rounds, n + acc, e.msg);
        if (!ok) break;
        n += acc;
        ctx[n++] = (int)((r >> 40) % (uint64_t)V); /* the target's own token, not cached yet */
        for (int i = p->length(p, 0); i < n - 1; i++) { /* the plain cache: the prompt, then
                                                          * one token a step */
            const kv_seq s1 = {0, i, i ? 1 : np, ctx + i};
            if (!i) i = np - 1;
            ok = p->forward(p, &s1, 1, NULL, NULL, &e) == KV_OK;
        }
        KV_CHECK(ok, "%s: plain step: %s", what, e.msg);
        bad += cache_differ(kv_backend_cpu_cache(t), kv_backend_cpu_cache(p)) != 0;
        rounds++;
    }
    KV_CHECK(bad == 0, "%s: %ld of %d rounds leave a cache unlike the plain run's", what, bad,
             rounds);
    /* the log holds k positions: dropping more, or anything unarmed, is refused */
    const int have = t->length(t, 0);
    KV_CHECK(t->rollback->truncate(t, 0, have - 1, &e) == KV_ERR_UNSUPPORTED,
             "%s: an unarmed truncate accepted", what);
    if (t->rollback->speculate(t, 0, 2, &e) == KV_OK) {
        const kv_seq s = {0, have, 4, ctx};
        KV_CHECK(t->forward(t, &s, 1, NULL, NULL, &e) == KV_OK, "%s: %s", what, e.msg);
        KV_CHECK(t->rollback->truncate(t, 0, have + 1, &e) == KV_ERR_UNSUPPORTED,
                 "%s: dropping 3 tokens with a 2-token log accepted", what);
        KV_CHECK(t->length(t, 0) == have + 4, "%s: a refused truncate changed the length", what);
        KV_CHECK(t->rollback->truncate(t, 0, have + 2, &e) == KV_OK, "%s: %s", what, e.msg);
        KV_CHECK(t->rollback->truncate(t, 0, have + 2, &e) == KV_OK,
                 "%s: a no-op truncate refused: %s", what, e.msg);
    }
done:
    kv_backend_destroy(t);
    kv_backend_destroy(p);
}

/* ---- greedy speculative decoding == the target's greedy run ---------------------------- */

static void test_greedy(const kv_model *m, const kv_model *dm, const wcase *w, int paged, int np)
{
    char what[96];
    case_name(what, sizeof what, w, paged, np);
    kv_err e;
    const kv_cache_spec spec = case_spec(w, paged);
    kv_backend *plain = NULL;
    int want[N], got[N];
    int ok = kv_backend_cpu(&plain, m, &spec, &e) == KV_OK;
    const kv_gen_opts go = {KV_MODE_CACHED, 0, N, NULL, NULL, NULL, NULL};
    ok = ok && kv_generate(plain, PROMPT, np, &go, want, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: plain run: %s", what, e.msg);
    int64_t acc = 0, rolled = 0;
    for (int k = 1; k <= 8 && ok; k++) {
        kv_backend *t = NULL, *d = NULL; /* fresh caches: every byte comparable */
        ok = kv_backend_cpu(&t, m, &spec, &e) == KV_OK && kv_backend_cpu(&d, dm, &spec, &e) == KV_OK;
        const kv_spec_opts o = {k, N, 0, 0.0f, 1};
        kv_spec_stats st;
        ok = ok && kv_spec_generate(t, d, PROMPT, np, &o, got, &st, &e) == KV_OK;
        KV_CHECK(ok, "%s k=%d: %s", what, k, e.msg);
        if (ok) {
            KV_CHECK(memcmp(got, want, sizeof want) == 0, "%s k=%d: tokens differ from greedy",
                     what, k);
            const long bad = cache_differ(kv_backend_cpu_cache(t), kv_backend_cpu_cache(plain));
            KV_CHECK(bad == 0, "%s k=%d: the cache differs from the plain run's (%ld)", what, k, bad);
            acc += st.accepted;
            rolled += st.drafted - st.accepted;
        }
        kv_backend_destroy(t);
        kv_backend_destroy(d);
    }
    KV_CHECK(acc > 0 && rolled > 0, "%s: %lld accepted, %lld rejected: both paths must run",
             what, (long long)acc, (long long)rolled);
    kv_backend_destroy(plain);
}

int main(void)
{
    kv_model m = {0}, dm, wide = {0}, wd;
    kv_config c; /* KIVI needs 32 | d: a d = 32 twin of tiny */
    if (spec_window_models(&m, &dm, &wide, &wd, &c)) return 1;
    /* windows smaller than k+1 (3, 4+2 sinks) and larger (24+4), both schemes */
    const wcase win[] = {
        {KV_DTYPE_F32, 3, 0, KV_POS_ORIGINAL, 0}, {KV_QF_INT8, 4, 2, KV_POS_CACHE, 0},
        {KV_QF_F16, 4, 2, KV_POS_ORIGINAL, 0},    {KV_DTYPE_F32, 24, 4, KV_POS_CACHE, 0},
        {KV_QF_INT8, 24, 0, KV_POS_ORIGINAL, 0},  {KV_QF_F16, 9, 1, KV_POS_CACHE, 0},
    };
    const wcase kivi[] = {{KV_QF_INT4_KIVI, 0, 0, 0, 32}, {KV_QF_INT2_KIVI, 0, 0, 0, 32},
                          {KV_QF_INT4_KIVI, 0, 0, 0, 64}};
    for (size_t i = 0; i < sizeof win / sizeof *win; i++)
        for (int np = 7; np <= 45; np += 38) {
            test_rounds(&m, &win[i], 0, np);
            test_greedy(&m, &dm, &win[i], 0, np);
        }
    for (size_t i = 0; i < sizeof kivi / sizeof *kivi; i++)
        for (int np = 7; np <= 45; np += 38) { /* 45 > R: the prefill spills while armed */
            test_rounds(&wide, &kivi[i], 0, np);
            test_greedy(&wide, &wd, &kivi[i], 0, np);
        }
    /* paged: the ring through block tables, KIVI groups at physical rows */
    test_rounds(&m, &win[1], 1, 45);
    test_greedy(&m, &dm, &win[3], 1, 7);
    test_rounds(&wide, &kivi[0], 1, 45);
    test_greedy(&wide, &wd, &kivi[1], 1, 7);
    kv_model_free(&wide);
    kv_model_free(&m);
    return kv_test_finish();
}
