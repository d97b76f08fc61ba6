/*
 * Bad input, the files a command writes (every --csv, --svg, --timeline, --save-model,
 * --save-models and --out):
 *
 *  - replacing a file keeps its mode: a 0600 file stays 0600 (its temporary is never more
 *    open than the old file); a new file gets 0666 less the umask;
 *  - the temporary's name does not depend on the output's length: a legal name of 250 bytes
 *    is written, not refused for a suffix that pushes it past NAME_MAX;
 *  - two outputs naming one file (the same spelling, another spelling of the same path, a hard
 *    link, a --save-models file) are refused before any work, naming both options and the
 *    path; so is an output in a folder that does not exist;
 *  - a write that fails once the run is under way (the file size limit) exits 1 in every
 *    command (kvlab --help), and the old file stays.
 *
 * usage: test_bad_input_outputs <path to kvlab>
 */
#define _GNU_SOURCE
#include "kv_file.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>

static const char *trace_file; /* a shipped request trace (absolute) */

static int mode_of(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

/* @p p made anew with @p mode and a few bytes no command writes */
static void plant(const char *p, int mode)
{
    unlink(p);
    write_bytes(p, "old\n", 4);
    chmod(p, (mode_t)mode);
}

/* kvlab @p args in the scratch folder; expects exit 0 */
static void run_ok(const char *what, const char *const *args)
{
    result r = run_in(dir, args);
    KV_CHECK(r.rc == 0, "%s: exit %d, stderr %s", what, r.rc, r.err);
    free(r.out);
    free(r.err);
}

/* ---- modes -------------------------------------------------------------------------------- */

static void test_modes(void)
{
    /* the library's writer itself */
    const char *p = file("lib.out");
    plant(p, 0600);
    kv_file_out o;
    kv_err err = {{0}};
    KV_CHECK(kv_file_create(p, &o, &err) == KV_OK, "%s", err.msg);
    if (o.f) {
        struct stat st;
        KV_CHECK(fstat(fileno(o.f), &st) == 0 && (st.st_mode & 077) == 0,
                 "the temporary of a 0600 file is %o: more open than the old file",
                 (unsigned)(st.st_mode & 07777));
        fputs("new\n", o.f);
        KV_CHECK(kv_file_commit(&o, &err) == KV_OK, "%s", err.msg);
    }
    KV_CHECK(mode_of(p) == 0600, "kv_file_commit over a 0600 file left mode %o", mode_of(p));
    plant(p, 0640);
    KV_CHECK(kv_file_create(p, &o, &err) == KV_OK && kv_file_commit(&o, &err) == KV_OK, "%s", err.msg);
    KV_CHECK(mode_of(p) == 0640, "kv_file_commit over a 0640 file left mode %o", mode_of(p));
    unlink(p);
    KV_CHECK(kv_file_create(p, &o, &err) == KV_OK && kv_file_commit(&o, &err) == KV_OK, "%s", err.msg);
    KV_CHECK(mode_of(p) == 0644, "a new file under umask 022: mode %o, expected 0644", mode_of(p));

    /* every output of every command: a 0600 file replaced stays 0600, with new bytes */
    static const char *const names[] = {"m.bin", "c.csv", "c.svg", "t.csv", "s.csv",
                                        "conv.bin", "pre-direct.bin"};
    for (int i = 0; i < 7; i++) plant(file(names[i]), 0600);
    run_ok("generate --save-model", (const char *const[]){"generate", "--default", "tiny",
           "--steps", "1", "--save-model", "m.bin", NULL});
    run_ok("needle --csv --svg --save-models", (const char *const[]){"needle", "--models",
           "direct", "--lengths", "64", "--depths", "50", "--csv", "c.csv", "--svg", "c.svg",
           "--save-models", "pre", NULL});
    run_ok("serve --timeline --csv", (const char *const[]){"serve", "--trace", trace_file,
           "--max-requests", "3", "--timeline", "t.csv", "--csv", "s.csv", NULL});
    run_ok("convert --out", (const char *const[]){"convert", "--default", "tiny", "--kv-heads",
           "1", "--compare", "0", "--out", "conv.bin", NULL});
    for (int i = 0; i < 7; i++) {
        size_t n = 0;
        unsigned char *b = slurp(file(names[i]), &n);
        KV_CHECK(b && n > 4, "%s was not rewritten (%zu bytes)", names[i], n);
        KV_CHECK(mode_of(file(names[i])) == 0600, "%s: a 0600 file replaced has mode %o",
                 names[i], mode_of(file(names[i])));
        free(b);
    }
    KV_CHECK(count_files(KV_FILE_TMP_PREFIX) == 0, "a temporary file was left behind");
}

/* ---- long names --------------------------------------------------------------------------- */

static void test_long_names(void)
{
    char name[251], path[PATH_MAX]; /* file() holds 256 bytes: too few here */
    memset(name, 'n', 250);
    memcpy(name + 246, ".csv", 5); /* 250 bytes: legal under NAME_MAX (255) */
    run_ok("needle --csv <250-byte name>", (const char *const[]){"needle", "--models", "direct",
           "--lengths", "64", "--depths", "50", "--csv", name, NULL});
    snprintf(path, sizeof path, "%s/%s", dir, name);
    KV_CHECK(exists(path), "needle --csv did not write a 250-byte name");
    memcpy(name + 246, ".bin", 5);
    run_ok("generate --save-model <250-byte name>", (const char *const[]){"generate",
           "--default", "tiny", "--steps", "1", "--save-model", name, NULL});
    snprintf(path, sizeof path, "%s/%s", dir, name);
    KV_CHECK(exists(path), "generate --save-model did not write a 250-byte name");
}

/* ---- one file named twice ---------------------------------------------------------------- */

static void test_same_file(void)
{
    const char *const needle[] = {"needle", "--models", "direct", "--lengths", "64",
                                  "--depths", "50"};
#define NEEDLE(...) needle[0], needle[1], needle[2], needle[3], needle[4], needle[5], needle[6], \
                    __VA_ARGS__
    CLI_BAD("--csv|--svg|same.out|each output needs a file of its own",
            NEEDLE("--csv", "same.out", "--svg", "same.out"));
    CLI_BAD("--csv|--svg|same.out", NEEDLE("--csv", "same.out", "--svg", "./same.out"));
    CLI_BAD("--csv|--svg|same.out", NEEDLE("--csv", "same.out", "--svg", "../cwd/same.out"));
    CLI_BAD("--save-models|--csv|p-direct.bin", NEEDLE("--csv", "p-direct.bin",
                                                       "--save-models", "p"));
    CLI_BAD("--csv|no-such-folder", NEEDLE("--csv", "no-such-folder/x.csv"));
    CLI_BAD("--csv|--timeline|s.csv|each output needs a file of its own", "serve", "--trace",
            trace_file, "--max-requests", "2", "--timeline", "s.csv", "--csv", "s.csv");
    CLI_BAD("--save-model|no-such-folder", "generate", "--steps", "1", "--save-model",
            "no-such-folder/m.bin");
    CLI_BAD("--out|no-such-folder", "convert", "--default", "tiny", "--kv-heads", "1", "--out",
            "no-such-folder/m.bin");
    /* a hard link is the same file under another name: refused, both left as they were */
    const char *a = file("linked.csv"), *b = file("link.csv");
    plant(a, 0644);
    unlink(b);
    KV_CHECK(link(a, b) == 0, "link %s", b);
    char pa[PATH_MAX], pb[PATH_MAX];
    snprintf(pa, sizeof pa, "%s", a);
    snprintf(pb, sizeof pb, "%s", b);
    CLI_BAD("--csv|--svg|link", NEEDLE("--csv", pa, "--svg", pb));
    size_t n = 0;
    unsigned char *bytes = slurp(pa, &n);
    KV_CHECK(bytes && n == 4 && !memcmp(bytes, "old\n", 4), "a refused run changed %s", pa);
    free(bytes);
#undef NEEDLE
}

/* ---- one exit code for a failed write ----------------------------------------------------- */

static void test_write_failure(void)
{
    /* 2 KiB per file: stdout (about 0.5 and 1.3 KiB here) fits, the SVG of 11 cells (2.7 KiB)
     * and serve's timeline of 20 requests (10 KiB) do not */
    struct rlimit old, small = {2048, 2048};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN); /* write(2) then fails with EFBIG instead of a signal */
    plant(file("big.svg"), 0644);
    plant(file("big.csv"), 0644);
    KV_CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "setrlimit");
    result rn = run_in(dir, (const char *const[]){"needle", "--models", "direct", "--lengths",
                        "64", "--depths", "0,10,20,30,40,50,60,70,80,90,100", "--svg", "big.svg",
                        NULL});
    result rs = run_in(dir, (const char *const[]){"serve", "--trace", trace_file,
                        "--max-requests", "20", "--timeline", "big.csv", NULL});
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    KV_CHECK(rn.rc == 1 && strstr(rn.err, "--svg"), "needle, --svg past the size limit: exit "
             "%d, expected 1 (stderr %s)", rn.rc, rn.err);
    KV_CHECK(rs.rc == 1 && strstr(rs.err, "--timeline"), "serve, --timeline past the size "
             "limit: exit %d, expected 1 (stderr %s)", rs.rc, rs.err);
    static const char *const names[] = {"big.svg", "big.csv"};
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        unsigned char *b = slurp(file(names[i]), &n);
        KV_CHECK(b && n == 4, "a failed write replaced %s (%zu bytes)", names[i], n);
        free(b);
    }
    KV_CHECK(count_files(KV_FILE_TMP_PREFIX) == 0, "a failed write left a temporary file");
    free(rn.out);
    free(rn.err);
    free(rs.out);
    free(rs.err);
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s <kvlab> <datasets folder>\n", argv[0]);
        return 2;
    }
    static char trace[PATH_MAX];
    snprintf(trace, sizeof trace, "%s/traces/alpaca.csv", argv[2]);
    trace_file = trace;
    umask(022);
    test_modes();
    test_long_names();
    test_same_file();
    test_write_failure();
    cleanup();
    return kv_test_finish();
}
