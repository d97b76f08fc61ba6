/*
 * kvlab: the command-line front of the library. Each subcommand lives in its own file
 * (tour.c, generate.c, ...) and is one row of the table below; a new subcommand is one
 * new file and one new row.
 */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

typedef struct {
    const char *name;
    kv_cli_cmd run;
    const char *summary;
    int own_csv_file; /* 1: --csv FILE is written by the command beside its table (csv_out.c) */
} kv_subcommand;

static const kv_subcommand commands[] = {
    {"tour", cmd_tour, "run the chapter demos and print their measured tables"},
    {"generate", cmd_generate, "generate text or token ids from a model, naive or cached"},
    {"chat", cmd_chat, "a conversation with a GGUF model; the KV cache kept across turns"},
    {"calc", cmd_calc, "KV-cache memory for a preset or a config: L*2*N*H_kv*d*b"},
    {"info", cmd_info, "version, build, SIMD level, threads, CUDA mode and device"},
    {"bench", cmd_bench, "benchmarks: decode, attention-gqa, quant, bandwidth, engine, paged,\n"
                          "             attention, prefill, mla, swap (kvlab bench --help)"},
    {"needle", cmd_needle, "needle-in-a-haystack grid over the recall models: lengths x depths x cache", 1},
    {"passkey", cmd_passkey, "the pass-key test on a real model: a key hidden in a long text, asked for", 1},
    {"convert", cmd_convert, "MHA -> GQA/MQA: mean-pool K/V heads per group, write a new checkpoint"},
    {"dialogue", cmd_dialogue, "multi-turn dialogues: a .dlg file on the recall models, or chat scripts on a chat model (memory by distance)", 1},
    {"serve", cmd_serve, "replay a request trace: continuous batching on a paged cache, allocator metrics", 1},
    {"stream", cmd_stream, "an endless stream through a sliding-window cache: memory and tokens/s stay flat"},
    {"spec", cmd_spec, "speculative decoding: draft k tokens, verify in one step, roll back the rejected K/V"},
    {"tp", cmd_tp, "tensor-parallel heads: P ranks as threads, per-rank cache, all-reduces per layer"},
    {"eval", cmd_eval, "eval ppl: perplexity over a text under any cache; eval keys: key\n"
                        "             channels before/after RoPE; eval mass: attention mass by position"},
    {"tokenize", cmd_tokenize, "a GGUF file's tokenizer: text -> ids and pieces, or --decode ids -> bytes"},
    /* a new subcommand: its own file, and one row here */
};
static const int n_commands = (int)(sizeof commands / sizeof commands[0]);

static void usage(FILE *f)
{
    fprintf(f, "usage: kvlab <command> [options]   (kvlab <command> --help for its options)\n\n"
               "kvlab %s: how LLM inference manages its key/value cache, one chapter at a time.\n\n"
               "commands:\n", KV_VERSION_STRING);
    for (int i = 0; i < n_commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit codes: 0 success; 1 a run failed (a library or device error, or an output\n"
               "file that could not be written once the run was under way); 2 bad usage (bad\n"
               "arguments or input files, or an output path refused before any work)\n");
}

/* OMP_NUM_THREADS above the machine's CPUs buys nothing and, large enough (100000), crashes
 * inside libgomp when the first parallel region starts its team: cap it before any region
 * runs (a command's --threads can only ask for fewer, kv_cli_threads()). libgomp keeps the
 * variable as an unsigned long, and omp_get_max_threads() returns it cut to an int: 2^32 reads
 * as 0, 2^31 as negative, 2^32 + 1 as 1, while the team it would start is the full value. So
 * the variable's first number is read here; a count below 1 from omp_get_max_threads() is
 * capped like one above the CPUs. */
static void cap_threads(void)
{
    const int cpus = omp_get_num_procs(), now = omp_get_max_threads();
    unsigned long long asked = now > 0 ? (unsigned long long)now : 0;
    const char *p = getenv("OMP_NUM_THREADS");
    while (p && (*p == ' ' || *p == '\t')) p++;
    if (p && *p >= '0' && *p <= '9') { /* libgomp refuses 0, an overflow and a sign */
        errno = 0;
        const unsigned long long v = strtoull(p, NULL, 10);
        if (errno == 0 && v >= 1) asked = v;
    }
    if (now >= 1 && asked <= (unsigned long long)cpus) return;
    if (asked > (unsigned long long)cpus)
        fprintf(stderr, "kvlab: note: OMP_NUM_THREADS asks for %llu threads, more than the %d "
                "CPUs: using %d\n", asked, cpus, cpus);
    else
        fprintf(stderr, "kvlab: note: OpenMP reports %d threads: using the %d CPUs\n", now, cpus);
    omp_set_num_threads(cpus);
}

/* Descriptors 0-2 that are closed would be handed to the next file kvlab opens, so that its
 * tables land inside an output file: stdin and stderr are pointed at /dev/null, and a closed
 * stdout, where no result could ever arrive, is refused. Returns 0 when fine. */
static int check_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0) continue;
        if (fd == 1) {
            fprintf(stderr, "kvlab: standard output is closed: nowhere to write the results\n");
            return -1;
        }
        const int nul = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
        if (nul >= 0 && nul != fd) { /* the lowest free descriptor: fd itself, normally */
            dup2(nul, fd);
            close(nul);
        }
    }
    return 0;
}

/* Every result goes to stdout through stdio's buffer: a write that failed (a full disk,
 * /dev/full, a closed pipe's EPIPE) shows only at the flush, so check it and fail the run. */
static int finish_stdout(int rc)
{
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    fprintf(stderr, "kvlab: writing the results to standard output failed: %s\n",
            strerror(errno));
    return rc ? rc : KV_EXIT_FAIL;
}

int main(int argc, char **argv)
{
    if (check_std_fds()) return KV_EXIT_FAIL;
    cap_threads();
    if (argc < 2) {
        usage(stderr);
        return KV_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return finish_stdout(KV_EXIT_OK);
    }
    if (strcmp(name, "--version") == 0) {
        printf("kvlab %s\n", KV_VERSION_STRING);
        return finish_stdout(KV_EXIT_OK);
    }
    for (int i = 0; i < n_commands; i++)
        if (strcmp(name, commands[i].name) == 0) {
            /* --csv FILE or -: where the rows go, the same for every command (csv_out.c) */
            char cmd[64];
            snprintf(cmd, sizeof cmd, "kvlab %s", name);
            if (argc > 2 && strncmp(argv[2], "--", 2)) /* "kvlab bench decode" */
                snprintf(cmd, sizeof cmd, "kvlab %s %s", name, argv[2]);
            kv_cli_csv csv;
            const int e = kv_cli_csv_begin(cmd, argc - 1, argv + 1, commands[i].own_csv_file, &csv);
            if (e) return e;
            const int rc = finish_stdout(commands[i].run(argc - 1, argv + 1));
            return kv_cli_csv_end(cmd, argc - 1, argv + 1, &csv, rc);
        }
    fprintf(stderr, "kvlab: unknown command '%s'\n\n", name);
    usage(stderr);
    return KV_EXIT_USAGE;
}
