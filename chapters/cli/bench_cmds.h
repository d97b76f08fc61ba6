/**
 * @file bench_cmds.h
 * The roofline benchmarks beside bench.c's table: `bench bandwidth` (bench_bandwidth.c) and
 * `bench engine` (bench_engine.c).
 */
#ifndef KV_CLI_BENCH_CMDS_H
#define KV_CLI_BENCH_CMDS_H

#include <stdio.h>

#include "kv_bench.h"
#include "measure.h"

int cmd_bench_bandwidth(int argc, char **argv);
int cmd_bench_engine(int argc, char **argv);
/** `bench paged` (bench_paged.c): decode attention over contiguous vs paged caches (chapter 05). */
int cmd_bench_paged(int argc, char **argv);

/** One line: the bandwidth, its spread, threads, buffer and the LLC; @p when may be NULL. */
int kv_bench_print_bandwidth(FILE *f, const kv_bandwidth *bw, const char *when);

/**
 * Print the growth exponents of bench decode's curves (bench_fit.c): log-log slopes of
 * per-step projection FLOPs, attention FLOPs and time against the context length n, for
 * @p runs [0] naive and [1] cached, after a prompt of @p n_prompt tokens.
 */
void kv_print_growth_exponents(FILE *f, const kv_run_log runs[2], int n_prompt);

#endif
