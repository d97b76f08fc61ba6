/*
 * The real-model measurements of chapters 03, 04 and 06 (docs/real-model-ppl.md), small, on
 * SmolLM2-135M-Instruct (tools/fetch-model.sh smollm2): what each table's machinery must get
 * right before its numbers mean anything.
 *
 *   GQA -> MHA   copying each of the 3 KV heads to its 3 query heads (kv_convert_expand_kv_heads)
 *                computes the same function: every logit bit-identical (exact by construction).
 *   GQA -> MQA   pooling the expanded model (9 heads, each original one 3 times) to 1 KV head
 *                equals pooling the original's 3 to 1: the mean of a,a,a,b,b,b,c,c,c is the mean
 *                of a,b,c (rounding apart).
 *   KL           kv_eval_ppl_many() with an fp32 variant against the fp32 reference: KL exactly
 *                0, every argmax agreeing and the reference's NLL its own; an int8 variant:
 *                KL > 0. Running variants in lockstep changes nothing: each one's NLL equals a
 *                run of it alone, bit for bit, and the per-token hook's NLLs sum to the
 *                result's.
 *   sinks        kv_probe_attention_mass_heads() on the GGUF: each (layer, KV head) row is a
 *                distribution (sums to 1), and the layer's rows average to
 *                kv_probe_attention_mass()'s.
 *
 * Without the file it exits 77 (skipped), saying how to fetch it.
 */
#include "common/kv_test.h"
#include "common/kv_test_model.h"

#include <math.h>
#include <string.h>

#include "kv_backend.h"
#include "kv_convert.h"
#include "kv_eval.h"
#include "kv_gguf.h"
#include "kv_gguf_model.h"
#include "kv_needle.h"
#include "kv_probe.h"
#include "kv_vocab.h"

#define TEXT "In the beginning God created the heaven and the earth. And the earth was without " \
             "form, and void; and darkness was upon the face of the deep."

typedef struct {
    double nll;
    long n;
} nll_sum;

static void sum_nll(void *ctx, int v, long t, double nll, double kl, int agree)
{
    (void)t, (void)kl, (void)agree;
    nll_sum *s = ctx;
    s[v].nll += nll;
    s[v].n++;
}

/* a CPU backend of the cache variant @p spec for n tokens, or NULL after a failed check */
static kv_backend *backend(const kv_model *m, const char *spec, int n)
{
    kv_cache_spec cs;
    kv_backend *b = NULL;
    kv_err err = {{0}};
    int st = kv_needle_cache_spec(spec, 1, n, &cs, &err);
    if (!st) st = kv_backend_cpu(&b, m, &cs, &err);
    KV_CHECK(st == KV_OK, "backend %s: %s", spec, err.msg);
    return st ? NULL : b;
}

static void check_heads(const kv_model *m, const int *ids, int n)
{
    kv_model mha = {0}, mqa = {0}, mqa2 = {0};
    kv_err err = {{0}};
    int st = kv_convert_expand_kv_heads(&mha, m, m->config.n_heads, &err);
    KV_CHECK(st == KV_OK && mha.config.n_kv_heads == 9, "expand to MHA: %s", err.msg);
    kv_convert_diff d;
    if (!st) {
        st = kv_convert_compare(m, &mha, ids, n, &d, &err);
        KV_CHECK(st == KV_OK && d.identical, "MHA expansion: identical %d, max |dlogit| %g (%s)",
                 d.identical, d.max_abs, err.msg);
    }
    st = kv_convert_pool_kv_heads(&mqa, m, 1, &err);
    KV_CHECK(st == KV_OK && mqa.config.n_kv_heads == 1, "pool to MQA: %s", err.msg);
    if (!st && mha.data) st = kv_convert_pool_kv_heads(&mqa2, &mha, 1, &err);
    if (!st && mqa2.data) {
        st = kv_convert_compare(&mqa, &mqa2, ids, n, &d, &err);
        KV_CHECK(st == KV_OK && d.max_abs < 1e-3 && d.top1_agree == 1.0,
                 "MQA from 3 heads vs from 9 copies: max |dlogit| %g, top-1 %.3f", d.max_abs,
                 d.top1_agree);
        printf("  MHA expansion bit-identical over %d tokens; MQA two ways: max |dlogit| %.2e\n",
               n, d.max_abs);
    }
    kv_model_free(&mha);
    kv_model_free(&mqa);
    kv_model_free(&mqa2);
}

static void check_kl(const kv_model *m, const int *ids, int n)
{
    kv_backend *bs[2] = {backend(m, "fp32", n), backend(m, "int8", n)};
    kv_backend *ref = backend(m, "fp32", n), *alone = backend(m, "int8", n);
    kv_err err = {{0}};
    nll_sum sums[2] = {{0, 0}, {0, 0}};
    kv_ppl_result r[2], one;
    if (bs[0] && bs[1] && ref && alone) {
        kv_ppl_opts o = {0, 16, 0, 0, NULL, NULL, 0, 1, ref, NULL, NULL, sum_nll, sums};
        int st = kv_eval_ppl_many(bs, 2, ids, n, &o, r, &err);
        KV_CHECK(st == KV_OK, "lockstep: %s", err.msg);
        KV_CHECK(r[0].kl == 0.0 && r[0].top1 == 1.0, "fp32 vs fp32: KL %g, top-1 %g", r[0].kl,
                 r[0].top1);
        KV_CHECK(r[0].ref_nll == r[0].nll && r[1].ref_nll == r[0].nll,
                 "the reference's NLL %.12f, %.12f: the fp32 variant's is %.12f", r[0].ref_nll,
                 r[1].ref_nll, r[0].nll);
        KV_CHECK(r[1].kl > 0.0 && r[1].kl < 0.05, "int8 vs fp32: KL %g", r[1].kl);
        for (int v = 0; v < 2; v++)
            KV_CHECK(sums[v].n == r[v].n_predicted &&
                         fabs(sums[v].nll / sums[v].n - r[v].nll) < 1e-12,
                     "variant %d: the hook saw %ld tokens, NLL %.9f; result %ld, %.9f", v,
                     sums[v].n, sums[v].nll / sums[v].n, r[v].n_predicted, r[v].nll);
        kv_ppl_opts o1 = {0, 16, 0, 0, NULL, NULL};
        st = kv_eval_ppl(alone, ids, n, &o1, &one, &err);
        KV_CHECK(st == KV_OK && one.nll == r[1].nll, "int8 alone NLL %.12f, in lockstep %.12f",
                 one.nll, r[1].nll);
        printf("  %d tokens: fp32 NLL %.4f KL %g; int8 NLL %.4f KL %.2e top-1 %.3f\n", n,
               r[0].nll, r[0].kl, r[1].nll, r[1].kl, r[1].top1);
    }
    kv_backend_destroy(bs[0]);
    kv_backend_destroy(bs[1]);
    kv_backend_destroy(ref);
    kv_backend_destroy(alone);
}

static void check_mass(const kv_model *m, const int *ids, int n)
{
    const int L = m->config.n_layers, H = m->config.n_kv_heads;
    double *heads = malloc(sizeof(double) * (size_t)L * H * n); /* [L][H_kv][n] */
    double *layers = malloc(sizeof(double) * (size_t)L * n);    /* [L][n] */
    kv_err err = {{0}};
    int st = heads && layers ? kv_probe_attention_mass_heads(m, ids, n, heads, &err) : -1;
    if (!st) st = kv_probe_attention_mass(m, ids, n, layers, &err);
    KV_CHECK(st == KV_OK, "mass: %s", err.msg);
    double worst_sum = 0.0, worst_mean = 0.0;
    for (int l = 0; !st && l < L; l++) {
        for (int h = 0; h < H; h++) {
            double s = 0.0;
            for (int p = 0; p < n; p++) s += heads[((size_t)l * H + h) * n + p];
            worst_sum = fmax(worst_sum, fabs(s - 1.0));
        }
        for (int p = 0; p < n; p++) {
            double s = 0.0;
            for (int h = 0; h < H; h++) s += heads[((size_t)l * H + h) * n + p];
            worst_mean = fmax(worst_mean, fabs(s / H - layers[(size_t)l * n + p]));
        }
    }
    KV_CHECK(!st && worst_sum < 1e-6, "a head's mass sums to 1 +- %g", worst_sum);
    KV_CHECK(!st && worst_mean < 1e-12, "layer mass = mean of its heads' +- %g", worst_mean);
    free(heads);
    free(layers);
}

int main(void)
{
    char path[4096];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) return KV_TEST_SKIP;
    kv_gguf *g = NULL;
    kv_vocab *voc = NULL;
    kv_model m = {0};
    kv_err err = {{0}};
    int ids[128], n = 0;
    int st = kv_gguf_open(path, &g, &err);
    if (!st) st = kv_gguf_model_load(g, &m, &err);
    if (!st) st = kv_vocab_from_gguf(g, &voc, &err);
    if (!st) st = kv_vocab_encode(voc, TEXT, strlen(TEXT), 1, 0, ids, 128, &n, &err);
    KV_CHECK(st == KV_OK && n >= 24, "load and encode: %s (%d tokens)", err.msg, n);
    if (!st) {
        check_heads(&m, ids, 12);
        check_kl(&m, ids, n);
        check_mass(&m, ids, 24);
    }
    kv_vocab_free(voc);
    kv_model_free(&m);
    kv_gguf_close(g);
    return kv_test_finish();
}
