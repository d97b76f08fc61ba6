/*
 * What the CLI tests share (test_bad_input.c, test_bad_input2.c, test_cli.c): a scratch folder,
 * files written into it, and kvlab run as a child process with its exit code, stdout and
 * stderr captured. Include after kv_test.h, with _GNU_SOURCE defined.
 */
#ifndef KV_TEST_CLI_H
#define KV_TEST_CLI_H

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_test.h"

static char dir[64];        /* per-run scratch folder */
static const char *kvlab;   /* the CLI binary */

static inline const char *file(const char *name)
{
    static char p[4][256]; /* a few names may be live at once */
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static inline void write_bytes(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        printf("cannot write %s\n", p);
        exit(1);
    }
}

static inline unsigned char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) {
        free(b);
        b = NULL;
    } else {
        b[*n] = '\0'; /* the CLI's output is read as text */
    }
    fclose(f);
    return b;
}

static inline int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* entries in the scratch folder whose name contains @p part (dot files too: the temporary
 * files of kv_file.h start with a dot) */
static inline int count_files(const char *part)
{
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

typedef struct {
    int rc;     /* exit code; 128 + signal when it crashed */
    char *out;  /* stdout */
    char *err;  /* stderr */
} result;

/* Run kvlab with @p args (NULL-terminated) in the scratch folder @p cwd. */
static inline result run_in(const char *cwd, const char *const *args)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)kvlab;
    for (int i = 0; args[i] && argc < 63; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    char out_path[] = "/tmp/kvlab_bad_out_XXXXXX", err_path[] = "/tmp/kvlab_bad_err_XXXXXX";
    int fo = mkstemp(out_path), fe = mkstemp(err_path);
    result r = {-1, NULL, NULL};
    if (fo < 0 || fe < 0) {
        perror("mkstemp");
        exit(1);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fo, 1);
        dup2(fe, 2);
        if (chdir(cwd) != 0) _exit(126);
        execv(kvlab, argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    size_t n;
    r.out = (char *)slurp(out_path, &n);
    r.err = (char *)slurp(err_path, &n);
    close(fo);
    close(fe);
    unlink(out_path);
    unlink(err_path);
    return r;
}

/* Expect exit 2, stderr naming every '|'-separated word of @p want, an empty stdout, and no
 * new file in the working folder. */
static inline void expect_cli_bad(const char *want, const char *const *args)
{
    char cwd[128];
    snprintf(cwd, sizeof cwd, "%s/cwd", dir);
    mkdir(cwd, 0700);
    result r = run_in(cwd, args);
    char line[512] = "";
    for (int i = 0; args[i]; i++) {
        size_t used = strlen(line);
        snprintf(line + used, sizeof line - used, "%s%.60s", i ? " " : "", args[i]);
    }
    KV_CHECK(r.rc == 2, "kvlab %s: exit %d, expected 2 (stderr: %s)", line, r.rc, r.err);
    char words[256];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
        KV_CHECK(strstr(r.err, w) != NULL, "kvlab %s: stderr lacks '%s': %s", line, w, r.err);
    KV_CHECK(r.out[0] == '\0', "kvlab %s: printed on stdout: %.200s", line, r.out);
    DIR *d = opendir(cwd);
    int left = 0;
    for (struct dirent *e; d && (e = readdir(d));) left += e->d_name[0] != '.';
    if (d) closedir(d);
    KV_CHECK(left == 0, "kvlab %s: left %d file(s) in its working folder", line, left);
    free(r.out);
    free(r.err);
}

#define CLI_BAD(want, ...) expect_cli_bad(want, (const char *const[]){__VA_ARGS__, NULL})

static inline void cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
}


/* The CLI at argv[1] (made absolute: it runs in other folders) and a fresh scratch folder;
 * exits 2 on a missing argument, 1 when the folder cannot be made. */
static inline void kv_test_cli_init(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s <kvlab>\n", argv[0]);
        exit(2);
    }
    static char kvlab_abs[PATH_MAX];
    kvlab = realpath(argv[1], kvlab_abs) ? kvlab_abs : argv[1];
    snprintf(dir, sizeof dir, "/tmp/kvlab_bad_input_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

#endif
