/* The CUDA engine on the real model: SmolLM2-135M-Instruct (Q4_1 GGUF, fetched by
 * tools/fetch-model.sh smollm2), cut to its first 2 layers, against the CPU engine.
 *
 * The GGUF loader gives an fp32 kv_model; kv_test_model_prefix_copy() makes a 2-layer model of
 * its own (tests/common/kv_test_model_prefix.h): the device then holds 2 layers, not 30.
 *
 * A sentence tokenized by the file's own tokenizer (its first 16 ids) is prefilled and 8 tokens
 * are greedy-decoded on each backend, each following its own argmax (8, not more: the
 * emulated GEMV over the 49152-row classifier is most of the time):
 *  - fp32 cache, fp32 weights, the per-row prefill (kvcu_backend_create(), the engine the
 *    chapters' tests hold to the CPU at fp32 tolerance, docs/design.md §5): every step's
 *    logits within KV_TOL_F32_ATOL + KV_TOL_F32_RTOL·top, top the step's largest |logit|
 *    (kv_test.h's constants, taken norm-wise). Why not |ref| per logit: a logit is the dot
 *    product of one final hidden state x with a classifier row w, and the devices differ by
 *    summation order in every sum before it, so x carries an error relative to |x|, and each
 *    logit one of order rtol·|x|·|w|, the scale of the largest logits, whatever its own value.
 *    A logit near 0 by cancellation fails the element-wise rule: measured 1.29e-5 against
 *    1.27e-5 at a logit of 0.027 (step 3), while the largest logits are ~50;
 *  - int8 cache on both, fp16 weights on the GPU (kvcu_backend_create_opts): every step's
 *    logits within 1 % of the step's largest |logit|, test_gpu_engine's bound for fp16 weights
 *    (both caches quantize with the same rounding, docs/design.md §8, so the cache adds only
 *    the codes that the weights' rounding pushes across a rounding boundary).
 * The greedy tokens must be identical; a divergence is allowed only at a step where the CPU's
 * top-2 margin is within the sum of the two logits' tolerances (only then can a shift of each
 * logit by its tolerance swap them), and the comparison stops there (the streams differ).
 * Exits 77 (skipped) without a usable device or without the model file. */
#include "kv_backend.h"
#include "kv_gguf_model.h"
#include "kv_sampler.h"
#include "kv_spec.h"
#include "kv_vocab.h"
#include "common/kv_test.h"
#include "common/kv_test_gpu.h"
#include "common/kv_test_model.h"
#include "common/kv_test_model_prefix.h"
#include "kvcu.h"

#include <string.h>

enum { LAYERS = 2, PROMPT = 16, STEPS = 8, CAPACITY = PROMPT + STEPS };

/* logit tolerance of one value of the CPU's logits [V] in a run */
typedef double (*tol_fn)(double ref, double top);
static double tol_f32(double ref, double top)
{
    (void)ref;
    return KV_TOL_F32_ATOL + KV_TOL_F32_RTOL * top;
}
static double tol_w16(double ref, double top)
{
    (void)ref;
    return 0.01 * top;
}

/* The prompt and STEPS greedy tokens on the CPU and on the GPU (options @p o, NULL: the
 * default engine), over caches of @p variant; logits compared step by step under @p tol. */
static void run(const kv_model *m, const int *prompt, const char *variant,
                const kvcu_engine_opts *o, tol_fn tol, const char *what)
{
    const int V = m->config.vocab_size;
    kv_cache_spec spec;
    kv_backend *cb = NULL, *gb = NULL;
    kv_err e;
    int rc = kv_needle_cache_spec(variant, 1, CAPACITY, &spec, &e);
    if (!rc) rc = kv_backend_cpu(&cb, m, &spec, &e);
    if (!rc) rc = kvcu_backend_create_opts(&gb, m, &spec, o, &e);
    KV_CHECK(rc == KV_OK, "%s: backends: %s", what, e.msg);
    float *cpu = malloc(sizeof(float) * V), *gpu = malloc(sizeof(float) * V); /* [V] each */
    int ct = 0, gt = 0, same = 0, step = 0;
    double worst = 0.0, worst_frac = 0.0;
    for (; !rc && cpu && gpu && step <= STEPS; step++) {
        kv_seq qc = {0, 0, PROMPT, prompt, NULL}, qg = qc;
        if (step > 0) {
            qc = (kv_seq){0, PROMPT + step - 1, 1, &ct, NULL};
            qg = (kv_seq){0, PROMPT + step - 1, 1, &gt, NULL};
        }
        rc = cb->forward(cb, &qc, 1, cpu, NULL, &e);
        if (!rc) rc = gb->forward(gb, &qg, 1, gpu, NULL, &e);
        KV_CHECK(rc == KV_OK, "%s step %d: %s", what, step, e.msg);
        if (rc) break;
        double top = 0.0;
        for (int i = 0; i < V; i++) top = fmax(top, fabs(cpu[i]));
        int bad = 0;
        for (int i = 0; i < V; i++) {
            const double d = fabs((double)gpu[i] - cpu[i]);
            worst = fmax(worst, d);
            worst_frac = fmax(worst_frac, d / top);
            if (!(d <= tol(cpu[i], top))) {
                if (bad++ < 3)
                    printf("  %s step %d: logit %d: GPU %.7g, CPU %.7g (|diff| %.3g > %.3g)\n",
                           what, step, i, gpu[i], cpu[i], d, tol(cpu[i], top));
            }
        }
        KV_CHECK(bad == 0, "%s step %d: %d of %d logits outside the tolerance", what, step, bad, V);
        ct = kv_argmax(cpu, V);
        gt = kv_argmax(gpu, V);
        if (ct != gt) { /* only a near tie may swap: the CPU's top-2 margin within tolerance */
            int second = ct ? 0 : 1;
            for (int i = 0; i < V; i++)
                if (i != ct && cpu[i] > cpu[second]) second = i;
            const double margin = (double)cpu[ct] - cpu[second];
            const double allowed = tol(cpu[ct], top) + tol(cpu[second], top);
            printf("  %s: greedy tokens diverge at step %d (CPU %d, GPU %d): CPU top-2 margin "
                   "%.3g, tolerance %.3g\n", what, step, ct, gt, margin, allowed);
            KV_CHECK(margin <= allowed, "%s step %d: GPU chose %d over the CPU's %d, margin %.3g "
                     "> %.3g", what, step, gt, ct, margin, allowed);
            break;
        }
        same++;
    }
    printf("%s: %d of %d steps (prefill + %d decodes) with identical greedy tokens; max |diff| "
           "%.3g (%.3g%% of a step's largest logit)\n", what, same, STEPS + 1, STEPS, worst,
           100.0 * worst_frac);
    free(cpu);
    free(gpu);
    kv_backend_destroy(cb);
    kv_backend_destroy(gb);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    char path[1200];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) return KV_TEST_SKIP;
    kv_gguf *g = NULL;
    kv_vocab *voc = NULL;
    kv_model m = {0};
    kv_err e = {{0}};
    int rc = kv_test_gguf_prefix_open(path, LAYERS, &g, &voc, &m, &e);
    KV_CHECK(rc == KV_OK, "model: %s", e.msg);
    static const char text[] = "The quick brown fox jumps over the lazy dog, then it runs back "
                               "to the old barn by the river.";
    int prompt[64], n = 0;
    if (!rc) rc = kv_vocab_encode(voc, text, strlen(text), 0, 0, prompt, 64, &n, &e);
    KV_CHECK(rc == KV_OK && n >= PROMPT, "'%s': %d tokens (%s)", text, n, rc ? e.msg : "");
    if (!rc && n >= PROMPT) {
        run(&m, prompt, "fp32", NULL, tol_f32, "fp32 weights, fp32 cache");
        const kvcu_engine_opts w16 = {KV_QF_F16, 0};
        run(&m, prompt, "int8", &w16, tol_w16, "fp16 weights, int8 cache");
    }
    kv_model_free(&m);
    kv_vocab_free(voc);
    kv_gguf_close(g);
    return kv_test_finish();
}
