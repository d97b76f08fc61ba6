/* Config: validation messages, parameter counts, embedded defaults, published-model presets. */
#include "kv_config.h"
#include "common/kv_test.h"

#include <math.h>
#include <string.h>

/* a valid tiny config to mutate */
static kv_config base(void)
{
    kv_config c = {0};
    c.dim = 64;
    c.hidden_dim = 172;
    c.n_layers = 2;
    c.n_heads = 8;
    c.n_kv_heads = 8;
    c.vocab_size = 512;
    c.seq_len = 512;
    kv_config_set_defaults(&c);
    return c;
}

/* validate c; expect KV_ERR_ARG and a message containing want */
static void expect_invalid(const kv_config *c, const char *want, const char *what)
{
    kv_err err = {{0}};
    int rc = kv_config_validate(c, &err);
    KV_CHECK(rc == KV_ERR_ARG, "%s: status %s, want KV_ERR_ARG", what, kv_status_name(rc));
    KV_CHECK(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
}

static void test_validate(void)
{
    kv_err err = {{0}};
    kv_config c = base();
    KV_CHECK(kv_config_validate(&c, &err) == KV_OK, "base config invalid: %s", err.msg);
    KV_CHECK(c.rope_theta == 10000.0f && c.rotary_dim == 8 && c.norm_eps == 1e-5f &&
                 c.tied_classifier == 1 && c.kind == KV_MODEL_GENERIC,
             "set_defaults: theta %g rotary %d eps %g tied %d kind %d", (double)c.rope_theta,
             c.rotary_dim, (double)c.norm_eps, c.tied_classifier, c.kind);

    c = base(); c.n_kv_heads = 3;
    expect_invalid(&c, "n_kv_heads (3) must divide n_heads (8)", "kv heads");
    c = base(); c.n_heads = 5;
    expect_invalid(&c, "n_heads (5) must divide dim (64)", "heads");
    c = base(); c.n_kv_heads = 16;
    expect_invalid(&c, "n_kv_heads (16)", "more kv heads than heads");
    c = base(); c.dim = 0;
    expect_invalid(&c, "dim (0)", "zero dim");
    c = base(); c.dim = 100000;
    expect_invalid(&c, "dim (100000)", "huge dim");
    c = base(); c.hidden_dim = -5;
    expect_invalid(&c, "hidden_dim (-5)", "negative hidden");
    c = base(); c.n_layers = 2000;
    expect_invalid(&c, "n_layers (2000)", "many layers");
    c = base(); c.vocab_size = 1 << 25;
    expect_invalid(&c, "vocab_size (33554432)", "huge vocab");
    c = base(); c.seq_len = -1;
    expect_invalid(&c, "seq_len (-1)", "negative seq");
    c = base(); c.dim = 24; c.n_heads = 8; c.n_kv_heads = 8; /* d = 3 */
    expect_invalid(&c, "head_dim", "odd head dim");
    c = base(); c.rotary_dim = 3;
    expect_invalid(&c, "rotary_dim (3)", "odd rotary");
    c = base(); c.rotary_dim = 10;
    expect_invalid(&c, "rotary_dim (10)", "rotary > d");
    c = base(); c.rotary_dim = 0; /* no rotation at all is a valid (NoPE) model */
    KV_CHECK(kv_config_validate(&c, &err) == KV_OK, "rotary 0 rejected: %s", err.msg);
    c = base(); c.rope_theta = 0.0f;
    expect_invalid(&c, "rope_theta", "zero theta");
    c = base(); c.rope_theta = NAN;
    expect_invalid(&c, "rope_theta", "NaN theta");
    c = base(); c.rope_theta = INFINITY;
    expect_invalid(&c, "rope_theta", "inf theta");
    c = base(); c.norm_eps = 0.0f;
    expect_invalid(&c, "norm_eps", "zero eps");
    c = base(); c.norm_eps = -1e-5f;
    expect_invalid(&c, "norm_eps", "negative eps");
    c = base(); c.norm_eps = NAN;
    expect_invalid(&c, "norm_eps", "NaN eps");
    c = base(); c.tied_classifier = 2;
    expect_invalid(&c, "tied_classifier (2)", "tied flag");
    c = base(); c.kind = 9;
    expect_invalid(&c, "kind (9)", "kind");
    KV_CHECK(kv_config_validate(NULL, &err) == KV_ERR_ARG, "NULL config accepted");
}

static void test_param_count(void)
{
    /* by hand: embedding 512*64 = 32768; per layer 2*64 (norms) + 4*64*64 (wq wk wv wo)
     * + 3*172*64 (w1 w2 w3) = 128 + 16384 + 33024 = 49536; 2 layers; final norm 64 */
    kv_config c = base();
    KV_CHECK(kv_config_param_count(&c) == 32768 + 2 * 49536 + 64, "tiny params %lld",
             (long long)kv_config_param_count(&c));
    c.tied_classifier = 0;
    KV_CHECK(kv_config_param_count(&c) == 2 * 32768 + 2 * 49536 + 64, "untied params %lld",
             (long long)kv_config_param_count(&c));
    c = base();
    c.n_kv_heads = 2; /* wk, wv shrink to [2*8][64] each: 2 * 2 * (64*64 - 16*64) fewer */
    KV_CHECK(kv_config_param_count(&c) == 32768 + 2 * (49536 - 2 * (4096 - 1024)) + 64,
             "gqa params %lld", (long long)kv_config_param_count(&c));

    /* published parameter counts of the preset models (untied, no biases) */
    struct { const char *name; long long params; } known[] = {
        {"llama-2-7b", 6738415616LL},  {"llama-2-13b", 13015864320LL},
        {"llama-2-70b", 68976648192LL}, {"llama-3-8b", 8030261248LL},
        {"llama-3-70b", 70553706496LL}, {"mistral-7b", 7241732096LL},
    };
    for (int i = 0; i < 6; i++) {
        const kv_preset *p = kv_preset_find(known[i].name);
        KV_CHECK(p != NULL, "preset %s missing", known[i].name);
        if (!p) continue;
        long long got = (long long)kv_config_param_count(&p->config);
        KV_CHECK(got == known[i].params, "%s: %lld params, published %lld", known[i].name, got,
                 known[i].params);
    }
}

/* KV cache bytes per token for every layer: L * 2 (K and V) * H_kv * d * b */
static long long kv_bytes_per_token(const kv_config *c, int bytes_per_elem)
{
    return (long long)c->n_layers * 2 * kv_config_kv_dim(c) * bytes_per_elem;
}

static void test_presets(void)
{
    int n = 0;
    const kv_preset *p = kv_presets(&n);
    KV_CHECK(n == 6, "%d presets, want 6", n);
    for (int i = 0; i < n; i++) {
        kv_err err = {{0}};
        KV_CHECK(kv_config_validate(&p[i].config, &err) == KV_OK, "preset %s invalid: %s",
                 p[i].name, err.msg);
        KV_CHECK(p[i].config.tied_classifier == 0, "preset %s should be untied", p[i].name);
        KV_CHECK(kv_config_head_dim(&p[i].config) == 128, "preset %s: d %d, want 128", p[i].name,
                 kv_config_head_dim(&p[i].config));
        KV_CHECK(p[i].config.rotary_dim == 128, "preset %s: rotary %d", p[i].name,
                 p[i].config.rotary_dim);
    }
    struct {
        const char *name;
        int dim, hidden, L, H, Hkv, vocab, seq, window;
        float theta;
        long long kv_fp16; /* bytes per token */
    } want[] = {
        {"llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 0, 10000.0f, 512 * 1024},
        {"llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, 0, 10000.0f, 800 * 1024},
        {"llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, 0, 10000.0f, 320 * 1024},
        {"llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 0, 500000.0f, 128 * 1024},
        {"llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, 0, 500000.0f, 320 * 1024},
        {"mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, 4096, 10000.0f, 128 * 1024},
    };
    for (int i = 0; i < 6; i++) {
        const kv_preset *q = kv_preset_find(want[i].name);
        KV_CHECK(q != NULL, "preset %s not found", want[i].name);
        if (!q) continue;
        const kv_config *c = &q->config;
        KV_CHECK(c->dim == want[i].dim && c->hidden_dim == want[i].hidden &&
                     c->n_layers == want[i].L && c->n_heads == want[i].H &&
                     c->n_kv_heads == want[i].Hkv && c->vocab_size == want[i].vocab &&
                     c->seq_len == want[i].seq && q->sliding_window == want[i].window &&
                     c->rope_theta == want[i].theta,
                 "preset %s dims differ", want[i].name);
        long long b = kv_bytes_per_token(c, 2);
        KV_CHECK(b == want[i].kv_fp16, "%s: %lld fp16 KV bytes per token, want %lld",
                 want[i].name, b, want[i].kv_fp16);
    }
    const kv_preset *l7 = kv_preset_find("LLaMA-2-7B"); /* case-insensitive */
    KV_CHECK(l7 && strcmp(l7->name, "llama-2-7b") == 0, "case-insensitive lookup failed");
    if (l7) {
        /* the headline numbers: 512 KiB per token, 16 KiB of it per layer, 2 GiB at 4096 */
        KV_CHECK(kv_bytes_per_token(&l7->config, 2) / l7->config.n_layers == 16 * 1024,
                 "7B per-layer bytes per token");
        KV_CHECK(kv_bytes_per_token(&l7->config, 2) * l7->config.seq_len == 2LL << 30,
                 "7B cache at 4096 tokens is not 2 GiB");
        KV_CHECK(kv_bytes_per_token(&l7->config, 4) == 1024 * 1024, "7B fp32 bytes per token");
    }
    KV_CHECK(kv_preset_find("gpt-5") == NULL, "unknown preset found");
    KV_CHECK(kv_preset_find(NULL) == NULL, "NULL preset found");
}

static void test_defaults(void)
{
    const char *names[KV_DEFAULT_COUNT] = {"tiny", "tiny-gqa", "small", "tiny-mla"};
    uint64_t seeds[KV_DEFAULT_COUNT];
    for (int i = 0; i < KV_DEFAULT_COUNT; i++) {
        kv_err err = {{0}};
        kv_config a, b;
        KV_CHECK(kv_config_default((kv_default_model)i, &a, &err) == KV_OK, "default %d: %s", i,
                 err.msg);
        KV_CHECK(kv_config_validate(&a, &err) == KV_OK, "default %s invalid: %s", names[i], err.msg);
        const char *nm = kv_config_default_name((kv_default_model)i);
        KV_CHECK(nm && strcmp(nm, names[i]) == 0, "default %d is named %s", i, nm ? nm : "NULL");
        KV_CHECK(kv_config_default_by_name(names[i], &b, &seeds[i], &err) == KV_OK,
                 "by name %s: %s", names[i], err.msg);
        KV_CHECK(memcmp(&a, &b, sizeof a) == 0, "default %s differs by name and by number",
                 names[i]);
        /* the embedded byte tokenizer needs 259 ids at least */
        KV_CHECK(a.vocab_size >= 259, "default %s vocab %d too small for the byte tokenizer",
                 names[i], a.vocab_size);
    }
    KV_CHECK(seeds[0] != seeds[1] && seeds[1] != seeds[2] && seeds[0] != seeds[2],
             "default seeds are not distinct");
    for (int i = 0; i < KV_DEFAULT_COUNT - 1; i++) /* and tiny-mla's (chapter 11) is its own */
        KV_CHECK(seeds[i] != seeds[KV_DEFAULT_COUNT - 1], "tiny-mla's seed is not its own");
    kv_config t, g, s;
    kv_config_default(KV_DEFAULT_TINY, &t, NULL);
    kv_config_default(KV_DEFAULT_TINY_GQA, &g, NULL);
    kv_config_default(KV_DEFAULT_SMALL, &s, NULL);
    KV_CHECK(t.dim == 64 && t.hidden_dim == 172 && t.n_layers == 2 && t.n_heads == 4 &&
                 t.n_kv_heads == 4 && t.vocab_size == 512 && t.seq_len == 512,
             "tiny shape");
    g.n_kv_heads = t.n_kv_heads; /* tiny-gqa is tiny with H_kv = 2 */
    KV_CHECK(memcmp(&t, &g, sizeof t) == 0, "tiny-gqa differs from tiny beyond H_kv");
    kv_config_default(KV_DEFAULT_TINY_GQA, &g, NULL);
    KV_CHECK(g.n_kv_heads == 2, "tiny-gqa H_kv %d", g.n_kv_heads);
    KV_CHECK(s.dim == 288 && s.hidden_dim == 768 && s.n_layers == 6 && s.n_heads == 6 &&
                 s.n_kv_heads == 6 && s.seq_len == 256,
             "small is not the stories15M shape");

    kv_err err = {{0}};
    kv_config c;
    KV_CHECK(kv_config_default_by_name("huge", &c, NULL, &err) == KV_ERR_ARG &&
                 strstr(err.msg, "huge"), "unknown default: %s", err.msg);
    KV_CHECK(kv_config_default_by_name(NULL, &c, NULL, &err) == KV_ERR_ARG, "NULL name accepted");
    KV_CHECK(kv_config_default(KV_DEFAULT_COUNT, &c, &err) == KV_ERR_ARG, "default out of range");
    KV_CHECK(kv_config_default_name(KV_DEFAULT_COUNT) == NULL, "name out of range");
}

static void test_describe(void)
{
    char buf[256];
    kv_config s;
    kv_config_default(KV_DEFAULT_SMALL, &s, NULL);
    kv_config_describe(&s, buf, sizeof buf);
    KV_CHECK(strcmp(buf, "dim 288, L 6, H 6, H_kv 6, d 48, hidden 768, vocab 4096, seq 256") == 0,
             "describe small: '%s'", buf);
    kv_config_describe(&kv_preset_find("llama-3-8b")->config, buf, sizeof buf);
    KV_CHECK(strcmp(buf, "dim 4096, L 32, H 32, H_kv 8, d 128, hidden 14336, vocab 128256, "
                         "seq 8192, theta 500000, untied") == 0,
             "describe llama-3-8b: '%s'", buf);
    char small_buf[16];
    kv_config_describe(&s, small_buf, sizeof small_buf); /* must truncate, not overflow */
    KV_CHECK(strlen(small_buf) == 15, "truncated describe: '%s'", small_buf);
}

int main(void)
{
    test_validate();
    test_param_count();
    test_presets();
    test_defaults();
    test_describe();
    return kv_test_finish();
}
