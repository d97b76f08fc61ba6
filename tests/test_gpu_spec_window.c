/* Chapter 10 on the GPU: the undo log of windowed and KIVI caches (kvcu_cache_speculate(),
 * kvcu_cache_truncate()), against the CPU's.
 *
 * Predicted before measured:
 *  - rounds of (arm, write a chunk of 1 + k rows, truncate to a random acceptance) through
 *    kv_cache_write_seq() and kvcu_cache_write_seq() on the same K/V leave the same bytes in
 *    the CPU cache and the downloaded CUDA cache after every round, refusals included: the
 *    rows are stored by the same rounding rules (test_gpu_quant_cache), both logs copy back
 *    what each write overwrote, and KIVI's ring takes the chunk's last R rows on both (a
 *    write kernel block skips a token whose ring row a later token of the launch takes);
 *    windows smaller than k+1 and larger, sinks, fp32 / fp16 / int8, int4 / int2 KIVI with a
 *    32-token window whose spills fall inside the chunks, contiguous and paged;
 *  - greedy speculation on CUDA backends emits the CUDA backend's own plain greedy tokens for
 *    k = 1..8 on a window smaller than k+1 and on int4 KIVI whose spill at 33 tokens falls
 *    inside the speculative steps (asserted against CUDA's own
 *    run: CPU and GPU sum in different orders, see test_gpu_spec);
 *  - refusals in the CPU's words: unarmed, below the armed length, beyond max_tokens.
 * Exits 77 (skipped) without a usable device. */
#include "common/kv_test.h"
#include "common/test_spec_common.h"
#include "common/kv_test_gpu.h"

#include "kv_generate.h"
#include "kv_spec.h"
#include "kvcu.h"

#include <stdlib.h>
#include <string.h>

#define CAP 96
#define N 12 /* greedy: tokens to emit (emulation is slow) */

typedef struct {
    int dtype, window, sinks, kivi_window, paged;
} wcase;

static uint64_t rng = 88172645463325252ull;
static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static kv_cache_spec case_spec(const wcase *w)
{
    kv_cache_spec s = spec_cache_spec(w->paged, w->dtype, CAP, 32);
    s.window.size = w->window;
    s.window.n_sinks = w->sinks;
    s.quant.kivi_window = w->kivi_window;
    return s;
}

/* ---- write_seq rounds: CPU and CUDA logs leave the same bytes -------------------------- */

static void test_rounds(const kv_config *cfg, const wcase *w)
{
    char what[96];
    snprintf(what, sizeof what, "%s %s W%d S%d R%d", w->paged ? "paged" : "contiguous",
             kv_dtype_name(w->dtype), w->window, w->sinks, w->kivi_window);
    kv_err e;
    const kv_cache_spec spec = case_spec(w);
    const int Hkv = cfg->n_kv_heads, d = kv_config_head_dim(cfg), L = cfg->n_layers;
    const size_t kvdim = (size_t)Hkv * d;
    kv_cache hc = {0}, img = {0};
    kvcu_cache *gc = NULL;
    float *hk = malloc(sizeof(float) * 2 * 16 * kvdim), *dk = NULL; /* [2][16][H_kv][d] */
    int ok = kv_cache_create(&hc, cfg, &spec, &e) == KV_OK &&
             kv_cache_create(&img, cfg, &spec, &e) == KV_OK &&
             kvcu_cache_create(&gc, cfg, &spec, &e) == KV_OK &&
             kvcu_malloc((void **)&dk, sizeof(float) * 2 * 16 * kvdim, &e) == KV_OK;
    KV_CHECK(ok, "%s: setup: %s", what, e.msg);
    if (!ok) goto done;
    if (w->paged) { /* one slot, its blocks in order */
        int blocks[8];
        for (int i = 0; i < hc.max_blocks; i++) blocks[i] = hc.max_blocks - 1 - i;
        ok = kv_cache_set_blocks(&hc, 0, blocks, hc.max_blocks, &e) == KV_OK &&
             kvcu_cache_set_blocks(gc, 0, blocks, hc.max_blocks, &e) == KV_OK;
        KV_CHECK(ok, "%s: blocks: %s", what, e.msg);
        if (!ok) goto done;
    }
    int len = 0, rounds = 0;
    long bad = 0;
    while (len + 10 < CAP && ok) {
        const int k = 1 + rounds % 8, n = rounds ? 1 + k : 9 + k, acc = (int)(next() % (k + 1));
        for (size_t i = 0; i < 2 * (size_t)n * kvdim; i++)
            hk[i] = ((int)(next() % 2001) - 1000) / 250.0f;
        ok = kvcu_upload(dk, hk, sizeof(float) * 2 * (size_t)n * kvdim, &e) == KV_OK &&
             kv_cache_speculate(&hc, 0, k, &e) == KV_OK &&
             kvcu_cache_speculate(gc, 0, k, &e) == KV_OK;
        /* in the forward pass's waves: a ring row is never written twice by one launch */
        for (int o = 0, w8; o < n && ok; o += w8) {
            w8 = kv_window_chunk(spec.window.size, spec.window.n_sinks, len + o, n - o);
            const size_t a = o * kvdim, b = (n + o) * kvdim;
            for (int l = 0; l < L && ok; l++)
                ok = kv_cache_write_seq(&hc, l, 0, len + o, w8, hk + a, hk + b, &e) == KV_OK &&
                     kvcu_cache_write_seq(gc, l, 0, len + o, w8, dk + a, dk + b, &e) == KV_OK;
        }
        KV_CHECK(ok, "%s round %d: write: %s", what, rounds, e.msg);
        if (!ok) break;
        hc.len[0] = len + n; /* the forward pass's part */
        ok = kvcu_cache_commit_length(gc, 0, len + n, &e) == KV_OK;
        if (rounds == 2) {
            KV_CHECK(kv_cache_truncate(&hc, 0, len - 1, &e) == KV_ERR_UNSUPPORTED &&
                     kvcu_cache_truncate(gc, 0, len - 1, &e) == KV_ERR_UNSUPPORTED,
                     "%s: truncating below the armed length accepted", what);
            KV_CHECK(strstr(e.msg, "kvcu_cache_truncate: slot 0: ") == e.msg &&
                     strstr(e.msg, "before the"), "%s: refusal reads '%s'", what, e.msg);
        }
        const int keep = len + (rounds ? 1 : 9) + acc; /* kv_spec: context + accepted */
        ok = ok && kv_cache_truncate(&hc, 0, keep, &e) == KV_OK &&
             kvcu_cache_truncate(gc, 0, keep, &e) == KV_OK;
        KV_CHECK(ok, "%s round %d: truncate to %d: %s", what, rounds, keep, e.msg);
        if (!ok) break;
        len = keep;
        ok = kvcu_cache_download(gc, img.mem, img.mem_bytes, &e) == KV_OK;
        bad += kvcu_cache_length(gc, 0) != len || memcmp(hc.mem, img.mem, hc.mem_bytes) != 0;
        rounds++;
    }
    KV_CHECK(bad == 0, "%s: %ld of %d rounds leave CUDA bytes unlike the CPU's", what, bad, rounds);
    /* beyond the log and unarmed: refused by both, nothing changed */
    ok = kv_cache_speculate(&hc, 0, 2, &e) == KV_OK && kvcu_cache_speculate(gc, 0, 2, &e) == KV_OK;
    for (int o = 0, w8; o < 4 && ok; o += w8) {
        w8 = kv_window_chunk(spec.window.size, spec.window.n_sinks, len + o, 4 - o);
        for (int l = 0; l < L && ok; l++)
            ok = kv_cache_write_seq(&hc, l, 0, len + o, w8, hk + o * kvdim,
                                    hk + (4 + o) * kvdim, &e) == KV_OK &&
                 kvcu_cache_write_seq(gc, l, 0, len + o, w8, dk + o * kvdim,
                                      dk + (4 + o) * kvdim, &e) == KV_OK;
    }
    hc.len[0] = len + 4;
    ok = ok && kvcu_cache_commit_length(gc, 0, len + 4, &e) == KV_OK;
    KV_CHECK(ok, "%s: %s", what, e.msg);
    KV_CHECK(kv_cache_truncate(&hc, 0, len + 1, &e) == KV_ERR_UNSUPPORTED &&
             kvcu_cache_truncate(gc, 0, len + 1, &e) == KV_ERR_UNSUPPORTED,
             "%s: dropping 3 tokens with a 2-token log accepted", what);
    KV_CHECK(strstr(e.msg, "holds the last 2") != NULL, "%s: refusal reads '%s'", what, e.msg);
    KV_CHECK(kv_cache_truncate(&hc, 0, len + 2, &e) == KV_OK &&
             kvcu_cache_truncate(gc, 0, len + 2, &e) == KV_OK, "%s: %s", what, e.msg);
    KV_CHECK(kv_cache_truncate(&hc, 0, len + 1, &e) == KV_ERR_UNSUPPORTED &&
             kvcu_cache_truncate(gc, 0, len + 1, &e) == KV_ERR_UNSUPPORTED,
             "%s: an unarmed truncate accepted", what);
    KV_CHECK(strstr(e.msg, "arm it") != NULL, "%s: refusal reads '%s'", what, e.msg);
done:
    kv_cache_free(&hc);
    kv_cache_free(&img);
    kvcu_cache_free(gc);
    kvcu_free(dk);
    free(hk);
}

/* ---- greedy on CUDA backends == CUDA's plain greedy ------------------------------------ */

static void test_greedy(const kv_model *m, const kv_model *dm, const wcase *w, const int *prompt,
                        int np)
{
    char what[96];
    snprintf(what, sizeof what, "greedy %s W%d S%d R%d P%d", kv_dtype_name(w->dtype), w->window,
             w->sinks, w->kivi_window, np);
    kv_err e;
    const kv_cache_spec spec = case_spec(w);
    kv_backend *plain = NULL, *t = NULL, *d = NULL;
    int want[N], got[N];
    int ok = kvcu_backend_create(&plain, m, &spec, &e) == KV_OK &&
             kvcu_backend_create(&t, m, &spec, &e) == KV_OK &&
             kvcu_backend_create(&d, dm, &spec, &e) == KV_OK;
    const kv_gen_opts go = {KV_MODE_CACHED, 0, N, NULL, NULL, NULL, NULL};
    ok = ok && kv_generate(plain, prompt, np, &go, want, NULL, &e) == KV_OK;
    KV_CHECK(ok, "%s: setup: %s", what, e.msg);
    int64_t acc = 0, rej = 0;
    for (int k = 1; k <= 8 && ok; k++) {
        const kv_spec_opts o = {k, N, 0, 0.0f, 1};
        kv_spec_stats st;
        ok = kv_spec_generate(t, d, prompt, np, &o, got, &st, &e) == KV_OK;
        KV_CHECK(ok, "%s k=%d: %s", what, k, e.msg);
        if (!ok) break;
        KV_CHECK(memcmp(got, want, sizeof want) == 0, "%s k=%d: tokens differ from CUDA greedy",
                 what, k);
        KV_CHECK(t->length(t, 0) == plain->length(plain, 0), "%s k=%d: length %d, plain %d",
                 what, k, t->length(t, 0), plain->length(plain, 0));
        acc += st.accepted;
        rej += st.drafted - st.accepted;
    }
    KV_CHECK(!ok || (acc > 0 && rej > 0), "%s: %lld accepted, %lld rejected: both paths must run",
             what, (long long)acc, (long long)rej);
    kv_backend_destroy(plain);
    kv_backend_destroy(t);
    kv_backend_destroy(d);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    kv_model m = {0}, dm, wide = {0}, wd;
    kv_config c; /* KIVI needs 32 | d: a d = 32 twin of tiny */
    if (spec_window_models(&m, &dm, &wide, &wd, &c)) return 1;
    dm.data = m.data; /* the draft view names m's weight block for kvcu_model_upload() */
    dm.n_floats = m.n_floats;
    (void)rows_differ; /* test_spec_common.h's; the rounds compare whole images */
    wd.data = wide.data;
    wd.n_floats = wide.n_floats;
    const wcase rounds[] = {
        {KV_DTYPE_F32, 3, 0, 0, 0}, {KV_QF_INT8, 4, 2, 0, 0},  {KV_QF_F16, 24, 4, 0, 0},
        {KV_QF_INT8, 4, 2, 0, 1},   {KV_QF_INT4_KIVI, 0, 0, 32, 0},
        {KV_QF_INT2_KIVI, 0, 0, 32, 0}, {KV_QF_INT4_KIVI, 0, 0, 32, 1},
    };
    for (size_t i = 0; i < sizeof rounds / sizeof *rounds; i++)
        test_rounds(kvq_is_kivi(rounds[i].dtype) ? &c : &m.config, &rounds[i]);
    static const int prompt[40] = {17, 301, 5, 88, 240, 17, 9, 44, 3, 190, 71, 12, 250, 8,
                                   33, 61, 2, 140, 99, 7, 205, 18, 55, 130, 6, 77, 210, 41,
                                   16, 92, 160, 23, 4, 111, 58, 233, 30, 86, 14, 177};
    const wcase small = {KV_DTYPE_F32, 3, 1, 0, 0}, kivi = {KV_QF_INT4_KIVI, 0, 0, 32, 0};
    test_greedy(&m, &dm, &small, prompt, 7);
    test_greedy(&wide, &wd, &kivi, prompt, 28); /* 28 + 12 crosses Q's step at 33 */
    kv_model_free(&wide);
    kv_model_free(&m);
    return kv_test_finish();
}
