/* Needle and dialogue on the CUDA engine (issue 4): the same cells and turns as on the CPU,
 * through the same kv_backend code, give the same answers; logits agree to fp32 tolerance.
 * On a GPU: datasets/needle/tiny.needle plus a 4k context, and datasets/dialogues/boundaries.dlg.
 * In the emulation build (kernels on CPU fibers, ~1000x slower) the same code on contexts of a
 * few dozen tokens: a needle grid of 24 and 48 tokens and a five-turn dialogue.
 *
 *   test_gpu_needle DATASETS  */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_gpu.h"

#include "kv_dialogue.h"
#include "kv_needle.h"
#include "kvcu.h"

#include <string.h>

static void test_grid(const char *dir, int emulated)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/needle/tiny.needle", dir);
    kv_needle_spec s;
    kv_err e;
    kv_needle_spec_default(&s);
    int rc = emulated ? kv_needle_spec_parse("name emulated\nlengths 24 48\ndepths 0 100\n", &s, &e)
                      : kv_needle_spec_read(path, &s, &e);
    if (!rc && !emulated) rc = kv_needle_spec_parse("lengths 64 160 4096\n", &s, &e);
    if (rc) {
        KV_CHECK(0, "%s", e.msg);
        return;
    }
    kv_needle_result *rc_cpu = NULL, *rc_gpu = NULL;
    int n1 = 0, n2 = 0;
    double t0 = kv_now();
    KV_CHECK(kv_needle_grid(&s, kv_test_make_cpu, NULL, NULL, NULL, &rc_cpu, &n1, &e) == KV_OK, "cpu: %s", e.msg);
    double t1 = kv_now();
    KV_CHECK(kv_needle_grid(&s, kv_test_make_cuda, NULL, NULL, NULL, &rc_gpu, &n2, &e) == KV_OK, "gpu: %s", e.msg);
    double t2 = kv_now();
    if (!rc_cpu || !rc_gpu || n1 != n2) {
        free(rc_cpu);
        free(rc_gpu);
        return;
    }
    float *a = malloc(sizeof(float) * 2 * n1), *b = malloc(sizeof(float) * 2 * n1);
    int pass = 0;
    for (int i = 0; i < n1; i++) {
        KV_CHECK(rc_gpu[i].answer == rc_cpu[i].answer, "cell %d (%s L %d depth %d): gpu answer %d, "
                 "cpu %d", i, kv_recall_kind_name(rc_cpu[i].kind), rc_cpu[i].length,
                 rc_cpu[i].depth, rc_gpu[i].answer, rc_cpu[i].answer);
        KV_CHECK(rc_gpu[i].pass && rc_gpu[i].expected == 1, "gpu cell %d passes as predicted", i);
        pass += rc_gpu[i].pass;
        a[2 * i] = rc_gpu[i].logit_value;
        a[2 * i + 1] = rc_gpu[i].logit_other;
        b[2 * i] = rc_cpu[i].logit_value;
        b[2 * i + 1] = rc_cpu[i].logit_other;
    }
    KV_CHECK(kv_test_compare("needle logits gpu vs cpu", a, b, 2 * n1, KV_TOL_F32_ATOL,
                             KV_TOL_F32_RTOL) == 0, "needle logits agree");
    printf("grid %s: %d/%d cells pass on the GPU engine (cpu %.2f s, gpu %.2f s)\n", s.name,
           pass, n1, t1 - t0, t2 - t1);
    free(a);
    free(b);
    free(rc_cpu);
    free(rc_gpu);
}

static void test_dialogue(const char *dir, int emulated)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/dialogues/boundaries.dlg", dir);
    kv_dialogue d;
    kv_err e;
    /* emulated: facts, filler, and questions three and four turns later, ~35 tokens */
    int rc = emulated ? kv_dialogue_parse("k1=v4 ~3\n~4\nk2=v9 ~2\n~3 k1?\n~2 k2?\n", "emulated", &d, &e)
                      : kv_dialogue_read(path, &d, &e);
    if (rc) {
        KV_CHECK(0, "%s", e.msg);
        return;
    }
    for (int kind = KV_MODEL_RECALL_DIRECT; kind <= KV_MODEL_RECALL_INDUCTION; kind++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, kind);
        kv_model m;
        if (kv_recall_build(&m, &o, &e)) {
            KV_CHECK(0, "build: %s", e.msg);
            continue;
        }
        kv_cache_spec sp = kv_cache_spec_default(2, kv_dialogue_length(&d, kind));
        kv_backend *bc = NULL, *bg = NULL;
        kv_dlg_result *rcpu = calloc(d.n_turns, sizeof *rcpu), *rg = calloc(d.n_turns, sizeof *rg);
        int ok = kv_backend_cpu(&bc, &m, &sp, &e) == KV_OK;
        KV_CHECK(ok, "cpu backend: %s", e.msg);
        if (ok) KV_CHECK((ok = kvcu_backend_create(&bg, &m, &sp, &e) == KV_OK), "gpu backend: %s", e.msg);
        if (ok) KV_CHECK((ok = kv_dialogue_run(bc, &d, kind, 0, rcpu, &e) == KV_OK), "cpu run: %s", e.msg);
        /* on the GPU with the from-scratch check: incremental and recomputed replies agree */
        if (ok) KV_CHECK((ok = kv_dialogue_run(bg, &d, kind, 1, rg, &e) == KV_OK), "gpu run: %s", e.msg);
        for (int t = 0; ok && t < d.n_turns; t++) {
            KV_CHECK(rg[t].reply == rcpu[t].reply && rg[t].pass, "%s turn %d: gpu reply %d, cpu %d, "
                     "expected %d", kv_recall_kind_name(kind), t + 1, rg[t].reply, rcpu[t].reply,
                     rg[t].expected);
            KV_CHECK(rg[t].recompute_token == rg[t].reply, "%s turn %d: gpu incremental %d vs "
                     "from scratch %d", kv_recall_kind_name(kind), t + 1, rg[t].reply,
                     rg[t].recompute_token);
            KV_CHECK(fabsf(rg[t].margin - rcpu[t].margin) <= 1e-3f, "%s turn %d: margin gpu %.6f "
                     "cpu %.6f", kv_recall_kind_name(kind), t + 1, rg[t].margin, rcpu[t].margin);
        }
        if (ok) printf("%s: %s model, %d turns, gpu replies equal cpu replies\n", d.name,
                       kv_recall_kind_name(kind), d.n_turns);
        free(rcpu);
        free(rg);
        kv_backend_destroy(bc);
        kv_backend_destroy(bg);
        kv_model_free(&m);
    }
    kv_dialogue_free(&d);
}

int main(int argc, char **argv)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    if (argc < 2) {
        printf("usage: test_gpu_needle DATASETS\n");
        return 2;
    }
    const int emulated = kvcu_is_emulation();
    test_grid(argv[1], emulated);
    test_dialogue(argv[1], emulated);
    return kv_test_finish();
}
