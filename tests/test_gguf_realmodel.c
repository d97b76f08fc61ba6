/*
 * SmolLM2-135M-Instruct (Q4_1 GGUF, fetched by tools/fetch-model.sh smollm2) as the gguf
 * Python package reads it, and kvlab running it.
 *
 * tests/data/gguf/smollm2.txt is the package's reading of the file (tools/gguf/make_test_files.py
 * --real): every key and value (the token list, token types and merges by hash), the table of
 * 272 tensors (type, shape, offset, bytes, a hash of the data), the config those keys give, and
 * the dequantized weights of seven tensors (samples bit for bit, sums). kvlab's reader and
 * loader must agree with all of it.
 *
 * Then the rows of Q and K (kv_gguf_model.c: GGUF's arch "llama" rotates adjacent pairs, as
 * kv_rope() does, so the rows go in unpermuted): on "The capital of France is Paris. The
 * capital of Germany is Berlin. ..." (five sentences, 35 tokens) the model must say " Paris"
 * after "is", and the text must be clearly likelier (mean NLL lower by 0.25 nats) than with
 * every head's Q and K rows put back into Hugging Face's rotate-half order. The top token alone
 * cannot tell the orders apart: both say " Paris" (RoPE's angles are small at positions 0-4).
 *
 * Without the file it exits 77 (skipped), saying how to fetch it.
 * Usage: test_gguf_realmodel <tests/data/gguf>
 */
#include "common/kv_test.h"
#include "common/kv_test_gguf.h"

#include "kv_cache.h"
#include "kv_forward.h"
#include "kv_gguf_model.h"

#include <sys/stat.h>

#define MODEL "SmolLM2-135M-Instruct.Q4_1.gguf"

/* the token id of an exact token text in the file's vocabulary, -1 if absent */
static int token_id(const kv_gguf *g, const char *text)
{
    const kv_gguf_str *tok;
    uint64_t n;
    if (kv_gguf_get_strings(g, "tokenizer.ggml.tokens", &tok, &n, NULL)) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (kv_gguf_str_eq(tok[i], text)) return (int)i;
    return -1;
}

/* One prefill of @p ids with every row's logits: the mean negative log-likelihood of each next
 * token, and the argmax after token @p at. */
static double mean_nll(const kv_model *m, const int *ids, int n, int at, int *argmax)
{
    const int V = m->config.vocab_size;
    kv_cache_spec spec = kv_cache_spec_default(1, n);
    kv_cache c;
    kv_state s;
    kv_err err;
    float *logits = malloc(sizeof(float) * (size_t)n * V); /* [n][vocab] */
    int rc = kv_forward_cache_create(&c, &m->config, &spec, &err);
    KV_CHECK(rc == KV_OK && logits, "cache: %s", err.msg);
    if (rc || !logits) return free(logits), NAN;
    kv_state_init(&s);
    kv_seq q = {0, 0, n, ids, logits};
    rc = kv_forward(m, &c, &s, &q, 1, NULL, NULL, &err);
    KV_CHECK(rc == KV_OK, "forward: %s", err.msg);
    double nll = 0;
    for (int t = 0; t + 1 < n; t++) {
        const float *row = logits + (size_t)t * V;
        int best = 0;
        for (int i = 1; i < V; i++) best = row[i] > row[best] ? i : best;
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)row[i] - row[best]);
        nll += log(sum) - ((double)row[ids[t + 1]] - row[best]);
        if (t == at) *argmax = best;
    }
    kv_state_free(&s);
    kv_cache_free(&c);
    free(logits);
    return rc ? NAN : nll / (n - 1);
}

/* Each head's rows in rotate-half order: row 2i to i, row 2i+1 to d/2 + i (what llama.cpp's
 * converter undid), for @p rows heads of width d in every layer's W [L][heads*d][dim]. */
static void rotate_half_rows(float *w, int L, int heads, int d, int dim)
{
    float *tmp = malloc(sizeof(float) * (size_t)d * dim); /* [d][dim] */
    for (int64_t h = 0; tmp && h < (int64_t)L * heads; h++) {
        float *head = w + h * d * dim;
        for (int i = 0; i < d / 2; i++) {
            memcpy(tmp + (size_t)i * dim, head + (size_t)(2 * i) * dim, sizeof(float) * dim);
            memcpy(tmp + (size_t)(d / 2 + i) * dim, head + (size_t)(2 * i + 1) * dim,
                   sizeof(float) * dim);
        }
        memcpy(head, tmp, sizeof(float) * (size_t)d * dim);
    }
    free(tmp);
}

static void check_rope_order(const kv_gguf *g, kv_model *m)
{
    static const char *const capitals[][2] = {{"France", "Paris"}, {"Germany", "Berlin"},
        {"Italy", "Rome"}, {"Spain", "Madrid"}, {"Japan", "Tokyo"}};
    int ids[40], n = 0;
    for (int k = 0; k < 5; k++) { /* "The capital of France is Paris. The capital of ..." */
        char country[32], city[32];
        snprintf(country, sizeof country, "Ġ%s", capitals[k][0]);
        snprintf(city, sizeof city, "Ġ%s", capitals[k][1]);
        const char *words[] = {k ? "ĠThe" : "The", "Ġcapital", "Ġof", country, "Ġis", city, "."};
        for (int i = 0; i < 7; i++) {
            ids[n] = token_id(g, words[i]);
            KV_CHECK(ids[n] >= 0, "token '%s' not in the vocabulary", words[i]);
            if (ids[n++] < 0) return;
        }
    }
    int next = -1, next_neox = -1;
    const double nll = mean_nll(m, ids, n, 4, &next);
    KV_CHECK(next == ids[5], "'The capital of France is' -> token %d, not ' Paris' (%d)", next,
             ids[5]);
    const kv_config *c = &m->config;
    const int d = kv_config_head_dim(c);
    rotate_half_rows(m->w.wq, c->n_layers, c->n_heads, d, c->dim);
    rotate_half_rows(m->w.wk, c->n_layers, c->n_kv_heads, d, c->dim);
    const double nll_neox = mean_nll(m, ids, n, 4, &next_neox);
    /* the file's order must be the one the model was trained in: the text is likelier */
    KV_CHECK(nll < nll_neox - 0.25, "mean NLL %.3f with the file's rows, %.3f with rotate-half "
             "rows: the file's order is not clearly the model's", nll, nll_neox);
    printf("%d tokens: mean NLL %.3f nats (after 'is': ' Paris'); with rotate-half Q/K rows "
           "%.3f (token %d)\n", n, nll, nll_neox, next_neox);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <tests/data/gguf>\n", argv[0]);
        return 2;
    }
    const char *env = getenv("KVLAB_MODELS"), *home = getenv("HOME");
    char dir[1024], path[1200], expected[1024];
    if (env && *env) snprintf(dir, sizeof dir, "%s", env);
    else snprintf(dir, sizeof dir, "%s/.cache/kvlab/models", home ? home : ".");
    snprintf(path, sizeof path, "%s/" MODEL, dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("skipped: %s is not there; fetch it with: tools/fetch-model.sh smollm2\n", path);
        return KV_TEST_SKIP;
    }
    snprintf(expected, sizeof expected, "%s/smollm2.txt", argv[1]);
    const kv_test_gguf_counts n = kv_test_gguf_expected(expected, dir);
    KV_CHECK(n.files == 1 && n.kvs == 33 && n.tensors == 272, "smollm2.txt: %d files, %d keys, "
             "%d tensors checked", n.files, n.kvs, n.tensors);

    kv_gguf *g = NULL;
    kv_err err;
    KV_CHECK(kv_gguf_open(path, &g, &err) == KV_OK, "%s", err.msg);
    if (!g) return kv_test_finish();
    kv_model m;
    const double t0 = kv_now();
    const int rc = kv_gguf_model_load(g, &m, &err);
    KV_CHECK(rc == KV_OK, "load: %s", err.msg);
    if (rc == KV_OK) {
        printf("loaded %lld weights in %.1f s\n", (long long)m.n_floats, kv_now() - t0);
        size_t tn;
        char *text = (char *)kv_test_slurp(expected, &tn);
        int configs = 0, weights = 0, sums = 0;
        if (text) kv_test_gguf_weights(&m, text, &configs, &weights, &sums);
        KV_CHECK(configs == 1 && weights >= 30 && sums == 7, "smollm2.txt: %d config, %d "
                 "weights, %d sums", configs, weights, sums);
        KV_CHECK(m.w.wcls == m.w.token_embedding, "no output.weight: the classifier is tied");
        free(text);
        check_rope_order(g, &m);
        kv_model_free(&m);
    }
    kv_gguf_close(g);
    return kv_test_finish();
}
