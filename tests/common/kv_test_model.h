/*
 * The real models the tests labelled realmodel read: where tools/fetch-model.sh puts them
 * ($KVLAB_MODELS, else ~/.cache/kvlab/models, as kv_cli_model_resolve() looks), and the skip
 * line such a test prints when one is absent.
 */
#ifndef KV_TEST_MODEL_H
#define KV_TEST_MODEL_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define KV_TEST_SMOLLM2 "SmolLM2-135M-Instruct.Q4_1.gguf"

/* path [n] <- the models folder's @p file; 1 when it is there, else 0 after printing
 * "skipped: ... fetch it with: tools/fetch-model.sh @p fetch" (the caller exits 77) */
static inline int kv_test_model_path(const char *file, const char *fetch, char *path, size_t n)
{
    const char *env = getenv("KVLAB_MODELS"), *home = getenv("HOME");
    if (env && *env) snprintf(path, n, "%s/%s", env, file);
    else snprintf(path, n, "%s/.cache/kvlab/models/%s", home ? home : ".", file);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) return 1;
    printf("skipped: %s is not there; fetch it with: tools/fetch-model.sh %s\n", path, fetch);
    return 0;
}

#endif
