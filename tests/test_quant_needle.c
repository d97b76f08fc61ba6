/* Chapter 04, phase 2, end to end: the quantized needle grid and the dialogues, each format
 * through the engine on the recall models (the formats themselves inside the cache:
 * test_quant_cache.c).
 *
 *  - the quantized needle grid (datasets/needle/quant.needle), predictions in that file;
 *  - the six dialogues in every format, each reply as the grid predicts.
 *
 *   test_quant_needle DATASETS/needle [slow|long]  grid quant.needle (1k); slow:
 *                                     quant-fast.needle (1k and 4k); long: quant-32k.needle
 *                                     (int8, fp8 at 32k) and the dialogue suite in every format */
#include "common/kv_test.h"
#include "common/kv_test_backend.h"
#include "common/kv_test_data.h"

#include "kv_dialogue.h"
#include "kv_needle.h"
#include "kv_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run_grid(const char *dir, const char *file)
{
    kv_needle_spec s;
    kv_err e;
    if (kv_test_needle_read(dir, file, &s)) return;
    kv_needle_result *res;
    int n;
    int rc = kv_needle_grid(&s, kv_test_make_cpu, NULL, NULL, NULL, &res, &n, &e);
    KV_CHECK(rc == KV_OK, "grid %s: %s", s.name, e.msg);
    if (rc) return;
    for (int vi = 0; vi < s.n_variants; vi++) {
        int pass = 0, cells = 0;
        float mm = 1e9f;
        for (int i = 0; i < n; i++) {
            const kv_needle_result *r = &res[i];
            if (r->variant != vi) continue;
            cells++;
            pass += r->pass;
            mm = fminf(mm, r->margin);
            if (r->expected >= 0)
                KV_CHECK(r->pass == r->expected, "%s L %d depth %d%% (%s): %s, predicted %s "
                         "(margin %.3f)", kv_recall_kind_name(r->kind), r->length, r->depth,
                         s.variants[vi].spec, r->pass ? "pass" : "fail",
                         r->expected ? "pass" : "fail", r->margin);
        }
        printf("  needle %-12s %d of %d cells pass, smallest margin %.3f\n", s.variants[vi].spec,
               pass, cells, mm);
    }
    free(res);
}

/* A grid one context at a time (mode long): each (model, variant) is its own kv_needle_grid()
 * call, so every 32k context reports its cells, margin and time as soon as it is done. */
static void run_grid_each(const char *dir, const char *file)
{
    kv_needle_spec s;
    kv_err e;
    if (kv_test_needle_read(dir, file, &s)) return;
    for (int mi = 0; mi < s.n_models; mi++)
        for (int vi = 0; vi < s.n_variants; vi++) {
            kv_needle_spec one = s;
            one.n_models = 1;
            one.models[0] = s.models[mi];
            one.n_variants = 1;
            one.variants[0] = s.variants[vi];
            const double t0 = kv_now();
            kv_needle_result *res;
            int n, pass = 0;
            if (kv_needle_grid(&one, kv_test_make_cpu, NULL, NULL, NULL, &res, &n, &e)) {
                KV_CHECK(0, "grid %s: %s", s.name, e.msg);
                continue;
            }
            float mm = 1e9f;
            for (int i = 0; i < n; i++) {
                const kv_needle_result *r = &res[i];
                pass += r->pass;
                mm = fminf(mm, r->margin);
                if (r->expected >= 0)
                    KV_CHECK(r->pass == r->expected, "%s L %d depth %d%% (%s): %s, predicted %s "
                             "(margin %.3f)", kv_recall_kind_name(r->kind), r->length, r->depth,
                             s.variants[vi].spec, r->pass ? "pass" : "fail",
                             r->expected ? "pass" : "fail", r->margin);
            }
            printf("  needle %s %-9s %-12s %d of %d cells pass, smallest margin %.3f (%.0f s)\n",
                   s.name, kv_recall_kind_name(s.models[mi]), s.variants[vi].spec, pass, n, mm,
                   kv_now() - t0);
            fflush(stdout);
            free(res);
        }
}

/* The recall models and the dialogues' folder (beside DATASETS/needle); 0, or -1 (a failed
 * check). */
static int dialogue_setup(const char *needle_dir, kv_model models[2], char dlg_dir[1024])
{
    snprintf(dlg_dir, 1024, "%s/../dialogues", needle_dir);
    return kv_test_recall_models(models) ? -1 : 0;
}

/* Multi-turn recall on quantized caches: every turn of two dialogues, both recall models.
 * Predicted as for the needles (datasets/needle/quant.needle): every turn passes for int8,
 * fp8, int4 and int2 (the facts' keys are sparse: min/max quantization keeps them). */
static void run_dialogues(const char *needle_dir)
{
    static const char *const files[] = {"early-facts.dlg", "interleaved.dlg"};
    static const char *const fmts[] = {"int8", "fp8-e4m3", "int4", "int2"};
    kv_model models[2];
    kv_err e;
    char dlg_dir[1024];
    if (dialogue_setup(needle_dir, models, dlg_dir)) return;
    for (int f = 0; f < 2; f++) {
        kv_dialogue d;
        if (kv_test_dialogue_read(dlg_dir, files[f], &d)) continue;
        for (int fi = 0; fi < 4; fi++)
            for (int k = 0; k < 2; k++) {
                const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
                int pass = 0;
                float mm = 1e9f;
                const int rc = kv_test_dialogue_cell(kv_test_make_cpu, NULL, &models[k], &d, kind,
                                                     fmts[fi], &pass, &mm, &e);
                KV_CHECK(rc == KV_OK && pass == d.n_turns, "dialogue %s, %s model, %s: %d of %d "
                         "turns (%s)", files[f], kv_recall_kind_name(kind), fmts[fi], pass,
                         d.n_turns, rc ? e.msg : "predicted: all");
                printf("  dialogue %-16s %-9s %-9s %d/%d turns, smallest margin %.3f\n", files[f],
                       kv_recall_kind_name(kind), fmts[fi], pass, d.n_turns, mm);
            }
        kv_dialogue_free(&d);
    }
    kv_model_free(&models[0]);
    kv_model_free(&models[1]);
}

/* The dialogue suite per format (mode long): all six dialogues of datasets/dialogues on both
 * recall models, for every storage format and the fp8 and KIVI options. Predicted from the
 * construction as for the needles: every turn passes in every format. The dialogues are
 * 220-2600 tokens, so KIVI quantizes most of each history (its window keeps the newest 128,
 * or 32 with /w32); the facts' keys are zero on every filler of their 32-token block, and
 * min/max quantization keeps a group's extremes on grid points, so a fact decodes within
 * fp16 rounding at any bit width. Measured: see chapters/04-quantization/README.md. */
static void run_dialogue_suite(const char *needle_dir)
{
    static const char *const files[] = {"early-facts.dlg", "interleaved.dlg", "long-filler.dlg",
                                        "dense.dlg", "shared-values.dlg", "boundaries.dlg"};
    /* (int8-g128 needs d >= 128; the recall models have d = 64) */
    static const char *const fmts[] = {"fp16", "bf16", "int8", "int8-g32", "int8-g64",
                                       "fp8-e4m3", "fp8-e4m3/head", "fp8-e5m2", "fp8-e5m2/head",
                                       "int4", "int2", "int4/w32", "int2/w32"};
    const int n_fmts = (int)(sizeof fmts / sizeof fmts[0]);
    kv_model models[2];
    kv_err e;
    char dlg_dir[1024];
    if (dialogue_setup(needle_dir, models, dlg_dir)) return;
    for (int fi = 0; fi < n_fmts; fi++) {
        int turns = 0, pass = 0;
        float mm = 1e9f;
        for (int f = 0; f < 6; f++) {
            kv_dialogue d;
            if (kv_test_dialogue_read(dlg_dir, files[f], &d)) continue;
            for (int k = 0; k < 2; k++) {
                const int kind = k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT;
                int p = 0;
                const int rc = kv_test_dialogue_cell(kv_test_make_cpu, NULL, &models[k], &d, kind,
                                                     fmts[fi], &p, &mm, &e);
                KV_CHECK(rc == KV_OK && p == d.n_turns, "dialogue %s, %s model, %s: %d of %d "
                         "turns (%s)", files[f], kv_recall_kind_name(kind), fmts[fi], p,
                         d.n_turns, rc ? e.msg : "predicted: all");
                turns += d.n_turns;
                pass += p;
            }
            kv_dialogue_free(&d);
        }
        printf("  dialogues %-14s %d of %d turns (6 dialogues, 2 models), smallest margin %.3f\n",
               fmts[fi], pass, turns, mm);
        fflush(stdout);
    }
    kv_model_free(&models[0]);
    kv_model_free(&models[1]);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 2 ? argv[2] : "";
    if (argc < 2) {
        printf("usage: test_quant_needle DATASETS/needle [slow|long]\n");
        return 2;
    }
    if (!strcmp(mode, "long")) { /* 32k needles and the dialogue suite: slow */
        const double t0 = kv_now();
        run_dialogue_suite(argv[1]);
        const double t1 = kv_now();
        run_grid_each(argv[1], "quant-32k.needle");
        printf("  long: dialogue suite %.0f s, 32k grid %.0f s\n", t1 - t0, kv_now() - t1);
    } else {
        run_grid(argv[1], !strcmp(mode, "slow") ? "quant-fast.needle" : "quant.needle");
        run_dialogues(argv[1]);
    }
    return kv_test_finish();
}
