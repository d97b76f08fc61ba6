/*
 * kv_test_data.h: the data fixtures of the needle, dialogue and quantized-grid tests.
 *
 *  - kv_test_recall_models: the two recall models every dialogue runs on, [0] direct and
 *    [1] induction (kv_recall.h, default options); one that does not build is a failed check;
 *  - kv_test_needle_read / kv_test_dialogue_read: dir/file read from a datasets folder; a file
 *    that does not read is a failed check (its message printed) and returns -1;
 *  - kv_test_dialogue_cell: one dialogue on one recall model and cache format, through the
 *    backend a factory builds (kv_test_make_cpu, kv_test_make_cuda): the turns that pass and the
 *    smallest margin.
 * Include after kv_test.h.
 */
#ifndef KV_TEST_DATA_H
#define KV_TEST_DATA_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv_dialogue.h"
#include "kv_needle.h"
#include "kv_recall.h"
#include "kv_test.h"

static inline int kv_test_recall_models(kv_model models[2])
{
    kv_err e;
    for (int k = 0; k < 2; k++) {
        kv_recall_opts o;
        kv_recall_opts_default(&o, k ? KV_MODEL_RECALL_INDUCTION : KV_MODEL_RECALL_DIRECT);
        const int rc = kv_recall_build(&models[k], &o, &e);
        if (rc) {
            KV_CHECK(0, "recall model: %s", e.msg);
            if (k) kv_model_free(&models[0]);
            return rc;
        }
    }
    return KV_OK;
}

static inline int kv_test_needle_read(const char *dir, const char *file, kv_needle_spec *s)
{
    char path[4096];
    kv_err e;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    kv_needle_spec_default(s);
    if (kv_needle_spec_read(path, s, &e) == KV_OK) return 0;
    KV_CHECK(0, "%s", e.msg);
    return -1;
}

static inline int kv_test_dialogue_read(const char *dir, const char *file, kv_dialogue *d)
{
    char path[4096];
    kv_err e;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (kv_dialogue_read(path, d, &e) == KV_OK) return 0;
    KV_CHECK(0, "%s", e.msg);
    return -1;
}

/* d on m (recall kind) in one slot of cache format fmt: *pass = the turns that pass, *margin
 * lowered to the smallest margin seen (not reset). Returns the status of the run. */
static inline int kv_test_dialogue_cell(kv_needle_backend_fn make, void *user, const kv_model *m,
                                        const kv_dialogue *d, int kind, const char *fmt, int *pass,
                                        float *margin, kv_err *e)
{
    kv_cache_spec sp;
    kv_backend *b = NULL;
    kv_dlg_result *res = (kv_dlg_result *)calloc((size_t)d->n_turns, sizeof *res); /* [n_turns] */
    int rc = kv_needle_cache_spec(fmt, 1, kv_dialogue_length(d, kind), &sp, e);
    if (!rc) rc = make(&b, m, &sp, user, e);
    if (!rc) rc = kv_dialogue_run(b, d, kind, 0, res, e);
    *pass = 0;
    for (int t = 0; t < d->n_turns && !rc; t++) {
        *pass += res[t].pass;
        *margin = fminf(*margin, res[t].margin);
    }
    free(res);
    if (b) kv_backend_destroy(b);
    return rc;
}

#endif
