/**
 * @file args.h
 * Command-line options for every kvlab subcommand, parsed one way.
 *
 * A subcommand describes its options in a table of ::kv_opt and calls kv_args_parse() once.
 * The parser accepts `--name value` and `--name=value`, parses numbers completely (no "12abc",
 * no overflow, no NaN), checks ranges and choices, rejects unknown options, missing values and
 * stray words, and prints `--help` from the same table, so the help can never disagree with
 * what is accepted. Every message names the command and the option it is about.
 *
 * Every command takes `--threads N` (cli.h): a table without it gets it added by the parser,
 * which then sets the OpenMP team itself (kv_cli_threads(): at most the machine's CPUs).
 */
#ifndef KV_CLI_ARGS_H
#define KV_CLI_ARGS_H

#include <stdint.h>

/** Exit codes of kvlab (the libraries return kv_status; only the CLI picks an exit code). */
enum {
    KV_EXIT_OK = 0,
    KV_EXIT_FAIL = 1,  /**< a library or device error while running */
    KV_EXIT_USAGE = 2  /**< bad arguments or bad input files */
};

/** What an option's value is, and so what @c dest points to. */
typedef enum {
    KV_OPT_FLAG,   /**< no value; dest: int, set to 1 */
    KV_OPT_INT,    /**< dest: int, within [min, max] */
    KV_OPT_I64,    /**< dest: int64_t, within [min, max] */
    KV_OPT_FLOAT,  /**< dest: double, finite, within [min, max] */
    KV_OPT_STRING, /**< dest: const char * (points into argv), not empty */
    KV_OPT_TEXT,   /**< dest: const char * (points into argv), may be empty ("--prompt ''") */
    KV_OPT_CHOICE, /**< dest: const char *, one of @c choices */
    KV_OPT_CSV     /**< --csv FILE of a command that prints its rows: dest: int, set to 1; the
                        value (FILE, or - for standard output) is where main.c sends standard
                        output for the run (cli.h: kv_cli_csv_begin) */
} kv_opt_type;

typedef struct {
    const char *name;     /**< "--steps" */
    kv_opt_type type;
    void *dest;
    double min, max;      /**< inclusive range for INT, I64, FLOAT */
    const char *const *choices; /**< NULL-terminated list for CHOICE */
    const char *meta;     /**< value placeholder in the help: "N", "FILE" */
    const char *help;     /**< one line */
    int seen;             /**< set by the parser: the option was given */
} kv_opt;

/** Result of kv_args_parse(). */
typedef enum {
    KV_ARGS_OK = 0,   /**< parsed; run the command */
    KV_ARGS_HELP = 1, /**< --help was given and printed; exit 0 */
    KV_ARGS_BAD = 2   /**< a message was printed on stderr; exit 2 */
} kv_args_result;

/**
 * Parse argv[0..argc-1] (the words after the subcommand name) against @p opts.
 * @p cmd ("kvlab calc") prefixes every message; @p about is printed under the usage line
 * of --help (may hold several lines).
 */
kv_args_result kv_args_parse(const char *cmd, const char *about, int argc, char **argv,
                             kv_opt *opts, int n_opts);

/** 1 when the option @p name of the parsed table @p opts was given, else 0. */
int kv_args_given(const kv_opt *opts, int n_opts, const char *name);

/** Print the help of a table (what --help prints) to stdout. */
void kv_args_help(const char *cmd, const char *about, const kv_opt *opts, int n_opts);

/** Parse a whole decimal integer within [min, max]; 0 on success, -1 with a reason in @p why. */
int kv_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out, const char **why);
/** Parse a whole finite number within [min, max]; 0 on success, -1 with a reason in @p why. */
int kv_parse_double(const char *s, double min, double max, double *out, const char **why);

/** Comma-separated whole numbers in [@p lo, @p hi], at most @p max of them, into out (*n of
 * them): 0, or KV_EXIT_USAGE after a message naming @p opt and the item (each through
 * kv_parse_i64: no spaces, no "5abc", no empty item as in "5,,6", ",5" or "5,"). */
int kv_args_int_list(const char *cmd, const char *opt, const char *s, int *out, int max, int *n,
                     int64_t lo, int64_t hi);

/** The longest word of a kv_args_word_list(), its NUL included. */
#define KV_ARGS_WORD 32
/** Comma-separated words, at most @p max of them, into words (*n of them): 0, or KV_EXIT_USAGE
 * after a message naming @p opt: an empty item ("a,,b", "a,"), a word given twice, more than
 * @p max words (the limit named), a word of KV_ARGS_WORD characters or more. */
int kv_args_word_list(const char *cmd, const char *opt, const char *s,
                      char (*words)[KV_ARGS_WORD], int max, int *n);

/**
 * Split argv [1, argc) of a command that takes positional words (files): the first @p max_pos
 * words that neither start with '-' nor are an option's value (by @p opts) into pos (*n_pos),
 * everything else, in order, into rest [cap] (*n_rest) for kv_args_parse(), which then refuses
 * whatever is left over in words. 0, or KV_EXIT_USAGE after a message when rest is too small.
 */
int kv_args_positional(const char *cmd, int argc, char **argv, const kv_opt *opts, int n_opts,
                       const char **pos, int max_pos, int *n_pos, char **rest, int cap,
                       int *n_rest);

/** Report a bad value of @p opt ("kvlab calc: --config: ...") on stderr; returns KV_EXIT_USAGE. */
int kv_args_bad(const char *cmd, const char *opt, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
