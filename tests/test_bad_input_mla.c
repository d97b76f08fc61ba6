/*
 * Bad input on a multi-head latent attention model (chapter 11): the commands written for
 * per-head keys, given a model whose cache holds one latent row per token.
 *
 *  - speculation: the draft (kv_model_layer_prefix()) keeps the target's MLA layers, so greedy
 *    speculation emits the target's greedy tokens; the draft alone decodes cached exactly as it
 *    recomputes every prefix (chapter 01 against 02); the bytes rolled back are latent rows,
 *    L · (d_c + d_R) · 4 a token, so written - rolled back is what the cache holds at the end.
 *    On the command line, kvlab spec on a saved tiny-mla model.
 *  - the probes (eval keys, eval mass, eval ppl --kivi-keys): refused in words, since there
 *    are no per-head keys to measure, never a latent row read as key rows;
 *  - MLA dims no cache can hold: d_c + d_R odd refused when the header is read, naming the sum;
 *    a storage format whose group does not divide the latent row, naming the latent row.
 *
 * usage: test_bad_input_mla <path to kvlab>
 */
#define _GNU_SOURCE
#include "kv_checkpoint.h"
#include "kv_generate.h"
#include "kv_probe.h"
#include "kv_spec.h"
#include "kv_tokenizer.h"
#include "common/kv_test.h"
#include "common/kv_test_cli.h"
#include "common/kv_test_backend.h"

#define P 7  /* prompt tokens */
#define N 40 /* tokens to emit */

static const int PROMPT[P] = {17, 301, 5, 88, 240, 17, 9};

/* tiny-mla with its fixed seed's weights */
static int mla_model(kv_model *m)
{
    kv_err e = {{0}};
    const int rc = kv_model_default(m, KV_DEFAULT_TINY_MLA, &e);
    KV_CHECK(rc == KV_OK, "tiny-mla: %s", e.msg);
    return rc;
}

/* ---- speculation with a draft of the target's first layer ------------------------------ */

/* n tokens after PROMPT, greedy, in @p mode */
static int greedy(const kv_model *m, int mode, int *out, kv_err *e)
{
    kv_backend *b = NULL;
    const kv_cache_spec spec = kv_cache_spec_default(1, P + N + 64);
    const kv_gen_opts o = {mode, 0, N, NULL, NULL, NULL, NULL};
    int rc = kv_backend_cpu(&b, m, &spec, e);
    if (!rc) rc = kv_generate(b, PROMPT, P, &o, out, NULL, e);
    kv_backend_destroy(b);
    return rc;
}

static void test_spec(void)
{
    kv_model m, dm;
    if (mla_model(&m)) return;
    kv_err e = {{0}};
    int rc = kv_model_layer_prefix(&dm, &m, 1, &e);
    KV_CHECK(rc == KV_OK && dm.config.n_layers == 1, "layer prefix: %s", e.msg);
    KV_CHECK(dm.mla == m.mla, "the draft lost the MLA layers (mla %p, the target's %p)",
             (void *)dm.mla, (void *)m.mla);
    if (rc || dm.mla != m.mla) { /* the forward pass would read layer 0 of a NULL array */
        kv_model_free(&m);
        return;
    }
    int want[N], naive[N], cached[N], got[N];
    /* the draft alone: cached decode is chapter 01's recompute, token for token */
    rc = greedy(&dm, KV_MODE_NAIVE, naive, &e);
    if (!rc) rc = greedy(&dm, KV_MODE_CACHED, cached, &e);
    KV_CHECK(rc == KV_OK && !memcmp(naive, cached, sizeof naive), "draft: cached != naive (%s)",
             e.msg);
    rc = greedy(&m, KV_MODE_CACHED, want, &e);
    KV_CHECK(rc == KV_OK, "target greedy: %s", e.msg);

    kv_backend *t = NULL, *d = NULL;
    const kv_cache_spec spec = kv_cache_spec_default(1, P + N + 64);
    if (!rc) rc = kv_backend_cpu(&t, &m, &spec, &e);
    if (!rc) rc = kv_backend_cpu(&d, &dm, &spec, &e);
    for (int k = 1; !rc && k <= 4; k++) {
        const kv_spec_opts o = {k, N, 0, 0.0f, 7};
        kv_spec_stats st;
        t->reset(t, 0);
        d->reset(d, 0);
        rc = kv_spec_generate(t, d, PROMPT, P, &o, got, &st, &e);
        KV_CHECK(rc == KV_OK, "k %d: %s", k, e.msg);
        if (rc) break;
        KV_CHECK(!memcmp(got, want, sizeof want), "k %d: speculation differs from greedy", k);
        /* every row written is either still cached or was rolled back once */
        const double row = 2.0 * 64 * sizeof(float); /* L · (d_c + d_R) · 4 */
        const double kept_t = st.target_kv_written - st.target_kv_rolled_back;
        const double kept_d = st.draft_kv_written - st.draft_kv_rolled_back;
        KV_CHECK(kept_t == t->length(t, 0) * row, "k %d: target wrote %.0f B, rolled back %.0f "
                 "B, holds %d rows of %.0f B", k, st.target_kv_written, st.target_kv_rolled_back,
                 t->length(t, 0), row);
        KV_CHECK(kept_d == d->length(d, 0) * row / 2, "k %d: draft wrote %.0f B, rolled back "
                 "%.0f B, holds %d rows of %.0f B", k, st.draft_kv_written,
                 st.draft_kv_rolled_back, d->length(d, 0), row / 2);
        KV_CHECK(st.target_kv_rolled_back > 0 || k == 1, "k %d: nothing rolled back", k);
    }
    KV_CHECK(rc == KV_OK, "backends: %s", e.msg);
    kv_backend_destroy(t);
    kv_backend_destroy(d);
    kv_model_free(&m);
}

/* ---- the probes ---------------------------------------------------------------------------- */

#define NO_KEYS "no per-head keys (multi-head latent attention caches one latent row per token)"

static void test_probes(void)
{
    kv_model m;
    if (mla_model(&m)) return;
    kv_err e = {{0}};
    enum { T = 40 };
    int tok[T];
    for (int i = 0; i < T; i++) tok[i] = (37 * i + 11) % m.config.vocab_size;
    /* room for a GQA reading of the shape, so a wrong answer is a wrong answer, not a fault */
    double *pre = calloc(4096, sizeof(double)), *post = calloc(4096, sizeof(double));
    int rc = kv_probe_key_channels(&m, tok, T, pre, post, &e);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, NO_KEYS), "key channels: %s (%s)",
             kv_status_name(rc), e.msg);
    e.msg[0] = '\0';
    rc = kv_probe_attention_mass(&m, tok, T, pre, &e);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, NO_KEYS), "attention mass: %s (%s)",
             kv_status_name(rc), e.msg);
    free(pre);
    free(post);

    /* the KIVI emulation hook on a latent cache */
    kv_probe_kivi k;
    kv_backend *b = NULL;
    const kv_cache_spec spec = kv_cache_spec_default(1, 64);
    float *logits = malloc(sizeof(float) * (size_t)m.config.vocab_size);
    rc = kv_probe_kivi_init(&k, KV_QF_INT2_KIVI, 0, 32, &e);
    if (!rc) rc = kv_backend_cpu(&b, &m, &spec, &e);
    for (int pos = 0; !rc && pos < T; pos += 32) {
        const int n = T - pos < 32 ? T - pos : 32;
        const kv_seq s = {0, pos, n, tok + pos, NULL};
        rc = kv_probe_kivi_step(&k, b, pos, n, &e);
        if (!rc) rc = b->forward(b, &s, 1, logits, NULL, &e);
    }
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, NO_KEYS), "KIVI emulation: %s (%s)",
             kv_status_name(rc), e.msg);
    kv_backend_destroy(b);
    free(logits);
    kv_model_free(&m);
}

/* ---- MLA dims no cache can hold --------------------------------------------------------------- */

static void test_dims(void)
{
    kv_config c;
    kv_err e = {{0}};
    kv_config_default(KV_DEFAULT_TINY_MLA, &c, NULL);
    c.mla.d_c = 7; /* 7 + 16 = 23 */
    int rc = kv_config_validate(&c, &e);
    KV_CHECK(rc == KV_ERR_ARG && strstr(e.msg, "d_c + d_R (23) must be even"), "d_c 7: %s (%s)",
             kv_status_name(rc), e.msg);

    /* int8-g32 over a latent row of 24 + 16 = 40: the row is what the group must divide */
    kv_config_default(KV_DEFAULT_TINY_MLA, &c, NULL);
    c.mla.d_c = 24;
    kv_model m;
    if (kv_test_model_random(&m, &c, 5)) return;
    kv_cache_spec spec = kv_cache_spec_default(1, 64);
    spec.quant.dtype = KV_QF_INT8_G32;
    kv_backend *b = NULL;
    rc = kv_backend_cpu(&b, &m, &spec, &e);
    KV_CHECK(rc == KV_ERR_UNSUPPORTED && strstr(e.msg, "latent row (d_c + d_R = 40)") &&
                 !strstr(e.msg, "head dim"), "int8-g32 on a row of 40: %s (%s)",
             kv_status_name(rc), e.msg);
    kv_backend_destroy(b);
    KV_CHECK(kv_checkpoint_write(file("row40.kvlab"), &m, KV_FILE_KVLAB, &e) == KV_OK, "%s",
             e.msg);
    kv_model_free(&m);

    /* a file whose header says d_c 7: written with d_c 8, the field patched (offset 60,
     * kv_checkpoint.c) and the weights cut to what d_c 7 implies, so only the sum is wrong */
    kv_config_default(KV_DEFAULT_TINY_MLA, &c, NULL);
    c.mla.d_c = 8;
    if (kv_test_model_random(&m, &c, 6)) return;
    KV_CHECK(kv_checkpoint_write(file("odd.kvlab"), &m, KV_FILE_KVLAB, &e) == KV_OK, "%s", e.msg);
    kv_model_free(&m);
    c.mla.d_c = 7;
    size_t n = 0;
    unsigned char *bytes = slurp(file("odd.kvlab"), &n);
    const size_t want = 256 + (size_t)kv_config_param_count(&c) * sizeof(float);
    KV_CHECK(bytes && n > want, "odd.kvlab: %zu bytes", n);
    if (!bytes || n <= want) return;
    const int32_t d_c = 7;
    memcpy(bytes + 60, &d_c, sizeof d_c);
    write_bytes(file("odd.kvlab"), bytes, want);
    free(bytes);
    kv_model r;
    rc = kv_checkpoint_read(file("odd.kvlab"), &r, &e);
    KV_CHECK(rc == KV_ERR_FORMAT && strstr(e.msg, "d_c + d_R (23) must be even"),
             "odd.kvlab: %s (%s)", kv_status_name(rc), e.msg);
    if (rc == KV_OK) kv_model_free(&r);
}

/* ---- the command line ---------------------------------------------------------------------- */

static char mla[256]; /* tiny-mla, saved by kvlab generate */

/* kvlab @p args exits 0, prints every '|'-separated word of @p want, and no spec row whose
 * "= greedy" column says NO */
static void expect_ok(const char *want, const char *const *args)
{
    result r = run_in(dir, args);
    KV_CHECK(r.rc == 0, "kvlab %s %s: exit %d (%s)", args[0], args[1], r.rc, r.err);
    char words[256];
    snprintf(words, sizeof words, "%s", want);
    for (char *w = strtok(words, "|"); r.out && w; w = strtok(NULL, "|"))
        KV_CHECK(strstr(r.out, w) != NULL, "kvlab %s %s: stdout lacks '%s':\n%s", args[0],
                 args[1], w, r.out);
    KV_CHECK(r.out && !strstr(r.out, " NO"), "kvlab %s %s: a row differs from greedy:\n%s",
             args[0], args[1], r.out);
    free(r.out);
    free(r.err);
}

#define CLI_OK(want, ...) expect_ok(want, (const char *const[]){__VA_ARGS__, NULL})

static void cli_spec(void)
{
    CLI_OK("draft = its first 1 layer|yes", "spec", "--model", mla, "--max-k", "3", "--tokens",
           "24");
}

static void cli_probes(void)
{
    char tok[256], text[256];
    snprintf(tok, sizeof tok, "%s", file("tok.bin"));
    snprintf(text, sizeof text, "%s", file("text.txt"));
    kv_tokenizer t;
    kv_err e = {{0}};
    KV_CHECK(kv_tokenizer_bytes(&t, 512, &e) == KV_OK && kv_tokenizer_write(tok, &t, &e) == KV_OK,
             "tokenizer: %s", e.msg);
    kv_tokenizer_free(&t);
    const char *words = "the cache of a latent attention model holds one row per token. ";
    char body[2048] = "";
    for (int i = 0; i < 12; i++) strcat(body, words);
    write_bytes(text, body, strlen(body));
    CLI_BAD("probe|" NO_KEYS, "eval", "keys", "--model", mla, "--tokenizer", tok, "--text", text);
    CLI_BAD("probe|" NO_KEYS, "eval", "mass", "--model", mla, "--tokenizer", tok, "--text", text);
    CLI_BAD(NO_KEYS, "eval", "ppl", "--model", mla, "--tokenizer", tok, "--text", text,
            "--kivi-keys", "channel", "--kivi-window", "32");
}

static void cli_dims(void)
{
    /* KIVI groups the latent row of 64 (tiny-mla's dim / H = 16 is no row of its cache) */
    CLI_OK("yes", "spec", "--model", mla, "--cache", "int2-kivi", "--max-k", "2", "--tokens",
           "24");
    CLI_BAD("latent row (d_c + d_R)|has 40", "spec", "--model", file("row40.kvlab"), "--cache",
            "int2-kivi");
    CLI_BAD("latent row (d_c + d_R = 40)", "generate", "--model", file("row40.kvlab"), "--cache",
            "int8-g32", "--steps", "2");
    CLI_BAD("odd.kvlab|d_c + d_R (23) must be even", "generate", "--model", file("odd.kvlab"),
            "--steps", "2");
}

int main(int argc, char **argv)
{
    kv_test_cli_init(argc, argv);
    snprintf(mla, sizeof mla, "%s", file("mla.kvlab"));
    CLI_OK("", "generate", "--default", "tiny-mla", "--steps", "2", "--save-model", mla);
    test_spec();
    cli_spec();
    test_probes();
    cli_probes();
    test_dims();
    cli_dims();
    cleanup();
    return kv_test_finish();
}
