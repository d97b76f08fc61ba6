/*
 * Bad input, second round (issue 28): what test_bad_input.c did not reach.
 *
 *  - the sampler: a flat distribution with top-p below 1/vocab, a tiny temperature, NaN and
 *    inf logits (a token in range, or -1; never a read outside the candidates);
 *  - NaN logits from weights that overflow the forward pass: "no finite logits", not token 0
 *    forever; RMSNorm of a row whose squares overflow still has unit RMS;
 *  - every file reader on a FIFO (refused at once, never blocks), a directory, a file over its
 *    cap; NUL bytes and CR-only line endings in the text formats (LF and CRLF accepted);
 *  - writers never remove or replace a path they did not create: serve's --csv/--timeline on a
 *    failed run, a FIFO or a symbolic link as an output;
 *  - the CLI: a vocab-1 model under serve, OMP_NUM_THREADS far past the CPUs (also past 2^31
 *    and 2^32, which omp_get_max_threads() returns cut to a negative, zero or one int),
 *    --threads, stdout that cannot be written, serve where every request fails;
 *  - chapters 09 and 10 on the command line: tp's ranks, spec's options, needle's retention
 *    variants and spec files, tour's chapters without a demo.
 *
 * usage: test_bad_input2 <path to kvlab>
 */
#define _GNU_SOURCE
#include "kv_checkpoint.h"
#include "kv_dialogue.h"
#include "kv_file.h"
#include "kv_generate.h"
#include "kv_needle.h"
#include "kv_ops.h"
#include "kv_sampler.h"
#include "kv_tokenizer.h"
#include "kv_trace.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h"

#include <fcntl.h>
#include <math.h>
#include <sched.h>

/* every '|'-separated word of @p want is in @p msg */
static int has_words(const char *msg, const char *want)
{
    char words[256];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); w; w = strtok(NULL, "|"))
        if (!strstr(msg, w)) return 0;
    return 1;
}

/* ---- the sampler ------------------------------------------------------------------------ */

static void test_sampler(void)
{
    enum { V = 64 };
    float lg[V];
    kv_sampler s;
    /* flat logits, top-p below 1/V: every token falls under the pre-filter's cutoff */
    KV_CHECK(kv_sampler_init(&s, V, 1.0f, 0.001f, 7, NULL) == KV_OK, "init");
    for (int k = 0; k < 50; k++) {
        for (int i = 0; i < V; i++) lg[i] = 0.0f;
        const int t = kv_sample(&s, lg);
        KV_CHECK(t >= 0 && t < V, "flat logits, top-p 0.001: token %d", t);
    }
    kv_sampler_free(&s);
    /* temperature 1e-40 (x / T would overflow to inf and the softmax to NaN): the argmax */
    KV_CHECK(kv_sampler_init(&s, V, 1e-40f, 0.9f, 7, NULL) == KV_OK, "init tiny T");
    for (int i = 0; i < V; i++) lg[i] = (float)(i % 7);
    lg[33] = 9.0f;
    KV_CHECK(kv_sample(&s, lg) == 33, "temperature 1e-40 samples the largest logit");
    /* NaN, +inf, all -inf: no token (-1), and kv_logits_check names why */
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *want[3] = {"no finite logits|NaN", "no finite logits|+inf", "no finite logits|-inf"};
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < V; i++) lg[i] = b == 2 ? -INFINITY : 0.5f;
        lg[5] = bad[b];
        kv_err err = {{0}};
        KV_CHECK(kv_logits_check(lg, V, &err) == KV_ERR_ARG && has_words(err.msg, want[b]),
                 "kv_logits_check case %d: '%s'", b, err.msg);
        KV_CHECK(kv_sample(&s, lg) == -1, "top-p sampling of bad logits (case %d) is -1", b);
    }
    kv_sampler_free(&s);
    KV_CHECK(kv_sampler_init(&s, V, 0.0f, 1.0f, 7, NULL) == KV_OK, "init greedy");
    for (int i = 0; i < V; i++) lg[i] = NAN;
    KV_CHECK(kv_sample(&s, lg) == -1, "greedy over NaN logits is -1, not token 0");
    kv_sampler_free(&s);
}

/* ---- weights that overflow the forward pass ------------------------------------------------ */

/* dim 8, hidden 8, L 2 (a 1-layer draft for kvlab spec), H 2, H_kv 1, vocab @p vocab, seq 32 */
static void tiny_model(kv_model *m, int vocab, uint64_t seed)
{
    kv_config c = {8, 8, 2, 2, 1, vocab, 32, 0, 0, 0, 0, 0, 0, {0}};
    kv_config_set_defaults(&c);
    kv_err err;
    if (kv_model_alloc(m, &c, &err)) {
        printf("model: %s\n", err.msg);
        exit(1);
    }
    kv_model_randomize(m, seed);
}

static void test_overflow(void)
{
    /* RMSNorm of a row whose squares overflow float: unit RMS, not zeros or NaN */
    const float x[4] = {1e30f, -1e30f, 1e30f, 3e29f}, w[4] = {1, 1, 1, 1};
    float out[4];
    kv_rmsnorm(out, x, w, 1, 4, 1e-5f);
    double ss = 0;
    for (int i = 0; i < 4; i++) ss += (double)out[i] * out[i];
    KV_CHECK(isfinite(ss) && fabs(ss / 4 - 1.0) < 1e-3 && out[1] < 0, "rmsnorm of 1e30s: rms^2 %g",
             ss / 4);
    /* weights of 1e30, finite, pass the checkpoint's checks: the logits are not, and
     * generation says so instead of choosing token 0 forever */
    kv_model m;
    tiny_model(&m, 32, 5);
    for (int64_t i = 0; i < m.n_floats; i++) m.data[i] = (i & 1) ? 1e30f : -1e30f;
    kv_backend *b = NULL;
    kv_err err = {{0}};
    kv_cache_spec spec = kv_cache_spec_default(1, 32);
    KV_CHECK(kv_backend_cpu(&b, &m, &spec, &err) == KV_OK, "backend: %s", err.msg);
    if (b) {
        const int prompt[2] = {1, 2};
        int out_tok[4];
        kv_gen_opts o = {KV_MODE_CACHED, 0, 4, NULL, NULL, NULL, NULL};
        const int rc = kv_generate(b, prompt, 2, &o, out_tok, NULL, &err);
        KV_CHECK(rc == KV_ERR_ARG && strstr(err.msg, "no finite logits"),
                 "greedy on 1e30 weights: %s '%s'", kv_status_name(rc), err.msg);
        kv_sampler smp;
        kv_sampler_init(&smp, 32, 1.0f, 0.9f, 3, NULL);
        o.sampler = &smp;
        err.msg[0] = 0;
        const int rc2 = kv_generate(b, prompt, 2, &o, out_tok, NULL, &err);
        KV_CHECK(rc2 == KV_ERR_ARG && strstr(err.msg, "no finite logits"),
                 "sampling on 1e30 weights: %s '%s'", kv_status_name(rc2), err.msg);
        kv_sampler_free(&smp);
        kv_backend_destroy(b);
    }
    kv_checkpoint_write(file("huge.bin"), &m, KV_FILE_KVLAB, &err);
    kv_model_free(&m);
    CLI_BAD("no finite logits", "generate", "--model", file("huge.bin"), "--steps", "3");
    CLI_BAD("no finite logits", "generate", "--model", file("huge.bin"), "--steps", "3",
            "--temperature", "1", "--top-p", "0.5");
    CLI_BAD("no finite logits", "spec", "--model", file("huge.bin"));
}

/* ---- readers: FIFOs, directories, caps, NUL, CR ---------------------------------------------- */

static void test_readers(void)
{
    char fifo[256], sub[256];
    snprintf(fifo, sizeof fifo, "%s", file("a.fifo"));
    snprintf(sub, sizeof sub, "%s", file("subdir"));
    KV_CHECK(mkfifo(fifo, 0600) == 0 && mkdir(sub, 0700) == 0, "mkfifo / mkdir");
    const char *paths[2] = {fifo, sub}, *want[2] = {"a FIFO|not a regular file", "Is a directory"};
    for (int k = 0; k < 2; k++) {
        /* each would block forever (FIFO) or read as nothing (directory) without the check */
        kv_err err = {{0}};
        kv_model m;
        KV_CHECK(kv_checkpoint_read(paths[k], &m, &err) == KV_ERR_IO && has_words(err.msg, want[k]),
                 "checkpoint on %s: '%s'", paths[k], err.msg);
        kv_tokenizer t;
        err.msg[0] = 0;
        KV_CHECK(kv_tokenizer_read(paths[k], 32, &t, &err) == KV_ERR_IO && has_words(err.msg, want[k]),
                 "tokenizer on %s: '%s'", paths[k], err.msg);
        kv_needle_spec ns;
        kv_needle_spec_default(&ns);
        err.msg[0] = 0;
        KV_CHECK(kv_needle_spec_read(paths[k], &ns, &err) == KV_ERR_IO && has_words(err.msg, want[k]),
                 "needle spec on %s: '%s'", paths[k], err.msg);
        kv_dialogue d;
        err.msg[0] = 0;
        KV_CHECK(kv_dialogue_read(paths[k], &d, &err) == KV_ERR_IO && has_words(err.msg, want[k]),
                 "dialogue on %s: '%s'", paths[k], err.msg);
        kv_trace tr;
        err.msg[0] = 0;
        KV_CHECK(kv_trace_load(paths[k], &tr, &err) == KV_ERR_IO && has_words(err.msg, want[k]),
                 "trace on %s: '%s'", paths[k], err.msg);
    }
    CLI_BAD("Is a directory", "needle", "--spec", sub, "--csv", "o.csv");
    CLI_BAD("Is a directory", "dialogue", sub);
    CLI_BAD("not a regular file", "serve", "--trace", fifo);
    CLI_BAD("not a regular file", "generate", "--model", fifo);

    /* a trace past its cap is refused from its size, before a byte is read (sparse file) */
    const char *big = file("big.csv");
    int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    KV_CHECK(fd >= 0 && ftruncate(fd, (off_t)KV_TRACE_MAX_BYTES + 1) == 0, "sparse trace");
    if (fd >= 0) close(fd);
    kv_trace tr;
    kv_err err = {{0}};
    KV_CHECK(kv_trace_load(big, &tr, &err) == KV_ERR_FORMAT && has_words(err.msg, "64 MiB cap"),
             "a 64 MiB + 1 trace: '%s'", err.msg);
    unlink(big);

    /* NUL bytes: refused by every text reader, with the line */
    static const struct {
        const char *name, *text;
        size_t n;
    } nul[] = {
        {"nul.needle", "name x\nlengths 64\0variant fp32\n", 31},
        {"nul.dlg", "k1=v2 f3\n\0k1?\n", 15},
        {"nul.csv", "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id\n0,4,4,1,1,-1\0\n", 78},
    };
    for (int k = 0; k < 3; k++) {
        write_bytes(file(nul[k].name), nul[k].text, nul[k].n);
        err.msg[0] = 0;
        kv_needle_spec ns;
        kv_needle_spec_default(&ns);
        kv_dialogue d;
        const int rc = k == 0 ? kv_needle_spec_read(file(nul[k].name), &ns, &err)
                     : k == 1 ? kv_dialogue_read(file(nul[k].name), &d, &err)
                              : kv_trace_load(file(nul[k].name), &tr, &err);
        KV_CHECK(rc == KV_ERR_FORMAT && has_words(err.msg, "NUL byte|line 2"), "%s: %s '%s'",
                 nul[k].name, kv_status_name(rc), err.msg);
    }
    /* CR-only line endings refused; CRLF accepted, the same as LF */
    kv_needle_spec ns;
        kv_needle_spec_default(&ns);
    KV_CHECK(kv_needle_spec_parse("name cr\rlengths 64\r", &ns, &err) == KV_ERR_FORMAT &&
                 has_words(err.msg, "bare CR|line 1"), "CR-only needle spec: '%s'", err.msg);
    kv_needle_spec_default(&ns);
    KV_CHECK(kv_needle_spec_parse("name crlf\r\nlengths 64\r\n", &ns, &err) == KV_OK &&
                 !strcmp(ns.name, "crlf") && ns.n_lengths == 1 && ns.lengths[0] == 64,
             "CRLF needle spec: '%s'", err.msg);
    kv_dialogue d;
    KV_CHECK(kv_dialogue_parse("k1=v2\rk1?\r", "cr", &d, &err) == KV_ERR_FORMAT &&
                 has_words(err.msg, "bare CR"), "CR-only dialogue: '%s'", err.msg);
    KV_CHECK(kv_dialogue_parse("k1=v2\r\nk1?\r\n", "crlf", &d, &err) == KV_OK && d.n_turns == 2,
             "CRLF dialogue: '%s'", err.msg);
    kv_dialogue_free(&d);
    const char *H = "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id";
    char text[512];
    snprintf(text, sizeof text, "%s\r0,4,4,1,1,-1\r", H);
    KV_CHECK(kv_trace_parse(text, &tr, &err) == KV_ERR_FORMAT && has_words(err.msg, "bare CR"),
             "CR-only trace: '%s'", err.msg);
    /* hex arrivals and #prefix lines after the header are refused */
    snprintf(text, sizeof text, "%s\n0x1p1,4,4,1,1,-1\n", H);
    KV_CHECK(kv_trace_parse(text, &tr, &err) == KV_ERR_FORMAT && has_words(err.msg, "0x1p1"),
             "hex arrival: '%s'", err.msg);
    snprintf(text, sizeof text, "%s\n0,4,4,1,1,-1\n#prefix,0,2\n1,4,4,1,1,0\n", H);
    KV_CHECK(kv_trace_parse(text, &tr, &err) == KV_ERR_FORMAT &&
                 has_words(err.msg, "line 3|before the header"), "#prefix after the header: '%s'",
             err.msg);
    unlink(fifo);
    rmdir(sub);
}

/* ---- writers: nothing removed or replaced that the run did not create ------------------------- */

static int is_fifo(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0 && S_ISFIFO(st.st_mode);
}

static int is_link(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0 && S_ISLNK(st.st_mode);
}

static void test_writers(void)
{
    /* a trace whose every request needs more blocks than the pool has */
    char trace[256];
    snprintf(trace, sizeof trace, "%s", file("fat.csv"));
    const char *T = "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id\n"
                    "0,100,4,1,1,-1\n0.5,100,4,1,1,-1\n";
    write_bytes(trace, T, strlen(T));
    char keep[256], tl[256];
    snprintf(keep, sizeof keep, "%s", file("keep.csv"));
    snprintf(tl, sizeof tl, "%s", file("keep_tl.csv"));
    write_bytes(keep, "precious\n", 9);
    write_bytes(tl, "also precious\n", 14);
    result r = run_in(dir, (const char *const[]){"serve", "--trace", trace, "--blocks", "2",
                                                 "--csv", keep, "--timeline", tl, NULL});
    KV_CHECK(r.rc == 1 && has_words(r.err, "every request failed|2 of 2"),
             "serve, every request failed: exit %d, stderr %s", r.rc, r.err);
    size_t n;
    unsigned char *a = slurp(keep, &n), *b = slurp(tl, &n);
    KV_CHECK(a && !strcmp((char *)a, "precious\n") && b && !strcmp((char *)b, "also precious\n"),
             "a failed serve left --csv / --timeline as they were");
    KV_CHECK(count_files(KV_FILE_TMP_PREFIX) == 0, "a failed serve left a temporary file");
    free(a);
    free(b);
    free(r.out);
    free(r.err);

    /* a FIFO as --csv, a symbolic link or a FIFO as convert --out: refused, left as they are */
    char fifo[256], link_to[256], link[256];
    snprintf(fifo, sizeof fifo, "%s", file("out.fifo"));
    snprintf(link_to, sizeof link_to, "%s", file("target.bin"));
    snprintf(link, sizeof link, "%s", file("link.bin"));
    write_bytes(link_to, "target\n", 7);
    KV_CHECK(mkfifo(fifo, 0600) == 0 && symlink(link_to, link) == 0, "mkfifo / symlink");
    CLI_BAD("out.fifo|a FIFO|not a regular file", "serve", "--trace", trace, "--csv", fifo);
    CLI_BAD("link.bin|a symbolic link", "convert", "--default", "tiny", "--kv-heads", "1",
            "--out", link);
    CLI_BAD("out.fifo|a FIFO", "convert", "--default", "tiny", "--kv-heads", "1", "--out", fifo);
    KV_CHECK(is_fifo(fifo) && is_link(link), "the FIFO and the link are still there");
    a = slurp(link_to, &n);
    KV_CHECK(a && !strcmp((char *)a, "target\n"), "the link's target is untouched");
    free(a);
    unlink(fifo);
    unlink(link);
}

/* ---- the CLI ---------------------------------------------------------------------------------- */

/* Run kvlab with stdout on @p out_path ("/dev/full"), or closed when NULL; the exit code and
 * stderr (in @p err_buf). */
static int run_stdout(const char *out_path, const char *const *args, char *err_buf, size_t n)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)kvlab;
    for (int i = 0; args[i] && argc < 15; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    char err_path[] = "/tmp/kvlab_bad2_err_XXXXXX";
    int fe = mkstemp(err_path);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fe, 2);
        if (out_path) {
            int fo = open(out_path, O_WRONLY);
            dup2(fo, 1);
        } else {
            close(1);
        }
        if (chdir(dir) != 0) _exit(126);
        execv(kvlab, argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t got;
    char *e = (char *)slurp(err_path, &got);
    snprintf(err_buf, n, "%s", e ? e : "");
    free(e);
    close(fe);
    unlink(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* OMP_NUM_THREADS past the CPUs, as the environment gives it: capped to the CPUs with a note,
 * never a crash inside libgomp, an absurd allocation or a negative count. libgomp holds the
 * value as an unsigned long; omp_get_max_threads() returns it cut to an int (2^31 negative,
 * 2^32 zero, 2^32 + 1 one), so kvlab must read the variable itself. */
static void test_omp_threads(void)
{
    cpu_set_t set;
    const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    const char *values[] = {"100000", "2147483648", "4294967296", "4294967297"};
    const char *const cmds[][8] = {
        {"info", NULL},
        {"generate", "--steps", "4", NULL},
        {"tp", "--default", "tiny", "--tokens", "8", NULL},
        {"eval", "ppl", "--limit", "64", NULL},
    };
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
            setenv("OMP_NUM_THREADS", values[i], 1);
            result r = run_in(dir, cmds[c]);
            unsetenv("OMP_NUM_THREADS");
            KV_CHECK(r.rc == 0 && strstr(r.err, "more than the"), "OMP_NUM_THREADS=%s kvlab %s: "
                     "exit %d (%s)", values[i], cmds[c][0], r.rc, r.err);
            const char *line = c == 0 ? strstr(r.out, "OpenMP ") : NULL;
            int n = 0;
            if (c == 0)
                KV_CHECK(line && sscanf(line + 7, "%d threads", &n) == 1 && n >= 1 && n <= cpus,
                         "OMP_NUM_THREADS=%s kvlab info: %d threads (%d CPUs)", values[i], n,
                         cpus);
            free(r.out);
            free(r.err);
        }
    /* the team that bench engine starts even on a busy machine */
    setenv("OMP_NUM_THREADS", "4294967296", 1);
    result r = run_in(dir, (const char *const[]){"bench", "engine", "--ignore-load", "--repeats",
                                                 "1", "--tokens", "8", "--dim", "64", "--layers",
                                                 "1", "--heads", "4", "--hidden", "64", "--vocab",
                                                 "64", "--seq-len", "16", NULL});
    unsetenv("OMP_NUM_THREADS");
    KV_CHECK(r.rc == 0 && strstr(r.err, "more than the"), "OMP_NUM_THREADS=4294967296 kvlab bench "
             "engine --ignore-load: exit %d (%.300s)", r.rc, r.err);
    free(r.out);
    free(r.err);
}

static void test_cli(void)
{
    /* a valid checkpoint with a one-token vocabulary under serve: no division by vocab - 1 */
    kv_model m;
    tiny_model(&m, 1, 9);
    kv_err err = {{0}};
    KV_CHECK(kv_checkpoint_write(file("v1.bin"), &m, KV_FILE_KVLAB, &err) == KV_OK, "%s", err.msg);
    kv_model_free(&m);
    char trace[256];
    snprintf(trace, sizeof trace, "%s", file("small.csv"));
    const char *T = "arrival_s,prompt_len,output_len,n_samples,beam_width,prefix_id\n"
                    "0,4,3,1,1,-1\n0.1,5,2,2,1,-1\n";
    write_bytes(trace, T, strlen(T));
    result r = run_in(dir, (const char *const[]){"serve", "--trace", trace, "--model",
                                                 file("v1.bin"), NULL});
    KV_CHECK(r.rc == 0, "serve on a vocab-1 model: exit %d (%s)", r.rc, r.err);
    free(r.out);
    free(r.err);

    /* OMP_NUM_THREADS far past the CPUs: capped (a note), not a crash inside libgomp */
    setenv("OMP_NUM_THREADS", "100000", 1);
    r = run_in(dir, (const char *const[]){"generate", "--steps", "4", NULL});
    unsetenv("OMP_NUM_THREADS");
    KV_CHECK(r.rc == 0 && strstr(r.err, "more than the"), "OMP_NUM_THREADS=100000: exit %d (%s)",
             r.rc, r.err);
    free(r.out);
    free(r.err);
    CLI_BAD("--threads|more than the", "generate", "--threads", "100000");
    CLI_BAD("--threads|out of range", "serve", "--trace", trace, "--threads", "0");
    CLI_BAD("--prompt-lines|needs --prompts", "serve", "--trace", trace, "--prompt-lines", "3");
    CLI_BAD("--prompts|no chat template", "serve", "--trace", trace, "--prompts", "x.chat");
    /* --weights / --prefill: dialogue and eval ppl parse them as generate does (cli.h) */
    CLI_BAD("--weights|need --device cuda", "dialogue", "x.dlg", "--weights", "fp16");
    CLI_BAD("--weights|'int8'", "dialogue", "x.dlg", "--weights", "int8");
    CLI_BAD("--prefill|needs --device cuda", "dialogue", "x.dlg", "--prefill", "mma");
    CLI_BAD("--weights|need --device cuda", "eval", "ppl", "--weights", "bf16");
    CLI_BAD("--prefill|'v5'", "eval", "ppl", "--prefill", "v5");
    CLI_BAD("--prefill|needs --device cuda", "eval", "ppl", "--prefill", "mma");
    r = run_in(dir, (const char *const[]){"generate", "--steps", "2", "--threads", "1", NULL});
    KV_CHECK(r.rc == 0, "generate --threads 1: exit %d (%s)", r.rc, r.err);
    free(r.out);
    free(r.err);

    /* results that cannot be written: exit 1 and a message, not 0 */
    char e[1024];
    int rc = run_stdout("/dev/full", (const char *const[]){"calc", NULL}, e, sizeof e);
    KV_CHECK(rc == 1 && strstr(e, "standard output"), "calc > /dev/full: exit %d (%s)", rc, e);
    rc = run_stdout(NULL, (const char *const[]){"calc", NULL}, e, sizeof e);
    KV_CHECK(rc == 1 && strstr(e, "standard output"), "calc >&-: exit %d (%s)", rc, e);
}

/* ---- options accepted too loosely ----------------------------------------------------------- */

static void test_loose_options(void)
{
    CLI_BAD("--block-size|needs --layout paged", "stream", "--block-size", "8", "--tokens", "4");
    /* cache strings: an empty layer list, an empty item, a signed window or budget */
    CLI_BAD("--cache|int8/l|layer list", "generate", "--cache", "int8/l");
    CLI_BAD("--cache|int8/l0,|ends in a comma", "generate", "--cache", "int8/l0,");
    CLI_BAD("--cache|int8/l0,,1|layer list", "generate", "--cache", "int8/l0,,1");
    CLI_BAD("--cache|int4/w+32|multiple of 32", "generate", "--cache", "int4/w+32");
    CLI_BAD("--cache|int8/|empty part", "generate", "--cache", "int8/");
    CLI_BAD("--cache|fp8-e4m3//head|empty part", "generate", "--cache", "fp8-e4m3//head");
    CLI_BAD("--cache|/int8|empty part", "generate", "--cache", "/int8");
    CLI_BAD("--cache|h2o/b32/|empty part", "generate", "--cache", "h2o/b32/");
    CLI_BAD("--cache|h2o/b+64|needs a count", "needle", "--cache", "h2o/b+64", "--csv", "o.csv");
    /* a newline in a list option would add spec lines of its own */
    CLI_BAD("--lengths|newline", "needle", "--lengths", "64\nvariant int4", "--csv", "o.csv");
    CLI_BAD("--cache|newline", "needle", "--cache", "fp16\nlengths 16", "--csv", "o.csv");
    kv_needle_spec ns;
    kv_needle_spec_default(&ns);
    kv_err err = {{0}};
    KV_CHECK(kv_needle_spec_parse("name two words\n", &ns, &err) == KV_ERR_FORMAT &&
                 has_words(err.msg, "name takes one word"), "two-word name: '%s'", err.msg);
    /* a --save-models prefix too long for its path is refused, not cut to another name */
    char prefix[1100];
    memset(prefix, 'p', sizeof prefix - 1);
    prefix[sizeof prefix - 1] = 0;
    CLI_BAD("--save-models|longer than", "needle", "--save-models", prefix, "--lengths", "64",
            "--depths", "50", "--csv", "o.csv");
    /* outputs that could never be replaced are refused before the grid runs */
    char fifo[256];
    snprintf(fifo, sizeof fifo, "%s", file("grid.fifo"));
    KV_CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
    CLI_BAD("--csv|a FIFO", "needle", "--csv", fifo, "--lengths", "64", "--depths", "50");
    KV_CHECK(is_fifo(fifo), "the FIFO is still there");
    unlink(fifo);
    /* calc at sub-byte element sizes: the steps print the fractions they add up */
    result r = run_in(dir, (const char *const[]){"calc", "--config", "8,8,3,4,1,32,3", "--dtype",
                                                 "int4", NULL});
    KV_CHECK(r.rc == 0 && strstr(r.out, "= 3 * 2.5 ") && strstr(r.out, "7.5 bytes = 7.5 B") &&
                 !strstr(r.out, "8 bytes = 7.5 B"), "calc int4 at d 2: %s", r.out);
    free(r.out);
    free(r.err);
}

/* Chapters 09 and 10: kvlab tp, kvlab needle's method variants and --chunk, chapter 09 spec
 * files, kvlab spec's window, KIVI and layout options. */
static void test_cli_ch09_10(void)
{
    /* kvlab tp: ranks must divide the embedded model's heads (small: H 6, tiny: H 4) */
    CLI_BAD("--ranks|'0'|out of range", "tp", "--ranks", "0");
    CLI_BAD("--ranks|'-2'|out of range", "tp", "--ranks", "-2");
    CLI_BAD("--ranks|'65'|out of range", "tp", "--ranks", "65");
    CLI_BAD("--ranks|not an integer", "tp", "--ranks", "2.5");
    CLI_BAD("--ranks|not an integer", "tp", "--ranks", "two");
    CLI_BAD("--ranks|missing value", "tp", "--ranks");
    CLI_BAD("--ranks|4 ranks do not divide the 6 query heads", "tp", "--ranks", "4");
    CLI_BAD("--ranks|64 ranks", "tp", "--ranks", "64");
    CLI_BAD("--ranks|3 ranks|tiny", "tp", "--default", "tiny", "--ranks", "3");
    CLI_BAD("--default|'nosuch'", "tp", "--default", "nosuch");
    CLI_BAD("--cache|unknown format 'nosuch'", "tp", "--cache", "nosuch");
    CLI_BAD("--cache|empty", "tp", "--cache", "");
    CLI_BAD("--cache|int4-kivi|head dim", "tp", "--cache", "int4-kivi"); /* was named "tp" */
    CLI_BAD("--tokens|out of range", "tp", "--tokens", "0");
    CLI_BAD("--tokens|out of range", "tp", "--tokens", "65537");
    CLI_BAD("--prompt|out of range", "tp", "--prompt", "0");
    CLI_BAD("--prompt|out of range", "tp", "--prompt", "99999999999");
    CLI_BAD("--repeats|out of range", "tp", "--repeats", "0");
    CLI_BAD("unknown option '--tp'", "tp", "--tp", "2");
    CLI_BAD("unexpected argument 'extra'", "tp", "extra");

    /* kvlab needle --cache METHOD/...: refused before the grid runs or writes --csv */
    struct { const char *variant, *want; } nv[] = {
        {"nosuch/b64", "'nosuch/b64' is not known"},
        {"h2o", "needs a budget"},
        {"h2o/b64/r0.5", "one budget"},
        {"h2o/r0", "ratio '0'"},
        {"h2o/r1.01", "ratio '1.01'"},
        {"h2o/r0x1p-1", "ratio '0x1p-1'"},
        {"h2o/b64/w-1", "'w-1'"},
        {"h2o/b64/sx", "'sx'"},
        {"topk/b64/d-3", "'d-3'"},
        {"l2-small/b16/s8/w16", "more than its budget"},
        {"h2o/b64/w16/d1", "query-aware"},
        {"snapkv/b64", "observation window"},
        {"int2-kivi/snapkv/b64", "'snapkv' is not known for int2-kivi"},
        {"h2o/b64x", "'b64x'"},
    };
    for (size_t i = 0; i < sizeof nv / sizeof nv[0]; i++) {
        char want[160];
        snprintf(want, sizeof want, "--cache|%s", nv[i].want);
        CLI_BAD(want, "needle", "--cache", nv[i].variant, "--lengths", "64", "--csv", "out.csv",
                "--svg", "out.svg");
    }
    CLI_BAD("--chunk|'0'|out of range", "needle", "--chunk", "0", "--csv", "out.csv");
    CLI_BAD("--chunk|'-64'|out of range", "needle", "--chunk", "-64", "--csv", "out.csv");
    CLI_BAD("--chunk|out of range", "needle", "--chunk", "16777217", "--csv", "out.csv");
    CLI_BAD("--chunk|out of range", "needle", "--chunk", "99999999999999999999");
    CLI_BAD("--chunk|not an integer", "needle", "--chunk", "64.5");
    CLI_BAD("--chunk|not an integer", "needle", "--chunk", "1e3");

    /* chapter 09 spec files: the message names the file and the line */
    struct { const char *name, *text, *want; } sf[] = {
        {"kept.needle", "name k\nchunk 64\nvariant h2o/b64/w16 kept:3\n", "line 3|'kept:3'"},
        {"atleast.needle", "variant snapkv/b64/w16 atleast:-1,16\n", "line 1|'atleast:-1,16'"},
        {"split.needle", "name s\nvariant fp32 page-split:0\n", "line 2|'page-split:0'"},
        {"from.needle", "variant h2o/r0.1/w16 from:\n", "line 1|'from:'"},
        {"chunk0.needle", "name c\n\nchunk 0\n", "line 3|bad chunk '0'"},
        {"chunk2.needle", "chunk 64 64\n", "line 1|chunk takes one number"},
        {"chunkneg.needle", "chunk -64\n", "line 1|bad chunk '-64'"},
    };
    for (size_t i = 0; i < sizeof sf / sizeof sf[0]; i++) {
        char path[256], want[160];
        snprintf(path, sizeof path, "%s", file(sf[i].name));
        write_bytes(path, sf[i].text, strlen(sf[i].text));
        snprintf(want, sizeof want, "--spec|%s|%s", sf[i].name, sf[i].want);
        CLI_BAD(want, "needle", "--spec", path, "--csv", "out.csv");
    }
    /* a method a spec file names but no cache knows: named by the file, not by --cache */
    char unk[256];
    snprintf(unk, sizeof unk, "%s", file("unknown-method.needle"));
    write_bytes(unk, "variant nosuch/b64 all\n", 23);
    CLI_BAD("unknown-method.needle|'nosuch/b64' is not known", "needle", "--spec", unk, "--csv", "out.csv");

    /* kvlab spec: window, sinks, scheme, KIVI window, layout and block size */
    CLI_BAD("--window|'-1'|out of range", "spec", "--window", "-1");
    CLI_BAD("--window|out of range", "spec", "--window", "16777217");
    CLI_BAD("--sinks|out of range", "spec", "--sinks", "-4", "--window", "16");
    CLI_BAD("--sinks|needs --window", "spec", "--sinks", "4");
    CLI_BAD("--scheme|unknown 'rope'", "spec", "--scheme", "rope", "--window", "16");
    CLI_BAD("--scheme|'cache' needs --window", "spec", "--scheme", "cache");
    CLI_BAD("--kivi-window|needs --cache int4-kivi", "spec", "--kivi-window", "64");
    CLI_BAD("--kivi-window|48|multiple of 32", "spec", "--cache", "int4-kivi", "--kivi-window", "48");
    CLI_BAD("--kivi-window|out of range", "spec", "--kivi-window", "-32");
    CLI_BAD("--turns|needs --script", "spec", "--turns", "3");
    CLI_BAD("--prompt|not both", "spec", "--script", "x.chat", "--prompt", "8");
    CLI_BAD("--script|no chat template", "spec", "--script", "x.chat");
    CLI_BAD("--cache|int4-kivi|head dim", "spec", "--cache", "int4-kivi");
    CLI_BAD("--cache|unknown format 'h2o/b64'", "spec", "--cache", "h2o/b64");
    CLI_BAD("--layout|'ring'", "spec", "--layout", "ring");
    CLI_BAD("--block-size|needs --layout paged", "spec", "--block-size", "16");
    CLI_BAD("--block-size|out of range", "spec", "--layout", "paged", "--block-size", "0");
    CLI_BAD("--block-size|multiple of 32", "spec", "--layout", "paged", "--cache", "int2-kivi",
            "--block-size", "16");
    CLI_BAD("--draft-layers|99|6 layers", "spec", "--draft-layers", "99");
    CLI_BAD("--max-k|out of range", "spec", "--max-k", "65");
    CLI_BAD("--model|not both", "spec", "--model", "x.bin", "--default", "small");

    /* the one model loader's refusals, and kvlab chat's: what a command cannot run, in words */
    CLI_BAD("--model|recall models|.chat scripts", "dialogue", "--model", "trained", "x.dlg");
    CLI_BAD("FILE|a script is required", "dialogue", "--model", "smollm2");
    CLI_BAD("--model|recall models|eval ppl", "needle", "--model", "trained");
    CLI_BAD("--model|a GGUF model is required", "chat");
    CLI_BAD("--model|no chat template|kvlab generate", "chat", "--model", "trained");
    setenv("KVLAB_MODELS", dir, 1); /* a models folder without the model, fetched or not */
    CLI_BAD("--model|not fetched|fetch-model.sh smollm2", "chat", "--model", "smollm2");
    unsetenv("KVLAB_MODELS");
    CLI_BAD("--model|takes the model's own shape", "bench", "engine", "--model", "trained",
            "--dim", "64");
    CLI_BAD("--max-tokens|out of range", "chat", "--model", "x.gguf", "--max-tokens", "0");

    /* kvlab tour: chapter 12 has no demo */
    CLI_BAD("--chapter|no demo for chapter 12", "tour", "--chapter", "12");
    CLI_BAD("--chapter|no demo for chapter 12", "tour", "--chapter", "12", "--csv", "-");
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    test_sampler();
    test_overflow();
    test_readers();
    test_writers();
    test_cli();
    test_omp_threads();
    test_loose_options();
    test_cli_ch09_10();
    cleanup();
    return kv_test_finish();
}
