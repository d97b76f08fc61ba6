/* Device selection and model loading shared by tour, generate and bench (cli.h). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "kv_config.h"
#include "kv_gguf_model.h"
#include "kv_linear.h"
#ifdef KV_HAVE_CUDA
#include "kvcu.h"
#endif

const char *const kv_cli_devices[] = {"cpu", "cuda", NULL};
const char *const kv_cli_defaults[] = {"tiny", "tiny-gqa", "small", NULL};

int kv_cli_check_device(const char *cmd, const char *device)
{
    if (strcmp(device, "cpu") == 0) return KV_EXIT_OK;
#ifdef KV_HAVE_CUDA
    kv_err err = {{0}};
    if (kvcu_device_available(&err) != KV_OK) {
        /* the message already says "no usable CUDA device: <CUDA's reason>" */
        fprintf(stderr, "%s: --device cuda: %s\n", cmd, err.msg);
        return KV_EXIT_FAIL;
    }
    return KV_EXIT_OK;
#else
    fprintf(stderr,
            "%s: --device cuda: this kvlab was built without CUDA (CUDA mode: none).\n"
            "Rebuild with nvcc on the PATH, or with -DKV_CUDA_EMULATION=ON to run the CUDA\n"
            "kernels on the CPU; `kvlab info` shows how this binary was built.\n", cmd);
    return KV_EXIT_USAGE;
#endif
}

int kv_cli_backend(kv_backend **out, const char *device, const kv_model *model,
                   const kv_cache_spec *spec, kv_err *err)
{
    if (strcmp(device, "cpu") == 0) return kv_backend_cpu(out, model, spec, err);
#ifdef KV_HAVE_CUDA
    if (strcmp(device, "cuda") == 0) {
        const int st = kv_model_need_fp32(model, "the CUDA engine", err);
        return st ? st : kvcu_backend_create(out, model, spec, err);
    }
#endif
    return kv_fail(err, KV_ERR_UNSUPPORTED, "device '%s' is not available in this build", device);
}

const char *const kv_cli_weights[] = {"fp32", "bf16", "fp16", "f32", "native", "q8_0", "f16",
                                      NULL};
const char *const kv_cli_prefills[] = {"mma", "simt", NULL};

int kv_cli_engine_check(const char *cmd, const char *device, const kv_cli_engine *en)
{
    const int cpu_kind = en->weights && kv_weights_storage_parse(en->weights) >= 0;
    if (strcmp(device, "cpu") != 0) {
        if (cpu_kind && kv_weights_storage_parse(en->weights) != KV_WEIGHTS_F32)
            return kv_args_bad(cmd, "--weights", "%s keeps a GGUF model's matrices for the CPU "
                               "engine; with --device %s: fp32, bf16 or fp16", en->weights,
                               device);
        return KV_EXIT_OK;
    }
    if (en->weights && !cpu_kind)
        return kv_args_bad(cmd, "--weights", "%s weights need --device cuda (on the cpu: f32, "
                           "native, q8_0 or f16)", en->weights);
    if (en->prefill && strcmp(en->prefill, "simt") != 0)
        return kv_args_bad(cmd, "--prefill", "%s needs --device cuda (the CPU engine is the "
                           "reference)", en->prefill);
    return KV_EXIT_OK;
}

int kv_cli_engine_storage(const char *device, const kv_cli_engine *en)
{
    const int s = en->weights ? kv_weights_storage_parse(en->weights) : -1;
    return strcmp(device, "cpu") == 0 && s >= 0 ? s : KV_WEIGHTS_F32;
}

int kv_cli_backend_engine(kv_backend **out, const char *device, const kv_model *model,
                          const kv_cache_spec *spec, const kv_cli_engine *en, kv_err *err)
{
#ifdef KV_HAVE_CUDA
    if (strcmp(device, "cuda") == 0) {
        const char *w = en->weights ? en->weights : "fp32";
        const int st = kv_model_need_fp32(model, "the CUDA engine", err);
        if (st) return st;
        kvcu_engine_opts o = {KV_QF_F32, 6};
        o.weights = !strcmp(w, "bf16") ? KV_QF_BF16 : !strcmp(w, "fp16") ? KV_QF_F16 : KV_QF_F32;
        if (en->prefill && !strcmp(en->prefill, "simt")) o.prefill = 0;
        return kvcu_backend_create_opts(out, model, spec, &o, err);
    }
#else
    (void)en;
#endif
    return kv_cli_backend(out, device, model, spec, err);
}

int kv_demo_backend(const kv_demo_ctx *ctx, const kv_model *model, const kv_cache_spec *spec,
                    kv_backend **out, const char **dev, kv_err *err)
{
    *dev = ctx->device;
    int st = kv_cli_backend(out, ctx->device, model, spec, err);
    if (st == KV_ERR_UNSUPPORTED && strcmp(ctx->device, "cpu") != 0) {
        fprintf(ctx->csv ? stderr : ctx->out, "   (%s: %s; this part runs on the cpu)\n",
                ctx->device, err->msg);
        err->msg[0] = 0;
        *dev = "cpu";
        st = kv_backend_cpu(out, model, spec, err);
    }
    return st;
}

int kv_cli_default_model(kv_model *m, const char *name, kv_err *err)
{
    kv_config c;
    uint64_t seed = 0;
    int st = kv_config_default_by_name(name, &c, &seed, err);
    if (st != KV_OK) return st;
    st = kv_model_alloc(m, &c, err);
    if (st != KV_OK) return st;
    kv_model_randomize(m, seed);
    return KV_OK;
}
