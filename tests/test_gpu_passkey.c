/* The pass-key test on the CUDA engine against the CPU: SmolLM2-135M-Instruct (tools/
 * fetch-model.sh smollm2) cut to its first 2 layers (kv_test_model_prefix_copy(); the emulated
 * device is slow), 256-token prompts of the classic filler with the key at depths 0 and 50 %,
 * answered by kv_passkey_run() (the path of kvlab passkey --device cuda) on each backend.
 * Under an fp16 cache, an int8 cache and a 64-token window with 4 sinks, the GPU's greedy
 * answer is the CPU's, character for character, and so is the verdict (int4-g32, two codes a
 * byte, is held on the same engine by test_gpu_quant_cache: its bytes, attention and greedy
 * tokens; here it would add a third to the emulation suite's longest test). A 2-layer cut of the
 * model does not find keys (the verdicts are misses, most likely): what is held is that the
 * devices agree, the real model's answers are test_passkey_real's. Both engines run fp32
 * weights and quantize the cache with the same rounding (docs/design.md §8), so a greedy
 * answer can differ only at a near tie of two logits; test_gpu_realmodel holds the logits
 * themselves to a bound. Exits 77 without a usable device or without the model file. */
#include "kv_backend.h"
#include "kv_gguf_model.h"
#include "kv_needle.h"
#include "kv_passkey.h"
#include "kv_vocab.h"
#include "common/kv_test.h"
#include "common/kv_test_gpu.h"
#include "common/kv_test_model.h"
#include "common/kv_test_model_prefix.h"
#include "kvcu.h"

#include <string.h>

enum { LAYERS = 2, LENGTH = 256 };

static int encode(void *ctx, const char *text, int **ids, int *n, kv_err *err)
{
    const kv_vocab *v = ctx;
    int need = 0;
    const size_t len = strlen(text);
    int rc = kv_vocab_encode(v, text, len, 0, 0, NULL, 0, &need, err);
    if (rc && rc != KV_ERR_CAPACITY) return rc;
    *ids = malloc((size_t)(need > 0 ? need : 1) * sizeof(int));
    if (!*ids) return kv_fail(err, KV_ERR_NOMEM, "encode");
    return kv_vocab_encode(v, text, len, 0, 0, *ids, need, n, err);
}

static int piece(void *ctx, int prev, int id, char *buf, int cap)
{
    (void)prev;
    int n = kv_vocab_piece(ctx, id, buf, cap - 1);
    if (n < 0) n = 0;
    buf[n] = '\0';
    return n;
}

static void run(const kv_model *m, const kv_text_codec *tc, const kv_passkey_hay *hay,
                const char *variant)
{
    kv_cache_spec spec;
    kv_backend *cb = NULL, *gb = NULL;
    kv_err e = {{0}};
    int rc = kv_needle_cache_spec(variant, 1, LENGTH + 8, &spec, &e);
    if (!rc) rc = kv_backend_cpu(&cb, m, &spec, &e);
    if (!rc) rc = kvcu_backend_create(&gb, m, &spec, &e);
    KV_CHECK(rc == KV_OK, "%s: backends: %s", variant, e.msg);
    for (int depth = 0; !rc && depth <= 50; depth += 50) {
        kv_passkey_result rcpu, rgpu;
        const int key = kv_passkey_key(3, depth);
        rc = kv_passkey_run(cb, tc, NULL, hay, LENGTH, depth / 100.0, key, &rcpu, &e);
        if (!rc) rc = kv_passkey_run(gb, tc, NULL, hay, LENGTH, depth / 100.0, key, &rgpu, &e);
        KV_CHECK(rc == KV_OK, "%s, depth %d %%: %s", variant, depth, e.msg);
        if (rc) break;
        KV_CHECK(!strcmp(rcpu.answer, rgpu.answer) && rcpu.found == rgpu.found,
                 "%s, depth %d %%, key %d: CPU answered '%s', GPU '%s'", variant, depth, key,
                 rcpu.answer, rgpu.answer);
        printf("%-14s depth %3d %%  key %d  CPU '%s'  GPU '%s'\n", variant, depth, key,
               rcpu.answer, rgpu.answer);
    }
    kv_backend_destroy(cb);
    kv_backend_destroy(gb);
}

int main(void)
{
    if (kv_test_no_gpu()) return KV_TEST_SKIP;
    char path[1200];
    if (!kv_test_model_path(KV_TEST_SMOLLM2, "smollm2", path, sizeof path)) return KV_TEST_SKIP;
    kv_gguf *g = NULL;
    kv_vocab *voc = NULL;
    kv_model m = {0};
    kv_err e = {{0}};
    int rc = kv_test_gguf_prefix_open(path, LAYERS, &g, &voc, &m, &e);
    KV_CHECK(rc == KV_OK, "model: %s", e.msg);
    int stop = voc ? kv_vocab_eos(voc) : -1;
    kv_text_codec tc = {voc, encode, piece, -1, &stop, stop >= 0};
    kv_passkey_hay hay = {0};
    if (!rc) rc = kv_passkey_filler(&tc, &hay, &e);
    KV_CHECK(rc == KV_OK, "filler: %s", e.msg);
    if (!rc) {
        run(&m, &tc, &hay, "fp16");
        run(&m, &tc, &hay, "int8");
        run(&m, &tc, &hay, "window/w64/s4");
    }
    kv_passkey_hay_free(&hay);
    kv_model_free(&m);
    kv_vocab_free(voc);
    kv_gguf_close(g);
    return kv_test_finish();
}
