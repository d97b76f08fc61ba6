/*
 * `--model trained`: the model kvlab ships (datasets/models/, trained by tools/train/), found
 * from the source tree this binary was built from (KV_SOURCE_DIR, set by CMake) or from
 * $KVLAB_DATASETS, and checked against datasets/models/SHA256SUMS before it is read, so a
 * corrupted or truncated file is named as such instead of producing odd text (or, for the
 * held-out text, another perplexity).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kv_file.h"
#include "kv_sha256.h"

#ifndef KV_SOURCE_DIR
#define KV_SOURCE_DIR "."
#endif

/* the expected digest of @p name in the SHA256SUMS text @p sums ("<64 hex>  name" lines) */
static int expected_digest(const char *sums, const char *name, char want[65])
{
    size_t len = strlen(name);
    for (const char *line = sums; line && *line; line = strchr(line, '\n'), line += !!line) {
        const char *nm = line + 64;
        if (strspn(line, "0123456789abcdef") != 64 || strncmp(nm, "  ", 2) != 0) continue;
        nm += 2;
        if (strncmp(nm, name, len) == 0 && (nm[len] == '\n' || nm[len] == '\0' || nm[len] == '\r')) {
            memcpy(want, line, 64);
            want[64] = '\0';
            return 1;
        }
    }
    return 0;
}

int kv_cli_trained(kv_cli_trained_files *t, int heldout, kv_err *err)
{
    const char *env = getenv("KVLAB_DATASETS");
    char dir[KV_CLI_PATH_MAX];
    if (env && env[0]) snprintf(dir, sizeof dir, "%s/models", env);
    else snprintf(dir, sizeof dir, "%s/datasets/models", KV_SOURCE_DIR);
    snprintf(t->model, sizeof t->model, "%s/%s", dir, KV_TRAINED_NAME ".bin");
    snprintf(t->tokenizer, sizeof t->tokenizer, "%s/%s", dir, KV_TRAINED_NAME "-tokenizer.bin");
    snprintf(t->heldout, sizeof t->heldout, "%s/%s", dir, KV_TRAINED_NAME "-heldout.txt");
    char sums_path[KV_CLI_PATH_MAX + 16];
    snprintf(sums_path, sizeof sums_path, "%s/SHA256SUMS", dir);
    char *sums = NULL;
    kv_err why = {{0}};
    int rc = kv_file_read_text(sums_path, 1 << 16, &sums, NULL, &why);
    if (rc)
        return kv_fail(err, rc, "the trained model's checksums: %s (set KVLAB_DATASETS to the "
                       "datasets/ folder of a kvlab checkout)", why.msg);
    /* the held-out text too when it is read (eval's default text): an edited copy would
     * change the perplexity reported for the shipped model without a word */
    const char *files[3] = {t->model, t->tokenizer, t->heldout};
    for (int i = 0; i < (heldout ? 3 : 2) && !rc; i++) {
        const char *name = strrchr(files[i], '/') + 1;
        char want[65], got[65];
        if (!expected_digest(sums, name, want)) {
            rc = kv_fail(err, KV_ERR_FORMAT, "'%s' has no line for %s", sums_path, name);
        } else if ((rc = kv_sha256_file(files[i], got, err)) == KV_OK && strcmp(got, want) != 0) {
            rc = kv_fail(err, KV_ERR_FORMAT,
                         "'%s' is corrupt or truncated: its SHA-256 is %.16s..., SHA256SUMS "
                         "says %.16s... (restore it with git, or retrain: tools/train/README.md)",
                         files[i], got, want);
        }
    }
    free(sums);
    return rc;
}
