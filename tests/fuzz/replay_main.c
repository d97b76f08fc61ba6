/*
 * Replays fuzz inputs through a fuzz target without libFuzzer, so every build (gcc, Release,
 * debug-asan) runs the seed corpus and every saved crash as an ordinary CTest program.
 *
 * usage: <target>_replay DIR_OR_FILE...
 * A target aborts on any broken property (fuzz_common.h), so a bad input ends the process
 * with a signal and the test fails; one that returns prints "N passed, 0 failed".
 * Output the parsers print (the CLI's help and messages) is sent to /dev/null meanwhile.
 */
#define _DEFAULT_SOURCE
#include "fuzz_common.h"
#include "common/kv_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

static int stdout_fd = 1, quiet_fd = 1; /* the real stdout, and /dev/null */

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    KV_CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)(n > 0 ? n : 0) + 1); /* [file size] the input */
    size_t got = n > 0 ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    KV_CHECK(got == (size_t)(n > 0 ? n : 0), "short read of %s", path);
    fprintf(stderr, "replay %s (%zu bytes)\n", path, got);
    fflush(stdout);
    dup2(quiet_fd, 1); /* the parsers' own output is not what is checked */
    int rc = LLVMFuzzerTestOneInput(buf, got);
    fflush(stdout);
    dup2(stdout_fd, 1);
    KV_CHECK(rc == 0, "%s: target returned %d", path, rc);
    free(buf);
}

/* every regular file in a folder, in name order (the replay is deterministic) */
static void replay_dir(const char *dir)
{
    DIR *d = opendir(dir);
    KV_CHECK(d != NULL, "cannot open folder %s", dir);
    if (!d) return;
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, sizeof *names * (n + 1));
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && strcmp(names[i], "README.md") != 0)
            replay_file(path);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    stdout_fd = dup(1);
    quiet_fd = open("/dev/null", O_WRONLY);
    if (stdout_fd < 0 || quiet_fd < 0) {
        perror("dup/open /dev/null");
        return 2;
    }
    const int before = kv_test_passed + kv_test_failed;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) replay_dir(argv[i]);
        else replay_file(argv[i]);
    }
    close(quiet_fd);
    close(stdout_fd);
    KV_CHECK(kv_test_passed + kv_test_failed > before, "no inputs found in the given paths");
    return kv_test_finish();
}
