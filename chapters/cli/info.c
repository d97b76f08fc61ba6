/* kvlab info: how this binary was built and what it runs on. */
#include <stdio.h>

#include <omp.h>

#include "cli.h"
#include "kv_ops_fast.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

#ifndef KV_BUILD_TYPE
#define KV_BUILD_TYPE "unknown"
#endif
#ifndef KV_COMPILER
#define KV_COMPILER "unknown"
#endif
#ifndef KV_CUDA_MODE
#define KV_CUDA_MODE "none"
#endif

/* The widest vector instructions the compiler was allowed to use (its predefined macros),
 * not what the CPU could do: a default build targets the baseline of the architecture. */
static const char *simd_level(void)
{
#if defined(__AVX512F__)
    return "AVX-512";
#elif defined(__AVX2__)
    return "AVX2";
#elif defined(__ARM_NEON) || defined(__ARM_NEON__)
    return "NEON";
#elif defined(__SSE2__)
    return "none (the x86-64 baseline, SSE2); the matmul and attention twins pick AVX2 at run time";
#else
    return "none";
#endif
}

int cmd_info(int argc, char **argv)
{
    const char *model = NULL;
    kv_opt opts[] = {
        {"--model", KV_OPT_STRING, &model, 0, 0, NULL, "FILE", "a GGUF file (or smollm2, fetched by tools/fetch-model.sh): print its metadata and tensor table instead", 0},
    };
    int r = kv_args_parse("kvlab info",
                          "Print the version, build type, compiler, SIMD level, OpenMP threads,\n"
                          "CUDA mode (none, cuda, emulation) and, with CUDA, the device.\n"
                          "With --model FILE.gguf: the file's header, metadata (long arrays as\n"
                          "type, count and first items), the config kvlab loads from it, and its\n"
                          "tensors (name, type, shape from the row length up, bytes, offset).",
                          argc - 1, argv + 1, opts, 1);
    if (r == KV_ARGS_HELP) return KV_EXIT_OK;
    if (r != KV_ARGS_OK) return KV_EXIT_USAGE;
    if (model) return kv_cli_info_gguf("kvlab info", model);

    printf("kvlab        %s\n", KV_VERSION_STRING);
    printf("build type   %s\n", KV_BUILD_TYPE);
    printf("compiler     %s\n", KV_COMPILER);
    printf("SIMD level   %s\n", simd_level());
    printf("matmul       %s (kv_matmul_fast: chosen at run time from what this CPU has)\n",
           kv_matmul_fast_isa());
    printf("OpenMP       %d threads (omp_get_max_threads; set OMP_NUM_THREADS to change)\n",
           omp_get_max_threads());
    printf("CUDA mode    %s\n", KV_CUDA_MODE);
#ifdef KV_HAVE_CUDA
    char buf[256];
    kv_err err = {{0}};
    if (kvcu_device_describe(buf, sizeof buf, &err) == KV_OK) printf("device       %s\n", buf);
    else /* CUDA's own words ("driver version is insufficient") mean "no GPU" to most readers */
        printf("device       no usable GPU (CUDA says: %s).\n"
               "             Everything but --device cuda works: the CPU engine and every chapter;\n"
               "             the emulation build (cmake --preset emulation) runs the GPU tests on the CPU.\n",
               err.msg);
#else
    printf("device       none (built without CUDA)\n");
#endif
    return KV_EXIT_OK;
}
