/* Links the installed kvlab (headers as <kvlab/...>) and runs one cached generation on the tiny default model. */
#include <stdio.h>

#include <kvlab/kv_backend.h>
#include <kvlab/kv_generate.h>
#include <kvlab/kv_model.h>
#ifdef CONSUMER_HAS_CUDA
#include <kvlab/kvcu.h>
#endif

int main(void)
{
    kv_err err = {{0}};
    kv_model m = {0};
    if (kv_model_default(&m, KV_DEFAULT_TINY, &err) != KV_OK) {
        fprintf(stderr, "consumer: %s\n", err.msg);
        return 1;
    }
    kv_cache_spec spec = kv_cache_spec_default(1, 64);
    kv_backend *b = NULL;
    if (kv_backend_cpu(&b, &m, &spec, &err) != KV_OK) {
        fprintf(stderr, "consumer: %s\n", err.msg);
        return 1;
    }
    int prompt[3] = {1, 10, 20}, out[8];
    kv_gen_opts opts = {.mode = KV_MODE_CACHED, .slot = 0, .n_steps = 8};
    int rc = kv_generate(b, prompt, 3, &opts, out, NULL, &err);
    if (rc != KV_OK) {
        fprintf(stderr, "consumer: %s\n", err.msg);
        return 1;
    }
    printf("consumer: generated");
    for (int i = 0; i < 8; i++) printf(" %d", out[i]);
    printf("\n");
#ifdef CONSUMER_HAS_CUDA
    printf("consumer: linked kvlab_cuda (emulation: %d)\n", kvcu_is_emulation());
#endif
    kv_backend_destroy(b);
    kv_model_free(&m);
    return 0;
}
