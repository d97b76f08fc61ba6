/*
 * Models fetched by tools/fetch-model.sh (cli.h): `--model smollm2` resolved to its file in
 * the models folder, and a GGUF model opened and dequantized with progress on stderr.
 *
 * The folder is $KVLAB_MODELS, else $HOME/.cache/kvlab/models: what tools/fetch-model.sh
 * writes to. Nothing is downloaded here; a name whose file is absent says which command
 * fetches it.
 */
#include "cli.h"
#include "kv_file.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* the names tools/fetch-model.sh knows, and the file each one fetches */
static const struct { const char *name, *file; } fetched[] = {
    {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
};

int kv_cli_models_dir(char *dir, size_t n, kv_err *err)
{
    const char *env = getenv("KVLAB_MODELS"), *home = getenv("HOME");
    int k;
    if (env && *env) k = snprintf(dir, n, "%s", env);
    else if (home && *home) k = snprintf(dir, n, "%s/.cache/kvlab/models", home);
    else return kv_fail(err, KV_ERR_IO, "neither KVLAB_MODELS nor HOME is set: no models folder");
    if (k < 0 || (size_t)k >= n) return kv_fail(err, KV_ERR_ARG, "the models folder's path is too long");
    return KV_OK;
}

int kv_cli_model_resolve(const char *name, char *path, size_t n, kv_err *err)
{
    if (!name) return kv_fail(err, KV_ERR_ARG, "model name is NULL");
    for (size_t i = 0; i < sizeof fetched / sizeof fetched[0]; i++) {
        if (strcmp(name, fetched[i].name) != 0) continue;
        char dir[KV_CLI_PATH_MAX];
        int rc = kv_cli_models_dir(dir, sizeof dir, err);
        if (rc) return rc;
        const int k = snprintf(path, n, "%s/%s", dir, fetched[i].file);
        if (k < 0 || (size_t)k >= n)
            return kv_fail(err, KV_ERR_ARG, "the path of model '%s' is too long", name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            return kv_fail(err, KV_ERR_IO, "model '%s' is not fetched: run "
                           "tools/fetch-model.sh %s", name, name);
        return KV_OK;
    }
    const int k = snprintf(path, n, "%s", name);
    if (k < 0 || (size_t)k >= n) return kv_fail(err, KV_ERR_ARG, "model path is too long");
    return KV_OK;
}

static void show(void *ctx, int64_t done, int64_t total)
{
    kv_progress_update(ctx, (long)(done >> 20), (long)(total >> 20));
}

int kv_cli_gguf_load(const char *path, int storage, kv_model *m, kv_gguf **g, kv_err *err)
{
    memset(m, 0, sizeof *m);
    kv_gguf *file = NULL;
    int rc = kv_gguf_open(path, &file, err);
    if (rc) return rc;
    kv_progress p;
    kv_progress_start(&p, storage == KV_WEIGHTS_F32 ? "dequantizing the weights (Mi weights)"
                                                    : "reading the weights (Mi weights)");
    rc = kv_gguf_model_load_as(file, m, storage, show, &p, err);
    kv_progress_end(&p);
    if (rc || !g) kv_gguf_close(file);
    else *g = file;
    return rc;
}
