/*
 * kvlab bench quant (chapter 04): every KV-cache format against the fp32 cache on one run,
 * kv_quant_study() with a longer cache and more repeats than the tour's demo.
 *
 * Decode attention time is one layer, one query token, H = 8 query heads over N cached
 * tokens (H_kv = 4, d = 64). Bytes it reads = 2 · H_kv · N · d · b (b with metadata); the
 * ratio to fp32 measured in the same run is the column to compare.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model_load.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

int kv_bench_quant(int argc, char **argv)
{
    const char *cmd = "kvlab bench quant";
    const char *device = "cpu", *model = NULL;
    int N = 16384, repeats = 9, csv = 0, no_needles = 0, outliers = 0, quick = 0;
    kv_opt opts[] = {
        {"--seq", KV_OPT_INT, &N, 2, 1 << 20, NULL, "N", "cached positions for the attention time (default 16384)", 0},
        {"--repeats", KV_OPT_INT, &repeats, 1, 64, NULL, "R", "timed attention calls per format, after one warm-up (default 9)", 0},
        {"--device", KV_OPT_CHOICE, &device, 0, 0, kv_cli_devices, "D", "where caches and attention run (default cpu)", 0},
        {"--no-needles", KV_OPT_FLAG, &no_needles, 0, 0, NULL, NULL, "skip the recall-model needles", 0},
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "FILE", "a model to study instead of the random one: a llama2.c / kvlab checkpoint, `trained`, a GGUF file or smollm2", 0},
        {"--outlier-channels", KV_OPT_INT, &outliers, 0, 512, NULL, "C", "multiply the Wk rows of the last C key channels of every KV head by 20: outlier key channels (chapter 04, exercise 1; default 0)", 0},
        {"--quick", KV_OPT_FLAG, &quick, 0, 0, NULL, NULL, "tour --quick's sizes: a 32-token prompt, 8 teacher-forced steps, a 96-token needle context", 0},
        KV_CLI_CSV_OPTS(csv),
    };
    int r = kv_args_parse(cmd,
                          "Every cache format (fp32, fp16, bf16, int8, int8-g32, fp8 per tensor and per\n"
                          "head, int4 and int2 KIVI, selective layers) against fp32: bytes per token with\n"
                          "metadata, K/V and attention-output error, logit KL and top-1 agreement over a\n"
                          "teacher-forced generation, recall-model needles, and the median decode-attention\n"
                          "time over N cached tokens (chapters/04-quantization/README.md).",
                          argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    int e = kv_cli_check_device(cmd, device);
    if (e) return e;
    kv_err err = {{0}};
    kv_cli_model mdl = {0};
    const kv_cli_model_args ma = {model, NULL, NULL, NULL, KV_CLI_TEXT_NONE, 0};
    if (model && (e = kv_cli_model_load(cmd, &ma, &mdl))) return e;
    int st = kv_quant_study(stdout, device, csv, N, repeats, !no_needles, quick, outliers,
                            model ? &mdl.m : NULL, mdl.name, &err);
    kv_cli_model_close(&mdl);
    if (st) return kv_cli_fail(cmd, "run", st, &err);
#ifdef KV_HAVE_CUDA
    if (strcmp(device, "cpu") && kvcu_is_emulation() && !csv)
        printf("\nemulation build: these times are of CPU fibers running the kernels, not of a GPU.\n");
#endif
    return KV_EXIT_OK;
}
