/*
 * Bad input, options that were silently ignored or half read:
 *
 *  - the shared list parsers (args.h): kv_args_int_list() refuses an empty item ("1,,2", ",0",
 *    "1,"), a stray word, a value out of range and one item too many, naming the limit;
 *    kv_args_word_list() refuses empty items, a word given twice and too many words;
 *  - eval ppl: --caches with --cache or --recompute, --segments without --csv,
 *    --kivi-bits / --kivi-window without --kivi-keys, --scheme without --recent, and a
 *    --chunk that KIVI's emulation would replace by 32;
 *  - needle's --models / --lengths / --depths / --seeds through those parsers;
 *  - bench attention --device cuda's --dtypes and --layouts (in a CUDA build): empty items,
 *    duplicates (two names of one format too), more than 8 formats;
 *  - eval ppl --limit bounds the work: 16 MiB of text and --limit 300 encode a prefix, not the
 *    whole text (its memory stays near the text's own size; it held 60 times that), with the
 *    perplexity of the same 300 tokens read from a file that holds only the start;
 *  - every bench refuses before it measures: a format the head dim cannot hold (bench paged,
 *    bench attention), a config that a later run of bench engine --config all would refuse,
 *    with nothing on stdout (the headers come after the bandwidth runs) and at once.
 *
 * usage: test_bad_input_options <path to kvlab> <datasets folder>
 */
#define _GNU_SOURCE
#include "args.h"
#include "kv_common.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h"

#include <sys/resource.h>

/* ---- --limit ------------------------------------------------------------------------------ */

/* stdout of @p r after its first line's file name: the perplexity and what it was over */
static const char *after_name(const char *out)
{
    const char *p = out ? strstr(out, " of ") : NULL;
    p = p ? strchr(p + 4, ':') : NULL;
    return p ? p : "(no result)";
}

/* Run first, while no other child has run: RUSAGE_CHILDREN's peak is this run's. */
static void test_limit(const char *datasets)
{
    char heldout[PATH_MAX], big[PATH_MAX];
    snprintf(heldout, sizeof heldout, "%s/models/kjv-heldout.txt", datasets);
    snprintf(big, sizeof big, "%s/big.txt", dir);
    size_t n = 0;
    unsigned char *text = slurp(heldout, &n);
    KV_CHECK(text && n > 1000, "cannot read %s", heldout);
    if (!text || n <= 1000) return;
    FILE *f = fopen(big, "wb");
    size_t total = 0;
    for (; f && total < ((size_t)16 << 20); total += n) fwrite(text, 1, n, f);
    KV_CHECK(f && fclose(f) == 0, "cannot write %s", big);
    free(text);
    result r = run_in(dir, (const char *const[]){"eval", "ppl", "--text", big, "--limit", "300",
                                                 NULL});
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    const double peak_mib = ru.ru_maxrss / 1024.0, text_mib = total / 1048576.0;
    result ref = run_in(dir, (const char *const[]){"eval", "ppl", "--text", heldout, "--limit",
                                                   "300", NULL});
    KV_CHECK(r.rc == 0 && ref.rc == 0, "eval ppl --limit 300: exit %d (16 MiB) and %d (held-out "
             "text); stderr %s", r.rc, ref.rc, r.err);
    KV_CHECK(!strcmp(after_name(r.out), after_name(ref.out)), "--limit 300 of a text that starts "
             "with the held-out text: '%s', the held-out text alone: '%s'", r.out, ref.out);
    /* the text itself, the tiny model and the run: well under twice the text (the whole text
     * encoded held about 60 times it). Under AddressSanitizer (the debug-asan preset builds
     * kvlab with it too) the allocator's red zones, quarantine and shadow add tens of MiB
     * (49 MiB measured there), still a tenth of what encoding the whole text takes. */
#if defined(__SANITIZE_ADDRESS__)
    const double slack_mib = 96;
#else
    const double slack_mib = 32;
#endif
    KV_CHECK(peak_mib < text_mib + slack_mib, "eval ppl --limit 300 on %.0f MiB of text peaked "
             "at %.0f MiB: it encoded more than the limit needs", text_mib, peak_mib);
    printf("eval ppl --limit 300 on %.0f MiB of text: peak %.1f MiB\n", text_mib, peak_mib);
    free(r.out);
    free(r.err);
    free(ref.out);
    free(ref.err);
    unlink(big);
}

/* ---- the parsers -------------------------------------------------------------------------- */

/* kv_args_int_list on @p s: its return and count, stderr swallowed */
static int int_list(const char *s, int *out, int max, int *n, int lo, int hi)
{
    fflush(stderr);
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    const int rc = kv_args_int_list("test", "--x", s, out, max, n, lo, hi);
    fclose(stderr);
    stderr = saved;
    return rc;
}

static int word_list(const char *s, char (*w)[KV_ARGS_WORD], int max, int *n)
{
    fflush(stderr);
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    const int rc = kv_args_word_list("test", "--x", s, w, max, n);
    fclose(stderr);
    stderr = saved;
    return rc;
}

static void test_parsers(void)
{
    int v[4], n = -1;
    KV_CHECK(int_list("0,50,100", v, 4, &n, 0, 100) == 0 && n == 3 && v[0] == 0 && v[2] == 100,
             "0,50,100 in 0..100: n %d", n);
    static const char *const bad[] = {"1,,2", ",0", "1,", ",", "", "1, 2", "5abc", "101", "-1",
                                      "1,2,3,4,5"};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++)
        KV_CHECK(int_list(bad[i], v, 4, &n, 0, 100) == KV_EXIT_USAGE,
                 "int list '%s' (0..100, at most 4) accepted", bad[i]);
    KV_CHECK(int_list("0", v, 4, &n, 1, 100) == KV_EXIT_USAGE, "0 accepted in 1..100");

    char w[3][KV_ARGS_WORD];
    KV_CHECK(word_list("fp16,int8", w, 3, &n) == 0 && n == 2 && !strcmp(w[1], "int8"),
             "fp16,int8: n %d", n);
    static const char *const bad_words[] = {"int8,", ",int8", "a,,b", "", "paged,paged",
                                            "a,b,c,d",
                                            "a-word-of-forty-characters-is-too-long-x"};
    for (int i = 0; i < (int)(sizeof bad_words / sizeof bad_words[0]); i++)
        KV_CHECK(word_list(bad_words[i], w, 3, &n) == KV_EXIT_USAGE,
                 "word list '%s' (at most 3) accepted", bad_words[i]);
}

/* ---- the commands ------------------------------------------------------------------------- */

static void test_eval(void)
{
    CLI_BAD("--kivi-bits|needs --kivi-keys", "eval", "ppl", "--kivi-bits", "4");
    CLI_BAD("--kivi-window|needs --kivi-keys", "eval", "ppl", "--kivi-window", "64");
    CLI_BAD("--scheme|needs --recent", "eval", "ppl", "--scheme", "cache");
    CLI_BAD("--chunk|--kivi-keys|32", "eval", "ppl", "--kivi-keys", "channel", "--chunk", "64");
    CLI_BAD("--caches|cached mode", "eval", "ppl", "--caches", "ch04", "--cache", "int8");
    CLI_BAD("--caches|cached mode", "eval", "ppl", "--caches", "fp32 int8", "--recompute");
    CLI_BAD("--segments|needs --csv", "eval", "ppl", "--segments");
}

static void test_needle(void)
{
#define NEEDLE(...) "needle", "--models", "direct", __VA_ARGS__
    CLI_BAD("--depths|empty item", NEEDLE("--lengths", "64", "--depths", "1,,2"));
    CLI_BAD("--depths|empty item", NEEDLE("--lengths", "64", "--depths", ",0"));
    CLI_BAD("--lengths|empty item", NEEDLE("--lengths", "64,"));
    CLI_BAD("--seeds|empty item", NEEDLE("--lengths", "64", "--seeds", "1,"));
    CLI_BAD("--depths|'101'|0..100", NEEDLE("--lengths", "64", "--depths", "0,101"));
    CLI_BAD("--seeds|more than 8", NEEDLE("--lengths", "64", "--seeds", "1,2,3,4,5,6,7,8,9"));
    CLI_BAD("--lengths|'8'|16..", NEEDLE("--lengths", "8"));
#undef NEEDLE
    CLI_BAD("--models|given twice", "needle", "--models", "direct,direct", "--lengths", "64");
    CLI_BAD("--models|empty item", "needle", "--models", "direct,", "--lengths", "64");
}

static void test_bench_cuda(void)
{
    result info = run_in(dir, (const char *const[]){"info", NULL});
    const int cuda = info.out && !strstr(info.out, "built without CUDA");
    free(info.out);
    free(info.err);
    if (!cuda) { /* the options exist only in a CUDA build: refused as unknown here */
        CLI_BAD("--dtypes", "bench", "attention", "--device", "cuda", "--dtypes", "int8,");
        printf("(built without CUDA: bench attention --device cuda's lists not reached)\n");
        return;
    }
#define BENCH(...) "bench", "attention", "--device", "cuda", __VA_ARGS__
    CLI_BAD("--dtypes|empty item", BENCH("--dtypes", "int8,"));
    CLI_BAD("--dtypes|given twice", BENCH("--dtypes", "int8,int8"));
    CLI_BAD("--dtypes|one format", BENCH("--dtypes", "fp8,fp8-e4m3"));
    CLI_BAD("--dtypes|more than 8", BENCH("--dtypes", "fp32,fp16,bf16,int8,int8-g32,int8-g64,"
                                                      "int8-g128,fp8-e4m3,fp8-e5m2"));
    CLI_BAD("--layouts|given twice", BENCH("--layouts", "paged,paged"));
    CLI_BAD("--layouts|empty item", BENCH("--layouts", ",paged"));
#undef BENCH
}

/* ---- refusals before measurements ------------------------------------------------------- */

static void test_bench_first(void)
{
    const double t0 = kv_now();
    CLI_BAD("--dtype|int4-kivi|head dim (8)", "bench", "paged", "--dtype", "int4-kivi",
            "--head-dim", "8", "--lengths", "64");
    const double t_paged = kv_now() - t0; /* its bandwidth runs took 9-31 s before the refusal */
    KV_CHECK(t_paged < 5.0, "bench paged refused after %.1f s: after measuring", t_paged);
    CLI_BAD("--dtype|int8-g32|head dim (16)", "bench", "attention", "--dtype", "int8-g32",
            "--head-dim", "16", "--decode", "64", "--prefill", "none");
    CLI_BAD("--dtype|int8-g32|head dim (16)", "bench", "attention", "--dtype", "int8-g32",
            "--head-dim", "16", "--decode", "none", "--prefill", "64");
    CLI_BAD("small|int8-g32|head dim (48)", "bench", "engine", "--cache", "int8-g32",
            "--config", "small");
    /* small and long take 9 heads (d 32), large's dim 768 does not: refused before small runs */
    CLI_BAD("large|n_heads (9)", "bench", "engine", "--heads", "9", "--config", "all");
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s <kvlab> <datasets folder>\n", argv[0]);
        return 2;
    }
    static char datasets[PATH_MAX]; /* absolute: kvlab runs in the scratch folder */
    test_limit(realpath(argv[2], datasets) ? datasets : argv[2]);
    test_parsers();
    test_eval();
    test_needle();
    test_bench_cuda();
    test_bench_first();
    cleanup();
    return kv_test_finish();
}
