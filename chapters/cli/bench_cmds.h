/**
 * @file bench_cmds.h
 * The roofline benchmarks beside bench.c's table: `bench bandwidth` (bench_bandwidth.c) and
 * `bench engine` (bench_engine.c).
 */
#ifndef KV_CLI_BENCH_CMDS_H
#define KV_CLI_BENCH_CMDS_H

#include <stdio.h>

#include "kv_bench.h"
#include "kv_swap.h"
#include "measure.h"

int cmd_bench_bandwidth(int argc, char **argv);
int cmd_bench_engine(int argc, char **argv);
/** `bench paged` (bench_paged.c): decode attention over contiguous vs paged caches (chapter 05). */
int cmd_bench_paged(int argc, char **argv);
/** `bench attention` (bench_attention.c): naive vs tiled vs split-KV attention (chapter 08). */
int cmd_bench_attention(int argc, char **argv);

/** The device benches (bench_cuda.c, CUDA builds): `bench attention --device cuda` (every decode
 * kernel: B sequences of N tokens, per layout and format, against the same run's device
 * bandwidth) and `bench engine --device cuda` (whole-model decoding on the GPU). */
int cmd_bench_attention_cuda(int argc, char **argv);
int cmd_bench_engine_cuda(int argc, char **argv);
/** `bench prefill --device cuda` (bench_prefill.c, chapter 08): v5 and the 16-bit GEMM in TFLOP/s
 * against the same run's mma throughput, and a prompt's time to first token. */
int cmd_bench_prefill(int argc, char **argv);
/** `bench mla --device cuda` (bench_mla.c, chapter 11): the absorbed MLA decode in TFLOP/s and
 * GB/s against the same run's mma throughput and read bandwidth. */
int cmd_bench_mla(int argc, char **argv);
/** The one-layer config the attention benches time (bench_attention.c): H heads, H_kv KV
 * heads, head dim d, n positions, vocabulary 2, the defaults for the rest. */
void kv_bench_layer_config(kv_config *g, int H, int Hkv, int d, int n);

/** The value of --device in argv ("--device X" or "--device=X"), "cpu" when absent: lets a
 * bench hand a device run to its own parser before parsing its own options. */
const char *kv_cli_device_arg(int argc, char **argv);
/** 1 when @p flag is one of argv's words. */
int kv_cli_has_flag(int argc, char **argv, const char *flag);

/** `bench swap` (bench_swap.c): swap vs recompute by sequence length (chapter 07). */
int cmd_bench_swap(int argc, char **argv);

#define KV_SWAP_DEFAULT_TFLOPS 300.0 /**< modelled accelerator's sustained prefill, TFLOP/s */

/** The shape, cache format, link and accelerator of a swap-vs-recompute table. */
typedef struct {
    const char *name;     /**< embedded model ("tiny") or preset ("llama-2-7b") */
    int embedded;         /**< 1: an embedded model, whose prefills are measured on the CPU */
    kv_config cfg;
    kv_cache_spec spec;   /**< paged, the format and B; for FLOPs and bytes per element */
    int block_size;
    size_t block_bytes;   /**< kv_cache_block_bytes() of this shape: what kv_swap moves a block */
    kv_link link;
    double gpu_flops;     /**< modelled accelerator, FLOP/s */
} kv_swap_bench;

/** One sequence length of the table. */
typedef struct {
    int n;
    int64_t blocks, bytes; /**< moved each way */
    int64_t moved;         /**< bytes kv_swap really moved out (measured rows) */
    double swap_s;         /**< modelled link time, out + in */
    double flops;          /**< prefill of n tokens */
    double cpu_s;          /**< measured median prefill on the CPU; < 0: not measured */
    double gpu_s;          /**< flops / gpu_flops */
} kv_swap_row;

/** Set up @p sb for @p model (embedded or preset), @p dtype (NULL: fp32 embedded, fp16 preset),
 * blocks of @p block_size, a link of @p link_gbps GB/s and @p link_us us, an accelerator of
 * @p gpu_tflops. KV_ERR_ARG for an unknown model or dtype, KV_ERR_UNSUPPORTED for fp8/KIVI. */
int kv_swap_bench_init(kv_swap_bench *sb, const char *model, const char *dtype, int block_size,
                       double link_gbps, double link_us, double gpu_tflops, kv_err *err);

/** The table at lengths @p lens [n_lens] (ascending) and the crossovers, to @p f (CSV rows when
 * @p csv). Embedded models: prefills up to @p measure_max tokens measured, median of
 * @p repeats, each also swapped out and in through kv_swap (its bytes checked). */
int kv_swap_bench_run(FILE *f, int csv, const kv_swap_bench *sb, const int *lens, int n_lens,
                      int measure_max, int repeats, kv_err *err);

/** One line: the bandwidth, its spread, threads, buffer and the LLC; @p when may be NULL. */
int kv_bench_print_bandwidth(FILE *f, const kv_bandwidth *bw, const char *when);
/** Bytes a decoded token reads of @p m's weights as it holds them: its matrices
 * (kv_model_matrix_bytes()), one embedding row and the norms (bench_engine_ctx.c). */
double kv_bench_model_weight_bytes(const kv_model *m);
/**
 * kvlab bench engine --model FILE --context N: @p repeats times, a prefill of @p context tokens
 * into an empty cache of format @p cache (timed), then @p steps greedy one-token steps
 * (timed); prints the medians' tokens/s, the bytes per decoded token (weights + KV) and the
 * read bandwidth ceiling measured before and after in the same run (bench_engine_ctx.c).
 */
int kv_bench_engine_context(const kv_model *m, const char *name, const char *cache, int context,
                            int steps, int repeats, kv_err *err);

/** The best read bandwidth reachable over a buffer of @p buffer_bytes (at least 8 MiB): the
 * fastest of 7 passes, all threads or one (bench bandwidth.c); bytes/s into *best. */
int kv_bench_ceiling(double buffer_bytes, double *best, kv_err *err);

/**
 * Print the growth exponents of bench decode's curves (bench_fit.c): log-log slopes of
 * per-step projection FLOPs, attention FLOPs and time against the context length n, for
 * @p runs [0] naive and [1] cached, after a prompt of @p n_prompt tokens.
 */
void kv_print_growth_exponents(FILE *f, const kv_run_log runs[2], int n_prompt);

#endif
