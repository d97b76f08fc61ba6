/*
 * kvlab bench bandwidth: the machine's sustained read bandwidth and its last-level cache, the
 * denominator of every roofline ratio the other benchmarks print (kv_bench.h).
 */
#include <stdio.h>

#include <omp.h>

#include "cli.h"
#include "bench_cmds.h"

/* "LLC 32 MiB (L3, sysfs)" into buf. */
static const char *llc_words(char *buf, size_t n)
{
    int level = 0;
    const char *src = NULL;
    const int64_t llc = kv_llc_bytes(&level, &src);
    char b[32];
    if (llc > 0) snprintf(buf, n, "%s (L%d, from %s)", kv_fmt_bytes((double)llc, b, sizeof b), level, src);
    else snprintf(buf, n, "unknown");
    return buf;
}

int kv_bench_print_bandwidth(FILE *f, const kv_bandwidth *bw, const char *when)
{
    char llc[96], b[32];
    fprintf(f, "read bandwidth%s%s: %.2f GB/s (median of %d; slowest %.2f, fastest %.2f), "
            "%d OpenMP threads summing %s; last-level cache %s\n", when ? " " : "", when ? when : "",
            bw->bytes_per_s * 1e-9, bw->repeats, bw->min * 1e-9, bw->max * 1e-9, bw->threads,
            kv_fmt_bytes(bw->buffer_bytes, b, sizeof b), llc_words(llc, sizeof llc));
    return 0;
}

/* The best read bandwidth reachable: the fastest pass of all threads and of one thread alone
 * (on a busy machine one thread may read faster than two that wait for their turns). */
static double best_of(const kv_bandwidth *all, const kv_bandwidth *one)
{
    return all->max > one->max ? all->max : one->max;
}

int kv_bench_ceiling(double buffer_bytes, double *best, kv_err *err)
{
    kv_bandwidth all, one;
    size_t bytes = (size_t)buffer_bytes;
    if (bytes < ((size_t)8 << 20)) bytes = (size_t)8 << 20;
    int st = kv_read_bandwidth(&all, bytes, 7, err);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    if (!st) st = kv_read_bandwidth(&one, bytes, 7, err);
    omp_set_num_threads(threads);
    if (!st) *best = best_of(&all, &one);
    return st;
}

int cmd_bench_bandwidth(int argc, char **argv)
{
    const char *cmd = "kvlab bench bandwidth";
    int mib = 0, repeats = 7, csv = 0;
    kv_opt opts[] = {
        {"--mib", KV_OPT_INT, &mib, 1, 1 << 16, NULL, "M", "buffer size in MiB (default 8 x the LLC, 256 MiB to 1 GiB)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "timed passes after one warm-up (default 7)", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Sustained read bandwidth: every OpenMP thread sums (as 64-bit integers, the\n"
                          "widest loads the CPU has) its own part of a buffer far larger than the\n"
                          "last-level cache; the median and the fastest of R passes of buffer bytes /\n"
                          "wall time (GB = 1e9 bytes), with all threads and with one. Also the LLC size\n"
                          "(sysfs, else sysconf). `bench decode` divides by the median; `bench engine`\n"
                          "by the best reached, the fastest pass of either (a ceiling, not a typical).",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    kv_err err = {{0}};
    kv_bandwidth bw;
    int st = kv_read_bandwidth(&bw, (size_t)mib << 20, repeats, &err);
    if (st) return kv_cli_fail(cmd, "measure", st, &err);
    if (!csv) kv_bench_print_bandwidth(stdout, &bw, NULL);
    kv_bandwidth one;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1); /* one core alone: why matmuls split their rows over threads */
    st = kv_read_bandwidth(&one, (size_t)mib << 20, repeats, &err);
    omp_set_num_threads(threads);
    if (st) return kv_cli_fail(cmd, "measure", st, &err);
    if (csv) { /* one row per team: all threads, then one alone */
        int level = 0;
        const char *src = NULL;
        const long long llc = (long long)kv_llc_bytes(&level, &src);
        kv_csv_printf(stdout, "threads,buffer_bytes,repeats,median_gbps,slowest_gbps,fastest_gbps,"
                      "llc_bytes,llc_level\n");
        for (int k = 0; k < 2; k++) {
            const kv_bandwidth *x = k ? &one : &bw;
            kv_csv_printf(stdout, "%d,%.0f,%d,%.3f,%.3f,%.3f,%lld,%d\n", x->threads,
                          x->buffer_bytes, x->repeats, x->bytes_per_s * 1e-9, x->min * 1e-9,
                          x->max * 1e-9, llc, level);
        }
        return KV_EXIT_OK;
    }
    printf("one thread alone: %.2f GB/s (%.0f%% of all threads); fastest pass %.2f\n",
           one.bytes_per_s * 1e-9, 100.0 * one.bytes_per_s / bw.bytes_per_s, one.max * 1e-9);
    printf("best reached: %.2f GB/s (the fastest pass of either; the ceiling `bench engine` "
           "divides by)\n", best_of(&bw, &one) * 1e-9);
    return KV_EXIT_OK;
}
