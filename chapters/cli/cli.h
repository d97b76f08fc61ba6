/**
 * @file cli.h
 * What the kvlab subcommands and the chapter demos share: the subcommand signature,
 * device selection, model loading, byte formatting and progress lines on stderr.
 */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdio.h>

#include "args.h"
#include "csv.h"
#include "kv_file.h"
#include "kv_backend.h"
#include "kv_gguf_model.h"
#include "kv_model.h"
#include "kv_mla.h"

/** A subcommand: argv[0] is its name; returns the process exit code (args.h). */
typedef int (*kv_cli_cmd)(int argc, char **argv);

int cmd_tour(int argc, char **argv);     /* tour.c */
int cmd_generate(int argc, char **argv); /* generate.c */
int cmd_calc(int argc, char **argv);     /* calc.c */
int cmd_info(int argc, char **argv);     /* info.c */
int cmd_bench(int argc, char **argv);    /* bench.c */
int cmd_needle(int argc, char **argv);   /* needle.c */
int cmd_dialogue(int argc, char **argv); /* dialogue.c */
int cmd_dialogue_chat(int argc, char **argv); /* dialogue_chat.c: --model a chat model */
int cmd_convert(int argc, char **argv);  /* convert.c */
int cmd_stream(int argc, char **argv);   /* stream.c */
int cmd_serve(int argc, char **argv);    /* serve.c */
int cmd_spec(int argc, char **argv);     /* spec.c */
int cmd_tp(int argc, char **argv);       /* tp.c */
int cmd_eval(int argc, char **argv);     /* eval.c */
int cmd_tokenize(int argc, char **argv); /* tokenize.c */
int cmd_chat(int argc, char **argv);     /* chat.c */
int cmd_passkey(int argc, char **argv);  /* passkey.c */

/* `--model trained` (trained.c): datasets/models/kjv.*, checked against its SHA256SUMS */
#define KV_CLI_PATH_MAX 4096
#define KV_TRAINED_NAME "kjv"
typedef struct {
    char model[KV_CLI_PATH_MAX + 64], tokenizer[KV_CLI_PATH_MAX + 64], heldout[KV_CLI_PATH_MAX + 64];
} kv_cli_trained_files;
/** Find the shipped model (under $KVLAB_DATASETS, else the source tree's datasets/) and check
 *  the checkpoint's and the tokenizer's SHA-256, and the held-out text's when @p heldout (it
 *  is read): KV_ERR_FORMAT names a corrupt file. */
int kv_cli_trained(kv_cli_trained_files *t, int heldout, kv_err *err);

/* Models fetched by tools/fetch-model.sh (model_gguf.c) */
/** The models folder: $KVLAB_MODELS, else $HOME/.cache/kvlab/models. */
int kv_cli_models_dir(char *dir, size_t n, kv_err *err);
/** `--model NAME`: a fetched model's name ("smollm2") becomes its file's path in the models
 *  folder, KV_ERR_IO "model 'smollm2' is not fetched: run tools/fetch-model.sh smollm2" when
 *  it is absent; any other name is copied unchanged (a path). */
int kv_cli_model_resolve(const char *name, char *path, size_t n, kv_err *err);
/** Open the GGUF file @p path and load its model with its matrices in @p storage
 *  (kv_weights_storage: kv_gguf_model_load_as()), progress on stderr after a second; *g (may
 *  be NULL: closed) keeps the file open for its tokenizer (kv_vocab.h). */
int kv_cli_gguf_load(const char *path, int storage, kv_model *m, kv_gguf **g, kv_err *err);
/** kvlab info --model: a GGUF file's header, metadata and tensor table on stdout (info_gguf.c);
 *  returns the exit code. */
int kv_cli_info_gguf(const char *cmd, const char *model);

/** Exit code for a library status: bad input (ARG, IO, FORMAT, UNSUPPORTED) 2, else 1. */
int kv_cli_exit_code(int status);
/** Print "cmd: what: message" on stderr and return kv_cli_exit_code(status). */
int kv_cli_fail(const char *cmd, const char *what, int status, const kv_err *err);

/** One output file of a command: the option that names it and its path (NULL: not given). */
typedef struct {
    const char *opt;  /**< "--csv" */
    const char *path;
} kv_cli_output;
#define KV_CLI_MAX_OUTPUTS 8

/**
 * The outputs of a command, checked before any work (outputs.c): each can be replaced
 * (kv_file_check_target()) in a folder that exists and takes new files, and no two name the
 * same file (the same device and inode when it exists, the same path with its folder resolved
 * otherwise). Returns 0, or the exit code (2) after a message naming the option(s) and path.
 */
int kv_cli_outputs_check(const char *cmd, const kv_cli_output *outs, int n);
/** --csv and --json around one command run (csv_out.c): where its rows go. */
typedef struct {
    kv_file_out out;  /**< --csv FILE's temporary file */
    kv_file_out json; /**< --json FILE's temporary file */
    FILE *capture;    /**< with --json: the rows as printed, then written to both */
    int saved_fd;     /**< the real standard output while redirected, else -1 */
    int to_file;      /**< --csv FILE given */
    int to_stdout;    /**< --csv - given beside --json */
} kv_cli_csv;
/**
 * Before a command runs (main.c), its words @p argv (the command's name first): for a command
 * whose --csv is a KV_OPT_CSV (@p own_file 0), --csv FILE points standard output at FILE's
 * temporary file, and --json FILE (the benches) at a capture that becomes the JSON's rows and,
 * with --csv, the CSV; for one that writes its own CSV file (@p own_file 1), --csv - sends
 * standard output to standard error and keeps the real one for kv_cli_csv_stdout(). Nothing
 * otherwise (--help among the words, neither option). Returns 0, or the exit code after a
 * message ("cmd: --csv: ...").
 */
int kv_cli_csv_begin(const char *cmd, int argc, char **argv, int own_file, kv_cli_csv *c);
/** After the run, its exit code @p rc: standard output restored; the files renamed into place
 * when @p rc is 0, else removed (an old FILE stays as it was). Returns @p rc, or 1 when a write
 * failed. */
int kv_cli_csv_end(const char *cmd, int argc, char **argv, kv_cli_csv *c, int rc);
/** During a run with --csv - of a command that writes its own CSV: the real standard output,
 * where the rows go; NULL otherwise (the command then writes its --csv FILE). */
FILE *kv_cli_csv_stdout(void);
/** --json: the build, the machine (CPU model, threads, device, read bandwidth measured now),
 * the command @p cmd and its words, and @p rows (its --csv tables, @p n bytes) as one JSON
 * object on @p f (json_out.c). KV_ERR_FORMAT when the rows do not parse as CSV tables. */
int kv_cli_json_write(FILE *f, const char *cmd, int argc, char **argv, const char *rows,
                      size_t n, kv_err *err);
/** The --csv and --json entries of a bench's option table: both set @p v (the bench prints
 * its rows; main.c sends them where the options say). */
#define KV_CLI_CSV_OPTS(v)                                                                    \
    {"--csv", KV_OPT_CSV, &(v), 0, 0, NULL, "FILE", "the rows as CSV, to FILE in place of the table (- : standard output)", 0}, \
    {"--json", KV_OPT_CSV, &(v), 0, 0, NULL, "FILE", "the build, the machine, the options and the rows as JSON, to FILE in place of the table", 0}

/** A write that failed once the run was under way (a full disk, a refused rename): "cmd: opt:
 * message" on stderr; returns 1, a run failure, for every command alike. */
int kv_cli_write_fail(const char *cmd, const char *opt, const kv_err *err);

/**
 * --threads N, for the commands that run a model: KV_CLI_THREADS_OPT(n) in the option table,
 * then kv_cli_threads(cmd, n) once parsed. More threads than the machine has CPUs is refused
 * (a message, returns 2); otherwise the OpenMP team is set to N (0, not given: unchanged).
 */
#define KV_CLI_THREADS_OPT(n)                                                                   \
    {"--threads", KV_OPT_INT, &(n), 1, 1 << 20, NULL, "N", "OpenMP threads for the model (default: OMP_NUM_THREADS, or every CPU; at most the CPUs)", 0}
int kv_cli_threads(const char *cmd, int n);

/** --temperature T, --top-p P, --seed S (double, double, int64_t; defaults 0, 1, 42 set by the
 * command): the sampler of the commands that generate text (generate, chat; kv_sampler.h). */
#define KV_CLI_SAMPLER_OPTS(t, p, s)                                                            \
    {"--temperature", KV_OPT_FLOAT, &(t), 0, 100, NULL, "T", "0 = greedy (default 0)", 0},     \
    {"--top-p", KV_OPT_FLOAT, &(p), 1e-6, 1, NULL, "P", "nucleus sampling cut (default 1 = off)", 0}, \
    {"--seed", KV_OPT_I64, &(s), 0, 9.0e15, NULL, "S", "sampler seed (default 42)", 0}

/** Devices a --device option accepts; NULL-terminated. */
extern const char *const kv_cli_devices[];

/**
 * Check that @p device ("cpu" or "cuda") can be used by this build and machine.
 * Prints why not and returns 2 (built without CUDA) or 1 (no usable device); 0 when fine.
 */
int kv_cli_check_device(const char *cmd, const char *device);

/** A backend on @p device over @p model with @p spec (kv_backend_cpu or kvcu_backend_create). */
int kv_cli_backend(kv_backend **out, const char *device, const kv_model *model,
                   const kv_cache_spec *spec, kv_err *err);

/**
 * --weights / --prefill (chapter 08): the tensor-core choices of a CUDA engine (kvcu.h's
 * kvcu_engine_opts), for the commands that run a model (generate, serve, dialogue, eval
 * ppl): put KV_CLI_ENGINE_OPTS(en) in the option table (both fields NULL before parsing),
 * check them with kv_cli_engine_check() once the device is known, and build the backend with
 * kv_cli_backend_engine(). Defaults on --device cuda: fp32 weights (the reference's
 * arithmetic) and the prefill on tensor cores (v6 where it fits the layer, else v5; held to
 * the reference by a bound; a speculative verification chunk still takes the per-row kernels,
 * kvcu_state_set_prefill()).
 */
typedef struct {
    const char *weights; /**< cuda: "fp32", "bf16", "fp16"; cpu: "f32" ("fp32"), "native",
                          *   "q8_0", "f16" (a GGUF model's storage); NULL: not given (fp32) */
    const char *prefill; /**< "mma", "simt"; NULL: not given (mma on cuda) */
} kv_cli_engine;

/** Choices of --weights and --prefill; NULL-terminated. */
extern const char *const kv_cli_weights[];
extern const char *const kv_cli_prefills[];

#define KV_CLI_WEIGHTS_OPT(en)                                                                  \
    {"--weights", KV_OPT_CHOICE, &(en).weights, 0, 0, kv_cli_weights, "W", "the projections' weights. On the cpu, for a GGUF model: f32 (default; every weight dequantized), native (the file's blocks as stored, int8 activations and integer dots, as llama.cpp), q8_0 (rows re-quantized) or f16. With --device cuda: fp32 (default; the reference's arithmetic) or a 16-bit copy, bf16 or fp16: prompt rows on tensor cores, one-token rows by a 16-byte-load GEMV (logits move by the rounding; chapter 08)", 0}

#define KV_CLI_ENGINE_OPTS(en)                                                                  \
    KV_CLI_WEIGHTS_OPT(en),                                                                    \
    {"--prefill", KV_OPT_CHOICE, &(en).prefill, 0, 0, kv_cli_prefills, "P", "with --device cuda: attention of a prompt's rows: mma (default; chapter 08's v6 on tensor cores, v5 where v6 does not fit, within a stated bound of the reference) or simt (the per-row kernels: each row equals a one-token step bit for bit)", 0}

/** A --weights value the device cannot use (bf16 / fp16 on the CPU, native / q8_0 / f16 on
 * cuda) or --prefill mma on the CPU: says so and returns 2; 0 when fine. */
int kv_cli_engine_check(const char *cmd, const char *device, const kv_cli_engine *en);

/** The storage --weights asks of a model's matrices on @p device (kv_weights_storage):
 * KV_WEIGHTS_F32 but on the CPU (where it names native, q8_0 or f16). */
int kv_cli_engine_storage(const char *device, const kv_cli_engine *en);

/** kv_cli_backend() with the engine @p en chooses (its NULL fields: the defaults above). */
int kv_cli_backend_engine(kv_backend **out, const char *device, const kv_model *model,
                          const kv_cache_spec *spec, const kv_cli_engine *en, kv_err *err);

/**
 * --layout / --block-size / --blocks (chapter 05), shared by generate, needle and dialogue:
 * put the three entries KV_CLI_LAYOUT_OPTS(lo) in a command's option table, check them once
 * with kv_cli_layout_check(), and pass every cache spec the command builds through
 * kv_cli_layout_apply().
 */
typedef struct {
    const char *layout; /**< "contiguous" (default) or "paged" */
    int block_size;     /**< B; 0 = 16 (32 for int4/int2, whose key groups span 32 tokens) */
    int n_blocks;       /**< N; 0 = enough for every slot at full capacity */
} kv_cli_layout;

/** Layouts a --layout option accepts; NULL-terminated. */
extern const char *const kv_cli_layouts[];

#define KV_CLI_LAYOUT_OPTS(lo)                                                                  \
    {"--layout", KV_OPT_CHOICE, &(lo).layout, 0, 0, kv_cli_layouts, "L", "cache layout: contiguous (default) or paged: blocks from a pool, found by block tables (chapter 05)", 0}, \
    {"--block-size", KV_OPT_INT, &(lo).block_size, 1, 4096, NULL, "B", "paged: tokens per block (default 16; int4/int2 need a multiple of 32, default 32)", 0}, \
    {"--blocks", KV_OPT_INT, &(lo).n_blocks, 1, 1 << 24, NULL, "N", "paged: blocks in the pool (default: enough for every sequence at full length)", 0}

/** --block-size and --blocks mean nothing without --layout paged: says so and returns 2 (the
 * exit code); 0 when the options agree. */
int kv_cli_layout_check(const char *cmd, const kv_cli_layout *lo);

/** Make @p spec paged when --layout paged was given (block size and pool size from @p lo, or
 * their defaults for the spec's slots, capacity and dtype); otherwise leave it as it is. */
void kv_cli_layout_apply(const kv_cli_layout *lo, kv_cache_spec *spec);

/** "contiguous" or "paged, blocks of B tokens, N blocks" for @p spec, for headers. */
const char *kv_cli_layout_name(const kv_cache_spec *spec, char *buf, size_t n);

/**
 * Chapter 06's stream (kvlab stream, and the tour's shorter run): decode @p tokens greedily on
 * @p m through a cache built from the windowed spec @p win, reporting every @p every tokens
 * (KV bytes held, resident memory growth, tokens/s), then a full cache over @p full_tokens
 * (0: none) beside it. Table or CSV to @p f.
 */
int kv_stream_study(FILE *f, int csv, const kv_model *m, const kv_cache_spec *win, long tokens,
                    long full_tokens, long every, kv_err *err);

/** Names of the embedded default models ("tiny", ...); NULL-terminated. */
extern const char *const kv_cli_defaults[];
/** Build an embedded default model by name (kv_config_default_by_name + randomize). */
int kv_cli_default_model(kv_model *m, const char *name, kv_err *err);

/**
 * The KV-cache bill of every preset (kvlab calc without a model): bytes per token and at a few
 * lengths (or at @p seq when > 0), for dtype @p dt ("fp16", ...) and @p batch sequences.
 */
void kv_calc_table(FILE *f, const char *dt, int64_t seq, int64_t batch);

/**
 * MHA / GQA / MQA side by side for every preset (kvlab calc --compare-heads): per-token cache
 * bytes with H_kv = H, H/8 and 1 beside the preset's own H_kv, and the cache at @p seq tokens
 * (32768 when <= 0) for @p batch sequences, dtype @p dt.
 */
void kv_calc_heads_table(FILE *f, const char *dt, int64_t seq, int64_t batch);

/** Chapter 11 (calc_mla.c): MLA's latent cache beside MHA / GQA / MQA for DeepSeek's presets
 * and, with d_c = 4d and d_R = d/2, for the presets above; the DeepSeek-V2 paper's 93.3 %. */
void kv_calc_mla_heads_table(FILE *f, const char *dt, int64_t seq, int64_t batch);
/** The MLA presets' dims (kvlab calc --list). */
void kv_calc_mla_list(FILE *f);
/** One MLA preset's bill, step by step (kvlab calc --preset deepseek-v2). */
void kv_calc_mla_explain(const kv_mla_preset *p, const char *dt, int64_t n, int64_t batch);

/**
 * Decode attention per group size (kvlab bench attention-gqa, chapter 03's demo): one token of
 * @p H heads over @p N positions, G = 1, 2, 4, 8, H; median of @p repeats calls on @p device
 * ("cpu"; "cuda" times kernel v1 and v2). Prints a table (or CSV) to @p f.
 */
int kv_attn_gqa_table(FILE *f, const char *device, int H, int d, int N, int repeats, int csv,
                      kv_err *err);

/** "16 KiB", "1 GiB", "1.5 MiB", "512 B": binary units, at most 4 significant digits. */
const char *kv_fmt_bytes(double bytes, char *buf, size_t n);

/**
 * Progress on stderr for long runs: nothing during the first second, then one line
 * rewritten in place at most ten times a second, and a newline at the end.
 */
typedef struct {
    const char *label;
    double t0, last;
    int shown;
} kv_progress;

void kv_progress_start(kv_progress *p, const char *label);
void kv_progress_update(kv_progress *p, long done, long total);
void kv_progress_end(kv_progress *p);

/* ---- chapter demos (chapters/NN-name/demo.c), run by `kvlab tour` ------------------- */

/** What a demo is given: where to print, in which form, on which device. */
typedef struct {
    FILE *out;          /**< tables go here (stdout) */
    int csv;            /**< 1: comma-separated rows instead of aligned tables */
    const char *device; /**< "cpu" or "cuda" (already checked) */
    int quick;          /**< 1 (tour --quick): the same code paths at smaller sizes, fewer
                         *   repeats (what the emulation build and memcheck run) */
} kv_demo_ctx;

/**
 * A backend on the demo's device (kv_cli_backend()), or on the CPU when that device refuses
 * the spec (KV_ERR_UNSUPPORTED: the CUDA cache and a paged or other layout it lacks): the
 * demo then says so once and runs that part on the cpu. *dev names where it runs, so the
 * reference runs beside it use the same device.
 */
int kv_demo_backend(const kv_demo_ctx *ctx, const kv_model *model, const kv_cache_spec *spec,
                    kv_backend **out, const char **dev, kv_err *err);

/** A chapter demo: returns a kv_status and fills @p err. */
typedef int (*kv_demo_fn)(const kv_demo_ctx *ctx, kv_err *err);

int kv_demo_ch01(const kv_demo_ctx *ctx, kv_err *err); /* 01-naive-recompute/demo.c */
int kv_demo_ch02(const kv_demo_ctx *ctx, kv_err *err); /* 02-kv-cache/demo.c */
int kv_demo_ch03(const kv_demo_ctx *ctx, kv_err *err); /* 03-mqa-gqa/demo.c */
int kv_demo_ch04(const kv_demo_ctx *ctx, kv_err *err); /* 04-quantization/demo.c */
int kv_demo_ch05(const kv_demo_ctx *ctx, kv_err *err); /* 05-paged/demo.c */
int kv_demo_ch06(const kv_demo_ctx *ctx, kv_err *err); /* 06-sliding-window/demo.c */
int kv_demo_ch07(const kv_demo_ctx *ctx, kv_err *err); /* 07-swap/demo.c */
int kv_demo_ch08(const kv_demo_ctx *ctx, kv_err *err); /* 08-flash/demo.c */
int kv_demo_ch09(const kv_demo_ctx *ctx, kv_err *err); /* 09-eviction/demo.c */
int kv_demo_ch10(const kv_demo_ctx *ctx, kv_err *err); /* 10-spec-tp/demo.c */
int kv_demo_ch11(const kv_demo_ctx *ctx, kv_err *err); /* 11-mla/demo.c */

/**
 * KV-cache formats side by side (chapter 04's demo, kvlab bench quant): per format bytes per
 * token, K/V and attention error, KL and top-1 over a generation, needles (when @p needles),
 * and the median decode-attention time over @p N tokens (@p repeats calls) on @p device;
 * on @p model, named @p model_name, when not NULL (kvlab bench quant --model: borrowed;
 * --outlier-channels changes its Wk), else a random d = 64 model.
 * @p quick (tour --quick): a shorter generation and needle context, the same rows.
 * @p outliers (exercise 1, --outlier-channels): the last @p outliers key channels of every KV
 * head made 20 times larger (their Wk rows scaled) before anything runs; 0 = the model as is.
 */
int kv_quant_study(FILE *f, const char *device, int csv, int N, int repeats, int needles,
                   int quick, int outliers, kv_model *model, const char *model_name,
                   kv_err *err);
/** kvlab bench quant (bench_quant.c). */
int kv_bench_quant(int argc, char **argv);

#endif
