/*
 * Bad input, the files a command writes (every --csv, --svg, --timeline, --save-model,
 * --save-models and --out):
 *
 *  - replacing a file keeps its mode: a 0600 file stays 0600 (its temporary is never more
 *    open than the old file); a new file gets 0666 less the umask;
 *  - the temporary's name does not depend on the output's length: a legal name of 250 bytes
 *    is written, not refused for a suffix that pushes it past NAME_MAX.
 *
 * usage: test_bad_input_outputs <path to kvlab>
 */
#define _GNU_SOURCE
#include "kv_file.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h"

#include <fcntl.h>

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
    cleanup();
    return kv_test_finish();
}
