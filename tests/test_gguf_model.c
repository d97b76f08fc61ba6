/*
 * A Llama model from GGUF (model/kv_gguf_model.h) against the gguf Python package.
 *
 * tests/data/gguf/tiny_llama.gguf is a two-layer Llama written by GGUFWriter with weights in
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16 and F32 and an untied classifier;
 * expected.txt holds its config and, per tensor, sampled weights and the sum of all of them as
 * gguf.quants.dequantize computes them (tools/gguf/make_test_files.py). Each loaded weight
 * must equal the package's bit for bit (the dequantizers promise that, test_gguf_quant), and
 * each sum agree to the rounding of a double sum of a few thousand floats.
 *
 * Refusals, each by name: another architecture, a key missing, a shape that does not match
 * the config, a missing tensor, a tensor type kvlab does not dequantize, a Llama 3
 * rope_freqs.weight whose factor is not positive and a RoPE scaling other than none or
 * linear (llama_rope.gguf). Factors that make sense: tests/test_gguf_llama3.c.
 *
 * Usage: test_gguf_model <tests/data/gguf>
 */
#include "common/kv_test.h"
#include "common/kv_test_gguf.h"

#include "kv_gguf_model.h"

#include <math.h>

static const char *dir;

/* tiny_llama.gguf with one change: a loader refusal with @p status and @p words in it */
static void refused(const unsigned char *b, size_t n, const char *what, int status,
                    const char *words)
{
    kv_gguf *g = NULL;
    kv_err err = {{0}};
    int rc = kv_test_gguf_bytes(b, n, &g, &err);
    KV_CHECK(rc == KV_OK, "%s: the file still opens: %s", what, err.msg);
    if (rc) return;
    kv_model m;
    memset(&m, 0xab, sizeof m);
    rc = kv_gguf_model_load(g, &m, &err);
    KV_CHECK(rc == status && strstr(err.msg, words) && m.data == NULL,
             "%s: status %d, message \"%s\"", what, rc, err.msg);
    kv_gguf_close(g);
}

static void refusals(const kv_gguf *g, const unsigned char *file, size_t n)
{
    unsigned char *b = malloc(n);
    const unsigned char *base = kv_test_gguf_base(g);
#define AT(p) ((size_t)((const unsigned char *)(p) - base))
    const kv_gguf_kv *ffn = kv_test_gguf_kv(g, "llama.feed_forward_length");
    const kv_gguf_kv *blocks = kv_test_gguf_kv(g, "llama.block_count");
    const kv_gguf_tensor *up = kv_gguf_find_tensor(g, "blk.1.ffn_up.weight");
    const kv_gguf_tensor *q = kv_gguf_find_tensor(g, "blk.0.attn_q.weight");
    const uint32_t half = 32, iq4_nl = 20; /* Q4_0's 18 bytes per 32 weights, no dequantizer */

    memcpy(b, file, n);
    memcpy(b + AT(ffn->value), &half, 4);
    refused(b, n, "hidden 32", KV_ERR_FORMAT,
            "tensor 'blk.0.ffn_gate.weight': shape [32, 32] expected, found [32, 64]");
    memcpy(b, file, n);
    b[AT(blocks->key.s) + blocks->key.n - 1] = 'x';
    refused(b, n, "no block count", KV_ERR_FORMAT, "GGUF key 'llama.block_count' is missing");
    memcpy(b, file, n);
    b[AT(up->name.s) + strlen("blk.1.ffn_u")] = 'q';
    refused(b, n, "no ffn_up", KV_ERR_FORMAT, "tensor 'blk.1.ffn_up.weight' is missing");
    memcpy(b, file, n);
    memcpy(b + AT(q->name.s) + q->name.n + 4 + 8 * (size_t)q->n_dims, &iq4_nl, 4);
    refused(b, n, "IQ4_NL", KV_ERR_UNSUPPORTED, "tensor 'blk.0.attn_q.weight' is of ggml type "
            "IQ4_NL (20), which kvlab does not dequantize");
#undef AT
    free(b);

    char path[1024];
    snprintf(path, sizeof path, "%s/not_llama.gguf", dir);
    size_t qn;
    unsigned char *qwen = kv_test_slurp(path, &qn);
    if (qwen)
        refused(qwen, qn, "qwen2", KV_ERR_UNSUPPORTED,
                "architecture 'qwen2' is not supported (kvlab runs 'llama')");
    free(qwen);

    /* Llama 3's frequency factors (this file's are random, one negative), and a RoPE scaling
     * kvlab's RoPE has not */
    snprintf(path, sizeof path, "%s/llama_rope.gguf", dir);
    unsigned char *rope = kv_test_slurp(path, &qn);
    kv_gguf *r = NULL;
    kv_err err;
    KV_CHECK(rope && kv_gguf_open(path, &r, &err) == KV_OK, "llama_rope.gguf: %s", err.msg);
    if (rope && r) {
        refused(rope, qn, "rope_freqs", KV_ERR_FORMAT, "tensor 'rope_freqs.weight'[1] = "
                "-1.11473 must be positive and finite");
        const kv_gguf_kv *scaling = kv_test_gguf_kv(r, "llama.rope.scaling.type");
        memcpy(rope + (scaling->str.s - (const char *)kv_test_gguf_base(r)), "yarn", 4);
        refused(rope, qn, "yarn", KV_ERR_UNSUPPORTED, "RoPE scaling 'yarn' "
                "(llama.rope.scaling.type) is not supported");
    }
    kv_gguf_close(r);
    free(rope);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <tests/data/gguf>\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    char path[1024], expected[1024];
    snprintf(path, sizeof path, "%s/tiny_llama.gguf", dir);
    snprintf(expected, sizeof expected, "%s/expected.txt", dir);
    KV_CHECK(kv_model_path_is_gguf(path) == 1 && kv_model_path_is_gguf(expected) == 0 &&
             kv_model_path_is_gguf(dir) == 0 && kv_model_path_is_gguf("/nonexistent") == 0,
             "kv_model_path_is_gguf");
    size_t n, tn;
    unsigned char *file = kv_test_slurp(path, &n);
    char *text = (char *)kv_test_slurp(expected, &tn);
    kv_gguf *g = NULL;
    kv_err err;
    KV_CHECK(file && text && kv_gguf_open(path, &g, &err) == KV_OK, "%s: %s", path, err.msg);
    if (g) {
        kv_model m;
        const int rc = kv_gguf_model_load(g, &m, &err);
        KV_CHECK(rc == KV_OK, "load: %s", err.msg);
        if (rc == KV_OK) {
            KV_CHECK(m.w.wcls != m.w.token_embedding, "output.weight present: untied");
            int configs, weights, sums;
            kv_test_gguf_weights(&m, text, &configs, &weights, &sums);
            KV_CHECK(configs == 1 && weights >= 100 && sums == 21, "expected.txt: %d config, %d "
                     "weights, %d sums", configs, weights, sums);
            kv_model_free(&m);
        }
        refusals(g, file, n);
        kv_gguf_close(g);
    }
    free(file);
    free(text);
    return kv_test_finish();
}
