/*
 * Fuzz target: the kvlab command line (chapters/cli/args.c and the one subcommand with a
 * parser of its own, `kvlab calc --config D,F,L,H,K,V,S`).
 *
 * Input layout: 1 byte mode, then the argument words separated by NUL bytes (at most 32).
 *   mode even: kv_args_parse() against a table with every option type. A result of OK must
 *              leave every value inside its declared range or choice list; BAD and HELP are
 *              fine. kv_parse_i64 / kv_parse_double are also run on every word: what they
 *              accept must be a whole number inside the range.
 *   mode odd:  cmd_calc() itself, which must return 0 or 2 (never crash or return anything else).
 * Output of the parser (help, messages) is not checked here; tests/test_cli.c checks it.
 */
#include "fuzz_common.h"
#include "args.h"
#include "cli.h"

#include <math.h>

#define MAX_WORDS 32

static const char *const colours[] = {"red", "green", "blue", NULL};

static void check_numbers(const char *w)
{
    int64_t i = 0;
    double d = 0.0;
    const char *why = NULL;
    if (kv_parse_i64(w, -1000, 1000, &i, &why) == 0) {
        FUZZ_REQUIRE(i >= -1000 && i <= 1000, "kv_parse_i64 accepted %lld outside -1000..1000", (long long)i);
        char *end;
        FUZZ_REQUIRE(strtoll(w, &end, 10) == i && *end == '\0', "kv_parse_i64 accepted '%s'", w);
    } else {
        FUZZ_REQUIRE(why != NULL, "kv_parse_i64 refused '%s' without a reason", w);
    }
    why = NULL;
    if (kv_parse_double(w, -1.5, 1e6, &d, &why) == 0)
        FUZZ_REQUIRE(isfinite(d) && d >= -1.5 && d <= 1e6 && !strpbrk(w, "xX"),
                     "kv_parse_double accepted '%s' (%g)", w, d); /* no hex floats: "0x10" */
    else
        FUZZ_REQUIRE(why != NULL, "kv_parse_double refused '%s' without a reason", w);
}

static void parse_table(int argc, char **argv)
{
    int flag = 0, n = 7;
    int64_t big = 5;
    double x = 0.5;
    const char *s = NULL, *c = "red";
    kv_opt opts[] = {
        {"--flag", KV_OPT_FLAG, &flag, 0, 0, NULL, NULL, "a flag", 0},
        {"--n", KV_OPT_INT, &n, 1, 4096, NULL, "N", "an int", 0},
        {"--big", KV_OPT_I64, &big, 0, 9.0e15, NULL, "B", "an int64", 0},
        {"--x", KV_OPT_FLOAT, &x, -2.0, 2.0, NULL, "X", "a number", 0},
        {"--s", KV_OPT_STRING, &s, 0, 0, NULL, "S", "a string", 0},
        {"--c", KV_OPT_CHOICE, &c, 0, 0, colours, "C", "a choice", 0},
    };
    kv_args_result r = kv_args_parse("fuzz", "about", argc, argv, opts, 6);
    FUZZ_REQUIRE(r == KV_ARGS_OK || r == KV_ARGS_HELP || r == KV_ARGS_BAD, "result %d", (int)r);
    if (r != KV_ARGS_OK) return;
    FUZZ_REQUIRE(flag == 0 || flag == 1, "flag %d", flag);
    FUZZ_REQUIRE(n >= 1 && n <= 4096, "--n %d outside 1..4096", n);
    FUZZ_REQUIRE(big >= 0 && big <= (int64_t)9.0e15, "--big %lld", (long long)big);
    FUZZ_REQUIRE(isfinite(x) && x >= -2.0 && x <= 2.0, "--x %g outside -2..2", x);
    FUZZ_REQUIRE(s == NULL || s[0] != '\0', "--s accepted an empty value");
    int known = 0;
    for (int i = 0; colours[i]; i++) known |= c == colours[i];
    FUZZ_REQUIRE(known, "--c is not one of the choices");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int mode = data[0] & 1;
    char *text = malloc(size + 1); /* the words, each NUL-terminated */
    FUZZ_REQUIRE(text != NULL, "out of memory");
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *argv[MAX_WORDS + 2];
    int argc = 0;
    argv[argc++] = "calc";
    for (size_t i = 0; i < size - 1 && argc <= MAX_WORDS;) {
        argv[argc++] = text + i;
        i += strlen(text + i) + 1;
    }
    argv[argc] = NULL;

    if (mode == 0) {
        for (int i = 1; i < argc; i++) check_numbers(argv[i]);
        parse_table(argc - 1, argv + 1);
    } else {
        int rc = cmd_calc(argc, argv);
        FUZZ_REQUIRE(rc == KV_EXIT_OK || rc == KV_EXIT_USAGE, "kvlab calc returned %d", rc);
    }
    free(text);
    return 0;
}
