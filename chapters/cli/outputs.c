/*
 * The files a command writes (--csv, --svg, --timeline, --save-model, --out ...), checked once
 * before any work (cli.h): each can be replaced, in a folder that exists and can be written,
 * and no two name the same file. Then one exit code for a write that fails once the run is
 * under way, whatever the command: 1, a run failure (kvlab --help).
 */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_file.h"

/* The folder of @p path resolved (realpath) and its last name after it: "/a/b" + "/" + "x.csv",
 * one spelling for "x.csv", "./x.csv" and "sub/../x.csv"; NULL (errno set) when the folder
 * cannot be resolved. */
static char *normalized(const char *path)
{
    const char *slash = strrchr(path, '/');
    char folder[PATH_MAX];
    if (!slash) snprintf(folder, sizeof folder, ".");
    else if (slash == path) snprintf(folder, sizeof folder, "/");
    else snprintf(folder, sizeof folder, "%.*s", (int)(slash - path), path);
    char *real = realpath(folder, NULL);
    if (!real) return NULL;
    const char *base = slash ? slash + 1 : path;
    char *out = malloc(strlen(real) + strlen(base) + 2);
    if (out) sprintf(out, "%s/%s", real, base);
    free(real);
    return out;
}

/* 1 when @p a and @p b name one file: the same device and inode when both exist, else the
 * same normalized path (a file that does not exist yet) */
static int same_file(const char *a, const char *b, const char *na, const char *nb)
{
    struct stat sa, sb;
    const int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ea != eb) return 0;
    return strcmp(na, nb) == 0;
}

int kv_cli_outputs_check(const char *cmd, const kv_cli_output *outs, int n)
{
    char *norm[KV_CLI_MAX_OUTPUTS] = {0};
    int rc = 0;
    if (n > KV_CLI_MAX_OUTPUTS) n = KV_CLI_MAX_OUTPUTS; /* never: the lists are written by hand */
    for (int i = 0; i < n && !rc; i++) {
        if (!outs[i].path) continue;
        if (!strcmp(outs[i].opt, "--csv") && kv_cli_csv_stdout()) continue; /* --csv - */
        kv_err err = {{0}};
        const int st = kv_file_check_target(outs[i].path, &err);
        if (st) {
            rc = kv_cli_fail(cmd, outs[i].opt, st, &err);
            break;
        }
        if (!(norm[i] = normalized(outs[i].path))) {
            rc = kv_args_bad(cmd, outs[i].opt, "cannot open '%s' for writing: its folder: %s",
                             outs[i].path, strerror(errno));
            break;
        }
        char *slash = strrchr(norm[i], '/'); /* the folder must take a new file */
        *slash = '\0';
        const int writable = access(norm[i][0] ? norm[i] : "/", W_OK | X_OK) == 0;
        const int e = errno;
        *slash = '/';
        if (!writable) {
            rc = kv_args_bad(cmd, outs[i].opt, "cannot open '%s' for writing: its folder: %s",
                             outs[i].path, strerror(e));
            break;
        }
        for (int j = 0; j < i && !rc; j++)
            if (outs[j].path && same_file(outs[j].path, outs[i].path, norm[j], norm[i]))
                rc = kv_args_bad(cmd, outs[i].opt, "'%s' is the file %s names too ('%s'): "
                                 "each output needs a file of its own", outs[i].path,
                                 outs[j].opt, outs[j].path);
    }
    for (int i = 0; i < n; i++) free(norm[i]);
    return rc;
}

int kv_cli_write_fail(const char *cmd, const char *opt, const kv_err *err)
{
    fprintf(stderr, "%s: %s: %s\n", cmd, opt, err && err->msg[0] ? err->msg : "writing failed");
    return KV_EXIT_FAIL;
}
