/*
 * --csv FILE and --json FILE, one convention for every command (cli.h): the rows go to FILE,
 * or with "-" to standard output. main.c calls kv_cli_csv_begin() before a command runs and
 * kv_cli_csv_end() after it, so a command only prints:
 *
 *   - a command that prints its rows in place of its table (tour, bench, eval, spec, stream,
 *     calc, tp: --csv is a KV_OPT_CSV in its table): with FILE, standard output is pointed at
 *     FILE's temporary file (kv_file_create) for the run and the file is renamed into place
 *     when the command succeeds, removed when it fails; with "-" nothing changes. A bench's
 *     --json FILE captures the rows the same way, and once the run succeeds writes them as
 *     JSON with the build and the machine (json_out.c), and as CSV where --csv asks too.
 *   - a command that prints a table and writes its rows to a file of its own (needle, passkey,
 *     serve, dialogue: --csv is a KV_OPT_STRING): with FILE nothing changes; with "-" the table goes to
 *     standard error and the command writes the rows to kv_cli_csv_stdout(), the real standard
 *     output, so a pipe receives the CSV alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "kv_file.h"

static FILE *csv_stdout; /* the real standard output while the table goes to stderr ("-") */

/* The value of @p opt in a command's words (opt X or opt=X), or NULL: also NULL when the
 * words ask for --help, which prints to standard output whatever the options say. */
static const char *opt_value(int argc, char **argv, const char *opt)
{
    const char *v = NULL;
    const size_t n = strlen(opt);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return NULL;
        if (!v && !strcmp(argv[i], opt) && i + 1 < argc && strncmp(argv[i + 1], "--", 2))
            v = argv[i + 1];
        else if (!v && !strncmp(argv[i], opt, n) && argv[i][n] == '=')
            v = argv[i] + n + 1;
    }
    return v && v[0] ? v : NULL;
}

/* Standard output onto @p fd for the run, the real one kept in c->saved_fd. */
static int redirect(const char *cmd, kv_cli_csv *c, int fd)
{
    fflush(stdout);
    c->saved_fd = dup(1);
    if (c->saved_fd >= 0 && dup2(fd, 1) >= 0) return KV_EXIT_OK;
    perror(cmd);
    return KV_EXIT_FAIL;
}

int kv_cli_csv_begin(const char *cmd, int argc, char **argv, int own_file, kv_cli_csv *c)
{
    memset(c, 0, sizeof *c);
    c->saved_fd = -1;
    const char *v = opt_value(argc, argv, "--csv");
    const char *j = own_file ? NULL : opt_value(argc, argv, "--json");
    kv_err err = {{0}};
    int st;
    if (own_file) { /* "-": the table to stderr, the rows to the real stdout */
        if (!v || strcmp(v, "-")) return KV_EXIT_OK;
        const int e = redirect(cmd, c, 2);
        if (!e && !(csv_stdout = fdopen(c->saved_fd, "w"))) {
            perror(cmd);
            return KV_EXIT_FAIL;
        }
        return e;
    }
    if (v && strcmp(v, "-")) { /* refused now, before any work, when it cannot be written */
        if ((st = kv_file_create(v, &c->out, &err))) return kv_cli_fail(cmd, "--csv", st, &err);
        c->to_file = 1;
    }
    if (!j) return c->to_file ? redirect(cmd, c, fileno(c->out.f)) : KV_EXIT_OK;
    c->to_stdout = v && !strcmp(v, "-");
    if (strcmp(j, "-") && (st = kv_file_create(j, &c->json, &err))) {
        kv_file_abort(&c->out);
        return kv_cli_fail(cmd, "--json", st, &err);
    }
    if (!(c->capture = tmpfile())) {
        perror(cmd);
        kv_file_abort(&c->out);
        kv_file_abort(&c->json);
        return KV_EXIT_FAIL;
    }
    return redirect(cmd, c, fileno(c->capture));
}

FILE *kv_cli_csv_stdout(void) { return csv_stdout; }

/* The captured rows, once the run succeeded: to --csv (FILE or -) and as --json. */
static int write_captured(const char *cmd, int argc, char **argv, kv_cli_csv *c)
{
    long n = -1;
    char *text = NULL;
    if (fseek(c->capture, 0, SEEK_END) == 0 && (n = ftell(c->capture)) >= 0 &&
        (text = malloc((size_t)n + 1)) != NULL) {
        rewind(c->capture);
        if (fread(text, 1, (size_t)n, c->capture) != (size_t)n) n = -1;
        else text[n] = '\0';
    }
    if (n < 0) {
        free(text);
        fprintf(stderr, "%s: --json: the rows could not be read back\n", cmd);
        return KV_EXIT_FAIL;
    }
    kv_err err = {{0}};
    FILE *csv = c->to_file ? c->out.f : c->to_stdout ? stdout : NULL;
    if (csv) fwrite(text, 1, (size_t)n, csv);
    int st = kv_cli_json_write(c->json.f ? c->json.f : stdout, cmd, argc, argv, text, (size_t)n,
                               &err);
    free(text);
    if (st) return kv_cli_fail(cmd, "--json", st, &err);
    if (c->to_file && (st = kv_file_commit(&c->out, &err))) return kv_cli_write_fail(cmd, "--csv", &err);
    if (c->json.f && (st = kv_file_commit(&c->json, &err)))
        return kv_cli_write_fail(cmd, "--json", &err);
    return KV_EXIT_OK;
}

int kv_cli_csv_end(const char *cmd, int argc, char **argv, kv_cli_csv *c, int rc)
{
    if (c->saved_fd < 0) return rc;
    const int flushed = fflush(stdout) == 0 && !ferror(stdout);
    if (csv_stdout) { /* "-" of a command with its own file: the rows went to csv_stdout */
        const int ok = fflush(csv_stdout) == 0 && !ferror(csv_stdout);
        dup2(c->saved_fd, 1);
        fclose(csv_stdout); /* closes saved_fd */
        csv_stdout = NULL;
        if (!ok && !rc) {
            fprintf(stderr, "%s: --csv: writing to standard output failed\n", cmd);
            rc = KV_EXIT_FAIL;
        }
        return rc;
    }
    dup2(c->saved_fd, 1);
    close(c->saved_fd);
    if (!rc && !flushed) {
        fprintf(stderr, "%s: writing the rows failed\n", cmd);
        rc = KV_EXIT_FAIL;
    }
    if (!rc && c->capture) rc = write_captured(cmd, argc, argv, c);
    else if (!rc && c->to_file) {
        kv_err err = {{0}};
        if (kv_file_commit(&c->out, &err)) rc = kv_cli_write_fail(cmd, "--csv", &err);
    }
    /* a failed run leaves no file, and an old one as it was (no-ops on what was committed) */
    kv_file_abort(&c->out);
    kv_file_abort(&c->json);
    if (c->capture) fclose(c->capture);
    return rc;
}
